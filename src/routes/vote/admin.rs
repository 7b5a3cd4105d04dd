//! The admin's routes of polls: create, list, show, close, reveal.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::auth::AdminUser;
use crate::domain::{self, Id, PollId};
use crate::error::{AppError, ErrorBody, ErrorCode};
use crate::paging::ListScope;
use crate::recover::Target;
use crate::routes::paged_json_with;
use crate::state::AppState;
use crate::vote::cached::invalidate_record;
use crate::vote::cached::{PollView, load_view};
use crate::vote::list::{self, PollCursor};
use crate::vote::setting::{BallotFields, BallotSettings};
use crate::vote::store::{self, NewPoll};
use crate::vote::visibility::{ResultsVisibility, Viewer};
use crate::vote::{MAX_OPTIONS, MIN_OPTIONS};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreatePoll {
    question: String,
    options: Vec<String>,
    opens_at: DateTime<Utc>,
    closes_at: DateTime<Utc>,
    /// Who sees the tallies when: `live` (the default: everyone, at once),
    /// `after_vote`, `after_close` or `on_reveal`; else 422 `invalid_ballot_settings`.
    #[schema(value_type = Option<ResultsVisibility>)]
    #[serde(default)]
    results: Option<serde_json::Value>,
    /// `single` (the default), `multi`, `budget` or `ranked`.
    #[schema(value_type = Option<crate::vote::setting::BallotKind>)]
    #[serde(default)]
    ballot: Option<serde_json::Value>,
    /// `multi` and `ranked`: most options on one ballot, 1 to the number of options
    /// (not sent: all of them).
    #[schema(value_type = Option<i32>)]
    #[serde(default)]
    max_choices: Option<serde_json::Value>,
    /// `budget` (required there): votes each voter may spend, 1 to 1,000.
    #[schema(value_type = Option<i32>)]
    #[serde(default)]
    votes_per_user: Option<serde_json::Value>,
    /// `budget`: most votes of one voter on one option, 1 to `votes_per_user` (the
    /// default).
    #[schema(value_type = Option<i32>)]
    #[serde(default)]
    max_per_option: Option<serde_json::Value>,
    /// `single`, `multi`, `ranked`: a voter may replace the ballot until the close
    /// (default `false`).
    #[schema(value_type = Option<bool>)]
    #[serde(default)]
    allow_change: Option<serde_json::Value>,
    /// Leading zero bits of a proof of work asked with each vote
    /// (`GET /api/polls/{id}/challenge`, then the `Proof-Of-Work` header): 0 (the
    /// default, off) to 24; else 422 `invalid_fairness`.
    #[schema(value_type = Option<i32>, minimum = 0, maximum = 24)]
    #[serde(default)]
    proof_of_work: Option<serde_json::Value>,
    /// Least age of an account that may vote, in seconds before the opening (or
    /// before the vote, when later): 0 (the default, off) to 31622400 (366 days);
    /// else 422 `invalid_fairness`.
    #[schema(value_type = Option<i32>, minimum = 0, maximum = 31622400)]
    #[serde(default)]
    min_account_age_s: Option<serde_json::Value>,
}

/// The `results` setting of a create or an edit, when sent (a `null` is not sent).
pub(super) fn parse_results(
    raw: Option<&serde_json::Value>,
) -> Result<Option<ResultsVisibility>, AppError> {
    raw.map(ResultsVisibility::from_setting).transpose()
}

/// A poll's options: 2 to 20, each 1 to 200 characters, distinct as a reader
/// sees them (ignoring case, runs of white space and characters that show
/// nothing: [`domain::visible_key`]).
pub(super) fn parse_options(raw: &[String]) -> Result<Vec<String>, AppError> {
    if !(MIN_OPTIONS..=MAX_OPTIONS).contains(&raw.len()) {
        return Err(AppError::new(
            ErrorCode::InvalidOptions,
            format!("a poll has {MIN_OPTIONS} to {MAX_OPTIONS} options"),
        ));
    }
    let options = raw
        .iter()
        .map(|o| domain::parse_line("option", o, 200))
        .collect::<Result<Vec<_>, _>>()?;
    let mut seen = std::collections::HashSet::new();
    if !options.iter().all(|o| seen.insert(domain::visible_key(o))) {
        return Err(AppError::new(
            ErrorCode::InvalidOptions,
            "options must be distinct",
        ));
    }
    Ok(options)
}

impl CreatePoll {
    fn validate(self) -> Result<NewPoll, AppError> {
        let question = domain::parse_line("question", &self.question, 300)?;
        let options = parse_options(&self.options)?;
        crate::vote::lifecycle::check_window(self.opens_at, self.closes_at)?;
        let results = parse_results(self.results.as_ref())?.unwrap_or_default();
        let ballot = BallotFields {
            ballot: self.ballot,
            max_choices: self.max_choices,
            votes_per_user: self.votes_per_user,
            max_per_option: self.max_per_option,
            allow_change: self.allow_change,
        }
        .settle(BallotSettings::default(), options.len())?;
        let fairness = crate::gate::FairnessFields {
            proof_of_work: self.proof_of_work,
            min_account_age_s: self.min_account_age_s,
        }
        .parse()?;
        Ok(NewPoll {
            fairness,
            question,
            options,
            opens_at: self.opens_at,
            closes_at: self.closes_at,
            results,
            ballot,
        })
    }
}

/// Creates a poll of 2 to 20 options.
#[utoipa::path(post, path = "/api/admin/polls", tag = "admin", request_body = CreatePoll, security(("bearer" = [])), responses(
    (status = 201, description = "The new poll", body = PollView),
    (status = 422, description = "`invalid_text`, `invalid_options`, `invalid_window`, `invalid_ballot_settings` (a `results`, `ballot`, `max_choices`, `votes_per_user`, `max_per_option` or `allow_change` out of its values; the message says which), `invalid_fairness` (`proof_of_work` or `min_account_age_s` out of range), `invalid_body`", body = ErrorBody<'static>),
))]
pub(super) async fn admin_create(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    body: crate::routes::extract::JsonObject<CreatePoll>,
) -> Result<HttpResponse, AppError> {
    let new = body.into_inner().validate()?;
    let record = store::create_poll(
        &state.db,
        &mut state.redis.clone(),
        &state.keys,
        new,
        Some(admin.id),
    )
    .await?;
    state.wake.catalog_changed();
    tracing::info!(poll = record.poll.id, admin = %admin.id, "poll created");
    let id = Id::new(record.poll.id).expect("serial ids are positive");
    // A read of this id before it existed may have cached "no such poll".
    invalidate_record(&state, id).await?;
    Ok(HttpResponse::Created().json(load_view(&state, id, Viewer::Admin).await?))
}

#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct AdminPollSummary {
    #[serde(flatten)]
    poll: store::PollRow,
    status: crate::domain::PollStatus,
    /// Live, from Redis.
    voters: i64,
}

/// The admin's list query: a page, and which polls.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct AdminListQuery {
    /// Items per page: a whole number from 1 to 200 (default 50); else 400 `invalid_limit`.
    #[param(value_type = Option<u16>, minimum = 1, maximum = 200)]
    limit: Option<String>,
    /// Where the page starts: the `X-Next-Cursor` of the page before (opaque).
    cursor: Option<String>,
    /// `all` (the default: every poll not archived), `live` (open), `upcoming`,
    /// `ended` (closed) or `archived`; else 400 `invalid_query`.
    filter: Option<String>,
}

/// A page of polls with status and live voter count, for the admin page's table
/// (the order and cursors of `GET /api/polls`), archived ones by `filter`.
#[utoipa::path(get, path = "/api/admin/polls", tag = "admin", params(AdminListQuery), security(("bearer" = [])), responses(
    (status = 200, description = "A page of polls with status and live voter count; the next page in `Link` and `X-Next-Cursor`, as `GET /api/polls`", body = [AdminPollSummary], headers(
        ("Link" = String, description = "`</api/admin/polls?limit=50&cursor=...>; rel=\"next\"`: the next page"),
        ("X-Next-Cursor" = String, description = "The `cursor` of the next page"))),
    (status = 400, description = "`invalid_limit` (not 1 to 200) or `invalid_query` (a cursor this server did not issue for this list)", body = ErrorBody<'static>),
))]
pub(super) async fn admin_list(
    req: HttpRequest,
    state: web::Data<AppState>,
    _: AdminUser,
    query: web::Query<AdminListQuery>,
) -> Result<HttpResponse, AppError> {
    let limit = crate::paging::Limit::parse(query.limit.as_deref())?;
    let after = query.cursor.as_deref().map(PollCursor::parse).transpose()?;
    let scope = ListScope::parse_filter(query.filter.as_deref())?;
    let now = Utc::now();
    let page = list::page_with_voters(
        &state.db,
        &mut state.redis.clone(),
        &state.keys,
        after.as_ref(),
        limit,
        scope,
        crate::vote::visibility::Viewer::Admin,
        |id| crate::vote::cached::PollReads::recovering(state.get_ref(), id),
    )
    .await?
    .map(|(poll, voters, _)| AdminPollSummary {
        status: store::status(&poll, now),
        poll,
        voters,
    });
    let extra = format!("&filter={}", scope.as_str());
    Ok(paged_json_with(&req, limit, page, &extra))
}

#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct AdminPollView {
    #[serde(flatten)]
    view: PollView,
    /// Votes already written to Postgres, per option.
    settled: Vec<store::Tally>,
    /// Voters with a vote in Postgres, each once (a multi or budget ballot's picks
    /// and votes are the tallies').
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
    let view = load_view(&state, id, Viewer::Admin).await?;
    let (rows, settled_voters) = store::settled_tallies_and_voters(&state.db, id).await?;
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
    let (_, in_redis) = store::close(&state.db, &state.redis, &state.keys, id, admin.id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no poll with id {id}")))?;
    invalidate_record(&state, id).await?;
    if !in_redis {
        // Lost from Redis: the rebuild writes the closed window from Postgres.
        return Err(state.recovery.recovering(Target::Poll(id)));
    }
    tracing::info!(poll = %id, admin = %admin.id, "poll closed");
    Ok(HttpResponse::Ok().json(load_view(&state, id, Viewer::Admin).await?))
}

/// Reveals the results of an `on_reveal` poll once it is closed: from then on
/// everyone sees its tallies. A second reveal answers the poll as it is.
#[utoipa::path(post, path = "/api/admin/polls/{id}/reveal", tag = "admin", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The poll, with `revealed_at`", body = PollView),
    (status = 404, description = "`not_found`: no such poll", body = ErrorBody<'static>),
    (status = 409, description = "`not_revealable`: the poll's `results` is not `on_reveal`, or it is not closed yet", body = ErrorBody<'static>),
))]
pub(super) async fn admin_reveal(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = PollId::parse(&path)?;
    if crate::vote::reveal::reveal(state.get_ref(), id, admin.id).await? {
        tracing::info!(poll = %id, admin = %admin.id, "poll results revealed");
    }
    Ok(HttpResponse::Ok().json(load_view(&state, id, Viewer::Admin).await?))
}
