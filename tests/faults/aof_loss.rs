//! Scenario 4: Redis under `appendfsync everysec` loses its last second of
//! writes. Simulated: note the size of the AOF increment file at time t, storm
//! on, `kill -9` Redis at t + 1 s, cut the file back to the noted size (Redis
//! drops a torn last command, `aof-load-truncated yes`), start Redis again.
//!
//! No 202 may be lost: the server that answered the cut second's 202s still runs,
//! and the rebuild after the restart asks it for the orders it keeps before it
//! reads Postgres (docs/operations.md, "What a server keeps"). The cut second must
//! hold 202s, or the fault missed its window. Nobody may buy twice and the units
//! arithmetic must be exact in both stores. The `always` counterpart (a kill
//! without a cut) is
//! `redis_restart::redis_killed_mid_storm_under_fsync_always_loses_no_202`.

use std::fs::{self, OpenOptions};
use std::time::{Duration, Instant};

use crate::harness::{Fsync, Options, Stack};
use crate::invariants::{AllowedLoss, assert_buyers_cannot_buy_again, assert_invariants};
use crate::storm::{Plan, purchases};

#[tokio::test(flavor = "multi_thread")]
async fn redis_losing_its_last_second_under_everysec_loses_no_202_its_running_server_kept() {
    let mut stack = Stack::start("aof-cut", Options::fsync(Fsync::EverySec)).await;
    let (users, sales) = stack.shoppers_and_sales().await;
    let storm = stack.storm(purchases(&users, &sales, 1, 0.03), Plan::at_rate(250.0));
    storm.wait_accepted(300, Duration::from_secs(20)).await;
    // The settlement workers know every sale's stream, so that some 202s of the cut
    // second are settled before the kill: Redis forgets buyers Postgres remembers.
    stack.wait_settling(&sales).await;
    let incr = stack.redis.aof_incr_file();
    // t first, then the size: whatever was answered before t is in the file by now.
    let t = Instant::now();
    let cut_to = fs::metadata(&incr).expect("AOF increment file").len();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stack.redis.kill9();
    let killed_at = Instant::now();
    assert_eq!(
        stack.redis.aof_incr_file(),
        incr,
        "Redis rewrote its AOF during the cut second; the simulation does not hold"
    );
    let size_at_kill = fs::metadata(&incr).unwrap().len();
    assert!(
        size_at_kill > cut_to,
        "Redis wrote nothing in the second before the kill"
    );
    OpenOptions::new()
        .write(true)
        .open(&incr)
        .unwrap()
        .set_len(cut_to)
        .expect("truncate the AOF");
    println!(
        "AOF {} cut from {size_at_kill} to {cut_to} bytes at {:.1?}",
        incr.display(),
        storm.elapsed()
    );
    stack.start_redis().await;
    let serving = storm.wait_decided(100, Duration::from_secs(30)).await;
    let records = storm.finish().await;
    assert!(
        serving,
        "purchases are decided again after Redis is back, without restarting the server"
    );
    let in_lost_second = records
        .iter()
        .filter(|r| r.is_accepted() && r.answered >= t && r.answered < killed_at)
        .count();
    assert!(
        in_lost_second > 0,
        "no purchase was accepted in the cut second: the cut took no 202, the fault missed its window"
    );
    // The server kept what it answered in the cut second: nothing is lost.
    let report = assert_invariants(&stack, &records, &sales, &[], AllowedLoss::None).await;
    println!(
        "{in_lost_second} purchases were accepted in the cut second; {} accepted purchases lost",
        report.lost.len()
    );
    let mut all = records;
    all.extend(assert_buyers_cannot_buy_again(&stack, &sales).await);
    assert_invariants(&stack, &all, &sales, &[], AllowedLoss::None).await;
}
