//! A server keeps the orders it accepted until settlement has committed them
//! (`sale/kept.rs`), and a rebuild of the sale asks it to write them into Postgres
//! before it reads there (`roster.rs`): a Redis that loses them before settlement
//! read them loses nothing. Here settlement is off, so that every order is only in
//! Redis and in the server's memory when Redis loses it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use uuid::Uuid;

use crate::helpers::{assert_error, spawn_with_live_sale_and};

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what} within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wipe_before_settlement_loses_no_order_the_server_kept() {
    let (app, _, sale) = spawn_with_live_sale_and(10, |c| c.settle_in_serve = false).await;
    let users = app.create_users(6, false).await;
    let own: HashMap<i64, Uuid> = app.buy_all(sale, &users).await;
    assert_eq!(app.state.kept.len(), 6, "every accepted order is kept");
    assert!(app.orders_in_db(sale).await.is_empty(), "nothing settled");

    app.wipe().await;
    for user in &users {
        let body = assert_error(
            app.purchase_through_recovery(sale, &user.token).await,
            StatusCode::CONFLICT,
            "already_bought",
        )
        .await;
        assert_eq!(body["order_ids"], json!([own[&user.id].to_string()]));
    }
    let mut in_db: Vec<(Uuid, i64)> = app.orders_in_db(sale).await;
    in_db.sort();
    let mut want: Vec<(Uuid, i64)> = own.iter().map(|(u, o)| (*o, *u)).collect();
    want.sort();
    assert_eq!(in_db, want, "the rebuild found the kept orders in Postgres");
    assert_eq!(app.stock_left(sale).await, 4, "10 units, 6 bought");
    assert_eq!(app.state.metrics.kept_flushed.get(), 6);
    assert_eq!(app.state.kept.len(), 0, "written, no longer kept");
}

#[tokio::test(flavor = "multi_thread")]
async fn kept_orders_are_let_go_once_settled() {
    let (app, _, sale) = spawn_with_live_sale_and(10, |_| {}).await;
    let users = app.create_users(3, false).await;
    app.buy_all(sale, &users).await;
    app.wait_for_orders(sale, 3).await;
    let kept = app.state.kept.clone();
    wait_until("settled orders let go", || kept.is_empty()).await;
    assert_eq!(app.state.metrics.kept_flushed.get(), 0);
    assert_eq!(app.state.metrics.kept_dropped.get(), 0);
}

/// A request its rebuild closed (it stopped waiting) gets nothing written: written
/// after the rebuild, the orders could take units the rebuilt sale sold again.
#[tokio::test(flavor = "multi_thread")]
async fn nothing_is_written_for_a_request_the_rebuild_closed() {
    let (app, _, sale) = spawn_with_live_sale_and(10, |c| c.settle_in_serve = false).await;
    let users = app.create_users(2, false).await;
    app.buy_all(sale, &users).await;
    assert_eq!(app.state.kept.len(), 2);
    sqlx::query("INSERT INTO flush_requests (sale_id, closed_at) VALUES ($1, now())")
        .bind(sale)
        .execute(&app.db)
        .await
        .unwrap();
    // No notification: the server's next beat finds it.
    let kept = app.state.kept.clone();
    wait_until("the closed request answered", || kept.is_empty()).await;
    assert!(app.orders_in_db(sale).await.is_empty());
    assert_eq!(app.state.metrics.kept_late.get(), 2);
    assert_eq!(app.state.metrics.kept_flushed.get(), 0);
}
