//! `spawn_app`: a real server on a free port, with its own Postgres database and
//! Redis namespace, both removed again when the `TestApp` is dropped.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use actix_web::web;
use futures_util::future::join_all;
use reqwest::header::{self, HeaderMap};
use reqwest::{Client, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};
use stampede::auth::token::{Claims, TokenKey};
use stampede::config::Config;
use stampede::config::LimitsConfig;
use stampede::domain::Id;
use stampede::keys::{Keys, SaleKeys};
use stampede::redis_conn::{Redis, Target, Timeouts};
use stampede::startup::Application;
use stampede::state::AppState;
use uuid::Uuid;

pub use crate::bodies::{merged, poll_ids};
use crate::bodies::{poll_body, sale_body};
pub use crate::db::Db;

pub struct TestApp {
    pub address: String,
    pub port: u16,
    /// The listener that serves only `/metrics` (loopback, no token).
    pub metrics_port: Option<u16>,
    pub db: PgPool,
    pub redis: Redis,
    pub keys: Keys,
    pub config: Config,
    pub tokens: TokenKey,
    pub client: Client,
    /// The server's own state (counters, cache), for white-box assertions.
    pub state: web::Data<AppState>,
    db_name: String,
    maintenance_url: String,
}

pub struct User {
    pub id: i64,
    pub token: String,
}

/// The Redis Cluster the tests run on, when `STAMPEDE_TEST_REDIS_CLUSTER` names its
/// nodes (`scripts/test` runs the whole API suite a second time that way); else none,
/// and the tests use the one node of `STAMPEDE_TEST_REDIS_URL`.
pub fn test_redis_cluster() -> Vec<String> {
    std::env::var("STAMPEDE_TEST_REDIS_CLUSTER")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(String::from)
        .collect()
}

/// The URL of the tests' single Redis node (`STAMPEDE_TEST_REDIS_URL`).
/// The shared Lua library (`lua/lib/*.lua`) through the rate-limit runner, in the
/// order `lua_script!` assembles it, for a test script that calls its functions.
pub fn lua_limits_library() -> String {
    [
        "run",
        "clock",
        "limit_fixed_window",
        "limit_sliding_log",
        "limit_sliding_counter",
        "limit_token_bucket",
        "limits",
        "limits_batch",
    ]
    .iter()
    .map(|name| {
        std::fs::read_to_string(format!("{}/lua/lib/{name}.lua", env!("CARGO_MANIFEST_DIR")))
            .expect("library file")
    })
    .collect()
}

pub fn test_redis_url() -> String {
    env_url("STAMPEDE_TEST_REDIS_URL", "REDIS_URL")
}

/// The URL of the tests' Postgres maintenance database (`STAMPEDE_TEST_DATABASE_URL`),
/// where each test creates its own database.
pub fn test_database_url() -> String {
    env_url("STAMPEDE_TEST_DATABASE_URL", "DATABASE_URL")
}

/// Where the tests' Redis is: the cluster when one is configured, else the node.
pub fn test_redis_target() -> Target {
    let cluster = test_redis_cluster();
    if cluster.is_empty() {
        Target::Node(test_redis_url())
    } else {
        Target::Cluster(cluster)
    }
}

/// A connection to the tests' Redis (node or cluster), for tests that talk to it
/// without an app.
pub async fn test_redis() -> Redis {
    Redis::connect(
        &test_redis_target(),
        Timeouts {
            connect: Duration::from_secs(2),
            response: Some(Duration::from_secs(5)),
            resend: true,
        },
    )
    .await
    .expect("connect to the test Redis")
}

/// A Redis key namespace of its own on the tests' Redis, for tests that need Redis
/// but no server (locks, limit scripts). Every key under it is deleted on drop, so
/// keep it to the end of the test:
/// `let RedisNamespace { redis, keys } = &RedisNamespace::new().await;`.
pub struct RedisNamespace {
    pub redis: Redis,
    pub keys: Keys,
}

impl RedisNamespace {
    pub async fn new() -> Self {
        let ns = format!("tl{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        RedisNamespace {
            redis: test_redis().await,
            keys: Keys::new(&ns),
        }
    }

    /// Every key of the namespace there is now.
    pub async fn all_keys(&self) -> Vec<String> {
        redis::cmd("KEYS")
            .arg(format!("{}:*", self.keys.namespace()))
            .query_async(&mut self.redis.clone())
            .await
            .unwrap()
    }
}

impl Drop for RedisNamespace {
    fn drop(&mut self) {
        let pattern = format!("{}:*", self.keys.namespace());
        let target = test_redis_target();
        let _ = std::thread::spawn(move || unlink_matching(&target, &pattern)).join();
    }
}

/// `GET key`.
pub async fn redis_get(redis: &Redis, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut redis.clone())
        .await
        .unwrap()
}

/// `PTTL key`: ms to live, -1 without an expiry, -2 for no key.
pub async fn redis_pttl(redis: &Redis, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut redis.clone())
        .await
        .unwrap()
}

/// The address a `redis://[user@]host:port/` URL points at (for TCP relays).
pub async fn socket_addr_of(url: &str) -> SocketAddr {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    tokio::net::lookup_host(rest.split('/').next().unwrap())
        .await
        .unwrap()
        .next()
        .unwrap()
}

/// Deletes every key matching `pattern` (blocking; for `Drop`). On a cluster: on
/// every primary, found from the first node that answers `CLUSTER NODES`.
pub fn unlink_matching(target: &Target, pattern: &str) {
    let nodes: Vec<String> = match target {
        Target::Node(url) => vec![url.clone()],
        Target::Cluster(seeds) => seeds
            .iter()
            .find_map(|seed| {
                let mut conn = redis::Client::open(seed.as_str())
                    .ok()?
                    .get_connection()
                    .ok()?;
                let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut conn).ok()?;
                Some(
                    nodes
                        .lines()
                        .filter(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("master")))
                        .filter_map(|l| l.split(' ').nth(1)?.split('@').next())
                        .map(|addr| format!("redis://{addr}/"))
                        .collect(),
                )
            })
            .unwrap_or_default(),
    };
    for node in nodes {
        let Ok(mut conn) = redis::Client::open(node).and_then(|c| c.get_connection()) else {
            continue;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut conn)
            .unwrap_or_default();
        // One key per UNLINK: on a cluster node, keys of several slots in one command
        // are refused.
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.cmd("UNLINK").arg(key).ignore();
        }
        let _: redis::RedisResult<()> = pipe.query(&mut conn);
    }
}

/// A blocking connection to the first seed of the tests' cluster that answers.
fn cluster_seed(seeds: &[String]) -> Option<redis::Connection> {
    seeds.iter().find_map(|seed| {
        redis::Client::open(seed.as_str())
            .ok()?
            .get_connection()
            .ok()
    })
}

/// The node that holds `key` now: on the tests' cluster the address
/// (`host:port`) of the primary of its slot, found with `CLUSTER KEYSLOT` and
/// `CLUSTER SLOTS`; on a single node, its URL.
pub fn node_of(key: &str) -> String {
    let Target::Cluster(seeds) = test_redis_target() else {
        return test_redis_url();
    };
    let mut conn = cluster_seed(&seeds).expect("a cluster node answers");
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut conn)
        .expect("CLUSTER KEYSLOT");
    let ranges: Vec<(i64, i64, (String, i64))> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query::<Vec<Vec<redis::Value>>>(&mut conn)
        .expect("CLUSTER SLOTS")
        .into_iter()
        .map(|range| {
            let num = |v: &redis::Value| redis::from_redis_value::<i64>(v.clone()).unwrap();
            let redis::Value::Array(owner) = &range[2] else {
                panic!("CLUSTER SLOTS: no owner in {range:?}")
            };
            let host: String = redis::from_redis_value(owner[0].clone()).unwrap();
            (num(&range[0]), num(&range[1]), (host, num(&owner[1])))
        })
        .collect();
    let (_, _, (host, port)) = ranges
        .into_iter()
        .find(|(start, end, _)| (*start..=*end).contains(&slot))
        .unwrap_or_else(|| panic!("no node serves slot {slot}"));
    format!("{host}:{port}")
}

/// `SCRIPT FLUSH` and `FUNCTION FLUSH` on the node that holds `key` only (on a
/// single node: that node): the scripts and the functions (the batch decisions,
/// see `src/lua.rs`) are gone there and nowhere else.
pub fn flush_scripts_on_node_of(key: &str) {
    let node = node_of(key);
    let url = if node.contains("://") {
        node
    } else {
        format!("redis://{node}/")
    };
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("connect to the node");
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut conn)
        .expect("SCRIPT FLUSH");
    let () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut conn)
        .expect("FUNCTION FLUSH");
}

fn env_url(primary: &str, fallback: &str) -> String {
    std::env::var(primary)
        .or_else(|_| std::env::var(fallback))
        .unwrap_or_else(|_| panic!("set {primary} (scripts/test does): tests need a real server"))
}

/// A fresh, valid config for one test: own database, own namespace, port 0.
pub async fn test_config() -> (Config, String, String) {
    let maintenance_url = test_database_url();
    let redis_url = test_redis_url();
    let redis_cluster = test_redis_cluster();
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let db_name = format!("stampede_test_{suffix}");
    let mut conn = PgConnection::connect(&maintenance_url)
        .await
        .expect("connect to the test Postgres");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        r#"CREATE DATABASE "{db_name}""#
    )))
    .execute(&mut conn)
    .await
    .expect("create test database");
    let database_url = replace_db(&maintenance_url, &db_name);
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        database_url,
        redis_url,
        redis_cluster,
        redis_namespace: format!("t{}", &suffix[..12]),
        token_secret: stampede::auth::random_token_hex(32),
        workers: 2,
        database_max_connections: 10,
        // Tests that fire hundreds of Postgres-backed requests at once on a busy
        // 2-core machine queue for those 10 connections longer than the product's
        // 1 s; the statement timeout stays the product's (tests/api/health.rs).
        database_acquire_timeout: Duration::from_secs(5),
        // Every test client comes from 127.0.0.1: the default per-IP limits would
        // trip tests of other things. tests/api/limit.rs turns them on.
        limits: LimitsConfig::off(),
        ..Config::default()
    };
    (config, db_name, maintenance_url)
}

fn replace_db(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let slash = base.rfind('/').expect("database url has a path");
    let mut out = format!("{}/{db}", &base[..slash]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(tweak: impl FnOnce(&mut Config)) -> TestApp {
    stampede::telemetry::init();
    let (mut config, db_name, maintenance_url) = test_config().await;
    tweak(&mut config);
    spawn_with_config(config, db_name, maintenance_url).await
}

/// A server, its admin and one sale of `stock` units open now (see
/// [`TestApp::live_sale`]): where most purchase tests start.
pub async fn spawn_with_live_sale(stock: i64) -> (TestApp, User, i64) {
    spawn_with_live_sale_and(stock, |_| {}).await
}

/// [`spawn_with_live_sale`] on a server with `tweak` applied to its config.
pub async fn spawn_with_live_sale_and(
    stock: i64,
    tweak: impl FnOnce(&mut Config),
) -> (TestApp, User, i64) {
    let app = spawn_app_with(tweak).await;
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, stock).await;
    (app, admin, sale)
}

/// A server whose test drives the expiry pass itself (`expire` off), its admin
/// and a payment sale (see [`TestApp::payment_sale`]).
pub async fn spawn_with_payment_sale(
    stock: i64,
    window_s: i64,
    rebuy: bool,
) -> (TestApp, User, i64) {
    let app = spawn_app_with(|c| c.expire = Duration::ZERO).await;
    let admin = app.admin().await;
    let sale = app.payment_sale(&admin, stock, window_s, rebuy).await;
    (app, admin, sale)
}

/// A server, its admin and a poll open now (see [`TestApp::open_poll`]): the poll's
/// id and its option ids in order.
pub async fn spawn_with_open_poll(
    question: &str,
    options: &[&str],
) -> (TestApp, User, (i64, Vec<i64>)) {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let poll = app.open_poll(&admin, question, options).await;
    (app, admin, poll)
}

/// A second server on the same database and namespace as `app` (for multi-instance
/// tests). It does not own the database: dropping it removes nothing.
pub async fn spawn_sibling(app: &TestApp, tweak: impl FnOnce(&mut Config)) -> TestApp {
    let mut config = app.config.clone();
    tweak(&mut config);
    let mut sibling = spawn_with_config(config, String::new(), app.maintenance_url.clone()).await;
    sibling.db_name.clear();
    sibling
}

async fn spawn_with_config(config: Config, db_name: String, maintenance_url: String) -> TestApp {
    let app = Application::build(config.clone())
        .await
        .expect("build application");
    let port = app.port();
    let metrics_port = app.metrics_port();
    let state = app.state();
    // The server answers at once; the tests' first requests expect what Redis
    // lost to be rebuilt already (one that needs otherwise spawns without it).
    tokio::time::timeout(Duration::from_secs(60), app.swept())
        .await
        .expect("the startup sweep within a minute");
    tokio::spawn(app.run_until_stopped());
    let db = PgPoolOptions::new()
        .max_connections(5)
        .connect(&config.database_url)
        .await
        .expect("test pool");
    let redis = stampede::startup::connect_redis(&config)
        .await
        .expect("redis");
    let client = Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(512)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    TestApp {
        address: format!("http://127.0.0.1:{port}"),
        port,
        metrics_port,
        db,
        redis,
        keys: Keys::new(&config.redis_namespace),
        tokens: TokenKey::new(config.token_secret.as_bytes()),
        config,
        client,
        state,
        db_name,
        maintenance_url,
    }
}

impl Db for TestApp {
    fn pool(&self) -> &PgPool {
        &self.db
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// The Prometheus text from the metrics listener.
    pub async fn metrics_text(&self) -> String {
        let port = self.metrics_port.expect("a metrics listener");
        let resp = self
            .client
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
            .expect("metrics request");
        assert_eq!(resp.status(), StatusCode::OK);
        resp.text().await.unwrap()
    }

    /// Inserts `n` users in one statement (no argon2: far too slow for thousands)
    /// and mints their tokens with the server's key. Sign-in itself is tested apart.
    pub async fn create_users(&self, n: usize, admin: bool) -> Vec<User> {
        let ids = self.insert_users(n, admin).await;
        ids.into_iter()
            .map(|id| User {
                id,
                token: self.token_for(id, admin),
            })
            .collect()
    }

    pub async fn user(&self) -> User {
        self.create_users(1, false).await.pop().unwrap()
    }

    pub async fn admin(&self) -> User {
        self.create_users(1, true).await.pop().unwrap()
    }

    pub fn token_for(&self, id: i64, admin: bool) -> String {
        self.tokens.issue(Claims {
            user_id: Id::new(id).unwrap(),
            admin,
            expires_at: chrono::Utc::now().timestamp() + 3600,
            generation: 0,
            session: rand::random(),
            account_created: None,
        })
    }

    /// Sends `req`, with `token` as its bearer token if given.
    async fn send(req: RequestBuilder, token: Option<&str>) -> Response {
        let req = match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        req.send().await.expect("request")
    }

    pub async fn post_json(&self, path: &str, token: Option<&str>, body: &Value) -> Response {
        Self::send(self.client.post(self.url(path)).json(body), token).await
    }

    pub async fn post(&self, path: &str, token: Option<&str>) -> Response {
        Self::send(self.client.post(self.url(path)), token).await
    }

    /// A GET, sent once more when the connection it reused was closed by the
    /// server's keep-alive timeout as it went out (hyper's `IncompleteMessage`: a
    /// race of the client's pool, no answer of the server; a GET changes nothing).
    pub async fn get(&self, path: &str, token: Option<&str>) -> Response {
        let req = || {
            let req = self.client.get(self.url(path));
            match token {
                Some(t) => req.bearer_auth(t),
                None => req,
            }
        };
        match req().send().await {
            Ok(resp) => resp,
            Err(e) if e.is_request() && !e.is_timeout() => req().send().await.expect("request"),
            Err(e) => panic!("request: {e:?}"),
        }
    }

    /// A GET's JSON body, whatever its status.
    pub async fn get_json(&self, path: &str, token: Option<&str>) -> Value {
        self.get(path, token).await.json().await.unwrap()
    }

    /// Asserts that a GET of `path` answers `status` with the JSON error `code`
    /// (see [`assert_error`]): the error body.
    pub async fn assert_get_error(
        &self,
        path: &str,
        token: Option<&str>,
        status: StatusCode,
        code: &str,
    ) -> Value {
        assert_error(self.get(path, token).await, status, code).await
    }

    /// A GET as a browser sends it: HTML wanted, the session in a cookie.
    pub async fn browse(&self, path: &str, session: Option<&User>) -> Response {
        let mut req = self
            .client
            .get(self.url(path))
            .header(header::ACCEPT, "text/html,application/xhtml+xml,*/*;q=0.8");
        if let Some(user) = session {
            req = req.header(header::COOKIE, format!("stampede_session={}", user.token));
        }
        req.send().await.expect("request")
    }

    /// A page as a browser gets it: asserts a 200 with HTML, and returns the HTML.
    pub async fn html(&self, path: &str, session: Option<&User>) -> String {
        self.html_status(path, session, StatusCode::OK).await
    }

    /// [`Self::html`] for a page that must answer `status` (an HTML error page).
    pub async fn html_status(
        &self,
        path: &str,
        session: Option<&User>,
        status: StatusCode,
    ) -> String {
        assert_html(self.browse(path, session).await, status).await
    }

    /// Creates a sale through the admin API, without purchase tickets (see
    /// `tickets.rs` for sales with them). `starts_in`/`ends_in` are seconds from now
    /// (negative = in the past).
    pub async fn create_sale(&self, admin: &User, stock: i64, starts_in: i64, ends_in: i64) -> i64 {
        self.create_sale_with(admin, stock, starts_in, ends_in, false)
            .await
    }

    /// [`Self::create_sale`], choosing whether purchases need a ticket.
    pub async fn create_sale_with(
        &self,
        admin: &User,
        stock: i64,
        starts_in: i64,
        ends_in: i64,
        requires_ticket: bool,
    ) -> i64 {
        let now = chrono::Utc::now();
        let sale = json!({
            "name": "Test phone",
            "description": "for tests",
            "price_cents": 19_900,
            "stock": stock,
            "starts_at": now + chrono::Duration::seconds(starts_in),
            "ends_at": now + chrono::Duration::seconds(ends_in),
            "requires_ticket": requires_ticket,
        });
        self.admin_create(admin, "/api/admin/sales", &sale).await["id"]
            .as_i64()
            .unwrap()
    }

    /// A sale open now (since a minute ago) for an hour, without tickets, with
    /// `overrides` (such as `payment_window_s`, `max_per_user`) over those
    /// defaults: the created sale.
    pub async fn open_sale_with(&self, admin: &User, stock: i64, overrides: Value) -> Value {
        let sale = sale_body("Test phone", 500, stock, 60, &overrides);
        let created = self.admin_create(admin, "/api/admin/sales", &sale).await;
        for (k, v) in overrides.as_object().expect("an object") {
            assert_eq!(&created[k], v, "{k}");
        }
        created
    }

    /// [`Self::open_sale_with`]: the created sale's id.
    pub async fn live_sale_with(&self, admin: &User, stock: i64, overrides: Value) -> i64 {
        let sale = self.open_sale_with(admin, stock, overrides).await;
        sale["id"].as_i64().unwrap()
    }

    /// The admin's reconcile report of a sale (`GET .../reconcile`).
    pub async fn reconcile_report(&self, admin: &User, sale: i64) -> Value {
        self.get_json(
            &format!("/api/admin/sales/{sale}/reconcile"),
            Some(&admin.token),
        )
        .await
    }

    /// Deletes every key of this test's namespace: what `FLUSHALL` does to a
    /// deployment.
    pub async fn wipe(&self) {
        let keys: Vec<String> = self
            .redis_query(redis::cmd("KEYS").arg(format!("{}:*", self.config.redis_namespace)))
            .await;
        // One key per DEL, in one pipeline: on a cluster, keys of several slots.
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.del(key).ignore();
        }
        let _: () = pipe.query_async(&mut self.redis.clone()).await.unwrap();
    }

    /// The admin's repair (`POST .../reconcile`: a rebuild from Postgres), which
    /// must succeed: the new report.
    pub async fn repair(&self, admin: &User, sale: i64) -> Value {
        let resp = self
            .post(
                &format!("/api/admin/sales/{sale}/reconcile"),
                Some(&admin.token),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::OK, "repair of sale {sale}");
        resp.json().await.unwrap()
    }

    /// An admin's POST that must create (asserts the 201): the created thing.
    pub async fn admin_create(&self, admin: &User, path: &str, body: &Value) -> Value {
        let resp = self.post_json(path, Some(&admin.token), body).await;
        assert_eq!(
            resp.status(),
            StatusCode::CREATED,
            "{}",
            resp.text().await.unwrap()
        );
        resp.json().await.unwrap()
    }

    /// Asserts that the page of `/{kind}/{id}` is the HTML 404 page, with a way back,
    /// for ids that are not numbers, not positive, too large, or of nothing.
    pub async fn assert_bad_ids_get_an_html_404(&self, kind: &str) {
        for id in [
            "abc",
            "0",
            "-1",
            "1.5",
            "%20",
            "99999999999999999999999",
            "424242",
        ] {
            let path = format!("/{kind}/{id}");
            let body = self.html_status(&path, None, StatusCode::NOT_FOUND).await;
            assert!(body.contains("Page not found"), "{path}");
            assert!(body.contains(r#"href="/""#), "{path}: a way back");
        }
    }

    /// A sale open now, for an hour, at 500, with a payment window of `window_s`
    /// seconds; `rebuy` is its `rebuy_after_expiry`.
    pub async fn payment_sale(&self, admin: &User, stock: i64, window_s: i64, rebuy: bool) -> i64 {
        let overrides = json!({ "payment_window_s": window_s, "rebuy_after_expiry": rebuy });
        self.live_sale_with(admin, stock, overrides).await
    }

    /// `n` new users who each bought one unit of the sale (each purchase must be
    /// accepted), one after the other.
    pub async fn new_buyers(&self, sale: i64, n: usize) -> Vec<User> {
        let users = self.create_users(n, false).await;
        for u in &users {
            self.buy(sale, &u.token).await;
        }
        users
    }

    /// `n` new users who each bought `sale`, all at once ([`Self::buy_all`]), and
    /// their orders.
    pub async fn buyers_at_once(&self, sale: i64, n: usize) -> (Vec<User>, HashMap<i64, Uuid>) {
        let users = self.create_users(n, false).await;
        let orders = self.buy_all(sale, &users).await;
        (users, orders)
    }

    /// Buys for every user at once (each must be accepted); returns the order ids by
    /// user.
    pub async fn buy_all(&self, sale: i64, users: &[User]) -> HashMap<i64, Uuid> {
        let answers = join_all(users.iter().map(|u| self.purchase(sale, &u.token))).await;
        let mut orders = HashMap::new();
        for (user, resp) in users.iter().zip(answers) {
            assert_eq!(
                resp.status(),
                StatusCode::ACCEPTED,
                "purchase of {}",
                user.id
            );
            let body: Value = resp.json().await.unwrap();
            let id = Uuid::parse_str(body["order_id"].as_str().unwrap()).unwrap();
            orders.insert(user.id, id);
        }
        orders
    }

    /// `POST /api/orders/{order}/pay` as `user`, under the `Idempotency-Key` `key`.
    pub async fn pay(&self, user: &User, order: impl std::fmt::Display, key: &str) -> Response {
        self.client
            .post(self.url(&format!("/api/orders/{order}/pay")))
            .bearer_auth(&user.token)
            .header("Idempotency-Key", key)
            .send()
            .await
            .unwrap()
    }

    /// The sale's returned units (`stock_changes` of kind 'return'), counted by status.
    pub async fn returns_by_status(&self, sale: i64) -> HashMap<String, i64> {
        let query =
            "SELECT status, count(*) FROM stock_changes WHERE sale_id = $1 AND kind = 'return'
             GROUP BY status";
        let rows: Vec<(String, i64)> = self.rows(query, sale).await;
        rows.into_iter().collect()
    }

    /// The stock arithmetic in both stores: units ever offered (Postgres) = units
    /// left + buyers (Redis), and the admin's reconcile agrees. `step` names the
    /// moment in the messages.
    pub async fn assert_stock_arithmetic(&self, admin: &User, sale: i64, step: &str) {
        let total = self.stock_total(sale).await;
        let left = self.stock_left(sale).await;
        let buyers = self.buyers(sale).await.len() as i64;
        assert_eq!(total, left + buyers, "{step}: stock_total = left + buyers");
        let report = self.reconcile_report(admin, sale).await;
        assert_eq!(report["consistent"], true, "{step}: {report}");
    }

    /// A sale open now (since a minute ago) for an hour, without purchase tickets.
    pub async fn live_sale(&self, admin: &User, stock: i64) -> i64 {
        self.create_sale(admin, stock, -60, 3600).await
    }

    /// [`Self::live_sale`], where purchases need a ticket.
    pub async fn live_ticket_sale(&self, admin: &User, stock: i64) -> i64 {
        self.create_sale_with(admin, stock, -60, 3600, true).await
    }

    /// Creates a poll through the admin API; `opens_in`/`closes_in` are seconds from
    /// now. Returns the poll id and its option ids in order.
    pub async fn create_poll(
        &self,
        admin: &User,
        question: &str,
        options: &[&str],
        opens_in: i64,
        closes_in: i64,
    ) -> (i64, Vec<i64>) {
        self.create_poll_with(admin, question, options, (opens_in, closes_in), json!({}))
            .await
    }

    /// `create_poll` with extra settings (`ballot`, `results`, ...) merged into the
    /// create; `window` is (opens in, closes in) seconds from now.
    pub async fn create_poll_with(
        &self,
        admin: &User,
        question: &str,
        options: &[&str],
        window: (i64, i64),
        settings: Value,
    ) -> (i64, Vec<i64>) {
        let poll = poll_body(question, options, window, &settings);
        poll_ids(&self.admin_create(admin, "/api/admin/polls", &poll).await)
    }

    /// An admin's change of a sale's stock: `{"add": n}` or `{"set": n}`.
    pub async fn change_stock(&self, admin: &User, sale: i64, change: &Value) -> Response {
        self.post_json(
            &format!("/api/admin/sales/{sale}/stock"),
            Some(&admin.token),
            change,
        )
        .await
    }

    /// `who`'s `PATCH` of a sale with `body`.
    pub async fn patch_sale(&self, who: &User, sale: i64, body: &Value) -> Response {
        let url = self.url(&format!("/api/admin/sales/{sale}"));
        let req = self.client.patch(url).bearer_auth(&who.token).json(body);
        req.send().await.unwrap()
    }

    /// An admin closes a sale before its end.
    pub async fn close_sale(&self, admin: &User, sale: i64) -> Response {
        let path = format!("/api/admin/sales/{sale}/close");
        self.post(&path, Some(&admin.token)).await
    }

    /// An admin opens a sale now.
    pub async fn open_sale(&self, admin: &User, sale: i64) -> Response {
        let path = format!("/api/admin/sales/{sale}/open");
        self.post(&path, Some(&admin.token)).await
    }

    /// An admin closes a poll before its end.
    pub async fn close_poll(&self, admin: &User, poll: i64) -> Response {
        let path = format!("/api/admin/polls/{poll}/close");
        self.post(&path, Some(&admin.token)).await
    }

    /// A poll open now (since a minute ago) for an hour. Returns the poll id and its
    /// option ids in order.
    pub async fn open_poll(
        &self,
        admin: &User,
        question: &str,
        options: &[&str],
    ) -> (i64, Vec<i64>) {
        self.create_poll(admin, question, options, -60, 3600).await
    }

    /// A poll open now (since a minute ago) for an hour with extra settings
    /// (`ballot`, `results`, ...). Returns the poll id and its option ids in order.
    pub async fn open_poll_with(
        &self,
        admin: &User,
        question: &str,
        options: &[&str],
        settings: Value,
    ) -> (i64, Vec<i64>) {
        self.create_poll_with(admin, question, options, (-60, 3600), settings)
            .await
    }

    /// A ballot of any kind (`{"option_ids": [..]}`, ...) that must be accepted;
    /// answers the 202's body.
    pub async fn cast_ballot(&self, poll: i64, token: &str, ballot: Value) -> Value {
        let resp = self
            .post_json(&format!("/api/polls/{poll}/votes"), Some(token), &ballot)
            .await;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        assert_eq!(
            status,
            StatusCode::ACCEPTED,
            "ballot {ballot} in poll {poll}: {body}"
        );
        body
    }

    /// A vote for `option` in `poll`.
    pub async fn vote(&self, poll: i64, token: &str, option: i64) -> Response {
        self.post_json(
            &format!("/api/polls/{poll}/votes"),
            Some(token),
            &json!({ "option_id": option }),
        )
        .await
    }

    /// A vote that must be accepted: asserts the 202.
    pub async fn cast_vote(&self, poll: i64, token: &str, option: i64) {
        let resp = self.vote(poll, token, option).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED, "vote in poll {poll}");
    }

    /// The poll's public results (`GET /api/polls/{poll}/results`).
    pub async fn poll_results(&self, poll: i64) -> Value {
        self.get_json(&format!("/api/polls/{poll}/results"), None)
            .await
    }

    /// The poll's public tallies by option (`GET /api/polls/{poll}/results`).
    pub async fn poll_tallies(&self, poll: i64) -> std::collections::HashMap<i64, i64> {
        self.poll_results(poll).await["tallies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["option_id"].as_i64().unwrap(),
                    t["votes"].as_i64().unwrap(),
                )
            })
            .collect()
    }

    /// The number a `SELECT count(*) ...` query (without parameters) answers.
    pub async fn count(&self, query: &'static str) -> i64 {
        sqlx::query_scalar(query).fetch_one(&self.db).await.unwrap()
    }

    /// How many votes of the poll Postgres holds (settled).
    pub async fn votes_in_db(&self, poll: i64) -> i64 {
        self.scalar("SELECT count(*) FROM votes WHERE poll_id = $1", poll)
            .await
    }

    /// Polls Postgres until `expected` votes of the poll are there; returns how many
    /// are. Panics, with the count it saw, when they are not there after 20 s.
    pub async fn wait_for_votes(&self, poll: i64, expected: i64) -> i64 {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let votes = self.votes_in_db(poll).await;
            if votes >= expected {
                return votes;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "poll {poll}: {votes} of {expected} votes settled after 20 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn username_of(&self, user: &User) -> String {
        self.scalar("SELECT username FROM users WHERE id = $1", user.id)
            .await
    }

    /// A purchase that must be accepted: asserts the 202.
    pub async fn buy(&self, sale: i64, token: &str) {
        let resp = self.purchase(sale, token).await;
        assert_eq!(
            resp.status(),
            StatusCode::ACCEPTED,
            "purchase in sale {sale}"
        );
    }

    pub async fn purchase(&self, sale: i64, token: &str) -> Response {
        self.post(&format!("/api/sales/{sale}/purchase"), Some(token))
            .await
    }

    /// A purchase with a raw (possibly invalid) id segment.
    /// A purchase sent again while it answers 503 (the sale rebuilding after a
    /// wipe), for at most 20 s.
    pub async fn purchase_through_recovery(&self, sale: i64, token: &str) -> Response {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let resp = self.purchase(sale, token).await;
            if resp.status() != StatusCode::SERVICE_UNAVAILABLE {
                return resp;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the sale never came back"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    pub async fn purchase_raw(&self, sale: &str, token: &str) -> Response {
        self.post(&format!("/api/sales/{sale}/purchase"), Some(token))
            .await
    }

    /// The Redis keys of a sale.
    pub fn sale_keys(&self, sale: i64) -> SaleKeys {
        self.keys.sale(Id::new(sale).unwrap())
    }

    /// Runs `cmd` on the test's Redis connection (which must answer): its reply.
    pub async fn redis_query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        cmd.query_async(&mut self.redis.clone()).await.unwrap()
    }

    /// The sale's buyers as an earlier version kept them: a set of user ids
    /// (`{sale:N}:buyers`) with no order named, the buyers hash gone; then folded
    /// into the hash as a server does at startup (`stampede::sale::legacy::fold_all`,
    /// over every sale of the database in this test's namespace: only this one
    /// has a set). Returns how many buyers the fold moved.
    pub async fn as_earlier_version(&self, sale: i64) -> u64 {
        let k = self.sale_keys(sale);
        let users: Vec<i64> = self.buyers(sale).await;
        assert!(!users.is_empty(), "the sale has buyers");
        let mut redis = self.redis.clone();
        let _: () = redis::pipe()
            .cmd("DEL")
            .arg(&k.buyers)
            .arg(&k.buyers_legacy)
            .ignore()
            .cmd("SADD")
            .arg(&k.buyers_legacy)
            .arg(&users)
            .ignore()
            .query_async(&mut redis)
            .await
            .unwrap();
        let (sales, moved) = stampede::sale::legacy::fold_all(&self.db, &mut redis, &self.keys)
            .await
            .unwrap();
        assert_eq!(sales, 1, "one sale had an earlier set");
        let legacy: Option<String> = self
            .redis_query(redis::cmd("GET").arg(&k.buyers_legacy))
            .await;
        assert_eq!(
            legacy.as_deref(),
            Some(stampede::sale::legacy::MARKER),
            "the earlier set is gone once folded, the marker in its place"
        );
        assert_eq!(
            self.buyers(sale).await.len(),
            users.len(),
            "every buyer still a buyer"
        );
        moved
    }

    pub async fn stock_left(&self, sale: i64) -> i64 {
        let key = self.sale_keys(sale).stock;
        redis::cmd("GET")
            .arg(key)
            .query_async::<Option<i64>>(&mut self.redis.clone())
            .await
            .unwrap()
            .unwrap_or(0)
    }

    pub async fn buyers(&self, sale: i64) -> Vec<i64> {
        let key = self.sale_keys(sale).buyers;
        redis::cmd("HKEYS")
            .arg(key)
            .query_async(&mut self.redis.clone())
            .await
            .unwrap()
    }

    pub async fn orders_in_db(&self, sale: i64) -> Vec<(uuid::Uuid, i64)> {
        self.rows(
            "SELECT id, user_id FROM orders WHERE sale_id = $1 ORDER BY user_id",
            sale,
        )
        .await
    }

    /// Reads up to `count` new entries of the sale's orders stream as `consumer` of the
    /// settlement group and acknowledges none: a worker that died mid-batch.
    /// Adds `consumer` to the settlement group of `sale`'s stream, holding nothing
    /// (a worker that started and never read).
    pub async fn create_consumer(&self, sale: i64, consumer: &str) {
        let _: i64 = redis::cmd("XGROUP")
            .arg("CREATECONSUMER")
            .arg(&self.sale_keys(sale).orders)
            .arg(stampede::settle::SETTLE_GROUP)
            .arg(consumer)
            .query_async(&mut self.redis.clone())
            .await
            .unwrap();
    }

    pub async fn read_as_dead_consumer(&self, sale: i64, consumer: &str, count: usize) {
        let _: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(stampede::settle::SETTLE_GROUP)
            .arg(consumer)
            .arg("COUNT")
            .arg(count)
            .arg("STREAMS")
            .arg(self.sale_keys(sale).orders)
            .arg(">")
            .query_async(&mut self.redis.clone())
            .await
            .unwrap();
    }

    /// Polls Postgres until `expected` orders of the sale are there; returns them.
    /// Panics, with the count it saw, when they are not there after 20 s.
    pub async fn wait_for_orders(&self, sale: i64, expected: usize) -> Vec<(uuid::Uuid, i64)> {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let orders = self.orders_in_db(sale).await;
            if orders.len() >= expected {
                return orders;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "sale {sale}: {} of {expected} orders settled after 20 s",
                orders.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Polls Redis until settlement has taken every entry of the sale's order
    /// stream: the settle group has read them all (`lag` 0) and acknowledged them
    /// (`pending` 0). What the stream held is then in Postgres, so a count read
    /// after this is final, not a snapshot. Panics, with what it saw, after 20 s.
    pub async fn wait_until_settled(&self, sale: i64) {
        let key = self.sale_keys(sale).orders;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let reply: redis::streams::StreamInfoGroupsReply =
                redis::AsyncCommands::xinfo_groups(&mut self.redis.clone(), &key)
                    .await
                    .unwrap();
            let group = reply
                .groups
                .iter()
                .find(|g| g.name == stampede::settle::SETTLE_GROUP);
            let (pending, lag) = (group.map(|g| g.pending), group.and_then(|g| g.lag));
            if pending == Some(0) && lag == Some(0) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "sale {sale}: settlement not done after 20 s (pending {pending:?}, lag {lag:?})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// `page` holds each of `wanted`, and none of `unwanted`: a failure names the
/// piece and `context`.
pub fn assert_contains(page: &str, wanted: &[&str], unwanted: &[&str], context: &str) {
    for w in wanted {
        assert!(page.contains(w), "{context}: {w:?} missing");
    }
    for u in unwanted {
        assert!(!page.contains(u), "{context}: {u:?} present");
    }
}

/// Asserts a JSON error body with the given status and code.
pub async fn assert_error(resp: Response, status: StatusCode, code: &str) -> Value {
    assert_eq!(resp.status(), status, "unexpected status");
    let body: Value = resp.json().await.expect("error body is JSON");
    assert_eq!(body["error"], code, "body: {body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "body: {body}"
    );
    body
}

/// Asserts the answer's status, showing its body when it is another.
pub async fn assert_status(resp: Response, status: StatusCode) {
    let got = resp.status();
    let body = resp.text().await.unwrap();
    assert_eq!(got, status, "{body}");
}

/// The entry of a JSON list (of sales, polls) whose `id` is `id`; it must be there.
pub fn listed(list: &Value, id: i64) -> &Value {
    let entries = list.as_array().expect("a list");
    let entry = entries.iter().find(|e| e["id"] == id);
    entry.unwrap_or_else(|| panic!("{id} is not in the list: {list}"))
}

/// Asserts an HTML answer with the given status; returns the HTML.
pub async fn assert_html(resp: Response, status: StatusCode) -> String {
    assert_eq!(resp.status(), status, "unexpected status");
    let content_type = resp.headers()[header::CONTENT_TYPE].to_str().unwrap();
    assert!(
        content_type.starts_with("text/html"),
        "not HTML: {content_type}"
    );
    resp.text().await.unwrap()
}

/// Asserts what every page (error pages too) carries against injected script: a CSP
/// with scripts from this site only and nothing inline, `nosniff`, a referrer policy,
/// and no inline script or style in the body. Returns the headers for more checks.
pub async fn assert_page_is_locked_down(resp: Response, path: &str) -> HeaderMap {
    let h = resp.headers().clone();
    let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
    assert!(!csp.contains("unsafe-inline"), "{path}: {csp}");
    assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
    assert!(h.contains_key(header::REFERRER_POLICY), "{path}");
    let body = resp.text().await.unwrap();
    // The CSP forbids inline script, so every script must come from a file.
    assert_eq!(
        body.matches("<script").count(),
        body.matches(r#"<script src="/static/"#).count(),
        "{path}: inline script"
    );
    assert!(!body.contains(" style=\""), "{path}: inline style");
    h
}

/// Whether `raw` appears HTML-escaped: `<` as `&lt;`, or as `&#60;`, which is what
/// askama 0.16 writes (numeric references for `"&'<>`).
pub fn escaped_in(body: &str, raw: &str) -> bool {
    let escape = |table: [(char, &str); 5]| {
        raw.chars().fold(String::new(), |mut out, c| {
            match table.iter().find(|(from, _)| *from == c) {
                Some((_, to)) => out.push_str(to),
                None => out.push(c),
            }
            out
        })
    };
    let named = escape([
        ('&', "&amp;"),
        ('<', "&lt;"),
        ('>', "&gt;"),
        ('"', "&quot;"),
        ('\'', "&#39;"),
    ]);
    let numeric = escape([
        ('&', "&#38;"),
        ('<', "&#60;"),
        ('>', "&#62;"),
        ('"', "&#34;"),
        ('\'', "&#39;"),
    ]);
    body.contains(&named) || body.contains(&numeric)
}

/// The text between the first `start` in `text` and the next `end` after it.
pub fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text.find(start).expect("start marker") + start.len();
    let len = text[from..].find(end).expect("end marker");
    &text[from..from + len]
}

/// `base` with the fields of `patch` set (a JSON object over a JSON object).
pub fn patched(base: &Value, patch: &Value) -> Value {
    let mut body = base.clone();
    for (k, v) in patch.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Limits on, with exactly these policies: `[[policies]]` tables of TOML, as
/// [`window_policy`] and [`bucket_policy`] write them.
pub fn limits(policies: &[String]) -> LimitsConfig {
    let mut config: LimitsConfig = toml::from_str(&policies.concat()).expect("limits TOML");
    config.enabled = true;
    config
}

/// A policy of `limit` requests per `window_ms` on `route`, per `subject` (`user` or
/// `ip`), counted by `algorithm` (`fixed_window`, `sliding_log`, `sliding_counter`).
pub fn window_policy(
    name: &str,
    route: &str,
    subject: &str,
    algorithm: &str,
    limit: u64,
    window_ms: u64,
) -> String {
    format!(
        "[[policies]]\nname = \"{name}\"\nroute = \"{route}\"\nsubject = \"{subject}\"\n\
         algorithm = \"{algorithm}\"\nlimit = {limit}\nwindow_ms = {window_ms}\n"
    )
}

/// A token-bucket policy on `route`, per `subject`: `capacity` tokens, refilled at
/// `refill_per_sec`.
pub fn bucket_policy(
    name: &str,
    route: &str,
    subject: &str,
    capacity: u64,
    refill_per_sec: f64,
) -> String {
    format!(
        "[[policies]]\nname = \"{name}\"\nroute = \"{route}\"\nsubject = \"{subject}\"\n\
         algorithm = \"token_bucket\"\ncapacity = {capacity}\nrefill_per_sec = {refill_per_sec}\n"
    )
}

/// The value of one series (name with its labels, as rendered) in `/metrics` text,
/// if it is there.
pub fn try_metric<T: FromStr>(text: &str, series: &str) -> Option<T>
where
    T::Err: std::fmt::Debug,
{
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{series} ")))
        .map(|v| v.parse().unwrap())
}

/// [`try_metric`] for a series that must be there.
pub fn metric<T: FromStr>(text: &str, series: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    try_metric(text, series).unwrap_or_else(|| panic!("{series} missing in:\n{text}"))
}

impl Drop for TestApp {
    /// Leave nothing behind: delete this test's Redis keys and database.
    fn drop(&mut self) {
        let target = Target::from_config(&self.config);
        let pattern = format!("{}:*", self.config.redis_namespace);
        let db_name = std::mem::take(&mut self.db_name);
        let maintenance_url = self.maintenance_url.clone();
        let owner = !db_name.is_empty();
        let _ = std::thread::spawn(move || {
            if !owner {
                return;
            }
            unlink_matching(&target, &pattern);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(mut conn) = PgConnection::connect(&maintenance_url).await {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        r#"DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)"#
                    )))
                    .execute(&mut conn)
                    .await;
                }
            });
        })
        .join();
    }
}

/// How many requests a sliding-log limit key holds: its state is the requests'
/// times in ms, 13 digits each (lua/lib/limit_sliding_log.lua); no key is none.
pub async fn sliding_log_entries(redis: &mut Redis, key: &str) -> usize {
    let state: Option<String> = redis::cmd("GET").arg(key).query_async(redis).await.unwrap();
    log_entries(state.unwrap_or_default())
}

/// The names of a policy's buckets of one sale, newest first: the hashes the
/// batched routes keep their users' or addresses' limit states in (`limits_cache`
/// in lua/lib/limits.lua), `...:rl:buy-user:b<span number>`,
/// `...:rl:buy-ip:b<span number>`.
pub async fn limit_buckets(app: &TestApp, sale: i64, policy: &str) -> Vec<String> {
    let prefix = app
        .keys
        .sale_rate_limit(Id::new(sale).unwrap(), policy, stampede::batch::BUCKETS);
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();
    let span = |k: &String| k[prefix.len()..].parse::<i64>().expect("a bucket's number");
    keys.sort_by_key(|k| std::cmp::Reverse(span(k)));
    keys
}

/// How many requests `user`'s sliding log holds under a per-user policy of a sale's
/// buy route: the user's field in the newest bucket that has one (a later bucket's
/// field holds every entry still in the window); none is none.
pub async fn user_log_entries(app: &TestApp, sale: i64, policy: &str, user: i64) -> usize {
    subject_log_entries(app, sale, policy, &user.to_string()).await
}

/// The same for any subject of a policy kept in buckets: a user id, or an address
/// as a per-address policy counts it (`203.0.113.9`).
pub async fn subject_log_entries(app: &TestApp, sale: i64, policy: &str, field: &str) -> usize {
    for bucket in limit_buckets(app, sale, policy).await {
        let state: Option<String> = redis::cmd("HGET")
            .arg(&bucket)
            .arg(field)
            .query_async(&mut app.redis.clone())
            .await
            .unwrap();
        if let Some(state) = state {
            return log_entries(state);
        }
    }
    0
}

fn log_entries(state: String) -> usize {
    assert!(
        state.len().is_multiple_of(13) && state.bytes().all(|b| b.is_ascii_digit()),
        "not a sliding log: {state:?}"
    );
    state.len() / 13
}
