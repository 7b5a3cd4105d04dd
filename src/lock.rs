//! A Redis lock: `SET key token NX PX ttl` with a random 128-bit token. Release and
//! extend are Lua scripts (`lua/lock_release.lua`, `lua/lock_extend.lua`) that act only
//! while the key still holds the caller's token, so a holder whose lease ran out can
//! never delete or revive the lock of whoever took it next.
//!
//! It is a lease, not a mutex: a holder that stalls past its TTL loses the lock without
//! knowing it. Work under a lock must therefore either tolerate a rare overlap (the
//! settlement writes are idempotent; a cache fill re-checks the token inside Redis), or
//! run a [watchdog](LockGuard::start_watchdog) and stop when it reports the loss.
//!
//! ```no_run
//! # async fn demo(redis: stampede::redis_conn::Redis) -> redis::RedisResult<()> {
//! use stampede::lock::{Lock, Released};
//! if let Some(mut guard) = Lock::try_acquire(&redis, "ns:lock:{nightly}", 5_000).await? {
//!     let mut lost = guard.start_watchdog(); // keeps the 5 s lease alive while we work
//!     tokio::select! {
//!         _ = async { /* the work */ } => {}
//!         _ = lost.lost() => { /* another instance may run now: stop */ }
//!     }
//!     assert_eq!(guard.release().await?, Released::Released);
//! }
//! # Ok(()) }
//! ```

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use rand::Rng;
use redis::RedisResult;
use redis::aio::ConnectionLike;

use crate::redis_conn::Redis;
use tokio::sync::watch;
use tokio::task::JoinHandle;

static RELEASE: LazyLock<crate::lua::Script> =
    LazyLock::new(|| crate::lua::Script::new(include_str!("../lua/lock_release.lua")));
static EXTEND: LazyLock<crate::lua::Script> =
    LazyLock::new(|| crate::lua::Script::new(include_str!("../lua/lock_extend.lua")));

/// Pause between attempts of [`Lock::acquire`]: short, and random so that waiters on
/// several instances do not retry in lockstep.
const RETRY_PAUSE_MS: std::ops::RangeInclusive<u64> = 5..=25;

/// Constructors of [`LockGuard`]. The key is the caller's: build it with
/// [`crate::keys::Keys::lock`] (or keep it in the slot of the data it protects).
pub struct Lock;

/// What [`LockGuard::release`] found.
/// What the locks of this process did, for `/metrics`: attempts that got the lock,
/// attempts that found it held (contention), and held locks a watchdog lost.
#[derive(Default)]
pub struct Stats {
    pub acquired: crate::metrics::Counter,
    pub contended: crate::metrics::Counter,
    pub lost: crate::metrics::Counter,
}

/// The process's lock counters (the lock functions take no state of their own).
pub static STATS: LazyLock<Stats> = LazyLock::new(Stats::default);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The key held our token and is gone now.
    Released,
    /// The key was gone or held another token (our lease had expired); nothing deleted.
    NotOwner,
}

impl Lock {
    /// One attempt. `Ok(None)` when someone else holds the lock.
    pub async fn try_acquire(
        redis: &Redis,
        key: impl Into<String>,
        ttl_ms: u64,
    ) -> RedisResult<Option<LockGuard>> {
        let key = key.into();
        // PX 0 is an error in Redis; a zero lease is a caller bug we round up.
        let ttl_ms = ttl_ms.max(1);
        let token = crate::random::token_hex(16);
        let mut redis = redis.clone();
        // With GET (Redis 7): the value the key held, none when this SET wrote
        // it. Our own token there is ours too: the connection re-sends a command
        // whose reply was lost, and the first send took the lock.
        let held: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut redis)
            .await?;
        let ours = held.as_deref().is_none_or(|held| held == token);
        let stat = if ours {
            &STATS.acquired
        } else {
            &STATS.contended
        };
        stat.add(1);
        Ok(ours.then(|| LockGuard {
            redis,
            key,
            token,
            ttl_ms,
            released: false,
            watchdog: None,
        }))
    }

    /// Retries with short random pauses until the lock is ours or `wait` has passed.
    pub async fn acquire(
        redis: &Redis,
        key: impl Into<String>,
        ttl_ms: u64,
        wait: Duration,
    ) -> RedisResult<Option<LockGuard>> {
        let key = key.into();
        let deadline = Instant::now() + wait;
        loop {
            if let Some(guard) = Self::try_acquire(redis, key.clone(), ttl_ms).await? {
                return Ok(Some(guard));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let pause = Duration::from_millis(rand::rng().random_range(RETRY_PAUSE_MS));
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }
}

/// Compare-and-delete: deletes `key` only if it holds `token`.
pub async fn release<C: ConnectionLike>(
    redis: &mut C,
    key: &str,
    token: &str,
) -> RedisResult<Released> {
    let deleted: i64 = RELEASE.key(key).arg(token).invoke_async(redis).await?;
    match ReleaseCode::of(deleted) {
        Some(ReleaseCode::Released) => Ok(Released::Released),
        Some(ReleaseCode::NotHeld) => Ok(Released::NotOwner),
        None => Err(unknown_code("lock_release.lua", deleted)),
    }
}

/// Compare-and-expire: sets a new lease on `key` only if it holds `token`. Never
/// creates the key.
pub async fn extend<C: ConnectionLike>(
    redis: &mut C,
    key: &str,
    token: &str,
    ttl_ms: u64,
) -> RedisResult<bool> {
    let extended: i64 = EXTEND
        .key(key)
        .arg(token)
        .arg(ttl_ms.max(1))
        .invoke_async(redis)
        .await?;
    match ExtendCode::of(extended) {
        Some(code) => Ok(code == ExtendCode::Extended),
        None => Err(unknown_code("lock_extend.lua", extended)),
    }
}

crate::lua::reply_codes! {
    /// What `lua/lock_release.lua` answers, as its header lists them.
    pub enum ReleaseCode in "lock_release.lua", checked_by release_codes_are_the_scripts {
        Released = 1, "released";
        NotHeld = 0, "not held";
    }
}

crate::lua::reply_codes! {
    /// What `lua/lock_extend.lua` answers, as its header lists them.
    pub enum ExtendCode in "lock_extend.lua", checked_by extend_codes_are_the_scripts {
        Extended = 1, "extended";
        NotHeld = 0, "not held";
    }
}

/// A reply code a lock script never answers: a bug or another version's script.
fn unknown_code(script: &str, code: i64) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "a lock script answered a code it never answers",
        format!("{script}: {code}"),
    ))
}

/// A held lock. Release it with [`release`](Self::release); a guard dropped without
/// release is released in the background (best effort; the TTL is the backstop).
pub struct LockGuard {
    redis: Redis,
    key: String,
    token: String,
    ttl_ms: u64,
    released: bool,
    watchdog: Option<Watchdog>,
}

struct Watchdog {
    task: JoinHandle<()>,
    lost: watch::Receiver<bool>,
}

impl LockGuard {
    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    /// The lease this guard was taken (and is extended) with.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// Sets the lease to `ttl_ms` from now. `false` when the lock is no longer ours
    /// (expired, or taken by another holder); the key is then left as it is.
    pub async fn extend(&self, ttl_ms: u64) -> RedisResult<bool> {
        extend(&mut self.redis.clone(), &self.key, &self.token, ttl_ms).await
    }

    /// Stops the watchdog (if any), then deletes the key if it still holds our token.
    pub async fn release(mut self) -> RedisResult<Released> {
        if let Some(dog) = self.watchdog.take() {
            dog.task.abort();
            // Wait until it has stopped, so no extension races the delete below and
            // the lost signal cannot fire after a clean release.
            let _ = dog.task.await;
        }
        let result = release(&mut self.redis.clone(), &self.key, &self.token).await;
        // On a Redis error `released` stays false and Drop tries once more.
        self.released = result.is_ok();
        result
    }

    /// Extends the lease every third of its TTL until the guard is released or dropped.
    /// The returned signal fires when an extension finds the lock gone or someone
    /// else's, or when Redis has not confirmed an extension for long enough that the
    /// lease may have run out. Calling it again returns the same signal.
    pub fn start_watchdog(&mut self) -> LostSignal {
        if let Some(dog) = &self.watchdog {
            return LostSignal(dog.lost.clone());
        }
        let (lost_tx, lost) = watch::channel(false);
        let task = tokio::spawn(keep_alive(
            self.redis.clone(),
            self.key.clone(),
            self.token.clone(),
            self.ttl_ms,
            lost_tx,
        ));
        self.watchdog = Some(Watchdog {
            task,
            lost: lost.clone(),
        });
        LostSignal(lost)
    }
}

async fn keep_alive(
    mut redis: Redis,
    key: String,
    token: String,
    ttl_ms: u64,
    lost: watch::Sender<bool>,
) {
    let ttl = Duration::from_millis(ttl_ms);
    let every = (ttl / 3).max(Duration::from_millis(1));
    // The lease is known good until `confirmed + ttl`, counted from when the
    // extension was sent (Redis applied it a little later, so this errs safe).
    let mut confirmed = Instant::now();
    loop {
        tokio::time::sleep(every).await;
        let sent = Instant::now();
        let outcome = tokio::time::timeout(every, extend(&mut redis, &key, &token, ttl_ms)).await;
        match outcome {
            Ok(Ok(true)) => confirmed = sent,
            Ok(Ok(false)) => {
                tracing::warn!(lock = %key, "lock lost: another holder has it, or it expired");
                STATS.lost.add(1);
                lost.send_replace(true);
                return;
            }
            Ok(Err(e)) => tracing::warn!(lock = %key, error = %e, "lock extension failed"),
            Err(_) => tracing::warn!(lock = %key, "lock extension timed out"),
        }
        // Declare the loss before the lease can have run out, not after: the next
        // attempt would come too late.
        if confirmed.elapsed() + every >= ttl {
            tracing::warn!(lock = %key, "lock lost: its lease could not be extended in time");
            STATS.lost.add(1);
            lost.send_replace(true);
            return;
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(dog) = self.watchdog.take() {
            dog.task.abort();
        }
        if self.released {
            return;
        }
        // Dropped early (an error, a cancelled request): free the lock now rather than
        // make the next caller wait out the lease. Outside a runtime, the TTL does it.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let mut redis = self.redis.clone();
            let key = std::mem::take(&mut self.key);
            let token = std::mem::take(&mut self.token);
            rt.spawn(async move {
                if let Err(e) = release(&mut redis, &key, &token).await {
                    tracing::warn!(lock = %key, error = %e, "releasing a dropped lock failed");
                }
            });
        }
    }
}

/// Fires once the watchdog decides the lock is lost. It never fires after a clean
/// release or while the watchdog is not running.
#[derive(Clone, Debug)]
pub struct LostSignal(watch::Receiver<bool>);

impl LostSignal {
    pub fn is_lost(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves when the lock is lost; pends forever if the watchdog stopped because
    /// the guard was released or dropped. Made for `tokio::select!` against the work.
    pub async fn lost(&mut self) {
        if self.0.wait_for(|lost| *lost).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
