//! The background work of `serve`, each a loop that stops with the server: the
//! sweep, the expiry of unpaid orders, the metrics upkeep.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use actix_web::web;
use tokio::sync::watch;

use crate::error::AppError;
use crate::lock::Lock;
use crate::recover::Recovery;
use crate::sale::stock::ChangeResult;
use crate::state::AppState;

/// The startup sweep at once, then a sweep tick every `every` (see
/// [`crate::recover::sweep::Sweep`]): a wipe or a restart is repaired within about that
/// time even when no request comes. Zero: only the startup sweep (requests still
/// trigger rebuilds). `swept` turns true after the startup sweep.
pub(super) async fn sweep_forever(
    recovery: Arc<Recovery>,
    every: Duration,
    shutdown: watch::Receiver<bool>,
    swept: watch::Sender<bool>,
) {
    // Before the first sweep (a rebuild folds a sale's set itself; a trusted sale
    // is not rebuilt), and at each tick until it once succeeds.
    let folded = std::sync::atomic::AtomicBool::new(fold_legacy(&recovery).await);
    let sweep = tokio::sync::Mutex::new(crate::recover::sweep::Sweep::new(recovery.clone()));
    match sweep.lock().await.tick().await {
        Ok(0) => {}
        Ok(rebuilt) => tracing::warn!(rebuilt, "sales and polls rebuilt from Postgres"),
        Err(e) => {
            tracing::warn!(error = ?e, "startup check of Redis state failed; retrying in the background")
        }
    }
    let _ = swept.send(true);
    every_until_shutdown(every, shutdown, || async {
        if !folded.load(std::sync::atomic::Ordering::Relaxed) && fold_legacy(&recovery).await {
            folded.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let mut sweep = sweep.lock().await;
        match crate::error::within("a sweep", WORK_LIMIT, sweep.tick()).await {
            Ok(0) => {}
            Ok(rebuilt) => tracing::warn!(rebuilt, "sales and polls rebuilt from Postgres"),
            Err(e) => tracing::debug!(error = ?e, "sweep of Redis state failed; retrying"),
        }
    })
    .await
}

/// [`Recovery::fold_legacy_buyers`], logged; whether it succeeded.
async fn fold_legacy(recovery: &Recovery) -> bool {
    match recovery.fold_legacy_buyers().await {
        Ok((0, _)) => true,
        Ok((sales, buyers)) => {
            tracing::info!(
                sales,
                buyers,
                "earlier buyers sets folded into the buyers hashes"
            );
            true
        }
        Err(e) => {
            tracing::warn!(error = ?e, "folding earlier buyers sets failed; retrying at the next sweep");
            false
        }
    }
}

/// Drains the metrics recorder's pending samples every
/// [`crate::metrics::observed::UPKEEP_EVERY`] while samples come, whether or not
/// anything scrapes; after an interval without one, not until the next.
pub(super) async fn upkeep_forever(
    state: web::Data<AppState>,
    mut shutdown: watch::Receiver<bool>,
) {
    while !*shutdown.borrow() {
        tokio::select! {
            _ = state.metrics.observed.until_upkeep() => {}
            _ = shutdown.changed() => break,
        }
        state.metrics.observed.upkeep();
    }
}

/// Runs `step` every `every` until `shutdown` turns true; zero: never.
async fn every_until_shutdown<F, Fut>(
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
    mut step: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    if every.is_zero() {
        return;
    }
    while !*shutdown.borrow() {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => break,
        }
        step().await;
    }
}

/// How long an expiry pass, or a sweep's tick, may wait (for Postgres, mostly)
/// before it is given up and tried again (see [`crate::error::within`]): a tick
/// rebuilds at most a few sales, each within its own limit.
const WORK_LIMIT: Duration = Duration::from_secs(300);

/// Name of the lock (see [`crate::lock`]) held during an expiry pass.
pub const EXPIRE_LOCK: &str = "orders:expire";
/// Orders expired per Postgres transaction.
const EXPIRE_BATCH: i64 = 500;
/// Lease of the expiry lock; the watchdog extends it while a pass runs, so this
/// bounds how long a pass that died holds up the next one.
const EXPIRE_LOCK_TTL_MS: u64 = 3_000;

/// On one instance at a time (the lock): expires the orders past their payment
/// deadline and gives their units back (see
/// [`crate::sale::payment::expire_pass`]). It looks when the earliest unpaid order
/// falls due, at most every `every` and at least every five `every` (5 s at most),
/// and after the settlement worker here commits a batch (new orders, perhaps with
/// a short window), not sooner than `every` after its last look. Zero: never in
/// this process.
pub(super) async fn expire_forever(
    state: web::Data<AppState>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    if every.is_zero() {
        return;
    }
    let idle = (every * 5).min(Duration::from_secs(5)).max(every);
    let wake = state.wake.expire.clone();
    let mut looked = tokio::time::Instant::now();
    let mut pause = every;
    while !*shutdown.borrow() {
        tokio::select! {
            _ = tokio::time::sleep_until(looked + pause) => {}
            _ = wake.notified() => {
                tokio::select! {
                    _ = tokio::time::sleep_until(looked + every) => {}
                    _ = shutdown.changed() => break,
                }
            }
            _ = shutdown.changed() => break,
        }
        looked = tokio::time::Instant::now();
        pause = match crate::sale::payment::expiry_next(&state.db).await {
            Ok(Some(next)) if next.is_zero() => {
                if let Err(e) = expire_locked(&state).await {
                    tracing::warn!(error = ?e, "expiry of unpaid orders failed; retrying");
                }
                every
            }
            Ok(next) => next.unwrap_or(idle).clamp(every, idle),
            Err(e) => {
                tracing::warn!(error = ?e, "expiry of unpaid orders failed; retrying");
                every
            }
        };
    }
}

/// One expiry pass under the lock, when something is due; a pass already running
/// elsewhere: nothing.
pub async fn expire_once(state: &AppState) -> Result<usize, AppError> {
    // Most looks find nothing due: asking Postgres first, without the lock, spares
    // Redis two writes (and their fsyncs). What falls due just after the question
    // is the next look's.
    if crate::sale::payment::expiry_next(&state.db).await? != Some(Duration::ZERO) {
        return Ok(0);
    }
    expire_locked(state).await
}

async fn expire_locked(state: &AppState) -> Result<usize, AppError> {
    let key = state.keys.lock(EXPIRE_LOCK);
    let Some(mut guard) = Lock::try_acquire(&state.redis, key, EXPIRE_LOCK_TTL_MS).await? else {
        return Ok(0);
    };
    let _lost = guard.start_watchdog();
    let mut redis = state.redis.clone();
    let pass = crate::sale::payment::expire_pass(&state.db, &mut redis, &state.keys, EXPIRE_BATCH);
    let pass = crate::error::within("an expiry pass", WORK_LIMIT, pass).await;
    let _ = guard.release().await;
    let pass = pass?;
    for (sale, results) in &pass.applied {
        crate::sale::cached::invalidate(state, *sale).await?;
        if results
            .iter()
            .any(|(_, r)| matches!(r, ChangeResult::Applied { left, .. } if *left > 0))
        {
            state.sold_out.clear(*sale);
        }
    }
    if pass.expired > 0 {
        tracing::info!(
            expired = pass.expired,
            sales = pass.applied.len(),
            "unpaid orders expired; units returned"
        );
    }
    Ok(pass.expired)
}
