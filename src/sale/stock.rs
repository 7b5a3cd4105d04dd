//! Stock changes: an admin's (set, add) and the units of expired orders coming
//! back (return), recorded in Postgres, applied once in Redis by
//! `lua/stock_change.lua`, which remembers each change's delta, so a change is
//! never applied twice whatever dies in between.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use sqlx::PgPool;

use super::numbers::live_numbers;
use crate::domain::{Id, MAX_STOCK, SaleId, UserId};
use crate::error::AppError;
use crate::keys::Keys;
use crate::lua::{lua_script, unexpected_reply};

static STOCK_CHANGE: LazyLock<crate::lua::Script> = lua_script!("stock_change.lua");

crate::lua::reply_codes! {
    /// What `lua/stock_change.lua` answers, as its header lists them.
    pub enum StockCode in "stock_change.lua", checked_by stock_codes_are_the_scripts {
        Applied = 0, "applied";
        Refused = 1, "refused: units ever offered would pass the maximum";
        NotLoaded = 4, "not loaded";
        Recovering = 6, "recovering";
    }
}

/// An admin's stock change, as the API takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StockChange {
    /// Units left become exactly this.
    Set(i64),
    /// Units left grow by this.
    Add(i64),
}

impl StockChange {
    fn kind(self) -> &'static str {
        match self {
            StockChange::Set(_) => "set",
            StockChange::Add(_) => "add",
        }
    }

    fn amount(self) -> i64 {
        match self {
            StockChange::Set(n) | StockChange::Add(n) => n,
        }
    }
}

/// What became of one recorded stock change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeResult {
    /// Units left moved by `delta` in Redis, and `stock_total` by the same delta in
    /// Postgres, once.
    Applied { delta: i64, left: i64, sold: i64 },
    /// Units ever offered would pass [`MAX_STOCK`]: nothing changed.
    Refused { left: i64, sold: i64 },
    /// Not applied yet: Redis does not hold the sale, or holds state this Redis run has
    /// not verified. The change stays recorded and is applied after the rebuild.
    Deferred,
}

/// Records a stock change in Postgres; [`apply_pending`] applies it. Never
/// read-modify-write across the two stores: Redis computes the delta, Postgres adds it.
pub async fn record_stock_change(
    db: &PgPool,
    sale: SaleId,
    change: StockChange,
    admin: UserId,
) -> Result<i64, AppError> {
    let mut tx = db.begin().await?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO stock_changes (sale_id, kind, amount, admin_id) VALUES ($1, $2, $3, $4)
         RETURNING id",
    )
    .bind(sale.get())
    .bind(change.kind())
    .bind(change.amount())
    .bind(admin.get())
    .fetch_one(&mut *tx)
    .await?;
    crate::audit::record(
        &mut tx,
        crate::audit::Change {
            admin,
            action: crate::audit::Action::Stock,
            subject: crate::audit::Subject::Sale(sale),
            before: None,
            after: Some(serde_json::json!({ change.kind(): change.amount(), "change_id": id })),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(id)
}

/// Applies every recorded, not yet applied stock change of the sale, oldest first,
/// holding the sale's row lock, so that concurrent changes on any number of instances
/// (and a rebuild, which takes the same lock) take turns. Returns each change's result.
pub async fn apply_pending<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
) -> Result<Vec<(i64, ChangeResult)>, AppError> {
    let mut tx = db.begin().await?;
    let exists: Option<i64> = sqlx::query_scalar("SELECT id FROM sales WHERE id = $1 FOR UPDATE")
        .bind(sale.get())
        .fetch_optional(&mut *tx)
        .await?;
    if exists.is_none() {
        return Ok(Vec::new());
    }
    let results = apply_pending_locked(&mut tx, redis, keys, sale).await?;
    tx.commit().await?;
    Ok(results)
}

/// [`apply_pending`] for a caller that already holds the sale's row lock in `tx`.
///
/// Crash safety: Redis applies a change once and remembers its delta under the
/// change id; the row turns `applied` (and `stock_total` moves) in `tx`. If `tx` never
/// commits, the row stays `pending` and the next call gets the remembered delta back
/// from Redis instead of applying it again.
pub async fn apply_pending_locked<C: ConnectionLike>(
    tx: &mut sqlx::PgConnection,
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
) -> Result<Vec<(i64, ChangeResult)>, AppError> {
    // A returned unit (an expired order's) is a 'return' in Postgres; the script
    // is told whether its buyer may buy again ('release') or not (see the script).
    let pending: Vec<(i64, String, i64, Option<i64>)> = sqlx::query_as(
        "SELECT c.id,
                CASE WHEN c.kind = 'return' AND s.rebuy_after_expiry THEN 'release' ELSE c.kind END,
                c.amount, o.user_id
         FROM stock_changes c
         JOIN sales s ON s.id = c.sale_id
         LEFT JOIN orders o ON o.id = c.order_id
         WHERE c.sale_id = $1 AND c.status = 'pending' ORDER BY c.id",
    )
    .bind(sale.get())
    .fetch_all(&mut *tx)
    .await?;
    let k = keys.sale(sale);
    let mut results = Vec::with_capacity(pending.len());
    for (id, kind, amount, buyer) in pending {
        let (code, delta, left, sold): (i64, i64, i64, i64) = STOCK_CHANGE
            .key(&k.meta)
            .key(&k.stock)
            .key(&k.buyers)
            .key(&k.changes)
            .key(&k.units)
            .key(&k.sold)
            .arg(id)
            .arg(&kind)
            .arg(amount)
            .arg(MAX_STOCK)
            .arg(buyer.unwrap_or(0))
            .invoke_async(redis)
            .await?;
        let result = match StockCode::of(code) {
            Some(StockCode::Applied) => ChangeResult::Applied { delta, left, sold },
            Some(StockCode::Refused) => ChangeResult::Refused { left, sold },
            Some(StockCode::NotLoaded | StockCode::Recovering) => {
                // This and every later change wait for the rebuild.
                results.push((id, ChangeResult::Deferred));
                break;
            }
            None => return Err(unexpected_reply("stock_change.lua", (code, delta))),
        };
        record_change(tx, sale, id, kind == "return", &result).await?;
        results.push((id, result));
    }
    Ok(results)
}

/// Records a change Redis decided: its row turns `applied` or `refused`, and an
/// applied delta moves the sale's `stock_total`, only by the update that turned the
/// row (a second call finds it no longer `pending`). A returned unit offered again
/// (`reoffer`: its buyer may not buy again) moves `units_reoffered` by the same
/// delta, so the units the admin offered (`stock_total - units_reoffered`, what
/// every page and API calls `stock_total`) do not grow with returns.
async fn record_change(
    tx: &mut sqlx::PgConnection,
    sale: SaleId,
    id: i64,
    reoffer: bool,
    result: &ChangeResult,
) -> Result<(), AppError> {
    let (status, applied_delta) = match result {
        ChangeResult::Applied { delta, .. } => ("applied", *delta),
        _ => ("refused", 0),
    };
    let done = sqlx::query(
        "UPDATE stock_changes SET status = $2, delta = $3, applied_at = now()
         WHERE id = $1 AND status = 'pending'",
    )
    .bind(id)
    .bind(status)
    .bind(applied_delta)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() == 1 && applied_delta != 0 {
        sqlx::query(
            "UPDATE sales SET stock_total = stock_total + $2,
                 units_reoffered = units_reoffered + CASE WHEN $3 THEN $2 ELSE 0 END,
                 updated_at = now()
             WHERE id = $1",
        )
        .bind(sale.get())
        .bind(applied_delta)
        .bind(reoffer)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// The outcome of a change as Postgres records it now, with live numbers from Redis.
pub async fn change_result<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
    change_id: i64,
) -> Result<ChangeResult, AppError> {
    let (status, delta): (String, Option<i64>) =
        sqlx::query_as("SELECT status, delta FROM stock_changes WHERE id = $1")
            .bind(change_id)
            .fetch_one(db)
            .await?;
    let numbers = live_numbers(redis, keys, &[sale.get()]).await?;
    let (left, sold) = numbers.first().copied().unwrap_or((None, 0));
    let left = left.unwrap_or(0);
    Ok(match status.as_str() {
        "applied" => ChangeResult::Applied {
            delta: delta.unwrap_or(0),
            left,
            sold,
        },
        "refused" => ChangeResult::Refused { left, sold },
        _ => ChangeResult::Deferred,
    })
}

/// Sales with stock changes recorded more than `older_than_ms` ago and still not
/// applied (their admin request died, or the sale was being rebuilt).
pub async fn sales_with_pending_changes(
    db: &PgPool,
    older_than_ms: i64,
) -> Result<Vec<SaleId>, sqlx::Error> {
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT DISTINCT sale_id FROM stock_changes
         WHERE status = 'pending' AND created_at < now() - make_interval(secs => $1::float8 / 1000)",
    )
    .bind(older_than_ms)
    .fetch_all(db)
    .await?;
    Ok(ids.into_iter().filter_map(Id::new).collect())
}
