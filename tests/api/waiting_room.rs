//! A sale's waiting room (issue 29): one place per account, the early joiners in a
//! random order at the opening, admission at the sale's pace and never past the
//! units left, purchases only with an admission, passes to the next in line.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, User, assert_error, spawn_app_with};

/// A sale with a waiting room whose line is open now and that opens in
/// `starts_in_ms`, admitting `rate` a second: its id.
pub async fn waiting_room_sale(
    app: &TestApp,
    admin: &User,
    stock: i64,
    starts_in_ms: i64,
    rate: i64,
) -> i64 {
    let now = chrono::Utc::now();
    let sale = json!({
        "name": "Queued phone",
        "price_cents": 500,
        "stock": stock,
        "starts_at": now + chrono::Duration::milliseconds(starts_in_ms),
        "ends_at": now + chrono::Duration::seconds(3600),
        "requires_ticket": false,
        "waiting_room": true,
        "queue_opens_at": now - chrono::Duration::seconds(5),
        "admit_per_second": rate,
    });
    let created = app.admin_create(admin, "/api/admin/sales", &sale).await;
    assert_eq!(created["waiting_room"], true);
    assert_eq!(created["requires_ticket"], true, "an admission is a ticket");
    created["id"].as_i64().unwrap()
}

pub async fn join(app: &TestApp, sale: i64, user: &User) -> reqwest::Response {
    app.post(&format!("/api/sales/{sale}/queue"), Some(&user.token))
        .await
}

pub async fn me(app: &TestApp, sale: i64, user: &User) -> Value {
    app.get_json(&format!("/api/sales/{sale}/queue/me"), Some(&user.token))
        .await
}

/// Waits until `user` is no longer waiting: the standing then.
pub async fn wait_turn(app: &TestApp, sale: i64, user: &User, within: Duration) -> Value {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let m = me(app, sale, user).await;
        if m["state"] != "waiting" || tokio::time::Instant::now() > deadline {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn buy_with_ticket(app: &TestApp, sale: i64, user: &User, ticket: &str) -> reqwest::Response {
    app.post_json(
        &format!("/api/sales/{sale}/purchase"),
        Some(&user.token),
        &json!({ "ticket": ticket }),
    )
    .await
}

#[tokio::test]
async fn one_place_per_account_admission_buys_and_an_unused_one_passes_to_the_next() {
    let app = spawn_app_with(|c| c.queue_admission = Duration::from_millis(1500)).await;
    let admin = app.admin().await;
    let sale = waiting_room_sale(&app, &admin, 2, 1500, 1000).await;
    let users = app.create_users(4, false).await;

    // Before the opening: a place, the same one however often; no order yet.
    for u in &users {
        let first = join(&app, sale, u).await;
        assert_eq!(first.status(), StatusCode::OK);
        let first: Value = first.json().await.unwrap();
        assert_eq!(first["state"], "waiting");
        assert_eq!(first["ahead"], Value::Null, "drawn at the opening");
        for _ in 0..3 {
            let again: Value = join(&app, sale, u).await.json().await.unwrap();
            assert_eq!(again, first);
        }
    }
    let line: i64 = redis::cmd("ZCARD")
        .arg(app.sale_keys(sale).queue)
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();
    assert_eq!(line, 4, "one place per account");

    // No purchase without an admission, nothing taken.
    assert_error(
        app.purchase(sale, &users[0].token).await,
        StatusCode::FORBIDDEN,
        "not_admitted",
    )
    .await;
    assert_eq!(app.stock_left(sale).await, 2);

    // From the opening: two admitted (two units), two still waiting.
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let mut admitted = Vec::new();
    let mut waiting = Vec::new();
    for u in &users {
        let m = wait_turn(&app, sale, u, Duration::from_millis(300)).await;
        match m["state"].as_str().unwrap() {
            "admitted" => admitted.push((u, m)),
            "waiting" => waiting.push((u, m)),
            other => panic!("unexpected state {other}: {m}"),
        }
    }
    assert_eq!(admitted.len(), 2, "never more admitted than units left");
    let mut positions: Vec<i64> = admitted
        .iter()
        .map(|(_, m)| m["position"].as_i64().unwrap())
        .collect();
    positions.sort();
    assert_eq!(positions, vec![1, 2], "the head of the line first");
    for (_, m) in &waiting {
        assert!(m["ahead"].as_i64().unwrap() <= 1, "{m}");
    }
    // A shopper waiting cannot get a ticket.
    assert_error(
        app.post(
            &format!("/api/sales/{sale}/ticket"),
            Some(&waiting[0].0.token),
        )
        .await,
        StatusCode::FORBIDDEN,
        "not_admitted",
    )
    .await;

    // The first admitted buys with the admission's ticket; the second lets it pass.
    let (buyer, m) = &admitted[0];
    let resp = buy_with_ticket(&app, sale, buyer, m["ticket"].as_str().unwrap()).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    assert_eq!(me(&app, sale, buyer).await["state"], "bought");
    let (idle, _) = &admitted[1];
    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert_eq!(me(&app, sale, idle).await["state"], "passed");

    // Its room went to the next in line, and then the sale sold out.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let (first_turn, later) = loop {
        let a = me(&app, sale, waiting[0].0).await;
        if a["state"] == "admitted" {
            break ((waiting[0].0, a), waiting[1].0);
        }
        let b = me(&app, sale, waiting[1].0).await;
        if b["state"] == "admitted" {
            break ((waiting[1].0, b), waiting[0].0);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nobody admitted after the pass"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        me(&app, sale, later).await["state"],
        "waiting",
        "one unit left, one admitted"
    );
    assert_eq!(first_turn.1["state"], "admitted", "{}", first_turn.1);
    let resp = buy_with_ticket(
        &app,
        sale,
        first_turn.0,
        first_turn.1["ticket"].as_str().unwrap(),
    )
    .await;
    assert_eq!(
        resp.status(),
        StatusCode::ACCEPTED,
        "{}",
        resp.text().await.unwrap()
    );
    assert_eq!(app.stock_left(sale).await, 0);
    assert_eq!(me(&app, sale, later).await["state"], "sold_out");
    assert_eq!(app.wait_for_orders(sale, 2).await.len(), 2);
    let view: Value = app.get_json(&format!("/api/sales/{sale}"), None).await;
    assert_eq!(view["line"]["line"], 4, "{view}");
    assert_eq!(view["line"]["admitted"], 3, "{view}");
    assert_eq!(view["line"]["passed"], 1, "{view}");
}
