//! Issue 26: a retried purchase is the same purchase. On a sale of `max_per_user`
//! 5, every buyer presses Buy five times, each press with a new `Idempotency-Key`,
//! and retries every 503, timeout and reset of that press with the same key
//! (on the other server, when one is down) while Redis is killed (`kill -9`) and
//! brought back, and a server is killed mid-storm. Afterwards each buyer's units in
//! Postgres are exactly the distinct keys that got a 202, every 202's order is in
//! Postgres once, and each key's 202s name one order.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Db, Options, Stack};

/// What one press ended with: its key, its 202s' order ids, and the last status.
struct Press {
    user: i64,
    key: String,
    orders: Vec<uuid::Uuid>,
    status: u16,
    tries: usize,
}

const PRESSES: usize = 5;
const USERS: usize = 150;

async fn press(
    http: &reqwest::Client,
    bases: &[String],
    sale: i64,
    user: &crate::harness::User,
    key: String,
    next: &AtomicUsize,
) -> Press {
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut out = Press {
        user: user.id,
        key,
        orders: Vec::new(),
        status: 0,
        tries: 0,
    };
    loop {
        out.tries += 1;
        let base = &bases[next.fetch_add(1, Ordering::Relaxed) % bases.len()];
        let answer = http
            .post(format!("{base}/api/sales/{sale}/purchase"))
            .bearer_auth(&user.token)
            .header("Idempotency-Key", &out.key)
            .timeout(Duration::from_millis(1500))
            .send()
            .await;
        let status = match answer {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let body: Value = resp.json().await.unwrap_or(Value::Null);
                if status == 202 {
                    let order = body["order_id"].as_str().unwrap().parse().unwrap();
                    if !out.orders.contains(&order) {
                        out.orders.push(order);
                    }
                }
                status
            }
            // A timeout, a refused connection or a reset: the purchase may have run.
            Err(_) => 0,
        };
        out.status = status;
        if !matches!(status, 0 | 503) || Instant::now() > deadline {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn retries_under_one_key_buy_exactly_once_through_redis_and_server_kills() {
    let mut stack = Stack::start("idempotent-retry", Options::servers(2)).await;
    let users = stack.create_users(USERS, false).await;
    let sale = stack
        .create_sale_with(10_000, json!({ "max_per_user": PRESSES }))
        .await;
    let started = Instant::now();
    let bases = Arc::new(stack.bases());
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = users
        .into_iter()
        .enumerate()
        .map(|(i, user)| {
            let (http, bases, next) = (stack.http.clone(), bases.clone(), next.clone());
            tokio::spawn(async move {
                // Spread over the faults: each buyer presses every 150 to 600 ms.
                tokio::time::sleep(Duration::from_millis((i % 50) as u64 * 20)).await;
                let mut presses = Vec::new();
                for p in 0..PRESSES {
                    let key = format!("u{}-p{p}-{}", user.id, uuid::Uuid::new_v4().simple());
                    presses.push(press(&http, &bases, sale, &user, key, &next).await);
                    tokio::time::sleep(Duration::from_millis(150 + (i as u64 * 37 % 450))).await;
                }
                presses
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(600)).await;
    stack.redis.kill9();
    println!("Redis killed at {:.1?}", started.elapsed());
    tokio::time::sleep(Duration::from_millis(800)).await;
    stack.start_redis().await;
    println!("Redis back at {:.1?}", started.elapsed());
    tokio::time::sleep(Duration::from_millis(700)).await;
    stack.servers[1].kill9();
    println!("server #1 killed at {:.1?}", started.elapsed());

    let mut presses = Vec::new();
    for task in tasks {
        presses.extend(task.await.expect("a buyer's task"));
    }
    println!("storm over at {:.1?}", started.elapsed());
    let retried = presses.iter().filter(|p| p.tries > 1).count();
    let replays = presses
        .iter()
        .filter(|p| p.tries > 1 && p.status == 202)
        .count();
    let mut statuses: HashMap<u16, usize> = HashMap::new();
    for p in &presses {
        *statuses.entry(p.status).or_default() += 1;
    }
    println!(
        "presses: {} ({retried} retried, {replays} of them ended 202); last answers {statuses:?}",
        presses.len()
    );
    assert!(retried > 0, "the faults made some press retry");

    // Settled: nothing pending, then Postgres against what the buyers were told.
    let deadline = Instant::now() + Duration::from_secs(30);
    while stack.pending_orders(&[sale]).await > 0 {
        assert!(Instant::now() < deadline, "orders still pending after 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows: Vec<(uuid::Uuid, i64, i32, Option<String>)> = stack
        .rows(
            "SELECT id, user_id, quantity, idempotency_key FROM orders WHERE sale_id = $1",
            sale,
        )
        .await;
    let in_pg: HashMap<uuid::Uuid, (i64, Option<String>)> = rows
        .iter()
        .map(|(id, user, _, key)| (*id, (*user, key.clone())))
        .collect();
    assert_eq!(in_pg.len(), rows.len());
    let mut units: HashMap<i64, i64> = HashMap::new();
    for (_, user, q, _) in &rows {
        *units.entry(*user).or_default() += i64::from(*q);
    }
    let mut keys_accepted: HashMap<i64, HashSet<&str>> = HashMap::new();
    for p in &presses {
        assert!(
            p.orders.len() <= 1,
            "key {} named orders {:?}",
            p.key,
            p.orders
        );
        assert!(
            matches!(p.status, 202 | 409),
            "press {} of user {} ended {} after {} tries",
            p.key,
            p.user,
            p.status,
            p.tries
        );
        if let Some(order) = p.orders.first() {
            keys_accepted.entry(p.user).or_default().insert(&p.key);
            let (owner, key) = in_pg
                .get(order)
                .unwrap_or_else(|| panic!("order {order} (a 202) is not in Postgres"));
            assert_eq!(*owner, p.user);
            assert_eq!(
                key.as_deref(),
                Some(p.key.as_str()),
                "the order keeps its key"
            );
        }
    }
    for (user, held) in &units {
        let keys = keys_accepted.get(user).map_or(0, HashSet::len) as i64;
        assert_eq!(
            *held, keys,
            "user {user}: units in Postgres = distinct keys with a 202"
        );
    }
    let total_keys: usize = keys_accepted.values().map(HashSet::len).sum();
    assert_eq!(
        rows.len(),
        total_keys,
        "every 202 in Postgres once, nothing else"
    );
    println!(
        "{total_keys} keys accepted, {} orders in Postgres",
        rows.len()
    );
}
