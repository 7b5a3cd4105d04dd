//! Draw sales (issue 52): settings checked at creation and fixed once entries
//! open, the seed's commitment public from the start, one entry per account in
//! its window, a draw made once in the seeded order, only winners buying (with
//! the ticket their standing gives), unclaimed wins passing on, and the draw
//! published so that `stampede verify-draw` recomputes it.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use stampede::sale::draw::{order, pass};

use crate::helpers::{
    TestApp, User, assert_error, assert_status, patched, spawn_app, spawn_app_with,
};

/// A draw sale's creation body: entries open since a minute, drawn in an hour
/// (`POST .../open` draws it at once), `overrides` over those.
fn draw_body(stock: i64, overrides: Value) -> Value {
    let now = chrono::Utc::now();
    patched(
        &json!({
            "name": "Drawn sneakers",
            "price_cents": 12_000,
            "stock": stock,
            "mode": "draw",
            "entries_open_at": now - chrono::Duration::seconds(60),
            "draw_at": now + chrono::Duration::seconds(3600),
            "ends_at": now + chrono::Duration::seconds(7200),
            "claim_window_s": 600,
        }),
        &overrides,
    )
}

async fn draw_sale(app: &TestApp, admin: &User, stock: i64, overrides: Value) -> Value {
    app.admin_create(admin, "/api/admin/sales", &draw_body(stock, overrides))
        .await
}

/// Enters every user: their entry ids, in the users' order.
async fn enter_all(app: &TestApp, sale: i64, users: &[User]) -> Vec<i64> {
    let mut ids = Vec::new();
    for u in users {
        let resp = app
            .post(&format!("/api/sales/{sale}/entry"), Some(&u.token))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["state"], "entered");
        ids.push(body["entry_id"].as_i64().unwrap());
    }
    ids
}

/// Draws now (the admin's open moves the draw to now) and waits for the
/// publication: the published draw.
async fn draw_now(app: &TestApp, admin: &User, sale: i64) -> Value {
    assert_status(app.open_sale(admin, sale).await, StatusCode::OK).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let resp = app.get(&format!("/api/sales/{sale}/draw"), None).await;
        if resp.status() == StatusCode::OK {
            return resp.json().await.unwrap();
        }
        assert_error(resp, StatusCode::CONFLICT, "draw_pending").await;
        assert!(Instant::now() < deadline, "not drawn within 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn me(app: &TestApp, sale: i64, user: &User) -> Value {
    let resp = app
        .get(&format!("/api/sales/{sale}/entry/me"), Some(&user.token))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    resp.json().await.unwrap()
}

async fn buy_with(
    app: &TestApp,
    sale: i64,
    user: &User,
    ticket: Option<&Value>,
) -> reqwest::Response {
    let body = match ticket {
        Some(t) => json!({ "ticket": t }),
        None => json!({}),
    };
    app.post_json(
        &format!("/api/sales/{sale}/purchase"),
        Some(&user.token),
        &body,
    )
    .await
}

fn winner_ids(draw: &Value) -> Vec<i64> {
    draw["winners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["entry_id"].as_i64().unwrap())
        .collect()
}

#[tokio::test]
async fn draw_settings_are_checked_public_from_creation_and_fixed_once_entries_open() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let now = chrono::Utc::now();
    let at = |s: i64| json!(now + chrono::Duration::seconds(s));
    for bad in [
        json!({ "entries_open_at": at(4000) }),
        json!({ "entries_open_at": null }),
        json!({ "entries_open_at": "-5000-01-01T00:00:00Z" }),
        json!({ "entries_open_at": at(-367 * 86_400) }),
        json!({ "draw_at": null }),
        json!({ "starts_at": at(3000) }),
        json!({ "claim_window_s": 59 }),
        json!({ "claim_window_s": 86_401 }),
        json!({ "waiting_room": true, "queue_opens_at": at(0), "admit_per_second": 5 }),
        json!({ "mode": "first_come", "starts_at": at(10) }),
    ] {
        let body = draw_body(5, bad.clone());
        let resp = app
            .post_json("/api/admin/sales", Some(&admin.token), &body)
            .await;
        assert_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid_draw").await;
    }
    assert_eq!(
        app.count("SELECT count(*) FROM sales").await,
        0,
        "nothing made"
    );

    // Entries open in an hour: editable till then.
    let later = draw_sale(
        &app,
        &admin,
        5,
        json!({ "entries_open_at": at(3600), "draw_at": at(5400) }),
    )
    .await;
    let id = later["id"].as_i64().unwrap();
    assert_eq!(later["mode"], "draw");
    assert_eq!(later["draw_at"], later["starts_at"]);
    assert_eq!(later["claim_window_s"], 600);
    assert_eq!(later["requires_ticket"], true);
    let commitment = later["draw_commitment"].as_str().unwrap().to_string();
    assert_eq!(commitment.len(), 64);
    assert!(commitment.bytes().all(|b| b.is_ascii_hexdigit()));
    let public = app.get_json(&format!("/api/sales/{id}"), None).await;
    assert_eq!(public["draw_commitment"], commitment.as_str());
    assert!(public.get("seed").is_none());
    let seed: Vec<u8> = sqlx::query_scalar("SELECT seed FROM sale_draws WHERE sale_id = $1")
        .bind(id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(
        order::commitment(&seed),
        commitment,
        "the commitment is the seed's"
    );
    assert!(
        !public.to_string().contains(&order::hex(&seed)),
        "the seed is secret"
    );

    let edit = async |sale: i64, body: Value| app.patch_sale(&admin, sale, &body).await;
    let resp = edit(id, json!({ "draw_at": at(6000), "claim_window_s": 120 })).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let edited: Value = resp.json().await.unwrap();
    assert_eq!(edited["starts_at"], edited["draw_at"]);
    let moved: chrono::DateTime<chrono::Utc> = edited["draw_at"].as_str().unwrap().parse().unwrap();
    assert!(
        (moved - (now + chrono::Duration::seconds(6000)))
            .num_milliseconds()
            .abs()
            < 5
    );
    assert_eq!(edited["claim_window_s"], 120);
    let resp = edit(id, json!({ "draw_at": at(3000) })).await;
    assert_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid_draw").await;
    let resp = edit(id, json!({ "claim_window_s": 30 })).await;
    assert_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid_draw").await;

    // Entries open now: fixed.
    let open = draw_sale(&app, &admin, 5, json!({})).await;
    let resp = edit(
        open["id"].as_i64().unwrap(),
        json!({ "claim_window_s": 120 }),
    )
    .await;
    assert_error(resp, StatusCode::CONFLICT, "sale_started").await;
    // A first-come sale has no draw fields.
    let plain = app.live_sale(&admin, 3).await;
    let resp = edit(plain, json!({ "claim_window_s": 120 })).await;
    assert_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid_draw").await;
}

#[tokio::test]
async fn one_entry_per_account_and_only_while_entries_are_open() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let users = app.create_users(2, false).await;
    let now = chrono::Utc::now();
    let early = draw_sale(
        &app,
        &admin,
        1,
        json!({ "entries_open_at": now + chrono::Duration::seconds(90) }),
    )
    .await;
    let resp = app
        .post(
            &format!("/api/sales/{}/entry", early["id"]),
            Some(&users[0].token),
        )
        .await;
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((85..=91).contains(&retry), "{retry}");
    assert_error(resp, StatusCode::CONFLICT, "entries_not_open").await;

    let sale = draw_sale(&app, &admin, 1, json!({})).await["id"]
        .as_i64()
        .unwrap();
    let path = format!("/api/sales/{sale}/entry");
    assert_error(
        app.post(&path, None).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    let first = enter_all(&app, sale, &users[..1]).await;
    let again = enter_all(&app, sale, &users[..1]).await;
    assert_eq!(first, again, "the same entry");
    let other = enter_all(&app, sale, &users[1..]).await;
    assert_ne!(first, other);
    assert_eq!(
        app.count("SELECT count(*) FROM draw_entries").await,
        2,
        "one row per account"
    );
    let standing = me(&app, sale, &users[0]).await;
    assert_eq!(
        (standing["state"].clone(), standing["entry_id"].as_i64()),
        (json!("entered"), Some(first[0]))
    );
    let stranger = app.user().await;
    let resp = app
        .get(
            &format!("/api/sales/{sale}/entry/me"),
            Some(&stranger.token),
        )
        .await;
    assert_error(resp, StatusCode::NOT_FOUND, "not_found").await;

    // Nobody buys or gets a ticket before the draw, and a first-come sale has no entry.
    assert_error(
        buy_with(&app, sale, &users[0], None).await,
        StatusCode::FORBIDDEN,
        "not_drawn",
    )
    .await;
    let ticket = app
        .post(&format!("/api/sales/{sale}/ticket"), Some(&users[0].token))
        .await;
    assert_ne!(ticket.status(), StatusCode::OK);
    let plain = app.live_sale(&admin, 3).await;
    let resp = app
        .post(&format!("/api/sales/{plain}/entry"), Some(&users[0].token))
        .await;
    assert_error(resp, StatusCode::CONFLICT, "not_a_draw").await;
    assert_error(
        app.get(&format!("/api/sales/{sale}/draw"), None).await,
        StatusCode::CONFLICT,
        "draw_pending",
    )
    .await;
}

/// Entries sent while the draw is made (at its time, by the server's own loop):
/// each is either in the draw (200, and ranked) or refused 410 `entries_closed`
/// (and written nowhere). The entries hold the draw's lock shared and the draw
/// takes it alone, so none is written after the draw read the entries.
#[tokio::test(flavor = "multi_thread")]
async fn entries_racing_the_draw_are_drawn_or_refused_never_lost() {
    const USERS: usize = 240;
    let app = spawn_app().await;
    let admin = app.admin().await;
    let users = app.create_users(USERS, false).await;
    let draw_at = chrono::Utc::now() + chrono::Duration::milliseconds(1500);
    let sale = draw_sale(
        &app,
        &admin,
        3,
        json!({ "draw_at": draw_at, "starts_at": draw_at }),
    )
    .await["id"]
        .as_i64()
        .unwrap();
    // One entry each, spread over 3 s around the draw's time.
    let sends = users.iter().enumerate().map(|(i, u)| {
        let app = &app;
        async move {
            tokio::time::sleep(Duration::from_millis(i as u64 * 3000 / USERS as u64)).await;
            let resp = app
                .post(&format!("/api/sales/{sale}/entry"), Some(&u.token))
                .await;
            let status = resp.status();
            let body: Value = resp.json().await.unwrap();
            (u.id, status, body)
        }
    });
    let answers = futures_util::future::join_all(sends).await;
    let mut entered: Vec<(i64, i64)> = Vec::new();
    let mut refused = 0;
    for (user, status, body) in &answers {
        match *status {
            StatusCode::OK => entered.push((*user, body["entry_id"].as_i64().unwrap())),
            StatusCode::GONE => {
                assert_eq!(body["error"], "entries_closed", "{body}");
                refused += 1;
            }
            other => panic!("user {user}: {other} {body}"),
        }
    }
    assert!(
        !entered.is_empty() && refused > 0,
        "the entries did not straddle the draw: {} entered, {refused} refused",
        entered.len()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while app
        .get(&format!("/api/sales/{sale}/draw"), None)
        .await
        .status()
        != StatusCode::OK
    {
        assert!(Instant::now() < deadline, "not drawn within 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    entered.sort_unstable();
    let rows: Vec<(i64, i64)> =
        sqlx::query_as("SELECT user_id, id FROM draw_entries WHERE sale_id = $1 ORDER BY user_id")
            .bind(sale)
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(rows, entered, "every 200 written, nothing else");
    let mut ranked: Vec<i64> =
        sqlx::query_scalar("SELECT entry_id FROM draw_order WHERE sale_id = $1")
            .bind(sale)
            .fetch_all(&app.db)
            .await
            .unwrap();
    ranked.sort_unstable();
    let mut ids: Vec<i64> = entered.iter().map(|(_, id)| *id).collect();
    ids.sort_unstable();
    assert_eq!(ranked, ids, "every entry written is in the draw");
}

#[tokio::test]
async fn the_draw_picks_the_first_of_the_seeded_order_once_and_only_winners_buy() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let users = app.create_users(10, false).await;
    let sale = draw_sale(&app, &admin, 3, json!({})).await["id"]
        .as_i64()
        .unwrap();
    let ids = enter_all(&app, sale, &users).await;
    let draw = draw_now(&app, &admin, sale).await;

    let seed = order::unhex(draw["seed"].as_str().unwrap()).unwrap();
    let view = app.get_json(&format!("/api/sales/{sale}"), None).await;
    assert_eq!(view["draw_commitment"], order::commitment(&seed));
    assert_eq!(draw["entries"], 10);
    assert_eq!(draw["winners_at_draw"], 3);
    let ordered = order::order(&seed, &ids);
    assert_eq!(
        winner_ids(&draw),
        ordered[..3].to_vec(),
        "the first three of the seeded order"
    );
    // Once: another attempt finds it drawn, and nobody enters any more.
    let again = stampede::sale::draw::run::draw_once(
        &app.db,
        &app.redis,
        &app.keys,
        stampede::domain::Id::new(sale).unwrap(),
        Duration::from_secs(600),
    )
    .await
    .unwrap();
    assert_eq!(again, None);
    let late = app.user().await;
    let resp = app
        .post(&format!("/api/sales/{sale}/entry"), Some(&late.token))
        .await;
    assert_error(resp, StatusCode::GONE, "entries_closed").await;

    let user_of = |entry: i64| &users[ids.iter().position(|&e| e == entry).unwrap()];
    let winners: Vec<&User> = ordered[..3].iter().map(|&e| user_of(e)).collect();
    let mut tickets = Vec::new();
    for w in &winners {
        let standing = me(&app, sale, w).await;
        assert_eq!(standing["state"], "won", "{standing}");
        assert!(standing["claim_until"].is_string());
        tickets.push(standing["ticket"].clone());
    }
    for (i, &entry) in ordered[3..].iter().enumerate() {
        let standing = me(&app, sale, user_of(entry)).await;
        assert_eq!(standing["state"], "waitlisted", "{standing}");
        assert_eq!(standing["position"], i as i64 + 1);
        assert!(standing.get("ticket").is_none());
    }
    // Someone else: no ticket of their own, and a winner's is not theirs.
    let loser = user_of(ordered[3]);
    assert_error(
        buy_with(&app, sale, loser, None).await,
        StatusCode::FORBIDDEN,
        "not_drawn",
    )
    .await;
    assert_error(
        buy_with(&app, sale, loser, Some(&tickets[0])).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_ticket",
    )
    .await;
    let resp = app
        .post(&format!("/api/sales/{sale}/ticket"), Some(&loser.token))
        .await;
    assert_error(resp, StatusCode::FORBIDDEN, "not_drawn").await;
    // A winner buys with their ticket, once.
    assert_status(
        buy_with(&app, sale, winners[0], Some(&tickets[0])).await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(me(&app, sale, winners[0]).await["state"], "bought");
    let resp = buy_with(&app, sale, winners[0], Some(&tickets[0])).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let view = app.get_json(&format!("/api/sales/{sale}"), None).await;
    assert_eq!(
        (view["stock_left"].as_i64(), view["sold"].as_i64()),
        (Some(2), Some(1))
    );
}

#[tokio::test]
async fn an_unclaimed_win_passes_to_the_next_in_the_seeded_order_until_sold() {
    let app = spawn_app_with(|c| c.draw_claim_max = Duration::from_millis(3000)).await;
    let admin = app.admin().await;
    let users = app.create_users(5, false).await;
    let sale = draw_sale(&app, &admin, 2, json!({})).await["id"]
        .as_i64()
        .unwrap();
    let ids = enter_all(&app, sale, &users).await;
    let draw = draw_now(&app, &admin, sale).await;
    let seed = order::unhex(draw["seed"].as_str().unwrap()).unwrap();
    let ordered = order::order(&seed, &ids);
    let user_of = |entry: i64| &users[ids.iter().position(|&e| e == entry).unwrap()];
    let (buyer, idle) = (user_of(ordered[0]), user_of(ordered[1]));
    let ticket = me(&app, sale, buyer).await["ticket"].clone();
    assert_status(
        buy_with(&app, sale, buyer, Some(&ticket)).await,
        StatusCode::ACCEPTED,
    )
    .await;
    let stale = me(&app, sale, idle).await["ticket"].clone();
    assert_eq!(me(&app, sale, user_of(ordered[2])).await["position"], 1);

    // The idle winner's window ends: the third entry wins, nobody else.
    let deadline = Instant::now() + Duration::from_secs(10);
    let next = user_of(ordered[2]);
    let won = loop {
        let standing = me(&app, sale, next).await;
        if standing["state"] == "won" {
            break standing;
        }
        assert_eq!(standing["state"], "waitlisted");
        assert!(Instant::now() < deadline, "the win never passed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(me(&app, sale, idle).await["state"], "claim_passed");
    assert_eq!(me(&app, sale, user_of(ordered[3])).await["position"], 1);
    let resp = buy_with(&app, sale, idle, Some(&stale)).await;
    assert_eq!(
        resp.status(),
        StatusCode::UNPROCESSABLE_ENTITY,
        "an expired ticket"
    );
    assert_status(
        buy_with(&app, sale, next, Some(&won["ticket"])).await,
        StatusCode::ACCEPTED,
    )
    .await;
    let published = app.get_json(&format!("/api/sales/{sale}/draw"), None).await;
    assert_eq!(winner_ids(&published), ordered[..3].to_vec());
    // Sold: nobody else wins, however long one waits for a pass.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    for &entry in &ordered[3..] {
        assert_eq!(me(&app, sale, user_of(entry)).await["state"], "not_drawn");
    }
    let published = app.get_json(&format!("/api/sales/{sale}/draw"), None).await;
    assert_eq!(winner_ids(&published).len(), 3);
    let outcomes: Vec<&str> = published["winners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["outcome"].as_str().unwrap_or("running"))
        .collect();
    assert_eq!(outcomes, ["bought", "passed", "bought"]);
}

/// A drawn sale of one unit among three entrants: the app, the sale, the
/// entrants, which of them won, and the winner's standing (`won`, with its ticket).
async fn one_winner_of_three() -> (TestApp, i64, Vec<User>, usize, Value) {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let users = app.create_users(3, false).await;
    let sale = draw_sale(&app, &admin, 1, json!({})).await["id"]
        .as_i64()
        .unwrap();
    let ids = enter_all(&app, sale, &users).await;
    let draw = draw_now(&app, &admin, sale).await;
    let seed = order::unhex(draw["seed"].as_str().unwrap()).unwrap();
    let first = order::order(&seed, &ids)[0];
    let w = ids.iter().position(|&e| e == first).unwrap();
    let standing = me(&app, sale, &users[w]).await;
    assert_eq!(standing["state"], "won", "{standing}");
    (app, sale, users, w, standing)
}

/// The draw commits in Postgres and then gives its wins in Redis: a winner told
/// "won" who buys in between is not refused. (The win is taken out of Redis
/// here to stand for that moment; the servers' step, every half second, would
/// give it back, so the purchase follows at once.)
#[tokio::test]
async fn a_winner_who_buys_before_the_win_reaches_redis_buys() {
    let (app, sale, users, w, standing) = one_winner_of_three().await;
    let winner = &users[w];
    let k = app.sale_keys(sale);
    // In one MULTI: a step between the two would give the win back to one
    // hash only, and the winner would be refused.
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("HDEL")
        .arg(&k.queue_admitted)
        .arg(winner.id)
        .ignore();
    pipe.cmd("ZREM").arg(&k.queue_open).arg(winner.id).ignore();
    let _: () = pipe.query_async(&mut app.redis.clone()).await.unwrap();
    assert_status(
        buy_with(&app, sale, winner, Some(&standing["ticket"])).await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(me(&app, sale, winner).await["state"], "bought");
    // Once: the win was used up, and the same ticket buys nothing more.
    let resp = buy_with(&app, sale, winner, Some(&standing["ticket"])).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(app.stock_left(sale).await, 0);
}

/// The purchase's second look at a refused winner (`admit_one`): a win a
/// server's step gave between the refusal and that look is open, and the
/// purchase runs again; one used up stays refused. (CI once saw the step win
/// that race, and the winner was refused with `not_drawn`.)
#[tokio::test]
async fn a_win_given_by_a_step_during_the_refusal_lets_the_purchase_run_again() {
    let (app, sale, users, w, standing) = one_winner_of_three().await;
    let winner = &users[w];
    let id = stampede::domain::SaleId::new(sale).unwrap();
    let look = |user: i64| {
        let (db, mut redis, keys) = (app.db.clone(), app.redis.clone(), app.keys.clone());
        async move {
            pass::admit_one(&db, &mut redis, &keys, id, user)
                .await
                .unwrap()
        }
    };
    // The draw gave the win already: it is open, so the purchase may run again.
    assert!(look(winner.id).await);
    // Someone who did not win has nothing to run again for.
    let loser = users.iter().find(|u| u.id != winner.id).unwrap();
    assert!(!look(loser.id).await);
    assert_status(
        buy_with(&app, sale, winner, Some(&standing["ticket"])).await,
        StatusCode::ACCEPTED,
    )
    .await;
    // Used up: the refusal stands.
    assert!(!look(winner.id).await);
}

/// `stampede verify-draw` against the running server: its exit status and output.
/// (Off the test's runtime thread, which the server's Redis connection runs on.)
async fn verify(app: &TestApp, sale: i64) -> (bool, String) {
    let url = format!("http://127.0.0.1:{}", app.port);
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_stampede"))
            .args(["verify-draw", "--url", &url, "--sale", &sale.to_string()])
            .env_remove("STAMPEDE_CONFIG")
            .output()
            .expect("run stampede verify-draw")
    })
    .await
    .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[tokio::test]
async fn the_published_draw_and_entries_verify_and_a_tampered_one_does_not() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let users = app.create_users(30, false).await;
    let sale = draw_sale(&app, &admin, 4, json!({ "max_per_user": 2 })).await["id"]
        .as_i64()
        .unwrap();
    let ids = enter_all(&app, sale, &users).await;
    let draw = draw_now(&app, &admin, sale).await;
    assert_eq!(draw["winners_at_draw"], 2, "ceil(4 / 2)");

    let resp = app
        .get(&format!("/api/sales/{sale}/draw/entries.csv"), None)
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let csv = resp.text().await.unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("entry_id,entered_at"));
    let listed: Vec<i64> = lines
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(listed, sorted, "every entry once, by id");

    let (ok, text) = verify(&app, sale).await;
    assert!(ok, "{text}");
    assert!(text.contains("the draw checks out"), "{text}");
    assert_eq!(draw["stock_at_draw"], 4);
    // A top-up after the draw moves the sale's stock, not the draw's.
    assert_status(
        app.change_stock(&admin, sale, &json!({ "add": 6 })).await,
        StatusCode::OK,
    )
    .await;
    let (ok, text) = verify(&app, sale).await;
    assert!(ok, "after a top-up: {text}");
    // Recipe 2: the order key is fixed by the entries digest, published.
    assert_eq!(draw["recipe"], 2);
    assert_eq!(
        draw["entries_digest"],
        order::hex(&order::entries_digest(&ids)),
        "SHA-256 of the entry ids"
    );
    assert!(text.contains("entries digest"), "{text}");
    let cached = app
        .keys
        .draw_view(stampede::domain::SaleId::new(sale).unwrap());
    let drop_cached = || async { app.redis_query::<i64>(redis::cmd("DEL").arg(&cached)).await };
    // A digest other than the entries give: found.
    let set_digest = |digest: Vec<u8>| {
        sqlx::query("UPDATE sale_draws SET entries_digest = $2 WHERE sale_id = $1")
            .bind(sale)
            .bind(digest)
            .execute(&app.db)
    };
    set_digest(vec![1u8; 32]).await.unwrap();
    drop_cached().await;
    let (ok, text) = verify(&app, sale).await;
    assert!(!ok && text.contains("MISMATCH"), "{text}");
    set_digest(order::entries_digest(&ids).to_vec())
        .await
        .unwrap();
    drop_cached().await;

    // Another winner than the seed picks: found.
    sqlx::query(
        "UPDATE draw_entries SET won_at = NULL, claim_until = NULL WHERE sale_id = $1 AND rank = 2",
    )
    .bind(sale)
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE draw_entries SET rank = 7,
                won_at = (SELECT drawn_at FROM sale_draws WHERE sale_id = $1),
                claim_until = now() + interval '1 minute'
         WHERE sale_id = $1
           AND id = (SELECT entry_id FROM draw_order WHERE sale_id = $1 AND rank = 7)",
    )
    .bind(sale)
    .execute(&app.db)
    .await
    .unwrap();
    // The publication is cached a second; written behind the server's back, its
    // copy goes too.
    drop_cached().await;
    let (ok, text) = verify(&app, sale).await;
    assert!(!ok, "{text}");
    assert!(text.contains("MISMATCH"), "{text}");
    // A seed other than the one committed to: found.
    sqlx::query("UPDATE sale_draws SET seed = $2 WHERE sale_id = $1")
        .bind(sale)
        .bind(&[9u8; 32][..])
        .execute(&app.db)
        .await
        .unwrap();
    drop_cached().await;
    let (ok, text) = verify(&app, sale).await;
    assert!(!ok && text.contains("MISMATCH"), "{text}");
}

/// A draw made before recipe 2 (or, during a rolling upgrade, by a server of the
/// version before) was made by the seed alone, and its row says recipe 1: its
/// publication names recipe 1 and verifies by it, and the waiting list's places
/// follow that order. (This version draws by recipe 2 whatever the row says: the
/// draw is made here, then rewritten as the version before wrote it.)
#[tokio::test]
async fn a_draw_made_under_recipe_1_verifies_and_places_by_the_seed_alone() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let users = app.create_users(8, false).await;
    let sale = draw_sale(&app, &admin, 2, json!({})).await["id"]
        .as_i64()
        .unwrap();
    let ids = enter_all(&app, sale, &users).await;
    let draw = draw_now(&app, &admin, sale).await;
    assert_eq!(draw["recipe"], 2, "{draw}");
    let seed = order::unhex(draw["seed"].as_str().unwrap()).unwrap();
    let ordered = order::order_with(order::Recipe::Seed, &seed, &ids);
    assert_ne!(ordered, order::order(&seed, &ids), "the recipes differ");
    // What the version before wrote: the order by the seed's keys, its first two
    // offered the wins, recipe 1 and no digest.
    let (keys, by_rank): (Vec<i64>, Vec<i64>) = order::order_keyed(&seed, &ids).into_iter().unzip();
    let mut tx = app.db.begin().await.unwrap();
    for sql in [
        "UPDATE sale_draws SET recipe = 1, entries_digest = NULL WHERE sale_id = $1",
        "DELETE FROM draw_order WHERE sale_id = $1",
        "UPDATE draw_entries SET rank = NULL, won_at = NULL, claim_until = NULL WHERE sale_id = $1",
    ] {
        sqlx::query(sql).bind(sale).execute(&mut *tx).await.unwrap();
    }
    sqlx::query(
        "INSERT INTO draw_order (sale_id, rank, key8, entry_id)
         SELECT $1, r.rank::int4, r.key8, r.id
         FROM unnest($2::int8[], $3::int8[]) WITH ORDINALITY AS r(key8, id, rank)",
    )
    .bind(sale)
    .bind(&keys)
    .bind(&by_rank)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE draw_entries e SET rank = o.rank, won_at = d.drawn_at,
                claim_until = d.drawn_at + interval '10 minutes'
         FROM draw_order o, sale_draws d
         WHERE e.sale_id = $1 AND o.sale_id = $1 AND d.sale_id = $1
           AND o.entry_id = e.id AND o.rank <= 2",
    )
    .bind(sale)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let cached = app
        .keys
        .draw_view(stampede::domain::SaleId::new(sale).unwrap());
    let _: i64 = app.redis_query(redis::cmd("DEL").arg(&cached)).await;

    let draw = app.get_json(&format!("/api/sales/{sale}/draw"), None).await;
    assert_eq!(draw["recipe"], 1, "{draw}");
    assert!(draw.get("entries_digest").is_none(), "{draw}");
    let winners: Vec<i64> = draw["winners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["entry_id"].as_i64().unwrap())
        .collect();
    assert_eq!(winners, ordered[..2]);
    let user_of = |entry: i64| &users[ids.iter().position(|&e| e == entry).unwrap()];
    for (i, &entry) in ordered[2..].iter().enumerate() {
        let standing = me(&app, sale, user_of(entry)).await;
        assert_eq!(standing["state"], "waitlisted", "{standing}");
        assert_eq!(standing["position"], i as i64 + 1);
    }
    let (ok, text) = verify(&app, sale).await;
    assert!(ok, "{text}");
    assert!(!text.contains("entries digest"), "{text}");
}

/// A storm of readers at the draw: the publication is read from Postgres once per
/// cache lifetime (0.8 to 1.2 s), whatever the number of readers, and every reader
/// gets the same seed and winners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_a_published_draw_cost_one_read_a_second() {
    let app = std::sync::Arc::new(spawn_app().await);
    let admin = app.admin().await;
    let users = app.create_users(6, false).await;
    let sale = draw_sale(&app, &admin, 2, json!({})).await["id"]
        .as_i64()
        .unwrap();
    enter_all(&app, sale, &users).await;
    let draw = draw_now(&app, &admin, sale).await;
    // Cold, as at the draw's first second (`draw_now` read it once).
    let cached = app
        .keys
        .draw_view(stampede::domain::SaleId::new(sale).unwrap());
    let _: i64 = app.redis_query(redis::cmd("DEL").arg(&cached)).await;
    let before = app.state.cache.stats();
    let started = Instant::now();
    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let app = app.clone();
        readers.spawn(async move {
            let resp = app.get(&format!("/api/sales/{sale}/draw"), None).await;
            assert_eq!(resp.status(), StatusCode::OK);
            resp.json::<Value>().await.unwrap()
        });
    }
    while let Some(read) = readers.join_next().await {
        let read = read.unwrap();
        assert_eq!(
            (&read["seed"], &read["winners"]),
            (&draw["seed"], &draw["winners"])
        );
    }
    let elapsed = started.elapsed();
    let loads = app.state.cache.stats().loads - before.loads;
    let windows = 1 + elapsed.as_millis() as u64 / 800;
    assert!(
        (1..=windows).contains(&loads),
        "{loads} reads of the publication in {elapsed:?}: at most {windows}"
    );
}

/// How long a draw of 1,000,000 entries takes, end to end (read the entries,
/// order them, write the ranks and the wins, commit): the issue asks under 10 s.
/// Ignored (a minute of machine): `cargo nextest run --test api --run-ignored
/// only draw_of_a_million`.
#[tokio::test]
#[ignore = "benchmark: prints the draw's time, asserts only the counts"]
async fn draw_of_a_million_entries() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let sale = draw_sale(&app, &admin, 100, json!({})).await["id"]
        .as_i64()
        .unwrap();
    sqlx::query(
        "INSERT INTO draw_entries (sale_id, user_id) SELECT $1, g FROM generate_series(1, 1000000) g",
    )
    .bind(sale)
    .execute(&app.db)
    .await
    .unwrap();
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM draw_entries WHERE sale_id = $1")
        .bind(sale)
        .fetch_all(&app.db)
        .await
        .unwrap();
    let started = Instant::now();
    let ordered = order::order(&[5u8; 32], &ids);
    let ordering = started.elapsed();
    assert_eq!(ordered.len(), 1_000_000);
    // Due now: timed from here until drawn, by this call or the server's loop.
    sqlx::query("UPDATE sales SET starts_at = now() WHERE id = $1")
        .bind(sale)
        .execute(&app.db)
        .await
        .unwrap();
    let started = Instant::now();
    let id = stampede::domain::Id::new(sale).unwrap();
    let drawn = loop {
        let once = stampede::sale::draw::run::draw_once(
            &app.db,
            &app.redis,
            &app.keys,
            id,
            Duration::from_secs(600),
        )
        .await
        .unwrap();
        let done: bool =
            sqlx::query_scalar("SELECT drawn_at IS NOT NULL FROM sale_draws WHERE sale_id = $1")
                .bind(sale)
                .fetch_one(&app.db)
                .await
                .unwrap();
        if done {
            break once;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = started.elapsed();
    println!(
        "draw of 1,000,000 entries: {took:.2?} end to end ({}); the order alone: {ordering:.2?}",
        if drawn.is_some() {
            "drawn by this call"
        } else {
            "drawn by the server's loop, timed from this call"
        }
    );
    assert_eq!(
        app.count("SELECT count(DISTINCT entry_id) FROM draw_order")
            .await,
        1_000_000
    );
    assert_eq!(
        app.count("SELECT count(*) FROM draw_entries WHERE won_at IS NOT NULL")
            .await,
        100
    );
}

/// Signed out, a draw sale's page offers signing in to enter until the draw;
/// once drawn it shows the draw's outcome and "How this draw was made", and
/// no longer offers to sign in to enter.
#[tokio::test]
async fn a_signed_out_visitor_sees_the_draws_outcome_once_drawn() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let users = app.create_users(2, false).await;
    let sale = draw_sale(&app, &admin, 1, json!({})).await["id"]
        .as_i64()
        .unwrap();
    let page = || async {
        let resp = app.get(&format!("/sales/{sale}"), None).await;
        assert_eq!(resp.status(), StatusCode::OK);
        resp.text().await.unwrap()
    };
    let signin = r#"data-field="signin-buy">Sign in to enter the draw</a>"#;
    let link = format!(
        r#"data-field="draw-link"><a href="/sales/{sale}/draw">How this draw was made</a>"#
    );
    let before = page().await;
    assert!(
        before.contains("Enter the draw for a chance to buy."),
        "{before}"
    );
    assert!(before.contains(signin), "{before}");
    assert!(before.contains("then enter the draw."), "{before}");
    assert!(
        !before.contains(&link),
        "no outcome before the draw: {before}"
    );

    enter_all(&app, sale, &users).await;
    draw_now(&app, &admin, sale).await;
    let after = page().await;
    assert!(after.contains("The draw has been made."), "{after}");
    assert!(after.contains("Only its winners may buy."), "{after}");
    assert!(after.contains(&link), "{after}");
    assert!(!after.contains(signin), "{after}");
    // Entries are closed: nobody is told to sign up and enter.
    assert!(!after.contains("then enter the draw"), "{after}");
    assert!(
        after.contains(r#"data-field="signin-buy" hidden>Sign in to enter the draw</a>"#),
        "{after}"
    );
}
