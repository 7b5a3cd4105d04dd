//! Poll records read through the Redis cache ([`crate::cache`]), and the view of a
//! poll (record, status, live tallies) that the API and the pages show. Only the
//! Postgres record is cached; tallies are read from Redis on every request.
//!
//! Poll creation and closing call [`invalidate_record`] after their commit.

use actix_web::web;
use chrono::Utc;
use serde::Serialize;

use super::store::{self, PollRecord};
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
    pub results: store::Results,
}

/// The poll's record (question, options, window) plus its live results.
pub async fn load_view<S: PollReads + ?Sized>(state: &S, id: PollId) -> Result<PollView, AppError> {
    let record = cached_record(state, id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no poll with id {id}")))?;
    let results = live_results(state, id).await?;
    Ok(PollView {
        status: store::status(&record.poll, Utc::now()),
        record,
        results,
    })
}

/// The poll's tallies from Redis; when Redis has no state for it, see
/// [`missing_from_redis`].
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
