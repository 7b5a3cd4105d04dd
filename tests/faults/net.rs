//! What the network-fault scenarios (issue 53: `net_redis.rs`, `net_partition.rs`,
//! `net_postgres.rs`) share: their durations (short in CI, the in
//! `scripts/faults`), a sampler of `/readyz`, the bound on an answer's time, and
//! the figures each prints.
//!
//! Durations: `STAMPEDE_NETFAULT_SECS=<s>` sets every fault's length;
//! `STAMPEDE_NETFAULTS_FULL=1` (what `scripts/faults` sets) the lengths
//! (15 to 30 s); neither, the CI's few seconds.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reqwest::Client;
use tokio::task::JoinHandle;

use crate::storm::{Plan, Record};

/// `STAMPEDE_REDIS_RESPONSE_TIMEOUT_MS`'s default (docs/operations.md): a Redis
/// command slower than this fails with 503.
pub const REDIS_RESPONSE_TIMEOUT: Duration = Duration::from_millis(2000);

/// The longest a purchase may take while a dependency is slow or gone
/// (docs/operations.md, "Network faults"): the Redis response timeout plus a
/// second.
pub const ANSWER_BOUND: Duration = Duration::from_millis(3000);

/// Back to normal this long after healing: every purchase sent from then on is
/// decided (202, 409, 410), none 503 or unanswered.
pub const RECOVERY: Duration = Duration::from_secs(2);

/// How long a fault lasts: `STAMPEDE_NETFAULT_SECS`, else `full` seconds under
/// `STAMPEDE_NETFAULTS_FULL`, else `ci` seconds.
pub fn fault_length(ci: u64, full: u64) -> Duration {
    if let Some(s) = std::env::var("STAMPEDE_NETFAULT_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    {
        return Duration::from_secs_f64(s);
    }
    match std::env::var_os("STAMPEDE_NETFAULTS_FULL") {
        Some(_) => Duration::from_secs(full),
        None => Duration::from_secs(ci),
    }
}

/// A storm plan at `rate` requests a second lasting until `fault` is over and
/// `after` more (with room for the warm-up before it).
pub fn plan_around(rate: f64, fault: Duration, after: Duration) -> Plan {
    let lasting = Duration::from_secs(4) + fault + after;
    Plan {
        max_requests: (rate * lasting.as_secs_f64()) as usize + 1_000,
        ..Plan::at_rate(rate).lasting(lasting)
    }
}

/// One `/readyz` answer: the server, when it was asked, its status (`None`: no
/// answer within 5 s) and how long it took.
#[derive(Clone, Debug)]
pub struct Ready {
    pub server: usize,
    pub at: Instant,
    pub status: Option<u16>,
    pub took: Duration,
}

/// Asks `path` (`/readyz` or `/readyz/postgres`) of every server every 200 ms
/// until stopped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Vec<Ready>>,
}

impl Sampler {
    pub fn start(http: &Client, bases: Vec<String>, path: &'static str) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let (http, halt) = (http.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut out = Vec::new();
            while !halt.load(Ordering::Relaxed) {
                let asks = bases.iter().enumerate().map(|(server, base)| {
                    let http = http.clone();
                    let url = format!("{base}{path}");
                    async move {
                        let at = Instant::now();
                        let resp = http.get(url).timeout(Duration::from_secs(5)).send().await;
                        let status = resp.ok().map(|r| r.status().as_u16());
                        Ready {
                            server,
                            at,
                            status,
                            took: at.elapsed(),
                        }
                    }
                });
                out.extend(futures_util::future::join_all(asks).await);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            out
        });
        Sampler { stop, task }
    }

    pub async fn finish(self) -> Vec<Ready> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the readiness sampler")
    }
}

/// The statuses `server` answered to samples asked in `[from, to)`.
pub fn statuses(samples: &[Ready], server: usize, from: Instant, to: Instant) -> Vec<Option<u16>> {
    samples
        .iter()
        .filter(|s| s.server == server && s.at >= from && s.at < to)
        .map(|s| s.status)
        .collect()
}

/// The records sent in `[from, to)`.
pub fn sent_between(records: &[Record], from: Instant, to: Instant) -> Vec<Record> {
    records
        .iter()
        .filter(|r| r.sent >= from && r.sent < to)
        .cloned()
        .collect()
}

/// The slowest answer among `records`: its time and label.
pub fn slowest(records: &[Record]) -> (Duration, String) {
    records
        .iter()
        .map(|r| (r.answered - r.sent, r.label()))
        .max_by_key(|(d, _)| *d)
        .unwrap_or((Duration::ZERO, "none".into()))
}

/// Fails on any answer slower than [`ANSWER_BOUND`], naming the first few.
pub fn assert_answers_bounded(records: &[Record], what: &str) {
    let late: Vec<String> = records
        .iter()
        .filter(|r| r.answered - r.sent > ANSWER_BOUND)
        .take(10)
        .map(|r| {
            format!(
                "{} after {:.2?} (server #{})",
                r.label(),
                r.answered - r.sent,
                r.server
            )
        })
        .collect();
    assert!(
        late.is_empty(),
        "{what}: {} answers later than {ANSWER_BOUND:?}: {}",
        records
            .iter()
            .filter(|r| r.answered - r.sent > ANSWER_BOUND)
            .count(),
        late.join("; ")
    );
}

/// From the heal on: the first purchase sent after it that was decided, how long
/// after the heal its answer came (the time to recover), and every purchase sent
/// [`RECOVERY`] after the heal decided (none 503, none unanswered).
pub fn assert_recovered(records: &[Record], healed: Instant, servers: &[usize]) -> Duration {
    let recovered = records
        .iter()
        .filter(|r| r.sent >= healed && servers.contains(&r.server) && r.is_decided())
        .map(|r| r.answered - healed)
        .min()
        .expect("a purchase sent after healing was decided");
    let after: Vec<&Record> = records
        .iter()
        .filter(|r| r.sent >= healed + RECOVERY && servers.contains(&r.server))
        .collect();
    let undecided: Vec<String> = after
        .iter()
        .filter(|r| !r.is_decided())
        .take(10)
        .map(|r| {
            format!(
                "{} at heal+{:.2?} (answered in {:.2?}, attempt {})",
                r.label(),
                r.sent - healed,
                r.answered - r.sent,
                r.attempt
            )
        })
        .collect();
    assert!(
        !after.is_empty(),
        "no purchase was sent {RECOVERY:?} after healing: the storm ended too soon"
    );
    assert!(
        undecided.is_empty(),
        "not back to normal {RECOVERY:?} after healing: {} of {} purchases undecided: {}",
        after.iter().filter(|r| !r.is_decided()).count(),
        after.len(),
        undecided.join("; ")
    );
    recovered
}

/// Prints a scenario's figures: answers by status during the fault, the slowest
/// answer during it and overall, the time to recover, and what settlement did.
pub fn print_figures(
    name: &str,
    records: &[Record],
    during: &[Record],
    recovered: Duration,
    settlement: &str,
) {
    let (slow_during, what_during) = slowest(during);
    let (slow_all, what_all) = slowest(records);
    println!(
        "FIGURES {name}: during the fault {} requests: {}; slowest during {slow_during:.2?} ({what_during}), overall {slow_all:.2?} ({what_all}); recovered {recovered:.2?} after healing; settlement: {settlement}",
        during.len(),
        crate::storm::summary(during),
    );
}

/// A process's resident memory (`VmRSS` of `/proc/PID/status`) and open file
/// descriptors (entries of `/proc/PID/fd`).
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    pub rss_kib: u64,
    pub fds: usize,
}

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} MiB, {} fds",
            self.rss_kib as f64 / 1024.0,
            self.fds
        )
    }
}

/// [`Usage`] of process `pid` now.
pub fn usage(pid: u32) -> Usage {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/PID/fd")
        .count();
    Usage { rss_kib, fds }
}

/// File descriptors a server may hold after healing beyond those it held before
/// the fault: HTTP connections the storm's client keeps idle for up to 2 s, a
/// Redis or Postgres connection opened again. A leak per reset or per stalled
/// request is hundreds (a reset every 0.5 s for 4 s closes tens of connections).
pub const FD_SLACK: usize = 16;

/// Resident memory a server may gain through a fault and its healing (the storm
/// goes on before and after): what the allocator keeps of the queues a stall
/// builds. A leak of a buffer per request or per reset over a storm of 2,000
/// requests is more.
pub const RSS_SLACK_KIB: u64 = 48 * 1024;

/// `pid`'s [`Usage`] once it holds at most 4 fds more than `before` (waiting up
/// to 5 s for the storm's idle connections to close), or after 5 s.
pub async fn usage_settled(pid: u32, before: Usage) -> Usage {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut now = usage(pid);
    while now.fds > before.fds + 4 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        now = usage(pid);
    }
    now
}

/// At most [`FD_SLACK`] fds and [`RSS_SLACK_KIB`] of memory more `after` healing
/// than `before` the fault.
pub fn assert_flat(before: Usage, after: Usage, what: &str) {
    assert!(
        after.fds <= before.fds + FD_SLACK,
        "{what}: {} fds after healing, {} before: a leak",
        after.fds,
        before.fds
    );
    assert!(
        after.rss_kib <= before.rss_kib + RSS_SLACK_KIB,
        "{what}: resident memory {after} after healing, {before} before: grew over {} MiB",
        RSS_SLACK_KIB / 1024
    );
}
