//! Scenario 1: a server killed with SIGKILL mid-storm, restarted or not.

use std::time::Duration;

use crate::STOCKS;
use crate::harness::{Options, Stack};
use crate::invariants::{AllowedLoss, assert_invariants};
use crate::storm::{Plan, Storm, purchases};

#[tokio::test(flavor = "multi_thread")]
async fn server_killed_mid_storm_and_restarted_loses_no_accepted_order() {
    let mut stack = Stack::start("app-kill", Options::default()).await;
    let users = stack.create_users(1500, false).await;
    let sales = stack.create_sales(&STOCKS).await;
    let storm = Storm::start(
        &stack.http,
        stack.bases(),
        purchases(&users, &sales, 1, 0.03),
        Plan::default(),
    );
    storm.wait_accepted(400, Duration::from_secs(20)).await;
    stack.servers[0].kill9();
    println!("server killed at {:.1?}", storm.elapsed());
    tokio::time::sleep(Duration::from_secs(1)).await;
    stack.restart_server(0).await;
    println!("server back at {:.1?}", storm.elapsed());
    assert!(
        storm.wait_decided(200, Duration::from_secs(20)).await,
        "the restarted server decides purchases again"
    );
    let records = storm.finish().await;
    assert_invariants(&stack, &records, &sales, &[], AllowedLoss::None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn survivor_settles_what_a_killed_sibling_accepted() {
    let mut stack = Stack::start(
        "app-kill-sibling",
        Options {
            servers: 2,
            ..Options::default()
        },
    )
    .await;
    let users = stack.create_users(1500, false).await;
    let sales = stack.create_sales(&STOCKS).await;
    let storm = Storm::start(
        &stack.http,
        stack.bases(),
        purchases(&users, &sales, 2, 0.03),
        Plan::default(),
    );
    storm.wait_accepted(400, Duration::from_secs(20)).await;
    let before = stack.pending_by_consumer(&sales).await;
    stack.servers[1].kill9();
    println!(
        "server #1 killed for good at {:.1?}; unacknowledged entries per consumer just before: {before:?}",
        storm.elapsed()
    );
    assert!(
        storm.wait_decided(200, Duration::from_secs(20)).await,
        "the survivor decides purchases"
    );
    let records = storm.finish().await;
    assert_invariants(&stack, &records, &sales, &[], AllowedLoss::None).await;
    let after = stack.pending_by_consumer(&sales).await;
    assert!(
        after.values().all(|&n| n == 0),
        "entries left unacknowledged: {after:?}"
    );
}
