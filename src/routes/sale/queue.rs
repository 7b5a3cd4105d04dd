//! A sale's waiting room: joining its line and where a shopper stands (see
//! [`crate::sale::queue`]). The ticket of an admitted shopper is issued by
//! `POST /api/sales/{id}/ticket` (`purchase.rs`), and is also in the answer here.

use actix_web::http::header;
use actix_web::{HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::purchase::missing_from_redis;
use super::{ended, sold_out};
use crate::auth::AuthUser;
use crate::domain::{SaleId, UserId};
use crate::error::{AppError, ErrorBody, ErrorCode};
use crate::metrics::Metrics;
use crate::recover::Target;
use crate::sale::cached;
use crate::sale::queue::{self, Joined, QueueState, Standing, Unavailable};
use crate::state::AppState;

/// Where the signed-in shopper stands in a sale's waiting room.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct QueueView {
    #[schema(value_type = i64)]
    sale_id: SaleId,
    /// `not_joined`, `waiting`, `admitted` (buy with `ticket` until `expires_at`),
    /// `passed` (the admission expired unused), `bought`, or `sold_out` (waiting,
    /// and no unit is left).
    state: QueueState,
    /// 1-based place in the line once the order is drawn (the sale's opening); null
    /// before it and when not in line.
    position: Option<i64>,
    /// People waiting before this one (waiting only; null before the opening: the
    /// order of everyone who joined before it is drawn at random then).
    ahead: Option<i64>,
    /// Seconds until admission at the sale's pace, if nobody ahead passes
    /// (waiting only, after the opening).
    estimated_wait_s: Option<i64>,
    /// People in the whole line not yet reached by admission.
    waiting: i64,
    /// Shoppers admitted a second.
    admit_per_second: i32,
    /// When the sale opens: the draw, and the first admissions.
    starts_at: DateTime<Utc>,
    /// Admitted only: the purchase ticket (send it with the purchase:
    /// `{"ticket": "..."}`).
    ticket: Option<String>,
    /// Admitted only: when the admission (and its ticket) ends.
    expires_at: Option<DateTime<Utc>>,
}

async fn unavailable(state: &AppState, sale: SaleId, why: Unavailable) -> AppError {
    match why {
        Unavailable::NotLoaded => missing_from_redis(state, sale).await,
        Unavailable::Recovering => state.recovery.recovering(Target::Sale(sale)),
        Unavailable::NoWaitingRoom => no_waiting_room(sale),
    }
}

fn no_waiting_room(sale: SaleId) -> AppError {
    AppError::new(
        ErrorCode::NoWaitingRoom,
        format!("sale {sale} has no waiting room: buy it directly"),
    )
}

/// The view of a standing; an admitted shopper's ticket is issued here (one HMAC).
async fn view(
    state: &AppState,
    sale: SaleId,
    user: UserId,
    s: Standing,
) -> Result<QueueView, AppError> {
    let row = cached::sale_row(state, sale)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no sale with id {sale}")))?;
    let rate = row.admit_per_second.unwrap_or(1).max(1);
    let drawn = s.now_ms >= row.starts_at.timestamp_millis();
    let expires_at = s.expires_ms.and_then(DateTime::from_timestamp_millis);
    Ok(QueueView {
        sale_id: sale,
        state: s.state,
        position: (drawn && s.position > 0).then_some(s.position),
        ahead: s.ahead,
        estimated_wait_s: s.ahead.map(|a| (a + i64::from(rate)) / i64::from(rate)),
        waiting: s.waiting,
        admit_per_second: rate,
        starts_at: row.starts_at,
        ticket: s.expires_ms.map(|e| state.tickets.issue(sale, user, e)),
        expires_at,
    })
}

/// Where the caller stands, or why it cannot be read.
async fn standing(state: &AppState, sale: SaleId, user: UserId) -> Result<Standing, AppError> {
    match queue::standing(&mut state.redis.clone(), &state.keys, sale, user, None).await? {
        Ok(s) => Ok(s),
        Err(why) => Err(unavailable(state, sale, why).await),
    }
}

fn answer(view: QueueView) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(view)
}

/// Joins the sale's waiting room: one place per account, the same answer however
/// often it joins. Everyone who joins before `starts_at` is put in a random order
/// at the opening; later joiners follow in arrival order.
#[utoipa::path(post, path = "/api/sales/{id}/queue", tag = "sales", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "In the line (or admitted, passed, bought: the place held already)", body = QueueView),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 409, description = "`queue_not_open` (with `Retry-After`: seconds until the line opens) or `no_waiting_room`", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "With `queue_not_open`: seconds until the line opens"))),
    (status = 410, description = "`ended` or `sold_out`", body = ErrorBody<'static>),
    (status = 503, description = "`recovering`: the sale's state is being rebuilt", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds before trying again"))),
))]
pub(super) async fn join(
    state: web::Data<AppState>,
    user: AuthUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let sale = SaleId::parse(&path)?;
    let joined = queue::join(&mut state.redis.clone(), &state.keys, sale, user.id, None).await?;
    match joined {
        Joined::InLine { new } => {
            if new {
                Metrics::inc(&state.metrics.queue_joins);
            }
        }
        Joined::NotOpenYet { opens_in_ms } => {
            let secs = (opens_in_ms + 999) / 1000;
            return Err(AppError::new(
                ErrorCode::QueueNotOpen,
                format!("this sale's waiting room opens in {secs} s"),
            )
            .with_header(header::RETRY_AFTER, secs.max(1).to_string()));
        }
        Joined::Ended => return Err(ended()),
        Joined::SoldOut => return Err(sold_out()),
        Joined::Unavailable(why) => return Err(unavailable(&state, sale, why).await),
    }
    let s = standing(&state, sale, user.id).await?;
    Ok(answer(view(&state, sale, user.id, s).await?))
}

/// Where the signed-in shopper stands in the sale's waiting room: state, place,
/// people ahead and an estimated wait; when admitted, the purchase ticket. An open
/// sale page follows the line over `GET /api/sales/{id}/events` (its
/// `waiting_room.served`) and asks here only when its turn may have come.
#[utoipa::path(get, path = "/api/sales/{id}/queue/me", tag = "sales", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "Where the caller stands (`not_joined` when not in line)", body = QueueView),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 409, description = "`no_waiting_room`", body = ErrorBody<'static>),
    (status = 503, description = "`recovering`: the sale's state is being rebuilt", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds before trying again"))),
))]
pub(super) async fn me(
    state: web::Data<AppState>,
    user: AuthUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let sale = SaleId::parse(&path)?;
    let s = standing(&state, sale, user.id).await?;
    Ok(answer(view(&state, sale, user.id, s).await?))
}

/// The ticket of a sale with a waiting room: only an admitted shopper gets one,
/// good as long as the admission (`Ok(None)`: the sale has no waiting room).
pub(super) async fn admission_ticket(
    state: &AppState,
    sale: SaleId,
    user: UserId,
) -> Result<Option<(String, i64)>, AppError> {
    let Some(row) = cached::sale_row(state, sale).await? else {
        return Err(AppError::not_found(format!("no sale with id {sale}")));
    };
    if !row.waiting_room {
        return Ok(None);
    }
    let s = standing(state, sale, user).await?;
    match (s.state, s.expires_ms) {
        (QueueState::Admitted, Some(e)) => Ok(Some((state.tickets.issue(sale, user, e), e))),
        (QueueState::SoldOut, _) => Err(sold_out()),
        _ => Err(super::purchase::not_admitted(sale)),
    }
}
