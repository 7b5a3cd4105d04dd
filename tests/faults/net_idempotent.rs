//! Issue 53, scenario 8: idempotent clients through scenarios 2 and 4. Two
//! servers, each on its own fault proxies; buyers press Buy twice (a sale of
//! `max_per_user` 2), each press under a new `Idempotency-Key`, and send every
//! 503, timeout and reset again under the same key, while first both servers'
//! Redis links stall and heal, then server #1 alone is cut off from Redis and
//! healed. Afterwards every press ended 202, some retry got its key's first 202
//! back (a purchase the stall held ran after its 503: `Idempotent-Replayed`),
//! each key is one order in Postgres, each buyer holds exactly the two units
//! meant, and the shared invariants hold over every attempt (no attempt
//! unanswered: the client waits longer than the server's bound).

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::{Options, Stack};
use crate::idempotent_retry::{assert_keys_bought_once, press_within};
use crate::invariants::{AllowedLoss, assert_invariants};
use crate::net::{ANSWER_BOUND, fault_length};
use crate::storm::Record;

const USERS: usize = 200;
const PRESSES: usize = 2;

#[tokio::test(flavor = "multi_thread")]
async fn idempotent_buyers_through_a_redis_stall_and_a_partition_buy_exactly_what_they_meant() {
    let length = fault_length(3, 15);
    let stack = Stack::start("net-idempotent", Options::proxied(2)).await;
    let (links0, links1) = (&stack.links[0], &stack.links[1]);
    let users = stack.create_users(USERS, false).await;
    let sale = stack
        .create_sale_with(10_000, json!({ "max_per_user": PRESSES }))
        .await;
    // The presses spread over both faults and the gap between them.
    let window = 2 * length + Duration::from_secs(2);
    let limits = (
        ANSWER_BOUND + Duration::from_secs(1),
        2 * window + Duration::from_secs(30),
    );
    let started = Instant::now();
    let bases = Arc::new(stack.bases());
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = users
        .into_iter()
        .enumerate()
        .map(|(i, user)| {
            let (http, bases, next) = (stack.http.clone(), bases.clone(), next.clone());
            tokio::spawn(async move {
                tokio::time::sleep(window.mul_f64(i as f64 / USERS as f64)).await;
                let mut presses = Vec::new();
                for p in 0..PRESSES {
                    let key = format!("u{}-p{p}-{}", user.id, uuid::Uuid::new_v4().simple());
                    presses
                        .push(press_within(&http, &bases, sale, &user, key, &next, limits).await);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                presses
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(500)).await;
    links0.redis.stall();
    links1.redis.stall();
    println!(
        "Redis stalled for both servers at {:.1?}",
        started.elapsed()
    );
    tokio::time::sleep(length).await;
    links0.redis.heal();
    links1.redis.heal();
    println!("healed at {:.1?}", started.elapsed());
    tokio::time::sleep(Duration::from_secs(1)).await;
    links1.redis.blackhole();
    println!("server #1 cut off from Redis at {:.1?}", started.elapsed());
    tokio::time::sleep(length).await;
    links1.redis.heal();
    println!("healed at {:.1?}", started.elapsed());

    let mut presses = Vec::new();
    for task in tasks {
        presses.extend(task.await.expect("a buyer's task"));
    }
    let records: Vec<Record> = presses.iter().flat_map(|p| p.records.clone()).collect();
    let retried = presses.iter().filter(|p| p.tries > 1).count();
    let replayed = records.iter().filter(|r| r.is_replayed()).count();
    let (slowest, what) = crate::net::slowest(&records);
    println!(
        "FIGURES net-idempotent: {} presses, {} attempts ({}), {retried} presses retried, {replayed} answers replayed a key's 202, slowest {slowest:.2?} ({what}), over in {:.1?}",
        presses.len(),
        records.len(),
        crate::storm::summary(&records),
        started.elapsed()
    );
    assert!(retried > 0, "no press met a fault");
    // A purchase sent into the stalled link ran once it healed, after its 503: its
    // retry must have got the key's first 202 back.
    assert!(
        replayed > 0,
        "no retry got its key's first 202 back (Idempotent-Replayed: true): no purchase \
         held by the stall ran after its 503, or its retry was decided anew"
    );
    let not_accepted: Vec<String> = presses
        .iter()
        .filter(|p| p.status != 202)
        .take(10)
        .map(|p| {
            format!(
                "{} ended {} {:?} after {} tries",
                p.key, p.status, p.code, p.tries
            )
        })
        .collect();
    assert!(
        not_accepted.is_empty(),
        "presses that did not end 202: {}",
        not_accepted.join("; ")
    );
    crate::net::assert_answers_bounded(&records, "keyed purchases");
    assert_invariants(&stack, &records, &[sale], &[], AllowedLoss::None).await;
    assert_keys_bought_once(&stack, sale, &presses, USERS * PRESSES).await;
}
