//! The read step: list the streams, read a batch of entries (one `XREADGROUP`, or one
//! a stream on Redis Cluster) and parse them into events.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::streams::{StreamKey, StreamReadOptions, StreamReadReply};

use super::{Event, SETTLE_GROUP, Settler, Stream, ensure_group};
use crate::redis_conn::Redis;

/// Streams of sales that ended longer ago than this are no longer read.
const STREAM_RETENTION_DAYS: i32 = 7;
/// How often the worker looks for entries in the streams earlier versions wrote
/// ([`Stream::legacy`]): an order an older server accepted during a rolling
/// upgrade is settled at most this much later.
pub(super) const LEGACY_EVERY: Duration = Duration::from_secs(30);

static DROP_EMPTY_STREAM: std::sync::LazyLock<crate::lua::Script> =
    crate::lua::lua_script!("drop_empty_stream.lua");

/// How much longer than its block a settlement read may take before it is given
/// up (see [`Settler::read`]).
const READ_MARGIN: Duration = Duration::from_secs(5);

impl Settler {
    /// The keys of the streams Postgres lists now (see [`Settler::streams`]).
    async fn listed_keys(&mut self) -> anyhow::Result<HashSet<String>> {
        Ok(self.streams().await?.into_iter().map(|s| s.key).collect())
    }

    /// The streams of every feature that may still get entries: a legacy stream
    /// only while it holds some (looked at every [`LEGACY_EVERY`]).
    pub(super) async fn streams(&mut self) -> anyhow::Result<Vec<Stream>> {
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

    /// One read of the streams from `from` (`"0"`: this consumer's pending entries;
    /// `">"`: new ones), waiting up to `block` for new ones; at most one batch.
    pub(super) async fn read(
        &mut self,
        streams: &[Stream],
        from: &str,
        block: Option<Duration>,
    ) -> anyhow::Result<Vec<Event>> {
        let opts = self.read_options(streams);
        // Its connection has no response timeout (it blocks), so a link that died
        // without a reset would hold this read, and settlement, for ever: past its
        // block and [`READ_MARGIN`], the read is given up (what it was handed is
        // this consumer's pending entries, read first next step) and its
        // connection probed, replaced if dead (`redis_conn::node`).
        let limit = block.unwrap_or_default() + READ_MARGIN;
        let read = self.read_reply(streams, from, opts, block);
        let Ok((reply, woken)) = tokio::time::timeout(limit, read).await else {
            self.maybe_pending = true;
            self.redis.suspect();
            anyhow::bail!(
                "a settlement read of Redis did not answer within {} ms",
                limit.as_millis()
            );
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
            // A stream or group vanished: see `recreate_groups`.
            Err(e) if e.code() == Some("NOGROUP") => {
                self.recreate_groups(streams).await?;
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
        // No stream filled its count: the read took every entry there was.
        let count = self.per_stream(streams);
        let took_all = keys.iter().all(|k| k.ids.len() < count);
        self.note_busy(&keys);
        let mut events = self.events_of(streams, keys).await?;
        let read = events.len();
        self.keep_one_batch(&mut events);
        self.took_all = took_all && events.len() == read;
        Ok(events)
    }

    /// The read's options: COUNT applies per stream ([`Settler::per_stream`]).
    fn read_options(&self, streams: &[Stream]) -> StreamReadOptions {
        StreamReadOptions::default()
            .group(SETTLE_GROUP, &self.consumer)
            .count(self.per_stream(streams))
    }

    /// A read's COUNT, which applies per stream and counts entries: the batch
    /// spread over the streams that are busy, in entries of the size the last read
    /// saw.
    fn per_stream(&self, streams: &[Stream]) -> usize {
        (self.config.batch_size
            / self.busy_streams.clamp(1, streams.len().max(1))
            / self.per_entry.max(1))
        .max(1)
    }

    /// The read's reply (`None`: dropped, see [`after_wake`]), and whether `wake`
    /// cut it short.
    async fn read_reply(
        &mut self,
        streams: &[Stream],
        from: &str,
        mut opts: StreamReadOptions,
        block: Option<Duration>,
    ) -> (Option<redis::RedisResult<Option<StreamReadReply>>>, bool) {
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
    }

    /// A stream or group vanished (FLUSHALL, a new Redis, a removed
    /// rehearsal): recreate those Postgres still lists, and go on with a
    /// fresh list. A sale removed between the listing and the recreation
    /// (a rehearsal cleanup commits, then removes its keys) would get its
    /// stream back, empty, after the cleanup's last pass: list again and
    /// remove what was recreated for a sale no longer listed, only while
    /// it has no entries (`lua/drop_empty_stream.lua`).
    async fn recreate_groups(&mut self, streams: &[Stream]) -> anyhow::Result<()> {
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
        Ok(())
    }

    /// Which streams gave entries: the next read spreads its batch over them, and on a
    /// cluster polls them often (see [`CLUSTER_HOT`]).
    fn note_busy(&mut self, keys: &[StreamKey]) {
        let busy = keys.iter().filter(|k| !k.ids.is_empty()).count();
        if busy > 0 {
            self.busy_streams = busy;
            let now = Instant::now();
            for k in keys.iter().filter(|k| !k.ids.is_empty()) {
                self.last_busy.insert(k.key.clone(), now);
            }
            self.last_busy.retain(|_, t| t.elapsed() < CLUSTER_HOT);
        }
    }

    /// Keeps at most one batch of `events` for one transaction.
    fn keep_one_batch(&mut self, events: &mut Vec<Event>) {
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
    }

    /// The events of one read, stream by stream; an entry that is not one of ours
    /// is acknowledged (and logged), so it never comes back.
    async fn events_of(
        &mut self,
        streams: &[Stream],
        keys: Vec<StreamKey>,
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
}

/// How often a settlement worker on Redis Cluster, waiting for entries, looks again
/// at the streams that were busy lately.
const CLUSTER_POLL: Duration = Duration::from_millis(20);
/// A stream that gave entries this recently is polled every [`CLUSTER_POLL`] on a
/// cluster; the others once a `block_ms`.
const CLUSTER_HOT: Duration = Duration::from_secs(10);

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
