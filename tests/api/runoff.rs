//! A ranked poll's instant runoff follows the ballots Redis holds: a ballot changed
//! without the number of voters changing (a recovery that restores a voter's later
//! ballot, a change taken at the close, a change while open) shows in the next
//! results, on the server that read the runoff before as on any other.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{SubsecRound, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};
use stampede::domain::Id;

use crate::helpers::{TestApp, User, merged, poll_ids, spawn_app};

/// A ranked poll that allows changes, open since a minute ago until `closes_in`
/// from now (whole seconds); its id and option ids (Alto, Bass, Cello).
async fn ranked_poll(app: &TestApp, admin: &User, closes_in: chrono::Duration) -> (i64, Vec<i64>) {
    let now = Utc::now().trunc_subsecs(0);
    let body = json!({
        "question": "Best act?",
        "options": ["Alto", "Bass", "Cello"],
        "opens_at": now - chrono::Duration::minutes(1),
        "closes_at": now + closes_in,
    });
    let settings = json!({"ballot": "ranked", "allow_change": true});
    poll_ids(
        &app.admin_create(admin, "/api/admin/polls", &merged(body, &settings))
            .await,
    )
}

/// Ranks `ranking` for `user`: a 202's body.
async fn rank(app: &TestApp, poll: i64, user: &User, ranking: &[i64]) -> Value {
    let resp = app
        .client
        .post(app.url(&format!("/api/polls/{poll}/votes")))
        .bearer_auth(&user.token)
        .json(&json!({ "ranking": ranking }))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{ranking:?} -> {answer}");
    answer
}

/// Five voters: first preferences 2 Alto, 2 Bass, 1 Cello, Cello's voter prefers
/// Alto next, so Alto wins in round 2. The first voter ranks Alto alone.
async fn five_voters(app: &TestApp, poll: i64, r: &[i64]) -> Vec<User> {
    let users = app.create_users(5, false).await;
    for (user, ranking) in users.iter().zip([
        vec![r[0]],
        vec![r[0], r[1]],
        vec![r[1]],
        vec![r[1], r[0]],
        vec![r[2], r[0]],
    ]) {
        rank(app, poll, user, &ranking).await;
    }
    users
}

/// Option -> votes of a list of `{option_id, votes}`.
fn votes(tallies: &Value) -> HashMap<i64, i64> {
    tallies
        .as_array()
        .unwrap_or_else(|| panic!("tallies: {tallies}"))
        .iter()
        .map(|t| {
            (
                t["option_id"].as_i64().unwrap(),
                t["votes"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// The closed poll's runoff: its winner and round 1's tallies.
async fn runoff(app: &TestApp, poll: i64) -> (i64, HashMap<i64, i64>, Value) {
    let results = app.poll_results(poll).await;
    let runoff = &results["runoff"];
    let winner = runoff["winner"]
        .as_i64()
        .unwrap_or_else(|| panic!("a winner: {results}"));
    assert_eq!(runoff["ballots"], 5, "{results}");
    (winner, votes(&runoff["rounds"][0]["tallies"]), results)
}

#[tokio::test]
async fn a_ballot_a_recovery_restores_after_the_runoff_was_read_is_counted() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, r) = ranked_poll(&app, &admin, chrono::Duration::hours(1)).await;
    let users = five_voters(&app, poll, &r).await;
    assert_eq!(app.close_poll(&admin, poll).await.status(), StatusCode::OK);
    let (winner, round1, _) = runoff(&app, poll).await;
    assert_eq!(winner, r[0]);
    assert_eq!(round1, HashMap::from([(r[0], 2), (r[1], 2), (r[2], 1)]));

    // What a rebuild leaves when it finds the first voter's later ballot (seq 2:
    // Bass alone) in Postgres after Redis lost it: the voters hash holds it, the
    // tallies count it, and the meta hash is stamped with the rebuild's token and
    // no change since. Five voters still.
    let k = app.keys.poll(Id::new(poll).unwrap());
    let user = users[0].id;
    let mut pipe = redis::pipe();
    pipe.hset(&k.voters, user, format!("2|{}", r[1]))
        .hincr(&k.tally, r[0], -1)
        .hincr(&k.tally, r[1], 1)
        .hset_multiple(&k.meta, &[("rebuilt", "a-rebuild-token"), ("changes", "0")]);
    let _: () = pipe.query_async(&mut app.redis.clone()).await.unwrap();

    let (winner, round1, results) = runoff(&app, poll).await;
    assert_eq!(results["voters"], 5, "{results}");
    assert_eq!(votes(&results["tallies"])[&r[1]], 3, "{results}");
    assert_eq!(
        round1,
        HashMap::from([(r[0], 1), (r[1], 3), (r[2], 1)]),
        "round 1 counts the restored ballot: {results}"
    );
    assert_eq!(
        winner, r[1],
        "Bass wins with the restored ballot: {results}"
    );
}

#[tokio::test]
async fn a_ranking_changed_while_open_changes_the_results_and_the_runoff() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, r) = ranked_poll(&app, &admin, chrono::Duration::hours(1)).await;
    let users = five_voters(&app, poll, &r).await;
    let before = app.poll_results(poll).await;
    assert!(before.get("runoff").is_none(), "open: {before}");
    assert_eq!(
        votes(&before["tallies"]),
        HashMap::from([(r[0], 2), (r[1], 2), (r[2], 1)])
    );
    let changed = rank(&app, poll, &users[0], &[r[1]]).await;
    assert_eq!(changed["replaced"], true, "{changed}");
    let after = app.poll_results(poll).await;
    assert_eq!(after["voters"], 5, "{after}");
    assert_eq!(
        votes(&after["tallies"]),
        HashMap::from([(r[0], 1), (r[1], 3), (r[2], 1)]),
        "{after}"
    );
    assert_eq!(app.close_poll(&admin, poll).await.status(), StatusCode::OK);
    let (winner, round1, _) = runoff(&app, poll).await;
    assert_eq!(round1, HashMap::from([(r[0], 1), (r[1], 3), (r[2], 1)]));
    assert_eq!(winner, r[1]);
}

/// The server decides that a poll is closed by its clock, Redis takes a ballot by
/// its own: a change Redis takes at the close, after this server counted the
/// runoff, is counted when the results are read again.
#[tokio::test]
async fn a_change_redis_takes_at_the_close_after_the_runoff_was_read_is_counted() {
    use stampede::vote::cast::{Ballot, VoteBatch, VoteOutcome, VoteRequest};
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, r) = ranked_poll(&app, &admin, chrono::Duration::seconds(4)).await;
    let users = five_voters(&app, poll, &r).await;
    let open = app.poll_results(poll).await;
    assert!(open.get("runoff").is_none(), "still open: {open}");
    let closes_ms: i64 = app
        .redis_query(
            redis::cmd("HGET")
                .arg(app.keys.poll(Id::new(poll).unwrap()).meta)
                .arg("closes_ms"),
        )
        .await;
    let wait = closes_ms + 200 - Utc::now().timestamp_millis();
    tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(0))).await;
    let (winner, _, _) = runoff(&app, poll).await;
    assert_eq!(winner, r[0]);

    // A Redis whose clock is a second behind takes the first voter's change.
    let batch = VoteBatch {
        keys: &app.keys,
        poll: Id::new(poll).unwrap(),
        policies: &[],
        now_ms: Some(closes_ms - 1_000),
        key_ttl_ms: 86_400_000,
    };
    let change = VoteRequest {
        user: Id::new(users[0].id).unwrap(),
        ballot: Ballot::Ranked(vec![r[1]]),
        key: None,
        ip: None,
    };
    let replies = batch.run(&mut app.redis.clone(), &[change]).await.unwrap();
    assert!(
        matches!(replies[0].outcome, VoteOutcome::Accepted { .. }),
        "{:?}",
        replies[0].outcome
    );
    let (winner, round1, results) = runoff(&app, poll).await;
    assert_eq!(results["voters"], 5, "{results}");
    assert_eq!(round1, HashMap::from([(r[0], 1), (r[1], 3), (r[2], 1)]));
    assert_eq!(winner, r[1], "{results}");
}
