//! The poll list: its order, its cursor, and its pages (with live voter counts, or
//! results as the caller may see them).

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;
use sqlx::PgPool;

use super::store::{PollRow, RawResults, parse_results, poll_id, results_reads, status};
use super::visibility::{PollResults, Viewer, asks_for_vote, decide};
use crate::domain::PollId;
use crate::error::AppError;
use crate::keys::Keys;
use crate::paging::{Limit, ListScope, Page};

/// The order of every poll list (`GET /api/polls`, the admin's, the pages): by
/// [`list_rank`] as of one moment (the first page's, carried by the cursor, so a
/// walk through the pages sees one order even as polls open and close meanwhile),
/// then latest opening first, the id (highest first) breaking ties. Keyset paging:
/// a page reads the polls after the cursor's key, never an offset.
pub async fn list_page(
    db: &PgPool,
    at: DateTime<Utc>,
    after: Option<&PollCursor>,
    limit: i64,
    scope: ListScope,
) -> Result<Vec<PollRow>, sqlx::Error> {
    sqlx::query_as::<_, PollRow>(concat!(
        "SELECT ",
        poll_columns!(),
        " FROM (SELECT ",
        poll_columns!(),
        ",
                      CASE WHEN closed OR closes_at <= $1 THEN 2 WHEN opens_at > $1 THEN 1 ELSE 0 END
                        AS list_rank
               FROM polls) p
         WHERE ($2::int2 IS NULL
            OR list_rank > $2
            OR (list_rank = $2 AND (opens_at, id) < ($3::timestamptz, $4::int8)))
           AND CASE $6::text
                 WHEN 'archived' THEN archived_at IS NOT NULL
                 WHEN 'live' THEN archived_at IS NULL AND list_rank = 0
                 WHEN 'upcoming' THEN archived_at IS NULL AND list_rank = 1
                 WHEN 'ended' THEN archived_at IS NULL AND list_rank = 2
                 ELSE archived_at IS NULL END
         ORDER BY list_rank, opens_at DESC, id DESC
         LIMIT $5"
    ))
    .bind(at)
    .bind(after.map(|c| c.rank))
    .bind(after.map(|c| c.opens_at))
    .bind(after.map(|c| c.id))
    .bind(limit)
    .bind(scope.as_str())
    .fetch_all(db)
    .await
}

/// A poll's place in the list order at `at` (the `list_rank` of [`list_page`]'s
/// SQL, which this must match): 0 open, 1 upcoming, 2 closed (run out or early).
pub fn list_rank(poll: &PollRow, at: DateTime<Utc>) -> i16 {
    match status(poll, at) {
        crate::domain::PollStatus::Open => 0,
        crate::domain::PollStatus::Upcoming => 1,
        crate::domain::PollStatus::Closed => 2,
    }
}

/// Where the next page of a poll list starts: the moment the walk's order is taken
/// at, and the sort key of the last poll shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PollCursor {
    pub at: DateTime<Utc>,
    pub rank: i16,
    pub opens_at: DateTime<Utc>,
    pub id: i64,
}

impl PollCursor {
    const TAG: &'static str = "p1";

    /// The cursor after `last`, in the order taken at `at`.
    pub fn after(last: &PollRow, at: DateTime<Utc>) -> Self {
        PollCursor {
            at,
            rank: list_rank(last, at),
            opens_at: last.opens_at,
            id: last.id,
        }
    }

    pub fn encode(&self) -> String {
        crate::paging::encode_cursor(
            Self::TAG,
            &[
                self.at.timestamp_micros(),
                i64::from(self.rank),
                self.opens_at.timestamp_micros(),
                self.id,
            ],
        )
    }

    /// A cursor of a poll list; anything else is a 400 `invalid_query`.
    pub fn parse(raw: &str) -> Result<Self, AppError> {
        let [at, rank, opens_at, id] = crate::paging::decode_cursor::<4>(Self::TAG, raw)?;
        let time = crate::paging::cursor_time;
        let rank = i16::try_from(rank)
            .ok()
            .filter(|r| (0..=2).contains(r))
            .ok_or_else(|| crate::paging::bad_cursor("an unknown rank"))?;
        if id < 1 {
            return Err(crate::paging::bad_cursor("an id that is not positive"));
        }
        Ok(PollCursor {
            at: time(at)?,
            rank,
            opens_at: time(opens_at)?,
            id,
        })
    }
}

/// One page of the poll list (see [`list_page`]) from Postgres, and the cursor of
/// the next page. Polls are not cached: the list is read by people choosing a
/// poll, not by a stampede.
pub async fn page(
    db: &PgPool,
    after: Option<&PollCursor>,
    limit: Limit,
    scope: ListScope,
) -> Result<Page<PollRow>, sqlx::Error> {
    let at = after.map_or_else(crate::paging::list_moment, |c| c.at);
    let rows = list_page(db, at, after, limit.with_one_more(), scope).await?;
    Ok(Page::from_rows(rows, limit, |last| {
        PollCursor::after(last, at).encode()
    }))
}

/// One page of polls (see [`page`]), each with its live voter count and whether
/// `viewer` voted in it (asked only where that decides what they see, see
/// [`asks_for_vote`]; else `false`): one query and one pipelined Redis round trip,
/// however long the page. A poll missing from Redis (lost, being rebuilt) is no
/// poll of 0 voters: the page is `lost(id)` (the caller's 503 `recovering`, which
/// starts the rebuild), see [`lost_polls`].
#[allow(clippy::too_many_arguments)]
pub async fn page_with_voters<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    after: Option<&PollCursor>,
    limit: Limit,
    scope: ListScope,
    viewer: Viewer,
    lost: impl Fn(PollId) -> AppError,
) -> Result<Page<(PollRow, i64, bool)>, AppError> {
    let page = page(db, after, limit, scope).await?;
    let mut pipe = redis::pipe();
    let mut ids = Vec::with_capacity(page.items.len());
    for poll in &page.items {
        let id = poll_id(poll.id)?;
        // Every loaded poll has the meta field `closed`.
        pipe.hexists(keys.poll(id).meta, "closed");
        pipe.hlen(keys.poll(id).voters);
        if let (Viewer::User(user), true) = (viewer, asks_for_vote(poll, viewer)) {
            pipe.hexists(keys.poll(id).voters, user.get());
        }
        ids.push(id);
    }
    let mut answers = run_reads(redis, pipe, page.items.is_empty()).await?;
    let mut next = || next_answer(&mut answers);
    let mut items = Vec::with_capacity(page.items.len());
    let mut missing = Vec::new();
    for (poll, id) in page.items.into_iter().zip(ids) {
        if !parse::<bool>(next()?)? {
            missing.push(id);
        }
        let voters = parse::<i64>(next()?)?;
        let voted = asks_for_vote(&poll, viewer) && parse::<bool>(next()?)?;
        items.push((poll, voters, voted));
    }
    lost_polls(&missing, lost)?;
    Ok(Page {
        items,
        next: page.next,
    })
}

/// A page that lists a poll Redis does not hold would show it without its votes
/// (0 voters, a closed poll's final result empty): the page is refused with
/// `lost(id)` of the first such poll (503 `recovering` with `Retry-After`, which
/// starts its rebuild), as the poll's own routes answer meanwhile. One rebuild a
/// request: after a wipe the sweep restores everything in its order (open sales
/// first), and a list read does not start a rebuild of each poll it holds at once.
fn lost_polls(missing: &[PollId], lost: impl Fn(PollId) -> AppError) -> Result<(), AppError> {
    match missing.first() {
        Some(&id) => Err(lost(id)),
        None => Ok(()),
    }
}

/// One page of polls (see [`page`]), each with its results as `viewer` may see
/// them at `now`: one query and one pipelined Redis round trip (four reads a poll,
/// and whether the caller voted where that decides). A poll Redis does not hold
/// (lost, being rebuilt): see [`lost_polls`].
#[allow(clippy::too_many_arguments)]
pub async fn page_with_results<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    after: Option<&PollCursor>,
    limit: Limit,
    scope: ListScope,
    viewer: Viewer,
    lost: impl Fn(PollId) -> AppError,
) -> Result<Page<(PollRow, PollResults)>, AppError> {
    let page = page(db, after, limit, scope).await?;
    let now = Utc::now();
    let mut pipe = redis::pipe();
    let mut ids = Vec::with_capacity(page.items.len());
    for poll in &page.items {
        let id = poll_id(poll.id)?;
        results_reads(&mut pipe, keys, id);
        if let (Viewer::User(user), true) = (viewer, asks_for_vote(poll, viewer)) {
            pipe.hexists(keys.poll(id).voters, user.get());
        }
        ids.push(id);
    }
    let mut answers = run_reads(redis, pipe, ids.is_empty()).await?;
    let mut next = || next_answer(&mut answers);
    let mut items = Vec::with_capacity(ids.len());
    let mut missing = Vec::new();
    for (poll, id) in page.items.into_iter().zip(ids) {
        let raw: RawResults = (
            parse(next()?)?,
            parse(next()?)?,
            parse(next()?)?,
            parse(next()?)?,
        );
        let voted = match asks_for_vote(&poll, viewer) {
            true => parse::<bool>(next()?)?,
            false => false,
        };
        let Some(results) = parse_results(id, raw) else {
            missing.push(id);
            continue;
        };
        let shown = decide(&poll, results, viewer, voted, now);
        items.push((poll, shown));
    }
    lost_polls(&missing, lost)?;
    Ok(Page {
        items,
        next: page.next,
    })
}

/// A page's pipelined reads, in order (none sent for an empty page).
async fn run_reads<C: ConnectionLike>(
    redis: &mut C,
    pipe: redis::Pipeline,
    empty: bool,
) -> Result<std::vec::IntoIter<redis::Value>, AppError> {
    if empty {
        return Ok(Vec::new().into_iter());
    }
    Ok(pipe
        .query_async::<Vec<redis::Value>>(redis)
        .await?
        .into_iter())
}

/// The next answer of a page's reads; an error when they came back short.
fn next_answer(answers: &mut std::vec::IntoIter<redis::Value>) -> Result<redis::Value, AppError> {
    answers
        .next()
        .ok_or_else(|| AppError::Internal(anyhow::anyhow!("a poll list read came back short")))
}

fn parse<T: redis::FromRedisValue>(value: redis::Value) -> Result<T, AppError> {
    redis::from_redis_value(value).map_err(|e| AppError::Internal(e.into()))
}
