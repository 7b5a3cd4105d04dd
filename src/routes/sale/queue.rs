//! A sale's waiting room: joining its line and where a shopper stands (see
//! [`crate::sale::queue`]). The ticket of an admitted shopper is issued by
//! `POST /api/sales/{id}/ticket` (`ticket.rs`), and is also in the answer here
//! ([`crate::sale::ticket::grant::of_admission`]).

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::answers;
use crate::auth::AuthUser;
use crate::domain::{SaleId, UserId};
use crate::error::{AppError, ErrorBody};
use crate::gate::Subject;
use crate::limit::Route;
use crate::metrics::Metrics;
use crate::routes::fair;
use crate::sale::queue::estimate::Chance;
use crate::sale::queue::join::{Ask, Place, QueueState, Standing, tell_used_turn};
use crate::sale::ticket::grant;
use crate::state::{AppState, Worker};

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
    /// Waiting only, after the opening: the expected seconds until this shopper
    /// is let in, from what moves the line (the pace, the units left not held by
    /// shoppers let in, the admissions running and when they end, the recent share
    /// of passes; see [Waiting room](#waiting-room) in docs/api.md);
    /// null when at that share the line may not reach this place.
    estimated_wait_s: Option<i64>,
    /// Waiting only: the soonest the turn may come (if every shopper let in or
    /// waiting before this one let the turn pass); nobody is let in sooner.
    estimated_wait_min_s: Option<i64>,
    /// Waiting only: the latest, at the low end of what the pass share may be;
    /// null when the turn may never come (more people before than units left, and
    /// too few passes seen).
    estimated_wait_max_s: Option<i64>,
    /// Waiting only: `likely` (more units left than people before this shopper,
    /// those let in and holding a turn included), `possible` (enough only if the
    /// recent share of them passes), `unlikely` (fewer units than the people before
    /// who are likely to buy).
    chance: Option<Chance>,
    /// Units not yet sold.
    units_left: i64,
    /// Shoppers let in now who may still buy (each holds a unit while their turn
    /// runs): before every shopper still waiting.
    admissions_open: i64,
    /// An admin paused admissions: nobody is let in until they resume (the
    /// estimate counts from then).
    paused: bool,
    /// An admin closed the line to new joins (those in it keep their places).
    joins_closed: bool,
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

/// The view of a standing; an admitted shopper's ticket is issued here (one HMAC).
fn view(state: &AppState, sale: SaleId, user: UserId, s: Standing) -> QueueView {
    let drawn = s.now_ms >= s.starts_ms;
    let life_ms = i64::try_from(state.config.queue_admission.as_millis()).unwrap_or(i64::MAX);
    let estimate = s.line_now(life_ms).map(|line| line.estimate());
    QueueView {
        sale_id: sale,
        state: s.state,
        position: (drawn && s.position > 0).then_some(s.position),
        ahead: s.ahead,
        estimated_wait_s: estimate.and_then(|e| e.expected_s),
        estimated_wait_min_s: estimate.and_then(|e| e.min_s),
        estimated_wait_max_s: estimate.and_then(|e| e.max_s),
        chance: estimate.map(|e| e.chance),
        units_left: s.moves.units_left.max(0),
        admissions_open: s.moves.open,
        paused: s.moves.paused,
        joins_closed: s.moves.joins_closed,
        waiting: s.waiting,
        admit_per_second: i32::try_from(s.admit_per_second).unwrap_or(i32::MAX),
        starts_at: DateTime::from_timestamp_millis(s.starts_ms).unwrap_or_default(),
        ticket: grant::of_admission(&state.tickets, sale, user, &s).map(|(ticket, _)| ticket),
        expires_at: s.expires_ms.and_then(DateTime::from_timestamp_millis),
    }
}

/// `lua/queue_place.lua` (joining with `join`), through this worker's batch of the
/// sale: where the caller stands (a used turn told apart from a passed one,
/// [`tell_used_turn`]), or the refusal.
async fn place(
    state: &AppState,
    worker: &Worker,
    sale: SaleId,
    user: UserId,
    join: bool,
) -> Result<Standing, AppError> {
    match worker.queue.submit(sale, Ask { user, join }).await? {
        Place::Standing { new, standing } => {
            if new {
                Metrics::inc(&state.metrics.queue_joins);
            }
            tell_used_turn(&state.db, sale, user, standing).await
        }
        refused => Err(answers::line_refusal(state, sale, refused).await),
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
    (status = 403, description = "`account_too_new` (the sale's `min_account_age_s`; `allowed_at` when the account may before the close), `proof_invalid` or `proof_used` (the sale's `proof_of_work`)", body = ErrorBody<'static>),
    (status = 428, description = "`proof_required`: the sale asks for a `Proof-Of-Work` header with the join (see `GET /api/sales/{id}/challenge`)", body = ErrorBody<'static>),
    (status = 429, description = "`rate_limited`: a join limit refused (by default per network)", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"),
        ("RateLimit" = String), ("RateLimit-Policy" = String))),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 409, description = "`queue_not_open` (with `Retry-After`: seconds until the line opens), `line_closed` (an admin closed the line to new joins) or `no_waiting_room`", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "With `queue_not_open`: seconds until the line opens"))),
    (status = 410, description = "`ended` or `sold_out`", body = ErrorBody<'static>),
    (status = 503, description = "`recovering`: the sale's state is being rebuilt", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"))),
))]
pub(super) async fn join(
    state: web::Data<AppState>,
    worker: web::Data<Worker>,
    user: AuthUser,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, AppError> {
    let sale = SaleId::parse(&path)?;
    let gates = fair::sale_gates(&state, sale).await?;
    let proof = fair::pass(&state, &req, &user, Subject::Sale(sale), gates, true).await?;
    // The join route's limits (by default one per network, see docs/rate-limits.md),
    // then the proof used up.
    let granted = state
        .limiter
        .check(Route::Join, Some(user.id), &req)
        .await?;
    proof.spend(&state, &req).await?;
    let s = place(&state, &worker, sale, user.id, true).await?;
    Ok(granted.attach(answer(view(&state, sale, user.id, s))))
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
        ("Retry-After" = u32, description = "Seconds until a retry may pass"))),
))]
pub(super) async fn me(
    state: web::Data<AppState>,
    worker: web::Data<Worker>,
    user: AuthUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let sale = SaleId::parse(&path)?;
    let s = place(&state, &worker, sale, user.id, false).await?;
    Ok(answer(view(&state, sale, user.id, s)))
}
