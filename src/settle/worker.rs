//! The worker loop: hold the lease, list the streams, reclaim, then read and settle
//! one batch a turn (see the module docs of `settle`).

use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::lease::{Lease, SETTLE_LEASE, STANDBY_EVERY};
use super::{Event, Settled, Settler, Stream};
use crate::metrics::Metrics;

/// How often the list of sale and poll streams is re-read from Postgres.
const REFRESH_EVERY: Duration = Duration::from_secs(2);

/// What the worker loop carries from one turn to the next.
struct Turns {
    streams: Vec<Stream>,
    refreshed_at: Option<Instant>,
    claimed_at: Instant,
    /// A dead consumer's entry is taken over at most `claim_every` after it has been
    /// idle for `claim_idle_ms`: about 1.1 times the configured idle time.
    claim_every: Duration,
    backoff: Duration,
    /// Take over what a dead consumer left at once, not after the first interval.
    claim_now: bool,
}

impl Settler {
    /// Runs until `shutdown` turns true. With `exclusive` (the default) it reads only
    /// while it holds the settling lease, and stands by otherwise (see `lease.rs`);
    /// it releases the lease when it stops. A batch in progress is committed and
    /// acknowledged before it returns; shutdown stops a long blocking read at once
    /// on one node (`CLIENT UNBLOCK`); else it waits for the read's end.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        tracing::info!(consumer = %self.consumer, "settlement worker started");
        let stop = self.wake_on(&shutdown);
        let mut turns = Turns {
            streams: Vec::new(),
            refreshed_at: None,
            claimed_at: Instant::now(),
            claim_every: (self.config.claim_idle / 10).max(Duration::from_millis(100)),
            backoff: Duration::from_millis(100),
            claim_now: true,
        };
        let mut lease = Lease::new(self.metrics.clone());
        let lease_key = self.keys.lock(SETTLE_LEASE);
        while !*shutdown.borrow() {
            if self.config.exclusive
                && !self
                    .lead(&mut lease, &lease_key, &mut turns, &mut shutdown)
                    .await
            {
                continue;
            }
            if !self
                .relist_if_due(&mut lease, &mut turns, &mut shutdown)
                .await
            {
                continue;
            }
            if turns.streams.is_empty() {
                let wake = self.wake.clone();
                tokio::select! {
                    _ = wait(&mut shutdown, self.idle_block()) => {}
                    _ = wake.notified() => self.relist = true,
                }
                continue;
            }
            self.reclaim_if_due(&mut turns).await;
            self.step_and_pace(&mut lease, &mut turns, &mut shutdown)
                .await;
        }
        stop.abort();
        lease.release().await;
        tracing::info!(consumer = %self.consumer, "settlement worker stopped");
    }

    /// Shutdown stops a blocking read at once: a task that notifies `wake` when
    /// `shutdown` turns true.
    fn wake_on(&self, shutdown: &watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
        let (mut shutdown, wake) = (shutdown.clone(), self.wake.clone());
        tokio::spawn(async move {
            while !*shutdown.borrow() {
                if shutdown.changed().await.is_err() {
                    break;
                }
            }
            wake.notify_one();
        })
    }

    /// Holds the settling lease; without it (another worker leads, or Redis does
    /// not answer), stands by and waits: false, this turn reads nothing.
    async fn lead(
        &mut self,
        lease: &mut Lease,
        lease_key: &str,
        turns: &mut Turns,
        shutdown: &mut watch::Receiver<bool>,
    ) -> bool {
        match lease
            .hold(&self.lock_redis, lease_key, &self.consumer)
            .await
        {
            Ok(true) => true,
            Ok(false) => {
                // Leading later, first take over what the last leader left.
                turns.claim_now = true;
                self.standing_by(&turns.streams).await;
                wait(shutdown, STANDBY_EVERY).await;
                false
            }
            Err(e) => {
                turns.claim_now = true;
                tracing::warn!(error = %e, retry_in_ms = turns.backoff.as_millis() as u64, "cannot ask for the settlement lease");
                wait(shutdown, turns.backoff).await;
                turns.backoff = (turns.backoff * 2).min(Duration::from_secs(5));
                false
            }
        }
    }

    /// Lists the streams again when asked to or every [`REFRESH_EVERY`]; false when
    /// the listing failed and the lease was handed over (after a wait).
    async fn relist_if_due(
        &mut self,
        lease: &mut Lease,
        turns: &mut Turns,
        shutdown: &mut watch::Receiver<bool>,
    ) -> bool {
        if self.relist
            || turns
                .refreshed_at
                .is_none_or(|t| t.elapsed() >= REFRESH_EVERY)
        {
            self.relist = false;
            match self.streams().await {
                Ok(s) => {
                    turns.streams = s;
                    turns.refreshed_at = Some(Instant::now());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list sale streams");
                    if lease.failed(&self.consumer).await {
                        wait(shutdown, STANDBY_EVERY * 2).await;
                        return false;
                    }
                }
            }
        }
        true
    }

    /// Every `claim_every` (at once after leading again), takes over entries a dead
    /// consumer left, on the next streams in turn.
    async fn reclaim_if_due(&mut self, turns: &mut Turns) {
        if turns.claim_now || turns.claimed_at.elapsed() >= turns.claim_every {
            let turn = if turns.claim_now {
                &turns.streams[..]
            } else {
                self.next_to_reclaim(&turns.streams, turns.claim_every)
            };
            let turn = turn.to_vec();
            turns.claim_now = false;
            turns.claimed_at = Instant::now();
            if let Err(e) = self.reclaim(&turn).await {
                tracing::warn!(error = %e, "reclaiming pending entries failed");
            }
        }
    }

    /// One [`Settler::step`], then the wait its outcome asks for: none after a
    /// success, a growing backoff after a failure.
    async fn step_and_pace(
        &mut self,
        lease: &mut Lease,
        turns: &mut Turns,
        shutdown: &mut watch::Receiver<bool>,
    ) {
        match self.step(&turns.streams).await {
            Ok(done) => {
                turns.backoff = Duration::from_millis(100);
                lease.succeeded();
                if done.read > 0 {
                    tracing::debug!(read = done.read, inserted = done.inserted, "settled batch");
                    if self.took_all && !self.config.linger.is_zero() {
                        // A storm settles in fewer, fuller transactions; a read
                        // that may have left entries is followed at once.
                        wait(shutdown, self.config.linger).await;
                    }
                }
            }
            Err(e) => {
                Metrics::inc(&self.metrics.settle_errors);
                // Entries stay pending for this consumer and are retried next loop.
                tracing::warn!(error = %e, retry_in_ms = turns.backoff.as_millis() as u64, "settlement step failed");
                if lease.failed(&self.consumer).await {
                    // Another worker may fare better: it leads at its next
                    // attempt, while this one waits longer than a standby does.
                    wait(shutdown, STANDBY_EVERY * 2).await;
                    return;
                }
                wait(shutdown, turns.backoff).await;
                turns.backoff = (turns.backoff * 2).min(Duration::from_secs(5));
            }
        }
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
}

async fn wait(shutdown: &mut watch::Receiver<bool>, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = shutdown.changed() => {}
    }
}
