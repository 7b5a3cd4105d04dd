//! Cancelling an order: by its buyer while it is unpaid, or by an admin at any
//! time before it was cancelled or expired (a paid order is refunded).
//!
//! Its units go back exactly as an expired order's do (see [`super::payment`]):
//! in one transaction the order's row is locked (`FOR UPDATE`, so a payment, the
//! expiry or another cancel of it waits and then finds it no longer live), its
//! sale's row is held `FOR SHARE` (a rebuild sees all of it or none), the status
//! turns `cancelled` or `refunded`, and a `stock_changes` row of kind 'return'
//! records the units going back (one per order: the column is unique); an
//! admin's cancel is recorded in `admin_changes` in the same transaction. After
//! the commit [`stock::apply_pending`] applies the return to Redis once; if that
//! fails (Redis down, the sale being rebuilt), the return stays pending for the
//! expiry pass, the sweep or the rebuild. Whether the buyer may buy again is the
//! sale's `rebuy_after_expiry`, as for an expired order.
//!
//! Idempotency: a cancel may carry an `Idempotency-Key`, stored on the order
//! (`orders.cancel_key`, migrations/0010_cancel.sql). The same caller sending the
//! same key again gets the same answer (`replayed`), however many times; without
//! the key, or with another, a cancel of a cancelled order is 409 `not_cancellable`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::admin::SaleAdmin;
use super::cached;
use super::orders::OrderStatus;
use super::stock::{self, ChangeResult};
use crate::audit::{self, Action, Change, Subject};
use crate::domain::{Id, SaleId, UserId};
use crate::error::{AppError, ErrorCode};

/// Who asks for the cancel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// The order's buyer: only an unpaid order (accepted or awaiting payment).
    Buyer(UserId),
    /// An admin: any order not cancelled, refunded or expired; a paid one is refunded.
    Admin(UserId),
}

impl By {
    fn user(self) -> UserId {
        match self {
            By::Buyer(u) | By::Admin(u) => u,
        }
    }
}

/// The answer to a cancel: the order as it now stands.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Cancelled {
    pub order_id: Uuid,
    /// `cancelled`, or `refunded` for a paid order an admin cancelled.
    pub status: OrderStatus,
    pub cancelled_at: DateTime<Utc>,
    /// Units of the order that went back on sale.
    pub units_returned: i64,
    /// What the refund gave back (a refunded order only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refunded_cents: Option<i64>,
}

/// What a cancel came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The order is cancelled: now (`replayed` false), or earlier by this same
    /// caller under this same key (`replayed` true).
    Done { answer: Cancelled, replayed: bool },
    /// No such order in Postgres (for a buyer: none of theirs). It may still be
    /// settling: the caller asks the pending hash.
    NotFound,
}

/// The order as the cancel reads it, under its row lock.
#[derive(sqlx::FromRow)]
struct Row {
    sale_id: i64,
    user_id: i64,
    status: OrderStatus,
    quantity: i32,
    cancelled_by: Option<i64>,
    cancel_key: Option<String>,
    cancelled_at: Option<DateTime<Utc>>,
}

fn not_cancellable(message: &str) -> AppError {
    AppError::new(ErrorCode::NotCancellable, message.to_owned())
}

/// Cancels the order (see the module's comment), then gives its units back to
/// Redis. Refusals (409 `not_cancellable`) change nothing.
pub async fn cancel<S: SaleAdmin + ?Sized>(
    state: &S,
    by: By,
    order: Uuid,
    key: Option<&str>,
) -> Result<Outcome, AppError> {
    let (outcome, sale) = decide(state.db(), by, order, key).await?;
    if let (
        Outcome::Done {
            replayed: false, ..
        },
        Some(sale),
    ) = (&outcome, sale)
    {
        give_back(state, sale).await;
    }
    Ok(outcome)
}

/// The transaction: the order locked, checked, cancelled with its return recorded.
/// Returns the sale whose returns to apply (a fresh cancel only).
async fn decide(
    db: &sqlx::PgPool,
    by: By,
    order: Uuid,
    key: Option<&str>,
) -> Result<(Outcome, Option<SaleId>), AppError> {
    let mut tx = db.begin().await?;
    let row: Option<Row> = sqlx::query_as(
        "SELECT sale_id, user_id, status, quantity, cancelled_by, cancel_key, cancelled_at
         FROM orders WHERE id = $1 FOR UPDATE",
    )
    .bind(order)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row.filter(|r| match by {
        By::Buyer(u) => r.user_id == u.get(),
        By::Admin(_) => true,
    }) else {
        return Ok((Outcome::NotFound, None));
    };
    let caller = by.user().get();
    match row.status {
        OrderStatus::Cancelled | OrderStatus::Refunded => {
            let same_call = key.is_some()
                && row.cancel_key.as_deref() == key
                && row.cancelled_by == Some(caller);
            if !same_call {
                return Err(not_cancellable("this order is already cancelled"));
            }
            let refunded = refunded_cents(&mut tx, order, row.status).await?;
            let answer = Cancelled {
                order_id: order,
                status: row.status,
                cancelled_at: row.cancelled_at.unwrap_or_else(Utc::now),
                units_returned: i64::from(row.quantity),
                refunded_cents: refunded,
            };
            return Ok((
                Outcome::Done {
                    answer,
                    replayed: true,
                },
                None,
            ));
        }
        OrderStatus::Expired => {
            return Err(not_cancellable(
                "this order expired unpaid: its units already went back on sale",
            ));
        }
        OrderStatus::Paid if matches!(by, By::Buyer(_)) => {
            return Err(not_cancellable(
                "a paid order cannot be cancelled here: ask the shop for a refund",
            ));
        }
        OrderStatus::Accepted | OrderStatus::AwaitingPayment | OrderStatus::Paid => {}
    }
    let status = if row.status == OrderStatus::Paid {
        OrderStatus::Refunded
    } else {
        OrderStatus::Cancelled
    };
    // A rebuild holds its sale's row FOR UPDATE while it reads the orders: it sees
    // this cancel and its return, or neither (as the expiry does).
    sqlx::query("SELECT id FROM sales WHERE id = $1 FOR SHARE")
        .bind(row.sale_id)
        .execute(&mut *tx)
        .await?;
    let cancelled_at: DateTime<Utc> = sqlx::query_scalar(
        "UPDATE orders SET status = $2, cancelled_at = now(), cancelled_by = $3, cancel_key = $4
         WHERE id = $1 RETURNING cancelled_at",
    )
    .bind(order)
    .bind(status.as_str())
    .bind(caller)
    .bind(key)
    .fetch_one(&mut *tx)
    .await?;
    if status == OrderStatus::Refunded {
        sqlx::query(
            "UPDATE payments SET refunded_at = now()
             WHERE order_id = $1 AND http_status = 200 AND refunded_at IS NULL",
        )
        .bind(order)
        .execute(&mut *tx)
        .await?;
    }
    let refunded = refunded_cents(&mut tx, order, status).await?;
    sqlx::query(
        "INSERT INTO stock_changes (sale_id, kind, amount, order_id) VALUES ($1, 'return', $2, $3)",
    )
    .bind(row.sale_id)
    .bind(i64::from(row.quantity))
    .bind(order)
    .execute(&mut *tx)
    .await?;
    let answer = Cancelled {
        order_id: order,
        status,
        cancelled_at,
        units_returned: i64::from(row.quantity),
        refunded_cents: refunded,
    };
    let sale = Id::new(row.sale_id)
        .ok_or_else(|| AppError::Internal(anyhow::anyhow!("order {order} has sale id 0")))?;
    if let By::Admin(admin) = by {
        audit::record(
            &mut tx,
            Change {
                admin,
                action: if status == OrderStatus::Refunded {
                    Action::Refund
                } else {
                    Action::Cancel
                },
                subject: Subject::Order(sale, order),
                before: Some(serde_json::json!({ "status": row.status.as_str() })),
                after: Some(serde_json::json!({
                    "status": status.as_str(),
                    "cancelled_at": cancelled_at,
                    "units_returned": row.quantity,
                    "refunded_cents": refunded,
                    "idempotency_key": key,
                })),
            },
        )
        .await?;
    }
    tx.commit().await?;
    Ok((
        Outcome::Done {
            answer,
            replayed: false,
        },
        Some(sale),
    ))
}

/// What was refunded for the order: the sum of its refunded payments, for a
/// refunded order; none for a cancelled one.
async fn refunded_cents(
    tx: &mut sqlx::PgConnection,
    order: Uuid,
    status: OrderStatus,
) -> Result<Option<i64>, AppError> {
    if status != OrderStatus::Refunded {
        return Ok(None);
    }
    let cents: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(amount_cents), 0)::int8 FROM payments
         WHERE order_id = $1 AND refunded_at IS NOT NULL",
    )
    .bind(order)
    .fetch_one(&mut *tx)
    .await?;
    Ok(Some(cents))
}

/// Applies the sale's pending returns (this cancel's among them) to Redis, and
/// lets this process sell the units at once. A failure is logged, never answered:
/// the cancel has committed, and its return stays pending for the next pass.
async fn give_back<S: SaleAdmin + ?Sized>(state: &S, sale: SaleId) {
    let results = match stock::apply_pending(
        state.db(),
        &mut state.redis().clone(),
        state.keys(),
        sale,
    )
    .await
    {
        Ok(results) => results,
        Err(e) => {
            tracing::warn!(sale = %sale, error = ?e, "cancelled order's units not returned yet; retrying later");
            return;
        }
    };
    if results
        .iter()
        .any(|(_, r)| matches!(r, ChangeResult::Applied { left, .. } if *left > 0))
    {
        state.sold_out().clear(sale);
    }
    if let Err(e) = cached::invalidate(state, sale).await {
        tracing::warn!(sale = %sale, error = ?e, "sale view not invalidated after a cancel");
    }
}
