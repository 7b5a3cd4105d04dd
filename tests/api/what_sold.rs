//! What sold: units per order and the totals in `GET /api/admin/sales/{id}/orders`
//! and on the admin's orders page, and every order as CSV.

use std::collections::HashMap;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, User, assert_error, spawn_app};

async fn buy_units(app: &TestApp, sale: i64, user: &User, quantity: i64) -> Value {
    let resp = app
        .post_json(
            &format!("/api/sales/{sale}/purchase"),
            Some(&user.token),
            &json!({ "quantity": quantity }),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    resp.json().await.unwrap()
}

async fn csv(app: &TestApp, admin: &User, sale: i64) -> Vec<HashMap<String, String>> {
    let resp = app
        .get(
            &format!("/api/admin/sales/{sale}/orders.csv"),
            Some(&admin.token),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let headers = resp.headers().clone();
    assert_eq!(headers["content-type"], "text/csv; charset=utf-8");
    assert_eq!(
        headers["content-disposition"],
        format!("attachment; filename=\"sale-{sale}-orders.csv\"").as_str()
    );
    let text = resp.text().await.unwrap();
    let mut lines = text.split("\r\n");
    let header: Vec<String> = lines.next().unwrap().split(',').map(String::from).collect();
    assert_eq!(
        header,
        [
            "order_id",
            "buyer",
            "user_id",
            "units",
            "status",
            "accepted_at",
            "settled_at",
            "paid_at",
            "amount_cents"
        ]
    );
    assert!(text.ends_with("\r\n"));
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            // Usernames have no comma or quote (letters, digits, _ . -).
            let fields: Vec<&str> = l.split(',').collect();
            assert_eq!(fields.len(), header.len(), "{l}");
            header
                .iter()
                .cloned()
                .zip(fields.into_iter().map(String::from))
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn orders_show_units_and_totals_and_the_csv_has_every_order() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let users = app.create_users(3, false).await;
    // No payment step, up to 2 each, $5.00 a unit.
    let plain = app
        .live_sale_with(&admin, 20, json!({"max_per_user": 2}))
        .await;
    // With a payment step.
    let paying = app
        .live_sale_with(
            &admin,
            20,
            json!({"max_per_user": 2, "payment_window_s": 600}),
        )
        .await;
    let wanted = [2, 1, 2];
    for (user, units) in users.iter().zip(wanted) {
        buy_units(&app, plain, user, units).await;
    }
    let paid_order = buy_units(&app, paying, &users[0], 2).await["order_id"]
        .as_str()
        .unwrap()
        .to_string();
    buy_units(&app, paying, &users[1], 1).await;
    app.wait_for_orders(plain, 3).await;
    app.wait_for_orders(paying, 2).await;
    let pay = app.pay(&users[0], &paid_order, "what-sold-1").await;
    assert_eq!(pay.status(), StatusCode::OK);

    // The JSON: units per order, and the totals.
    let listed = app
        .get_json(
            &format!("/api/admin/sales/{plain}/orders"),
            Some(&admin.token),
        )
        .await;
    let mut units: Vec<i64> = listed["confirmed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["quantity"].as_i64().unwrap())
        .collect();
    units.sort();
    assert_eq!(units, [1, 2, 2]);
    assert_eq!(
        listed["totals"],
        json!({"orders": 3, "units_sold": 5, "units_paid": 5, "units_awaiting": 0,
               "revenue_paid_cents": 2500, "revenue_awaiting_cents": 0})
    );
    let listed = app
        .get_json(
            &format!("/api/admin/sales/{paying}/orders"),
            Some(&admin.token),
        )
        .await;
    assert_eq!(
        listed["totals"],
        json!({"orders": 2, "units_sold": 3, "units_paid": 2, "units_awaiting": 1,
               "revenue_paid_cents": 1000, "revenue_awaiting_cents": 500})
    );

    // The CSV: every order, with its buyer, units and amount.
    let rows = csv(&app, &admin, plain).await;
    assert_eq!(rows.len(), 3);
    for (user, units) in users.iter().zip(wanted) {
        let row = rows
            .iter()
            .find(|r| r["user_id"] == user.id.to_string())
            .expect("every buyer's order");
        assert_eq!(row["buyer"], app.username_of(user).await);
        assert_eq!(row["units"], units.to_string());
        assert_eq!(row["amount_cents"], (units * 500).to_string());
        assert_eq!(row["status"], "accepted");
        assert_eq!(row["paid_at"], "");
        assert!(row["accepted_at"].ends_with('Z'));
    }
    let rows = csv(&app, &admin, paying).await;
    assert_eq!(rows.len(), 2);
    let paid = rows.iter().find(|r| r["order_id"] == paid_order).unwrap();
    assert_eq!(paid["status"], "paid");
    assert_eq!(paid["amount_cents"], "1000");
    assert!(!paid["paid_at"].is_empty());
    let awaiting = rows.iter().find(|r| r["order_id"] != paid_order).unwrap();
    assert_eq!(awaiting["status"], "awaiting_payment");
    assert_eq!(awaiting["units"], "1");

    // The admin's page: units per order, the totals and the CSV link.
    let page = app
        .html(&format!("/admin/sales/{paying}/orders"), Some(&admin))
        .await;
    assert!(page.contains(r#"data-field="units-sold">3<"#), "{page}");
    assert!(
        page.contains(r#"data-field="revenue-paid">$10.00<"#),
        "{page}"
    );
    assert!(
        page.contains(r#"data-field="revenue-awaiting">$5.00<"#),
        "{page}"
    );
    assert!(page.contains(&format!(r#"href="/api/admin/sales/{paying}/orders.csv""#)));
    assert!(page.contains(r#"data-field="units">2<"#));
}

#[tokio::test]
async fn the_csv_streams_many_orders_and_needs_an_admin() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let buyers = app.create_users(400, false).await;
    let sale = app.live_sale(&admin, 1000).await;
    for chunk in buyers.chunks(50) {
        futures_util::future::join_all(chunk.iter().map(|b| app.buy(sale, &b.token))).await;
    }
    assert_eq!(app.wait_for_orders(sale, 400).await.len(), 400);
    let rows = csv(&app, &admin, sale).await;
    assert_eq!(rows.len(), 400, "every order, across several chunks");
    let mut ids: Vec<&str> = rows.iter().map(|r| r["order_id"].as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 400);

    let path = format!("/api/admin/sales/{sale}/orders.csv");
    app.assert_get_error(&path, None, StatusCode::UNAUTHORIZED, "unauthorized")
        .await;
    let buyer = &buyers[0];
    app.assert_get_error(
        &path,
        Some(&buyer.token),
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    assert_error(
        app.get("/api/admin/sales/999999/orders.csv", Some(&admin.token))
            .await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
}
