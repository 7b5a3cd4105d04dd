//! A draw sale that is over while wins still run (closed early by the admin, or
//! its `ends_at` passed): the running wins settle at once, bought or passed, the
//! draw finishes, and no winner is told they may still buy.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use stampede::sale::draw::order;

use crate::helpers::{TestApp, User, assert_status, spawn_app};

/// A draw sale of `stock` drawn in `draw_in_s`, ending in `ends_in_s`, a claim
/// window of ten minutes; each of `users` enters. The sale and the entry ids.
async fn entered(
    app: &TestApp,
    admin: &User,
    stock: i64,
    (draw_in_s, ends_in_s): (i64, i64),
    users: &[User],
) -> (i64, Vec<i64>) {
    let now = chrono::Utc::now();
    let at = |s: i64| json!(now + chrono::Duration::seconds(s));
    let body = json!({
        "name": "Drawn, then over", "price_cents": 9_000, "stock": stock, "mode": "draw",
        "entries_open_at": at(-60), "draw_at": at(draw_in_s), "ends_at": at(ends_in_s),
        "claim_window_s": 600,
    });
    let sale = app.admin_create(admin, "/api/admin/sales", &body).await["id"]
        .as_i64()
        .unwrap();
    let mut ids = Vec::new();
    for u in users {
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
    (sale, ids)
}

/// Draws now and waits for the publication; the entries in the seeded order.
async fn draw_now(app: &TestApp, admin: &User, sale: i64, ids: &[i64]) -> Vec<i64> {
    assert_status(app.open_sale(admin, sale).await, StatusCode::OK).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let resp = app.get(&format!("/api/sales/{sale}/draw"), None).await;
        if resp.status() == StatusCode::OK {
            let draw: Value = resp.json().await.unwrap();
            let seed = order::unhex(draw["seed"].as_str().unwrap()).unwrap();
            return order::order(&seed, ids);
        }
        assert!(Instant::now() < deadline, "not drawn within 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn me(app: &TestApp, sale: i64, user: &User) -> Value {
    app.get_json(&format!("/api/sales/{sale}/entry/me"), Some(&user.token))
        .await
}

/// The first winner buys with their ticket; the ticket of the second, taken
/// while it was good.
async fn first_buys(app: &TestApp, sale: i64, winners: &[&User]) -> Value {
    let standing = me(app, sale, winners[1]).await;
    assert_eq!(standing["state"], "won", "{standing}");
    buys_with_the_win(app, sale, winners[0]).await;
    standing["ticket"].clone()
}

/// `winner` buys with the ticket of their running win: 202.
async fn buys_with_the_win(app: &TestApp, sale: i64, winner: &User) {
    let ticket = me(app, sale, winner).await["ticket"].clone();
    let resp = app
        .post_json(
            &format!("/api/sales/{sale}/purchase"),
            Some(&winner.token),
            &json!({ "ticket": ticket }),
        )
        .await;
    assert_status(resp, StatusCode::ACCEPTED).await;
}

/// Within 5 s: the admin's numbers show the three wins settled (one bought, two
/// passed), the publication gives each its outcome, the draw is finished; then
/// no unbought winner holds a usable win.
async fn settled(app: &TestApp, admin: &User, sale: i64, winners: &[&User], stale: &Value) {
    let path = format!("/api/admin/sales/{sale}/draw");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = app.get_json(&path, Some(&admin.token)).await;
        let got = [&n["wins"], &n["running"], &n["bought"], &n["passed"]];
        if got == [&json!(3), &json!(0), &json!(1), &json!(2)] {
            break;
        }
        assert!(Instant::now() < deadline, "running wins never settled: {n}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let finished: Option<bool> =
        sqlx::query_scalar("SELECT finished_at IS NOT NULL FROM sale_draws WHERE sale_id = $1")
            .bind(sale)
            .fetch_optional(&app.db)
            .await
            .unwrap();
    assert_eq!(finished, Some(true), "the draw is finished");
    let n = app.get_json(&path, Some(&admin.token)).await;
    assert!(
        n["finished_at"].is_string(),
        "the admin's numbers say so: {n}"
    );
    // The publication (cached a second) shows each outcome within a second.
    let deadline = Instant::now() + Duration::from_millis(1500);
    loop {
        let draw = app.get_json(&format!("/api/sales/{sale}/draw"), None).await;
        let outcomes: Vec<Value> = draw["winners"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["outcome"].clone())
            .collect();
        if outcomes == [json!("bought"), json!("passed"), json!("passed")] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "outcomes never published: {draw}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(me(app, sale, winners[0]).await["state"], "bought");
    for w in &winners[1..] {
        let standing = me(app, sale, w).await;
        assert_eq!(standing["state"], "claim_passed", "{standing}");
        assert!(standing.get("ticket").is_none(), "{standing}");
    }
    let resp = app
        .post_json(
            &format!("/api/sales/{sale}/purchase"),
            Some(&winners[1].token),
            &json!({ "ticket": stale }),
        )
        .await;
    assert!(!resp.status().is_success(), "a ticket taken before the end");
}

#[tokio::test]
async fn a_draw_closed_early_settles_its_running_wins_at_once() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let users = app.create_users(5, false).await;
    let (sale, ids) = entered(&app, &admin, 3, (3600, 7200), &users).await;
    let ordered = draw_now(&app, &admin, sale, &ids).await;
    let user_of = |entry: i64| &users[ids.iter().position(|&e| e == entry).unwrap()];
    let winners: Vec<&User> = ordered[..3].iter().map(|&e| user_of(e)).collect();
    let stale = first_buys(&app, sale, &winners).await;

    // Closed right after the purchase: most often before a step (every half
    // second) saw the purchase, so the close settles that win bought too.
    assert_status(app.close_sale(&admin, sale).await, StatusCode::OK).await;
    // At once, before any step: a closed sale's winner may not buy any more.
    let standing = me(&app, sale, winners[1]).await;
    assert_eq!(standing["state"], "claim_passed", "{standing}");
    assert!(standing.get("ticket").is_none(), "{standing}");
    app.wait_until_settled(sale).await;
    settled(&app, &admin, sale, &winners, &stale).await;
    // Nobody on the waiting list wins: the sale is over.
    for &entry in &ordered[3..] {
        assert_eq!(me(&app, sale, user_of(entry)).await["state"], "not_drawn");
    }
}

#[tokio::test]
async fn a_draw_whose_end_passes_settles_its_running_wins() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let users = app.create_users(4, false).await;
    // Drawn (by the admin's open) at once; over in 12 s, within the claims.
    let ends_at = Instant::now() + Duration::from_secs(12);
    let (sale, ids) = entered(&app, &admin, 3, (5, 12), &users).await;
    let ordered = draw_now(&app, &admin, sale, &ids).await;
    let user_of = |entry: i64| &users[ids.iter().position(|&e| e == entry).unwrap()];
    let winners: Vec<&User> = ordered[..3].iter().map(|&e| user_of(e)).collect();
    let stale = first_buys(&app, sale, &winners).await;
    app.wait_until_settled(sale).await;
    tokio::time::sleep(ends_at.saturating_duration_since(Instant::now())).await;
    settled(&app, &admin, sale, &winners, &stale).await;
}

/// A draw with fewer entries than units: once its one winner bought, every entry
/// had its turn and the units left are not for sale to anyone while the sale
/// still runs. Its views say when the draw finished (`draw_finished_at`, status
/// still `live`), and its page and card say the draw is over instead of offering
/// units nobody may buy.
#[tokio::test]
async fn a_finished_draw_with_units_left_says_so_while_the_sale_runs() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let users = app.create_users(1, false).await;
    let (sale, ids) = entered(&app, &admin, 3, (3600, 7200), &users).await;
    draw_now(&app, &admin, sale, &ids).await;
    let path = format!("/api/sales/{sale}");
    let view = app.get_json(&path, None).await;
    assert!(
        view.get("draw_finished_at").is_none(),
        "a win still runs: {view}"
    );
    buys_with_the_win(&app, sale, &users[0]).await;
    app.wait_until_settled(sale).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let view = loop {
        let view = app.get_json(&path, None).await;
        if view["draw_finished_at"].is_string() {
            break view;
        }
        assert!(Instant::now() < deadline, "never finished: {view}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(view["status"], "live", "{view}");
    assert_eq!(view["stock_left"], 2, "{view}");
    let list = app.get_json("/api/sales", None).await;
    let listed = list
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == sale)
        .cloned()
        .unwrap_or_default();
    assert!(listed["draw_finished_at"].is_string(), "{listed}");

    let page = app
        .get(&format!("/sales/{sale}"), None)
        .await
        .text()
        .await
        .unwrap();
    for text in [
        r#"data-draw-over="true""#,
        r#"<span class="badge badge-draw_over" data-field="badge">Draw over</span>"#,
        "The draw is over.",
        "No more wins will be given: the units left are not for sale.",
    ] {
        assert!(page.contains(text), "the sale page lacks {text:?}");
    }
    assert!(!page.contains("Only its winners may buy."));
    let home = app.get("/", None).await.text().await.unwrap();
    assert!(
        home.contains(r#"class="sale-card status-draw_over""#),
        "the home page's card"
    );
}
