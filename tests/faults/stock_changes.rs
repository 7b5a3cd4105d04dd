//! Scenarios 6 and 7: admin stock changes racing buyers over two instances, and a
//! stock change on a wiped Redis. A sale's `stock_total` lives in both stores; a
//! change must reach each exactly once, so that afterwards
//! `stock_total == units left + buyers` in Redis and in Postgres.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use rand::seq::SliceRandom;
use sqlx::PgPool;

use crate::harness::{Options, Stack};
use crate::invariants::{AllowedLoss, assert_invariants, final_answers};
use crate::storm::{self, Op, Plan, Work, purchases};

const ROUNDS: usize = 20;
const BUYERS_PER_ROUND: usize = 100;

async fn stock_total(db: &PgPool, sale: i64) -> i64 {
    sqlx::query_scalar("SELECT stock_total FROM sales WHERE id = $1")
        .bind(sale)
        .fetch_one(db)
        .await
        .unwrap()
}

fn stock_change(stack: &Stack, sale: i64, body: String) -> Work {
    Work {
        user: stack.admin.id,
        token: Arc::from(stack.admin.token.as_str()),
        op: Op::Stock { sale, body },
        server: 0,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_stock_changes_over_two_instances_keep_both_stores_in_step() {
    let stack = Stack::start("stock-race", Options::servers(2)).await;
    let users = stack.create_users(ROUNDS * BUYERS_PER_ROUND, false).await;
    for (round, buyers) in users.chunks(BUYERS_PER_ROUND).enumerate() {
        let sale = stack.create_sale(20).await;
        let mut rng = rand::rng();
        let mut changes: Vec<Work> = (0..200)
            .map(|_| stock_change(&stack, sale, r#"{"add": 1}"#.into()))
            .chain((0..100).map(|_| {
                let n = rng.random_range(0..=40);
                stock_change(&stack, sale, format!(r#"{{"set": {n}}}"#))
            }))
            .collect();
        changes.shuffle(&mut rng);
        storm::spread(&mut changes, 2);
        // All 300 changes in flight at once, racing each other on both instances,
        // while the buyers arrive over the second or two the changes take.
        let changing = stack.storm(changes, Plan::burst(300, 300));
        let buying = stack.storm(
            purchases(buyers, &[sale], 2, 0.0),
            Plan {
                rate: 60.0,
                concurrency: 32,
                max_requests: 2_000,
                max_duration: Duration::from_secs(30),
                max_tries: 60,
            },
        );
        let mut records = changing.finish().await;
        records.extend(buying.finish().await);
        println!("round {round}: sale {sale}");
        assert_invariants(&stack, &records, &[sale], &[], AllowedLoss::None).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn stock_change_on_a_wiped_redis_adds_exactly_one_unit_and_keeps_earlier_buyers_out() {
    let stack = Stack::start("stock-wiped", Options::default()).await;
    let users = stack.create_users(80, false).await;
    let (earlier, fresh) = users.split_at(30);
    let sale = stack.create_sale(50).await;
    let mut records = storm::run_all(
        &stack.http,
        stack.bases(),
        purchases(earlier, &[sale], 1, 0.0),
    )
    .await;
    assert_eq!(records.iter().filter(|r| r.is_accepted()).count(), 30);
    // Settled (the check waits for it) before the wipe.
    assert_invariants(&stack, &records, &[sale], &[], AllowedLoss::None).await;
    let before = stock_total(&stack.db, sale).await;

    stack.flushall().await;
    let add = storm::run_all(
        &stack.http,
        stack.bases(),
        vec![stock_change(&stack, sale, r#"{"add": 1}"#.into())],
    )
    .await;
    println!("the stock change after the wipe: {}", storm::summary(&add));
    let answer = final_answers(&add)[0].status();
    assert!(
        matches!(answer, Some(200 | 202)),
        "the stock change is applied (200) or recorded (202), after 503 recovering if any; got {answer:?}"
    );
    records.extend(add);
    stack.wait_stock_changes_applied(&[sale]).await;
    let after = stock_total(&stack.db, sale).await;
    assert_eq!(after, before + 1, "stock_total is the old total plus one");

    let again = storm::run_all(
        &stack.http,
        stack.bases(),
        purchases(earlier, &[sale], 1, 0.0),
    )
    .await;
    let not_refused: Vec<String> = final_answers(&again)
        .iter()
        .filter(|r| r.code() != Some("already_bought"))
        .map(|r| format!("user {}: {}", r.user, r.label()))
        .collect();
    records.extend(again);
    assert!(
        not_refused.is_empty(),
        "earlier buyers were not refused with 409 already_bought: {}",
        not_refused.join("; ")
    );

    // The units left are exactly total - 30 buyers: fresh buyers get that many.
    let newcomers = storm::run_all(
        &stack.http,
        stack.bases(),
        purchases(fresh, &[sale], 1, 0.0),
    )
    .await;
    let accepted = newcomers.iter().filter(|r| r.is_accepted()).count() as i64;
    records.extend(newcomers);
    assert_eq!(
        accepted,
        after - 30,
        "fresh buyers get exactly the units left"
    );
    assert_invariants(&stack, &records, &[sale], &[], AllowedLoss::None).await;
}
