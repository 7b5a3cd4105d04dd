//! Taking over what a dead worker left: entries read by a consumer that died and
//! never acknowledged them (`XAUTOCLAIM`), a few streams a pass, under a lock so
//! that one instance at a time scans; and forgetting consumers long gone.

use std::time::Duration;

use redis::AsyncCommands;
use redis::streams::{StreamAutoClaimOptions, StreamAutoClaimReply, StreamInfoConsumersReply};

use super::{SETTLE_GROUP, Settler, Stream};
use crate::lock::{Lock, LostSignal};

/// Name of the lock (see [`crate::lock`]) held during a reclaim pass.
pub const RECLAIM_LOCK: &str = "settle:reclaim";
/// Lease of the reclaim lock; a watchdog extends it while a pass runs, so this only
/// bounds how long a crashed worker blocks the next pass.
const RECLAIM_LOCK_TTL_MS: u64 = 10_000;
/// Most streams one periodic reclaim pass looks at (an `XINFO CONSUMERS` each, all
/// in one round trip, and an `XAUTOCLAIM` of those where a consumer holds
/// entries), in turn: the pass costs no more with 10,000 open sales than with 640.
pub(super) const RECLAIM_BUDGET: usize = 64;

static FORGET_CONSUMER: std::sync::LazyLock<crate::lua::Script> =
    crate::lua::lua_script!("forget_consumer.lua");

crate::lua::reply_codes! {
    /// What `lua/forget_consumer.lua` answers, as its header lists them.
    pub enum ForgetCode in "forget_consumer.lua", checked_by forget_codes_are_the_scripts {
        Removed = 1, "removed";
        HoldsEntries = 0, "it holds entries now";
    }
}
/// Fewest streams a pass looks at (all of them when there are fewer).
const RECLAIM_LEAST: usize = 16;

impl Settler {
    /// The next streams of `streams` in turn: as many as a turn through them all
    /// within `claim_idle_ms` needs, passes coming every `every` (the loop's
    /// interval, or its longest read when idle), at least [`RECLAIM_LEAST`] and at
    /// most [`RECLAIM_BUDGET`]. An entry a dead consumer left is then taken over
    /// at most about twice `claim_idle_ms` after it was read, up to some hundreds
    /// of streams.
    pub(super) fn next_to_reclaim<'a>(
        &mut self,
        streams: &'a [Stream],
        every: Duration,
    ) -> &'a [Stream] {
        if self.reclaim_from >= streams.len() {
            self.reclaim_from = 0;
        }
        let from = self.reclaim_from;
        let every = every.max(self.idle_block()).max(Duration::from_millis(1));
        let passes = (self.config.claim_idle.as_millis() / every.as_millis()).max(1) as usize;
        let budget = streams
            .len()
            .div_ceil(passes)
            .clamp(RECLAIM_LEAST, RECLAIM_BUDGET);
        let to = (from + budget).min(streams.len());
        self.reclaim_from = to;
        &streams[from..to]
    }

    /// Moves entries idle for longer than `claim_idle_ms` (their reader died) to this
    /// consumer; the next `read(.., "0")` settles them. Skipped while another instance
    /// holds the reclaim lock: it is doing the same pass. (`XAUTOCLAIM` itself never
    /// hands one entry to two claimers; the lock saves every instance claiming on
    /// every stream each interval.) Who holds what is read first, without the lock:
    /// where no consumer holds an entry (an idle server), there is nothing to take
    /// over, and the pass takes no lock (two writes fewer).
    pub(super) async fn reclaim(&mut self, streams: &[Stream]) -> anyhow::Result<usize> {
        let replies = self.consumers_of(streams).await;
        let nothing_held = replies.iter().all(|reply| match reply {
            Some(Ok(r)) => r.consumers.iter().all(|c| c.pending == 0),
            Some(Err(e)) => gone(e),
            None => false,
        });
        if nothing_held {
            return self.reclaim_streams(streams, replies, None).await;
        }
        let key = self.keys.lock(RECLAIM_LOCK);
        let Some(mut guard) = Lock::try_acquire(&self.lock_redis, key, RECLAIM_LOCK_TTL_MS).await?
        else {
            tracing::debug!("another instance is reclaiming pending entries; skipped");
            return Ok(0);
        };
        let lost = guard.start_watchdog();
        let result = self.reclaim_streams(streams, replies, Some(&lost)).await;
        if result.as_ref().map_or(true, |claimed| *claimed > 0) {
            self.maybe_pending = true;
        }
        if let Err(e) = guard.release().await {
            tracing::warn!(error = %e, "releasing the reclaim lock failed; it expires on its own");
        }
        result
    }

    /// The entries other readers of the settlement group hold now, per reader:
    /// its name, how many and how long it has been idle (ms). After a drain: a
    /// worker running beside it settles its own; a stopped one's are taken over
    /// once idle for `claim_idle_ms` (by a running worker, or the next drain).
    pub async fn held_by_others(&mut self) -> anyhow::Result<Vec<(String, usize, usize)>> {
        let streams = self.streams().await?;
        let replies = self.consumers_of(&streams).await;
        let mut held: Vec<(String, usize, usize)> = Vec::new();
        for (stream, reply) in streams.iter().zip(replies) {
            let Some(consumers) = self.consumers(stream, reply).await? else {
                continue;
            };
            for c in consumers {
                if c.pending == 0 || c.name == self.consumer {
                    continue;
                }
                match held.iter_mut().find(|(name, _, _)| *name == c.name) {
                    Some(h) => {
                        h.1 += c.pending;
                        h.2 = h.2.min(c.idle);
                    }
                    None => held.push((c.name, c.pending, c.idle)),
                }
            }
        }
        Ok(held)
    }

    /// A stream's readers, from `reply` ([`Self::consumers_of`]'s) or asked now;
    /// `None` when the stream or its group is gone (a new or wiped Redis, a
    /// removed sale; `XINFO` answers "no such key" for a missing stream): nothing
    /// to claim, no consumers to forget, and a read recreates what Postgres still
    /// lists.
    async fn consumers(
        &mut self,
        stream: &Stream,
        reply: Option<redis::RedisResult<StreamInfoConsumersReply>>,
    ) -> anyhow::Result<Option<Vec<redis::streams::StreamInfoConsumer>>> {
        let reply = match reply {
            Some(reply) => reply,
            None => self.redis.xinfo_consumers(stream.key(), SETTLE_GROUP).await,
        };
        match reply {
            Ok(r) => Ok(Some(r.consumers)),
            Err(e) if gone(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Who reads each stream and how much each holds: `None` for a stream to ask
    /// alone.
    async fn consumers_of(
        &mut self,
        streams: &[Stream],
    ) -> Vec<Option<redis::RedisResult<StreamInfoConsumersReply>>> {
        // Who reads each stream and how much each holds, for every stream of the
        // turn in one round trip (an idle server's pass wakes Redis once, not once
        // a stream); each stream alone where the pipeline as a whole fails (on a
        // cluster, one stream's error fails it). Only a stream where some consumer
        // holds entries can have any to take over: the others cost no `XAUTOCLAIM`.
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for stream in streams {
            pipe.xinfo_consumers(stream.key(), SETTLE_GROUP);
        }
        match pipe
            .query_async::<Vec<redis::RedisResult<StreamInfoConsumersReply>>>(&mut self.redis)
            .await
        {
            Ok(replies) if replies.len() == streams.len() => {
                replies.into_iter().map(Some).collect()
            }
            _ => streams.iter().map(|_| None).collect(),
        }
    }

    /// Claims what consumers hold too long, and forgets dead consumers, on the
    /// streams `replies` describe; `lost`: the reclaim lock's, when held.
    async fn reclaim_streams(
        &mut self,
        streams: &[Stream],
        mut replies: Vec<Option<redis::RedisResult<StreamInfoConsumersReply>>>,
        lost: Option<&LostSignal>,
    ) -> anyhow::Result<usize> {
        let mut total = 0;
        let mut dead: Vec<(&str, String)> = Vec::new();
        for (stream, reply) in streams.iter().zip(replies.iter_mut()) {
            if lost.is_some_and(LostSignal::is_lost) {
                // Another instance may be reclaiming now; leave the rest to it.
                tracing::warn!("reclaim lock lost; pass cut short");
                break;
            }
            let Some(consumers) = self.consumers(stream, reply.take()).await? else {
                continue;
            };
            if consumers.iter().any(|c| c.pending > 0) {
                total += self.claim_idle_entries(stream.key()).await?;
            }
            dead.extend(
                self.dead_consumers(&consumers)
                    .map(|name| (stream.key(), name)),
            );
        }
        if !dead.is_empty() {
            // All at once (a restarted fleet leaves one a stream): on one node,
            // one round trip. A later pass tries again where one fails; the claims
            // above stand.
            let removed = futures_util::future::join_all(dead.iter().map(|(stream, name)| {
                let mut redis = self.lock_redis.clone();
                async move {
                    FORGET_CONSUMER
                        .key(*stream)
                        .arg(SETTLE_GROUP)
                        .arg(name.as_str())
                        .invoke_async::<i64>(&mut redis)
                        .await
                }
            }))
            .await;
            let forgotten = removed
                .iter()
                .filter(|r| matches!(r, Ok(c) if ForgetCode::of(*c) == Some(ForgetCode::Removed)))
                .count();
            if let Some(Err(e)) = removed.iter().find(|r| r.is_err()) {
                tracing::warn!(error = %e, "removing dead settlement consumers failed");
            }
            if forgotten > 0 {
                tracing::info!(forgotten, "removed dead settlement consumers");
            }
        }
        if total > 0 {
            tracing::info!(
                claimed = total,
                "took over pending order events from a stopped consumer"
            );
        }
        Ok(total)
    }

    /// `XAUTOCLAIM`s a stream's entries idle for longer than `claim_idle_ms`, page
    /// after page; returns how many it took. A stream or group gone meanwhile: 0.
    async fn claim_idle_entries(&mut self, stream: &str) -> anyhow::Result<usize> {
        let mut start = "0-0".to_string();
        let mut claimed = 0;
        loop {
            let opts = StreamAutoClaimOptions::default()
                .count(self.config.batch_size)
                .with_justid();
            let reply: redis::RedisResult<StreamAutoClaimReply> = self
                .redis
                .xautoclaim_options(
                    stream,
                    SETTLE_GROUP,
                    &self.consumer,
                    self.config.claim_idle.as_millis() as u64,
                    &start,
                    opts,
                )
                .await;
            let reply = match reply {
                Ok(r) => r,
                Err(e) if gone(&e) => return Ok(claimed),
                Err(e) => return Err(e.into()),
            };
            claimed += reply.claimed.len();
            if reply.next_stream_id == "0-0" {
                return Ok(claimed);
            }
            start = reply.next_stream_id;
        }
    }

    /// The consumers of the group that have nothing pending and have been idle
    /// longer than `claim_idle_ms` (workers that died or stopped): without this the
    /// group lists every worker that ever ran. A consumer with pending entries is
    /// kept until a claim has taken them over (a later pass forgets it). Each is
    /// removed by `lua/forget_consumer.lua`, only while it still holds nothing.
    fn dead_consumers<'a>(
        &'a self,
        consumers: &'a [redis::streams::StreamInfoConsumer],
    ) -> impl Iterator<Item = String> + 'a {
        consumers
            .iter()
            .filter(|c| {
                c.name != self.consumer
                    && c.pending == 0
                    && Duration::from_millis(c.idle as u64) > self.config.claim_idle
            })
            .map(|c| c.name.clone())
    }
}

/// A stream, or its group, that does not exist: `NOGROUP`, or `XINFO`'s "no such
/// key".
fn gone(e: &redis::RedisError) -> bool {
    e.code() == Some("NOGROUP") || e.to_string().contains("no such key")
}
