//! The periodic sweep, and the full pass it runs when Redis restarted, failed over or
//! was wiped.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use super::{Recovery, Target};
use crate::error::AppError;
use crate::lua::lua_script;

static SWEEP_MARKER: LazyLock<crate::lua::Script> = lua_script!("sweep_marker.lua");

crate::lua::reply_codes! {
    /// What `lua/sweep_marker.lua` answers, as its header lists them.
    pub enum MarkerCode in "sweep_marker.lua", checked_by marker_codes_are_the_scripts {
        Marked = 1, "marked";
        NotMarked = 0, "not marked";
    }
}

/// Sales and polls that ended longer ago than this are left out of the periodic
/// sweep's round robin (a full pass and `reconcile --repair` still cover them).
const SWEEP_RECENT_DAYS: i32 = 7;
/// Most targets a sweep tick checks when nothing says Redis lost its state: with
/// 1,000 sales of the last week, each is checked every 40 s at the default
/// 2 s tick (25 checks a second), whatever the size of the catalog.
const SWEEP_BUDGET: usize = 50;
/// Ticks a round robin over the recent targets takes when they are fewer than
/// [`SWEEP_BUDGET`] times this: each is still checked every 40 s at the default
/// tick, with fewer checks a tick (300 sales: 15 a tick, not 50).
const SWEEP_ROUND_TICKS: usize = 20;
/// Every how many sweep ticks the work dead instances left half done is looked
/// for (two Postgres queries): every 10 s at the default tick. A full pass
/// always looks.
const PENDING_EVERY_TICKS: u32 = 5;

impl Recovery {
    /// Every sale and poll, most urgent first (see [`Recovery::targets`]): what a
    /// restart, a failover or a wipe left missing or untrusted is rebuilt. When the
    /// pass saw every one whole and Redis neither restarted nor lost the marker
    /// meanwhile, the marker names this Redis run, and later sweeps check only a
    /// few targets per tick.
    pub async fn full_pass(&self) -> Result<usize, AppError> {
        let pass = crate::random::token_hex(8);
        self.marker("begin", &pass).await?;
        let targets = self.targets(None).await?;
        let (rebuilt, whole) = self.check_each(&targets, None).await?;
        if whole && self.marker("end", &pass).await? == MarkerCode::NotMarked {
            tracing::info!("Redis changed during the full sweep; the next sweep starts over");
        }
        Ok(rebuilt)
    }

    /// Finishes what instances that died left half done (see
    /// [`Restore::finish_pending`]), rebuilding where that must come first.
    async fn finish_pending_work(&self) -> Result<(), AppError> {
        for sale in self.features.sales.finish_pending(self.stores()).await? {
            self.rebuild(Target::Sale(sale), Duration::ZERO).await?;
        }
        for poll in self.features.polls.finish_pending(self.stores()).await? {
            self.rebuild(Target::Poll(poll), Duration::ZERO).await?;
        }
        Ok(())
    }

    /// `lua/sweep_marker.lua` in one of its modes.
    async fn marker(&self, mode: &str, pass: &str) -> Result<MarkerCode, AppError> {
        let code: i64 = SWEEP_MARKER
            .key(self.keys.sweep_marker())
            .arg(mode)
            .arg(pass)
            .invoke_async(&mut self.redis.clone())
            .await?;
        MarkerCode::of(code).ok_or_else(|| crate::lua::unexpected_reply("sweep_marker.lua", code))
    }
}

/// The periodic sweep (`serve` runs one, every `sweep_ms`, and once at startup in
/// the background): so that a wipe or a restart is repaired before anyone asks,
/// at a cost that does not grow with the catalog.
///
/// Each tick asks Redis one question first: does the sweep's marker
/// (`lua/sweep_marker.lua`) name the running Redis, and (on a cluster) do the
/// primaries' run ids match the last tick's? If not (a restart, a failover, a
/// wipe, a first start), the tick is a [`Recovery::full_pass`] over every sale and
/// poll, most urgent first. If so, it checks the next [`SWEEP_BUDGET`] targets of
/// those of the last [`SWEEP_RECENT_DAYS`] in turn, for state lost one key at a
/// time (an eviction, a hand-made `DEL`), which a request also repairs when it
/// meets it. Then it finishes stock changes left pending.
pub struct Sweep {
    recovery: Arc<Recovery>,
    /// The targets of the last listing, checked a budget at a time.
    queue: Vec<Target>,
    next: usize,
    /// The primaries' run ids at the last tick (`None` before the first).
    primaries: Option<Vec<String>>,
    /// Ticks since the last look for half-done work.
    since_pending: u32,
}

impl Sweep {
    pub fn new(recovery: Arc<Recovery>) -> Self {
        Sweep {
            recovery,
            queue: Vec::new(),
            next: 0,
            primaries: None,
            // The first tick looks (at startup, and with `sweep_ms` zero the only one).
            since_pending: PENDING_EVERY_TICKS,
        }
    }

    /// One tick; returns how many sales and polls were rebuilt.
    pub async fn tick(&mut self) -> Result<usize, AppError> {
        let whole = self.whole().await?;
        let rebuilt = if whole {
            self.round_robin().await?
        } else {
            let rebuilt = self.recovery.full_pass().await?;
            // The queue may name sales a full pass has just checked: start over.
            self.queue.clear();
            rebuilt
        };
        self.since_pending += 1;
        if !whole || self.since_pending >= PENDING_EVERY_TICKS {
            self.recovery.finish_pending_work().await?;
            self.since_pending = 0;
        }
        Ok(rebuilt)
    }

    /// Whether nothing says Redis lost or replaced its state since the last full
    /// pass: the marker names a running primary (on one node: this run), and no
    /// primary's run id changed. A `GET` and an `INFO server` per primary, no script.
    async fn whole(&mut self) -> Result<bool, AppError> {
        // Both at once: on one node their answers come back together.
        let mut redis = self.recovery.redis.clone();
        let marker_key = self.recovery.keys.sweep_marker();
        let get = redis::cmd("GET").arg(&marker_key).clone();
        let (marker, primaries) = tokio::join!(
            get.query_async::<Option<String>>(&mut redis),
            self.recovery.primaries()
        );
        let (marker, primaries) = (marker?, primaries?);
        // A pass in progress marks `pass:...`, never a run id.
        let marked = marker.is_some_and(|m| primaries.contains(&m));
        let same = self.primaries.as_ref().is_none_or(|p| *p == primaries);
        self.primaries = Some(primaries);
        Ok(marked && same)
    }

    async fn round_robin(&mut self) -> Result<usize, AppError> {
        if self.next >= self.queue.len() {
            self.queue = self.recovery.targets(Some(SWEEP_RECENT_DAYS)).await?;
            self.next = 0;
        }
        let budget = self
            .queue
            .len()
            .div_ceil(SWEEP_ROUND_TICKS)
            .clamp(1, SWEEP_BUDGET);
        let end = (self.next + budget).min(self.queue.len());
        let batch = self.queue[self.next..end].to_vec();
        self.next = end;
        Ok(self
            .recovery
            .check_each(&batch, self.primaries.as_deref())
            .await?
            .0)
    }
}
