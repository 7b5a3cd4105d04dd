//! Scenario 1: a server killed with SIGKILL mid-storm, restarted or not. It is
//! killed while its settlement worker holds delivered, unacknowledged order
//! entries (Postgres is held down for a moment so that the worker cannot commit
//! them), so only a takeover (`XAUTOCLAIM` by another consumer after
//! `STAMPEDE_SETTLE_CLAIM_IDLE_MS`) can bring those orders to Postgres. The killed
//! worker held the settling lease, which it never released: the next worker
//! (the restarted server's, or the sibling's) waits it out first.

use std::time::{Duration, Instant};

use crate::harness::{Options, PgStop, Stack};
use crate::invariants::{AllowedLoss, CUT_AT_A_KILL, assert_invariants};
use crate::storm::{Plan, Storm, purchases};

/// Stops Postgres and waits until the settlement worker of server `index` holds
/// order entries it read but cannot commit; returns how many. Postgres stays
/// down: the caller starts it again. (With Postgres down a worker spends most of
/// its time waiting for a connection, so this takes a few seconds.)
async fn hold_entries_in_worker(stack: &mut Stack, index: usize, sales: &[i64]) -> usize {
    // Consumer names are `<host>-<pid>-<random>`.
    let tag = format!("-{}-", stack.servers[index].pid().expect("server runs"));
    // The worker must know the sales' streams before Postgres goes (it re-reads
    // their list from Postgres every 2 s): it has read the newest one.
    let newest = *sales.iter().max().expect("sales");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !stack
        .consumers(newest)
        .await
        .iter()
        .any(|name| name.contains(&tag))
    {
        assert!(
            Instant::now() < deadline,
            "server #{index}'s settlement worker never read sale {newest}'s stream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stack.pg.stop(PgStop::Fast);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held: usize = stack
            .pending_by_consumer(sales)
            .await
            .into_iter()
            .filter(|(name, _)| name.contains(&tag))
            .map(|(_, n)| n)
            .sum();
        if held > 0 {
            return held;
        }
        assert!(
            Instant::now() < deadline,
            "server #{index}'s settlement worker never held an entry"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The server whose settlement worker reads the streams: the one that holds the
/// settling lease (`settle.exclusive`, the default), found as the one whose
/// consumer has read sale `newest`'s stream.
async fn settling_server(stack: &Stack, newest: i64) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let readers = stack.consumers(newest).await;
        let reading = (0..stack.servers.len()).find(|&i| {
            let tag = format!("-{}-", stack.servers[i].pid().expect("server runs"));
            readers.iter().any(|name| name.contains(&tag))
        });
        if let Some(i) = reading {
            return i;
        }
        assert!(
            Instant::now() < deadline,
            "no server's settlement worker read sale {newest}'s stream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn assert_nothing_left_unacknowledged(stack: &Stack, sales: &[i64]) {
    let left = stack.pending_by_consumer(sales).await;
    assert!(
        left.values().all(|&n| n == 0),
        "entries left unacknowledged: {left:?}"
    );
}

/// After the kill of server #`killed`: `who` decides purchases again, and once the
/// storm ends nothing accepted is lost and no entry is left unacknowledged.
async fn assert_storm_ends_whole(
    stack: &Stack,
    storm: Storm,
    sales: &[i64],
    (killed, who): (usize, &str),
) {
    assert!(
        storm.wait_decided(200, Duration::from_secs(20)).await,
        "{who} decides purchases again"
    );
    let records = storm.finish().await;
    let allowed = AllowedLoss::None.with_kills(&[killed], CUT_AT_A_KILL);
    assert_invariants(stack, &records, sales, &[], allowed).await;
    assert_nothing_left_unacknowledged(stack, sales).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn server_killed_mid_storm_and_restarted_loses_no_accepted_order() {
    let mut stack = Stack::start("app-kill", Options::default()).await;
    let (users, sales) = stack.shoppers_and_sales().await;
    let storm = stack.storm(purchases(&users, &sales, 1, 0.03), Plan::default());
    storm.wait_accepted(400, Duration::from_secs(20)).await;
    let held = hold_entries_in_worker(&mut stack, 0, &sales).await;
    stack.servers[0].kill9();
    println!(
        "server killed at {:.1?} holding {held} unacknowledged entries",
        storm.elapsed()
    );
    stack.pg.start();
    stack.restart_server(0).await;
    println!("server back at {:.1?}", storm.elapsed());
    let after = (0, "the restarted server");
    assert_storm_ends_whole(&stack, storm, &sales, after).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn survivor_settles_what_a_killed_sibling_accepted() {
    let mut stack = Stack::start("app-kill-sibling", Options::servers(2)).await;
    let (users, sales) = stack.shoppers_and_sales().await;
    let storm = stack.storm(purchases(&users, &sales, 2, 0.03), Plan::default());
    storm.wait_accepted(400, Duration::from_secs(20)).await;
    // The one that settles (the other stands by): only its death leaves entries
    // behind, and the survivor must take the lease over before it can claim them.
    let newest = *sales.iter().max().expect("sales");
    let killed = settling_server(&stack, newest).await;
    let held = hold_entries_in_worker(&mut stack, killed, &sales).await;
    stack.servers[killed].kill9();
    println!(
        "server #{killed}, the settling one, killed for good at {:.1?} holding {held} unacknowledged entries",
        storm.elapsed()
    );
    stack.pg.start();
    assert_storm_ends_whole(&stack, storm, &sales, (killed, "the survivor")).await;
}
