//! What sold: units per order and the totals in `GET /api/admin/sales/{id}/orders`
//! and on the admin's orders page, and every order as CSV.

use std::collections::HashMap;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, User, assert_error, spawn_app, spawn_app_with};

/// A live sale of 20 units at $5.00, up to 2 each, with 600 s to pay.
async fn paying_sale(app: &TestApp, admin: &User) -> i64 {
    let overrides = json!({"max_per_user": 2, "payment_window_s": 600});
    app.live_sale_with(admin, 20, overrides).await
}

/// The answer's body, once its status is `status`.
async fn answer(resp: reqwest::Response, status: StatusCode) -> Value {
    assert_eq!(resp.status(), status);
    resp.json().await.unwrap()
}

async fn buy_units(app: &TestApp, sale: i64, user: &User, quantity: i64) -> Value {
    let path = format!("/api/sales/{sale}/purchase");
    let body = json!({ "quantity": quantity });
    answer(
        app.post_json(&path, Some(&user.token), &body).await,
        StatusCode::ACCEPTED,
    )
    .await
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
            "expired_at",
            "cancelled_at",
            "refunded_at",
            "amount_paid_cents",
            "amount_awaiting_cents",
            "amount_refunded_cents"
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
    let paying = paying_sale(&app, &admin).await;
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
               "units_returned": 0, "units_expired": 0, "units_cancelled": 0,
               "units_refunded": 0, "revenue_paid_cents": 2500,
               "revenue_awaiting_cents": 0, "revenue_refunded_cents": 0})
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
               "units_returned": 0, "units_expired": 0, "units_cancelled": 0,
               "units_refunded": 0, "revenue_paid_cents": 1000,
               "revenue_awaiting_cents": 500, "revenue_refunded_cents": 0})
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
        assert_eq!(row["amount_paid_cents"], (units * 500).to_string());
        assert_eq!(row["amount_awaiting_cents"], "0");
        assert_eq!(row["amount_refunded_cents"], "0");
        assert_eq!(row["status"], "accepted");
        assert_eq!(row["paid_at"], "");
        assert!(row["accepted_at"].ends_with('Z'));
    }
    let rows = csv(&app, &admin, paying).await;
    assert_eq!(rows.len(), 2);
    let paid = rows.iter().find(|r| r["order_id"] == paid_order).unwrap();
    assert_eq!(paid["status"], "paid");
    assert_eq!(paid["amount_paid_cents"], "1000");
    assert!(!paid["paid_at"].is_empty());
    let awaiting = rows.iter().find(|r| r["order_id"] != paid_order).unwrap();
    assert_eq!(awaiting["status"], "awaiting_payment");
    assert_eq!(awaiting["units"], "1");
    assert_eq!(awaiting["amount_paid_cents"], "0");
    assert_eq!(awaiting["amount_awaiting_cents"], "500");

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

/// `POST /api/admin/orders/{id}/cancel` as `admin`: must answer 200; the answer.
async fn admin_cancel(app: &TestApp, admin: &User, order: &str) -> Value {
    let path = format!("/api/admin/orders/{order}/cancel");
    answer(app.post(&path, Some(&admin.token)).await, StatusCode::OK).await
}

/// The sum of one CSV column over every row.
fn column_sum(rows: &[HashMap<String, String>], column: &str) -> i64 {
    rows.iter()
        .map(|r| r[column].parse::<i64>().expect(column))
        .sum()
}

/// A payment sale at $5.00 a unit: two paid orders (one of 2 units), two awaiting,
/// one left to expire. Before any return the totals count 7 units sold; then an
/// admin refunds a paid order and cancels an awaiting one, and one expires. The
/// totals, the page and the CSV all say the same: 4 units sold ($15.00 paid, $5.00
/// awaiting), 3 returned (1 expired, 1 cancelled, 1 refunded: $5.00 refunded), and
/// each CSV money column sums to its total.
#[tokio::test]
async fn totals_page_and_csv_agree_after_cancels_refunds_and_expiry() {
    let app = spawn_app_with(|c| c.expire = std::time::Duration::ZERO).await;
    let admin = app.admin().await;
    let sale = paying_sale(&app, &admin).await;
    let users = app.create_users(6, false).await;
    // paid 2, paid 1 (refunded), paid 1, awaiting 1 (cancelled), awaiting 1, to expire 1.
    let wanted = [2, 1, 1, 1, 1, 1];
    let mut orders = Vec::new();
    for (user, units) in users.iter().zip(wanted) {
        let bought = buy_units(&app, sale, user, units).await;
        orders.push(bought["order_id"].as_str().unwrap().to_string());
    }
    app.wait_for_orders(sale, 6).await;
    for (i, user) in users.iter().enumerate().take(3) {
        let paid = app.pay(user, &orders[i], &format!("sold-pay-{i}")).await;
        assert_eq!(paid.status(), StatusCode::OK);
    }
    let totals_path = format!("/api/admin/sales/{sale}/orders");
    let before = app.get_json(&totals_path, Some(&admin.token)).await;
    assert_eq!(
        before["totals"],
        json!({"orders": 6, "units_sold": 7, "units_paid": 4, "units_awaiting": 3,
               "units_returned": 0, "units_expired": 0, "units_cancelled": 0,
               "units_refunded": 0, "revenue_paid_cents": 2000,
               "revenue_awaiting_cents": 1500, "revenue_refunded_cents": 0})
    );

    let refunded = admin_cancel(&app, &admin, &orders[1]).await;
    assert_eq!(refunded["status"], "refunded");
    assert_eq!(refunded["refunded_cents"], 500);
    let cancelled = admin_cancel(&app, &admin, &orders[3]).await;
    assert_eq!(cancelled["status"], "cancelled");
    sqlx::query("UPDATE orders SET pay_by = now() - interval '1 second' WHERE id = $1::uuid")
        .bind(&orders[5])
        .execute(&app.db)
        .await
        .unwrap();
    assert_eq!(stampede::startup::expire_once(&app.state).await.unwrap(), 1);

    let after = app.get_json(&totals_path, Some(&admin.token)).await;
    let totals = json!({"orders": 6, "units_sold": 4, "units_paid": 3, "units_awaiting": 1,
               "units_returned": 3, "units_expired": 1, "units_cancelled": 1,
               "units_refunded": 1, "revenue_paid_cents": 1500,
               "revenue_awaiting_cents": 500, "revenue_refunded_cents": 500});
    assert_eq!(after["totals"], totals);

    // The CSV: one row per order, its times and money; each money column sums to
    // its total.
    let rows = csv(&app, &admin, sale).await;
    assert_eq!(rows.len(), 6);
    assert_eq!(column_sum(&rows, "amount_paid_cents"), 1500);
    assert_eq!(column_sum(&rows, "amount_awaiting_cents"), 500);
    assert_eq!(column_sum(&rows, "amount_refunded_cents"), 500);
    let sold: i64 = rows
        .iter()
        .filter(|r| ["accepted", "awaiting_payment", "paid"].contains(&r["status"].as_str()))
        .map(|r| r["units"].parse::<i64>().unwrap())
        .sum();
    assert_eq!(sold, 4);
    let row = |i: usize| rows.iter().find(|r| r["order_id"] == orders[i]).unwrap();
    let refunded_row = row(1);
    assert_eq!(refunded_row["status"], "refunded");
    assert_eq!(refunded_row["amount_paid_cents"], "0");
    assert_eq!(refunded_row["amount_refunded_cents"], "500");
    assert!(!refunded_row["paid_at"].is_empty());
    assert!(refunded_row["cancelled_at"].ends_with('Z'));
    assert_eq!(refunded_row["refunded_at"], refunded_row["cancelled_at"]);
    let cancelled_row = row(3);
    assert_eq!(cancelled_row["status"], "cancelled");
    assert!(cancelled_row["cancelled_at"].ends_with('Z'));
    assert_eq!(cancelled_row["refunded_at"], "");
    for column in [
        "amount_paid_cents",
        "amount_awaiting_cents",
        "amount_refunded_cents",
    ] {
        assert_eq!(cancelled_row[column], "0", "{column}");
    }
    let expired_row = row(5);
    assert_eq!(expired_row["status"], "expired");
    assert!(expired_row["expired_at"].ends_with('Z'));
    assert_eq!(expired_row["cancelled_at"], "");
    assert_eq!(expired_row["amount_awaiting_cents"], "0");
    let paid_row = row(0);
    assert_eq!(paid_row["amount_paid_cents"], "1000");
    assert_eq!(paid_row["cancelled_at"], "");

    // The page: the same numbers.
    let page = app
        .html(&format!("/admin/sales/{sale}/orders"), Some(&admin))
        .await;
    for (field, shown) in [
        ("units-sold", "4"),
        ("revenue-paid", "$15.00"),
        ("revenue-awaiting", "$5.00"),
        ("units-returned", "3"),
        ("revenue-refunded", "$5.00"),
        ("units-paid", "3"),
        ("units-awaiting", "1"),
        ("units-expired", "1"),
        ("units-cancelled", "1"),
        ("units-refunded", "1"),
    ] {
        assert!(
            page.contains(&format!(r#"data-field="{field}">{shown}<"#)),
            "{field} should read {shown}: {page}"
        );
    }
}

/// Order ids on the admin's orders page and My orders: a short form (the last 8
/// hex digits, the order's own; the first ones are its sale's), the whole id in
/// its title and behind a copy button.
#[tokio::test]
async fn order_ids_show_a_short_form_with_the_whole_id_to_copy() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 5).await;
    let buyer = app.user().await;
    app.buy(sale, &buyer.token).await;
    let orders = app.wait_for_orders(sale, 1).await;
    let id = orders[0].0.to_string();
    let short = &id[id.len() - 8..];
    for (path, who) in [
        (format!("/admin/sales/{sale}/orders"), &admin),
        ("/me/orders".to_string(), &buyer),
    ] {
        let page = app.html(&path, Some(who)).await;
        assert!(
            page.contains(&format!(r#"<code title="{id}">…{short}</code>"#)),
            "{path}: the short form with the whole id in its title: {page}"
        );
        assert!(
            page.contains(&format!(r#"data-action="copy" data-copy="{id}""#)),
            "{path}: a button copies the whole id: {page}"
        );
        assert!(
            !page.contains(&format!(">{id}<")),
            "{path}: the whole id is not shown as text"
        );
    }
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

/// The orders page states the sale's rule for a returned order as the buyer's
/// pages do: on a sale of more than one per customer whose buyers may not simply buy
/// again, they may buy again up to the limit (returned units count toward it),
/// where a sale of one per customer allows no second purchase.
#[tokio::test]
async fn the_orders_page_states_the_rule_for_returned_orders_by_the_sales_limit() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let overrides = json!({ "payment_window_s": 300, "rebuy_after_expiry": false });
    let one = app.live_sale_with(&admin, 5, overrides.clone()).await;
    let mut three = overrides;
    three["max_per_user"] = json!(3);
    let three = app.live_sale_with(&admin, 5, three).await;
    let page = app
        .html(&format!("/admin/sales/{one}/orders"), Some(&admin))
        .await;
    assert!(
        page.contains("One purchase per customer, cancelled or not"),
        "{page}"
    );
    let page = app
        .html(&format!("/admin/sales/{three}/orders"), Some(&admin))
        .await;
    assert!(
        page.contains("Up to 3 units per customer, returned units included"),
        "{page}"
    );
    assert!(!page.contains("may not buy again"), "{page}");
}
