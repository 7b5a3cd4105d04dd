//! Sessions that end. A token names its session (a random id) and the account's
//! session generation at sign-in. A session stands while the token's generation is
//! at least the account's and the session was not signed out.
//!
//! Redis holds each account's state in one hash, `{user:<id>}:session`: `gen` and
//! `out:<session id>` (see [`crate::keys::Keys::session`]). Postgres holds the record
//! (`users.session_gen`, `signed_out_sessions`), written first, so a Redis that lost
//! the hash gets it back from there ([`Sessions::restore`]): the only Postgres read
//! on this path, once per account after such a loss. Sign-in writes the hash, so in
//! normal running the check is Redis only.
//!
//! Each process keeps what it read for `session_cache_ms` (1 s by default): a
//! signed-out token keeps working on another instance for at most that long, and a
//! buyer's first request in that window costs one `HMGET`, the rest nothing.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use sqlx::PgPool;

use super::token::Claims;
use crate::domain::UserId;
use crate::error::AppError;
use crate::keys::Keys;
use crate::lua::lua_script;

static SESSION_GEN: std::sync::LazyLock<redis::Script> = lua_script!("session_gen.lua");

/// Above this many cached sessions, entries past their time are dropped.
const CACHE_SOFT_MAX: usize = 100_000;

#[derive(Clone, Copy)]
struct Known {
    generation: i64,
    signed_out: bool,
    at: Instant,
}

pub struct Sessions {
    keys: Keys,
    ttl: Duration,
    /// Seconds a token lives: how long Redis must keep an account's hash.
    token_ttl_secs: u64,
    cache: Mutex<HashMap<(i64, u64), Known>>,
}

/// Whether a token's session still stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Standing {
    Valid,
    SignedOut,
    /// Every session of the account was ended (or its password changed) after sign-in.
    Superseded,
}

/// Writes generation 0 for accounts that have never signed in, in one pipeline, as
/// sign-in would: for tools and tests that mint tokens without signing in, so their
/// first request does not need Postgres to learn the account's generation.
pub async fn register_new_accounts(
    redis: &mut ConnectionManager,
    keys: &Keys,
    users: &[UserId],
    token_ttl_secs: u64,
) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    for user in users {
        let key = keys.session(*user);
        pipe.hset_nx(&key, "gen", 0).ignore();
        pipe.expire(&key, token_ttl_secs as i64).ignore();
    }
    pipe.query_async(redis).await
}

impl Sessions {
    pub fn new(keys: Keys, cache_ttl: Duration, token_ttl_secs: u64) -> Self {
        Sessions {
            keys,
            ttl: cache_ttl,
            token_ttl_secs,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The session of `claims`, from this process's memory when fresh, else from
    /// Redis (one `HMGET`), else, when Redis lost the account's hash, from Postgres.
    pub async fn standing(
        &self,
        redis: &mut ConnectionManager,
        db: &PgPool,
        claims: &Claims,
    ) -> Result<Standing, AppError> {
        let id = (claims.user_id.get(), claims.session);
        let cached = self.cache.lock().expect("session cache").get(&id).copied();
        let known = match cached {
            Some(k) if k.at.elapsed() < self.ttl => k,
            _ => {
                let k = match self.read(redis, claims).await? {
                    Some(k) => k,
                    None => {
                        self.restore(redis, db, claims.user_id).await?;
                        self.read(redis, claims).await?.ok_or_else(|| {
                            AppError::Internal(anyhow::anyhow!("session state vanished"))
                        })?
                    }
                };
                self.remember(id, k);
                k
            }
        };
        Ok(if known.signed_out {
            Standing::SignedOut
        } else if claims.generation < known.generation {
            Standing::Superseded
        } else {
            Standing::Valid
        })
    }

    async fn read(
        &self,
        redis: &mut ConnectionManager,
        claims: &Claims,
    ) -> Result<Option<Known>, AppError> {
        let (generation, out): (Option<i64>, Option<String>) = redis::cmd("HMGET")
            .arg(self.keys.session(claims.user_id))
            .arg("gen")
            .arg(format!("out:{:016x}", claims.session))
            .query_async(redis)
            .await?;
        Ok(generation.map(|generation| Known {
            generation,
            signed_out: out.is_some(),
            at: Instant::now(),
        }))
    }

    fn remember(&self, id: (i64, u64), known: Known) {
        if self.ttl.is_zero() {
            return;
        }
        let mut cache = self.cache.lock().expect("session cache");
        if cache.len() >= CACHE_SOFT_MAX {
            let ttl = self.ttl;
            cache.retain(|_, k| k.at.elapsed() < ttl);
            if cache.len() >= CACHE_SOFT_MAX {
                cache.clear();
            }
        }
        cache.insert(id, known);
    }

    fn forget_account(&self, user: UserId) {
        self.cache
            .lock()
            .expect("session cache")
            .retain(|(u, _), _| *u != user.get());
    }

    /// Redis lost the account's hash (a wipe, an old AOF): rebuild it from Postgres.
    async fn restore(
        &self,
        redis: &mut ConnectionManager,
        db: &PgPool,
        user: UserId,
    ) -> Result<(), AppError> {
        let generation: Option<i64> =
            sqlx::query_scalar("SELECT session_gen FROM users WHERE id = $1")
                .bind(user.get())
                .fetch_optional(db)
                .await?;
        // A deleted account: no session of it stands.
        let generation = generation.unwrap_or(i64::MAX);
        let out: Vec<String> = sqlx::query_scalar(
            "SELECT session FROM signed_out_sessions WHERE user_id = $1 AND expires_at > now()",
        )
        .bind(user.get())
        .fetch_all(db)
        .await?;
        tracing::info!(
            user_id = user.get(),
            signed_out = out.len(),
            "session state restored from Postgres"
        );
        self.write(redis, user, generation, None).await?;
        for session in out {
            self.write(redis, user, generation, Some(&session)).await?;
        }
        Ok(())
    }

    async fn write(
        &self,
        redis: &mut ConnectionManager,
        user: UserId,
        generation: i64,
        signed_out: Option<&str>,
    ) -> Result<i64, AppError> {
        Ok(SESSION_GEN
            .key(self.keys.session(user))
            .arg(generation)
            .arg(self.token_ttl_secs)
            .arg(signed_out.unwrap_or(""))
            .invoke_async(redis)
            .await?)
    }

    /// At sign-in: the account's generation from Postgres reaches Redis (never
    /// lowering it), and the hash lives at least as long as the new token.
    pub async fn signed_in(
        &self,
        redis: &mut ConnectionManager,
        user: UserId,
        generation: i64,
    ) -> Result<(), AppError> {
        self.write(redis, user, generation, None).await?;
        Ok(())
    }

    /// Signs out one session: recorded in Postgres, then Redis, then this process.
    pub async fn sign_out(
        &self,
        redis: &mut ConnectionManager,
        db: &PgPool,
        claims: &Claims,
    ) -> Result<(), AppError> {
        let session = format!("{:016x}", claims.session);
        let expires_at = chrono::DateTime::from_timestamp(claims.expires_at, 0)
            .ok_or_else(|| AppError::Internal(anyhow::anyhow!("token expiry out of range")))?;
        sqlx::query(
            "INSERT INTO signed_out_sessions (user_id, session, expires_at) VALUES ($1, $2, $3)
             ON CONFLICT DO NOTHING",
        )
        .bind(claims.user_id.get())
        .bind(&session)
        .bind(expires_at)
        .execute(db)
        .await?;
        // Generation 0 never raises anything: this only marks the session.
        self.write(redis, claims.user_id, 0, Some(&session)).await?;
        self.forget_account(claims.user_id);
        Ok(())
    }

    /// Ends every session of the account: `users.session_gen` goes up in Postgres
    /// (inside the caller's transaction, if any, via `generation`), then Redis.
    pub async fn end_all(
        &self,
        redis: &mut ConnectionManager,
        user: UserId,
        generation: i64,
    ) -> Result<(), AppError> {
        self.write(redis, user, generation, None).await?;
        self.forget_account(user);
        Ok(())
    }
}
