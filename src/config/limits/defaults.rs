//! The default policies, and the `[limits]` section when none is given.

use super::algorithm::AlgorithmName;
use super::{LimitsConfig, PolicyConfig, Route, Subject};

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            enabled: true,
            timeout_ms: 1000,
            policies: default_policies(),
        }
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
/// - per network (IPv4 /24, IPv6 /56), sliding counters sized far above what a
///   household or an office behind one network does, against a rack of
///   neighbouring addresses: sign-up 60 per 10 minutes, joining a waiting room
///   300 a minute (each account joins once), entering a draw 300 a minute, voting
///   300 per 10 s (five times an address's 60), signing in 120 a minute (a guesser
///   with a /56 of IPv6 would otherwise try 256 networks' 10 a minute each).
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
            "signin-subnet",
            Route::Signin,
            Subject::Subnet,
            SlidingCounter,
            120,
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
        window(
            "signup-subnet",
            Route::Signup,
            Subject::Subnet,
            SlidingCounter,
            60,
            600_000,
        ),
        window(
            "join-subnet",
            Route::Join,
            Subject::Subnet,
            SlidingCounter,
            300,
            60_000,
        ),
        window(
            "entry-subnet",
            Route::Entry,
            Subject::Subnet,
            SlidingCounter,
            300,
            60_000,
        ),
        window(
            "vote-subnet",
            Route::Vote,
            Subject::Subnet,
            SlidingCounter,
            300,
            10_000,
        ),
    ]
}
