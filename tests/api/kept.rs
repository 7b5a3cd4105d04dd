//! A server keeps the orders it accepted until settlement has committed them
//! (`settle/kept.rs`), and a rebuild of the sale asks it to write them into Postgres
//! before it reads there (`roster.rs`): a Redis that loses them before settlement
//! read them loses nothing; votes likewise. Here settlement is off, so that every
//! order or vote is only in Redis and in the server's memory when Redis loses it.

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
    // No notification: the server's next beat finds it. The keeper lets its
    // orders go as the flush begins and counts them late once the flush's
    // transaction found the request closed: wait for the count, not the emptiness.
    let kept = app.state.kept.clone();
    let metrics = app.state.metrics.clone();
    wait_until("the closed request answered", || {
        kept.is_empty() && metrics.kept_late.get() == 2
    })
    .await;
    assert!(app.orders_in_db(sale).await.is_empty());
    assert_eq!(app.state.metrics.kept_late.get(), 2);
    assert_eq!(app.state.metrics.kept_flushed.get(), 0);
}

/// A vote's request through a rebuild (503 until the poll is back): its answer.
async fn vote_through_recovery(
    app: &crate::helpers::TestApp,
    poll: i64,
    token: &str,
    ballot: &serde_json::Value,
) -> reqwest::Response {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let resp = app
            .post_json(&format!("/api/polls/{poll}/votes"), Some(token), ballot)
            .await;
        if resp.status() != StatusCode::SERVICE_UNAVAILABLE {
            return resp;
        }
        assert!(Instant::now() < deadline, "the poll never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Votes too (`vote/kept.rs`): a single poll whose voters may change their
/// ballot, and a budget poll spent over two requests, wiped before settlement
/// read any of it. The rebuild finds every accepted request in Postgres: a voter
/// is still a voter (a change is the second ballot), a budget stays spent, and
/// the tallies are the votes.
#[tokio::test(flavor = "multi_thread")]
async fn a_wipe_before_settlement_loses_no_vote_the_server_kept() {
    let app = crate::helpers::spawn_app_with(|c| c.settle_in_serve = false).await;
    let admin = app.admin().await;
    let (single, s) = app
        .open_poll_with(
            &admin,
            "Kept?",
            &["yes", "no"],
            json!({"allow_change": true}),
        )
        .await;
    let (budget, b) = app
        .open_poll_with(
            &admin,
            "Spend",
            &["a", "b"],
            json!({"ballot": "budget", "votes_per_user": 5}),
        )
        .await;
    let users = app.create_users(4, false).await;
    for u in &users {
        app.cast_vote(single, &u.token, s[0]).await;
    }
    // The first changes to "no": two requests, seq 1 and 2.
    let changed = app
        .cast_ballot(single, &users[0].token, json!({"option_id": s[1]}))
        .await;
    assert_eq!(changed["replaced"], true);
    app.cast_ballot(
        budget,
        &users[0].token,
        json!({"option_id": b[0], "count": 2}),
    )
    .await;
    app.cast_ballot(
        budget,
        &users[0].token,
        json!({"option_id": b[1], "count": 2}),
    )
    .await;
    assert_eq!(
        app.state.kept_votes.len(),
        7,
        "every accepted request is kept"
    );
    assert_eq!(
        app.votes_in_db(single).await + app.votes_in_db(budget).await,
        0
    );

    app.wipe().await;
    // The voters are voters still: without a change allowed this would be 409; a
    // change now is the third ballot of the first voter.
    let again =
        vote_through_recovery(&app, single, &users[1].token, &json!({"option_id": s[1]})).await;
    assert_eq!(again.status(), StatusCode::ACCEPTED);
    let body: serde_json::Value = again.json().await.unwrap();
    assert_eq!(body["replaced"], true, "{body}");
    // The budget stays spent: 4 of 5.
    let over = vote_through_recovery(
        &app,
        budget,
        &users[0].token,
        &json!({"option_id": b[0], "count": 2}),
    )
    .await;
    let body = assert_error(over, StatusCode::UNPROCESSABLE_ENTITY, "over_budget").await;
    assert_eq!(body["remaining"], 1, "{body}");

    let seqs: Vec<(i64, i64, i32)> =
        sqlx::query_as("SELECT poll_id, user_id, seq FROM votes ORDER BY poll_id, user_id, seq")
            .fetch_all(&app.db)
            .await
            .unwrap();
    let mut want = vec![(single, users[0].id, 1), (single, users[0].id, 2)];
    want.extend(users[1..].iter().map(|u| (single, u.id, 1)));
    want.extend([(budget, users[0].id, 1), (budget, users[0].id, 2)]);
    want.sort();
    assert_eq!(seqs, want, "the rebuild found the kept votes in Postgres");
    assert_eq!(app.state.metrics.kept_flushed.get(), 7);
    // Tallies: "yes" 2 (users 2 and 3), "no" 2 (user 0's change, user 1's).
    let counts = app.poll_tallies(single).await;
    assert_eq!((counts[&s[0]], counts[&s[1]]), (2, 2), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kept_votes_are_let_go_once_settled() {
    let app = crate::helpers::spawn_app().await;
    let admin = app.admin().await;
    let (poll, o) = app.open_poll(&admin, "Settled?", &["yes", "no"]).await;
    let users = app.create_users(3, false).await;
    for u in &users {
        app.cast_vote(poll, &u.token, o[1]).await;
    }
    app.wait_for_votes(poll, 3).await;
    let kept = app.state.kept_votes.clone();
    wait_until("settled votes let go", || kept.is_empty()).await;
    assert_eq!(app.state.metrics.kept_flushed.get(), 0);
}
