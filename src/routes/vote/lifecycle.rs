//! The admin's routes for the days around a poll: edit (before the opening),
//! archive and unarchive, delete, and the record of every change (see
//! [`crate::vote::lifecycle`]).

use actix_web::{HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::admin::{parse_options, parse_results};
use crate::audit::{self, Subject};
use crate::auth::AdminUser;
use crate::domain::{self, PollId};
use crate::error::{AppError, ErrorBody};
use crate::recover::Target;
use crate::state::AppState;
use crate::vote::cached::{PollView, load_view};
use crate::vote::lifecycle::{self, PollEdit};
use crate::vote::visibility::Viewer;

/// Any of a poll's fields, until it opens (409 `poll_started` after). New
/// `options` replace the old ones (with new ids). Each is checked as in
/// `POST /api/admin/polls`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct EditPoll {
    question: Option<String>,
    options: Option<Vec<String>>,
    opens_at: Option<DateTime<Utc>>,
    closes_at: Option<DateTime<Utc>>,
    /// `live`, `after_vote`, `after_close` or `on_reveal`; else 422
    /// `invalid_ballot_settings`.
    #[schema(value_type = Option<crate::vote::visibility::ResultsVisibility>)]
    results: Option<serde_json::Value>,
    /// `single`, `multi`, `budget` or `ranked` (a new kind starts its numbers from
    /// the defaults).
    #[schema(value_type = Option<crate::vote::setting::BallotKind>)]
    ballot: Option<serde_json::Value>,
    /// `multi` and `ranked`: 1 to the number of options; `null`: all of them.
    #[schema(value_type = Option<i32>)]
    #[serde(default, deserialize_with = "crate::vote::setting::present")]
    max_choices: Option<serde_json::Value>,
    /// `budget`: 1 to 1,000.
    #[schema(value_type = Option<i32>)]
    votes_per_user: Option<serde_json::Value>,
    /// `budget`: 1 to `votes_per_user`; `null`: `votes_per_user`.
    #[schema(value_type = Option<i32>)]
    #[serde(default, deserialize_with = "crate::vote::setting::present")]
    max_per_option: Option<serde_json::Value>,
    /// `single`, `multi`, `ranked`.
    #[schema(value_type = Option<bool>)]
    allow_change: Option<serde_json::Value>,
    /// Leading zero bits of a proof of work asked with each vote
    /// (`GET /api/polls/{id}/challenge`, then the `Proof-Of-Work` header): 0 (the
    /// default, off) to 24; else 422 `invalid_fairness`.
    #[schema(value_type = Option<i32>, minimum = 0, maximum = 24)]
    proof_of_work: Option<serde_json::Value>,
    /// Least age of an account that may vote, in seconds before the opening (or
    /// before the vote, when later): 0 (the default, off) to 31622400 (366 days);
    /// else 422 `invalid_fairness`.
    #[schema(value_type = Option<i32>, minimum = 0, maximum = 31622400)]
    min_account_age_s: Option<serde_json::Value>,
}

/// Edits a poll that has not opened.
#[utoipa::path(patch, path = "/api/admin/polls/{id}", tag = "admin", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), request_body = EditPoll, security(("bearer" = [])), responses(
    (status = 200, description = "The poll as it is now", body = PollView),
    (status = 404, description = "`not_found`: no such poll", body = ErrorBody<'static>),
    (status = 409, description = "`poll_started`: the poll has opened", body = ErrorBody<'static>),
    (status = 422, description = "`invalid_text`, `invalid_options`, `invalid_window`, `invalid_ballot_settings`, `invalid_fairness` or `invalid_body`", body = ErrorBody<'static>),
))]
pub(super) async fn admin_edit(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
    body: crate::routes::extract::JsonObject<EditPoll>,
) -> Result<HttpResponse, AppError> {
    let id = PollId::parse(&path)?;
    let body = body.into_inner();
    let edit = PollEdit {
        question: body
            .question
            .map(|q| domain::parse_line("question", &q, 300))
            .transpose()?,
        options: body.options.as_deref().map(parse_options).transpose()?,
        opens_at: body.opens_at,
        closes_at: body.closes_at,
        results: parse_results(body.results.as_ref())?,
        ballot: crate::vote::setting::BallotFields {
            ballot: body.ballot,
            max_choices: body.max_choices,
            votes_per_user: body.votes_per_user,
            max_per_option: body.max_per_option,
            allow_change: body.allow_change,
        },
        fairness: crate::gate::FairnessFields {
            proof_of_work: body.proof_of_work,
            min_account_age_s: body.min_account_age_s,
        }
        .parse()?,
    };
    let in_redis = lifecycle::edit(state.get_ref(), id, edit, admin.id).await?;
    state.gates.polls.forget(id);
    state.wake.catalog_changed();
    tracing::info!(poll = %id, admin = %admin.id, "poll edited");
    if !in_redis {
        return Err(state.recovery.recovering(Target::Poll(id)));
    }
    Ok(HttpResponse::Ok().json(load_view(&state, id, Viewer::Admin).await?))
}

/// Archives a poll: off the public lists; still reachable by link and in the
/// admin (`?filter=archived`).
#[utoipa::path(post, path = "/api/admin/polls/{id}/archive", tag = "admin", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The poll, with `archived_at`", body = PollView),
    (status = 404, description = "`not_found`: no such poll", body = ErrorBody<'static>),
))]
pub(super) async fn admin_archive(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = PollId::parse(&path)?;
    lifecycle::set_archived(state.get_ref(), id, true, admin.id).await?;
    tracing::info!(poll = %id, admin = %admin.id, "poll archived");
    Ok(HttpResponse::Ok().json(load_view(&state, id, Viewer::Admin).await?))
}

/// Brings an archived poll back onto the public lists.
#[utoipa::path(post, path = "/api/admin/polls/{id}/unarchive", tag = "admin", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The poll, `archived_at` null", body = PollView),
    (status = 404, description = "`not_found`: no such poll", body = ErrorBody<'static>),
))]
pub(super) async fn admin_unarchive(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = PollId::parse(&path)?;
    lifecycle::set_archived(state.get_ref(), id, false, admin.id).await?;
    tracing::info!(poll = %id, admin = %admin.id, "poll unarchived");
    Ok(HttpResponse::Ok().json(load_view(&state, id, Viewer::Admin).await?))
}

/// Deletes a poll that never had a vote, from Postgres and Redis.
#[utoipa::path(delete, path = "/api/admin/polls/{id}", tag = "admin", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 204, description = "Deleted"),
    (status = 404, description = "`not_found`: no such poll", body = ErrorBody<'static>),
    (status = 409, description = "`has_votes`: the poll had a vote (archive it instead)", body = ErrorBody<'static>),
))]
pub(super) async fn admin_delete(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = PollId::parse(&path)?;
    lifecycle::delete(state.get_ref(), id, admin.id).await?;
    tracing::info!(poll = %id, admin = %admin.id, "poll deleted");
    Ok(HttpResponse::NoContent().finish())
}

/// Every admin change of a poll (create, edit, close, reveal, archive, unarchive, delete),
/// newest first, at most 500.
#[utoipa::path(get, path = "/api/admin/polls/{id}/history", tag = "admin", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The changes, newest first (also those of a deleted poll)", body = [audit::Entry]),
))]
pub(super) async fn admin_history(
    state: web::Data<AppState>,
    _: AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = PollId::parse(&path)?;
    let entries = audit::history(&state.db, Subject::Poll(id), 500).await?;
    Ok(HttpResponse::Ok().json(entries))
}
