//! The real binary: `stampede serve` answers, and SIGTERM stops it cleanly: first it
//! drains (`/readyz` 503 while purchases are still answered, for `drain_ms`), then
//! it stops after the settlement worker has written what was accepted, without
//! waiting for open pages' event streams (which never finish by themselves).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::helpers::{TestApp, spawn_with_live_sale_and};

/// The drain period the test gives the server.
const DRAIN: Duration = Duration::from_millis(2000);

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_then_stops_serve_after_settling_what_it_accepted() {
    // A test app only for its database, namespace and helpers; its own server runs
    // without settlement so that only the binary's worker can settle.
    let (app, _, sale) = spawn_with_live_sale_and(5, |c| c.settle_in_serve = false).await;
    let buyer = app.user().await;
    let late_buyer = app.user().await;

    let port = free_port();
    let mut child = start_role(&app, "serve")
        .env("STAMPEDE_LISTEN", format!("127.0.0.1:{port}"))
        .env("STAMPEDE_TOKEN_SECRET", &app.config.token_secret)
        .env("STAMPEDE_LIMITS", "off")
        // A developer's own server may hold the default metrics port.
        .env("STAMPEDE_METRICS_LISTEN", "off")
        // No other worker could take over its entries within the test.
        .env("STAMPEDE_SETTLE_CLAIM_IDLE_MS", "600000")
        .env("STAMPEDE_DRAIN_MS", DRAIN.as_millis().to_string())
        .spawn()
        .expect("start stampede serve");
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = app.client.get(format!("{base}/readyz")).send().await
            && r.status() == StatusCode::OK
        {
            break;
        }
        assert!(Instant::now() < deadline, "serve never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resp = app
        .client
        .post(format!("{base}/api/sales/{sale}/purchase"))
        .bearer_auth(&buyer.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    // An open page follows the sale.
    let mut stream = app
        .client
        .get(format!("{base}/api/sales/{sale}/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    assert!(stream.chunk().await.unwrap().is_some());

    sigterm(&child);
    let termed = Instant::now();
    // Draining: not ready at once, and still answering.
    let ready = loop {
        let r = app
            .client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::SERVICE_UNAVAILABLE {
            break r;
        }
        assert!(
            termed.elapsed() < Duration::from_millis(500),
            "/readyz still 200 half a second after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(ready.headers().contains_key("retry-after"));
    let body: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(body["status"], "draining", "{body}");
    let late = app
        .client
        .post(format!("{base}/api/sales/{sale}/purchase"))
        .bearer_auth(&late_buyer.token)
        .send()
        .await
        .unwrap();
    assert_eq!(
        late.status(),
        StatusCode::ACCEPTED,
        "a purchase during the drain is decided"
    );
    assert_eq!(
        late.headers().get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..]),
        "an answer in the drain closes its connection (a proxy keeps none to reuse)"
    );
    assert!(
        termed.elapsed() < DRAIN,
        "the checks of the drain took longer than the drain ({:?}): they proved nothing",
        termed.elapsed()
    );
    // The stream ends once the drain is over, at once then; waiting for it would
    // take the whole 10 s shutdown timeout.
    let deadline = termed + DRAIN + Duration::from_secs(8);
    let ended = tokio::time::timeout(DRAIN + Duration::from_secs(8), async {
        let mut last = Vec::new();
        while let Ok(Some(chunk)) = stream.chunk().await {
            last.extend_from_slice(&chunk);
        }
        last
    })
    .await;
    let last = ended.expect("the event stream stayed open after SIGTERM");
    let all = String::from_utf8_lossy(&last);
    let last = all.rsplit("\n\n").nth(1).unwrap_or_default();
    assert!(
        last.starts_with(": server stopping, reconnect\nretry: ") && all.ends_with("\n\n"),
        "the stream's last lines ask the page to reconnect: {last:?}"
    );
    assert!(
        termed.elapsed() >= DRAIN - Duration::from_millis(100),
        "the event stream ended {:?} after SIGTERM, before the drain was over",
        termed.elapsed()
    );
    assert_exits_ok(&mut child, deadline, "serve", "the drain and 8 s").await;
    assert_eq!(
        app.orders_in_db(sale).await.len(),
        2,
        "both accepted orders, the one of the drain too, were settled before exit"
    );
    assert!(
        app.client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .is_err(),
        "the port is closed"
    );
}

/// The settling role (`stampede settle`) serves `/metrics` and `/healthz` on its
/// metrics listener: settlement's own counters, for the ServiceMonitor.
#[tokio::test(flavor = "multi_thread")]
async fn the_settling_role_serves_its_metrics_and_stops_on_sigterm() {
    let (app, _, sale) = spawn_with_live_sale_and(5, |c| c.settle_in_serve = false).await;
    let buyer = app.user().await;
    let port = free_port();
    let mut child = start_role(&app, "settle")
        .env("STAMPEDE_METRICS_LISTEN", format!("127.0.0.1:{port}"))
        .spawn()
        .expect("start stampede settle");
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = app.client.get(format!("{base}/healthz")).send().await {
            assert_eq!(r.status(), StatusCode::OK);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "settle's listener never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.buy(sale, &buyer.token).await;
    // It settles the order and says so, and that it holds the lease.
    let text = loop {
        let text = app
            .client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if text.contains("\nstampede_settled_rows_total 1\n") {
            break text;
        }
        assert!(Instant::now() < deadline, "never counted the row:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(text.contains("\nstampede_settle_leading 1\n"), "{text}");
    assert!(
        text.contains("\nstampede_settle_errors_total 0\n"),
        "{text}"
    );
    assert_eq!(app.orders_in_db(sale).await.len(), 1);
    sigterm(&child);
    let stop = Instant::now() + Duration::from_secs(10);
    assert_exits_ok(&mut child, stop, "settle", "10 s").await;
}

/// Sends SIGTERM to `child`.
fn sigterm(child: &std::process::Child) {
    let killed = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(killed.success());
}

/// `child` (the `role` process) exits, successfully, before `deadline` (`within`
/// of its SIGTERM).
async fn assert_exits_ok(
    child: &mut std::process::Child,
    deadline: Instant,
    role: &str,
    within: &str,
) {
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "{role} did not stop within {within} of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{role} exited with {status}");
}

/// A free port on the loopback interface.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// `stampede <role>` (not started yet) on `app`'s database and Redis, with
/// `RUST_LOG=warn` and its output discarded.
fn start_role(app: &TestApp, role: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stampede"));
    cmd.arg(role)
        .env("DATABASE_URL", &app.config.database_url)
        .env("REDIS_URL", &app.config.redis_url)
        .env("STAMPEDE_REDIS_NAMESPACE", &app.config.redis_namespace)
        // The API suite's second run is on a cluster: the child must find it too.
        .env("STAMPEDE_REDIS_CLUSTER", app.config.redis_cluster.join(","))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}
