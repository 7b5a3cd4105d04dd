//! Rate-limit policies: the `[limits]` section of the configuration as written
//! (flat, every field optional) and the validated [`Policy`] the limiter runs.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

mod algorithm;
mod check;
pub mod defaults;

pub use algorithm::{Algorithm, AlgorithmName};

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
    /// `POST /api/sales/{id}/queue`: joining a waiting room's line.
    Join,
    /// `POST /api/sales/{id}/entry`: entering a draw (its route checks it).
    Entry,
}

impl Route {
    pub const ALL: [Route; 7] = [
        Route::Buy,
        Route::Ticket,
        Route::Vote,
        Route::Signin,
        Route::Signup,
        Route::Join,
        Route::Entry,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Route::Buy => "buy",
            Route::Ticket => "ticket",
            Route::Vote => "vote",
            Route::Signin => "signin",
            Route::Signup => "signup",
            Route::Join => "join",
            Route::Entry => "entry",
        }
    }

    /// Signed-in routes: a policy per user makes sense there only.
    pub fn has_user(self) -> bool {
        matches!(
            self,
            Route::Buy | Route::Ticket | Route::Vote | Route::Join | Route::Entry
        )
    }

    /// Without Redis a purchase or vote cannot be decided anyway, so their limits
    /// fail closed; sign-in and sign-up need only Postgres, and locking everyone
    /// out during a Redis blip is worse than argon2-paced guessing for that time.
    fn default_fail_open(self) -> bool {
        !self.has_user()
    }
}

/// Whom a policy counts: the signed-in user, the client IP (IPv6 by its /64), or
/// the client's network (IPv4 by its /24, IPv6 by its /56): a rack of addresses
/// shares one budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Subject {
    User,
    Ip,
    Subnet,
}

impl Subject {
    /// Counts by the client's address (its IP or its network).
    pub fn by_address(self) -> bool {
        matches!(self, Subject::Ip | Subject::Subnet)
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
                .all(|p| p.fail_open && matches!(p.subject, Subject::Ip | Subject::Subnet))
        );
    }

    #[test]
    fn the_defaults_limit_each_network_on_sign_in_sign_up_join_entry_and_vote() {
        let policies = LimitsConfig::default().policies().unwrap();
        for route in [
            Route::Signin,
            Route::Signup,
            Route::Join,
            Route::Entry,
            Route::Vote,
        ] {
            assert!(
                policies
                    .iter()
                    .any(|p| p.route == route && p.subject == Subject::Subnet),
                "{route}"
            );
        }
        let parsed = parse(
            "[[limits.policies]]\nname = \"n\"\nroute = \"join\"\nsubject = \"subnet\"\n\
             algorithm = \"sliding_counter\"\nlimit = 5\nwindow_ms = 1000",
        )
        .unwrap();
        assert_eq!(parsed[0].subject, Subject::Subnet);
        assert_eq!(parsed[0].route, Route::Join);
        assert!(!parsed[0].fail_open, "a signed-in route fails closed");
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
