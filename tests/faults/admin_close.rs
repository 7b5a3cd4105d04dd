//! An admin's close that Postgres committed while Redis did not answer its write
//! (Redis stopped with SIGSTOP): the admin is answered 503, and once Redis answers
//! again the close reaches it without a second close: the poll takes no more votes
//! and the sale sells no more (both were still decided by their old window in
//! Redis, since only Postgres knew of the close).

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Options, Stack};

async fn post(stack: &Stack, path: &str, token: &str, body: Value) -> (StatusCode, String) {
    let resp = stack
        .http
        .post(format!("{}{path}", stack.live_base()))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("request answered");
    (resp.status(), resp.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_close_redis_missed_reaches_it_once_it_answers() {
    let stack = Stack::start("admin_close", Options::servers(1)).await;
    let (poll, options) = stack.create_poll(&["red", "blue"]).await;
    let sale = stack.create_sale(100).await;
    let users = stack.create_users(2, false).await;
    let vote = |n: usize| {
        let path = format!("/api/polls/{poll}/votes");
        let body = json!({ "option_id": options[0] });
        let (stack, token) = (&stack, users[n].token.clone());
        async move { post(stack, &path, &token, body).await }
    };
    let buy = |n: usize| {
        let path = format!("/api/sales/{sale}/purchase");
        let (stack, token) = (&stack, users[n].token.clone());
        async move { post(stack, &path, &token, json!({})).await }
    };
    // Both stores hold the poll and the sale: a vote and a purchase go through.
    assert_eq!(vote(0).await.0, StatusCode::ACCEPTED);
    assert_eq!(buy(0).await.0, StatusCode::ACCEPTED);

    stack.redis.pause();
    let admin = stack.admin.token.clone();
    let poll_close = post(
        &stack,
        &format!("/api/admin/polls/{poll}/close"),
        &admin,
        json!({}),
    )
    .await;
    let sale_close = post(
        &stack,
        &format!("/api/admin/sales/{sale}/close"),
        &admin,
        json!({}),
    )
    .await;
    stack.redis.resume();
    // Postgres took both closes; Redis missed them: the admin was told to retry.
    assert_eq!(
        poll_close.0,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        poll_close.1
    );
    assert_eq!(
        sale_close.0,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        sale_close.1
    );
    let closed: (bool, bool) = sqlx::query_as(
        "SELECT (SELECT closed FROM polls WHERE id = $1), (SELECT closed FROM sales WHERE id = $2)",
    )
    .bind(poll)
    .bind(sale)
    .fetch_one(&stack.db)
    .await
    .unwrap();
    assert_eq!(closed, (true, true), "Postgres holds both closes");

    // Nobody closes again: within a few seconds Redis refuses, as Postgres says.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (status, body) = vote(1).await;
    assert_eq!(status, StatusCode::GONE, "a vote after the close: {body}");
    assert!(body.contains("\"closed\""), "{body}");
    let (status, body) = buy(1).await;
    assert_eq!(
        status,
        StatusCode::GONE,
        "a purchase after the close: {body}"
    );
    assert!(body.contains("\"ended\""), "{body}");
    // What Redis counts is what Postgres settles: one vote, one order.
    let votes: i64 = sqlx::query_scalar("SELECT count(*) FROM votes WHERE poll_id = $1")
        .bind(poll)
        .fetch_one(&stack.db)
        .await
        .unwrap();
    assert!(votes <= 1, "no vote after the close in Postgres: {votes}");
}
