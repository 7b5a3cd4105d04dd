//! Idle connections made whole after a Redis fault, before a request finds them
//! broken.
//!
//! A node connection (redis-rs's `ConnectionManager` over RESP2) learns that
//! its socket is gone only when a command fails on it; the command's caller gets
//! the error (a 503) and the reconnection starts then. A worker whose connection
//! was idle while Redis's link reset (no request of its own during the fault) would
//! thus answer 503 to its first request after the fault had healed, seconds later.
//! So a batch that fails `redis_unavailable`, or `/readyz` finding Redis
//! unanswering, calls [`trouble`]; each worker's [`watch`] then `PING`s its own connections
//! every [`PING_EVERY`], which reconnects a broken one in the background (and
//! has a dead one replaced: see `node.rs`), until
//! they have answered [`HEALTHY_PINGS`] times in a row. An idle server has no
//! trouble and sends nothing: no timer runs while nothing failed.

use std::sync::LazyLock;
use std::time::Duration;

use tokio::sync::Notify;

use super::Redis;

/// How often a worker `PING`s its connections after trouble.
pub const PING_EVERY: Duration = Duration::from_millis(250);
/// `PING`s answered in a row that end the watch (2 s).
pub const HEALTHY_PINGS: u32 = 8;

static TROUBLE: LazyLock<Notify> = LazyLock::new(Notify::new);

/// Redis failed somewhere in this process: every worker checks its connections.
pub fn trouble() {
    TROUBLE.notify_waiters();
}

/// A worker's watch over its own connections (runs on the worker's thread for
/// as long as the worker).
pub async fn watch(connections: Vec<Redis>) {
    loop {
        TROUBLE.notified().await;
        let mut healthy = 0;
        while healthy < HEALTHY_PINGS {
            tokio::time::sleep(PING_EVERY).await;
            let mut all = true;
            for connection in &connections {
                let mut connection = connection.clone();
                let answered: redis::RedisResult<()> =
                    redis::cmd("PING").query_async(&mut connection).await;
                all &= answered.is_ok();
            }
            healthy = if all { healthy + 1 } else { 0 };
        }
    }
}
