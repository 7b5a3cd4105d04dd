use reqwest::StatusCode;
use serde_json::Value;
use sqlx::Connection;

use crate::helpers::{
    assert_error, limits, metric, spawn_app, spawn_app_with, spawn_with_live_sale,
    spawn_with_live_sale_and, test_database_url, try_metric, window_policy,
};

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
async fn without_postgres_readyz_stays_200_for_the_buy_path_and_readyz_postgres_is_503() {
    let app = spawn_app().await;
    // Terminate the server's database connections and forbid new ones.
    let db_name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let mut conn = sqlx::PgConnection::connect(&test_database_url())
        .await
        .unwrap();
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
    // The probe asks every second and waits a second at most.
    let mut body = Value::Null;
    for _ in 0..50 {
        let resp = app.get("/readyz/postgres", None).await;
        if resp.status() == StatusCode::SERVICE_UNAVAILABLE {
            assert!(resp.headers().get("retry-after").is_some());
            body = resp.json().await.unwrap();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(body["postgres"], "down", "/readyz/postgres never said so");
    assert_eq!(body["redis"], "ok");
    // Deciding needs Redis alone: the buy path's readiness stays 200.
    let resp = app.get("/readyz", None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "ready");
    assert_eq!(body["postgres"], "down");
    let scraped = app.metrics_text().await;
    assert!(
        scraped.lines().any(|l| l == "stampede_postgres_up 0"),
        "stampede_postgres_up not 0"
    );
}

/// A table held under an exclusive lock (a migration or `VACUUM FULL` gone
/// wrong): a read that needs it is answered 503 with `Retry-After` after about
/// the statement timeout, not when the lock goes; `/readyz` stays 200 and
/// purchases are decided. The claim is the event (answered while the lock is
/// still held), not the speed: the bound (20 s) is generous and only turns a read
/// that waits for the lock into a failure.
#[tokio::test(flavor = "multi_thread")]
async fn a_read_stuck_behind_a_lock_fails_while_the_lock_holds_and_purchases_go_on() {
    let (app, _, sale) = spawn_with_live_sale(10).await;
    let buyer = app.user().await;
    let mut locker = sqlx::PgConnection::connect(&app.config.database_url)
        .await
        .unwrap();
    let mut tx = sqlx::Connection::begin(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let resp = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        app.get("/api/me/orders", Some(&buyer.token)),
    )
    .await
    .expect("the read still waits for the lock after 20 s");
    let took = started.elapsed();
    assert_eq!(
        resp.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "after {took:?}"
    );
    assert!(resp.headers().get("retry-after").is_some());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "database_unavailable");
    let resp = app.get("/readyz", None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = app.purchase(sale, &buyer.token).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    tx.rollback().await.unwrap();
    assert_eq!(app.wait_for_orders(sale, 1).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_purchase_outcomes() {
    let (app, _, sale) = spawn_with_live_sale(1).await;
    let users = app.create_users(3, false).await;
    for u in &users {
        app.purchase(sale, &u.token).await;
    }
    app.purchase(sale, &users[0].token).await;
    let text = app.metrics_text().await;
    let value = |name: &str| -> u64 { metric(&text, name) };
    assert_eq!(value("stampede_purchase_accepted_total"), 1);
    // Redis answers: the gauge the alert rules read (deploy/alerts.yml).
    assert_eq!(value("stampede_redis_up"), 1);
    // The second buyer meets the script's sold-out; the rest hit the local flag.
    assert_eq!(value("stampede_purchase_sold_out_total"), 1);
    assert_eq!(value("stampede_purchase_sold_out_local_total"), 2);
    // Every purchase, the two the flag answered before routing among them, is
    // timed under the route's pattern; nothing fell to `unmatched`.
    let timed = |class: &str| -> u64 {
        metric(
            &text,
            &format!(
                "stampede_http_request_duration_seconds_count{{route=\"/api/sales/{{id}}/purchase\",status=\"{class}\"}}"
            ),
        )
    };
    assert_eq!(timed("2xx"), 1, "{text}");
    assert_eq!(timed("4xx"), 3, "{text}");
    assert!(!text.contains("route=\"unmatched\""), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_show_cache_loads() {
    let (app, _, sale) = spawn_with_live_sale(1).await;
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
    // The load took the view's rebuild lock (the lock counters are per process).
    let acquired: u64 = metric(&text, "stampede_lock_acquired_total");
    assert!(acquired >= 1, "{text}");
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

/// The value of one series (name with its labels, as rendered) in `/metrics` text.
fn series(text: &str, name_and_labels: &str) -> f64 {
    metric(text, name_and_labels)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_purchase_a_limit_refusal_and_a_settled_batch_each_move_their_series() {
    let policy = window_policy("buy-user", "buy", "user", "fixed_window", 1, 60_000);
    let (app, _, sale) = spawn_with_live_sale_and(10, |c| c.limits = limits(&[policy])).await;
    let user = app.user().await;
    let route = "/api/sales/{id}/purchase";
    let count = |class: &str| {
        format!(
            r#"stampede_http_request_duration_seconds_count{{route="{route}",status="{class}"}}"#
        )
    };

    app.buy(sale, &user.token).await;
    let text = app.metrics_text().await;
    assert_eq!(series(&text, &count("2xx")), 1.0);
    assert_eq!(series(&text, &count("4xx")), 0.0);
    assert_eq!(series(&text, "stampede_buy_batch_size_count"), 1.0);
    assert_eq!(series(&text, "stampede_buy_batch_size_sum"), 1.0);
    // The answer took more than nothing and less than the largest bucket.
    assert!(
        series(
            &text,
            &format!(
                r#"stampede_http_request_duration_seconds_sum{{route="{route}",status="2xx"}}"#
            )
        ) > 0.0
    );
    assert_eq!(
        series(
            &text,
            &format!(
                r#"stampede_http_request_duration_seconds_bucket{{route="{route}",status="2xx",le="5"}}"#
            )
        ),
        1.0
    );

    // The second try of the same user is refused by the per-user limit: a 4xx,
    // counted by the limit counter, and no new 2xx.
    let refused = app.purchase(sale, &user.token).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let text = app.metrics_text().await;
    assert_eq!(series(&text, &count("4xx")), 1.0);
    assert_eq!(series(&text, &count("2xx")), 1.0);
    assert_eq!(series(&text, "stampede_rate_limited_total"), 1.0);
    assert_eq!(
        series(
            &text,
            r#"stampede_limit_decisions_total{policy="buy-user",answer="allowed"}"#
        ),
        1.0
    );
    assert_eq!(
        series(
            &text,
            r#"stampede_limit_decisions_total{policy="buy-user",answer="denied"}"#
        ),
        1.0
    );

    // Settlement writes the order: a settled batch, and the sale's stream empties.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = app.metrics_text().await;
        let settled: f64 =
            try_metric(&text, "stampede_settle_batch_duration_seconds_count").unwrap_or(0.0);
        // The batch is timed before its entry is deleted: polled until both, so a
        // scrape between the two is not taken for an entry left behind.
        let entries = try_metric(
            &text,
            &format!(
                r#"stampede_settle_stream_entries{{kind="sale",id="{sale}",rehearsal="false"}}"#
            ),
        );
        if settled >= 1.0 && entries == Some(0.0) {
            assert_eq!(series(&text, "stampede_settled_rows_total"), 1.0);
            assert_eq!(
                series(
                    &text,
                    &format!(r#"stampede_sale_stock_left{{id="{sale}",rehearsal="false"}}"#)
                ),
                9.0
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no settled batch with its entry deleted in 10 s:\n{text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sale_closed_early_shows_no_units_left() {
    // Its end days away, a sale closed early keeps its settlement gauges for the
    // backlog, not units left nobody can buy (StampedeStockStuck reads them).
    let (app, admin, closed) = spawn_with_live_sale(5).await;
    let open = app.live_sale(&admin, 7).await;
    let user = app.user().await;
    app.buy(closed, &user.token).await;
    assert_eq!(
        app.close_sale(&admin, closed).await.status(),
        StatusCode::OK
    );
    let text = app.metrics_text().await;
    let left = |sale: i64| {
        try_metric::<f64>(
            &text,
            &format!(r#"stampede_sale_stock_left{{id="{sale}",rehearsal="false"}}"#),
        )
    };
    assert_eq!(left(open), Some(7.0), "the open sale's units left:\n{text}");
    assert_eq!(left(closed), None, "the closed sale's units left:\n{text}");
    assert!(
        try_metric::<f64>(
            &text,
            &format!(
                r#"stampede_settle_stream_entries{{kind="sale",id="{closed}",rehearsal="false"}}"#
            ),
        )
        .is_some(),
        "the closed sale's backlog is still watched:\n{text}"
    );
}
