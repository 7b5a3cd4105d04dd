//! The purchase (the hot path). Its body is read by `purchase_body.rs`, its ticket
//! is `ticket.rs`.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;
use uuid::Uuid;

use super::answers;
use super::purchase_body::PurchaseBody;
use crate::auth::AuthUser;
use crate::domain::{self, SaleId};
use crate::error::{AppError, ErrorBody, ErrorCode};
use crate::limit::Route;
use crate::metrics::Metrics;
use crate::recover::Target;
use crate::sale::buy::PurchaseOutcome;
use crate::sale::buy::{self, BuyReply, BuyRequest};
use crate::sale::held;
use crate::sale::ticket;
use crate::state::{AppState, Worker};

/// 409 `already_bought`: the error body, and the buyer's orders of the sale.
#[derive(Serialize, utoipa::ToSchema)]
struct AlreadyBought {
    error: &'static str,
    message: &'static str,
    /// The buyer's orders of this sale, pending or confirmed, oldest first (at
    /// most 100; `GET /api/orders/{id}` tells each one's state). Absent when they
    /// could not be read in time (the refusal never waits on a slow database):
    /// `GET /api/me/orders` lists them.
    #[serde(skip_serializing_if = "Option::is_none")]
    order_ids: Option<Vec<Uuid>>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct Accepted {
    /// Always `pending`: confirmed once in Postgres.
    status: &'static str,
    order_id: Uuid,
    #[schema(value_type = i64)]
    sale_id: SaleId,
}

/// The hot path. The local sold-out flag first: that a sale is sold out is public
/// (its page says so), so the stampede after the last unit is answered 410 from
/// memory before the token is even checked (a purchase without an
/// `Idempotency-Key`: a keyed one may be a retry, see [`keyed`]). Then the token (no I/O) and the
/// sale's next batch: one script call decides it, the buy route's rate limits
/// included (see [`crate::batch`] and `lua/purchase_batch.lua`). A limited request
/// touches no sale state and is counted by no policy.
#[utoipa::path(post, path = "/api/sales/{id}/purchase", tag = "sales", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1),
    ("Idempotency-Key" = Option<String>, Header, description = "Optional: 1 to 64 characters of letters, digits, `_`, `.`, `:` or `-`, new for each purchase and sent unchanged with every retry of it; a retry gets the first answer again (with `Idempotent-Replayed: true`)")), request_body(content = Option<PurchaseBody>, description = "Empty, or the purchase ticket for a sale that requires one and/or the units to buy (1 to the sale's `max_per_user`)", content_type = "application/json"), security(("bearer" = [])), responses(
    (status = 202, description = "Accepted: the order is pending, confirmed once in Postgres", body = Accepted, headers(
        ("RateLimit" = String), ("RateLimit-Policy" = String),
        ("Idempotent-Replayed" = String, description = "`true` when this is the first answer to this Idempotency-Key given again"))),
    (status = 400, description = "`invalid_idempotency_key`: an Idempotency-Key header out of its form, or `invalid_json`: a body that is not JSON", body = ErrorBody<'static>),
    (status = 403, description = "`not_admitted`: the sale has a waiting room, and the purchase carried no ticket or the buyer's admission is missing or expired; `not_drawn`: a draw sale, and the buyer holds no running win of its draw (nothing taken); `account_too_new`: a sale without tickets whose `min_account_age_s` the account does not meet yet (`allowed_at` when it may before the close)", body = ErrorBody<'static>),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 409, description = "`already_bought` (one per customer; the body names the buyer's orders of the sale in `order_ids`: AlreadyBought), `per_user_limit` (the quantity would pass `max_per_user`), `not_enough_left` (fewer units left than asked for; nothing taken), or `not_started` (with `Retry-After`: seconds until it opens)", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "With `not_started`: seconds until the sale opens"))),
    (status = 410, description = "`sold_out` or `ended` (past `ends_at`, or closed early)", body = ErrorBody<'static>),
    (status = 422, description = "`invalid_body` (JSON other than `{\"ticket\": \"...\", \"quantity\": n}`), `invalid_quantity` (not 1 to the sale's `max_per_user`), `invalid_ticket` (not issued here, or for another user or sale), `ticket_expired`, `idempotency_key_reused` (the key was first sent with another quantity), or `rate_limit_unsatisfiable`: a limit policy can never grant this request", body = ErrorBody<'static>),
    (status = 428, description = "`ticket_required`: the sale wants a ticket from `POST /api/sales/{id}/ticket` with each purchase", body = ErrorBody<'static>),
    (status = 429, description = "`rate_limited`: a buy limit refused", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"),
        ("RateLimit" = String), ("RateLimit-Policy" = String))),
))]
pub(super) async fn purchase(
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, AppError> {
    // Borrowed, not extracted (see `state_and_worker`).
    let (state, worker) = crate::routes::extract::state_and_worker(&req)?;
    let sale = SaleId::parse(req.match_info().get("id").unwrap_or_default())?;
    if state.sold_out.is_sold_out(sale) && !keyed(&req) {
        Metrics::inc(&state.metrics.purchase_sold_out_local);
        return Ok(answers::sold_out_from_memory());
    }
    let user = AuthUser::of(&req)?;
    let body = PurchaseBody::read(&req, payload, state.config.body_timeout).await?;
    let ticket = body.ticket.as_deref();
    ticket::check_purchase(
        state,
        &state.tickets,
        &state.ticket_rules,
        sale,
        user.id,
        ticket,
    )
    .await?;
    // The account's age, with a ticket too: a waiting room's admission gives its
    // ticket without asking, and the sale's rule may have been raised since the
    // join. (The proof of work is the join's, the ticket's or the entry's.) A map
    // lookup when the sale has no gates.
    let gates = crate::routes::fair::sale_gates(state, sale).await?;
    let subject = crate::gate::Subject::Sale(sale);
    crate::routes::fair::pass(state, &req, &user, subject, gates, false)
        .await?
        .spend(state, &req)
        .await?;
    let quantity = buy::check_quantity(state.get_ref(), sale, body.quantity).await?;
    let key = match req.headers().get("idempotency-key") {
        Some(v) => Some(domain::PurchaseKey::parse(v.as_bytes())?),
        None => None,
    };
    let ip = state
        .limiter
        .limits()
        .counts_ip(Route::Buy)
        .then(|| state.limiter.client_ip(&req));
    let request = BuyRequest {
        user: user.id,
        quantity,
        ip,
        key,
    };
    let mut reply = worker.buys.submit(sale, request.clone()).await?;
    if matches!(reply.outcome, PurchaseOutcome::NotAdmitted)
        && ticket.is_some()
        && answers::win_given_now(state, sale, user.id).await?
    {
        // A draw's winner who bought between the draw's commit and its wins
        // reaching Redis: their win is there now, and the purchase runs again.
        reply = worker.buys.submit(sale, request).await?;
    }
    count_outcome(&state.metrics, &reply.outcome);
    let replayed = reply.replayed;
    match purchase_answer(state, worker, sale, user.id, reply).await {
        Ok(mut answer) if replayed => {
            answer.headers_mut().insert(
                IDEMPOTENT_REPLAYED,
                header::HeaderValue::from_static("true"),
            );
            Ok(answer)
        }
        Err(e) if replayed => Err(e.with_header(IDEMPOTENT_REPLAYED, "true")),
        answer => answer,
    }
}

/// Whether the purchase carries an `Idempotency-Key`: then it may be the retry of
/// a purchase decided before the sale sold out, whose first answer (a 202) it
/// must get again, so it is never answered `sold_out` from memory; the decision
/// script answers it (its stored answer, or `sold_out` for a new key).
fn keyed(req: &HttpRequest) -> bool {
    req.headers().contains_key("idempotency-key")
}

/// Marks an answer given again under the same `Idempotency-Key`.
const IDEMPOTENT_REPLAYED: header::HeaderName =
    header::HeaderName::from_static("idempotent-replayed");

/// One counter per purchase, by how the batch decided it.
fn count_outcome(m: &Metrics, outcome: &PurchaseOutcome) {
    Metrics::inc(match outcome {
        PurchaseOutcome::Accepted { .. } => &m.purchase_accepted,
        PurchaseOutcome::AlreadyBought { .. }
        | PurchaseOutcome::OverPerUserCap { .. }
        | PurchaseOutcome::KeyReused { .. } => &m.purchase_already_bought,
        PurchaseOutcome::SoldOut | PurchaseOutcome::NotEnoughLeft { .. } => &m.purchase_sold_out,
        PurchaseOutcome::NotLoaded | PurchaseOutcome::Recovering => &m.purchase_unavailable,
        PurchaseOutcome::RateLimited { .. } | PurchaseOutcome::RateLimitUnsatisfiable => {
            // (`judge`, in `purchase_answer`, counts the policy that refused.)
            &m.purchase_limited
        }
        _ => &m.purchase_not_open,
    });
}

/// The answer to a purchase the batch decided: 202 with the order, or the refusal.
async fn purchase_answer(
    state: &AppState,
    worker: &Worker,
    sale: SaleId,
    user: domain::UserId,
    reply: BuyReply,
) -> Result<HttpResponse, AppError> {
    let outcome = reply.outcome;
    // What the buy route's policies said: the RateLimit headers of a 202, or the
    // 429 (422) of a refusal. Built only for those answers: a storm's refusals
    // (already bought, sold out) carry no RateLimit headers and pay nothing for them.
    let judged = || {
        let policies = state.limiter.limits().for_route(Route::Buy);
        let decided: Vec<_> = policies.iter().zip(reply.limits.iter().copied()).collect();
        state.limiter.judge(&decided)
    };
    match outcome {
        PurchaseOutcome::Accepted { order_id, .. } => {
            Ok(judged()?.attach(HttpResponse::Accepted().json(Accepted {
                status: "pending",
                order_id,
                sale_id: sale,
            })))
        }
        PurchaseOutcome::AlreadyBought { order } => {
            // The script named the order that makes them a buyer, so a client that
            // lost its 202 learns it; on a sale bought before the script kept
            // them, one bounded read off the batch does.
            let order_ids = match order {
                Some(order) => Some(vec![order]),
                None => held::held_by(&state.held_orders, &worker.held, sale, user).await,
            };
            let message = if order_ids.is_some() {
                "you already bought from this sale (one per customer): order_ids names your order"
            } else {
                Metrics::inc(&state.metrics.held_unread);
                "you already bought from this sale (one per customer): see GET /api/me/orders"
            };
            Ok(HttpResponse::Conflict().json(AlreadyBought {
                error: ErrorCode::AlreadyBought.as_str(),
                message,
                order_ids,
            }))
        }
        PurchaseOutcome::KeyReused { quantity } => Err(AppError::new(
            ErrorCode::IdempotencyKeyReused,
            format!(
                "this Idempotency-Key was first sent with quantity {quantity}: send a new key \
                 for another purchase"
            ),
        )),
        PurchaseOutcome::OverPerUserCap { held } => Err(AppError::new(
            ErrorCode::PerUserLimit,
            format!(
                "that would take you past this sale's limit per customer; {held} of your units \
                 count toward it already"
            ),
        )),
        PurchaseOutcome::NotEnoughLeft { left } => Err(AppError::new(
            ErrorCode::NotEnoughLeft,
            format!("only {left} left: ask for at most {left} (nothing was taken)"),
        )),
        PurchaseOutcome::NotAdmitted => Err(answers::not_admitted_of(state, sale).await),
        PurchaseOutcome::SoldOut => {
            state.sold_out.mark(sale);
            Err(answers::sold_out())
        }
        PurchaseOutcome::NotStarted { starts_in_ms } => Err(answers::not_started(starts_in_ms)),
        PurchaseOutcome::Ended => Err(answers::ended()),
        PurchaseOutcome::UnknownSale => Err(AppError::not_found(format!("no sale with id {sale}"))),
        PurchaseOutcome::NotLoaded => Err(answers::missing_from_redis(state, sale).await),
        PurchaseOutcome::Recovering => Err(state.recovery.recovering(Target::Sale(sale))),
        PurchaseOutcome::RateLimited { .. } | PurchaseOutcome::RateLimitUnsatisfiable => {
            let _no_policy_refused = judged()?;
            Err(AppError::Internal(anyhow::anyhow!(
                "a rate-limited purchase came back with no refusing policy"
            )))
        }
    }
}
