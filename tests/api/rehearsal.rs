//! Rehearsals (`stampede load`'s sales and users): never on a public page or list,
//! still sold to whoever knows the id; the cleanup removes every row and key of
//! them and nothing else, and only an admin may ask for it.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use stampede::sale::rehearsal::REMOVAL_OPEN_AFTER_TOKENS;

use crate::helpers::{
    Db, TestApp, User, assert_error, listed, merged, spawn_app, spawn_app_with, spawn_sibling,
};
use crate::settle::settler;

/// Every Redis key of the sale's hash tag in the app's namespace.
async fn keys_of_sale(app: &TestApp, sale: i64) -> Vec<String> {
    let k = app.sale_keys(sale);
    app.redis
        .clone()
        .keys_in_slot_of(
            &k.meta,
            &format!("{}:*{{sale:{sale}}}*", app.keys.namespace()),
        )
        .await
        .unwrap()
}

async fn rehearsal_sale(app: &TestApp, admin: &User, stock: i64, extra: Value) -> i64 {
    let overrides = merged(
        json!({"name": "Rehearsal gadget", "rehearsal": true}),
        &extra,
    );
    app.live_sale_with(admin, stock, overrides).await
}

async fn mark_rehearsal_users(app: &TestApp, users: &[&User]) {
    let ids: Vec<i64> = users.iter().map(|u| u.id).collect();
    sqlx::query("UPDATE users SET rehearsal = TRUE WHERE id = ANY($1)")
        .bind(&ids)
        .execute(&app.db)
        .await
        .unwrap();
}

/// `POST /api/admin/rehearsals/cleanup` as `admin`: 200 and what it removed.
async fn clean_up(app: &TestApp, admin: &User) -> Value {
    let resp = app
        .post("/api/admin/rehearsals/cleanup", Some(&admin.token))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    resp.json().await.unwrap()
}

fn ids_of(list: &Value) -> Vec<i64> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_i64().unwrap())
        .collect()
}

#[tokio::test]
async fn a_rehearsal_is_on_no_public_surface_yet_sells() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let buyer = app.user().await;
    let real = app
        .live_sale_with(&admin, 5, json!({"name": "Real phone"}))
        .await;
    let created = app
        .open_sale_with(
            &admin,
            5,
            json!({"name": "Rehearsal gadget", "rehearsal": true}),
        )
        .await;
    let rehearsal = created["id"].as_i64().unwrap();
    // A real sale says it is not one.
    let real_view = app.get_json(&format!("/api/sales/{real}"), None).await;
    assert_eq!(real_view["rehearsal"], false);

    // Public lists: the cached first page, a larger (uncached) one, a later page.
    for path in ["/api/sales", "/api/sales?limit=100", "/api/sales?limit=1"] {
        let mut next = Some(path.to_string());
        let mut seen = Vec::new();
        while let Some(p) = next.take() {
            let resp = app.get(&p, Some(&buyer.token)).await;
            assert_eq!(resp.status(), StatusCode::OK);
            next = resp
                .headers()
                .get("x-next-cursor")
                .map(|c| format!("/api/sales?limit=1&cursor={}", c.to_str().unwrap()));
            seen.extend(ids_of(&resp.json().await.unwrap()));
        }
        assert!(seen.contains(&real), "{path}: {seen:?}");
        assert!(!seen.contains(&rehearsal), "{path}: {seen:?}");
    }
    // The admin's list has it, marked.
    let admin_list = app.get_json("/api/admin/sales", Some(&admin.token)).await;
    let row = listed(&admin_list, rehearsal);
    assert_eq!(row["rehearsal"], true);

    // The home page, signed out and signed in.
    for session in [None, Some(&buyer)] {
        let home = app.html("/", session).await;
        assert!(home.contains("Real phone"));
        assert!(!home.contains("Rehearsal gadget"), "{home}");
        assert!(!home.contains(&format!("/sales/{rehearsal}\"")));
    }
    // The sale itself: 404 to all but an admin.
    for token in [None, Some(buyer.token.as_str())] {
        let resp = app.get(&format!("/api/sales/{rehearsal}"), token).await;
        assert_error(resp, StatusCode::NOT_FOUND, "not_found").await;
    }
    let seen = app
        .get_json(&format!("/api/sales/{rehearsal}"), Some(&admin.token))
        .await;
    assert_eq!(seen["rehearsal"], true);
    app.html_status(
        &format!("/sales/{rehearsal}"),
        Some(&buyer),
        StatusCode::NOT_FOUND,
    )
    .await;
    app.html_status(&format!("/sales/{rehearsal}"), None, StatusCode::NOT_FOUND)
        .await;
    let page = app.html(&format!("/sales/{rehearsal}"), Some(&admin)).await;
    assert!(page.contains("Rehearsal gadget"));
    let admin_page = app.html("/admin", Some(&admin)).await;
    assert!(
        admin_page.contains("data-field=\"rehearsal\" title=\"A rehearsal (stampede load): never on a public page or list\">Rehearsal"),
        "{admin_page}"
    );

    // Yet it sells, and its events stream, as the load tool needs.
    app.buy(rehearsal, &buyer.token).await;
    assert_eq!(app.wait_for_orders(rehearsal, 1).await.len(), 1);
    let events = app
        .client
        .get(app.url(&format!("/api/sales/{rehearsal}/events")))
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), StatusCode::OK);
    drop(events);
}

#[tokio::test]
async fn cleanup_removes_every_rehearsal_row_and_key_and_nothing_else() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let shoppers = app.create_users(3, false).await;
    let load_users = app.create_users(4, false).await;
    let (a, b) = (&shoppers[0], &shoppers[1]);
    mark_rehearsal_users(&app, &load_users.iter().collect::<Vec<_>>()).await;
    // The load tool's own admin (`rehearse::Store::make_users` makes one a run):
    // removed too, but not counted among the rehearsal's users.
    let load_admin = app.create_users(1, true).await.remove(0);
    mark_rehearsal_users(&app, &[&load_admin]).await;

    // A real sale with real orders, one of them by a rehearsal user (kept).
    let real = app
        .live_sale_with(&admin, 10, json!({"max_per_user": 2}))
        .await;
    for buyer in [a, b, &load_users[3]] {
        app.buy(real, &buyer.token).await;
    }
    // Two rehearsals: one with a payment step (a payment, a stock change), one open
    // and still with pending state.
    let paid = rehearsal_sale(&app, &admin, 10, json!({"payment_window_s": 600})).await;
    let plain = rehearsal_sale(&app, &admin, 10, json!({})).await;
    let mut order_ids = Vec::new();
    for user in &load_users[..3] {
        let resp = app.purchase(paid, &user.token).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        let body: Value = resp.json().await.unwrap();
        order_ids.push(body["order_id"].as_str().unwrap().to_string());
        app.buy(plain, &user.token).await;
    }
    let resp = app.change_stock(&admin, paid, &json!({"add": 5})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    app.wait_for_orders(paid, 3).await;
    app.wait_for_orders(plain, 3).await;
    app.wait_for_orders(real, 3).await;
    let pay = app
        .client
        .post(app.url(&format!("/api/orders/{}/pay", order_ids[0])))
        .bearer_auth(&load_users[0].token)
        .header("Idempotency-Key", "rehearsal-pay-1")
        .send()
        .await
        .unwrap();
    assert_eq!(pay.status(), StatusCode::OK, "{:?}", pay.text().await);
    sqlx::query("INSERT INTO admin_changes (admin_id, action, sale_id) VALUES ($1, 'close', $2)")
        .bind(admin.id)
        .bind(paid)
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query("INSERT INTO admin_changes (admin_id, action, sale_id) VALUES ($1, 'close', $2)")
        .bind(admin.id)
        .bind(real)
        .execute(&app.db)
        .await
        .unwrap();
    // A rehearsal user's ended session.
    let out = app
        .post("/api/auth/signout", Some(&load_users[1].token))
        .await;
    assert_eq!(out.status(), StatusCode::NO_CONTENT);
    assert!(!keys_of_sale(&app, paid).await.is_empty());
    let real_keys = keys_of_sale(&app, real).await;
    let real_left = app.stock_left(real).await;

    let cleaned = clean_up(&app, &admin).await;
    assert_eq!(cleaned["sales"], 2, "{cleaned}");
    assert_eq!(cleaned["orders"], 6, "{cleaned}");
    assert_eq!(
        cleaned["users"], 3,
        "the shoppers, not the tool's admin: {cleaned}"
    );
    assert_eq!(cleaned["admins"], 1, "{cleaned}");
    assert_eq!(cleaned["users_kept"], 1, "{cleaned}");

    let count = |sql: &'static str| {
        let db = app.db.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(vec![paid, plain])
                .fetch_one(&db)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        count("SELECT count(*) FROM sales WHERE id = ANY($1) OR rehearsal OR $1 IS NULL").await,
        0
    );
    assert_eq!(
        count("SELECT count(*) FROM orders WHERE sale_id = ANY($1)").await,
        0
    );
    assert_eq!(
        count("SELECT count(*) FROM stock_changes WHERE sale_id = ANY($1)").await,
        0
    );
    assert_eq!(
        count("SELECT count(*) FROM admin_changes WHERE sale_id = ANY($1)").await,
        0
    );
    assert_eq!(
        count("SELECT count(*) FROM payments WHERE cardinality($1) > 0").await,
        0
    );
    let gone: i64 = app
        .scalar("SELECT count(*) FROM users WHERE id = $1", load_admin.id)
        .await;
    assert_eq!(
        gone, 0,
        "the load tool's admin is removed with its rehearsal"
    );
    let ids: Vec<i64> = load_users.iter().map(|u| u.id).collect();
    let left: Vec<i64> = app
        .scalars("SELECT id FROM users WHERE id = ANY($1) ORDER BY id", &ids)
        .await;
    assert_eq!(left, [load_users[3].id], "the one with a real order stays");
    let sessions: i64 = app
        .scalar(
            "SELECT count(*) FROM signed_out_sessions WHERE user_id = ANY($1)",
            &ids,
        )
        .await;
    assert_eq!(sessions, 0);

    // Redis: nothing of the rehearsals, also after settlement has read its streams
    // again (it must not recreate a removed sale's stream).
    for sale in [paid, plain] {
        assert_eq!(keys_of_sale(&app, sale).await, Vec::<String>::new());
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for sale in [paid, plain] {
        assert_eq!(keys_of_sale(&app, sale).await, Vec::<String>::new());
        let resp = app
            .get(&format!("/api/sales/{sale}"), Some(&admin.token))
            .await;
        assert_error(resp, StatusCode::NOT_FOUND, "not_found").await;
        let resp = app.purchase(sale, &shoppers[2].token).await;
        assert_error(resp, StatusCode::NOT_FOUND, "not_found").await;
    }
    for sale in [paid, plain] {
        // Only the cache's note that there is no such sale, which those reads made.
        let state: Vec<String> = keys_of_sale(&app, sale)
            .await
            .into_iter()
            .filter(|k| *k != app.keys.sale_view(stampede::domain::Id::new(sale).unwrap()))
            .collect();
        assert_eq!(state, Vec::<String>::new(), "a purchase rebuilt nothing");
    }

    // The real sale: untouched in both stores, and it still sells.
    assert_eq!(app.orders_in_db(real).await.len(), 3);
    let history: i64 = app
        .scalar(
            "SELECT count(*) FROM admin_changes WHERE sale_id = $1",
            real,
        )
        .await;
    assert_eq!(history, 2, "its creation and the close above");
    let mut now_keys = keys_of_sale(&app, real).await;
    let mut before = real_keys.clone();
    now_keys.sort();
    before.sort();
    assert_eq!(now_keys, before);
    assert_eq!(app.stock_left(real).await, real_left);
    let report = app.reconcile_report(&admin, real).await;
    assert_eq!(report["consistent"], true, "{report}");
    app.buy(real, &shoppers[2].token).await;

    // Again: nothing left to remove.
    let again: Value = app
        .post("/api/admin/rehearsals/cleanup", Some(&admin.token))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again["sales"], 0);
    assert_eq!(again["orders"], 0);
    assert_eq!(again["users"], 0);
    assert_eq!(again["admins"], 0);
}

#[tokio::test]
async fn cleanup_needs_an_admin_and_a_csrf_token_in_a_browser() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let buyer = app.user().await;
    let sale = rehearsal_sale(&app, &admin, 3, json!({})).await;
    let path = "/api/admin/rehearsals/cleanup";
    assert_error(
        app.post(path, None).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    assert_error(
        app.post(path, Some(&buyer.token)).await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    // The admin's cookie session without the CSRF header.
    let resp = app
        .client
        .post(app.url(path))
        .header(
            "Cookie",
            format!("stampede_session={}; stampede_csrf=abc123", admin.token),
        )
        .send()
        .await
        .unwrap();
    assert_error(resp, StatusCode::FORBIDDEN, "csrf_failed").await;
    let still: i64 = app
        .scalar("SELECT count(*) FROM sales WHERE id = $1", sale)
        .await;
    assert_eq!(still, 1);
}

/// Settlement looks an order's user up only while a removal of users by the cleanup
/// is open (migrations/0015). A rehearsal user's order of a real sale, accepted
/// before the cleanup and not settled yet, is then not written (it is counted as a
/// conflict); the other buyer's order is.
#[tokio::test]
async fn an_order_of_a_user_the_cleanup_removed_is_not_settled() {
    let app = spawn_app_with(|c| c.settle_in_serve = false).await;
    let admin = app.admin().await;
    let shopper = app.user().await;
    let load_users = app.create_users(1, false).await;
    let load_user = &load_users[0];
    mark_rehearsal_users(&app, &[load_user]).await;
    let real = app.live_sale_with(&admin, 10, json!({})).await;
    for buyer in [&shopper, load_user] {
        let resp = app.purchase(real, &buyer.token).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
    }

    // The rehearsal user has no order in Postgres yet: the cleanup removes it, and
    // records the removal open for a token's life and a day.
    let cleaned = clean_up(&app, &admin).await;
    assert_eq!(cleaned["users"], 1, "{cleaned}");
    let (users, open_for): (i64, f64) = sqlx::query_as(
        "SELECT users, extract(epoch FROM until - removed_at)::float8 FROM user_removals",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(users, 1);
    let expected = (app.config.token_ttl + REMOVAL_OPEN_AFTER_TOKENS).as_secs_f64();
    assert!(
        (open_for - expected).abs() < 5.0,
        "{open_for} s, not {expected}"
    );

    let metrics = std::sync::Arc::new(stampede::metrics::Metrics::default());
    let mut worker = settler(&app, "after-cleanup", 100, Duration::from_secs(30))
        .await
        .with_metrics(metrics.clone());
    worker.drain().await.unwrap();
    let buyers: Vec<i64> = app
        .scalars("SELECT user_id FROM orders WHERE sale_id = $1", real)
        .await;
    assert_eq!(
        buyers,
        [shopper.id],
        "the removed user's order is not written"
    );
    assert_eq!(metrics.settle_conflicts.get(), 1);
}

/// Votes guard the same way (migrations/0027, no foreign key to `users`): a
/// rehearsal user's vote in a real poll, accepted before the cleanup and not settled
/// yet, is not written once the cleanup removed that user; the other voter's is.
#[tokio::test]
async fn a_vote_of_a_user_the_cleanup_removed_is_not_settled() {
    let app = spawn_app_with(|c| c.settle_in_serve = false).await;
    let admin = app.admin().await;
    let voter = app.user().await;
    let load_users = app.create_users(1, false).await;
    let load_user = &load_users[0];
    mark_rehearsal_users(&app, &[load_user]).await;
    let (poll, options) = app
        .create_poll(&admin, "Removed voters", &["a", "b"], -60, 3600)
        .await;
    for user in [&voter, load_user] {
        let resp = app.vote(poll, &user.token, options[0]).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
    }

    let cleaned = clean_up(&app, &admin).await;
    assert_eq!(cleaned["users"], 1, "{cleaned}");

    let mut worker = settler(&app, "after-cleanup", 100, Duration::from_secs(30)).await;
    worker.drain().await.unwrap();
    let voters: Vec<i64> = app
        .scalars("SELECT user_id FROM votes WHERE poll_id = $1", poll)
        .await;
    assert_eq!(voters, [voter.id], "the removed user's vote is not written");
}

/// A `token_ttl` past any sense opens the removal for a century, no longer: the
/// cleanup neither overflows nor fails on it.
#[tokio::test]
async fn a_huge_token_ttl_opens_a_removal_for_a_century() {
    let app = spawn_app().await;
    let load_users = app.create_users(1, false).await;
    mark_rehearsal_users(&app, &[&load_users[0]]).await;
    let cleaned = stampede::sale::rehearsal::cleanup(
        &app.db,
        &mut app.redis.clone(),
        &app.keys,
        Duration::MAX,
    )
    .await
    .unwrap();
    assert_eq!(cleaned.users, 1);
    let years: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM until - removed_at)::float8 / (365 * 24 * 3600)
         FROM user_removals",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert!((years - 100.0).abs() < 0.01, "{years} years");
}

/// A rehearsal's admin (a `stampede load` run signs its own a token of six hours)
/// removed by the cleanup: its token stops working on every server at once, on a
/// server started after the removal too (it loads `ended_accounts`), where the
/// token carried the admin flag and kept the admin API open until it expired.
#[tokio::test(flavor = "multi_thread")]
async fn a_removed_rehearsal_admins_token_stops_working_everywhere() {
    // Sign-ins live an hour here; the load tool's tokens six hours whatever it is.
    let app = spawn_app_with(|c| {
        c.session_sync = Duration::from_secs(1);
        c.token_ttl = Duration::from_secs(3600);
    })
    .await;
    let sibling = spawn_sibling(&app, |_| {}).await;
    let admin = app.admin().await;
    let load_admin = app.admin().await;
    let load_shopper = app.user().await;
    mark_rehearsal_users(&app, &[&load_admin, &load_shopper]).await;
    for server in [&app, &sibling] {
        let resp = server
            .get("/api/admin/console", Some(&load_admin.token))
            .await;
        assert_eq!(resp.status(), StatusCode::OK, "before the cleanup");
    }
    let cleaned = clean_up(&app, &admin).await;
    assert_eq!(
        (cleaned["admins"].as_i64(), cleaned["users"].as_i64()),
        (Some(1), Some(1)),
        "{cleaned}"
    );
    for (server, what) in [
        (&app, "the server that cleaned up"),
        (&sibling, "another server"),
    ] {
        let started = std::time::Instant::now();
        loop {
            let resp = server
                .get("/api/admin/console", Some(&load_admin.token))
                .await;
            if resp.status() == StatusCode::UNAUTHORIZED {
                assert_error(resp, StatusCode::UNAUTHORIZED, "session_ended").await;
                break;
            }
            assert!(
                started.elapsed() < Duration::from_millis(2500),
                "{what} still takes the removed admin's token: {}",
                resp.status()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let later = spawn_sibling(&app, |_| {}).await;
    let resp = later
        .get("/api/admin/console", Some(&load_admin.token))
        .await;
    assert_error(resp, StatusCode::UNAUTHORIZED, "session_ended").await;
    // The admin who cleaned up goes on.
    let resp = later.get("/api/admin/console", Some(&admin.token)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let rows = app
        .count("SELECT count(*) FROM ended_accounts WHERE until > now() + interval '359 minutes'")
        .await;
    assert_eq!(
        rows, 1,
        "one removed admin recorded, for as long as a load token lives"
    );
}
