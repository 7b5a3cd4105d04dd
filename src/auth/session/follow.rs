//! Following the stream of announcements: what other processes ended, applied as
//! soon as it is written; a reload from Postgres when the stream lost some.

use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;

use super::{Entry, Event, Sessions, newest};
use crate::error::AppError;
use crate::redis_conn::{Redis, Target, Timeouts};

/// Announcements read per round trip when catching up.
const READ_BATCH: usize = 1_000;
/// How long the follower's blocking read waits for an announcement before it reads
/// the stream again anyway (and forgets expired sign-outs).
const WAIT_AT_MOST: Duration = Duration::from_secs(15);

impl Sessions {
    /// Follows the stream until shutdown: applies what others ended, reloads from
    /// Postgres when the stream lost what this process has not read, and forgets
    /// signed-out sessions whose tokens have expired. Between reads it waits on a
    /// blocking `XREAD` of its own connection (to `target`) for the next
    /// announcement, at most [`WAIT_AT_MOST`]: an idle server asks Redis nothing in
    /// between, and an announcement is applied as soon as it is written. Where
    /// that connection cannot be had or fails, it reads every `every` instead.
    /// `resume`: what [`Sessions::load`] returned.
    pub async fn follow(
        self,
        resume: Option<String>,
        mut redis: Redis,
        target: Target,
        db: PgPool,
        every: Duration,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let key = self.keys.sessions_ended();
        let mut follower = Follower {
            sessions: self,
            last: resume,
        };
        let mut waiter: Option<Redis> = None;
        while !*shutdown.borrow() {
            let read = follower.catch_up(&mut redis, &db).await;
            if let Err(e) = &read {
                tracing::warn!(error = %crate::error::error_chain(e), "reading the ended-sessions stream failed; retrying");
            }
            let wait = async {
                let last = follower.last.clone().filter(|_| read.is_ok());
                let waited = match last {
                    Some(last) => wait_for_announcement(&mut waiter, &target, &key, &last).await,
                    None => false,
                };
                if !waited {
                    tokio::time::sleep(every).await;
                }
            };
            tokio::select! {
                _ = wait => {}
                _ = shutdown.changed() => break,
            }
        }
    }
}

/// Waits on the stream, after `last`, for the next announcement: at most
/// [`WAIT_AT_MOST`], on a blocking connection of its own (`waiter`, opened here
/// when there is none). False when it could not wait that way (no connection, or
/// the read failed: the connection is dropped), and the caller polls instead.
async fn wait_for_announcement(
    waiter: &mut Option<Redis>,
    target: &Target,
    key: &str,
    last: &str,
) -> bool {
    if waiter.is_none() {
        *waiter = Redis::connect(
            target,
            Timeouts {
                connect: Duration::from_secs(2),
                response: None,
                resend: false,
            },
        )
        .await
        .inspect_err(|e| tracing::debug!(error = %e, "no blocking connection for the ended-sessions stream; polling"))
        .ok();
    }
    let Some(conn) = waiter.as_mut() else {
        return false;
    };
    // The connection has no response timeout (the read blocks): a Redis that
    // vanished without closing it must not hold the follower.
    let next = tokio::time::timeout(
        WAIT_AT_MOST + Duration::from_secs(2),
        redis::cmd("XREAD")
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(WAIT_AT_MOST.as_millis() as u64)
            .arg("STREAMS")
            .arg(key)
            .arg(last)
            .query_async::<redis::Value>(conn),
    )
    .await;
    if matches!(next, Ok(Ok(_))) {
        return true;
    }
    tracing::debug!(answer = ?next, "waiting on the ended-sessions stream failed; polling");
    *waiter = None;
    false
}

struct Follower {
    sessions: Sessions,
    /// The newest entry applied; `None` until the stream has been located.
    last: Option<String>,
}

impl Follower {
    async fn catch_up(&mut self, redis: &mut Redis, db: &PgPool) -> Result<(), AppError> {
        let key = self.sessions.keys.sessions_ended();
        let Some(mut from) = self.last.clone() else {
            // The stream could not be located at startup: everything up to its
            // newest entry comes from Postgres again.
            self.resync(redis, db, &key).await?;
            return Ok(());
        };
        // From `from` itself: if it is gone, the stream lost entries this process
        // has not seen (a wipe, an older copy of Redis, trimming).
        let mut entries = read(redis, &key, &from).await?;
        if from != "0-0" && entries.first().is_none_or(|(id, _)| *id != from) {
            tracing::warn!(
                "the ended-sessions stream lost entries this process had not read; reloading from Postgres"
            );
            self.resync(redis, db, &key).await?;
            return Ok(());
        }
        loop {
            let fresh: Vec<Event> = entries
                .iter()
                .filter(|(id, _)| *id != from)
                .filter_map(|(_, fields)| Event::parse(fields))
                .collect();
            if !fresh.is_empty() {
                tracing::debug!(count = fresh.len(), "sessions ended on other instances");
                let mut ended = self
                    .sessions
                    .ended
                    .write()
                    .unwrap_or_else(|e| e.into_inner());
                for event in &fresh {
                    ended.apply(event);
                }
            }
            let Some((newest_id, _)) = entries.last() else {
                break;
            };
            let full = entries.len() >= READ_BATCH;
            from = newest_id.clone();
            self.last = Some(from.clone());
            if !full {
                break;
            }
            entries = read(redis, &key, &from).await?;
        }
        self.forget_expired();
        Ok(())
    }

    /// Postgres's record, and the stream followed from its newest entry (taken
    /// before the read, so nothing announced meanwhile is missed; applying an
    /// announcement twice changes nothing).
    async fn resync(&mut self, redis: &mut Redis, db: &PgPool, key: &str) -> Result<(), AppError> {
        let resume = newest(redis, key).await?;
        self.sessions.reload(db).await?;
        self.last = Some(resume);
        Ok(())
    }

    fn forget_expired(&self) {
        let now = chrono::Utc::now().timestamp();
        let mut ended = self
            .sessions
            .ended
            .write()
            .unwrap_or_else(|e| e.into_inner());
        ended.signed_out.retain(|_, expires_at| *expires_at > now);
    }
}

/// Entries from `from` (inclusive), at most [`READ_BATCH`].
async fn read(redis: &mut Redis, key: &str, from: &str) -> Result<Vec<Entry>, AppError> {
    let entries: Vec<Entry> = redis::cmd("XRANGE")
        .arg(key)
        .arg(from)
        .arg("+")
        .arg("COUNT")
        .arg(READ_BATCH)
        .query_async(redis)
        .await?;
    Ok(entries)
}
