//! The flash sale's invariants under real concurrency: no oversell, one per user,
//! nothing lost, no undersell.

use std::collections::HashSet;
use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::helpers::{
    TestApp, assert_error, listed, spawn_app, spawn_app_with, spawn_with_live_sale,
    spawn_with_live_sale_and,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stock_100_under_2000_buyers_and_500_repeats_sells_exactly_100() {
    // The process-local sold-out flag would answer most late requests itself; turn it
    // off so every request reaches the script and the script alone is tested.
    storm_of_2500_on_stock_100(
        spawn_app_with(|c| c.sold_out_cache = std::time::Duration::ZERO).await,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stock_100_under_2000_buyers_and_500_repeats_sells_exactly_100_one_buyer_per_call() {
    storm_of_2500_on_stock_100(
        spawn_app_with(|c| {
            c.sold_out_cache = std::time::Duration::ZERO;
            c.batch_max = 1;
        })
        .await,
    )
    .await;
}

/// 2,000 distinct buyers and 500 of them again, released together on a stock of
/// 100: exactly 100 accepted, nobody twice, exactly those orders in Postgres.
async fn storm_of_2500_on_stock_100(app: TestApp) {
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 100).await;
    let users = app.create_users(2000, false).await;

    // Give the first 500 users a purchase attempt already "in hand" so that their
    // repeats race with everyone else: 2,000 first attempts + 500 repeats together.
    let mut attempts: Vec<(i64, String)> = users.iter().map(|u| (u.id, u.token.clone())).collect();
    attempts.extend(users[..500].iter().map(|u| (u.id, u.token.clone())));

    let barrier = Arc::new(Barrier::new(attempts.len()));
    let app = Arc::new(app);
    let mut tasks = Vec::with_capacity(attempts.len());
    for (user_id, token) in attempts {
        let app = app.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let resp = app.purchase(sale, &token).await;
            let status = resp.status();
            let body: Value = resp.json().await.unwrap();
            (user_id, status, body)
        }));
    }
    let mut accepted = Vec::new();
    let mut refused = 0;
    for t in tasks {
        let (user_id, status, body) = t.await.unwrap();
        match status {
            StatusCode::ACCEPTED => {
                accepted.push((user_id, body["order_id"].as_str().unwrap().to_string()))
            }
            StatusCode::GONE => {
                assert_eq!(body["error"], "sold_out");
                refused += 1;
            }
            StatusCode::CONFLICT => {
                assert_eq!(body["error"], "already_bought");
                refused += 1;
            }
            other => panic!("unexpected answer {other}: {body}"),
        }
    }
    assert_eq!(accepted.len(), 100, "exactly the stock is sold");
    assert_eq!(refused, 2400);
    let buyers: HashSet<i64> = accepted.iter().map(|(u, _)| *u).collect();
    assert_eq!(buyers.len(), 100, "no user bought twice");
    assert_eq!(app.stock_left(sale).await, 0, "stock ends at exactly 0");
    let redis_buyers: HashSet<i64> = app.buyers(sale).await.into_iter().collect();
    assert_eq!(redis_buyers, buyers);

    // After settlement exactly those 100 orders are in Postgres.
    let orders = app.wait_for_orders(sale, 100).await;
    assert_eq!(orders.len(), 100);
    let db_pairs: HashSet<(String, i64)> =
        orders.iter().map(|(id, u)| (id.to_string(), *u)).collect();
    let answered: HashSet<(String, i64)> = accepted.into_iter().map(|(u, id)| (id, u)).collect();
    assert_eq!(
        db_pairs, answered,
        "every accepted order id is in Postgres, no other"
    );
    let m = &app.state.metrics;
    let batches = m.buy_batches.get();
    let batched = m.buy_batched.get();
    assert_eq!(batched, 2500, "every request was decided in some batch");
    assert!(
        batches <= batched,
        "{batches} batches for {batched} requests"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn accepted_order_is_pending_then_confirmed() {
    let (app, admin, sale) = spawn_with_live_sale(3).await;
    let buyer = app.user().await;
    let resp = app.purchase(sale, &buyer.token).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let body: Value = resp.json().await.unwrap();
    let order_id = body["order_id"].as_str().unwrap().to_string();
    assert_eq!(body["status"], "pending");

    app.wait_for_orders(sale, 1).await;
    let resp = app
        .get(&format!("/api/orders/{order_id}"), Some(&buyer.token))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let status: Value = resp.json().await.unwrap();
    assert_eq!(status["status"], "confirmed");
    assert_eq!(status["user_id"], buyer.id);

    // Another user cannot see it; an admin can.
    let other = app.user().await;
    let resp = app
        .get(&format!("/api/orders/{order_id}"), Some(&other.token))
        .await;
    assert_error(resp, StatusCode::NOT_FOUND, "not_found").await;
    let resp = app
        .get(&format!("/api/orders/{order_id}"), Some(&admin.token))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);

    let mine: Value = app.get_json("/api/me/orders", Some(&buyer.token)).await;
    assert_eq!(mine.as_array().unwrap().len(), 1);
    assert_eq!(mine[0]["id"], order_id.as_str());

    // A second attempt is refused and changes nothing.
    let resp = app.purchase(sale, &buyer.token).await;
    assert_error(resp, StatusCode::CONFLICT, "already_bought").await;
    assert_eq!(app.stock_left(sale).await, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn pending_order_status_is_read_from_redis_before_settlement() {
    let (app, _, sale) = spawn_with_live_sale_and(3, |c| c.settle_in_serve = false).await;
    let buyer = app.user().await;
    let body: Value = app.purchase(sale, &buyer.token).await.json().await.unwrap();
    let order_id = body["order_id"].as_str().unwrap();
    let status: Value = app
        .get_json(&format!("/api/orders/{order_id}"), Some(&buyer.token))
        .await;
    assert_eq!(status["status"], "pending");
    let other = app.user().await;
    let resp = app
        .get(&format!("/api/orders/{order_id}"), Some(&other.token))
        .await;
    assert_error(resp, StatusCode::NOT_FOUND, "not_found").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn purchases_outside_the_window_are_refused_and_leave_stock_untouched() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let buyer = app.user().await;

    let upcoming = app.create_sale(&admin, 10, 3600, 7200).await;
    let resp = app.purchase(upcoming, &buyer.token).await;
    assert!(resp.headers().contains_key("retry-after"));
    assert_error(resp, StatusCode::CONFLICT, "not_started").await;
    assert_eq!(app.stock_left(upcoming).await, 10);
    assert!(app.buyers(upcoming).await.is_empty());

    // A sale that ends in one second: buy nothing, wait for the end, try.
    let ending = app.create_sale(&admin, 10, -5, 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let resp = app.purchase(ending, &buyer.token).await;
    assert_error(resp, StatusCode::GONE, "ended").await;
    assert_eq!(app.stock_left(ending).await, 10);
    assert!(app.buyers(ending).await.is_empty());
    // Past its end it cannot be opened again: 409, nothing changed.
    let resp = app.open_sale(&admin, ending).await;
    assert_error(resp, StatusCode::CONFLICT, "past_end").await;
    let resp = app.purchase(ending, &buyer.token).await;
    assert_error(resp, StatusCode::GONE, "ended").await;

    // Closed early by an admin.
    let live = app.live_sale(&admin, 10).await;
    let resp = app.close_sale(&admin, live).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = app.purchase(live, &buyer.token).await;
    assert_error(resp, StatusCode::GONE, "ended").await;
    assert_eq!(app.stock_left(live).await, 10);

    // Opened early by an admin: the upcoming sale now sells.
    let resp = app.open_sale(&admin, upcoming).await;
    assert_eq!(resp.status(), StatusCode::OK);
    app.buy(upcoming, &buyer.token).await;
    assert_eq!(app.stock_left(upcoming).await, 9);
}

#[tokio::test(flavor = "multi_thread")]
async fn sold_out_flag_is_cleared_by_a_top_up() {
    let (app, admin, sale) = spawn_with_live_sale(1).await;
    let users = app.create_users(3, false).await;
    app.buy(sale, &users[0].token).await;
    assert_error(
        app.purchase(sale, &users[1].token).await,
        StatusCode::GONE,
        "sold_out",
    )
    .await;

    let resp = app.change_stock(&admin, sale, &json!({"add": 1})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let view: Value = resp.json().await.unwrap();
    assert_eq!(view["stock_left"], 1);
    assert_eq!(view["sold"], 1);
    assert_eq!(view["stock_total"], 2);
    app.buy(sale, &users[1].token).await;

    // Setting stock is absolute.
    let resp = app.change_stock(&admin, sale, &json!({"set": 5})).await;
    let view: Value = resp.json().await.unwrap();
    assert_eq!(view["stock_left"], 5);
    assert_eq!(view["stock_total"], 7);
    app.buy(sale, &users[2].token).await;
    assert_eq!(app.stock_left(sale).await, 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn scripts_are_reloaded_after_script_flush() {
    let (app, _, sale) = spawn_with_live_sale(5).await;
    let users = app.create_users(2, false).await;
    app.buy(sale, &users[0].token).await;
    let _: () = app.redis_query(redis::cmd("SCRIPT").arg("FLUSH")).await;
    app.buy(sale, &users[1].token).await;
    assert_eq!(app.stock_left(sale).await, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn sales_are_listed_with_live_stock() {
    let (app, _, sale) = spawn_with_live_sale(7).await;
    let buyer = app.user().await;
    app.purchase(sale, &buyer.token).await;
    let list: Value = app.get_json("/api/sales", None).await;
    let entry = listed(&list, sale);
    assert_eq!(entry["stock_left"], 6);
    assert_eq!(entry["sold"], 1);
    assert_eq!(entry["status"], "live");
    let one: Value = app.get_json(&format!("/api/sales/{sale}"), None).await;
    assert_eq!(one["stock_left"], 6);
}

#[tokio::test(flavor = "multi_thread")]
async fn reconcile_reports_agreement_and_a_lost_order() {
    let (app, admin, sale) = spawn_with_live_sale(10).await;
    let users = app.new_buyers(sale, 4).await;
    app.wait_for_orders(sale, 4).await;
    let path = format!("/api/admin/sales/{sale}/reconcile");
    let report: Value = app.get_json(&path, Some(&admin.token)).await;
    assert_eq!(report["consistent"], true, "{report}");
    assert_eq!(report["redis_sold"], 4);
    assert_eq!(report["postgres_orders"], 4);
    assert_eq!(report["stock_left"], 6);

    // An order vanishes from Postgres: reconcile names its buyer.
    sqlx::query("DELETE FROM orders WHERE sale_id = $1 AND user_id = $2")
        .bind(sale)
        .bind(users[2].id)
        .execute(&app.db)
        .await
        .unwrap();
    let report: Value = app.get_json(&path, Some(&admin.token)).await;
    assert_eq!(report["consistent"], false);
    assert_eq!(report["missing_in_postgres"], json!([users[2].id]));
    let resp = app.get(&path, Some(&users[0].token)).await;
    assert_error(resp, StatusCode::FORBIDDEN, "forbidden").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn repair_restores_lost_buyers_and_stock_from_postgres() {
    let (app, admin, sale) = spawn_with_live_sale(10).await;
    let users = app.new_buyers(sale, 3).await;
    app.wait_for_orders(sale, 3).await;
    // Redis loses a buyer and its stock count drifts.
    let k = app.sale_keys(sale);
    let mut redis = app.redis.clone();
    let _: () = redis::cmd("HDEL")
        .arg(&k.buyers)
        .arg(users[1].id)
        .query_async(&mut redis)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(&k.stock)
        .arg(10)
        .query_async(&mut redis)
        .await
        .unwrap();

    let path = format!("/api/admin/sales/{sale}/reconcile");
    let report: Value = app.get_json(&path, Some(&admin.token)).await;
    assert_eq!(report["consistent"], false);
    assert_eq!(report["missing_in_redis"], json!([users[1].id]));

    let resp = app.post(&path, Some(&users[0].token)).await;
    assert_error(resp, StatusCode::FORBIDDEN, "forbidden").await;
    let report: Value = app
        .post(&path, Some(&admin.token))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(report["consistent"], true, "{report}");
    assert_eq!(report["stock_left"], 7);
    // The restored buyer cannot buy a second unit.
    assert_error(
        app.purchase(sale, &users[1].token).await,
        StatusCode::CONFLICT,
        "already_bought",
    )
    .await;
    assert_eq!(app.stock_left(sale).await, 7);
}

/// The process's sold-out flag answers before the token is checked: that a sale is
/// sold out is public, and the stampede after the last unit costs no HMAC. A sale
/// that is not known sold out still needs a valid token, and a sold-out answer
/// changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_known_sold_out_sale_answers_410_before_the_token_is_checked() {
    let (app, admin, sold) = spawn_with_live_sale(1).await;
    let open = app.live_sale(&admin, 5).await;
    let users = app.create_users(2, false).await;
    app.buy(sold, &users[0].token).await;
    // The last unit is gone; the next buyer's answer sets the flag.
    assert_error(
        app.purchase(sold, &users[1].token).await,
        StatusCode::GONE,
        "sold_out",
    )
    .await;
    for token in [None, Some("not-a-token")] {
        assert_error(
            app.post(&format!("/api/sales/{sold}/purchase"), token)
                .await,
            StatusCode::GONE,
            "sold_out",
        )
        .await;
        let code = if token.is_some() {
            "invalid_token"
        } else {
            "unauthorized"
        };
        assert_error(
            app.post(&format!("/api/sales/{open}/purchase"), token)
                .await,
            StatusCode::UNAUTHORIZED,
            code,
        )
        .await;
    }
    assert_eq!(app.stock_left(sold).await, 0);
    assert_eq!(app.stock_left(open).await, 5);
}
