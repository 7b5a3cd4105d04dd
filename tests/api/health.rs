use reqwest::StatusCode;
use serde_json::Value;
use sqlx::Connection;

use crate::helpers::spawn_app;

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
    let resp = app.get("/metrics", None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let text = resp.text().await.unwrap();
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
    let text = app.get("/metrics", None).await.text().await.unwrap();
    assert!(text.contains("\nstampede_cache_loads_total 1\n"), "{text}");
    // The create answer built the view; the three reads were hits.
    assert!(text.contains("\nstampede_cache_hits_total 3\n"), "{text}");
}
