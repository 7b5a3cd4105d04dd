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
) -> Result<PollRecord, AppError> {
    let mut tx = db.begin().await?;
    let poll = sqlx::query_as::<_, PollRow>(
        "INSERT INTO polls (question, opens_at, closes_at) VALUES ($1, $2, $3)
         RETURNING id, question, opens_at, closes_at, closed",
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
    let k = keys.poll(poll_id(record.poll.id)?);
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
        "SELECT id, question, opens_at, closes_at, closed FROM polls WHERE id = $1",
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

/// Most polls a list returns.
pub const LIST_LIMIT: i64 = 200;

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

pub async fn list_polls(db: &PgPool, limit: i64) -> Result<Vec<PollRow>, sqlx::Error> {
    sqlx::query_as::<_, PollRow>(
        "SELECT id, question, opens_at, closes_at, closed FROM polls
         ORDER BY opens_at DESC, id DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(db)
    .await
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

/// Polls (newest opening first), each with its live voter count: one query and one
/// pipelined Redis round trip, however many polls there are.
pub async fn list_with_voters<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    limit: i64,
) -> Result<Vec<(PollRow, i64)>, AppError> {
    let rows = list_polls(db, limit).await?;
    let ids = rows
        .iter()
        .map(|poll| poll_id(poll.id))
        .collect::<Result<Vec<_>, _>>()?;
    let voters = voter_counts(redis, keys, &ids).await?;
    Ok(rows.into_iter().zip(voters).collect())
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
) -> Result<Option<(PollRecord, bool)>, AppError> {
    let updated = sqlx::query("UPDATE polls SET closed = TRUE WHERE id = $1")
        .bind(id.get())
        .execute(db)
        .await?;
    if updated.rows_affected() == 0 {
        return Ok(None);
    }
    let written: i64 = UPDATE_META
        .key(&keys.poll(id).meta)
        .arg("closed")
        .arg(1)
        .invoke_async(redis)
        .await?;
    Ok(fetch_record(db, id).await?.map(|r| (r, written == 1)))
}
