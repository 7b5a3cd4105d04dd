//! What one client can hold: idle connections, a trickled body, a huge header. The
//! server keeps answering others; the offending connection gets a 4xx or is closed.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{TestApp, spawn_app_with};

/// Reads until the peer closes (or `within` passes); returns what came.
async fn read_to_close(stream: &mut TcpStream, within: Duration) -> (String, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&out).into(), true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&out).into(), false),
        }
    }
}

async fn healthz_answers(app: &TestApp) {
    let started = Instant::now();
    let resp = app.get("/healthz", None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_64_kb_header_is_refused_with_431_and_json_and_the_connection_closed() {
    let app = spawn_app_with(|_| {}).await;
    let mut stream = TcpStream::connect(("127.0.0.1", app.port)).await.unwrap();
    let big = "a".repeat(64 * 1024);
    let request = format!("GET /api/sales HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let (answer, closed) = read_to_close(&mut stream, Duration::from_secs(5)).await;
    assert!(
        answer.starts_with("HTTP/1.1 431"),
        "{}",
        &answer[..answer.len().min(200)]
    );
    assert!(
        answer.contains(r#""error":"headers_too_large""#),
        "{answer}"
    );
    assert!(closed, "the connection stays open after 431");
    healthz_answers(&app).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_trickled_one_byte_a_second_is_cut_with_408_while_others_are_served() {
    let app = spawn_app_with(|c| c.body_timeout_ms = 2000).await;
    let mut stream = TcpStream::connect(("127.0.0.1", app.port)).await.unwrap();
    let body = br#"{"username":"someone","password":"a long password"}"#;
    let head = format!(
        "POST /api/auth/signin HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut sent = 0;
    let mut answer = String::new();
    let mut closed = false;
    // One byte a second; stop once the server answered or closed.
    while sent < body.len() {
        if stream.write_all(&body[sent..sent + 1]).await.is_err() {
            break;
        }
        sent += 1;
        healthz_answers(&app).await;
        let (got, gone) = read_to_close(&mut stream, Duration::from_secs(1)).await;
        answer.push_str(&got);
        if gone || !answer.is_empty() {
            closed = gone;
            break;
        }
    }
    if !closed {
        let (rest, gone) = read_to_close(&mut stream, Duration::from_secs(3)).await;
        answer.push_str(&rest);
        closed = gone;
    }
    let took = started.elapsed();
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "after {took:?}: {answer:?}"
    );
    assert!(answer.contains(r#""error":"body_timeout""#), "{answer}");
    assert!(closed, "the connection stays open after 408");
    assert!(
        sent < body.len(),
        "the whole body went through ({sent} bytes)"
    );
    assert!(took < Duration::from_secs(6), "cut after {took:?}");
    healthz_answers(&app).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_idle_connections_do_not_stop_others_and_are_closed() {
    // Client and server share this process: two descriptors per connection.
    let wanted: u64 = 10_000;
    let need = wanted * 2 + 1024;
    let _ = rlimit::setrlimit(rlimit::Resource::NOFILE, need, need);
    let (soft, _) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
    let count = wanted.min(soft.saturating_sub(1024) / 2) as usize;
    eprintln!("open files limit {soft}: holding {count} idle connections");
    assert!(
        count >= 1000,
        "open files limit {soft} too low for this test"
    );
    let app = spawn_app_with(|c| c.client_request_timeout_ms = 3000).await;
    let port = app.port;
    let started = Instant::now();
    let mut idle = Vec::with_capacity(count);
    for chunk in 0..count.div_ceil(500) {
        let n = 500.min(count - chunk * 500);
        let conns =
            futures_util::future::join_all((0..n).map(|_| TcpStream::connect(("127.0.0.1", port))))
                .await;
        idle.extend(conns.into_iter().map(|c| c.expect("connect")));
    }
    eprintln!("{count} connections open after {:?}", started.elapsed());
    // Others are served while they sit there.
    for _ in 0..5 {
        healthz_answers(&app).await;
    }
    let resp = app.get("/api/sales", None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    // The server cuts every connection that sent nothing within
    // client_request_timeout (3 s here): a 408, then closed.
    // Each one's 3 s start when a worker accepts it, and on a loaded machine (the
    // suite runs tests side by side on two cores) the last of 10,000 can be
    // accepted seconds after it connected: each read may wait up to 20 s, and
    // returns as soon as the server cuts the connection.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reads = idle.iter_mut().map(|conn| async move {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(Duration::from_secs(20), conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => true,
            // actix-web answers 408 before closing.
            Ok(Ok(n)) => buf[..n].starts_with(b"HTTP/1.1 408"),
            Err(_) => false,
        }
    });
    let closed = futures_util::future::join_all(reads)
        .await
        .into_iter()
        .filter(|c| *c)
        .count();
    assert_eq!(
        closed, count,
        "idle connections neither answered 408 nor closed"
    );
    healthz_answers(&app).await;
}
