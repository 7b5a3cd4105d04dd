//! The fair-opening challenges (`GET /api/sales/{id}/challenge`,
//! `GET /api/polls/{id}/challenge`): a proof of work to solve before a step whose
//! sale or poll asks for one (see [`crate::gate::proof`]); the step checks it
//! through [`super::fair::pass`].

use actix_web::http::header;
use actix_web::{HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::fair::{now_ms, poll_gates, sale_gates};
use crate::auth::AuthUser;
use crate::domain::{PollId, SaleId};
use crate::error::{AppError, ErrorBody};
use crate::gate::proof::CHALLENGE_TTL_MS;
use crate::gate::{Gates, Subject};
use crate::state::AppState;

// Routes under `/api` (see `startup`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(sale_challenge, poll_challenge))]
pub(crate) struct Api;

super::routes! {
    pub fn configure, pub const ROUTES; mounted "/api";
    get "/sales/{id}/challenge" => sale_challenge,
    get "/polls/{id}/challenge" => poll_challenge,
}

/// A challenge to solve.
#[derive(Serialize, utoipa::ToSchema)]
struct Challenge {
    /// Find a nonce (1 to 64 of `A-Z a-z 0-9 _ -`) such that SHA-256 of
    /// `<challenge>:<nonce>` starts with `difficulty` zero bits, and send
    /// `Proof-Of-Work: <challenge>:<nonce>` with the step.
    challenge: String,
    /// Leading zero bits asked for (0: none is asked now).
    difficulty: u8,
    /// Good until then (the server's clock), 5 minutes after it was issued; it
    /// counts once.
    expires_at: DateTime<Utc>,
}

fn challenge_answer(
    state: &AppState,
    user: &AuthUser,
    subject: Subject,
    gates: Gates,
) -> Result<HttpResponse, AppError> {
    let expires_ms = now_ms() + CHALLENGE_TTL_MS;
    let expires_at = DateTime::from_timestamp_millis(expires_ms)
        .ok_or_else(|| AppError::Internal(anyhow::anyhow!("clock out of range")))?;
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(Challenge {
            challenge: state.gates.challenges.issue(subject, user.id, expires_ms),
            difficulty: gates.proof_of_work,
            expires_at,
        }))
}

/// A proof-of-work challenge for the signed-in user and this sale, to solve before
/// the waiting room's join or the purchase ticket (or a draw's entry) when the
/// sale's `proof_of_work` is above 0. Stateless: issuing one writes nothing.
#[utoipa::path(get, path = "/api/sales/{id}/challenge", tag = "sales", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The challenge, bound to this user and sale, good for 5 minutes", body = Challenge),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
))]
pub(super) async fn sale_challenge(
    state: web::Data<AppState>,
    user: AuthUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let sale = SaleId::parse(&path)?;
    let gates = sale_gates(&state, sale).await?;
    challenge_answer(&state, &user, Subject::Sale(sale), gates)
}

/// A proof-of-work challenge for the signed-in user and this poll, to solve
/// before each vote when the poll's `proof_of_work` is above 0.
#[utoipa::path(get, path = "/api/polls/{id}/challenge", tag = "polls", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The challenge, bound to this user and poll, good for 5 minutes", body = Challenge),
    (status = 404, description = "`not_found`: no such poll", body = ErrorBody<'static>),
))]
pub(super) async fn poll_challenge(
    state: web::Data<AppState>,
    user: AuthUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let poll = PollId::parse(&path)?;
    let gates = poll_gates(&state, poll).await?;
    challenge_answer(&state, &user, Subject::Poll(poll), gates)
}
