//! Voting: one vote per user per poll under concurrency, tallies that match the
//! accepted choices, and Postgres agreeing with Redis after settlement.

use std::collections::HashMap;
use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::helpers::{
    Db, TestApp, assert_error, limits, patched, spawn_app, spawn_app_with, spawn_with_open_poll,
    window_policy,
};

async fn db_tallies(app: &TestApp, poll: i64) -> HashMap<i64, i64> {
    let rows: Vec<(i64, i64)> = app
        .rows(
            "SELECT option_id, count(*) FROM votes WHERE poll_id = $1 GROUP BY option_id",
            poll,
        )
        .await;
    rows.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_users_voting_five_times_count_once_each() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, options) = app
        .open_poll(
            &admin,
            "Best phone colour?",
            &["red", "green", "blue", "black"],
        )
        .await;
    let users = app.create_users(1000, false).await;

    // Each user sends 5 votes: option picks vary, and every fifth user's first two
    // attempts name an option of no poll (refused, must not use up their vote).
    let mut attempts = Vec::with_capacity(5000);
    for (i, u) in users.iter().enumerate() {
        for round in 0..5 {
            let option = if i % 5 == 0 && round < 2 {
                999_999_999
            } else {
                options[(i + round) % options.len()]
            };
            attempts.push((u.id, u.token.clone(), option));
        }
    }
    let barrier = Arc::new(Barrier::new(attempts.len()));
    let app = Arc::new(app);
    let mut tasks = Vec::new();
    for (user, token, option) in attempts {
        let (app, barrier) = (app.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let resp = app.vote(poll, &token, option).await;
            let status = resp.status();
            let body: Value = resp.json().await.unwrap();
            (user, option, status, body)
        }));
    }
    let mut accepted: HashMap<i64, i64> = HashMap::new();
    let (mut duplicate, mut invalid) = (0, 0);
    for t in tasks {
        let (user, option, status, body) = t.await.unwrap();
        match status {
            StatusCode::ACCEPTED => {
                assert!(
                    accepted.insert(user, option).is_none(),
                    "user {user} voted twice"
                );
            }
            StatusCode::CONFLICT => {
                assert_eq!(body["error"], "already_voted");
                duplicate += 1;
            }
            StatusCode::UNPROCESSABLE_ENTITY => {
                assert_eq!(body["error"], "unknown_option");
                invalid += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(accepted.len(), 1000, "every user's vote counted once");
    assert_eq!(invalid, 400);
    assert_eq!(duplicate, 5000 - 1000 - 400);

    let mut expected: HashMap<i64, i64> = options.iter().map(|o| (*o, 0)).collect();
    for option in accepted.values() {
        *expected.get_mut(option).expect("accepted option is real") += 1;
    }
    assert_eq!(
        app.poll_tallies(poll).await,
        expected,
        "tallies equal the accepted choices"
    );

    // After settlement Postgres agrees with Redis, vote by vote.
    assert_eq!(app.wait_for_votes(poll, 1000).await, 1000);
    let db: HashMap<i64, i64> = db_tallies(&app, poll).await;
    let nonzero: HashMap<i64, i64> = expected.into_iter().filter(|(_, n)| *n > 0).collect();
    assert_eq!(db, nonzero);
    let rows: Vec<(i64, i64)> = app
        .rows(
            "SELECT user_id, option_id FROM votes WHERE poll_id = $1",
            poll,
        )
        .await;
    assert_eq!(rows.into_iter().collect::<HashMap<_, _>>(), accepted);
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_option_and_closed_poll_change_nothing() {
    let (app, admin, (poll, options)) =
        spawn_with_open_poll("Best phone colour?", &["yes", "no"]).await;
    let (other_poll, other_options) = app
        .open_poll(&admin, "Best phone colour?", &["a", "b"])
        .await;
    let voter = app.user().await;

    // An option of another poll, zero, negative, a string: all refused.
    assert_error(
        app.vote(poll, &voter.token, other_options[0]).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_option",
    )
    .await;
    assert_error(
        app.vote(poll, &voter.token, 0).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_option",
    )
    .await;
    assert_error(
        app.vote(poll, &voter.token, -3).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_option",
    )
    .await;
    let resp = app
        .post_json(
            &format!("/api/polls/{poll}/votes"),
            Some(&voter.token),
            &json!({"option_id": "yes"}),
        )
        .await;
    assert_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body").await;
    assert_eq!(app.poll_results(poll).await["voters"], 0);
    assert!(app.poll_tallies(poll).await.values().all(|n| *n == 0));

    // The refused attempts did not use up the vote.
    assert_eq!(
        app.vote(poll, &voter.token, options[1]).await.status(),
        StatusCode::ACCEPTED
    );
    assert_error(
        app.vote(poll, &voter.token, options[0]).await,
        StatusCode::CONFLICT,
        "already_voted",
    )
    .await;

    // Closed early: refused, tallies untouched.
    let resp = app.close_poll(&admin, other_poll).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(app.poll_results(other_poll).await["closed"], true);
    assert_error(
        app.vote(other_poll, &voter.token, other_options[0]).await,
        StatusCode::GONE,
        "closed",
    )
    .await;
    assert!(app.poll_tallies(other_poll).await.values().all(|n| *n == 0));

    // Not yet open.
    let (later, later_options) = app
        .create_poll(&admin, "Best phone colour?", &["x", "y"], 3600, 7200)
        .await;
    assert_error(
        app.vote(later, &voter.token, later_options[0]).await,
        StatusCode::CONFLICT,
        "not_open",
    )
    .await;

    // Unknown and malformed poll ids.
    assert_error(
        app.vote(987_654, &voter.token, options[0]).await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let resp = app
        .post_json(
            "/api/polls/abc/votes",
            Some(&voter.token),
            &json!({"option_id": 1}),
        )
        .await;
    assert_error(resp, StatusCode::BAD_REQUEST, "invalid_id").await;
    app.assert_get_error(
        "/api/polls/987654",
        None,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    // Not signed in.
    let resp = app
        .post_json(
            &format!("/api/polls/{poll}/votes"),
            None,
            &json!({"option_id": options[0]}),
        )
        .await;
    assert_error(resp, StatusCode::UNAUTHORIZED, "unauthorized").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn poll_creation_is_validated() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let now = chrono::Utc::now();
    let base = json!({
        "question": "Q?", "options": ["a", "b"],
        "opens_at": now, "closes_at": now + chrono::Duration::hours(1),
    });
    let many: Vec<String> = (0..21).map(|i| format!("o{i}")).collect();
    for (patch, code) in [
        (json!({"options": ["only one"]}), "invalid_options"),
        (json!({"options": many}), "invalid_options"),
        (json!({"options": ["same", "Same"]}), "invalid_options"),
        // Labels that look the same: a zero-width space, a word joiner, spaces.
        (
            json!({"options": ["B", "B\u{200b}", "C"]}),
            "invalid_options",
        ),
        (json!({"options": ["B", "\u{2060}b"]}), "invalid_options"),
        (
            json!({"options": ["New York", "New  York"]}),
            "invalid_options",
        ),
        // One that shows nothing, one that reverses what follows it.
        (json!({"options": ["ok", "\u{200b}"]}), "invalid_text"),
        (json!({"options": ["ok", "abc\u{202e}fed"]}), "invalid_text"),
        (json!({"question": "Q\u{2066}?"}), "invalid_text"),
        (json!({"options": ["ok", ""]}), "invalid_text"),
        (json!({"question": ""}), "invalid_text"),
        (
            json!({"closes_at": now - chrono::Duration::hours(2)}),
            "invalid_window",
        ),
    ] {
        let resp = app
            .post_json(
                "/api/admin/polls",
                Some(&admin.token),
                &patched(&base, &patch),
            )
            .await;
        assert_error(resp, StatusCode::UNPROCESSABLE_ENTITY, code).await;
    }
    let user = app.user().await;
    let resp = app
        .post_json("/api/admin/polls", Some(&user.token), &base)
        .await;
    assert_error(resp, StatusCode::FORBIDDEN, "forbidden").await;
    let polls = app.count("SELECT count(*) FROM polls").await;
    assert_eq!(polls, 0);
    let resp = app
        .post_json("/api/admin/polls", Some(&admin.token), &base)
        .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread")]
async fn one_address_voting_faster_than_the_ip_limit_is_cut_off() {
    // The vote policies of the shipped defaults, with the per-IP one made a sliding
    // log so the count is exact (the default sliding counter is approximate across a
    // window boundary).
    let app = spawn_app_with(|c| {
        c.limits = limits(&[
            window_policy("vote-user", "vote", "user", "sliding_log", 5, 10_000),
            window_policy("vote-ip", "vote", "ip", "sliding_log", 60, 10_000),
        ])
    })
    .await;
    let admin = app.admin().await;
    let (poll, options) = app
        .open_poll(&admin, "Best phone colour?", &["up", "down"])
        .await;
    // A script with 80 accounts behind one address.
    let users = app.create_users(80, false).await;
    let mut accepted = 0;
    let mut limited = Vec::new();
    for u in &users {
        let resp = app.vote(poll, &u.token, options[0]).await;
        match resp.status() {
            StatusCode::ACCEPTED => {
                assert!(resp.headers().contains_key("ratelimit"));
                accepted += 1;
            }
            StatusCode::TOO_MANY_REQUESTS => limited.push(resp),
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(accepted, 60, "the per-IP limit lets exactly 60 through");
    assert_eq!(limited.len(), 20);
    let resp = limited.pop().unwrap();
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=10).contains(&retry));
    assert!(
        resp.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .contains(r#""vote-ip";q=60;w=10"#)
    );
    assert!(resp.headers().contains_key("ratelimit"));
    assert_error(resp, StatusCode::TOO_MANY_REQUESTS, "rate_limited").await;
    // Refused votes changed nothing.
    let tallies = app.poll_tallies(poll).await;
    assert_eq!(tallies[&options[0]], 60);
    assert_eq!(app.poll_results(poll).await["voters"], 60);
}

/// An admin's close races a stream of votes: every vote the poll took is stamped
/// no later than the poll's `closed_at` (the close is stamped by the Redis clock
/// that stamps the votes, once Redis took it), and every vote after it is 410.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_vote_taken_is_stamped_after_the_close() {
    let app = Arc::new(spawn_app().await);
    let admin = app.admin().await;
    let (poll, options) = app.open_poll(&admin, "Closing soon?", &["yes", "no"]).await;
    let users = app.create_users(400, false).await;
    let mut tasks = Vec::new();
    for (i, u) in users.into_iter().enumerate() {
        let app = app.clone();
        let option = options[i % 2];
        tasks.push(tokio::spawn(async move {
            // Spread over about 400 ms, so the close lands among them.
            tokio::time::sleep(std::time::Duration::from_millis(i as u64)).await;
            app.vote(poll, &u.token, option).await.status()
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(app.close_poll(&admin, poll).await.status(), StatusCode::OK);
    let mut taken = 0;
    for t in tasks {
        match t.await.unwrap() {
            StatusCode::ACCEPTED => taken += 1,
            StatusCode::GONE => {}
            other => panic!("a vote answered {other}"),
        }
    }
    assert!(taken > 0, "the close came before every vote");
    assert_eq!(app.wait_for_votes(poll, taken).await, taken);
    let late: Vec<(i64,)> = app
        .rows(
            "SELECT count(*) FROM votes v JOIN polls p ON p.id = v.poll_id
             WHERE v.poll_id = $1 AND v.voted_at > p.closed_at",
            poll,
        )
        .await;
    assert_eq!(
        late[0].0, 0,
        "votes stamped after the close ({taken} taken)"
    );
}
