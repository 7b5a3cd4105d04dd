//! Open pages through a Redis outage (`src/live.rs`): a sale's event stream stays
//! open while Redis is killed (a failed read keeps the last view; the page sees
//! nothing but keep-alive comments, never an error), and once Redis is back and the
//! sale rebuilt, the same stream carries the next change without reconnecting.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::harness::{Options, Stack};

/// An open event stream: what it sent, event by event.
struct Stream {
    resp: reqwest::Response,
    buf: String,
}

/// What a stream sent next.
#[derive(Debug)]
enum Sent {
    View(Value),
    Comment,
    Ended,
}

impl Stream {
    /// The next event or comment, or `None` when nothing came within `wait`.
    async fn next(&mut self, wait: Duration) -> Option<Sent> {
        tokio::time::timeout(wait, async {
            loop {
                if let Some(end) = self.buf.find("\n\n") {
                    let event: String = self.buf.drain(..end + 2).collect();
                    if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                        return Sent::View(serde_json::from_str(data).unwrap());
                    }
                    if event.starts_with(':') {
                        return Sent::Comment;
                    }
                    continue; // `retry:`
                }
                match self.resp.chunk().await {
                    Ok(Some(chunk)) => self.buf.push_str(std::str::from_utf8(&chunk).unwrap()),
                    _ => return Sent::Ended,
                }
            }
        })
        .await
        .ok()
    }

    /// The next view within `wait`, skipping comments; panics on an end.
    async fn next_view(&mut self, wait: Duration) -> Value {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some(Sent::View(view)) => return view,
                Some(Sent::Comment) => continue,
                Some(Sent::Ended) => panic!("the stream ended"),
                None => panic!("no view within {wait:?}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sale_stream_outlives_a_redis_kill_and_carries_changes_after_it() {
    let mut stack = Stack::start("live-streams", Options::default()).await;
    let users = stack.create_users(2, false).await;
    let sale = stack.create_sales(&[10]).await[0];
    let base = stack.bases()[0].clone();
    let http = stack.http.clone();
    let buy = |token: String| {
        let (http, url) = (http.clone(), format!("{base}/api/sales/{sale}/purchase"));
        async move {
            http.post(url)
                .bearer_auth(token)
                .send()
                .await
                .map(|r| r.status())
        }
    };

    // A client of its own: the stack's gives up on any answer after 15 s, and a
    // stream is one answer that lasts.
    let resp = reqwest::Client::new()
        .get(format!("{base}/api/sales/{sale}/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut stream = Stream {
        resp,
        buf: String::new(),
    };
    assert_eq!(
        stream.next_view(Duration::from_secs(5)).await["stock_left"],
        10
    );
    assert_eq!(
        buy(users[0].token.clone()).await.unwrap(),
        StatusCode::ACCEPTED
    );
    assert_eq!(
        stream.next_view(Duration::from_secs(5)).await["stock_left"],
        9
    );

    stack.redis.kill9();
    // Down for 7 s: more than five read intervals, so a keep-alive comment comes;
    // the stream neither ends nor sends anything but comments.
    let down_until = Instant::now() + Duration::from_secs(7);
    let mut comments = 0;
    while let Some(left) = down_until.checked_duration_since(Instant::now()) {
        match stream.next(left).await {
            None => break,
            Some(Sent::Comment) => comments += 1,
            Some(other) => panic!("while Redis was down the stream sent {other:?}"),
        }
    }
    assert!(comments >= 1, "no keep-alive while Redis was down");

    stack.start_redis().await;
    // The sale is rebuilt from Postgres on its first use (503 `recovering` until
    // then); the second user's purchase goes through once it is.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match buy(users[1].token.clone()).await {
            Ok(StatusCode::ACCEPTED) => break,
            Ok(status) => assert!(
                status == StatusCode::SERVICE_UNAVAILABLE,
                "after the restart a purchase answered {status}"
            ),
            Err(e) => panic!("purchase failed: {e}"),
        }
        assert!(Instant::now() < deadline, "no purchase decided within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The same stream, never reopened, shows it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view = stream.next_view(Duration::from_secs(10)).await;
        if view["stock_left"] == 8 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stream never showed the purchase: last {view}"
        );
    }
}
