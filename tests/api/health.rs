use reqwest::StatusCode;
use serde_json::Value;
use sqlx::Connection;

use crate::helpers::{assert_error, spawn_app, spawn_app_with};

#[tokio::test(flavor = "multi_thread")]
async fn healthz_and_readyz_answer() {
    let app = spawn_app().await;
    let resp = app.get("/healthz", None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = app.get("/readyz", None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["redis"], "ok");
    assert_eq!(body["postgres"], "ok");
}

#[tokio::test(flavor = "multi_thread")]
async fn readyz_is_503_when_postgres_is_gone() {
    let app = spawn_app().await;
    // Terminate the server's database connections and forbid new ones.
    let db_name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let maintenance = std::env::var("STAMPEDE_TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .unwrap();
    let mut conn = sqlx::PgConnection::connect(&maintenance).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        r#"ALTER DATABASE "{db_name}" WITH ALLOW_CONNECTIONS false"#
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
        .bind(&db_name)
        .execute(&mut conn)
        .await
        .unwrap();
    let resp = app.get("/readyz", None).await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["postgres"], "down");
    assert_eq!(body["redis"], "ok");
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_purchase_outcomes() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app.create_sale(&admin, 1, -5, 3600).await;
    let users = app.create_users(3, false).await;
    for u in &users {
        app.purchase(sale, &u.token).await;
    }
    app.purchase(sale, &users[0].token).await;
    let text = app.metrics_text().await;
    let value = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing in:\n{text}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("stampede_purchase_accepted_total"), 1);
    // The second buyer meets the script's sold-out; the rest hit the local flag.
    assert_eq!(value("stampede_purchase_sold_out_total"), 1);
    assert_eq!(value("stampede_purchase_sold_out_local_total"), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_show_cache_loads() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app.create_sale(&admin, 1, -5, 3600).await;
    for _ in 0..3 {
        assert_eq!(
            app.get(&format!("/api/sales/{sale}"), None).await.status(),
            StatusCode::OK
        );
    }
    let text = app.metrics_text().await;
    assert!(text.contains("\nstampede_cache_loads_total 1\n"), "{text}");
    // The create answer built the view; the three reads were hits.
    assert!(text.contains("\nstampede_cache_hits_total 3\n"), "{text}");
}

/// `/metrics` is not public: the main listener has none unless a bearer token is
/// configured, and then only with that token; the metrics listener (loopback by
/// default) serves it freely.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_are_not_served_publicly() {
    let app = spawn_app().await;
    let resp = app.get("/metrics", None).await;
    assert_error(resp, StatusCode::NOT_FOUND, "not_found").await;
    let admin = app.admin().await;
    let resp = app.get("/metrics", Some(&admin.token)).await;
    assert_error(resp, StatusCode::NOT_FOUND, "not_found").await;
    assert!(
        app.metrics_text()
            .await
            .contains("stampede_purchase_accepted_total")
    );
    // The metrics listener serves nothing else.
    let port = app.metrics_port.unwrap();
    let other = app
        .client
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        stampede::config::Config::default()
            .metrics_listen
            .unwrap()
            .ip()
            .to_string(),
        "127.0.0.1"
    );

    let token = "metrics-token-0123456789";
    let app = spawn_app_with(|c| {
        c.metrics_token = Some(token.into());
        c.metrics_listen = None;
    })
    .await;
    assert_eq!(app.metrics_port, None);
    for wrong in [
        None,
        Some("metrics-token-012345678x"),
        Some("short"),
        Some(admin.token.as_str()),
    ] {
        let resp = app.get("/metrics", wrong).await;
        let resp_headers = resp.headers().clone();
        assert_error(resp, StatusCode::UNAUTHORIZED, "unauthorized").await;
        assert_eq!(resp_headers["www-authenticate"], "Bearer");
    }
    let resp = app.get("/metrics", Some(token)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.text()
            .await
            .unwrap()
            .contains("stampede_purchase_accepted_total")
    );
}
