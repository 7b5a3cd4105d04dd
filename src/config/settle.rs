//! The settlement worker's settings (`[settle]`).

use std::time::Duration;

use serde::Deserialize;

use super::units;

#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SettleConfig {
    /// Most rows (orders, votes) written to Postgres in one transaction: whole
    /// stream entries up to it, at least one.
    pub batch_size: usize,
    /// How long one blocking read waits for new entries after a read that gave
    /// some; after empty ones, up to five times this (at most 5 s, and a quarter of
    /// `claim_idle_ms`).
    #[serde(rename = "block_ms", with = "units::millis")]
    pub block: Duration,
    /// How long the worker waits before its next read after a batch that took
    /// every new entry there was (none left behind a full read): during a storm,
    /// fewer and fuller transactions, each one `XREADGROUP` and one
    /// acknowledgement in Redis and one commit in Postgres, for this much more
    /// time from a 202 to its row. A read that may have left entries (one that
    /// filled its count or its batch) is followed at once, so settlement never
    /// falls behind for it. 0: read again at once.
    #[serde(rename = "linger_ms", with = "units::millis")]
    pub linger: Duration,
    /// Entries pending longer than this are taken over from a dead consumer.
    #[serde(rename = "claim_idle_ms", with = "units::millis")]
    pub claim_idle: Duration,
    /// Consumer name inside the group; defaults to host and process id.
    pub consumer: Option<String>,
    /// One running worker settles at a time (the others stand by, and one takes
    /// over within seconds when it stops): workers that read the same streams side
    /// by side split each storm into small transactions, which cost Postgres and
    /// Redis more per order (see `src/settle/lease.rs`). `false`: every worker
    /// reads, for a database that gains from parallel inserts.
    pub exclusive: bool,
    /// How long one batch's transaction may wait for Postgres before the worker
    /// gives up on its connection (closed, never returned to the pool) and writes
    /// the batch again on another: a connection whose peer vanished without a reset
    /// (a failover, a dropped route) never answers, and would hold settlement for
    /// ever. A batch written twice is settled once (the rows already there are
    /// skipped). Longer than any lock wait worth waiting out in one go.
    #[serde(rename = "write_timeout_ms", with = "units::millis")]
    pub write_timeout: Duration,
}

impl Default for SettleConfig {
    fn default() -> Self {
        Self {
            batch_size: 2000,
            block: Duration::from_millis(1000),
            linger: Duration::from_millis(10),
            claim_idle: Duration::from_millis(30_000),
            consumer: None,
            exclusive: true,
            write_timeout: Duration::from_millis(30_000),
        }
    }
}

/// Durations show under their keys, in the keys' units (`sweep_ms: 2000`).
impl std::fmt::Debug for SettleConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SettleConfig")
            .field("batch_size", &self.batch_size)
            .field("block_ms", &self.block.as_millis())
            .field("linger_ms", &self.linger.as_millis())
            .field("claim_idle_ms", &self.claim_idle.as_millis())
            .field("consumer", &self.consumer)
            .field("exclusive", &self.exclusive)
            .field("write_timeout_ms", &self.write_timeout.as_millis())
            .finish()
    }
}
