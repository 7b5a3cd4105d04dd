//! How a configuration shows in a log: secrets redacted, durations in their keys' units.

use super::{Config, redact_url};

/// Secrets redacted; durations as in [`SettleConfig`]'s.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("metrics_listen", &self.metrics_listen)
            .field(
                "metrics_token",
                &self.metrics_token.as_ref().map(|_| "<redacted>"),
            )
            .field("database_url", &redact_url(&self.database_url))
            .field("redis_url", &redact_url(&self.redis_url))
            .field(
                "redis_cluster",
                &self
                    .redis_cluster
                    .iter()
                    .map(|u| redact_url(u))
                    .collect::<Vec<_>>(),
            )
            .field("redis_namespace", &self.redis_namespace)
            .field("token_secret", &"<redacted>")
            .field("token_ttl_secs", &self.token_ttl.as_secs())
            .field("session_sync_ms", &self.session_sync.as_millis())
            .field("live_interval_ms", &self.live_interval.as_millis())
            .field("cookie_secure", &self.cookie_secure)
            .field("max_body_bytes", &self.max_body_bytes)
            .field(
                "client_request_timeout_ms",
                &self.client_request_timeout.as_millis(),
            )
            .field("body_timeout_ms", &self.body_timeout.as_millis())
            .field("keep_alive_secs", &self.keep_alive.as_secs())
            .field("max_connections", &self.max_connections)
            .field("max_streams_per_client", &self.max_streams_per_client)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("sold_out_cache_ms", &self.sold_out_cache.as_millis())
            .field("purchase_key_ttl_secs", &self.purchase_key_ttl.as_secs())
            .field("settle_in_serve", &self.settle_in_serve)
            .field("drain_ms", &self.drain.as_millis())
            .field("settle", &self.settle)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("limits", &self.limits)
            .field("admin_username", &self.admin_username)
            .field("database_max_connections", &self.database_max_connections)
            .field(
                "database_acquire_timeout_ms",
                &self.database_acquire_timeout.as_millis(),
            )
            .field(
                "database_statement_timeout_ms",
                &self.database_statement_timeout.as_millis(),
            )
            .field(
                "redis_response_timeout_ms",
                &self.redis_response_timeout.as_millis(),
            )
            .field("replica_acks", &self.replica_acks)
            .field(
                "replica_ack_timeout_ms",
                &self.replica_ack_timeout.as_millis(),
            )
            .field("workers", &self.workers)
            .field("sweep_ms", &self.sweep.as_millis())
            .field("expire_ms", &self.expire.as_millis())
            .field("queue_admission_ms", &self.queue_admission.as_millis())
            .field("draw_claim_max_ms", &self.draw_claim_max.as_millis())
            .field("batch_max", &self.batch_max)
            .field("batch_in_flight", &self.batch_in_flight())
            .finish_non_exhaustive()
    }
}
