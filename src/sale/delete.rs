//! Deleting a sale nobody bought, from both stores, under its row lock (see
//! [`super::lifecycle`]).

use std::sync::LazyLock;

use super::admin::SaleAdmin;
use super::cached;
use super::lifecycle::locked;
use crate::audit::{self, Action, Change, Subject};
use crate::domain::{SaleId, UserId};
use crate::error::{AppError, ErrorCode};
use crate::lua::{lua_script, unexpected_reply};

static DELETE_SALE: LazyLock<crate::lua::Script> = lua_script!("delete_sale.lua");

crate::lua::reply_codes! {
    /// What `lua/delete_sale.lua` answers, as its header lists them.
    pub enum DeleteCode in "delete_sale.lua", checked_by delete_codes_are_the_scripts {
        Removed = 1, "removed";
        HasOrders = 0, "the sale has a buyer or an order";
    }
}

/// Whether the sale has an order in Postgres (settled: one still only in Redis
/// shows in its sold count).
pub async fn has_orders<'c, E: sqlx::PgExecutor<'c>>(db: E, id: SaleId) -> Result<bool, AppError> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM orders WHERE sale_id = $1)")
            .bind(id.get())
            .fetch_one(db)
            .await?,
    )
}

/// Deletes a sale that never had an order, from both stores: 409 `has_orders`
/// once it has one (settled, or accepted in Redis and not settled yet).
pub async fn delete<S: SaleAdmin + ?Sized>(
    state: &S,
    id: SaleId,
    admin: UserId,
) -> Result<(), AppError> {
    let mut tx = state.db().begin().await?;
    let row = locked(&mut tx, id).await?;
    let has_orders = has_orders(&mut *tx, id).await?;
    let refused = || {
        AppError::new(
            ErrorCode::HasOrders,
            "this sale has orders, so it stays on record: archive it to hide it",
        )
    };
    if has_orders {
        return Err(refused());
    }
    for table in [
        "DELETE FROM stock_changes WHERE sale_id = $1",
        "DELETE FROM queue_places WHERE sale_id = $1",
        "DELETE FROM queue_admissions WHERE sale_id = $1",
        "DELETE FROM draw_entries WHERE sale_id = $1",
        "DELETE FROM draw_order WHERE sale_id = $1",
        "DELETE FROM sale_draws WHERE sale_id = $1",
    ] {
        sqlx::query(table).bind(id.get()).execute(&mut *tx).await?;
    }
    sqlx::query("DELETE FROM sales WHERE id = $1")
        .bind(id.get())
        .execute(&mut *tx)
        .await?;
    audit::record(
        &mut tx,
        Change {
            admin,
            action: Action::Delete,
            subject: Subject::Sale(id),
            before: Some(serde_json::to_value(&row).map_err(|e| AppError::Internal(e.into()))?),
            after: None,
        },
    )
    .await?;
    // Redis first, atomically against purchases: a buyer who got in first keeps
    // the sale. Once its state is gone, a purchase finds none, and a rebuild waits
    // for our row lock and then finds no sale.
    let k = state.keys().sale(id);
    let removed: i64 = DELETE_SALE
        .key(&k.meta)
        .key(&k.stock)
        .key(&k.buyers)
        .key(&k.orders)
        .key(&k.pending)
        .key(&k.changes)
        .key(&k.rebuild)
        .key(&k.units)
        .key(&k.sold)
        .key(&k.orders_legacy)
        .key(&k.buyers_legacy)
        .key(&k.queue)
        .key(&k.queue_state)
        .key(&k.queue_open)
        .key(&k.queue_admitted)
        .key(&k.queue_joins)
        .key(&k.queue_admits)
        .invoke_async(&mut state.redis().clone())
        .await?;
    match DeleteCode::of(removed) {
        Some(DeleteCode::Removed) => {}
        Some(DeleteCode::HasOrders) => return Err(refused()),
        None => return Err(unexpected_reply("delete_sale.lua", removed)),
    }
    tx.commit().await?;
    cached::invalidate(state, id).await?;
    state.sold_out().clear(id);
    Ok(())
}
