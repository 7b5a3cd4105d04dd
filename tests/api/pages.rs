//! Browser pages: they render, escape user text, guard the admin page, answer bad
//! addresses with HTML error pages and carry the security headers.

use reqwest::{StatusCode, header};
use serde_json::json;

use crate::helpers::{
    Db, TestApp, User, assert_page_is_locked_down, between, escaped_in, spawn_app, spawn_app_with,
    spawn_with_live_sale,
};

async fn create_named_sale(app: &TestApp, admin: &User, name: &str, description: &str) -> i64 {
    let now = chrono::Utc::now();
    let sale = json!({
        "name": name,
        "description": description,
        "price_cents": 123_456,
        "stock": 7,
        "starts_at": now - chrono::Duration::minutes(1),
        "ends_at": now + chrono::Duration::hours(1),
    });
    app.admin_create(admin, "/api/admin/sales", &sale).await["id"]
        .as_i64()
        .unwrap()
}

#[tokio::test]
async fn home_lists_sales_with_status_price_and_stock() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let live = create_named_sale(&app, &admin, "Blue kettle", "").await;
    let upcoming = app.create_sale(&admin, 10, 3600, 7200).await;

    let body = app.html("/", None).await;
    assert!(body.contains("Blue kettle"));
    assert!(body.contains(&format!(r#"href="/sales/{live}""#)));
    assert!(body.contains(&format!(r#"href="/sales/{upcoming}""#)));
    assert!(body.contains("$1,234.56"), "price formatted");
    assert!(body.contains(
        r#"<strong data-field="stock-left">7</strong> of <span data-field="stock-total">7</span> left"#
    ));
    assert!(body.contains(r#"badge-live" data-field="badge">Live<"#));
    assert!(body.contains(r#"badge-upcoming" data-field="badge">Upcoming<"#));
    assert!(
        body.contains(r#"href="/signin" data-keep-next"#),
        "signed-out header"
    );
}

#[tokio::test]
async fn home_shows_buyable_sales_before_closed_ones() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let live = app.create_sale(&admin, 5, -120, 3600).await;
    // Starts later, so the store lists it first.
    let closed = app.create_sale(&admin, 5, -60, 3600).await;
    let resp = app.close_sale(&admin, closed).await;
    assert_eq!(resp.status(), StatusCode::OK);

    let body = app.html("/", None).await;
    let at = |id: i64| body.find(&format!(r#"href="/sales/{id}""#)).unwrap();
    assert!(at(live) < at(closed), "live sale listed first");
    assert!(body.contains(r#"badge-closed" data-field="badge">Closed<"#));
}

#[tokio::test]
async fn home_lists_upcoming_sales_soonest_opening_first() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    // Created out of order of their openings: in two hours, three, one, four.
    let in_2h = app.create_sale(&admin, 5, 2 * 3600, 9 * 3600).await;
    let in_3h = app.create_sale(&admin, 5, 3 * 3600, 5 * 3600).await;
    let in_1h = app.create_sale(&admin, 5, 3600, 10 * 3600).await;
    let in_4h = app.create_sale(&admin, 5, 4 * 3600, 8 * 3600).await;
    let live = app.live_sale(&admin, 5).await;
    let sold_out = app.create_sale(&admin, 0, -120, 3600).await;

    let body = app.html("/", None).await;
    let at = |id: i64| {
        body.find(&format!(r#"href="/sales/{id}""#))
            .unwrap_or_else(|| panic!("sale {id} listed"))
    };
    let shown = [live, in_1h, in_2h, in_3h, in_4h, sold_out];
    let positions: Vec<usize> = shown.iter().map(|&id| at(id)).collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "live first, then upcoming by opening (1 h, 2 h, 3 h, 4 h), then sold out: {positions:?}"
    );
    assert_eq!(
        body.matches(r#"badge-upcoming" data-field="badge">Upcoming<"#)
            .count(),
        4
    );
}

#[tokio::test]
async fn header_names_the_signed_in_user() {
    let app = spawn_app().await;
    let user = app.user().await;
    let name = app.username_of(&user).await;

    let body = app.html("/", Some(&user)).await;
    // The words for screen readers (and wide screens), the name on every screen.
    assert!(body.contains(&format!(
        r#"<span class="who-label">Signed in as </span><strong title="Signed in as {name}">{name}</strong>"#
    )));
    assert!(body.contains("Sign out"));
    assert!(
        !body.contains(r#"href="/admin""#),
        "no admin link for a shopper"
    );

    // A bad or foreign token is simply signed out, never an error page.
    let mut forged = app.user().await;
    forged.token = "not.a.token".into();
    let body = app.html("/", Some(&forged)).await;
    assert!(body.contains(r#"href="/signin""#));
}

#[tokio::test]
async fn sale_page_carries_what_the_script_needs() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = create_named_sale(&app, &admin, "Red bike", "Fast.\nLight.").await;

    let body = app.html(&format!("/sales/{sale}"), None).await;
    assert!(body.contains(r#"<h1 data-field="name">Red bike</h1>"#));
    assert!(body.contains("Fast.\nLight."));
    assert!(body.contains("$1,234.56"));
    assert!(body.contains(&format!(r#"data-sale-id="{sale}""#)));
    assert!(body.contains(r#"data-status="live""#));
    assert!(body.contains(r#"data-signed-in="false""#));
    assert!(body.contains(r#"data-bought="false""#));
    assert!(body.contains(&format!(r#"href="/signin?next=%2Fsales%2F{sale}""#)));
    let server_now: i64 = between(&body, r#"data-server-now=""#, "\"")
        .parse()
        .unwrap();
    let skew = (server_now - chrono::Utc::now().timestamp_millis()).abs();
    assert!(skew < 60_000, "server time embedded in ms: {server_now}");
    assert!(body.contains(r#"data-action="buy""#));
}

#[tokio::test]
async fn sale_page_knows_the_buyer_already_bought() {
    let (app, _, sale) = spawn_with_live_sale(5).await;
    let user = app.user().await;

    let before = app.html(&format!("/sales/{sale}"), Some(&user)).await;
    assert!(before.contains(r#"data-signed-in="true""#));
    assert!(before.contains(r#"data-bought="false""#));

    app.buy(sale, &user.token).await;
    let after = app.html(&format!("/sales/{sale}"), Some(&user)).await;
    assert!(after.contains(r#"data-bought="true""#));
    assert!(after.contains("<strong data-field=\"stock-left\">4</strong>"));
}

#[tokio::test]
async fn user_text_is_escaped_on_every_page() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let name = "<script>alert(1)</script>";
    let description = r#""><img src=x onerror=alert(2)>"#;
    let sale = create_named_sale(&app, &admin, name, description).await;

    for path in ["/".to_string(), format!("/sales/{sale}"), "/admin".into()] {
        let body = app.html(&path, Some(&admin)).await;
        assert!(escaped_in(&body, name), "{path}: name not escaped");
        assert!(!body.contains("<script>alert"), "{path}: raw script tag");
        assert!(!body.contains("<img src=x"), "{path}: raw img tag");
    }
    let sale_page = app.html(&format!("/sales/{sale}"), None).await;
    assert!(escaped_in(&sale_page, description));
}

#[tokio::test]
async fn bad_or_unknown_sale_ids_get_an_html_404() {
    spawn_app()
        .await
        .assert_bad_ids_get_an_html_404("sales")
        .await;
}

#[tokio::test]
async fn admin_page_is_for_admins_only() {
    let app = spawn_app().await;

    let anonymous = app.browse("/admin", None).await;
    assert_eq!(anonymous.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        anonymous.headers()[header::LOCATION],
        "/signin?next=%2Fadmin"
    );

    let user = app.user().await;
    let body = app
        .html_status("/admin", Some(&user), StatusCode::FORBIDDEN)
        .await;
    assert!(body.contains("Not allowed"));
    assert!(!body.contains("New sale"));

    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 3).await;
    let body = app.html("/admin", Some(&admin)).await;
    assert!(body.contains("New sale"));
    assert!(body.contains(&format!(r#"<tr data-sale-id="{sale}" data-ends-at="#)));
    assert!(body.contains(r#"data-action="set-stock""#));
    assert!(
        body.contains(r#"href="/admin""#),
        "admin link in the header"
    );
}

#[tokio::test]
async fn my_orders_needs_a_session() {
    let app = spawn_app().await;
    let anonymous = app.browse("/me/orders", None).await;
    assert_eq!(anonymous.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        anonymous.headers()[header::LOCATION],
        "/signin?next=%2Fme%2Forders"
    );
    let user = app.user().await;
    let body = app.html("/me/orders", Some(&user)).await;
    assert!(body.contains("<h1>My orders</h1>"));
}

#[tokio::test]
async fn sign_in_and_sign_up_pages_have_labelled_forms() {
    let app = spawn_app().await;
    for (path, form) in [("/signin", "signin"), ("/signup", "signup")] {
        let body = app.html(path, None).await;
        assert!(body.contains(&format!(r#"data-auth-form="{form}""#)));
        assert!(body.contains(r#"<label for="username">"#));
        assert!(body.contains(r#"<label for="password">"#));
        assert!(
            body.contains(r#"method="post""#),
            "never GET: the password must not land in a URL"
        );
    }
}

#[tokio::test]
async fn pages_and_error_pages_carry_security_headers() {
    let app = spawn_app().await;
    let user = app.user().await;
    for (path, session, status) in [
        ("/", None, StatusCode::OK),
        ("/signin", None, StatusCode::OK),
        ("/sales/abc", None, StatusCode::NOT_FOUND),
        ("/admin", Some(&user), StatusCode::FORBIDDEN),
        ("/no-such-page", None, StatusCode::NOT_FOUND),
    ] {
        let resp = app.browse(path, session).await;
        assert_eq!(resp.status(), status, "{path}");
        let h = assert_page_is_locked_down(resp, path).await;
        let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(csp.contains("default-src 'self'"), "{path}: {csp}");
    }
}

#[tokio::test]
async fn unknown_paths_answer_html_to_browsers_and_json_to_clients() {
    let app = spawn_app().await;
    let body = app
        .html_status("/no-such-page", None, StatusCode::NOT_FOUND)
        .await;
    assert!(body.contains("Page not found"));

    // API clients keep their JSON, even when they accept HTML.
    for resp in [
        app.browse("/api/no-such-route", None).await,
        app.get("/no-such-page", None).await,
    ] {
        crate::helpers::assert_error(resp, StatusCode::NOT_FOUND, "not_found").await;
    }
}

#[tokio::test]
async fn static_files_are_served_with_nosniff() {
    let app = spawn_app().await;
    for (path, kind) in [
        ("/static/app.js", "javascript"),
        ("/static/app.css", "text/css"),
    ] {
        let resp = app.get(path, None).await;
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let content_type = resp.headers()[header::CONTENT_TYPE].to_str().unwrap();
        assert!(content_type.contains(kind), "{path}: {content_type}");
        assert_eq!(resp.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    }
    assert_eq!(
        app.get("/static/nope.js", None).await.status(),
        StatusCode::NOT_FOUND
    );
}

/// `?next=` on the sign-in and sign-up pages must be a path on this site. The known
/// ways past a naive check (tab, newline, carriage return, backslash, `//`, encoded
/// slashes) get a 303 to the bare page; a local path gets the page.
#[tokio::test(flavor = "multi_thread")]
async fn signin_pages_refuse_a_next_that_leaves_the_site() {
    let app = spawn_app().await;
    for page in ["/signin", "/signup"] {
        for bad in [
            "/%09/evil.example",
            "/%0A/evil.example",
            "/%0D/evil.example",
            "/%09%5Cevil.example",
            "/%5Cevil.example",
            "%2F%2Fevil.example",
            "//evil.example",
            "/\\evil.example",
            "https://evil.example/",
            "evil.example",
            "%FF",
        ] {
            let resp = app.get(&format!("{page}?next={bad}"), None).await;
            assert_eq!(resp.status(), StatusCode::SEE_OTHER, "{page}?next={bad}");
            assert_eq!(resp.headers()["location"], page, "{page}?next={bad}");
        }
        for good in ["%2Fsales%2F1", "/polls/2", "/%252F%252Fevil.example"] {
            let resp = app.get(&format!("{page}?next={good}"), None).await;
            assert_eq!(resp.status(), StatusCode::OK, "{page}?next={good}");
        }
        assert_eq!(app.get(page, None).await.status(), StatusCode::OK);
    }
}

/// A sale open now for an hour, without tickets, whose buyers have `window_s`
/// seconds to pay.
async fn payment_sale(app: &TestApp, admin: &User, name: &str, window_s: i64) -> i64 {
    let now = chrono::Utc::now();
    let sale = json!({
        "name": name,
        "price_cents": 49_900,
        "stock": 5,
        "starts_at": now - chrono::Duration::seconds(60),
        "ends_at": now + chrono::Duration::seconds(3600),
        "requires_ticket": false,
        "payment_window_s": window_s,
    });
    let created = app.admin_create(admin, "/api/admin/sales", &sale).await;
    assert_eq!(created["payment_window_s"], window_s);
    created["id"].as_i64().unwrap()
}

/// Buys in the sale and waits for the order to settle; returns its id.
async fn settled_order(app: &TestApp, sale: i64, buyer: &User) -> uuid::Uuid {
    app.buy(sale, &buyer.token).await;
    let orders = app.wait_for_orders(sale, 1).await;
    orders
        .iter()
        .find(|(_, user)| *user == buyer.id)
        .expect("the order settled")
        .0
}

/// The `<tr>` of an order on My orders, up to its end.
fn order_row(body: &str, order: uuid::Uuid) -> &str {
    between(body, &format!(r#"<tr data-order-id="{order}""#), "</tr>")
}

#[tokio::test(flavor = "multi_thread")]
async fn my_orders_shows_a_second_purchase_pending_beside_a_settled_one() {
    let app = spawn_app_with(|c| c.settle_in_serve = false).await;
    let admin = app.admin().await;
    let sale = app
        .live_sale_with(&admin, 10, json!({"max_per_user": 3}))
        .await;
    let buyer = app.user().await;
    let path = format!("/api/sales/{sale}/purchase");
    let two = json!({"quantity": 2});
    assert_eq!(
        app.post_json(&path, Some(&buyer.token), &two)
            .await
            .status(),
        StatusCode::ACCEPTED
    );
    let mut settler = crate::settle::settler(&app, "w1", 10, std::time::Duration::ZERO).await;
    settler.drain().await.unwrap();
    // A second purchase, not settled yet: its unit shows as pending.
    let one = json!({"quantity": 1});
    assert_eq!(
        app.post_json(&path, Some(&buyer.token), &one)
            .await
            .status(),
        StatusCode::ACCEPTED
    );
    let body = app.html("/me/orders", Some(&buyer)).await;
    assert_eq!(
        body.matches(r#"badge-pending">Pending<"#).count(),
        1,
        "{body}"
    );
    assert_eq!(body.matches("<tr data-order-id=").count(), 1, "{body}");
    // Once it settles, nothing is pending.
    settler.drain().await.unwrap();
    let body = app.html("/me/orders", Some(&buyer)).await;
    assert_eq!(
        body.matches(r#"badge-pending">Pending<"#).count(),
        0,
        "{body}"
    );
    assert_eq!(body.matches("<tr data-order-id=").count(), 2, "{body}");
}

#[tokio::test]
async fn my_orders_shows_an_awaiting_order_with_its_deadline_and_a_pay_button() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let name = "Phone & <case>";
    let sale = payment_sale(&app, &admin, name, 600).await;
    let buyer = app.user().await;
    let order = settled_order(&app, sale, &buyer).await;
    let pay_by: chrono::DateTime<chrono::Utc> = app
        .scalar("SELECT pay_by FROM orders WHERE id = $1", order)
        .await;
    let iso = pay_by.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);

    let body = app.html("/me/orders", Some(&buyer)).await;
    let row = order_row(&body, order);
    assert!(row.contains(r#"data-payment="awaiting_payment""#), "{row}");
    // The countdown's deadline for the script, and the deadline as a time.
    assert!(row.contains(&format!(r#"data-pay-by="{iso}""#)), "{row}");
    assert!(
        row.contains(&format!(r#"<time datetime="{iso}" data-local"#)),
        "{row}"
    );
    assert!(
        row.contains(r#"badge-awaiting">Awaiting payment<"#),
        "{row}"
    );
    // A countdown that starts at the time left (10 minutes at most).
    let left = between(row, r#"data-field="pay-left">"#, "</strong>");
    assert!(
        left.len() == 5 && ("09:00".."10:01").contains(&left),
        "time left {left:?}"
    );
    // One Pay button, named for the sale (escaped) for screen readers.
    assert_eq!(row.matches(r#"data-action="pay""#).count(), 1, "{row}");
    let button = between(row, r#"data-action="pay">"#, "</button>");
    assert!(
        button.contains(r#"data-field="pay-label">Pay</span>"#),
        "{button}"
    );
    assert!(escaped_in(button, &format!(" for {name}")), "{button}");
    assert!(
        !body.contains(name),
        "the sale's name is escaped everywhere"
    );
    assert!(body.contains("Some sales ask you to pay within a time limit"));
    assert!(body.contains(r#"data-server-now=""#));

    // A sale without a payment step: Confirmed, nothing to pay, no deadline talk.
    let plain = app.live_sale(&admin, 5).await;
    let other = app.user().await;
    let plain_order = settled_order(&app, plain, &other).await;
    let body = app.html("/me/orders", Some(&other)).await;
    let row = order_row(&body, plain_order);
    assert!(row.contains(r#"data-payment="none""#), "{row}");
    assert!(row.contains(r#"badge-confirmed">Confirmed<"#), "{row}");
    assert!(!body.contains(r#"data-action="pay""#));
    assert!(!body.contains("data-pay-by"));
    assert!(!body.contains("Some sales ask you to pay"));
}

#[tokio::test]
async fn my_orders_shows_paid_and_expired_orders_without_a_pay_button() {
    // The test runs the expiry pass itself.
    let app = spawn_app_with(|c| c.expire = std::time::Duration::ZERO).await;
    let admin = app.admin().await;
    let buyer = app.user().await;
    let paid_sale = payment_sale(&app, &admin, "Paid phone", 600).await;
    let expired_sale = payment_sale(&app, &admin, "Expired phone", 600).await;
    let overdue_sale = payment_sale(&app, &admin, "Overdue phone", 600).await;
    let paid = settled_order(&app, paid_sale, &buyer).await;
    let expired = settled_order(&app, expired_sale, &buyer).await;
    let overdue = settled_order(&app, overdue_sale, &buyer).await;

    let resp = app.pay(&buyer, paid, "pages-test-key").await;
    assert_eq!(resp.status(), StatusCode::OK);
    let paid_at: chrono::DateTime<chrono::Utc> = app
        .scalar("SELECT paid_at FROM orders WHERE id = $1", paid)
        .await;
    // Both deadlines pass: one order as the expiry job leaves it, one before the
    // job got to it.
    sqlx::query("UPDATE orders SET pay_by = now() - interval '1 second' WHERE id = ANY($1)")
        .bind([expired, overdue])
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query("UPDATE orders SET status = 'expired', expired_at = now() WHERE id = $1")
        .bind(expired)
        .execute(&app.db)
        .await
        .unwrap();

    let body = app.html("/me/orders", Some(&buyer)).await;
    let row = order_row(&body, paid);
    assert!(row.contains(r#"data-payment="paid""#), "{row}");
    assert!(row.contains(r#"badge-paid">Paid<"#), "{row}");
    let at = paid_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert!(
        row.contains(&format!(r#"Paid <time datetime="{at}""#)),
        "{row}"
    );
    // Expired by the job, or past its deadline before the job ran: the same to
    // the buyer, since a payment would be refused either way.
    for order in [expired, overdue] {
        let row = order_row(&body, order);
        assert!(row.contains(r#"data-payment="expired""#), "{row}");
        assert!(row.contains(r#"badge-expired">Expired<"#), "{row}");
        assert!(
            row.contains("Not paid in time; the unit went back on sale."),
            "{row}"
        );
        assert!(!row.contains("data-pay-by"), "{row}");
    }
    assert!(
        !body.contains(r#"data-action="pay""#),
        "nothing left to pay"
    );
    assert!(!body.contains("badge-awaiting"));
    assert!(!body.contains("is-pending"));
}

/// The sale page's `<select>` of quantities, up to its end.
fn quantity_control(body: &str) -> Option<&str> {
    body.find(r#"<select id="buy-quantity""#)
        .map(|at| between(&body[at..], "<select", "</select>"))
}

#[tokio::test]
async fn sale_page_offers_a_quantity_only_when_a_buyer_may_take_several() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let user = app.user().await;
    let several = app
        .live_sale_with(&admin, 10, json!({"max_per_user": 3}))
        .await;
    let one = app
        .live_sale_with(&admin, 10, json!({"max_per_user": 1}))
        .await;

    let body = app.html(&format!("/sales/{several}"), Some(&user)).await;
    assert!(
        body.contains(r#"<label for="buy-quantity">Quantity</label>"#),
        "a labelled control"
    );
    let select = quantity_control(&body).expect("a quantity control");
    let values: Vec<&str> = select
        .split(r#"<option value=""#)
        .skip(1)
        .map(|o| &o[..o.find('"').unwrap()])
        .collect();
    assert_eq!(values, ["1", "2", "3"], "{select}");
    assert!(body.contains(r#"data-max-per-user="3""#));
    assert!(body.contains(r#"data-held="0""#));
    assert!(body.contains(r#"id="buy-limit">Up to 3 per customer</p>"#));
    assert!(body.contains("<dt>Limit</dt><dd>Up to 3 per customer</dd>"));
    assert!(!body.contains("One per customer"));

    // One unit held of three: the buyer may still buy, and the page knows it.
    let resp = app
        .post_json(
            &format!("/api/sales/{several}/purchase"),
            Some(&user.token),
            &json!({"quantity": 1}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let body = app.html(&format!("/sales/{several}"), Some(&user)).await;
    assert!(body.contains(r#"data-bought="false""#));
    assert!(body.contains(r#"data-held="1""#));
    // All three held: nothing more to buy.
    let resp = app
        .post_json(
            &format!("/api/sales/{several}/purchase"),
            Some(&user.token),
            &json!({"quantity": 2}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let body = app.html(&format!("/sales/{several}"), Some(&user)).await;
    assert!(body.contains(r#"data-bought="true""#));
    assert!(body.contains(r#"data-held="3""#));

    // One per customer: the page as it always was.
    let body = app.html(&format!("/sales/{one}"), Some(&user)).await;
    assert!(quantity_control(&body).is_none(), "no quantity control");
    assert!(!body.contains("Quantity"));
    assert!(!body.contains("data-max-per-user"));
    assert!(!body.contains("data-held"));
    assert!(body.contains(r#"<p class="buy-limit">One per customer</p>"#));
    assert!(body.contains("<dt>Limit</dt><dd>One per customer</dd>"));
}

#[tokio::test]
async fn my_orders_shows_how_many_units_an_order_has() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let buyer = app.user().await;
    let sale = app
        .live_sale_with(&admin, 10, json!({"max_per_user": 3, "name": "Earbuds"}))
        .await;
    let resp = app
        .post_json(
            &format!("/api/sales/{sale}/purchase"),
            Some(&buyer.token),
            &json!({"quantity": 2}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let order = app.wait_for_orders(sale, 1).await[0].0;

    let body = app.html("/me/orders", Some(&buyer)).await;
    let row = order_row(&body, order);
    assert!(row.contains(r#"data-quantity="2""#), "{row}");
    assert!(
        row.contains(
            r#"<span class="order-qty">2<span aria-hidden="true"> ×</span><span class="visually-hidden"> units of</span></span> <a href"#
        ),
        "{row}"
    );
    // The price of both units ($5.00 each).
    assert!(
        row.contains(r#"<td data-label="Price">$10.00</td>"#),
        "{row}"
    );

    // An order of one unit shows no quantity.
    let single = app.live_sale(&admin, 5).await;
    let other = app.user().await;
    let one = settled_order(&app, single, &other).await;
    let body = app.html("/me/orders", Some(&other)).await;
    let row = order_row(&body, one);
    assert!(!row.contains("order-qty"), "{row}");
    assert!(!row.contains("data-quantity"), "{row}");
}
