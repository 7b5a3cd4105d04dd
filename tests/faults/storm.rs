//! The storm: a bounded, paced client that sends purchases (and votes and admin
//! stock changes) to the servers of a stack and records every answer. It stops by
//! itself after `max_requests` requests or `max_duration`, whichever comes first.
//!
//! Each work item is tried until it gets a decided answer; a 503 is retried after
//! its `Retry-After` (capped at a second), a request without an answer (a killed
//! server, a reset connection) on the next server, up to `max_tries` times.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use rand::seq::SliceRandom;
use reqwest::Client;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::harness::User;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Purchase {
        sale: i64,
    },
    Vote {
        poll: i64,
        option: i64,
    },
    /// `POST /api/admin/sales/{sale}/stock` with `{"add": n}` or `{"set": n}`.
    Stock {
        sale: i64,
        body: String,
    },
    /// A vote of any ballot kind (`body`, JSON) under its `Idempotency-Key`, which
    /// every retry of the work item sends again (see `ballots.rs`).
    Ballot {
        poll: i64,
        body: Arc<str>,
        key: Arc<str>,
    },
}

impl Op {
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Purchase { .. } => "purchase",
            Op::Vote { .. } => "vote",
            Op::Stock { .. } => "stock",
            Op::Ballot { .. } => "ballot",
        }
    }

    fn path(&self) -> String {
        match self {
            Op::Purchase { sale } => format!("/api/sales/{sale}/purchase"),
            Op::Vote { poll, .. } | Op::Ballot { poll, .. } => format!("/api/polls/{poll}/votes"),
            Op::Stock { sale, .. } => format!("/api/admin/sales/{sale}/stock"),
        }
    }

    fn body(&self) -> Option<Value> {
        match self {
            Op::Purchase { .. } => None,
            Op::Vote { option, .. } => Some(json!({ "option_id": option })),
            Op::Stock { body, .. } => Some(serde_json::from_str(body).unwrap()),
            Op::Ballot { body, .. } => Some(serde_json::from_str(body).unwrap()),
        }
    }

    fn idempotency_key(&self) -> Option<&str> {
        match self {
            Op::Ballot { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// One thing to do: an op on behalf of a user, first sent to `server`.
#[derive(Clone, Debug)]
pub struct Work {
    pub user: i64,
    pub token: Arc<str>,
    pub op: Op,
    pub server: usize,
}

/// What one HTTP attempt got.
#[derive(Clone, Debug)]
pub enum Outcome {
    Answer {
        status: u16,
        /// `error` of a JSON error body.
        code: Option<String>,
        /// `order_id` of a 202 purchase.
        order_id: Option<Uuid>,
        /// `order_ids` of a 409 `already_bought`: the order that makes the buyer
        /// one (empty when the body names none).
        order_ids: Vec<Uuid>,
        /// `receipt` of a 202 vote.
        receipt: Option<Uuid>,
        /// `Idempotent-Replayed: true`: the first answer to this key, again.
        replayed: bool,
        retry_after: Option<String>,
    },
    /// No (complete) answer, as `<kind>: <error>`, the kind one of `timeout`,
    /// `refused` (no connection made), `reset` (the connection failed otherwise) or
    /// `cut off` (the body did not arrive whole). The request may have run.
    NoAnswer(String),
}

impl Outcome {
    /// What a request got: its outcome, and its JSON body (null when it has none).
    pub async fn of(sent: reqwest::Result<reqwest::Response>) -> (Outcome, Value) {
        let resp = match sent {
            Err(e) => {
                let kind = if e.is_timeout() {
                    "timeout"
                } else if e.is_connect() {
                    "refused"
                } else {
                    "reset"
                };
                return (Outcome::NoAnswer(format!("{kind}: {e}")), Value::Null);
            }
            Ok(resp) => resp,
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let replayed = resp
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        match resp.bytes().await {
            Err(e) => {
                let lost = format!("cut off: status {status}, body lost: {e}");
                (Outcome::NoAnswer(lost), Value::Null)
            }
            Ok(bytes) => {
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let outcome = Outcome::Answer {
                    status,
                    code: body["error"].as_str().map(str::to_string),
                    order_id: body["order_id"]
                        .as_str()
                        .and_then(|s| Uuid::parse_str(s).ok()),
                    order_ids: body["order_ids"]
                        .as_array()
                        .map(|ids| {
                            ids.iter()
                                .filter_map(|id| Uuid::parse_str(id.as_str()?).ok())
                                .collect()
                        })
                        .unwrap_or_default(),
                    receipt: body["receipt"]
                        .as_str()
                        .and_then(|s| Uuid::parse_str(s).ok()),
                    replayed,
                    retry_after,
                };
                (outcome, body)
            }
        }
    }
}

#[derive(Clone, Debug)]
pub struct Record {
    pub user: i64,
    pub op: Op,
    /// Sent with an `Idempotency-Key` (every retry of the work item with the same).
    pub keyed: bool,
    pub server: usize,
    pub attempt: u32,
    pub sent: Instant,
    pub answered: Instant,
    pub outcome: Outcome,
}

impl Record {
    pub fn status(&self) -> Option<u16> {
        match &self.outcome {
            Outcome::Answer { status, .. } => Some(*status),
            Outcome::NoAnswer(_) => None,
        }
    }

    pub fn code(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Answer { code, .. } => code.as_deref(),
            Outcome::NoAnswer(_) => None,
        }
    }

    pub fn is_accepted(&self) -> bool {
        self.status() == Some(202)
    }

    pub fn order_id(&self) -> Option<Uuid> {
        match &self.outcome {
            Outcome::Answer { order_id, .. } => *order_id,
            Outcome::NoAnswer(_) => None,
        }
    }

    /// The orders a 409 `already_bought` names (`order_ids`).
    pub fn order_ids(&self) -> &[Uuid] {
        match &self.outcome {
            Outcome::Answer { order_ids, .. } => order_ids,
            Outcome::NoAnswer(_) => &[],
        }
    }

    /// Ambiguous: no answer, or a 503 (the script may have run).
    pub fn is_ambiguous(&self) -> bool {
        self.status().is_none_or(|s| s == 503)
    }

    pub fn receipt(&self) -> Option<Uuid> {
        match &self.outcome {
            Outcome::Answer { receipt, .. } => *receipt,
            Outcome::NoAnswer(_) => None,
        }
    }

    pub fn is_replayed(&self) -> bool {
        matches!(self.outcome, Outcome::Answer { replayed: true, .. })
    }

    /// The poll and `Idempotency-Key` of a ballot.
    pub fn ballot(&self) -> Option<(i64, &str)> {
        match &self.op {
            Op::Ballot { poll, key, .. } => Some((*poll, key)),
            _ => None,
        }
    }

    pub fn sale(&self) -> Option<i64> {
        match self.op {
            Op::Purchase { sale } => Some(sale),
            _ => None,
        }
    }

    /// Decided by the server: accepted or refused for a reason of the sale/poll.
    pub fn is_decided(&self) -> bool {
        match self.op {
            // 422 `over_budget`: refused by the poll's script.
            Op::Ballot { .. } => matches!(self.status(), Some(202 | 409 | 422)),
            _ => matches!(self.status(), Some(200 | 202 | 409 | 410)),
        }
    }

    /// Worth another try: the server could not decide, or we never heard. A stock
    /// change we never heard about is not sent again: it may have been recorded,
    /// and an `add` sent twice adds twice (a 503 comes before it is recorded).
    fn retry_after(&self) -> Option<Duration> {
        match &self.outcome {
            Outcome::NoAnswer(_) if matches!(self.op, Op::Stock { .. }) => None,
            Outcome::NoAnswer(_) => Some(Duration::from_millis(200)),
            // actix answers 408 on a connection whose first request head it did not
            // read within 5 s, e.g. one the client pool opened and left idle: the
            // request was never read, so sending it again is safe.
            Outcome::Answer { status: 408, .. } => Some(Duration::from_millis(50)),
            Outcome::Answer {
                status: 503,
                retry_after,
                ..
            } => {
                let secs = retry_after
                    .as_deref()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .unwrap_or(1);
                // Honour Retry-After, but keep the storm moving: at most a second.
                Some(Duration::from_millis((secs * 1000).clamp(100, 1000)))
            }
            _ => None,
        }
    }

    /// `purchase 410 sold_out` or `purchase no answer`.
    pub fn label(&self) -> String {
        match &self.outcome {
            Outcome::Answer { status, code, .. } => match code {
                Some(c) => format!("{} {status} {c}", self.op.kind()),
                None => format!("{} {status}", self.op.kind()),
            },
            Outcome::NoAnswer(_) => format!("{} no answer", self.op.kind()),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Plan {
    /// Requests per second, retries included.
    pub rate: f64,
    /// Requests in flight at most.
    pub concurrency: usize,
    pub max_requests: usize,
    pub max_duration: Duration,
    /// Tries per work item.
    pub max_tries: u32,
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            rate: 300.0,
            concurrency: 128,
            max_requests: 6_000,
            max_duration: Duration::from_secs(20),
            max_tries: 40,
        }
    }
}

impl Plan {
    /// The default plan at `rate` requests per second.
    pub fn at_rate(rate: f64) -> Plan {
        Plan {
            rate,
            ..Plan::default()
        }
    }

    /// This plan, ending after `max_duration` at the latest.
    pub fn lasting(self, max_duration: Duration) -> Plan {
        Plan {
            max_duration,
            ..self
        }
    }

    /// `items` work items with up to `concurrency` requests in flight, released as
    /// fast as the client can send them, each tried until it is decided.
    pub fn burst(items: usize, concurrency: usize) -> Plan {
        Plan {
            rate: 20_000.0,
            concurrency,
            max_requests: items * 60 + 100,
            max_duration: Duration::from_secs(60),
            max_tries: 60,
        }
    }
}

/// The order id of each 202 of `sale`, by user.
pub fn orders_of(records: &[Record], sale: i64) -> HashMap<i64, Uuid> {
    records
        .iter()
        .filter(|r| r.is_accepted() && r.sale() == Some(sale))
        .filter_map(|r| Some((r.user, r.order_id()?)))
        .collect()
}

/// Every user tries every sale, in random order; `repeat_share` of the pairs are
/// tried a second time later (they must answer 409, never a second 202).
pub fn purchases(users: &[User], sales: &[i64], servers: usize, repeat_share: f64) -> Vec<Work> {
    let mut rng = rand::rng();
    let mut work: Vec<Work> = Vec::with_capacity(users.len() * sales.len());
    for u in users {
        let token: Arc<str> = u.token.as_str().into();
        for &sale in sales {
            work.push(Work {
                user: u.id,
                token: token.clone(),
                op: Op::Purchase { sale },
                server: 0,
            });
        }
    }
    work.shuffle(&mut rng);
    let repeats = (work.len() as f64 * repeat_share) as usize;
    let again: Vec<Work> = work.iter().take(repeats).cloned().collect();
    // Repeats go into the later half, after (most of) their first tries.
    for w in again {
        let at = rng.random_range(work.len() / 2..=work.len());
        work.insert(at, w);
    }
    spread(&mut work, servers);
    work
}

/// Each user votes once for a random option.
pub fn votes(users: &[User], poll: i64, options: &[i64], servers: usize) -> Vec<Work> {
    let mut rng = rand::rng();
    let mut work: Vec<Work> = users
        .iter()
        .map(|u| Work {
            user: u.id,
            token: u.token.as_str().into(),
            op: Op::Vote {
                poll,
                option: options[rng.random_range(0..options.len())],
            },
            server: 0,
        })
        .collect();
    work.shuffle(&mut rng);
    spread(&mut work, servers);
    work
}

/// Assigns work items to servers in turn.
pub fn spread(work: &mut [Work], servers: usize) {
    for (i, w) in work.iter_mut().enumerate() {
        w.server = i % servers.max(1);
    }
}

/// Live counters of a running storm.
#[derive(Default)]
pub struct Progress {
    pub sent: AtomicUsize,
    pub accepted: AtomicUsize,
    pub decided: AtomicUsize,
    pub unavailable: AtomicUsize,
    pub no_answer: AtomicUsize,
    /// Per sale, when the latest purchase that only its Redis script can have
    /// answered was sent: 202, 409 `already_bought`, or 503 `not_replicated`
    /// (decided on the primary, unconfirmed by a replica). Not 410: a server that
    /// has seen the sale sold out answers that from memory.
    pub decided_sent: Mutex<HashMap<i64, Instant>>,
}

pub struct Storm {
    pub started: Instant,
    pub progress: Arc<Progress>,
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<Vec<Record>>>,
}

struct Pacer {
    next: Mutex<Instant>,
    interval: Duration,
    issued: AtomicUsize,
    max_requests: usize,
    deadline: Instant,
    stop: Arc<AtomicBool>,
}

impl Pacer {
    /// Waits for this request's turn; false when the storm's budget is spent.
    async fn turn(&self) -> bool {
        if self.stop.load(Ordering::Relaxed)
            || self.issued.fetch_add(1, Ordering::Relaxed) >= self.max_requests
            || Instant::now() >= self.deadline
        {
            return false;
        }
        let at = {
            let mut next = self.next.lock().unwrap();
            let now = Instant::now();
            // After a stall, catch up by at most 100 ms worth of requests.
            let floor = now.checked_sub(Duration::from_millis(100)).unwrap_or(now);
            let at = (*next).max(floor);
            *next = at + self.interval;
            at
        };
        tokio::time::sleep_until(at.into()).await;
        Instant::now() < self.deadline && !self.stop.load(Ordering::Relaxed)
    }
}

impl Storm {
    /// Starts the storm in the background; [`Storm::finish`] collects the records.
    pub fn start(http: &Client, bases: Vec<String>, work: Vec<Work>, plan: Plan) -> Storm {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let pacer = Arc::new(Pacer {
            next: Mutex::new(started),
            interval: Duration::from_secs_f64(1.0 / plan.rate),
            issued: AtomicUsize::new(0),
            max_requests: plan.max_requests,
            deadline: started + plan.max_duration,
            stop: stop.clone(),
        });
        let queue = Arc::new(Mutex::new(VecDeque::from(work)));
        let progress = Arc::new(Progress::default());
        let bases = Arc::new(bases);
        let workers = (0..plan.concurrency)
            .map(|_| {
                let (http, bases, queue, pacer, progress) = (
                    http.clone(),
                    bases.clone(),
                    queue.clone(),
                    pacer.clone(),
                    progress.clone(),
                );
                let max_tries = plan.max_tries;
                tokio::spawn(async move {
                    let mut records = Vec::new();
                    'work: loop {
                        let Some(item) = queue.lock().unwrap().pop_front() else {
                            break;
                        };
                        for attempt in 0..max_tries {
                            if !pacer.turn().await {
                                break 'work;
                            }
                            let server = (item.server + attempt as usize) % bases.len();
                            let rec = send(&http, &bases[server], &item, server, attempt).await;
                            progress.count(&rec);
                            let again = rec.retry_after();
                            records.push(rec);
                            match again {
                                None => break,
                                // Unanswered and another server to try: try it now.
                                Some(_)
                                    if bases.len() > 1
                                        && records.last().unwrap().status().is_none() => {}
                                Some(d) => {
                                    let jitter = rand::rng().random_range(0..50);
                                    tokio::time::sleep(d + Duration::from_millis(jitter)).await;
                                }
                            }
                        }
                    }
                    records
                })
            })
            .collect();
        Storm {
            started,
            progress,
            stop,
            workers,
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Waits until `n` requests were accepted (or panics after `timeout`).
    pub async fn wait_accepted(&self, n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.progress.accepted.load(Ordering::Relaxed) < n {
            assert!(
                Instant::now() < deadline,
                "the storm had {} accepted requests after {timeout:?}, waited for {n}",
                self.progress.accepted.load(Ordering::Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `more` requests got a decided answer (202, 409, 410, 200) from
    /// now on; false after `timeout`. Shows that a stack serves again after a fault.
    pub async fn wait_decided(&self, more: usize, timeout: Duration) -> bool {
        let base = self.progress.decided.load(Ordering::Relaxed);
        let deadline = Instant::now() + timeout;
        while self.progress.decided.load(Ordering::Relaxed) < base + more {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// Waits until a purchase of one of `sales` sent after `since` was answered by
    /// the sale's Redis script (see [`Progress::decided_sent`]); false after
    /// `timeout`.
    pub async fn wait_decided_on(&self, sales: &[i64], since: Instant, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let decided = self
                .progress
                .decided_sent
                .lock()
                .unwrap()
                .iter()
                .any(|(sale, sent)| sales.contains(sale) && *sent > since);
            if decided {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops sending new requests now (in-flight ones finish).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Waits for the storm to end by itself and returns every record.
    pub async fn finish(self) -> Vec<Record> {
        let mut all = Vec::new();
        for w in self.workers {
            all.extend(w.await.expect("storm worker panicked"));
        }
        all.sort_by_key(|r| r.sent);
        println!(
            "storm: {} requests in {:.1?}: {}",
            all.len(),
            self.started.elapsed(),
            summary(&all)
        );
        all
    }
}

impl Progress {
    fn count(&self, rec: &Record) {
        self.sent.fetch_add(1, Ordering::Relaxed);
        if rec.is_accepted() {
            self.accepted.fetch_add(1, Ordering::Relaxed);
        }
        if rec.is_decided() {
            self.decided.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(sale) = rec.sale()
            && (matches!(rec.status(), Some(202 | 409)) || rec.code() == Some("not_replicated"))
        {
            let mut decided = self.decided_sent.lock().unwrap();
            let latest = decided.entry(sale).or_insert(rec.sent);
            *latest = (*latest).max(rec.sent);
        }
        match rec.status() {
            Some(503) => {
                self.unavailable.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.no_answer.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

async fn send(http: &Client, base: &str, item: &Work, server: usize, attempt: u32) -> Record {
    let sent = Instant::now();
    let mut req = http
        .post(format!("{base}{}", item.op.path()))
        .bearer_auth(&*item.token);
    if let Some(body) = item.op.body() {
        req = req.json(&body);
    }
    if let Some(key) = item.op.idempotency_key() {
        req = req.header("Idempotency-Key", key);
    }
    let (outcome, _) = Outcome::of(req.send().await).await;
    Record {
        user: item.user,
        op: item.op.clone(),
        keyed: item.op.idempotency_key().is_some(),
        server,
        attempt,
        sent,
        answered: Instant::now(),
        outcome,
    }
}

/// Runs a small batch of work to completion (fast, no pacing to speak of).
pub async fn run_all(http: &Client, bases: Vec<String>, work: Vec<Work>) -> Vec<Record> {
    run_together(http, bases, work, 64).await
}

/// Runs a batch of work to completion with up to `concurrency` requests in
/// flight, released as fast as the client can send them.
pub async fn run_together(
    http: &Client,
    bases: Vec<String>,
    work: Vec<Work>,
    concurrency: usize,
) -> Vec<Record> {
    let plan = Plan::burst(work.len(), concurrency);
    Storm::start(http, bases, work, plan).finish().await
}

/// `purchase 202: 812, purchase 410 sold_out: 3021, ...`, most frequent first.
pub fn summary(records: &[Record]) -> String {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for r in records {
        *counts.entry(r.label()).or_default() += 1;
    }
    let mut v: Vec<(String, usize)> = counts.into_iter().collect();
    v.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    v.iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
