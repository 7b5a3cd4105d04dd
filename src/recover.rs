//! Rebuilding a sale's or a poll's Redis state from Postgres, the record.
//!
//! Redis state can be missing (a wipe, a new empty server) or untrusted: every state
//! is stamped with the run id of the Redis process that created or last rebuilt it
//! (`lua/lib/run.lua`), and a restart, a failover or a restore changes that run id.
//! With `appendfsync everysec` a restart may have lost the last second of writes:
//! 202s that Redis forgot, some of them already settled into Postgres. Deciding on
//! such state would sell a second unit to a buyer Redis forgot, or more units than
//! the sale has. So the decision scripts answer "not loaded" or "recovering" for
//! such state, the HTTP layer answers 503 `recovering` with `Retry-After`, and this
//! module rebuilds:
//!
//! 1. take the sale's lock (one instance at a time; the others keep answering 503)
//!    and its Postgres row lock (stock changes and other rebuilds wait);
//! 2. fence it in Redis (`lua/fence.lua`): decisions stop, a token marks the rebuild;
//! 3. read what Redis still has (unsettled stream entries, pending orders, the
//!    buyers set), then what Postgres has (settled orders). In this order: an entry
//!    the settlement worker moves meanwhile is still seen in one of the two, because
//!    it deletes a stream entry only after the commit;
//! 4. add every buyer to the buyers set, then `lua/restore_sale.lua` sets units left
//!    to `stock_total - buyers`, writes the window and stamps this run, atomically
//!    and only if the token survived (a second wipe mid-way means: start over);
//! 5. apply the stock changes still pending in Postgres.
//!
//! A poll is rebuilt the same way: voters from the stream, the voters hash and the
//! `votes` table; tallies counted from that union.
//!
//! Triggers: a decision that meets such state ([`Recovery::trigger`], in the
//! background), the [`Sweep`] that `serve` runs at startup and every couple of
//! seconds (so a wiped Redis is restored before anyone asks, at an idle cost that
//! does not grow with the catalog), and `reconcile --repair`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use crate::redis_conn::Redis;
use serde::Serialize;
use sqlx::PgPool;

use crate::domain::{Id, PollId, SaleId};
use crate::error::{AppError, ErrorCode};
use crate::keys::Keys;
use crate::lock::Lock;
use crate::lua::{lua_script, unexpected_reply};
use crate::metrics::Metrics;
use crate::sale::stock::{self, ChangeResult};
use crate::sale::store::{self as sales, SaleRow};
use crate::settle::ensure_group;

static FENCE: LazyLock<crate::lua::Script> = lua_script!("fence.lua");
static RESTORE_SALE: LazyLock<crate::lua::Script> = lua_script!("restore_sale.lua");
static RESTORE_POLL: LazyLock<crate::lua::Script> = lua_script!("restore_poll.lua");
static CHECK_STATE: LazyLock<crate::lua::Script> = lua_script!("check_state.lua");
static SWEEP_MARKER: LazyLock<crate::lua::Script> = lua_script!("sweep_marker.lua");

/// Lease of a rebuild's lock; a watchdog extends it while the rebuild runs.
const LOCK_TTL_MS: u64 = 10_000;
/// Lifetime of the fence token: a rebuild that died leaves the sale fenced at most
/// this long before the token is gone and any rebuild may start over.
const TOKEN_TTL_MS: u64 = 120_000;
/// Items per Redis command when reading or writing large sets.
const CHUNK: usize = 1000;
/// Sales and polls that ended longer ago than this are left out of the periodic
/// sweep's round robin (a full pass and `reconcile --repair` still cover them).
const SWEEP_RECENT_DAYS: i32 = 7;
/// Targets a sweep tick checks when nothing says Redis lost its state: with
/// 1,000 sales of the last week, each is checked every 40 s at the default
/// 2 s tick (25 checks a second), whatever the size of the catalog.
const SWEEP_BUDGET: usize = 50;
/// Stock changes still pending after this long are finished by the sweep.
const STALE_CHANGE_MS: i64 = 2_000;

/// What can be rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    Sale(SaleId),
    Poll(PollId),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Sale(id) => write!(f, "sale:{id}"),
            Target::Poll(id) => write!(f, "poll:{id}"),
        }
    }
}

/// What one rebuild found and wrote.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Rebuilt {
    /// Buyers or voters settled in Postgres.
    pub settled: usize,
    /// Accepted orders or votes still on their way (in the stream).
    pub unsettled: usize,
    /// Buyers or voters after the rebuild (the union of everything seen).
    pub total: usize,
    /// Units left after the rebuild (sales only).
    pub stock_left: Option<i64>,
}

/// The rebuilder, shared by the HTTP handlers, the sweep and the CLI.
pub struct Recovery {
    metrics: Arc<Metrics>,
    db: PgPool,
    redis: Redis,
    keys: Keys,
    /// Rebuilds started by this process and not finished: a storm of requests on a
    /// fenced sale starts one task, not thousands. A std mutex: held for a set
    /// insert or remove, never across an await.
    in_flight: Mutex<HashSet<Target>>,
}

/// How a sale's or poll's Redis state stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateCheck {
    Trusted,
    NotLoaded,
    Untrusted,
}

impl Recovery {
    pub fn new(db: PgPool, redis: Redis, keys: Keys, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Recovery {
            metrics,
            db,
            redis,
            keys,
            in_flight: Mutex::new(HashSet::new()),
        })
    }

    /// Starts a rebuild in the background unless this process already runs one for
    /// the target. Another instance holding the lock means it is rebuilding: this
    /// one then does nothing, and its callers keep answering 503 until it is done.
    pub fn trigger(self: &Arc<Self>, target: Target) {
        {
            let mut in_flight = self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !in_flight.insert(target) {
                return;
            }
        }
        let this = self.clone();
        tokio::spawn(async move {
            match this.rebuild(target, Duration::ZERO).await {
                Ok(Some(done)) => {
                    tracing::warn!(%target, ?done, "rebuilt from Postgres")
                }
                Ok(None) => tracing::debug!(%target, "another instance is rebuilding"),
                Err(e) => tracing::warn!(%target, error = ?e, "rebuild failed; will retry"),
            }
            this.in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&target);
        });
    }

    /// Rebuilds now, waiting up to `wait` for another instance's rebuild to finish.
    /// `Ok(None)` when the lock stayed taken, or when Postgres has no such target.
    pub async fn rebuild(
        &self,
        target: Target,
        wait: Duration,
    ) -> Result<Option<Rebuilt>, AppError> {
        let key = self.keys.lock(&format!("rebuild:{target}"));
        let Some(mut guard) = Lock::acquire(&self.redis, key, LOCK_TTL_MS, wait).await? else {
            return Ok(None);
        };
        let lost = guard.start_watchdog();
        let result = match target {
            Target::Sale(id) => self.rebuild_sale(id).await,
            Target::Poll(id) => self.rebuild_poll(id).await,
        };
        if matches!(result, Ok(Some(_))) {
            Metrics::inc(&self.metrics.rebuilds);
        }
        if lost.is_lost() {
            tracing::warn!(%target, "rebuild lock lost while rebuilding; the fence token decides");
        }
        if let Err(e) = guard.release().await {
            tracing::warn!(error = %e, "releasing the rebuild lock failed; it expires on its own");
        }
        result
    }

    /// Whether Redis holds the target's state, trusted by the running Redis.
    pub async fn check(&self, target: Target) -> Result<StateCheck, AppError> {
        let (meta, must_have) = match target {
            Target::Sale(id) => {
                let k = self.keys.sale(id);
                (k.meta, k.stock)
            }
            Target::Poll(id) => {
                let k = self.keys.poll(id);
                (k.meta, k.options)
            }
        };
        let code: i64 = CHECK_STATE
            .key(meta)
            .key(must_have)
            .invoke_async(&mut self.redis.clone())
            .await?;
        match code {
            0 => Ok(StateCheck::Trusted),
            4 => Ok(StateCheck::NotLoaded),
            6 => Ok(StateCheck::Untrusted),
            other => Err(unexpected_reply("check_state.lua", other)),
        }
    }

    /// Every sale and poll (all of them, or those of the last `days`), most urgent
    /// first: open ones, then upcoming ones, then the ended ones, the most recently
    /// ended first. After a restart the shop's live sales are whole again before
    /// the archive of past ones is touched.
    pub async fn targets(&self, days: Option<i32>) -> Result<Vec<Target>, AppError> {
        type Row = (i64, i32, chrono::DateTime<chrono::Utc>);
        let sales: Vec<Row> = sqlx::query_as(
            "SELECT id, CASE WHEN closed OR ends_at <= now() THEN 2
                             WHEN starts_at > now() THEN 1 ELSE 0 END, ends_at
             FROM sales
             WHERE $1::int IS NULL OR ends_at > now() - make_interval(days => $1)",
        )
        .bind(days)
        .fetch_all(&self.db)
        .await?;
        let polls: Vec<Row> = sqlx::query_as(
            "SELECT id, CASE WHEN closed OR closes_at <= now() THEN 2
                             WHEN opens_at > now() THEN 1 ELSE 0 END, closes_at
             FROM polls
             WHERE $1::int IS NULL OR closes_at > now() - make_interval(days => $1)",
        )
        .bind(days)
        .fetch_all(&self.db)
        .await?;
        let mut ranked: Vec<(
            i32,
            std::cmp::Reverse<chrono::DateTime<chrono::Utc>>,
            Target,
        )> = sales
            .into_iter()
            .filter_map(|(id, rank, end)| {
                Some((rank, std::cmp::Reverse(end), Target::Sale(Id::new(id)?)))
            })
            .chain(polls.into_iter().filter_map(|(id, rank, end)| {
                Some((rank, std::cmp::Reverse(end), Target::Poll(Id::new(id)?)))
            }))
            .collect();
        ranked.sort_by_key(|(rank, end, _)| (*rank, *end));
        Ok(ranked.into_iter().map(|(_, _, target)| target).collect())
    }

    /// Checks each target and rebuilds what is missing or untrusted. Returns how
    /// many were rebuilt, and whether every one was found or left trusted (a
    /// rebuild that failed, or that another instance holds, leaves it unsure).
    async fn check_each(&self, targets: &[Target]) -> Result<(usize, bool), AppError> {
        let mut rebuilt = 0;
        let mut whole = true;
        for &target in targets {
            if self.check(target).await? == StateCheck::Trusted {
                continue;
            }
            // One target's failure must not keep the others waiting.
            match self.rebuild(target, Duration::ZERO).await {
                Ok(Some(done)) => {
                    rebuilt += 1;
                    tracing::warn!(%target, ?done, "rebuilt from Postgres");
                }
                Ok(None) => whole = false,
                Err(e) => {
                    whole = false;
                    tracing::warn!(%target, error = ?e, "rebuild failed; will retry");
                }
            }
        }
        Ok((rebuilt, whole))
    }

    /// Every sale and poll, most urgent first (see [`Recovery::targets`]): what a
    /// restart, a failover or a wipe left missing or untrusted is rebuilt. When the
    /// pass saw every one whole and Redis neither restarted nor lost the marker
    /// meanwhile, the marker names this Redis run, and later sweeps check only a
    /// few targets per tick.
    pub async fn full_pass(&self) -> Result<usize, AppError> {
        let pass = crate::random::token_hex(8);
        self.marker("begin", &pass).await?;
        let targets = self.targets(None).await?;
        let (rebuilt, whole) = self.check_each(&targets).await?;
        if whole && self.marker("end", &pass).await? == 0 {
            tracing::info!("Redis changed during the full sweep; the next sweep starts over");
        }
        Ok(rebuilt)
    }

    /// Finishes stock changes left pending in Postgres by an instance that died
    /// between its commit and Redis.
    async fn finish_pending_changes(&self) -> Result<(), AppError> {
        for sale in stock::sales_with_pending_changes(&self.db, STALE_CHANGE_MS).await? {
            let results =
                stock::apply_pending(&self.db, &mut self.redis.clone(), &self.keys, sale).await?;
            if results.iter().any(|(_, r)| *r == ChangeResult::Deferred) {
                self.rebuild(Target::Sale(sale), Duration::ZERO).await?;
            }
        }
        Ok(())
    }

    /// `lua/sweep_marker.lua` in one of its modes.
    async fn marker(&self, mode: &str, pass: &str) -> Result<i64, AppError> {
        Ok(SWEEP_MARKER
            .key(self.keys.sweep_marker())
            .arg(mode)
            .arg(pass)
            .invoke_async(&mut self.redis.clone())
            .await?)
    }

    /// The run ids of every primary (one on a single node), sorted.
    async fn primaries(&self) -> Result<Vec<String>, AppError> {
        let answers = self
            .redis
            .clone()
            .on_every_primary(redis::cmd("INFO").arg("server"))
            .await?;
        let mut runs: Vec<String> = answers
            .into_iter()
            .filter_map(|(_, v)| redis::from_redis_value::<String>(v).ok())
            .filter_map(|info| {
                info.lines()
                    .find_map(|l| l.strip_prefix("run_id:"))
                    .map(|r| r.trim().to_string())
            })
            .collect();
        runs.sort();
        Ok(runs)
    }

    async fn rebuild_sale(&self, id: SaleId) -> Result<Option<Rebuilt>, AppError> {
        let mut redis = self.redis.clone();
        let k = self.keys.sale(id);
        let mut tx = self.db.begin().await?;
        // The row lock: stock changes and window changes of this sale wait for us.
        let Some(sale) = sqlx::query_as::<_, SaleRow>(concat!(
            "SELECT ",
            sales::sale_columns!(),
            " FROM sales WHERE id = $1 FOR UPDATE"
        ))
        .bind(id.get())
        .fetch_optional(&mut *tx)
        .await?
        else {
            return Ok(None);
        };
        let token = fence(&mut redis, &k.meta, &k.rebuild).await?;

        let seen = read_sale(&mut redis, &mut tx, &k, &sale).await?;
        let missing: Vec<i64> = seen.buyers.difference(&seen.known).copied().collect();
        for chunk in missing.chunks(CHUNK) {
            let _: i64 = redis::cmd("SADD")
                .arg(&k.buyers)
                .arg(chunk)
                .query_async(&mut redis)
                .await?;
        }
        let folded = if sale.rebuy_after_expiry {
            release_expired(&mut tx, &mut redis, &k.buyers, id, &seen).await?
        } else {
            Vec::new()
        };
        if sale.max_per_user > 1 {
            restore_units(&mut redis, &k, &seen).await?;
        }
        let (left, sold): (i64, i64) = RESTORE_SALE
            .key(&k.meta)
            .key(&k.stock)
            .key(&k.buyers)
            .key(&k.changes)
            .key(&k.rebuild)
            .key(&k.sold)
            .arg(&token)
            .arg(sale.starts_at.timestamp_millis())
            .arg(sale.ends_at.timestamp_millis())
            .arg(u8::from(sale.closed))
            .arg(sale.stock_total)
            .arg(sale.max_per_user)
            .arg(&folded)
            .invoke_async(&mut redis)
            .await?;
        if left < 0 {
            tracing::warn!(sale = %id, "Redis lost the rebuild token (wiped or restarted again)");
            return Err(interrupted());
        }
        if sold > sale.stock_total {
            // Only possible when writes were lost before this rebuild existed.
            tracing::error!(sale = %id, sold, stock_total = sale.stock_total, "more buyers than units");
        }
        ensure_group(&mut redis, &k.orders).await?;
        stock::apply_pending_locked(&mut tx, &mut redis, &self.keys, id).await?;
        let stock_left: Option<i64> = redis::cmd("GET")
            .arg(&k.stock)
            .query_async(&mut redis)
            .await?;
        tx.commit().await?;
        Ok(Some(Rebuilt {
            settled: seen.orders.iter().filter(|o| o.holds).count(),
            unsettled: seen.unsettled.len(),
            total: sold as usize,
            stock_left,
        }))
    }

    async fn rebuild_poll(&self, id: PollId) -> Result<Option<Rebuilt>, AppError> {
        let mut redis = self.redis.clone();
        let k = self.keys.poll(id);
        let mut tx = self.db.begin().await?;
        let Some((opens_at, closes_at, closed)) =
            sqlx::query_as::<
                _,
                (
                    chrono::DateTime<chrono::Utc>,
                    chrono::DateTime<chrono::Utc>,
                    bool,
                ),
            >("SELECT opens_at, closes_at, closed FROM polls WHERE id = $1 FOR UPDATE")
            .bind(id.get())
            .fetch_optional(&mut *tx)
            .await?
        else {
            return Ok(None);
        };
        let options: Vec<i64> =
            sqlx::query_scalar("SELECT id FROM poll_options WHERE poll_id = $1 ORDER BY position")
                .bind(id.get())
                .fetch_all(&mut *tx)
                .await?;
        let token = fence(&mut redis, &k.meta, &k.rebuild).await?;

        // Later sources win: what Redis knew, then the stream, then the record.
        let mut voters: HashMap<i64, i64> = scan_all(&mut redis, "HSCAN", &k.voters)
            .await?
            .into_iter()
            .collect();
        let unsettled = stream_field(&mut redis, &k.votes, "option_id").await?;
        voters.extend(unsettled.iter().copied());
        let settled: Vec<(i64, i64)> =
            sqlx::query_as("SELECT user_id, option_id FROM votes WHERE poll_id = $1")
                .bind(id.get())
                .fetch_all(&mut *tx)
                .await?;
        voters.extend(settled.iter().copied());
        let pairs: Vec<(i64, i64)> = voters.iter().map(|(u, o)| (*u, *o)).collect();
        for chunk in pairs.chunks(CHUNK) {
            let _: i64 = redis::cmd("HSET")
                .arg(&k.voters)
                .arg(chunk)
                .query_async(&mut redis)
                .await?;
        }
        let mut counts: HashMap<i64, i64> = HashMap::new();
        for option in voters.values() {
            *counts.entry(*option).or_default() += 1;
        }
        let mut restore = RESTORE_POLL.prepare_invoke();
        restore
            .key(&k.meta)
            .key(&k.options)
            .key(&k.tally)
            .key(&k.rebuild)
            .arg(&token)
            .arg(opens_at.timestamp_millis())
            .arg(closes_at.timestamp_millis())
            .arg(u8::from(closed))
            .arg(options.len());
        for option in &options {
            restore.arg(option);
        }
        for option in &options {
            restore.arg(counts.get(option).copied().unwrap_or(0));
        }
        let written: i64 = restore.invoke_async(&mut redis).await?;
        if written < 0 {
            tracing::warn!(poll = %id, "Redis lost the rebuild token (wiped or restarted again)");
            return Err(interrupted());
        }
        ensure_group(&mut redis, &k.votes).await?;
        tx.commit().await?;
        Ok(Some(Rebuilt {
            settled: settled.len(),
            unsettled: unsettled.len(),
            total: voters.len(),
            stock_left: None,
        }))
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
}

impl Sweep {
    pub fn new(recovery: Arc<Recovery>) -> Self {
        Sweep {
            recovery,
            queue: Vec::new(),
            next: 0,
            primaries: None,
        }
    }

    /// One tick; returns how many sales and polls were rebuilt.
    pub async fn tick(&mut self) -> Result<usize, AppError> {
        let rebuilt = if self.whole().await? {
            self.round_robin().await?
        } else {
            let rebuilt = self.recovery.full_pass().await?;
            // The queue may name sales a full pass has just checked: start over.
            self.queue.clear();
            rebuilt
        };
        self.recovery.finish_pending_changes().await?;
        Ok(rebuilt)
    }

    /// Whether nothing says Redis lost or replaced its state since the last full
    /// pass: the marker names this run, and no primary's run id changed.
    async fn whole(&mut self) -> Result<bool, AppError> {
        let marked = self.recovery.marker("check", "").await? == 1;
        let primaries = self.recovery.primaries().await?;
        let same = self.primaries.as_ref().is_none_or(|p| *p == primaries);
        self.primaries = Some(primaries);
        Ok(marked && same)
    }

    async fn round_robin(&mut self) -> Result<usize, AppError> {
        if self.next >= self.queue.len() {
            self.queue = self.recovery.targets(Some(SWEEP_RECENT_DAYS)).await?;
            self.next = 0;
        }
        let end = (self.next + SWEEP_BUDGET).min(self.queue.len());
        let batch = self.queue[self.next..end].to_vec();
        self.next = end;
        Ok(self.recovery.check_each(&batch).await?.0)
    }
}

/// On a sale whose expired buyers may buy again: buyers whose only orders expired
/// leave the buyers set (a lost `SREM` of their return), and returns still pending
/// are recorded as applied, since units left are counted from this set next (the
/// unit is back by construction; applying the return again would count it twice).
/// Returns their change ids: `restore_sale.lua` remembers them as applied in Redis
/// too, so that if this rebuild's transaction never commits, applying them later
/// changes nothing. The caller holds the sale's row lock, so no expiry commits
/// between its read of the orders and this.
async fn release_expired(
    tx: &mut sqlx::PgConnection,
    redis: &mut Redis,
    buyers_key: &str,
    id: SaleId,
    seen: &SaleSeen,
) -> Result<Vec<i64>, AppError> {
    let gone: Vec<i64> = seen
        .orders
        .iter()
        .filter(|o| !o.holds && seen.known.contains(&o.user) && !seen.buyers.contains(&o.user))
        .map(|o| o.user)
        .collect::<HashSet<i64>>()
        .into_iter()
        .collect();
    for chunk in gone.chunks(CHUNK) {
        let _: i64 = redis::cmd("SREM")
            .arg(buyers_key)
            .arg(chunk)
            .query_async(&mut *redis)
            .await?;
    }
    Ok(sqlx::query_scalar(
        "UPDATE stock_changes SET status = 'applied', delta = 0, applied_at = now()
         WHERE sale_id = $1 AND kind = 'return' AND status = 'pending' RETURNING id",
    )
    .bind(id.get())
    .fetch_all(&mut *tx)
    .await?)
}

/// One order of a sale as its rebuild reads it from Postgres.
struct SeenOrder {
    id: uuid::Uuid,
    user: i64,
    units: i64,
    /// It holds its units: not expired, or expired on a sale whose expired buyers
    /// stay buyers.
    holds: bool,
}

/// What a sale's rebuild reads, Redis first and Postgres second (see the module doc).
struct SaleSeen {
    /// Orders in Postgres.
    orders: Vec<SeenOrder>,
    /// Orders in the stream that Postgres does not have yet: order, user, units.
    /// (An entry left behind by a worker that died after its commit is Postgres's.)
    unsettled: Vec<(uuid::Uuid, i64, i64)>,
    /// The buyers set as Redis has it.
    known: HashSet<i64>,
    /// Users holding units: of the orders that hold theirs, of the unsettled ones,
    /// and of pending orders Postgres does not have.
    buyers: HashSet<i64>,
}

async fn read_sale(
    redis: &mut Redis,
    tx: &mut sqlx::PgConnection,
    k: &crate::keys::SaleKeys,
    sale: &SaleRow,
) -> Result<SaleSeen, AppError> {
    let stream = stream_orders(redis, &k.orders).await?;
    let pending: Vec<(String, i64)> = scan_all(redis, "HSCAN", &k.pending).await?;
    let known: HashSet<i64> = scan_all(redis, "SSCAN", &k.buyers)
        .await?
        .into_iter()
        .collect();
    let rows: Vec<(uuid::Uuid, i64, i32, bool)> = sqlx::query_as(
        "SELECT id, user_id, quantity, (status <> 'expired' OR NOT $2) FROM orders WHERE sale_id = $1",
    )
    .bind(sale.id)
    .bind(sale.rebuy_after_expiry)
    .fetch_all(&mut *tx)
    .await?;
    let orders: Vec<SeenOrder> = rows
        .into_iter()
        .map(|(id, user, units, holds)| SeenOrder {
            id,
            user,
            units: i64::from(units),
            holds,
        })
        .collect();
    let in_pg: HashSet<uuid::Uuid> = orders.iter().map(|o| o.id).collect();
    let unsettled: Vec<(uuid::Uuid, i64, i64)> = stream
        .into_iter()
        .filter(|(order, _, _)| !in_pg.contains(order))
        .collect();
    let mut buyers: HashSet<i64> = orders.iter().filter(|o| o.holds).map(|o| o.user).collect();
    buyers.extend(unsettled.iter().map(|(_, user, _)| *user));
    buyers.extend(
        pending
            .iter()
            .filter(|(order, _)| uuid::Uuid::parse_str(order).map_or(true, |o| !in_pg.contains(&o)))
            .map(|(_, user)| *user),
    );
    Ok(SaleSeen {
        orders,
        unsettled,
        known,
        buyers,
    })
}

/// On a sale of more than one per customer: units per buyer and units sold, counted
/// from the orders that hold units in Postgres and the unsettled ones, written over
/// what Redis had. Then units left are units ever offered minus units sold.
async fn restore_units(
    redis: &mut Redis,
    k: &crate::keys::SaleKeys,
    seen: &SaleSeen,
) -> Result<(), AppError> {
    let mut units: HashMap<i64, i64> = HashMap::new();
    for o in seen.orders.iter().filter(|o| o.holds) {
        *units.entry(o.user).or_default() += o.units;
    }
    for (_, user, n) in &seen.unsettled {
        *units.entry(*user).or_default() += n;
    }
    let sold: i64 = units.values().sum();
    let _: () = redis::cmd("DEL")
        .arg(&k.units)
        .query_async(&mut *redis)
        .await?;
    let flat: Vec<i64> = units.iter().flat_map(|(u, n)| [*u, *n]).collect();
    for chunk in flat.chunks(2 * CHUNK) {
        let _: i64 = redis::cmd("HSET")
            .arg(&k.units)
            .arg(chunk)
            .query_async(&mut *redis)
            .await?;
    }
    let _: () = redis::cmd("SET")
        .arg(&k.sold)
        .arg(sold)
        .query_async(&mut *redis)
        .await?;
    Ok(())
}

/// The orders in a sale's stream: order id, user, units.
async fn stream_orders(
    redis: &mut Redis,
    stream: &str,
) -> Result<Vec<(uuid::Uuid, i64, i64)>, AppError> {
    let mut out = Vec::new();
    each_entry(redis, stream, |entry| {
        let order = entry
            .get::<String>("order_id")
            .and_then(|o| uuid::Uuid::parse_str(&o).ok());
        if let (Some(order), Some(user)) = (order, entry.get::<i64>("user_id")) {
            out.push((order, user, entry.get::<i64>("quantity").unwrap_or(1)));
        }
    })
    .await?;
    Ok(out)
}

/// Stops decisions on a sale or poll (`lua/fence.lua`) and returns the token its
/// restore script must find, or start over.
async fn fence(redis: &mut Redis, meta: &str, rebuild: &str) -> Result<String, AppError> {
    let token = crate::random::token_hex(16);
    let _: i64 = FENCE
        .key(meta)
        .key(rebuild)
        .arg(&token)
        .arg(TOKEN_TTL_MS)
        .invoke_async(redis)
        .await?;
    Ok(token)
}

/// A rebuild cut short because Redis lost its state again meanwhile: not a bug, an
/// outage; the next rebuild starts over.
fn interrupted() -> AppError {
    AppError::new(
        ErrorCode::Recovering,
        "Redis lost its data again while it was being restored; try again in a moment",
    )
}

/// `(user_id, <field>)` of every entry of a stream, read in chunks.
async fn stream_field(
    redis: &mut Redis,
    stream: &str,
    field: &str,
) -> Result<Vec<(i64, i64)>, AppError> {
    let mut out = Vec::new();
    each_entry(redis, stream, |entry| {
        if let (Some(user), Some(value)) = (entry.get::<i64>("user_id"), entry.get::<i64>(field)) {
            out.push((user, value));
        }
    })
    .await?;
    Ok(out)
}

/// Calls `f` on every entry of the stream, oldest first, `CHUNK` per read.
async fn each_entry(
    redis: &mut Redis,
    stream: &str,
    mut f: impl FnMut(&redis::streams::StreamId),
) -> Result<(), AppError> {
    let mut start = "-".to_string();
    loop {
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(stream)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(CHUNK)
            .query_async(redis)
            .await?;
        let n = reply.ids.len();
        reply.ids.iter().for_each(&mut f);
        match reply.ids.last() {
            Some(last) if n == CHUNK => start = format!("({}", last.id),
            _ => return Ok(()),
        }
    }
}

/// Every item of a set (`SSCAN`) or every field-value pair of a hash (`HSCAN`, with
/// `T` a pair), read in chunks so that a large sale never blocks Redis.
async fn scan_all<T: redis::FromRedisValue>(
    redis: &mut Redis,
    command: &str,
    key: &str,
) -> Result<Vec<T>, AppError> {
    let mut out = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, items): (u64, Vec<T>) = redis::cmd(command)
            .arg(key)
            .arg(cursor)
            .arg("COUNT")
            .arg(CHUNK)
            .query_async(redis)
            .await?;
        out.extend(items);
        if next == 0 {
            return Ok(out);
        }
        cursor = next;
    }
}

impl Recovery {
    /// The answer to a request that met missing or untrusted state of a target that
    /// exists in Postgres: starts the rebuild (once) and answers 503 `recovering`.
    pub fn recovering(self: &Arc<Self>, target: Target) -> AppError {
        self.trigger(target);
        let what = match target {
            Target::Sale(_) => "sale",
            Target::Poll(_) => "poll",
        };
        AppError::new(
            ErrorCode::Recovering,
            format!(
                "this {what} is being restored from the record after a Redis restart or data \
                 loss; try again in a moment"
            ),
        )
        .with_header(
            actix_web::http::header::RETRY_AFTER,
            crate::error::RETRY_AFTER_OUTAGE_SECS.to_string(),
        )
    }
}
