//! Redis Cluster: a connection that never resends (an HTTP worker's, which sends
//! the decisions) still follows a slot that moved since its last command. A node
//! answers `MOVED` before it runs anything, so the command is sent again (at most
//! `MOVED_RETRIES` times) while redis-rs refreshes its slot map; before, such a
//! connection's first command after a move was an error (a 503 on a request).
//! The slot moves while the connection sits idle, so its map is certain to be the
//! old one; then one plain command, a pipeline over two slots (sent key by key)
//! and one script (`EVALSHA`, as every decision) must each answer, the script
//! having run exactly once.

use std::time::Duration;

use stampede::config::Config;
use stampede::redis_conn::Redis;
use stampede::startup::connect_worker_redis;

use crate::cluster_ops::{keyslot, migrate_slot, owner_of};
use crate::harness::{Options, Stack};

/// A connection made as an HTTP worker's is (`connect_worker_redis`: it never
/// resends).
async fn worker_connection(cluster: &crate::harness::Cluster) -> Redis {
    let config = Config {
        redis_cluster: cluster.urls().split(',').map(String::from).collect(),
        ..Config::default()
    };
    connect_worker_redis(&config)
        .await
        .expect("a cluster connection")
}

/// `SET key value` on `conn`, failing the test with `what`.
async fn set(conn: &mut Redis, key: &str, value: &str, what: &str) {
    let () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async(conn)
        .await
        .expect(what);
}

/// Moves the slot of `key` to another primary; returns the new owner.
async fn move_slot_of(cluster: &crate::harness::Cluster, key: &str) -> usize {
    let source = cluster.primary_of(key).await;
    let slot = keyslot(cluster, source, key).await;
    let target = cluster
        .shards()
        .await
        .iter()
        .map(|s| s.primary)
        .find(|&p| p != source)
        .expect("another primary");
    migrate_slot(cluster, slot, (source, target), 100, Duration::ZERO).await;
    assert_eq!(owner_of(cluster, target, slot).await, Some(target));
    assert_eq!(owner_of(cluster, source, slot).await, Some(target));
    target
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_connection_follows_a_slot_moved_while_it_was_idle() {
    let stack = Stack::start(
        "cluster-moved",
        Options {
            cluster: true,
            ..Options::default()
        },
    )
    .await;
    let cluster = stack.cluster.as_ref().unwrap();
    let mut conn = worker_connection(cluster).await;

    // A plain command.
    let key = "{moved-a}:k";
    set(&mut conn, key, "before", "SET before the move").await;
    let to = move_slot_of(cluster, key).await;
    let got: redis::RedisResult<String> = redis::cmd("GET").arg(key).query_async(&mut conn).await;
    assert_eq!(
        got.expect("GET on the connection whose map predates the move"),
        "before",
        "the key, now on node {to}"
    );

    // A pipeline of keys of several slots (a list page's reads) goes key by key:
    // each command follows the move too.
    let other = "{moved-c}:k";
    set(
        &mut conn,
        other,
        "elsewhere",
        "SET of a key of another slot",
    )
    .await;
    let key = "{moved-d}:k";
    set(&mut conn, key, "before", "SET before the move").await;
    move_slot_of(cluster, key).await;
    let mut reads = redis::pipe();
    reads.get(other).get(key);
    let got: redis::RedisResult<(String, String)> = reads.query_async(&mut conn).await;
    assert_eq!(
        got.expect("a pipeline over two slots, one of them moved"),
        ("elsewhere".to_string(), "before".to_string())
    );

    // A script, as a decision is sent: it runs once, on the new owner.
    let key = "{moved-b}:n";
    let incr = redis::Script::new("return redis.call('INCR', KEYS[1])");
    let first: i64 = incr
        .key(key)
        .invoke_async(&mut conn)
        .await
        .expect("the script before the move");
    assert_eq!(first, 1);
    move_slot_of(cluster, key).await;
    let second: redis::RedisResult<i64> = incr.key(key).invoke_async(&mut conn).await;
    assert_eq!(
        second.expect("the script on the connection whose map predates the move"),
        2,
        "the script ran exactly once more"
    );
    let on_a_fresh_connection: i64 = redis::cmd("GET")
        .arg(key)
        .query_async(&mut worker_connection(cluster).await)
        .await
        .expect("GET on a fresh connection");
    assert_eq!(on_a_fresh_connection, 2, "one INCR per call, none twice");
}
