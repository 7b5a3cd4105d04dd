//! Rebuilding a poll's Redis state from Postgres (the [`Restore`] of polls, driven
//! by [`crate::recover`]): voters from the voters hash Redis still has, the
//! unsettled entries of the stream and the `votes` table (later sources win);
//! tallies counted from that union.

use std::collections::HashMap;
use std::sync::LazyLock;

use futures_util::future::BoxFuture;
use sqlx::PgPool;

use crate::domain::PollId;
use crate::error::AppError;
use crate::keys::Keys;
use crate::lua::lua_script;
use crate::restore::{
    CHUNK, Listed, Rebuilt, Restore, Stores, fence, interrupted, scan_all, stream_field,
};
use crate::settle::ensure_group;

static RESTORE_POLL: LazyLock<crate::lua::Script> = lua_script!("restore_poll.lua");

/// The polls, as the recovery driver sees them.
pub struct Polls;

impl Restore for Polls {
    type Id = PollId;

    fn state_keys(&self, keys: &Keys, id: PollId) -> (String, String) {
        let k = keys.poll(id);
        (k.meta, k.options)
    }

    fn list<'a>(
        &'a self,
        db: &'a PgPool,
        days: Option<i32>,
    ) -> BoxFuture<'a, Result<Vec<Listed<PollId>>, AppError>> {
        Box::pin(async move {
            let rows: Vec<(PollId, i32, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
                "SELECT id, CASE WHEN closed OR closes_at <= now() THEN 2
                         WHEN opens_at > now() THEN 1 ELSE 0 END, closes_at
         FROM polls
         WHERE $1::int IS NULL OR closes_at > now() - make_interval(days => $1)",
            )
            .bind(days)
            .fetch_all(db)
            .await?;
            Ok(rows.into_iter().map(Listed::from).collect())
        })
    }

    fn rebuild<'a>(
        &'a self,
        stores: Stores<'a>,
        id: PollId,
    ) -> BoxFuture<'a, Result<Option<Rebuilt>, AppError>> {
        Box::pin(rebuild_poll(stores, id))
    }
}

async fn rebuild_poll(stores: Stores<'_>, id: PollId) -> Result<Option<Rebuilt>, AppError> {
    let mut redis = stores.redis.clone();
    let k = stores.keys.poll(id);
    let mut tx = stores.db.begin().await?;
    let Some((opens_at, closes_at, closed)) =
        sqlx::query_as::<
            _,
            (
                chrono::DateTime<chrono::Utc>,
                chrono::DateTime<chrono::Utc>,
                bool,
            ),
        >("SELECT opens_at, closes_at, closed FROM polls WHERE id = $1 FOR UPDATE")
        .bind(id.get())
        .fetch_optional(&mut *tx)
        .await?
    else {
        return Ok(None);
    };
    let options: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM poll_options WHERE poll_id = $1 ORDER BY position")
            .bind(id.get())
            .fetch_all(&mut *tx)
            .await?;
    let token = fence(&mut redis, &k.meta, &k.rebuild).await?;

    // Later sources win: what Redis knew, then the stream, then the record.
    let mut voters: HashMap<i64, i64> = scan_all(&mut redis, "HSCAN", &k.voters)
        .await?
        .into_iter()
        .collect();
    let unsettled = stream_field(&mut redis, &k.votes, "option_id").await?;
    voters.extend(unsettled.iter().copied());
    let settled: Vec<(i64, i64)> =
        sqlx::query_as("SELECT user_id, option_id FROM votes WHERE poll_id = $1")
            .bind(id.get())
            .fetch_all(&mut *tx)
            .await?;
    voters.extend(settled.iter().copied());
    let pairs: Vec<(i64, i64)> = voters.iter().map(|(u, o)| (*u, *o)).collect();
    for chunk in pairs.chunks(CHUNK) {
        let _: i64 = redis::cmd("HSET")
            .arg(&k.voters)
            .arg(chunk)
            .query_async(&mut redis)
            .await?;
    }
    let mut counts: HashMap<i64, i64> = HashMap::new();
    for option in voters.values() {
        *counts.entry(*option).or_default() += 1;
    }
    let mut restore = RESTORE_POLL.prepare_invoke();
    restore
        .key(&k.meta)
        .key(&k.options)
        .key(&k.tally)
        .key(&k.rebuild)
        .arg(&token)
        .arg(opens_at.timestamp_millis())
        .arg(closes_at.timestamp_millis())
        .arg(u8::from(closed))
        .arg(options.len());
    for option in &options {
        restore.arg(option);
    }
    for option in &options {
        restore.arg(counts.get(option).copied().unwrap_or(0));
    }
    let written: i64 = restore.invoke_async(&mut redis).await?;
    if written == crate::restore::TOKEN_GONE {
        tracing::warn!(poll = %id, "Redis lost the rebuild token (wiped or restarted again)");
        return Err(interrupted());
    }
    ensure_group(&mut redis, &k.votes).await?;
    tx.commit().await?;
    Ok(Some(Rebuilt {
        settled: settled.len(),
        unsettled: unsettled.len(),
        total: voters.len(),
        stock_left: None,
    }))
}
