//! The limiting algorithms, by name as written and checked with their parameters.

use serde::Deserialize;

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

    /// Whether a request's reset after a take depends on its subject's state (the
    /// token bucket's: the time its bucket takes to fill again). Every other
    /// algorithm's is the same for every request a batch script takes at one time,
    /// so the script sends it once per batch (`limits_batch_resets` in
    /// `lua/lib/limits.lua`), not per request.
    pub fn reset_per_item(&self) -> bool {
        matches!(self, Algorithm::TokenBucket { .. })
    }

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
