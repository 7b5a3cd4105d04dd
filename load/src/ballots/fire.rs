//! Firing a `--ballot` run: `--concurrency` connections, each taking the next
//! voter and sending its requests in order; a 503 or a lost answer is sent again
//! with the same key (the same request, never a second vote).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::Value;
use uuid::Uuid;

use super::script::Step;
use crate::client::{Conn, Request, Target};
use crate::fire::REQUEST_TIMEOUT;
use crate::latency::{histogram, record_since};
use crate::progress::{Kind, Progress};

/// Tries per request: the first, then again after 50 ms, 100 ms, ... while the
/// answer is a 503 or none.
const TRIES: u32 = 10;

/// A request's answer, as the checks read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub code: Option<String>,
    pub receipt: Option<Uuid>,
    pub replaced: Option<bool>,
    pub remaining: Option<i64>,
}

impl Answer {
    fn of(status: u16, body: &[u8]) -> Answer {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        Answer {
            status,
            code: (status >= 400)
                .then(|| v["error"].as_str().map(String::from))
                .flatten(),
            receipt: v["receipt"].as_str().and_then(|s| s.parse().ok()),
            replaced: v["replaced"].as_bool(),
            remaining: v["remaining"].as_i64(),
        }
    }
}

/// One voter's answers, step by step; a voter stops at a request that got no
/// clear answer in [`TRIES`] (`unresolved`: it may have counted).
#[derive(Default, Clone)]
pub struct Voted {
    pub answers: Vec<Answer>,
    pub unresolved: bool,
}

/// Fires every voter's steps; what each voter got, and the latency of every request.
pub async fn fire_voters(
    target: &Target,
    path: &str,
    tokens: Arc<Vec<String>>,
    voters: Arc<Vec<Vec<Step>>>,
    concurrency: usize,
    progress: Arc<Progress>,
) -> (Histogram<u64>, Vec<Voted>) {
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (tokens, voters, next, progress) = (
                tokens.clone(),
                voters.clone(),
                next.clone(),
                progress.clone(),
            );
            let path = path.to_string();
            let mut conn = Conn::new(target.clone(), REQUEST_TIMEOUT);
            tokio::spawn(async move {
                let mut latency = histogram();
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let (Some(token), Some(steps)) = (tokens.get(i), voters.get(i)) else {
                        break;
                    };
                    let mut voted = Voted::default();
                    for step in steps {
                        let req = Request {
                            method: "POST",
                            path: &path,
                            token: Some(token),
                            forwarded_for: None,
                            idempotency_key: Some(&step.key),
                            body: Some(step.body.as_bytes()),
                        };
                        match send(&mut conn, &req, &mut latency, &progress).await {
                            Some(answer) => voted.answers.push(answer),
                            None => {
                                voted.unresolved = true;
                                break;
                            }
                        }
                    }
                    out.push((i, voted));
                }
                (latency, out)
            })
        })
        .collect();
    let mut latency = histogram();
    let mut voted = vec![Voted::default(); voters.len()];
    for task in tasks {
        if let Ok((h, out)) = task.await {
            latency.add(&h).expect("same bounds");
            for (i, v) in out {
                voted[i] = v;
            }
        }
    }
    (latency, voted)
}

/// Sends `req` until it gets an answer other than a 503, counting every answer.
async fn send(
    conn: &mut Conn,
    req: &Request<'_>,
    latency: &mut Histogram<u64>,
    progress: &Progress,
) -> Option<Answer> {
    for attempt in 1..=TRIES {
        let started = Instant::now();
        let answer = conn.send(req).await;
        record_since(latency, started);
        let answer = match answer {
            Ok(resp) => Answer::of(resp.status, &resp.body),
            Err(_) => Answer::of(0, b""),
        };
        let kind = Kind {
            status: answer.status,
            code: answer.code.clone(),
        };
        progress.counter(&kind).fetch_add(1, Ordering::Relaxed);
        if !matches!(answer.status, 0 | 503) {
            return Some(answer);
        }
        if attempt < TRIES {
            tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
        }
    }
    None
}
