//! The admin's orders and tallies pages (with a sale's payments), My orders with
//! pending orders, and the signed-out sale page's way to sign in and back.

use chrono::{DateTime, Utc};
use reqwest::{StatusCode, header};
use serde_json::json;

use crate::helpers::{
    between, escaped_in, spawn_app_with, spawn_with_live_sale, spawn_with_live_sale_and,
    spawn_with_open_poll,
};

/// The `datetime` of every "Ordered" cell of a page, in order.
fn ordered_times(body: &str) -> Vec<DateTime<Utc>> {
    const CELL: &str = r#"<td data-label="Ordered"><time datetime=""#;
    body.match_indices(CELL)
        .map(|(at, _)| {
            let rest = &body[at + CELL.len()..];
            let iso = &rest[..rest.find('"').expect("closing quote")];
            DateTime::parse_from_rfc3339(iso)
                .unwrap_or_else(|e| panic!("{iso}: {e}"))
                .with_timezone(&Utc)
        })
        .collect()
}

#[tokio::test]
async fn orders_page_lists_every_buyer_with_order_id_and_status_for_admins_only() {
    let (app, admin, sale) = spawn_with_live_sale(5).await;
    let buyers = app.new_buyers(sale, 3).await;
    let orders = app.wait_for_orders(sale, 3).await;
    let path = format!("/admin/sales/{sale}/orders");

    let anonymous = app.browse(&path, None).await;
    assert_eq!(anonymous.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        anonymous.headers()[header::LOCATION],
        "/signin?next=%2Fadmin"
    );
    let denied = app
        .html_status(&path, Some(&buyers[0]), StatusCode::FORBIDDEN)
        .await;
    assert!(!denied.contains("Confirmed"));

    let body = app.html(&path, Some(&admin)).await;
    for buyer in &buyers {
        let name = app.username_of(buyer).await;
        assert_eq!(
            body.matches(&format!(r#"class="cell-title">{name}</td>"#))
                .count(),
            1,
            "{name} listed once"
        );
    }
    for (order_id, _) in &orders {
        assert!(body.contains(&format!(r#"data-copy="{order_id}""#)));
    }
    assert_eq!(body.matches(r#"badge-confirmed">Confirmed<"#).count(), 3);
    assert!(body.contains(r#"data-field="confirmed-total">3<"#));
    assert!(body.contains(r#"data-field="pending-total">0<"#));

    for bad in ["?page=0", "?page=2", "?page=x"] {
        let resp = app.browse(&format!("{path}{bad}"), Some(&admin)).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{bad}");
    }
    let unknown = app.browse("/admin/sales/999999/orders", Some(&admin)).await;
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn orders_page_pages_fifty_orders_at_a_time() {
    let (app, admin, sale) = spawn_with_live_sale(60).await;
    let buyers = app.new_buyers(sale, 52).await;
    app.wait_for_orders(sale, 52).await;
    let path = format!("/admin/sales/{sale}/orders");
    let numbers = |body: &str| -> Vec<i64> {
        const CELL: &str = r##"<td data-label="#" class="num">"##;
        body.match_indices(CELL)
            .map(|(at, _)| {
                let rest = &body[at + CELL.len()..];
                rest[..rest.find('<').unwrap()].parse().unwrap()
            })
            .collect()
    };

    let first = app.html(&path, Some(&admin)).await;
    assert_eq!(numbers(&first), (1..=50).collect::<Vec<_>>());
    assert!(first.contains("1 to 50 of 52, oldest first"));
    assert!(first.contains("Page 1 of 2"));
    assert!(first.contains(r#"href="?page=2" rel="next""#));
    assert!(!first.contains(r#"rel="prev""#));
    assert_eq!(ordered_times(&first).len(), 50);

    let second = app.html(&format!("{path}?page=2"), Some(&admin)).await;
    assert_eq!(numbers(&second), vec![51, 52]);
    assert!(second.contains("51 to 52 of 52, oldest first"));
    assert!(second.contains("Page 2 of 2"));
    assert!(second.contains(r#"href="?page=1" rel="prev""#));
    assert!(!second.contains(r#"rel="next""#));
    // Every buyer is on exactly one of the two pages, and times never go back.
    for buyer in &buyers {
        let cell = format!(
            r#"class="cell-title">{}</td>"#,
            app.username_of(buyer).await
        );
        assert_eq!(
            first.matches(&cell).count() + second.matches(&cell).count(),
            1,
            "{cell}"
        );
    }
    let times: Vec<_> = ordered_times(&first)
        .into_iter()
        .chain(ordered_times(&second))
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "oldest first");

    let past = app.browse(&format!("{path}?page=3"), Some(&admin)).await;
    assert_eq!(past.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn pending_orders_show_on_the_admin_page_and_in_my_orders() {
    // No settlement worker: accepted orders stay pending in Redis.
    let (app, admin, sale) = spawn_with_live_sale_and(5, |c| c.settle_in_serve = false).await;
    let buyers = app.create_users(2, false).await;
    // Whole seconds, as the page shows them.
    let before = Utc::now().timestamp();
    for buyer in &buyers {
        app.buy(sale, &buyer.token).await;
    }
    let after = Utc::now().timestamp();

    let body = app
        .html(&format!("/admin/sales/{sale}/orders"), Some(&admin))
        .await;
    assert!(body.contains(r#"data-field="pending-total">2<"#));
    assert!(body.contains(r#"data-field="confirmed-total">0<"#));
    assert_eq!(body.matches(r#"badge-pending">Pending<"#).count(), 2);
    for buyer in &buyers {
        let name = app.username_of(buyer).await;
        assert!(body.contains(&format!(r#"class="cell-title">{name}</td>"#)));
    }
    // Each pending row shows when it was accepted, like the confirmed rows do.
    let times = ordered_times(&body);
    assert_eq!(times.len(), 2, "one time per pending row: {body}");
    for at in &times {
        let at = at.timestamp();
        assert!((before..=after).contains(&at), "{at} in {before}..={after}");
    }
    assert!(times[0] <= times[1], "oldest first");

    let mine = app.html("/me/orders", Some(&buyers[0])).await;
    assert_eq!(mine.matches(r#"<tr class="is-pending">"#).count(), 1);
    assert!(mine.contains(&format!(r#"href="/sales/{sale}""#)));
    let other = app.html("/me/orders", Some(&admin)).await;
    assert!(!other.contains("is-pending"), "the admin bought nothing");
}

#[tokio::test]
async fn tallies_page_shows_live_and_settled_votes_for_admins_only() {
    let (app, admin, (poll, options)) =
        spawn_with_open_poll("Tea <or> coffee?", &["Tea", "Coffee"]).await;
    let voters = app.create_users(3, false).await;
    for (i, voter) in voters.iter().enumerate() {
        app.cast_vote(poll, &voter.token, options[usize::from(i > 0)])
            .await;
    }
    let path = format!("/admin/polls/{poll}");
    let denied = app.browse(&path, Some(&voters[0])).await;
    assert_eq!(denied.status(), StatusCode::FORBIDDEN);

    // Settled counts catch up with the live ones once the worker has run.
    let mut body = String::new();
    for _ in 0..100 {
        body = app.html(&path, Some(&admin)).await;
        if body.contains(r#"data-field="settled-voters">3<"#) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(body.contains(r#"data-field="live-voters">3<"#));
    assert!(body.contains(r#"data-field="settled-voters">3<"#));
    assert!(escaped_in(&body, "Tea <or> coffee?"));
    let row = |option: i64, label: &str, live: i64, share: i64| {
        format!(
            r#"<tr data-option-id="{option}">
          <td data-label="Option" class="cell-title">{label}</td>
          <td data-label="Live" class="num" data-field="live">{live}</td>
          <td data-label="Share" class="num" data-field="percent">{share}%</td>
          <td data-label="Settled" class="num" data-field="settled">{live}</td>
          <td data-label="Not yet settled" class="num" data-field="unsettled">0</td>"#
        )
    };
    assert!(body.contains(&row(options[0], "Tea", 1, 33)), "{body}");
    assert!(body.contains(&row(options[1], "Coffee", 2, 67)));
    // The page follows the tallies without a reload (static/app.js asks the API);
    // it says nothing about reloading.
    assert!(body.contains(&format!(r#"id="admin-poll" data-poll-id="{poll}""#)));
    assert!(!body.contains("Reload"));
}

#[tokio::test]
async fn signed_out_sale_page_offers_sign_in_to_buy_and_keeps_the_way_back() {
    let (app, _, sale) = spawn_with_live_sale(1_234_567).await;
    let body = app.html(&format!("/sales/{sale}"), None).await;
    let back = format!("next=%2Fsales%2F{sale}");
    assert!(body.contains(&format!(
        r#"<a class="btn btn-buy" href="/signin?{back}" data-field="signin-buy">Sign in to buy</a>"#
    )));
    assert!(body.contains(r#"data-action="buy" disabled hidden>"#));
    assert!(body.contains(&format!(
        r#"href="/signup?{back}" data-keep-next>Sign up</a>"#
    )));
    assert!(body.contains(&format!(
        r#"href="/signin?{back}" data-keep-next>Sign in</a>"#
    )));
    assert!(body.contains(r#"<strong data-field="stock-left">1,234,567</strong>"#));

    let user = app.user().await;
    let signed_in = app.html(&format!("/sales/{sale}"), Some(&user)).await;
    assert!(signed_in.contains(r#"data-field="signin-buy" hidden>"#));
    assert!(signed_in.contains(r#"data-action="buy" disabled>Buy now<"#));
}

#[tokio::test]
async fn orders_page_counts_payments_and_shows_each_orders_payment_status() {
    // The test runs the expiry pass itself.
    let app = spawn_app_with(|c| c.expire = std::time::Duration::ZERO).await;
    let admin = app.admin().await;
    let now = Utc::now();
    let sale = json!({
        "name": "Phone with payment",
        "price_cents": 49_900,
        "stock": 5,
        "starts_at": now - chrono::Duration::seconds(60),
        "ends_at": now + chrono::Duration::seconds(3600),
        "requires_ticket": false,
        "payment_window_s": 120,
    });
    let sale = app.admin_create(&admin, "/api/admin/sales", &sale).await["id"]
        .as_i64()
        .unwrap();
    let buyers = app.new_buyers(sale, 3).await;
    let orders = app.wait_for_orders(sale, 3).await;
    let order_of =
        |buyer: &crate::helpers::User| orders.iter().find(|(_, user)| *user == buyer.id).unwrap().0;
    let paid = app
        .pay(&buyers[0], order_of(&buyers[0]), "admin-pages-key")
        .await;
    assert_eq!(paid.status(), StatusCode::OK);
    sqlx::query("UPDATE orders SET pay_by = now() - interval '1 second' WHERE id = $1")
        .bind(order_of(&buyers[1]))
        .execute(&app.db)
        .await
        .unwrap();
    assert_eq!(stampede::startup::expire_once(&app.state).await.unwrap(), 1);

    let path = format!("/admin/sales/{sale}/orders");
    let body = app.html(&path, Some(&admin)).await;
    for (field, count) in [
        ("units-paid", 1),
        ("units-awaiting", 1),
        ("units-expired", 1),
        ("units-returned", 1),
        ("units-cancelled", 0),
        ("units-refunded", 0),
    ] {
        assert!(
            body.contains(&format!(r#"data-field="{field}">{count}<"#)),
            "{field}: {count}"
        );
    }
    assert!(body.contains("Buyers have 2 minutes to pay"));
    assert!(body.contains("may not buy again"));
    let status_of = |buyer_name: &str| {
        let row = between(
            &body,
            &format!(r#"class="cell-title">{buyer_name}</td>"#),
            "</tr>",
        );
        between(row, r#"<td data-label="Status">"#, "</td>")
            .trim()
            .to_string()
    };
    let names = [
        app.username_of(&buyers[0]).await,
        app.username_of(&buyers[1]).await,
        app.username_of(&buyers[2]).await,
    ];
    assert!(status_of(&names[0]).contains(r#"badge-paid">Paid<"#));
    assert!(status_of(&names[1]).contains(r#"badge-expired">Expired<"#));
    assert!(status_of(&names[2]).contains(r#"badge-awaiting""#));
    assert!(!body.contains("badge-confirmed"));

    // A sale without a payment step shows no payment counts, only its returns.
    let plain = app.live_sale(&admin, 5).await;
    let body = app
        .html(&format!("/admin/sales/{plain}/orders"), Some(&admin))
        .await;
    assert!(!body.contains("Payments and returns"));
    assert!(!body.contains(r#"data-field="units-paid""#));
    assert!(body.contains(r#"data-field="units-cancelled">0<"#));
}
