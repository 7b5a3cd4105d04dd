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

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::{HttpRequest, HttpResponse};
use futures_util::future::join_all;

use std::sync::Arc;

use super::{Attempt, Decision, Limits, Policy, Route, Subject, Verdict, refund, take};
use crate::domain::UserId;
use crate::error::{AppError, ErrorCode, is_redis_unreachable};
use crate::keys::Keys;
use crate::metrics::Metrics;
use crate::redis_conn::Redis;

pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

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
    trusted_proxies: Vec<IpAddr>,
}

/// What one policy's take came to.
type Taken<'p> = (&'p Policy, Result<Decision, Unavailable>);

impl Limiter {
    pub fn new(
        limits: Limits,
        redis: Redis,
        keys: Keys,
        metrics: Arc<Metrics>,
        trusted_proxies: Vec<IpAddr>,
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
            .any(|p| p.subject == Subject::Ip)
            .then(|| self.client_ip(req));
        policies
            .iter()
            .map(|p| {
                let subject = match (p.subject, user, ip) {
                    (Subject::User, Some(user), _) => format!("u{user}"),
                    (Subject::Ip, _, Some(ip)) => ip_subject(ip),
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

/// The values of `RateLimit-Policy` and `RateLimit`: one list member per policy,
/// e.g. `"buy-user";q=5;w=10` and `"buy-user";r=4;t=10`. `t` is the time until the
/// whole quota is back. A refunded policy shows what it has after the refund.
/// Written piece by piece into two strings (every 202 and vote carries them: the
/// `format!` of each member cost about 0.3 us of a purchase).
fn headers(decided: &[(&Policy, Decision)], refunded: bool) -> (String, String) {
    let mut policy = String::with_capacity(40 * decided.len());
    let mut state = String::with_capacity(40 * decided.len());
    for (p, d) in decided {
        let quota = p.algorithm.quota();
        let remaining = if refunded && d.allowed() {
            (d.remaining + p.algorithm.cost()).min(quota)
        } else {
            d.remaining
        };
        if !policy.is_empty() {
            policy.push_str(", ");
            state.push_str(", ");
        }
        push_item(
            &mut policy,
            &p.name,
            ("q", quota),
            ("w", ceil_secs(p.algorithm.window_ms())),
        );
        push_item(
            &mut state,
            &p.name,
            ("r", remaining),
            ("t", ceil_secs(d.reset_ms)),
        );
    }
    (policy, state)
}

/// Appends `"<name>";<a>=<x>;<b>=<y>` (names are `[a-z0-9_-]`: nothing to escape).
fn push_item(out: &mut String, name: &str, (a, x): (&str, u64), (b, y): (&str, u64)) {
    let mut digits = itoa::Buffer::new();
    out.push('"');
    out.push_str(name);
    out.push_str("\";");
    out.push_str(a);
    out.push('=');
    out.push_str(digits.format(x));
    out.push(';');
    out.push_str(b);
    out.push('=');
    out.push_str(digits.format(y));
}

/// `"<name>";q=<limit>;w=<window in s>` (names are `[a-z0-9_-]`: nothing to escape).
pub fn policy_item(name: &str, quota: u64, window_secs: u64) -> String {
    let mut out = String::new();
    push_item(&mut out, name, ("q", quota), ("w", window_secs));
    out
}

/// `"<name>";r=<remaining>;t=<seconds>`.
pub fn state_item(name: &str, remaining: u64, reset_secs: u64) -> String {
    let mut out = String::new();
    push_item(&mut out, name, ("r", remaining), ("t", reset_secs));
    out
}

/// Whole seconds, rounded up.
pub fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// The client's address: the socket peer, or, when the peer is a trusted proxy,
/// the rightmost `X-Forwarded-For` hop that is not a trusted proxy. Hops are
/// parsed, so nothing a client wrote reaches a key as text.
pub fn client_ip(req: &HttpRequest, trusted_proxies: &[IpAddr]) -> IpAddr {
    let peer = req
        .peer_addr()
        .map(|a| a.ip().to_canonical())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let forwarded = req.headers().get_all("x-forwarded-for");
    forwarded_client(peer, forwarded, trusted_proxies)
}

fn is_trusted(ip: IpAddr, trusted: &[IpAddr]) -> bool {
    trusted.iter().any(|t| t.to_canonical() == ip)
}

/// Walks `X-Forwarded-For` from the right (the hop our proxy appended) past our
/// own proxies. A hop that does not parse stops the walk at the nearest trusted
/// hop: what lies left of it was written by someone we do not trust.
fn forwarded_client<'a>(
    peer: IpAddr,
    values: impl Iterator<Item = &'a HeaderValue>,
    trusted: &[IpAddr],
) -> IpAddr {
    if !is_trusted(peer, trusted) {
        return peer;
    }
    let mut hops: Vec<&str> = Vec::new();
    for value in values {
        let Ok(text) = value.to_str() else {
            return peer;
        };
        hops.extend(text.split(',').map(str::trim).filter(|h| !h.is_empty()));
    }
    let mut nearest = peer;
    for hop in hops.iter().rev() {
        match parse_hop(hop) {
            Some(ip) if is_trusted(ip, trusted) => nearest = ip,
            Some(ip) => return ip,
            None => return nearest,
        }
    }
    nearest
}

/// `203.0.113.7`, `2001:db8::1`, `203.0.113.7:4711` or `[2001:db8::1]:4711`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    hop.parse::<IpAddr>()
        .or_else(|_| hop.parse::<SocketAddr>().map(|s| s.ip()))
        .ok()
        .map(|ip| ip.to_canonical())
}

/// The subject text of an address. IPv4 as is; IPv6 by its /64, since anyone with
/// IPv6 holds at least a /64 and could otherwise use a fresh address per request.
pub fn ip_subject(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            format!("{}/64", Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Algorithm;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn xff(values: &[&str]) -> Vec<HeaderValue> {
        values
            .iter()
            .map(|v| HeaderValue::from_str(v).unwrap())
            .collect()
    }

    #[test]
    fn header_items_follow_the_ietf_draft() {
        assert_eq!(policy_item("buy-user", 5, 10), "\"buy-user\";q=5;w=10");
        assert_eq!(state_item("buy-user", 0, 3), "\"buy-user\";r=0;t=3");
        assert_eq!(ceil_secs(0), 0);
        assert_eq!(ceil_secs(1), 1);
        assert_eq!(ceil_secs(1000), 1);
        assert_eq!(ceil_secs(1001), 2);
    }

    #[test]
    fn several_policies_become_one_list() {
        let user = Policy {
            name: "buy-user".into(),
            route: Route::Buy,
            subject: Subject::User,
            algorithm: Algorithm::SlidingLog {
                limit: 5,
                window_ms: 10_000,
            },
            fail_open: false,
        };
        let ipp = Policy {
            name: "buy-ip".into(),
            subject: Subject::Ip,
            algorithm: Algorithm::TokenBucket {
                capacity: 10,
                refill_per_sec: 3.0,
                cost: 2,
            },
            ..user.clone()
        };
        let d = |verdict, remaining, reset_ms| Decision {
            verdict,
            remaining,
            retry_after_ms: 0,
            reset_ms,
            now_ms: 0,
        };
        let decided = vec![
            (&user, d(Verdict::Denied, 0, 9_001)),
            (&ipp, d(Verdict::Allowed, 7, 1_000)),
        ];
        let (policy, state) = headers(&decided, true);
        // 10 tokens at 3/s fill in 3.34 s: w rounds up to 4.
        assert_eq!(policy, "\"buy-user\";q=5;w=10, \"buy-ip\";q=10;w=4");
        // The allowing policy was refunded its cost of 2.
        assert_eq!(state, "\"buy-user\";r=0;t=10, \"buy-ip\";r=9;t=1");
    }

    #[test]
    fn peer_is_the_client_unless_it_is_a_trusted_proxy() {
        let h = xff(&["6.6.6.6"]);
        assert_eq!(
            forwarded_client(ip("1.2.3.4"), h.iter(), &[]),
            ip("1.2.3.4")
        );
        let trusted = [ip("10.0.0.1"), ip("10.0.0.2")];
        assert_eq!(
            forwarded_client(ip("1.2.3.4"), h.iter(), &trusted),
            ip("1.2.3.4"),
            "an untrusted peer's X-Forwarded-For is ignored"
        );
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), h.iter(), &trusted),
            ip("6.6.6.6")
        );
    }

    #[test]
    fn rightmost_untrusted_hop_wins() {
        let trusted = [ip("10.0.0.1"), ip("10.0.0.2")];
        // The client forged the first hop; our two proxies appended the rest.
        let h = xff(&["1.1.1.1, 203.0.113.9", "10.0.0.2"]);
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), h.iter(), &trusted),
            ip("203.0.113.9")
        );
        let h = xff(&["[2001:db8::7]:443, 203.0.113.9:5555"]);
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), h.iter(), &trusted),
            ip("203.0.113.9")
        );
        // Garbage stops the walk at the nearest trusted hop.
        let h = xff(&["8.8.8.8, {evil}, 10.0.0.2"]);
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), h.iter(), &trusted),
            ip("10.0.0.2")
        );
        // Only trusted hops: the leftmost one.
        let h = xff(&["10.0.0.2"]);
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), h.iter(), &trusted),
            ip("10.0.0.2")
        );
        // No header: the peer.
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), std::iter::empty(), &trusted),
            ip("10.0.0.1")
        );
        // IPv4-mapped IPv6 peers match IPv4 proxies.
        let h = xff(&["198.51.100.1"]);
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), h.iter(), &[ip("::ffff:10.0.0.1")]),
            ip("198.51.100.1")
        );
    }

    #[test]
    fn subjects_are_canonical_and_ipv6_counts_per_64() {
        assert_eq!(ip_subject(ip("203.0.113.9")), "203.0.113.9");
        assert_eq!(ip_subject(ip("::ffff:203.0.113.9")), "203.0.113.9");
        assert_eq!(
            ip_subject(ip("2001:db8:aa:bb:1:2:3:4")),
            "2001:db8:aa:bb::/64"
        );
        assert_eq!(
            ip_subject(ip("2001:db8:aa:bb:ffff::1")),
            ip_subject(ip("2001:db8:aa:bb::9"))
        );
    }
}
