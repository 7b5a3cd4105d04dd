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
use redis::AsyncCommands;
use redis::aio::ConnectionLike;
use redis::streams::{StreamId, StreamReadOptions, StreamReadReply};
use sqlx::PgPool;
use tokio::sync::watch;
use uuid::Uuid;

use crate::config::SettleConfig;
use crate::keys::Keys;
use crate::metrics::Metrics;
use crate::redis_conn::{Redis, Target, Timeouts};

/// How often the list of sale and poll streams is re-read from Postgres.
const REFRESH_EVERY: Duration = Duration::from_secs(2);
/// Streams of sales that ended longer ago than this are no longer read.
const STREAM_RETENTION_DAYS: i32 = 7;
/// How often the worker looks for entries in the streams earlier versions wrote
/// ([`Stream::legacy`]): an order an older server accepted during a rolling
/// upgrade is settled at most this much later.
const LEGACY_EVERY: Duration = Duration::from_secs(30);

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
    /// [`CLUSTER_POLL`] while waiting; the others once a `block_ms`).
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

static DROP_EMPTY_STREAM: std::sync::LazyLock<crate::lua::Script> =
    crate::lua::lua_script!("drop_empty_stream.lua");

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
    /// worker checks every [`LEGACY_EVERY`], so that a catalog of sales costs no
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
    /// Ids neither inserted nor already there: Postgres holds another row for the
    /// same (owner, user), so the two stores disagree.
    pub conflicting: Vec<Uuid>,
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
    /// redelivery) change nothing. Nothing to do by default.
    fn drop_pending<'a>(
        &'a self,
        redis: &'a mut Redis,
        pending: &'a str,
        records: &'a [String],
    ) -> BoxFuture<'a, redis::RedisResult<()>> {
        let _ = (redis, pending, records);
        Box::pin(async { Ok(()) })
    }
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

mod lease;
mod reclaim;
pub use lease::{SETTLE_LEASE, STANDBY_EVERY};
pub use reclaim::RECLAIM_LOCK;

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
        let redis = Redis::connect(
            target,
            Timeouts {
                connect,
                response: None,
                resend: true,
            },
        )
        .await?;
        let lock_redis = Redis::connect(
            target,
            Timeouts {
                connect,
                response: Some(Duration::from_secs(2)),
                resend: true,
            },
        )
        .await?;
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

    /// Runs until `shutdown` turns true. With `exclusive` (the default) it reads only
    /// while it holds the settling lease, and stands by otherwise (see `lease.rs`);
    /// it releases the lease when it stops. A batch in progress is committed and
    /// acknowledged before it returns; shutdown stops a long blocking read at once
    /// on one node (`CLIENT UNBLOCK`); else it waits for the read's end.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        tracing::info!(consumer = %self.consumer, "settlement worker started");
        // Shutdown stops a blocking read at once.
        let stop = {
            let (mut shutdown, wake) = (shutdown.clone(), self.wake.clone());
            tokio::spawn(async move {
                while !*shutdown.borrow() {
                    if shutdown.changed().await.is_err() {
                        break;
                    }
                }
                wake.notify_one();
            })
        };
        let mut streams: Vec<Stream> = Vec::new();
        let mut refreshed_at: Option<Instant> = None;
        let mut claimed_at = Instant::now();
        // A dead consumer's entry is taken over at most `claim_every` after it has been
        // idle for `claim_idle_ms`: about 1.1 times the configured idle time.
        let claim_every = (self.config.claim_idle / 10).max(Duration::from_millis(100));
        let mut backoff = Duration::from_millis(100);
        // Take over what a dead consumer left at once, not after the first interval.
        let mut claim_now = true;
        let mut lease = lease::Lease::new(self.metrics.clone());
        let lease_key = self.keys.lock(SETTLE_LEASE);
        while !*shutdown.borrow() {
            if self.config.exclusive {
                match lease
                    .hold(&self.lock_redis, &lease_key, &self.consumer)
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => {
                        // Leading later, first take over what the last leader left.
                        claim_now = true;
                        self.standing_by(&streams).await;
                        wait(&mut shutdown, STANDBY_EVERY).await;
                        continue;
                    }
                    Err(e) => {
                        claim_now = true;
                        tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "cannot ask for the settlement lease");
                        wait(&mut shutdown, backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
            }
            if self.relist || refreshed_at.is_none_or(|t| t.elapsed() >= REFRESH_EVERY) {
                self.relist = false;
                match self.streams().await {
                    Ok(s) => {
                        streams = s;
                        refreshed_at = Some(Instant::now());
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot list sale streams");
                        if lease.failed(&self.consumer).await {
                            wait(&mut shutdown, STANDBY_EVERY * 2).await;
                            continue;
                        }
                    }
                }
            }
            if streams.is_empty() {
                let wake = self.wake.clone();
                tokio::select! {
                    _ = wait(&mut shutdown, self.idle_block()) => {}
                    _ = wake.notified() => self.relist = true,
                }
                continue;
            }
            if claim_now || claimed_at.elapsed() >= claim_every {
                let turn = if claim_now {
                    &streams[..]
                } else {
                    self.next_to_reclaim(&streams, claim_every)
                };
                let turn = turn.to_vec();
                claim_now = false;
                claimed_at = Instant::now();
                if let Err(e) = self.reclaim(&turn).await {
                    tracing::warn!(error = %e, "reclaiming pending entries failed");
                }
            }
            match self.step(&streams).await {
                Ok(done) => {
                    backoff = Duration::from_millis(100);
                    lease.succeeded();
                    if done.read > 0 {
                        tracing::debug!(
                            read = done.read,
                            inserted = done.inserted,
                            "settled batch"
                        );
                    }
                }
                Err(e) => {
                    Metrics::inc(&self.metrics.settle_errors);
                    // Entries stay pending for this consumer and are retried next loop.
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "settlement step failed");
                    if lease.failed(&self.consumer).await {
                        // Another worker may fare better: it leads at its next
                        // attempt, while this one waits longer than a standby does.
                        wait(&mut shutdown, STANDBY_EVERY * 2).await;
                        continue;
                    }
                    wait(&mut shutdown, backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
        stop.abort();
        lease.release().await;
        tracing::info!(consumer = %self.consumer, "settlement worker stopped");
    }

    /// One batch: this consumer's unacknowledged entries first (when it may have
    /// any), else new ones.
    pub async fn step(&mut self, streams: &[Stream]) -> anyhow::Result<Settled> {
        let mut entries = self.read_own_pending(streams).await?;
        if entries.is_empty() {
            entries = self.read(streams, ">", Some(self.block)).await?;
            self.block = if entries.is_empty() {
                (self.block * 2).min(self.idle_block())
            } else {
                self.config.block
            };
        }
        // Until they are acknowledged (or if the read left some of a stream's
        // entries for the next batch), some may be pending.
        self.maybe_pending |= !entries.is_empty();
        self.settle(entries).await
    }

    /// Entries delivered to this consumer and not acknowledged, read only when it
    /// may hold some (none read: it holds none, until its next read of new ones).
    async fn read_own_pending(&mut self, streams: &[Stream]) -> anyhow::Result<Vec<Event>> {
        if !self.maybe_pending {
            return Ok(Vec::new());
        }
        let entries = self.read(streams, "0", None).await?;
        self.maybe_pending = !entries.is_empty();
        Ok(entries)
    }

    /// A standby's one duty: entries it read while it led and could not
    /// acknowledge (a failed commit, the lease lost meanwhile) are settled here, at
    /// once, not left for the next leader's reclaim after `claim_idle_ms`. It reads
    /// nothing new.
    async fn standing_by(&mut self, streams: &[Stream]) {
        if !self.maybe_pending || streams.is_empty() {
            return;
        }
        let settled = match self.read_own_pending(streams).await {
            Ok(entries) => self.settle(entries).await,
            Err(e) => Err(e),
        };
        if let Err(e) = settled {
            Metrics::inc(&self.metrics.settle_errors);
            tracing::warn!(error = %e, "settling this worker's own pending entries failed");
        }
    }

    /// Reads until every stream is drained; returns the rows inserted. For tests
    /// and `stampede settle --drain`.
    pub async fn drain(&mut self) -> anyhow::Result<u64> {
        self.drain_reporting(|_| {}).await
    }

    /// [`Settler::drain`], calling `progress` with the rows inserted so far after
    /// each committed batch.
    pub async fn drain_reporting(&mut self, mut progress: impl FnMut(u64)) -> anyhow::Result<u64> {
        self.legacy_checked_at = None;
        let streams = self.streams().await?;
        let mut inserted = 0;
        if streams.is_empty() {
            return Ok(0);
        }
        self.reclaim(&streams).await?;
        loop {
            let mut entries = self.read(&streams, "0", None).await?;
            if entries.is_empty() {
                entries = self.read(&streams, ">", None).await?;
            }
            if entries.is_empty() {
                return Ok(inserted);
            }
            inserted += self.settle(entries).await?.inserted;
            progress(inserted);
        }
    }

    /// The streams of every feature that may still get entries: a legacy stream
    /// only while it holds some (looked at every [`LEGACY_EVERY`]).
    /// The keys of the streams Postgres lists now (see [`Settler::streams`]).
    async fn listed_keys(&mut self) -> anyhow::Result<std::collections::HashSet<String>> {
        Ok(self.streams().await?.into_iter().map(|s| s.key).collect())
    }

    async fn streams(&mut self) -> anyhow::Result<Vec<Stream>> {
        let mut all = Vec::new();
        for (feature, settle) in self.features.iter().enumerate() {
            let streams = settle
                .streams(&self.db, &self.keys, STREAM_RETENTION_DAYS)
                .await?;
            all.extend(streams.into_iter().map(|s| Stream { feature, ..s }));
        }
        if self
            .legacy_checked_at
            .is_none_or(|t| t.elapsed() >= LEGACY_EVERY)
        {
            let legacy: Vec<&str> = all.iter().filter(|s| s.legacy).map(Stream::key).collect();
            let lengths = futures_util::future::try_join_all(legacy.iter().map(|key| {
                let mut redis = self.lock_redis.clone();
                async move {
                    redis::cmd("XLEN")
                        .arg(*key)
                        .query_async::<u64>(&mut redis)
                        .await
                }
            }))
            .await?;
            self.legacy_live = legacy
                .iter()
                .zip(lengths)
                .filter(|(_, n)| *n > 0)
                .map(|(key, _)| key.to_string())
                .collect();
            self.legacy_checked_at = Some(Instant::now());
        }
        all.retain(|s| !s.legacy || self.legacy_live.contains(s.key()));
        Ok(all)
    }

    async fn read(
        &mut self,
        streams: &[Stream],
        from: &str,
        block: Option<Duration>,
    ) -> anyhow::Result<Vec<Event>> {
        // COUNT applies per stream, and counts entries: spread the batch over the
        // streams that are busy, in entries of the size the last read saw.
        let per_stream = (self.config.batch_size
            / self.busy_streams.clamp(1, streams.len().max(1))
            / self.per_entry.max(1))
        .max(1);
        let mut opts = StreamReadOptions::default()
            .group(SETTLE_GROUP, &self.consumer)
            .count(per_stream);
        // A long wait on a single node can be cut short (`CLIENT UNBLOCK`, from
        // another connection: the read answers at once with what it has): its
        // connection's id, asked just before.
        let cluster = self.redis.is_cluster();
        let unblock = match block {
            Some(b) if b > self.config.block && !cluster => redis::cmd("CLIENT")
                .arg("ID")
                .query_async::<i64>(&mut self.redis)
                .await
                .ok(),
            _ => None,
        };
        let (wake, mut lock_redis) = (self.wake.clone(), self.lock_redis.clone());
        let (reply, woken) = {
            let mut reading = std::pin::pin!(async {
                if cluster {
                    let hot: Vec<&Stream> = streams
                        .iter()
                        .filter(|s| {
                            self.last_busy
                                .get(s.key())
                                .is_some_and(|t| t.elapsed() < CLUSTER_HOT)
                        })
                        .collect();
                    self.read_each(streams, &hot, from, &opts, block).await
                } else {
                    if let Some(block) = block {
                        opts = opts.block(block.as_millis() as usize);
                    }
                    let ids = vec![from; streams.len()];
                    let keys: Vec<&str> = streams.iter().map(Stream::key).collect();
                    self.redis.xread_options(&keys, &ids, &opts).await
                }
            });
            // A waiting read stops when `wake` is notified (a sale or poll created
            // or changed here, shutdown): then the streams are listed again.
            if block.is_some() {
                tokio::select! {
                    reply = &mut reading => (Some(reply), false),
                    _ = wake.notified() => {
                        (after_wake(reading, unblock, &mut lock_redis, cluster).await, true)
                    }
                }
            } else {
                (Some(reading.await), false)
            }
        };
        if woken {
            self.relist = true;
            self.block = self.config.block;
        }
        let reply = reply.unwrap_or_else(|| {
            // The polling reads may have been handed entries whose replies are
            // now dropped: they are this consumer's pending entries, which the
            // next step reads first.
            self.maybe_pending = true;
            Ok(None)
        });
        let reply = match reply {
            Ok(r) => r,
            // A stream or group vanished (FLUSHALL, a new Redis, a removed
            // rehearsal): recreate those Postgres still lists, and go on with a
            // fresh list. A sale removed between the listing and the recreation
            // (a rehearsal cleanup commits, then removes its keys) would get its
            // stream back, empty, after the cleanup's last pass: list again and
            // remove what was recreated for a sale no longer listed, only while
            // it has no entries (`lua/drop_empty_stream.lua`).
            Err(e) if e.code() == Some("NOGROUP") => {
                let listed = self.listed_keys().await?;
                let recreated: Vec<&str> = streams
                    .iter()
                    .map(Stream::key)
                    .filter(|key| listed.contains(*key))
                    .collect();
                for key in &recreated {
                    ensure_group(&mut self.redis, key).await?;
                }
                if !recreated.is_empty() {
                    let still = self.listed_keys().await?;
                    for key in recreated.iter().filter(|key| !still.contains(**key)) {
                        let _: i64 = DROP_EMPTY_STREAM
                            .key(*key)
                            .invoke_async(&mut self.redis)
                            .await?;
                    }
                }
                self.relist = true;
                return Ok(Vec::new());
            }
            Err(e) => {
                // The read may have been handed entries before it failed.
                self.maybe_pending = true;
                return Err(e.into());
            }
        };
        let keys = reply.map(|r| r.keys).unwrap_or_default();
        let busy = keys.iter().filter(|k| !k.ids.is_empty()).count();
        if busy > 0 {
            self.busy_streams = busy;
            let now = Instant::now();
            for k in keys.iter().filter(|k| !k.ids.is_empty()) {
                self.last_busy.insert(k.key.clone(), now);
            }
            self.last_busy.retain(|_, t| t.elapsed() < CLUSTER_HOT);
        }
        let mut events = self.events_of(streams, keys).await?;
        let decisions: usize = events.iter().map(|e| e.accepted.len()).sum();
        if !events.is_empty() {
            self.per_entry = decisions.div_ceil(events.len()).max(1);
        }
        // At most one batch per transaction (whole entries: at least one). What is
        // left stays delivered to this consumer and comes back with the next read of
        // its pending entries ("0").
        let mut rows = 0;
        let keep = events
            .iter()
            .position(|e| {
                rows += e.accepted.len();
                rows > self.config.batch_size.max(1)
            })
            .unwrap_or(events.len())
            .max(1);
        events.truncate(keep);
        Ok(events)
    }

    /// The events of one read, stream by stream; an entry that is not one of ours
    /// is acknowledged (and logged), so it never comes back.
    async fn events_of(
        &mut self,
        streams: &[Stream],
        keys: Vec<redis::streams::StreamKey>,
    ) -> anyhow::Result<Vec<Event>> {
        let mut events = Vec::new();
        let by_key: HashMap<&str, &Stream> = streams.iter().map(|s| (s.key(), s)).collect();
        for key in keys {
            let Some(stream) = by_key.get(key.key.as_str()) else {
                anyhow::bail!(
                    "XREADGROUP answered for a stream not asked for: {}",
                    key.key
                );
            };
            for entry in key.ids {
                let feature = &self.features[stream.feature];
                match feature.parse(&entry) {
                    Some(accepted) => events.push(Event {
                        stream: stream.key.clone(),
                        pending: stream.pending.clone(),
                        entry_id: entry.id.clone(),
                        feature: stream.feature,
                        accepted,
                        record: stream
                            .pending
                            .is_some()
                            .then(|| feature.pending_record(&entry))
                            .flatten(),
                    }),
                    None => {
                        // Not one of ours: keep it out of the way, but never silently.
                        tracing::error!(stream = %key.key, entry = %entry.id, "malformed event; acknowledged without settling");
                        let _: () = self
                            .redis
                            .xack(&key.key, SETTLE_GROUP, &[&entry.id])
                            .await?;
                    }
                }
            }
        }
        Ok(events)
    }

    /// The same read on Redis Cluster, where the streams of different sales and polls
    /// live in different slots and one `XREADGROUP` over all of them is a `CROSSSLOT`
    /// error: one `XREADGROUP` per stream, all in flight at once, without `BLOCK`
    /// (a blocking read would hold up the node's connection for every other
    /// stream on that node). When all come back empty and the caller would block, it
    /// reads again every [`CLUSTER_POLL`] until something comes or `block_ms` passes,
    /// but only the `hot` streams (those that gave entries in the last
    /// [`CLUSTER_HOT`]): an idle stream costs one read a `block_ms`, not one every
    /// 20 ms, and a sale's first order after a quiet spell waits at most that long.
    async fn read_each(
        &self,
        streams: &[Stream],
        hot: &[&Stream],
        from: &str,
        opts: &StreamReadOptions,
        block: Option<Duration>,
    ) -> redis::RedisResult<Option<StreamReadReply>> {
        let deadline = Instant::now() + block.unwrap_or_default();
        let mut round: Vec<&Stream> = streams.iter().collect();
        loop {
            let reads = round.iter().map(|stream| {
                let mut redis = self.redis.clone();
                async move {
                    redis
                        .xread_options::<_, _, Option<StreamReadReply>>(
                            &[stream.key()],
                            &[from],
                            opts,
                        )
                        .await
                }
            });
            let keys: Vec<_> = futures_util::future::try_join_all(reads)
                .await?
                .into_iter()
                .flatten()
                .flat_map(|reply| reply.keys)
                .collect();
            let now = Instant::now();
            if keys.iter().any(|k| !k.ids.is_empty()) || now >= deadline {
                return Ok(Some(StreamReadReply { keys }));
            }
            round = hot.to_vec();
            let pause = if round.is_empty() {
                deadline - now
            } else {
                CLUSTER_POLL.min(deadline - now)
            };
            tokio::time::sleep(pause).await;
            if round.is_empty() {
                return Ok(Some(StreamReadReply { keys: Vec::new() }));
            }
        }
    }

    /// Writes a batch in one transaction, each feature its own rows; returns the
    /// rows inserted and the ids in conflict. Plain inserts first; a batch that
    /// meets a row already there (a redelivery, or an order in conflict) is
    /// written again, skipping those rows.
    async fn write(&self, events: &[Event]) -> Result<(u64, Vec<Uuid>), sqlx::Error> {
        match self.write_as(events, Insert::Fresh).await {
            Err(e)
                if e.as_database_error()
                    .is_some_and(|d| d.is_unique_violation()) =>
            {
                Metrics::inc(&self.metrics.settle_rewrites);
                tracing::debug!(
                    error = %e,
                    "a settlement batch met rows already in Postgres; writing it again, skipping them"
                );
                self.write_as(events, Insert::Tolerant).await
            }
            written => written,
        }
    }

    async fn write_as(
        &self,
        events: &[Event],
        insert: Insert,
    ) -> Result<(u64, Vec<Uuid>), sqlx::Error> {
        let mut tx = self.db.begin().await?;
        let (mut inserted, mut conflicting) = (0, Vec::new());
        for (feature, settle) in self.features.iter().enumerate() {
            let rows: Vec<Accepted> = events
                .iter()
                .filter(|e| e.feature == feature)
                .flat_map(|e| e.accepted.iter().cloned())
                .collect();
            if rows.is_empty() {
                continue;
            }
            let written = settle.write(&mut tx, &rows, insert).await?;
            inserted += written.inserted;
            conflicting.extend(written.conflicting);
        }
        tx.commit().await?;
        Ok((inserted, conflicting))
    }

    async fn settle(&mut self, events: Vec<Event>) -> anyhow::Result<Settled> {
        if events.is_empty() {
            return Ok(Settled::default());
        }
        let started = Instant::now();
        let (inserted, conflicting) = self.write(&events).await?;
        if !conflicting.is_empty() {
            // Redis accepted these, but Postgres already holds another order of the
            // same user for the same sale (or the sale or the user is gone): the two
            // stores disagree (Redis lost its buyers set, or two deployments share
            // one database). Nothing to retry; say so loudly and leave the repair to
            // `stampede reconcile`.
            self.metrics.settle_conflicts.add(conflicting.len() as u64);
            tracing::error!(
                count = conflicting.len(),
                orders = ?conflicting,
                "accepted orders conflict with settled orders of the same user and sale; \
                 Redis and Postgres disagree: run `stampede reconcile`"
            );
        }
        self.metrics.settled_rows.add(inserted);
        // Only now, with the rows committed, may the entries be acknowledged. If this
        // fails, they are delivered again and the insert above skips them.
        // Per stream: its entry ids, and the pending hash with the order ids to drop.
        #[derive(Default)]
        struct Done<'a> {
            entries: Vec<&'a str>,
            pending: Option<&'a str>,
            feature: usize,
            records: Vec<String>,
        }
        let mut by_stream: HashMap<&str, Done<'_>> = HashMap::new();
        for ev in &events {
            let done = by_stream.entry(ev.stream.as_str()).or_default();
            done.entries.push(ev.entry_id.as_str());
            done.pending = ev.pending.as_deref();
            done.feature = ev.feature;
            done.records.extend(ev.record.iter().cloned());
        }
        // The pending hash first: a failure after it leaves the entries to be
        // delivered again, which finds their rows written and their orders gone.
        for done in by_stream.values() {
            if let Some(pending) = done.pending
                && !done.records.is_empty()
            {
                self.features[done.feature]
                    .drop_pending(&mut self.redis, pending, &done.records)
                    .await?;
            }
        }
        let mut pipe = redis::pipe();
        for (stream, done) in &by_stream {
            pipe.xack(*stream, SETTLE_GROUP, &done.entries).ignore();
            pipe.xdel(*stream, &done.entries).ignore();
        }
        let _: () = pipe.query_async(&mut self.redis).await?;
        self.metrics
            .observed
            .settle_batch_seconds
            .record(started.elapsed().as_secs_f64());
        self.metrics.observed.touched();
        if let Some(settled) = &self.settled {
            settled.notify_one();
        }
        Ok(Settled {
            read: events.iter().map(|e| e.accepted.len()).sum(),
            inserted,
        })
    }
}

/// How often a settlement worker on Redis Cluster, waiting for entries, looks again
/// at the streams that were busy lately.
const CLUSTER_POLL: Duration = Duration::from_millis(20);
/// A stream that gave entries this recently is polled every [`CLUSTER_POLL`] on a
/// cluster; the others once a `block_ms`.
const CLUSTER_HOT: Duration = Duration::from_secs(10);

fn default_consumer_name() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".into());
    format!(
        "{host}-{}-{}",
        std::process::id(),
        &crate::random::token_hex(3)
    )
}

async fn wait(shutdown: &mut watch::Receiver<bool>, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = shutdown.changed() => {}
    }
}

/// The answer of a waiting read that a wake interrupts (`None`: dropped). On one
/// node the read's answer is awaited, so no entry it was handed goes unseen: at
/// once when `CLIENT UNBLOCK` of its connection (`unblock`, its id) frees it (asked
/// again every 20 ms while Redis answers that nothing is blocked, for at most 1 s:
/// the read may not have reached it yet), else when its wait ends. A cluster's
/// polling read is dropped.
async fn after_wake<F: std::future::Future>(
    mut reading: std::pin::Pin<&mut F>,
    unblock: Option<i64>,
    lock_redis: &mut Redis,
    cluster: bool,
) -> Option<F::Output> {
    if cluster {
        return None;
    }
    for _ in 0..50 {
        let Some(id) = unblock else { break };
        let unblocked = redis::cmd("CLIENT")
            .arg("UNBLOCK")
            .arg(id)
            .query_async::<i64>(lock_redis)
            .await;
        if !matches!(unblocked, Ok(0)) {
            break;
        }
        tokio::select! {
            reply = &mut reading => return Some(reply),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    Some(reading.await)
}
