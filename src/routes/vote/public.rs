//! Public reads of polls and the vote.

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::Utc;
use serde::Serialize;

use crate::domain::PollId;
use crate::error::{AppError, ErrorBody};
use crate::live::Topic;
use crate::routes::auth::optional_user;
use crate::routes::{PageQuery, paged_json};
use crate::state::AppState;
use crate::vote::cached::{PollView, cached_record, load_view, results_for, sees_tallies};
use crate::vote::list::{self, PollCursor};
use crate::vote::store;
use crate::vote::visibility::{PollResults, Viewer};

#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct PollSummary {
    #[serde(flatten)]
    poll: store::PollRow,
    status: crate::domain::PollStatus,
    /// The live results as the caller may see them (hidden:
    /// `{"closed", "hidden": true, "until", "voters"}`).
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
        |id| crate::vote::cached::PollReads::recovering(state.get_ref(), id),
    )
    .await?;
    let mut items = Vec::with_capacity(page.items.len());
    for (poll, mut results) in page.items {
        // A closed ranked poll's results carry its runoff, as one poll's do.
        if poll.ballot == crate::vote::setting::BallotKind::Ranked
            && matches!(results, PollResults::Shown(_))
            && let Some(record) = cached_record(state.get_ref(), store::poll_id(poll.id)?).await?
        {
            crate::vote::cached::add_runoff(state.get_ref(), &record, &mut results, now).await?;
        }
        items.push(PollSummary {
            status: store::status(&poll, now),
            poll,
            results,
        });
    }
    let page = crate::paging::Page {
        items,
        next: page.next,
    };
    let mut answer = paged_json(&req, limit, page);
    // What it holds depends on who asks (an admin's token, a voter of an
    // after_vote poll see tallies): no cache may keep it, as one poll's answer.
    answer.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    Ok(answer)
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
    (status = 429, description = "`too_many_streams`: this client address holds as many streams as it may", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds before trying again"))),
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
    let client = state.limiter.client_ip(&req);
    state.live.stream(client, topic, "poll", load).await
}

/// Live results for pages that poll, as the caller may see them: the cached record
/// and Redis, no Postgres query per viewer.
#[utoipa::path(get, path = "/api/polls/{id}/results", tag = "polls", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), responses(
    (status = 200, description = "Live tallies from Redis, or `{\"closed\": b, \"hidden\": true, \"until\": \"vote\" | \"close\" | \"reveal\", \"voters\": n}` while this caller may not see them", body = PollResults),
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
