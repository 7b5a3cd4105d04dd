//! The `RateLimit` and `RateLimit-Policy` headers (IETF draft), and `Retry-After`'s
//! whole seconds.

use actix_web::http::header::HeaderName;

use super::{Decision, Policy};

pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// The values of `RateLimit-Policy` and `RateLimit`: one list member per policy,
/// e.g. `"buy-user";q=5;w=10` and `"buy-user";r=4;t=10`. `t` is the time until the
/// whole quota is back. A refunded policy shows what it has after the refund.
/// Written piece by piece into two strings (every 202 and vote carries them: the
/// `format!` of each member cost about 0.3 us of a purchase).
pub(super) fn headers(decided: &[(&Policy, Decision)], refunded: bool) -> (String, String) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, Route, Subject, Verdict};

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
}
