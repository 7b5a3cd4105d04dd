//! The HTTP side of rate limits: who the subject is (user id or client IP), one
//! [`Limiter::check`] per request, and the `Retry-After` / `RateLimit` / `RateLimit-Policy`
//! headers.
//!
//! # Several policies on one route
//! A route's policies (say per user and per IP) live under different hash tags,
//! so no single script can see them all on Redis Cluster. [`Limiter::check`] runs them
//! concurrently over the one multiplexed connection, which writes both EVALSHAs
//! before reading either answer: one round trip when they agree. When some allow
//! and some deny, the request is refused and the allowing ones are refunded
//! (a second round trip, on that path only), so a refused request is not counted
//! by any policy. Between take and refund another request may see that count: under
//! a race right at the limit a request can be refused that a single atomic check
//! would have let through, never the other way round.

use std::net::IpAddr;

use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse};
use futures_util::future::join_all;

use std::sync::Arc;

use super::client::{client_ip, ip_subject, subnet_subject};
use super::headers::{RATELIMIT, RATELIMIT_POLICY, ceil_secs, headers};
use super::{Attempt, Decision, Limits, Policy, Route, Subject, Verdict, refund, take};
use crate::domain::UserId;
use crate::error::{AppError, ErrorCode, is_redis_unreachable};
use crate::keys::Keys;
use crate::metrics::Metrics;
use crate::redis_conn::Redis;

/// The go-ahead of [`Limiter::check`], carrying the `RateLimit` headers for the answer.
#[derive(Clone, Debug, Default)]
#[must_use = "attach the RateLimit headers to the success answer"]
pub struct Granted {
    /// `(RateLimit-Policy, RateLimit)`, made once from the text [`headers`] wrote
    /// (the value takes the text's buffer: no copy).
    headers: Option<(HeaderValue, HeaderValue)>,
}

impl Granted {
    /// Adds `RateLimit-Policy` and `RateLimit` (nothing when no policy applied).
    pub fn attach(self, mut resp: HttpResponse) -> HttpResponse {
        if let Some((policy, state)) = self.headers {
            resp.headers_mut().insert(RATELIMIT_POLICY, policy);
            resp.headers_mut().insert(RATELIMIT, state);
        }
        resp
    }

    /// `(RateLimit-Policy, RateLimit)` values, if any policy applied.
    pub fn header_values(&self) -> Option<(&str, &str)> {
        let (policy, state) = self.headers.as_ref()?;
        Some((policy.to_str().ok()?, state.to_str().ok()?))
    }
}

/// The rate limiter: the policies, and what it needs to apply them (its Redis
/// handle, key names, metrics, the proxies whose `X-Forwarded-For` it believes).
/// `state.limiter.check(..)` for sign-in and sign-up; buy and vote check their
/// policies inside their decision scripts and call [`Limiter::judge`] on the result.
pub struct Limiter {
    limits: Limits,
    redis: Redis,
    keys: Keys,
    metrics: Arc<Metrics>,
    trusted_proxies: Vec<crate::config::IpNet>,
}

/// What one policy's take came to.
type Taken<'p> = (&'p Policy, Result<Decision, Unavailable>);

impl Limiter {
    pub fn new(
        limits: Limits,
        redis: Redis,
        keys: Keys,
        metrics: Arc<Metrics>,
        trusted_proxies: Vec<crate::config::IpNet>,
    ) -> Self {
        Limiter {
            limits,
            redis,
            keys,
            metrics,
            trusted_proxies,
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The client's address, as far as it can be told (see [`client_ip`]).
    pub fn client_ip(&self, req: &HttpRequest) -> IpAddr {
        client_ip(req, &self.trusted_proxies)
    }

    /// Checks every policy of `route` for this request. `user` is the signed-in
    /// caller on buy and vote, `None` on sign-in and sign-up.
    ///
    /// Errors: `429 rate_limited` (with `Retry-After`, `RateLimit`, `RateLimit-Policy`),
    /// `503 rate_limiter_unavailable` when Redis cannot be reached and a policy fails
    /// closed, `422 rate_limit_unsatisfiable` when a request costs more than a token
    /// bucket can ever hold. A refused request is counted by no policy.
    #[tracing::instrument(level = "debug", skip_all, fields(route = %route))]
    pub async fn check(
        &self,
        route: Route,
        user: Option<UserId>,
        req: &HttpRequest,
    ) -> Result<Granted, AppError> {
        let policies = self.limits.for_route(route);
        if policies.is_empty() {
            return Ok(Granted::default());
        }
        // The machine itself is not a network: a client on loopback (a load test
        // here, or a proxy not named in `trusted_proxies`) meets no `subnet` policy.
        let mine;
        let policies = if policies.iter().any(|p| p.subject == Subject::Subnet)
            && self.client_ip(req).to_canonical().is_loopback()
        {
            mine = policies
                .iter()
                .filter(|p| p.subject != Subject::Subnet)
                .cloned()
                .collect::<Vec<Policy>>();
            if mine.is_empty() {
                return Ok(Granted::default());
            }
            &mine[..]
        } else {
            policies
        };
        let keys = self.subject_keys(policies, route, user, req)?;
        let attempts: Vec<Attempt<'_>> = policies
            .iter()
            .zip(&keys)
            .map(|(p, key)| Attempt {
                algorithm: &p.algorithm,
                key,
            })
            .collect();
        let taken = self.take_all(policies, &attempts).await;
        self.verdict(&attempts, taken).await
    }

    /// Each policy's state key: the policy and its subject (the user, or the address).
    fn subject_keys(
        &self,
        policies: &[Policy],
        route: Route,
        user: Option<UserId>,
        req: &HttpRequest,
    ) -> Result<Vec<String>, AppError> {
        let ip = policies
            .iter()
            .any(|p| p.subject.by_address())
            .then(|| self.client_ip(req));
        policies
            .iter()
            .map(|p| {
                let subject = match (p.subject, user, ip) {
                    (Subject::User, Some(user), _) => format!("u{user}"),
                    (Subject::Ip, _, Some(ip)) => ip_subject(ip),
                    (Subject::Subnet, _, Some(ip)) => subnet_subject(ip),
                    _ => {
                        return Err(AppError::Internal(anyhow::anyhow!(
                            "policy {} needs a signed-in user on route {route}",
                            p.name
                        )));
                    }
                };
                Ok(self.keys.rate_limit(&p.name, &subject))
            })
            .collect()
    }

    /// Takes every policy at once (one round trip on the multiplexed connection),
    /// each bounded by the limiter's timeout.
    async fn take_all<'p>(
        &self,
        policies: &'p [Policy],
        attempts: &[Attempt<'_>],
    ) -> Vec<Taken<'p>> {
        let timeout = self.limits.timeout();
        let results = join_all(attempts.iter().map(|a| async move {
            match tokio::time::timeout(timeout, take(&mut self.redis.clone(), a, None)).await {
                Ok(result) => result.map_err(Unavailable::Redis),
                Err(_) => Err(Unavailable::Timeout),
            }
        }))
        .await;
        policies.iter().zip(results).collect()
    }

    /// From what the policies said to the answer: unreachable policies fail open or
    /// closed as configured; a refusal gives back what the others counted.
    async fn verdict(
        &self,
        attempts: &[Attempt<'_>],
        taken: Vec<Taken<'_>>,
    ) -> Result<Granted, AppError> {
        let mut decided: Vec<(&Policy, &Attempt<'_>, Decision)> = Vec::new();
        let mut closed: Option<&Policy> = None;
        let mut broken: Option<redis::RedisError> = None;
        for ((policy, result), attempt) in taken.into_iter().zip(attempts) {
            match result {
                Ok(decision) => decided.push((policy, attempt, decision)),
                Err(Unavailable::Redis(e)) if !is_redis_unreachable(&e) => broken = Some(e),
                Err(why) if policy.fail_open => {
                    tracing::warn!(policy = %policy.name, error = %why, "rate limiter unreachable; letting the request through (fail_open)");
                }
                Err(why) => {
                    tracing::warn!(policy = %policy.name, error = %why, "rate limiter unreachable; refusing the request (fail closed)");
                    closed.get_or_insert(policy);
                }
            }
        }
        let refused =
            closed.is_some() || broken.is_some() || decided.iter().any(|(_, _, d)| !d.allowed());
        if refused {
            self.refund_allowed(&decided).await;
        }
        if let Some(e) = broken {
            return Err(AppError::Redis(e));
        }
        if let Some(policy) = closed {
            return Err(AppError::new(
                ErrorCode::RateLimiterUnavailable,
                format!(
                    "the rate limiter ({}) cannot be reached, so this request cannot be checked; \
                     try again shortly",
                    policy.name
                ),
            ));
        }
        let decided: Vec<(&Policy, Decision)> = decided.iter().map(|(p, _, d)| (*p, *d)).collect();
        self.judge(&decided)
    }

    /// The answer for what the policies of one request decided (refunds done): a
    /// [`Granted`] with the `RateLimit` headers, `429 rate_limited` when one refused,
    /// `422 rate_limit_unsatisfiable` when one never can allow it. Used by [`Limiter::check`]
    /// and by the decision scripts that check a route's limits themselves.
    pub fn judge(&self, decided: &[(&Policy, Decision)]) -> Result<Granted, AppError> {
        for (policy, decision) in decided {
            let answer = match decision.verdict {
                Verdict::Allowed => 0,
                Verdict::Denied => 1,
                Verdict::Never => 2,
            };
            self.metrics.observed.limit_decision(&policy.name, answer);
        }
        let refused = decided.iter().any(|(_, d)| !d.allowed());
        let (policy_header, state_header) = headers(decided, refused);
        if let Some((policy, _)) = decided.iter().find(|(_, d)| d.verdict == Verdict::Never) {
            return Err(AppError::new(
                ErrorCode::RateLimitUnsatisfiable,
                format!(
                    "this request costs more than the limit {} can ever allow; retrying will not help",
                    policy.name
                ),
            ));
        }
        if refused {
            let retry_ms = decided
                .iter()
                .filter(|(_, d)| !d.allowed())
                .map(|(_, d)| d.retry_after_ms)
                .max()
                .unwrap_or(0);
            let retry_secs = ceil_secs(retry_ms).max(1);
            tracing::debug!(retry_secs, "rate limited");
            crate::metrics::Metrics::inc(&self.metrics.rate_limited);
            return Err(AppError::new(
                ErrorCode::RateLimited,
                format!("too many requests; try again in {retry_secs} s"),
            )
            .with_header(header::RETRY_AFTER, retry_secs.to_string())
            .with_header(RATELIMIT_POLICY, policy_header)
            .with_header(RATELIMIT, state_header));
        }
        if decided.is_empty() {
            return Ok(Granted::default());
        }
        // The text is `[a-z0-9_-]` names, digits and `";=, `: always a valid value.
        let values = HeaderValue::try_from(policy_header)
            .and_then(|policy| HeaderValue::try_from(state_header).map(|state| (policy, state)));
        Ok(Granted {
            headers: values.ok(),
        })
    }

    /// Gives back what the allowing policies of a refused request counted. Best
    /// effort: a refund that fails leaves the request counted, which errs on the side
    /// of limiting.
    async fn refund_allowed(&self, decided: &[(&Policy, &Attempt<'_>, Decision)]) {
        let timeout = self.limits.timeout();
        let refunds = decided
        .iter()
        .filter(|(_, _, d)| d.allowed())
        .map(|(policy, attempt, d)| async move {
            let result =
                tokio::time::timeout(timeout, refund(&mut self.redis.clone(), attempt, d.now_ms))
                    .await;
            if !matches!(result, Ok(Ok(()))) {
                tracing::warn!(policy = %policy.name, "rate-limit refund failed; the refused request stays counted");
            }
        });
        join_all(refunds).await;
    }
}

enum Unavailable {
    Redis(redis::RedisError),
    Timeout,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::Redis(e) => e.fmt(f),
            Unavailable::Timeout => f.write_str("timed out"),
        }
    }
}
