//! The admin's live numbers of a draw sale (`GET /api/admin/sales/{id}/draw`,
//! issue 52): entries before the draw, then the wins as they run, are bought
//! and pass; admins only; a sale that is not a draw is refused.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use stampede::sale::draw::order;

use crate::helpers::{TestApp, User, assert_error, assert_status, spawn_app_with};

async fn numbers(app: &TestApp, admin: &User, sale: i64) -> Value {
    app.get_json(&format!("/api/admin/sales/{sale}/draw"), Some(&admin.token))
        .await
}

async fn ticket(app: &TestApp, sale: i64, user: &User) -> Value {
    app.get_json(&format!("/api/sales/{sale}/entry/me"), Some(&user.token))
        .await["ticket"]
        .clone()
}

#[tokio::test]
async fn the_admin_follows_entries_wins_buys_and_passes() {
    let app = spawn_app_with(|c| c.draw_claim_max = Duration::from_millis(3000)).await;
    let admin = app.admin().await;
    let users = app.create_users(4, false).await;
    let now = chrono::Utc::now();
    let at = |s: i64| json!(now + chrono::Duration::seconds(s));
    let body = json!({
        "name": "Drawn for the admin", "price_cents": 5_000, "stock": 2, "mode": "draw",
        "entries_open_at": at(-60), "draw_at": at(3600), "ends_at": at(7200),
        "claim_window_s": 600, "rebuy_after_expiry": true,
    });
    let sale = app.admin_create(&admin, "/api/admin/sales", &body).await["id"]
        .as_i64()
        .unwrap();
    let path = format!("/api/admin/sales/{sale}/draw");

    // Admins only; numbers of draws only.
    assert_error(
        app.get(&path, None).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    assert_error(
        app.get(&path, Some(&users[0].token)).await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    let plain = app.create_sale(&admin, 3, 3600, 7200).await;
    assert_error(
        app.get(
            &format!("/api/admin/sales/{plain}/draw"),
            Some(&admin.token),
        )
        .await,
        StatusCode::CONFLICT,
        "not_a_draw",
    )
    .await;
    assert_error(
        app.get("/api/admin/sales/987654/draw", Some(&admin.token))
            .await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    assert_error(
        app.get("/api/admin/sales/x1/draw", Some(&admin.token))
            .await,
        StatusCode::BAD_REQUEST,
        "invalid_id",
    )
    .await;

    let empty = numbers(&app, &admin, sale).await;
    assert_eq!(empty["entries"], 0);
    assert_eq!(empty["drawn_at"], Value::Null);
    let mut ids = Vec::new();
    for u in &users {
        let resp = app
            .post(&format!("/api/sales/{sale}/entry"), Some(&u.token))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        ids.push(
            resp.json::<Value>().await.unwrap()["entry_id"]
                .as_i64()
                .unwrap(),
        );
    }
    let before = numbers(&app, &admin, sale).await;
    assert_eq!(
        before,
        json!({"entries": 4, "drawn_at": null, "winners_at_draw": 0, "wins": 0,
               "running": 0, "bought": 0, "returned": 0, "passed": 0,
               "finished_at": null})
    );

    // The draw: two win, both buying.
    assert_status(app.open_sale(&admin, sale).await, StatusCode::OK).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let drawn = loop {
        let n = numbers(&app, &admin, sale).await;
        if !n["drawn_at"].is_null() {
            break n;
        }
        assert!(Instant::now() < deadline, "not drawn within 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(drawn["entries"], 4);
    assert_eq!(drawn["winners_at_draw"], 2);
    assert_eq!(
        (drawn["wins"].clone(), drawn["running"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(
        (drawn["bought"].clone(), drawn["passed"].clone()),
        (json!(0), json!(0))
    );

    // The first buys, the second lets the win pass: the third wins.
    let published = app.get_json(&format!("/api/sales/{sale}/draw"), None).await;
    let seed = order::unhex(published["seed"].as_str().unwrap()).unwrap();
    let ordered = order::order(&seed, &ids);
    let user_of = |entry: i64| &users[ids.iter().position(|&e| e == entry).unwrap()];
    let buyer = user_of(ordered[0]);
    let t = ticket(&app, sale, buyer).await;
    let resp = app
        .post_json(
            &format!("/api/sales/{sale}/purchase"),
            Some(&buyer.token),
            &json!({ "ticket": t }),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let order = resp.json::<Value>().await.unwrap()["order_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let want = json!({"entries": 4, "drawn_at": drawn["drawn_at"], "winners_at_draw": 2,
                      "wins": 3, "running": 1, "bought": 1, "returned": 0, "passed": 1,
                      "finished_at": null});
    until_numbers(&app, &admin, sale, &want).await;

    // The buyer cancels: the win stays bought (it bought once), counted returned,
    // and its unit goes to the last entry.
    let cancel = format!("/api/orders/{order}/cancel");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let resp = app.post(&cancel, Some(&buyer.token)).await;
        if resp.status() != StatusCode::SERVICE_UNAVAILABLE {
            assert_status(resp, StatusCode::OK).await;
            break;
        }
        assert!(Instant::now() < deadline, "still 503 after 15 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let want = json!({"entries": 4, "drawn_at": drawn["drawn_at"], "winners_at_draw": 2,
                      "wins": 4, "running": 2, "bought": 1, "returned": 1, "passed": 1,
                      "finished_at": null});
    until_numbers(&app, &admin, sale, &want).await;

    // The buyer's orders say the win bought once, whatever the sale's rebuy
    // setting (a win is not given again), as the sale page does.
    let mine = app.get_json("/api/me/orders", Some(&buyer.token)).await;
    assert_eq!(mine[0]["rebuy_after_expiry"], false, "{mine}");
    let page = app.html("/me/orders", Some(buyer)).await;
    assert!(page.contains("A win buys once: a returned order does not give another."));
    assert!(!page.contains("You may buy from this sale again"));
    assert!(page.contains(r#"data-gate="draw""#));
}

/// Waits up to 15 s for the draw's numbers to be `want`.
async fn until_numbers(app: &TestApp, admin: &User, sale: i64, want: &Value) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let n = numbers(app, admin, sale).await;
        if &n == want {
            return;
        }
        assert!(Instant::now() < deadline, "never {want}: last {n}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
