//! An order's status and its payment.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::auth::{AdminUser, AuthUser};
use crate::error::{AppError, ErrorBody, ErrorCode};
use crate::metrics::Metrics;
use crate::sale::cancel::{self, By};
use crate::sale::{orders, payment, pending};

/// An order is its owner's: never kept by a shared cache.
const PRIVATE: (header::HeaderName, &str) = (header::CACHE_CONTROL, "private, no-store");
use crate::state::AppState;

use super::answers;

#[derive(Serialize, utoipa::ToSchema)]
struct OrderStatus {
    order_id: Uuid,
    sale_id: i64,
    user_id: i64,
    /// `pending` (accepted, on its way to Postgres) or `confirmed` (in Postgres).
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    accepted_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    settled_at: Option<DateTime<Utc>>,
    /// Once confirmed, on a sale with a payment window: `awaiting_payment`, `paid`
    /// or `expired` (not paid by `pay_by`: its unit went back on sale).
    #[serde(skip_serializing_if = "Option::is_none")]
    payment: Option<orders::OrderStatus>,
    /// The payment deadline (`POST /api/orders/{id}/pay` before it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pay_by: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    paid_at: Option<DateTime<Utc>>,
    /// Once confirmed: the units the order holds (or held, once returned).
    #[serde(skip_serializing_if = "Option::is_none")]
    quantity: Option<i32>,
}

/// An order's status, for its owner or an admin.
#[utoipa::path(get, path = "/api/orders/{id}", tag = "sales",
    params(("id" = uuid::Uuid, Path, description = "The order id (a UUID)")),
    security(("bearer" = [])), responses(
    (status = 200, description = "The order: `pending` or `confirmed`", body = OrderStatus),
    (status = 404, description = "`not_found`: no such order, or not the caller's", body = ErrorBody<'static>),
    (status = 503, description = "`recovering`: in neither store while its sale's Redis state is rebuilt", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may find it"))),
))]
pub(super) async fn order_status(
    state: web::Data<AppState>,
    user: AuthUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let order_id = parse_order_id(&path)?;
    let not_found = || AppError::not_found("no such order");
    if let Some(o) = orders::find(&state.db, order_id).await? {
        if o.user_id != user.id.get() && !user.admin {
            return Err(not_found());
        }
        return Ok(HttpResponse::Ok().insert_header(PRIVATE).json(OrderStatus {
            order_id: o.id,
            sale_id: o.sale_id,
            user_id: o.user_id,
            status: "confirmed",
            accepted_at: Some(o.accepted_at),
            settled_at: Some(o.settled_at),
            payment: (o.status != orders::OrderStatus::Accepted).then_some(o.status),
            pay_by: o.pay_by,
            paid_at: o.paid_at,
            quantity: Some(o.quantity),
        }));
    }
    match pending::owner(&mut state.redis.clone(), &state.keys, &order_id).await? {
        Some((sale, owner)) if owner == user.id.get() || user.admin => {
            Ok(HttpResponse::Ok().insert_header(PRIVATE).json(OrderStatus {
                order_id,
                sale_id: sale.get(),
                user_id: owner,
                status: "pending",
                accepted_at: None,
                settled_at: None,
                payment: None,
                pay_by: None,
                paid_at: None,
                quantity: None,
            }))
        }
        Some(_) => Err(not_found()),
        None => Err(answers::missing_order(
            state.get_ref(),
            &order_id,
            (!user.admin).then(|| user.id.get()),
        )
        .await),
    }
}

/// Pays an order (a simulated payment provider that always accepts), once: the
/// first request with a given `Idempotency-Key` decides, and a retry with the same
/// key gets the same answer (with `Idempotent-Replayed: true`), never a second
/// charge. Payment and the expiry of the unpaid order race fairly: exactly one wins.
#[utoipa::path(post, path = "/api/orders/{id}/pay", tag = "sales",
    params(
        ("id" = uuid::Uuid, Path, description = "The order id (a UUID)"),
        ("Idempotency-Key" = String, Header, description = "Any unique string (a UUID), sent unchanged with every retry of this payment"),
    ),
    security(("bearer" = [])), responses(
    (status = 200, description = "Paid", body = payment::Paid),
    (status = 400, description = "`invalid_idempotency_key`: the header is missing or malformed", body = ErrorBody<'static>),
    (status = 404, description = "`not_found`: no such order of the caller", body = ErrorBody<'static>),
    (status = 409, description = "`already_paid` (under another key), `no_payment_needed` (the sale has no payment step)", body = ErrorBody<'static>),
    (status = 410, description = "`payment_expired`: the deadline passed, the unit went back on sale", body = ErrorBody<'static>),
    (status = 422, description = "`idempotency_key_reused`: the key paid another order", body = ErrorBody<'static>),
    (status = 503, description = "`order_settling`: accepted moments ago, not yet in Postgres", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds before trying again"))),
))]
pub(super) async fn pay(
    state: web::Data<AppState>,
    user: AuthUser,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, AppError> {
    let order_id = parse_order_id(&path)?;
    let key = req
        .headers()
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap_or("\u{0}"));
    let key = payment::parse_key(key)?;
    match payment::pay(&state.db, user.id, order_id, key).await? {
        payment::Payment::Answer(answer) => {
            let status = actix_web::http::StatusCode::from_u16(answer.http_status)
                .map_err(|e| AppError::Internal(e.into()))?;
            let mut reply = HttpResponse::build(status);
            reply.insert_header((header::CACHE_CONTROL, "no-store"));
            if answer.replayed {
                reply.insert_header(("Idempotent-Replayed", "true"));
            }
            if status.is_success() {
                tracing::info!(order = %order_id, user = %user.id, replayed = answer.replayed, "order paid");
            }
            Ok(reply.json(answer.body))
        }
        payment::Payment::KeyReused { order_id: other } => Err(AppError::new(
            ErrorCode::IdempotencyKeyReused,
            format!("this Idempotency-Key paid order {other}: use a new key for each payment"),
        )),
        payment::Payment::NotFound => {
            // Not in Postgres yet: an order accepted moments ago is in its sale's
            // pending hash until the settlement worker writes it.
            let owner = pending::owner(&mut state.redis.clone(), &state.keys, &order_id).await?;
            if owner.is_some_and(|(_, owner)| owner == user.id.get()) {
                return Err(AppError::new(
                    ErrorCode::OrderSettling,
                    "the order was accepted moments ago and is not confirmed yet: retry in a second",
                )
                .with_header(header::RETRY_AFTER, "1"));
            }
            if owner.is_some() {
                return Err(AppError::not_found("no such order"));
            }
            Err(answers::missing_order(state.get_ref(), &order_id, Some(user.id.get())).await)
        }
    }
}

/// Cancels the caller's own order while it is unpaid (`accepted` on a sale with no
/// payment step, or `awaiting_payment`): it turns `cancelled` and its units go back
/// on sale, exactly once. A retry with the same `Idempotency-Key` answers the same
/// (with `Idempotent-Replayed: true`).
#[utoipa::path(post, path = "/api/orders/{id}/cancel", tag = "sales",
    params(
        ("id" = uuid::Uuid, Path, description = "The order id (a UUID)"),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional: any unique string; a retry with it answers the same instead of 409"),
    ),
    security(("bearer" = [])), responses(
    (status = 200, description = "Cancelled: its units went back on sale", body = cancel::Cancelled),
    (status = 400, description = "`invalid_id`, `invalid_idempotency_key`", body = ErrorBody<'static>),
    (status = 404, description = "`not_found`: no such order of the caller", body = ErrorBody<'static>),
    (status = 409, description = "`not_cancellable`: already cancelled, expired, or paid (an admin refunds a paid order)", body = ErrorBody<'static>),
    (status = 503, description = "`order_settling`: accepted moments ago, not yet in Postgres", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds before trying again"))),
))]
pub(super) async fn cancel(
    state: web::Data<AppState>,
    user: AuthUser,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, AppError> {
    cancel_as(&state, By::Buyer(user.id), &path, &req).await
}

/// Cancels any order not yet cancelled, refunded or expired: an `accepted` or
/// `awaiting_payment` one turns `cancelled`, a `paid` one `refunded` (its payment
/// is refunded); its units go back on sale, exactly once. Recorded in the sale's
/// history. A retry with the same `Idempotency-Key` answers the same (with
/// `Idempotent-Replayed: true`).
#[utoipa::path(post, path = "/api/admin/orders/{id}/cancel", tag = "admin",
    params(
        ("id" = uuid::Uuid, Path, description = "The order id (a UUID)"),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional: any unique string; a retry with it answers the same instead of 409"),
    ),
    security(("bearer" = [])), responses(
    (status = 200, description = "Cancelled (or refunded): its units went back on sale", body = cancel::Cancelled),
    (status = 400, description = "`invalid_id`, `invalid_idempotency_key`", body = ErrorBody<'static>),
    (status = 404, description = "`not_found`: no such order", body = ErrorBody<'static>),
    (status = 409, description = "`not_cancellable`: already cancelled or refunded, or expired", body = ErrorBody<'static>),
    (status = 503, description = "`order_settling`: accepted moments ago, not yet in Postgres", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds before trying again"))),
))]
pub(super) async fn admin_cancel(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, AppError> {
    cancel_as(&state, By::Admin(admin.id), &path, &req).await
}

async fn cancel_as(
    state: &web::Data<AppState>,
    by: By,
    raw_id: &str,
    req: &HttpRequest,
) -> Result<HttpResponse, AppError> {
    let order_id = parse_order_id(raw_id)?;
    let key = match req.headers().get("idempotency-key") {
        Some(v) => Some(payment::parse_key(Some(v.to_str().unwrap_or("\u{0}")))?),
        None => None,
    };
    let counter = match by {
        By::Buyer(_) => &state.metrics.order_cancels_buyer,
        By::Admin(_) => &state.metrics.order_cancels_admin,
    };
    let outcome = cancel::cancel(state.get_ref(), by, order_id, key).await;
    if matches!(&outcome, Err(e) if e.error_code() == ErrorCode::NotCancellable) {
        Metrics::inc(&state.metrics.order_cancels_refused);
    }
    match outcome? {
        cancel::Outcome::Done { answer, replayed } => {
            if !replayed {
                Metrics::inc(counter);
                tracing::info!(order = %order_id, by = ?by, status = answer.status.as_str(),
                    units = answer.units_returned, "order cancelled; units returned");
            }
            let mut reply = HttpResponse::Ok();
            reply.insert_header((header::CACHE_CONTROL, "no-store"));
            if replayed {
                reply.insert_header(("Idempotent-Replayed", "true"));
            }
            Ok(reply.json(answer))
        }
        cancel::Outcome::NotFound => {
            // Not in Postgres yet: an order accepted moments ago is in its sale's
            // pending hash until the settlement worker writes it.
            let owner = pending::owner(&mut state.redis.clone(), &state.keys, &order_id).await?;
            let visible = match by {
                By::Buyer(user) => owner.is_some_and(|(_, owner)| owner == user.get()),
                By::Admin(_) => owner.is_some(),
            };
            if visible {
                return Err(AppError::new(
                    ErrorCode::OrderSettling,
                    "the order was accepted moments ago and is not confirmed yet: retry in a second",
                )
                .with_header(header::RETRY_AFTER, "1"));
            }
            if owner.is_some() {
                return Err(AppError::not_found("no such order"));
            }
            Err(answers::missing_order(
                state.get_ref(),
                &order_id,
                match by {
                    By::Buyer(user) => Some(user.get()),
                    By::Admin(_) => None,
                },
            )
            .await)
        }
    }
}

fn parse_order_id(raw: &str) -> Result<Uuid, AppError> {
    Uuid::parse_str(raw).map_err(|_| AppError::new(ErrorCode::InvalidId, "order id must be a UUID"))
}
