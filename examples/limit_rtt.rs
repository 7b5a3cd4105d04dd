//! How to send a route's two limit scripts (per user and per IP): measured straight
//! against Redis, without HTTP
//! (`REDIS_URL=redis://127.0.0.1:6399/ cargo run --release --example limit_rtt -- 3`,
//! the number being seconds per figure). Prints, for 64 concurrent callers over one
//! multiplexed connection:
//!   one policy        one EVALSHA per check
//!   two, concurrent   two EVALSHAs joined (what `limit::check` does)
//!
//! Keys go under a namespace of their own and are deleted at the end.

use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use stampede::limit::{self, Algorithm, Attempt};

const CALLERS: usize = 64;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6399/".into());
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let redis = ConnectionManager::new(redis::Client::open(url)?).await?;
    let ns = format!("rtt{}", std::process::id());
    let user = Algorithm::SlidingLog {
        limit: 1_000_000,
        window_ms: 10_000,
    };
    let ip = Algorithm::SlidingCounter {
        limit: 1_000_000,
        window_ms: 10_000,
    };
    for variant in ["one policy", "two, concurrent"] {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let started = Instant::now();
        let tasks: Vec<_> = (0..CALLERS)
            .map(|caller| {
                let (redis, ns) = (redis.clone(), ns.clone());
                tokio::spawn(async move {
                    let keys = stampede::keys::Keys::new(&ns);
                    let user_key = keys.rate_limit("user", &format!("u{caller}"));
                    let ip_key = keys.rate_limit("ip", "127.0.0.1");
                    let mut latencies = Vec::new();
                    let mut errors = 0u64;
                    while Instant::now() < deadline {
                        let mut ok = true;
                        let a = Attempt {
                            algorithm: &user,
                            key: &user_key,
                        };
                        let b = Attempt {
                            algorithm: &ip,
                            key: &ip_key,
                        };
                        let t = Instant::now();
                        match variant {
                            "one policy" => {
                                ok &= limit::take(&mut redis.clone(), &a, None).await.is_ok();
                            }
                            _ => {
                                let (mut r1, mut r2) = (redis.clone(), redis.clone());
                                let (x, y) = tokio::join!(
                                    limit::take(&mut r1, &a, None),
                                    limit::take(&mut r2, &b, None)
                                );
                                ok &= x.is_ok() && y.is_ok();
                            }
                        }
                        latencies.push(t.elapsed().as_micros() as u32);
                        errors += u64::from(!ok);
                    }
                    (latencies, errors)
                })
            })
            .collect();
        let mut all = Vec::new();
        let mut errors = 0;
        for t in tasks {
            let (latencies, errs) = t.await?;
            all.extend(latencies);
            errors += errs;
        }
        let elapsed = started.elapsed().as_secs_f64();
        all.sort_unstable();
        let p = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)] as f64 / 1000.0;
        println!(
            "{variant:<16} {:>8.0} checks/s   p50 {:>5.2} ms   p99 {:>5.2} ms   errors {errors}",
            all.len() as f64 / elapsed,
            p(0.5),
            p(0.99)
        );
    }

    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{ns}:*"))
        .query_async(&mut redis.clone())
        .await?;
    if !keys.is_empty() {
        let _: () = redis::cmd("UNLINK")
            .arg(keys)
            .query_async(&mut redis.clone())
            .await?;
    }
    Ok(())
}
