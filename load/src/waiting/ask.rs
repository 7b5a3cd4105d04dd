//! One request of the waiting room's run, recorded: its answer and latency by
//! phase on the connection's [`Tally`], and its kind on the live line.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use hdrhistogram::Histogram;
use serde_json::Value;

use crate::client::{Conn, Request};
use crate::latency::{histogram, record_since};
use crate::progress::{Kind, Progress};

/// Answers and latency of one phase's requests on one connection.
pub struct Tally {
    pub latency_us: Histogram<u64>,
    /// `<phase> <status> [code or state]` -> count.
    pub answers: BTreeMap<String, u64>,
    /// Answers 500 and over, and requests never answered.
    pub server_errors: u64,
    pub no_answer: u64,
}

impl Tally {
    pub fn new() -> Tally {
        Tally {
            latency_us: histogram(),
            answers: BTreeMap::new(),
            server_errors: 0,
            no_answer: 0,
        }
    }

    pub fn add(&mut self, other: Tally) {
        self.latency_us.add(&other.latency_us).expect("same bounds");
        for (k, n) in other.answers {
            *self.answers.entry(k).or_default() += n;
        }
        self.server_errors += other.server_errors;
        self.no_answer += other.no_answer;
    }
}

/// One answer: status (0: none came), the JSON body, its kind.
pub struct Answer {
    pub status: u16,
    pub body: Option<Value>,
    pub kind: Kind,
}

/// Sends `req`, records it in `tally` (labelled `phase`, with `detail` of a 200
/// when given: the standing's state) and in `progress` (the live line).
pub async fn ask(
    conn: &mut Conn,
    req: &Request<'_>,
    phase: &str,
    tally: &mut Tally,
    progress: &Progress,
    detail: fn(&Value) -> Option<String>,
) -> Answer {
    let started = Instant::now();
    let resp = conn.send(req).await;
    record_since(&mut tally.latency_us, started);
    let (status, body) = match resp {
        Ok(r) => (r.status, serde_json::from_slice::<Value>(&r.body).ok()),
        Err(_) => (0, None),
    };
    let code = match (status, &body) {
        (400.., Some(v)) => v["error"].as_str().map(String::from),
        (200, Some(v)) => detail(v),
        _ => None,
    };
    let kind = Kind { status, code };
    progress.counter(&kind).fetch_add(1, Ordering::Relaxed);
    *tally
        .answers
        .entry(format!("{phase} {}", kind.label()))
        .or_default() += 1;
    match status {
        0 => tally.no_answer += 1,
        500.. => tally.server_errors += 1,
        _ => {}
    }
    Answer { status, body, kind }
}

/// No detail: the answer's status and code say it all.
pub fn no_detail(_: &Value) -> Option<String> {
    None
}

/// A standing's `state` (`waiting`, `admitted`, ...).
pub fn state_of(v: &Value) -> Option<String> {
    v["state"].as_str().map(String::from)
}
