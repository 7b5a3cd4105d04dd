//! The first phase: every user joins the line, before the opening.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::ask::{Tally, ask, state_of};
use crate::client::{Conn, Request, Target};
use crate::fire::{REQUEST_TIMEOUT, STORM_TRIES};
use crate::progress::Progress;

/// Every user's join, before the opening.
pub async fn join_all(
    target: &Target,
    sale: i64,
    tokens: Arc<Vec<String>>,
    concurrency: usize,
    progress: Arc<Progress>,
) -> (Tally, Vec<bool>) {
    let next = Arc::new(AtomicUsize::new(0));
    let path = Arc::new(format!("/api/sales/{sale}/queue"));
    let tasks: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (tokens, next, path, progress) =
                (tokens.clone(), next.clone(), path.clone(), progress.clone());
            let mut conn = Conn::new(target.clone(), REQUEST_TIMEOUT);
            tokio::spawn(async move {
                let mut tally = Tally::new();
                let mut joined = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= tokens.len() {
                        break;
                    }
                    let req = Request {
                        method: "POST",
                        path: &path,
                        token: Some(&tokens[i]),
                        forwarded_for: None,
                        idempotency_key: None,
                        body: None,
                    };
                    let mut ok = false;
                    for attempt in 1..=STORM_TRIES {
                        let a = ask(&mut conn, &req, "join", &mut tally, &progress, state_of).await;
                        ok = a.status == 200;
                        if !matches!(a.status, 0 | 503) {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                    }
                    joined.push((i, ok));
                }
                (tally, joined)
            })
        })
        .collect();
    let mut tally = Tally::new();
    let mut joined = vec![false; tokens.len()];
    for task in tasks {
        if let Ok((t, j)) = task.await {
            tally.add(t);
            for (i, ok) in j {
                joined[i] = ok;
            }
        }
    }
    (tally, joined)
}
