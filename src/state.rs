//! The one application state, built once at startup and shared by every worker
//! through `web::Data` (an `Arc`).

use std::sync::Arc;

use crate::redis_conn::Redis;
use sqlx::PgPool;

use crate::auth::token::TokenKey;
use crate::cache::Cache;
use crate::config::Config;
use crate::keys::Keys;
use crate::limit::http::Limiter;
use crate::metrics::Metrics;
use crate::recover::Recovery;
use crate::sale::SoldOutFlags;

/// What each HTTP worker has of its own, built on the worker's thread when the
/// worker starts (`App::data_factory`): its Redis connection, whose I/O task runs
/// on that thread, and its batchers (with `replica_acks`, the buy and vote batchers
/// share `batch_in_flight` connections of their own, made on that thread too). A
/// purchase is written to Redis and its answer read on the thread that serves the
/// request: no hop to another thread.
pub struct Worker {
    pub redis: Redis,
    pub buys: Arc<crate::batch::Batcher<crate::sale::buy::BuyDecider>>,
    pub votes: Arc<crate::batch::Batcher<crate::vote::cast::VoteDecider>>,
    /// Joins and position queries of waiting rooms.
    pub queue: Arc<crate::batch::Batcher<crate::sale::queue::join::QueueDecider>>,
    /// Reads of what buyers hold of a sale, for `already_bought`.
    pub held: Arc<crate::batch::Batcher<crate::sale::held::HeldReader>>,
    /// Entries into draws, written to Postgres together.
    pub entries: Arc<crate::batch::Batcher<crate::sale::draw::enter::EntryWriter>>,
}

pub struct AppState {
    pub config: Arc<Config>,
    /// One multiplexed connection, cloned per use: no pool, no per-request connect.
    pub redis: Redis,
    pub db: PgPool,
    pub keys: Keys,
    pub tokens: TokenKey,
    /// Signs and checks purchase tickets (see [`crate::sale::ticket`]).
    pub tickets: crate::sale::ticket::TicketKey,
    /// Which sales require a ticket, once read.
    pub ticket_rules: crate::sale::ticket::TicketRules,
    /// The fair-opening gates: the challenge key, each sale's and poll's gates
    /// once read, account creation times read (see [`crate::gate`]).
    pub gates: crate::gate::Keeper,
    /// What buyers hold of a sale, for `already_bought` (see `sale::held::HeldOrders`).
    pub held_orders: crate::sale::held::HeldOrders,
    /// The orders this server accepted and settlement has not committed, kept
    /// for a rebuild that finds Redis lost them (see [`crate::settle::kept`]).
    pub kept: Arc<crate::sale::kept::KeptOrders>,
    /// The votes, likewise.
    pub kept_votes: Arc<crate::vote::kept::KeptVotes>,
    /// Whether a token's session still stands: what has ended, in memory, fed by
    /// the ended-sessions stream (see [`crate::auth::session`]).
    pub sessions: crate::auth::session::Sessions,
    pub sold_out: SoldOutFlags,
    pub metrics: Arc<Metrics>,
    /// Rate limits: the policies by route, and their Redis (see [`Limiter::check`]).
    pub limiter: Limiter,
    /// Cached views: rebuilds in flight in this process, and counters.
    pub cache: Cache,
    /// Rebuilds of sales and polls whose Redis state was lost or is untrusted.
    pub recovery: Arc<Recovery>,
    /// One reader per sale or poll watched by open pages (see [`crate::live`]).
    pub live: Arc<crate::live::Feeds>,
    /// Whether Postgres answered the last probe (see
    /// [`crate::observe::probe_postgres`]): `/readyz` reads it without waiting.
    pub postgres: PostgresStatus,
    /// Set on SIGTERM: `/readyz` answers 503 while every route still answers,
    /// for the drain period (`drain_ms`), before the server stops accepting.
    pub draining: std::sync::atomic::AtomicBool,
    /// Nudges to the background loops that wait long while nothing happens.
    pub wake: Wake,
}

/// In-process nudges to background loops that, idle, wait seconds between looks
/// (see `docs/resources.md`): what happens in this process reaches them at once;
/// what happens in another, at their next look.
#[derive(Default)]
pub struct Wake {
    /// A sale or poll was created or changed: the settlement worker stops waiting
    /// and lists its streams again.
    pub settle: Arc<tokio::sync::Notify>,
    /// The same: the waiting-room loop lists the active rooms again.
    pub rooms: Arc<tokio::sync::Notify>,
    /// The settlement worker committed a batch: the expiry job looks at the next
    /// payment deadline again.
    pub expire: Arc<tokio::sync::Notify>,
    /// The same as `settle`: the draw loop looks for draws due again (a draw sale
    /// created, edited or opened now here is drawn at its time, not at the loop's
    /// next look, up to 2 s later).
    pub draws: Arc<tokio::sync::Notify>,
}

impl Wake {
    /// A sale or poll was created or changed here (its window, its waiting room,
    /// opened or closed).
    pub fn catalog_changed(&self) {
        self.settle.notify_one();
        self.rooms.notify_one();
        self.draws.notify_one();
    }
}

/// What the last Postgres probe found. Starts up: `serve` connected and migrated
/// before it built the state.
pub struct PostgresStatus(std::sync::atomic::AtomicBool);

impl Default for PostgresStatus {
    fn default() -> Self {
        PostgresStatus(std::sync::atomic::AtomicBool::new(true))
    }
}

impl PostgresStatus {
    pub fn is_up(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn set(&self, up: bool) {
        self.0.store(up, std::sync::atomic::Ordering::Relaxed)
    }
}

impl crate::cache::CachedReads for AppState {
    fn cache(&self) -> &Cache {
        &self.cache
    }
    fn db(&self) -> &PgPool {
        &self.db
    }
    fn redis(&self) -> &Redis {
        &self.redis
    }
    fn keys(&self) -> &Keys {
        &self.keys
    }
}

impl crate::vote::cached::PollReads for AppState {
    fn recovering(&self, poll: crate::domain::PollId) -> crate::error::AppError {
        self.recovery.recovering(crate::recover::Target::Poll(poll))
    }
}

impl crate::sale::admin::SaleAdmin for AppState {
    fn sold_out(&self) -> &SoldOutFlags {
        &self.sold_out
    }

    async fn rebuild_sale(
        &self,
        sale: crate::domain::SaleId,
        wait: std::time::Duration,
    ) -> Result<bool, crate::error::AppError> {
        let rebuilt = self
            .recovery
            .rebuild(crate::recover::Target::Sale(sale), wait)
            .await?;
        Ok(rebuilt.is_some())
    }
}
