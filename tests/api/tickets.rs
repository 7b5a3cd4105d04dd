//! Purchase tickets: a sale that requires one sells only to purchases that carry a
//! ticket issued to that user, for that sale, once the sale was open; anything else
//! is a clear 4xx that consumes nothing (no unit, no buyer, no limit count).

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use stampede::config::LimitsConfig;
use stampede::domain::Id;
use stampede::sale::ticket::TicketKey;
use tokio::sync::Barrier;

use crate::helpers::{
    TestApp, User, assert_error, limits, spawn_app_with, spawn_with_live_sale_and,
    user_log_entries, window_policy,
};

async fn ticket(app: &TestApp, sale: i64, user: &User) -> reqwest::Response {
    app.post(&format!("/api/sales/{sale}/ticket"), Some(&user.token))
        .await
}

async fn ticket_of(app: &TestApp, sale: i64, user: &User) -> String {
    let resp = ticket(app, sale, user).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["sale_id"], sale);
    body["ticket"].as_str().expect("a ticket").to_owned()
}

/// Asks for a ticket until the answer is `status` with error `code`: the sale
/// opening or ending takes time to come, and the event, not the wait, is asserted.
/// Every answer before it must be `before`; fails after 15 s with the last answer.
async fn ticket_until(
    app: &TestApp,
    sale: i64,
    user: &User,
    before: (StatusCode, &str),
    after: (StatusCode, &str),
) -> reqwest::Response {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let resp = ticket(app, sale, user).await;
        if resp.status() == after.0 {
            return resp;
        }
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        assert_eq!(status, before.0, "{body}");
        if !before.1.is_empty() {
            assert_eq!(body["error"], before.1, "{body}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {} `{}` after 15 s; the last answer: {status} {body}",
            after.0,
            after.1
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn buy_with(app: &TestApp, sale: i64, user: &User, body: &Value) -> reqwest::Response {
    app.post_json(
        &format!("/api/sales/{sale}/purchase"),
        Some(&user.token),
        body,
    )
    .await
}

/// One per-user sliding-log policy on `route`, 60 s window, limits on.
fn per_user(name: &str, route: &str, limit: u64) -> LimitsConfig {
    let policy = window_policy(name, route, "user", "sliding_log", limit, 60_000);
    limits(&[policy])
}

/// The buy route's per-user policy, so that "counted by no policy" is visible.
fn user_limit() -> LimitsConfig {
    per_user("buy-user", "buy", 50)
}

async fn counted(app: &TestApp, sale: i64, user: &User) -> usize {
    user_log_entries(app, sale, "buy-user", user.id).await
}

#[tokio::test]
async fn a_ticket_is_issued_only_once_the_sale_is_open_and_a_purchase_needs_one() {
    let app = spawn_app_with(|c| c.limits = user_limit()).await;
    let admin = app.admin().await;
    let sale = app.create_sale_with(&admin, 5, 2, 3600, true).await;
    let shown: Value = app.get_json(&format!("/api/sales/{sale}"), None).await;
    assert_eq!(shown["requires_ticket"], true);
    let user = app.user().await;

    // Before the opening: no ticket, and no purchase without one.
    let early = ticket(&app, sale, &user).await;
    assert!(early.headers().contains_key("retry-after"));
    assert_error(early, StatusCode::CONFLICT, "not_started").await;
    assert_error(
        app.purchase(sale, &user.token).await,
        StatusCode::PRECONDITION_REQUIRED,
        "ticket_required",
    )
    .await;
    assert_eq!(app.stock_left(sale).await, 5);
    assert!(app.buyers(sale).await.is_empty());
    assert_eq!(counted(&app, sale, &user).await, 0, "no limit counted it");

    // Once open (by the Redis clock, 2 s away): a ticket, and the purchase with it.
    let open = ticket_until(
        &app,
        sale,
        &user,
        (StatusCode::CONFLICT, "not_started"),
        (StatusCode::OK, ""),
    )
    .await;
    let body: Value = open.json().await.unwrap();
    assert_eq!(body["sale_id"], sale);
    let t = body["ticket"].as_str().expect("a ticket").to_owned();
    let resp = buy_with(&app, sale, &user, &json!({ "ticket": t })).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    assert_eq!(app.stock_left(sale).await, 4);
    assert_eq!(app.buyers(sale).await, vec![user.id]);
    assert_eq!(app.wait_for_orders(sale, 1).await.len(), 1);
}

#[tokio::test]
async fn a_bad_ticket_is_refused_and_consumes_nothing() {
    let app = spawn_app_with(|c| c.limits = user_limit()).await;
    let admin = app.admin().await;
    let sale = app.live_ticket_sale(&admin, 5).await;
    let other_sale = app.live_ticket_sale(&admin, 5).await;
    let (user, someone) = (app.user().await, app.user().await);
    let key = TicketKey::new(app.config.token_secret.as_bytes());
    let (sale_id, user_id) = (Id::new(sale).unwrap(), Id::new(user.id).unwrap());
    let now_ms = chrono::Utc::now().timestamp_millis();

    let refused = [
        (
            json!({}),
            StatusCode::PRECONDITION_REQUIRED,
            "ticket_required",
        ),
        (
            json!({ "ticket": "garbage" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_ticket",
        ),
        (
            // Someone else's ticket for this sale.
            json!({ "ticket": ticket_of(&app, sale, &someone).await }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_ticket",
        ),
        (
            // Her ticket for another sale.
            json!({ "ticket": ticket_of(&app, other_sale, &user).await }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_ticket",
        ),
        (
            json!({ "ticket": key.issue(sale_id, user_id, now_ms - 1) }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "ticket_expired",
        ),
        (
            // Signed with another secret.
            json!({ "ticket": TicketKey::new(b"not-the-server-secret-not-the-se")
                .issue(sale_id, user_id, now_ms + 60_000) }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_ticket",
        ),
        (
            // Her session token is not a ticket.
            json!({ "ticket": user.token }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_ticket",
        ),
        (
            json!({ "ticket": 7 }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({ "coupon": "FREE" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
    ];
    for (body, status, code) in refused {
        let resp = buy_with(&app, sale, &user, &body).await;
        assert_eq!(resp.status(), status, "{body}");
        assert_error(resp, status, code).await;
    }
    let resp = app
        .client
        .post(app.url(&format!("/api/sales/{sale}/purchase")))
        .bearer_auth(&user.token)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_error(resp, StatusCode::BAD_REQUEST, "invalid_json").await;
    assert_eq!(app.stock_left(sale).await, 5, "no unit taken");
    assert!(app.buyers(sale).await.is_empty(), "no buyer recorded");
    assert_eq!(counted(&app, sale, &user).await, 0, "no limit counted them");

    // Her own ticket still works afterwards.
    let t = ticket_of(&app, sale, &user).await;
    let resp = buy_with(&app, sale, &user, &json!({ "ticket": t })).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    assert_eq!(counted(&app, sale, &user).await, 1);
    assert_eq!(app.stock_left(sale).await, 4);
}

/// The ticket route's own limit: a bot polling for the opening is cut off (429
/// with `Retry-After`), and a refused request is counted by no other policy.
#[tokio::test]
async fn polling_for_tickets_is_rate_limited_per_user() {
    let app = spawn_app_with(|c| c.limits = per_user("ticket-user", "ticket", 3)).await;
    let admin = app.admin().await;
    let sale = app.create_sale_with(&admin, 5, 3600, 7200, true).await;
    let (bot, person) = (app.user().await, app.user().await);
    for _ in 0..3 {
        let early = ticket(&app, sale, &bot).await;
        assert_error(early, StatusCode::CONFLICT, "not_started").await;
    }
    let cut = ticket(&app, sale, &bot).await;
    assert!(cut.headers().contains_key("retry-after"));
    assert_error(cut, StatusCode::TOO_MANY_REQUESTS, "rate_limited").await;
    // Someone else is not affected.
    let theirs = ticket(&app, sale, &person).await;
    assert_error(theirs, StatusCode::CONFLICT, "not_started").await;
}

#[tokio::test]
async fn a_sale_without_tickets_sells_without_one_and_checks_one_if_sent() {
    let (app, _, sale) = spawn_with_live_sale_and(5, |_| {}).await;
    let (user, someone) = (app.user().await, app.user().await);
    app.buy(sale, &user.token).await;
    // A ticket sent anyway must still be good.
    let bad = buy_with(&app, sale, &someone, &json!({ "ticket": "x.y" })).await;
    assert_error(bad, StatusCode::UNPROCESSABLE_ENTITY, "invalid_ticket").await;
    let t = ticket_of(&app, sale, &someone).await;
    let resp = buy_with(&app, sale, &someone, &json!({ "ticket": t })).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    assert_eq!(app.stock_left(sale).await, 3);
}

#[tokio::test]
async fn tickets_of_unknown_ended_and_sold_out_sales_are_refused() {
    let app = spawn_app_with(|_| {}).await;
    let admin = app.admin().await;
    let user = app.user().await;
    assert_error(
        ticket(&app, 999_999, &user).await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let resp = app.post("/api/sales/abc/ticket", Some(&user.token)).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_error(
        app.post("/api/sales/1/ticket", None).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    // A sale that ends in a second: tickets until then, 410 `ended` after.
    let ended = app.create_sale_with(&admin, 5, -5, 1, true).await;
    let resp = ticket_until(
        &app,
        ended,
        &user,
        (StatusCode::OK, ""),
        (StatusCode::GONE, "ended"),
    )
    .await;
    assert_error(resp, StatusCode::GONE, "ended").await;
    let gone = app.live_ticket_sale(&admin, 1).await;
    let first = app.user().await;
    let t = ticket_of(&app, gone, &first).await;
    let resp = buy_with(&app, gone, &first, &json!({ "ticket": t })).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let t = ticket_of(&app, gone, &user).await;
    let resp = buy_with(&app, gone, &user, &json!({ "ticket": t })).await;
    assert_error(resp, StatusCode::GONE, "sold_out").await;
    // The process now knows it is sold out: no ticket either.
    assert_error(
        ticket(&app, gone, &user).await,
        StatusCode::GONE,
        "sold_out",
    )
    .await;
}

/// The opening with bots: 300 users of whom 100 fetched nothing (or fired before the
/// opening with no ticket) and 50 forge one, against 200 with real tickets, stock 150,
/// all released together. Exactly the ticket holders buy: 150 of the 200, nobody
/// without a valid ticket.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_at_the_opening_sells_only_to_ticket_holders() {
    let app = Arc::new(spawn_app_with(|c| c.sold_out_cache = Duration::ZERO).await);
    let admin = app.admin().await;
    let sale = app.create_sale_with(&admin, 150, -1, 3600, true).await;
    let users = app.create_users(350, false).await;
    let forger = TicketKey::new(b"a-bot-guessing-the-secret-badly!");
    let sale_id = Id::new(sale).unwrap();
    let far = chrono::Utc::now().timestamp_millis() + 60_000;
    let mut attempts = Vec::new();
    for (i, user) in users.iter().enumerate() {
        let body = match i {
            0..200 => json!({ "ticket": ticket_of(&app, sale, user).await }),
            200..300 => json!({}),
            _ => json!({ "ticket": forger.issue(sale_id, Id::new(user.id).unwrap(), far) }),
        };
        attempts.push((user.id, user.token.clone(), body, i < 200));
    }
    let barrier = Arc::new(Barrier::new(attempts.len()));
    let tasks: Vec<_> = attempts
        .into_iter()
        .map(|(id, token, body, holder)| {
            let (app, barrier) = (app.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let resp = app
                    .post_json(&format!("/api/sales/{sale}/purchase"), Some(&token), &body)
                    .await;
                (id, holder, resp.status())
            })
        })
        .collect();
    let mut accepted = Vec::new();
    for t in tasks {
        let (id, holder, status) = t.await.unwrap();
        match (holder, status) {
            (true, StatusCode::ACCEPTED) => accepted.push(id),
            (true, StatusCode::GONE) => {}
            (false, StatusCode::PRECONDITION_REQUIRED | StatusCode::UNPROCESSABLE_ENTITY) => {}
            other => panic!("user {id}: unexpected {other:?}"),
        }
    }
    accepted.sort_unstable();
    assert_eq!(accepted.len(), 150, "every unit to a ticket holder");
    assert_eq!(app.stock_left(sale).await, 0);
    let mut buyers = app.buyers(sale).await;
    buyers.sort_unstable();
    assert_eq!(buyers, accepted);
    let orders = app.wait_for_orders(sale, 150).await;
    let mut ordered: Vec<i64> = orders.iter().map(|(_, u)| *u).collect();
    ordered.sort_unstable();
    assert_eq!(ordered, accepted, "exactly those orders in Postgres");
}
