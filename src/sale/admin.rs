//! An admin's work on a sale that spans both stores: creating it, changing its
//! stock or its window, its orders with the pending count, the comparison of the
//! stores and the repair. Each runs its steps in the order that keeps Redis and
//! Postgres agreeing (ARCHITECTURE.md, "Stock changes"), and rebuilds the sale's
//! Redis state where Redis lost it. What the steps need of the application state
//! beyond its cached reads comes through [`SaleAdmin`], which `state.rs` implements.
//!
//! Admin paths read the sale's record fresh from Postgres, never through the cache.

use std::future::Future;
use std::time::Duration;

use super::SoldOutFlags;
use super::cached::{self, load_view};
use super::orders::{self, BuyerOrder, OrderRow};
use super::pending::{self, PendingOrder};
use super::reconcile::{self, Reconciliation};
use super::record::{self, SaleRow, SaleView};
use super::stock::{self, ChangeResult, StockChange};
use super::store::{self, NewSale, WindowChange};
use crate::cache::CachedReads;
use crate::domain::{SaleId, UserId};
use crate::error::{AppError, ErrorCode};

/// What an admin's change of a sale needs of the application state, beyond the
/// cached reads: the sold-out flags it clears, and the rebuild of a sale's Redis
/// state from Postgres ([`crate::recover`], which imports this module, so the state
/// lends it here).
pub trait SaleAdmin: CachedReads {
    fn sold_out(&self) -> &SoldOutFlags;

    /// Rebuilds the sale's Redis state from Postgres, waiting up to `wait` for a
    /// rebuild of it already running; false when that one still holds the lock.
    fn rebuild_sale(
        &self,
        sale: SaleId,
        wait: Duration,
    ) -> impl Future<Output = Result<bool, AppError>>;
}

/// How long an admin's change waits for a rebuild of its sale before it answers
/// (a stock change: 202, recorded, applied later by the rebuild or the sweep).
pub const REBUILD_WAIT: Duration = Duration::from_secs(5);

/// The sale's record from Postgres; 404 `not_found` when there is no such sale.
pub async fn record(db: &sqlx::PgPool, id: SaleId) -> Result<SaleRow, AppError> {
    record::fetch_sale(db, id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no sale with id {id}")))
}

/// Creates the sale (Postgres and Redis, see [`store::create_sale`]) and answers
/// its view, read after the cache forgot the list.
pub async fn create<S: CachedReads + ?Sized>(
    state: &S,
    new: NewSale,
    admin: UserId,
) -> Result<SaleView, AppError> {
    let mut redis = state.redis().clone();
    let row = store::create_sale(state.db(), &mut redis, state.keys(), new, Some(admin)).await?;
    let id = row.id;
    cached::invalidate(state, id).await?;
    load_view(state, id).await
}

/// An admin's stock change: recorded in Postgres, then applied (see
/// [`apply_recorded`]). Its id and what became of it: once recorded, a failure to
/// apply is [`ChangeResult::Deferred`] (applied later by the sweep or the next
/// change), never an error that invites a second, duplicate change.
pub async fn change_stock<S: SaleAdmin + ?Sized>(
    state: &S,
    id: SaleId,
    change: StockChange,
    admin: UserId,
) -> Result<(i64, ChangeResult), AppError> {
    record(state.db(), id).await?;
    let change_id = stock::record_stock_change(state.db(), id, change, admin).await?;
    let result = match apply_recorded(state, id, change_id).await {
        Ok(result) => result,
        Err(e) => {
            tracing::warn!(sale = %id, change = change_id, error = ?e, "stock change recorded; applying it later");
            ChangeResult::Deferred
        }
    };
    if let ChangeResult::Applied { left, .. } = result {
        cached::invalidate(state, id).await?;
        if left > 0 {
            state.sold_out().clear(id);
        }
    }
    Ok((change_id, result))
}

/// Applies the recorded change (and any older one still pending). When the sale's
/// Redis state is missing or untrusted, rebuilds it first (the rebuild applies the
/// pending changes too) and reads the outcome back.
async fn apply_recorded<S: SaleAdmin + ?Sized>(
    state: &S,
    id: SaleId,
    change_id: i64,
) -> Result<ChangeResult, AppError> {
    let (db, keys) = (state.db(), state.keys());
    let outcome = |results: &[(i64, ChangeResult)]| {
        results
            .iter()
            .find(|(c, _)| *c == change_id)
            .map(|(_, r)| *r)
    };
    let results = stock::apply_pending(db, &mut state.redis().clone(), keys, id).await?;
    match outcome(&results) {
        Some(ChangeResult::Deferred) => {}
        Some(done) => return Ok(done),
        // Another request applied it between our insert and our turn at the lock.
        None => {
            return stock::change_result(db, &mut state.redis().clone(), keys, id, change_id).await;
        }
    }
    state.rebuild_sale(id, REBUILD_WAIT).await?;
    stock::change_result(db, &mut state.redis().clone(), keys, id, change_id).await
}

/// Opens the sale now (moves `starts_at` back to now, clears an early close);
/// 409 `past_end` when its end time has passed.
pub async fn open<S: SaleAdmin + ?Sized>(
    state: &S,
    id: SaleId,
    admin: UserId,
) -> Result<(), AppError> {
    let sale = record(state.db(), id).await?;
    if sale.ends_at <= chrono::Utc::now() {
        return Err(AppError::new(
            ErrorCode::PastEnd,
            "this sale's end time has passed; it cannot be opened",
        ));
    }
    // A draw opened now is drawn now: only once its entries have opened.
    if sale
        .entries_open_at
        .is_some_and(|at| at >= chrono::Utc::now())
    {
        return Err(AppError::new(
            ErrorCode::InvalidDraw,
            "this draw's entries have not opened yet: edit draw_at instead",
        ));
    }
    set_window(state, id, WindowChange::Open, admin).await
}

/// Closes the sale early.
pub async fn close<S: SaleAdmin + ?Sized>(
    state: &S,
    id: SaleId,
    admin: UserId,
) -> Result<(), AppError> {
    set_window(state, id, WindowChange::Close, admin).await
}

/// Updates the record, then the Redis window when Redis holds the sale. In this
/// order a rebuild running meanwhile cannot undo the change: it reads the row after
/// the commit, or its restore runs before this update. A sale Redis lost is rebuilt
/// (with the new window) before the answer.
async fn set_window<S: SaleAdmin + ?Sized>(
    state: &S,
    id: SaleId,
    change: WindowChange,
    admin: UserId,
) -> Result<(), AppError> {
    let row = store::set_window(state.db(), id, change, admin)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no sale with id {id}")))?;
    let in_redis = match store::update_window(&mut state.redis().clone(), state.keys(), &row).await
    {
        Ok(in_redis) => in_redis,
        Err(e) => {
            // Committed: Redis must follow, or the sale sells by its old window.
            store::resync_window(state.db(), state.redis(), state.keys(), id);
            return Err(e);
        }
    };
    cached::invalidate(state, id).await?;
    if !in_redis {
        state.rebuild_sale(id, REBUILD_WAIT).await?;
    }
    Ok(())
}

/// The sale's settled orders, oldest first (at most `limit`), and how many accepted
/// orders are not in Postgres yet.
pub async fn orders<S: CachedReads + ?Sized>(
    state: &S,
    id: SaleId,
    limit: i64,
) -> Result<(Vec<OrderRow>, i64), AppError> {
    record(state.db(), id).await?;
    let confirmed = orders::of_sale(state.db(), id, limit).await?;
    let pending = pending::count(&mut state.redis().clone(), state.keys(), id).await?;
    Ok((confirmed, pending))
}

/// A page of a sale's orders for the admin's page: settled ones with their buyers'
/// names, and the pending ones.
pub struct OrdersPage {
    /// This page's settled orders, oldest first.
    pub confirmed: Vec<BuyerOrder>,
    pub confirmed_total: i64,
    /// The oldest pending orders, each with its buyer's name (`None` for an
    /// account that is gone).
    pub pending: Vec<(PendingOrder, Option<String>)>,
    pub pending_total: i64,
}

/// `per_page` settled orders of the sale after `offset` (oldest first), the count
/// of all, and the exact pending count with the oldest `pending_shown` pending
/// orders (Redis first: an order that settles in between shows in both).
pub async fn orders_page<S: CachedReads + ?Sized>(
    state: &S,
    id: SaleId,
    offset: i64,
    per_page: i64,
    pending_shown: usize,
) -> Result<OrdersPage, AppError> {
    let db = state.db();
    let (pending_total, entries) =
        pending::oldest(&mut state.redis().clone(), state.keys(), id, pending_shown).await?;
    let confirmed = orders::page_of_sale(db, id, per_page, offset).await?;
    let confirmed_total = orders::count_of_sale(db, id).await?;
    let buyers: Vec<i64> = entries.iter().map(|e| e.user).collect();
    let names = crate::auth::usernames(db, &buyers).await?;
    let name_of = |user: i64| {
        names
            .iter()
            .find(|(id, _)| *id == user)
            .map(|(_, name)| name.clone())
    };
    let pending = entries
        .into_iter()
        .map(|e| {
            let name = name_of(e.user);
            (e, name)
        })
        .collect();
    Ok(OrdersPage {
        confirmed,
        confirmed_total,
        pending,
        pending_total,
    })
}

/// Redis against Postgres for the sale (see [`reconcile::reconcile`]).
pub async fn reconciliation<S: CachedReads + ?Sized>(
    state: &S,
    id: SaleId,
) -> Result<Reconciliation, AppError> {
    let sale = record(state.db(), id).await?;
    reconcile::reconcile(state.db(), &mut state.redis().clone(), state.keys(), &sale).await
}

/// Makes Redis agree with Postgres for the sale (the rebuild of
/// [`crate::recover`]), then compares them again; 503 `busy` when another rebuild
/// of it keeps the lock.
pub async fn repair<S: SaleAdmin + ?Sized>(
    state: &S,
    id: SaleId,
) -> Result<Reconciliation, AppError> {
    record(state.db(), id).await?;
    if !state.rebuild_sale(id, REBUILD_WAIT).await? {
        return Err(AppError::new(
            ErrorCode::Busy,
            "another rebuild of this sale is running; try again",
        )
        .with_header(actix_web::http::header::RETRY_AFTER, "1"));
    }
    state.sold_out().clear(id);
    cached::invalidate(state, id).await?;
    reconciliation(state, id).await
}
