//! Results visibility (issue 51): a poll's `results` setting (`live`, `after_vote`,
//! `after_close`, `on_reveal`) decides who sees the tallies when; hidden results
//! answer `{"closed", "hidden": true, "until", "voters"}` on every route, the event stream and
//! the pages, the same bytes whatever the tallies; admins always see them.

use chrono::{DateTime, Duration, SubsecRound, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, User, assert_error, poll_ids, spawn_app};
use crate::live::Stream;

/// A poll with `results` made through the admin API, open since a minute ago for
/// an hour (or at the given window). Returns its id and its option ids.
async fn poll_with(
    app: &TestApp,
    admin: &User,
    results: &str,
    window: Option<(DateTime<Utc>, DateTime<Utc>)>,
) -> (i64, Vec<i64>) {
    let now = Utc::now().trunc_subsecs(0);
    let (opens_at, closes_at) =
        window.unwrap_or((now - Duration::minutes(1), now + Duration::hours(1)));
    let body = app
        .admin_create(
            admin,
            "/api/admin/polls",
            &json!({
                "question": "Best snack?",
                "options": ["Crisps", "Nuts", "Fruit"],
                "opens_at": opens_at,
                "closes_at": closes_at,
                "results": results,
            }),
        )
        .await;
    assert_eq!(body["results_visibility"], results, "{body}");
    poll_ids(&body)
}

/// An admin's `PATCH` of the poll's `results`.
async fn patch_results(app: &TestApp, admin: &User, poll: i64, results: &str) -> reqwest::Response {
    app.client
        .patch(app.url(&format!("/api/admin/polls/{poll}")))
        .bearer_auth(&admin.token)
        .json(&json!({ "results": results }))
        .send()
        .await
        .unwrap()
}

fn hidden(until: &str, voters: i64, closed: bool) -> Value {
    json!({ "closed": closed, "hidden": true, "until": until, "voters": voters })
}

/// Votes of `picks` (option indexes), one new user each; returns the voters.
async fn votes(app: &TestApp, poll: i64, options: &[i64], picks: &[usize]) -> Vec<User> {
    let users = app.create_users(picks.len(), false).await;
    for (user, &pick) in users.iter().zip(picks) {
        app.cast_vote(poll, &user.token, options[pick]).await;
    }
    users
}

/// The results of `poll` on each route that carries them, as `token` gets them:
/// `/results`, the poll's `results`, and its entry in the list.
async fn results_everywhere(app: &TestApp, poll: i64, token: Option<&str>) -> [Value; 3] {
    let results = app
        .get_json(&format!("/api/polls/{poll}/results"), token)
        .await;
    let view = app.get_json(&format!("/api/polls/{poll}"), token).await;
    let list = app.get_json("/api/polls", token).await;
    let entry = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == poll)
        .expect("the poll is in the list")
        .clone();
    [results, view["results"].clone(), entry["results"].clone()]
}

async fn assert_hidden(
    app: &TestApp,
    poll: i64,
    token: Option<&str>,
    (until, voters, closed): (&str, i64, bool),
) {
    for got in results_everywhere(app, poll, token).await {
        assert_eq!(got, hidden(until, voters, closed), "poll {poll}");
    }
}

/// Asserts every route shows the tallies, `votes` per option in order.
async fn assert_tallies(app: &TestApp, poll: i64, token: Option<&str>, votes: &[i64]) {
    for got in results_everywhere(app, poll, token).await {
        assert_eq!(got["hidden"], false, "{got}");
        let tallies: Vec<i64> = got["tallies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["votes"].as_i64().unwrap())
            .collect();
        assert_eq!(tallies, votes, "{got}");
    }
}

#[tokio::test]
async fn live_is_the_default_and_shows_every_caller_the_tallies() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, options) = app.open_poll(&admin, "Tea?", &["Yes", "No"]).await;
    let view = app.get_json(&format!("/api/polls/{poll}"), None).await;
    assert_eq!(view["results_visibility"], "live");
    votes(&app, poll, &options, &[0, 0, 1]).await;
    assert_tallies(&app, poll, None, &[2, 1]).await;
    let first = Stream::open(&app, &format!("/api/polls/{poll}/events"))
        .await
        .next()
        .await;
    assert_eq!(first["tallies"][0]["votes"], 2);
}

#[tokio::test]
async fn after_close_hides_tallies_from_all_but_admins_until_the_close() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, options) = poll_with(&app, &admin, "after_close", None).await;
    let voters = votes(&app, poll, &options, &[0, 0, 2]).await;

    assert_hidden(&app, poll, None, ("close", 3, false)).await;
    assert_hidden(&app, poll, Some(&voters[0].token), ("close", 3, false)).await;
    assert_tallies(&app, poll, Some(&admin.token), &[2, 0, 1]).await;
    let shown = app
        .get_json(&format!("/api/admin/polls/{poll}"), Some(&admin.token))
        .await;
    assert_eq!(shown["results"]["tallies"][0]["votes"], 2);
    let first = Stream::open(&app, &format!("/api/polls/{poll}/events"))
        .await
        .next()
        .await;
    assert_eq!(first, hidden("close", 3, false));

    assert_eq!(app.close_poll(&admin, poll).await.status(), StatusCode::OK);
    assert_tallies(&app, poll, None, &[2, 0, 1]).await;
    assert_tallies(&app, poll, Some(&voters[1].token), &[2, 0, 1]).await;
}

#[tokio::test]
async fn after_close_shows_the_tallies_once_the_closing_time_passes() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let now = Utc::now();
    let window = (now - Duration::minutes(1), now + Duration::seconds(2));
    let (poll, options) = poll_with(&app, &admin, "after_close", Some(window)).await;
    // An on_reveal poll of the same window: hidden after it, closed all the same.
    let (kept, kept_options) = poll_with(&app, &admin, "on_reveal", Some(window)).await;
    votes(&app, poll, &options, &[1]).await;
    votes(&app, kept, &kept_options, &[0]).await;
    assert_hidden(&app, poll, None, ("close", 1, false)).await;
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_tallies(&app, poll, None, &[0, 1, 0]).await;
    // Closed on time is closed in the results too, on every route, for anyone.
    for got in results_everywhere(&app, poll, None).await {
        assert_eq!(got["closed"], true, "{got}");
    }
    assert_hidden(&app, kept, None, ("reveal", 1, true)).await;
    // The list differs by who asks, as one poll's answer: kept by no cache.
    let list = app.get("/api/polls", None).await;
    assert_eq!(list.headers()["cache-control"], "no-store");
    let mut watching = Stream::open(&app, &format!("/api/polls/{kept}/events")).await;
    assert_eq!(watching.next().await, hidden("reveal", 1, true));
}

#[tokio::test]
async fn after_vote_shows_a_voter_the_tallies_once_their_ballot_is_in() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, options) = poll_with(&app, &admin, "after_vote", None).await;
    let others = votes(&app, poll, &options, &[1, 1]).await;
    let me = app.user().await;
    let bystander = app.user().await;

    assert_hidden(&app, poll, Some(&me.token), ("vote", 2, false)).await;
    let path = format!("/api/polls/{poll}/events");
    let first = Stream::open_as(&app, &path, Some(&me.token))
        .await
        .next()
        .await;
    assert_eq!(first, hidden("vote", 2, false), "before the vote");

    app.cast_vote(poll, &me.token, options[0]).await;
    assert_tallies(&app, poll, Some(&me.token), &[1, 2, 0]).await;
    assert_tallies(&app, poll, Some(&others[0].token), &[1, 2, 0]).await;
    let first = Stream::open_as(&app, &path, Some(&me.token))
        .await
        .next()
        .await;
    assert_eq!(first["tallies"][1]["votes"], 2, "a voter's stream: {first}");

    // Everyone else, the shared stream included, sees them hidden: also after the
    // close (only voters see an `after_vote` poll's results; admins always).
    for token in [None, Some(bystander.token.as_str())] {
        assert_hidden(&app, poll, token, ("vote", 3, false)).await;
        // (The shared reader may still hold its reading from before the vote.)
        let first = Stream::open_as(&app, &path, token).await.next().await;
        assert!(
            first == hidden("vote", 3, false) || first == hidden("vote", 2, false),
            "{first}"
        );
    }
    assert_eq!(app.close_poll(&admin, poll).await.status(), StatusCode::OK);
    assert_hidden(&app, poll, None, ("vote", 3, true)).await;
    assert_hidden(&app, poll, Some(&bystander.token), ("vote", 3, true)).await;
    assert_tallies(&app, poll, Some(&me.token), &[1, 2, 0]).await;
    assert_tallies(&app, poll, Some(&admin.token), &[1, 2, 0]).await;
}

#[tokio::test]
async fn on_reveal_stays_hidden_after_the_close_until_an_admin_reveals() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, options) = poll_with(&app, &admin, "on_reveal", None).await;
    let voters = votes(&app, poll, &options, &[2, 2, 0, 2]).await;
    let reveal = format!("/api/admin/polls/{poll}/reveal");

    let open = app.post(&reveal, Some(&admin.token)).await;
    let body = assert_error(open, StatusCode::CONFLICT, "not_revealable").await;
    assert!(body["message"].as_str().unwrap().contains("open"), "{body}");
    let by_voter = app.post(&reveal, Some(&voters[0].token)).await;
    assert_error(by_voter, StatusCode::FORBIDDEN, "forbidden").await;
    let (live, _) = app.open_poll(&admin, "Live?", &["A", "B"]).await;
    let not_kept = app
        .post(
            &format!("/api/admin/polls/{live}/reveal"),
            Some(&admin.token),
        )
        .await;
    assert_error(not_kept, StatusCode::CONFLICT, "not_revealable").await;
    let none = app
        .post("/api/admin/polls/999999/reveal", Some(&admin.token))
        .await;
    assert_error(none, StatusCode::NOT_FOUND, "not_found").await;

    assert_eq!(app.close_poll(&admin, poll).await.status(), StatusCode::OK);
    assert_hidden(&app, poll, None, ("reveal", 4, true)).await;
    assert_hidden(&app, poll, Some(&voters[1].token), ("reveal", 4, true)).await;
    assert_tallies(&app, poll, Some(&admin.token), &[1, 0, 3]).await;
    let path = format!("/api/polls/{poll}/events");
    let mut watching = Stream::open(&app, &path).await;
    assert_eq!(watching.next().await, hidden("reveal", 4, true));

    let first = app.post(&reveal, Some(&admin.token)).await;
    assert_eq!(first.status(), StatusCode::OK);
    let first: Value = first.json().await.unwrap();
    let at = first["revealed_at"]
        .as_str()
        .expect("revealed_at")
        .to_string();
    assert_tallies(&app, poll, None, &[1, 0, 3]).await;
    assert_eq!(
        watching.next().await["tallies"][2]["votes"],
        3,
        "the stream follows"
    );

    let again = app.post(&reveal, Some(&admin.token)).await;
    assert_eq!(again.status(), StatusCode::OK, "a reveal is idempotent");
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["revealed_at"], at.as_str());
    let history = app
        .get_json(
            &format!("/api/admin/polls/{poll}/history"),
            Some(&admin.token),
        )
        .await;
    let reveals = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "reveal")
        .count();
    assert_eq!(reveals, 1, "one record: {history}");
    let stored: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT revealed_at FROM polls WHERE id = $1")
            .bind(poll)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert!(stored.is_some(), "kept in Postgres");
}

#[tokio::test]
async fn a_bad_results_setting_is_422_naming_it_and_it_changes_until_the_opening() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let now = Utc::now();
    for bad in [json!("sometimes"), json!("LIVE"), json!(3), json!({})] {
        let body = json!({
            "question": "Q?", "options": ["A", "B"],
            "opens_at": now, "closes_at": now + Duration::hours(1), "results": bad,
        });
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
            err["message"].as_str().unwrap().contains("results"),
            "{err}"
        );
    }
    let later = Some((now + Duration::hours(1), now + Duration::hours(2)));
    let (poll, _) = poll_with(&app, &admin, "live", later).await;
    let path = format!("/api/admin/polls/{poll}");
    let resp = patch_results(&app, &admin, poll, "nope").await;
    assert_error(
        resp,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_ballot_settings",
    )
    .await;
    let resp = patch_results(&app, &admin, poll, "on_reveal").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_hidden(&app, poll, None, ("reveal", 0, false)).await;
    let history = app
        .get_json(&format!("{path}/history"), Some(&admin.token))
        .await;
    assert_eq!(history[0]["after"]["results"], "on_reveal", "{history}");

    let (open, _) = poll_with(&app, &admin, "live", None).await;
    let resp = patch_results(&app, &admin, open, "after_close").await;
    assert_error(resp, StatusCode::CONFLICT, "poll_started").await;
}

/// Two servers, each with the same poll (same ids, names and window) and the same
/// number of voters, who chose differently: every hidden answer is the same bytes.
#[tokio::test]
async fn hidden_answers_are_the_same_bytes_whatever_the_tallies() {
    let now = Utc::now().trunc_subsecs(0);
    let window = Some((now - Duration::minutes(1), now + Duration::hours(1)));
    let mut bodies = Vec::new();
    for picks in [[0, 0, 0, 0], [1, 2, 2, 1]] {
        let app = spawn_app().await;
        let admin = app.admin().await;
        let (poll, options) = poll_with(&app, &admin, "after_close", window).await;
        votes(&app, poll, &options, &picks).await;
        let mut got = Vec::new();
        for path in [
            format!("/api/polls/{poll}/results"),
            format!("/api/polls/{poll}"),
            "/api/polls".to_string(),
        ] {
            got.push(app.get(&path, None).await.bytes().await.unwrap());
        }
        let mut stream = Stream::open(&app, &format!("/api/polls/{poll}/events")).await;
        got.push(serde_json::to_vec(&stream.next().await).unwrap().into());
        let page = app.html(&format!("/polls/{poll}"), None).await;
        got.push(strip_volatile(&page).into_bytes().into());
        bodies.push(got);
    }
    assert_eq!(
        bodies[0][0],
        serde_json::to_vec(&hidden("close", 4, false)).unwrap()
    );
    for (a, b) in bodies[0].iter().zip(&bodies[1]) {
        assert_eq!(a, b, "{}", String::from_utf8_lossy(a));
    }
}

/// A page without what differs from one render to the next whatever the poll (the
/// server's clock, the CSRF token, the nonce of inline scripts).
fn strip_volatile(page: &str) -> String {
    page.lines()
        .filter(|l| !l.contains("data-server-now") && !l.contains("nonce") && !l.contains("csrf"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn the_poll_page_carries_no_tally_while_hidden() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, options) = poll_with(&app, &admin, "after_vote", None).await;
    let voters = votes(&app, poll, &options, &[0, 0, 0, 1, 1, 1, 1]).await;
    let me = app.user().await;

    for session in [None, Some(&me)] {
        let page = app.html(&format!("/polls/{poll}"), session).await;
        assert!(page.contains("Results after you vote"), "{page}");
        assert!(page.contains("7 voters"));
        for shown in [
            "57%",
            "43%",
            r#"data-field="votes">3<"#,
            r#"data-field="votes">4<"#,
            r#"value="4""#,
        ] {
            assert!(!page.contains(shown), "{shown} leaks");
        }
    }
    let page = app.html(&format!("/polls/{poll}"), Some(&voters[0])).await;
    assert!(
        page.contains(r#"data-field="votes">4<"#),
        "a voter sees the tallies"
    );
    assert!(!page.contains("Results after you vote"));

    let (later, options) = poll_with(&app, &admin, "after_close", None).await;
    votes(&app, later, &options, &[2, 2]).await;
    let page = app.html(&format!("/polls/{later}"), None).await;
    assert!(page.contains("Results at the end of the vote"));
    assert!(!page.contains("100%") && !page.contains(r#"data-field="votes">2<"#));
    let admin_page = app
        .html(&format!("/admin/polls/{later}"), Some(&admin))
        .await;
    assert!(
        admin_page.contains(r#"data-field="live">2<"#),
        "admins see the tallies"
    );
    assert!(admin_page.contains("Hidden until the poll closes"));
    let list = app.html("/polls", None).await;
    assert!(list.contains("Results at the end of the vote"));

    let (revealed, _) = poll_with(&app, &admin, "on_reveal", None).await;
    app.close_poll(&admin, revealed).await;
    let page = app.html(&format!("/polls/{revealed}"), None).await;
    assert!(page.contains("Results when the organisers reveal them"));
    let admin_page = app
        .html(&format!("/admin/polls/{revealed}"), Some(&admin))
        .await;
    assert!(
        admin_page.contains(r#"data-action="reveal""#),
        "the reveal button"
    );
}

#[tokio::test]
async fn the_openapi_document_describes_hidden_results_and_the_reveal() {
    let app = spawn_app().await;
    let doc = app.get_json("/api/openapi.json", None).await;
    let reveal = &doc["paths"]["/api/admin/polls/{id}/reveal"]["post"]["responses"];
    assert!(
        reveal["409"]["description"]
            .as_str()
            .unwrap()
            .contains("not_revealable")
    );
    let schemas = &doc["components"]["schemas"];
    let hidden = &schemas["HiddenResults"]["properties"];
    for field in ["closed", "hidden", "until", "voters"] {
        assert!(
            hidden.get(field).is_some(),
            "HiddenResults.{field}: {hidden}"
        );
    }
    assert!(
        schemas["PollResults"]["oneOf"].is_array(),
        "{}",
        schemas["PollResults"]
    );
    let setting = &schemas["ResultsVisibility"]["enum"];
    assert_eq!(
        setting,
        &json!(["live", "after_vote", "after_close", "on_reveal"])
    );
}
