//! Orders: their ids (UUIDv8 that carry their sale's id, so an order can be found in
//! its sale's pending hash before it reaches Postgres), the SQL that reads the
//! settled ones, and the pending ones (accepted in Redis, not yet settled).

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::{Id, SaleId, UserId};
use crate::error::AppError;
use crate::keys::Keys;

/// A settled order, as Postgres holds it.
#[derive(Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct OrderRow {
    pub id: Uuid,
    pub sale_id: i64,
    pub user_id: i64,
    pub accepted_at: DateTime<Utc>,
    pub settled_at: DateTime<Utc>,
    /// `accepted` (the sale has no payment step), `awaiting_payment`, `paid` or
    /// `expired` (not paid in time: its unit went back on sale).
    pub status: String,
    /// The payment deadline (sales with a payment window).
    pub pay_by: Option<DateTime<Utc>>,
    pub paid_at: Option<DateTime<Utc>>,
    /// Units bought.
    pub quantity: i32,
}

/// A settled order of the caller, with its sale's name and price.
#[derive(Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct MyOrder {
    pub id: Uuid,
    pub sale_id: i64,
    pub sale_name: String,
    pub price_cents: i64,
    pub accepted_at: DateTime<Utc>,
    pub settled_at: DateTime<Utc>,
    /// As [`OrderRow::status`].
    pub status: String,
    pub pay_by: Option<DateTime<Utc>>,
    pub paid_at: Option<DateTime<Utc>>,
    pub quantity: i32,
}

/// The columns of [`OrderRow`], as a literal so queries stay `&'static str`.
macro_rules! order_columns {
    () => {
        "id, sale_id, user_id, accepted_at, settled_at, status, pay_by, paid_at, quantity"
    };
}

/// The settled order with this id.
pub async fn find(db: &PgPool, id: Uuid) -> sqlx::Result<Option<OrderRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        order_columns!(),
        " FROM orders WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(db)
    .await
}

/// A user's settled orders, newest first (at most 500).
pub async fn of_user(db: &PgPool, user: UserId) -> sqlx::Result<Vec<MyOrder>> {
    sqlx::query_as(
        "SELECT o.id, o.sale_id, s.name AS sale_name, s.price_cents, o.accepted_at, o.settled_at,
                o.status, o.pay_by, o.paid_at, o.quantity
         FROM orders o JOIN sales s ON s.id = o.sale_id
         WHERE o.user_id = $1 ORDER BY o.accepted_at DESC LIMIT 500",
    )
    .bind(user.get())
    .fetch_all(db)
    .await
}

/// A sale's settled orders, oldest first (at most `limit`).
pub async fn of_sale(db: &PgPool, sale: SaleId, limit: i64) -> sqlx::Result<Vec<OrderRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        order_columns!(),
        " FROM orders WHERE sale_id = $1 ORDER BY accepted_at LIMIT $2"
    ))
    .bind(sale.get())
    .bind(limit)
    .fetch_all(db)
    .await
}

/// An order accepted and not yet in Postgres: its sale (carried by the id) and its
/// owner, from the sale's pending hash.
pub async fn pending_owner<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    order: &Uuid,
) -> Result<Option<(SaleId, i64)>, AppError> {
    let Some(sale) = sale_of_order(order) else {
        return Ok(None);
    };
    let owner: Option<i64> = redis::cmd("HGET")
        .arg(&keys.sale(sale).pending)
        .arg(order.to_string())
        .query_async(redis)
        .await?;
    Ok(owner.map(|owner| (sale, owner)))
}

/// How many of the sale's accepted orders are not in Postgres yet.
pub async fn pending_count<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
) -> Result<i64, AppError> {
    Ok(redis::cmd("HLEN")
        .arg(&keys.sale(sale).pending)
        .query_async(redis)
        .await?)
}

/// Order ids carry their sale id in the first six bytes (a UUIDv8), so an order's
/// status can be found in its sale's pending hash before it reaches Postgres.
pub fn new_order_id(sale: SaleId) -> Uuid {
    use rand::RngCore;
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    bytes[..6].copy_from_slice(&sale.get().to_be_bytes()[2..]);
    Uuid::new_v8(bytes)
}

/// The sale an order id was minted for, if it is one of ours.
pub fn sale_of_order(order: &Uuid) -> Option<SaleId> {
    if order.get_version_num() != 8 {
        return None;
    }
    let b = order.as_bytes();
    let mut raw = [0u8; 8];
    raw[2..].copy_from_slice(&b[..6]);
    Id::new(i64::from_be_bytes(raw))
}

/// Largest sale id an order id can carry (48 bits).
pub const MAX_ORDERABLE_SALE_ID: i64 = (1 << 48) - 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_ids_carry_their_sale() {
        for raw in [1, 42, 1 << 40, MAX_ORDERABLE_SALE_ID] {
            let sale = Id::new(raw).unwrap();
            let order = new_order_id(sale);
            assert_eq!(order.get_version_num(), 8);
            assert_eq!(sale_of_order(&order), Some(sale));
        }
        assert_eq!(sale_of_order(&Uuid::new_v4()), None);
    }
}
