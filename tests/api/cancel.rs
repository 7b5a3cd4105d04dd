//! Cancel and refund: the buyer cancels an unpaid order, an admin cancels any live
//! one (a paid one is refunded); the units go back exactly once, through the same
//! 'return' stock change as an expired order's, and whether the buyer may buy
//! again is the sale's `rebuy_after_expiry`. Cancels racing payments, expiry and
//! each other over two instances: exactly one wins per order.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};
use stampede::domain::Id;
use stampede::sale::order_id::new_order_id;
use uuid::Uuid;

use crate::helpers::{
    Db, TestApp, User, assert_error, spawn_app_with, spawn_sibling, spawn_with_live_sale_and,
    spawn_with_payment_sale,
};

/// `POST /api/orders/{id}/cancel` (`admin` false) or the admin's route, with an
/// optional key.
async fn cancel(
    app: &TestApp,
    token: Option<&str>,
    admin: bool,
    order: &str,
    key: Option<&str>,
) -> reqwest::Response {
    let path = if admin {
        format!("/api/admin/orders/{order}/cancel")
    } else {
        format!("/api/orders/{order}/cancel")
    };
    let mut req = app.client.post(app.url(&path));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    req.send().await.unwrap()
}

/// A request sent again while it answers 503 (an outage: Postgres too slow to take
/// the row lock within its statement timeout on a loaded machine), as the API tells
/// clients to; a 503 changed nothing. At most 20 tries, then the test fails.
async fn until_not_503<F, Fut>(mut send: F) -> reqwest::Response
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = reqwest::Response>,
{
    for _ in 0..20 {
        let resp = send().await;
        if resp.status() != StatusCode::SERVICE_UNAVAILABLE {
            return resp;
        }
        assert!(
            resp.headers().contains_key("retry-after"),
            "a 503 without Retry-After"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("still 503 after 20 tries");
}

async fn ok_json(resp: reqwest::Response) -> (Value, bool) {
    assert_eq!(resp.status(), StatusCode::OK);
    let replayed = resp.headers().get("idempotent-replayed").is_some();
    (resp.json().await.unwrap(), replayed)
}

/// `who` cancels `order` (as an admin if `admin`) without a key: a 200, its body
/// and whether it was a replay.
async fn cancel_ok(app: &TestApp, who: &User, admin: bool, order: Uuid) -> (Value, bool) {
    ok_json(cancel(app, Some(&who.token), admin, &order.to_string(), None).await).await
}

async fn status_of(app: &TestApp, order: Uuid) -> String {
    app.scalar("SELECT status FROM orders WHERE id = $1", order)
        .await
}

/// Everything a refused cancel must leave as it was.
async fn snapshot(app: &TestApp, sale: i64) -> (Vec<(Uuid, String)>, i64, i64, i64, i64) {
    let orders: Vec<(Uuid, String)> = app
        .rows(
            "SELECT id, status FROM orders WHERE sale_id = $1 ORDER BY id",
            sale,
        )
        .await;
    let changes: i64 = app
        .scalar(
            "SELECT count(*) FROM stock_changes WHERE sale_id = $1",
            sale,
        )
        .await;
    let audit: i64 =
        sqlx::query_scalar("SELECT count(*) FROM admin_changes WHERE order_id IS NOT NULL")
            .fetch_one(&app.db)
            .await
            .unwrap();
    (
        orders,
        changes,
        audit,
        app.stock_total(sale).await,
        app.stock_left(sale).await,
    )
}

/// Every route's answers, on a sale with a payment window, for both settings of
/// `rebuy_after_expiry`: owner and admin cancels, a refund, replays under a key,
/// every refusal changing nothing; units back exactly once in both stores.
#[tokio::test]
async fn cancels_and_refunds_return_units_once_and_refusals_change_nothing() {
    for rebuy in [false, true] {
        cancels_and_refunds(rebuy).await;
    }
}

async fn cancels_and_refunds(rebuy: bool) {
    let (app, admin, sale) = spawn_with_payment_sale(5, 600, rebuy).await;
    let (users, orders) = app.buyers_at_once(sale, 5).await;
    assert_eq!(app.wait_for_orders(sale, 5).await.len(), 5);
    assert_eq!(app.stock_left(sale).await, 0);
    let (alice, bob, carol, dave, erin) = (&users[0], &users[1], &users[2], &users[3], &users[4]);
    let a = orders[&alice.id].to_string();

    // Refusals first, each changing nothing.
    let before = snapshot(&app, sale).await;
    assert_error(
        cancel(&app, None, false, &a, None).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    assert_error(
        cancel(&app, None, true, &a, None).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    assert_error(
        cancel(&app, Some(&alice.token), true, &a, None).await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    assert_error(
        cancel(&app, Some(&bob.token), false, &a, None).await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    for admin_route in [false, true] {
        let token = if admin_route {
            &admin.token
        } else {
            &alice.token
        };
        assert_error(
            cancel(
                &app,
                Some(token),
                admin_route,
                &Uuid::new_v4().to_string(),
                None,
            )
            .await,
            StatusCode::NOT_FOUND,
            "not_found",
        )
        .await;
        assert_error(
            cancel(&app, Some(token), admin_route, "not-a-uuid", None).await,
            StatusCode::BAD_REQUEST,
            "invalid_id",
        )
        .await;
        assert_error(
            cancel(&app, Some(token), admin_route, &a, Some(&"k".repeat(201))).await,
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
        )
        .await;
    }
    // Bob pays; as the buyer he may not cancel a paid order.
    assert_eq!(
        app.pay(bob, orders[&bob.id], "bob-pay").await.status(),
        StatusCode::OK
    );
    let before_paid = snapshot(&app, sale).await;
    assert_error(
        cancel(
            &app,
            Some(&bob.token),
            false,
            &orders[&bob.id].to_string(),
            None,
        )
        .await,
        StatusCode::CONFLICT,
        "not_cancellable",
    )
    .await;
    assert_eq!(
        snapshot(&app, sale).await,
        before_paid,
        "refusals changed nothing"
    );
    assert_eq!(before.4, 0);

    // Alice cancels her unpaid order with a key: 200, one unit back.
    let (body, replayed) =
        ok_json(cancel(&app, Some(&alice.token), false, &a, Some("a-1")).await).await;
    assert!(!replayed);
    assert_eq!(body["order_id"], a.as_str());
    assert_eq!(body["status"], "cancelled");
    assert_eq!(body["units_returned"], 1);
    assert!(body["cancelled_at"].is_string());
    assert!(body.get("refunded_cents").is_none(), "{body}");
    assert_eq!(app.stock_left(sale).await, 1);
    // The same key again (sequentially and concurrently): the same answer, replayed.
    let again =
        join_all((0..5).map(|_| cancel(&app, Some(&alice.token), false, &a, Some("a-1")))).await;
    for resp in again {
        let (b, replayed) = ok_json(resp).await;
        assert!(replayed);
        assert_eq!(b, body);
    }
    // Without a key, or with another: 409.
    assert_error(
        cancel(&app, Some(&alice.token), false, &a, None).await,
        StatusCode::CONFLICT,
        "not_cancellable",
    )
    .await;
    assert_error(
        cancel(&app, Some(&alice.token), false, &a, Some("a-2")).await,
        StatusCode::CONFLICT,
        "not_cancellable",
    )
    .await;
    // An admin on an already cancelled order: 409, even under the buyer's key.
    assert_error(
        cancel(&app, Some(&admin.token), true, &a, Some("a-1")).await,
        StatusCode::CONFLICT,
        "not_cancellable",
    )
    .await;
    // Paying a cancelled order is refused.
    assert_error(
        app.pay(alice, orders[&alice.id], "alice-late").await,
        StatusCode::CONFLICT,
        "not_cancellable",
    )
    .await;
    assert_eq!(status_of(&app, orders[&alice.id]).await, "cancelled");

    // The admin refunds Bob's paid order.
    let b = orders[&bob.id].to_string();
    let (body, _) =
        ok_json(cancel(&app, Some(&admin.token), true, &b, Some("refund-b")).await).await;
    assert_eq!(body["status"], "refunded");
    assert_eq!(body["refunded_cents"], 500);
    assert_eq!(body["units_returned"], 1);
    let (replay, replayed) =
        ok_json(cancel(&app, Some(&admin.token), true, &b, Some("refund-b")).await).await;
    assert!(replayed);
    assert_eq!(replay, body);
    let refunded: Vec<(i16, bool)> = app
        .rows(
            "SELECT http_status, refunded_at IS NOT NULL FROM payments WHERE order_id = $1",
            orders[&bob.id],
        )
        .await;
    assert_eq!(
        refunded,
        vec![(200, true)],
        "the payment row is marked refunded"
    );
    assert_error(
        app.pay(bob, orders[&bob.id], "bob-pay-2").await,
        StatusCode::CONFLICT,
        "not_cancellable",
    )
    .await;

    // The admin cancels Carol's unpaid order, without a key; again is 409.
    let c = orders[&carol.id].to_string();
    let (body, _) = ok_json(cancel(&app, Some(&admin.token), true, &c, None).await).await;
    assert_eq!(body["status"], "cancelled");
    assert_error(
        cancel(&app, Some(&admin.token), true, &c, None).await,
        StatusCode::CONFLICT,
        "not_cancellable",
    )
    .await;

    // An expired order cannot be cancelled.
    sqlx::query("UPDATE orders SET pay_by = now() - interval '1 s' WHERE id = $1")
        .bind(orders[&dave.id])
        .execute(&app.db)
        .await
        .unwrap();
    assert_eq!(stampede::startup::expire_once(&app.state).await.unwrap(), 1);
    for (token, admin_route) in [(&dave.token, false), (&admin.token, true)] {
        assert_error(
            cancel(
                &app,
                Some(token),
                admin_route,
                &orders[&dave.id].to_string(),
                None,
            )
            .await,
            StatusCode::CONFLICT,
            "not_cancellable",
        )
        .await;
    }

    // The audit: one refund and one cancel, by the admin, for these orders.
    let audit: Vec<(String, Uuid, i64, Value, Value)> = sqlx::query_as(
        "SELECT action, order_id, admin_id, before, after FROM admin_changes
         WHERE order_id IS NOT NULL ORDER BY id",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(audit.len(), 2, "{audit:?}");
    assert_eq!(
        (audit[0].0.as_str(), audit[0].1, audit[0].2),
        ("refund", orders[&bob.id], admin.id)
    );
    assert_eq!(audit[0].3["status"], "paid");
    assert_eq!(audit[0].4["status"], "refunded");
    assert_eq!(audit[0].4["refunded_cents"], 500);
    assert_eq!(
        (audit[1].0.as_str(), audit[1].1, audit[1].2),
        ("cancel", orders[&carol.id], admin.id)
    );
    let by: Vec<(Uuid, Option<i64>)> = app.rows("SELECT id, cancelled_by FROM orders WHERE sale_id = $1 AND cancelled_at IS NOT NULL ORDER BY id", sale).await;
    let by: HashMap<Uuid, Option<i64>> = by.into_iter().collect();
    assert_eq!(by[&orders[&alice.id]], Some(alice.id));
    assert_eq!(by[&orders[&bob.id]], Some(admin.id));
    assert_eq!(by[&orders[&carol.id]], Some(admin.id));
    assert_eq!(by.len(), 3);

    // Four units back (three cancels, one expiry), each exactly once.
    assert_eq!(
        app.returns_by_status(sale).await,
        HashMap::from([("applied".into(), 4)])
    );
    assert_eq!(app.stock_left(sale).await, 4);
    let buyers: HashSet<i64> = app.buyers(sale).await.into_iter().collect();
    if rebuy {
        assert_eq!(
            app.stock_total(sale).await,
            5,
            "units ever offered do not move"
        );
        assert_eq!(buyers, HashSet::from([erin.id]));
    } else {
        assert_eq!(app.stock_total(sale).await, 9, "four units offered again");
        assert_eq!(buyers.len(), 5, "cancelled buyers stay buyers");
    }
    app.assert_stock_arithmetic(&admin, sale, "after the cancels")
        .await;
    // The reconcile report counts each status, and the four units back.
    let report = app.reconcile_report(&admin, sale).await;
    let counts = &report["orders"];
    assert_eq!(
        (
            &counts["cancelled"],
            &counts["refunded"],
            &counts["expired"]
        ),
        (&json!(2), &json!(1), &json!(1)),
        "{report}"
    );
    assert_eq!(counts["returned"], 4, "{report}");
    let shown = app
        .get_json(&format!("/api/orders/{a}"), Some(&alice.token))
        .await;
    assert_eq!(shown["payment"], "cancelled", "{shown}");

    // Rebuy as after an expiry.
    let resp = app.purchase(sale, &alice.token).await;
    if rebuy {
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        assert_eq!(app.stock_left(sale).await, 3);
    } else {
        assert_error(resp, StatusCode::CONFLICT, "already_bought").await;
        assert_eq!(app.stock_left(sale).await, 4);
    }

    // A rebuild from Postgres comes to the same numbers.
    let left = app.stock_left(sale).await;
    app.repair(&admin, sale).await;
    assert_eq!(app.stock_left(sale).await, left);
    app.assert_stock_arithmetic(&admin, sale, "after a rebuild")
        .await;

    // The counters.
    let m = &app.state.metrics;
    assert_eq!(m.order_cancels_buyer.get(), 1);
    assert_eq!(m.order_cancels_admin.get(), 2);
    assert!(m.order_cancels_refused.get() >= 6);
}

/// A sale with no payment step: its `accepted` orders are cancellable by the buyer
/// and by an admin; an order accepted moments ago and not yet in Postgres answers
/// 503 `order_settling` with `Retry-After`, to its owner and to an admin.
#[tokio::test]
async fn accepted_orders_cancel_and_a_settling_one_says_retry() {
    let (app, admin, sale) = spawn_with_live_sale_and(3, |c| c.expire = Duration::ZERO).await;
    let (users, orders) = app.buyers_at_once(sale, 3).await;
    assert_eq!(app.wait_for_orders(sale, 3).await.len(), 3);
    let (body, _) = cancel_ok(&app, &users[0], false, orders[&users[0].id]).await;
    assert_eq!(body["status"], "cancelled");
    let (body, _) = cancel_ok(&app, &admin, true, orders[&users[1].id]).await;
    assert_eq!(body["status"], "cancelled");
    assert_eq!(app.stock_left(sale).await, 2);
    assert_eq!(app.stock_total(sale).await, 5);
    app.assert_stock_arithmetic(&admin, sale, "two accepted orders cancelled")
        .await;

    // An order still in the pending hash (what settlement has not written yet).
    let settling = new_order_id(Id::new(sale).unwrap());
    let _: i64 = app
        .redis_query(
            redis::cmd("HSET")
                .arg(app.sale_keys(sale).pending)
                .arg(settling.to_string())
                .arg(users[2].id),
        )
        .await;
    for (token, admin_route) in [(&users[2].token, false), (&admin.token, true)] {
        let resp = cancel(&app, Some(token), admin_route, &settling.to_string(), None).await;
        assert_eq!(resp.headers()["retry-after"], "1");
        assert_error(resp, StatusCode::SERVICE_UNAVAILABLE, "order_settling").await;
    }
    // Someone else's settling order: 404.
    assert_error(
        cancel(
            &app,
            Some(&users[0].token),
            false,
            &settling.to_string(),
            None,
        )
        .await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let _: i64 = app
        .redis_query(
            redis::cmd("HDEL")
                .arg(app.sale_keys(sale).pending)
                .arg(settling.to_string()),
        )
        .await;
}

/// 200 orders on a sale with a short payment window, over two instances: per order
/// a cancel (the owner's or an admin's), a payment and a second cancel go out at
/// once, around the deadline, while both instances' expiry jobs run. Afterwards
/// each order is in exactly one final state that agrees with the answers, and the
/// units returned are exactly the cancelled, refunded and expired orders', in both
/// stores.
#[tokio::test]
async fn cancel_pay_cancel_and_expiry_racing_over_two_instances() {
    let app = Arc::new(
        spawn_app_with(|c| {
            c.expire = Duration::from_millis(50);
        })
        .await,
    );
    let sibling = Arc::new(spawn_sibling(&app, |_| {}).await);
    let admin = app.admin().await;
    let sale = app.payment_sale(&admin, 200, 600, false).await;
    let (users, orders) = app.buyers_at_once(sale, 200).await;
    assert_eq!(app.wait_for_orders(sale, 200).await.len(), 200);
    // Every deadline lands 700 ms from now; the requests go out over the second
    // around it.
    sqlx::query("UPDATE orders SET pay_by = now() + interval '700 ms' WHERE sale_id = $1")
        .bind(sale)
        .execute(&app.db)
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    let answers = join_all(users.iter().enumerate().map(|(i, user)| {
        let (app, sibling) = (app.clone(), sibling.clone());
        let admin_token = admin.token.clone();
        let order = orders[&user.id];
        async move {
            tokio::time::sleep_until(start + Duration::from_millis(200 + 5 * i as u64)).await;
            let id = order.to_string();
            let (first, second) = if i % 2 == 0 {
                (&*app, &*sibling)
            } else {
                (&*sibling, &*app)
            };
            // Even orders: the owner cancels; odd ones: an admin. The second cancel
            // is the admin's on the other instance.
            let (admin_route, first_token) = if i % 2 == 0 {
                (false, &user.token)
            } else {
                (true, &admin_token)
            };
            let key = format!("k{i}");
            let (c1, p, c2) = tokio::join!(
                until_not_503(|| cancel(first, Some(first_token), admin_route, &id, None)),
                until_not_503(|| second.pay(user, order, &key)),
                until_not_503(|| cancel(second, Some(&admin_token), true, &id, None)),
            );
            (order, c1.status(), p.status(), c2.status())
        }
    }))
    .await;
    // Let the expiry jobs finish, then one last pass.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stampede::startup::expire_once(&app.state).await.unwrap();
    stampede::startup::expire_once(&sibling.state)
        .await
        .unwrap();

    let status: HashMap<Uuid, String> = app
        .rows("SELECT id, status FROM orders WHERE sale_id = $1", sale)
        .await
        .into_iter()
        .collect();
    let mut by_state: HashMap<&str, i64> = HashMap::new();
    for (order, c1, p, c2) in &answers {
        let s = status[order].as_str();
        *by_state.entry(s).or_default() += 1;
        for c in [c1, c2] {
            assert!(
                *c == StatusCode::OK || *c == StatusCode::CONFLICT,
                "a cancel answered {c}"
            );
        }
        let cancels_ok = [c1, c2].iter().filter(|c| ***c == StatusCode::OK).count();
        match s {
            "cancelled" => {
                assert_eq!(cancels_ok, 1, "one cancel won {order}");
                assert_ne!(*p, StatusCode::OK, "a cancelled order was not paid");
            }
            "refunded" => {
                assert_eq!(cancels_ok, 1, "one cancel won {order}");
                assert_eq!(*p, StatusCode::OK, "a refunded order was paid");
            }
            "paid" => {
                assert_eq!(cancels_ok, 0, "{order}");
                assert_eq!(*p, StatusCode::OK);
            }
            "expired" => {
                assert_eq!(cancels_ok, 0, "{order}");
                assert_ne!(*p, StatusCode::OK);
            }
            other => panic!("order {order} ended {other}"),
        }
        if *p != StatusCode::OK {
            assert!(
                *p == StatusCode::CONFLICT || *p == StatusCode::GONE,
                "a payment answered {p}"
            );
        }
    }
    let returned = by_state.get("cancelled").copied().unwrap_or(0)
        + by_state.get("refunded").copied().unwrap_or(0)
        + by_state.get("expired").copied().unwrap_or(0);
    assert!(
        by_state.get("cancelled").copied().unwrap_or(0) > 0,
        "a real race: {by_state:?}"
    );
    let charged: i64 = app
        .scalar(
            "SELECT count(*) FROM payments p JOIN orders o ON o.id = p.order_id
         WHERE o.sale_id = $1 AND p.http_status = 200",
            sale,
        )
        .await;
    let refunded_rows: i64 = app
        .scalar(
            "SELECT count(*) FROM payments p JOIN orders o ON o.id = p.order_id
         WHERE o.sale_id = $1 AND p.refunded_at IS NOT NULL",
            sale,
        )
        .await;
    assert_eq!(
        charged,
        by_state.get("paid").copied().unwrap_or(0) + by_state.get("refunded").copied().unwrap_or(0)
    );
    assert_eq!(
        refunded_rows,
        by_state.get("refunded").copied().unwrap_or(0)
    );
    assert_eq!(
        app.returns_by_status(sale).await,
        HashMap::from([("applied".into(), returned)]),
        "{by_state:?}"
    );
    assert_eq!(app.stock_left(sale).await, returned, "{by_state:?}");
    assert_eq!(app.stock_total(sale).await, 200 + returned);
    app.assert_stock_arithmetic(&admin, sale, "after the race")
        .await;
}

/// The buttons: My orders offers "Cancel order" on an unpaid order only; the
/// admin's orders page offers "Cancel" on an unpaid order and "Cancel and refund"
/// on a paid one, and none on a cancelled one, which shows its badge.
#[tokio::test]
async fn pages_offer_cancel_where_it_is_allowed_and_show_the_new_state() {
    let (app, admin, sale) = spawn_with_payment_sale(5, 600, false).await;
    let (users, orders) = app.buyers_at_once(sale, 3).await;
    assert_eq!(app.wait_for_orders(sale, 3).await.len(), 3);
    assert_eq!(
        app.pay(&users[1], orders[&users[1].id], "p").await.status(),
        StatusCode::OK
    );
    let row_of = |body: &str, order: Uuid| -> String {
        let start = body
            .find(&format!(r#"data-order-id="{order}""#))
            .unwrap_or_else(|| panic!("row of {order}"));
        let rest = &body[start..];
        rest[..rest.find("</tr>").unwrap()].to_string()
    };

    let mine = app.html("/me/orders", Some(&users[0])).await;
    assert!(row_of(&mine, orders[&users[0].id]).contains(r#"data-action="cancel""#));
    let paid = app.html("/me/orders", Some(&users[1])).await;
    assert!(!row_of(&paid, orders[&users[1].id]).contains(r#"data-action="cancel""#));

    let path = format!("/admin/sales/{sale}/orders");
    let page = app.html(&path, Some(&admin)).await;
    let unpaid_row = row_of(&page, orders[&users[0].id]);
    assert!(unpaid_row.contains(r#"data-action="cancel""#) && !unpaid_row.contains("refund"));
    assert!(row_of(&page, orders[&users[1].id]).contains("Cancel and refund"));

    cancel_ok(&app, &users[0], false, orders[&users[0].id]).await;
    cancel_ok(&app, &admin, true, orders[&users[1].id]).await;
    let mine = app.html("/me/orders", Some(&users[0])).await;
    let row = row_of(&mine, orders[&users[0].id]);
    assert!(row.contains("Cancelled") && !row.contains(r#"data-action="cancel""#));
    let page = app.html(&path, Some(&admin)).await;
    let row = row_of(&page, orders[&users[1].id]);
    assert!(row.contains("Refunded") && !row.contains(r#"data-action="cancel""#));
    let row = row_of(&page, orders[&users[0].id]);
    assert!(row.contains("Cancelled") && !row.contains(r#"data-action="cancel""#));
}
