//! Redis side of the buy path: how many purchase decisions one sale on one Redis
//! takes per second when the purchase script decides a batch of buyers per call,
//! against one buyer per call (DESIGN.md: at least 300,000 a second for one hot
//! sale). Three kinds of buyer, each with and without both shipped limit shapes
//! (sliding log per user, sliding counter per address, which every buyer counts
//! in whatever the answer):
//!   new buyers      every decision an accepted purchase: the whole write path
//!                   (buyers hash, stock, pending hash, one XADD per call), the
//!                   worst case; a real sale accepts at most its stock
//!   repeat buyers   every one already bought: what most of a storm on a sale
//!                   with buyers already in costs
//!   sold out        new buyers of a sale with no units left (before the
//!                   process's sold-out flag answers them without Redis)
//!
//!   REDIS_URL=redis://127.0.0.1:6399/ cargo run --release --example batch_decisions -- [seconds] [only]
//!
//! `only` measures just the figures whose label contains it (say `"64 repeat"`),
//! or, after a `=`, the one figure so labelled (`"=batch 64 new buyers"`).
//! The buyers come from 250 addresses, or from `BATCH_ADDRESSES` (1 to 250: 1 is
//! what `scripts/bench`'s HTTP figures send, all from 127.0.0.1).
//!
//! The calls go over [`CONNECTIONS`] connections, as an app tier's do (each HTTP
//! worker of each server has its own): Redis reads at most 16 KB of one
//! connection in a turn of its event loop, and under `appendfsync always` every
//! turn that wrote waits for its `fsync`, so from a single connection it would
//! decide about three calls of 64 buyers per `fsync`. "64 new buyers, one
//! connection" measures that too (the figure of earlier runs).
//!
//! Works in its own key namespace on the Redis named by REDIS_URL (loopback only)
//! and deletes it afterwards. Prints `batch N <kind>[, both limit shapes][, one
//! connection]: D decisions/s (C calls/s ...)` lines, `seconds` (default 5) each.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use stampede::config::Config;
use stampede::domain::{Id, MAX_STOCK};
use stampede::keys::Keys;
use stampede::limit::{Algorithm, Policy, Route, Subject};
use stampede::sale::buy::{BuyRequest, PurchaseBatch};
use stampede::sale::record::SaleRow;
use stampede::sale::store::put_new_sale;

/// Callers in flight: four per connection over [`CONNECTIONS`] (a server's worker
/// keeps two batches of a sale out by default, `batch_in_flight`, four with
/// replica acknowledgements; the figure keeps the count it always had, so runs
/// compare); all of them on the one connection of the one-connection figure.
const IN_FLIGHT: usize = 32;

/// Connections the callers share: as many as four servers of two HTTP workers.
const CONNECTIONS: usize = 8;

/// Users who bought in the warm-up of the "repeat buyers" figures.
const REPEAT_USERS: u64 = 20_000;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    New,
    Repeat,
    SoldOut,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::New => "new buyers",
            Kind::Repeat => "repeat buyers",
            Kind::SoldOut => "sold out",
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seconds: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(5);
    let only = std::env::args().nth(2).unwrap_or_default();
    let redis_url = std::env::var("REDIS_URL")?;
    let host = redis_url
        .strip_prefix("redis://")
        .and_then(|r| r.rsplit('@').next())
        .and_then(|r| r.split([':', '/']).next())
        .unwrap_or("");
    anyhow::ensure!(
        matches!(host, "127.0.0.1" | "localhost" | "[::1]"),
        "batch_decisions talks to a loopback Redis only, not {host:?}"
    );
    let config = Config {
        redis_url,
        redis_namespace: format!("benchbatch{}", std::process::id()),
        ..Config::default()
    };
    let redis = stampede::startup::connect_redis(&config).await?;
    let mut pool = vec![redis.clone()];
    for _ in 1..CONNECTIONS {
        pool.push(stampede::startup::connect_redis(&config).await?);
    }
    let keys = Keys::new(&config.redis_namespace);
    let policies = vec![
        policy(
            "buy-user",
            Subject::User,
            Algorithm::SlidingLog {
                limit: 1_000,
                window_ms: 10_000,
            },
        ),
        policy(
            "buy-ip",
            Subject::Ip,
            Algorithm::SlidingCounter {
                limit: 100_000_000,
                window_ms: 10_000,
            },
        ),
    ];
    let next_sale = AtomicU64::new(1);
    // (kind, buyers per call, connections)
    let figures = [
        (Kind::New, 1usize, CONNECTIONS),
        (Kind::New, 16, CONNECTIONS),
        (Kind::New, 64, CONNECTIONS),
        (Kind::New, 64, 1),
        (Kind::Repeat, 1, CONNECTIONS),
        (Kind::Repeat, 64, CONNECTIONS),
        (Kind::SoldOut, 1, CONNECTIONS),
        (Kind::SoldOut, 64, CONNECTIONS),
    ];
    for limits in [false, true] {
        for (kind, batch, connections) in figures {
            if limits && connections == 1 {
                continue;
            }
            let label = format!(
                "batch {batch} {}{}{}",
                kind.label(),
                if limits { ", both limit shapes" } else { "" },
                if connections == 1 {
                    ", one connection"
                } else {
                    ""
                }
            );
            if !match only.strip_prefix('=') {
                Some(exact) => label == exact,
                None => label.contains(&only),
            } {
                continue;
            }
            let sale = Id::new(next_sale.fetch_add(1, Ordering::Relaxed) as i64).expect("positive");
            let now = Utc::now();
            let row = SaleRow {
                id: sale,
                name: "bench".into(),
                description: String::new(),
                price_cents: 1,
                stock_total: if kind == Kind::SoldOut { 0 } else { MAX_STOCK },
                units_reoffered: 0,
                starts_at: now - chrono::Duration::minutes(1),
                ends_at: now + chrono::Duration::hours(1),
                closed: false,
                image_url: None,
                requires_ticket: false,
                payment_window_s: 0,
                rebuy_after_expiry: false,
                max_per_user: 1,
                archived_at: None,
                rehearsal: false,
                waiting_room: false,
                queue_opens_at: None,
                admit_per_second: None,
                proof_of_work: 0,
                min_account_age_s: 0,
                mode: Default::default(),
                entries_open_at: None,
                claim_window_s: None,
                draw_commitment: None,
            };
            put_new_sale(&mut redis.clone(), &keys, &row)
                .await
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            if kind == Kind::Repeat {
                let buyers: Vec<BuyRequest> = (1..=REPEAT_USERS).map(buyer).collect();
                for chunk in buyers.chunks(500) {
                    let call = PurchaseBatch {
                        keys: &keys,
                        sale,
                        policies: &[],
                        now_ms: None,
                        key_ttl: std::time::Duration::from_secs(86_400),
                    };
                    call.run(&mut redis.clone(), chunk)
                        .await
                        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                }
            }
            let decided = Arc::new(AtomicU64::new(0));
            let calls = Arc::new(AtomicU64::new(0));
            let next_user = Arc::new(AtomicU64::new(1));
            let deadline = Instant::now() + Duration::from_secs(seconds);
            let started = Instant::now();
            let tasks: Vec<_> = (0..IN_FLIGHT)
                .map(|t| {
                    let (mut redis, keys, decided, calls, next_user) = (
                        pool[t % connections].clone(),
                        keys.clone(),
                        decided.clone(),
                        calls.clone(),
                        next_user.clone(),
                    );
                    let policies = if limits { policies.clone() } else { Vec::new() };
                    tokio::spawn(async move {
                        while Instant::now() < deadline {
                            let first = next_user.fetch_add(batch as u64, Ordering::Relaxed);
                            let buyers: Vec<BuyRequest> = (first..first + batch as u64)
                                .map(|u| match kind {
                                    Kind::Repeat => buyer((u - 1) % REPEAT_USERS + 1),
                                    _ => buyer(u),
                                })
                                .collect();
                            let call = PurchaseBatch {
                                keys: &keys,
                                sale,
                                policies: &policies,
                                now_ms: None,
                                key_ttl: std::time::Duration::from_secs(86_400),
                            };
                            match call.run(&mut redis, &buyers).await {
                                Ok(replies) => {
                                    decided.fetch_add(replies.len() as u64, Ordering::Relaxed);
                                    calls.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => {
                                    eprintln!("batch failed: {e:?}");
                                    return;
                                }
                            }
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await?;
            }
            let secs = started.elapsed().as_secs_f64();
            println!(
                "{label}: {:.0} decisions/s ({:.0} calls/s, {IN_FLIGHT} calls in flight over {connections} connection{})",
                decided.load(Ordering::Relaxed) as f64 / secs,
                calls.load(Ordering::Relaxed) as f64 / secs,
                if connections == 1 { "" } else { "s" },
            );
        }
    }
    let mut redis = redis;
    let leftovers: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:*", config.redis_namespace))
        .query_async(&mut redis)
        .await?;
    for chunk in leftovers.chunks(500) {
        let _: () = redis::cmd("UNLINK")
            .arg(chunk)
            .query_async(&mut redis)
            .await?;
    }
    Ok(())
}

/// User `u`, from one of `BATCH_ADDRESSES` addresses (1 to 250; default 250).
fn buyer(u: u64) -> BuyRequest {
    static ADDRESSES: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let addresses = *ADDRESSES.get_or_init(|| {
        std::env::var("BATCH_ADDRESSES")
            .ok()
            .and_then(|a| a.parse().ok())
            .filter(|a| (1..=250).contains(a))
            .unwrap_or(250)
    });
    let last = (u % addresses) as u8 + 1;
    BuyRequest {
        user: Id::new(u as i64).expect("positive"),
        quantity: 1,
        ip: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))),
        key: None,
    }
}

fn policy(name: &str, subject: Subject, algorithm: Algorithm) -> Policy {
    Policy {
        name: name.into(),
        route: Route::Buy,
        subject,
        algorithm,
        fail_open: false,
    }
}
