//! What sold: a sale's totals (units sold, returned; revenue paid, awaiting,
//! refunded) and every settled order as CSV (`GET /api/admin/sales/{id}/orders.csv`),
//! streamed from one Postgres query through a small bounded channel, never all in
//! memory.
//!
//! One definition, [`Bucket::of`], says where an order's units and money count by
//! its status, for the totals, the admin's orders page and the CSV alike, so the
//! CSV's money columns add up to the totals. An order is worth the sale's
//! `price_cents` times its `quantity` (the price is fixed once the sale has orders).
//! Sold: `accepted`, `awaiting_payment`, `paid`. Revenue paid counts `paid` orders
//! and, on a sale with no payment step, `accepted` ones (complete on acceptance);
//! revenue awaiting counts `awaiting_payment`; revenue refunded counts `refunded`
//! (paid, then cancelled by an admin). Returned: the units of `expired`,
//! `cancelled` and `refunded` orders, which went back on sale.

use actix_web::web::Bytes;
use chrono::{DateTime, Utc};
use futures_util::{Stream, TryStreamExt};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::orders::OrderStatus;
use crate::csv::{self, CsvOut};
use crate::domain::SaleId;
use crate::error::AppError;

/// Where an order's units and money count, by its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucket {
    /// Sold and paid for: `paid`, or `accepted` (a sale with no payment step).
    Paid,
    /// Sold, its payment awaited.
    Awaiting,
    /// Returned: not paid in time.
    Expired,
    /// Returned: cancelled before it was paid; nothing was charged.
    Cancelled,
    /// Returned: paid, then cancelled by an admin and its payment refunded.
    Refunded,
}

impl Bucket {
    pub fn of(status: OrderStatus) -> Self {
        match status {
            OrderStatus::Accepted | OrderStatus::Paid => Bucket::Paid,
            OrderStatus::AwaitingPayment => Bucket::Awaiting,
            OrderStatus::Expired => Bucket::Expired,
            OrderStatus::Cancelled => Bucket::Cancelled,
            OrderStatus::Refunded => Bucket::Refunded,
        }
    }
}

/// A sale's settled orders summed up. Units sold and units returned add up to the
/// units of every settled order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SaleTotals {
    /// Settled orders, whatever their status.
    pub orders: i64,
    /// Units held by settled orders: accepted, awaiting payment or paid (not
    /// expired, cancelled or refunded). `units_paid + units_awaiting`.
    pub units_sold: i64,
    /// Units of paid orders, and of accepted ones on a sale with no payment step.
    pub units_paid: i64,
    /// Units of orders awaiting payment.
    pub units_awaiting: i64,
    /// Units that went back on sale: of expired, cancelled and refunded orders.
    /// `units_expired + units_cancelled + units_refunded`.
    pub units_returned: i64,
    /// Units of orders not paid in time.
    pub units_expired: i64,
    /// Units of orders cancelled unpaid (by the buyer or an admin).
    pub units_cancelled: i64,
    /// Units of paid orders an admin cancelled, their payment refunded.
    pub units_refunded: i64,
    /// `price_cents` times `units_paid`: what the shop keeps.
    pub revenue_paid_cents: i64,
    /// `price_cents` times `units_awaiting`.
    pub revenue_awaiting_cents: i64,
    /// `price_cents` times `units_refunded`: what refunds gave back.
    pub revenue_refunded_cents: i64,
}

impl SaleTotals {
    /// Counts one status's orders and units in.
    fn add(&mut self, status: OrderStatus, orders: i64, units: i64) {
        self.orders += orders;
        match Bucket::of(status) {
            Bucket::Paid => self.units_paid += units,
            Bucket::Awaiting => self.units_awaiting += units,
            Bucket::Expired => self.units_expired += units,
            Bucket::Cancelled => self.units_cancelled += units,
            Bucket::Refunded => self.units_refunded += units,
        }
    }

    /// The sums and the money, once every status is in.
    fn priced(mut self, price_cents: i64) -> Self {
        self.units_sold = self.units_paid + self.units_awaiting;
        self.units_returned = self.units_expired + self.units_cancelled + self.units_refunded;
        self.revenue_paid_cents = self.units_paid.saturating_mul(price_cents);
        self.revenue_awaiting_cents = self.units_awaiting.saturating_mul(price_cents);
        self.revenue_refunded_cents = self.units_refunded.saturating_mul(price_cents);
        self
    }
}

/// The totals of the sale's settled orders, at `price_cents` a unit.
pub async fn totals(db: &PgPool, sale: SaleId, price_cents: i64) -> Result<SaleTotals, AppError> {
    let by_status: Vec<(OrderStatus, i64, i64)> = sqlx::query_as(
        "SELECT status, count(*), COALESCE(sum(quantity), 0)::int8
         FROM orders WHERE sale_id = $1 GROUP BY status",
    )
    .bind(sale.get())
    .fetch_all(db)
    .await?;
    let mut totals = SaleTotals::default();
    for (status, orders, units) in by_status {
        totals.add(status, orders, units);
    }
    Ok(totals.priced(price_cents))
}

/// The CSV's header row.
pub const CSV_HEADER: &str = "order_id,buyer,user_id,units,status,accepted_at,settled_at,\
paid_at,expired_at,cancelled_at,refunded_at,amount_paid_cents,amount_awaiting_cents,\
amount_refunded_cents\r\n";

#[derive(sqlx::FromRow)]
struct CsvOrder {
    id: Uuid,
    username: String,
    user_id: i64,
    quantity: i32,
    status: OrderStatus,
    accepted_at: DateTime<Utc>,
    settled_at: DateTime<Utc>,
    paid_at: Option<DateTime<Utc>>,
    expired_at: Option<DateTime<Utc>>,
    cancelled_at: Option<DateTime<Utc>>,
}

/// Every settled order of the sale, oldest first, as CSV lines after
/// [`CSV_HEADER`]; the order's worth (`price_cents` times the units) goes in the
/// one money column of its [`Bucket`] (paid, awaiting or refunded; none for an
/// expired or cancelled order), so each column sums to its total. One query on
/// one connection of `db` (see [`csv::download_transaction`]), read as the client
/// takes the chunks; a client that leaves ends it.
pub fn orders_csv(
    db: PgPool,
    sale: SaleId,
    price_cents: i64,
) -> impl Stream<Item = Result<Bytes, AppError>> + 'static {
    let span = tracing::warn_span!("orders_csv", sale = %sale);
    csv::stream(span, CSV_HEADER, None, move |out| {
        write_csv(db, sale, price_cents, out)
    })
}

async fn write_csv(
    db: PgPool,
    sale: SaleId,
    price_cents: i64,
    mut out: CsvOut,
) -> Result<(), AppError> {
    let mut tx = csv::download_transaction(&db).await?;
    {
        let mut rows = sqlx::query_as::<_, CsvOrder>(
            "SELECT o.id, u.username, o.user_id, o.quantity, o.status, o.accepted_at,
                    o.settled_at, o.paid_at, o.expired_at, o.cancelled_at
             FROM orders o JOIN users u ON u.id = o.user_id
             WHERE o.sale_id = $1 ORDER BY o.accepted_at, o.id",
        )
        .bind(sale.get())
        .fetch(&mut *tx);
        while let Some(order) = rows.try_next().await? {
            push_row(out.buf(), &order, price_cents);
            if !out.row_done().await {
                // The client left.
                return Ok(());
            }
        }
    }
    tx.commit().await?;
    out.finish().await;
    Ok(())
}

fn push_row(buf: &mut String, o: &CsvOrder, price_cents: i64) {
    use crate::csv::{push_field, time};
    use std::fmt::Write;
    let bucket = Bucket::of(o.status);
    let worth = i64::from(o.quantity).saturating_mul(price_cents);
    let amount = |b: Bucket| if bucket == b { worth } else { 0 };
    // An admin's cancel refunds a paid order in its own transaction: the refund's
    // time is the cancel's.
    let refunded_at = o.cancelled_at.filter(|_| bucket == Bucket::Refunded);
    let _ = write!(buf, "{},", o.id);
    push_field(buf, &o.username);
    let _ = write!(
        buf,
        ",{},{},{},{},{},{},{},{},{},{},{},{}\r\n",
        o.user_id,
        o.quantity,
        o.status.as_str(),
        time(Some(o.accepted_at)),
        time(Some(o.settled_at)),
        time(o.paid_at),
        time(o.expired_at),
        time(o.cancelled_at),
        time(refunded_at),
        amount(Bucket::Paid),
        amount(Bucket::Awaiting),
        amount(Bucket::Refunded),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_split_units_and_money_by_status() {
        let mut t = SaleTotals::default();
        t.add(OrderStatus::Paid, 2, 3);
        t.add(OrderStatus::AwaitingPayment, 1, 1);
        t.add(OrderStatus::Expired, 1, 1);
        t.add(OrderStatus::Cancelled, 1, 2);
        t.add(OrderStatus::Refunded, 1, 1);
        let t = t.priced(500);
        assert_eq!((t.orders, t.units_sold, t.units_returned), (6, 4, 4));
        assert_eq!(
            (
                t.revenue_paid_cents,
                t.revenue_awaiting_cents,
                t.revenue_refunded_cents
            ),
            (1500, 500, 500)
        );
        assert_eq!(CSV_HEADER.matches(',').count(), 13);
    }
}
