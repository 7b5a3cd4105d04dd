//! The settlement worker: moves accepted orders (the sales' streams) and votes (the
//! polls' streams) from Redis into Postgres, in batches, idempotently,
//! acknowledging only after the commit.
//!
//! Each loop: re-read entries already delivered to this consumer but not yet
//! acknowledged (a failed commit is retried this way); if there are none, block on
//! new entries. Every `claim_idle_ms / 10` (or after each read, when an idle
//! worker waits longer) it takes over entries that another consumer read and never
//! acknowledged (it crashed) with `XAUTOCLAIM`, under a lock so that one instance
//! at a time claims. A batch is first written
//! with a plain `INSERT` ([`Insert::Fresh`]): a batch of new rows, the usual case,
//! needs no `ON CONFLICT` (Postgres's speculative insertion checks every unique
//! index before each row, about 2 µs a row here). When a row is already there
//! (Postgres answers a unique violation), the transaction is rolled back and the
//! batch written again with `ON CONFLICT DO NOTHING` ([`Insert::Tolerant`]) on the
//! order id and on (sale, user) among orders not expired, and on (poll, user) for
//! votes, so an entry that is delivered twice lands once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use redis::aio::ConnectionLike;
use redis::streams::StreamId;
use sqlx::PgPool;
use uuid::Uuid;

use crate::config::SettleConfig;
use crate::keys::Keys;
use crate::metrics::Metrics;
use crate::redis_conn::{Redis, Target, Timeouts};

pub struct Settler {
    /// Whether this consumer may hold entries delivered and not acknowledged (a
    /// batch it read, a failed commit, entries it claimed): only then does a step
    /// read its pending entries (`"0"`) before waiting for new ones, so an idle
    /// worker sends one blocking read a `block_ms`, not two.
    maybe_pending: bool,
    /// A read met a stream or group that is gone: list the streams again before
    /// the next read (a sale removed since the last listing, such as a rehearsal
    /// cleaned up, is no longer read).
    relist: bool,
    /// When each stream last gave entries (Redis Cluster: the streams polled every
    /// [`read::CLUSTER_POLL`] while waiting; the others once a `block_ms`).
    last_busy: HashMap<String, Instant>,
    /// The features whose streams this worker settles (see [`Settle`]).
    features: Vec<Arc<dyn Settle>>,
    /// Where the next periodic reclaim pass starts in the list of streams.
    reclaim_from: usize,
    /// The legacy streams found holding entries, and when they were last looked at.
    legacy_live: std::collections::HashSet<String>,
    legacy_checked_at: Option<Instant>,
    /// Streams that gave entries in the last read: the next read asks each of them
    /// for `batch_size / busy_streams` rows, so one transaction stays near
    /// `batch_size` rows however many streams have a backlog.
    busy_streams: usize,
    /// Decisions per entry in the last read (a sale's entry carries its whole
    /// decision batch): the next read asks for `batch_size / per_entry` entries.
    per_entry: usize,
    /// How long the next blocking read waits: `block_ms` after a read that gave
    /// entries, doubled after each empty one up to [`Settler::idle_block`].
    block: Duration,
    /// Whether the last read took every entry there was (no stream filled its
    /// count, and the batch kept them all): the worker then waits `linger_ms`
    /// before it reads again (see [`SettleConfig::linger`]).
    took_all: bool,
    /// Notified to stop a blocking read at once and list the streams again (a
    /// sale or poll created in this process, or shutdown).
    wake: Arc<tokio::sync::Notify>,
    /// Notified after a batch is committed (the expiry job looks at the next
    /// payment deadline again).
    settled: Option<Arc<tokio::sync::Notify>>,
    db: PgPool,
    redis: Redis,
    /// For the reclaim lock and the look at legacy streams: commands with a response
    /// timeout, never queued behind a blocking read.
    lock_redis: Redis,
    keys: Keys,
    config: SettleConfig,
    consumer: String,
    metrics: Arc<Metrics>,
}

/// Name of the consumer group the settlement worker reads every stream with.
pub const SETTLE_GROUP: &str = "settle";

/// `XGROUP CREATE ... MKSTREAM` of the settlement group, tolerating an existing one.
pub async fn ensure_group<C: ConnectionLike>(
    redis: &mut C,
    stream: &str,
) -> Result<(), redis::RedisError> {
    let created: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(SETTLE_GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(redis)
        .await;
    match created {
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        other => other,
    }
}

/// One stream the worker settles: its key, the hash its entries' ids leave once
/// settled (a sale's pending orders; none for a poll), and which feature settles
/// it. A feature builds its streams from ids and [`Keys`] ([`Stream::new`]); the
/// worker tags them with the feature.
#[derive(Clone, Debug, PartialEq)]
pub struct Stream {
    key: String,
    pending: Option<String>,
    feature: usize,
    legacy: bool,
}

impl Stream {
    pub fn new(key: String, pending: Option<String>) -> Stream {
        Stream {
            key,
            pending,
            feature: 0,
            legacy: false,
        }
    }

    /// A stream an earlier version wrote and this one only reads (a sale's
    /// one-order-per-entry stream): read only while it holds entries, which the
    /// worker checks every [`read::LEGACY_EVERY`], so that a catalog of sales costs no
    /// second read per sale once an upgrade is over.
    pub fn legacy(key: String, pending: Option<String>) -> Stream {
        Stream {
            legacy: true,
            ..Stream::new(key, pending)
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }
}

/// One accepted decision as its stream entry carries it, parsed by its feature
/// ([`Settle::parse`]): the same columns for every feature.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    /// The decision's own id, when it has one (an order's); it leaves the stream's
    /// pending hash once settled.
    pub id: Option<Uuid>,
    /// What it was decided on (the sale, the poll).
    pub owner: i64,
    pub user: i64,
    /// The feature's one number (an order's units, a vote's option).
    pub value: i64,
    /// When Redis accepted it.
    pub at: DateTime<Utc>,
    /// The idempotency key the request carried (a purchase's), if any.
    pub key: Option<String>,
    /// A vote's ballot beyond its first choice (`None`: an order).
    pub vote: Option<VoteDetail>,
}

/// What a vote's stream entry says beyond its first choice (`lua/vote_batch.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoteDetail {
    /// The voter's `seq`-th accepted request of the poll (1 when absent).
    pub seq: i32,
    /// Every choice of a multi or ranked ballot, in order.
    pub choices: Option<Vec<i64>>,
    /// A budget vote's votes (1 when absent).
    pub count: i32,
}

/// How [`Settle::write`] inserts a batch's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insert {
    /// A plain `INSERT`: a row whose id or (owner, user) is already there fails the
    /// statement with a unique violation, and the worker writes the batch again,
    /// [`Insert::Tolerant`].
    Fresh,
    /// `INSERT ... ON CONFLICT DO NOTHING`: rows already there are skipped.
    Tolerant,
}

/// What a feature's write of one batch did.
#[derive(Debug, Default)]
pub struct Written {
    pub inserted: u64,
    /// Decisions neither inserted nor already there, named for the log (an
    /// order's id; a vote's poll, user and seq): Postgres holds another row in
    /// their place, so the two stores disagree.
    pub conflicting: Vec<String>,
}

/// A feature whose accepted decisions the worker settles (`sale/settlement.rs`:
/// orders; `vote/settlement.rs`: votes). The worker holds the mechanism (consumer
/// group, blocking read, claim, acknowledgement after commit) and knows no table.
pub trait Settle: Send + Sync {
    /// The streams that may still get entries: those of the last `days`.
    fn streams<'a>(
        &'a self,
        db: &'a PgPool,
        keys: &'a Keys,
        days: i32,
    ) -> BoxFuture<'a, Result<Vec<Stream>, sqlx::Error>>;

    /// The decisions one entry of its streams carries (a sale's entry: every order
    /// its batch accepted; a poll's: one vote); `None` for an entry that is not its
    /// own (acknowledged without settling, and logged).
    fn parse(&self, entry: &StreamId) -> Option<Vec<Accepted>>;

    /// What [`Settle::drop_pending`] is given for one of its entries once settled:
    /// the entry's record as the feature's pending hash knows it. None by default
    /// (a feature without a pending hash).
    fn pending_record(&self, entry: &StreamId) -> Option<String> {
        let _ = entry;
        None
    }

    /// Writes a batch inside the worker's transaction: `Fresh`, failing on a row
    /// already there; `Tolerant`, idempotently (`ON CONFLICT DO NOTHING`: an entry
    /// delivered twice lands once).
    fn write<'a>(
        &'a self,
        tx: &'a mut sqlx::PgConnection,
        rows: &'a [Accepted],
        insert: Insert,
    ) -> BoxFuture<'a, Result<Written, sqlx::Error>>;

    /// Drops settled decisions from a stream's pending hash, after their rows are
    /// committed: `records`, the [`Settle::pending_record`] of each settled entry;
    /// the feature owns that hash's layout. Decisions the hash no longer holds (a
    /// redelivery) change nothing. True when it also acknowledged and deleted
    /// `entries` in the same call (one write to Redis, so one fsync under
    /// `appendfsync always`, where there were two); false (the default: nothing
    /// done) leaves them to the caller's `XACK` and `XDEL`.
    fn drop_pending<'a>(
        &'a self,
        redis: &'a mut Redis,
        pending: &'a str,
        records: &'a [String],
        entries: Entries<'a>,
    ) -> BoxFuture<'a, redis::RedisResult<bool>> {
        let _ = (redis, pending, records, entries);
        Box::pin(async { Ok(false) })
    }
}

/// Settled entries of one stream, to acknowledge and delete: the stream, the
/// consumer group and the entry ids.
#[derive(Debug, Clone, Copy)]
pub struct Entries<'a> {
    pub stream: &'a str,
    pub group: &'a str,
    pub ids: &'a [&'a str],
}

/// One event as read from a stream.
#[derive(Debug, Clone, PartialEq)]
struct Event {
    stream: String,
    /// The stream's pending hash: the decision's id leaves it once settled.
    pending: Option<String>,
    entry_id: String,
    feature: usize,
    accepted: Vec<Accepted>,
    /// What the feature's pending hash knows the entry by ([`Settle::pending_record`]).
    record: Option<String>,
}

/// What one settle step did, for logs and tests.
#[derive(Debug, Default, Clone, Copy)]
pub struct Settled {
    pub read: usize,
    pub inserted: u64,
}

pub mod kept;
mod lease;
mod read;
pub mod reclaim;
mod worker;
mod write;
pub use lease::{SETTLE_LEASE, STANDBY_EVERY};

impl Settler {
    /// Opens the worker's own Redis connection: a blocking `XREADGROUP` must not run
    /// on the shared connection, whose response timeout (`redis_response_timeout_ms`,
    /// 2000 ms by default) would cut it off.
    pub async fn connect(
        db: PgPool,
        target: &Target,
        keys: Keys,
        config: SettleConfig,
        features: Vec<Arc<dyn Settle>>,
    ) -> anyhow::Result<Self> {
        let connect = Duration::from_secs(2);
        let unreachable =
            |e| anyhow::anyhow!("cannot connect to Redis at {}: {e}", target.describe());
        let redis = Redis::connect(
            target,
            Timeouts {
                connect,
                response: None,
                resend: true,
            },
        )
        .await
        .map_err(unreachable)?;
        let lock_redis = Redis::connect(
            target,
            Timeouts {
                connect,
                response: Some(Duration::from_secs(2)),
                resend: true,
            },
        )
        .await
        .map_err(unreachable)?;
        let consumer = config
            .consumer
            .clone()
            .unwrap_or_else(default_consumer_name);
        Ok(Settler {
            maybe_pending: true,
            relist: false,
            last_busy: HashMap::new(),
            features,
            reclaim_from: 0,
            legacy_live: std::collections::HashSet::new(),
            legacy_checked_at: None,
            busy_streams: 1,
            per_entry: 1,
            block: config.block,
            took_all: false,
            wake: Arc::new(tokio::sync::Notify::new()),
            settled: None,
            db,
            redis,
            lock_redis,
            keys,
            config,
            consumer,
            // `stampede settle` serves no /metrics: record nothing (a histogram
            // nobody renders keeps every sample).
            metrics: Arc::new(Metrics::off()),
        })
    }

    /// Count settled rows and errors in the server's metrics.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// `wake` stops a blocking read and makes the worker list its streams again
    /// (`serve` notifies it when a sale or poll is created); `settled` is notified
    /// after each committed batch.
    pub fn with_wakes(
        mut self,
        wake: Arc<tokio::sync::Notify>,
        settled: Arc<tokio::sync::Notify>,
    ) -> Self {
        self.wake = wake;
        self.settled = Some(settled);
        self
    }

    /// The longest a blocking read waits while the streams stay empty: five
    /// `block_ms`, at most 5 s and a quarter of `claim_idle_ms` (never less than
    /// `block_ms`). An idle worker sends
    /// one read (over every stream) that long, not one a `block_ms`; a sale
    /// created in another process is listed within that time, one created here
    /// at once.
    pub(super) fn idle_block(&self) -> Duration {
        (self.config.block * 5)
            .min(Duration::from_secs(5))
            // A consumer idle past `claim_idle_ms` with nothing pending counts as
            // dead and is removed (see `reclaim.rs`): a live one waiting in a
            // read must never look so.
            .min(self.config.claim_idle / 4)
            .max(self.config.block)
    }

    pub fn consumer(&self) -> &str {
        &self.consumer
    }
}

fn default_consumer_name() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".into());
    format!(
        "{host}-{}-{}",
        std::process::id(),
        &crate::random::token_hex(3)
    )
}
