use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_error, spawn_app, spawn_with_live_sale};

/// A POST as a browser session sends it: the cookie, and the CSRF header if given.
async fn post_with_cookie(
    app: &TestApp,
    url: &str,
    cookie: &str,
    csrf: Option<&str>,
) -> reqwest::Response {
    let mut req = app.client.post(url).header("cookie", cookie);
    if let Some(token) = csrf {
        req = req.header("x-csrf-token", token);
    }
    req.send().await.unwrap()
}

/// The CSRF token of the session `token` names, as the server derives it.
fn csrf_of(app: &TestApp, token: &str) -> String {
    let claims = app
        .tokens
        .verify(token, chrono::Utc::now().timestamp())
        .unwrap();
    app.tokens.csrf_of(&claims)
}

#[tokio::test(flavor = "multi_thread")]
async fn signup_signin_and_bearer_token_work() {
    let app = spawn_app().await;
    let creds = json!({"username": "Carol_1", "password": "correct horse battery"});
    let resp = app.post_json("/api/auth/signup", None, &creds).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let user: Value = resp.json().await.unwrap();
    assert_eq!(user["username"], "carol_1");
    assert_eq!(user["is_admin"], false);

    let resp = app.post_json("/api/auth/signup", None, &creds).await;
    assert_error(resp, StatusCode::CONFLICT, "username_taken").await;

    let resp = app.post_json("/api/auth/signin", None, &creds).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let cookies: Vec<String> = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let session = cookies
        .iter()
        .find(|c| c.starts_with("stampede_session="))
        .unwrap();
    assert!(session.contains("HttpOnly"));
    assert!(session.contains("SameSite=Lax"));
    assert!(cookies.iter().any(|c| c.starts_with("stampede_csrf=")));
    let body: Value = resp.json().await.unwrap();
    let token = body["token"].as_str().unwrap();

    let me: Value = app.get_json("/api/me", Some(token)).await;
    assert_eq!(me["username"], "carol_1");

    let wrong = json!({"username": "carol_1", "password": "wrong password!"});
    let resp = app.post_json("/api/auth/signin", None, &wrong).await;
    assert_error(resp, StatusCode::UNAUTHORIZED, "bad_credentials").await;
    let nobody = json!({"username": "nobody", "password": "wrong password!"});
    let resp = app.post_json("/api/auth/signin", None, &nobody).await;
    assert_error(resp, StatusCode::UNAUTHORIZED, "bad_credentials").await;
}

/// An account made without a password (a load test's shopper, as `stampede load`
/// makes them) signs in with nothing: 401 like a wrong password, never a 500
/// that names it.
#[tokio::test(flavor = "multi_thread")]
async fn an_account_without_a_password_answers_like_a_wrong_one() {
    let app = spawn_app().await;
    sqlx::query("INSERT INTO users (username, password_hash) VALUES ($1, $2)")
        .bind("load0123456789-0")
        .bind("no password: made by stampede load")
        .execute(&app.db)
        .await
        .unwrap();
    let guess = json!({"username": "load0123456789-0", "password": "a guess, any guess"});
    let resp = app.post_json("/api/auth/signin", None, &guess).await;
    assert_error(resp, StatusCode::UNAUTHORIZED, "bad_credentials").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cookie_sessions_need_the_csrf_header_for_changes() {
    let (app, _, sale) = spawn_with_live_sale(5).await;
    let user = app.user().await;
    let path = app.url(&format!("/api/sales/{sale}/purchase"));
    let cookie = format!("stampede_session={}; stampede_csrf=abc123", user.token);

    // Cookie without the header: refused, nothing bought.
    let resp = post_with_cookie(&app, &path, &cookie, None).await;
    assert_error(resp, StatusCode::FORBIDDEN, "csrf_failed").await;
    let resp = post_with_cookie(&app, &path, &cookie, Some("wrong")).await;
    assert_error(resp, StatusCode::FORBIDDEN, "csrf_failed").await;
    assert_eq!(app.stock_left(sale).await, 5);

    // The cookie's value echoed: someone who could set that cookie (a sibling
    // subdomain, plain HTTP) would pass a check of cookie against header. The
    // token is the session's own.
    let resp = post_with_cookie(&app, &path, &cookie, Some("abc123")).await;
    // The refusal sets the session's own token in the cookie (a page opened before
    // the token was bound to the session sends the request again with it).
    let set: Vec<String> = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|c| c.to_str().unwrap().to_string())
        .collect();
    let want = csrf_of(&app, &user.token);
    assert!(
        set.iter()
            .any(|c| c.starts_with(&format!("stampede_csrf={want};"))),
        "{set:?}"
    );
    assert_error(resp, StatusCode::FORBIDDEN, "csrf_failed").await;
    let other = app.user().await;
    let resp = post_with_cookie(&app, &path, &cookie, Some(&csrf_of(&app, &other.token))).await;
    assert_error(resp, StatusCode::FORBIDDEN, "csrf_failed").await;
    assert_eq!(app.stock_left(sale).await, 5);
    let resp = post_with_cookie(&app, &path, &cookie, Some(&csrf_of(&app, &user.token))).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    // Reads by cookie need no header.
    let resp = app
        .client
        .get(app.url("/api/me/orders"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_routes_need_an_admin() {
    let app = spawn_app().await;
    let user = app.user().await;
    let resp = app.get("/api/admin/sales", None).await;
    assert_error(resp, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let resp = app.get("/api/admin/sales", Some(&user.token)).await;
    assert_error(resp, StatusCode::FORBIDDEN, "forbidden").await;
    let resp = app
        .post_json("/api/admin/sales", Some(&user.token), &json!({"name": "x"}))
        .await;
    assert_error(resp, StatusCode::FORBIDDEN, "forbidden").await;
    let count = app.count("SELECT count(*) FROM sales").await;
    assert_eq!(count, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn signout_of_a_browser_session_needs_the_csrf_header() {
    let app = spawn_app().await;
    let user = app.user().await;
    let cookie = format!("stampede_session={}; stampede_csrf=tok123", user.token);
    let url = app.url("/api/auth/signout");
    let resp = post_with_cookie(&app, &url, &cookie, None).await;
    assert_error(resp, StatusCode::FORBIDDEN, "csrf_failed").await;
    let resp = post_with_cookie(&app, &url, &cookie, Some("tok123")).await;
    assert_error(resp, StatusCode::FORBIDDEN, "csrf_failed").await;
    assert_eq!(
        app.get("/api/me", Some(&user.token)).await.status(),
        StatusCode::OK
    );
    let resp = post_with_cookie(&app, &url, &cookie, Some(&csrf_of(&app, &user.token))).await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let cleared = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .any(|c| c.to_str().unwrap().starts_with("stampede_session=;"));
    assert!(cleared, "the session cookie is removed");
}

/// The admin named in the configuration is made only when no account has the
/// name: a shopper who signed up under it stays a shopper when a server starts
/// with it (their own password would otherwise hold the admin's rights); the
/// name free, the admin is made with the configured password.
#[tokio::test(flavor = "multi_thread")]
async fn the_configured_admin_never_promotes_a_shoppers_account() {
    let app = spawn_app().await;
    let creds = json!({"username": "shopkeeper", "password": "a shopper's own pass"});
    let resp = app.post_json("/api/auth/signup", None, &creds).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let db = app.db.clone();
    let is_admin = |name: &'static str| {
        let db = db.clone();
        async move {
            sqlx::query_scalar::<_, bool>("SELECT is_admin FROM users WHERE username = $1")
                .bind(name)
                .fetch_optional(&db)
                .await
                .unwrap()
        }
    };
    let _sibling = crate::helpers::spawn_sibling(&app, |c| {
        c.admin_username = Some("shopkeeper".into());
        c.admin_password = Some("the operator's pass".into());
    })
    .await;
    assert_eq!(is_admin("shopkeeper").await, Some(false));
    let _other = crate::helpers::spawn_sibling(&app, |c| {
        c.admin_username = Some("night_admin".into());
        c.admin_password = Some("the operator's pass".into());
    })
    .await;
    assert_eq!(is_admin("night_admin").await, Some(true));
}

/// Sign-in sets the session's own CSRF token in the cookie (and the answer); a page
/// answered to a cookie session whose CSRF cookie is anything else (signed in
/// before the token was bound to the session) sets it right, and one that has it
/// right sets nothing.
#[tokio::test(flavor = "multi_thread")]
async fn the_csrf_cookie_is_the_sessions_token_and_pages_set_it_right() {
    let app = spawn_app().await;
    let creds = json!({"username": "csrfuser", "password": "correct horse battery"});
    let resp = app.post_json("/api/auth/signup", None, &creds).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let resp = app.post_json("/api/auth/signin", None, &creds).await;
    // The answer holds the token: no cache keeps it, and no browser sniffs it.
    assert_eq!(resp.headers()["cache-control"], "no-store");
    assert_eq!(resp.headers()["x-content-type-options"], "nosniff");
    let cookies: Vec<String> = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|c| c.to_str().unwrap().to_string())
        .collect();
    let body: Value = resp.json().await.unwrap();
    let token = body["token"].as_str().unwrap();
    let want = csrf_of(&app, token);
    assert_eq!(body["csrf_token"], want.as_str());
    assert!(
        cookies
            .iter()
            .any(|c| c.starts_with(&format!("stampede_csrf={want};"))),
        "{cookies:?}"
    );
    let page = |csrf: &'static str| {
        app.client
            .get(app.url("/"))
            .header(
                "cookie",
                format!("stampede_session={token}; stampede_csrf={csrf}"),
            )
            .send()
    };
    let resp = page("legacy0123456789").await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let set: Vec<&str> = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|c| c.to_str().unwrap())
        .collect();
    assert!(
        set.iter()
            .any(|c| c.starts_with(&format!("stampede_csrf={want};"))
                && c.contains("SameSite=Strict")),
        "{set:?}"
    );
    let right: &'static str = Box::leak(want.into_boxed_str());
    let resp = page(right).await.unwrap();
    assert!(
        resp.headers().get_all("set-cookie").iter().next().is_none(),
        "a right cookie is set again"
    );
}
