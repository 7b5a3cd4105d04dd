//! Fault injection against the real binary. Each test starts its own Postgres
//! cluster, Redis server and `stampede serve` processes on free loopback ports
//! (`harness.rs`), runs a bounded storm of purchases (`storm.rs`), breaks something
//! in the middle of it (kills a server, stops Postgres, restarts, cuts back or
//! wipes Redis, races admin stock changes), and ends with the same invariants
//! (`invariants.rs`): every accepted order in Postgres once, nobody buys twice,
//! no oversell, units arithmetic exact in both stores, never a 500. Scenarios over
//! polls of ballot kinds end with those of `ballot_invariants.rs`.

/// Declares `#[tokio::test]`s that each run one scenario with its own arguments:
/// `/// doc` lines, then `test_name => scenario(args);`.
macro_rules! scenario_tests {
    ($($(#[$meta:meta])* $name:ident => $scenario:ident($($arg:expr),* $(,)?);)+) => {
        $(
            $(#[$meta])*
            #[tokio::test(flavor = "multi_thread")]
            async fn $name() {
                $scenario($($arg),*).await;
            }
        )+
    };
}

mod ballot_invariants;
#[path = "../common/bodies.rs"]
mod bodies;
mod cluster_ops;
#[path = "../common/db.rs"]
mod db;
mod harness;
mod invariants;
mod proxy;
mod storm;

mod admin_close;
mod aof_loss;
mod app_kill;
mod ballots;
mod ballots_ranked;
mod cancel_kill;
mod cluster_failover;
mod cluster_moved;
mod draws;
mod idempotent_retry;
mod limit_state;
mod live_streams;
mod net;
mod net_cluster;
mod net_idempotent;
mod net_partition;
mod net_postgres;
mod net_redis;
mod net_votes;
mod outage_wipe;
mod payment_expiry;
mod postgres_outage;
mod redis_restart;
mod redis_wipe;
mod replay_wipe;
mod stock_changes;
mod waiting_room;

/// Units of the sales of a standard storm (1,500 users): the small ones sell out
/// early, the large ones keep accepting while the fault happens, and the last one
/// has more units than users, so accepted orders keep coming whatever the timing.
pub const STOCKS: [i64; 9] = [20, 50, 100, 150, 200, 250, 300, 300, 5_000];
