//! The days around a sale (issue 25): edit, archive, delete and the history of
//! admin changes, each refusal changing nothing.

use chrono::{Duration, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};
use stampede::domain::Id;

use crate::helpers::{Db, TestApp, User, redis_get, spawn_app, spawn_with_live_sale};

async fn patch(app: &TestApp, who: &User, sale: i64, body: Value) -> (StatusCode, Value) {
    let resp = app.patch_sale(who, sale, &body).await;
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn delete(app: &TestApp, who: &User, sale: i64) -> (StatusCode, Value) {
    let resp = app
        .client
        .delete(app.url(&format!("/api/admin/sales/{sale}")))
        .bearer_auth(&who.token)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn row(app: &TestApp, sale: i64) -> Value {
    let rows: Vec<(Value,)> = app
        .rows("SELECT to_jsonb(s) FROM sales s WHERE id = $1", sale)
        .await;
    rows.into_iter().next().map_or(Value::Null, |(v,)| v)
}

async fn history(app: &TestApp, admin: &User, sale: i64) -> Vec<Value> {
    let h = app
        .get_json(
            &format!("/api/admin/sales/{sale}/history"),
            Some(&admin.token),
        )
        .await;
    h.as_array().expect("a list").clone()
}

/// The actions of a history (`GET .../history`), newest first.
async fn actions(app: &TestApp, admin: &User, path: String) -> Vec<String> {
    app.get_json(&path, Some(&admin.token))
        .await
        .as_array()
        .expect("a list")
        .iter()
        .map(|e| e["action"].as_str().unwrap().to_string())
        .collect()
}

fn ids(list: &Value) -> Vec<i64> {
    list.as_array()
        .expect("a list")
        .iter()
        .map(|s| s["id"].as_i64().unwrap())
        .collect()
}

#[tokio::test]
async fn an_upcoming_sale_may_change_every_field_and_the_change_is_recorded() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app.create_sale(&admin, 10, 3600, 7200).await;
    let starts = Utc::now() + Duration::seconds(1800);
    let (status, body) = patch(
        &app,
        &admin,
        sale,
        json!({
            "name": "  Phone X, fixed  ",
            "description": "new words",
            "price_cents": 12_345,
            "image_url": "/static/placeholder.svg",
            "starts_at": starts,
            "ends_at": starts + Duration::seconds(600),
            "requires_ticket": true,
            "payment_window_s": 300,
            "rebuy_after_expiry": true,
            "max_per_user": 3,
        }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["name"], "Phone X, fixed");
    assert_eq!(body["price_cents"], 12_345);
    assert_eq!(body["max_per_user"], 3);
    assert_eq!(body["requires_ticket"], true);
    assert_eq!(body["payment_window_s"], 300);
    // The public view shows it at once (the cache was cleared).
    let public = app.get_json(&format!("/api/sales/{sale}"), None).await;
    assert_eq!(public["name"], "Phone X, fixed");
    assert_eq!(public["image_url"], "/static/placeholder.svg");
    // And Redis holds the new window and cap.
    let k = app.keys.sale(Id::new(sale).unwrap());
    let meta: std::collections::HashMap<String, String> =
        app.redis_query(redis::cmd("HGETALL").arg(&k.meta)).await;
    assert_eq!(meta["starts_ms"], starts.timestamp_millis().to_string());
    assert_eq!(meta["per_user"], "3");
    assert_eq!(redis_get(&app.redis, &k.sold).await.as_deref(), Some("0"));
    // Recorded: who, what, before and after.
    let h = history(&app, &admin, sale).await;
    assert_eq!(h[0]["action"], "edit");
    assert_eq!(h[0]["admin_id"], admin.id);
    assert_eq!(h[0]["before"]["price_cents"], 19_900);
    assert_eq!(h[0]["after"]["price_cents"], 12_345);
    assert_eq!(h[0]["after"]["name"], "Phone X, fixed");
    assert_eq!(h.last().unwrap()["action"], "create");
    // The picture can be removed again.
    let (status, body) = patch(&app, &admin, sale, json!({"image_url": null})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["image_url"], Value::Null);
}

#[tokio::test]
async fn an_open_sale_keeps_what_buyers_were_promised() {
    let (app, admin, sale) = spawn_with_live_sale(5).await;
    let before = row(&app, sale).await;
    let ends_before = app.get_json(&format!("/api/sales/{sale}"), None).await["ends_at"].clone();
    for body in [
        json!({"price_cents": 1}),
        json!({"max_per_user": 2}),
        json!({"requires_ticket": true}),
        json!({"payment_window_s": 60}),
        json!({"rebuy_after_expiry": true}),
        json!({"starts_at": Utc::now() + Duration::seconds(60)}),
        json!({"ends_at": Utc::now() + Duration::seconds(60)}),
        // One allowed field does not carry a forbidden one through.
        json!({"name": "sneaky", "price_cents": 1}),
    ] {
        let (status, err) = patch(&app, &admin, sale, body.clone()).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(err["error"], "sale_started", "{body}");
    }
    assert_eq!(
        row(&app, sale).await,
        before,
        "a refused edit changed nothing"
    );
    // The same value is no change, even for a fixed field.
    let (status, _) = patch(
        &app,
        &admin,
        sale,
        json!({"price_cents": 19_900, "name": "Renamed"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let later = Utc::now() + Duration::seconds(7200);
    let (status, body) = patch(
        &app,
        &admin,
        sale,
        json!({"ends_at": later, "description": "d"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_ne!(body["ends_at"], ends_before);
    let k = app.keys.sale(Id::new(sale).unwrap());
    let ends_ms: String = app
        .redis_query(redis::cmd("HGET").arg(&k.meta).arg("ends_ms"))
        .await;
    assert_eq!(ends_ms, later.timestamp_millis().to_string());
    // Buying still works.
    let buyer = app.user().await;
    let resp = app
        .post(&format!("/api/sales/{sale}/purchase"), Some(&buyer.token))
        .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
}

#[tokio::test]
async fn bad_edits_are_refused_with_nothing_changed() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let buyer = app.user().await;
    let sale = app.create_sale(&admin, 10, 3600, 7200).await;
    let before = row(&app, sale).await;
    let now = Utc::now();
    for (body, status, code) in [
        (json!({"name": ""}), 422, "invalid_text"),
        (json!({"price_cents": -1}), 422, "invalid_price"),
        (json!({"max_per_user": 0}), 422, "invalid_quantity"),
        (
            json!({"payment_window_s": 90_000}),
            422,
            "invalid_payment_window",
        ),
        (
            json!({"image_url": "javascript:alert(1)"}),
            422,
            "invalid_image_url",
        ),
        (
            json!({"ends_at": now + Duration::seconds(60)}),
            422,
            "invalid_window",
        ),
        (
            json!({"starts_at": now + Duration::days(400)}),
            422,
            "invalid_window",
        ),
        (json!({"stock": 5}), 422, "invalid_body"),
        (json!({"name": 5}), 422, "invalid_body"),
    ] {
        let (got, err) = patch(&app, &admin, sale, body.clone()).await;
        assert_eq!(got.as_u16(), status, "{body}: {err}");
        assert_eq!(err["error"], code, "{body}");
    }
    let (got, err) = patch(&app, &buyer, sale, json!({"name": "mine"})).await;
    assert_eq!(
        (got, err["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    let (got, err) = patch(&app, &admin, 999_999, json!({"name": "x"})).await;
    assert_eq!(
        (got, err["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let resp = app
        .client
        .patch(app.url("/api/admin/sales/abc"))
        .bearer_auth(&admin.token)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(row(&app, sale).await, before);
    assert_eq!(
        history(&app, &admin, sale).await.len(),
        1,
        "only the create"
    );
}

#[tokio::test]
async fn archive_hides_a_sale_from_every_public_surface_and_unarchive_brings_it_back() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let buyer = app.user().await;
    let sale = app.live_sale(&admin, 5).await;
    let other = app.live_sale(&admin, 5).await;
    let resp = app
        .post(&format!("/api/sales/{sale}/purchase"), Some(&buyer.token))
        .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let resp = app
        .post(
            &format!("/api/admin/sales/{sale}/archive"),
            Some(&buyer.token),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = app
        .post(
            &format!("/api/admin/sales/{sale}/archive"),
            Some(&admin.token),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.unwrap();
    assert!(body["archived_at"].is_string(), "{body}");

    let public = app.get_json("/api/sales", None).await;
    assert_eq!(ids(&public), vec![other]);
    let home = app.html("/", None).await;
    assert!(
        !home.contains(&format!("/sales/{sale}\"")),
        "home page lists the archived sale"
    );
    assert!(home.contains(&format!("/sales/{other}\"")));
    // By link it is still there, and so are its orders.
    assert_eq!(
        app.get(&format!("/api/sales/{sale}"), None).await.status(),
        StatusCode::OK
    );
    app.html(&format!("/sales/{sale}"), None).await;
    // The admin finds it under "archived", not under "all".
    let all = app.get_json("/api/admin/sales", Some(&admin.token)).await;
    assert_eq!(ids(&all), vec![other]);
    let archived = app
        .get_json("/api/admin/sales?filter=archived", Some(&admin.token))
        .await;
    assert_eq!(ids(&archived), vec![sale]);
    let live = app
        .get_json("/api/admin/sales?filter=live", Some(&admin.token))
        .await;
    assert_eq!(ids(&live), vec![other]);
    let resp = app
        .get("/api/admin/sales?filter=nope", Some(&admin.token))
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);

    let resp = app
        .post(
            &format!("/api/admin/sales/{sale}/unarchive"),
            Some(&admin.token),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let public = app.get_json("/api/sales", None).await;
    let mut listed = ids(&public);
    listed.sort_unstable();
    assert_eq!(listed, vec![sale, other]);
    let path = format!("/api/admin/sales/{sale}/history");
    assert_eq!(
        actions(&app, &admin, path).await,
        ["unarchive", "archive", "create"]
    );
}

#[tokio::test]
async fn delete_removes_a_sale_without_orders_from_both_stores_and_refuses_one_with_orders() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let buyer = app.user().await;
    let empty = app.live_sale(&admin, 5).await;
    let sold = app.live_sale(&admin, 5).await;
    let resp = app
        .post(&format!("/api/sales/{sold}/purchase"), Some(&buyer.token))
        .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);

    // Refused at once, whether or not the order has settled yet.
    let (status, err) = delete(&app, &admin, sold).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::CONFLICT, Some("has_orders"))
    );
    assert!(row(&app, sold).await.is_object());
    let (status, _) = delete(&app, &buyer, empty).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let (status, _) = delete(&app, &admin, empty).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(row(&app, empty).await, Value::Null);
    let k = app.keys.sale(Id::new(empty).unwrap());
    let left: i64 = app
        .redis_query(
            redis::cmd("EXISTS")
                .arg(&k.meta)
                .arg(&k.stock)
                .arg(&k.orders),
        )
        .await;
    assert_eq!(left, 0, "the sale's Redis state is gone");
    assert_eq!(
        app.get(&format!("/api/sales/{empty}"), None).await.status(),
        StatusCode::NOT_FOUND
    );
    let resp = app
        .post(&format!("/api/sales/{empty}/purchase"), Some(&buyer.token))
        .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let (status, _) = delete(&app, &admin, empty).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The record outlives the sale.
    let h = history(&app, &admin, empty).await;
    assert_eq!(h[0]["action"], "delete");
    assert_eq!(h[0]["before"]["id"], empty);

    // Settled now: still refused.
    app.wait_for_orders(sold, 1).await;
    let (status, _) = delete(&app, &admin, sold).await;
    assert_eq!(status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn stock_open_and_close_are_recorded() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app.create_sale(&admin, 10, 3600, 7200).await;
    let resp = app
        .post_json(
            &format!("/api/admin/sales/{sale}/stock"),
            Some(&admin.token),
            &json!({"add": 5}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    app.post(&format!("/api/admin/sales/{sale}/open"), Some(&admin.token))
        .await;
    app.post(
        &format!("/api/admin/sales/{sale}/close"),
        Some(&admin.token),
    )
    .await;
    let path = format!("/api/admin/sales/{sale}/history");
    assert_eq!(
        actions(&app, &admin, path).await,
        ["close", "open", "stock", "create"]
    );
    let h = history(&app, &admin, sale).await;
    assert_eq!(h[2]["after"]["add"], 5);
    assert_eq!(h[0]["after"]["closed"], true);
    assert!(h.iter().all(|e| e["admin_id"] == admin.id));
}

async fn send(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    who: &User,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = app
        .client
        .request(method, app.url(path))
        .bearer_auth(&who.token);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn polls_are_edited_before_opening_archived_and_deleted_alike() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let voter = app.user().await;
    let (upcoming, _) = app
        .create_poll(&admin, "Colour?", &["Red", "Blue"], 3600, 7200)
        .await;
    let (open, open_options) = app
        .create_poll(&admin, "Size?", &["S", "M"], -60, 3600)
        .await;
    let patch = reqwest::Method::PATCH;

    // Before the opening: question, options and window.
    let opens = Utc::now() + Duration::seconds(600);
    let (status, body) = send(
        &app,
        patch.clone(),
        &format!("/api/admin/polls/{upcoming}"),
        &admin,
        Some(json!({"question": "Which colour?", "options": ["Red", "Green", "Blue"], "opens_at": opens})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["question"], "Which colour?");
    let labels: Vec<&str> = body["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["Red", "Green", "Blue"]);
    let option_ids: std::collections::BTreeSet<i64> = body["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_i64().unwrap())
        .collect();
    let k = app.keys.poll(Id::new(upcoming).unwrap());
    let in_redis: std::collections::BTreeSet<i64> = app
        .redis_query(redis::cmd("SMEMBERS").arg(&k.options))
        .await;
    assert_eq!(in_redis, option_ids);
    for (body, code) in [
        (json!({"options": ["Only"]}), "invalid_options"),
        (json!({"options": ["A", "a"]}), "invalid_options"),
        (
            json!({"closes_at": Utc::now() - Duration::seconds(5)}),
            "invalid_window",
        ),
        (json!({"question": ""}), "invalid_text"),
    ] {
        let (status, err) = send(
            &app,
            patch.clone(),
            &format!("/api/admin/polls/{upcoming}"),
            &admin,
            Some(body.clone()),
        )
        .await;
        assert_eq!(
            (status, err["error"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(code)),
            "{body}"
        );
    }
    // Once open: nothing changes, and every edit says so, one that changes
    // nothing or carries a value out of range among them (they were 200 and 422).
    for body in [
        json!({"question": "Fit?"}),
        json!({}),
        json!({"question": "Size?"}),
        json!({"max_choices": 99}),
    ] {
        let (status, err) = send(
            &app,
            patch.clone(),
            &format!("/api/admin/polls/{open}"),
            &admin,
            Some(body.clone()),
        )
        .await;
        assert_eq!(
            (status, err["error"].as_str()),
            (StatusCode::CONFLICT, Some("poll_started")),
            "{body}"
        );
    }
    let (status, _) = send(
        &app,
        patch.clone(),
        &format!("/api/admin/polls/{open}"),
        &voter,
        Some(json!({"question": "Fit?"})),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        app.get_json(&format!("/api/polls/{open}"), None).await["question"],
        "Size?"
    );

    // Archive: off the public list, still there by link and under the filter.
    let (status, body) = send(
        &app,
        reqwest::Method::POST,
        &format!("/api/admin/polls/{open}/archive"),
        &admin,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["archived_at"].is_string());
    assert_eq!(ids(&app.get_json("/api/polls", None).await), vec![upcoming]);
    assert_eq!(
        app.get(&format!("/api/polls/{open}"), None).await.status(),
        StatusCode::OK
    );
    let polls_page = app.html("/polls", None).await;
    assert!(
        !polls_page.contains("Size?"),
        "the polls page lists the archived poll"
    );
    let archived = app
        .get_json("/api/admin/polls?filter=archived", Some(&admin.token))
        .await;
    assert_eq!(ids(&archived), vec![open]);
    let (status, _) = send(
        &app,
        reqwest::Method::POST,
        &format!("/api/admin/polls/{open}/unarchive"),
        &admin,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ids(&app.get_json("/api/polls", None).await).len(), 2);

    // Delete: refused once a vote exists (settled or not), done otherwise.
    assert_eq!(
        app.vote(open, &voter.token, open_options[0]).await.status(),
        StatusCode::ACCEPTED
    );
    let (status, err) = send(
        &app,
        reqwest::Method::DELETE,
        &format!("/api/admin/polls/{open}"),
        &admin,
        None,
    )
    .await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::CONFLICT, Some("has_votes"))
    );
    let (status, _) = send(
        &app,
        reqwest::Method::DELETE,
        &format!("/api/admin/polls/{upcoming}"),
        &admin,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.get(&format!("/api/polls/{upcoming}"), None)
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    let left: i64 = app
        .redis_query(redis::cmd("EXISTS").arg(&k.meta).arg(&k.options))
        .await;
    assert_eq!(left, 0);
    let (rows,): (i64,) = app
        .row(
            "SELECT count(*) FROM poll_options WHERE poll_id = $1",
            upcoming,
        )
        .await;
    assert_eq!(rows, 0);

    let history = |poll: i64| actions(&app, &admin, format!("/api/admin/polls/{poll}/history"));
    assert_eq!(history(upcoming).await, ["delete", "edit", "create"]);
    assert_eq!(history(open).await, ["unarchive", "archive", "create"]);
}

#[tokio::test]
async fn the_admin_pages_offer_the_edit_form_the_filters_and_the_history() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let shopper = app.user().await;
    let upcoming = app.create_sale(&admin, 5, 3600, 7200).await;
    let live = app.live_sale(&admin, 5).await;
    let (status, _) = patch(&app, &admin, live, json!({"name": "Phone <b>X</b>"})).await;
    assert_eq!(status, StatusCode::OK);

    let path = format!("/admin/sales/{upcoming}");
    assert_eq!(
        app.browse(&path, None).await.status(),
        StatusCode::SEE_OTHER
    );
    app.html_status(&path, Some(&shopper), StatusCode::FORBIDDEN)
        .await;
    let page = app.html(&path, Some(&admin)).await;
    assert!(page.contains(r#"data-form="edit-sale""#));
    assert!(!page.contains(
        r#"id="edit-price" name="price" inputmode="decimal" required value="199.00" disabled"#
    ));
    assert!(
        page.contains(r#"data-action="delete""#),
        "nobody bought: delete offered"
    );
    assert!(page.contains(r#"data-action="archive""#));

    // Once open, the fixed fields are disabled, and the history escapes the words.
    let page = app
        .html(&format!("/admin/sales/{live}"), Some(&admin))
        .await;
    assert!(
        page.contains(r#"value="199.00" disabled"#),
        "the price is fixed once open"
    );
    assert!(
        page.contains("Phone &#60;b&#62;X&#60;/b&#62;")
            || page.contains("Phone &lt;b&gt;X&lt;/b&gt;")
    );
    assert!(!page.contains("<b>X</b>"));
    assert!(page.contains("Edited"));
    assert!(page.contains("Created"));

    // The admin list's tabs.
    let resp = app
        .post(
            &format!("/api/admin/sales/{live}/archive"),
            Some(&admin.token),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let page = app.html("/admin", Some(&admin)).await;
    // The sale-day console above the table still lists the archived sale, which
    // sells by link while it runs, marked; the table's "all" tab does not.
    let (console, all) = page.split_at(page.find(r#"id="sales-heading""#).unwrap());
    assert!(console.contains(&format!(r#"href="/admin/sales/{live}""#)));
    assert!(all.contains(r#"aria-current="page" data-filter="all""#));
    assert!(all.contains(&format!(r#"href="/admin/sales/{upcoming}""#)));
    assert!(!all.contains(&format!(r#"href="/admin/sales/{live}""#)));
    let page = app.html("/admin?sales=archived", Some(&admin)).await;
    // The sales table (the sale-day console above it lists the upcoming sale).
    let archived = &page[page.find(r#"id="sales-heading""#).unwrap()..];
    assert!(archived.contains(&format!(r#"href="/admin/sales/{live}""#)));
    assert!(!archived.contains(&format!(r#"href="/admin/sales/{upcoming}""#)));
    assert!(
        archived.contains("filter=archived"),
        "the table refreshes from the archived list"
    );

    // A poll not open yet offers its edit form.
    let (poll, _) = app
        .create_poll(&admin, "Colour?", &["Red", "Blue"], 3600, 7200)
        .await;
    let page = app
        .html(&format!("/admin/polls/{poll}"), Some(&admin))
        .await;
    assert!(page.contains(r#"data-form="edit-poll""#));
    assert!(page.contains("Red\nBlue"));
    assert!(!page.contains("Redis") && !page.contains("Postgres"));
}

#[tokio::test]
async fn the_sale_page_says_what_a_buyer_holds() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let buyer = app.user().await;
    let sale = app
        .live_sale_with(&admin, 10, json!({"max_per_user": 3}))
        .await;
    let page = app.html(&format!("/sales/{sale}"), Some(&buyer)).await;
    assert!(
        page.contains(r#"data-field="held-note" hidden></p>"#),
        "nothing held yet"
    );
    let resp = app
        .post_json(
            &format!("/api/sales/{sale}/purchase"),
            Some(&buyer.token),
            &json!({"quantity": 2}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let page = app.html(&format!("/sales/{sale}"), Some(&buyer)).await;
    assert!(page.contains(r#"data-held="2""#));
    assert!(page.contains("You have 2 from this sale."), "{page}");
}
