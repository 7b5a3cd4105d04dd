//! Settling a sale's accepted orders (the [`Settle`] of sales, driven by
//! [`crate::settle`]): each order of an entry of `{sale:N}:accepted` (one entry per
//! decision batch, see [`entry`]), or of an earlier version's `{sale:N}:orders`,
//! becomes a row of `orders`, waiting for its payment when the sale has a payment
//! window.

use chrono::DateTime;
use futures_util::future::BoxFuture;
use redis::streams::StreamId;
use sqlx::PgPool;
use uuid::Uuid;

use super::entry;
use crate::domain::SaleId;
use crate::keys::Keys;
use crate::redis_conn::Redis;
use crate::settle::{Accepted, Entries, Insert, Settle, Stream, Written};

/// The sales, as the settlement worker sees them.
pub struct Orders;

/// A sale's stream of accepted orders, with its pending-orders hash.
pub fn stream(keys: &Keys, sale: SaleId) -> Stream {
    let (orders, _, pending) = keys.sale_streams(sale);
    Stream::new(orders, Some(pending))
}

/// The stream earlier versions wrote the sale's orders to (one entry per order):
/// read only while it holds entries (see [`Stream::legacy`]).
pub fn legacy_stream(keys: &Keys, sale: SaleId) -> Stream {
    let (_, legacy, pending) = keys.sale_streams(sale);
    Stream::legacy(legacy, Some(pending))
}

impl Settle for Orders {
    fn streams<'a>(
        &'a self,
        db: &'a PgPool,
        keys: &'a Keys,
        days: i32,
    ) -> BoxFuture<'a, Result<Vec<Stream>, sqlx::Error>> {
        Box::pin(async move {
            let sales: Vec<SaleId> = sqlx::query_scalar(
                "SELECT id FROM sales WHERE ends_at > now() - make_interval(days => $1) ORDER BY id",
            )
            .bind(days)
            .fetch_all(db)
            .await?;
            Ok(sales
                .into_iter()
                .flat_map(|id| {
                    let (orders, legacy, pending) = keys.sale_streams(id);
                    [
                        Stream::new(orders, Some(pending.clone())),
                        Stream::legacy(legacy, Some(pending)),
                    ]
                })
                .collect())
        })
    }

    fn parse(&self, entry: &StreamId) -> Option<Vec<Accepted>> {
        let sale = entry::sale_of(entry)?;
        entry::orders_of(entry)?
            .into_iter()
            .map(|o| {
                Some(Accepted {
                    id: Some(o.order),
                    owner: sale,
                    user: o.user,
                    at: DateTime::from_timestamp_millis(o.at_ms)?,
                    value: o.units,
                    key: o.key,
                    vote: None,
                })
            })
            .collect()
    }

    fn write<'a>(
        &'a self,
        tx: &'a mut sqlx::PgConnection,
        rows: &'a [Accepted],
        insert: Insert,
    ) -> BoxFuture<'a, Result<Written, sqlx::Error>> {
        Box::pin(insert_orders(tx, rows, insert))
    }

    /// A batch entry's `orders` text (the value of its batch's field in the
    /// pending hash), or an earlier version's entry's order id (its own field).
    fn pending_record(&self, entry: &StreamId) -> Option<String> {
        entry
            .get::<String>("orders")
            .or_else(|| entry.get::<String>("order_id"))
    }

    fn drop_pending<'a>(
        &'a self,
        redis: &'a mut Redis,
        pending: &'a str,
        records: &'a [String],
        entries: Entries<'a>,
    ) -> BoxFuture<'a, redis::RedisResult<bool>> {
        Box::pin(async move {
            super::pending::drop_settled_and_acknowledge(
                redis,
                pending,
                records,
                entries.stream,
                entries.group,
                entries.ids,
            )
            .await?;
            Ok(true)
        })
    }
}

/// The insert of a batch of orders: `$key`, the expression of each order's
/// idempotency key, then `$tail` after it (nothing, or `ON CONFLICT DO NOTHING`).
macro_rules! insert_orders_sql {
    ($key:literal, $tail:literal) => {
        concat!(
            // A sale with a payment window makes the order wait for its payment
            // until `accepted_at` + the window (see migrations/0007_payment.sql).
            "INSERT INTO orders (id, sale_id, user_id, accepted_at, status, pay_by, quantity,
                                 multi_unit, idempotency_key)
             SELECT o.id, o.sale_id, o.user_id, o.accepted_at,
                    CASE WHEN s.payment_window_s > 0 THEN 'awaiting_payment' ELSE 'accepted' END,
                    CASE WHEN s.payment_window_s > 0
                         THEN o.accepted_at + make_interval(secs => s.payment_window_s) END,
                    o.quantity, s.max_per_user > 1, ",
            $key,
            "
             FROM (SELECT unnest($1::uuid[]) AS id, unnest($2::int8[]) AS sale_id,
                          unnest($3::int8[]) AS user_id, unnest($4::timestamptz[]) AS accepted_at,
                          unnest($5::int4[]) AS quantity, unnest($6::text[]) AS idempotency_key) o
             -- Each array unnested in the select list: in step, row by row (the
             -- `UNNEST(a, b, ...)` of a FROM first stores its rows: 0.2 us a row more).
             -- In place of foreign keys (migrations/0012): an order of a sale or a user
             -- that is gone is not written (and is reported below). Users are removed
             -- only by the rehearsal cleanup, which records it: the user is looked up
             -- only while a removal is open (migrations/0015). The first test is
             -- evaluated once per statement, and when it holds no user is looked up.
             JOIN sales s ON s.id = o.sale_id
             WHERE NOT EXISTS (SELECT 1 FROM user_removals r WHERE r.until > now())
                OR EXISTS (SELECT 1 FROM users u WHERE u.id = o.user_id)",
            $tail
        )
    };
}

/// Inserts the orders (`Fresh`: a plain insert, failing on an order already there;
/// `Tolerant`: `ON CONFLICT DO NOTHING`); returns the rows inserted and the ids of
/// those skipped that are not there (a conflict, not a redelivery, or a sale or
/// user that is gone).
pub(super) async fn insert_orders(
    tx: &mut sqlx::PgConnection,
    rows: &[Accepted],
    insert: Insert,
) -> Result<Written, sqlx::Error> {
    let ids: Vec<Uuid> = rows.iter().filter_map(|r| r.id).collect();
    let sales: Vec<i64> = rows.iter().map(|r| r.owner).collect();
    let users: Vec<i64> = rows.iter().map(|r| r.user).collect();
    let times: Vec<DateTime<chrono::Utc>> = rows.iter().map(|r| r.at).collect();
    let quantities: Vec<i32> = rows
        .iter()
        .map(|r| i32::try_from(r.value).unwrap_or(i32::MAX))
        .collect();
    // A key Redis forgot (older than `purchase_key_ttl`) and then met again made a
    // second order: it settles without the key, which stays its first order's
    // (the unique index would otherwise refuse the order itself).
    let mut seen = std::collections::HashSet::new();
    let keys: Vec<Option<&str>> = rows
        .iter()
        .map(|r| {
            r.key
                .as_deref()
                .filter(|k| seen.insert((r.owner, r.user, *k)))
        })
        .collect();
    // A key Redis forgot and met again is rare: the plain insert writes every key as
    // it came, and such an order fails it on `orders_purchase_key` (a unique
    // violation: the batch is written again as `Tolerant`). Only the tolerant insert
    // looks for the key's first order, row by row: that lookup cost every keyed row
    // about 0.7 us of Postgres, and the expression 0.2 us every row (docs/capacity.md).
    let sql = match insert {
        Insert::Fresh => insert_orders_sql!("o.idempotency_key", ""),
        Insert::Tolerant => insert_orders_sql!(
            "CASE WHEN o.idempotency_key IS NULL THEN NULL
                  WHEN NOT EXISTS (SELECT 1 FROM orders k
                                   WHERE k.sale_id = o.sale_id AND k.user_id = o.user_id
                                     AND k.idempotency_key = o.idempotency_key
                                     AND k.id <> o.id)
                  THEN o.idempotency_key END",
            " ON CONFLICT DO NOTHING"
        ),
    };
    let inserted = sqlx::query(sql)
        .bind(&ids)
        .bind(&sales)
        .bind(&users)
        .bind(&times)
        .bind(&quantities)
        .bind(&keys)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if inserted as usize == ids.len() {
        return Ok(Written {
            inserted,
            conflicting: Vec::new(),
        });
    }
    // Skipped rows are redeliveries (the id is there) or conflicts (it is not: another
    // order of the same buyer, or a sale or user that is gone).
    let conflicting: Vec<Uuid> = sqlx::query_scalar(
        "SELECT u FROM UNNEST($1::uuid[]) AS u
         WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = u)",
    )
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    Ok(Written {
        inserted,
        conflicting: conflicting.iter().map(|id| format!("order {id}")).collect(),
    })
}
