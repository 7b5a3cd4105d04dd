//! Configuration: built-in defaults, then an optional TOML file, then environment
//! variables (highest priority). Secrets never reach a log: `Debug` redacts them.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

mod debug;
mod env;
pub mod limits;
mod net;
mod settle;
mod units;
mod validate;

pub use limits::LimitsConfig;
pub use net::IpNet;
pub use settle::SettleConfig;

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
    /// Most live event streams one client address (IPv6: one /64) holds open in
    /// this process; past it 429 `too_many_streams` (the page asks every 2 s
    /// instead). 0: no cap.
    pub max_streams_per_client: u32,
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
    /// On SIGTERM, how long `serve` keeps answering every route while `/readyz`
    /// answers 503, before it stops accepting (0 to 60000 ms): the load balancer
    /// or Kubernetes takes it out of rotation meanwhile, so no client meets a
    /// closed port.
    #[serde(rename = "drain_ms", with = "units::millis")]
    pub drain: Duration,
    pub settle: SettleConfig,
    /// Peers whose `X-Forwarded-For` header is believed: addresses or CIDR
    /// ranges (`10.0.0.7`, `10.0.0.0/8`, `fd00::/8`).
    pub trusted_proxies: Vec<IpNet>,
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
    /// Longest claim window a draw's win gets on this server: a sale's
    /// `claim_window_s`, at most this (default a day, the API's maximum, so the
    /// sale's own). Tests shorten it to see wins pass within a second.
    #[serde(rename = "draw_claim_max_ms", with = "units::millis")]
    pub draw_claim_max: Duration,
    /// Most purchases (or votes) of one sale (poll) decided by one script call; 1
    /// decides each alone. See `src/batch.rs`.
    pub batch_max: usize,
    /// Most batch calls of one sale (or poll) in flight at once, per HTTP worker:
    /// under `appendfsync always` the batches that reach Redis during one `fsync`
    /// share the next. Unset: [`Config::batch_in_flight`] picks it.
    pub batch_in_flight: Option<usize>,
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
            max_streams_per_client: 64,
            max_header_bytes: 16 * 1024,
            sold_out_cache: Duration::from_millis(1000),
            purchase_key_ttl: Duration::from_secs(24 * 3600),
            settle_in_serve: true,
            drain: Duration::from_millis(5000),
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
            draw_claim_max: Duration::from_secs(86_400),
            batch_max: 64,
            batch_in_flight: None,
        }
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

    /// Whether anything can read `/metrics`: the metrics listener, or the main
    /// listener with a token. When nothing can, nothing is recorded.
    pub fn metrics_served(&self) -> bool {
        self.metrics_listen.is_some() || self.metrics_token.is_some()
    }
}

#[cfg(test)]
mod tests;
