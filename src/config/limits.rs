//! Rate-limit policies: the `[limits]` section of the configuration as written
//! (flat, every field optional) and the validated [`Policy`] the limiter runs.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

/// Longest window accepted; anything longer is almost surely a typo.
const MAX_WINDOW_MS: u64 = 30 * 24 * 3600 * 1000;
/// Largest limit of any policy.
const MAX_LIMIT: u64 = 1_000_000;
/// A sliding log keeps one entry per counted request, and every check reads them
/// all (lua/lib/limit_sliding_log.lua): above this, use the counter.
const MAX_LOG_LIMIT: u64 = 1_000;

/// An endpoint that a policy guards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    Buy,
    /// `POST /api/sales/{id}/ticket`: the purchase ticket.
    Ticket,
    Vote,
    Signin,
    Signup,
}

impl Route {
    pub const ALL: [Route; 5] = [
        Route::Buy,
        Route::Ticket,
        Route::Vote,
        Route::Signin,
        Route::Signup,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Route::Buy => "buy",
            Route::Ticket => "ticket",
            Route::Vote => "vote",
            Route::Signin => "signin",
            Route::Signup => "signup",
        }
    }

    /// Signed-in routes: a policy per user makes sense there only.
    pub fn has_user(self) -> bool {
        matches!(self, Route::Buy | Route::Ticket | Route::Vote)
    }

    /// Without Redis a purchase or vote cannot be decided anyway, so their limits
    /// fail closed; sign-in and sign-up need only Postgres, and locking everyone
    /// out during a Redis blip is worse than argon2-paced guessing for that time.
    fn default_fail_open(self) -> bool {
        !self.has_user()
    }
}

/// Whom a policy counts: the signed-in user or the client IP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Subject {
    User,
    Ip,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlgorithmName {
    FixedWindow,
    SlidingLog,
    SlidingCounter,
    TokenBucket,
}

/// An algorithm with its parameters, checked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Algorithm {
    FixedWindow {
        limit: u64,
        window_ms: u64,
    },
    SlidingLog {
        limit: u64,
        window_ms: u64,
    },
    SlidingCounter {
        limit: u64,
        window_ms: u64,
    },
    TokenBucket {
        capacity: u64,
        refill_per_sec: f64,
        cost: u64,
    },
}

impl Algorithm {
    /// The quota `q` of the `RateLimit-Policy` header: requests (or tokens) per window.
    pub fn quota(&self) -> u64 {
        match *self {
            Algorithm::FixedWindow { limit, .. }
            | Algorithm::SlidingLog { limit, .. }
            | Algorithm::SlidingCounter { limit, .. } => limit,
            Algorithm::TokenBucket { capacity, .. } => capacity,
        }
    }

    /// The window `w` of the `RateLimit-Policy` header, in ms. For a token bucket,
    /// the time an empty bucket takes to fill.
    pub fn window_ms(&self) -> u64 {
        match *self {
            Algorithm::FixedWindow { window_ms, .. }
            | Algorithm::SlidingLog { window_ms, .. }
            | Algorithm::SlidingCounter { window_ms, .. } => window_ms,
            Algorithm::TokenBucket {
                capacity,
                refill_per_sec,
                ..
            } => (capacity as f64 * 1000.0 / refill_per_sec).ceil() as u64,
        }
    }

    /// What one request counts against the quota.
    /// How the decision scripts name this algorithm and its parameters
    /// (`lua/lib/limits.lua`): code, then a, b, c.
    pub fn lua_args(&self) -> (&'static str, String, String, String) {
        match *self {
            Algorithm::FixedWindow { limit, window_ms } => {
                ("fw", limit.to_string(), window_ms.to_string(), "0".into())
            }
            Algorithm::SlidingLog { limit, window_ms } => {
                ("sl", limit.to_string(), window_ms.to_string(), "0".into())
            }
            Algorithm::SlidingCounter { limit, window_ms } => {
                ("sc", limit.to_string(), window_ms.to_string(), "0".into())
            }
            Algorithm::TokenBucket {
                capacity,
                refill_per_sec,
                cost,
            } => (
                "tb",
                capacity.to_string(),
                refill_per_sec.to_string(),
                cost.to_string(),
            ),
        }
    }

    pub fn cost(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket { cost, .. } => cost,
            _ => 1,
        }
    }
}

/// One checked policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// Goes into Redis keys and headers: `[a-z0-9_-]`, 1 to 48 characters.
    pub name: String,
    pub route: Route,
    pub subject: Subject,
    pub algorithm: Algorithm,
    /// When Redis cannot be reached: let the request through (true) or answer 503.
    pub fail_open: bool,
}

/// A policy as written in the configuration. Window algorithms take `limit` and
/// `window_ms`; the token bucket takes `capacity`, `refill_per_sec` and `cost`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    pub name: String,
    pub route: Route,
    pub subject: Subject,
    pub algorithm: AlgorithmName,
    #[serde(default)]
    pub limit: Option<u64>,
    #[serde(default)]
    pub window_ms: Option<u64>,
    #[serde(default)]
    pub capacity: Option<u64>,
    #[serde(default)]
    pub refill_per_sec: Option<f64>,
    #[serde(default)]
    pub cost: Option<u64>,
    /// Default: closed (503) for buy and vote, open for sign-in and sign-up.
    #[serde(default)]
    pub fail_open: Option<bool>,
}

/// The `[limits]` section. Giving `[[limits.policies]]` replaces all the defaults.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// `STAMPEDE_LIMITS=off` turns every limit off (for benchmarks and load tests).
    pub enabled: bool,
    /// Longest a limit check waits for Redis before it counts as unreachable.
    pub timeout_ms: u64,
    pub policies: Vec<PolicyConfig>,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            enabled: true,
            timeout_ms: 1000,
            policies: default_policies(),
        }
    }
}

impl LimitsConfig {
    pub fn off() -> Self {
        LimitsConfig {
            enabled: false,
            ..LimitsConfig::default()
        }
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// Checks every policy; the error names the policy and the field.
    pub fn policies(&self) -> Result<Vec<Policy>, String> {
        if !(1..=60_000).contains(&self.timeout_ms) {
            return Err("limits.timeout_ms must be 1 to 60000".into());
        }
        let mut out: Vec<Policy> = Vec::with_capacity(self.policies.len());
        for raw in &self.policies {
            let policy = raw.check()?;
            if out.iter().any(|p| p.name == policy.name) {
                return Err(format!(
                    "limits: two policies are named {:?}; names must be unique",
                    policy.name
                ));
            }
            out.push(policy);
        }
        Ok(out)
    }
}

fn window(
    name: &str,
    route: Route,
    subject: Subject,
    algorithm: AlgorithmName,
    limit: u64,
    window_ms: u64,
) -> PolicyConfig {
    PolicyConfig {
        name: name.into(),
        route,
        subject,
        algorithm,
        limit: Some(limit),
        window_ms: Some(window_ms),
        capacity: None,
        refill_per_sec: None,
        cost: None,
        fail_open: None,
    }
}

/// The defaults, reasoned in `docs/rate-limits.md`:
/// - buy and vote, per user: sliding log, 5 per 10 s. A person clicks a few times
///   (one purchase per sale is enforced anyway); a script clicks hundreds. The log
///   is exact and holds at most 5 entries per user.
/// - buy and vote, per IP: sliding counter, 60 per 10 s. Catches many accounts
///   behind one address while leaving room for a household or office behind one
///   NAT. The counter's memory is constant per address, which matters because
///   addresses are the attacker's to choose.
/// - ticket, per user: sliding log, 10 per 10 s (the page asks for one per click,
///   and once more when one expired on the way); per IP: sliding counter, 120 per
///   10 s. A bot polling for the opening is cut off; a person never notices.
/// - sign-in and sign-up, per IP: sliding log, 10 per minute, against password
///   guessing and account farming; argon2 makes each attempt cost CPU too.
pub fn default_policies() -> Vec<PolicyConfig> {
    use AlgorithmName::{SlidingCounter, SlidingLog};
    vec![
        window("buy-user", Route::Buy, Subject::User, SlidingLog, 5, 10_000),
        window(
            "buy-ip",
            Route::Buy,
            Subject::Ip,
            SlidingCounter,
            60,
            10_000,
        ),
        window(
            "ticket-user",
            Route::Ticket,
            Subject::User,
            SlidingLog,
            10,
            10_000,
        ),
        window(
            "ticket-ip",
            Route::Ticket,
            Subject::Ip,
            SlidingCounter,
            120,
            10_000,
        ),
        window(
            "vote-user",
            Route::Vote,
            Subject::User,
            SlidingLog,
            5,
            10_000,
        ),
        window(
            "vote-ip",
            Route::Vote,
            Subject::Ip,
            SlidingCounter,
            60,
            10_000,
        ),
        window(
            "signin-ip",
            Route::Signin,
            Subject::Ip,
            SlidingLog,
            10,
            60_000,
        ),
        window(
            "signup-ip",
            Route::Signup,
            Subject::Ip,
            SlidingLog,
            10,
            60_000,
        ),
    ]
}

impl PolicyConfig {
    pub fn check(&self) -> Result<Policy, String> {
        let name = &self.name;
        let err = |msg: String| format!("limits policy {name:?}: {msg}");
        if name.is_empty()
            || name.len() > 48
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        {
            return Err(format!(
                "limits policy name {name:?} must be 1 to 48 characters of [a-z0-9_-]"
            ));
        }
        if self.subject == Subject::User && !self.route.has_user() {
            return Err(err(format!(
                "route {} has no signed-in user; use subject = \"ip\"",
                self.route.as_str()
            )));
        }
        let algorithm = match self.algorithm {
            AlgorithmName::TokenBucket => self.token_bucket().map_err(err)?,
            windowed => self.windowed(windowed).map_err(err)?,
        };
        Ok(Policy {
            name: name.clone(),
            route: self.route,
            subject: self.subject,
            algorithm,
            fail_open: self
                .fail_open
                .unwrap_or_else(|| self.route.default_fail_open()),
        })
    }

    fn windowed(&self, which: AlgorithmName) -> Result<Algorithm, String> {
        if self.capacity.is_some() || self.refill_per_sec.is_some() || self.cost.is_some() {
            return Err("capacity, refill_per_sec and cost belong to token_bucket; \
                 window algorithms take limit and window_ms"
                .into());
        }
        let (Some(limit), Some(window_ms)) = (self.limit, self.window_ms) else {
            return Err("needs limit and window_ms".into());
        };
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(format!("limit must be 1 to {MAX_LIMIT}"));
        }
        if !(1..=MAX_WINDOW_MS).contains(&window_ms) {
            return Err(format!("window_ms must be 1 to {MAX_WINDOW_MS}"));
        }
        Ok(match which {
            AlgorithmName::FixedWindow => Algorithm::FixedWindow { limit, window_ms },
            AlgorithmName::SlidingCounter => Algorithm::SlidingCounter { limit, window_ms },
            AlgorithmName::SlidingLog if limit > MAX_LOG_LIMIT => {
                return Err(format!(
                    "a sliding_log keeps one entry per request: limit must be at most \
                     {MAX_LOG_LIMIT} (use sliding_counter for more)"
                ));
            }
            AlgorithmName::SlidingLog => Algorithm::SlidingLog { limit, window_ms },
            AlgorithmName::TokenBucket => unreachable!("handled by token_bucket()"),
        })
    }

    fn token_bucket(&self) -> Result<Algorithm, String> {
        if self.limit.is_some() || self.window_ms.is_some() {
            return Err("token_bucket takes capacity, refill_per_sec and cost, \
                 not limit and window_ms"
                .into());
        }
        let (Some(capacity), Some(refill_per_sec)) = (self.capacity, self.refill_per_sec) else {
            return Err("token_bucket needs capacity and refill_per_sec".into());
        };
        let cost = self.cost.unwrap_or(1);
        if !(1..=MAX_LIMIT).contains(&capacity) {
            return Err(format!("capacity must be 1 to {MAX_LIMIT}"));
        }
        if !(refill_per_sec.is_finite() && refill_per_sec > 0.0) {
            return Err("refill_per_sec must be a positive number".into());
        }
        // Slower than one token per 30 days is surely a typo (and would overflow the TTL maths).
        if capacity as f64 * 1000.0 / refill_per_sec > MAX_WINDOW_MS as f64 {
            return Err("the bucket would take more than 30 days to fill".into());
        }
        if !(1..=capacity).contains(&cost) {
            return Err(format!(
                "cost must be 1 to capacity ({capacity}); a larger cost could never be paid"
            ));
        }
        Ok(Algorithm::TokenBucket {
            capacity,
            refill_per_sec,
            cost,
        })
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Wrapper {
        limits: LimitsConfig,
    }

    fn parse(toml_text: &str) -> Result<Vec<Policy>, String> {
        let w: Wrapper = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        w.limits.policies()
    }

    #[test]
    fn defaults_are_valid_and_cover_every_route() {
        let policies = LimitsConfig::default().policies().unwrap();
        for route in Route::ALL {
            assert!(policies.iter().any(|p| p.route == route), "{route}");
        }
        let buy: Vec<_> = policies.iter().filter(|p| p.route == Route::Buy).collect();
        assert_eq!(buy.len(), 2);
        assert!(buy.iter().all(|p| !p.fail_open), "buy fails closed");
        assert!(
            policies
                .iter()
                .filter(|p| p.route == Route::Signin)
                .all(|p| p.fail_open && p.subject == Subject::Ip)
        );
    }

    #[test]
    fn parses_every_algorithm() {
        let policies = parse(
            r#"
            [limits]
            timeout_ms = 200
            [[limits.policies]]
            name = "a"
            route = "buy"
            subject = "user"
            algorithm = "fixed_window"
            limit = 3
            window_ms = 1000
            [[limits.policies]]
            name = "b"
            route = "buy"
            subject = "ip"
            algorithm = "sliding_counter"
            limit = 30
            window_ms = 1000
            fail_open = true
            [[limits.policies]]
            name = "c"
            route = "signin"
            subject = "ip"
            algorithm = "token_bucket"
            capacity = 10
            refill_per_sec = 0.5
            cost = 2
            [[limits.policies]]
            name = "d"
            route = "vote"
            subject = "ip"
            algorithm = "sliding_log"
            limit = 5
            window_ms = 10000
            "#,
        )
        .unwrap();
        assert_eq!(policies.len(), 4);
        assert_eq!(
            policies[0].algorithm,
            Algorithm::FixedWindow {
                limit: 3,
                window_ms: 1000
            }
        );
        assert!(!policies[0].fail_open);
        assert!(policies[1].fail_open);
        assert_eq!(
            policies[2].algorithm,
            Algorithm::TokenBucket {
                capacity: 10,
                refill_per_sec: 0.5,
                cost: 2
            }
        );
        assert_eq!(policies[2].algorithm.window_ms(), 20_000);
        assert!(policies[2].fail_open, "sign-in fails open by default");
        assert_eq!(policies[3].algorithm.quota(), 5);
    }

    #[test]
    fn refuses_bad_policies_with_a_reason() {
        let one = |body: &str| {
            parse(&format!(
                "[[limits.policies]]\nname = \"p\"\nroute = \"buy\"\nsubject = \"ip\"\n{body}"
            ))
            .unwrap_err()
        };
        assert!(one("algorithm = \"sliding_log\"\nlimit = 5").contains("window_ms"));
        assert!(one("algorithm = \"sliding_log\"\nlimit = 0\nwindow_ms = 10").contains("limit"));
        assert!(
            one("algorithm = \"sliding_log\"\nlimit = 20000\nwindow_ms = 10")
                .contains("sliding_counter")
        );
        assert!(
            one("algorithm = \"token_bucket\"\ncapacity = 5\nrefill_per_sec = 1\ncost = 6")
                .contains("never")
        );
        assert!(
            one("algorithm = \"token_bucket\"\ncapacity = 5\nrefill_per_sec = 0")
                .contains("positive")
        );
        assert!(
            one("algorithm = \"fixed_window\"\nlimit = 5\nwindow_ms = 10\ncost = 2")
                .contains("token_bucket")
        );
        assert!(one("algorithm = \"leaky\"").contains("unknown variant"));
        assert!(one("algorithm = \"fixed_window\"\nlimt = 5").contains("unknown field"));
        let signin_user = parse(
            "[[limits.policies]]\nname = \"p\"\nroute = \"signin\"\nsubject = \"user\"\n\
             algorithm = \"fixed_window\"\nlimit = 1\nwindow_ms = 1",
        )
        .unwrap_err();
        assert!(signin_user.contains("no signed-in user"), "{signin_user}");
        let bad_name = parse(
            "[[limits.policies]]\nname = \"a{b}\"\nroute = \"buy\"\nsubject = \"ip\"\n\
             algorithm = \"fixed_window\"\nlimit = 1\nwindow_ms = 1",
        )
        .unwrap_err();
        assert!(bad_name.contains("[a-z0-9_-]"), "{bad_name}");
    }

    #[test]
    fn duplicate_names_are_refused() {
        let mut c = LimitsConfig::default();
        c.policies.push(c.policies[0].clone());
        assert!(c.policies().unwrap_err().contains("unique"));
    }
}
