//! What sold: a sale's totals (units, revenue paid and awaiting) and every settled
//! order as CSV (`GET /api/admin/sales/{id}/orders.csv`), streamed from one
//! Postgres query through a small bounded channel, never all in memory.
//!
//! Money: an order is worth the sale's `price_cents` times its `quantity` (the
//! price is fixed once the sale has orders). Revenue paid counts `paid` orders and,
//! on a sale with no payment step, `accepted` ones (complete on acceptance);
//! revenue awaiting counts `awaiting_payment`. Expired, cancelled and refunded
//! orders count in neither.

use actix_web::web::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use futures_util::{Stream, TryStreamExt};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::orders::OrderStatus;
use crate::domain::SaleId;
use crate::error::AppError;

/// A sale's settled orders summed up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SaleTotals {
    /// Settled orders, whatever their status.
    pub orders: i64,
    /// Units held by settled orders: accepted, awaiting payment or paid (not
    /// expired, cancelled or refunded).
    pub units_sold: i64,
    /// Units of paid orders, and of accepted ones on a sale with no payment step.
    pub units_paid: i64,
    /// Units of orders awaiting payment.
    pub units_awaiting: i64,
    /// `price_cents` times `units_paid`.
    pub revenue_paid_cents: i64,
    /// `price_cents` times `units_awaiting`.
    pub revenue_awaiting_cents: i64,
}

/// The totals of the sale's settled orders, at `price_cents` a unit.
pub async fn totals(db: &PgPool, sale: SaleId, price_cents: i64) -> Result<SaleTotals, AppError> {
    let (orders, units_sold, units_paid, units_awaiting): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT count(*),
                COALESCE(sum(quantity) FILTER (WHERE status IN ('accepted', 'awaiting_payment', 'paid')), 0)::int8,
                COALESCE(sum(quantity) FILTER (WHERE status IN ('accepted', 'paid')), 0)::int8,
                COALESCE(sum(quantity) FILTER (WHERE status = 'awaiting_payment'), 0)::int8
         FROM orders WHERE sale_id = $1",
    )
    .bind(sale.get())
    .fetch_one(db)
    .await?;
    Ok(SaleTotals {
        orders,
        units_sold,
        units_paid,
        units_awaiting,
        revenue_paid_cents: units_paid.saturating_mul(price_cents),
        revenue_awaiting_cents: units_awaiting.saturating_mul(price_cents),
    })
}

/// The CSV's header row.
pub const CSV_HEADER: &str =
    "order_id,buyer,user_id,units,status,accepted_at,settled_at,paid_at,amount_cents\r\n";

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
}

/// Bytes gathered before a chunk is handed to the client.
const CHUNK_BYTES: usize = 32 * 1024;
/// Chunks in flight between the query and the client: what a slow client makes
/// the server hold is about this times [`CHUNK_BYTES`].
const CHUNKS_AHEAD: usize = 4;

/// Every settled order of the sale, oldest first, as CSV lines after
/// [`CSV_HEADER`]; `amount_cents` is `price_cents` times the units. One query on
/// one connection of `db` (its statement timeout lifted for this download), read
/// as the client takes the chunks; a client that leaves ends it.
pub fn orders_csv(
    db: PgPool,
    sale: SaleId,
    price_cents: i64,
) -> impl Stream<Item = Result<Bytes, AppError>> + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, AppError>>(CHUNKS_AHEAD);
    actix_web::rt::spawn(async move {
        let sent = write_csv(&db, sale, price_cents, &tx).await;
        if let Err(e) = sent {
            tracing::warn!(sale = %sale, error = ?e, "orders CSV cut short");
            let _ = tx.send(Err(e)).await;
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

async fn write_csv(
    db: &PgPool,
    sale: SaleId,
    price_cents: i64,
    out: &tokio::sync::mpsc::Sender<Result<Bytes, AppError>>,
) -> Result<(), AppError> {
    let mut tx = db.begin().await?;
    // One statement that lasts as long as the download.
    sqlx::query("SET LOCAL statement_timeout = 0")
        .execute(&mut *tx)
        .await?;
    let mut buf = String::with_capacity(CHUNK_BYTES + 512);
    buf.push_str(CSV_HEADER);
    {
        let mut rows = sqlx::query_as::<_, CsvOrder>(
            "SELECT o.id, u.username, o.user_id, o.quantity, o.status, o.accepted_at,
                    o.settled_at, o.paid_at
             FROM orders o JOIN users u ON u.id = o.user_id
             WHERE o.sale_id = $1 ORDER BY o.accepted_at, o.id",
        )
        .bind(sale.get())
        .fetch(&mut *tx);
        while let Some(order) = rows.try_next().await? {
            push_row(&mut buf, &order, price_cents);
            if buf.len() >= CHUNK_BYTES {
                let chunk = Bytes::from(std::mem::take(&mut buf));
                if out.send(Ok(chunk)).await.is_err() {
                    // The client left.
                    return Ok(());
                }
                buf.reserve(CHUNK_BYTES + 512);
            }
        }
    }
    tx.commit().await?;
    if !buf.is_empty() {
        let _ = out.send(Ok(Bytes::from(buf))).await;
    }
    Ok(())
}

fn push_row(buf: &mut String, o: &CsvOrder, price_cents: i64) {
    use std::fmt::Write;
    let time = |t: DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Millis, true);
    let _ = write!(buf, "{},", o.id);
    push_field(buf, &o.username);
    let _ = write!(
        buf,
        ",{},{},{},{},{},{},{}\r\n",
        o.user_id,
        o.quantity,
        o.status.as_str(),
        time(o.accepted_at),
        time(o.settled_at),
        o.paid_at.map(time).unwrap_or_default(),
        i64::from(o.quantity).saturating_mul(price_cents),
    );
}

/// One field of text, as RFC 4180 wants it: quoted (inner quotes doubled) when it
/// holds a comma, a quote or a line break. Text a spreadsheet would run as a
/// formula (starting with `=`, `+`, `-`, `@`, a tab or a carriage return) gets a
/// leading `'` and quotes, as OWASP advises for CSV files opened in spreadsheets.
pub fn push_field(buf: &mut String, text: &str) {
    let formula = text.starts_with(['=', '+', '-', '@', '\t', '\r']);
    let quote = formula || text.contains([',', '"', '\r', '\n']);
    if !quote {
        buf.push_str(text);
        return;
    }
    buf.push('"');
    if formula {
        buf.push('\'');
    }
    for c in text.chars() {
        if c == '"' {
            buf.push('"');
        }
        buf.push(c);
    }
    buf.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(text: &str) -> String {
        let mut buf = String::new();
        push_field(&mut buf, text);
        buf
    }

    #[test]
    fn fields_are_quoted_only_when_they_must_be() {
        assert_eq!(field("alice"), "alice");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(field("two\nlines"), "\"two\nlines\"");
        assert_eq!(field("-1+2"), "\"'-1+2\"");
        assert_eq!(field("=SUM(A1)"), "\"'=SUM(A1)\"");
        assert_eq!(field(""), "");
    }
}
