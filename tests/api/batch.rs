//! Purchases decided in per-sale batches, with the buy route's limits inside the
//! decision: every invariant holds inside a batch, and a refused request leaves no
//! trace. (The 2,000 + 500 storm runs batched and one buyer per call in purchase.rs.)

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use stampede::domain::Id;
use stampede::sale::buy::PurchaseOutcome;
use stampede::sale::buy::{BuyRequest, PurchaseBatch};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Barrier;

use crate::helpers::{
    TestApp, flush_scripts_on_node_of, limit_buckets, limits, node_of, redis_pttl, socket_addr_of,
    spawn_app, spawn_app_with, spawn_with_live_sale, subject_log_entries, test_redis_cluster,
    test_redis_url, user_log_entries, window_policy,
};

/// A buy-route policy that refuses when Redis cannot answer.
fn policy(
    name: &str,
    subject: stampede::limit::Subject,
    algorithm: stampede::limit::Algorithm,
) -> stampede::limit::Policy {
    stampede::limit::Policy {
        name: name.into(),
        route: stampede::limit::Route::Buy,
        subject,
        algorithm,
        fail_open: false,
    }
}

/// Sends all requests at once (a barrier) and returns the statuses.
async fn together(app: &Arc<TestApp>, requests: Vec<(i64, String)>) -> Vec<(i64, StatusCode)> {
    let barrier = Arc::new(Barrier::new(requests.len()));
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|(sale, token)| {
            let (app, barrier) = (app.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                (sale, app.purchase(sale, &token).await.status())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn five_sales_stormed_at_once_each_sell_exactly_their_stock() {
    let app = Arc::new(spawn_app_with(|c| c.sold_out_cache = Duration::ZERO).await);
    let admin = app.admin().await;
    let mut sales = Vec::new();
    for stock in [10, 20, 30, 40, 50] {
        sales.push((app.live_sale(&admin, stock).await, stock));
    }
    // On a cluster the five sales must really be spread: every primary decides
    // some of them.
    let cluster = test_redis_cluster();
    if !cluster.is_empty() {
        let nodes: HashSet<String> = sales
            .iter()
            .map(|(sale, _)| node_of(&app.keys.sale(Id::new(*sale).unwrap()).stock))
            .collect();
        assert_eq!(
            nodes.len(),
            cluster.len(),
            "sales on every primary: {nodes:?}"
        );
    }
    let users = app.create_users(300, false).await;
    let requests = users
        .iter()
        .flat_map(|u| sales.iter().map(|(sale, _)| (*sale, u.token.clone())))
        .collect();
    let answers = together(&app, requests).await;
    for (sale, stock) in &sales {
        let accepted = answers
            .iter()
            .filter(|(s, st)| s == sale && *st == StatusCode::ACCEPTED)
            .count();
        assert_eq!(accepted as i64, *stock, "sale {sale}");
        assert_eq!(app.stock_left(*sale).await, 0);
        assert_eq!(app.buyers(*sale).await.len() as i64, *stock);
    }
    assert!(
        answers
            .iter()
            .all(|(_, st)| [StatusCode::ACCEPTED, StatusCode::GONE].contains(st)),
        "only accepted and sold out"
    );
}

/// The decision scripts and functions vanish from the sale's node (on a cluster:
/// from that one primary) again and again while a storm runs: every purchase is
/// still decided (the function is loaded again after "Function not found", a
/// script after `NOSCRIPT`), none answers 5xx, and the stock is exact.
#[tokio::test(flavor = "multi_thread")]
async fn scripts_flushed_from_the_sales_node_during_a_storm_are_reloaded() {
    let app = Arc::new(spawn_app_with(|c| c.sold_out_cache = Duration::ZERO).await);
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 100).await;
    let stock_key = app.sale_keys(sale).stock;
    let users = app.create_users(400, false).await;
    let storming = Arc::new(AtomicBool::new(true));
    let flusher = {
        let (storming, key) = (storming.clone(), stock_key.clone());
        tokio::task::spawn_blocking(move || {
            let mut flushes = 0;
            while storming.load(Ordering::Relaxed) || flushes == 0 {
                flush_scripts_on_node_of(&key);
                flushes += 1;
                std::thread::sleep(Duration::from_millis(3));
            }
            flushes
        })
    };
    // Two waves, so that flushes land between and inside batches.
    let mut answers = Vec::new();
    for wave in users.chunks(200) {
        let requests = wave.iter().map(|u| (sale, u.token.clone())).collect();
        answers.extend(together(&app, requests).await);
    }
    storming.store(false, Ordering::Relaxed);
    let flushes = flusher.await.unwrap();
    assert!(flushes > 1, "the scripts were flushed during the storm");
    let accepted = answers
        .iter()
        .filter(|(_, st)| *st == StatusCode::ACCEPTED)
        .count();
    assert_eq!(accepted, 100);
    assert!(
        answers
            .iter()
            .all(|(_, st)| [StatusCode::ACCEPTED, StatusCode::GONE].contains(st)),
        "only accepted and sold out: {:?}",
        answers.iter().map(|(_, st)| *st).collect::<HashSet<_>>()
    );
    assert_eq!(app.stock_left(sale).await, 0);
    assert_eq!(app.buyers(sale).await.len(), 100);
}

/// Without limits, and with a per-user one (whose lookups tell the script whether
/// a batch's users are distinct: lua/lib/batch.lua), and with one per address.
#[tokio::test(flavor = "multi_thread")]
async fn one_user_twice_in_one_batch_buys_once() {
    use stampede::limit::{Algorithm, Subject};
    let window = |limit| Algorithm::SlidingLog {
        limit,
        window_ms: 60_000,
    };
    one_user_twice_in_one_batch_buys_once_under(&[]).await;
    one_user_twice_in_one_batch_buys_once_under(&[policy("u", Subject::User, window(10))]).await;
    one_user_twice_in_one_batch_buys_once_under(&[
        policy("ip", Subject::Ip, window(100)),
        policy("u", Subject::User, window(10)),
    ])
    .await;
}

async fn one_user_twice_in_one_batch_buys_once_under(policies: &[stampede::limit::Policy]) {
    let (app, _, sale) = spawn_with_live_sale(10).await;
    let (a, b) = (app.user().await, app.user().await);
    let buyer = |id: i64| BuyRequest {
        user: Id::new(id).unwrap(),
        quantity: 1,
        ip: Some(std::net::Ipv4Addr::LOCALHOST.into()),
        key: None,
    };
    let replies = PurchaseBatch {
        keys: &app.keys,
        sale: Id::new(sale).unwrap(),
        policies,
        now_ms: None,
        key_ttl: std::time::Duration::from_secs(86_400),
    }
    .run(
        &mut app.redis.clone(),
        &[buyer(a.id), buyer(a.id), buyer(b.id), buyer(a.id)],
    )
    .await
    .unwrap();
    let outcomes: Vec<_> = replies.iter().map(|r| r.outcome).collect();
    let PurchaseOutcome::Accepted {
        stock_left: 9,
        order_id,
    } = outcomes[0]
    else {
        panic!("{outcomes:?}");
    };
    // The repeats name the order the batch made for that buyer.
    let named = PurchaseOutcome::AlreadyBought {
        order: Some(order_id),
    };
    assert_eq!(outcomes[1], named);
    assert!(matches!(
        outcomes[2],
        PurchaseOutcome::Accepted { stock_left: 8, .. }
    ));
    assert_eq!(outcomes[3], named);
    assert_eq!(app.stock_left(sale).await, 8);
    let pending: i64 = app
        .redis_query(redis::cmd("XLEN").arg(app.sale_keys(sale).orders))
        .await;
    assert!(pending <= 2, "one stream entry per batch that accepted");
    assert_eq!(app.wait_for_orders(sale, 2).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn twelve_buys_of_one_user_released_together_pass_exactly_five() {
    let policy = window_policy("buy-user", "buy", "user", "sliding_log", 5, 60_000);
    let app = Arc::new(spawn_app_with(|c| c.limits = limits(&[policy])).await);
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 10).await;
    let user = app.user().await;
    let answers = together(&app, vec![(sale, user.token.clone()); 12]).await;
    let count = |s: StatusCode| answers.iter().filter(|(_, st)| *st == s).count();
    assert_eq!(count(StatusCode::ACCEPTED), 1);
    assert_eq!(
        count(StatusCode::CONFLICT),
        4,
        "passed the limit: already bought"
    );
    assert_eq!(count(StatusCode::TOO_MANY_REQUESTS), 7);
    // The refused seven left nothing: one unit sold, five entries in the log.
    assert_eq!(app.stock_left(sale).await, 9);
    let log = user_log_entries(&app, sale, "buy-user", user.id).await;
    assert_eq!(log, 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn eighty_buyers_from_one_address_pass_exactly_sixty() {
    let policy = window_policy("buy-ip", "buy", "ip", "sliding_counter", 60, 60_000);
    let app = Arc::new(
        spawn_app_with(|c| {
            c.sold_out_cache = Duration::ZERO;
            c.limits = limits(&[policy]);
        })
        .await,
    );
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 100).await;
    let users = app.create_users(80, false).await;
    let answers = together(
        &app,
        users.iter().map(|u| (sale, u.token.clone())).collect(),
    )
    .await;
    let count = |s: StatusCode| answers.iter().filter(|(_, st)| *st == s).count();
    assert_eq!(count(StatusCode::ACCEPTED), 60);
    assert_eq!(count(StatusCode::TOO_MANY_REQUESTS), 20);
    assert_eq!(
        app.stock_left(sale).await,
        40,
        "a refused buyer consumed nothing"
    );
    assert_eq!(app.buyers(sale).await.len(), 60);
}

/// A TCP relay to the test Redis that can hold back Redis's answers (Redis still
/// runs every command; the answers arrive late).
struct SlowRelay {
    addr: SocketAddr,
    held: Arc<AtomicBool>,
}

impl SlowRelay {
    async fn start(target: &str) -> Self {
        let target = socket_addr_of(target).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let held = Arc::new(AtomicBool::new(false));
        let held2 = held.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let held = held2.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut cr, &mut sw).await;
                    });
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = sr.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        while held.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    up.abort();
                });
            }
        });
        SlowRelay { addr, held }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_redis_answers_too_late_gets_503_and_a_retry_never_sells_twice() {
    let relay = SlowRelay::start(&test_redis_url()).await;
    let app = Arc::new(
        spawn_app_with(|c| {
            c.redis_url = format!("redis://{}/", relay.addr);
            // The relay stands in front of one node: this test runs on one node.
            c.redis_cluster.clear();
            c.redis_response_timeout = Duration::from_millis(300);
            c.settle_in_serve = false;
            c.sweep = Duration::ZERO;
        })
        .await,
    );
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 100).await;
    let users = app.create_users(20, false).await;

    relay.held.store(true, Ordering::SeqCst);
    let answers = together(
        &app,
        users.iter().map(|u| (sale, u.token.clone())).collect(),
    )
    .await;
    relay.held.store(false, Ordering::SeqCst);
    for (_, status) in &answers {
        assert_eq!(
            *status,
            StatusCode::SERVICE_UNAVAILABLE,
            "a late batch is a 503"
        );
    }
    // Redis did decide them; the answers came too late. A retry is safe.
    let mut accepted = HashSet::new();
    for u in &users {
        let resp = app.purchase(sale, &u.token).await;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        match status {
            StatusCode::ACCEPTED => {
                accepted.insert(u.id);
            }
            StatusCode::CONFLICT => assert_eq!(body["error"], "already_bought"),
            other => panic!("retry answered {other}: {body}"),
        }
    }
    let buyers: HashSet<i64> = app.buyers(sale).await.into_iter().collect();
    assert_eq!(buyers.len(), 20, "every user bought exactly once");
    assert_eq!(app.stock_left(sale).await, 80, "no second unit");
    assert!(buyers.is_superset(&accepted));
}

/// The batch sent through `conn` accepted, and the `WAIT` behind it did not
/// confirm it: 503 `not_replicated`.
fn assert_not_replicated(conn: stampede::redis_conn::acks::ThenWait<'_>) {
    let refused = conn.confirm(true).unwrap_err();
    assert_eq!(
        refused.error_code(),
        stampede::error::ErrorCode::NotReplicated,
        "{refused:?}"
    );
}

/// The purchase script for `sale` of `app`, without limits, at the Redis clock.
fn unlimited_batch(app: &TestApp, sale: i64) -> PurchaseBatch<'_> {
    PurchaseBatch {
        keys: &app.keys,
        sale: Id::new(sale).unwrap(),
        policies: &[],
        now_ms: None,
        key_ttl: Duration::from_secs(86_400),
    }
}

/// A redis-server of the test's own on a free loopback port, without persistence,
/// killed and its directory removed when dropped.
struct OwnRedis {
    child: std::process::Child,
    dir: std::path::PathBuf,
    port: u16,
}

impl OwnRedis {
    fn start(args: &[&str]) -> OwnRedis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("stampede-own-redis-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let child = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .args(args)
            .arg("--dir")
            .arg(&dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server");
        OwnRedis { child, dir, port }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A connection of Stampede's own kind, once the server answers.
    async fn connect(&self) -> stampede::redis_conn::Redis {
        let config = stampede::config::Config {
            redis_url: self.url(),
            ..stampede::config::Config::default()
        };
        for _ in 0..100 {
            if let Ok(r) = stampede::startup::connect_redis(&config).await {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{} does not answer", self.url());
    }

    /// Sends the process `signal` (`-STOP`, `-CONT`).
    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A purchase whose first answer was 503 `not_replicated`, sent again with its key
/// on another connection, is confirmed only once a replica has the first decision.
/// From Redis 7.2 a client's replication offset moves only with a command that
/// wrote, so the `WAIT` behind a replay on a connection that wrote nothing would
/// count every replica still connected at once, whatever it has; the purchase
/// script writes on a replay for that. The replica here is stopped (SIGSTOP): still connected,
/// acknowledging nothing, so both answers are `not_replicated`; running again, it
/// confirms the next replay.
#[tokio::test(flavor = "multi_thread")]
async fn a_replayed_acceptance_is_confirmed_only_once_a_replica_has_it() {
    let primary = OwnRedis::start(&["--repl-diskless-sync-delay", "0"]);
    let replica = OwnRedis::start(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let mut probe = primary.connect().await;
    for attempt in 0.. {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut probe)
            .await
            .unwrap();
        if info.contains("connected_slaves:1") && info.contains(",state=online,") {
            break;
        }
        assert!(attempt < 200, "the replica did not sync: {info}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let url = primary.url();
    let app = spawn_app_with(move |c| {
        c.redis_url = url;
        c.redis_cluster.clear();
        c.settle_in_serve = false;
    })
    .await;
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 10).await;
    let a = app.user().await;
    let buyer = BuyRequest {
        user: Id::new(a.id).unwrap(),
        quantity: 1,
        ip: None,
        key: Some(stampede::domain::PurchaseKey::parse(b"press-1").unwrap()),
    };
    let call = unlimited_batch(&app, sale);
    let acks = stampede::redis_conn::acks::ReplicaAcks {
        replicas: 1,
        timeout: Duration::from_millis(100),
    };
    let key = app.sale_keys(sale).stock;
    replica.signal("-STOP");

    let mut first = primary.connect().await;
    let mut conn = acks.then_wait(&mut first, &key);
    let replies = call
        .run(&mut conn, std::slice::from_ref(&buyer))
        .await
        .unwrap();
    let PurchaseOutcome::Accepted { order_id, .. } = replies[0].outcome else {
        panic!("{:?}", replies[0].outcome);
    };
    assert_not_replicated(conn);
    // What sending the script and its `WAIT` together prevents: a `WAIT` on a link
    // that has sent nothing else counts the stopped replica at once.
    let mut bare = TcpStream::connect(("127.0.0.1", primary.port))
        .await
        .unwrap();
    bare.write_all(b"WAIT 1 100\r\n").await.unwrap();
    let mut answer = [0u8; 4];
    bare.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b":1\r\n", "a bare WAIT is answered at once");

    // The retry, on a connection that has written nothing. (On Redis 7.0 its
    // read-only script alone moves the offset its `WAIT` waits for; from 7.2 only
    // a write does, which the script makes on a replay: it refreshes the keys
    // hash's expiry, here to a longer one, which shows that it wrote.)
    let retry = PurchaseBatch {
        key_ttl: Duration::from_secs(2 * 86_400),
        ..unlimited_batch(&app, sale)
    };
    let mut second = primary.connect().await;
    let mut conn = acks.then_wait(&mut second, &key);
    let replies = retry
        .run(&mut conn, std::slice::from_ref(&buyer))
        .await
        .unwrap();
    let idem = app.sale_keys(sale).idem;
    let ttl = crate::helpers::redis_pttl(&app.redis, &idem).await;
    assert!(
        ttl > 86_400_000,
        "the replay refreshed the keys hash: {ttl}"
    );
    assert!(replies[0].replayed, "{:?}", replies[0]);
    assert!(
        matches!(replies[0].outcome, PurchaseOutcome::Accepted { order_id: o, .. } if o == order_id),
        "{:?}",
        replies[0].outcome
    );
    // The replica has acknowledged nothing since before the first decision.
    assert_not_replicated(conn);

    // Running again, the replica catches up: the next replay is confirmed.
    replica.signal("-CONT");
    let patient = stampede::redis_conn::acks::ReplicaAcks {
        replicas: 1,
        timeout: Duration::from_secs(5),
    };
    let mut third = primary.connect().await;
    let mut conn = patient.then_wait(&mut third, &key);
    let replies = call
        .run(&mut conn, std::slice::from_ref(&buyer))
        .await
        .unwrap();
    assert!(replies[0].replayed, "{:?}", replies[0]);
    conn.confirm(true).unwrap();
    assert_eq!(app.stock_left(sale).await, 9, "one unit taken");
}

/// Where Redis refuses functions (an ACL without `FCALL` and `FUNCTION`, as a
/// managed Redis may set), the batch decisions run as `EVALSHA` (src/lua.rs):
/// every purchase decided, none 5xx, the stock exact, and the node saw `FCALL`
/// refused and the script run.
#[tokio::test(flavor = "multi_thread")]
async fn where_redis_refuses_functions_the_decisions_run_as_scripts() {
    let node = OwnRedis::start(&[
        "--user",
        "default",
        "on",
        "nopass",
        "~*",
        "&*",
        "+@all",
        "-fcall",
        "-function",
    ]);
    let mut probe = node.connect().await;
    let url = node.url();
    let app = Arc::new(
        spawn_app_with(move |c| {
            c.redis_url = url;
            c.redis_cluster.clear();
            c.sold_out_cache = Duration::ZERO;
        })
        .await,
    );
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 5).await;
    let users = app.create_users(8, false).await;
    let answers = together(
        &app,
        users.iter().map(|u| (sale, u.token.clone())).collect(),
    )
    .await;
    let statuses: Vec<StatusCode> = answers.iter().map(|(_, st)| *st).collect();
    assert_eq!(
        statuses
            .iter()
            .filter(|st| **st == StatusCode::ACCEPTED)
            .count(),
        5,
        "{statuses:?}"
    );
    assert!(
        statuses
            .iter()
            .all(|st| [StatusCode::ACCEPTED, StatusCode::GONE].contains(st)),
        "only accepted and sold out: {statuses:?}"
    );
    assert_eq!(app.stock_left(sale).await, 0);
    assert_eq!(app.buyers(sale).await.len(), 5);
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut probe)
        .await
        .unwrap();
    let stat = |command: &str, field: &str| -> i64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:")))
            .and_then(|l| {
                l.split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{field}=")))
            })
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    assert!(stat("fcall", "rejected_calls") >= 1, "{stats}");
    assert!(stat("evalsha", "calls") >= 1, "{stats}");
}

/// A `WAIT` that Redis refuses, as a node demoted to a replica does (a failover
/// between the decision and its `WAIT`), confirms nothing: 503 `not_replicated`,
/// never a 500. The node here is a redis-server started as a replica of nobody.
#[tokio::test(flavor = "multi_thread")]
async fn a_wait_refused_by_a_demoted_node_is_not_replicated() {
    let node = OwnRedis::start(&["--replicaof", "127.0.0.1", "1"]);
    let mut redis = node.connect().await;
    let acks = stampede::redis_conn::acks::ReplicaAcks {
        replicas: 1,
        timeout: Duration::from_millis(100),
    };
    let mut conn = acks.then_wait(&mut redis, "k");
    // A script a replica runs (it writes nothing); the WAIT behind it is refused.
    let one: i64 = redis::cmd("EVAL")
        .arg("return 1")
        .arg(0)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(one, 1);
    assert_not_replicated(conn);
}

/// With replica acknowledgements a batch's script and its `WAIT` go in one
/// pipeline. Where Redis has lost the function (a restart that lost its data, a
/// flush), the library is loaded and the pipeline goes again: the purchase is decided
/// once, and only the `WAIT` that followed the script that ran confirms it (here it
/// cannot: more replicas than any test Redis has). A batch that accepted nothing
/// is answered without one.
#[tokio::test(flavor = "multi_thread")]
async fn with_replica_acks_a_lost_script_goes_again_with_its_wait_and_decides_once() {
    let (app, _, sale) = spawn_with_live_sale(10).await;
    let a = app.user().await;
    let buyer = BuyRequest {
        user: Id::new(a.id).unwrap(),
        quantity: 1,
        ip: None,
        key: None,
    };
    let call = unlimited_batch(&app, sale);
    let acks = stampede::redis_conn::acks::ReplicaAcks {
        replicas: 5,
        timeout: Duration::from_millis(50),
    };
    let key = app.sale_keys(sale).stock;
    flush_scripts_on_node_of(&key);
    let mut redis = app.redis.clone();

    let mut conn = acks.then_wait(&mut redis, &key);
    let replies = call
        .run(&mut conn, std::slice::from_ref(&buyer))
        .await
        .unwrap();
    assert!(
        matches!(
            replies[0].outcome,
            PurchaseOutcome::Accepted { stock_left: 9, .. }
        ),
        "{:?}",
        replies[0].outcome
    );
    assert_not_replicated(conn);
    assert_eq!(app.stock_left(sale).await, 9, "decided once");
    assert_eq!(app.buyers(sale).await, vec![a.id]);

    let mut conn = acks.then_wait(&mut redis, &key);
    let replies = call.run(&mut conn, &[buyer]).await.unwrap();
    assert!(matches!(
        replies[0].outcome,
        PurchaseOutcome::AlreadyBought { order: Some(_) }
    ));
    conn.confirm(false).unwrap();
    assert_eq!(app.stock_left(sale).await, 9);
    assert_eq!(app.wait_for_orders(sale, 1).await.len(), 1);
}

/// An accepted purchase reports each policy's answer (remaining and reset; an
/// allowed request's wait is not sent) exactly as the limiter script
/// (`lua/limit.lua`) answers the same requests at the same times: the batch reads
/// the sliding log's and counter's answers off the state its take left
/// (`limits_append_taken` in lua/lib/limits.lua) and decides the others again.
/// Three batches: one user at the log's limit, a refusal that counts nowhere, and a
/// batch in the counter's next window.
#[tokio::test(flavor = "multi_thread")]
async fn accepted_purchases_report_what_the_limiter_script_answers() {
    use stampede::limit::{self, Algorithm, Attempt, Subject};
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app
        .live_sale_with(&admin, 100, serde_json::json!({"max_per_user": 5}))
        .await;
    let (a, b) = (app.user().await.id, app.user().await.id);
    let policies = vec![
        policy(
            "u-log",
            Subject::User,
            Algorithm::SlidingLog {
                limit: 4,
                window_ms: 1000,
            },
        ),
        policy(
            "u-fixed",
            Subject::User,
            Algorithm::FixedWindow {
                limit: 5,
                window_ms: 1000,
            },
        ),
        policy(
            "ip-counter",
            Subject::Ip,
            Algorithm::SlidingCounter {
                limit: 9,
                window_ms: 1000,
            },
        ),
        policy(
            "ip-bucket",
            Subject::Ip,
            Algorithm::TokenBucket {
                capacity: 10,
                refill_per_sec: 2.0,
                cost: 1,
            },
        ),
    ];
    let ip: std::net::IpAddr = "10.0.0.7".parse().unwrap();
    let buyer = |id: i64| BuyRequest {
        user: Id::new(id).unwrap(),
        quantity: 1,
        ip: Some(ip),
        key: None,
    };
    // Whole seconds, so every window starts at t0.
    let t0 = chrono::Utc::now().timestamp_millis() / 1000 * 1000;
    let batches = [
        (t0, vec![a, a, a, b, b]),
        (t0 + 600, vec![a, b, a]),
        (t0 + 1300, vec![b, a]),
    ];
    let mut redis = app.redis.clone();
    let mut accepted = 0;
    for (now, users) in batches {
        let replies = PurchaseBatch {
            keys: &app.keys,
            sale: Id::new(sale).unwrap(),
            policies: &policies,
            now_ms: Some(now),
            key_ttl: Duration::from_secs(86_400),
        }
        .run(
            &mut redis,
            &users.iter().map(|u| buyer(*u)).collect::<Vec<_>>(),
        )
        .await
        .unwrap();
        for (user, reply) in users.iter().zip(&replies) {
            if !matches!(reply.outcome, PurchaseOutcome::Accepted { .. }) {
                // Refused by a limit: counted by none, so the script is not asked.
                assert!(
                    matches!(reply.outcome, PurchaseOutcome::RateLimited { .. }),
                    "{reply:?}"
                );
                continue;
            }
            accepted += 1;
            assert_eq!(reply.limits.len(), policies.len());
            for (p, got) in policies.iter().zip(&reply.limits) {
                let subject = match p.subject {
                    Subject::User => user.to_string(),
                    _ => ip.to_string(),
                };
                let key = app.keys.rate_limit(&format!("ref-{}", p.name), &subject);
                let want = limit::take(
                    &mut redis,
                    &Attempt {
                        algorithm: &p.algorithm,
                        key: &key,
                    },
                    Some(now),
                )
                .await
                .unwrap();
                // An accepted request's answer carries no wait (nothing reads it: a
                // RateLimit header has remaining and reset; see limits_append_taken).
                assert_eq!(got.retry_after_ms, 0);
                assert_eq!(
                    (got.verdict, got.remaining, got.reset_ms),
                    (want.verdict, want.remaining, want.reset_ms),
                    "{} for user {user} at t0 + {} ms",
                    p.name,
                    now - t0
                );
            }
        }
    }
    // a: 3, then 1 (the log's 4th: its last), the 5th refused; b: 2, 1, 1; a once more in
    // the next window.
    assert_eq!(accepted, 9);
}

/// A policy keeps its subjects' states in buckets, one hash per span of its window
/// (`limits_cache` in lua/lib/limits.lua): a state written in one span still
/// counts in the next (read from the previous bucket), a bucket two spans old is
/// deleted by the next write, and every bucket carries an expiry of at most three
/// spans. Replayed clock, a sliding log of 2 per 1,000 ms; per user, then per
/// address (the buyer's address the field, no key of its own).
#[tokio::test(flavor = "multi_thread")]
async fn per_user_limit_states_live_in_buckets_that_carry_over_one_span_and_go() {
    limit_states_carry_over_one_span_and_go(stampede::limit::Subject::User).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn per_address_limit_states_live_in_buckets_that_carry_over_one_span_and_go() {
    limit_states_carry_over_one_span_and_go(stampede::limit::Subject::Ip).await;
}

async fn limit_states_carry_over_one_span_and_go(subject: stampede::limit::Subject) {
    use stampede::limit::{Algorithm, Subject};
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app
        .live_sale_with(&admin, 100, serde_json::json!({"max_per_user": 10}))
        .await;
    let user = app.user().await.id;
    let address = std::net::IpAddr::from([203, 0, 113, 9]);
    let field = match subject {
        Subject::User => user.to_string(),
        Subject::Ip | Subject::Subnet => address.to_string(),
    };
    let policies = vec![policy(
        "log",
        subject,
        Algorithm::SlidingLog {
            limit: 2,
            window_ms: 1000,
        },
    )];
    let buyer = BuyRequest {
        user: Id::new(user).unwrap(),
        quantity: 1,
        ip: Some(address),
        key: None,
    };
    let span0 = chrono::Utc::now().timestamp_millis() / 1000;
    let mut redis = app.redis.clone();
    let mut buy_at = async |now: i64| {
        PurchaseBatch {
            keys: &app.keys,
            sale: Id::new(sale).unwrap(),
            policies: &policies,
            now_ms: Some(now),
            key_ttl: Duration::from_secs(86_400),
        }
        .run(&mut redis, std::slice::from_ref(&buyer))
        .await
        .unwrap()
        .remove(0)
        .outcome
    };
    let bucket = |span: i64| {
        app.keys
            .sale_rate_limit(Id::new(sale).unwrap(), "log", stampede::batch::BUCKETS)
            + &span.to_string()
    };
    let accepted = |o: &PurchaseOutcome| matches!(o, PurchaseOutcome::Accepted { .. });

    // Two in span 0 (late in it); the third, 300 ms later in span 1, is refused:
    // the log from span 0's bucket still holds both.
    assert!(accepted(&buy_at(span0 * 1000 + 800).await));
    assert!(accepted(&buy_at(span0 * 1000 + 900).await));
    assert_eq!(subject_log_entries(&app, sale, "log", &field).await, 2);
    let third = buy_at(span0 * 1000 + 1100).await;
    assert!(
        matches!(third, PurchaseOutcome::RateLimited { .. }),
        "{third:?}"
    );
    assert_eq!(
        limit_buckets(&app, sale, "log").await,
        vec![bucket(span0)],
        "a refused request writes nothing"
    );
    // In span 1, past the first entry's window: allowed, written to span 1's bucket
    // with the live entry carried over.
    assert!(accepted(&buy_at(span0 * 1000 + 1850).await));
    assert_eq!(subject_log_entries(&app, sale, "log", &field).await, 2);
    // Span 2: span 0's bucket goes with the first write.
    assert!(accepted(&buy_at(span0 * 1000 + 2950).await));
    assert_eq!(
        limit_buckets(&app, sale, "log").await,
        vec![bucket(span0 + 2), bucket(span0 + 1)]
    );
    for key in limit_buckets(&app, sale, "log").await {
        let ttl = redis_pttl(&app.redis, &key).await;
        assert!(ttl > 0 && ttl <= 3_000, "{key}: PTTL {ttl}");
    }
    // Nothing else of the policy: no key per address (or user) beside its buckets.
    let prefix = app.keys.sale_rate_limit(Id::new(sale).unwrap(), "log", "");
    let all: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();
    assert_eq!(all.len(), 2, "{all:?}");
}

/// A batch reads a policy's states in chunks of 1,000 fields (one `HMGET` of its
/// bucket each): 1,100 buyers, each from an address of their own, are 1,101 fields
/// of each per-user and per-address policy's bucket (with its mark `#`), and a
/// state past the first chunk is read like any other: the last buyer's log is full,
/// so it alone is refused by the limit, and an address counted by an earlier call
/// (buyer 1,050's, 1,051st of the read) counts on. A per-subnet policy beside the
/// per-address one keeps its own buckets, a field per /24. Everyone else is
/// counted once and buys. One clock for both calls (mid-span), so no window turns
/// between them.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_past_one_read_chunk_reads_every_limit_state() {
    use stampede::limit::{Algorithm, Subject};
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = Id::new(app.live_sale(&admin, 2_000).await).unwrap();
    let users = app.create_users(1_101, false).await;
    let counter = |name: &str, subject| {
        policy(
            name,
            subject,
            Algorithm::SlidingCounter {
                limit: 100_000,
                window_ms: 60_000,
            },
        )
    };
    let policies = vec![
        policy(
            "buy-user",
            Subject::User,
            Algorithm::SlidingLog {
                limit: 1,
                window_ms: 60_000,
            },
        ),
        counter("buy-ip", Subject::Ip),
        counter("buy-net", Subject::Subnet),
    ];
    let address = |n: usize| std::net::IpAddr::from([10, 1, (n / 250) as u8, (n % 250) as u8]);
    let buyer = |n: usize| BuyRequest {
        user: Id::new(users[n].id).unwrap(),
        quantity: 1,
        ip: Some(address(n)),
        key: None,
    };
    let now = chrono::Utc::now().timestamp_millis();
    let batch = PurchaseBatch {
        keys: &app.keys,
        sale,
        policies: &policies,
        now_ms: Some(now - now % 120_000 + 60_000),
        key_ttl: Duration::from_secs(86_400),
    };
    let mut redis = app.redis.clone();
    let last = 1_099;
    // The last buyer, and user 1,100 (not in the big batch) from buyer 1,050's address.
    let early = BuyRequest {
        ip: Some(address(1_050)),
        ..buyer(1_100)
    };
    let first = batch.run(&mut redis, &[buyer(last), early]).await.unwrap();
    assert!(
        first
            .iter()
            .all(|r| matches!(r.outcome, PurchaseOutcome::Accepted { .. })),
        "{first:?}"
    );

    let all: Vec<BuyRequest> = (0..=last).map(buyer).collect();
    let replies = batch.run(&mut redis, &all).await.unwrap();
    for (n, reply) in replies.iter().enumerate() {
        if n == last {
            assert!(
                matches!(reply.outcome, PurchaseOutcome::RateLimited { .. }),
                "the last buyer's full log (field 1,100 of 1,101) was read: {reply:?}"
            );
        } else {
            assert!(
                matches!(reply.outcome, PurchaseOutcome::Accepted { .. }),
                "buyer {n}: {reply:?}"
            );
        }
    }
    assert_eq!(app.stock_left(sale.get()).await, 2_000 - 1_101);
    for n in [0, 499, 998, 999, 1_000, 1_098, last] {
        assert_eq!(
            user_log_entries(&app, sale.get(), "buy-user", users[n].id).await,
            1,
            "buyer {n}"
        );
    }
    // Each address's count as a field of its policy's bucket (`<window> <count>
    // <previous count>`): one bucket a policy, no key of its own per subject.
    let counts = async |policy: &str, field: &str| -> String {
        let buckets = limit_buckets(&app, sale.get(), policy).await;
        assert_eq!(buckets.len(), 1, "{policy}: {buckets:?}");
        let state: Option<String> = redis::cmd("HGET")
            .arg(&buckets[0])
            .arg(field)
            .query_async(&mut app.redis.clone())
            .await
            .unwrap();
        let state = state.unwrap_or_default();
        state
            .split_once(' ')
            .map(|(_, c)| c.to_string())
            .unwrap_or(state)
    };
    for n in [0, 499, 998, 999, 1_000, 1_098, last] {
        assert_eq!(
            counts("buy-ip", &address(n).to_string()).await,
            "1 0",
            "buyer {n}"
        );
    }
    assert_eq!(
        counts("buy-ip", &address(1_050).to_string()).await,
        "2 0",
        "an address counted before, read past the first chunk"
    );
    assert_eq!(counts("buy-net", "10.1.0.0/24").await, "250 0");
    // 10.1.4.0/24: buyers 1,000 to 1,099 (the last counted by the first call, not
    // by the batch that refused it) and user 1,100.
    assert_eq!(counts("buy-net", "10.1.4.0/24").await, "101 0");
    let fields: usize = redis::cmd("HLEN")
        .arg(&limit_buckets(&app, sale.get(), "buy-ip").await[0])
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(fields, 1_101, "1,100 addresses and the mark `#`");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!(
            "{}:{{sale:{sale}}}:rl:*",
            app.config.redis_namespace
        ))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(
        keys.len(),
        3,
        "a bucket a policy and nothing else: {keys:?}"
    );
}

/// A decider that takes 500 ms a batch and records what each batch held.
struct Recorder<const DROP: bool> {
    batches: Arc<std::sync::Mutex<Vec<Vec<u32>>>>,
}

impl<const DROP: bool> stampede::batch::Decider for Recorder<DROP> {
    type Key = u32;
    type Request = u32;
    type Reply = u32;
    const DROP_ABANDONED: bool = DROP;

    async fn decide(
        &self,
        _redis: stampede::redis_conn::Redis,
        _key: u32,
        batch: Vec<u32>,
    ) -> Result<Vec<u32>, stampede::error::AppError> {
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.batches.lock().unwrap().push(batch.clone());
        Ok(batch)
    }
}

/// Requests queued behind a batch in flight whose callers stop waiting: a decider
/// that drops abandoned requests (the `already_bought` read) leaves them out of the
/// next batch; one that does not (the decisions) decides them all the same.
async fn batches_after_callers_leave<const DROP: bool>() -> Vec<Vec<u32>> {
    use stampede::batch::{Batcher, Connections, Counters};
    let metrics = Arc::new(stampede::metrics::Metrics::off());
    let batches = Arc::new(std::sync::Mutex::new(Vec::new()));
    let batcher = Batcher::new(
        Recorder::<DROP> {
            batches: batches.clone(),
        },
        Connections::new(vec![crate::helpers::test_redis().await]),
        64,
        1,
        Counters {
            metrics,
            batches: |m| &m.held_batches,
            requests: |m| &m.held_batched,
            sizes: |m| &m.observed.held_batch_size,
        },
    );
    let first = tokio::spawn({
        let b = batcher.clone();
        async move { b.submit(7, 0).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    for r in 1..=10 {
        let gone = tokio::time::timeout(Duration::from_millis(5), batcher.submit(7, r)).await;
        assert!(
            gone.is_err(),
            "request {r} waits behind the batch in flight"
        );
    }
    assert_eq!(batcher.submit(7, 11).await.unwrap(), 11);
    assert_eq!(first.await.unwrap(), 0);
    batches.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_nobody_waits_for_are_dropped_only_by_a_decider_that_asks() {
    assert_eq!(
        batches_after_callers_leave::<true>().await,
        vec![vec![0], vec![11]]
    );
    assert_eq!(
        batches_after_callers_leave::<false>().await,
        vec![vec![0], (1..=11).collect::<Vec<u32>>()]
    );
}
