//! Paged lists: `GET /api/sales`, `/api/polls` and their admin twins answer a page
//! (`limit`, default 50, 1 to 200) as a JSON array and name the next one in `Link`
//! and `X-Next-Cursor`; a walk through the pages sees every item once, in the
//! documented order, even when the clock moves a sale to another group meanwhile.
//! The home page, the polls page and the admin page show a bounded page with a
//! link to the next.

use std::collections::HashSet;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use reqwest::{StatusCode, header};
use serde_json::Value;

use crate::helpers::{TestApp, User, assert_error, between, spawn_app, spawn_with_live_sale};

/// One page: the items, the `X-Next-Cursor` and the `Link` header.
struct ApiPage {
    items: Vec<Value>,
    cursor: Option<String>,
    link: Option<String>,
}

async fn api_page(app: &TestApp, path: &str, token: Option<&str>) -> ApiPage {
    let resp = app.get(path, token).await;
    assert_eq!(resp.status(), StatusCode::OK, "{path}");
    let text = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let (cursor, link) = (text("x-next-cursor"), text(header::LINK.as_str()));
    let items: Vec<Value> = resp.json().await.expect("a JSON array");
    ApiPage {
        items,
        cursor,
        link,
    }
}

/// Walks a list from its first page (`first`, e.g. `/api/sales?limit=3`) by the
/// `Link` headers; checks that each page's `Link` and `X-Next-Cursor` agree.
/// Returns the ids of each page.
async fn walk(app: &TestApp, first: &str, token: Option<&str>) -> Vec<Vec<i64>> {
    let mut pages = Vec::new();
    let mut next = Some(first.to_string());
    while let Some(path) = next.take() {
        let page = api_page(app, &path, token).await;
        pages.push(
            page.items
                .iter()
                .map(|v| v["id"].as_i64().unwrap())
                .collect(),
        );
        match (page.cursor, page.link) {
            (None, None) => {}
            (Some(cursor), Some(link)) => {
                let target = between(&link, "<", ">; rel=\"next\"");
                assert!(
                    target.ends_with(&format!("&cursor={cursor}")),
                    "{link} names the cursor {cursor}"
                );
                next = Some(target.to_string());
            }
            other => panic!("Link and X-Next-Cursor come together: {other:?}"),
        }
        assert!(pages.len() <= 100, "the walk ends");
    }
    pages
}

fn flat(pages: &[Vec<i64>]) -> Vec<i64> {
    pages.iter().flatten().copied().collect()
}

fn assert_no_repeats(ids: &[i64]) {
    let unique: HashSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "no sale twice: {ids:?}");
}

/// Seven sales of every group: three open, two of them starting in the same
/// microsecond (the id breaks the tie), two upcoming, one ended (moved into the
/// past in Postgres: the API takes no past window), one closed. Returns them in the
/// documented list order.
async fn seven_sales(app: &TestApp, admin: &User) -> Vec<i64> {
    let open_old = app.create_sale(admin, 5, -300, 3600).await;
    let open_tie_a = app.create_sale(admin, 5, -100, 3600).await;
    let open_tie_b = app.create_sale(admin, 0, -90, 3600).await; // sold out: still "open"
    sqlx::query(
        "UPDATE sales SET starts_at = (SELECT starts_at FROM sales WHERE id = $1) WHERE id = $2",
    )
    .bind(open_tie_a)
    .bind(open_tie_b)
    .execute(&app.db)
    .await
    .unwrap();
    let upcoming_late = app.create_sale(admin, 5, 7200, 9000).await;
    let upcoming_soon = app.create_sale(admin, 5, 3600, 9000).await;
    let ended = app.create_sale(admin, 5, -200, 3600).await;
    sqlx::query(
        "UPDATE sales SET starts_at = now() - interval '2 hours', ends_at = now() - interval '1 hour'
         WHERE id = $1",
    )
    .bind(ended)
    .execute(&app.db)
    .await
    .unwrap();
    let closed = app.create_sale(admin, 5, -50, 3600).await;
    assert_eq!(app.close_sale(admin, closed).await.status(), StatusCode::OK);
    vec![
        open_tie_b, // same start as a, higher id first
        open_tie_a,
        open_old,
        upcoming_soon, // upcoming: soonest opening first
        upcoming_late,
        ended,
        closed,
    ]
}

#[tokio::test]
async fn seven_sales_by_3_come_in_pages_of_3_3_1_in_the_list_order() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let expected = seven_sales(&app, &admin).await;

    let pages = walk(&app, "/api/sales?limit=3", None).await;
    assert_eq!(
        pages.iter().map(Vec::len).collect::<Vec<_>>(),
        [3, 3, 1],
        "{pages:?}"
    );
    assert_no_repeats(&flat(&pages));
    assert_eq!(flat(&pages), expected, "every sale once, in the list order");

    // The same walk again gives the same pages; the admin list is the same list.
    assert_eq!(walk(&app, "/api/sales?limit=3", None).await, pages);
    assert_eq!(
        walk(&app, "/api/admin/sales?limit=3", Some(&admin.token)).await,
        pages
    );
    // The default page holds all seven, and there is no next one.
    let all = api_page(&app, "/api/sales", None).await;
    assert_eq!(all.items.len(), 7);
    assert!(all.cursor.is_none() && all.link.is_none());
    let statuses: Vec<&str> = all
        .items
        .iter()
        .map(|v| v["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        [
            "sold_out", "live", "live", "upcoming", "upcoming", "ended", "closed"
        ],
        "live numbers and status as before"
    );
    // A page as big as the rest ends the walk: no cursor to an empty page.
    let rest = walk(&app, "/api/sales?limit=6", None).await;
    assert_eq!(rest.iter().map(Vec::len).collect::<Vec<_>>(), [6, 1]);
}

#[tokio::test]
async fn a_walk_keeps_its_order_when_a_sale_opens_between_two_pages() {
    let (app, admin, live) = spawn_with_live_sale(5).await;
    let opens_soon = app.create_sale(&admin, 5, 2, 3600).await;

    let first = api_page(&app, "/api/sales?limit=1", None).await;
    assert_eq!(first.items[0]["id"], live);
    // Once open, the sale would come first (latest start) and a walk that took the
    // order again would skip it; the cursor keeps the first page's order.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let cursor = first.cursor.expect("a second page");
    let second = api_page(&app, &format!("/api/sales?limit=1&cursor={cursor}"), None).await;
    assert_eq!(second.items.len(), 1);
    assert_eq!(second.items[0]["id"], opens_soon);
    assert_eq!(second.items[0]["status"], "live", "its status is today's");
    assert!(second.cursor.is_none());
}

/// Seven polls: three open, two upcoming, two closed early. Returns them in the
/// documented order (open, upcoming, closed; latest opening first in each).
async fn seven_polls(app: &TestApp, admin: &User) -> Vec<i64> {
    let poll = async |opens_in: i64, closes_in: i64| {
        app.create_poll(admin, "Which?", &["A", "B"], opens_in, closes_in)
            .await
            .0
    };
    let open_old = poll(-300, 3600).await;
    let open_mid = poll(-200, 3600).await;
    let open_new = poll(-100, 3600).await;
    let upcoming_soon = poll(3600, 9000).await;
    let upcoming_late = poll(7200, 9000).await;
    let closed_old = poll(-250, 3600).await;
    let closed_new = poll(-50, 3600).await;
    for id in [closed_old, closed_new] {
        assert_eq!(app.close_poll(admin, id).await.status(), StatusCode::OK);
    }
    vec![
        open_new,
        open_mid,
        open_old,
        upcoming_late,
        upcoming_soon,
        closed_new,
        closed_old,
    ]
}

#[tokio::test]
async fn seven_polls_by_3_come_in_pages_of_3_3_1_in_the_list_order() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let expected = seven_polls(&app, &admin).await;

    let pages = walk(&app, "/api/polls?limit=3", None).await;
    assert_eq!(
        pages.iter().map(Vec::len).collect::<Vec<_>>(),
        [3, 3, 1],
        "{pages:?}"
    );
    assert_no_repeats(&flat(&pages));
    assert_eq!(flat(&pages), expected, "every poll once, in the list order");
    assert_eq!(
        walk(&app, "/api/admin/polls?limit=3", Some(&admin.token)).await,
        pages
    );
    let admin_page = api_page(&app, "/api/admin/polls?limit=3", Some(&admin.token)).await;
    assert_eq!(
        admin_page.items[0]["voters"], 0,
        "admin rows keep their voters"
    );
    let all = api_page(&app, "/api/polls", None).await;
    assert_eq!(all.items.len(), 7);
    assert!(all.cursor.is_none() && all.link.is_none());
}

#[tokio::test]
async fn bad_limits_and_cursors_are_400_with_a_json_body() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    app.live_sale(&admin, 5).await;
    app.live_sale(&admin, 5).await;
    app.open_poll(&admin, "Q?", &["A", "B"]).await;
    app.open_poll(&admin, "R?", &["A", "B"]).await;
    let sale_cursor = api_page(&app, "/api/sales?limit=1", None)
        .await
        .cursor
        .unwrap();
    let poll_cursor = api_page(&app, "/api/polls?limit=1", None)
        .await
        .cursor
        .unwrap();

    let lists = [
        ("/api/sales", &poll_cursor, "s1"),
        ("/api/admin/sales", &poll_cursor, "s1"),
        ("/api/polls", &sale_cursor, "p1"),
        ("/api/admin/polls", &sale_cursor, "p1"),
    ];
    for (list, foreign, tag) in lists {
        // Cursors of the list's own shape whose times Postgres cannot compare
        // (before 4714 BC; past chrono's range): refused, not a failed query.
        let out_of_range = [
            format!("{tag}.-300000000000000000.0.0.1"),
            format!("{tag}.0.0.-210866803200000001.1"),
            format!("{tag}.{}.0.0.1", i64::MAX),
        ]
        .map(|text| URL_SAFE_NO_PAD.encode(text));
        let token = Some(admin.token.as_str());
        for limit in ["0", "201", "-1", "abc", "1.5", "", "99999999999"] {
            let resp = app.get(&format!("{list}?limit={limit}"), token).await;
            assert_error(resp, StatusCode::BAD_REQUEST, "invalid_limit").await;
        }
        let made = out_of_range.iter().map(String::as_str);
        for cursor in ["zzz", "!!", "", foreign.as_str(), &"A".repeat(400)]
            .into_iter()
            .chain(made)
        {
            let resp = app.get(&format!("{list}?cursor={cursor}"), token).await;
            assert_error(resp, StatusCode::BAD_REQUEST, "invalid_query").await;
        }
        for limit in ["1", "200"] {
            let resp = app.get(&format!("{list}?limit={limit}"), token).await;
            assert_eq!(resp.status(), StatusCode::OK, "{list}?limit={limit}");
        }
    }
}

/// The `href` of the link marked `data-field="{field}"`, as the browser reads it.
fn link_of(body: &str, field: &str) -> Option<String> {
    let at = body.find(&format!(r#"data-field="{field}""#))?;
    let tag_start = body[..at].rfind("<a ")?;
    Some(unescape_amp(between(&body[tag_start..], "href=\"", "\"")))
}

/// An attribute's text as the browser reads it (askama writes `&` as `&#38;`).
fn unescape_amp(attr: &str) -> String {
    attr.replace("&#38;", "&").replace("&amp;", "&")
}

fn ids_linked(body: &str, prefix: &str) -> Vec<i64> {
    body.split(&format!(r#"href="{prefix}"#))
        .skip(1)
        .filter_map(|rest| rest.split('"').next()?.parse().ok())
        .collect()
}

#[tokio::test]
async fn home_page_shows_24_sales_and_links_the_next_page() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    for i in 0..30 {
        app.create_sale(&admin, 5, -600 + i, 3600).await;
    }

    let first = app.html("/", None).await;
    let shown = ids_linked(&first, "/sales/");
    assert_eq!(shown.len(), 24, "a bounded page");
    assert!(first.contains(r#"data-list-url="/api/sales?limit=24""#));
    assert!(!first.contains(r#"data-field="first-page""#));
    let more = link_of(&first, "more-sales").expect("a More sales link");
    assert!(more.starts_with("/?cursor="), "{more}");
    assert!(first.contains("More sales"));

    let second = app.html(&more, None).await;
    let rest = ids_linked(&second, "/sales/");
    assert_eq!(rest.len(), 6);
    let all: Vec<i64> = shown.iter().chain(&rest).copied().collect();
    assert_no_repeats(&all);
    assert_eq!(all.len(), 30, "every sale on one of the two pages");
    assert!(link_of(&second, "more-sales").is_none(), "the last page");
    assert_eq!(link_of(&second, "first-page").as_deref(), Some("/"));
    // The script keeps the cards of this page current from the same API page.
    let cursor = more.trim_start_matches("/?cursor=");
    assert_eq!(
        unescape_amp(between(&second, r#"data-list-url=""#, "\"")),
        format!("/api/sales?limit=24&cursor={cursor}")
    );
    let api = api_page(&app, &format!("/api/sales?limit=24&cursor={cursor}"), None).await;
    let api_ids: HashSet<i64> = api
        .items
        .iter()
        .map(|v| v["id"].as_i64().unwrap())
        .collect();
    assert_eq!(api_ids, rest.iter().copied().collect());

    let body = app
        .html_status("/?cursor=%3Cscript%3E", None, StatusCode::BAD_REQUEST)
        .await;
    assert!(
        !body.contains("<script>"),
        "nothing of the cursor echoed raw"
    );
}

#[tokio::test]
async fn polls_page_shows_24_polls_and_links_the_next_page() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    for i in 0..26 {
        app.create_poll(&admin, "Which?", &["A", "B"], -600 + i, 3600)
            .await;
    }

    let first = app.html("/polls", None).await;
    let shown = ids_linked(&first, "/polls/");
    assert_eq!(shown.len(), 24);
    let more = link_of(&first, "more-polls").expect("a More polls link");
    assert!(more.starts_with("/polls?cursor="), "{more}");

    let second = app.html(&more, None).await;
    let rest = ids_linked(&second, "/polls/");
    assert_eq!(rest.len(), 2);
    let all: Vec<i64> = shown.iter().chain(&rest).copied().collect();
    assert_no_repeats(&all);
    assert_eq!(all.len(), 26);
    assert!(link_of(&second, "more-polls").is_none());
    assert_eq!(link_of(&second, "first-page").as_deref(), Some("/polls"));

    app.html_status("/polls?cursor=nope", None, StatusCode::BAD_REQUEST)
        .await;
    // A cursor of the list's shape with a time Postgres cannot compare.
    let before_postgres = URL_SAFE_NO_PAD.encode("p1.-300000000000000000.0.0.1");
    app.html_status(
        &format!("/polls?cursor={before_postgres}"),
        None,
        StatusCode::BAD_REQUEST,
    )
    .await;
}

#[tokio::test]
async fn admin_page_pages_its_sales_and_polls_tables_apart() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    for i in 0..52 {
        app.create_sale(&admin, 5, -600 + i, 3600).await;
    }
    for i in 0..51 {
        app.create_poll(&admin, "Which?", &["A", "B"], -600 + i, 3600)
            .await;
    }

    let first = app.html("/admin", Some(&admin)).await;
    let rows = |body: &str, attr: &str| -> Vec<i64> {
        body.split(&format!(r#"<tr {attr}=""#))
            .skip(1)
            .filter_map(|rest| rest.split('"').next()?.parse().ok())
            .collect()
    };
    assert_eq!(rows(&first, "data-sale-id").len(), 50);
    assert_eq!(rows(&first, "data-poll-id").len(), 50);
    assert!(first.contains(r#"data-list-url="/api/admin/sales?limit=50""#));
    assert!(first.contains(r#"data-list-url="/api/admin/polls?limit=50""#));

    let more_sales = link_of(&first, "more-sales").expect("More sales");
    assert!(
        more_sales.starts_with("/admin?sales_cursor="),
        "{more_sales}"
    );
    let second = app.html(&more_sales, Some(&admin)).await;
    let rest = rows(&second, "data-sale-id");
    assert_eq!(rest.len(), 2);
    let all: Vec<i64> = rows(&first, "data-sale-id")
        .into_iter()
        .chain(rest)
        .collect();
    assert_no_repeats(&all);
    assert_eq!(all.len(), 52);
    assert!(link_of(&second, "more-sales").is_none());
    // The polls table stayed on its first page, and its link keeps the sales' place.
    assert_eq!(rows(&second, "data-poll-id"), rows(&first, "data-poll-id"));
    let more_polls = link_of(&second, "more-polls").expect("More polls");
    let sales_cursor = between(&more_sales, "sales_cursor=", "#");
    assert!(
        more_polls.starts_with(&format!("/admin?sales_cursor={sales_cursor}&polls_cursor=")),
        "{more_polls}"
    );
    let third = app.html(&more_polls, Some(&admin)).await;
    assert_eq!(rows(&third, "data-poll-id").len(), 1);
    assert_eq!(rows(&third, "data-sale-id").len(), 2);

    app.html_status(
        "/admin?polls_cursor=nope",
        Some(&admin),
        StatusCode::BAD_REQUEST,
    )
    .await;
}
