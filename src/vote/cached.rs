//! Poll records read through the Redis cache ([`crate::cache`]), and the view of a
//! poll (record, status, live tallies) that the API and the pages show. Only the
//! Postgres record is cached; tallies are read from Redis on every request, and
//! shown or hidden for the caller there ([`super::visibility`]): nothing cached or
//! shared ever holds one caller's view.
//!
//! Every change of a poll (create, edit, close, archive, reveal) calls
//! [`invalidate_record`] after its commit.

use actix_web::web;
use chrono::Utc;
use serde::Serialize;

use super::store::{self, PollRecord};
use super::visibility::{PollResults, ResultsVisibility, Viewer, asks_for_vote, decide};
use crate::cache::{CachedReads, RECORD_TTL};
use crate::domain::PollId;
use crate::error::AppError;
/// What a poll's view needs: the cached reads, and the answer when Redis lost the
/// poll (which starts its rebuild). The application state implements it
/// (`state.rs`, through the recovery driver), so polls need no import of it.
pub trait PollReads: CachedReads {
    /// 503 `recovering`, with the poll's rebuild started.
    fn recovering(&self, poll: PollId) -> AppError;
}

impl<T: PollReads + ?Sized> PollReads for web::Data<T> {
    fn recovering(&self, poll: PollId) -> AppError {
        (**self).recovering(poll)
    }
}

/// The poll's record through the Redis cache: one Postgres query per miss across all
/// instances; `None` (cached too) when there is no such poll. Live tallies are never
/// part of it. Poll creation and closing call [`invalidate_record`].
pub async fn cached_record<S: CachedReads + ?Sized>(
    state: &S,
    id: PollId,
) -> Result<Option<PollRecord>, AppError> {
    let db = state.db();
    state
        .cache()
        .get_or_rebuild(&state.keys().poll_view(id), RECORD_TTL, || async move {
            Ok(store::fetch_record(db, id).await?)
        })
        .await
}

pub async fn invalidate_record<S: CachedReads + ?Sized>(
    state: &S,
    id: PollId,
) -> Result<(), AppError> {
    state
        .cache()
        .invalidate(&[state.keys().poll_view(id)])
        .await
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct PollView {
    #[serde(flatten)]
    pub record: store::PollRecord,
    pub status: crate::domain::PollStatus,
    /// The tallies, or `{"closed", "hidden": true, "until", "voters"}` when this caller may
    /// not see them yet.
    pub results: PollResults,
}

/// The poll's record (question, options, window) plus its live results as
/// `viewer` may see them.
pub async fn load_view<S: PollReads + ?Sized>(
    state: &S,
    id: PollId,
    viewer: Viewer,
) -> Result<PollView, AppError> {
    let (record, results) = record_and_results(state, id).await?;
    let now = Utc::now();
    let results = shown_to(state, &record, results, viewer, now).await?;
    Ok(PollView {
        status: store::status(&record.poll, now),
        record,
        results,
    })
}

/// The poll's live results as `viewer` may see them (`GET /api/polls/{id}/results`
/// and the event streams): the cached record, then Redis; no Postgres on a hit.
pub async fn results_for<S: PollReads + ?Sized>(
    state: &S,
    id: PollId,
    viewer: Viewer,
) -> Result<PollResults, AppError> {
    let (record, results) = record_and_results(state, id).await?;
    shown_to(state, &record, results, viewer, Utc::now()).await
}

/// The cached record (404 when none) and the tallies from Redis, whoever asks.
async fn record_and_results<S: PollReads + ?Sized>(
    state: &S,
    id: PollId,
) -> Result<(PollRecord, store::Results), AppError> {
    let record = cached_record(state, id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no poll with id {id}")))?;
    Ok((record, live_results(state, id).await?))
}

/// Whether `viewer` sees the tallies whatever the poll's state: an admin, or a
/// signed-in voter of an `after_vote` poll whose ballot is in (one `HGET`). An
/// event stream's subscription is decided by it: such a viewer follows the
/// tallies, everyone else what anyone may see.
pub async fn sees_tallies<S: PollReads + ?Sized>(
    state: &S,
    record: &PollRecord,
    viewer: Viewer,
) -> Result<bool, AppError> {
    let id = store::poll_id(record.poll.id)?;
    Ok(match viewer {
        Viewer::Admin => true,
        Viewer::Anyone => false,
        Viewer::User(user) => {
            record.poll.results == ResultsVisibility::AfterVote && voted(state, id, user).await?
        }
    })
}

async fn voted<S: PollReads + ?Sized>(
    state: &S,
    id: PollId,
    user: crate::domain::UserId,
) -> Result<bool, AppError> {
    let choice = store::voted_option(&mut state.redis().clone(), state.keys(), id, user).await?;
    Ok(choice.is_some())
}

/// `results` as `viewer` may see them, decided at `now` (the server's clock, as the
/// poll's status).
async fn shown_to<S: PollReads + ?Sized>(
    state: &S,
    record: &PollRecord,
    results: store::Results,
    viewer: Viewer,
    now: chrono::DateTime<Utc>,
) -> Result<PollResults, AppError> {
    let poll = &record.poll;
    let voted = match viewer {
        Viewer::User(user) if asks_for_vote(poll, viewer) => {
            voted(state, store::poll_id(poll.id)?, user).await?
        }
        _ => false,
    };
    let mut shown = decide(poll, results, viewer, voted, now);
    add_runoff(state, record, &mut shown, now).await?;
    Ok(shown)
}

/// A closed ranked poll's shown results carry its runoff (see
/// [`super::result::runoff`]); any other results are left as they are.
pub async fn add_runoff<S: PollReads + ?Sized>(
    state: &S,
    record: &PollRecord,
    shown: &mut PollResults,
    now: chrono::DateTime<Utc>,
) -> Result<(), AppError> {
    let poll = &record.poll;
    if let PollResults::Shown(results) = shown
        && poll.ballot == super::setting::BallotKind::Ranked
        && super::visibility::is_closed(poll, results.closed, now)
    {
        let id = store::poll_id(poll.id)?;
        let counted =
            super::result::runoff(state.redis(), state.keys(), record, id, &results.stamp).await?;
        results.runoff = Some((*counted).clone());
    }
    Ok(())
}

/// The poll's tallies from Redis, whoever asks (callers decide what to show);
/// when Redis has no state for it, see [`missing_from_redis`].
pub async fn live_results<S: PollReads + ?Sized>(
    state: &S,
    id: PollId,
) -> Result<store::Results, AppError> {
    match store::results(&mut state.redis().clone(), state.keys(), id).await? {
        Some(results) => Ok(results),
        None => Err(missing_from_redis(state, id).await),
    }
}

/// Redis has no state for this poll: 404 when Postgres has none either, else the
/// poll was lost (wiped): rebuild it and answer 503 meanwhile.
pub async fn missing_from_redis<S: PollReads + ?Sized>(state: &S, poll: PollId) -> AppError {
    match cached_record(state, poll).await {
        Ok(Some(_)) => state.recovering(poll),
        Ok(None) => AppError::not_found(format!("no poll with id {poll}")),
        Err(e) => e,
    }
}
