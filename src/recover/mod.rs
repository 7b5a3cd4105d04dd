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
//! module drives the rebuild. It holds the mechanism and knows no table; each
//! feature implements [`crate::restore::Restore`] (`sale/rebuild.rs`,
//! `vote/rebuild.rs`), handed in as [`Features`]:
//!
//! 1. the driver takes the target's lock (one instance at a time; the others keep
//!    answering 503), with a watchdog;
//! 2. the feature takes its Postgres row lock (stock changes and other rebuilds
//!    wait), fences the state in Redis (`lua/fence.lua`: decisions stop, a token
//!    marks the rebuild), reads what Redis still has, then what Postgres has, and
//!    restores it with a script that stamps this run atomically and only if the
//!    token survived (a second wipe mid-way means: start over);
//! 3. the driver counts it and releases the lock.
//!
//! Triggers: a decision that meets such state ([`Recovery::trigger`], in the
//! background), the [`sweep::Sweep`] that `serve` runs at startup and every couple of
//! seconds (so a wiped Redis is restored before anyone asks, at an idle cost that
//! does not grow with the catalog), and `reconcile --repair`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::redis_conn::Redis;
use sqlx::PgPool;

use crate::domain::{PollId, SaleId};
use crate::error::{AppError, ErrorCode};
use crate::keys::Keys;
use crate::lock::Lock;
use crate::lua::unexpected_reply;
use crate::metrics::Metrics;
pub use crate::restore::Rebuilt;
use crate::restore::{Listed, Restore, Stores};

pub mod sweep;

/// Lease of a rebuild's lock; a watchdog extends it while the rebuild runs.
const LOCK_TTL_MS: u64 = 10_000;

/// How long one rebuild may take before it is given up (see [`Recovery::rebuild`]):
/// far more than a sale of a million orders needs, far less than for ever.
const REBUILD_LIMIT: Duration = Duration::from_secs(120);
/// Checks sent to Redis in one pipelined round trip (see [`Recovery::check_many`]);
/// a full pass over 30,000 sales sends 118 of them, each followed by the rebuilds
/// its answers asked for, most urgent first.
const CHECK_CHUNK: usize = 256;

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

/// The features whose state the driver rebuilds (`sale/rebuild.rs`,
/// `vote/rebuild.rs`), handed in by whoever builds the [`Recovery`].
pub struct Features {
    pub sales: Arc<dyn Restore<Id = SaleId>>,
    pub polls: Arc<dyn Restore<Id = PollId>>,
}

/// The rebuilder, shared by the HTTP handlers, the sweep and the CLI.
pub struct Recovery {
    metrics: Arc<Metrics>,
    db: PgPool,
    redis: Redis,
    keys: Keys,
    features: Features,
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
    pub fn new(
        db: PgPool,
        redis: Redis,
        keys: Keys,
        metrics: Arc<Metrics>,
        features: Features,
    ) -> Arc<Self> {
        Arc::new(Recovery {
            metrics,
            db,
            redis,
            keys,
            features,
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

    /// Folds every sale's buyers hash of an earlier version into its buyers hash
    /// ([`crate::sale::legacy::fold_all`]): (sales folded, buyers moved).
    pub async fn fold_legacy_buyers(&self) -> Result<(u64, u64), AppError> {
        crate::sale::legacy::fold_all(&self.db, &mut self.redis.clone(), &self.keys).await
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
        let stores = self.stores();
        let rebuilt = async {
            match target {
                Target::Sale(id) => self.features.sales.rebuild(stores, id).await,
                Target::Poll(id) => self.features.polls.rebuild(stores, id).await,
            }
        };
        // A link to Postgres that died without a reset never answers: given up
        // here, its connections are closed (see `startup::connect`) and the next
        // rebuild starts afresh, instead of this one holding the lock, and the sale
        // in `recovering`, for ever. Dropped, it writes nothing more; the next
        // rebuild writes the whole state again.
        let result = crate::error::within("a rebuild", REBUILD_LIMIT, rebuilt).await;
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

    /// A target's meta hash, and the key its state cannot be without.
    fn state_keys(&self, target: Target) -> (String, String) {
        match target {
            Target::Sale(id) => self.features.sales.state_keys(&self.keys, id),
            Target::Poll(id) => self.features.polls.state_keys(&self.keys, id),
        }
    }

    /// Whether each of `targets` has its Redis state, and trusts it: the run ids of
    /// the primaries (`INFO server`), then each target's meta `run` field and
    /// whether its two keys exist, all in one pipelined round trip (on a cluster:
    /// every command in flight at once). An idle server's sweep wakes Redis twice a
    /// tick, not once a target, and costs it a hash read and two `EXISTS` a target
    /// instead of a script run with an `INFO` in it.
    ///
    /// Not atomic, unlike the script: a sweep's answer is a reason to rebuild, and
    /// a rebuild decides again under its lock. On a cluster a stamp is trusted when
    /// it names any primary now (a slot moved whole by resharding keeps its old
    /// primary's stamp; the request path, which compares with its own node, rebuilds
    /// it when it meets it).
    pub async fn check_many(&self, targets: &[Target]) -> Result<Vec<StateCheck>, AppError> {
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        let runs = self.primaries().await?;
        self.check_against(targets, &runs).await
    }

    /// [`Recovery::check_many`] with the primaries' run ids already read (the
    /// sweep's tick has just read them).
    async fn check_against(
        &self,
        targets: &[Target],
        runs: &[String],
    ) -> Result<Vec<StateCheck>, AppError> {
        let mut pipe = redis::pipe();
        for &target in targets {
            let (meta, must_have) = self.state_keys(target);
            pipe.hget(&meta, "run").exists(&meta).exists(&must_have);
        }
        // A flat reply, three answers a target, read three at a time.
        let replies: Vec<(Option<String>, bool, bool)> =
            pipe.query_async(&mut self.redis.clone()).await?;
        if replies.len() != targets.len() {
            return Err(unexpected_reply("the sweep's checks", replies.len()));
        }
        Ok(replies
            .into_iter()
            .map(|(stamp, meta, must_have)| match (meta, stamp, must_have) {
                (false, _, _) => StateCheck::NotLoaded,
                (true, Some(stamp), true) if runs.contains(&stamp) => StateCheck::Trusted,
                _ => StateCheck::Untrusted,
            })
            .collect())
    }

    /// Every sale and poll (all of them, or those of the last `days`), most urgent
    /// first: open ones, then upcoming ones, then the ended ones, the most recently
    /// ended first. After a restart the shop's live sales are whole again before
    /// the archive of past ones is touched.
    pub async fn targets(&self, days: Option<i32>) -> Result<Vec<Target>, AppError> {
        fn ranked<I>(
            listed: Vec<Listed<I>>,
            target: impl Fn(I) -> Target,
        ) -> impl Iterator<Item = (Listed<()>, Target)> {
            listed.into_iter().map(move |l| {
                let key = Listed {
                    id: (),
                    urgency: l.urgency,
                    ends_at: l.ends_at,
                };
                (key, target(l.id))
            })
        }
        let sales = self.features.sales.list(&self.db, days).await?;
        let polls = self.features.polls.list(&self.db, days).await?;
        let mut all: Vec<(Listed<()>, Target)> = ranked(sales, Target::Sale)
            .chain(ranked(polls, Target::Poll))
            .collect();
        all.sort_by_key(|(l, _)| (l.urgency, std::cmp::Reverse(l.ends_at)));
        Ok(all.into_iter().map(|(_, target)| target).collect())
    }

    fn stores(&self) -> Stores<'_> {
        Stores {
            db: &self.db,
            redis: &self.redis,
            keys: &self.keys,
        }
    }

    /// Checks each target and rebuilds what is missing or untrusted. Returns how
    /// many were rebuilt, and whether every one was found or left trusted (a
    /// rebuild that failed, or that another instance holds, leaves it unsure).
    /// `runs`: the primaries' run ids, when the caller has just read them; else
    /// they are read again for each round trip of checks.
    async fn check_each(
        &self,
        targets: &[Target],
        runs: Option<&[String]>,
    ) -> Result<(usize, bool), AppError> {
        let mut rebuilt = 0;
        let mut whole = true;
        for chunk in targets.chunks(CHECK_CHUNK) {
            let checks = match runs {
                Some(runs) => self.check_against(chunk, runs).await?,
                None => self.check_many(chunk).await?,
            };
            for (&target, check) in chunk.iter().zip(checks) {
                if check != StateCheck::Trusted {
                    let (done, sure) = self.rebuild_checked(target).await;
                    rebuilt += done;
                    whole &= sure;
                }
            }
        }
        Ok((rebuilt, whole))
    }

    /// [`Recovery::rebuild`] of a target a check found missing or untrusted, for
    /// the sweep: (1, true) rebuilt; (0, false) held elsewhere or failed (logged).
    async fn rebuild_checked(&self, target: Target) -> (usize, bool) {
        // One target's failure must not keep the others waiting.
        match self.rebuild(target, Duration::ZERO).await {
            Ok(Some(done)) => {
                // A restart rebuilds the whole catalog: one line per pass (the
                // sweep's), each target at debug.
                tracing::debug!(%target, ?done, "rebuilt from Postgres");
                (1, true)
            }
            Ok(None) => (0, false),
            Err(e) => {
                tracing::warn!(%target, error = ?e, "rebuild failed; will retry");
                (0, false)
            }
        }
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
