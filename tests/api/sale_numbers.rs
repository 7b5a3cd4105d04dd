//! A sale's numbers after cancels, refunds and expiries (issue 50): units offered
//! (`stock_total`) are the stock the admin set plus top-ups and never grow with a
//! returned unit; units left take the unit back; units sold are those held by
//! live orders (`stock_total - stock_left`), on the API, the admin's list and the
//! pages alike; and a shopper whose order was returned reads whether they may buy
//! again, by the sale's one rule for cancelled, refunded and expired orders.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{TestApp, User, listed, spawn_app_with};

async fn cancel(app: &TestApp, token: &str, admin: bool, order: Uuid) {
    let path = if admin {
        format!("/api/admin/orders/{order}/cancel")
    } else {
        format!("/api/orders/{order}/cancel")
    };
    let resp = app.post(&path, Some(token)).await;
    assert_eq!(
        resp.status(),
        StatusCode::OK,
        "{}",
        resp.text().await.unwrap()
    );
}

/// `(stock_total, stock_left, sold)` as `GET /api/sales/{id}`, the admin's list
/// and the sale's page show them; all three must agree.
async fn shown(app: &TestApp, admin: &User, sale: i64) -> (i64, i64, i64) {
    let view = app
        .get_json(&format!("/api/sales/{sale}"), Some(&admin.token))
        .await;
    let numbers = |v: &Value| {
        (
            v["stock_total"].as_i64().unwrap(),
            v["stock_left"].as_i64().unwrap(),
            v["sold"].as_i64().unwrap(),
        )
    };
    let list = app
        .get_json("/api/admin/sales?limit=200", Some(&admin.token))
        .await;
    assert_eq!(
        numbers(listed(&list, sale)),
        numbers(&view),
        "the admin's list"
    );
    let page = app.html(&format!("/sales/{sale}"), Some(admin)).await;
    let (total, left, _) = numbers(&view);
    assert!(
        page.contains(&format!(r#"data-stock-total="{total}""#))
            && page.contains(&format!(r#"data-stock-left="{left}""#)),
        "the sale page shows {left} of {total}"
    );
    numbers(&view)
}

/// A sale of 10 with a payment window, `bought` buyers (at least 4) and one more
/// user who bought nothing (the last); then four units back: the first buyer
/// cancels, an admin cancels the second's order, the third's is paid and refunded,
/// the fourth's expires unpaid.
async fn four_returned(rebuy: bool, bought: usize) -> (TestApp, User, i64, Vec<User>) {
    let app = spawn_app_with(|c| c.expire = Duration::ZERO).await;
    let admin = app.admin().await;
    let sale = app.payment_sale(&admin, 10, 600, rebuy).await;
    let users = app.create_users(bought + 1, false).await;
    let orders = app.buy_all(sale, &users[..bought]).await;
    assert_eq!(app.wait_for_orders(sale, bought).await.len(), bought);
    let left = i64::try_from(10 - bought).unwrap();
    let sold = i64::try_from(bought).unwrap();
    assert_eq!(shown(&app, &admin, sale).await, (10, left, sold));
    let [a, b, c, d] = [0, 1, 2, 3].map(|i| orders[&users[i].id]);
    cancel(&app, &users[0].token, false, a).await;
    cancel(&app, &admin.token, true, b).await;
    assert_eq!(
        app.pay(&users[2], c, "pay-c").await.status(),
        StatusCode::OK
    );
    cancel(&app, &admin.token, true, c).await;
    sqlx::query("UPDATE orders SET pay_by = now() - interval '1 s' WHERE id = $1")
        .bind(d)
        .execute(&app.db)
        .await
        .unwrap();
    assert_eq!(stampede::startup::expire_once(&app.state).await.unwrap(), 1);
    assert_eq!(
        app.returns_by_status(sale).await,
        HashMap::from([("applied".into(), 4)])
    );
    (app, admin, sale, users)
}

#[tokio::test]
async fn returned_units_go_back_to_left_and_the_offer_stays_what_the_admin_set() {
    for rebuy in [false, true] {
        returned_units(rebuy).await;
    }
}

async fn returned_units(rebuy: bool) {
    let (app, admin, sale, _) = four_returned(rebuy, 7).await;
    assert_eq!(
        shown(&app, &admin, sale).await,
        (10, 7, 3),
        "10 offered, 4 returned: 7 left, 3 sold (rebuy {rebuy})"
    );
    // What sold, from Postgres, says the same.
    let totals = &app
        .get_json(
            &format!("/api/admin/sales/{sale}/orders"),
            Some(&admin.token),
        )
        .await["totals"];
    assert_eq!(
        (&totals["units_sold"], &totals["units_returned"]),
        (&json!(3), &json!(4)),
        "{totals}"
    );
    // The record behind it: re-offered units counted apart, the arithmetic of both
    // stores untouched.
    let (column, reoffered): (i64, i64) =
        sqlx::query_as("SELECT stock_total, units_reoffered FROM sales WHERE id = $1")
            .bind(sale)
            .fetch_one(&app.db)
            .await
            .unwrap();
    let expected = if rebuy { 0 } else { 4 };
    assert_eq!((column, reoffered), (10 + expected, expected));
    app.assert_stock_arithmetic(&admin, sale, "after the returns")
        .await;
    let report = app.reconcile_report(&admin, sale).await;
    assert_eq!(
        (&report["stock_total"], &report["units_reoffered"]),
        (&json!(10), &json!(expected)),
        "{report}"
    );

    // A top-up adds to the offer; a rebuild from Postgres comes to the same numbers.
    let resp = app.change_stock(&admin, sale, &json!({ "add": 2 })).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        shown(&app, &admin, sale).await,
        (12, 9, 3),
        "after a top-up"
    );
    app.repair(&admin, sale).await;
    assert_eq!(
        shown(&app, &admin, sale).await,
        (12, 9, 3),
        "after a rebuild"
    );
    app.assert_stock_arithmetic(&admin, sale, "after a rebuild")
        .await;
}

/// The `data-returned` of the sale page as `user` gets it (`None`: no attribute).
async fn returned_on_page(app: &TestApp, sale: i64, user: &User) -> Option<String> {
    let page = app.html(&format!("/sales/{sale}"), Some(user)).await;
    let at = page.find(r#"data-returned=""#)?;
    let rest = &page[at + r#"data-returned=""#.len()..];
    Some(rest[..rest.find('"').unwrap()].to_string())
}

#[tokio::test]
async fn a_returned_order_tells_its_buyer_whether_they_may_buy_again() {
    for rebuy in [false, true] {
        returned_words(rebuy).await;
    }
}

async fn returned_words(rebuy: bool) {
    let (app, _, sale, users) = four_returned(rebuy, 4).await;
    for (user, words) in
        users[..4]
            .iter()
            .zip(["cancelled_by_you", "cancelled", "refunded", "expired"])
    {
        assert_eq!(
            returned_on_page(&app, sale, user).await.as_deref(),
            Some(words),
            "rebuy {rebuy}"
        );
    }
    let page = app.html(&format!("/sales/{sale}"), Some(&users[0])).await;
    assert!(page.contains(&format!(r#"data-rebuy="{rebuy}""#)));
    // One who never bought reads nothing of the kind.
    assert_eq!(returned_on_page(&app, sale, &users[4]).await, None);

    // The buyer's own orders say the rule, in the API and on the page.
    let mine = app.get_json("/api/me/orders", Some(&users[0].token)).await;
    assert_eq!(mine[0]["rebuy_after_expiry"], rebuy, "{mine}");
    let page = app.html("/me/orders", Some(&users[0])).await;
    let rule = if rebuy {
        "You may buy from this sale again."
    } else {
        "This sale allows one purchase per customer, cancelled or not."
    };
    assert!(page.contains(rule), "{page}");

    // The rule is honoured: buying again is accepted, or refused as one per customer.
    let resp = app.purchase(sale, &users[0].token).await;
    if rebuy {
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        // Holding a unit again (pending or settled), the page says nothing of the old order.
        assert_eq!(returned_on_page(&app, sale, &users[0]).await, None);
    } else {
        assert_eq!(resp.status(), StatusCode::CONFLICT);
        assert_eq!(
            returned_on_page(&app, sale, &users[0]).await.as_deref(),
            Some("cancelled_by_you")
        );
    }
}

/// One rule for expired and cancelled orders, in the same words on the create form
/// and the edit form (the create form once said "expires" only).
#[tokio::test]
async fn the_create_and_edit_forms_say_the_same_rule() {
    let app = spawn_app_with(|_| {}).await;
    let admin = app.admin().await;
    let sale = app.payment_sale(&admin, 3, 600, false).await;
    let rule = "Buyers whose order expires or is cancelled may buy again";
    let help = "Otherwise one purchase per customer, cancelled or not";
    for path in ["/admin".to_string(), format!("/admin/sales/{sale}")] {
        let page = app.html(&path, Some(&admin)).await;
        assert!(page.contains(rule) && page.contains(help), "{path}");
    }
}

/// A sale of up to 3 per customer that does not let a buyer buy again: a
/// cancelled order's units still count against the cap, and the page says the
/// buyer holds none of them ("You have 2" was shown for units given back).
#[tokio::test]
async fn returned_units_of_a_sale_of_several_are_counted_and_not_held() {
    let app = spawn_app_with(|_| {}).await;
    let admin = app.admin().await;
    let sale = app
        .live_sale_with(&admin, 10, json!({"max_per_user": 3}))
        .await;
    let user = app.user().await;
    let path = format!("/api/sales/{sale}/purchase");
    let bodies = [1, 2].map(|quantity| json!({ "quantity": quantity }));
    let buy = |quantity: usize| app.post_json(&path, Some(&user.token), &bodies[quantity - 1]);
    assert_eq!(buy(2).await.status(), StatusCode::ACCEPTED);
    let order = app.wait_for_orders(sale, 1).await[0].0;
    cancel(&app, &user.token, false, order).await;

    let page = app.html(&format!("/sales/{sale}"), Some(&user)).await;
    assert!(page.contains(r#"data-held="0""#), "{page}");
    assert!(page.contains(r#"data-counted="2""#), "{page}");
    assert!(
        page.contains(r#"data-field="held-note" hidden></p>"#),
        "{page}"
    );
    assert_eq!(
        returned_on_page(&app, sale, &user).await.as_deref(),
        Some("cancelled_by_you")
    );
    // My orders words the rule by the sale's cap, not as one per customer.
    let orders = app.html("/me/orders", Some(&user)).await;
    assert!(
        orders
            .contains("Returned units still count toward this sale&#39;s limit of 3 per customer."),
        "{orders}"
    );
    assert!(!orders.contains("one purchase per customer"), "{orders}");
    assert!(orders.contains(r#"data-max-per-user="3""#), "{orders}");
    // The buyer's own answers are kept by no shared cache.
    for path in [
        "/api/me".to_string(),
        "/api/me/orders".to_string(),
        format!("/api/orders/{order}"),
    ] {
        let resp = app
            .client
            .get(app.url(&path))
            .bearer_auth(&user.token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        assert_eq!(
            resp.headers()["cache-control"],
            "private, no-store",
            "{path}"
        );
    }

    // One more unit is all the cap leaves.
    assert_eq!(buy(2).await.status(), StatusCode::CONFLICT);
    assert_eq!(buy(1).await.status(), StatusCode::ACCEPTED);
    let page = app.html(&format!("/sales/{sale}"), Some(&user)).await;
    assert!(page.contains(r#"data-held="1""#), "{page}");
    assert!(page.contains(r#"data-counted="3""#), "{page}");
    assert!(page.contains(r#"data-bought="true""#), "{page}");
    assert!(page.contains("You have 1 from this sale."), "{page}");
    assert_eq!(returned_on_page(&app, sale, &user).await, None);
}
