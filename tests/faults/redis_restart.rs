//! Scenario 3: Redis (with `appendfsync always`) restarted mid-storm, gracefully
//! and with `kill -9`. While it is down or loading the servers answer 503 with
//! Retry-After, never 500; afterwards they decide again without a restart, and
//! no accepted order is lost (with `always` a 202 leaves only after the fsync).

use std::time::{Duration, Instant};

use crate::harness::{Fsync, Options, Stack};
use crate::invariants::{AllowedLoss, assert_buyers_cannot_buy_again, assert_invariants};
use crate::storm::{Outcome, Plan, Record, purchases};

/// What a server may answer a purchase sent while Redis is down or loading: a
/// decision from memory (409 `already_bought`, 410 `sold_out`) or made just before
/// the stop (202), else 503 with `Retry-After` and an error code; never a 5xx
/// else, never no answer (a hang). And the fault landed: some got the 503.
fn assert_outage_answers(during: &[Record]) {
    let wrong: Vec<String> = during
        .iter()
        .filter(|r| match &r.outcome {
            Outcome::Answer {
                status: 503,
                code,
                retry_after,
                ..
            } => code.is_none() || retry_after.is_none(),
            Outcome::Answer { status, code, .. } => !matches!(
                (*status, code.as_deref()),
                (202, _) | (409, Some("already_bought")) | (410, Some("sold_out"))
            ),
            Outcome::NoAnswer(_) => true,
        })
        .take(10)
        .map(|r| format!("user {} on server #{}: {}", r.user, r.server, r.label()))
        .collect();
    assert!(
        wrong.is_empty(),
        "answers while Redis was down that are not 202/409 already_bought/410 sold_out/503 with Retry-After and a code: {}",
        wrong.join("; ")
    );
    assert!(
        during.iter().any(|r| r.status() == Some(503)),
        "no purchase sent while Redis was down got a 503: the fault did not land"
    );
}

#[derive(Clone, Copy, Debug)]
enum Stop {
    /// `redis-cli shutdown`.
    Graceful,
    /// SIGKILL.
    Kill9,
}

async fn redis_restart_mid_storm(name: &str, stop: Stop) {
    let mut stack = Stack::start(name, Options::fsync(Fsync::Always)).await;
    let (users, sales) = stack.shoppers_and_sales().await;
    let storm = stack.storm(purchases(&users, &sales, 1, 0.03), Plan::at_rate(200.0));
    storm.wait_accepted(300, Duration::from_secs(20)).await;
    let down_at = Instant::now();
    match stop {
        Stop::Graceful => stack.redis.shutdown(),
        Stop::Kill9 => stack.redis.kill9(),
    }
    println!("Redis stopped ({stop:?}) at {:.1?}", storm.elapsed());
    tokio::time::sleep(Duration::from_secs(2)).await;
    stack.start_redis().await;
    let up_at = Instant::now();
    println!("Redis back at {:.1?}", storm.elapsed());
    let serving = storm.wait_decided(100, Duration::from_secs(30)).await;
    let records = storm.finish().await;
    let during: Vec<Record> = records
        .iter()
        .filter(|r| r.sent >= down_at && r.sent < up_at)
        .cloned()
        .collect();
    println!(
        "sent while Redis was down: {}",
        crate::storm::summary(&during)
    );
    assert_outage_answers(&during);
    assert!(
        serving,
        "purchases are decided again after Redis is back, without restarting the server"
    );
    assert_invariants(&stack, &records, &sales, &[], AllowedLoss::None).await;
    let mut all = records;
    all.extend(assert_buyers_cannot_buy_again(&stack, &sales).await);
    assert_invariants(&stack, &all, &sales, &[], AllowedLoss::None).await;
}

scenario_tests! {
    redis_shut_down_and_restarted_mid_storm_answers_503_never_500_and_loses_no_202 =>
        redis_restart_mid_storm("redis-restart", Stop::Graceful);
    /// Also the `always` half of scenario 4: no cut of the AOF, since with `always` a
    /// reply leaves only after its fsync, so a 202 is in the file before the kill.
    redis_killed_mid_storm_under_fsync_always_loses_no_202 =>
        redis_restart_mid_storm("redis-kill9", Stop::Kill9);
}
