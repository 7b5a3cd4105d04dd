//! What an operator does to a Redis Cluster by hand, for scenario 7 of issue 53
//! (`net_cluster.rs`): move one slot to another primary the way
//! `redis-cli --cluster reshard` does (`CLUSTER SETSLOT ... IMPORTING/MIGRATING`,
//! `MIGRATE` of its keys in batches, `CLUSTER SETSLOT ... NODE` on every primary),
//! and wait for a replica's promotion.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use redis::Value;

use crate::harness::Cluster;

/// `CLUSTER MYID` of node `node`.
pub async fn node_id(cluster: &Cluster, node: usize) -> String {
    cluster
        .query(node, redis::cmd("CLUSTER").arg("MYID"))
        .await
        .expect("CLUSTER MYID")
}

/// The slot of `key`.
pub async fn keyslot(cluster: &Cluster, node: usize, key: &str) -> i64 {
    cluster
        .query(node, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
        .await
        .expect("CLUSTER KEYSLOT")
}

/// What [`migrate_slot`] did.
#[derive(Debug, Default)]
pub struct Migration {
    /// Keys moved.
    pub keys: usize,
    /// `MIGRATE` calls made.
    pub batches: usize,
    /// When the first key left the source, and when every node was told the new
    /// owner (`SETSLOT NODE` on the last primary).
    pub started: Option<Instant>,
    pub ended: Option<Instant>,
}

/// `cmd` on `node`, failing the test with `what` on an error (or no answer).
async fn must(cluster: &Cluster, node: usize, cmd: &redis::Cmd, what: &str) -> Value {
    let mut conn = crate::harness::connect_within_a_second(&cluster.nodes[node].url())
        .await
        .unwrap_or_else(|| panic!("{what}: node {node} does not answer"));
    let answer: redis::RedisResult<Value> =
        tokio::time::timeout(Duration::from_secs(10), cmd.query_async(&mut conn))
            .await
            .unwrap_or_else(|_| panic!("{what}: node {node} took over 10 s"));
    match answer {
        Ok(Value::ServerError(e)) => panic!("{what} on node {node}: {e:?}"),
        Ok(v) => v,
        Err(e) => panic!("{what} on node {node}: {e}"),
    }
}

/// Moves `slot` from primary `from` to primary `to` while clients use it: the
/// target imports, the source migrates, then its keys go `batch` at a time with
/// `pause` between the `MIGRATE`s (keys already moved answer `ASK`, a script whose
/// keys are split between the two `TRYAGAIN`), then every primary is told the new
/// owner (the target first, then the source, then the rest: clients meet `MOVED`).
pub async fn migrate_slot(
    cluster: &Cluster,
    slot: i64,
    (from, to): (usize, usize),
    batch: usize,
    pause: Duration,
) -> Migration {
    let (from_id, to_id) = (node_id(cluster, from).await, node_id(cluster, to).await);
    let setslot = |state: &str, id: &str| {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SETSLOT").arg(slot).arg(state).arg(id);
        cmd
    };
    must(cluster, to, &setslot("IMPORTING", &from_id), "IMPORTING").await;
    must(cluster, from, &setslot("MIGRATING", &to_id), "MIGRATING").await;
    let mut done = Migration::default();
    let port = cluster.nodes[to].port;
    loop {
        let keys: Vec<String> = redis::from_redis_value(
            must(
                cluster,
                from,
                redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(batch),
                "GETKEYSINSLOT",
            )
            .await,
        )
        .expect("keys");
        if keys.is_empty() {
            break;
        }
        done.started.get_or_insert_with(Instant::now);
        let mut migrate = redis::cmd("MIGRATE");
        migrate
            .arg("127.0.0.1")
            .arg(port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys);
        must(cluster, from, &migrate, "MIGRATE").await;
        done.keys += keys.len();
        done.batches += 1;
        tokio::time::sleep(pause).await;
    }
    let owner = setslot("NODE", &to_id);
    must(cluster, to, &owner, "SETSLOT NODE (target)").await;
    must(cluster, from, &owner, "SETSLOT NODE (source)").await;
    for shard in cluster.shards().await {
        if shard.primary != to && shard.primary != from {
            must(cluster, shard.primary, &owner, "SETSLOT NODE (others)").await;
        }
    }
    done.ended = Some(Instant::now());
    done
}

/// Waits until node `node` says `role:master`; the moment it did.
pub async fn wait_promoted(cluster: &Cluster, node: usize, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        let info: Option<String> = cluster
            .query(node, redis::cmd("INFO").arg("replication"))
            .await;
        if info.is_some_and(|i| i.lines().any(|l| l.trim() == "role:master")) {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "node {node} was not promoted within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The primary that owns `slot` now, as node `asked` sees it (`CLUSTER SLOTS`).
pub async fn owner_of(cluster: &Cluster, asked: usize, slot: i64) -> Option<usize> {
    let ranges: Vec<Vec<Value>> = cluster
        .query(asked, redis::cmd("CLUSTER").arg("SLOTS"))
        .await?;
    for range in ranges {
        let (Some(start), Some(end), Some(Value::Array(owner))) =
            (range.first(), range.get(1), range.get(2))
        else {
            continue;
        };
        let start: i64 = redis::from_redis_value(start.clone()).ok()?;
        let end: i64 = redis::from_redis_value(end.clone()).ok()?;
        if (start..=end).contains(&slot) {
            let port: i64 = redis::from_redis_value(owner.get(1)?.clone()).ok()?;
            return cluster.index_of_port(port as u16);
        }
    }
    None
}
