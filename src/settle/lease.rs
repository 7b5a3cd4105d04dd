//! The settling lease: with `settle.exclusive` (the default) one running worker at a
//! time reads the streams; the others stand by and ask for the lease once a
//! [`STANDBY_EVERY`].
//!
//! Why: every `stampede serve` runs a worker, and workers that read the same streams
//! side by side each take whatever the last few milliseconds left. A storm is then
//! settled in many small transactions instead of a few large ones, and every
//! transaction costs Postgres a commit and its per-statement work, and Redis a read,
//! an acknowledgement and a deletion. Measured with three servers on one machine
//! (docs/capacity.md): about 7 µs more of machine CPU per accepted purchase, and a
//! fifth fewer fresh buyers a second, than with one worker reading.
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
//! `stampede settle --drain` ([`super::Settler::drain`]) does not take the lease: an
//! operator who drains a backlog means it to run now.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::lock::{Lock, LockGuard, LostSignal};
use crate::redis_conn::Redis;

/// The lease's name under [`crate::keys::Keys::lock`].
pub const SETTLE_LEASE: &str = "settle";

/// How long the lease outlives its last extension (the watchdog extends it every
/// third of this).
pub const LEASE_TTL_MS: u64 = 3_000;

/// How often a standby asks for the lease.
pub const STANDBY_EVERY: Duration = Duration::from_secs(1);

/// Whether a settlement worker of this process holds the lease now (`/metrics`:
/// `stampede_settle_leading`).
pub static LEADING: AtomicBool = AtomicBool::new(false);

/// This worker's hold on the lease.
#[derive(Default)]
pub(super) struct Lease {
    held: Option<(LockGuard, LostSignal)>,
    /// Standing by since the last attempt (logged once per change).
    standing_by: bool,
}

impl Lease {
    /// Whether this worker may read now: it holds the lease, taking it when it is
    /// free. A lease the watchdog lost is let go first.
    pub(super) async fn hold(
        &mut self,
        redis: &Redis,
        key: String,
        consumer: &str,
    ) -> redis::RedisResult<bool> {
        if self.held.as_ref().is_some_and(|(_, lost)| lost.is_lost()) {
            self.held = None;
            LEADING.store(false, Ordering::Relaxed);
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
        LEADING.store(true, Ordering::Relaxed);
        tracing::info!(
            consumer,
            "settlement worker leads: it alone reads the streams"
        );
        Ok(true)
    }

    /// Lets the lease go, so that a standby leads at its next attempt.
    pub(super) async fn release(&mut self) {
        if let Some((guard, _)) = self.held.take() {
            LEADING.store(false, Ordering::Relaxed);
            if let Err(e) = guard.release().await {
                tracing::warn!(error = %e, "releasing the settlement lease failed");
            }
        }
    }
}
