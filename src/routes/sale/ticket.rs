//! A purchase ticket (`POST /api/sales/{id}/ticket`): what
//! [`crate::sale::ticket::grant`] decides, answered.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::answers;
use crate::auth::AuthUser;
use crate::domain::SaleId;
use crate::error::{AppError, ErrorBody};
use crate::gate::Subject;
use crate::limit::Route;
use crate::routes::fair;
use crate::sale::ticket::grant::{self, Grant};
use crate::state::AppState;

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
    (status = 403, description = "`not_admitted`: the sale has a waiting room and the caller holds no admission (see `GET /api/sales/{id}/queue/me`); `not_drawn`: a draw sale (its winners' tickets come with `GET /api/sales/{id}/entry/me`); `account_too_new` (the sale's `min_account_age_s`; `allowed_at` when the account may before the close); `proof_invalid` or `proof_used` (the sale's `proof_of_work`)", body = ErrorBody<'static>),
    (status = 428, description = "`proof_required`: the sale asks for a `Proof-Of-Work` header with the ticket (a sale without a waiting room; see `GET /api/sales/{id}/challenge`)", body = ErrorBody<'static>),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 409, description = "`not_started` (with `Retry-After`: seconds until it opens)", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until the sale opens"))),
    (status = 410, description = "`ended` (past `ends_at`, or closed early) or `sold_out`", body = ErrorBody<'static>),
    (status = 429, description = "`rate_limited`: a ticket limit refused (per user, per address)", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"),
        ("RateLimit" = String), ("RateLimit-Policy" = String))),
))]
pub(super) async fn ticket(
    state: web::Data<AppState>,
    user: AuthUser,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, AppError> {
    let sale = SaleId::parse(&path)?;
    if state.sold_out.is_sold_out(sale) {
        return Err(answers::sold_out());
    }
    // The account's age, and the proof (a waiting room's comes with the join:
    // its admission stands for it here).
    let gates = fair::sale_gates(&state, sale).await?;
    let with_proof = !gates.waiting_room;
    let proof = fair::pass(&state, &req, &user, Subject::Sale(sale), gates, with_proof).await?;
    // Per user and per address: a bot polling for the opening is cut off.
    let granted = state
        .limiter
        .check(Route::Ticket, Some(user.id), &req)
        .await?;
    proof.spend(&state, &req).await?;
    let grant = grant::grant(
        state.get_ref(),
        &mut state.redis.clone(),
        &state.keys,
        &state.tickets,
        sale,
        user.id,
    )
    .await?;
    let (ticket, expires_ms) = match grant {
        Grant::Issued { ticket, expires_ms } => (ticket, expires_ms),
        Grant::Window(window) => return Err(answers::window_refusal(&state, sale, window).await),
        Grant::Line(place) => return Err(answers::line_refusal(&state, sale, place).await),
        Grant::SoldOut => return Err(answers::sold_out()),
        Grant::NotAdmitted => return Err(answers::not_admitted(sale)),
        Grant::NotDrawn => return Err(answers::not_drawn(sale)),
    };
    let expires_at = DateTime::from_timestamp_millis(expires_ms).ok_or_else(|| {
        AppError::Internal(anyhow::anyhow!(
            "the Redis clock is out of range: {expires_ms}"
        ))
    })?;
    Ok(granted.attach(
        HttpResponse::Ok()
            .insert_header((header::CACHE_CONTROL, "no-store"))
            .json(Ticket {
                ticket,
                sale_id: sale,
                expires_at,
            }),
    ))
}
