//! Settled orders: their status, the SQL that reads them, and a buyer's orders
//! with the units still pending (see [`super::pending`]). Their ids are
//! [`super::order_id`]'s; what `already_bought` names is [`super::held`]'s.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::pending;
use super::record::SaleView;
use crate::cache::CachedReads;
use crate::domain::{SaleId, UserId};
use crate::error::AppError;
use crate::paging::Limit;

/// Where a settled order stands: the `orders.status` column. Postgres writes
/// `accepted` or `awaiting_payment` at settlement, `paid` and `expired` later; a
/// value this version does not know fails the read (an error, never a guess).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    /// The sale has no payment step: the order is complete.
    Accepted,
    AwaitingPayment,
    Paid,
    /// Not paid in time: its units went back on sale.
    Expired,
    /// Cancelled by the buyer (unpaid) or an admin: its units went back on sale.
    Cancelled,
    /// A paid order an admin cancelled: the payment was refunded and its units went
    /// back on sale.
    Refunded,
}

impl OrderStatus {
    pub const ALL: [OrderStatus; 6] = [
        OrderStatus::Accepted,
        OrderStatus::AwaitingPayment,
        OrderStatus::Paid,
        OrderStatus::Expired,
        OrderStatus::Cancelled,
        OrderStatus::Refunded,
    ];

    /// The statuses whose units went back on sale (in SQL: `status IN ('expired',
    /// 'cancelled', 'refunded')`).
    pub fn returned(self) -> bool {
        matches!(
            self,
            OrderStatus::Expired | OrderStatus::Cancelled | OrderStatus::Refunded
        )
    }

    /// The column's text.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Accepted => "accepted",
            OrderStatus::AwaitingPayment => "awaiting_payment",
            OrderStatus::Paid => "paid",
            OrderStatus::Expired => "expired",
            OrderStatus::Cancelled => "cancelled",
            OrderStatus::Refunded => "refunded",
        }
    }

    pub fn parse(text: &str) -> Option<OrderStatus> {
        OrderStatus::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

impl sqlx::Type<sqlx::Postgres> for OrderStatus {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <&str as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for OrderStatus {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let text = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
        OrderStatus::parse(text).ok_or_else(|| format!("unknown order status {text:?}").into())
    }
}

/// A settled order, as Postgres holds it.
#[derive(Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct OrderRow {
    pub id: Uuid,
    pub sale_id: i64,
    pub user_id: i64,
    pub accepted_at: DateTime<Utc>,
    pub settled_at: DateTime<Utc>,
    pub status: OrderStatus,
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
    // The price of one unit (the page multiplies it by the quantity).
    pub price_cents: i64,
    pub accepted_at: DateTime<Utc>,
    pub settled_at: DateTime<Utc>,
    pub status: OrderStatus,
    pub pay_by: Option<DateTime<Utc>>,
    pub paid_at: Option<DateTime<Utc>>,
    pub quantity: i32,
    /// The sale's rule for a returned order (cancelled, refunded or expired): its
    /// buyer may buy from the sale again. Never on a draw or waiting-room sale,
    /// whatever its setting: a win or a turn in the line buys once.
    pub rebuy_after_expiry: bool,
    /// What a purchase of a gated sale used up: `draw` (a win) or `line` (a turn
    /// in the waiting room); none on a first-come sale (the page words its rule).
    #[serde(skip)]
    pub gate: Option<String>,
    /// The sale's units per customer (the page words its rule by it).
    #[serde(skip)]
    pub max_per_user: i32,
    /// `pay_by <= now()` by Postgres's clock, as the payment decides it (the page
    /// shows it; the API answers `pay_by`).
    #[serde(skip)]
    pub overdue: bool,
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
                o.status, o.pay_by, o.paid_at, o.quantity,
                s.rebuy_after_expiry AND s.mode <> 'draw' AND NOT s.waiting_room
                    AS rebuy_after_expiry,
                CASE WHEN s.mode = 'draw' THEN 'draw' WHEN s.waiting_room THEN 'line' END AS gate,
                s.max_per_user,
                COALESCE(o.pay_by <= now(), false) AS overdue
         FROM orders o JOIN sales s ON s.id = o.sale_id
         WHERE o.user_id = $1 ORDER BY o.accepted_at DESC LIMIT 500",
    )
    .bind(user.get())
    .fetch_all(db)
    .await
}

/// How a buyer's last order of a sale ended when it no longer holds a unit: what
/// the sale page tells them (and whether they may buy again is the sale's rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Returned {
    /// They cancelled it themselves.
    CancelledByYou,
    /// An admin cancelled it.
    Cancelled,
    Refunded,
    Expired,
}

impl Returned {
    pub fn as_str(self) -> &'static str {
        match self {
            Returned::CancelledByYou => "cancelled_by_you",
            Returned::Cancelled => "cancelled",
            Returned::Refunded => "refunded",
            Returned::Expired => "expired",
        }
    }
}

/// How the buyer's latest settled order of the sale ended, when none of their
/// orders of it holds a unit any more (cancelled, refunded or expired); `None`
/// when one still does, or they have none. One indexed read of their own orders.
pub async fn returned_order(
    db: &PgPool,
    sale: SaleId,
    user: UserId,
) -> sqlx::Result<Option<Returned>> {
    let orders: Vec<(OrderStatus, Option<i64>)> = sqlx::query_as(
        "SELECT status, cancelled_by FROM orders
         WHERE user_id = $1 AND sale_id = $2 ORDER BY accepted_at DESC, id DESC",
    )
    .bind(user.get())
    .bind(sale.get())
    .fetch_all(db)
    .await?;
    if orders.iter().any(|(status, _)| !status.returned()) {
        return Ok(None);
    }
    Ok(orders.first().map(|&(status, by)| match status {
        OrderStatus::Refunded => Returned::Refunded,
        OrderStatus::Expired => Returned::Expired,
        _ if by == Some(user.get()) => Returned::CancelledByYou,
        _ => Returned::Cancelled,
    }))
}

/// Units of the buyer's orders of the sale that went back on sale (expired,
/// cancelled, refunded). On a sale of more than one per customer that does not
/// let a buyer buy again, the units hash keeps counting them against the cap:
/// what the buyer holds now is that count less these.
pub async fn returned_units(db: &PgPool, sale: SaleId, user: UserId) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "SELECT COALESCE(sum(quantity), 0)::int8 FROM orders
         WHERE user_id = $1 AND sale_id = $2
           AND status IN ('expired', 'cancelled', 'refunded')",
    )
    .bind(user.get())
    .bind(sale.get())
    .fetch_one(db)
    .await
}

/// Units a buyer holds of a sale whose order has not settled yet.
pub struct PendingUnits {
    pub sale_id: i64,
    pub sale_name: String,
    pub units: i32,
    /// What the units cost together.
    pub price_cents: i64,
}

/// A buyer's orders: the pending units first, then the settled orders (as
/// [`of_user`]).
pub struct MyOrders {
    pub pending: Vec<PendingUnits>,
    pub settled: Vec<MyOrder>,
}

/// Sales whose buyers hash is asked about the buyer (pending orders): the list's
/// cached first page, where open sales, the only ones taking orders, come first.
/// (A pending order lives until settlement, a moment; one of a sale past this page
/// shows once settled.)
const PENDING_SCAN: Limit = super::cached::FIRST_PAGE_CACHED;

/// The buyer's settled orders ([`of_user`]) and the units they hold whose order
/// has not settled yet: of a sale of the list's first page, whose buyers include
/// them, when no settled order of theirs holds a unit of it.
pub async fn of_user_with_pending<S: CachedReads + ?Sized>(
    reads: &S,
    user: UserId,
) -> Result<MyOrders, AppError> {
    let sales = super::cached::load_page(reads, None, PENDING_SCAN)
        .await?
        .items;
    // Redis before Postgres: an order that settles in between shows as confirmed.
    let asked: Vec<(SaleId, i32)> = sales
        .iter()
        .map(|s| {
            let id = s.sale.id;
            (id, s.sale.max_per_user)
        })
        .collect();
    let bought = pending::bought_of(&mut reads.redis().clone(), reads.keys(), &asked, user).await?;
    let settled = of_user(reads.db(), user).await?;
    // What Redis counts for the buyer is every unit of their orders, settled or
    // not, but a returned order's only when the sale does not let its buyer buy
    // again (then the units stay counted against the cap); what settled orders
    // account for of that count is not pending.
    let settled_counted = |sale: &SaleView| -> i64 {
        settled
            .iter()
            .filter(|o| {
                o.sale_id == sale.sale.id.get()
                    && (!o.status.returned() || !sale.sale.rebuy_after_expiry)
            })
            .map(|o| i64::from(o.quantity))
            .sum()
    };
    let pending = sales
        .iter()
        .zip(bought)
        .filter_map(|(sale, (bought, held))| {
            let units = i64::from(held) - settled_counted(sale);
            (bought && units > 0).then(|| PendingUnits {
                sale_id: sale.sale.id.get(),
                sale_name: sale.sale.name.clone(),
                units: units as i32,
                price_cents: sale.sale.price_cents * units,
            })
        })
        .collect();
    Ok(MyOrders { pending, settled })
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

/// A settled order of a sale with its buyer's name, as the admin's page of the
/// sale's orders reads it.
#[derive(sqlx::FromRow)]
pub struct BuyerOrder {
    pub id: Uuid,
    pub username: String,
    pub accepted_at: DateTime<Utc>,
    pub settled_at: DateTime<Utc>,
    pub status: OrderStatus,
    pub pay_by: Option<DateTime<Utc>>,
    pub paid_at: Option<DateTime<Utc>>,
    /// `pay_by <= now()` by Postgres's clock.
    pub overdue: bool,
    /// Units bought.
    pub quantity: i32,
}

/// A page of a sale's settled orders with their buyers' names, oldest first (the
/// id breaking ties), so pages do not shift as orders settle.
pub async fn page_of_sale(
    db: &PgPool,
    sale: SaleId,
    limit: i64,
    offset: i64,
) -> sqlx::Result<Vec<BuyerOrder>> {
    sqlx::query_as(
        "SELECT o.id, u.username, o.accepted_at, o.settled_at, o.status, o.pay_by, o.paid_at,
                COALESCE(o.pay_by <= now(), false) AS overdue, o.quantity
         FROM orders o JOIN users u ON u.id = o.user_id
         WHERE o.sale_id = $1 ORDER BY o.accepted_at, o.id LIMIT $2 OFFSET $3",
    )
    .bind(sale.get())
    .bind(limit)
    .bind(offset)
    .fetch_all(db)
    .await
}

/// How many settled orders the sale has.
pub async fn count_of_sale(db: &PgPool, sale: SaleId) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT count(*) FROM orders WHERE sale_id = $1")
        .bind(sale.get())
        .fetch_one(db)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_statuses_read_back_what_they_write_and_nothing_else() {
        for status in OrderStatus::ALL {
            assert_eq!(OrderStatus::parse(status.as_str()), Some(status));
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::json!(status.as_str())
            );
        }
        assert_eq!(OrderStatus::parse("shipped"), None);
    }
}
