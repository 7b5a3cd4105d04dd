//! How Redis and Postgres agree on one sale: buyers, pending orders, settled
//! orders and the stock arithmetic (`GET /api/admin/sales/{id}/reconcile`).

use redis::aio::ConnectionLike;
use serde::Serialize;
use sqlx::PgPool;

use super::payment::{self, OrderCounts};
use super::record::SaleRow;
use crate::error::AppError;
use crate::keys::Keys;

/// How Redis and Postgres agree on one sale.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Reconciliation {
    pub sale_id: i64,
    /// Units sold by Redis's count: the buyers hash, or on a sale of more than one
    /// per customer, its units-sold counter.
    pub redis_sold: i64,
    /// Users in the Redis buyers hash.
    pub redis_buyers: i64,
    /// Accepted orders not yet settled (the pending hash).
    pub pending: i64,
    /// Orders in Postgres that hold a unit: all of them, except on a sale whose
    /// expired buyers may buy again, the expired ones.
    pub postgres_orders: i64,
    /// The sale's orders by payment status, and the units of expired orders
    /// already back in Redis.
    pub orders: OrderCounts,
    /// Buyers in Redis with no order in Postgres and none pending: should be empty.
    pub missing_in_postgres: Vec<i64>,
    /// Orders in Postgres whose buyer is not in the Redis buyers hash: should be empty.
    pub missing_in_redis: Vec<i64>,
    pub stock_left: i64,
    /// Units offered (the stock set plus top-ups).
    pub stock_total: i64,
    /// Returned units offered again, their buyers still in the buyers hash.
    pub units_reoffered: i64,
    /// `stock_total + units_reoffered == stock_left + redis_sold` and both lists
    /// empty.
    pub consistent: bool,
}

/// Compares a sale's Redis state with its Postgres record. Reads only; a buyer whose
/// order is still pending is not reported missing.
pub async fn reconcile<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    sale: &SaleRow,
) -> Result<Reconciliation, AppError> {
    let k = keys.sale(sale.id);
    type Read = (Vec<i64>, Vec<(String, String)>, Option<i64>, Option<i64>);
    let (buyers, pending, left, units_sold): Read = redis::pipe()
        .hkeys(&k.buyers)
        .hgetall(&k.pending)
        .get(&k.stock)
        .get(&k.sold)
        .query_async(redis)
        .await?;
    let settled: Vec<i64> = sqlx::query_scalar(
        "SELECT user_id FROM orders
         WHERE sale_id = $1 AND (status NOT IN ('expired', 'cancelled', 'refunded') OR NOT $2)",
    )
    .bind(sale.id)
    .bind(sale.rebuy_after_expiry)
    .fetch_all(db)
    .await?;
    // Buyers whose expired order's unit is on its way back (the return recorded, not
    // applied yet): still in the buyers hash for a moment, rightly.
    let returning: Vec<i64> = sqlx::query_scalar(
        "SELECT o.user_id FROM stock_changes c JOIN orders o ON o.id = c.order_id
         WHERE c.sale_id = $1 AND c.kind = 'return' AND c.status = 'pending'",
    )
    .bind(sale.id)
    .fetch_all(db)
    .await?;
    let orders = payment::counts(db, sale.id).await?;
    let buyers_set: std::collections::HashSet<i64> = buyers.iter().copied().collect();
    let settled_set: std::collections::HashSet<i64> = settled.iter().copied().collect();
    let pending_owners: Vec<i64> = super::pending::PendingHash::orders(pending)
        .into_iter()
        .map(|(_, user)| user)
        .collect();
    let mut pending_set: std::collections::HashSet<i64> = pending_owners.iter().copied().collect();
    pending_set.extend(returning);
    let mut missing_in_postgres: Vec<i64> = buyers_set
        .iter()
        .filter(|u| !settled_set.contains(u) && !pending_set.contains(u))
        .copied()
        .collect();
    let mut missing_in_redis: Vec<i64> = settled_set.difference(&buyers_set).copied().collect();
    missing_in_postgres.sort_unstable();
    missing_in_redis.sort_unstable();
    let stock_left = left.unwrap_or(0);
    let redis_sold = units_sold.unwrap_or(buyers.len() as i64);
    Ok(Reconciliation {
        sale_id: sale.id.get(),
        redis_sold,
        redis_buyers: buyers.len() as i64,
        pending: pending_owners.len() as i64,
        postgres_orders: settled.len() as i64,
        orders,
        consistent: missing_in_postgres.is_empty()
            && missing_in_redis.is_empty()
            && sale.units_ever_offered() == stock_left + redis_sold,
        missing_in_postgres,
        missing_in_redis,
        stock_left,
        stock_total: sale.stock_total,
        units_reoffered: sale.units_reoffered,
    })
}
