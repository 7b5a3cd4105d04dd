//! The admin as a sale-day console: `/admin` opens on the live and upcoming sales
//! (sold, left, revenue paid, the line, Open now / Close / Top up) with the forms
//! behind buttons, `GET /api/admin/console` keeps it current, and a sale's own
//! admin page has the same buttons and its Rehearsal badge.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    TestApp, User, assert_contains, assert_error, between, escaped_in, spawn_app,
};

/// The console's row of `sale` on `/admin` (the table's row has another marker).
fn console_row(page: &str, sale: i64) -> &str {
    between(page, &format!(r#"<tr data-console-sale="{sale}""#), "</tr>")
}

fn console_sale(console: &Value, group: &str, sale: i64) -> Value {
    console[group]
        .as_array()
        .unwrap_or_else(|| panic!("{console}"))
        .iter()
        .find(|s| s["id"] == sale)
        .unwrap_or_else(|| panic!("sale {sale} not in {group}: {console}"))
        .clone()
}

/// A live sale with 2 paid units and 1 awaiting payment (price $5.00), an upcoming
/// sale with a waiting room, a closed sale and a rehearsal: their ids.
async fn sale_day(app: &TestApp, admin: &User) -> (i64, i64, i64, i64) {
    let live = app.payment_sale(admin, 10, 600, false).await;
    let buyers = app.create_users(3, false).await;
    let orders = app.buy_all(live, &buyers).await;
    app.wait_for_orders(live, 3).await;
    for (i, buyer) in buyers.iter().take(2).enumerate() {
        let resp = app.pay(buyer, orders[&buyer.id], &format!("pay-{i}")).await;
        assert_eq!(resp.status(), StatusCode::OK);
    }
    let now = chrono::Utc::now();
    let upcoming = app
        .admin_create(
            admin,
            "/api/admin/sales",
            &json!({
                "name": "Opens <soon> & fast",
                "price_cents": 2500,
                "stock": 50,
                "starts_at": now + chrono::Duration::hours(1),
                "ends_at": now + chrono::Duration::hours(2),
                "waiting_room": true,
                "queue_opens_at": now + chrono::Duration::minutes(10),
                "admit_per_second": 5,
            }),
        )
        .await["id"]
        .as_i64()
        .unwrap();
    let closed = app
        .live_sale_with(admin, 5, json!({"name": "Closed one"}))
        .await;
    assert_eq!(app.close_sale(admin, closed).await.status(), StatusCode::OK);
    let rehearsal = app
        .live_sale_with(admin, 5, json!({"name": "Storm", "rehearsal": true}))
        .await;
    (live, upcoming, closed, rehearsal)
}

#[tokio::test]
async fn the_admin_page_opens_on_the_sale_day_console_with_the_forms_behind_buttons() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (live, upcoming, closed, rehearsal) = sale_day(&app, &admin).await;
    let page = app.html("/admin", Some(&admin)).await;

    // The console comes first; the forms wait behind their buttons.
    let at = |marker: &str| page.find(marker).unwrap_or_else(|| panic!("{marker}"));
    assert!(at(r#"id="console-heading""#) < at(r#"id="sales-heading""#));
    assert!(at(r#"id="console-heading""#) < at(r#"data-form="create-sale""#));
    for (button, form) in [("New sale", "create-sale"), ("New poll", "create-poll")] {
        let summary = format!(r#"<summary class="btn btn-small">{button}</summary>"#);
        let details = page[..at(&format!(r#"data-form="{form}""#))]
            .rfind("<details")
            .unwrap_or_else(|| panic!("{form} is in no <details>"));
        assert!(page[details..].starts_with(r#"<details class="new-form""#));
        assert!(
            !page[details..details + 80].contains(" open"),
            "{form} starts closed"
        );
        assert!(page[details..at(&format!(r#"data-form="{form}""#))].contains(&summary));
    }

    // Live and upcoming sales, each with its numbers, money, line and buttons.
    let row = console_row(&page, live);
    assert!(row.contains(r#"data-field="sold">3<"#), "{row}");
    assert!(row.contains(r#"data-field="stock-left">7<"#), "{row}");
    assert!(row.contains(r#"data-field="revenue">$10.00<"#), "{row}");
    assert!(row.contains(r#"data-line-state="">No line<"#), "{row}");
    assert!(row.contains(r#"data-action="add-stock">Top up<"#), "{row}");
    assert!(row.contains(r#"data-action="close">Close<"#), "{row}");
    assert!(row.contains(r#"data-action="open" hidden>"#), "{row}");
    let row = console_row(&page, upcoming);
    assert!(escaped_in(row, "Opens <soon> & fast"), "escaped: {row}");
    assert!(
        row.contains(r#"data-line-state="not_open">Not open yet<"#),
        "{row}"
    );
    assert!(row.contains(r#"data-action="open">Open now<"#), "{row}");
    assert!(row.contains(r#"data-field="revenue">$0.00<"#), "{row}");
    // A waiting room's line can be paused from the console; a plain sale has no such button.
    let line_buttons = [
        r#"data-line-action="pause">Pause line"#,
        r#"data-line-action="resume" hidden>"#,
    ];
    assert_contains(row, &line_buttons, &[], row);
    assert!(console_row(&page, live).contains(r#"data-line-action="pause" hidden>"#));
    let resp = app
        .post_json(
            &format!("/api/admin/sales/{upcoming}/line"),
            Some(&admin.token),
            &json!({"action": "pause"}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let paused = app.html("/admin", Some(&admin)).await;
    let row = console_row(&paused, upcoming);
    assert!(row.contains(r#"data-line-action="pause" hidden>"#), "{row}");
    assert!(
        row.contains(r#"data-line-action="resume">Resume line"#),
        "{row}"
    );
    let row = console_row(&page, rehearsal);
    assert!(
        row.contains(r#"data-field="rehearsal" title="#) && !row.contains("hidden>Rehearsal"),
        "{row}"
    );
    assert!(
        !page.contains(&format!(r#"data-console-sale="{closed}""#)),
        "a closed sale is not on the console"
    );
    assert!(page.contains(r#"data-field="console-empty" hidden"#));
}

#[tokio::test]
async fn the_console_api_counts_revenue_as_the_orders_totals_do() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (live, upcoming, closed, _) = sale_day(&app, &admin).await;
    let console = app.get_json("/api/admin/console", Some(&admin.token)).await;

    let sale = console_sale(&console, "live", live);
    let totals = app
        .get_json(
            &format!("/api/admin/sales/{live}/orders"),
            Some(&admin.token),
        )
        .await["totals"]
        .clone();
    assert_eq!(
        sale["revenue_paid_cents"], totals["revenue_paid_cents"],
        "{console}"
    );
    assert_eq!(
        sale["revenue_awaiting_cents"],
        totals["revenue_awaiting_cents"]
    );
    assert_eq!(sale["revenue_paid_cents"], 1000);
    assert_eq!(sale["revenue_awaiting_cents"], 500);
    assert_eq!(sale["sold"], 3);
    assert!(
        sale.get("line_state").is_none(),
        "no waiting room, no line: {sale}"
    );
    let sale = console_sale(&console, "upcoming", upcoming);
    assert_eq!(sale["line_state"], "not_open");
    assert_eq!(sale["line"]["waiting"], 0);
    for group in ["live", "upcoming"] {
        assert!(
            !console[group]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["id"] == closed)
        );
    }
    assert_eq!(console["more_live"], false);

    let shopper = app.user().await;
    assert_error(
        app.get("/api/admin/console", None).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    assert_error(
        app.get("/api/admin/console", Some(&shopper.token)).await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
}

#[tokio::test]
async fn a_sales_admin_page_has_open_close_top_up_and_its_rehearsal_badge() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (live, upcoming, closed, rehearsal) = sale_day(&app, &admin).await;
    let controls =
        |page: &str| between(page, r#"data-field="sale-controls""#, "</div>\n").to_string();

    let page = app
        .html(&format!("/admin/sales/{live}"), Some(&admin))
        .await;
    let c = controls(&page);
    assert!(c.contains(r#"data-action="add-stock">Top up<"#), "{c}");
    assert!(c.contains(r#"data-action="close">Close<"#), "{c}");
    assert!(c.contains(r#"data-action="open" hidden>"#), "{c}");
    assert!(
        !page.contains(">Rehearsal</span>"),
        "a real sale has no Rehearsal badge"
    );
    assert!(page.contains(r#"<span data-field="sold">3</span>"#));

    let page = app
        .html(&format!("/admin/sales/{upcoming}"), Some(&admin))
        .await;
    assert!(controls(&page).contains(r#"data-action="open">Open now<"#));
    let page = app
        .html(&format!("/admin/sales/{closed}"), Some(&admin))
        .await;
    let c = controls(&page);
    assert!(
        c.contains(r#"data-action="open">Reopen now<"#)
            && c.contains(r#"data-action="close" hidden>"#),
        "{c}"
    );

    let page = app
        .html(&format!("/admin/sales/{rehearsal}"), Some(&admin))
        .await;
    let status = between(&page, "<dt>Status</dt>", "</div>");
    assert!(
        status.contains(r#"class="badge badge-rehearsal" data-field="rehearsal""#),
        "{status}"
    );
    assert!(status.contains(">Rehearsal</span>"), "{status}");
}

/// An archived sale that is still live keeps selling by link: it stays on the
/// sale-day console (API and page), marked Archived (it dropped off both, its
/// units and revenue with it); the lists' filters are as they were.
#[tokio::test]
async fn an_archived_live_sale_stays_on_the_console_marked() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 5).await;
    let resp = app
        .post(
            &format!("/api/admin/sales/{sale}/archive"),
            Some(&admin.token),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    app.buy(sale, &app.user().await.token).await;
    let console = app.get_json("/api/admin/console", Some(&admin.token)).await;
    let row = console_sale(&console, "live", sale);
    assert!(row["archived_at"].is_string(), "{row}");
    let all = app.get_json("/api/admin/sales", Some(&admin.token)).await;
    assert!(
        !all.as_array().unwrap().iter().any(|s| s["id"] == sale),
        "the default list is of sales not archived: {all}"
    );
    let page = app.html("/admin", Some(&admin)).await;
    let row = console_row(&page, sale);
    assert!(
        row.contains(r#"data-field="archived" title="Archived: off the public lists, still selling by link">Archived<"#),
        "{row}"
    );
}
