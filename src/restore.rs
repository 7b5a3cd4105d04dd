//! What a feature gives the recovery driver ([`crate::recover`]) so that its Redis
//! state can be rebuilt from Postgres: the [`Restore`] trait, which `sale/` and
//! `vote/` implement, and the pieces every rebuild uses (the fence that stops
//! decisions while it runs, chunked reads of sets, hashes and streams). The driver
//! holds the mechanism (lock, fence check, sweep) and knows no table.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use serde::Serialize;
use sqlx::PgPool;

use crate::error::{AppError, ErrorCode};
use crate::keys::Keys;
use crate::lua::lua_script;
use crate::redis_conn::Redis;

static FENCE: LazyLock<crate::lua::Script> = lua_script!("fence.lua");
static UPDATE_META: LazyLock<crate::lua::Script> = lua_script!("update_meta.lua");

/// What the restore scripts (`lua/restore_sale.lua`, `lua/restore_poll.lua`) answer
/// in place of their numbers when the rebuild's fence token is gone (Redis wiped or
/// restarted again): start over. Their headers say so; a test reads them.
pub const TOKEN_GONE: i64 = -1;

crate::lua::reply_codes! {
    /// What `lua/update_meta.lua` answers, as its header lists them.
    pub enum MetaCode in "update_meta.lua", checked_by meta_codes_are_the_scripts {
        Written = 1, "written";
        Missing = 0, "the state is missing";
    }
}

/// Writes `fields` into a sale's or poll's meta hash `meta` when Redis holds its
/// state (`lua/update_meta.lua`): false when it does not, and then the rebuild
/// from Postgres writes them.
pub async fn update_meta(
    redis: &mut impl redis::aio::ConnectionLike,
    meta: &str,
    fields: &[(&str, i64)],
) -> Result<bool, AppError> {
    let mut call = UPDATE_META.key(meta);
    for (name, value) in fields {
        call.arg(*name).arg(*value);
    }
    let written: i64 = call.invoke_async(redis).await?;
    match MetaCode::of(written) {
        Some(code) => Ok(code == MetaCode::Written),
        None => Err(crate::lua::unexpected_reply("update_meta.lua", written)),
    }
}

/// How long [`resync_meta`] keeps trying.
const RESYNC_FOR: std::time::Duration = std::time::Duration::from_secs(1800);

/// After an admin's change committed in Postgres (a close, an opening) whose write
/// into the meta hash `meta` failed (a timeout, a dropped link): until Redis has
/// it, the scripts would still decide by the old window (a closed poll taking
/// votes, a closed sale selling). In the background, every second for at most
/// half an hour (a Redis that restarts meanwhile is rebuilt from Postgres
/// anyway), writes the fields as Postgres holds them then (`read`) until written,
/// or until Redis lacks the state (its rebuild writes them from Postgres). An
/// admin's next change landing between this read and this write would be undone
/// until a rebuild (milliseconds; no version is compared). Lost if this process
/// stops first. `what` names it in the log.
pub fn resync_meta<F, Fut>(redis: Redis, meta: String, what: String, read: F)
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Vec<(&'static str, i64)>, AppError>> + Send,
{
    tokio::spawn(async move {
        let until = std::time::Instant::now() + RESYNC_FOR;
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let attempt = async {
                let fields = read().await?;
                update_meta(&mut redis.clone(), &meta, &fields).await
            };
            match attempt.await {
                Ok(_) => {
                    tracing::info!(%what, "the window reached Redis after a failed write");
                    return;
                }
                Err(e) if std::time::Instant::now() >= until => {
                    tracing::error!(%what, error = %crate::error::error_chain(&e),
                        "the window never reached Redis: a rebuild of its state writes it");
                    return;
                }
                Err(_) => {}
            }
        }
    });
}

/// Lifetime of the fence token: a rebuild that died leaves the state fenced at most
/// this long before the token is gone and any rebuild may start over.
const TOKEN_TTL_MS: u64 = 120_000;
/// Items per Redis command when reading or writing large sets.
pub const CHUNK: usize = 1000;

/// What one rebuild found and wrote.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Rebuilt {
    /// Buyers or voters settled in Postgres.
    pub settled: usize,
    /// Accepted orders or votes still on their way (in the stream).
    pub unsettled: usize,
    /// Buyers or voters after the rebuild (the union of everything seen).
    pub total: usize,
    /// Units left after the rebuild (sales only).
    pub stock_left: Option<i64>,
}

/// How soon a rebuild is wanted: open ones first, then upcoming, then ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Urgency {
    Open,
    Upcoming,
    Ended,
}

impl Urgency {
    /// From the rank the listing queries compute (0 open, 1 upcoming, else ended).
    pub fn from_rank(rank: i32) -> Urgency {
        match rank {
            0 => Urgency::Open,
            1 => Urgency::Upcoming,
            _ => Urgency::Ended,
        }
    }
}

/// One entry of a feature's listing.
#[derive(Debug, Clone, Copy)]
pub struct Listed<I> {
    pub id: I,
    pub urgency: Urgency,
    /// When it ends (or ended): the most recently ended are rebuilt first.
    pub ends_at: DateTime<Utc>,
}

impl<I> From<(I, i32, DateTime<Utc>)> for Listed<I> {
    /// A row of a listing query: id, urgency rank (see [`Urgency::from_rank`]), end.
    fn from((id, rank, ends_at): (I, i32, DateTime<Utc>)) -> Self {
        Listed {
            id,
            urgency: Urgency::from_rank(rank),
            ends_at,
        }
    }
}

/// The stores a rebuild works on.
#[derive(Clone, Copy)]
pub struct Stores<'a> {
    pub db: &'a PgPool,
    pub redis: &'a Redis,
    pub keys: &'a Keys,
}

/// A feature whose Redis state the driver can check and rebuild.
pub trait Restore: Send + Sync {
    type Id: Copy + Eq + std::hash::Hash + std::fmt::Display + Send + Sync + 'static;

    /// The keys the sweep checks (`Recovery::check_many`): the meta hash (with the run stamp) and
    /// a key the state cannot be without.
    fn state_keys(&self, keys: &Keys, id: Self::Id) -> (String, String);

    /// Every one, or those that ended within the last `days`.
    fn list<'a>(
        &'a self,
        db: &'a PgPool,
        days: Option<i32>,
    ) -> BoxFuture<'a, Result<Vec<Listed<Self::Id>>, AppError>>;

    /// Rebuilds one (the driver holds its lock): fence, read what Redis still has,
    /// then what Postgres has, restore. `Ok(None)` when Postgres has no such one.
    fn rebuild<'a>(
        &'a self,
        stores: Stores<'a>,
        id: Self::Id,
    ) -> BoxFuture<'a, Result<Option<Rebuilt>, AppError>>;

    /// Finishes work an instance that died left half done (a sale's stock changes
    /// committed in Postgres and not yet applied in Redis); returns the ones whose
    /// state must be rebuilt before it can be finished.
    fn finish_pending<'a>(
        &'a self,
        _stores: Stores<'a>,
    ) -> BoxFuture<'a, Result<Vec<Self::Id>, AppError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// Stops decisions on a sale or poll (`lua/fence.lua`) and returns the token its
/// restore script must find, or start over.
pub async fn fence(redis: &mut Redis, meta: &str, rebuild: &str) -> Result<String, AppError> {
    let token = crate::random::token_hex(16);
    let _: i64 = FENCE
        .key(meta)
        .key(rebuild)
        .arg(&token)
        .arg(TOKEN_TTL_MS)
        .invoke_async(redis)
        .await?;
    Ok(token)
}

/// A rebuild cut short because Redis lost its state again meanwhile: not a bug, an
/// outage; the next rebuild starts over.
pub fn interrupted() -> AppError {
    AppError::new(
        ErrorCode::Recovering,
        "Redis lost its data again while it was being restored; try again in a moment",
    )
}

/// Calls `f` on every entry of the stream, oldest first, `CHUNK` per read.
pub async fn each_entry(
    redis: &mut Redis,
    stream: &str,
    mut f: impl FnMut(&redis::streams::StreamId),
) -> Result<(), AppError> {
    let mut start = "-".to_string();
    loop {
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(stream)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(CHUNK)
            .query_async(redis)
            .await?;
        let n = reply.ids.len();
        reply.ids.iter().for_each(&mut f);
        match reply.ids.last() {
            Some(last) if n == CHUNK => start = format!("({}", last.id),
            _ => return Ok(()),
        }
    }
}

/// Every item of a set (`SSCAN`) or every field-value pair of a hash (`HSCAN`, with
/// `T` a pair), read in chunks so that a large sale never blocks Redis.
pub async fn scan_all<T: redis::FromRedisValue>(
    redis: &mut Redis,
    command: &str,
    key: &str,
) -> Result<Vec<T>, AppError> {
    let mut out = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, items): (u64, Vec<T>) = redis::cmd(command)
            .arg(key)
            .arg(cursor)
            .arg("COUNT")
            .arg(CHUNK)
            .query_async(redis)
            .await?;
        out.extend(items);
        if next == 0 {
            return Ok(out);
        }
        cursor = next;
    }
}

#[cfg(test)]
mod token_tests {
    use super::*;

    #[test]
    fn the_restore_scripts_say_what_token_gone_is() {
        for script in [
            include_str!("../lua/restore_sale.lua"),
            include_str!("../lua/restore_poll.lua"),
        ] {
            let says = format!("{TOKEN_GONE}");
            assert!(
                script.lines().any(|l| l.starts_with("-- Returns")
                    && l.contains(&says)
                    && l.contains("token is gone")),
                "a restore script's header names {TOKEN_GONE} as the token gone"
            );
        }
    }
}
