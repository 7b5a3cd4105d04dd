//! The Rust side of the poll scripts and the poll tables.

use std::collections::HashMap;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;
use serde::Serialize;
use sqlx::PgPool;

use crate::domain::{Id, PollId, UserId};
use crate::error::AppError;
use crate::keys::Keys;
use crate::lua::lua_script;
use crate::paging::{Limit, ListScope, Page};
use crate::settle::ensure_group;

static NEW_POLL: LazyLock<crate::lua::Script> = lua_script!("new_poll.lua");
static UPDATE_META: LazyLock<crate::lua::Script> = lua_script!("update_meta.lua");

#[derive(Clone, Debug, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct PollRow {
    pub id: i64,
    pub question: String,
    pub opens_at: DateTime<Utc>,
    pub closes_at: DateTime<Utc>,
    pub closed: bool,
    /// When an admin archived the poll: off the public lists, still reachable by
    /// link. (Default: records cached before archiving existed.)
    #[serde(default)]
    pub archived_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct OptionRow {
    pub id: i64,
    pub label: String,
    pub position: i32,
}

/// A poll's record: question, window and options (what a cache may hold).
#[derive(Clone, Debug, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct PollRecord {
    #[serde(flatten)]
    pub poll: PollRow,
    pub options: Vec<OptionRow>,
}

/// Live results, from Redis only.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Results {
    pub poll_id: i64,
    /// Closed early by an admin (a poll past its `closes_at` is closed too; pages
    /// compare that time with their clock).
    pub closed: bool,
    pub voters: i64,
    /// Option id -> votes, every option present (0 when none).
    pub tallies: Vec<Tally>,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Tally {
    pub option_id: i64,
    pub votes: i64,
}

pub fn status(poll: &PollRow, now: DateTime<Utc>) -> crate::domain::PollStatus {
    crate::domain::PollStatus::of(poll.closed, now, poll.opens_at, poll.closes_at)
}

pub struct NewPoll {
    pub question: String,
    pub options: Vec<String>,
    pub opens_at: DateTime<Utc>,
    pub closes_at: DateTime<Utc>,
}

/// Inserts poll and options and loads them into Redis in one transaction: if Redis
/// refuses, nothing is written.
pub async fn create_poll<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    new: NewPoll,
    admin: Option<UserId>,
) -> Result<PollRecord, AppError> {
    let mut tx = db.begin().await?;
    let poll = sqlx::query_as::<_, PollRow>(
        "INSERT INTO polls (question, opens_at, closes_at) VALUES ($1, $2, $3)
         RETURNING id, question, opens_at, closes_at, closed, archived_at",
    )
    .bind(&new.question)
    .bind(new.opens_at)
    .bind(new.closes_at)
    .fetch_one(&mut *tx)
    .await?;
    let positions: Vec<i32> = (1..=new.options.len() as i32).collect();
    let options = sqlx::query_as::<_, OptionRow>(
        "INSERT INTO poll_options (poll_id, label, position)
         SELECT $1, label, position FROM UNNEST($2::text[], $3::int4[]) AS t(label, position)
         RETURNING id, label, position",
    )
    .bind(poll.id)
    .bind(&new.options)
    .bind(&positions)
    .fetch_all(&mut *tx)
    .await?;
    let record = PollRecord { poll, options };
    let id = poll_id(record.poll.id)?;
    if let Some(admin) = admin {
        let after = serde_json::to_value(&record).map_err(|e| AppError::Internal(e.into()))?;
        crate::audit::record(
            &mut tx,
            crate::audit::Change {
                admin,
                action: crate::audit::Action::Create,
                subject: crate::audit::Subject::Poll(id),
                before: None,
                after: Some(after),
            },
        )
        .await?;
    }
    let k = keys.poll(id);
    let mut inv = NEW_POLL.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.options)
        .arg(record.poll.opens_at.timestamp_millis())
        .arg(record.poll.closes_at.timestamp_millis())
        .arg(u8::from(record.poll.closed));
    for option in &record.options {
        inv.arg(option.id);
    }
    let _: i64 = inv.invoke_async(redis).await?;
    ensure_group(redis, &k.votes).await?;
    tx.commit().await?;
    Ok(record)
}

fn poll_id(raw: i64) -> Result<PollId, AppError> {
    Id::new(raw).ok_or_else(|| AppError::Internal(anyhow::anyhow!("poll id {raw} not positive")))
}

pub async fn fetch_record(db: &PgPool, id: PollId) -> Result<Option<PollRecord>, sqlx::Error> {
    let Some(poll) = sqlx::query_as::<_, PollRow>(
        "SELECT id, question, opens_at, closes_at, closed, archived_at FROM polls WHERE id = $1",
    )
    .bind(id.get())
    .fetch_optional(db)
    .await?
    else {
        return Ok(None);
    };
    let options = sqlx::query_as::<_, OptionRow>(
        "SELECT id, label, position FROM poll_options WHERE poll_id = $1 ORDER BY position",
    )
    .bind(id.get())
    .fetch_all(db)
    .await?;
    Ok(Some(PollRecord { poll, options }))
}

// Read through the cache by [`super::cached`]; re-exported for the pages that
// read a poll's record beside its tallies.
pub use super::cached::{cached_record, invalidate_record};

/// Whether a poll asking `question` is still open (the demo seed creates one once).
pub async fn open_asking(db: &PgPool, question: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM polls WHERE question = $1 AND closes_at > now())",
    )
    .bind(question)
    .fetch_one(db)
    .await
}

/// The polls open now or closed in the last ten minutes, each with its votes
/// stream's entries and those settlement read and has not acknowledged (see
/// [`crate::redis_conn::stream_backlog`]), as a scrape of `/metrics` reads them.
/// Best effort: no polls when Postgres cannot answer, none of a poll whose stream
/// Redis cannot read.
pub async fn watched_backlogs<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
) -> Vec<(i64, (u64, u64))> {
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM polls WHERE opens_at <= now() AND closes_at > now() - interval '10 minutes'",
    )
    .fetch_all(db)
    .await
    .unwrap_or_default();
    let mut backlogs = Vec::with_capacity(ids.len());
    for id in ids {
        let Some(poll) = Id::new(id) else {
            continue;
        };
        let stream = keys.poll(poll).votes;
        let backlog =
            crate::redis_conn::stream_backlog(redis, &stream, crate::settle::SETTLE_GROUP).await;
        if let Some(backlog) = backlog {
            backlogs.push((id, backlog));
        }
    }
    backlogs
}

/// Votes in Postgres per option of the poll, `(option id, votes)` in option order
/// (options nobody voted for with 0).
pub async fn settled_tallies(db: &PgPool, id: PollId) -> Result<Vec<(i64, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT o.id, count(v.user_id) FROM poll_options o
         LEFT JOIN votes v ON v.option_id = o.id
         WHERE o.poll_id = $1 GROUP BY o.id ORDER BY o.id",
    )
    .bind(id.get())
    .fetch_all(db)
    .await
}

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
    sqlx::query_as::<_, PollRow>(
        "SELECT id, question, opens_at, closes_at, closed, archived_at
         FROM (SELECT id, question, opens_at, closes_at, closed, archived_at,
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
         LIMIT $5",
    )
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
        let time = |us| {
            DateTime::from_timestamp_micros(us)
                .ok_or_else(|| crate::paging::bad_cursor("a time out of range"))
        };
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

/// Tallies and voter count in one pipelined round trip; no Postgres.
pub async fn results<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    poll: PollId,
) -> Result<Option<Results>, AppError> {
    let k = keys.poll(poll);
    let (closed, options, tally, voters): (Option<String>, Vec<i64>, HashMap<i64, i64>, i64) =
        redis::pipe()
            .hget(&k.meta, "closed")
            .smembers(&k.options)
            .hgetall(&k.tally)
            .hlen(&k.voters)
            .query_async(redis)
            .await?;
    // Every loaded poll has the field; its absence means Redis does not know the poll.
    let Some(closed) = closed else {
        return Ok(None);
    };
    let mut options = options;
    options.sort_unstable();
    Ok(Some(Results {
        poll_id: poll.get(),
        closed: closed == "1",
        voters,
        tallies: options
            .into_iter()
            .map(|option_id| Tally {
                option_id,
                votes: tally.get(&option_id).copied().unwrap_or(0),
            })
            .collect(),
    }))
}

/// One page of polls (see [`page`]), each with its live voter count: one query and
/// one pipelined Redis round trip, however long the page.
pub async fn page_with_voters<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    after: Option<&PollCursor>,
    limit: Limit,
    scope: ListScope,
) -> Result<Page<(PollRow, i64)>, AppError> {
    let page = page(db, after, limit, scope).await?;
    let ids = page
        .items
        .iter()
        .map(|poll| poll_id(poll.id))
        .collect::<Result<Vec<_>, _>>()?;
    let voters = voter_counts(redis, keys, &ids).await?;
    Ok(Page {
        items: page.items.into_iter().zip(voters).collect(),
        next: page.next,
    })
}

/// Voters of many polls (`HLEN` of each voters hash) in one pipelined round trip,
/// in the order of `ids`. A poll missing from Redis counts 0.
async fn voter_counts<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    ids: &[PollId],
) -> Result<Vec<i64>, redis::RedisError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for id in ids {
        pipe.hlen(keys.poll(*id).voters);
    }
    pipe.query_async(redis).await
}

/// The option `user` voted for in `poll`, if any: one `HGET`, no Postgres.
pub async fn voted_option<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    poll: PollId,
    user: UserId,
) -> Result<Option<i64>, redis::RedisError> {
    redis::cmd("HGET")
        .arg(keys.poll(poll).voters)
        .arg(user.get())
        .query_async(redis)
        .await
}

/// Closes the poll: Postgres first, then Redis when it holds the poll. In this
/// order a rebuild running meanwhile cannot undo the close: it reads the row after
/// it committed, or its restore comes before this update. Returns the record and
/// whether Redis held the poll (when not, it needs a rebuild).
pub async fn close<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    id: PollId,
    admin: UserId,
) -> Result<Option<(PollRecord, bool)>, AppError> {
    let mut tx = db.begin().await?;
    let was: Option<bool> = sqlx::query_scalar("SELECT closed FROM polls WHERE id = $1 FOR UPDATE")
        .bind(id.get())
        .fetch_optional(&mut *tx)
        .await?;
    let Some(was) = was else {
        return Ok(None);
    };
    sqlx::query("UPDATE polls SET closed = TRUE, updated_at = now() WHERE id = $1")
        .bind(id.get())
        .execute(&mut *tx)
        .await?;
    crate::audit::record(
        &mut tx,
        crate::audit::Change {
            admin,
            action: crate::audit::Action::Close,
            subject: crate::audit::Subject::Poll(id),
            before: Some(serde_json::json!({ "closed": was })),
            after: Some(serde_json::json!({ "closed": true })),
        },
    )
    .await?;
    tx.commit().await?;
    let written: i64 = UPDATE_META
        .key(&keys.poll(id).meta)
        .arg("closed")
        .arg(1)
        .invoke_async(redis)
        .await?;
    Ok(fetch_record(db, id).await?.map(|r| (r, written == 1)))
}
