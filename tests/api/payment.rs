//! Payment and units that come back: an accepted order of a sale with a payment
//! window waits for `POST /api/orders/{id}/pay`; unpaid past its deadline it
//! expires, and its unit goes back to the sale exactly once, whatever dies between
//! Postgres and Redis. Payment and expiry racing for one order: exactly one wins.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::Value;
use stampede::domain::Id;
use stampede::sale::{payment, stock};
use uuid::Uuid;

use crate::helpers::{Db, TestApp, User, assert_error, spawn_app_with, spawn_with_payment_sale};

async fn wait_settled(app: &TestApp, sale: i64, expected: usize) {
    assert_eq!(app.wait_for_orders(sale, expected).await.len(), expected);
}

/// Sleeps until every order of the sale is past its deadline (by Postgres's clock).
async fn wait_past_deadlines(app: &TestApp, sale: i64) {
    for _ in 0..200 {
        let due: bool = app
            .scalar(
                "SELECT COALESCE(max(pay_by) < now(), true) FROM orders WHERE sale_id = $1",
                sale,
            )
            .await;
        if due {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the deadlines never passed");
}

/// 100 units, 100 buyers, 30 never pay: after the deadline exactly 30 units are back
/// and exactly 30 more purchases get them. The expiry is interrupted twice on the
/// way, as a process that dies would leave it: once after the Postgres commit and
/// before Redis (returns recorded, not applied), once after Redis applied a return
/// and before Postgres recorded it. Nothing comes back twice. Both settings of
/// whether an expired buyer may buy again.
#[tokio::test]
async fn thirty_unpaid_orders_give_back_exactly_thirty_units_once() {
    for rebuy in [false, true] {
        thirty_unpaid(rebuy).await;
    }
}

async fn thirty_unpaid(rebuy: bool) {
    // The test drives the expiry pass itself (`expire_once`, what the job runs).
    let (app, admin, sale) = spawn_with_payment_sale(100, 4, rebuy).await;
    let sale_id = Id::new(sale).unwrap();
    let (users, orders) = app.buyers_at_once(sale, 100).await;
    assert_error(
        app.purchase(sale, &app.user().await.token).await,
        StatusCode::GONE,
        "sold_out",
    )
    .await;
    wait_settled(&app, sale, 100).await;
    let (payers, unpaid) = users.split_at(70);
    let paid = join_all(
        payers
            .iter()
            .map(|user| app.pay(user, orders[&user.id], "pay-1")),
    )
    .await;
    assert!(paid.iter().all(|r| r.status() == StatusCode::OK));
    assert_eq!(app.stock_left(sale).await, 0);
    app.assert_stock_arithmetic(&admin, sale, "all sold, 70 paid")
        .await;

    wait_past_deadlines(&app, sale).await;
    // A payment after the deadline is refused, even before the job has run.
    let late = &unpaid[0];
    assert_error(
        app.pay(late, orders[&late.id], "late").await,
        StatusCode::GONE,
        "payment_expired",
    )
    .await;

    // Crash 1: ten orders expire in Postgres (with their returns), and the process
    // dies before Redis hears of it.
    let (expired, _) = payment::expire_due(&app.db, 10).await.unwrap();
    assert_eq!(expired, 10);
    assert_eq!(app.returns_by_status(sale).await.get("pending"), Some(&10));
    assert_eq!(app.stock_left(sale).await, 0, "nothing applied yet");
    app.assert_stock_arithmetic(&admin, sale, "10 returns recorded, none applied")
        .await;

    // Crash 2: those returns reach Redis, and the process dies before Postgres
    // records them (the transaction never commits).
    {
        let mut tx = app.db.begin().await.unwrap();
        sqlx::query("SELECT id FROM sales WHERE id = $1 FOR UPDATE")
            .bind(sale)
            .execute(&mut *tx)
            .await
            .unwrap();
        let applied =
            stock::apply_pending_locked(&mut tx, &mut app.redis.clone(), &app.keys, sale_id)
                .await
                .unwrap();
        assert_eq!(applied.len(), 10);
        drop(tx);
    }
    assert_eq!(app.stock_left(sale).await, 10, "Redis applied them");
    assert_eq!(app.returns_by_status(sale).await.get("pending"), Some(&10));

    // The job runs (twice): the other twenty expire, and every return is applied
    // once; the ten Redis already applied are not applied again.
    assert_eq!(
        stampede::startup::expire_once(&app.state).await.unwrap(),
        20
    );
    assert_eq!(stampede::startup::expire_once(&app.state).await.unwrap(), 0);
    let (total, statuses) = (
        app.stock_total(sale).await,
        app.orders_by_status(sale).await,
    );
    assert_eq!(statuses.get("expired"), Some(&30));
    assert_eq!(statuses.get("paid"), Some(&70));
    assert_eq!(
        app.returns_by_status(sale).await,
        HashMap::from([("applied".into(), 30)])
    );
    assert_eq!(app.stock_left(sale).await, 30, "exactly 30 units back");
    let buyers: HashSet<i64> = app.buyers(sale).await.into_iter().collect();
    if rebuy {
        assert_eq!(total, 100, "units ever offered do not move");
        assert_eq!(buyers.len(), 70, "expired buyers left the buyers hash");
    } else {
        assert_eq!(total, 130, "30 units offered again");
        assert_eq!(buyers.len(), 100, "expired buyers stay buyers");
    }
    app.assert_stock_arithmetic(&admin, sale, "30 back").await;

    // The returned units sell at once (the process's sold-out flag was cleared),
    // exactly 30 of them; then the sale is sold out again.
    let newcomers = app.create_users(30, false).await;
    let mut takers: Vec<&User> = Vec::new();
    if rebuy {
        // Expired buyers may buy again: ten of them do.
        takers.extend(&unpaid[..10]);
        takers.extend(&newcomers[..20]);
    } else {
        for user in &unpaid[..5] {
            assert_error(
                app.purchase(sale, &user.token).await,
                StatusCode::CONFLICT,
                "already_bought",
            )
            .await;
        }
        takers.extend(&newcomers);
    }
    let answers = join_all(takers.iter().map(|u| app.purchase(sale, &u.token))).await;
    assert!(answers.iter().all(|r| r.status() == StatusCode::ACCEPTED));
    assert_error(
        app.purchase(sale, &app.user().await.token).await,
        StatusCode::GONE,
        "sold_out",
    )
    .await;
    assert_eq!(app.stock_left(sale).await, 0);
    // 100 first orders (30 of them expired) and 30 new ones.
    wait_settled(&app, sale, 130).await;
    app.assert_stock_arithmetic(&admin, sale, "30 resold").await;

    // A rebuild from Postgres (the admin's repair) comes to the same numbers.
    let buyers_before: HashSet<i64> = app.buyers(sale).await.into_iter().collect();
    app.repair(&admin, sale).await;
    let buyers_after: HashSet<i64> = app.buyers(sale).await.into_iter().collect();
    assert_eq!(buyers_after, buyers_before);
    assert_eq!(app.stock_left(sale).await, 0);
    assert_eq!(
        app.returns_by_status(sale).await,
        HashMap::from([("applied".into(), 30)])
    );
    app.assert_stock_arithmetic(&admin, sale, "after a rebuild")
        .await;
}

/// Pay and expire at the same instant, for 200 orders: each ends paid or expired,
/// never both; every 200 is a paid order, every 410 an expired one; returned units
/// = expired orders, in both stores.
#[tokio::test]
async fn payment_and_expiry_racing_for_200_orders_never_both() {
    let app = Arc::new(spawn_app_with(|c| c.expire = Duration::ZERO).await);
    let admin = app.admin().await;
    let sale = app.payment_sale(&admin, 200, 60, false).await;
    let (users, orders) = app.buyers_at_once(sale, 200).await;
    wait_settled(&app, sale, 200).await;
    // Every deadline lands 600 ms from now; the payments go out spread over the
    // 600 ms around it, while the expiry job runs in a tight loop.
    sqlx::query("UPDATE orders SET pay_by = now() + interval '600 ms' WHERE sale_id = $1")
        .bind(sale)
        .execute(&app.db)
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    // The job runs for 1.5 s and until every payment has answered, then once more:
    // a payment that came late (a slow machine) holds its order's row while the
    // job skips it, and answers 410 with the order still due; that last pass,
    // with no payment left, expires it.
    let answered = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let expirer = {
        let app = app.clone();
        let answered = answered.clone();
        tokio::spawn(async move {
            let mut expired = 0;
            loop {
                let last = answered.load(std::sync::atomic::Ordering::SeqCst)
                    && start.elapsed() >= Duration::from_millis(1500);
                expired += stampede::startup::expire_once(&app.state).await.unwrap();
                if last {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            expired
        })
    };
    let payments = join_all(users.iter().enumerate().map(|(i, user)| {
        let app = app.clone();
        let order = orders[&user.id];
        async move {
            tokio::time::sleep_until(start + Duration::from_millis(300 + 3 * i as u64 / 2)).await;
            let resp = app.pay(user, order, &format!("k{i}")).await;
            (order, resp.status())
        }
    }))
    .await;
    answered.store(true, std::sync::atomic::Ordering::SeqCst);
    let expired_by_job = expirer.await.unwrap();
    assert_eq!(stampede::startup::expire_once(&app.state).await.unwrap(), 0);

    let status: HashMap<Uuid, String> = app
        .rows("SELECT id, status FROM orders WHERE sale_id = $1", sale)
        .await
        .into_iter()
        .collect();
    let mut paid = 0;
    for (order, answer) in &payments {
        match *answer {
            StatusCode::OK => {
                paid += 1;
                assert_eq!(status[order], "paid");
            }
            StatusCode::GONE => assert_eq!(status[order], "expired"),
            other => panic!("payment answered {other}"),
        }
    }
    let expired = status.values().filter(|s| *s == "expired").count() as i64;
    assert_eq!(paid + expired, 200, "each order paid or expired");
    assert_eq!(expired, expired_by_job as i64);
    assert!(
        paid > 0 && expired > 0,
        "a real race: {paid} paid, {expired} expired"
    );
    let charged: i64 = app
        .scalar(
            "SELECT count(*) FROM payments p JOIN orders o ON o.id = p.order_id
         WHERE o.sale_id = $1 AND p.http_status = 200",
            sale,
        )
        .await;
    assert_eq!(charged, paid, "one charge per paid order");
    assert_eq!(
        app.returns_by_status(sale).await,
        HashMap::from([("applied".into(), expired)])
    );
    assert_eq!(
        app.stock_left(sale).await,
        expired,
        "returned units = expired orders"
    );
    let total = app.stock_total(sale).await;
    assert_eq!(total, 200 + expired);
    app.assert_stock_arithmetic(&admin, sale, "after the race")
        .await;
}

/// The payment endpoint's answers: idempotent under its key (a retry, even a
/// concurrent one, gets the same answer and there is one charge), and a clear 4xx
/// for everything else, changing nothing.
#[tokio::test]
async fn a_payment_is_idempotent_under_its_key_and_refusals_are_clear() {
    let (app, admin, sale) = spawn_with_payment_sale(10, 600, false).await;
    let plain = app.live_sale(&admin, 10).await;
    let (users, orders) = app.buyers_at_once(sale, 2).await;
    let (alice, bob) = (&users[0], &users[1]);
    wait_settled(&app, sale, 2).await;
    let order = orders[&alice.id];

    // The order shows its deadline before it is paid.
    let shown = app
        .get_json(&format!("/api/orders/{order}"), Some(&alice.token))
        .await;
    assert_eq!(shown["payment"], "awaiting_payment", "{shown}");
    assert!(shown["pay_by"].is_string());

    // No key, a malformed key: 400, nothing paid.
    let resp = app
        .post(&format!("/api/orders/{order}/pay"), Some(&alice.token))
        .await;
    assert_error(resp, StatusCode::BAD_REQUEST, "invalid_idempotency_key").await;
    assert_error(
        app.pay(alice, order, &"x".repeat(201)).await,
        StatusCode::BAD_REQUEST,
        "invalid_idempotency_key",
    )
    .await;
    // Someone else's order, a made-up one: 404.
    assert_error(
        app.pay(bob, order, "b1").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    assert_error(
        app.pay(alice, Uuid::new_v4(), "a0").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let bad = app
        .client
        .post(app.url("/api/orders/not-a-uuid/pay"))
        .bearer_auth(&alice.token)
        .header("Idempotency-Key", "a0")
        .send()
        .await
        .unwrap();
    assert_error(bad, StatusCode::BAD_REQUEST, "invalid_id").await;
    let unpaid: i64 = sqlx::query_scalar("SELECT count(*) FROM payments")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(unpaid, 0, "no refusal wrote anything");

    // Ten concurrent requests with one key: one charge, ten identical answers.
    let answers = join_all((0..10).map(|_| app.pay(alice, order, "alice-1"))).await;
    let mut bodies = Vec::new();
    let mut replayed = 0;
    for resp in answers {
        assert_eq!(resp.status(), StatusCode::OK);
        replayed += usize::from(resp.headers().contains_key("idempotent-replayed"));
        bodies.push(resp.json::<Value>().await.unwrap());
    }
    assert_eq!(replayed, 9, "one decided, nine replayed");
    assert!(bodies.iter().all(|b| *b == bodies[0]));
    assert_eq!(bodies[0]["status"], "paid");
    assert_eq!(bodies[0]["amount_cents"], 500);
    let charges: i64 = app
        .scalar("SELECT count(*) FROM payments WHERE order_id = $1", order)
        .await;
    assert_eq!(charges, 1);

    // A new key on a paid order: 409, and that answer is kept for its key too.
    assert_error(
        app.pay(alice, order, "alice-2").await,
        StatusCode::CONFLICT,
        "already_paid",
    )
    .await;
    let shown = app
        .get_json(&format!("/api/orders/{order}"), Some(&alice.token))
        .await;
    assert_eq!(shown["payment"], "paid");

    // An order of a sale with no payment step: 409; and a key that paid one order
    // sent for another: 422.
    let plain_orders = app.buy_all(plain, &users).await;
    wait_settled(&app, plain, 2).await;
    assert_error(
        app.pay(bob, plain_orders[&bob.id], "bob-plain").await,
        StatusCode::CONFLICT,
        "no_payment_needed",
    )
    .await;
    assert_error(
        app.pay(alice, plain_orders[&alice.id], "alice-1").await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
    )
    .await;
    // Bob's own first key is his: his order pays.
    let resp = app.pay(bob, orders[&bob.id], "alice-1").await;
    assert_eq!(resp.status(), StatusCode::OK);
}

/// The job runs by itself in `serve`: an unpaid order expires shortly after its
/// deadline, and its unit sells at once to the buyer the sale had just refused
/// as sold out (the process's sold-out flag is cleared with the return).
#[tokio::test]
async fn the_expiry_job_returns_an_unpaid_unit_and_it_sells_at_once() {
    let app = spawn_app_with(|c| {
        c.expire = Duration::from_millis(200);
        c.sold_out_cache = Duration::from_secs(60);
    })
    .await;
    let admin = app.admin().await;
    let sale = app.payment_sale(&admin, 1, 1, false).await;
    let (first, second) = (app.user().await, app.user().await);
    app.buy(sale, &first.token).await;
    assert_error(
        app.purchase(sale, &second.token).await,
        StatusCode::GONE,
        "sold_out",
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let resp = app.purchase(sale, &second.token).await;
        if resp.status() == StatusCode::ACCEPTED {
            break;
        }
        assert_eq!(resp.status(), StatusCode::GONE);
        assert!(
            std::time::Instant::now() < deadline,
            "the unit never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_settled(&app, sale, 2).await;
    let (total, statuses) = (
        app.stock_total(sale).await,
        app.orders_by_status(sale).await,
    );
    assert_eq!(statuses.get("expired"), Some(&1));
    assert_eq!(statuses.get("awaiting_payment"), Some(&1));
    assert_eq!(total, 2);
    app.assert_stock_arithmetic(&admin, sale, "resold").await;
}

/// A rebuild of a sale whose expired buyers may buy again counts the returns still
/// pending (it leaves their buyers out) and remembers them in Redis as applied. If
/// its transaction never commits (the process dies after Redis is restored), the
/// returns are pending again in Postgres, and applying them later must change
/// nothing: not take the unit of the buyer's new order, not count it twice.
#[tokio::test]
async fn a_rebuild_that_dies_before_its_commit_never_returns_a_unit_twice() {
    let (app, admin, sale) = spawn_with_payment_sale(2, 2, true).await;
    let users = app.create_users(2, false).await;
    app.buy_all(sale, &users).await;
    wait_settled(&app, sale, 2).await;
    wait_past_deadlines(&app, sale).await;
    // Both expire; their returns are recorded, not applied (a pass that died).
    assert_eq!(payment::expire_due(&app.db, 10).await.unwrap().0, 2);
    // The admin's repair rebuilds the sale: both buyers out, both units back.
    app.repair(&admin, sale).await;
    assert_eq!(app.stock_left(sale).await, 2);
    assert!(app.buyers(sale).await.is_empty());
    assert_eq!(
        app.returns_by_status(sale).await,
        HashMap::from([("applied".into(), 2)])
    );
    // As if that rebuild's transaction had never committed.
    sqlx::query(
        "UPDATE stock_changes SET status = 'pending', delta = NULL, applied_at = NULL
         WHERE sale_id = $1 AND kind = 'return'",
    )
    .bind(sale)
    .execute(&app.db)
    .await
    .unwrap();
    // The first buyer buys again; then the returns are applied by the next pass.
    app.buy(sale, &users[0].token).await;
    assert_eq!(app.stock_left(sale).await, 1);
    assert_eq!(stampede::startup::expire_once(&app.state).await.unwrap(), 0);
    assert_eq!(
        app.returns_by_status(sale).await,
        HashMap::from([("applied".into(), 2)])
    );
    assert_eq!(app.stock_left(sale).await, 1, "no unit came back twice");
    assert_eq!(
        app.buyers(sale).await,
        vec![users[0].id],
        "the new order keeps its unit"
    );
    wait_settled(&app, sale, 3).await;
    app.assert_stock_arithmetic(&admin, sale, "after the replayed returns")
        .await;
}

/// A stream entry (and pending-hash entry) left behind by a settlement worker that
/// died after its commit belongs to an order Postgres has: when that order has
/// expired on a sale whose expired buyers may buy again, a rebuild must not make
/// its buyer a buyer again (and lose a unit).
#[tokio::test]
async fn a_rebuild_ignores_leftover_stream_entries_of_expired_orders() {
    let (app, admin, sale) = spawn_with_payment_sale(2, 2, true).await;
    let (users, orders) = app.buyers_at_once(sale, 1).await;
    wait_settled(&app, sale, 1).await;
    wait_past_deadlines(&app, sale).await;
    assert_eq!(stampede::startup::expire_once(&app.state).await.unwrap(), 1);
    assert_eq!(app.stock_left(sale).await, 2);
    // The entries a worker that died after its commit would have left.
    let k = app.sale_keys(sale);
    let order = orders[&users[0].id].to_string();
    let _: String = app
        .redis_query(
            redis::cmd("XADD")
                .arg(&k.orders)
                .arg("*")
                .arg("order_id")
                .arg(&order)
                .arg("sale_id")
                .arg(sale)
                .arg("user_id")
                .arg(users[0].id)
                .arg("at_ms")
                .arg(chrono::Utc::now().timestamp_millis()),
        )
        .await;
    let _: i64 = app
        .redis_query(
            redis::cmd("HSET")
                .arg(&k.pending)
                .arg(&order)
                .arg(users[0].id),
        )
        .await;
    app.repair(&admin, sale).await;
    assert!(
        app.buyers(sale).await.is_empty(),
        "the expired buyer stays out"
    );
    assert_eq!(app.stock_left(sale).await, 2, "no unit lost");
}
