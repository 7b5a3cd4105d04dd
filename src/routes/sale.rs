//! HTTP routes of sales: public reads, the purchase, order status, admin set-up.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{PageQuery, paged_json};
use crate::auth::{AdminUser, AuthUser};
use crate::domain::{self, Id, SaleId};
use crate::error::{AppError, ErrorBody, ErrorCode};
use crate::limit::Route;
use crate::live::Topic;
use crate::metrics::Metrics;
use crate::recover::Target;
use crate::sale::buy::{BuyReply, BuyRequest};
use crate::sale::cached::{self, find_view, load_page, load_view};
use crate::sale::stock::{self, ChangeResult, StockChange};
use crate::sale::store::{self, NewSale, PurchaseOutcome, SaleCursor};
use crate::sale::ticket::{self, TicketError, TicketWindow, Window};
use crate::sale::{orders, payment, reconcile};
use crate::state::{AppState, Worker};
use futures_util::StreamExt;

// Routes under `/api` (see `startup`): the purchase first, so the hot path matches
// the first pattern the router tries.
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    purchase,
    ticket,
    list,
    show,
    events,
    order_status,
    pay,
    my_orders,
    admin_create,
    admin_list,
    admin_stock,
    admin_open,
    admin_close,
    admin_orders,
    admin_reconcile,
    admin_repair
))]
pub(crate) struct Api;

super::routes! {
    pub fn configure, pub const ROUTES; mounted "/api";
    post "/sales/{id}/purchase" => purchase,
    post "/sales/{id}/ticket" => ticket,
    get "/sales" => list,
    get "/sales/{id}" => show,
    get "/sales/{id}/events" => events,
    get "/orders/{id}" => order_status,
    post "/orders/{id}/pay" => pay,
    get "/me/orders" => my_orders,
    post "/admin/sales" => admin_create,
    get "/admin/sales" => admin_list,
    post "/admin/sales/{id}/stock" => admin_stock,
    post "/admin/sales/{id}/open" => admin_open,
    post "/admin/sales/{id}/close" => admin_close,
    get "/admin/sales/{id}/orders" => admin_orders,
    get "/admin/sales/{id}/reconcile" => admin_reconcile,
    post "/admin/sales/{id}/reconcile" => admin_repair,
}

/// A page of sales, with live stock, in the list order: open sales (live or sold
/// out) first, then upcoming ones (soonest opening first), then ended and closed
/// ones; latest start first within a group except upcoming; the id breaks ties.
/// The order is taken at the first page's moment for the whole walk.
#[utoipa::path(get, path = "/api/sales", tag = "sales", params(PageQuery), responses(
    (status = 200, description = "A page of sales with live `stock_left`, `sold` and `status`; the next page's address in `Link` and its cursor in `X-Next-Cursor`, both absent on the last page", body = [store::SaleView], headers(
        ("Link" = String, description = "`</api/sales?limit=50&cursor=...>; rel=\"next\"`: the next page"),
        ("X-Next-Cursor" = String, description = "The `cursor` of the next page"))),
    (status = 400, description = "`invalid_limit` (not 1 to 200) or `invalid_query` (a cursor this server did not issue for this list)", body = ErrorBody<'static>),
))]
async fn list(
    req: HttpRequest,
    state: web::Data<AppState>,
    query: web::Query<PageQuery>,
) -> Result<HttpResponse, AppError> {
    let (limit, after) = query.parse(SaleCursor::parse)?;
    let page = load_page(&state, after.as_ref(), limit).await?;
    Ok(paged_json(&req, limit, page))
}

/// One sale, with live stock.
#[utoipa::path(get, path = "/api/sales/{id}", tag = "sales", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), responses(
    (status = 200, description = "The sale", body = store::SaleView),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
))]
async fn show(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    Ok(HttpResponse::Ok().json(load_view(&state, id).await?))
}

/// The sale's live view as server-sent events: the JSON of `GET /api/sales/{id}`
/// at once, then again whenever stock or status change (read once a second per
/// sale in each process, however many pages watch it: see [`crate::live`]).
#[utoipa::path(get, path = "/api/sales/{id}/events", tag = "sales", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), responses(
    (status = 200, description = "`text/event-stream`: each `data:` line a sale, as `GET /api/sales/{id}` answers", content_type = "text/event-stream", body = crate::live::LiveEvent),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 503, description = "The sale cannot be read now", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds before trying again"))),
))]
async fn events(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let reader = state.clone();
    let load = move || {
        let state = reader.clone();
        async move {
            match find_view(&state, id).await? {
                Some(view) => Ok(Some(crate::live::json(&view)?)),
                None => Ok(None),
            }
        }
    };
    state.live.stream(Topic::Sale(id), "sale", load).await
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
/// memory before the token is even checked. Then the token (no I/O) and the
/// sale's next batch: one script call decides it, the buy route's rate limits
/// included (see [`crate::batch`] and `lua/purchase_batch.lua`). A limited request
/// touches no sale state and is counted by no policy.
#[utoipa::path(post, path = "/api/sales/{id}/purchase", tag = "sales", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), request_body(content = Option<PurchaseBody>, description = "Empty, or the purchase ticket for a sale that requires one and/or the units to buy (1 to the sale's `max_per_user`)", content_type = "application/json"), security(("bearer" = [])), responses(
    (status = 202, description = "Accepted: the order is pending, confirmed once in Postgres", body = Accepted, headers(
        ("RateLimit" = String), ("RateLimit-Policy" = String))),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 409, description = "`already_bought` (one per customer), `per_user_limit` (the quantity would pass `max_per_user`), `not_enough_left` (fewer units left than asked for; nothing taken), or `not_started` (with `Retry-After`: seconds until it opens)", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "With `not_started`: seconds until the sale opens"))),
    (status = 410, description = "`sold_out` or `ended` (past `ends_at`, or closed early)", body = ErrorBody<'static>),
    (status = 400, description = "`invalid_json`: a body that is not JSON", body = ErrorBody<'static>),
    (status = 422, description = "`invalid_body` (JSON other than `{\"ticket\": \"...\", \"quantity\": n}`), `invalid_quantity` (not 1 to the sale's `max_per_user`), `invalid_ticket` (not issued here, or for another user or sale), `ticket_expired`, or `rate_limit_unsatisfiable`: a limit policy can never grant this request", body = ErrorBody<'static>),
    (status = 428, description = "`ticket_required`: the sale wants a ticket from `POST /api/sales/{id}/ticket` with each purchase", body = ErrorBody<'static>),
    (status = 429, description = "`rate_limited`: a buy limit refused", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"),
        ("RateLimit" = String), ("RateLimit-Policy" = String))),
))]
async fn purchase(req: HttpRequest, payload: web::Payload) -> Result<HttpResponse, AppError> {
    // Borrowed, not extracted: a `web::Data` extractor clones the `Arc`, and the
    // shared state's reference count is one cache line that every worker thread
    // would then write twice a request.
    let (Some(state), Some(worker)) = (
        req.app_data::<web::Data<AppState>>(),
        req.app_data::<web::Data<Worker>>(),
    ) else {
        return Err(AppError::Internal(anyhow::anyhow!(
            "the purchase route runs without its state"
        )));
    };
    let sale = SaleId::parse(req.match_info().get("id").unwrap_or_default())?;
    if state.sold_out.is_sold_out(sale) {
        Metrics::inc(&state.metrics.purchase_sold_out_local);
        return Ok(sold_out_from_memory());
    }
    let user = AuthUser::of(&req)?;
    let body = PurchaseBody::read(&req, payload, state.config.body_timeout_ms).await?;
    check_ticket(state, sale, user.id, body.ticket.as_deref()).await?;
    let quantity = check_quantity(state, sale, body.quantity).await?;
    let ip = state
        .limiter
        .limits()
        .counts_ip(Route::Buy)
        .then(|| state.limiter.client_ip(&req));
    let reply = worker
        .buys
        .submit(
            sale,
            BuyRequest {
                user: user.id,
                quantity,
                ip,
            },
        )
        .await?;
    count_outcome(&state.metrics, &reply.outcome);
    purchase_answer(state, sale, reply).await
}

/// One counter per purchase, by how the batch decided it.
fn count_outcome(m: &Metrics, outcome: &PurchaseOutcome) {
    Metrics::inc(match outcome {
        PurchaseOutcome::Accepted { .. } => &m.purchase_accepted,
        PurchaseOutcome::AlreadyBought | PurchaseOutcome::OverPerUserCap { .. } => {
            &m.purchase_already_bought
        }
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
    sale: SaleId,
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
        PurchaseOutcome::AlreadyBought => Err(AppError::new(
            ErrorCode::AlreadyBought,
            "you already bought from this sale (one per customer)",
        )),
        PurchaseOutcome::OverPerUserCap { held } => Err(AppError::new(
            ErrorCode::PerUserLimit,
            format!(
                "that would take you past this sale's limit per customer; you hold {held} already"
            ),
        )),
        PurchaseOutcome::NotEnoughLeft { left } => Err(AppError::new(
            ErrorCode::NotEnoughLeft,
            format!("only {left} left: ask for at most {left} (nothing was taken)"),
        )),
        PurchaseOutcome::SoldOut => {
            state.sold_out.mark(sale);
            Err(sold_out())
        }
        PurchaseOutcome::NotStarted { starts_in_ms } => Err(not_started(starts_in_ms)),
        PurchaseOutcome::Ended => Err(ended()),
        PurchaseOutcome::UnknownSale => Err(AppError::not_found(format!("no sale with id {sale}"))),
        PurchaseOutcome::NotLoaded => Err(missing_from_redis(state, sale).await),
        PurchaseOutcome::Recovering => Err(state.recovery.recovering(Target::Sale(sale))),
        PurchaseOutcome::RateLimited { .. } | PurchaseOutcome::RateLimitUnsatisfiable => {
            let _no_policy_refused = judged()?;
            Err(AppError::Internal(anyhow::anyhow!(
                "a rate-limited purchase came back with no refusing policy"
            )))
        }
    }
}

/// The purchase's optional body. No body (or `{}`) means no ticket, one unit.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct PurchaseBody {
    /// The ticket from `POST /api/sales/{id}/ticket`, for a sale that requires one.
    #[serde(default)]
    ticket: Option<String>,
    /// Units to buy, all or nothing: 1 (the default) to the sale's `max_per_user`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100)]
    quantity: Option<i64>,
}

/// Longest purchase body read (a ticket is about 100 bytes).
const MAX_PURCHASE_BODY: usize = 4096;

impl PurchaseBody {
    /// Reads the body only when there is one: most purchases carry none, and they
    /// pay for no buffer (the `web::Bytes` extractor reserves 8 KiB for every
    /// request). A body that cannot be read is answered like the JSON extractor's
    /// errors (408 `body_timeout`, 413, 400).
    async fn read(
        req: &HttpRequest,
        mut payload: web::Payload,
        body_timeout_ms: u64,
    ) -> Result<Self, AppError> {
        let headers = req.headers();
        let has_body = headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|n| n.as_bytes() != b"0")
            || headers.contains_key(header::TRANSFER_ENCODING);
        if !has_body {
            return Ok(PurchaseBody::default());
        }
        let mut body = web::BytesMut::new();
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(|e| crate::conn::body_read_error(&e, body_timeout_ms))?;
            if body.len() + chunk.len() > MAX_PURCHASE_BODY {
                return Err(AppError::new(
                    ErrorCode::PayloadTooLarge,
                    format!("a purchase body is at most {MAX_PURCHASE_BODY} bytes"),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        Self::parse(&body)
    }

    fn parse(body: &[u8]) -> Result<Self, AppError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(PurchaseBody::default());
        }
        serde_json::from_slice(body).map_err(|e| {
            let message =
                format!("the purchase body must be empty or {{\"ticket\": \"...\", \"quantity\": n}} (both optional): {e}");
            if e.is_data() {
                AppError::new(ErrorCode::InvalidBody, message)
            } else {
                AppError::new(ErrorCode::InvalidJson, message)
            }
        })
    }
}

/// A ticket, when the purchase carries one, must be good for this user and sale
/// (one HMAC); without one, the sale must not require it (read once per sale and
/// process, see [`ticket::TicketRules`]). A refused purchase consumes nothing: no
/// limit counts it and the sale's state is not touched.
async fn check_ticket(
    state: &AppState,
    sale: SaleId,
    user: domain::UserId,
    ticket: Option<&str>,
) -> Result<(), AppError> {
    if let Some(ticket) = ticket {
        return state
            .tickets
            .verify(ticket, sale, user, Utc::now().timestamp_millis())
            .map_err(ticket_refused);
    }
    let required = match state.ticket_rules.get(sale) {
        Some(required) => required,
        None => match cached::sale_row(state, sale).await? {
            Some(row) => {
                state.ticket_rules.remember(sale, row.requires_ticket);
                row.requires_ticket
            }
            None => return Err(AppError::not_found(format!("no sale with id {sale}"))),
        },
    };
    if required {
        return Err(AppError::new(
            ErrorCode::TicketRequired,
            format!(
                "this sale needs a purchase ticket: POST /api/sales/{sale}/ticket once it is open, \
                 then send {{\"ticket\": \"...\"}} with the purchase"
            ),
        ));
    }
    Ok(())
}

/// The units asked for: 1 unless the body says otherwise; more only up to the
/// sale's `max_per_user` (its record, read through the cache, only for a request
/// that asks for more than one).
async fn check_quantity(
    state: &AppState,
    sale: SaleId,
    quantity: Option<i64>,
) -> Result<u32, AppError> {
    let q = match quantity {
        None | Some(1) => return Ok(1),
        Some(q) if (2..=i64::from(domain::MAX_PER_USER)).contains(&q) => q,
        Some(_) => {
            return Err(AppError::new(
                ErrorCode::InvalidQuantity,
                format!(
                    "quantity must be between 1 and the sale's max_per_user (at most {})",
                    domain::MAX_PER_USER
                ),
            ));
        }
    };
    let row = cached::sale_row(state, sale)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no sale with id {sale}")))?;
    if q > i64::from(row.max_per_user) {
        return Err(AppError::new(
            ErrorCode::InvalidQuantity,
            format!(
                "this sale sells at most {} per customer: quantity must be 1 to {}",
                row.max_per_user, row.max_per_user
            ),
        ));
    }
    Ok(q as u32)
}

fn ticket_refused(e: TicketError) -> AppError {
    match e {
        TicketError::Expired => AppError::new(
            ErrorCode::TicketExpired,
            "the purchase ticket has expired: get a new one",
        ),
        TicketError::Malformed | TicketError::BadSignature => {
            AppError::new(ErrorCode::InvalidTicket, "the purchase ticket is not valid")
        }
        TicketError::OtherSale => AppError::new(
            ErrorCode::InvalidTicket,
            "the purchase ticket is for another sale",
        ),
        TicketError::OtherUser => AppError::new(
            ErrorCode::InvalidTicket,
            "the purchase ticket is for another user",
        ),
    }
}

/// A purchase ticket.
#[derive(Serialize, utoipa::ToSchema)]
struct Ticket {
    /// Send it with the purchase: `{"ticket": "..."}`.
    ticket: String,
    #[schema(value_type = i64)]
    sale_id: SaleId,
    /// Good until then (the server's clock), 30 s after it was issued.
    expires_at: DateTime<Utc>,
}

/// A purchase ticket for the signed-in user, once the sale is open by the Redis
/// clock: what a sale that requires tickets wants with each purchase, so a bot
/// that fires before the opening gets nothing. Issuing one writes nothing.
#[utoipa::path(post, path = "/api/sales/{id}/ticket", tag = "sales", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The ticket, bound to this user and sale, good for 30 s", body = Ticket, headers(
        ("RateLimit" = String), ("RateLimit-Policy" = String))),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 409, description = "`not_started` (with `Retry-After`: seconds until it opens)", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until the sale opens"))),
    (status = 410, description = "`ended` (past `ends_at`, or closed early) or `sold_out`", body = ErrorBody<'static>),
    (status = 429, description = "`rate_limited`: a ticket limit refused (per user, per address)", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"),
        ("RateLimit" = String), ("RateLimit-Policy" = String))),
))]
async fn ticket(
    state: web::Data<AppState>,
    user: AuthUser,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, AppError> {
    let sale = SaleId::parse(&path)?;
    if state.sold_out.is_sold_out(sale) {
        return Err(sold_out());
    }
    // Per user and per address: a bot polling for the opening is cut off.
    let granted = state
        .limiter
        .check(Route::Ticket, Some(user.id), &req)
        .await?;
    let window = TicketWindow {
        keys: &state.keys,
        sale,
        now_ms: None,
    }
    .run(&mut state.redis.clone())
    .await?;
    match window {
        Window::Open { now_ms } => {
            let expires_ms = now_ms + ticket::TICKET_TTL_MS;
            let expires_at = DateTime::from_timestamp_millis(expires_ms).ok_or_else(|| {
                AppError::Internal(anyhow::anyhow!("the Redis clock is out of range: {now_ms}"))
            })?;
            Ok(granted.attach(
                HttpResponse::Ok()
                    .insert_header((header::CACHE_CONTROL, "no-store"))
                    .json(Ticket {
                        ticket: state.tickets.issue(sale, user.id, expires_ms),
                        sale_id: sale,
                        expires_at,
                    }),
            ))
        }
        Window::NotStarted { starts_in_ms } => Err(not_started(starts_in_ms)),
        Window::Ended => Err(ended()),
        Window::NotLoaded => Err(missing_from_redis(&state, sale).await),
        Window::Recovering => Err(state.recovery.recovering(Target::Sale(sale))),
    }
}

/// Redis has no state for this sale: 404 when Postgres has none either (the cached
/// answer, so unknown ids cost no query each), else the sale was lost (wiped):
/// rebuild it and answer 503 meanwhile.
async fn missing_from_redis(state: &AppState, sale: SaleId) -> AppError {
    match cached::sale_row(state, sale).await {
        Ok(Some(_)) => state.recovery.recovering(Target::Sale(sale)),
        Ok(None) => AppError::not_found(format!("no sale with id {sale}")),
        Err(e) => e,
    }
}

/// 409 `not_started`, with `Retry-After` in whole seconds until the opening.
fn not_started(starts_in_ms: i64) -> AppError {
    let secs = (starts_in_ms + 999) / 1000;
    AppError::new(
        ErrorCode::NotStarted,
        format!("this sale has not started; it opens in {secs} s"),
    )
    .with_header(header::RETRY_AFTER, secs.max(1).to_string())
}

fn ended() -> AppError {
    AppError::new(ErrorCode::Ended, "this sale has ended")
}

fn sold_out() -> AppError {
    AppError::new(ErrorCode::SoldOut, "sold out")
}

/// [`sold_out`]'s answer, byte for byte (a unit test compares them).
/// The purchase route's whole pattern (the `RouteLabel` its resource carries).
pub const PURCHASE_ROUTE: &str = "/api/sales/{id}/purchase";

/// `POST /api/sales/{id}/purchase` of a sale this process already knows is sold
/// out, answered before routing (`conn::guard`, as its `early` answer; with the
/// route's label) with the handler's own first
/// answer: the flag is the first thing [`purchase`] checks, before the token, so
/// the answer is the same, and the storm's most frequent request costs no match
/// against the route patterns. Anything else, including a path only the router
/// would decode to this route, is left to the router (`None`).
pub fn sold_out_before_routing(
    req: &actix_web::dev::ServiceRequest,
) -> Option<(HttpResponse, &'static str)> {
    if req.method() != actix_web::http::Method::POST {
        return None;
    }
    let id = req
        .path()
        .strip_prefix("/api/sales/")?
        .strip_suffix("/purchase")?;
    let sale = SaleId::parse(id).ok()?;
    let state = req.app_data::<web::Data<AppState>>()?;
    if !state.sold_out.is_sold_out(sale) {
        return None;
    }
    Metrics::inc(&state.metrics.purchase_sold_out_local);
    Some((sold_out_from_memory(), PURCHASE_ROUTE))
}

const SOLD_OUT_BODY: &[u8] = br#"{"error":"sold_out","message":"sold out"}"#;

/// The answer of the process's sold-out flag: the hottest answer of a flash sale
/// (everyone after the last unit), so a fixed body with no error value, no
/// serializer and no allocation for it.
fn sold_out_from_memory() -> HttpResponse {
    HttpResponse::Gone()
        .content_type(actix_web::http::header::ContentType::json())
        .body(SOLD_OUT_BODY)
}

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
    payment: Option<String>,
    /// The payment deadline (`POST /api/orders/{id}/pay` before it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pay_by: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    paid_at: Option<DateTime<Utc>>,
}

/// An order's status, for its owner or an admin.
#[utoipa::path(get, path = "/api/orders/{id}", tag = "sales",
    params(("id" = uuid::Uuid, Path, description = "The order id (a UUID)")),
    security(("bearer" = [])), responses(
    (status = 200, description = "The order: `pending` or `confirmed`", body = OrderStatus),
    (status = 404, description = "`not_found`: no such order, or not the caller's", body = ErrorBody<'static>),
))]
async fn order_status(
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
        return Ok(HttpResponse::Ok().json(OrderStatus {
            order_id: o.id,
            sale_id: o.sale_id,
            user_id: o.user_id,
            status: "confirmed",
            accepted_at: Some(o.accepted_at),
            settled_at: Some(o.settled_at),
            payment: (o.status != "accepted").then_some(o.status),
            pay_by: o.pay_by,
            paid_at: o.paid_at,
        }));
    }
    match pending_owner(&state, &order_id).await? {
        Some((sale, owner)) if owner == user.id.get() || user.admin => {
            Ok(HttpResponse::Ok().json(OrderStatus {
                order_id,
                sale_id: sale.get(),
                user_id: owner,
                status: "pending",
                accepted_at: None,
                settled_at: None,
                payment: None,
                pay_by: None,
                paid_at: None,
            }))
        }
        _ => Err(not_found()),
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
async fn pay(
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
            let owner = pending_owner(&state, &order_id).await?;
            if owner.is_some_and(|(_, owner)| owner == user.id.get()) {
                return Err(AppError::new(
                    ErrorCode::OrderSettling,
                    "the order was accepted moments ago and is not confirmed yet: retry in a second",
                )
                .with_header(header::RETRY_AFTER, "1"));
            }
            Err(AppError::not_found("no such order"))
        }
    }
}

fn parse_order_id(raw: &str) -> Result<Uuid, AppError> {
    Uuid::parse_str(raw).map_err(|_| AppError::new(ErrorCode::InvalidId, "order id must be a UUID"))
}

/// An order accepted and not yet in Postgres: its sale (carried by the id) and its
/// owner, from the sale's pending hash.
async fn pending_owner(state: &AppState, order: &Uuid) -> Result<Option<(SaleId, i64)>, AppError> {
    let Some(sale) = orders::sale_of_order(order) else {
        return Ok(None);
    };
    let owner: Option<i64> = redis::cmd("HGET")
        .arg(&state.keys.sale(sale).pending)
        .arg(order.to_string())
        .query_async(&mut state.redis.clone())
        .await?;
    Ok(owner.map(|owner| (sale, owner)))
}

/// The caller's confirmed orders (at most 500, newest first).
#[utoipa::path(get, path = "/api/me/orders", tag = "sales", security(("bearer" = [])), responses(
    (status = 200, description = "Confirmed orders", body = [orders::MyOrder]),
))]
async fn my_orders(state: web::Data<AppState>, user: AuthUser) -> Result<HttpResponse, AppError> {
    Ok(HttpResponse::Ok().json(orders::of_user(&state.db, user.id).await?))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateSale {
    name: String,
    #[serde(default)]
    description: String,
    price_cents: i64,
    stock: i64,
    starts_at: DateTime<Utc>,
    ends_at: DateTime<Utc>,
    /// The picture: an `https://` address or a path on this site (`/static/...`);
    /// blank or absent for none (pages show a placeholder).
    #[serde(default)]
    image_url: Option<String>,
    /// Every purchase must carry a ticket from `POST /api/sales/{id}/ticket`, which
    /// is issued only once the sale is open: a bot firing before the opening gets
    /// nothing. Default true; fixed once the sale exists.
    #[serde(default = "yes")]
    #[schema(default = true)]
    requires_ticket: bool,
    /// Seconds a buyer has to pay (`POST /api/orders/{id}/pay`) once the order is
    /// accepted; an order not paid by then expires and its unit goes back on sale.
    /// 0 (the default): no payment step. At most 86400. Fixed once the sale exists.
    #[serde(default)]
    #[schema(default = 0, minimum = 0, maximum = 86400)]
    payment_window_s: i64,
    /// Whether a buyer whose order expired unpaid may buy again. Default false: the
    /// unit goes back on sale for others only. Fixed once the sale exists.
    #[serde(default)]
    #[schema(default = false)]
    rebuy_after_expiry: bool,
    /// Most units one customer may buy (a purchase may ask for several, all or
    /// nothing). Default 1; at most 100. Fixed once the sale exists.
    #[serde(default = "one")]
    #[schema(default = 1, minimum = 1, maximum = 100)]
    max_per_user: i64,
}

fn one() -> i64 {
    1
}

fn yes() -> bool {
    true
}

/// Longest sale window accepted; anything longer is almost surely a typo.
const MAX_SALE_DAYS: i64 = 366;

impl CreateSale {
    fn validate(self) -> Result<NewSale, AppError> {
        let name = domain::parse_text("name", &self.name, 200, false)?;
        let description = domain::parse_text("description", &self.description, 5000, true)?;
        let price_cents = domain::parse_price(self.price_cents)?;
        let stock = domain::parse_stock("stock", self.stock)?;
        let image_url = domain::parse_image_url(self.image_url.as_deref())?;
        let payment_window_s = domain::parse_payment_window(self.payment_window_s)?;
        let max_per_user = domain::parse_max_per_user(self.max_per_user)?;
        if self.ends_at <= self.starts_at {
            return Err(AppError::new(
                ErrorCode::InvalidWindow,
                "ends_at must be after starts_at",
            ));
        }
        if self.ends_at - self.starts_at > chrono::Duration::days(MAX_SALE_DAYS) {
            return Err(AppError::new(
                ErrorCode::InvalidWindow,
                format!("a sale may last at most {MAX_SALE_DAYS} days"),
            ));
        }
        if self.ends_at <= Utc::now() {
            return Err(AppError::new(
                ErrorCode::InvalidWindow,
                "ends_at is in the past",
            ));
        }
        Ok(NewSale {
            name,
            description,
            price_cents,
            stock,
            starts_at: self.starts_at,
            ends_at: self.ends_at,
            image_url,
            requires_ticket: self.requires_ticket,
            payment_window_s,
            rebuy_after_expiry: self.rebuy_after_expiry,
            max_per_user,
        })
    }
}

/// Creates a sale.
#[utoipa::path(post, path = "/api/admin/sales", tag = "admin", request_body = CreateSale, security(("bearer" = [])), responses(
    (status = 201, description = "The new sale", body = store::SaleView),
    (status = 422, description = "A field that fails validation (`invalid_text`, `invalid_price`, `invalid_stock`, `invalid_window`, ...) or `invalid_body`", body = ErrorBody<'static>),
))]
async fn admin_create(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    body: web::Json<CreateSale>,
) -> Result<HttpResponse, AppError> {
    let new = body.into_inner().validate()?;
    let row = store::create_sale(&state.db, &mut state.redis.clone(), &state.keys, new).await?;
    tracing::info!(sale = row.id, admin = %admin.id, "sale created");
    let id = Id::new(row.id).expect("serial ids are positive");
    cached::invalidate(&state, id).await?;
    let view = load_view(&state, id).await?;
    Ok(HttpResponse::Created().json(view))
}

/// A page of sales with live stock (as `GET /api/sales`: same order, same cursors).
#[utoipa::path(get, path = "/api/admin/sales", tag = "admin", params(PageQuery), security(("bearer" = [])), responses(
    (status = 200, description = "A page of sales; the next page in `Link` and `X-Next-Cursor`, as `GET /api/sales`", body = [store::SaleView], headers(
        ("Link" = String, description = "`</api/admin/sales?limit=50&cursor=...>; rel=\"next\"`: the next page"),
        ("X-Next-Cursor" = String, description = "The `cursor` of the next page"))),
    (status = 400, description = "`invalid_limit` (not 1 to 200) or `invalid_query` (a cursor this server did not issue for this list)", body = ErrorBody<'static>),
))]
async fn admin_list(
    req: HttpRequest,
    state: web::Data<AppState>,
    _: AdminUser,
    query: web::Query<PageQuery>,
) -> Result<HttpResponse, AppError> {
    list(req, state, query).await
}

/// Exactly one of `set` and `add`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct StockBody {
    /// Units left become exactly this.
    set: Option<i64>,
    /// Units left grow by this.
    add: Option<i64>,
}

/// Sets or tops up a sale's stock, before or during the sale.
#[utoipa::path(post, path = "/api/admin/sales/{id}/stock", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), request_body = StockBody, security(("bearer" = [])), responses(
    (status = 200, description = "Applied: the sale", body = store::SaleView),
    (status = 202, description = "Recorded; applied once the sale's Redis state is rebuilt. Do not send it again", body = StockPending),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 422, description = "`invalid_stock` (not exactly one of set/add, or out of range), `stock_too_large`", body = ErrorBody<'static>),
))]
async fn admin_stock(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
    body: web::Json<StockBody>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let change = match (body.set, body.add) {
        (Some(n), None) => StockChange::Set(domain::parse_stock("set", n)?),
        (None, Some(n)) => StockChange::Add(domain::parse_stock("add", n)?),
        _ => {
            return Err(AppError::new(
                ErrorCode::InvalidStock,
                "send exactly one of {\"set\": n} or {\"add\": n}",
            ));
        }
    };
    sale_or_404(&state, id).await?;
    let change_id = stock::record_stock_change(&state.db, id, change, admin.id).await?;
    // From here on the change is recorded: whatever fails, it is applied later (by
    // the sweep or the next change), so the answer is 202, never an error that
    // invites a second, duplicate change.
    let result = match apply_stock_change(&state, id, change_id).await {
        Ok(result) => result,
        Err(e) => {
            tracing::warn!(sale = %id, change = change_id, error = ?e, "stock change recorded; applying it later");
            ChangeResult::Deferred
        }
    };
    match result {
        ChangeResult::Applied { delta, left, sold } => {
            cached::invalidate(&state, id).await?;
            if left > 0 {
                state.sold_out.clear(id);
            }
            tracing::info!(sale = %id, admin = %admin.id, change = change_id, delta, left, sold, "stock changed");
            Ok(HttpResponse::Ok().json(load_view(&state, id).await?))
        }
        ChangeResult::Refused { left, sold } => Err(AppError::new(
            ErrorCode::StockTooLarge,
            format!(
                "a sale may offer at most {} units in all; it has {sold} sold and {left} left",
                domain::MAX_STOCK
            ),
        )),
        ChangeResult::Deferred => Ok(HttpResponse::Accepted().json(StockPending {
            status: "pending",
            change_id,
            sale_id: id.get(),
            message: "the change is recorded and will be applied as soon as Redis holds the \
                      sale again; do not send it again",
        })),
    }
}

#[derive(Serialize, utoipa::ToSchema)]
struct StockPending {
    /// Always `pending`.
    status: &'static str,
    change_id: i64,
    sale_id: i64,
    message: &'static str,
}

/// How long an admin's stock change waits for a rebuild of its sale before it
/// answers 202 (recorded, applied later by the rebuild or the sweep).
const STOCK_CHANGE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Applies the recorded change (and any older one still pending). When the sale's
/// Redis state is missing or untrusted, rebuilds it first (the rebuild applies the
/// pending changes too) and reads the outcome back.
async fn apply_stock_change(
    state: &AppState,
    id: SaleId,
    change_id: i64,
) -> Result<ChangeResult, AppError> {
    let outcome = |results: &[(i64, ChangeResult)]| {
        results
            .iter()
            .find(|(c, _)| *c == change_id)
            .map(|(_, r)| *r)
    };
    let results =
        stock::apply_pending(&state.db, &mut state.redis.clone(), &state.keys, id).await?;
    match outcome(&results) {
        Some(ChangeResult::Deferred) => {}
        Some(done) => return Ok(done),
        // Another request applied it between our insert and our turn at the lock.
        None => {
            return stock::change_result(
                &state.db,
                &mut state.redis.clone(),
                &state.keys,
                id,
                change_id,
            )
            .await;
        }
    }
    state
        .recovery
        .rebuild(Target::Sale(id), STOCK_CHANGE_WAIT)
        .await?;
    stock::change_result(
        &state.db,
        &mut state.redis.clone(),
        &state.keys,
        id,
        change_id,
    )
    .await
}

/// Opens a sale now (moves `starts_at` back to now, clears an early close).
#[utoipa::path(post, path = "/api/admin/sales/{id}/open", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The sale", body = store::SaleView),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 409, description = "`past_end`: its end time has passed", body = ErrorBody<'static>),
))]
async fn admin_open(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let sale = sale_or_404(&state, id).await?;
    if sale.ends_at <= Utc::now() {
        return Err(AppError::new(
            ErrorCode::PastEnd,
            "this sale's end time has passed; it cannot be opened",
        ));
    }
    set_window(&state, id, store::WindowChange::Open).await?;
    tracing::info!(sale = %id, admin = %admin.id, "sale opened");
    Ok(HttpResponse::Ok().json(load_view(&state, id).await?))
}

/// Closes a sale early.
#[utoipa::path(post, path = "/api/admin/sales/{id}/close", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The sale", body = store::SaleView),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
))]
async fn admin_close(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    set_window(&state, id, store::WindowChange::Close).await?;
    tracing::info!(sale = %id, admin = %admin.id, "sale closed");
    Ok(HttpResponse::Ok().json(load_view(&state, id).await?))
}

/// Updates the record, then the Redis window when Redis holds the sale. In this
/// order a rebuild running meanwhile cannot undo the change: it reads the row after
/// the commit, or its restore runs before this update. A sale Redis lost is rebuilt
/// (with the new window) before the answer.
async fn set_window(
    state: &AppState,
    id: SaleId,
    change: store::WindowChange,
) -> Result<(), AppError> {
    let row = store::set_window(&state.db, id, change)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no sale with id {id}")))?;
    let in_redis = store::update_window(&mut state.redis.clone(), &state.keys, &row).await?;
    cached::invalidate(state, id).await?;
    if !in_redis {
        state
            .recovery
            .rebuild(Target::Sale(id), STOCK_CHANGE_WAIT)
            .await?;
    }
    Ok(())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct Page {
    /// At most this many orders (1 to 10000, default 1000).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<i64>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct SaleOrders {
    sale_id: i64,
    /// Orders in Postgres, oldest first.
    confirmed: Vec<orders::OrderRow>,
    /// Accepted orders not yet in Postgres.
    pending_count: i64,
}

/// A sale's confirmed orders and how many are still pending.
#[utoipa::path(get, path = "/api/admin/sales/{id}/orders", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1), Page), security(("bearer" = [])), responses(
    (status = 200, description = "The orders", body = SaleOrders),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
))]
async fn admin_orders(
    state: web::Data<AppState>,
    _: AdminUser,
    path: web::Path<String>,
    page: web::Query<Page>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let limit = page.limit.unwrap_or(1000);
    if !(1..=10_000).contains(&limit) {
        return Err(AppError::new(
            ErrorCode::InvalidLimit,
            "limit must be 1 to 10000",
        ));
    }
    sale_or_404(&state, id).await?;
    let orders = orders::of_sale(&state.db, id, limit).await?;
    let pending: i64 = redis::cmd("HLEN")
        .arg(&state.keys.sale(id).pending)
        .query_async(&mut state.redis.clone())
        .await?;
    Ok(HttpResponse::Ok().json(SaleOrders {
        sale_id: id.get(),
        confirmed: orders,
        pending_count: pending,
    }))
}

/// Redis against Postgres for one sale: who bought, what is pending, what settled.
#[utoipa::path(get, path = "/api/admin/sales/{id}/reconcile", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The report", body = reconcile::Reconciliation),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
))]
async fn admin_reconcile(
    state: web::Data<AppState>,
    _: AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let sale = sale_or_404(&state, id).await?;
    let report =
        reconcile::reconcile(&state.db, &mut state.redis.clone(), &state.keys, &sale).await?;
    Ok(HttpResponse::Ok().json(report))
}

/// Makes Redis agree with Postgres for one sale: the rebuild of [`crate::recover`].
#[utoipa::path(post, path = "/api/admin/sales/{id}/reconcile", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "Rebuilt from Postgres: the new report", body = reconcile::Reconciliation),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
))]
async fn admin_repair(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    sale_or_404(&state, id).await?;
    state
        .recovery
        .rebuild(Target::Sale(id), STOCK_CHANGE_WAIT)
        .await?
        .ok_or_else(|| {
            AppError::new(
                ErrorCode::Busy,
                "another rebuild of this sale is running; try again",
            )
            .with_header(header::RETRY_AFTER, "1")
        })?;
    state.sold_out.clear(id);
    cached::invalidate(&state, id).await?;
    let report = reconcile::reconcile(
        &state.db,
        &mut state.redis.clone(),
        &state.keys,
        &sale_or_404(&state, id).await?,
    )
    .await?;
    tracing::warn!(sale = %id, admin = %admin.id, consistent = report.consistent, "sale repaired from Postgres");
    Ok(HttpResponse::Ok().json(report))
}

/// The sale's record from Postgres (admin paths: always fresh, never the cache).
async fn sale_or_404(state: &AppState, id: SaleId) -> Result<store::SaleRow, AppError> {
    store::fetch_sale(&state.db, id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no sale with id {id}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::ResponseError;
    use actix_web::body::to_bytes;

    #[test]
    fn the_purchase_label_is_the_registered_route() {
        assert!(ROUTES.contains(&("post", "/sales/{id}/purchase")));
        assert_eq!(PURCHASE_ROUTE, "/api/sales/{id}/purchase");
    }

    #[actix_web::test]
    async fn the_sold_out_flag_answers_what_the_script_answers() {
        let from_script = sold_out().error_response();
        let from_memory = sold_out_from_memory();
        assert_eq!(from_memory.status(), from_script.status());
        assert_eq!(
            from_memory.headers().get(header::CONTENT_TYPE),
            from_script.headers().get(header::CONTENT_TYPE)
        );
        assert_eq!(
            to_bytes(from_memory.into_body()).await.unwrap(),
            to_bytes(from_script.into_body()).await.unwrap()
        );
    }
}
