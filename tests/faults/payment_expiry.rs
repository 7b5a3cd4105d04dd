//! Scenario: the payment window under crashes. 100 units, 100 buyers, 30 never
//! pay: after the deadline exactly 30 units are back and exactly 30 later
//! purchases get them, while both servers are SIGKILLed (and restarted) again and
//! again in the middle of the expiry job's passes and of the sweep that finishes
//! what a killed pass left: between the Postgres commit of an expiry and Redis,
//! between Redis applying a return and Postgres recording it. Nothing comes back
//! twice. One such sale per setting of `rebuy_after_expiry`, and four larger
//! sales nobody pays for, so that a pass has enough work to be killed in.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use rand::seq::SliceRandom;
use uuid::Uuid;

use crate::harness::{Db, Options, Retried, Stack, User};
use crate::invariants::{AllowedLoss, CUT_AT_A_KILL, assert_invariants, final_answers, reconcile};
use crate::storm::{self, Op, Plan, Record, Work, orders_of};

/// Both servers' expiry pass and sweep run this often (ms): the orders and
/// returns the test needs come due within its time.
const FAST_JOBS: [(&str, &str); 2] = [("STAMPEDE_EXPIRE_MS", "50"), ("STAMPEDE_SWEEP_MS", "200")];
/// Payment window of every sale: time enough to buy, settle and pay 140 orders.
const WINDOW_S: i64 = 8;
const UNITS: i64 = 100;
const PAYERS: usize = 70;
const UNPAID: i64 = UNITS - PAYERS as i64;
const BULK_SALES: usize = 4;
const BULK_UNITS: i64 = 250;
/// When each SIGKILL of both servers strikes (the loop ends sooner when no work is
/// left). The expiry lock of a killed pass is held for its 10 s lease, so passes
/// come about 10 s apart (at the deadline, then twice after a lease ran out) and
/// the sweep finishes a killed pass's returns about 2 s after it.
const KILLS: [Strike; 5] = [
    // The first pass at the deadline, once it has started applying returns.
    Strike::RedisApplied,
    // The sweep, at its first return applied in Redis.
    Strike::AnyStep,
    // The pass after the lease, once its first expiry batch has committed.
    Strike::AnyStep,
    // The sweep again.
    Strike::AnyStep,
    // The pass after the next lease, once it has started applying returns.
    Strike::RedisApplied,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strike {
    /// As soon as an expiry commits or a return is applied in Redis or recorded in
    /// Postgres, while returns are still on their way.
    AnyStep,
    /// As soon as a return is applied in Redis, while returns are still pending.
    RedisApplied,
}

struct Sales {
    /// `rebuy_after_expiry = false`: expired buyers stay buyers.
    keep: i64,
    /// `rebuy_after_expiry = true`: expired buyers may buy again.
    rebuy: i64,
    /// Nobody pays for these.
    bulk: Vec<i64>,
}

impl Sales {
    fn all(&self) -> Vec<i64> {
        let mut all = vec![self.keep, self.rebuy];
        all.extend(&self.bulk);
        all
    }
}

/// What one sale should look like, at rest.
#[derive(Debug, Clone, Copy)]
struct Expect {
    total: i64,
    left: i64,
    buyers: i64,
    awaiting: i64,
    paid: i64,
    expired: i64,
}

fn work(users: &[User], sale: i64) -> Vec<Work> {
    users
        .iter()
        .map(|u| Work {
            user: u.id,
            token: Arc::from(u.token.as_str()),
            op: Op::Purchase { sale },
            server: 0,
        })
        .collect()
}

fn shuffled(mut items: Vec<Work>, servers: usize) -> Vec<Work> {
    items.shuffle(&mut rand::rng());
    storm::spread(&mut items, servers);
    items
}

/// `(user, final answer)` of every purchase of `sale` in `records`.
fn answers_of(records: &[Record], sale: i64) -> Vec<(i64, String)> {
    final_answers(records)
        .into_iter()
        .filter(|r| r.sale() == Some(sale))
        .map(|r| (r.user, r.label()))
        .collect()
}

/// `POST /api/orders/{order}/pay` under one idempotency key until decided: a 503
/// (with `Retry-After` and a code, else a failure) or no answer is sent again.
async fn pay(stack: &Stack, user: &User, order: Uuid) -> u16 {
    let path = format!("/api/orders/{order}/pay");
    let retries = (50, Duration::from_millis(200));
    let key = format!("pay-{order}");
    let (status, _) = stack
        .post_until_decided(&path, &user.token, &key, retries, &Retried::default())
        .await;
    status
}

/// Pays each user's order; every payment must be 200.
async fn pay_all(stack: &Stack, payers: &[(&User, Uuid)]) {
    let answers = join_all(payers.iter().map(|(u, o)| pay(stack, u, *o))).await;
    let refused: Vec<String> = payers
        .iter()
        .zip(&answers)
        .filter(|(_, s)| **s != 200)
        .map(|((u, o), s)| format!("user {} order {o}: {s}", u.id))
        .collect();
    assert!(
        refused.is_empty(),
        "payments within the window not 200 (machine too slow for a {WINDOW_S} s window?): {refused:?}"
    );
}

/// Counts over all the test's sales, for the kill loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Progress {
    /// Orders still awaiting payment (due or not).
    awaiting: i64,
    /// Of those, past their deadline.
    due: i64,
    /// Return rows (one per expired order, same commit).
    returns: i64,
    /// Return rows not recorded as applied.
    pending: i64,
    /// Stock changes Redis has applied (the sales' `changes` hashes).
    in_redis: i64,
}

impl Progress {
    fn done(&self) -> bool {
        self.awaiting == 0 && self.pending == 0
    }

    /// Some expiry or return went a step further since `before` (for
    /// [`Strike::RedisApplied`]: a return reached Redis), and a return is still on
    /// its way: a pass (or the sweep) is between its steps.
    fn mid_pass_since(&self, before: &Progress, strike: Strike) -> bool {
        let moved = match strike {
            Strike::AnyStep => {
                self.returns != before.returns
                    || self.pending != before.pending
                    || self.in_redis != before.in_redis
            }
            Strike::RedisApplied => self.in_redis != before.in_redis,
        };
        moved && self.pending > 0
    }
}

async fn progress(stack: &Stack, sales: &[i64]) -> Progress {
    let (awaiting, due, returns, pending): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM orders
                 WHERE sale_id = ANY($1) AND status = 'awaiting_payment'),
                (SELECT count(*) FROM orders
                 WHERE sale_id = ANY($1) AND status = 'awaiting_payment' AND pay_by <= now()),
                (SELECT count(*) FROM stock_changes WHERE sale_id = ANY($1) AND kind = 'return'),
                (SELECT count(*) FROM stock_changes
                 WHERE sale_id = ANY($1) AND kind = 'return' AND status = 'pending')",
    )
    .bind(sales)
    .fetch_one(&stack.db)
    .await
    .expect("read progress");
    let mut pipe = redis::pipe();
    for &sale in sales {
        pipe.hlen(
            stack
                .keys
                .sale(stampede::domain::Id::new(sale).unwrap())
                .changes,
        );
    }
    let lens: Vec<i64> = pipe
        .query_async(&mut stack.redis().await)
        .await
        .expect("HLEN changes");
    Progress {
        awaiting,
        due,
        returns,
        pending,
        in_redis: lens.iter().sum(),
    }
}

/// One sale's state in both stores.
#[derive(Debug)]
struct Snapshot {
    total: i64,
    left: i64,
    buyers: i64,
    /// Stock changes Redis has applied (each remembered once, by its id).
    in_redis: i64,
    statuses: HashMap<String, i64>,
    /// Return rows by (status, delta).
    returns: HashMap<(String, Option<i64>), i64>,
    /// Pending returns Redis has applied already, and their deltas' sum.
    pending_in_redis: i64,
    pending_delta: i64,
}

async fn snapshot(stack: &Stack, sale: i64) -> Snapshot {
    let total = stack.stock_total(sale).await;
    let statuses = stack.orders_by_status(sale).await;
    let returns: Vec<(String, Option<i64>, i64)> = stack
        .rows(
            "SELECT status, delta, count(*) FROM stock_changes
         WHERE sale_id = $1 AND kind = 'return' GROUP BY status, delta",
            sale,
        )
        .await;
    let pending: Vec<i64> = stack.scalars("SELECT id FROM stock_changes WHERE sale_id = $1 AND kind = 'return' AND status = 'pending'", sale).await;
    let k = stack.keys.sale(stampede::domain::Id::new(sale).unwrap());
    let mut conn = stack.redis().await;
    let (left, buyers, in_redis): (i64, i64, i64) = redis::pipe()
        .get(&k.stock)
        .hlen(&k.buyers)
        .hlen(&k.changes)
        .query_async(&mut conn)
        .await
        .expect("read sale keys");
    let mut pending_in_redis = 0;
    let mut pending_delta = 0;
    if !pending.is_empty() {
        let applied: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(&k.changes)
            .arg(&pending)
            .query_async(&mut conn)
            .await
            .expect("HMGET changes");
        for delta in applied.into_iter().flatten() {
            pending_in_redis += 1;
            pending_delta += delta
                .parse::<i64>()
                .unwrap_or_else(|_| panic!("sale {sale}: a return Redis recorded as {delta}"));
        }
    }
    Snapshot {
        total,
        left,
        buyers,
        in_redis,
        statuses,
        returns: returns.into_iter().map(|(s, d, n)| ((s, d), n)).collect(),
        pending_in_redis,
        pending_delta,
    }
}

/// The stock arithmetic of a sale at rest (no process running that could move
/// it), exact also half-way through a return: `stock_total` (Postgres) plus the
/// deltas Redis applied and Postgres has not recorded yet == units left + buyers
/// (Redis); every unit left is a return Redis applied once; one return row per
/// expired order. Returns (pending returns committed in Postgres only, pending
/// returns applied in Redis and not recorded in Postgres).
fn check_at_rest(sale: i64, s: &Snapshot, rebuy: bool, initial: i64) -> (i64, i64) {
    let n = |status: &str| s.statuses.get(status).copied().unwrap_or(0);
    let rows: i64 = s.returns.values().sum();
    let pending: i64 = s
        .returns
        .iter()
        .filter(|((st, _), _)| st == "pending")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        rows,
        n("expired"),
        "sale {sale}: a return row per expired order: {s:?}"
    );
    assert_eq!(
        s.total + s.pending_delta,
        s.left + s.buyers,
        "sale {sale}: stock_total + deltas applied in Redis only == units left + buyers: {s:?}"
    );
    assert_eq!(
        s.left, s.in_redis,
        "sale {sale}: each unit left is one return applied once in Redis: {s:?}"
    );
    assert!(
        s.in_redis <= rows,
        "sale {sale}: more returns in Redis than rows: {s:?}"
    );
    let applied = rows - pending;
    if rebuy {
        assert_eq!(
            s.total, initial,
            "sale {sale}: stock_total does not move: {s:?}"
        );
        assert_eq!(s.buyers, initial - s.in_redis, "sale {sale}: {s:?}");
    } else {
        assert_eq!(
            s.total,
            initial + applied,
            "sale {sale}: stock_total grew once per recorded return: {s:?}"
        );
        assert_eq!(s.buyers, initial, "sale {sale}: expired buyers stay: {s:?}");
    }
    (pending - s.pending_in_redis, s.pending_in_redis)
}

/// A sale at rest is exactly `e`, every return applied once, and the reconcile
/// endpoint agrees (consistent, orders by status).
async fn expect_sale(stack: &Stack, sale: i64, rebuy: bool, e: Expect, step: &str) {
    let s = snapshot(stack, sale).await;
    println!("{step}: sale {sale}: {s:?}");
    let n = |status: &str| s.statuses.get(status).copied().unwrap_or(0);
    assert_eq!(
        (s.total, s.left, s.buyers),
        (e.total, e.left, e.buyers),
        "{step}: sale {sale}: (stock_total, units left, buyers): {s:?}"
    );
    assert_eq!(
        (
            n("awaiting_payment"),
            n("paid"),
            n("expired"),
            n("accepted")
        ),
        (e.awaiting, e.paid, e.expired, 0),
        "{step}: sale {sale}: orders (awaiting_payment, paid, expired, accepted): {s:?}"
    );
    let delta = i64::from(!rebuy);
    let want: HashMap<(String, Option<i64>), i64> = match e.expired {
        0 => HashMap::new(),
        n => HashMap::from([(("applied".to_string(), Some(delta)), n)]),
    };
    assert_eq!(
        s.returns, want,
        "{step}: sale {sale}: every return applied, once, with delta {delta}"
    );
    assert_eq!(
        s.total,
        s.left + s.buyers,
        "{step}: sale {sale}: arithmetic"
    );
    let report = reconcile(stack, sale).await.expect("reconcile answers");
    assert_eq!(report["consistent"], true, "{step}: sale {sale}: {report}");
    let orders: Vec<i64> = [
        "accepted",
        "awaiting_payment",
        "paid",
        "expired",
        "returned",
    ]
    .iter()
    .map(|k| report["orders"][k].as_i64().unwrap_or(-1))
    .collect();
    assert_eq!(
        orders,
        [0, e.awaiting, e.paid, e.expired, e.expired],
        "{step}: sale {sale}: reconcile orders (accepted, awaiting_payment, paid, expired, returned): {report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unpaid_orders_come_back_exactly_once_while_the_expiry_job_is_killed() {
    let mut stack = Stack::start("payment-expiry", Options::servers(2).with(&FAST_JOBS)).await;
    let t0 = Instant::now();
    let mut bulk = Vec::new();
    bulk.push(stack.create_payment_sale(BULK_UNITS, WINDOW_S, false).await);
    let keep = stack.create_payment_sale(UNITS, WINDOW_S, false).await;
    bulk.push(stack.create_payment_sale(BULK_UNITS, WINDOW_S, false).await);
    let rebuy = stack.create_payment_sale(UNITS, WINDOW_S, true).await;
    for _ in 2..BULK_SALES {
        bulk.push(stack.create_payment_sale(BULK_UNITS, WINDOW_S, false).await);
    }
    let sales = Sales { keep, rebuy, bulk };
    let all = sales.all();
    let keep_users = stack.create_users(UNITS as usize, false).await;
    let rebuy_users = stack.create_users(UNITS as usize, false).await;
    let bulk_users = stack.create_users(BULK_UNITS as usize, false).await;

    // Everything sells out: every purchase 202.
    let mut items = work(&keep_users, keep);
    items.extend(work(&rebuy_users, rebuy));
    for &sale in &sales.bulk {
        items.extend(work(&bulk_users, sale));
    }
    let expected_orders = items.len() as i64;
    let bought = storm::run_together(&stack.http, stack.bases(), shuffled(items, 2), 64).await;
    let not_accepted: Vec<&Record> = final_answers(&bought)
        .into_iter()
        .filter(|r| !r.is_accepted())
        .collect();
    assert!(
        not_accepted.is_empty(),
        "purchases not 202: {not_accepted:?}"
    );
    let mut records = bought;
    stack.wait_orders_in_postgres(&all, expected_orders).await;
    println!(
        "{expected_orders} orders bought and settled at {:.1?}",
        t0.elapsed()
    );

    // 70 of each 100 pay within the window.
    let keep_orders = orders_of(&records, keep);
    let rebuy_orders = orders_of(&records, rebuy);
    let payers: Vec<(&User, Uuid)> = keep_users[..PAYERS]
        .iter()
        .map(|u| (u, keep_orders[&u.id]))
        .chain(
            rebuy_users[..PAYERS]
                .iter()
                .map(|u| (u, rebuy_orders[&u.id])),
        )
        .collect();
    pay_all(&stack, &payers).await;
    println!("{} paid at {:.1?}", payers.len(), t0.elapsed());

    // Checkpoint: before the deadline, all sold, nothing expired.
    let sold = |units: i64, paid: i64| Expect {
        total: units,
        left: 0,
        buyers: units,
        awaiting: units - paid,
        paid,
        expired: 0,
    };
    expect_sale(&stack, keep, false, sold(UNITS, PAYERS as i64), "paid").await;
    expect_sale(&stack, rebuy, true, sold(UNITS, PAYERS as i64), "paid").await;
    for &sale in &sales.bulk {
        expect_sale(&stack, sale, false, sold(BULK_UNITS, 0), "paid").await;
    }
    let before = progress(&stack, &all).await;
    assert_eq!(
        (before.due, before.returns),
        (0, 0),
        "the checkpoint was taken before any deadline (machine too slow?)"
    );

    // Over the deadline: buyers who hold a unit keep trying to buy again (never a
    // second unit), while both servers are killed whenever a pass or the sweep is
    // half-way through the returns, and restarted.
    let mut again = work(&keep_users, keep);
    again.extend(work(&rebuy_users[..PAYERS], rebuy));
    let again: Vec<Work> = (0..10).flat_map(|_| again.clone()).collect();
    let retrying = stack.storm(
        shuffled(again, 2),
        Plan {
            rate: 20.0,
            concurrency: 8,
            max_requests: 2_000,
            max_duration: Duration::from_secs(90),
            max_tries: 200,
        },
    );
    let mut kills: Vec<String> = Vec::new();
    let mut mid_pass = 0;
    let mut redis_only = 0;
    let mut pg_only_total = 0;
    for (round, strike) in KILLS.into_iter().enumerate() {
        let base = progress(&stack, &all).await;
        if base.done() {
            break;
        }
        let wait = Duration::from_secs(if round == 0 { WINDOW_S as u64 + 15 } else { 15 });
        let until = Instant::now() + wait;
        let hit = loop {
            let now = progress(&stack, &all).await;
            if now.mid_pass_since(&base, strike) {
                break true;
            }
            if now.done() || Instant::now() > until {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        if !hit {
            break;
        }
        stack.servers[0].kill9();
        stack.servers[1].kill9();
        let at = t0.elapsed();
        let after = progress(&stack, &all).await;
        let (mut pg_only, mut in_redis) = (0, 0);
        let checks = [(keep, false, UNITS), (rebuy, true, UNITS)]
            .into_iter()
            .chain(sales.bulk.iter().map(|&s| (s, false, BULK_UNITS)));
        for (sale, releases, initial) in checks {
            let s = snapshot(&stack, sale).await;
            let (p, r) = check_at_rest(sale, &s, releases, initial);
            pg_only += p;
            in_redis += r;
        }
        let line = format!(
            "kill {} ({strike:?}) at {at:.1?}: {} orders expired, {} due and not yet expired; \
             {} returns pending: {pg_only} committed in Postgres only, {in_redis} applied \
             in Redis and not recorded in Postgres",
            round + 1,
            after.returns,
            after.due,
            after.pending,
        );
        println!("{line}");
        kills.push(line);
        mid_pass += usize::from(after.pending > 0);
        redis_only += in_redis;
        pg_only_total += pg_only;
        stack.restart_server(0).await;
        stack.restart_server(1).await;
        println!("servers back at {:.1?}", t0.elapsed());
    }
    // The last kill may hold the expiry lock for its 10 s lease.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let now = progress(&stack, &all).await;
        if now.done() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "expiry not finished 40 s after the last kill: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    retrying.stop();
    let retried = retrying.finish().await;
    println!("all expired and returned at {:.1?}", t0.elapsed());
    let second: Vec<&Record> = retried.iter().filter(|r| r.is_accepted()).collect();
    assert!(
        second.is_empty(),
        "a buyer holding a unit bought again: {second:?}"
    );
    records.extend(retried);
    assert!(
        mid_pass > 0,
        "no kill landed while returns were on their way: {kills:#?}"
    );
    println!(
        "{} kills, {mid_pass} with returns pending: {pg_only_total} committed in Postgres \
         only, {redis_only} applied in Redis and not recorded in Postgres",
        kills.len()
    );
    assert!(
        pg_only_total > 0 && redis_only > 0,
        "the kills did not land both between an expiry's commit and Redis and between \
         Redis and Postgres recording a return: {kills:#?}"
    );

    // Checkpoint: exactly 30 back in each, every return applied once.
    let back = |units: i64, paid: i64, rebuy: bool| Expect {
        total: if rebuy { units } else { units + (units - paid) },
        left: units - paid,
        buyers: if rebuy { paid } else { units },
        awaiting: 0,
        paid,
        expired: units - paid,
    };
    expect_sale(
        &stack,
        keep,
        false,
        back(UNITS, PAYERS as i64, false),
        "expired",
    )
    .await;
    expect_sale(
        &stack,
        rebuy,
        true,
        back(UNITS, PAYERS as i64, true),
        "expired",
    )
    .await;
    for &sale in &sales.bulk {
        expect_sale(&stack, sale, false, back(BULK_UNITS, 0, false), "expired").await;
    }
    // Both servers were killed in each round: their refused connections are the
    // kills', and each kill may cut the requests in flight.
    let allowed = AllowedLoss::None.with_kills(&[0, 1], KILLS.len() * CUT_AT_A_KILL);
    assert_invariants(&stack, &records, &all, &[], allowed).await;

    // The 30 units sell again, exactly 30, to whoever may buy: newcomers, and on
    // the rebuy sale the expired buyers too; expired buyers of the other sale and
    // paid buyers are refused. Then both sales are sold out.
    // (A server trusts its own sold-out flag for up to a second.)
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let newcomers = stack.create_users(45, false).await;
    let keep_expired = &keep_users[PAYERS..];
    let rebuy_expired = &rebuy_users[PAYERS..];
    let mut items = work(&newcomers, keep);
    items.extend(work(&keep_expired[..10], keep));
    items.extend(work(&newcomers[..35], rebuy));
    items.extend(work(&rebuy_expired[..15], rebuy));
    items.extend(work(&rebuy_users[..5], rebuy));
    let resale = storm::run_together(&stack.http, stack.bases(), shuffled(items, 2), 64).await;
    let holders: HashSet<i64> = keep_expired
        .iter()
        .chain(&rebuy_users[..5])
        .map(|u| u.id)
        .collect();
    for sale in [keep, rebuy] {
        let answers = answers_of(&resale, sale);
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for (user, label) in &answers {
            if holders.contains(user) {
                assert_ne!(
                    label, "purchase 202",
                    "sale {sale}: user {user} holds a unit"
                );
            } else {
                *counts.entry(label.as_str()).or_default() += 1;
            }
        }
        let takers = answers.len() - answers.iter().filter(|(u, _)| holders.contains(u)).count();
        println!("resale of sale {sale}: {counts:?}");
        assert_eq!(
            counts,
            HashMap::from([
                ("purchase 202", UNPAID as usize),
                ("purchase 410 sold_out", takers - UNPAID as usize),
            ]),
            "sale {sale}: exactly {UNPAID} units sold again, the rest sold out"
        );
    }
    records.extend(resale.iter().cloned());
    stack
        .wait_orders_in_postgres(&[keep, rebuy], 2 * UNITS + 2 * UNPAID)
        .await;
    // The new orders are paid within their window too, so nothing expires again.
    let by_id: HashMap<i64, &User> = newcomers
        .iter()
        .chain(&rebuy_users)
        .map(|u| (u.id, u))
        .collect();
    let new_payers: Vec<(&User, Uuid)> = resale
        .iter()
        .filter(|r| r.is_accepted())
        .map(|r| (by_id[&r.user], r.order_id().expect("a 202 has an order id")))
        .collect();
    pay_all(&stack, &new_payers).await;
    let resold = |units: i64, rebuy: bool| Expect {
        total: if rebuy { units } else { units + UNPAID },
        left: 0,
        buyers: if rebuy { units } else { units + UNPAID },
        awaiting: 0,
        paid: units,
        expired: UNPAID,
    };
    expect_sale(&stack, keep, false, resold(UNITS, false), "resold").await;
    expect_sale(&stack, rebuy, true, resold(UNITS, true), "resold").await;
    assert_invariants(&stack, &records, &all, &[], allowed).await;
    println!("done at {:.1?}", t0.elapsed());
}
