//! Sessions that end. A token names its session (a random id) and the account's
//! session generation at sign-in. A session stands while the token's generation is
//! at least the account's and the session was not signed out.
//!
//! Postgres holds the record (`users.session_gen`, `signed_out_sessions`), written
//! first. Every process keeps, in memory, what has ended: each account's generation
//! (only accounts that ended all their sessions) and the signed-out sessions whose
//! tokens have not expired yet. So the check on every request (the buy path
//! included) is a lookup in this process's memory: no Redis, no Postgres.
//!
//! Ending a session is rare; it is announced on a Redis stream,
//! `ns:sessions:ended` ([`crate::keys::Keys::sessions_ended`]), that every process
//! waits on with a blocking `XREAD` of its own connection: a signed-out token stops
//! working on another instance as soon as that instance reads the announcement (a
//! round trip), on the instance that signed it out at once. Where the blocking
//! connection fails, a process reads the stream every `session_sync_ms` (250 ms by
//! default) instead. A process loads the record from Postgres at startup,
//! and again whenever the stream cannot tell it everything since it last read
//! (Redis wiped or restored from an older copy, or the stream trimmed past it).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::redis_conn::Redis;
use sqlx::PgPool;

mod follow;

use super::token::Claims;
use crate::domain::UserId;
use crate::error::AppError;
use crate::keys::Keys;

/// The stream keeps about this many announcements; a process that falls further
/// behind reloads from Postgres.
const STREAM_MAX: usize = 100_000;

/// Whether a token's session still stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Standing {
    Valid,
    SignedOut,
    /// Every session of the account was ended (or its password changed) after sign-in.
    Superseded,
}

#[derive(Default)]
struct Ended {
    /// Accounts whose sessions were all ended: the generation a token needs.
    generations: HashMap<i64, i64>,
    /// Signed-out sessions, with their token's expiry (unix seconds).
    signed_out: HashMap<(i64, u64), i64>,
}

impl Ended {
    fn apply(&mut self, event: &Event) {
        match *event {
            Event::Generation { user, generation } => {
                let known = self.generations.entry(user).or_insert(generation);
                *known = (*known).max(generation);
            }
            Event::SignedOut {
                user,
                session,
                expires_at,
            } => {
                self.signed_out.insert((user, session), expires_at);
            }
        }
    }
}

/// One announcement on the stream.
#[derive(Debug, PartialEq)]
enum Event {
    Generation {
        user: i64,
        generation: i64,
    },
    SignedOut {
        user: i64,
        session: u64,
        expires_at: i64,
    },
}

impl Event {
    fn fields(&self) -> Vec<(&'static str, String)> {
        match *self {
            Event::Generation { user, generation } => {
                vec![("user", user.to_string()), ("gen", generation.to_string())]
            }
            Event::SignedOut {
                user,
                session,
                expires_at,
            } => vec![
                ("user", user.to_string()),
                ("session", format!("{session:016x}")),
                ("expires", expires_at.to_string()),
            ],
        }
    }

    /// An entry of the stream; `None` for one this version does not know (skipped).
    fn parse(fields: &HashMap<String, String>) -> Option<Event> {
        let user = fields.get("user")?.parse().ok()?;
        if let Some(generation) = fields.get("gen") {
            return Some(Event::Generation {
                user,
                generation: generation.parse().ok()?,
            });
        }
        Some(Event::SignedOut {
            user,
            session: u64::from_str_radix(fields.get("session")?, 16).ok()?,
            expires_at: fields.get("expires")?.parse().ok()?,
        })
    }
}

/// What has ended, in this process's memory, and how to announce an end.
#[derive(Clone)]
pub struct Sessions {
    keys: Keys,
    ended: Arc<RwLock<Ended>>,
}

impl Sessions {
    /// Loads what has ended from Postgres (before the server serves anything), and
    /// where [`Sessions::follow`] resumes the stream: its newest entry, taken before
    /// the read, or `None` when Redis could not say (then the follower loads again).
    pub async fn load(
        keys: Keys,
        db: &PgPool,
        redis: &mut Redis,
    ) -> Result<(Self, Option<String>), AppError> {
        let sessions = Sessions {
            ended: Arc::new(RwLock::new(Ended::default())),
            keys,
        };
        let resume = newest(redis, &sessions.keys.sessions_ended()).await.ok();
        sessions.reload(db).await?;
        Ok((sessions, resume))
    }

    /// Whether the session of `claims` stands: memory only.
    pub fn standing(&self, claims: &Claims) -> Standing {
        let ended = self.ended.read().unwrap_or_else(|e| e.into_inner());
        let user = claims.user_id.get();
        if ended.signed_out.contains_key(&(user, claims.session)) {
            Standing::SignedOut
        } else if ended
            .generations
            .get(&user)
            .is_some_and(|g| claims.generation < *g)
        {
            Standing::Superseded
        } else {
            Standing::Valid
        }
    }

    /// Signs out one session: recorded in Postgres, announced, and ended here.
    pub async fn sign_out(
        &self,
        redis: &mut Redis,
        db: &PgPool,
        claims: &Claims,
    ) -> Result<(), AppError> {
        let expires_at = chrono::DateTime::from_timestamp(claims.expires_at, 0)
            .ok_or_else(|| AppError::Internal(anyhow::anyhow!("token expiry out of range")))?;
        sqlx::query(
            "INSERT INTO signed_out_sessions (user_id, session, expires_at) VALUES ($1, $2, $3)
             ON CONFLICT DO NOTHING",
        )
        .bind(claims.user_id.get())
        .bind(format!("{:016x}", claims.session))
        .bind(expires_at)
        .execute(db)
        .await?;
        self.announce(
            redis,
            Event::SignedOut {
                user: claims.user_id.get(),
                session: claims.session,
                expires_at: claims.expires_at,
            },
        )
        .await
    }

    /// Ends every session of the account whose generation Postgres raised to
    /// `generation` (the caller did, in its transaction): announced, and ended here.
    pub async fn end_all(
        &self,
        redis: &mut Redis,
        user: UserId,
        generation: i64,
    ) -> Result<(), AppError> {
        self.announce(
            redis,
            Event::Generation {
                user: user.get(),
                generation,
            },
        )
        .await
    }

    /// Ends here at once, then tells the others. When Redis cannot take the
    /// announcement the caller gets the error (a 503 to retry: Postgres has the
    /// record, and a retry is harmless), and this process has ended it already.
    async fn announce(&self, redis: &mut Redis, event: Event) -> Result<(), AppError> {
        self.ended
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .apply(&event);
        publish(redis, &self.keys, &event).await
    }

    /// Adds Postgres's record to what this process knows. Never replaces: nothing
    /// that ended comes back (a generation only goes up, a signed-out session
    /// stays so until its token expires), so an announcement applied here while
    /// the record was being read is kept.
    async fn reload(&self, db: &PgPool) -> Result<(), AppError> {
        let generations: Vec<(i64, i64)> =
            sqlx::query_as("SELECT id, session_gen FROM users WHERE session_gen > 0")
                .fetch_all(db)
                .await?;
        // Accounts removed while their tokens may live (migrations/0032): every
        // session ended, whatever its generation.
        let removed: Vec<i64> =
            sqlx::query_scalar("SELECT user_id FROM ended_accounts WHERE until > now()")
                .fetch_all(db)
                .await?;
        let signed_out: Vec<(i64, String, i64)> = sqlx::query_as(
            "SELECT user_id, session, extract(epoch FROM expires_at)::bigint
             FROM signed_out_sessions WHERE expires_at > now()",
        )
        .fetch_all(db)
        .await?;
        let mut ended = self.ended.write().unwrap_or_else(|e| e.into_inner());
        for &(user, generation) in &generations {
            ended.apply(&Event::Generation { user, generation });
        }
        for &user in &removed {
            ended.apply(&Event::Generation {
                user,
                generation: i64::MAX,
            });
        }
        for (user, session, expires_at) in signed_out {
            if let Ok(session) = u64::from_str_radix(&session, 16) {
                ended.apply(&Event::SignedOut {
                    user,
                    session,
                    expires_at,
                });
            }
        }
        tracing::debug!(
            generations = ended.generations.len(),
            signed_out = ended.signed_out.len(),
            "ended sessions loaded from Postgres"
        );
        Ok(())
    }
}

/// Tells every serving process that every session of `user` before `generation`
/// ended, from outside them (`stampede revoke-admin`, which raised the generation in
/// Postgres first): each applies it as it reads the stream.
pub async fn announce_end_all(
    redis: &mut Redis,
    keys: &Keys,
    user: UserId,
    generation: i64,
) -> Result<(), AppError> {
    let event = Event::Generation {
        user: user.get(),
        generation,
    };
    publish(redis, keys, &event).await
}

/// Appends one announcement to the stream.
async fn publish(redis: &mut Redis, keys: &Keys, event: &Event) -> Result<(), AppError> {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(keys.sessions_ended())
        .arg("MAXLEN")
        .arg("~")
        .arg(STREAM_MAX)
        .arg("*");
    for (field, value) in event.fields() {
        cmd.arg(field).arg(value);
    }
    let _: String = cmd.query_async(redis).await?;
    Ok(())
}

type Entry = (String, HashMap<String, String>);

/// The id of the stream's newest entry, `0-0` when it has none.
async fn newest(redis: &mut Redis, key: &str) -> Result<String, AppError> {
    let entries: Vec<Entry> = redis::cmd("XREVRANGE")
        .arg(key)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(redis)
        .await?;
    Ok(entries
        .into_iter()
        .next()
        .map_or_else(|| "0-0".to_string(), |(id, _)| id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_round_trip_and_unknown_ones_are_skipped() {
        for event in [
            Event::Generation {
                user: 7,
                generation: 3,
            },
            Event::SignedOut {
                user: 7,
                session: 0xdead_beef_0000_0001,
                expires_at: 1_800_000_000,
            },
        ] {
            let fields: HashMap<String, String> = event
                .fields()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            assert_eq!(Event::parse(&fields), Some(event));
        }
        let unknown: HashMap<String, String> = [("kind".to_string(), "x".to_string())].into();
        assert_eq!(Event::parse(&unknown), None);
    }

    #[test]
    fn a_generation_never_goes_down() {
        let mut ended = Ended::default();
        for generation in [3, 1, 2] {
            ended.apply(&Event::Generation {
                user: 1,
                generation,
            });
        }
        assert_eq!(ended.generations[&1], 3);
    }
}
