//! Rate limits against real Redis: the four scripts with exact counts (time passed
//! in as `now_ms` so no test sleeps for a window), then the HTTP behaviour on the
//! buy, sign-in and sign-up routes, two servers sharing one Redis, and Redis going
//! away under a running server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use stampede::config::LimitsConfig;
use stampede::limit::{self, Algorithm, Attempt, Decision, Verdict};
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::{
    RedisNamespace, TestApp, assert_error, bucket_policy, limit_buckets, limits,
    lua_limits_library, redis_pttl, sliding_log_entries, socket_addr_of, spawn_app_with,
    spawn_sibling, test_redis_url, user_log_entries, window_policy,
};

/// A multiple of every window used below, so windows start at `T0` exactly.
const T0: i64 = 1_700_000_000_000;

/// The limit scripts on a Redis namespace of the test's own.
impl RedisNamespace {
    fn key(&self, name: &str) -> String {
        self.keys.rate_limit(name, "x")
    }

    async fn take(&self, algorithm: &Algorithm, key: &str, now: Option<i64>) -> Decision {
        let attempt = Attempt { algorithm, key };
        limit::take(&mut self.redis.clone(), &attempt, now)
            .await
            .expect("limit script")
    }

    /// How many of `n` requests at time `now` are allowed.
    async fn allowed_of(&self, n: usize, algorithm: &Algorithm, key: &str, now: i64) -> usize {
        let mut allowed = 0;
        for _ in 0..n {
            if self.take(algorithm, key, Some(now)).await.allowed() {
                allowed += 1;
            }
        }
        allowed
    }
}

fn five_per_second() -> [(&'static str, Algorithm); 4] {
    [
        (
            "fixed",
            Algorithm::FixedWindow {
                limit: 5,
                window_ms: 1000,
            },
        ),
        (
            "log",
            Algorithm::SlidingLog {
                limit: 5,
                window_ms: 1000,
            },
        ),
        (
            "counter",
            Algorithm::SlidingCounter {
                limit: 5,
                window_ms: 1000,
            },
        ),
        (
            "bucket",
            Algorithm::TokenBucket {
                capacity: 5,
                refill_per_sec: 5.0,
                cost: 1,
            },
        ),
    ]
}

#[tokio::test]
async fn every_algorithm_allows_5_per_second_denies_the_6th_and_recovers() {
    let lab = RedisNamespace::new().await;
    for (name, algorithm) in five_per_second() {
        let key = lab.key(name);
        for i in 0..5 {
            let d = lab.take(&algorithm, &key, Some(T0)).await;
            assert!(d.allowed(), "{name}: request {i} must be allowed");
            assert_eq!(d.remaining, 4 - i, "{name}: remaining after request {i}");
        }
        let sixth = lab.take(&algorithm, &key, Some(T0)).await;
        assert_eq!(sixth.verdict, Verdict::Denied, "{name}: the 6th is denied");
        assert_eq!(sixth.remaining, 0);
        // When exactly the next request would pass, per algorithm:
        let expected_retry = match name {
            // the window (or the oldest entry) ends at T0 + 1 s
            "fixed" | "log" => 1000,
            // next window: the previous 5 weigh 0.8 at 200 ms in, leaving room for 1
            "counter" => 1200,
            // one token at 5 per second
            _ => 200,
        };
        assert_eq!(sixth.retry_after_ms, expected_retry, "{name}");
        // Just before that time: still denied. At it: allowed.
        let early = T0 + expected_retry as i64 - 1;
        assert!(
            !lab.take(&algorithm, &key, Some(early)).await.allowed(),
            "{name}"
        );

        // Once the window (or the refill) has passed in full: exactly 5 again.
        // The sliding counter still weighs the previous window for one more window.
        let later = if name == "counter" {
            T0 + 2000
        } else {
            T0 + 1000
        };
        assert_eq!(
            lab.allowed_of(6, &algorithm, &key, later).await,
            5,
            "{name}: exactly 5 allowed after the window"
        );
    }
}

/// Edge: an entry made at t counts while now < t + window, so at t + window exactly
/// it no longer counts (the window is (now - 1000 ms, now], exclusive at the old end).
#[tokio::test]
async fn sliding_log_edge_is_exclusive_at_the_window_end() {
    let lab = RedisNamespace::new().await;
    let log = Algorithm::SlidingLog {
        limit: 5,
        window_ms: 1000,
    };
    let key = lab.key("edge");
    for at in [0, 200, 400, 600, 800] {
        assert!(
            lab.take(&log, &key, Some(T0 + at)).await.allowed(),
            "at {at} ms"
        );
    }
    let d = lab.take(&log, &key, Some(T0 + 900)).await;
    assert!(!d.allowed(), "at 900 ms: 5 in the last second");
    assert_eq!(d.retry_after_ms, 100, "the entry at 0 ms leaves at 1000 ms");
    let d = lab.take(&log, &key, Some(T0 + 999)).await;
    assert!(!d.allowed(), "at 999 ms the entry at 0 ms still counts");
    assert_eq!(d.retry_after_ms, 1);
    assert!(
        lab.take(&log, &key, Some(T0 + 1000)).await.allowed(),
        "at 1000 ms the entry at 0 ms no longer counts"
    );
    assert!(
        !lab.take(&log, &key, Some(T0 + 1000)).await.allowed(),
        "one slot freed, one taken"
    );
    assert!(lab.take(&log, &key, Some(T0 + 1200)).await.allowed());
    // Denied requests were not recorded: 5 live entries, no more.
    let live = sliding_log_entries(&mut lab.redis.clone(), &key).await;
    assert_eq!(live, 5);
}

#[tokio::test]
async fn sliding_counter_halfway_weighs_a_full_previous_window_by_half() {
    let lab = RedisNamespace::new().await;
    let counter = Algorithm::SlidingCounter {
        limit: 10,
        window_ms: 1000,
    };
    let key = lab.key("half");
    assert_eq!(lab.allowed_of(10, &counter, &key, T0).await, 10);
    // Halfway through the next (empty) window: 10 * 0.5 = 5 still count.
    let halfway = T0 + 1500;
    assert_eq!(lab.allowed_of(20, &counter, &key, halfway).await, 5);
    let d = lab.take(&counter, &key, Some(halfway)).await;
    assert!(!d.allowed());
    // At 600 ms in, the previous window weighs 4: room for the 6th.
    assert_eq!(d.retry_after_ms, 100);
    assert!(
        lab.take(&counter, &key, Some(halfway + 100))
            .await
            .allowed()
    );
}

#[tokio::test]
async fn token_bucket_refills_from_elapsed_time() {
    let lab = RedisNamespace::new().await;
    let bucket = Algorithm::TokenBucket {
        capacity: 10,
        refill_per_sec: 1.0,
        cost: 1,
    };
    let key = lab.key("bucket");
    assert_eq!(lab.allowed_of(10, &bucket, &key, T0).await, 10);
    let eleventh = lab.take(&bucket, &key, Some(T0)).await;
    assert_eq!(eleventh.verdict, Verdict::Denied);
    assert_eq!(eleventh.retry_after_ms, 1000);
    assert_eq!(eleventh.reset_ms, 10_000, "10 s to fill an empty bucket");
    assert_eq!(lab.allowed_of(10, &bucket, &key, T0 + 3000).await, 3);

    // A cost above the capacity can never be paid: refused as such, nothing stored.
    let greedy = Algorithm::TokenBucket {
        capacity: 10,
        refill_per_sec: 1.0,
        cost: 20,
    };
    let greedy_key = lab.key("greedy");
    let d = lab.take(&greedy, &greedy_key, Some(T0)).await;
    assert_eq!(d.verdict, Verdict::Never);
    assert_eq!(d.retry_after_ms, 0, "not a 'retry later'");
    assert_eq!(
        redis_pttl(&lab.redis, &greedy_key).await,
        -2,
        "no key for a refused request"
    );

    // Capacity 1 at 3 per second fills in 334 ms: the state must live (TTL 668 ms),
    // not vanish with a TTL rounded down to 0.
    let small = Algorithm::TokenBucket {
        capacity: 1,
        refill_per_sec: 3.0,
        cost: 1,
    };
    let small_key = lab.key("small");
    assert!(lab.take(&small, &small_key, None).await.allowed());
    let ttl = redis_pttl(&lab.redis, &small_key).await;
    assert!((600..=668).contains(&ttl), "TTL {ttl} ms");
    let again = lab.take(&small, &small_key, None).await;
    assert_eq!(again.verdict, Verdict::Denied, "the empty bucket was kept");
    assert!((1..=334).contains(&again.retry_after_ms));
}

#[tokio::test]
async fn fifty_concurrent_requests_in_one_millisecond_get_exactly_10_log_entries() {
    let lab = RedisNamespace::new().await;
    let log = Algorithm::SlidingLog {
        limit: 10,
        window_ms: 1000,
    };
    let key = lab.key("burst");
    let gate = Arc::new(tokio::sync::Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (mut redis, key, gate) = (lab.redis.clone(), key.clone(), gate.clone());
            tokio::spawn(async move {
                let attempt = Attempt {
                    algorithm: &log,
                    key: &key,
                };
                gate.wait().await;
                limit::take(&mut redis, &attempt, Some(T0)).await.unwrap()
            })
        })
        .collect();
    let mut allowed = 0;
    for task in tasks {
        if task.await.unwrap().allowed() {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 10);
    let live = sliding_log_entries(&mut lab.redis.clone(), &key).await;
    assert_eq!(live, 10, "same millisecond, distinct members");
}

/// On the Redis clock, with a real (short) wait: keys carry a TTL from their first
/// write, refunds and denials leave it alone, and once every window has passed no
/// limiter key is left at all.
#[tokio::test]
async fn no_limiter_key_outlives_its_window_or_lacks_a_ttl() {
    let lab = RedisNamespace::new().await;
    let algorithms = [
        Algorithm::FixedWindow {
            limit: 2,
            window_ms: 1000,
        },
        Algorithm::SlidingLog {
            limit: 2,
            window_ms: 1000,
        },
        Algorithm::SlidingCounter {
            limit: 2,
            window_ms: 1000,
        },
        Algorithm::TokenBucket {
            capacity: 1,
            refill_per_sec: 3.0,
            cost: 1,
        },
    ];
    for (i, algorithm) in algorithms.iter().enumerate() {
        let key = lab.key(&format!("ttl{i}"));
        let mut last = None;
        for _ in 0..3 {
            let attempt = Attempt {
                algorithm,
                key: &key,
            };
            let d = limit::take(&mut lab.redis.clone(), &attempt, None)
                .await
                .unwrap();
            if d.allowed() {
                last = Some(d.now_ms);
            }
        }
        let at = last.unwrap();
        let attempt = Attempt {
            algorithm,
            key: &key,
        };
        limit::refund(&mut lab.redis.clone(), &attempt, at)
            .await
            .unwrap();
        // Right after this algorithm's writes (checked at the end, an early key's
        // window could be over on a busy machine, and its TTL rightly 0).
        let keys: Vec<String> = lab
            .all_keys()
            .await
            .into_iter()
            .filter(|k| k.contains(&format!("ttl{i}")))
            .collect();
        assert!(!keys.is_empty(), "{algorithm:?} wrote no key");
        for key in keys {
            let ttl = redis_pttl(&lab.redis, &key).await;
            assert!(ttl > 0, "{key} has PTTL {ttl}");
        }
    }
    // Longest state: the counter (2 windows = 2,000 ms) and the bucket (668 ms).
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert_eq!(lab.all_keys().await, Vec::<String>::new());
}

/// The real clock path, with one short wait: a window of 1 s, then 5 again.
#[tokio::test]
async fn sliding_log_on_the_redis_clock_recovers_after_the_window() {
    let lab = RedisNamespace::new().await;
    let log = Algorithm::SlidingLog {
        limit: 5,
        window_ms: 1000,
    };
    let key = lab.key("clock");
    let mut allowed = 0;
    for _ in 0..6 {
        allowed += usize::from(lab.take(&log, &key, None).await.allowed());
    }
    assert_eq!(allowed, 5);
    tokio::time::sleep(Duration::from_millis(1050)).await;
    let mut allowed = 0;
    for _ in 0..6 {
        allowed += usize::from(lab.take(&log, &key, None).await.allowed());
    }
    assert_eq!(allowed, 5);
}

// ---- HTTP ----

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> &'a str {
    resp.headers()
        .get(name)
        .unwrap_or_else(|| panic!("missing {name}"))
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn answers_carry_ratelimit_headers_and_a_429_carries_retry_after() {
    let app = spawn_app_with(|c| {
        c.limits = limits(&[
            window_policy("buy-user", "buy", "user", "sliding_log", 2, 10_000),
            window_policy("buy-ip", "buy", "ip", "fixed_window", 100, 60_000),
        ])
    })
    .await;
    let sale = app.live_sale(&app.admin().await, 10).await;
    let user = app.user().await;

    let first = app.purchase(sale, &user.token).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    assert_eq!(
        header(&first, "ratelimit-policy"),
        r#""buy-user";q=2;w=10, "buy-ip";q=100;w=60"#
    );
    let state = header(&first, "ratelimit");
    assert!(
        state.starts_with(r#""buy-user";r=1;t=10, "buy-ip";r=99;t="#),
        "{state}"
    );

    let second = app.purchase(sale, &user.token).await;
    assert_error(second, StatusCode::CONFLICT, "already_bought").await;

    let third = app.purchase(sale, &user.token).await;
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = header(&third, "retry-after").parse().unwrap();
    assert!((1..=10).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        header(&third, "ratelimit-policy"),
        r#""buy-user";q=2;w=10, "buy-ip";q=100;w=60"#
    );
    let state = header(&third, "ratelimit").to_string();
    // The IP policy had counted the refused request and gave it back: still 98.
    assert!(
        state.starts_with(r#""buy-user";r=0;t=10, "buy-ip";r=98;t="#),
        "{state}"
    );
    assert_error(third, StatusCode::TOO_MANY_REQUESTS, "rate_limited").await;
}

#[tokio::test]
async fn a_refused_purchase_consumes_nothing() {
    let app = spawn_app_with(|c| {
        c.limits = limits(&[
            window_policy("buy-user", "buy", "user", "sliding_log", 5, 60_000),
            window_policy("buy-ip", "buy", "ip", "fixed_window", 1, 60_000),
        ])
    })
    .await;
    let sale = app.live_sale(&app.admin().await, 10).await;
    let users = app.create_users(2, false).await;
    app.buy(sale, &users[0].token).await;
    // The second user is fine by the per-user policy but the address is spent.
    let refused = app.purchase(sale, &users[1].token).await;
    assert_error(refused, StatusCode::TOO_MANY_REQUESTS, "rate_limited").await;
    assert_eq!(app.stock_left(sale).await, 9, "no stock taken");
    assert_eq!(app.buyers(sale).await, vec![users[0].id], "no buyer entry");
    assert_eq!(
        user_log_entries(&app, sale, "buy-user", users[0].id).await,
        1,
        "the first buyer is counted"
    );
    assert_eq!(
        user_log_entries(&app, sale, "buy-user", users[1].id).await,
        0,
        "the per-user policy did not count the refused request"
    );
}

#[tokio::test]
async fn two_servers_sharing_redis_allow_exactly_the_limit() {
    let app = spawn_app_with(|c| {
        c.limits = limits(&[
            window_policy("buy-user", "buy", "user", "sliding_log", 100, 60_000),
            window_policy("buy-ip", "buy", "ip", "sliding_counter", 100_000, 60_000),
        ])
    })
    .await;
    let sibling = spawn_sibling(&app, |_| {}).await;
    let sale = app.live_sale(&app.admin().await, 10).await;
    let user = app.user().await;

    let gate = Arc::new(tokio::sync::Semaphore::new(64));
    let tasks: Vec<_> = (0..1000)
        .map(|i| {
            let url = if i % 2 == 0 { &app } else { &sibling }
                .url(&format!("/api/sales/{sale}/purchase"));
            let (client, token, gate) = (app.client.clone(), user.token.clone(), gate.clone());
            tokio::spawn(async move {
                let _permit = gate.acquire().await.unwrap();
                let resp = client.post(url).bearer_auth(token).send().await.unwrap();
                resp.status()
            })
        })
        .collect();
    let mut limited = 0;
    let mut passed = 0;
    for task in tasks {
        match task.await.unwrap() {
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            StatusCode::ACCEPTED | StatusCode::CONFLICT => passed += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(passed, 100, "exactly the limit got through");
    assert_eq!(limited, 900);
    assert_eq!(app.buyers(sale).await, vec![user.id]);
    // Every limiter key of the run (in the sale's slot) carries a TTL: the per-user
    // policy's bucket and the per-address policy's (two of a policy when the run
    // crossed its span); no key per address.
    let keys: Vec<String> = app
        .redis_query(redis::cmd("KEYS").arg(format!(
            "{}:{{sale:{sale}}}:rl:*",
            app.config.redis_namespace
        )))
        .await;
    let buckets = limit_buckets(&app, sale, "buy-user").await;
    assert!((1..=2).contains(&buckets.len()), "{keys:?}");
    let address_buckets = limit_buckets(&app, sale, "buy-ip").await;
    assert!((1..=2).contains(&address_buckets.len()), "{keys:?}");
    assert_eq!(
        keys.len(),
        buckets.len() + address_buckets.len(),
        "{keys:?}"
    );
    for key in keys {
        let ttl = redis_pttl(&app.redis, &key).await;
        assert!(ttl > 0, "{key}: {ttl}");
    }
}

#[tokio::test]
async fn sign_in_and_sign_up_are_limited_per_ip() {
    let app = spawn_app_with(|c| {
        c.limits = limits(&[
            window_policy("signin-ip", "signin", "ip", "sliding_log", 2, 60_000),
            bucket_policy("signup-ip", "signup", "ip", 1, 0.015625),
        ])
    })
    .await;
    let creds = json!({"username": "guesser", "password": "not the password"});
    for _ in 0..2 {
        let resp = app.post_json("/api/auth/signin", None, &creds).await;
        assert_error(resp, StatusCode::UNAUTHORIZED, "bad_credentials").await;
    }
    let third = app.post_json("/api/auth/signin", None, &creds).await;
    assert!(third.headers().contains_key("retry-after"));
    assert_error(third, StatusCode::TOO_MANY_REQUESTS, "rate_limited").await;

    let signup = json!({"username": "newcomer", "password": "long enough pw"});
    let created = app.post_json("/api/auth/signup", None, &signup).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    assert_eq!(
        header(&created, "ratelimit-policy"),
        r#""signup-ip";q=1;w=64"#
    );
    assert_eq!(header(&created, "ratelimit"), r#""signup-ip";r=0;t=64"#);
    let again = json!({"username": "newcomer2", "password": "long enough pw"});
    let refused = app.post_json("/api/auth/signup", None, &again).await;
    assert_eq!(header(&refused, "retry-after"), "64");
    assert_error(refused, StatusCode::TOO_MANY_REQUESTS, "rate_limited").await;
}

fn one_per_ip_on_buy() -> LimitsConfig {
    let policy = window_policy("buy-ip", "buy", "ip", "fixed_window", 1, 60_000);
    limits(&[policy])
}

async fn buy_as(app: &TestApp, sale: i64, forwarded_for: &str) -> StatusCode {
    let user = app.user().await;
    app.client
        .post(app.url(&format!("/api/sales/{sale}/purchase")))
        .bearer_auth(&user.token)
        .header("x-forwarded-for", forwarded_for)
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn x_forwarded_for_counts_only_from_a_trusted_proxy() {
    let untrusted = spawn_app_with(|c| c.limits = one_per_ip_on_buy()).await;
    let sale = untrusted.live_sale(&untrusted.admin().await, 10).await;
    assert_eq!(
        buy_as(&untrusted, sale, "203.0.113.1").await,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        buy_as(&untrusted, sale, "203.0.113.2").await,
        StatusCode::TOO_MANY_REQUESTS,
        "a client cannot pick its own address"
    );

    let behind_proxy = spawn_app_with(|c| {
        c.limits = one_per_ip_on_buy();
        c.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
    })
    .await;
    let sale = behind_proxy
        .live_sale(&behind_proxy.admin().await, 10)
        .await;
    for (xff, expected) in [
        ("203.0.113.1", StatusCode::ACCEPTED),
        ("203.0.113.2", StatusCode::ACCEPTED),
        // The client forged the left hop; the proxy appended the real one.
        ("198.51.100.7, 203.0.113.1", StatusCode::TOO_MANY_REQUESTS),
        ("not-an-ip", StatusCode::ACCEPTED), // counted as the proxy itself
        ("also-garbage", StatusCode::TOO_MANY_REQUESTS),
    ] {
        assert_eq!(buy_as(&behind_proxy, sale, xff).await, expected, "{xff}");
    }
}

/// A TCP relay to the test Redis that can be cut: while cut it accepts and at once
/// drops every connection (and has dropped the open ones).
struct Relay {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    generation: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Relay {
    async fn start(target: &str) -> Self {
        let target = socket_addr_of(target).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let generation = Arc::new(generation);
        let (up2, gen2) = (up.clone(), generation.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    continue; // dropped: the client sees the connection close
                }
                let mut cut = gen2.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Relay {
            addr,
            up,
            generation,
        }
    }

    fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

// Multi-threaded: the relay must keep running while `TestApp`'s drop blocks one
// thread to delete the test's keys through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unreachable_fails_buy_closed_and_sign_in_open() {
    let relay = Relay::start(&test_redis_url()).await;
    let app = spawn_app_with(|c| {
        c.redis_url = relay.url();
        // The relay stands in front of one node: this test runs on one node.
        c.redis_cluster.clear();
        c.settle_in_serve = false;
        c.limits = LimitsConfig {
            enabled: true,
            timeout_ms: 300,
            ..LimitsConfig::default()
        };
    })
    .await;
    let sale = app.live_sale(&app.admin().await, 10).await;
    let user = app.user().await;
    app.buy(sale, &user.token).await;

    relay.cut();
    // The buy route's limits are checked inside the purchase script: without Redis
    // there is neither a limit check nor a decision, so the buy fails closed.
    let refused = app.purchase(sale, &user.token).await;
    assert!(refused.headers().contains_key("retry-after"));
    let body = assert_error(
        refused,
        StatusCode::SERVICE_UNAVAILABLE,
        "redis_unavailable",
    )
    .await;
    assert!(
        body["message"].as_str().unwrap().contains("Redis"),
        "{body}"
    );
    // Sign-in fails open by default: Postgres answers, the limiter is skipped.
    let creds = json!({"username": "nobody-here", "password": "whatever123"});
    let resp = app.post_json("/api/auth/signin", None, &creds).await;
    assert_error(resp, StatusCode::UNAUTHORIZED, "bad_credentials").await;

    // Back up: the key clean-up on drop goes through the relay too.
    relay.restore();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = app.purchase(sale, &user.token).await.status();
        if status == StatusCode::CONFLICT || std::time::Instant::now() > deadline {
            assert_eq!(
                status,
                StatusCode::CONFLICT,
                "Redis is back: already bought"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A limit key left by an older Stampede (a hash or a sorted set, where the state
/// is now one string) is read as no state and replaced by the next counted
/// request, never a WRONGTYPE error on the route.
#[tokio::test]
async fn a_limit_key_of_an_older_layout_is_replaced_not_an_error() {
    let lab = RedisNamespace::new().await;
    let log = Algorithm::SlidingLog {
        limit: 2,
        window_ms: 1000,
    };
    let counter = Algorithm::FixedWindow {
        limit: 2,
        window_ms: 1000,
    };
    let (zset, hash) = (lab.key("old-log"), lab.key("old-window"));
    let mut redis = lab.redis.clone();
    let _: () = redis::cmd("ZADD")
        .arg(&zset)
        .arg(T0)
        .arg("f00d")
        .query_async(&mut redis)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&hash)
        .arg("w")
        .arg(T0 / 1000)
        .arg("n")
        .arg(2)
        .query_async(&mut redis)
        .await
        .unwrap();
    for (algorithm, key) in [(&log, &zset), (&counter, &hash)] {
        let d = lab.take(algorithm, key, Some(T0 + 1)).await;
        assert!(d.allowed(), "{key}: the old state does not count");
        assert_eq!(
            d.remaining, 1,
            "{key}: this request is the only one counted"
        );
        let kind: String = redis::cmd("TYPE")
            .arg(key)
            .query_async(&mut redis)
            .await
            .unwrap();
        assert_eq!(kind, "string", "{key} was replaced");
        assert!(redis_pttl(&lab.redis, key).await > 0, "{key} has an expiry");
    }
    assert_eq!(sliding_log_entries(&mut redis, &zset).await, 1);
}

/// Every algorithm's take, as the batch scripts call it (`limit_taker` in
/// lua/lib/limits.lua), returns a new state when it counts a request and leaves
/// the state it was given as it was: `limits_write` writes a subject only when its
/// state is no longer the one read, so a take that changed its input in place (or
/// gave it back) would lose the count without an error. Fresh, live, stale and
/// previous-window states, and a log with an entry ahead of the clock.
#[tokio::test]
async fn a_take_that_counts_makes_a_new_state_and_leaves_the_one_it_read() {
    let lab = RedisNamespace::new().await;
    let mut source = lua_limits_library();
    source.push_str(
        r#"
local now = tonumber(ARGV[1])
local w = math.floor(now / 1000)
local function log(...)
  local t = {}
  for i, x in ipairs({...}) do t[i] = string.format('%013d', x) end
  return table.concat(t)
end
local cases = {
  {'sl', 5, 1000, 0, {false, log(now), log(now - 1500, now - 10), log(now - 1000, now),
    log(now - 900, now - 800, now - 700, now - 1), log(now + 100)}},
  {'sc', 5, 1000, 0, {false, w .. ' 1 0', (w - 1) .. ' 3 0', (w - 2) .. ' 4 4', w .. ' 0 2'}},
  {'fw', 5, 1000, 0, {false, w .. ' 2', (w - 1) .. ' 5'}},
  {'tb', 5, 5, 1, {false, '3.5 ' .. (now - 100), '0.2 ' .. (now - 1000)}},
}
local counted, wrong = 0, {}
for _, c in ipairs(cases) do
  local alg, take = c[1], limit_taker(c[1])
  for k, text in ipairs(c[5]) do
    local state, read_text = nil, nil
    if text then
      state = LIMIT_READ[alg](text)
      if not state then wrong[#wrong + 1] = alg .. ' ' .. k .. ': unreadable' end
      read_text = LIMIT_TEXT[alg](state)
    end
    local new_state = take(state, now, c[2], c[3], c[4])
    if new_state then
      counted = counted + 1
      if new_state == state then wrong[#wrong + 1] = alg .. ' ' .. k .. ': the state read' end
      if text and LIMIT_TEXT[alg](state) ~= read_text then
        wrong[#wrong + 1] = alg .. ' ' .. k .. ': the state read was changed'
      end
    end
  end
end
return counted .. '\n' .. table.concat(wrong, '\n')
"#,
    );
    let out: String = redis::Script::new(&source)
        .key(lab.key("unused"))
        .arg(T0)
        .invoke_async(&mut lab.redis.clone())
        .await
        .expect("take script");
    // Every case above counts (each is under its limit); none may come back as read.
    assert_eq!(
        out, "17\n",
        "takes that counted, then the cases that broke the rule"
    );
}
