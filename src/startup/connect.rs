//! What `serve` (and the CLI) connects to: the Postgres pools kept apart (the
//! requests', settlement's, the background jobs'), Redis, the migrations, and the
//! warning when Redis may lose acknowledged decisions.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::config::Config;
use crate::keys::Keys;
use crate::redis_conn::{Redis, Target, Timeouts};

/// A pool for work that may take long (the CLI commands, rebuilds, the
/// background jobs): no statement timeout.
pub async fn connect_db(config: &Config) -> anyhow::Result<PgPool> {
    connect_pool(config, Pool::Background).await
}

/// The pools `serve` keeps apart, so that slow readers cannot starve settlement
/// or the rebuilds, nor the other way round.
#[derive(Clone, Copy, Debug)]
pub(super) enum Pool {
    /// Pages and the API: a short wait for a connection, a statement timeout.
    Requests,
    /// The settlement worker's own connections.
    Settlement,
    /// Rebuilds, the sweep, ended sessions, the CLI.
    Background,
    /// The roster's (`crate::roster`): a rebuild waits for its flushes, so they
    /// must not queue behind the rebuilds.
    Roster,
}

pub(super) async fn connect_pool(config: &Config, pool: Pool) -> anyhow::Result<PgPool> {
    use sqlx::postgres::PgConnectOptions;
    let mut options: PgConnectOptions = config.database_url.parse().map_err(|e| {
        anyhow::anyhow!(
            "bad database URL {}: {e}",
            crate::config::redact_url(&config.database_url)
        )
    })?;
    let (size, acquire) = match pool {
        Pool::Requests => {
            if !config.database_statement_timeout.is_zero() {
                options = options.options([(
                    "statement_timeout",
                    format!("{}ms", config.database_statement_timeout.as_millis()),
                )]);
            }
            (
                config.database_max_connections,
                config.database_acquire_timeout,
            )
        }
        Pool::Settlement => (SETTLEMENT_CONNECTIONS, Duration::from_secs(5)),
        Pool::Background => (BACKGROUND_CONNECTIONS, Duration::from_secs(5)),
        Pool::Roster => (2, Duration::from_secs(5)),
    };
    if !matches!(pool, Pool::Requests) {
        // A settled batch is acknowledged in Redis, and an expiry's return given
        // back, only after its commit: that commit must survive a Postgres crash,
        // whatever the server's default says.
        options = options.options([("synchronous_commit", "on")]);
    }
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(acquire)
        // sqlx pings a connection as it goes back to the pool (bounded here, see
        // `answers_within`) and, for requests and settlement, again as it is taken
        // (bounded by `acquire`): a connection whose link died while it sat in the
        // pool, without a reset (a failover, a dropped route), is found and closed
        // there, where the work that took it would wait for its first answer for
        // ever (or, bounded, for its whole limit: 30 s of settlement per dead
        // connection). The background work and the roster, which run every few
        // seconds on an idle server, do without that ping (it was a third of an
        // idle server's wake-ups): each is bounded (`error::within`), a dead
        // connection costs one turn its limit, and its release ping closes it.
        .test_before_acquire(matches!(pool, Pool::Requests | Pool::Settlement))
        .after_release(|conn, _| Box::pin(answers_within(conn, RELEASE_PING_TIMEOUT)))
        .connect_with(options)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot connect to Postgres at {} ({pool:?} pool): {e}",
                crate::config::redact_url(&config.database_url)
            )
        })
}

/// How long a connection going back to its pool may take to answer a ping.
const RELEASE_PING_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether a connection going back to its pool still answers, within `limit`: else
/// it is closed, not kept. sqlx pings it on release too, but without a bound: a
/// connection whose work was given up (a settlement transaction past its timeout,
/// a request whose client left) on a link that died without a reset would hang
/// that ping for ever, and with it a place in the pool: a few such and the pool is
/// gone. The ping also waits out what the given-up work left to read.
async fn answers_within(
    conn: &mut sqlx::PgConnection,
    limit: Duration,
) -> Result<bool, sqlx::Error> {
    use sqlx::Connection;
    match tokio::time::timeout(limit, conn.ping()).await {
        Ok(answered) => answered.map(|()| true),
        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "a Postgres connection going back to its pool did not answer a ping",
        ))),
    }
}

/// Connections of the settlement worker's pool: one transaction at a time, and
/// one for listing the streams.
const SETTLEMENT_CONNECTIONS: u32 = 3;
/// Connections of the background pool: rebuilds (one per sale at a time, a
/// request's and the sweep's may overlap), expiry, ended sessions.
const BACKGROUND_CONNECTIONS: u32 = 4;

pub async fn connect_redis(config: &Config) -> anyhow::Result<Redis> {
    connect_redis_with(config, true).await
}

/// The connection of an HTTP worker, which sends the decision scripts: on a
/// cluster, a command that failed is never sent again (see [`Timeouts::resend`]).
pub async fn connect_worker_redis(config: &Config) -> anyhow::Result<Redis> {
    connect_redis_with(config, false).await
}

async fn connect_redis_with(config: &Config, resend: bool) -> anyhow::Result<Redis> {
    let target = Target::from_config(config);
    let timeouts = Timeouts {
        connect: Duration::from_secs(2),
        response: Some(config.redis_response_timeout),
        resend,
    };
    Redis::connect(&target, timeouts)
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to Redis at {}: {e}", target.describe()))
}

/// Applies the migrations this binary carries that the database lacks. One the
/// database has and this binary does not (a newer release's expand step, see
/// docs/operations.md, "Upgrades") is left alone: an older server that restarts, or
/// a rollback, must start against the expanded schema, which its code ignores.
pub async fn migrate(db: &PgPool) -> anyhow::Result<()> {
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.set_ignore_missing(true);
    migrator.run(db).await?;
    Ok(())
}

/// The connections `serve` opens at startup.
pub(super) struct Stores {
    /// The requests' pool (see [`Pool::Requests`]).
    pub(super) db: PgPool,
    /// The background jobs' pool (see [`Pool::Background`]).
    pub(super) background: PgPool,
    pub(super) redis: Redis,
    pub(super) keys: Keys,
}

/// Checks the configuration, connects to Postgres (and migrates it) and to Redis,
/// warns when Redis may lose acknowledged decisions, and creates the configured
/// admin.
pub(super) async fn connect_stores(config: &Config) -> anyhow::Result<Stores> {
    config.validate()?;
    let background = connect_db(config).await?;
    migrate(&background).await?;
    let db = connect_pool(config, Pool::Requests).await?;
    let mut redis = connect_redis(config).await?;
    warn_on_risky_settings(&mut redis).await;
    let keys = Keys::new(&config.redis_namespace);
    crate::seed::bootstrap_admin(&background, config).await?;
    Ok(Stores {
        db,
        background,
        redis,
        keys,
    })
}

/// A 202 is only as durable as Redis's persistence: say so at startup when the
/// Redis we talk to can lose acknowledged decisions in a crash, may evict keys, or
/// frees expired keys (a storm's rate-limit buckets) on its main thread.
async fn warn_on_risky_settings(redis: &mut Redis) {
    // On a cluster every primary answers; the weakest setting is the one reported.
    let config = |name: &'static str| {
        let mut redis = redis.clone();
        async move {
            let answers = redis
                .on_every_primary(redis::cmd("CONFIG").arg("GET").arg(name))
                .await
                .ok()?;
            let values: Vec<String> = answers
                .into_iter()
                .map(|(_, v)| {
                    redis::from_redis_value::<Vec<String>>(v)
                        .ok()
                        .and_then(|p| p.get(1).cloned())
                })
                .collect::<Option<_>>()?;
            let first = values.first()?.clone();
            Some(values.into_iter().find(|v| *v != first).unwrap_or(first))
        }
    };
    let appendonly = config("appendonly").await;
    let fsync = config("appendfsync").await;
    let eviction = config("maxmemory-policy").await;
    let lazy_expire = config("lazyfree-lazy-expire").await;
    match (appendonly.as_deref(), fsync.as_deref()) {
        (Some("yes"), Some("always")) => {
            tracing::info!("Redis persistence: AOF with appendfsync always (a 202 is on disk)")
        }
        (Some(aof), Some(fsync)) => tracing::warn!(
            appendonly = aof,
            appendfsync = fsync,
            "Redis may lose acknowledged purchases and votes in a crash: run it with \
             appendonly yes and appendfsync always. Sales it forgets are rebuilt from \
             Postgres, but 202s not yet settled there are lost"
        ),
        _ => tracing::warn!(
            "cannot read Redis persistence settings (CONFIG GET refused): a 202 is only \
             durable with appendonly yes and appendfsync always"
        ),
    }
    if let Some(policy) = eviction.filter(|p| p != "noeviction") {
        tracing::warn!(
            maxmemory_policy = %policy,
            "Redis may evict keys: a sale's buyers hash could vanish; use noeviction"
        );
    }
    if lazy_expire.as_deref() == Some("no") {
        tracing::warn!(
            lazyfree_lazy_expire = "no",
            "Redis frees expired keys on its main thread: a rate-limit bucket (a hash of \
             one field per buyer) that expires after a storm stops every purchase and vote \
             while it is freed (94 ms for 250,000 buyers); set lazyfree-lazy-expire yes \
             (docs/operations.md, \"Redis and Postgres settings\")"
        );
    }
}
