//! Firing: what every request sends, the connections that send it (a storm's
//! retries included), and what each connection saw.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use hdrhistogram::Histogram;
use serde_json::Value;
use uuid::Uuid;

use crate::args::Mode;
use crate::client::{Conn, Request, Target};
use crate::latency::{histogram, record_since};
use crate::progress::{Kind, Progress};

/// Tries per user in a storm: a 503, a request the server never answered, or one
/// that came a moment before the opening is sent again (after 50 ms, 100 ms, ...),
/// with the same `Idempotency-Key`: the same purchase, never a second one.
pub const STORM_TRIES: u32 = 20;
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// What every request of the run sends.
pub struct Plan {
    pub mode: Mode,
    pub path: String,
    pub body: Option<Vec<u8>>,
    pub tokens: Vec<String>,
    /// `X-Forwarded-For` per user, when asked for.
    pub addresses: Vec<String>,
    /// `--tickets`: where each purchase gets its ticket first.
    pub ticket_path: Option<String>,
    /// Purchases carry an `Idempotency-Key` (not `--no-keys`).
    pub keys: bool,
}

/// A new `Idempotency-Key`: 32 random hex characters.
fn new_key() -> String {
    Uuid::new_v4().simple().to_string()
}

impl Plan {
    /// The same plan for `users` alone (indexes into `tokens`), in that order.
    pub fn of_users(&self, users: &[usize]) -> Plan {
        Plan {
            mode: self.mode,
            path: self.path.clone(),
            body: self.body.clone(),
            tokens: users.iter().map(|&i| self.tokens[i].clone()).collect(),
            addresses: if self.addresses.is_empty() {
                Vec::new()
            } else {
                users.iter().map(|&i| self.addresses[i].clone()).collect()
            },
            ticket_path: self.ticket_path.clone(),
            keys: self.keys,
        }
    }

    fn request<'a>(&'a self, user: usize, key: Option<&'a str>) -> Request<'a> {
        Request {
            method: if self.mode == Mode::Healthz {
                "GET"
            } else {
                "POST"
            },
            path: &self.path,
            token: self.tokens.get(user).map(String::as_str),
            forwarded_for: self.addresses.get(user).map(String::as_str),
            idempotency_key: key,
            body: self.body.as_deref(),
        }
    }
}

/// What one connection's task saw.
pub struct Seen {
    pub latency_us: Histogram<u64>,
    /// This connection's handles on the live counters of [`Progress`].
    counters: HashMap<Kind, Arc<AtomicU64>>,
    /// When this connection got its first answer.
    pub first_answer: Option<DateTime<Utc>>,
    /// Per user: 202s (with the order id of a purchase), and whether an answer was
    /// ambiguous (503 or none: the decision may have run) or `already_*`.
    pub users: HashMap<usize, UserSeen>,
}

#[derive(Default, Clone)]
pub struct UserSeen {
    pub accepted: Vec<Option<Uuid>>,
    /// Per `Idempotency-Key` sent: the order ids its 202s named (one, however many
    /// replays), and whether its last answer was ambiguous (503 or none).
    pub keys: HashMap<String, KeySeen>,
    pub ambiguous: bool,
    pub already: bool,
    pub decided: bool,
    /// Some answer was a 2xx.
    pub succeeded: bool,
}

#[derive(Default, Clone)]
pub struct KeySeen {
    pub orders: Vec<Uuid>,
    pub unresolved: bool,
}

impl Seen {
    fn new() -> Self {
        Seen {
            latency_us: histogram(),
            counters: HashMap::new(),
            first_answer: None,
            users: HashMap::new(),
        }
    }
}

/// With `--tickets`: the user's ticket, then the purchase carrying it. A ticket
/// refused (not started yet, ended, sold out, ...) is the attempt's answer.
async fn with_ticket(
    conn: &mut Conn,
    plan: &Plan,
    user: usize,
    ticket_path: &str,
    key: Option<&str>,
) -> anyhow::Result<crate::client::Response> {
    let request = plan.request(user, key);
    let ticket = conn
        .send(&Request {
            path: ticket_path,
            body: None,
            idempotency_key: None,
            ..request
        })
        .await?;
    let parsed = (ticket.status == 200)
        .then(|| serde_json::from_slice::<Value>(&ticket.body).ok())
        .flatten();
    let Some(ticket) = parsed.as_ref().and_then(|v| v["ticket"].as_str()) else {
        return Ok(ticket);
    };
    let body = serde_json::json!({ "ticket": ticket }).to_string();
    conn.send(&Request {
        body: Some(body.as_bytes()),
        ..request
    })
    .await
}

/// Sends one request (with `--tickets`, a ticket request and the purchase) and
/// records it; returns its kind.
async fn one(
    conn: &mut Conn,
    plan: &Plan,
    user: usize,
    key: Option<&str>,
    seen: &mut Seen,
    progress: &Progress,
) -> Kind {
    let started = Instant::now();
    let answer = match &plan.ticket_path {
        Some(ticket_path) => with_ticket(conn, plan, user, ticket_path, key).await,
        None => conn.send(&plan.request(user, key)).await,
    };
    record_since(&mut seen.latency_us, started);
    let (kind, order) = match answer {
        Ok(resp) => {
            let parsed = (plan.mode != Mode::Healthz)
                .then(|| serde_json::from_slice::<Value>(&resp.body).ok())
                .flatten();
            let code = parsed
                .as_ref()
                .filter(|_| resp.status >= 400)
                .and_then(|v| v["error"].as_str().map(String::from));
            let order = parsed
                .as_ref()
                .and_then(|v| v["order_id"].as_str().and_then(|s| s.parse().ok()));
            (
                Kind {
                    status: resp.status,
                    code,
                },
                order,
            )
        }
        Err(_) => (
            Kind {
                status: 0,
                code: None,
            },
            None,
        ),
    };
    if seen.first_answer.is_none() {
        seen.first_answer = Some(Utc::now());
    }
    match seen.counters.get(&kind) {
        Some(counter) => counter.fetch_add(1, Ordering::Relaxed),
        None => {
            let counter = progress.counter(&kind);
            seen.counters.insert(kind.clone(), counter.clone());
            counter.fetch_add(1, Ordering::Relaxed)
        }
    };
    if plan.mode != Mode::Healthz {
        let u = seen.users.entry(user).or_default();
        match kind.status {
            202 => u.accepted.push(order),
            0 | 503 => u.ambiguous = true,
            _ => {}
        }
        if let Some(key) = key {
            let k = u.keys.entry(key.to_string()).or_default();
            k.unresolved = matches!(kind.status, 0 | 503);
            if let Some(order) = order.filter(|o| kind.status == 202 && !k.orders.contains(o)) {
                k.orders.push(order);
            }
        }
        u.already |= kind
            .code
            .as_deref()
            .is_some_and(|c| c.starts_with("already_"));
        u.decided |= matches!(kind.status, 200..=299 | 409 | 410) && !kind.retry_in_storm();
        u.succeeded |= (200..=299).contains(&kind.status);
    }
    kind
}

/// When the firing stops.
pub struct Stop {
    pub deadline: Instant,
    pub max_requests: u64,
}

/// `concurrency` connections; in a storm each takes the next user until every user
/// had its turn, else each sends the next request until `stop`.
pub async fn fire(
    target: &Target,
    plan: Arc<Plan>,
    concurrency: usize,
    release_at: Option<Instant>,
    stop: Stop,
    progress: Arc<Progress>,
) -> Vec<Seen> {
    let next = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(stop);
    let users = plan.tokens.len().max(1);
    let tasks: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (plan, next, stop, progress) =
                (plan.clone(), next.clone(), stop.clone(), progress.clone());
            let mut conn = Conn::new(target.clone(), REQUEST_TIMEOUT);
            tokio::spawn(async move {
                let mut seen = Seen::new();
                if let Some(at) = release_at {
                    // Connect before the opening, so the storm is requests, not handshakes.
                    let _ = conn.send(&Request::HEALTHZ).await;
                    tokio::time::sleep_until(at.into()).await;
                }
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if plan.mode == Mode::Storm {
                        if i >= users {
                            break;
                        }
                        // One purchase, one key, however often it is retried.
                        let key = plan.keys.then(new_key);
                        for attempt in 1..=STORM_TRIES {
                            let kind =
                                one(&mut conn, &plan, i, key.as_deref(), &mut seen, &progress)
                                    .await;
                            if !kind.retry_in_storm() || attempt == STORM_TRIES {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt)))
                                .await;
                        }
                    } else {
                        if i as u64 >= stop.max_requests || Instant::now() >= stop.deadline {
                            break;
                        }
                        // Each request a purchase of its own: a key of its own.
                        let key = plan.keys.then(new_key);
                        one(
                            &mut conn,
                            &plan,
                            i % users,
                            key.as_deref(),
                            &mut seen,
                            &progress,
                        )
                        .await;
                    }
                }
                seen
            })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        if let Ok(seen) = task.await {
            out.push(seen);
        }
    }
    out
}
