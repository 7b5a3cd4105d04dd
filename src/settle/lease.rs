//! The settling lease: with `settle.exclusive` (the default) one running worker at a
//! time reads the streams; the others stand by and ask for the lease once a
//! [`STANDBY_EVERY`].
//!
//! Why: every `stampede serve` runs a worker, and workers that read the same streams
//! side by side each take whatever the last few milliseconds left. A storm is then
//! settled in many small transactions instead of a few large ones, and every
//! transaction costs Postgres a commit and its per-statement work, and Redis a read,
//! an acknowledgement and a deletion. Measured with three servers on one machine
//! (docs/capacity.md): about 7 µs more of machine CPU per accepted purchase, and
//! about a tenth fewer fresh buyers a second, than with one worker reading.
//!
//! The lease is a [`Lock`] (`ns:lock:{settle}`) of [`LEASE_TTL_MS`], kept alive by its
//! watchdog. A worker that stops cleanly releases it, so a standby leads within a
//! second; one that dies leaves it to expire, so a standby leads within
//! [`LEASE_TTL_MS`] and a second. What the dead one had read and not acknowledged is
//! then taken over as before (`XAUTOCLAIM` after `claim_idle_ms`, see `reclaim.rs`).
//! A lease is not a mutex: a leader that stalls past its lease overlaps for a moment
//! with the next one, which the settlement's writes tolerate (an entry delivered
//! twice lands once).
//!
//! The watchdog keeps the lease alive however the worker fares, so a leader whose
//! steps fail [`FAILURES_BEFORE_HANDING_OVER`] times in a row (Postgres out of its
//! reach, say) lets it go and waits longer than a standby before it asks again. A
//! worker that lost the lease with entries it read and did not acknowledge settles
//! those while it stands by (`Settler::standing_by`), and reads nothing new.
//!
//! `stampede settle --drain` ([`super::Settler::drain`]) does not take the lease: an
//! operator who drains a backlog means it to run now.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::lock::{Lock, LockGuard, LostSignal};
use crate::metrics::Metrics;
use crate::redis_conn::Redis;

/// The lease's name under [`crate::keys::Keys::lock`].
pub const SETTLE_LEASE: &str = "settle";

/// How long the lease outlives its last extension (the watchdog extends it every
/// third of this).
pub const LEASE_TTL_MS: u64 = 3_000;

/// How often a standby asks for the lease.
pub const STANDBY_EVERY: Duration = Duration::from_secs(1);

/// Steps in a row that failed before a leader lets the lease go (its watchdog
/// would keep it alive however the worker fares): a worker that cannot settle (its
/// Postgres pool or its Redis connection broken, say) hands over to one that may.
pub const FAILURES_BEFORE_HANDING_OVER: u32 = 3;

/// This worker's hold on the lease. While it holds it, `metrics.settle_leading`
/// is set (`/metrics`: `stampede_settle_leading`); dropped, it clears it (the lock
/// itself is released in the background, see [`LockGuard`]).
pub(super) struct Lease {
    held: Option<(LockGuard, LostSignal)>,
    /// Standing by since the last attempt (logged once per change).
    standing_by: bool,
    /// Failures in a row while leading (see [`FAILURES_BEFORE_HANDING_OVER`]).
    failures: u32,
    metrics: Arc<Metrics>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.held.is_some() {
            self.metrics.settle_leading.store(false, Ordering::Relaxed);
        }
    }
}

impl Lease {
    pub(super) fn new(metrics: Arc<Metrics>) -> Lease {
        Lease {
            held: None,
            standing_by: false,
            failures: 0,
            metrics,
        }
    }

    /// Whether this worker may read now: it holds the lease, taking it when it is
    /// free. A lease the watchdog lost is let go first.
    pub(super) async fn hold(
        &mut self,
        redis: &Redis,
        key: &str,
        consumer: &str,
    ) -> redis::RedisResult<bool> {
        if self.held.as_ref().is_some_and(|(_, lost)| lost.is_lost()) {
            self.held = None;
            self.metrics.settle_leading.store(false, Ordering::Relaxed);
            tracing::warn!(consumer, "settlement lease lost: this worker stands by");
        }
        if self.held.is_some() {
            return Ok(true);
        }
        let Some(mut guard) = Lock::try_acquire(redis, key, LEASE_TTL_MS).await? else {
            if !self.standing_by {
                tracing::info!(consumer, "settlement worker stands by: another one settles");
                self.standing_by = true;
            }
            return Ok(false);
        };
        let lost = guard.start_watchdog();
        self.held = Some((guard, lost));
        self.standing_by = false;
        self.metrics.settle_leading.store(true, Ordering::Relaxed);
        tracing::info!(
            consumer,
            "settlement worker leads: it alone reads the streams"
        );
        Ok(true)
    }

    /// A step (or the listing of the streams) failed. After
    /// [`FAILURES_BEFORE_HANDING_OVER`] in a row while leading, the lease goes and
    /// this returns true: the caller waits longer than a standby does before it
    /// asks again, so that another worker leads.
    pub(super) async fn failed(&mut self, consumer: &str) -> bool {
        if self.held.is_none() {
            return false;
        }
        self.failures += 1;
        if self.failures < FAILURES_BEFORE_HANDING_OVER {
            return false;
        }
        tracing::warn!(
            consumer,
            failures = self.failures,
            "settlement worker hands the lease over: it cannot settle"
        );
        self.release().await;
        true
    }

    /// A step succeeded: the failures in a row start again from zero.
    pub(super) fn succeeded(&mut self) {
        self.failures = 0;
    }

    /// Lets the lease go, so that a standby leads at its next attempt.
    pub(super) async fn release(&mut self) {
        self.failures = 0;
        if let Some((guard, _)) = self.held.take() {
            self.metrics.settle_leading.store(false, Ordering::Relaxed);
            if let Err(e) = guard.release().await {
                tracing::warn!(error = %e, "releasing the settlement lease failed");
            }
        }
    }
}
