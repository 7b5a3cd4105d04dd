//! A purchase whose first answer was lost, then replayed, then wiped before
//! settlement. Redis is stopped (SIGSTOP) past the server's response timeout while
//! keyed buyers press Buy: the server answers 503 and keeps nothing (its call
//! failed), yet Redis runs the purchases when it resumes; each buyer's retry under
//! the same key gets that first 202 back (`Idempotent-Replayed`). With settlement
//! held back (the test holds the settling lease), Redis is then wiped: the orders
//! live only in the server that answered the replays. The rebuild must find every
//! one of them in Postgres: each key sent again after the wipe names its first
//! order, and the shared invariants hold with no loss allowed.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use serde_json::json;

use crate::harness::{Options, Stack};
use crate::idempotent_retry::{Press, assert_keys_bought_once, press_within};
use crate::invariants::{AllowedLoss, assert_invariants};
use crate::redis_wipe::{flushall_measuring_the_tail, take_the_settling_lease};
use crate::storm::Record;

const USERS: usize = 60;
/// Buyers before Redis stops.
const WARM: usize = 8;

#[tokio::test(flavor = "multi_thread")]
async fn a_replayed_acceptance_is_kept_through_a_wipe_before_settlement() {
    // The server gives up on Redis after 1 s, below the presses' 1.5 s.
    let options = Options {
        extra: vec![("STAMPEDE_REDIS_RESPONSE_TIMEOUT_MS", "1000")],
        ..Options::servers(1)
    };
    let stack = Stack::start("replay-wipe", options).await;
    let mut users = stack.create_users(USERS + WARM, false).await;
    let warm = users.split_off(USERS);
    let sale = stack.create_sale_with(10_000, json!({})).await;
    // Nothing settles until the wipe takes the lease away (the server that held
    // it finds it gone within a second).
    take_the_settling_lease(&stack).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let bases = Arc::new(stack.bases());
    let next = Arc::new(AtomicUsize::new(0));
    let limits = (Duration::from_millis(1500), Duration::from_secs(40));
    // Purchases first on a running Redis, so that the server's connections are up
    // when it stops (a connection made while it is stopped sends no purchase).
    let warming = warm.iter().map(|user| {
        let key = format!("warm-{}", user.id);
        press_within(&stack.http, &bases, sale, user, key, &next, limits)
    });
    let warmed = futures_util::future::join_all(warming).await;
    assert!(
        warmed.iter().all(|p| p.status == 202),
        "the warm-up purchases"
    );

    stack.redis.pause();
    let tasks: Vec<_> = users
        .iter()
        .cloned()
        .map(|user| {
            let (http, bases, next) = (stack.http.clone(), bases.clone(), next.clone());
            tokio::spawn(async move {
                let key = format!("u{}-{}", user.id, uuid::Uuid::new_v4().simple());
                press_within(&http, &bases, sale, &user, key, &next, limits).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    stack.redis.resume();
    let mut presses: Vec<Press> = warmed;
    for task in tasks {
        presses.push(task.await.expect("a buyer's task"));
    }
    let replayed = presses
        .iter()
        .filter(|p| p.records.iter().any(Record::is_replayed))
        .count();
    let unanswered = presses
        .iter()
        .filter(|p| p.records.iter().any(|r| r.status() == Some(503)))
        .count();
    println!(
        "{} presses: {unanswered} met a 503, {replayed} got their first 202 back",
        presses.len()
    );
    assert!(
        presses.iter().all(|p| p.status == 202),
        "every press ends 202: {:?}",
        presses.iter().map(|p| p.status).collect::<Vec<_>>()
    );
    assert!(
        replayed > 0,
        "no retry got its key's first 202 back: the stop did not land on a decision"
    );

    // The wipe, the replayed orders unsettled: only the server holds them.
    let replayed_orders: Vec<uuid::Uuid> = presses
        .iter()
        .filter(|p| p.records.iter().any(Record::is_replayed))
        .flat_map(|p| p.orders.clone())
        .collect();
    let settled: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE id = ANY($1)")
        .bind(&replayed_orders)
        .fetch_one(&stack.db)
        .await
        .unwrap();
    let tail = flushall_measuring_the_tail(&stack, &[sale], &[]).await;
    println!(
        "FLUSHALL took {tail} unsettled orders, {} of them replayed, {settled} replayed ones settled before",
        replayed_orders.len()
    );
    assert_eq!(settled, 0, "the replayed orders were unsettled at the wipe");
    assert!(
        tail >= replayed_orders.len(),
        "the wipe took the replayed orders"
    );

    // Each key again: after the rebuild, its first order, not a new one.
    let mut again = Vec::new();
    for (p, user) in presses.iter().zip(warm.iter().chain(&users)) {
        let key = p.key.clone();
        again.push(press_within(&stack.http, &bases, sale, user, key, &next, limits).await);
    }
    for (p, a) in presses.iter_mut().zip(again) {
        assert_eq!(
            (a.status, &a.orders),
            (202, &p.orders),
            "key {} sent again after the wipe names its first order",
            p.key
        );
        p.records.extend(a.records);
    }
    let records: Vec<Record> = presses.iter().flat_map(|p| p.records.clone()).collect();
    assert_invariants(&stack, &records, &[sale], &[], AllowedLoss::None).await;
    assert_keys_bought_once(&stack, sale, &presses, USERS + WARM).await;
}
