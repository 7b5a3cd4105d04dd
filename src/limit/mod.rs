//! Rate limits whose state lives in Redis, so they hold across any number of app
//! instances. Four algorithms, one Lua source file each (`lua/lib/limit_*.lua`),
//! run by one script (`lua/limit.lua`) behind one interface: [`take`] counts a
//! request if it fits and returns a [`Decision`]; [`refund`] undoes a take. The
//! script reads the Redis clock (`TIME`), keeps each policy's state for one
//! subject in one string key that it reads once and writes once with its TTL, and
//! returns allowed, remaining, and the time until the next request would be
//! allowed.
//!
//! Handlers call [`http::Limiter::check`] once, after their cheap local checks and
//! before their own script. It runs all of a route's policies, concurrently, and answers
//! `429 rate_limited` (with `Retry-After` and the IETF `RateLimit` headers) or
//! hands back a [`http::Granted`] whose headers go onto the success answer:
//!
//! ```ignore
//! let granted = state.limiter.check(Route::Signin, None, &req).await?;
//! // ... the sign-in ...
//! Ok(granted.attach(HttpResponse::Ok().json(body)))
//! ```
//!
//! Keys: `<namespace>:rl:{<policy>:<subject>}`, one hash tag per key, where the
//! subject is `u<user id>`, a parsed IP address ([`client::client_ip`]) or its
//! network (`203.0.113.0/24`, [`client::subnet_subject`]), never raw header text.

pub mod client;
pub mod headers;
pub mod http;
/// The policies, read and checked with the configuration (a leaf: [`crate::config`]
/// holds them, so the configuration imports nothing of the limiter).
pub use crate::config::limits as policy;

use std::sync::LazyLock;

use redis::aio::ConnectionLike;

use crate::lua::lua_function;

pub use crate::config::limits::{Algorithm, LimitsConfig, Policy, PolicyConfig, Route, Subject};

static LIMIT: LazyLock<crate::lua::Script> = lua_function!("limit.lua", "limit");

/// The script that decides one request under one policy (for
/// `examples/lua_function.rs`).
pub fn script() -> &'static crate::lua::Script {
    &LIMIT
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    Denied,
    /// The cost exceeds the capacity: no amount of waiting would let it through.
    Never,
}

/// What a script decided about one request under one policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    /// Requests (or tokens) left in the quota after this one.
    pub remaining: u64,
    /// Until the next request would be allowed (0 when it would be now).
    pub retry_after_ms: u64,
    /// Until the whole quota is available again.
    pub reset_ms: u64,
    /// The Redis time the script decided at; a [`refund`] passes it back.
    pub now_ms: i64,
}

impl Decision {
    pub fn allowed(&self) -> bool {
        self.verdict == Verdict::Allowed
    }
}

/// One request under one policy: the key it counts in.
#[derive(Clone, Debug)]
pub struct Attempt<'a> {
    pub algorithm: &'a Algorithm,
    pub key: &'a str,
}

crate::lua::reply_codes! {
    /// The verdict `lua/limit.lua` answers, as its header lists them.
    pub enum VerdictCode in "limit.lua", checked_by verdict_codes_are_the_scripts {
        Allowed = 1, "allowed";
        Denied = 0, "denied";
        Never = -1, "never";
    }
}

/// Counts the request if it fits. `now_ms` is for tests only (replaying exact
/// timings); production passes `None` and the Redis clock decides.
pub async fn take<C: ConnectionLike>(
    redis: &mut C,
    attempt: &Attempt<'_>,
    now_ms: Option<i64>,
) -> redis::RedisResult<Decision> {
    let (allowed, remaining, retry, reset, now): (i64, i64, i64, i64, i64) =
        run(redis, attempt, "take", now_ms).await?;
    Ok(Decision {
        verdict: match VerdictCode::of(allowed) {
            Some(VerdictCode::Allowed) => Verdict::Allowed,
            Some(VerdictCode::Denied) => Verdict::Denied,
            Some(VerdictCode::Never) => Verdict::Never,
            None => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "limit.lua: unexpected verdict",
                    allowed.to_string(),
                )));
            }
        },
        remaining: remaining.max(0) as u64,
        retry_after_ms: retry.max(0) as u64,
        reset_ms: reset.max(0) as u64,
        now_ms: now,
    })
}

/// Undoes an allowed [`take`] (same attempt, its decision's `now_ms`): used when
/// another policy of the same request denied it. Never creates a key.
pub async fn refund<C: ConnectionLike>(
    redis: &mut C,
    attempt: &Attempt<'_>,
    taken_at_ms: i64,
) -> redis::RedisResult<()> {
    let _: redis::Value = run(redis, attempt, "refund", Some(taken_at_ms)).await?;
    Ok(())
}

async fn run<C: ConnectionLike, T: redis::FromRedisValue>(
    redis: &mut C,
    attempt: &Attempt<'_>,
    mode: &str,
    now_ms: Option<i64>,
) -> redis::RedisResult<T> {
    let (code, a, b, c) = attempt.algorithm.lua_args();
    LIMIT
        .key(attempt.key)
        .arg(code)
        .arg(mode)
        .arg(now_ms.map(|n| n.to_string()).unwrap_or_default())
        .arg(a)
        .arg(b)
        .arg(c)
        .invoke_async(redis)
        .await
}

/// The checked policies of a deployment, grouped by route. Built once at startup.
#[derive(Clone, Debug, Default)]
pub struct Limits {
    enabled: bool,
    timeout: std::time::Duration,
    buy: Vec<Policy>,
    ticket: Vec<Policy>,
    vote: Vec<Policy>,
    signin: Vec<Policy>,
    signup: Vec<Policy>,
    join: Vec<Policy>,
    entry: Vec<Policy>,
}

impl Limits {
    pub fn from_config(config: &LimitsConfig) -> Result<Self, String> {
        let mut limits = Limits {
            enabled: config.enabled,
            timeout: config.timeout(),
            ..Limits::default()
        };
        for policy in config.policies()? {
            match policy.route {
                Route::Buy => limits.buy.push(policy),
                Route::Ticket => limits.ticket.push(policy),
                Route::Vote => limits.vote.push(policy),
                Route::Signin => limits.signin.push(policy),
                Route::Signup => limits.signup.push(policy),
                Route::Join => limits.join.push(policy),
                Route::Entry => limits.entry.push(policy),
            }
        }
        Ok(limits)
    }

    /// The policies guarding a route; none when limits are off.
    pub fn for_route(&self, route: Route) -> &[Policy] {
        if !self.enabled {
            return &[];
        }
        match route {
            Route::Buy => &self.buy,
            Route::Ticket => &self.ticket,
            Route::Vote => &self.vote,
            Route::Signin => &self.signin,
            Route::Signup => &self.signup,
            Route::Join => &self.join,
            Route::Entry => &self.entry,
        }
    }

    /// Whether a policy of the route counts per client address or network (so
    /// the handler works out the address only then).
    pub fn counts_ip(&self, route: Route) -> bool {
        self.for_route(route).iter().any(|p| p.subject.by_address())
    }

    pub fn timeout(&self) -> std::time::Duration {
        self.timeout
    }
}
