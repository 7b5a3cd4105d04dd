//! A policy as written, checked into the [`Policy`] the limiter runs.

use super::algorithm::{Algorithm, AlgorithmName};
use super::{Policy, PolicyConfig, Subject};

/// Longest window accepted; anything longer is almost surely a typo.
const MAX_WINDOW_MS: u64 = 30 * 24 * 3600 * 1000;
/// Largest limit of any policy.
const MAX_LIMIT: u64 = 1_000_000;
/// A sliding log keeps one entry per counted request, and every check reads them
/// all (lua/lib/limit_sliding_log.lua): above this, use the counter.
const MAX_LOG_LIMIT: u64 = 1_000;

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
