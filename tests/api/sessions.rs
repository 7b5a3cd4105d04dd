//! Sessions end: sign-out ends this session on every instance, sign-out-all and a
//! password change end every session of the account, and the check survives Redis
//! losing the stream of ended sessions (reloaded from Postgres); `stampede
//! revoke-admin` takes an admin's flag and ends its tokens on every instance.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_error, spawn_app_with, spawn_sibling};

const PASSWORD: &str = "correct horse battery";

async fn signup(app: &TestApp, username: &str) {
    let resp = app
        .post_json(
            "/api/auth/signup",
            None,
            &json!({"username": username, "password": PASSWORD}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
}

async fn signin(app: &TestApp, username: &str, password: &str) -> String {
    let resp = app
        .post_json(
            "/api/auth/signin",
            None,
            &json!({"username": username, "password": password}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK, "sign-in of {username}");
    let body: Value = resp.json().await.unwrap();
    body["token"].as_str().unwrap().to_string()
}

async fn me(app: &TestApp, token: &str) -> StatusCode {
    app.get("/api/me", Some(token)).await.status()
}

async fn assert_ended(app: &TestApp, token: &str) {
    let resp = app.get("/api/me", Some(token)).await;
    assert_error(resp, StatusCode::UNAUTHORIZED, "session_ended").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn signout_ends_this_session_on_every_instance_and_no_other() {
    let app = spawn_app_with(|c| c.session_sync = Duration::from_secs(1)).await;
    let sibling = spawn_sibling(&app, |_| {}).await;
    signup(&app, "sessiona").await;
    let first = signin(&app, "sessiona", PASSWORD).await;
    let second = signin(&app, "sessiona", PASSWORD).await;
    // The sibling has seen (and cached) the first session as valid.
    assert_eq!(me(&sibling, &first).await, StatusCode::OK);

    let resp = app.post("/api/auth/signout", Some(&first)).await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    // This instance knows at once.
    assert_ended(&app, &first).await;
    // The other instance within its sync interval (1 s), plus scheduling slack.
    let started = Instant::now();
    while me(&sibling, &first).await == StatusCode::OK {
        assert!(
            started.elapsed() < Duration::from_millis(2500),
            "the sibling still accepts a signed-out token"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_ended(&sibling, &first).await;
    // Buying with it is refused too, and takes no stock.
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 5).await;
    assert_error(
        app.purchase(sale, &first).await,
        StatusCode::UNAUTHORIZED,
        "session_ended",
    )
    .await;
    assert_eq!(app.stock_left(sale).await, 5);
    // The other session of the same account goes on.
    assert_eq!(me(&app, &second).await, StatusCode::OK);
    assert_eq!(me(&sibling, &second).await, StatusCode::OK);
    app.buy(sale, &second).await;
    assert_eq!(app.stock_left(sale).await, 4);
    // Signing out twice, or with garbage, is the same quiet 204.
    assert_eq!(
        app.post("/api/auth/signout", Some(&first)).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        app.post("/api/auth/signout", Some("garbage"))
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    let rows = app.count("SELECT count(*) FROM signed_out_sessions").await;
    assert_eq!(rows, 1);
    // The second sign-out announced nothing: one entry in the stream every
    // server follows, not one per replay.
    let announced: u64 = redis::cmd("XLEN")
        .arg(app.keys.sessions_ended())
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();
    assert_eq!(
        announced, 1,
        "a sign-out of an ended session is announced once"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn signout_all_and_password_change_end_every_session() {
    let app = spawn_app_with(|_| {}).await;
    signup(&app, "sessionb").await;
    let a = signin(&app, "sessionb", PASSWORD).await;
    let b = signin(&app, "sessionb", PASSWORD).await;
    let resp = app.post("/api/auth/signout-all", Some(&a)).await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert_ended(&app, &a).await;
    assert_ended(&app, &b).await;
    // Signing in again works, and the new session stands.
    let c = signin(&app, "sessionb", PASSWORD).await;
    let d = signin(&app, "sessionb", PASSWORD).await;
    assert_eq!(me(&app, &c).await, StatusCode::OK);

    // A wrong current password changes nothing.
    let change =
        |current: &str, new: &str| json!({"current_password": current, "new_password": new});
    let resp = app
        .post_json(
            "/api/me/password",
            Some(&c),
            &change("wrong password", "new password 1"),
        )
        .await;
    assert_error(resp, StatusCode::FORBIDDEN, "wrong_password").await;
    let resp = app
        .post_json("/api/me/password", Some(&c), &change(PASSWORD, "short"))
        .await;
    assert_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid_password").await;
    assert_eq!(me(&app, &c).await, StatusCode::OK);
    assert_eq!(me(&app, &d).await, StatusCode::OK);

    let resp = app
        .post_json(
            "/api/me/password",
            Some(&c),
            &change(PASSWORD, "new password 1"),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert_ended(&app, &c).await;
    assert_ended(&app, &d).await;
    let resp = app
        .post_json(
            "/api/auth/signin",
            None,
            &json!({"username": "sessionb", "password": PASSWORD}),
        )
        .await;
    assert_error(resp, StatusCode::UNAUTHORIZED, "bad_credentials").await;
    let e = signin(&app, "sessionb", "new password 1").await;
    assert_eq!(me(&app, &e).await, StatusCode::OK);
    let generation: i64 =
        sqlx::query_scalar("SELECT session_gen FROM users WHERE username = 'sessionb'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(generation, 2);
}

/// Redis losing the stream of ended sessions (a wipe) must not bring a signed-out
/// or ended session back: an instance started afterwards loads them from Postgres,
/// and one that was running notices the stream lost what it had read and reloads.
#[tokio::test(flavor = "multi_thread")]
async fn ended_sessions_stay_ended_when_redis_loses_the_stream() {
    let app = spawn_app_with(|c| c.session_sync = Duration::from_millis(100)).await;
    let running = spawn_sibling(&app, |_| {}).await;
    signup(&app, "sessionc").await;
    let old = signin(&app, "sessionc", PASSWORD).await;
    assert_eq!(
        app.post("/api/auth/signout-all", Some(&old)).await.status(),
        StatusCode::NO_CONTENT
    );
    let out = signin(&app, "sessionc", PASSWORD).await;
    let kept = signin(&app, "sessionc", PASSWORD).await;
    let later = signin(&app, "sessionc", PASSWORD).await;
    assert_eq!(
        app.post("/api/auth/signout", Some(&out)).await.status(),
        StatusCode::NO_CONTENT
    );
    // The running sibling has read both announcements.
    let started = Instant::now();
    while me(&running, &out).await == StatusCode::OK {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "sibling never caught up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let removed: i64 = app
        .redis_query(redis::cmd("DEL").arg(app.keys.sessions_ended()))
        .await;
    assert_eq!(removed, 1, "the stream existed");

    // Started after the wipe: everything from Postgres.
    let fresh = spawn_sibling(&app, |_| {}).await;
    for instance in [&app, &running, &fresh] {
        assert_ended(instance, &old).await;
        assert_ended(instance, &out).await;
        assert_eq!(me(instance, &kept).await, StatusCode::OK);
        assert_eq!(me(instance, &later).await, StatusCode::OK);
    }
    // Ended after the wipe: the running sibling found the stream gone (no longer
    // holding what it read last), reloaded from Postgres, and follows the new one.
    assert_eq!(
        app.post("/api/auth/signout", Some(&later)).await.status(),
        StatusCode::NO_CONTENT
    );
    let started = Instant::now();
    for (name, instance) in [("running", &running), ("fresh", &fresh)] {
        while me(instance, &later).await == StatusCode::OK {
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "the {name} sibling still accepts a session ended after the wipe"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for instance in [&app, &running, &fresh] {
        assert_ended(instance, &old).await;
        assert_ended(instance, &out).await;
        assert_ended(instance, &later).await;
        assert_eq!(me(instance, &kept).await, StatusCode::OK);
    }
}

/// `stampede <args>` on `app`'s database and Redis (off the test's runtime thread,
/// which the server's Redis connection runs on).
async fn stampede(app: &TestApp, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stampede"));
    cmd.args(args)
        .env_remove("STAMPEDE_CONFIG")
        .env("DATABASE_URL", &app.config.database_url)
        .env("REDIS_URL", &app.config.redis_url)
        .env("STAMPEDE_REDIS_NAMESPACE", &app.config.redis_namespace)
        .env("STAMPEDE_REDIS_CLUSTER", app.config.redis_cluster.join(","))
        .env("RUST_LOG", "warn");
    tokio::task::spawn_blocking(move || cmd.output().expect("run stampede"))
        .await
        .unwrap()
}

/// Waits (at most 2.5 s: the announcement is read at once, or within the sync
/// interval of 1 s) until `token` is refused on `app` as a session that ended.
async fn wait_ended(app: &TestApp, token: &str, what: &str) {
    let started = Instant::now();
    while me(app, token).await == StatusCode::OK {
        assert!(
            started.elapsed() < Duration::from_millis(2500),
            "{what} still accepts the revoked admin's token"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_ended(app, token).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn revoke_admin_ends_the_admins_tokens_everywhere_and_a_new_sign_in_is_a_shoppers() {
    let app = spawn_app_with(|c| c.session_sync = Duration::from_secs(1)).await;
    let sibling = spawn_sibling(&app, |_| {}).await;
    signup(&app, "revokee").await;
    signup(&app, "bystander").await;
    let out = stampede(&app, &["create-admin", "--username", "revokee"]).await;
    assert!(out.status.success(), "create-admin: {out:?}");
    let admin = signin(&app, "revokee", PASSWORD).await;
    let other = signin(&app, "bystander", PASSWORD).await;
    for server in [&app, &sibling] {
        let resp = server.get("/api/admin/console", Some(&admin)).await;
        assert_eq!(resp.status(), StatusCode::OK, "the admin before the revoke");
    }

    let out = stampede(&app, &["revoke-admin", "--username", "revokee"]).await;
    assert!(out.status.success(), "revoke-admin: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("revokee is no longer an admin"),
        "{out:?}"
    );
    // Neither server made the change: both learn it from the announcement.
    wait_ended(&app, &admin, "the first server").await;
    wait_ended(&sibling, &admin, "the second server").await;
    let flag = app
        .count("SELECT count(*) FROM users WHERE username = 'revokee' AND is_admin")
        .await;
    assert_eq!(flag, 0, "the account is still an admin in Postgres");
    // Signed in again: a shopper.
    let again = signin(&app, "revokee", PASSWORD).await;
    assert_eq!(me(&app, &again).await, StatusCode::OK);
    let resp = app.get("/api/admin/console", Some(&again)).await;
    assert_error(resp, StatusCode::FORBIDDEN, "forbidden").await;
    // Nobody else's session ended.
    assert_eq!(me(&app, &other).await, StatusCode::OK);
    assert_eq!(me(&sibling, &other).await, StatusCode::OK);

    // Not an admin (any more): exit 1, nothing changes, its session goes on.
    let out = stampede(&app, &["revoke-admin", "--username", "revokee"]).await;
    assert!(!out.status.success(), "revoke-admin of a shopper: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("revokee is not an admin"),
        "{out:?}"
    );
    assert_eq!(me(&app, &again).await, StatusCode::OK);
    // A name nobody has: exit 1, and it says so.
    let out = stampede(&app, &["revoke-admin", "--username", "nobodyhere"]).await;
    assert!(!out.status.success(), "revoke-admin of no account: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no account is named nobodyhere"),
        "{out:?}"
    );
}
