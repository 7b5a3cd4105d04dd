//! Live views over server-sent events (`src/live.rs`): the view at once, every
//! change after, one read per watched sale however many pages watch it.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{TestApp, metric, spawn_app_with, spawn_with_live_sale_and};

/// An open event stream and what it has sent that no event has used yet.
pub(crate) struct Stream {
    resp: reqwest::Response,
    buf: String,
}

impl Stream {
    pub(crate) async fn open(app: &TestApp, path: &str) -> Stream {
        Self::open_as(app, path, None).await
    }

    /// [`Self::open`] with the caller's token, when there is one.
    pub(crate) async fn open_as(app: &TestApp, path: &str, token: Option<&str>) -> Stream {
        let mut req = app.client.get(app.url(path));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        Stream {
            resp,
            buf: String::new(),
        }
    }

    /// The next `data:` event's JSON (comments and `retry:` skipped), within 5 s.
    pub(crate) async fn next(&mut self) -> Value {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                while let Some(end) = self.buf.find("\n\n") {
                    let event: String = self.buf.drain(..end + 2).collect();
                    if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                        return serde_json::from_str(data).unwrap();
                    }
                }
                let chunk = self.resp.chunk().await.unwrap().expect("the stream ended");
                self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
            }
        })
        .await
        .expect("an event within 5 s")
    }
}

async fn live_reads(app: &TestApp) -> i64 {
    metric(&app.metrics_text().await, "stampede_live_reads_total")
}

#[tokio::test]
async fn a_sale_stream_sends_the_view_then_each_change_to_every_viewer_from_one_reader() {
    let (app, admin, sale) =
        spawn_with_live_sale_and(5, |c| c.live_interval = Duration::from_millis(100)).await;
    let path = format!("/api/sales/{sale}/events");

    let mut viewers = Vec::new();
    for _ in 0..3 {
        viewers.push(Stream::open(&app, &path).await);
    }
    for viewer in &mut viewers {
        let view = viewer.next().await;
        assert_eq!(view["id"], sale);
        assert_eq!(view["stock_left"], 5);
        assert_eq!(view["status"], "live");
    }

    let buyer = app.user().await;
    app.buy(sale, &buyer.token).await;
    for viewer in &mut viewers {
        assert_eq!(viewer.next().await["stock_left"], 4);
    }

    // One reader for the three viewers. A reader sleeps the interval (100 ms) after
    // each read, so however slow the machine, one reader makes at most
    // elapsed / interval + 1 reads in a stretch; three would make about three times
    // that. The stretch (1 s) is time that has to pass; what is asserted is the
    // count against the time that did pass (that the reader runs at all, the
    // viewers' events above showed).
    let started = std::time::Instant::now();
    let before = live_reads(&app).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = live_reads(&app).await - before;
    let elapsed = started.elapsed();
    let most = (elapsed.as_millis() / 100) as i64 + 1;
    assert!(
        during <= most,
        "{during} reads in {elapsed:?}: one reader makes at most {most}"
    );

    // An admin closes the sale: every viewer sees it.
    let resp = app.close_sale(&admin, sale).await;
    assert!(resp.status().is_success(), "{}", resp.status());
    for viewer in &mut viewers {
        assert_eq!(viewer.next().await["status"], "closed");
    }

    // Nobody watching: the reader stops. The server learns that a page left when a
    // write to it fails: at the latest with the keep-alive comment (here 1 s).
    drop(viewers);
    // Polled: the count stands still for half a second; 20 s without that fails.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut last = live_reads(&app).await;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = live_reads(&app).await;
        if now == last {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still reading 20 s after the last viewer left ({now} reads)"
        );
        last = now;
    }
}

#[tokio::test]
async fn a_poll_stream_sends_the_tallies_then_each_vote() {
    let app = spawn_app_with(|c| c.live_interval = Duration::from_millis(100)).await;
    let admin = app.admin().await;
    let (poll, options) = app
        .open_poll(&admin, "Which colour?", &["Red", "Blue"])
        .await;
    let mut viewer = Stream::open(&app, &format!("/api/polls/{poll}/events")).await;
    let first = viewer.next().await;
    assert_eq!(first["voters"], 0);

    let voter = app.user().await;
    app.cast_vote(poll, &voter.token, options[1]).await;
    let next = viewer.next().await;
    assert_eq!(next["voters"], 1);
    let blue = next["tallies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["option_id"] == options[1])
        .unwrap();
    assert_eq!(blue["votes"], 1);
}

#[tokio::test]
async fn streams_of_unknown_or_malformed_ids_are_clear_errors() {
    let app = spawn_app_with(|c| c.live_interval = Duration::from_millis(100)).await;
    app.assert_get_error(
        "/api/sales/999999/events",
        None,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    app.assert_get_error(
        "/api/polls/999999/events",
        None,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let resp = app.get("/api/sales/abc/events", None).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

/// A stream from `client` (as the trusted proxy on loopback names it): its status,
/// and the answer, kept open while it is held.
async fn stream_from(app: &TestApp, path: &str, client: &str) -> reqwest::Response {
    app.client
        .get(app.url(path))
        .header("X-Forwarded-For", client)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn one_client_holds_at_most_its_streams_and_gets_a_slot_back_when_one_closes() {
    let (app, admin, sale) = spawn_with_live_sale_and(5, |c| {
        c.live_interval = Duration::from_millis(100);
        c.max_streams_per_client = 2;
        c.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
    })
    .await;
    let (poll, _) = app.open_poll(&admin, "Which?", &["A", "B"]).await;
    let sale_path = format!("/api/sales/{sale}/events");
    let poll_path = format!("/api/polls/{poll}/events");
    let client = "198.51.100.7";
    // A missing sale's 404 gives its slot back.
    for _ in 0..3 {
        let resp = stream_from(&app, "/api/sales/999999/events", client).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    }
    let first = stream_from(&app, &sale_path, client).await;
    let second = stream_from(&app, &poll_path, client).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(second.status(), StatusCode::OK);
    let client_ip: std::net::IpAddr = client.parse().unwrap();
    assert_eq!(app.state.live.open_streams(client_ip), 2);

    let third = stream_from(&app, &sale_path, client).await;
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        third.headers().contains_key("retry-after"),
        "no Retry-After"
    );
    let body: Value = third.json().await.unwrap();
    assert_eq!(body["error"], "too_many_streams");
    assert_eq!(
        metric::<i64>(&app.metrics_text().await, "stampede_live_refused_total"),
        1
    );
    // Another address is not held back; nor is the page's plain view.
    let other = stream_from(&app, &sale_path, "198.51.100.8").await;
    assert_eq!(other.status(), StatusCode::OK);
    let view = app.get(&format!("/api/sales/{sale}"), None).await;
    assert_eq!(view.status(), StatusCode::OK);

    // IPv6 counts by /64: another address of the same /64 is the same client.
    let v6a = stream_from(&app, &sale_path, "2001:db8:0:7::1").await;
    let v6b = stream_from(&app, &sale_path, "2001:db8:0:7::2").await;
    let v6c = stream_from(&app, &sale_path, "2001:db8:0:7:ffff::3").await;
    assert_eq!(
        (v6a.status(), v6b.status(), v6c.status()),
        (
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        )
    );
    let next_net = stream_from(&app, &sale_path, "2001:db8:0:8::1").await;
    assert_eq!(next_net.status(), StatusCode::OK);

    // A page that leaves gives its slot back: the client may open another.
    drop(first);
    let started = std::time::Instant::now();
    while app.state.live.open_streams(client_ip) > 1 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the closed stream still holds its slot"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = stream_from(&app, &sale_path, client).await;
    assert_eq!(again.status(), StatusCode::OK);
    drop((second, again, other, v6a, v6b, next_net));
}
