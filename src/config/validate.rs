//! The checks of a configuration once every source has been applied.

use std::time::Duration;

use super::{Config, ConfigError, redact_url};

impl Config {
    /// Checks that only make sense once every source has been applied.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ms = Duration::from_millis;
        if self.token_secret.len() < 32 {
            return Err(ConfigError::Invalid(
                "token_secret (STAMPEDE_TOKEN_SECRET) must be at least 32 characters; \
                 scripts/run generates one into .data/env"
                    .into(),
            ));
        }
        // The example Secret's placeholders (deploy/kubernetes-examples/): a token
        // secret anyone can read signs anyone's tokens, admin's included.
        for (name, value) in [
            (
                "token_secret (STAMPEDE_TOKEN_SECRET)",
                Some(&self.token_secret),
            ),
            (
                "admin_password (STAMPEDE_ADMIN_PASSWORD)",
                self.admin_password.as_ref(),
            ),
        ] {
            if value.is_some_and(|v| v.to_ascii_lowercase().contains("change-me")) {
                return Err(ConfigError::Invalid(format!(
                    "{name} is still the example's placeholder (CHANGE-ME): set a secret \
                     of your own (`openssl rand -hex 32`)"
                )));
            }
        }
        if self.drain > ms(60_000) {
            return Err(ConfigError::Invalid(
                "drain_ms (STAMPEDE_DRAIN_MS) must be 0 to 60000".into(),
            ));
        }
        // A call of 1,024 new buyers with both limit shapes holds Redis for about 8 ms
        // (about 120,000 such decisions a second on Redis alone: BENCHMARKS.md), every
        // other client waiting.
        if !(1..=1024).contains(&self.batch_max) {
            return Err(ConfigError::Invalid(
                "batch_max (STAMPEDE_BATCH_MAX) must be 1 to 1024".into(),
            ));
        }
        if self.batch_in_flight.is_some_and(|n| !(1..=64).contains(&n)) {
            return Err(ConfigError::Invalid(
                "batch_in_flight (STAMPEDE_BATCH_IN_FLIGHT) must be 1 to 64".into(),
            ));
        }
        if !(ms(1)..=ms(60_000)).contains(&self.session_sync) {
            return Err(ConfigError::Invalid(
                "session_sync_ms (STAMPEDE_SESSION_SYNC_MS) must be 1 to 60000".into(),
            ));
        }
        if !(ms(1000)..=ms(30 * 86_400_000)).contains(&self.purchase_key_ttl) {
            return Err(ConfigError::Invalid(
                "purchase_key_ttl_secs (STAMPEDE_PURCHASE_KEY_TTL_SECS) must be 1 to 2592000"
                    .into(),
            ));
        }
        if !(ms(100)..=ms(60_000)).contains(&self.live_interval) {
            return Err(ConfigError::Invalid(
                "live_interval_ms (STAMPEDE_LIVE_INTERVAL_MS) must be 100 to 60000".into(),
            ));
        }
        if self.metrics_token.as_ref().is_some_and(|t| t.len() < 16) {
            return Err(ConfigError::Invalid(
                "metrics_token (STAMPEDE_METRICS_TOKEN) must be at least 16 characters".into(),
            ));
        }
        if self.redis_namespace.is_empty()
            || !self
                .redis_namespace
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
        {
            return Err(ConfigError::Invalid(
                "redis_namespace must be non-empty and use only [A-Za-z0-9_.:-]".into(),
            ));
        }
        if let Some(bad) = self
            .redis_cluster
            .iter()
            .find(|u| !(u.starts_with("redis://") || u.starts_with("rediss://")))
        {
            return Err(ConfigError::Invalid(format!(
                "redis_cluster (STAMPEDE_REDIS_CLUSTER) takes redis:// URLs separated by \
                 commas; got {:?}",
                redact_url(bad)
            )));
        }
        // Only when replicas are waited for: the default timeout (200 ms) would
        // otherwise refuse a response timeout of 200 ms or less that never waits.
        if self.replica_acks > 0
            && (self.replica_ack_timeout.is_zero()
                || self.replica_ack_timeout >= self.redis_response_timeout)
        {
            return Err(ConfigError::Invalid(format!(
                "replica_ack_timeout_ms (STAMPEDE_REPLICA_ACK_TIMEOUT_MS) must be 1 to \
                 {} (below redis_response_timeout_ms, or the WAIT itself times out)",
                self.redis_response_timeout.as_millis().saturating_sub(1)
            )));
        }
        if self.settle.batch_size == 0 {
            return Err(ConfigError::Invalid("settle.batch_size must be > 0".into()));
        }
        if self.settle.write_timeout < std::time::Duration::from_millis(100) {
            return Err(ConfigError::Invalid(
                "settle.write_timeout_ms (STAMPEDE_SETTLE_WRITE_TIMEOUT_MS) must be at least \
                 100: a batch's transaction needs that long on a healthy Postgres"
                    .into(),
            ));
        }
        self.limits.policies().map_err(ConfigError::Invalid)?;
        Ok(())
    }
}
