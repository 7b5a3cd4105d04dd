//! Payment of orders (a simulated provider) and the expiry of unpaid ones.
//!
//! A sale with a payment window makes each settled order `awaiting_payment` until
//! `pay_by` (see migrations/0007_payment.sql). Payment and expiry both take the
//! order's row lock and act only on an order still `awaiting_payment`, so for one
//! order exactly one of them wins. An expiry and its "unit returned" record
//! (a `stock_changes` row of kind 'return') commit in one transaction; the unit
//! reaches Redis through [`super::stock::apply_pending`], exactly once, whoever
//! dies in between (the sweep finishes returns left pending).

use super::orders::OrderStatus;
use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::{Id, SaleId, UserId};
use crate::error::{AppError, ErrorCode};
use crate::keys::Keys;
use crate::sale::stock::{self, ChangeResult};

/// The answer to a payment, as stored for replays: the status and the JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct PayAnswer {
    pub http_status: u16,
    pub body: serde_json::Value,
    /// True when this is the stored answer of an earlier request with the same key.
    pub replayed: bool,
}

/// What a payment request came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Payment {
    /// Decided now or before (a replay): the answer to send.
    Answer(PayAnswer),
    /// No such order of this user in Postgres (it may still be settling).
    NotFound,
    /// The key was used before for another order.
    KeyReused { order_id: Uuid },
}

/// The body of a successful payment.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Paid {
    pub order_id: Uuid,
    /// Always `paid`.
    pub status: OrderStatus,
    pub paid_at: DateTime<Utc>,
    pub amount_cents: i64,
}

/// The order as the payment reads it, under its row lock.
#[derive(sqlx::FromRow)]
struct Payable {
    user_id: i64,
    status: OrderStatus,
    /// The order's price: the sale's price times its units.
    price_cents: i64,
    /// `pay_by <= now()`: the deadline has passed (the expiry job may not have run).
    overdue: bool,
}

/// Pays the user's order, once: the first request with a given key decides and
/// stores its answer; a retry with the same key gets that answer back (even while
/// the first is still running: it waits for it), and a new key on a paid order is
/// answered 409 `already_paid`. Never pays twice, never pays an expired order.
pub async fn pay(db: &PgPool, user: UserId, order: Uuid, key: &str) -> Result<Payment, AppError> {
    // Twice at most: a request that loses the race for its key to a concurrent one
    // with the same key rolls back and replays that one's answer.
    for _ in 0..2 {
        if let Some(found) = stored(db, user, key, order).await? {
            return Ok(found);
        }
        let mut tx = db.begin().await?;
        let payable: Option<Payable> = sqlx::query_as(
            "SELECT o.user_id, o.status, s.price_cents * o.quantity AS price_cents,
                    COALESCE(o.pay_by <= now(), false) AS overdue
             FROM orders o JOIN sales s ON s.id = o.sale_id
             WHERE o.id = $1 FOR UPDATE OF o",
        )
        .bind(order)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(payable) = payable.filter(|p| p.user_id == user.get()) else {
            return Ok(Payment::NotFound);
        };
        let (answer, amount) = decide(&mut tx, order, &payable).await?;
        let kept = sqlx::query(
            "INSERT INTO payments (user_id, idempotency_key, order_id, amount_cents, http_status, answer)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        )
        .bind(user.get())
        .bind(key)
        .bind(order)
        .bind(amount)
        .bind(i16::try_from(answer.http_status).unwrap_or(500))
        .bind(&answer.body)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if kept == 1 {
            tx.commit().await?;
            return Ok(Payment::Answer(answer));
        }
        // Another request with this key committed first: drop ours, replay its.
        tx.rollback().await?;
    }
    Err(AppError::Internal(anyhow::anyhow!(
        "payment key {key:?} of user {user} neither stored nor free"
    )))
}

/// The stored answer for this user's key, if any; a key stored for another order
/// is refused (a client bug: one key per payment).
async fn stored(
    db: &PgPool,
    user: UserId,
    key: &str,
    order: Uuid,
) -> Result<Option<Payment>, AppError> {
    let row: Option<(Uuid, i16, serde_json::Value)> = sqlx::query_as(
        "SELECT order_id, http_status, answer FROM payments
         WHERE user_id = $1 AND idempotency_key = $2",
    )
    .bind(user.get())
    .bind(key)
    .fetch_optional(db)
    .await?;
    Ok(row.map(|(order_id, http_status, body)| {
        if order_id != order {
            return Payment::KeyReused { order_id };
        }
        Payment::Answer(PayAnswer {
            http_status: u16::try_from(http_status).unwrap_or(500),
            body,
            replayed: true,
        })
    }))
}

/// Decides the payment of a locked order: pays it when it is still awaiting payment
/// and within its deadline. Returns the answer and the amount charged.
async fn decide(
    tx: &mut sqlx::PgConnection,
    order: Uuid,
    p: &Payable,
) -> Result<(PayAnswer, i64), AppError> {
    let refusal = |code: ErrorCode, message: &str| {
        let body = serde_json::json!({
            "error": code.as_str(),
            "message": message,
            "order_id": order,
        });
        PayAnswer {
            http_status: code.status().as_u16(),
            body,
            replayed: false,
        }
    };
    let answer = match p.status {
        OrderStatus::AwaitingPayment if !p.overdue => {
            let paid_at: DateTime<Utc> = sqlx::query_scalar(
                "UPDATE orders SET status = 'paid', paid_at = now() WHERE id = $1 RETURNING paid_at",
            )
            .bind(order)
            .fetch_one(&mut *tx)
            .await?;
            let body = serde_json::to_value(Paid {
                order_id: order,
                status: OrderStatus::Paid,
                paid_at,
                amount_cents: p.price_cents,
            })
            .map_err(|e| AppError::Internal(e.into()))?;
            let answer = PayAnswer {
                http_status: 200,
                body,
                replayed: false,
            };
            return Ok((answer, p.price_cents));
        }
        OrderStatus::AwaitingPayment | OrderStatus::Expired => refusal(
            ErrorCode::PaymentExpired,
            "the payment deadline has passed: the order expired and its unit went back on sale",
        ),
        OrderStatus::Paid => refusal(ErrorCode::AlreadyPaid, "this order is already paid"),
        OrderStatus::Cancelled | OrderStatus::Refunded => refusal(
            ErrorCode::NotCancellable,
            "this order was cancelled: its units went back on sale",
        ),
        OrderStatus::Accepted => refusal(
            ErrorCode::NoPaymentNeeded,
            "this sale has no payment step: the order is complete",
        ),
    };
    Ok((answer, 0))
}

/// Expires up to `limit` orders past their deadline, oldest deadline first, and
/// records each one's returned unit, in one transaction. Returns the sales whose
/// stock changed (apply their pending changes next). Orders another transaction
/// holds (a payment in progress) are skipped, and taken next time if still due.
pub async fn expire_due(db: &PgPool, limit: i64) -> Result<(usize, Vec<SaleId>), AppError> {
    let mut tx = db.begin().await?;
    let due: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT id, sale_id FROM orders
         WHERE status = 'awaiting_payment' AND pay_by <= now()
         ORDER BY pay_by LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    if due.is_empty() {
        return Ok((0, Vec::new()));
    }
    let mut sales: Vec<i64> = due.iter().map(|(_, sale)| *sale).collect();
    sales.sort_unstable();
    sales.dedup();
    // A rebuild holds its sale's row FOR UPDATE while it reads the orders: it sees
    // all of this expiry and its returns, or none of them.
    sqlx::query("SELECT id FROM sales WHERE id = ANY($1) ORDER BY id FOR SHARE")
        .bind(&sales)
        .execute(&mut *tx)
        .await?;
    let ids: Vec<Uuid> = due.iter().map(|(id, _)| *id).collect();
    sqlx::query("UPDATE orders SET status = 'expired', expired_at = now() WHERE id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO stock_changes (sale_id, kind, amount, order_id)
         SELECT sale_id, 'return', quantity, id FROM orders WHERE id = ANY($1) ORDER BY pay_by, id",
    )
    .bind(&ids)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok((due.len(), sales.into_iter().filter_map(Id::new).collect()))
}

/// When an expiry pass next has something to do: now (zero) when an unpaid order
/// is past its deadline or a return an earlier pass recorded was not applied (what
/// [`expire_pass`] looks for); else in how long the earliest unpaid order falls
/// due; `None` when no order awaits payment. One indexed question, no lock.
pub async fn expiry_next(db: &PgPool) -> Result<Option<std::time::Duration>, AppError> {
    let seconds: Option<f64> = sqlx::query_scalar(
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM stock_changes WHERE kind = 'return' AND status = 'pending')
                     THEN 0
                     ELSE extract(epoch FROM (SELECT min(pay_by) FROM orders WHERE status = 'awaiting_payment') - now())
                END::float8",
    )
    .fetch_one(db)
    .await?;
    Ok(seconds.map(|s| std::time::Duration::from_secs_f64(s.max(0.0))))
}

/// What one expiry pass did.
#[derive(Debug, Default, Clone)]
pub struct ExpiryPass {
    /// Orders that turned `expired` in this pass.
    pub expired: usize,
    /// Per sale touched: the stock changes applied (their returns among them), or
    /// deferred until the sale's Redis state is rebuilt.
    pub applied: Vec<(SaleId, Vec<(i64, ChangeResult)>)>,
}

/// Expires every order past its deadline (in transactions of `batch` orders) and
/// gives their units back to Redis. Crash-safe at any point: expired orders carry
/// their return in the same commit, and a return not yet applied is applied by the
/// next pass, the sweep, or the sale's next stock change, exactly once.
pub async fn expire_pass<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    batch: i64,
) -> Result<ExpiryPass, AppError> {
    let mut pass = ExpiryPass::default();
    let mut sales = Vec::new();
    loop {
        let (expired, touched) = expire_due(db, batch).await?;
        pass.expired += expired;
        sales.extend(touched);
        if (expired as i64) < batch {
            break;
        }
    }
    // And every sale with a return still pending (a pass that died after its
    // commit): finished now, not only by the sweep.
    let stranded: Vec<i64> = sqlx::query_scalar(
        "SELECT DISTINCT sale_id FROM stock_changes WHERE kind = 'return' AND status = 'pending'",
    )
    .fetch_all(db)
    .await?;
    sales.extend(stranded.into_iter().filter_map(Id::new));
    sales.sort_unstable_by_key(|s| s.get());
    sales.dedup();
    // One sale's failure (its Redis state being rebuilt, a timeout) must not keep
    // the others' units waiting; its returns stay pending for the next actor.
    for sale in sales {
        match stock::apply_pending(db, redis, keys, sale).await {
            Ok(results) => pass.applied.push((sale, results)),
            Err(e) => {
                tracing::warn!(sale = %sale, error = ?e, "returns not applied yet; retrying later")
            }
        }
    }
    Ok(pass)
}

/// How a sale's orders stand, by status (for the admin and reconcile).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct OrderCounts {
    /// Orders of a sale with no payment step.
    pub accepted: i64,
    pub awaiting_payment: i64,
    pub paid: i64,
    pub expired: i64,
    /// Cancelled unpaid (by their buyer or an admin).
    pub cancelled: i64,
    /// Cancelled after payment, the payment refunded.
    pub refunded: i64,
    /// Units of expired, cancelled and refunded orders already back in the sale's
    /// stock in Redis.
    pub returned: i64,
}

pub async fn counts(db: &PgPool, sale: SaleId) -> Result<OrderCounts, AppError> {
    type Row = (i64, i64, i64, i64, i64, i64, i64);
    let (accepted, awaiting_payment, paid, expired, cancelled, refunded, returned): Row =
        sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'accepted'),
                    count(*) FILTER (WHERE status = 'awaiting_payment'),
                    count(*) FILTER (WHERE status = 'paid'),
                    count(*) FILTER (WHERE status = 'expired'),
                    count(*) FILTER (WHERE status = 'cancelled'),
                    count(*) FILTER (WHERE status = 'refunded'),
                    (SELECT COALESCE(sum(amount), 0)::int8 FROM stock_changes
                     WHERE sale_id = $1 AND kind = 'return' AND status = 'applied')
             FROM orders WHERE sale_id = $1",
        )
        .bind(sale.get())
        .fetch_one(db)
        .await?;
    Ok(OrderCounts {
        accepted,
        awaiting_payment,
        paid,
        expired,
        cancelled,
        refunded,
        returned,
    })
}

/// Checks an `Idempotency-Key`: 1 to 200 visible ASCII characters.
pub fn parse_key(key: Option<&str>) -> Result<&str, AppError> {
    match key {
        Some(k) if (1..=200).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()) => Ok(k),
        Some(_) => Err(AppError::new(
            ErrorCode::InvalidIdempotencyKey,
            "the Idempotency-Key header must be 1 to 200 visible ASCII characters",
        )),
        None => Err(AppError::new(
            ErrorCode::InvalidIdempotencyKey,
            "a payment needs an Idempotency-Key header (any unique string, such as a UUID), \
             sent again unchanged with every retry of the same payment",
        )),
    }
}
