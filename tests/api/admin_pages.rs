//! The admin's orders and tallies pages, My orders with pending orders, and the
//! signed-out sale page's way to sign in and back.

use reqwest::{StatusCode, header};

use crate::helpers::{spawn_app, spawn_app_with};
use crate::pages::{browse, escaped_in, html};

async fn username_of(app: &crate::helpers::TestApp, id: i64) -> String {
    sqlx::query_scalar("SELECT username FROM users WHERE id = $1")
        .bind(id)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn orders_page_lists_every_buyer_with_order_id_and_status_for_admins_only() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app.create_sale(&admin, 5, -60, 3600).await;
    let buyers = app.create_users(3, false).await;
    for buyer in &buyers {
        assert_eq!(
            app.purchase(sale, &buyer.token).await.status(),
            StatusCode::ACCEPTED
        );
    }
    let orders = app.wait_for_orders(sale, 3).await;
    let path = format!("/admin/sales/{sale}/orders");

    let anonymous = browse(&app, &path, None).await;
    assert_eq!(anonymous.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        anonymous.headers()[header::LOCATION],
        "/signin?next=%2Fadmin"
    );
    let denied = html(
        browse(&app, &path, Some(&buyers[0])).await,
        StatusCode::FORBIDDEN,
    )
    .await;
    assert!(!denied.contains("Confirmed"));

    let body = html(browse(&app, &path, Some(&admin)).await, StatusCode::OK).await;
    for buyer in &buyers {
        let name = username_of(&app, buyer.id).await;
        assert_eq!(
            body.matches(&format!(r#"class="cell-title">{name}</td>"#))
                .count(),
            1,
            "{name} listed once"
        );
    }
    for (order_id, _) in &orders {
        assert!(body.contains(&format!("<code>{order_id}</code>")));
    }
    assert_eq!(body.matches(r#"badge-confirmed">Confirmed<"#).count(), 3);
    assert!(body.contains(r#"data-field="confirmed-total">3<"#));
    assert!(body.contains(r#"data-field="pending-total">0<"#));

    for bad in ["?page=0", "?page=2", "?page=x"] {
        let resp = browse(&app, &format!("{path}{bad}"), Some(&admin)).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{bad}");
    }
    let unknown = browse(&app, "/admin/sales/999999/orders", Some(&admin)).await;
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn pending_orders_show_on_the_admin_page_and_in_my_orders() {
    // No settlement worker: accepted orders stay pending in Redis.
    let app = spawn_app_with(|c| c.settle_in_serve = false).await;
    let admin = app.admin().await;
    let sale = app.create_sale(&admin, 5, -60, 3600).await;
    let buyers = app.create_users(2, false).await;
    for buyer in &buyers {
        assert_eq!(
            app.purchase(sale, &buyer.token).await.status(),
            StatusCode::ACCEPTED
        );
    }

    let body = html(
        browse(&app, &format!("/admin/sales/{sale}/orders"), Some(&admin)).await,
        StatusCode::OK,
    )
    .await;
    assert!(body.contains(r#"data-field="pending-total">2<"#));
    assert!(body.contains(r#"data-field="confirmed-total">0<"#));
    assert_eq!(body.matches(r#"badge-pending">Pending<"#).count(), 2);
    for buyer in &buyers {
        let name = username_of(&app, buyer.id).await;
        assert!(body.contains(&format!(r#"class="cell-title">{name}</td>"#)));
    }

    let mine = html(
        browse(&app, "/me/orders", Some(&buyers[0])).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(mine.matches(r#"<tr class="is-pending">"#).count(), 1);
    assert!(mine.contains(&format!(r#"href="/sales/{sale}""#)));
    let other = html(
        browse(&app, "/me/orders", Some(&admin)).await,
        StatusCode::OK,
    )
    .await;
    assert!(!other.contains("is-pending"), "the admin bought nothing");
}

#[tokio::test]
async fn tallies_page_shows_live_and_settled_votes_for_admins_only() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, options) = app
        .create_poll(&admin, "Tea <or> coffee?", &["Tea", "Coffee"], -60, 3600)
        .await;
    let voters = app.create_users(3, false).await;
    for (i, voter) in voters.iter().enumerate() {
        let resp = app
            .post_json(
                &format!("/api/polls/{poll}/votes"),
                Some(&voter.token),
                &serde_json::json!({ "option_id": options[usize::from(i > 0)] }),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
    }
    let path = format!("/admin/polls/{poll}");
    let denied = browse(&app, &path, Some(&voters[0])).await;
    assert_eq!(denied.status(), StatusCode::FORBIDDEN);

    // Settled counts catch up with the live ones once the worker has run.
    let mut body = String::new();
    for _ in 0..100 {
        body = html(browse(&app, &path, Some(&admin)).await, StatusCode::OK).await;
        if body.contains(r#"data-field="settled-voters">3<"#) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(body.contains(r#"data-field="live-voters">3<"#));
    assert!(body.contains(r#"data-field="settled-voters">3<"#));
    assert!(escaped_in(&body, "Tea <or> coffee?"));
    let row = |label: &str, live: i64, share: i64| {
        format!(
            r#"<td data-label="Option" class="cell-title">{label}</td>
          <td data-label="Live" class="num">{live}</td>
          <td data-label="Share" class="num">{share}%</td>
          <td data-label="Settled" class="num">{live}</td>
          <td data-label="Not yet settled" class="num">0</td>"#
        )
    };
    assert!(body.contains(&row("Tea", 1, 33)), "{body}");
    assert!(body.contains(&row("Coffee", 2, 67)));
}

#[tokio::test]
async fn signed_out_sale_page_offers_sign_in_to_buy_and_keeps_the_way_back() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app.create_sale(&admin, 1_234_567, -60, 3600).await;
    let body = html(
        browse(&app, &format!("/sales/{sale}"), None).await,
        StatusCode::OK,
    )
    .await;
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
    let signed_in = html(
        browse(&app, &format!("/sales/{sale}"), Some(&user)).await,
        StatusCode::OK,
    )
    .await;
    assert!(signed_in.contains(r#"data-field="signin-buy" hidden>"#));
    assert!(signed_in.contains(r#"data-action="buy" disabled>Buy now<"#));
}
