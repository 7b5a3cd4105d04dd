//! `min_account_age_s` (issue 52): an account made less than that before the
//! opening may not join, take a ticket, buy or vote until it is that old; the
//! refusal names the moment when it comes before the close. The creation time
//! rides in the session token (sign-in writes it), so the check reads nothing;
//! a token without it has it read once.

use chrono::{DateTime, Duration, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};
use stampede::auth::token::Claims;
use stampede::domain::Id;

use crate::helpers::{TestApp, User, assert_error, assert_status, spawn_app};

/// An account made through the API, signed in: its token carries its creation.
async fn signed_up(app: &TestApp, name: &str) -> User {
    let creds = json!({ "username": name, "password": "correct horse battery" });
    assert_status(
        app.post_json("/api/auth/signup", None, &creds).await,
        StatusCode::CREATED,
    )
    .await;
    let resp = app.post_json("/api/auth/signin", None, &creds).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.unwrap();
    User {
        id: body["user"]["id"].as_i64().unwrap(),
        token: body["token"].as_str().unwrap().to_string(),
    }
}

/// The account's creation time in Postgres, whole seconds.
async fn created_s(app: &TestApp, user: &User) -> i64 {
    sqlx::query_scalar(
        "SELECT floor(extract(epoch FROM created_at))::bigint FROM users WHERE id = $1",
    )
    .bind(user.id)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// Makes the account `secs` older in Postgres (a token minted without its
/// creation time is checked against this).
async fn backdate(app: &TestApp, user: &User, secs: i64) {
    sqlx::query(
        "UPDATE users SET created_at = created_at - make_interval(secs => $2) WHERE id = $1",
    )
    .bind(user.id)
    .bind(secs as f64)
    .execute(&app.db)
    .await
    .unwrap();
}

async fn ticket(app: &TestApp, sale: i64, user: &User) -> reqwest::Response {
    app.post(&format!("/api/sales/{sale}/ticket"), Some(&user.token))
        .await
}

async fn join(app: &TestApp, sale: i64, user: &User) -> reqwest::Response {
    app.post(&format!("/api/sales/{sale}/queue"), Some(&user.token))
        .await
}

/// A moment as the API writes it back (whole seconds, `Z`).
fn whole_seconds(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn allowed_at(body: &Value) -> i64 {
    let at: DateTime<Utc> = body["allowed_at"].as_str().unwrap().parse().unwrap();
    at.timestamp()
}

#[tokio::test]
async fn a_new_account_is_refused_with_the_moment_it_may_take_part() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = app
        .live_sale_with(
            &admin,
            10,
            json!({ "requires_ticket": true, "min_account_age_s": 3600,
                    "ends_at": whole_seconds(Utc::now() + Duration::hours(3)) }),
        )
        .await;

    // Signed in just now: an hour to go, within the sale: the moment is named.
    let fresh = signed_up(&app, "fresh_one").await;
    let body = assert_error(
        ticket(&app, sale, &fresh).await,
        StatusCode::FORBIDDEN,
        "account_too_new",
    )
    .await;
    assert_eq!(
        allowed_at(&body),
        created_s(&app, &fresh).await + 3600,
        "{body}"
    );

    // The token's creation time decides, not the row: a token that says two
    // hours ago passes though Postgres says now (no query was made for it).
    let told_old = app.tokens.issue(Claims {
        user_id: Id::new(fresh.id).unwrap(),
        admin: false,
        expires_at: Utc::now().timestamp() + 3600,
        generation: 0,
        session: rand::random(),
        account_created: Some(Utc::now().timestamp() - 7200),
    });
    let told_old = User {
        id: fresh.id,
        token: told_old,
    };
    assert_status(ticket(&app, sale, &told_old).await, StatusCode::OK).await;

    // A token without it (an earlier version's): the row is read, once.
    let old = app.user().await;
    backdate(&app, &old, 7200).await;
    assert_status(ticket(&app, sale, &old).await, StatusCode::OK).await;
    let young = app.user().await;
    let body = assert_error(
        ticket(&app, sale, &young).await,
        StatusCode::FORBIDDEN,
        "account_too_new",
    )
    .await;
    assert_eq!(allowed_at(&body), created_s(&app, &young).await + 3600);

    // When the moment falls after the close, none is named: never, for this sale.
    let short = app
        .live_sale_with(
            &admin,
            10,
            json!({ "requires_ticket": true, "min_account_age_s": 3600,
                    "ends_at": whole_seconds(Utc::now() + Duration::minutes(30)) }),
        )
        .await;
    let body = assert_error(
        ticket(&app, short, &fresh).await,
        StatusCode::FORBIDDEN,
        "account_too_new",
    )
    .await;
    assert!(body.get("allowed_at").is_none(), "{body}");
}

#[tokio::test]
async fn the_age_counts_at_the_opening_for_a_join_and_holds_for_votes_and_purchases() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let now = Utc::now();
    let created = app
        .admin_create(
            &admin,
            "/api/admin/sales",
            &json!({
                "name": "Queued", "price_cents": 500, "stock": 5,
                "starts_at": now + Duration::hours(2),
                "ends_at": now + Duration::hours(5),
                "waiting_room": true,
                "queue_opens_at": now - Duration::seconds(5),
                "admit_per_second": 10,
                "min_account_age_s": 3600,
            }),
        )
        .await;
    assert_eq!(created["min_account_age_s"], 3600);
    let sale = created["id"].as_i64().unwrap();
    // An hour old at the opening in two hours: may join now.
    let fresh = signed_up(&app, "fresh_two").await;
    assert_status(join(&app, sale, &fresh).await, StatusCode::OK).await;
    // Three hours asked: not at the opening; from three hours after its making.
    let patch = app
        .patch_sale(&admin, sale, &json!({ "min_account_age_s": 3 * 3600 }))
        .await;
    assert_status(patch, StatusCode::OK).await;
    let other = signed_up(&app, "fresh_three").await;
    let body = assert_error(
        join(&app, sale, &other).await,
        StatusCode::FORBIDDEN,
        "account_too_new",
    )
    .await;
    assert_eq!(allowed_at(&body), created_s(&app, &other).await + 3 * 3600);
    assert_error(
        app.patch_sale(&admin, sale, &json!({ "min_account_age_s": -5 }))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_fairness",
    )
    .await;

    // A vote.
    let (poll, options) = app
        .open_poll_with(
            &admin,
            "Q?",
            &["A", "B"],
            json!({ "min_account_age_s": 600 }),
        )
        .await;
    let body = assert_error(
        app.vote(poll, &fresh.token, options[0]).await,
        StatusCode::FORBIDDEN,
        "account_too_new",
    )
    .await;
    assert_eq!(allowed_at(&body), created_s(&app, &fresh).await + 600);
    let old = app.user().await;
    backdate(&app, &old, 601).await;
    app.cast_vote(poll, &old.token, options[1]).await;
    assert_eq!(app.poll_results(poll).await["voters"], 1);

    // A purchase of a sale without tickets.
    let plain = app
        .live_sale_with(&admin, 5, json!({ "min_account_age_s": 600 }))
        .await;
    assert_error(
        app.purchase(plain, &fresh.token).await,
        StatusCode::FORBIDDEN,
        "account_too_new",
    )
    .await;
    assert_status(app.purchase(plain, &old.token).await, StatusCode::ACCEPTED).await;
    assert_eq!(
        app.stock_left(plain).await,
        4,
        "the refused purchase took nothing"
    );
}

/// A waiting room's rule raised after a shopper joined: the admission's ticket
/// (`queue/me`, given without asking the rule) does not buy for an account too
/// new under the rule now, and the refusal takes nothing; an old account buys.
#[tokio::test]
async fn a_rule_raised_after_the_join_holds_for_the_admitted_purchase() {
    use crate::waiting_room::{join, me, waiting_room_sale};
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = waiting_room_sale(&app, &admin, 5, 1500, 100).await;
    let fresh = signed_up(&app, "fresh_joiner").await;
    let old = app.user().await;
    backdate(&app, &old, 7200).await;
    for u in [&fresh, &old] {
        assert_status(join(&app, sale, u).await, StatusCode::OK).await;
    }
    let patch = app
        .patch_sale(&admin, sale, &json!({ "min_account_age_s": 3600 }))
        .await;
    assert_status(patch, StatusCode::OK).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let ticket_of = async |u: &User| loop {
        let m = me(&app, sale, u).await;
        if let Some(t) = m["ticket"].as_str() {
            return t.to_string();
        }
        assert!(std::time::Instant::now() < deadline, "not admitted: {m}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let buy = async |u: &User, ticket: &str| {
        app.post_json(
            &format!("/api/sales/{sale}/purchase"),
            Some(&u.token),
            &json!({ "ticket": ticket }),
        )
        .await
    };
    let ticket = ticket_of(&fresh).await;
    assert_error(
        buy(&fresh, &ticket).await,
        StatusCode::FORBIDDEN,
        "account_too_new",
    )
    .await;
    assert_eq!(app.stock_left(sale).await, 5, "the refusal took nothing");
    let ticket = ticket_of(&old).await;
    assert_status(buy(&old, &ticket).await, StatusCode::ACCEPTED).await;
}

/// A draw's entry refused for the account's age names no moment after the draw
/// (the entries close then, whatever the sale's end).
#[tokio::test]
async fn a_draw_entry_refused_for_age_names_no_moment_past_the_draw() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let now = Utc::now();
    let sale = app
        .admin_create(
            &admin,
            "/api/admin/sales",
            &json!({
                "name": "Drawn", "price_cents": 500, "stock": 2, "mode": "draw",
                "entries_open_at": now - Duration::seconds(60),
                "draw_at": now + Duration::hours(1),
                "ends_at": now + Duration::days(3),
                "claim_window_s": 600,
                "min_account_age_s": 86_400,
            }),
        )
        .await["id"]
        .as_i64()
        .unwrap();
    let fresh = signed_up(&app, "fresh_entrant").await;
    let body = assert_error(
        app.post(&format!("/api/sales/{sale}/entry"), Some(&fresh.token))
            .await,
        StatusCode::FORBIDDEN,
        "account_too_new",
    )
    .await;
    assert!(body.get("allowed_at").is_none(), "{body}");
}
