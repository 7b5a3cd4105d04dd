//! `spawn_app`: a real server on a free port, with its own Postgres database and
//! Redis namespace, both removed again when the `TestApp` is dropped.

#![allow(dead_code)]

use std::time::Duration;

use actix_web::web;
use reqwest::{Client, Response, StatusCode};
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};
use stampede::auth::token::{Claims, TokenKey};
use stampede::config::Config;
use stampede::domain::Id;
use stampede::keys::Keys;
use stampede::redis_conn::{Redis, Target, Timeouts};
use stampede::startup::Application;
use stampede::state::AppState;

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

/// Where the tests' Redis is: the cluster when one is configured, else the node.
pub fn test_redis_target() -> Target {
    let cluster = test_redis_cluster();
    if cluster.is_empty() {
        Target::Node(env_url("STAMPEDE_TEST_REDIS_URL", "REDIS_URL"))
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
        return env_url("STAMPEDE_TEST_REDIS_URL", "REDIS_URL");
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

/// `SCRIPT FLUSH` on the node that holds `key` only (on a single node: that node):
/// the scripts are gone there and nowhere else.
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
}

fn env_url(primary: &str, fallback: &str) -> String {
    std::env::var(primary)
        .or_else(|_| std::env::var(fallback))
        .unwrap_or_else(|_| panic!("set {primary} (scripts/test does): tests need a real server"))
}

/// A fresh, valid config for one test: own database, own namespace, port 0.
pub async fn test_config() -> (Config, String, String) {
    let maintenance_url = env_url("STAMPEDE_TEST_DATABASE_URL", "DATABASE_URL");
    let redis_url = env_url("STAMPEDE_TEST_REDIS_URL", "REDIS_URL");
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
        // Every test client comes from 127.0.0.1: the default per-IP limits would
        // trip tests of other things. tests/api/limit.rs turns them on.
        limits: stampede::config::LimitsConfig::off(),
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
        let prefix = uuid::Uuid::new_v4().simple().to_string();
        let ids: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO users (username, password_hash, is_admin)
             SELECT $1 || '-' || g, 'not-a-real-hash', $3 FROM generate_series(1, $2) g
             RETURNING id",
        )
        .bind(&prefix[..12])
        .bind(n as i32)
        .bind(admin)
        .fetch_all(&self.db)
        .await
        .expect("insert users");
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
        })
    }

    pub async fn post_json(&self, path: &str, token: Option<&str>, body: &Value) -> Response {
        let mut req = self.client.post(self.url(path)).json(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send().await.expect("request")
    }

    pub async fn post(&self, path: &str, token: Option<&str>) -> Response {
        let mut req = self.client.post(self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send().await.expect("request")
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> Response {
        let mut req = self.client.get(self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send().await.expect("request")
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
        let resp = self
            .post_json(
                "/api/admin/sales",
                Some(&admin.token),
                &json!({
                    "name": "Test phone",
                    "description": "for tests",
                    "price_cents": 19_900,
                    "stock": stock,
                    "starts_at": now + chrono::Duration::seconds(starts_in),
                    "ends_at": now + chrono::Duration::seconds(ends_in),
                    "requires_ticket": requires_ticket,
                }),
            )
            .await;
        assert_eq!(
            resp.status(),
            StatusCode::CREATED,
            "{}",
            resp.text().await.unwrap()
        );
        resp.json::<Value>().await.unwrap()["id"].as_i64().unwrap()
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
        let now = chrono::Utc::now();
        let resp = self
            .post_json(
                "/api/admin/polls",
                Some(&admin.token),
                &json!({
                    "question": question,
                    "options": options,
                    "opens_at": now + chrono::Duration::seconds(opens_in),
                    "closes_at": now + chrono::Duration::seconds(closes_in),
                }),
            )
            .await;
        assert_eq!(
            resp.status(),
            StatusCode::CREATED,
            "{}",
            resp.text().await.unwrap()
        );
        let body: Value = resp.json().await.unwrap();
        let ids = body["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["id"].as_i64().unwrap())
            .collect();
        (body["id"].as_i64().unwrap(), ids)
    }

    pub async fn purchase(&self, sale: i64, token: &str) -> Response {
        self.post(&format!("/api/sales/{sale}/purchase"), Some(token))
            .await
    }

    /// A purchase with a raw (possibly invalid) id segment.
    pub async fn purchase_raw(&self, sale: &str, token: &str) -> Response {
        self.post(&format!("/api/sales/{sale}/purchase"), Some(token))
            .await
    }

    pub async fn stock_left(&self, sale: i64) -> i64 {
        let key = self.keys.sale(Id::new(sale).unwrap()).stock;
        redis::cmd("GET")
            .arg(key)
            .query_async::<Option<i64>>(&mut self.redis.clone())
            .await
            .unwrap()
            .unwrap_or(0)
    }

    pub async fn buyers(&self, sale: i64) -> Vec<i64> {
        let key = self.keys.sale(Id::new(sale).unwrap()).buyers;
        redis::cmd("SMEMBERS")
            .arg(key)
            .query_async(&mut self.redis.clone())
            .await
            .unwrap()
    }

    pub async fn orders_in_db(&self, sale: i64) -> Vec<(uuid::Uuid, i64)> {
        sqlx::query_as("SELECT id, user_id FROM orders WHERE sale_id = $1 ORDER BY user_id")
            .bind(sale)
            .fetch_all(&self.db)
            .await
            .unwrap()
    }

    /// Polls Postgres until `expected` orders of the sale are there (or panics).
    pub async fn wait_for_orders(&self, sale: i64, expected: usize) -> Vec<(uuid::Uuid, i64)> {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let orders = self.orders_in_db(sale).await;
            if orders.len() >= expected || std::time::Instant::now() > deadline {
                return orders;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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
    let state = state.unwrap_or_default();
    assert!(
        state.len().is_multiple_of(13) && state.bytes().all(|b| b.is_ascii_digit()),
        "not a sliding log: {state:?}"
    );
    state.len() / 13
}
