//! Two faults at once: Postgres down for 15 s mid-storm (no server can write its
//! roster beat, nothing settles), and Redis wiped while it is down. The orders
//! accepted meanwhile live only in the servers that answered them; once Postgres
//! is back, the rebuild must ask both servers for them though neither has beaten
//! for 15 s (`roster::LIVE_WINDOW_S`), and lose none: every 202 in Postgres once,
//! nobody buys twice.

use std::time::{Duration, Instant};

use crate::harness::{Options, PgStop, Stack};
use crate::invariants::{AllowedLoss, assert_buyers_cannot_buy_again, assert_invariants};
use crate::redis_wipe::flushall_measuring_the_tail;
use crate::storm::{self, Plan, purchases};

const OUTAGE: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread")]
async fn redis_wiped_during_a_long_postgres_outage_loses_no_accepted_purchase() {
    let mut stack = Stack::start("pg-outage-wipe", Options::servers(2)).await;
    let (users, sales) = stack.shoppers_and_sales().await;
    let storm = stack.storm(
        purchases(&users, &sales, 1, 0.03),
        // Slow enough that the sales still have units after the outage.
        Plan::at_rate(100.0).lasting(Duration::from_secs(35)),
    );
    storm.wait_accepted(100, Duration::from_secs(20)).await;
    let stopping = Instant::now();
    stack.pg.stop(PgStop::Fast);
    // From here nothing settles: a purchase sent before (while the fast shutdown
    // let settlement commit its last batch) may be in Postgres and not among the
    // orders the wipe takes, so the outage's purchases are those sent after.
    let down_at = Instant::now();
    println!("Postgres stopped at {:.1?}", storm.elapsed());
    tokio::time::sleep(
        (stopping + OUTAGE - Duration::from_secs(1)).saturating_duration_since(Instant::now()),
    )
    .await;
    let tail = flushall_measuring_the_tail(&stack, &sales, &[]).await;
    println!(
        "FLUSHALL at {:.1?}, {tail} unsettled orders taken",
        storm.elapsed()
    );
    tokio::time::sleep((stopping + OUTAGE).saturating_duration_since(Instant::now())).await;
    stack.pg.start();
    let up_at = Instant::now();
    println!("Postgres back at {:.1?}", storm.elapsed());
    assert!(
        storm.wait_decided(100, Duration::from_secs(30)).await,
        "purchases are decided again after the outage and the wipe"
    );
    let records = storm.finish().await;
    let during = records
        .iter()
        .filter(|r| r.sent >= down_at && r.answered < up_at && r.is_accepted())
        .count();
    println!(
        "{during} purchases accepted during the outage; after it: {}",
        storm::summary(
            &records
                .iter()
                .filter(|r| r.sent >= up_at)
                .cloned()
                .collect::<Vec<_>>()
        )
    );
    assert!(
        during > 0 && tail >= during,
        "the wipe took the orders accepted during the outage ({during}, tail {tail})"
    );
    let report = assert_invariants(&stack, &records, &sales, &[], AllowedLoss::None).await;
    println!("{} accepted purchases lost", report.lost.len());
    let mut all = records;
    all.extend(assert_buyers_cannot_buy_again(&stack, &sales).await);
    assert_invariants(&stack, &all, &sales, &[], AllowedLoss::None).await;
}
