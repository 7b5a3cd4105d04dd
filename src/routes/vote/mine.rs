//! The voter's own ballot (`GET /api/polls/{id}/my-ballot`): the poll's record, the
//! caller's ballot (`vote::mine`), answered uncached.

use actix_web::http::header;
use actix_web::{HttpResponse, web};

use crate::auth::AuthUser;
use crate::domain::PollId;
use crate::error::{AppError, ErrorBody};
use crate::state::AppState;
use crate::vote::cached::{cached_record, missing_from_redis};
use crate::vote::mine::{MyBallot, mine};

/// The caller's own ballot: what counts now (choices, or votes per option and
/// what is left of the budget), each accepted request's receipt, and whether
/// Postgres has it. Never anyone else's, never the tallies.
#[utoipa::path(get, path = "/api/polls/{id}/my-ballot", tag = "polls", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The caller's ballot", body = MyBallot),
    (status = 401, description = "`unauthorized`: not signed in", body = ErrorBody<'static>),
    (status = 404, description = "`not_found`: no such poll", body = ErrorBody<'static>),
    (status = 503, description = "The poll is being restored; try again", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds before trying again"))),
))]
pub(super) async fn my_ballot(
    state: web::Data<AppState>,
    user: AuthUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let poll = PollId::parse(&path)?;
    let Some(record) = cached_record(state.get_ref(), poll).await? else {
        return Err(AppError::not_found(format!("no poll with id {poll}")));
    };
    let kind = record.poll.ballot;
    let mut redis = state.redis.clone();
    let Some(held) = mine(&mut redis, &state.db, &state.keys, (poll, kind), user.id).await? else {
        return Err(missing_from_redis(state.get_ref(), poll).await);
    };
    let body = held.answer(
        (poll, kind),
        record.poll.votes_per_user,
        user.id,
        state.tokens.mac(),
    );
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(body))
}
