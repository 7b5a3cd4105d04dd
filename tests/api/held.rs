//! `already_bought` names the buyer's order from Redis alone: the purchase script
//! keeps each buyer's order beside the buyers hash (`{sale:N}:held`) and answers
//! it with the refusal, so a storm of repeat buyers, however many, costs Postgres
//! nothing. The fallback read (`held_batches`) serves only a sale bought before
//! the hash existed. Kept exact through settlement, a cancel (the buyer may buy
//! again or not) and the rebuild after a wipe.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{TestApp, User, assert_error, spawn_app};

/// The refusal each buyer gets, all at once: its `order_ids`, by user.
async fn refusals(app: &TestApp, sale: i64, users: &[&User]) -> HashMap<i64, Value> {
    let answers = join_all(users.iter().map(|u| app.purchase(sale, &u.token))).await;
    let mut out = HashMap::new();
    for (u, resp) in users.iter().zip(answers) {
        let body = assert_error(resp, StatusCode::CONFLICT, "already_bought").await;
        out.insert(u.id, body["order_ids"].clone());
    }
    out
}

/// Every user refused at once, each named the order `own` says is theirs.
async fn each_named_their_own(app: &TestApp, sale: i64, users: &[User], own: &HashMap<i64, Uuid>) {
    let all: Vec<&User> = users.iter().collect();
    let named = refusals(app, sale, &all).await;
    for u in users {
        assert_eq!(
            named[&u.id],
            json!([own[&u.id].to_string()]),
            "user {}",
            u.id
        );
    }
}

/// Reads of orders from Postgres for refusals, and refusals sent without them.
fn fallback_reads(app: &TestApp) -> (u64, u64) {
    let m = &app.state.metrics;
    (m.held_batched.get(), m.held_unread.get())
}

#[tokio::test(flavor = "multi_thread")]
async fn every_repeat_buyer_is_named_their_order_without_postgres() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 500).await;
    let users = app.create_users(250, false).await;
    // 200 settled, 50 maybe not yet: the refusal names both the same way.
    let mut own = app.buy_all(sale, &users[..200]).await;
    app.wait_for_orders(sale, 200).await;
    own.extend(app.buy_all(sale, &users[200..]).await);

    each_named_their_own(&app, sale, &users, &own).await;
    // Under a key too, first and replayed.
    let u = &users[0];
    for replayed in [false, true] {
        let resp = app
            .client
            .post(app.url(&format!("/api/sales/{sale}/purchase")))
            .bearer_auth(&u.token)
            .header("Idempotency-Key", "again")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.headers().contains_key("idempotent-replayed"), replayed);
        let body = assert_error(resp, StatusCode::CONFLICT, "already_bought").await;
        assert_eq!(body["order_ids"], json!([own[&u.id].to_string()]), "{body}");
    }
    assert_eq!(fallback_reads(&app), (0, 0), "no refusal read Postgres");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_presses_at_once_name_the_order_the_first_made() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 100).await;
    for u in app.create_users(20, false).await {
        let both = join_all([app.purchase(sale, &u.token), app.purchase(sale, &u.token)]).await;
        let mut order = None;
        let mut named = None;
        for resp in both {
            let status = resp.status();
            let body: Value = resp.json().await.unwrap();
            match status {
                StatusCode::ACCEPTED => order = Some(body["order_id"].clone()),
                StatusCode::CONFLICT => named = Some(body["order_ids"][0].clone()),
                other => panic!("{other}: {body}"),
            }
        }
        assert!(order.is_some() && order == named, "{order:?} {named:?}");
    }
    assert_eq!(fallback_reads(&app), (0, 0));
}

/// A buyer whose order was cancelled: on a sale whose buyers may buy again, the
/// next order is the one named; on one whose may not, the cancelled one.
#[tokio::test(flavor = "multi_thread")]
async fn after_a_cancel_the_refusal_names_the_order_that_holds() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    for rebuy in [true, false] {
        let sale = app.payment_sale(&admin, 5, 600, rebuy).await;
        let buyer = app.user().await;
        let first = app.buy_all(sale, std::slice::from_ref(&buyer)).await[&buyer.id];
        app.wait_for_orders(sale, 1).await;
        let resp = app
            .post(&format!("/api/orders/{first}/cancel"), Some(&buyer.token))
            .await;
        assert_eq!(
            resp.status(),
            StatusCode::OK,
            "{}",
            resp.text().await.unwrap()
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        let expected = loop {
            let resp = app.purchase(sale, &buyer.token).await;
            let status = resp.status();
            let body: Value = resp.json().await.unwrap();
            if status == StatusCode::ACCEPTED {
                assert!(rebuy, "a buyer of a sale without rebuys buys again: {body}");
                break body["order_id"].as_str().unwrap().parse::<Uuid>().unwrap();
            }
            assert_eq!(body["error"], "already_bought", "{body}");
            if !rebuy && app.stock_left(sale).await == 5 {
                // The unit is back and the buyer stays one: named by that order.
                break first;
            }
            assert!(
                Instant::now() < deadline,
                "the cancel's unit never came back"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let named = refusals(&app, sale, &[&buyer]).await;
        assert_eq!(
            named[&buyer.id],
            json!([expected.to_string()]),
            "rebuy {rebuy}"
        );
    }
    assert_eq!(fallback_reads(&app), (0, 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rebuild_after_a_wipe_names_every_buyers_order() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 100).await;
    let users = app.create_users(30, false).await;
    let own = app.buy_all(sale, &users).await;
    app.wait_for_orders(sale, 30).await;
    app.wait_until_settled(sale).await;

    app.wipe().await;
    let body = assert_error(
        app.purchase_through_recovery(sale, &users[0].token).await,
        StatusCode::CONFLICT,
        "already_bought",
    )
    .await;
    assert_eq!(body["order_ids"], json!([own[&users[0].id].to_string()]));
    each_named_their_own(&app, sale, &users, &own).await;
    assert_eq!(
        fallback_reads(&app),
        (0, 0),
        "the rebuild restored them all"
    );
}

/// A sale whose buyers an earlier version kept in a set, without their orders,
/// folded into the buyers hash: they stay buyers (refused, never sold a second
/// unit), and the refusal still names the order, read off the batch from Postgres.
#[tokio::test(flavor = "multi_thread")]
async fn a_buyer_of_an_earlier_version_is_named_from_postgres() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 10).await;
    let buyer = app.user().await;
    let order = app.buy_all(sale, std::slice::from_ref(&buyer)).await[&buyer.id];
    app.wait_for_orders(sale, 1).await;
    assert_eq!(app.as_earlier_version(sale).await, 1);
    let named = refusals(&app, sale, &[&buyer]).await;
    assert_eq!(named[&buyer.id], json!([order.to_string()]));
    assert_eq!(fallback_reads(&app), (1, 0), "one read from Postgres");
}

/// Where an earlier version kept its buyers set, a sale made or rebuilt by this
/// one holds the marker string: that version's `SISMEMBER` (its purchase's
/// question) fails with `WRONGTYPE` instead of answering "not a buyer" for a
/// buyer only the buyers hash knows (docs/operations.md, Upgrading).
#[tokio::test(flavor = "multi_thread")]
async fn an_earlier_versions_question_fails_on_the_marker() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 10).await;
    let buyer = app.user().await;
    app.buy_all(sale, std::slice::from_ref(&buyer)).await;
    let k = app.sale_keys(sale);
    let asked = || {
        let mut redis = app.redis.clone();
        let cmd = redis::cmd("SISMEMBER")
            .arg(&k.buyers_legacy)
            .arg(buyer.id)
            .clone();
        async move { cmd.query_async::<bool>(&mut redis).await }
    };
    let made = asked().await.expect_err("the marker of a sale made now");
    assert_eq!(made.code(), Some("WRONGTYPE"), "{made:?}");
    // Rebuilt from Postgres after a wipe: the marker again, and still a buyer.
    app.wait_for_orders(sale, 1).await;
    app.wipe().await;
    app.repair(&admin, sale).await;
    let rebuilt = asked().await.expect_err("the marker of a rebuilt sale");
    assert_eq!(rebuilt.code(), Some("WRONGTYPE"), "{rebuilt:?}");
    assert_eq!(app.buyers(sale).await, vec![buyer.id]);
}
