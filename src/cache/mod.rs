//! Views cached in Redis, rebuilt from Postgres by one caller at a time.
//!
//! [`Cache::get_or_rebuild`] reads a JSON value from Redis. On a miss:
//! 1. **Inside this process**, the first caller for a key leads a *flight*; every other
//!    caller for that key waits for the leader's result instead of doing the same work.
//! 2. **Across instances**, the leader takes the key's rebuild lock (`<key>:lock`, see
//!    [`crate::lock`]). The holder re-reads the key (someone may have just stored it),
//!    runs the loader (the one Postgres query), and stores the result with a jittered
//!    TTL. Leaders that do not get the lock poll the key for up to
//!    [`WAIT_FOR_REBUILD`]; a holder that is slower than that does not fail them:
//!    they run the loader themselves and serve that request without storing it.
//!
//! So a cold page read by 1,000 callers on any number of instances costs one query.
//!
//! Cache only what Postgres says. Live numbers (stock, tallies) come from Redis on
//! every read and are merged after the cached part; see `sale::cached`.
//!
//! # Using it for another view (the poll page, say)
//! ```ignore
//! let key = state.keys.cache(&format!("poll:{id}"), "view"); // same tag as the poll's live keys
//! let poll: Option<PollRow> =
//!     state.cache.get_or_rebuild(&key, Duration::from_secs(30), || async {
//!         Ok(fetch_poll(&state.db, id).await?) // the only Postgres read
//!     })
//!     .await?;
//! // then read the live tallies from Redis and merge them into the page
//! ```
//! and call [`Cache::invalidate`] with that key after every admin change to the poll.
//! `None` results are cached too (an unknown id costs one query per TTL, not one per
//! request), which is why creating a record must invalidate its view as well.

use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use rand::Rng;
use redis::aio::ConnectionLike;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::AppError;
use crate::lock::{Lock, LockGuard, Released};
use crate::redis_conn::Redis;

mod flight;

pub use flight::CacheStats;
use flight::{Flights, Join, SharedError};

static FILL: LazyLock<crate::lua::Script> =
    LazyLock::new(|| crate::lua::Script::new(include_str!("../../lua/cache_fill.lua")));

crate::lua::reply_codes! {
    /// What `lua/cache_fill.lua` answers, as its header lists them.
    pub enum FillCode in "cache_fill.lua", checked_by fill_codes_are_the_scripts {
        Stored = 1, "stored";
        LockLost = 0, "the lock was lost";
    }
}

/// Each stored view lives `ttl` ± this fraction, so views cached together (a restart,
/// a flush) do not all expire in the same second and stampede together.
pub const TTL_JITTER: f64 = 0.2;
/// Lease of a rebuild lock. A rebuild is one query; this only matters when the
/// holder died, and then it is how long others fall back to loading on their own.
pub const REBUILD_LOCK_TTL_MS: u64 = 5_000;
/// How long a caller waits for another instance's rebuild before loading itself.
pub const WAIT_FOR_REBUILD: Duration = Duration::from_secs(2);
/// Pause between polls while waiting: short next to a query, random so that the
/// waiting instances do not poll in step.
const POLL_MS: std::ops::RangeInclusive<u64> = 10..=20;

/// The cache: views in Redis (`redis`), and this process's rebuilds in flight
/// and counters (`local`). `state.cache.get_or_rebuild(..)`, `state.cache.invalidate(..)`.
pub struct Cache {
    redis: Redis,
    local: Flights,
}

/// How long a cached record lives. Records change only through admin actions, which
/// invalidate; the TTL bounds how long a change made behind the app's back (SQL by
/// hand) stays invisible. Sales and polls share it.
pub const RECORD_TTL: Duration = Duration::from_secs(30);

/// What a read through the cache needs besides the cache itself: the Postgres pool
/// a record is rebuilt from, a Redis connection for the live numbers beside it, and
/// the key names. The application state implements it (`state.rs`), so the
/// capabilities' cached reads (`sale::cached`, `vote::cached`) take the state
/// without importing it.
pub trait CachedReads {
    fn cache(&self) -> &Cache;
    fn db(&self) -> &sqlx::PgPool;
    fn redis(&self) -> &Redis;
    fn keys(&self) -> &crate::keys::Keys;
}

impl<T: CachedReads + ?Sized> CachedReads for actix_web::web::Data<T> {
    fn cache(&self) -> &Cache {
        (**self).cache()
    }
    fn db(&self) -> &sqlx::PgPool {
        (**self).db()
    }
    fn redis(&self) -> &Redis {
        (**self).redis()
    }
    fn keys(&self) -> &crate::keys::Keys {
        (**self).keys()
    }
}

impl Cache {
    pub fn new(redis: Redis) -> Self {
        Cache {
            redis,
            local: Flights::default(),
        }
    }

    pub fn stats(&self) -> CacheStats {
        self.local.stats()
    }
}

impl Cache {
    /// The cached value of `key`, or the loader's result stored under it for about `ttl`
    /// (± [`TTL_JITTER`]). Across all instances, one caller runs the loader per miss.
    pub async fn get_or_rebuild<T, F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        loader: F,
    ) -> Result<T, AppError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, AppError>>,
    {
        debug_assert!(
            key.contains('{'),
            "cache keys need a hash tag (Keys::cache): the fill script also touches <key>:lock"
        );
        let cache = &self.local;
        if let Some((value, _)) = read::<T, _>(&mut self.redis.clone(), key).await? {
            Flights::count(&cache.hits);
            return Ok(value);
        }
        loop {
            match cache.join(key) {
                Join::Follow(mut rx) => {
                    let outcome = match rx.wait_for(Option::is_some).await {
                        Ok(done) => (*done).clone(),
                        // The leader was cancelled (its client went away): start over.
                        Err(_) => continue,
                    };
                    let Some(outcome) = outcome else {
                        continue; // not reached: wait_for waited for Some
                    };
                    Flights::count(&cache.shared);
                    return match outcome {
                        Ok(json) => decode(&json),
                        Err(e) => Err(e.into()),
                    };
                }
                Join::Lead(flight) => {
                    let result = self.rebuild(key, ttl, loader).await;
                    flight.finish(match &result {
                        Ok((_, json)) => Ok(json.clone()),
                        Err(e) => Err(SharedError::from(e)),
                    });
                    return result.map(|(value, _)| value);
                }
            }
        }
    }

    /// The cross-instance part: take the rebuild lock and load, or wait for the holder.
    async fn rebuild<T, F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        loader: F,
    ) -> Result<(T, Arc<str>), AppError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, AppError>>,
    {
        let cache = &self.local;
        let mut redis = self.redis.clone();
        let lock_key = rebuild_lock_key(key);
        let deadline = Instant::now() + WAIT_FOR_REBUILD;
        loop {
            if let Some(guard) =
                Lock::try_acquire(&self.redis, lock_key.as_str(), REBUILD_LOCK_TTL_MS).await?
            {
                // The previous holder may have stored it between our miss and our lock.
                if let Some(found) = read(&mut redis, key).await? {
                    Flights::count(&cache.waited);
                    release_quietly(guard).await;
                    return Ok(found);
                }
                Flights::count(&cache.loads);
                let loaded = loader().await.and_then(encode);
                if let Ok((_, json)) = &loaded {
                    fill(&mut redis, key, json, ttl, &guard).await;
                }
                release_quietly(guard).await;
                return loaded;
            }
            if let Some(found) = read(&mut redis, key).await? {
                Flights::count(&cache.waited);
                return Ok(found);
            }
            let now = Instant::now();
            if now >= deadline {
                // Never fail a read because the holder is slow. Without the lock we may
                // not store: we cannot tell whether what we read is still current.
                tracing::warn!(key, "cache rebuild lock held too long; loading without it");
                Flights::count(&cache.loads);
                Flights::count(&cache.fallbacks);
                return encode(loader().await?);
            }
            let pause = Duration::from_millis(rand::rng().random_range(POLL_MS));
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }

    /// The cached values of `keys` as they are, in one pipelined round trip (a key
    /// of each slot's node on a cluster): `None` where one is missing or does not
    /// parse. Nothing is loaded: a caller gets a miss's value with
    /// [`Cache::get_or_rebuild`].
    pub async fn peek_many<T: DeserializeOwned>(
        &self,
        keys: &[String],
    ) -> Result<Vec<Option<T>>, AppError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.get(key);
        }
        let raws: Vec<Option<String>> = pipe.query_async(&mut self.redis.clone()).await?;
        Ok(raws
            .into_iter()
            .map(|raw| raw.and_then(|r| serde_json::from_str(&r).ok()))
            .collect())
    }

    /// After a change in Postgres: deletes the cached views and their rebuild locks (so a
    /// rebuild that read Postgres before the change cannot store what it read), and lets
    /// this process's later callers start fresh rebuilds. Call it after the commit.
    pub async fn invalidate(&self, keys: &[String]) -> Result<(), AppError> {
        invalidate_keys(&mut self.redis.clone(), keys).await?;
        self.local.forget(keys);
        Ok(())
    }
}

/// The rebuild lock of a cached view: same hash tag, so the fill script can check it.
fn rebuild_lock_key(key: &str) -> String {
    format!("{key}:lock")
}

/// Stores the rebuilt value if the rebuild lock is still ours. A failure here costs a
/// later miss, not this response, so it is logged and not returned.
async fn fill(
    redis: &mut impl ConnectionLike,
    key: &str,
    json: &str,
    ttl: Duration,
    guard: &LockGuard,
) {
    let ttl_ms = (jittered(ttl).as_millis() as u64).max(1);
    let stored: redis::RedisResult<i64> = FILL
        .key(key)
        .key(guard.key())
        .arg(json)
        .arg(ttl_ms)
        .arg(guard.token())
        .invoke_async(redis)
        .await;
    match stored.map(FillCode::of) {
        Ok(Some(FillCode::Stored)) => {}
        Ok(Some(FillCode::LockLost)) => {
            tracing::debug!(key, "view changed during its rebuild; not stored")
        }
        Ok(None) => tracing::warn!(key, "cache_fill.lua answered a code it never answers"),
        Err(e) => tracing::warn!(key, error = %e, "storing a rebuilt view failed"),
    }
}

async fn release_quietly(guard: LockGuard) {
    let key = guard.key().to_string();
    match guard.release().await {
        Ok(Released::Released) => {}
        // Invalidated meanwhile (or the lease ran out): the next holder's lock stays.
        Ok(Released::NotOwner) => tracing::debug!(lock = %key, "rebuild lock was no longer ours"),
        Err(e) => tracing::warn!(lock = %key, error = %e, "releasing a rebuild lock failed"),
    }
}

/// `ttl` scaled by a random factor in `1 ± TTL_JITTER`.
pub fn jittered(ttl: Duration) -> Duration {
    ttl.mul_f64(rand::rng().random_range((1.0 - TTL_JITTER)..=(1.0 + TTL_JITTER)))
}

/// The value under `key`, with its JSON. A value that no longer parses (written by an
/// older version, say) counts as a miss and is overwritten by the rebuild.
async fn read<T: DeserializeOwned, C: ConnectionLike>(
    redis: &mut C,
    key: &str,
) -> Result<Option<(T, Arc<str>)>, AppError> {
    let raw: Option<String> = redis::cmd("GET").arg(key).query_async(redis).await?;
    let Some(raw) = raw else {
        return Ok(None);
    };
    match serde_json::from_str(&raw) {
        Ok(value) => Ok(Some((value, raw.into()))),
        Err(e) => {
            tracing::warn!(key, error = %e, "cached view does not parse; rebuilding it");
            Ok(None)
        }
    }
}

fn encode<T: Serialize>(value: T) -> Result<(T, Arc<str>), AppError> {
    let json = serde_json::to_string(&value)
        .map_err(|e| AppError::Internal(anyhow::anyhow!("encoding a view: {e}")))?;
    Ok((value, json.into()))
}

fn decode<T: DeserializeOwned>(json: &str) -> Result<T, AppError> {
    serde_json::from_str(json)
        .map_err(|e| AppError::Internal(anyhow::anyhow!("decoding a shared view: {e}")))
}

/// The Redis half of [`Cache::invalidate`], for code without a `Cache` (`seed-demo`).
pub async fn invalidate_keys<C: ConnectionLike>(
    redis: &mut C,
    keys: &[String],
) -> redis::RedisResult<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for key in keys {
        // One DEL per view: the view and its lock share a slot.
        pipe.del(&[key.clone(), rebuild_lock_key(key)]).ignore();
    }
    pipe.query_async(redis).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_bounds() {
        let base = Duration::from_secs(30);
        for _ in 0..1000 {
            let t = jittered(base);
            assert!(
                t >= Duration::from_secs(24) && t <= Duration::from_secs(36),
                "{t:?}"
            );
        }
    }
}
