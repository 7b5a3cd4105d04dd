//! Configuration: built-in defaults, then an optional TOML file, then environment
//! variables (highest priority). Secrets never reach a log: `Debug` redacts them.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

mod env;
use env::ENV;
pub mod limits;
mod units;

pub use limits::LimitsConfig;

/// Everything the server needs to start. Every field has a local default so that
/// `stampede serve` works against the services `scripts/run` starts.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address the HTTP server binds to. Port 0 picks a free port (tests do this).
    pub listen: SocketAddr,
    /// Address of the second listener that serves only `GET /metrics`, without a
    /// token (loopback by default, so only this machine can read it). `None`
    /// (`STAMPEDE_METRICS_LISTEN=off`): no such listener.
    pub metrics_listen: Option<SocketAddr>,
    /// When set, `GET /metrics` on the main listener answers a request that carries
    /// `Authorization: Bearer <this>`; without it the main listener has no /metrics.
    pub metrics_token: Option<String>,
    pub database_url: String,
    /// One Redis node. Ignored when `redis_cluster` is set.
    pub redis_url: String,
    /// Seed nodes of a Redis Cluster (`STAMPEDE_REDIS_CLUSTER=redis://127.0.0.1:7001,
    /// redis://127.0.0.1:7002`): when set, Stampede runs on the cluster instead of
    /// `redis_url`. Any few nodes do; the rest are discovered.
    pub redis_cluster: Vec<String>,
    /// Prefix of every Redis key, so tests and deployments can share one server.
    pub redis_namespace: String,
    /// HMAC key for session tokens. At least 32 bytes.
    pub token_secret: String,
    /// How long a session token stays valid.
    #[serde(rename = "token_ttl_secs", with = "units::secs")]
    pub token_ttl: Duration,
    /// How often each process reads the stream of ended sessions: about the longest
    /// a signed-out token still works on another instance (1 to 60000 ms).
    #[serde(rename = "session_sync_ms", with = "units::millis")]
    pub session_sync: Duration,
    /// How often a watched sale's or poll's live view is read for its event streams
    /// (once per interval per watched sale or poll, however many pages watch it;
    /// 100 to 60000 ms).
    #[serde(rename = "live_interval_ms", with = "units::millis")]
    pub live_interval: Duration,
    /// Mark cookies `Secure` (set this when serving over HTTPS).
    pub cookie_secure: bool,
    /// Largest accepted JSON body.
    pub max_body_bytes: usize,
    /// What one client can hold (see "Limits on connections" in docs/api.md): the
    /// request line and headers must arrive within this long of the connection
    /// opening or of the previous answer, else 408 and the connection is closed
    /// (a connection that sent nothing is closed silently).
    #[serde(rename = "client_request_timeout_ms", with = "units::millis")]
    pub client_request_timeout: Duration,
    /// The body must arrive within this long of the headers, else 408 `body_timeout`
    /// and the connection is closed.
    #[serde(rename = "body_timeout_ms", with = "units::millis")]
    pub body_timeout: Duration,
    /// An idle keep-alive connection is closed after this long.
    #[serde(rename = "keep_alive_secs", with = "units::secs")]
    pub keep_alive: Duration,
    /// Most connections one HTTP worker holds at once; past it the worker stops
    /// accepting until some close.
    pub max_connections: usize,
    /// Largest request line plus headers; larger: 431 `headers_too_large`, closed.
    /// actix-http itself closes any head over 128 KiB.
    pub max_header_bytes: usize,
    /// How long this process trusts its own "sold out" flag before asking Redis again.
    /// Bounds how late another instance notices a top-up.
    #[serde(rename = "sold_out_cache_ms", with = "units::millis")]
    pub sold_out_cache: Duration,
    /// How long a purchase's `Idempotency-Key` is remembered at least: a sale's
    /// keys expire this long after its last purchase with a key, and a rebuild
    /// restores the keys of orders accepted less than this long ago (1 s to 30 days).
    #[serde(rename = "purchase_key_ttl_secs", with = "units::secs")]
    pub purchase_key_ttl: Duration,
    /// Run the settlement worker inside `serve`.
    pub settle_in_serve: bool,
    pub settle: SettleConfig,
    /// Peers whose `X-Forwarded-For` header is believed.
    pub trusted_proxies: Vec<IpAddr>,
    /// Rate-limit policies (`[limits]`, `[[limits.policies]]`); see `docs/rate-limits.md`.
    pub limits: LimitsConfig,
    /// Created (or promoted) at startup when both are set.
    pub admin_username: Option<String>,
    pub admin_password: Option<String>,
    /// Password of the demo users that `stampede seed-demo` creates.
    pub demo_password: Option<String>,
    /// Postgres pool size of the requests (pages and the API). The settlement
    /// worker and the background jobs (rebuilds, expiry, sessions) have small pools
    /// of their own, so neither starves the other.
    pub database_max_connections: u32,
    /// How long a request waits for a Postgres connection of its pool before it is
    /// answered 503 `database_unavailable` with `Retry-After`.
    #[serde(rename = "database_acquire_timeout_ms", with = "units::millis")]
    pub database_acquire_timeout: Duration,
    /// Postgres's `statement_timeout` on the requests' connections (lock waits
    /// included): a read stuck behind a lock or a slow server fails with 503 after
    /// this long instead of holding the buyer (0: no limit).
    #[serde(rename = "database_statement_timeout_ms", with = "units::millis")]
    pub database_statement_timeout: Duration,
    /// How long one Redis command may take before the request fails with 503. The
    /// client's 500 ms default is too tight when thousands of requests queue on one
    /// multiplexed connection during a stampede on a small machine.
    #[serde(rename = "redis_response_timeout_ms", with = "units::millis")]
    pub redis_response_timeout: Duration,
    /// Replicas that must have an accepted purchase or vote before its 202 is sent
    /// (`WAIT` on its primary after the batch; 0: answer at once, as Redis
    /// replicates asynchronously). With 1, a failover to a replica never forgets a
    /// 202. See "Redis Cluster" in docs/operations.md.
    pub replica_acks: u32,
    /// How long a batch waits for `replica_acks`; past it, the batch is answered 503
    /// `not_replicated` (1 to `redis_response_timeout_ms` - 1).
    #[serde(rename = "replica_ack_timeout_ms", with = "units::millis")]
    pub replica_ack_timeout: Duration,
    /// HTTP worker threads; 0 means one per core.
    pub workers: usize,
    /// How often `serve` checks that Redis holds every active sale and poll, trusted
    /// by the running Redis, and rebuilds what a wipe or restart left (0: only on
    /// startup and when a request meets such state).
    #[serde(rename = "sweep_ms", with = "units::millis")]
    pub sweep: Duration,
    /// How often `serve` expires orders past their payment deadline and gives their
    /// units back (one instance at a time, under a lock; 0: never in this process).
    #[serde(rename = "expire_ms", with = "units::millis")]
    pub expire: Duration,
    /// How long a waiting room's admission (and its purchase ticket) lasts before it
    /// passes to the next in line (see `src/sale/queue.rs`).
    #[serde(rename = "queue_admission_ms", with = "units::millis")]
    pub queue_admission: Duration,
    /// Most purchases (or votes) of one sale (poll) decided by one script call; 1
    /// decides each alone. See `src/batch.rs`.
    pub batch_max: usize,
    /// Most batch calls of one sale (or poll) in flight at once, per HTTP worker:
    /// under `appendfsync always` the batches that reach Redis during one `fsync`
    /// share the next. Unset: [`Config::batch_in_flight`] picks it.
    pub batch_in_flight: Option<usize>,
}

#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SettleConfig {
    /// Most rows (orders, votes) written to Postgres in one transaction: whole
    /// stream entries up to it, at least one.
    pub batch_size: usize,
    /// How long one blocking read waits for new entries after a read that gave
    /// some; after empty ones, up to five times this (at most 5 s, and a quarter of
    /// `claim_idle_ms`).
    #[serde(rename = "block_ms", with = "units::millis")]
    pub block: Duration,
    /// Entries pending longer than this are taken over from a dead consumer.
    #[serde(rename = "claim_idle_ms", with = "units::millis")]
    pub claim_idle: Duration,
    /// Consumer name inside the group; defaults to host and process id.
    pub consumer: Option<String>,
    /// One running worker settles at a time (the others stand by, and one takes
    /// over within seconds when it stops): workers that read the same streams side
    /// by side split each storm into small transactions, which cost Postgres and
    /// Redis more per order (see `src/settle/lease.rs`). `false`: every worker
    /// reads, for a database that gains from parallel inserts.
    pub exclusive: bool,
}

impl Default for SettleConfig {
    fn default() -> Self {
        Self {
            batch_size: 2000,
            block: Duration::from_millis(1000),
            claim_idle: Duration::from_millis(30_000),
            consumer: None,
            exclusive: true,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 9464))),
            metrics_token: None,
            database_url: "postgres://stampede@127.0.0.1:5439/stampede".into(),
            redis_url: "redis://127.0.0.1:6399/".into(),
            redis_cluster: Vec::new(),
            redis_namespace: "stampede".into(),
            token_secret: String::new(),
            token_ttl: Duration::from_secs(24 * 3600),
            session_sync: Duration::from_millis(250),
            live_interval: Duration::from_millis(1000),
            cookie_secure: false,
            max_body_bytes: 16 * 1024,
            client_request_timeout: Duration::from_millis(5000),
            body_timeout: Duration::from_millis(10_000),
            keep_alive: Duration::from_secs(5),
            max_connections: 25_000,
            max_header_bytes: 16 * 1024,
            sold_out_cache: Duration::from_millis(1000),
            purchase_key_ttl: Duration::from_secs(24 * 3600),
            settle_in_serve: true,
            settle: SettleConfig::default(),
            trusted_proxies: Vec::new(),
            limits: LimitsConfig::default(),
            admin_username: None,
            admin_password: None,
            demo_password: None,
            database_max_connections: 20,
            database_acquire_timeout: Duration::from_millis(1000),
            database_statement_timeout: Duration::from_millis(1000),
            redis_response_timeout: Duration::from_millis(2000),
            replica_acks: 0,
            replica_ack_timeout: Duration::from_millis(200),
            workers: 0,
            sweep: Duration::from_millis(2000),
            expire: Duration::from_millis(1000),
            queue_admission: Duration::from_millis(30_000),
            batch_max: 64,
            batch_in_flight: None,
        }
    }
}

/// Durations show under their keys, in the keys' units (`sweep_ms: 2000`).
impl std::fmt::Debug for SettleConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SettleConfig")
            .field("batch_size", &self.batch_size)
            .field("block_ms", &self.block.as_millis())
            .field("claim_idle_ms", &self.claim_idle.as_millis())
            .field("consumer", &self.consumer)
            .field("exclusive", &self.exclusive)
            .finish()
    }
}

/// Secrets redacted; durations as in [`SettleConfig`]'s.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("metrics_listen", &self.metrics_listen)
            .field(
                "metrics_token",
                &self.metrics_token.as_ref().map(|_| "<redacted>"),
            )
            .field("database_url", &redact_url(&self.database_url))
            .field("redis_url", &redact_url(&self.redis_url))
            .field(
                "redis_cluster",
                &self
                    .redis_cluster
                    .iter()
                    .map(|u| redact_url(u))
                    .collect::<Vec<_>>(),
            )
            .field("redis_namespace", &self.redis_namespace)
            .field("token_secret", &"<redacted>")
            .field("token_ttl_secs", &self.token_ttl.as_secs())
            .field("session_sync_ms", &self.session_sync.as_millis())
            .field("live_interval_ms", &self.live_interval.as_millis())
            .field("cookie_secure", &self.cookie_secure)
            .field("max_body_bytes", &self.max_body_bytes)
            .field(
                "client_request_timeout_ms",
                &self.client_request_timeout.as_millis(),
            )
            .field("body_timeout_ms", &self.body_timeout.as_millis())
            .field("keep_alive_secs", &self.keep_alive.as_secs())
            .field("max_connections", &self.max_connections)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("sold_out_cache_ms", &self.sold_out_cache.as_millis())
            .field("purchase_key_ttl_secs", &self.purchase_key_ttl.as_secs())
            .field("settle_in_serve", &self.settle_in_serve)
            .field("settle", &self.settle)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("limits", &self.limits)
            .field("admin_username", &self.admin_username)
            .field("database_max_connections", &self.database_max_connections)
            .field(
                "database_acquire_timeout_ms",
                &self.database_acquire_timeout.as_millis(),
            )
            .field(
                "database_statement_timeout_ms",
                &self.database_statement_timeout.as_millis(),
            )
            .field(
                "redis_response_timeout_ms",
                &self.redis_response_timeout.as_millis(),
            )
            .field("replica_acks", &self.replica_acks)
            .field(
                "replica_ack_timeout_ms",
                &self.replica_ack_timeout.as_millis(),
            )
            .field("workers", &self.workers)
            .field("sweep_ms", &self.sweep.as_millis())
            .field("expire_ms", &self.expire.as_millis())
            .field("queue_admission_ms", &self.queue_admission.as_millis())
            .field("batch_max", &self.batch_max)
            .field("batch_in_flight", &self.batch_in_flight())
            .finish_non_exhaustive()
    }
}

/// `postgres://user:secret@host/db` -> `postgres://user:***@host/db`.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme_end + 3],
                    &userinfo[..colon],
                    &url[at..]
                ),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: String,
        source: Box<toml::de::Error>,
    },
    #[error("invalid value for {var}: {message}")]
    Env { var: &'static str, message: String },
    #[error("{0}")]
    Invalid(String),
}

/// [`Config::batch_in_flight`] when unset: 2 batches in flight per sale and worker,
/// 4 with `replica_acks`. Fewer batches in flight make larger ones: Redis pays a
/// call's fixed part (the script's start, its per-batch commands, an `fsync`)
/// for more buyers. With 2 instead of 4, a storm of new buyers went from about 28
/// to 38 buyers a call and from 7.8 to 7.1 us of script time a purchase (see
/// docs/capacity.md). A batch's `WAIT` for a replica holds its connection, so with
/// acknowledgements more batches out keep the tail short (p99 10 ms against 13).
pub const BATCH_IN_FLIGHT: usize = 2;
pub const BATCH_IN_FLIGHT_WITH_ACKS: usize = 4;

impl Config {
    /// Most batch calls of one sale (or poll) out at once per HTTP worker: the
    /// setting, else [`BATCH_IN_FLIGHT`] ([`BATCH_IN_FLIGHT_WITH_ACKS`] with
    /// `replica_acks`).
    pub fn batch_in_flight(&self) -> usize {
        self.batch_in_flight.unwrap_or(if self.replica_acks > 0 {
            BATCH_IN_FLIGHT_WITH_ACKS
        } else {
            BATCH_IN_FLIGHT
        })
    }

    /// Defaults, then the file (if given), then the process environment.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut config = match file {
            Some(path) => Self::from_file(path)?,
            None => Self::default(),
        };
        config.apply_env(|name| std::env::var(name).ok())?;
        Ok(config)
    }

    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.display().to_string(),
            source: Box::new(source),
        })
    }

    /// Environment overrides. `DATABASE_URL` and `REDIS_URL` are honoured under their
    /// customary names; everything else is `STAMPEDE_<FIELD>` (the table `ENV`).
    pub fn apply_env(&mut self, var: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        for (name, set) in ENV {
            if let Some(value) = var(name) {
                set(self, name, value)?;
            }
        }
        Ok(())
    }

    /// Checks that only make sense once every source has been applied.
    /// Whether anything can read `/metrics`: the metrics listener, or the main
    /// listener with a token. When nothing can, nothing is recorded.
    pub fn metrics_served(&self) -> bool {
        self.metrics_listen.is_some() || self.metrics_token.is_some()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let ms = Duration::from_millis;
        if self.token_secret.len() < 32 {
            return Err(ConfigError::Invalid(
                "token_secret (STAMPEDE_TOKEN_SECRET) must be at least 32 characters; \
                 scripts/run generates one into .data/env"
                    .into(),
            ));
        }
        // A call of 1,024 new buyers with both limit shapes holds Redis for about 8 ms
        // (about 120,000 such decisions a second on Redis alone: BENCHMARKS.md), every
        // other client waiting.
        if !(1..=1024).contains(&self.batch_max) {
            return Err(ConfigError::Invalid(
                "batch_max (STAMPEDE_BATCH_MAX) must be 1 to 1024".into(),
            ));
        }
        if self.batch_in_flight.is_some_and(|n| !(1..=64).contains(&n)) {
            return Err(ConfigError::Invalid(
                "batch_in_flight (STAMPEDE_BATCH_IN_FLIGHT) must be 1 to 64".into(),
            ));
        }
        if !(ms(1)..=ms(60_000)).contains(&self.session_sync) {
            return Err(ConfigError::Invalid(
                "session_sync_ms (STAMPEDE_SESSION_SYNC_MS) must be 1 to 60000".into(),
            ));
        }
        if !(ms(1000)..=ms(30 * 86_400_000)).contains(&self.purchase_key_ttl) {
            return Err(ConfigError::Invalid(
                "purchase_key_ttl_secs (STAMPEDE_PURCHASE_KEY_TTL_SECS) must be 1 to 2592000"
                    .into(),
            ));
        }
        if !(ms(100)..=ms(60_000)).contains(&self.live_interval) {
            return Err(ConfigError::Invalid(
                "live_interval_ms (STAMPEDE_LIVE_INTERVAL_MS) must be 100 to 60000".into(),
            ));
        }
        if self.metrics_token.as_ref().is_some_and(|t| t.len() < 16) {
            return Err(ConfigError::Invalid(
                "metrics_token (STAMPEDE_METRICS_TOKEN) must be at least 16 characters".into(),
            ));
        }
        if self.redis_namespace.is_empty()
            || !self
                .redis_namespace
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
        {
            return Err(ConfigError::Invalid(
                "redis_namespace must be non-empty and use only [A-Za-z0-9_.:-]".into(),
            ));
        }
        if let Some(bad) = self
            .redis_cluster
            .iter()
            .find(|u| !(u.starts_with("redis://") || u.starts_with("rediss://")))
        {
            return Err(ConfigError::Invalid(format!(
                "redis_cluster (STAMPEDE_REDIS_CLUSTER) takes redis:// URLs separated by \
                 commas; got {:?}",
                redact_url(bad)
            )));
        }
        if self.replica_ack_timeout.is_zero()
            || self.replica_ack_timeout >= self.redis_response_timeout
        {
            return Err(ConfigError::Invalid(format!(
                "replica_ack_timeout_ms (STAMPEDE_REPLICA_ACK_TIMEOUT_MS) must be 1 to \
                 {} (below redis_response_timeout_ms, or the WAIT itself times out)",
                self.redis_response_timeout.as_millis().saturating_sub(1)
            )));
        }
        if self.settle.batch_size == 0 {
            return Err(ConfigError::Invalid("settle.batch_size must be > 0".into()));
        }
        self.limits.policies().map_err(ConfigError::Invalid)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn every_variable_is_read_once_under_its_name() {
        let mut seen = std::collections::HashSet::new();
        for (name, _) in ENV {
            assert!(seen.insert(*name), "{name} is in the table twice");
            assert!(
                name.starts_with("STAMPEDE_") || ["DATABASE_URL", "REDIS_URL"].contains(name),
                "{name}"
            );
        }
    }

    #[test]
    fn env_overrides_defaults() {
        let env: HashMap<&str, &str> = HashMap::from([
            ("STAMPEDE_LISTEN", "127.0.0.1:0"),
            ("REDIS_URL", "redis://x/"),
            ("STAMPEDE_TRUSTED_PROXIES", "10.0.0.1, ::1"),
        ]);
        let mut c = Config::default();
        c.apply_env(|k| env.get(k).map(|v| v.to_string())).unwrap();
        assert_eq!(c.listen.port(), 0);
        assert_eq!(c.redis_url, "redis://x/");
        assert_eq!(c.trusted_proxies.len(), 2);
    }

    #[test]
    fn a_cluster_is_a_comma_separated_list_of_redis_urls() {
        let mut c = Config {
            token_secret: "x".repeat(32),
            ..Config::default()
        };
        c.apply_env(|k| {
            (k == "STAMPEDE_REDIS_CLUSTER")
                .then(|| "redis://127.0.0.1:7001, redis://127.0.0.1:7002,".to_string())
        })
        .unwrap();
        assert_eq!(
            c.redis_cluster,
            ["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"]
        );
        c.validate().unwrap();
        c.redis_cluster = vec!["127.0.0.1:7001".into()];
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("STAMPEDE_REDIS_CLUSTER"), "{err}");
        let toml: Config = toml::from_str(r#"redis_cluster = ["redis://a:7001"]"#).unwrap();
        assert_eq!(toml.redis_cluster, ["redis://a:7001"]);
    }

    #[test]
    fn batches_in_flight_default_to_two_and_to_four_with_replica_acks() {
        let mut c = Config {
            token_secret: "x".repeat(32),
            ..Config::default()
        };
        assert_eq!(c.batch_in_flight(), 2);
        c.replica_acks = 1;
        assert_eq!(c.batch_in_flight(), 4);
        // Set, it is what it says, acknowledgements or not.
        c.apply_env(|k| (k == "STAMPEDE_BATCH_IN_FLIGHT").then(|| "3".to_string()))
            .unwrap();
        assert_eq!(c.batch_in_flight(), 3);
        c.replica_acks = 0;
        assert_eq!(c.batch_in_flight(), 3);
        c.validate().unwrap();
        let toml: Config = toml::from_str("batch_in_flight = 1").unwrap();
        assert_eq!(toml.batch_in_flight(), 1);
        for bad in ["0", "65"] {
            c.apply_env(|k| (k == "STAMPEDE_BATCH_IN_FLIGHT").then(|| bad.to_string()))
                .unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("STAMPEDE_BATCH_IN_FLIGHT"), "{err}");
        }
    }

    #[test]
    fn batch_max_is_one_to_1024() {
        let mut c = Config {
            token_secret: "x".repeat(32),
            ..Config::default()
        };
        for good in ["1", "64", "1024"] {
            c.apply_env(|k| (k == "STAMPEDE_BATCH_MAX").then(|| good.to_string()))
                .unwrap();
            c.validate().unwrap();
        }
        for bad in ["0", "1025"] {
            c.apply_env(|k| (k == "STAMPEDE_BATCH_MAX").then(|| bad.to_string()))
                .unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("STAMPEDE_BATCH_MAX"), "{err}");
        }
    }

    #[test]
    fn bad_env_value_names_the_variable() {
        let mut c = Config::default();
        let err = c
            .apply_env(|k| (k == "STAMPEDE_LISTEN").then(|| "nope".to_string()))
            .unwrap_err();
        assert!(err.to_string().contains("STAMPEDE_LISTEN"));
    }

    #[test]
    fn debug_never_prints_secrets() {
        let c = Config {
            token_secret: "supersecretsupersecretsupersecret".into(),
            database_url: "postgres://u:hunter2@h/db".into(),
            ..Config::default()
        };
        let shown = format!("{c:?}");
        assert!(!shown.contains("supersecret"));
        assert!(!shown.contains("hunter2"));
    }

    #[test]
    fn limits_can_be_switched_off_from_the_environment() {
        let mut c = Config::default();
        assert!(c.limits.enabled);
        c.apply_env(|k| (k == "STAMPEDE_LIMITS").then(|| "off".to_string()))
            .unwrap();
        assert!(!c.limits.enabled);
        let err = c
            .apply_env(|k| (k == "STAMPEDE_LIMITS").then(|| "maybe".to_string()))
            .unwrap_err();
        assert!(err.to_string().contains("STAMPEDE_LIMITS"));
    }

    #[test]
    fn limits_section_parses_and_replaces_the_default_policies() {
        let c: Config = toml::from_str(
            r#"
            trusted_proxies = ["10.0.0.1"]
            [limits]
            enabled = true
            [[limits.policies]]
            name = "buy-user"
            route = "buy"
            subject = "user"
            algorithm = "token_bucket"
            capacity = 3
            refill_per_sec = 1.5
            "#,
        )
        .unwrap();
        assert_eq!(c.limits.policies.len(), 1);
        assert_eq!(c.limits.timeout_ms, 1000, "unset fields keep their default");
        let c = Config {
            token_secret: "x".repeat(32),
            ..c
        };
        c.validate().unwrap();
        let bad: Config = toml::from_str(
            "[[limits.policies]]\nname = \"p\"\nroute = \"buy\"\nsubject = \"ip\"\nalgorithm = \"fixed_window\"\n",
        )
        .unwrap();
        let bad = Config {
            token_secret: "x".repeat(32),
            ..bad
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("window_ms")
        );
        assert!(toml::from_str::<Config>("[limits]\nenabeld = false\n").is_err());
    }

    #[test]
    fn durations_keep_their_units_in_files_and_variables() {
        let c: Config = toml::from_str(
            "sweep_ms = 0\nkeep_alive_secs = 7\ntoken_ttl_secs = 60\n\
             [settle]\nblock_ms = 250\nclaim_idle_ms = 5000\n",
        )
        .unwrap();
        assert_eq!(c.sweep, Duration::ZERO);
        assert_eq!(c.keep_alive, Duration::from_secs(7));
        assert_eq!(c.token_ttl, Duration::from_secs(60));
        assert_eq!(c.settle.block, Duration::from_millis(250));
        assert_eq!(c.settle.claim_idle, Duration::from_secs(5));
        assert_eq!(c.expire, Config::default().expire, "unset: the default");
        assert!(toml::from_str::<Config>("sweep = 2000\n").is_err());
        assert!(toml::from_str::<Config>("[settle]\nblock = 1000\n").is_err());

        let env: HashMap<&str, &str> = HashMap::from([
            ("STAMPEDE_SWEEP_MS", "2500"),
            ("STAMPEDE_KEEP_ALIVE_SECS", " 9 "),
            ("STAMPEDE_TOKEN_TTL_SECS", "3600"),
            ("STAMPEDE_SETTLE_CLAIM_IDLE_MS", "1500"),
        ]);
        let mut c = Config::default();
        c.apply_env(|k| env.get(k).map(|v| v.to_string())).unwrap();
        assert_eq!(c.sweep, Duration::from_millis(2500));
        assert_eq!(c.keep_alive, Duration::from_secs(9));
        assert_eq!(c.token_ttl, Duration::from_secs(3600));
        assert_eq!(c.settle.claim_idle, Duration::from_millis(1500));
        let err = c
            .apply_env(|k| (k == "STAMPEDE_EXPIRE_MS").then(|| "1s".to_string()))
            .unwrap_err();
        assert!(err.to_string().contains("STAMPEDE_EXPIRE_MS"), "{err}");

        let shown = format!("{c:?}");
        for key in [
            "sweep_ms: 2500",
            "keep_alive_secs: 9",
            "token_ttl_secs: 3600",
            "claim_idle_ms: 1500",
            "block_ms: 1000",
        ] {
            assert!(shown.contains(key), "{key} in {shown}");
        }
    }

    #[test]
    fn duration_bounds_are_checked_in_milliseconds() {
        let ok = Config {
            token_secret: "x".repeat(32),
            ..Config::default()
        };
        ok.validate().unwrap();
        let bad = [
            Config {
                session_sync: Duration::ZERO,
                ..ok.clone()
            },
            Config {
                live_interval: Duration::from_millis(99),
                ..ok.clone()
            },
            Config {
                replica_ack_timeout: Duration::ZERO,
                ..ok.clone()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
        let err = Config {
            replica_ack_timeout: Duration::from_millis(2000),
            ..ok.clone()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(err.contains("must be 1 to 1999"), "{err}");
    }

    #[test]
    fn short_secret_is_rejected() {
        let c = Config {
            token_secret: "short".into(),
            ..Config::default()
        };
        assert!(c.validate().is_err());
    }
}
