//! Scenario: a stream of cancels (buyers' and admins', refunds among them) over
//! two servers, one of which is SIGKILLed in the middle of it and restarted. Every
//! cancel is retried under its `Idempotency-Key` until answered (a retry of a
//! cancel that committed before the kill is replayed, never refused). Afterwards,
//! once the sweep has finished any return a killed request left pending: every
//! cancelled order's units came back exactly once, none lost, in both stores, the
//! orders not cancelled are as they were (paid or awaiting payment), and no answer
//! was a 5xx other than a 503 with `Retry-After`. The fault is shown to land: the
//! SIGKILL succeeded while cancels were still to come, and some cancel lost its
//! answer to it and was sent again to the survivor.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream;
use stampede::domain::Id;

use crate::harness::{Db, Options, Retried, Stack, User};
use crate::invariants::{final_answers, reconcile};
use crate::storm::{self, Op, Work, orders_of};

/// Both servers' expiry pass and sweep run this often (ms): the orders and
/// returns the test needs come due within its time.
const FAST_JOBS: [(&str, &str); 2] = [("STAMPEDE_EXPIRE_MS", "200"), ("STAMPEDE_SWEEP_MS", "200")];
const UNITS: i64 = 300;
/// Of each sale's 300 orders, these are cancelled (the others stay live).
const CANCELLED: i64 = 200;
/// Cancels answered before server #0 is killed.
const KILL_AFTER: usize = 120;

/// How often, and how far apart, a cancel or payment is sent until decided.
const RETRIES: (usize, Duration) = (100, Duration::from_millis(100));

async fn redis_int(stack: &Stack, key: String) -> i64 {
    redis::cmd("GET")
        .arg(key)
        .query_async::<Option<i64>>(&mut stack.redis().await)
        .await
        .unwrap()
        .unwrap_or(0)
}

async fn buyers(stack: &Stack, sale: i64) -> i64 {
    redis::cmd("HLEN")
        .arg(stack.keys.sale(Id::new(sale).unwrap()).buyers)
        .query_async(&mut stack.redis().await)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn cancels_through_a_server_kill_return_every_unit_exactly_once() {
    let mut stack = Stack::start("cancel-kill", Options::servers(2).with(&FAST_JOBS)).await;
    let keep = stack.create_payment_sale(UNITS, 600, false).await;
    let rebuy = stack.create_payment_sale(UNITS, 600, true).await;
    let users = stack.create_users(UNITS as usize, false).await;
    let mut items: Vec<Work> = Vec::new();
    for sale in [keep, rebuy] {
        items.extend(users.iter().map(|u| Work {
            user: u.id,
            token: Arc::from(u.token.as_str()),
            op: Op::Purchase { sale },
            server: 0,
        }));
    }
    storm::spread(&mut items, 2);
    let bought = storm::run_together(&stack.http, stack.bases(), items, 32).await;
    assert!(
        final_answers(&bought).iter().all(|r| r.is_accepted()),
        "every purchase 202"
    );
    stack
        .wait_orders_in_postgres(&[keep, rebuy], 2 * UNITS)
        .await;
    let retried = Retried::default();

    // A third of the keep sale's buyers pay: their orders will be refunded.
    let keep_orders = orders_of(&bought, keep);
    let rebuy_orders = orders_of(&bought, rebuy);
    let payers: Vec<&User> = users.iter().step_by(3).collect();
    let paid = stream::iter(payers.iter().map(|u| {
        let path = format!("/api/orders/{}/pay", keep_orders[&u.id]);
        let retried = &retried;
        let stack = &stack;
        async move {
            stack
                .post_until_decided(&path, &u.token, "pay", RETRIES, retried)
                .await
                .0
        }
    }))
    .buffer_unordered(16)
    .collect::<Vec<u16>>()
    .await;
    assert!(paid.iter().all(|s| *s == 200), "payments: {paid:?}");

    // The cancels: the first 200 orders of each sale (by user), the buyer's own
    // where it is unpaid and the user's index is even, else an admin's.
    struct Cancel {
        path: String,
        token: String,
        key: String,
        refund: bool,
    }
    let mut cancels = Vec::new();
    for (i, u) in users.iter().enumerate().take(CANCELLED as usize) {
        for (sale_orders, is_keep) in [(&keep_orders, true), (&rebuy_orders, false)] {
            let order = sale_orders[&u.id];
            let refund = is_keep && i % 3 == 0;
            let (path, token) = if i % 2 == 0 && !refund {
                (format!("/api/orders/{order}/cancel"), u.token.clone())
            } else {
                (
                    format!("/api/admin/orders/{order}/cancel"),
                    stack.admin.token.clone(),
                )
            };
            cancels.push(Cancel {
                path,
                token,
                key: format!("cancel-{order}"),
                refund,
            });
        }
    }
    let answered = AtomicUsize::new(0);
    let started = Instant::now();
    let stack_ref = &stack;
    let firing = stream::iter(cancels.iter().map(|c| {
        let (answered, retried) = (&answered, &retried);
        async move {
            let (status, body) = stack_ref
                .post_until_decided(&c.path, &c.token, &c.key, RETRIES, retried)
                .await;
            answered.fetch_add(1, Ordering::Relaxed);
            (status, body, c.refund)
        }
    }))
    .buffer_unordered(8)
    .collect::<Vec<_>>();
    // Kill server #0 mid-stream (and bring it back) while the cancels keep going.
    let killer = async {
        while answered.load(Ordering::Relaxed) < KILL_AFTER {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (answered.load(Ordering::Relaxed), started.elapsed())
    };
    let unanswered_before = retried.unanswered.load(Ordering::Relaxed);
    let (answers, (at, when, killed)) = tokio::join!(firing, async {
        let (at, when) = killer.await;
        // `kill9` needs the stack mutably, which the stream holds shared: the
        // same SIGKILL by pid (the child is reaped below).
        let pid = stack_ref.servers[0].pid().expect("server #0 runs");
        let killed = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .expect("run kill");
        (at, when, killed)
    });
    let cut = retried.unanswered.load(Ordering::Relaxed) - unanswered_before;
    let replayed = retried.replayed.load(Ordering::Relaxed);
    println!(
        "server #0 killed ({killed}) after {at} cancels at {when:.1?}; {} answers, {} 503s, {cut} attempts without an answer, {replayed} replays",
        answers.len(),
        retried.unavailable.load(Ordering::Relaxed)
    );
    // The fault landed: the SIGKILL went to a running server #0 while cancels were
    // still to come, and cancels lost their answer to it (cut off in flight, or
    // refused: every cancel tries server #0 first) and were sent again under their
    // key to the survivor. (A replay is printed, not required: it needs a cancel
    // that committed in the instant before the kill.)
    assert!(killed.success(), "kill -9 of server #0: {killed}");
    assert!(
        at < cancels.len(),
        "server #0 was killed after {at} of {} cancels: none left to cut",
        cancels.len()
    );
    assert!(
        cut > 0,
        "no cancel lost its answer to the kill of server #0: the fault did not land"
    );
    let pending: i64 = stack
        .scalar(
            "SELECT count(*) FROM stock_changes WHERE sale_id = ANY($1) AND status = 'pending'",
            [keep, rebuy],
        )
        .await;
    println!("returns still pending after the stream: {pending}");
    for (status, body, refund) in &answers {
        assert_eq!(*status, 200, "{body}");
        let want = if *refund { "refunded" } else { "cancelled" };
        assert_eq!(body["status"], want, "{body}");
        assert_eq!(body["units_returned"], 1, "{body}");
    }
    // A fresh server #0; its sweep (and the survivor's) finish what the kill left.
    stack.servers[0].kill9();
    stack.restart_server(0).await;
    stack.wait_stock_changes_applied(&[keep, rebuy]).await;

    for (sale, rebuy_after_expiry) in [(keep, false), (rebuy, true)] {
        // The orders not cancelled are as they were: the keep sale's payers paid,
        // every other order awaiting its payment.
        let states: Vec<(i64, String)> = stack
            .rows(
                "SELECT user_id, status FROM orders WHERE sale_id = $1",
                sale,
            )
            .await;
        let states: std::collections::HashMap<i64, String> = states.into_iter().collect();
        for (i, u) in users.iter().enumerate().skip(CANCELLED as usize) {
            let want = if !rebuy_after_expiry && i % 3 == 0 {
                "paid"
            } else {
                "awaiting_payment"
            };
            assert_eq!(
                states.get(&u.id).map(String::as_str),
                Some(want),
                "sale {sale}: user {} (index {i}) cancelled nothing, its order stays {want}",
                u.id
            );
        }
        let statuses = stack.orders_by_status(sale).await;
        let refunded = if rebuy_after_expiry { 0 } else { 67 };
        let cancelled = CANCELLED - refunded;
        assert_eq!(statuses.get("cancelled").copied().unwrap_or(0), cancelled);
        assert_eq!(statuses.get("refunded").copied().unwrap_or(0), refunded);
        let returns: (i64, i64, i64) = stack.row("SELECT count(*), count(*) FILTER (WHERE status = 'applied'), COALESCE(sum(delta), 0)::int8
             FROM stock_changes WHERE sale_id = $1 AND kind = 'return'", sale).await;
        let total = stack.stock_total(sale).await;
        let k = stack.keys.sale(Id::new(sale).unwrap());
        let left = redis_int(&stack, k.stock).await;
        let buyers = buyers(&stack, sale).await;
        let step = format!("sale {sale} (rebuy {rebuy_after_expiry})");
        assert_eq!(
            returns.0, CANCELLED,
            "{step}: one return per cancelled order"
        );
        assert_eq!(returns.1, CANCELLED, "{step}: every return applied");
        assert_eq!(left, CANCELLED, "{step}: every unit back once in Redis");
        if rebuy_after_expiry {
            assert_eq!(returns.2, 0, "{step}");
            assert_eq!(total, UNITS, "{step}");
            assert_eq!(buyers, UNITS - CANCELLED, "{step}");
        } else {
            assert_eq!(returns.2, CANCELLED, "{step}");
            assert_eq!(total, UNITS + CANCELLED, "{step}");
            assert_eq!(buyers, UNITS, "{step}");
        }
        assert_eq!(total, left + buyers, "{step}: stock_total = left + buyers");
        let report = reconcile(&stack, sale).await.expect("a reconcile report");
        assert_eq!(report["consistent"], true, "{step}: {report}");
    }
    let refunds: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM payments WHERE refunded_at IS NOT NULL AND http_status = 200",
    )
    .fetch_one(&stack.db)
    .await
    .unwrap();
    assert_eq!(refunds, 67, "each refunded order's payment marked once");
}
