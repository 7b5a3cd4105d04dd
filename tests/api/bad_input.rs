//! Bad input gets a clear 4xx with a JSON body and changes nothing.

use reqwest::StatusCode;
use serde_json::{Value, json};
use stampede::auth::token::{Claims, TokenKey};
use stampede::domain::Id;

use crate::helpers::{assert_error, patched, spawn_app, spawn_with_live_sale};

#[tokio::test(flavor = "multi_thread")]
async fn malformed_sale_bodies_are_refused_without_writes() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let url = app.url("/api/admin/sales");
    let now = chrono::Utc::now();
    let good = json!({
        "name": "Phone", "price_cents": 100, "stock": 10,
        "starts_at": now, "ends_at": now + chrono::Duration::hours(1),
    });

    // Not JSON at all.
    let resp = app
        .client
        .post(&url)
        .bearer_auth(&admin.token)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_error(resp, StatusCode::BAD_REQUEST, "invalid_json").await;
    // Wrong content type.
    let resp = app
        .client
        .post(&url)
        .bearer_auth(&admin.token)
        .header("content-type", "text/plain")
        .body(good.to_string())
        .send()
        .await
        .unwrap();
    assert_error(
        resp,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    )
    .await;
    // Oversized body.
    let huge = json!({"name": "x".repeat(100_000)});
    let resp = app
        .post_json("/api/admin/sales", Some(&admin.token), &huge)
        .await;
    assert_error(resp, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;

    let cases = [
        (
            json!({"stock": "ten"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({"stock": -1}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_stock",
        ),
        (
            json!({"stock": 1_000_000_000_000i64}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_stock",
        ),
        (
            json!({"stock": 1.5}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({"price_cents": -100}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_price",
        ),
        (
            json!({"name": "   "}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_text",
        ),
        (
            json!({"ends_at": now - chrono::Duration::hours(1)}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_window",
        ),
        (
            json!({"starts_at": "yesterday"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({"surprise": true}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({"image_url": "javascript:alert(1)"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_image_url",
        ),
        (
            json!({"image_url": "//evil.example/x.png"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_image_url",
        ),
        (
            json!({"image_url": "/x.png\" onerror=\"alert(1)"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_image_url",
        ),
    ];
    for (patch, status, code) in cases {
        let resp = app
            .post_json(
                "/api/admin/sales",
                Some(&admin.token),
                &patched(&good, &patch),
            )
            .await;
        assert_error(resp, status, code).await;
    }
    let mut missing = good.clone();
    missing.as_object_mut().unwrap().remove("stock");
    let resp = app
        .post_json("/api/admin/sales", Some(&admin.token), &missing)
        .await;
    assert_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body").await;

    assert_eq!(
        app.count("SELECT count(*) FROM sales").await,
        0,
        "nothing was written"
    );
    // The good body itself works, with or without a picture.
    let resp = app
        .post_json("/api/admin/sales", Some(&admin.token), &good)
        .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["image_url"],
        Value::Null
    );
    let mut pictured = good.clone();
    pictured["image_url"] = json!("https://cdn.example.com/phone.jpg");
    let resp = app
        .post_json("/api/admin/sales", Some(&admin.token), &pictured)
        .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let id = resp.json::<Value>().await.unwrap()["id"].as_i64().unwrap();
    let shown: Value = app.get_json(&format!("/api/sales/{id}"), None).await;
    assert_eq!(shown["image_url"], "https://cdn.example.com/phone.jpg");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_ids_and_unknown_sales() {
    let app = spawn_app().await;
    let user = app.user().await;
    for bad in [
        "abc",
        "-1",
        "0",
        "1.5",
        "99999999999999999999999",
        "%7B1%7D",
        "1%20",
    ] {
        let resp = app.purchase_raw(bad, &user.token).await;
        assert_error(resp, StatusCode::BAD_REQUEST, "invalid_id").await;
        let resp = app.get(&format!("/api/sales/{bad}"), None).await;
        assert_error(resp, StatusCode::BAD_REQUEST, "invalid_id").await;
    }
    assert_error(
        app.purchase(424242, &user.token).await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    app.assert_get_error(
        "/api/sales/424242",
        None,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    app.assert_get_error(
        "/api/orders/not-a-uuid",
        Some(&user.token),
        StatusCode::BAD_REQUEST,
        "invalid_id",
    )
    .await;
    assert_error(
        app.get(
            &format!("/api/orders/{}", uuid::Uuid::new_v4()),
            Some(&user.token),
        )
        .await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    app.assert_get_error(
        "/api/nothing-here",
        None,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    // A path no route has answers as the API's routes do: never sniffed.
    for path in ["/api/nothing-here", "/nothing-here"] {
        let resp = app.get(path, None).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{path}");
        assert_eq!(
            resp.headers()["x-content-type-options"],
            "nosniff",
            "{path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_expired_and_forged_tokens_are_401() {
    let (app, _, sale) = spawn_with_live_sale(5).await;
    let user = app.user().await;

    let resp = app.post(&format!("/api/sales/{sale}/purchase"), None).await;
    assert_error(resp, StatusCode::UNAUTHORIZED, "unauthorized").await;

    let expired = app.tokens.issue(Claims {
        user_id: Id::new(user.id).unwrap(),
        admin: false,
        expires_at: chrono::Utc::now().timestamp() - 1,
        generation: 0,
        session: 1,
        account_created: None,
    });
    assert_error(
        app.purchase(sale, &expired).await,
        StatusCode::UNAUTHORIZED,
        "token_expired",
    )
    .await;

    let forged = TokenKey::new(b"not-the-server-secret-not-the-server").issue(Claims {
        user_id: Id::new(user.id).unwrap(),
        admin: true,
        expires_at: chrono::Utc::now().timestamp() + 3600,
        generation: 0,
        session: 1,
        account_created: None,
    });
    assert_error(
        app.purchase(sale, &forged).await,
        StatusCode::UNAUTHORIZED,
        "invalid_token",
    )
    .await;
    assert_error(
        app.purchase(sale, "garbage").await,
        StatusCode::UNAUTHORIZED,
        "invalid_token",
    )
    .await;
    let resp = app
        .client
        .post(app.url(&format!("/api/sales/{sale}/purchase")))
        .header("authorization", "Basic abc")
        .send()
        .await
        .unwrap();
    assert_error(resp, StatusCode::UNAUTHORIZED, "unauthorized").await;

    assert_eq!(app.stock_left(sale).await, 5, "no stock moved");
    assert!(app.buyers(sale).await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_stock_changes_and_credentials() {
    let (app, admin, sale) = spawn_with_live_sale(5).await;
    for body in [
        json!({}),
        json!({"set": 1, "add": 1}),
        json!({"add": -3}),
        json!({"set": "many"}),
        json!({"set": 1e30}),
    ] {
        let resp = app.change_stock(&admin, sale, &body).await;
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    }
    assert_eq!(app.stock_left(sale).await, 5);

    for body in [
        json!({"username": "ab", "password": "long enough pw"}),
        json!({"username": "has space", "password": "long enough pw"}),
        json!({"username": "x{1}y", "password": "long enough pw"}),
        json!({"username": "okname", "password": "short"}),
    ] {
        let resp = app.post_json("/api/auth/signup", None, &body).await;
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    }
    let users = app.count("SELECT count(*) FROM users").await;
    assert_eq!(users, 1, "only the admin exists");
}

/// Postgres cannot store a NUL in text: every text field refuses it with a 422 that
/// names the field, before anything is written.
#[tokio::test(flavor = "multi_thread")]
async fn nul_in_any_text_field_is_a_422_naming_the_field_and_writes_nothing() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let now = chrono::Utc::now();
    let sale = |name: &str, description: &str| {
        json!({
            "name": name, "description": description, "price_cents": 100, "stock": 10,
            "starts_at": now, "ends_at": now + chrono::Duration::hours(1),
        })
    };
    let poll = |question: &str, options: [&str; 2]| {
        json!({
            "question": question, "options": options,
            "opens_at": now, "closes_at": now + chrono::Duration::hours(1),
        })
    };
    let cases = [
        ("/api/admin/sales", sale("Ph\u{0}one", ""), "name"),
        (
            "/api/admin/sales",
            sale("Phone", "nice\u{0}"),
            "description",
        ),
        ("/api/admin/sales", sale("\u{0}", "\u{0}"), "name"),
        (
            "/api/admin/polls",
            poll("Which\u{0}?", ["a", "b"]),
            "question",
        ),
        (
            "/api/admin/polls",
            poll("Which?", ["a", "\u{0}b"]),
            "option",
        ),
    ];
    for (path, body, field) in cases {
        let resp = app.post_json(path, Some(&admin.token), &body).await;
        let err = assert_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid_text").await;
        let message = err["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{path} {body}: {message}");
    }
    // Sign-up: the username refuses anything but [A-Za-z0-9_.-]; the password a NUL.
    let cases = [
        (
            "nul\u{0}user",
            "long enough",
            "invalid_username",
            "username",
        ),
        ("nuluser", "long\u{0}enough", "invalid_text", "password"),
    ];
    for (username, password, code, field) in cases {
        let body = json!({"username": username, "password": password});
        let resp = app.post_json("/api/auth/signup", None, &body).await;
        let err = assert_error(resp, StatusCode::UNPROCESSABLE_ENTITY, code).await;
        let message = err["message"].as_str().unwrap();
        assert!(message.starts_with(field), "sign-up {body}: {message}");
    }
    // Sign-in with a NUL is just wrong credentials.
    let body = json!({"username": "nul\u{0}user", "password": "long\u{0}enough"});
    let resp = app.post_json("/api/auth/signin", None, &body).await;
    assert_error(resp, StatusCode::UNAUTHORIZED, "bad_credentials").await;

    assert_eq!(app.count("SELECT count(*) FROM sales").await, 0);
    let polls = app.count("SELECT count(*) FROM polls").await;
    assert_eq!(polls, 0);
    let users = app
        .count("SELECT count(*) FROM users WHERE username LIKE 'nul%'")
        .await;
    assert_eq!(users, 0);
}

/// The vote reads its body itself (not through `web::Json`): the same answers as
/// the JSON extractor, the caller checked first, a gzip body taken, and nothing
/// counted for a refused body.
#[tokio::test(flavor = "multi_thread")]
async fn malformed_vote_bodies_are_refused_like_every_json_body_and_count_nothing() {
    use std::io::Write;
    let (app, _admin, (poll, options)) =
        crate::helpers::spawn_with_open_poll("Colour?", &["red", "blue"]).await;
    let voter = app.user().await;
    let url = app.url(&format!("/api/polls/{poll}/votes"));
    let good = json!({"option_id": options[0]}).to_string();
    let send = |content_type: Option<&'static str>, body: Vec<u8>, token: Option<&str>| {
        let mut req = app.client.post(&url).body(body);
        if let Some(t) = content_type {
            req = req.header("content-type", t);
        }
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        req.send()
    };
    let token = Some(voter.token.as_str());
    // Signed out: 401 whatever the body.
    let resp = send(Some("text/plain"), b"{".to_vec(), None).await.unwrap();
    assert_error(resp, StatusCode::UNAUTHORIZED, "unauthorized").await;
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let resp = send(content_type, good.clone().into_bytes(), token)
            .await
            .unwrap();
        assert_error(
            resp,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        )
        .await;
    }
    let json_type = Some("application/json");
    let resp = send(json_type, b"{\"option_id\":".to_vec(), token)
        .await
        .unwrap();
    assert_error(resp, StatusCode::BAD_REQUEST, "invalid_json").await;
    let resp = send(json_type, br#"{"option_id":"red"}"#.to_vec(), token)
        .await
        .unwrap();
    assert_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body").await;
    let resp = send(json_type, br#"{"option_id":1,"extra":2}"#.to_vec(), token)
        .await
        .unwrap();
    assert_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body").await;
    let huge = format!(
        r#"{{"option_id":{},"pad":"{}"}}"#,
        options[0],
        "x".repeat(40_000)
    );
    let resp = send(json_type, huge.into_bytes(), token).await.unwrap();
    assert_error(resp, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
    // Nothing was counted.
    let mine: Value = app
        .client
        .get(app.url(&format!("/api/polls/{poll}/my-ballot")))
        .bearer_auth(&voter.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(mine["voted"], json!(false), "{mine}");

    // A `+json` type and a gzip-compressed body are JSON, as for every other body.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(good.as_bytes()).unwrap();
    let resp = app
        .client
        .post(&url)
        .bearer_auth(&voter.token)
        .header("content-type", "application/vnd.stampede+json")
        .header("content-encoding", "gzip")
        .body(gz.finish().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        StatusCode::ACCEPTED,
        "{:?}",
        resp.text().await
    );
    let again = send(json_type, good.into_bytes(), token).await.unwrap();
    assert_error(again, StatusCode::CONFLICT, "already_voted").await;
}

/// The purchase reads its optional body itself: a body with something in it must
/// say it is JSON (415 otherwise, nothing bought), as every other body route's; an
/// empty one needs no type.
#[tokio::test(flavor = "multi_thread")]
async fn a_purchase_body_that_is_not_json_is_refused_415_and_buys_nothing() {
    let (app, _admin, sale) = crate::helpers::spawn_with_live_sale(5).await;
    let buyer = app.user().await;
    let url = app.url(&format!("/api/sales/{sale}/purchase"));
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let mut req = app.client.post(&url).bearer_auth(&buyer.token).body("{}");
        if let Some(t) = content_type {
            req = req.header("content-type", t);
        }
        let resp = req.send().await.unwrap();
        assert_error(
            resp,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        )
        .await;
    }
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE sale_id = $1")
        .bind(sale)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(orders, 0, "a refused body bought nothing");
    // No body, whatever its type: one unit.
    let resp = app
        .client
        .post(&url)
        .bearer_auth(&buyer.token)
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
}

/// serde's derived structs also read a JSON array of their fields in order: no
/// route documents that, so every body must be an object (422 `invalid_body`),
/// and an array writes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_body_that_is_an_array_of_the_fields_is_422_and_writes_nothing() {
    let (app, admin, (poll, options)) =
        crate::helpers::spawn_with_open_poll("Colour?", &["red", "blue"]).await;
    let sale = app.live_sale(&admin, 5).await;
    let voter = app.user().await;
    let now = chrono::Utc::now();
    let opens = (now + chrono::Duration::hours(1)).to_rfc3339();
    let closes = (now + chrono::Duration::hours(2)).to_rfc3339();
    let polls_before = app.count("SELECT count(*) FROM polls").await;
    let sales_before = app.count("SELECT count(*) FROM sales").await;
    let cases: Vec<(String, Option<&str>, Value)> = vec![
        (
            format!("/api/polls/{poll}/votes"),
            Some(voter.token.as_str()),
            json!([options[0], null, null, null]),
        ),
        (
            "/api/admin/polls".into(),
            Some(admin.token.as_str()),
            json!(["Q?", ["A", "B"], opens, closes]),
        ),
        (
            "/api/admin/sales".into(),
            Some(admin.token.as_str()),
            json!(["Phone", 100, 5, opens, closes]),
        ),
        (
            "/api/auth/signup".into(),
            None,
            json!(["arrayuser", "correct horse battery"]),
        ),
        (
            format!("/api/sales/{sale}/purchase"),
            Some(voter.token.as_str()),
            json!([null, 1]),
        ),
    ];
    for (path, token, body) in cases {
        let resp = app.post_json(&path, token, &body).await;
        let status = resp.status();
        let got: Value = resp.json().await.unwrap();
        assert_eq!(
            (status, got["error"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_body")),
            "{path} with {body}: {got}"
        );
        assert!(
            got["message"].as_str().unwrap().contains("a JSON object"),
            "{path}: {got}"
        );
    }
    assert_eq!(app.count("SELECT count(*) FROM polls").await, polls_before);
    assert_eq!(app.count("SELECT count(*) FROM sales").await, sales_before);
    assert_eq!(
        app.count("SELECT count(*) FROM users WHERE username = 'arrayuser'")
            .await,
        0
    );
    assert_eq!(app.stock_left(sale).await, 5);
    let voters = app.get(&format!("/api/polls/{poll}"), None).await;
    let view: Value = voters.json().await.unwrap();
    assert_eq!(view["results"]["voters"], 0, "{view}");
}
