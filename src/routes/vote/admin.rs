//! The admin's routes of polls: create, list, show, close.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::auth::AdminUser;
use crate::domain::{self, Id, PollId};
use crate::error::{AppError, ErrorBody, ErrorCode};
use crate::recover::Target;
use crate::routes::{PageQuery, paged_json};
use crate::state::AppState;
use crate::vote::cached::{PollView, load_view};
use crate::vote::store::{self, NewPoll, PollCursor};
use crate::vote::{MAX_OPTIONS, MIN_OPTIONS};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreatePoll {
    question: String,
    options: Vec<String>,
    opens_at: DateTime<Utc>,
    closes_at: DateTime<Utc>,
}

impl CreatePoll {
    fn validate(self) -> Result<NewPoll, AppError> {
        let question = domain::parse_text("question", &self.question, 300, false)?;
        if !(MIN_OPTIONS..=MAX_OPTIONS).contains(&self.options.len()) {
            return Err(AppError::new(
                ErrorCode::InvalidOptions,
                format!("a poll has {MIN_OPTIONS} to {MAX_OPTIONS} options"),
            ));
        }
        let options = self
            .options
            .iter()
            .map(|o| domain::parse_text("option", o, 200, false))
            .collect::<Result<Vec<_>, _>>()?;
        let mut seen = std::collections::HashSet::new();
        if !options.iter().all(|o| seen.insert(o.to_lowercase())) {
            return Err(AppError::new(
                ErrorCode::InvalidOptions,
                "options must be distinct",
            ));
        }
        if self.closes_at <= self.opens_at {
            return Err(AppError::new(
                ErrorCode::InvalidWindow,
                "closes_at must be after opens_at",
            ));
        }
        if self.closes_at <= Utc::now() {
            return Err(AppError::new(
                ErrorCode::InvalidWindow,
                "closes_at is in the past",
            ));
        }
        if self.closes_at - self.opens_at > chrono::Duration::days(366) {
            return Err(AppError::new(
                ErrorCode::InvalidWindow,
                "a poll may stay open at most 366 days",
            ));
        }
        Ok(NewPoll {
            question,
            options,
            opens_at: self.opens_at,
            closes_at: self.closes_at,
        })
    }
}

/// Creates a poll of 2 to 20 options.
#[utoipa::path(post, path = "/api/admin/polls", tag = "admin", request_body = CreatePoll, security(("bearer" = [])), responses(
    (status = 201, description = "The new poll", body = PollView),
    (status = 422, description = "`invalid_text`, `invalid_options`, `invalid_window`, `invalid_body`", body = ErrorBody<'static>),
))]
pub(super) async fn admin_create(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    body: web::Json<CreatePoll>,
) -> Result<HttpResponse, AppError> {
    let new = body.into_inner().validate()?;
    let record = store::create_poll(&state.db, &mut state.redis.clone(), &state.keys, new).await?;
    tracing::info!(poll = record.poll.id, admin = %admin.id, "poll created");
    let id = Id::new(record.poll.id).expect("serial ids are positive");
    // A read of this id before it existed may have cached "no such poll".
    store::invalidate_record(&state, id).await?;
    Ok(HttpResponse::Created().json(load_view(&state, id).await?))
}

#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct AdminPollSummary {
    #[serde(flatten)]
    poll: store::PollRow,
    status: crate::domain::PollStatus,
    /// Live, from Redis.
    voters: i64,
}

/// A page of polls with status and live voter count, for the admin page's table
/// (the order and cursors of `GET /api/polls`).
#[utoipa::path(get, path = "/api/admin/polls", tag = "admin", params(PageQuery), security(("bearer" = [])), responses(
    (status = 200, description = "A page of polls with status and live voter count; the next page in `Link` and `X-Next-Cursor`, as `GET /api/polls`", body = [AdminPollSummary], headers(
        ("Link" = String, description = "`</api/admin/polls?limit=50&cursor=...>; rel=\"next\"`: the next page"),
        ("X-Next-Cursor" = String, description = "The `cursor` of the next page"))),
    (status = 400, description = "`invalid_limit` (not 1 to 200) or `invalid_query` (a cursor this server did not issue for this list)", body = ErrorBody<'static>),
))]
pub(super) async fn admin_list(
    req: HttpRequest,
    state: web::Data<AppState>,
    _: AdminUser,
    query: web::Query<PageQuery>,
) -> Result<HttpResponse, AppError> {
    let (limit, after) = query.parse(PollCursor::parse)?;
    let now = Utc::now();
    let page = store::page_with_voters(
        &state.db,
        &mut state.redis.clone(),
        &state.keys,
        after.as_ref(),
        limit,
    )
    .await?
    .map(|(poll, voters)| AdminPollSummary {
        status: store::status(&poll, now),
        poll,
        voters,
    });
    Ok(paged_json(&req, limit, page))
}

#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct AdminPollView {
    #[serde(flatten)]
    view: PollView,
    /// Votes already written to Postgres, per option.
    settled: Vec<store::Tally>,
    settled_voters: i64,
}

/// A poll with live tallies and the tallies already settled in Postgres.
#[utoipa::path(get, path = "/api/admin/polls/{id}", tag = "admin", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The poll", body = AdminPollView),
    (status = 404, description = "`not_found`: no such poll", body = ErrorBody<'static>),
))]
pub(super) async fn admin_show(
    state: web::Data<AppState>,
    _: AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = PollId::parse(&path)?;
    let view = load_view(&state, id).await?;
    let rows = store::settled_tallies(&state.db, id).await?;
    let settled_voters = rows.iter().map(|(_, n)| n).sum();
    Ok(HttpResponse::Ok().json(AdminPollView {
        view,
        settled: rows
            .into_iter()
            .map(|(option_id, votes)| store::Tally { option_id, votes })
            .collect(),
        settled_voters,
    }))
}

/// Closes a poll early.
#[utoipa::path(post, path = "/api/admin/polls/{id}/close", tag = "admin", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The poll", body = PollView),
    (status = 404, description = "`not_found`: no such poll", body = ErrorBody<'static>),
))]
pub(super) async fn admin_close(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = PollId::parse(&path)?;
    let (_, in_redis) = store::close(&state.db, &mut state.redis.clone(), &state.keys, id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no poll with id {id}")))?;
    store::invalidate_record(&state, id).await?;
    if !in_redis {
        // Lost from Redis: the rebuild writes the closed window from Postgres.
        return Err(state.recovery.recovering(Target::Poll(id)));
    }
    tracing::info!(poll = %id, admin = %admin.id, "poll closed");
    Ok(HttpResponse::Ok().json(load_view(&state, id).await?))
}
