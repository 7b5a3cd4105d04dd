//! More than one per customer: a sale's `max_per_user` caps the units one buyer may
//! hold, and a purchase may ask for several (`quantity`), all or nothing.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Db, TestApp, User, assert_error, merged, spawn_app, spawn_app_with};

/// A sale open now, for an hour, of `stock` units at 500, at most `max` per customer.
async fn multi_sale(app: &TestApp, admin: &User, stock: i64, max: i64, extra: Value) -> i64 {
    let overrides = merged(json!({ "max_per_user": max }), &extra);
    app.live_sale_with(admin, stock, overrides).await
}

async fn buy_n(app: &TestApp, sale: i64, user: &User, quantity: i64) -> reqwest::Response {
    app.post_json(
        &format!("/api/sales/{sale}/purchase"),
        Some(&user.token),
        &json!({ "quantity": quantity }),
    )
    .await
}

/// `user` buys `quantity` units of the sale: accepted.
async fn assert_buys(app: &TestApp, sale: i64, user: &User, quantity: i64) {
    let status = buy_n(app, sale, user, quantity).await.status();
    assert_eq!(
        status,
        StatusCode::ACCEPTED,
        "user {} buys {quantity}",
        user.id
    );
}

/// `user` asks for `quantity` units of the sale: refused with `status` and
/// `code`; the error's body.
async fn assert_buy_refused(
    app: &TestApp,
    sale: i64,
    user: &User,
    quantity: i64,
    status: StatusCode,
    code: &str,
) -> Value {
    assert_error(buy_n(app, sale, user, quantity).await, status, code).await
}

/// Redis: units held per buyer, units sold, units left.
async fn redis_units(app: &TestApp, sale: i64) -> (HashMap<i64, i64>, i64, i64) {
    let k = app.sale_keys(sale);
    let held: HashMap<i64, i64> = app.redis_query(redis::cmd("HGETALL").arg(&k.units)).await;
    let sold: Option<i64> = app.redis_query(redis::cmd("GET").arg(&k.sold)).await;
    (held, sold.unwrap_or(0), app.stock_left(sale).await)
}

/// Postgres: units per buyer over the orders that hold units.
async fn pg_units(app: &TestApp, sale: i64) -> HashMap<i64, i64> {
    app.rows(
        "SELECT user_id, sum(quantity)::int8 FROM orders
         WHERE sale_id = $1 AND status <> 'expired' GROUP BY user_id",
        sale,
    )
    .await
    .into_iter()
    .collect()
}

async fn wait_units_settled(app: &TestApp, sale: i64, units: i64) -> HashMap<i64, i64> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let held = pg_units(app, sale).await;
        if held.values().sum::<i64>() >= units || std::time::Instant::now() > deadline {
            return held;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `max_per_user` 2, stock 5: many users each send a purchase of 1 and one of 2 at
/// the same moment. Exactly 5 units go, nobody holds more than 2, and every refused
/// request took nothing: the units in Redis (per buyer and sold), in Postgres, and
/// the 202s' quantities agree exactly. With batching and with a batch of one.
#[tokio::test]
async fn concurrent_quantities_never_pass_the_cap_per_user_or_the_stock() {
    for batch_max in [64, 1] {
        let app = spawn_app_with(|c| c.batch_max = batch_max).await;
        let admin = app.admin().await;
        let sale = multi_sale(&app, &admin, 5, 2, json!({})).await;
        let users = app.create_users(30, false).await;
        let requests = users
            .iter()
            .flat_map(|u| [(u, 1), (u, 2)])
            .collect::<Vec<_>>();
        let shared = &app;
        let answers = join_all(requests.iter().map(|(u, q)| async move {
            let resp = buy_n(shared, sale, u, *q).await;
            let status = resp.status();
            let body: Value = resp.json().await.unwrap();
            (u.id, *q, status, body)
        }))
        .await;
        let mut accepted: HashMap<i64, i64> = HashMap::new();
        for (user, q, status, body) in &answers {
            match *status {
                StatusCode::ACCEPTED => *accepted.entry(*user).or_default() += q,
                StatusCode::CONFLICT => assert!(
                    ["per_user_limit", "not_enough_left"]
                        .contains(&body["error"].as_str().unwrap()),
                    "{body}"
                ),
                StatusCode::GONE => assert_eq!(body["error"], "sold_out"),
                other => panic!("answered {other}: {body}"),
            }
        }
        assert_eq!(accepted.values().sum::<i64>(), 5, "exactly the stock");
        assert!(accepted.values().all(|&n| n <= 2), "{accepted:?}");
        let (held, sold, left) = redis_units(&app, sale).await;
        assert_eq!(
            held, accepted,
            "Redis holds what was accepted, nothing more"
        );
        assert_eq!((sold, left), (5, 0));
        assert_eq!(wait_units_settled(&app, sale, 5).await, accepted);
        let view = app.get_json(&format!("/api/sales/{sale}"), None).await;
        assert_eq!(
            (view["sold"].as_i64(), view["stock_left"].as_i64()),
            (Some(5), Some(0))
        );
        let report = app.reconcile_report(&admin, sale).await;
        assert_eq!(report["consistent"], true, "{report}");
        assert_eq!(report["redis_sold"], 5);
    }
}

/// All or nothing, and the cap across requests, step by step.
#[tokio::test]
async fn a_purchase_that_cannot_be_served_whole_takes_nothing() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = multi_sale(&app, &admin, 5, 2, json!({})).await;
    let [a, b, c] =
        <[User; 3]>::try_from(app.create_users(3, false).await).unwrap_or_else(|_| unreachable!());

    assert_buys(&app, sale, &a, 1).await;
    // One held, two more asked: past the cap of two.
    let refused =
        assert_buy_refused(&app, sale, &a, 2, StatusCode::CONFLICT, "per_user_limit").await;
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("1 of your units count toward it already")
    );
    assert_buys(&app, sale, &a, 1).await;
    assert_buy_refused(&app, sale, &a, 1, StatusCode::CONFLICT, "per_user_limit").await;
    assert_buys(&app, sale, &b, 2).await;
    // One left, two asked: nothing taken.
    let short =
        assert_buy_refused(&app, sale, &c, 2, StatusCode::CONFLICT, "not_enough_left").await;
    assert!(short["message"].as_str().unwrap().contains("only 1 left"));
    let (held, sold, left) = redis_units(&app, sale).await;
    assert_eq!(held, HashMap::from([(a.id, 2), (b.id, 2)]));
    assert_eq!((sold, left), (4, 1));
    assert!(!app.buyers(sale).await.contains(&c.id));
    // The one left, then sold out.
    assert_buys(&app, sale, &c, 1).await;
    assert_buy_refused(&app, sale, &c, 1, StatusCode::GONE, "sold_out").await;
    assert_eq!(
        wait_units_settled(&app, sale, 5).await,
        HashMap::from([(a.id, 2), (b.id, 2), (c.id, 1)])
    );

    // A rebuild from Postgres (the admin's repair) comes to the same state.
    let before = redis_units(&app, sale).await;
    let report = app.repair(&admin, sale).await;
    assert_eq!(report["consistent"], true, "{report}");
    assert_eq!(redis_units(&app, sale).await, before);
}

/// Quantities out of range are a clear 422 that consumes nothing; a sale of one per
/// customer takes `quantity: 1` and refuses more.
#[tokio::test]
async fn bad_quantities_are_refused_and_change_nothing() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let multi = multi_sale(&app, &admin, 5, 3, json!({})).await;
    let single = app.live_sale(&admin, 5).await;
    let user = app.user().await;
    for (sale, body, code) in [
        (multi, json!({ "quantity": 0 }), "invalid_quantity"),
        (multi, json!({ "quantity": -1 }), "invalid_quantity"),
        (multi, json!({ "quantity": 4 }), "invalid_quantity"),
        (multi, json!({ "quantity": 101 }), "invalid_quantity"),
        (
            multi,
            json!({ "quantity": 9_999_999_999i64 }),
            "invalid_quantity",
        ),
        (multi, json!({ "quantity": "two" }), "invalid_body"),
        (multi, json!({ "quantity": 1.5 }), "invalid_body"),
        (single, json!({ "quantity": 2 }), "invalid_quantity"),
    ] {
        let resp = app
            .post_json(
                &format!("/api/sales/{sale}/purchase"),
                Some(&user.token),
                &body,
            )
            .await;
        assert_error(resp, StatusCode::UNPROCESSABLE_ENTITY, code).await;
    }
    for sale in [multi, single] {
        assert_eq!(app.stock_left(sale).await, 5, "nothing consumed");
        assert!(app.buyers(sale).await.is_empty());
    }
    // Creating a sale with a cap out of range.
    for max in [0, 101, -3] {
        let now = chrono::Utc::now();
        let resp = app
            .post_json(
                "/api/admin/sales",
                Some(&admin.token),
                &json!({
                    "name": "x", "price_cents": 1, "stock": 1, "max_per_user": max,
                    "starts_at": now, "ends_at": now + chrono::Duration::hours(1),
                }),
            )
            .await;
        assert_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid_quantity").await;
    }
    // One per customer: an explicit quantity of 1 buys as before, once.
    assert_buys(&app, single, &user, 1).await;
    assert_buy_refused(
        &app,
        single,
        &user,
        1,
        StatusCode::CONFLICT,
        "already_bought",
    )
    .await;
    let k = app.sale_keys(single);
    let exists: i64 = app
        .redis_query(redis::cmd("EXISTS").arg(&k.units).arg(&k.sold))
        .await;
    assert_eq!(
        exists, 0,
        "a sale of one per customer keeps only its buyers hash"
    );
}

/// An unpaid order of 2 units expires and gives back both, once; on a sale whose
/// expired buyers may buy again, its buyer can buy 2 again.
#[tokio::test]
async fn an_expired_order_gives_back_all_its_units() {
    let app = spawn_app_with(|c| c.expire = Duration::ZERO).await;
    let admin = app.admin().await;
    let sale = multi_sale(
        &app,
        &admin,
        4,
        2,
        json!({ "payment_window_s": 3, "rebuy_after_expiry": true }),
    )
    .await;
    let [a, b] =
        <[User; 2]>::try_from(app.create_users(2, false).await).unwrap_or_else(|_| unreachable!());
    assert_buys(&app, sale, &a, 2).await;
    assert_buys(&app, sale, &b, 2).await;
    wait_units_settled(&app, sale, 4).await;
    let paid = app
        .client
        .post(app.url(&format!(
            "/api/orders/{}/pay",
            sqlx::query_scalar::<_, uuid::Uuid>("SELECT id FROM orders WHERE user_id = $1")
                .bind(b.id)
                .fetch_one(&app.db)
                .await
                .unwrap()
        )))
        .bearer_auth(&b.token)
        .header("Idempotency-Key", "b")
        .send()
        .await
        .unwrap();
    assert_eq!(paid.status(), StatusCode::OK);
    let body: Value = paid.json().await.unwrap();
    assert_eq!(body["amount_cents"], 1000, "2 units at 500");
    // The order says how many units it holds.
    let order = app
        .get_json(
            &format!("/api/orders/{}", body["order_id"].as_str().unwrap()),
            Some(&b.token),
        )
        .await;
    assert_eq!(order["quantity"], 2, "{order}");
    // Until a's deadline has passed, by Postgres's clock.
    while sqlx::query_scalar::<_, bool>("SELECT pay_by > now() FROM orders WHERE user_id = $1")
        .bind(a.id)
        .fetch_one(&app.db)
        .await
        .unwrap()
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(stampede::startup::expire_once(&app.state).await.unwrap(), 1);
    assert_eq!(stampede::startup::expire_once(&app.state).await.unwrap(), 0);
    let (held, sold, left) = redis_units(&app, sale).await;
    assert_eq!(held, HashMap::from([(b.id, 2)]));
    assert_eq!((sold, left), (2, 2));
    assert!(!app.buyers(sale).await.contains(&a.id));
    assert_buys(&app, sale, &a, 2).await;
    assert_buy_refused(&app, sale, &a, 1, StatusCode::CONFLICT, "per_user_limit").await;
    let report = app.reconcile_report(&admin, sale).await;
    assert_eq!(report["consistent"], true, "{report}");
    assert_eq!(report["orders"]["returned"], 2, "{report}");
}
