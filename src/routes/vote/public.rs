//! Public reads of polls and the vote.

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::Utc;
use serde::{Deserialize, Serialize};

use crate::auth::AuthUser;
use crate::domain::PollId;
use crate::error::{AppError, ErrorBody, ErrorCode};
use crate::limit::Route;
use crate::live::Topic;
use crate::metrics::Metrics;
use crate::recover::Target;
use crate::routes::auth::optional_user;
use crate::routes::{PageQuery, paged_json};
use crate::state::{AppState, Worker};
use crate::vote::cached::{
    PollView, cached_record, load_view, missing_from_redis, results_for, sees_tallies,
};
use crate::vote::cast::{VoteOutcome, VoteReply, VoteRequest};
use crate::vote::list::{self, PollCursor};
use crate::vote::store;
use crate::vote::visibility::{PollResults, Viewer};

#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct PollSummary {
    #[serde(flatten)]
    poll: store::PollRow,
    status: crate::domain::PollStatus,
    /// The live results as the caller may see them (hidden:
    /// `{"hidden": true, "until", "voters"}`).
    results: PollResults,
}

/// A page of polls in the list order: open polls first, then upcoming ones, then
/// closed ones; latest opening first within each, the id breaking ties. The order
/// is taken at the first page's moment for the whole walk. Each with its results as
/// the caller may see them (an admin's token: always the tallies).
#[utoipa::path(get, path = "/api/polls", tag = "polls", params(PageQuery), responses(
    (status = 200, description = "A page of polls with their status; the next page's address in `Link` and its cursor in `X-Next-Cursor`, both absent on the last page", body = [PollSummary], headers(
        ("Link" = String, description = "`</api/polls?limit=50&cursor=...>; rel=\"next\"`: the next page"),
        ("X-Next-Cursor" = String, description = "The `cursor` of the next page"))),
    (status = 400, description = "`invalid_limit` (not 1 to 200) or `invalid_query` (a cursor this server did not issue for this list)", body = ErrorBody<'static>),
))]
pub(super) async fn list(
    req: HttpRequest,
    state: web::Data<AppState>,
    query: web::Query<PageQuery>,
) -> Result<HttpResponse, AppError> {
    let (limit, after) = query.parse(PollCursor::parse)?;
    let viewer = Viewer::from(optional_user(&req)?);
    let now = Utc::now();
    let page = list::page_with_results(
        &state.db,
        &mut state.redis.clone(),
        &state.keys,
        after.as_ref(),
        limit,
        crate::paging::ListScope::Public,
        viewer,
    )
    .await?
    .map(|(poll, results)| PollSummary {
        status: store::status(&poll, now),
        poll,
        results,
    });
    Ok(paged_json(&req, limit, page))
}

/// One poll: question, options, window and live results as the caller may see
/// them (hidden until the vote, the close or a reveal, as its `results` says; an
/// admin's token always sees the tallies).
#[utoipa::path(get, path = "/api/polls/{id}", tag = "polls", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), responses(
    (status = 200, description = "The poll", body = PollView),
    (status = 404, description = "`not_found`: no such poll", body = ErrorBody<'static>),
))]
pub(super) async fn show(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = PollId::parse(&path)?;
    let viewer = Viewer::from(optional_user(&req)?);
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(load_view(&state, id, viewer).await?))
}

/// The poll's live results as server-sent events: the JSON of
/// `GET /api/polls/{id}/results` at once, then again whenever a tally or the status
/// changes (read once a second per poll in each process, however many pages watch
/// it: see [`crate::live`]). Two streams per poll: the tallies, followed only by
/// callers who see them whatever the poll's state (an admin, a voter of an
/// `after_vote` poll whose ballot is in, when the stream starts), and what anyone
/// may see, followed by everyone else: hidden tallies never enter that one.
#[utoipa::path(get, path = "/api/polls/{id}/events", tag = "polls", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), responses(
    (status = 200, description = "`text/event-stream`: each `data:` line the results, as `GET /api/polls/{id}/results` answers", content_type = "text/event-stream", body = crate::live::LiveEvent),
    (status = 404, description = "`not_found`: no such poll", body = ErrorBody<'static>),
    (status = 503, description = "The poll cannot be read now", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds before trying again"))),
))]
pub(super) async fn events(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = PollId::parse(&path)?;
    let viewer = Viewer::from(optional_user(&req)?);
    let tallies = match cached_record(state.get_ref(), id).await? {
        Some(record) => sees_tallies(state.get_ref(), &record, viewer).await?,
        None => false,
    };
    // The topic's reader shares one reading among all its streams, so it reads as
    // the topic's viewers: an admin for the tallies, anyone for the other.
    let (topic, shared_viewer) = if tallies {
        (Topic::PollTallies(id), Viewer::Admin)
    } else {
        (Topic::Poll(id), Viewer::Anyone)
    };
    let reader = state.clone();
    let load = move || {
        let state = reader.clone();
        async move {
            match results_for(&state, id, shared_viewer).await {
                Ok(results) => Ok(Some(crate::live::json(&results)?)),
                Err(e) if actix_web::ResponseError::status_code(&e) == StatusCode::NOT_FOUND => {
                    Ok(None)
                }
                Err(e) => Err(e),
            }
        }
    };
    state.live.stream(topic, "poll", load).await
}

/// Live results for pages that poll, as the caller may see them: the cached record
/// and Redis, no Postgres query per viewer.
#[utoipa::path(get, path = "/api/polls/{id}/results", tag = "polls", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), responses(
    (status = 200, description = "Live tallies from Redis, or `{\"hidden\": true, \"until\": \"vote\" | \"close\" | \"reveal\", \"voters\": n}` while this caller may not see them", body = PollResults),
    (status = 404, description = "`not_found`: no such poll", body = ErrorBody<'static>),
))]
pub(super) async fn results(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = PollId::parse(&path)?;
    let viewer = Viewer::from(optional_user(&req)?);
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(results_for(&state, id, viewer).await?))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct VoteBody {
    option_id: i64,
}

#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct VoteAccepted {
    /// Always `accepted`.
    status: &'static str,
    #[schema(value_type = i64)]
    poll_id: PollId,
    option_id: i64,
}

/// One vote per user per poll.
#[utoipa::path(post, path = "/api/polls/{id}/votes", tag = "polls", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), request_body = VoteBody, security(("bearer" = [])), responses(
    (status = 202, description = "Accepted", body = VoteAccepted, headers(
        ("RateLimit" = String), ("RateLimit-Policy" = String))),
    (status = 404, description = "`not_found`: no such poll", body = ErrorBody<'static>),
    (status = 409, description = "`already_voted`, or `not_open` (with `Retry-After`: seconds until it opens)", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "With `not_open`: seconds until the poll opens"))),
    (status = 410, description = "`closed`", body = ErrorBody<'static>),
    (status = 422, description = "`unknown_option` (an option of another poll, or none), `rate_limit_unsatisfiable`, `invalid_body`", body = ErrorBody<'static>),
    (status = 429, description = "`rate_limited`: a vote limit refused", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"),
        ("RateLimit" = String), ("RateLimit-Policy" = String))),
))]
#[tracing::instrument(level = "debug", skip_all, fields(poll = %path.as_str()))]
pub(super) async fn vote(
    state: web::Data<AppState>,
    worker: web::Data<Worker>,
    user: AuthUser,
    path: web::Path<String>,
    body: web::Json<VoteBody>,
    req: HttpRequest,
) -> Result<HttpResponse, AppError> {
    let poll = PollId::parse(&path)?;
    let option_id = body.option_id;
    if option_id <= 0 {
        return Err(unknown_option());
    }
    // Per-user and per-IP limits against vote stuffing, checked inside the vote
    // script: a refused vote is recorded by no policy and changes no tally.
    let ip = state
        .limiter
        .limits()
        .counts_ip(Route::Vote)
        .then(|| state.limiter.client_ip(&req));
    let reply = worker
        .votes
        .submit(
            poll,
            VoteRequest {
                user: user.id,
                option: option_id,
                ip,
            },
        )
        .await?;
    Metrics::inc(match reply.outcome {
        VoteOutcome::Accepted { .. } => &state.metrics.vote_accepted,
        _ => &state.metrics.vote_refused,
    });
    vote_answer(&state, poll, option_id, reply).await
}

/// The answer to a vote the batch decided: 202, or the refusal.
async fn vote_answer(
    state: &AppState,
    poll: PollId,
    option_id: i64,
    reply: VoteReply,
) -> Result<HttpResponse, AppError> {
    let outcome = reply.outcome;
    // The RateLimit headers of a 202, or the 429 (422) of a refusal by a limit;
    // other refusals carry no RateLimit headers (as in the purchase).
    let judged = || {
        let policies = state.limiter.limits().for_route(Route::Vote);
        let decided: Vec<_> = policies.iter().zip(reply.limits.iter().copied()).collect();
        state.limiter.judge(&decided)
    };
    match outcome {
        VoteOutcome::Accepted { .. } => Ok(judged()?.attach(HttpResponse::Accepted().json(
            VoteAccepted {
                status: "accepted",
                poll_id: poll,
                option_id,
            },
        ))),
        VoteOutcome::AlreadyVoted => Err(AppError::new(
            ErrorCode::AlreadyVoted,
            "you already voted in this poll (one vote per person)",
        )),
        VoteOutcome::UnknownOption => Err(unknown_option()),
        VoteOutcome::NotOpen { opens_in_ms } => {
            let secs = (opens_in_ms + 999) / 1000;
            Err(AppError::new(
                ErrorCode::NotOpen,
                format!("this poll is not open yet; it opens in {secs} s"),
            )
            .with_header(header::RETRY_AFTER, secs.max(1).to_string()))
        }
        VoteOutcome::Closed => Err(AppError::new(ErrorCode::Closed, "this poll is closed")),
        VoteOutcome::NotLoaded => Err(missing_from_redis(state, poll).await),
        VoteOutcome::Recovering => Err(state.recovery.recovering(Target::Poll(poll))),
        VoteOutcome::RateLimited { .. } | VoteOutcome::RateLimitUnsatisfiable => {
            let _no_policy_refused = judged()?;
            Err(AppError::Internal(anyhow::anyhow!(
                "a rate-limited vote came back with no refusing policy"
            )))
        }
    }
}

fn unknown_option() -> AppError {
    AppError::new(
        ErrorCode::UnknownOption,
        "that option does not belong to this poll",
    )
}
