//! Ballot kinds (issue 51): `single`, `multi`, `budget`, `ranked`, `allow_change`,
//! the vote's `Idempotency-Key`, receipts and `my-ballot`; Redis's tallies and
//! Postgres's rows agree after settlement, and a rebuild keeps what was replaced
//! replaced and what was spent spent.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{SubsecRound, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};
use stampede::domain::Id;

use crate::helpers::{TestApp, User, assert_error, merged, poll_ids, spawn_app};

/// A poll open now with three options and these ballot settings; its id and
/// option ids.
async fn ballot_poll(app: &TestApp, admin: &User, settings: Value) -> (i64, Vec<i64>) {
    let now = Utc::now().trunc_subsecs(0);
    let body = json!({
        "question": "Best act?",
        "options": ["Alto", "Bass", "Cello"],
        "opens_at": now - chrono::Duration::minutes(1),
        "closes_at": now + chrono::Duration::hours(1),
    });
    let body = merged(body, &settings);
    poll_ids(&app.admin_create(admin, "/api/admin/polls", &body).await)
}

async fn send(
    app: &TestApp,
    poll: i64,
    user: &User,
    body: Value,
    key: Option<&str>,
) -> reqwest::Response {
    let mut req = app
        .client
        .post(app.url(&format!("/api/polls/{poll}/votes")))
        .bearer_auth(&user.token)
        .json(&body);
    if let Some(key) = key {
        req = req.header("Idempotency-Key", key);
    }
    req.send().await.unwrap()
}

/// A vote that must be accepted: its 202 body.
async fn accepted(app: &TestApp, poll: i64, user: &User, body: Value) -> Value {
    let resp = send(app, poll, user, body.clone(), None).await;
    let status = resp.status();
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{body} -> {answer}");
    answer
}

/// The live tallies Redis holds, option -> count (0 when absent).
async fn redis_tally(app: &TestApp, poll: i64) -> HashMap<i64, i64> {
    app.redis_query(redis::cmd("HGETALL").arg(app.keys.poll(Id::new(poll).unwrap()).tally))
        .await
}

/// The admin poll view's live and settled tallies, option -> votes.
async fn both_tallies(app: &TestApp, admin: &User, poll: i64) -> (Vec<i64>, Vec<i64>) {
    let view = app
        .get_json(&format!("/api/admin/polls/{poll}"), Some(&admin.token))
        .await;
    let votes = |v: &Value| -> Vec<i64> {
        v.as_array()
            .unwrap_or_else(|| panic!("{view}"))
            .iter()
            .map(|t| t["votes"].as_i64().unwrap())
            .collect()
    };
    (votes(&view["results"]["tallies"]), votes(&view["settled"]))
}

/// The admin poll view's `settled_voters`, and the admin page's "Voters,
/// settled": the same number, each voter once.
async fn settled_voters(app: &TestApp, admin: &User, poll: i64) -> i64 {
    let view = app
        .get_json(&format!("/api/admin/polls/{poll}"), Some(&admin.token))
        .await;
    let n = view["settled_voters"].as_i64().unwrap();
    let page = app
        .html_status(&format!("/admin/polls/{poll}"), Some(admin), StatusCode::OK)
        .await;
    assert!(
        page.contains(&format!(r#"<dd data-field="settled-voters">{n}</dd>"#)),
        "the page says another number than {n}"
    );
    n
}

/// Waits until Postgres holds `rows` vote rows of the poll.
async fn settled_rows(app: &TestApp, poll: i64, rows: i64) {
    assert_eq!(app.wait_for_votes(poll, rows).await, rows);
}

/// `PATCH /api/admin/polls/{id}` with `edit`, as `admin`.
async fn patch_poll(app: &TestApp, admin: &User, id: i64, edit: &Value) -> reqwest::Response {
    app.client
        .patch(app.url(&format!("/api/admin/polls/{id}")))
        .bearer_auth(&admin.token)
        .json(edit)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn settings_are_checked_together_and_named_when_refused() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let now = Utc::now().trunc_subsecs(0);
    let base = json!({
        "question": "Q?", "options": ["a", "b", "c"],
        "opens_at": now + chrono::Duration::hours(1),
        "closes_at": now + chrono::Duration::hours(2),
    });
    for (settings, names) in [
        (json!({"ballot": "approval"}), "ballot"),
        (json!({"ballot": "multi", "max_choices": 4}), "max_choices"),
        (json!({"ballot": "multi", "max_choices": 0}), "max_choices"),
        (
            json!({"ballot": "ranked", "max_choices": "2"}),
            "max_choices",
        ),
        (json!({"max_choices": 2}), "max_choices"),
        (json!({"ballot": "budget"}), "votes_per_user"),
        (
            json!({"ballot": "budget", "votes_per_user": 1001}),
            "votes_per_user",
        ),
        (
            json!({"ballot": "budget", "votes_per_user": 5, "max_per_option": 6}),
            "max_per_option",
        ),
        (
            json!({"ballot": "budget", "votes_per_user": 5, "allow_change": true}),
            "allow_change",
        ),
        (json!({"votes_per_user": 5}), "votes_per_user"),
        (json!({"allow_change": "yes"}), "allow_change"),
    ] {
        let body = merged(base.clone(), &settings);
        let resp = app
            .post_json("/api/admin/polls", Some(&admin.token), &body)
            .await;
        let err = assert_error(
            resp,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_ballot_settings",
        )
        .await;
        assert!(
            err["message"].as_str().unwrap().contains(names),
            "{settings}: {err}"
        );
    }
    assert_eq!(
        app.count("SELECT count(*) FROM polls").await,
        0,
        "a refused poll was written"
    );

    // Defaults, and an edit that changes the kind before the opening.
    let mut body = base.clone();
    body["ballot"] = json!("budget");
    body["votes_per_user"] = json!(10);
    let poll = app.admin_create(&admin, "/api/admin/polls", &body).await;
    assert_eq!(
        (
            &poll["ballot"],
            &poll["votes_per_user"],
            &poll["max_per_option"],
            &poll["allow_change"]
        ),
        (&json!("budget"), &json!(10), &json!(10), &json!(false)),
        "{poll}"
    );
    let id = poll["id"].as_i64().unwrap();
    // A cap of the whole budget follows the budget; a cap below it stays.
    for (edit, budget, cap) in [
        (json!({"votes_per_user": 5}), 5, 5),
        (json!({"max_per_option": 3}), 5, 3),
        (json!({"votes_per_user": 8}), 8, 3),
    ] {
        let resp = patch_poll(&app, &admin, id, &edit).await;
        assert_eq!(resp.status(), StatusCode::OK, "{edit}");
        let poll: Value = resp.json().await.unwrap();
        assert_eq!(
            (&poll["votes_per_user"], &poll["max_per_option"]),
            (&json!(budget), &json!(cap)),
            "{edit}: {poll}"
        );
    }
    let edit = json!({"ballot": "ranked", "max_choices": 2, "allow_change": true});
    let resp = patch_poll(&app, &admin, id, &edit).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let poll: Value = resp.json().await.unwrap();
    assert_eq!(
        (
            &poll["ballot"],
            &poll["max_choices"],
            &poll["votes_per_user"],
            &poll["allow_change"]
        ),
        (&json!("ranked"), &json!(2), &Value::Null, &json!(true)),
        "{poll}"
    );
    // A field left out keeps its number; max_choices sent as null is every option again.
    for (edit, max_choices) in [
        (json!({"allow_change": false}), json!(2)),
        (json!({"max_choices": null}), Value::Null),
    ] {
        let resp = patch_poll(&app, &admin, id, &edit).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let poll: Value = resp.json().await.unwrap();
        assert_eq!(poll["max_choices"], max_choices, "after {edit}: {poll}");
    }
}

#[tokio::test]
async fn a_multi_ballot_is_all_or_nothing_and_counts_each_choice_once() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, o) = ballot_poll(&app, &admin, json!({"ballot": "multi", "max_choices": 2})).await;
    let (_, foreign) = ballot_poll(&app, &admin, json!({})).await;
    let users = app.create_users(3, false).await;
    let v = &users[0];
    for (body, status, code) in [
        (json!({"option_id": o[0]}), 422, "invalid_ballot"),
        (json!({"ranking": [o[0]]}), 422, "invalid_ballot"),
        (json!({"option_ids": []}), 422, "invalid_ballot"),
        (json!({"option_ids": [o[0], o[0]]}), 422, "invalid_ballot"),
        (
            json!({"option_ids": [o[0], o[1], o[2]]}),
            422,
            "invalid_ballot",
        ),
        (
            json!({"option_ids": [o[0], foreign[0]]}),
            422,
            "unknown_option",
        ),
        (json!({"option_ids": [o[0], -3]}), 422, "unknown_option"),
        (
            json!({"option_ids": [o[0]], "option_id": o[1]}),
            422,
            "invalid_ballot",
        ),
    ] {
        let resp = send(&app, poll, v, body.clone(), None).await;
        assert_error(resp, StatusCode::from_u16(status).unwrap(), code).await;
    }
    let first = accepted(&app, poll, v, json!({"option_ids": [o[2], o[0]]})).await;
    assert_eq!(first["option_ids"], json!([o[2], o[0]]));
    assert_eq!(first["replaced"], false);
    let again = send(&app, poll, v, json!({"option_ids": [o[1]]}), None).await;
    assert_error(again, StatusCode::CONFLICT, "already_voted").await;
    accepted(&app, poll, &users[1], json!({"option_ids": [o[0]]})).await;
    accepted(&app, poll, &users[2], json!({"option_ids": [o[0], o[1]]})).await;
    settled_rows(&app, poll, 3).await;
    let (live, settled) = both_tallies(&app, &admin, poll).await;
    assert_eq!(live, vec![3, 1, 1]);
    assert_eq!(settled, live);
    // Three voters, five picks.
    assert_eq!(settled_voters(&app, &admin, poll).await, 3);
    let choices: Vec<Vec<i64>> =
        sqlx::query_scalar("SELECT choices FROM votes WHERE poll_id = $1 AND user_id = $2")
            .bind(poll)
            .bind(v.id)
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(choices, vec![vec![o[2], o[0]]]);
    let results = app.poll_results(poll).await;
    assert_eq!(results["voters"], 3);
}

#[tokio::test]
async fn a_budget_is_spent_whole_over_several_requests_and_never_past_its_caps() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, o) = ballot_poll(
        &app,
        &admin,
        json!({"ballot": "budget", "votes_per_user": 10, "max_per_option": 6}),
    )
    .await;
    let v = &app.create_users(1, false).await[0];
    let wrong = send(&app, poll, v, json!({"option_id": o[0]}), None).await;
    assert_error(wrong, StatusCode::UNPROCESSABLE_ENTITY, "invalid_ballot").await;
    let zero = send(&app, poll, v, json!({"option_id": o[0], "count": 0}), None).await;
    assert_error(zero, StatusCode::UNPROCESSABLE_ENTITY, "invalid_ballot").await;

    let a = accepted(&app, poll, v, json!({"option_id": o[0], "count": 4})).await;
    assert_eq!(
        (&a["remaining"], &a["option_remaining"], &a["count"]),
        (&json!(6), &json!(2), &json!(4))
    );
    // Past the option's cap: nothing spent, the numbers left in the body.
    let over = send(&app, poll, v, json!({"option_id": o[0], "count": 3}), None).await;
    let body = assert_error(over, StatusCode::UNPROCESSABLE_ENTITY, "over_budget").await;
    assert_eq!(
        (&body["remaining"], &body["option_remaining"]),
        (&json!(6), &json!(2))
    );
    let b = accepted(&app, poll, v, json!({"option_id": o[1], "count": 5})).await;
    assert_eq!(
        (&b["remaining"], &b["option_remaining"]),
        (&json!(1), &json!(1))
    );
    // Past what is left overall.
    let over = send(&app, poll, v, json!({"option_id": o[2], "count": 2}), None).await;
    let body = assert_error(over, StatusCode::UNPROCESSABLE_ENTITY, "over_budget").await;
    assert_eq!(
        (&body["remaining"], &body["option_remaining"]),
        (&json!(1), &json!(1))
    );
    let c = accepted(&app, poll, v, json!({"option_id": o[2], "count": 1})).await;
    assert_eq!(c["remaining"], 0);
    let spent = send(&app, poll, v, json!({"option_id": o[2], "count": 1}), None).await;
    let body = assert_error(spent, StatusCode::CONFLICT, "budget_spent").await;
    assert_eq!(body["remaining"], 0);

    settled_rows(&app, poll, 3).await;
    let (live, settled) = both_tallies(&app, &admin, poll).await;
    assert_eq!(live, vec![4, 5, 1]);
    assert_eq!(settled, live);
    // One voter, ten votes in three requests.
    assert_eq!(settled_voters(&app, &admin, poll).await, 1);
    let mine = app
        .get_json(&format!("/api/polls/{poll}/my-ballot"), Some(&v.token))
        .await;
    assert_eq!(mine["remaining"], 0, "{mine}");
    assert_eq!(
        mine["votes"],
        json!([{"option_id": o[0], "count": 4}, {"option_id": o[1], "count": 5}, {"option_id": o[2], "count": 1}])
    );
    let receipts: Vec<&Value> = mine["receipts"].as_array().unwrap().iter().collect();
    assert_eq!(receipts.len(), 3);
    for (r, answer) in receipts.iter().zip([&a, &b, &c]) {
        assert_eq!(r["receipt"], answer["receipt"]);
        assert_eq!(
            (&r["settled"], &r["replaced"]),
            (&json!(true), &json!(false))
        );
    }
    assert_eq!(mine["settled"], true);
}

#[tokio::test]
async fn a_budget_voter_on_two_servers_at_once_never_spends_past_the_budget() {
    let app = spawn_app().await;
    let sibling = crate::helpers::spawn_sibling(&app, |_| {}).await;
    let admin = app.admin().await;
    let (poll, o) = ballot_poll(
        &app,
        &admin,
        json!({"ballot": "budget", "votes_per_user": 7, "max_per_option": 7}),
    )
    .await;
    let v = &app.create_users(1, false).await[0];
    let mut sends = Vec::new();
    for k in 0..20 {
        let server = if k % 2 == 0 { &app } else { &sibling };
        sends.push(send(
            server,
            poll,
            v,
            json!({"option_id": o[k % 3], "count": 1 + k % 2}),
            None,
        ));
    }
    let answers = futures_util::future::join_all(sends).await;
    let mut spent = 0;
    for (k, resp) in answers.into_iter().enumerate() {
        match resp.status() {
            StatusCode::ACCEPTED => spent += 1 + k % 2,
            StatusCode::CONFLICT | StatusCode::UNPROCESSABLE_ENTITY => {}
            other => panic!("answer {other}"),
        }
    }
    // Ones and twos in any order: the budget ends full, or one short when only twos
    // came after the sixth vote; never past it, and Redis counts what was answered.
    assert!((6..=7).contains(&spent), "{spent} of 7 spent");
    let total: i64 = redis_tally(&app, poll).await.values().sum();
    assert_eq!(total, spent as i64);
    let mine = app
        .get_json(&format!("/api/polls/{poll}/my-ballot"), Some(&v.token))
        .await;
    assert_eq!(mine["remaining"], json!(7 - spent as i64), "{mine}");
}

#[tokio::test]
async fn a_changed_ballot_leaves_the_tally_as_the_new_one_enters_and_counts_once() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (single, o) = ballot_poll(&app, &admin, json!({"allow_change": true})).await;
    let (ranked, r) = ballot_poll(
        &app,
        &admin,
        json!({"ballot": "ranked", "allow_change": true}),
    )
    .await;
    let users = app.create_users(2, false).await;
    let v = &users[0];
    let first = accepted(&app, single, v, json!({"option_id": o[0]})).await;
    assert_eq!(redis_tally(&app, single).await.get(&o[0]), Some(&1));
    let second = accepted(&app, single, v, json!({"option_id": o[1]})).await;
    assert_eq!(second["replaced"], true);
    assert_ne!(first["receipt"], second["receipt"]);
    let tally = redis_tally(&app, single).await;
    assert_eq!((tally.get(&o[0]), tally.get(&o[1])), (Some(&0), Some(&1)));
    accepted(&app, single, &users[1], json!({"option_id": o[1]})).await;
    settled_rows(&app, single, 3).await;
    let (live, settled) = both_tallies(&app, &admin, single).await;
    assert_eq!(live, vec![0, 2, 0]);
    assert_eq!(settled, live);
    assert_eq!(app.poll_results(single).await["voters"], 2);
    let mine = app
        .get_json(&format!("/api/polls/{single}/my-ballot"), Some(&v.token))
        .await;
    assert_eq!(mine["choices"], json!([o[1]]));
    assert_eq!(mine["receipts"][0]["receipt"], first["receipt"]);
    assert_eq!(mine["receipts"][0]["replaced"], true);
    assert_eq!(mine["receipts"][1]["replaced"], false);

    // Ranked: the tally counts first preferences; a change moves it.
    accepted(&app, ranked, v, json!({"ranking": [r[2], r[0], r[1]]})).await;
    let wrong = send(&app, ranked, v, json!({"option_ids": [r[0]]}), None).await;
    assert_error(wrong, StatusCode::UNPROCESSABLE_ENTITY, "invalid_ballot").await;
    let changed = accepted(&app, ranked, v, json!({"ranking": [r[1], r[2]]})).await;
    assert_eq!(
        (&changed["replaced"], &changed["ranking"]),
        (&json!(true), &json!([r[1], r[2]]))
    );
    let tally = redis_tally(&app, ranked).await;
    assert_eq!((tally.get(&r[2]), tally.get(&r[1])), (Some(&0), Some(&1)));
}

#[tokio::test]
async fn a_keyed_vote_retried_answers_the_first_answer_and_never_counts_twice() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, o) = ballot_poll(
        &app,
        &admin,
        json!({"ballot": "budget", "votes_per_user": 5}),
    )
    .await;
    let v = &app.create_users(1, false).await[0];
    let body = json!({"option_id": o[0], "count": 2});
    let first = send(&app, poll, v, body.clone(), Some("retry-1")).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first: Value = first.json().await.unwrap();
    for _ in 0..3 {
        let again = send(&app, poll, v, body.clone(), Some("retry-1")).await;
        assert_eq!(again.status(), StatusCode::ACCEPTED);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.json::<Value>().await.unwrap(), first);
    }
    let other = send(
        &app,
        poll,
        v,
        json!({"option_id": o[1], "count": 2}),
        Some("retry-1"),
    )
    .await;
    assert_error(
        other,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
    )
    .await;
    let bad = send(&app, poll, v, body.clone(), Some("no spaces")).await;
    assert_error(bad, StatusCode::BAD_REQUEST, "invalid_idempotency_key").await;
    assert_eq!(
        redis_tally(&app, poll).await.get(&o[0]),
        Some(&2),
        "spent once"
    );
    // A refusal is remembered too: the same key answers it again.
    let over = send(
        &app,
        poll,
        v,
        json!({"option_id": o[1], "count": 4}),
        Some("retry-2"),
    )
    .await;
    assert_error(over, StatusCode::UNPROCESSABLE_ENTITY, "over_budget").await;
    let again = send(
        &app,
        poll,
        v,
        json!({"option_id": o[1], "count": 4}),
        Some("retry-2"),
    )
    .await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_error(again, StatusCode::UNPROCESSABLE_ENTITY, "over_budget").await;
    settled_rows(&app, poll, 1).await;
}

#[tokio::test]
async fn receipts_are_derived_from_poll_voter_and_seq_under_the_secret() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, o) = ballot_poll(&app, &admin, json!({})).await;
    let v = &app.create_users(1, false).await[0];
    let answer = accepted(&app, poll, v, json!({"option_id": o[0]})).await;
    let expected = stampede::vote::receipt::receipt(
        app.config.token_secret.as_bytes(),
        Id::new(poll).unwrap(),
        Id::new(v.id).unwrap(),
        1,
    );
    assert_eq!(answer["receipt"], json!(expected));
    let nobody = app.create_users(1, false).await;
    let mine = app
        .get_json(
            &format!("/api/polls/{poll}/my-ballot"),
            Some(&nobody[0].token),
        )
        .await;
    assert_eq!(
        (&mine["voted"], &mine["choices"], &mine["receipts"]),
        (&json!(false), &json!([]), &json!([]))
    );
    let anonymous = app.get(&format!("/api/polls/{poll}/my-ballot"), None).await;
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let missing = app.get("/api/polls/999999/my-ballot", Some(&v.token)).await;
    assert_error(missing, StatusCode::NOT_FOUND, "not_found").await;
}

/// Waits through the rebuild's 503s until the poll answers its results.
async fn until_rebuilt(app: &TestApp, poll: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let resp = app.get(&format!("/api/polls/{poll}/results"), None).await;
        if resp.status() == StatusCode::OK {
            return;
        }
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(Instant::now() < deadline, "the poll never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wipe_keeps_budgets_spent_and_changed_ballots_changed() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (budget, b) = ballot_poll(
        &app,
        &admin,
        json!({"ballot": "budget", "votes_per_user": 3, "max_per_option": 2}),
    )
    .await;
    let (multi, m) = ballot_poll(
        &app,
        &admin,
        json!({"ballot": "multi", "allow_change": true}),
    )
    .await;
    let users = app.create_users(2, false).await;
    let (v, w) = (&users[0], &users[1]);
    accepted(&app, budget, v, json!({"option_id": b[0], "count": 2})).await;
    let keyed = send(
        &app,
        budget,
        v,
        json!({"option_id": b[1], "count": 1}),
        Some("k-1"),
    )
    .await;
    assert_eq!(keyed.status(), StatusCode::ACCEPTED);
    let keyed: Value = keyed.json().await.unwrap();
    accepted(&app, budget, w, json!({"option_id": b[0], "count": 1})).await;
    accepted(&app, multi, v, json!({"option_ids": [m[0], m[1]]})).await;
    accepted(&app, multi, v, json!({"option_ids": [m[2]]})).await;
    settled_rows(&app, budget, 3).await;
    settled_rows(&app, multi, 2).await;
    app.wipe().await;
    until_rebuilt(&app, budget).await;
    until_rebuilt(&app, multi).await;

    // The keyed vote's retry after the wipe answers its 202 again, spending nothing.
    let retry = send(
        &app,
        budget,
        v,
        json!({"option_id": b[1], "count": 1}),
        Some("k-1"),
    )
    .await;
    assert_eq!(retry.status(), StatusCode::ACCEPTED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.json::<Value>().await.unwrap(), keyed);
    let spent = send(
        &app,
        budget,
        v,
        json!({"option_id": b[2], "count": 1}),
        None,
    )
    .await;
    assert_error(spent, StatusCode::CONFLICT, "budget_spent").await;
    let capped = send(
        &app,
        budget,
        w,
        json!({"option_id": b[0], "count": 2}),
        None,
    )
    .await;
    let body = assert_error(capped, StatusCode::UNPROCESSABLE_ENTITY, "over_budget").await;
    assert_eq!(
        (&body["remaining"], &body["option_remaining"]),
        (&json!(2), &json!(1))
    );
    assert_eq!(redis_tally(&app, budget).await.get(&b[0]), Some(&3));
    // The rebuild holds the changed ballot, not the first.
    let mine = app
        .get_json(&format!("/api/polls/{multi}/my-ballot"), Some(&v.token))
        .await;
    assert_eq!(mine["choices"], json!([m[2]]), "{mine}");
    assert_eq!(both_tallies(&app, &admin, multi).await.0, vec![0, 0, 1]);
    let changed = accepted(&app, multi, v, json!({"option_ids": [m[1]]})).await;
    assert_eq!(changed["replaced"], true);
    let mine = app
        .get_json(&format!("/api/polls/{multi}/my-ballot"), Some(&v.token))
        .await;
    assert_eq!(mine["receipts"].as_array().unwrap().len(), 3, "{mine}");
    settled_rows(&app, multi, 3).await;
    let (live, settled) = both_tallies(&app, &admin, multi).await;
    assert_eq!(live, vec![0, 1, 0]);
    assert_eq!(settled, live);
}

#[tokio::test]
async fn a_closed_ranked_poll_shows_its_instant_runoff_rounds_and_winner() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, r) = ballot_poll(&app, &admin, json!({"ballot": "ranked"})).await;
    // First preferences 2 Alto, 2 Bass, 1 Cello; Cello's voter prefers Bass next.
    let users = app.create_users(5, false).await;
    for (user, ranking) in users.iter().zip([
        vec![r[0]],
        vec![r[0], r[1]],
        vec![r[1]],
        vec![r[1], r[0]],
        vec![r[2], r[1]],
    ]) {
        accepted(&app, poll, user, json!({ "ranking": ranking })).await;
    }
    let open = app.poll_results(poll).await;
    assert!(
        open.get("runoff").is_none(),
        "an open poll has no runoff: {open}"
    );
    assert_eq!(open["tallies"][0]["votes"], 2, "first preferences: {open}");
    app.close_poll(&admin, poll).await;
    let closed = app.poll_results(poll).await;
    let runoff = &closed["runoff"];
    assert_eq!(runoff["ballots"], 5, "{closed}");
    assert_eq!(runoff["winner"], r[1], "{closed}");
    let rounds = runoff["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2, "{closed}");
    assert_eq!(rounds[0]["eliminated"], json!([r[2]]));
    assert_eq!(
        rounds[1]["tallies"],
        json!([{"option_id": r[0], "votes": 2}, {"option_id": r[1], "votes": 3}])
    );
    assert!(runoff["tie_rule"].as_str().is_some_and(|t| !t.is_empty()));
    // The list's results carry the same runoff.
    let list = app.get_json("/api/polls", None).await;
    let item = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == poll)
        .unwrap_or_else(|| panic!("the poll is listed: {list}"));
    assert_eq!(&item["results"]["runoff"], runoff, "{item}");
}

/// One key twice in one batch, first with an option of no poll (a refusal not
/// remembered), then with a known one: the second is the key's use with another
/// ballot, never the first's `unknown_option`; the same ballot twice gets the
/// same answer; nothing is counted.
#[tokio::test]
async fn one_key_twice_in_a_batch_with_two_ballots_is_the_keys_reuse() {
    use stampede::domain::PurchaseKey;
    use stampede::vote::cast::{Ballot, VoteBatch, VoteOutcome, VoteRequest};
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, o) = ballot_poll(&app, &admin, json!({})).await;
    let voter = &app.create_users(1, false).await[0];
    let vote = |option: i64| VoteRequest {
        user: Id::new(voter.id).unwrap(),
        ballot: Ballot::Single(option),
        key: Some(PurchaseKey::parse(b"press-1").unwrap()),
        ip: None,
    };
    let batch = VoteBatch {
        keys: &app.keys,
        poll: Id::new(poll).unwrap(),
        policies: &[],
        now_ms: None,
        key_ttl_ms: 86_400_000,
    };
    let unknown = 999_999_999;
    let replies = batch
        .run(
            &mut app.redis.clone(),
            &[vote(unknown), vote(o[0]), vote(unknown)],
        )
        .await
        .unwrap();
    let outcomes: Vec<_> = replies.iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes,
        [
            VoteOutcome::UnknownOption,
            VoteOutcome::KeyReused,
            VoteOutcome::UnknownOption
        ]
    );
    assert!(redis_tally(&app, poll).await.values().all(|&n| n == 0));
}
