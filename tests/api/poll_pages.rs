//! The voting pages: the list of polls, one poll with its options and live results,
//! the admin's polls section, escaping, HTML 404s and the security headers.

use reqwest::{StatusCode, header};
use serde_json::{Value, json};

use crate::helpers::{
    assert_contains, assert_page_is_locked_down, between, escaped_in, spawn_app,
    spawn_with_open_poll,
};

#[tokio::test]
async fn polls_page_lists_polls_with_status_and_voters() {
    let (app, admin, (open, options)) =
        spawn_with_open_poll("Best tea?", &["Green", "Black"]).await;
    let (upcoming, _) = app
        .create_poll(&admin, "Best coffee?", &["Yes", "No"], 3600, 7200)
        .await;
    app.cast_vote(open, &app.user().await.token, options[0])
        .await;

    let body = app.html("/polls", None).await;
    assert!(body.contains("Best tea?"));
    assert!(body.contains(&format!(r#"href="/polls/{open}""#)));
    assert!(body.contains(&format!(r#"href="/polls/{upcoming}""#)));
    assert!(body.contains(r#"badge-open">Open<"#));
    assert!(body.contains(r#"badge-upcoming">Upcoming<"#));
    assert!(
        body.contains("<strong>1</strong> voter<"),
        "live voter count"
    );
    assert!(body.contains("<strong>0</strong> voters<"));
    let at = |id: i64| body.find(&format!(r#"href="/polls/{id}""#)).unwrap();
    assert!(at(open) < at(upcoming), "open polls first");
}

#[tokio::test]
async fn site_header_links_the_sales_and_the_polls() {
    let app = spawn_app().await;
    for path in ["/", "/polls", "/signin"] {
        let body = app.html(path, None).await;
        assert!(
            body.contains(r#"<a href="/polls" data-nav="polls">Polls</a>"#),
            "{path}"
        );
        assert!(
            body.contains(r#"<a href="/" data-nav="sales">Sales</a>"#),
            "{path}"
        );
    }
    let body = app.html("/polls", None).await;
    assert!(body.contains("No polls yet"), "an empty list says so");
}

#[tokio::test]
async fn poll_page_shows_options_and_live_results() {
    let (app, _, (poll, options)) =
        spawn_with_open_poll("Pick a colour", &["Red", "Green", "Blue"]).await;
    for _ in 0..2 {
        app.cast_vote(poll, &app.user().await.token, options[1])
            .await;
    }
    app.cast_vote(poll, &app.user().await.token, options[2])
        .await;

    let body = app.html(&format!("/polls/{poll}"), None).await;
    assert!(body.contains(r#"<h1 id="poll-question">Pick a colour</h1>"#));
    for (id, label) in options.iter().zip(["Red", "Green", "Blue"]) {
        assert!(
            body.contains(&format!(
                r#"<input type="radio" name="option" value="{id}""#
            )),
            "radio for {label}"
        );
        assert!(body.contains(&format!(r#"data-option-id="{id}""#)));
        assert!(body.contains(&format!("<span>{label}</span>")));
    }
    assert!(body.contains(&format!(r#"data-poll-id="{poll}""#)));
    assert!(body.contains(r#"data-status="open""#));
    assert!(body.contains(r#"data-signed-in="false""#));
    assert!(body.contains(r#"data-voted-option="0""#));
    assert!(body.contains(&format!(r#"href="/signin?next=%2Fpolls%2F{poll}""#)));
    assert!(body.contains(r#"data-action="vote""#));
    // Results as the first render shows them: 0 / 2 / 1 of 3 voters.
    assert!(body.contains(r#"data-field="voters">3 voters<"#));
    assert!(body.contains(
        r#"<strong data-field="votes">2</strong> · <span data-field="percent">67%</span>"#
    ));
    assert!(body.contains(
        r#"<strong data-field="votes">0</strong> · <span data-field="percent">0%</span>"#
    ));
    assert!(body.contains(r#"<progress max="3" value="1""#));

    // One more vote for Red: 1 / 2 / 1 of 4 is 25 + 50 + 25; then one for Blue,
    // 1 / 2 / 2 of 5: 20 + 40 + 40. And with a sixth voter, 2 / 2 / 2: the
    // shares add up to 100 (34, 33, 33), never 99.
    app.cast_vote(poll, &app.user().await.token, options[0])
        .await;
    app.cast_vote(poll, &app.user().await.token, options[2])
        .await;
    app.cast_vote(poll, &app.user().await.token, options[0])
        .await;
    let body = app.html(&format!("/polls/{poll}"), None).await;
    let shown: Vec<&str> = body
        .match_indices(r#"<span data-field="percent">"#)
        .map(|(at, tag)| {
            let rest = &body[at + tag.len()..];
            &rest[..rest.find('<').unwrap()]
        })
        .collect();
    assert_eq!(shown, ["34%", "33%", "33%"]);
}

#[tokio::test]
async fn poll_page_knows_the_voter_already_voted() {
    let (app, _, (poll, options)) = spawn_with_open_poll("Lunch?", &["Soup", "Salad"]).await;
    let user = app.user().await;

    let before = app.html(&format!("/polls/{poll}"), Some(&user)).await;
    assert!(before.contains(r#"data-signed-in="true""#));
    assert!(before.contains(r#"data-voted-option="0""#));
    assert!(!before.contains("You already voted"));

    app.cast_vote(poll, &user.token, options[1]).await;
    let after = app.html(&format!("/polls/{poll}"), Some(&user)).await;
    assert!(after.contains(&format!(r#"data-voted-option="{}""#, options[1])));
    assert!(after.contains("You already voted in this poll: “Salad”."));
    assert!(after.contains(&format!(r#"value="{}" checked"#, options[1])));
    assert!(after.contains(r#"class="result is-mine""#));
}

#[tokio::test]
async fn upcoming_and_closed_polls_carry_their_window() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (upcoming, _) = app
        .create_poll(&admin, "Later?", &["A", "B"], 600, 3600)
        .await;
    let body = app.html(&format!("/polls/{upcoming}"), None).await;
    assert!(body.contains(r#"data-status="upcoming""#));
    let opens_at: i64 = between(&body, r#"data-opens-at=""#, "\"").parse().unwrap();
    let server_now: i64 = between(&body, r#"data-server-now=""#, "\"")
        .parse()
        .unwrap();
    let until_open = opens_at - server_now;
    assert!(
        (590_000..=600_000).contains(&until_open),
        "countdown data: {until_open} ms"
    );

    let resp = app.close_poll(&admin, upcoming).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body = app.html(&format!("/polls/{upcoming}"), None).await;
    assert!(body.contains(r#"data-status="closed""#));
    let list = app.html("/polls", None).await;
    assert!(list.contains("Closed early"));
}

/// The card of the poll `question` on the list page.
fn card<'a>(list: &'a str, question: &str) -> &'a str {
    let at = list.find(question).expect("the poll is listed");
    let end = list[at..].find("</li>").map_or(list.len(), |e| at + e);
    &list[at..end]
}

#[tokio::test]
async fn a_poll_closed_early_says_so_after_its_closing_time_and_one_closed_late_does_not() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (early, _) = app.open_poll(&admin, "Closed early?", &["A", "B"]).await;
    let (late, _) = app.open_poll(&admin, "Ran out?", &["A", "B"]).await;
    assert_eq!(app.close_poll(&admin, early).await.status(), StatusCode::OK);
    let closed_at: Value = app.get_json(&format!("/api/polls/{early}"), None).await;
    assert!(closed_at["closed_at"].is_string(), "{closed_at}");
    // Three hours on: `early` was closed an hour before its closing time, which
    // has passed; `late` ran out an hour ago and an admin closed it afterwards.
    sqlx::query(
        "UPDATE polls SET opens_at = now() - interval '4 hours',
                          closes_at = now() - interval '1 hour',
                          closed_at = closed_at - interval '2 hours'
         WHERE id = $1",
    )
    .bind(early)
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE polls SET opens_at = now() - interval '4 hours',
                          closes_at = now() - interval '1 hour' WHERE id = $1",
    )
    .bind(late)
    .execute(&app.db)
    .await
    .unwrap();
    for id in [early, late] {
        let id = stampede::domain::PollId::new(id).unwrap();
        stampede::vote::cached::invalidate_record(&app.state, id)
            .await
            .unwrap();
    }
    assert_eq!(app.close_poll(&admin, late).await.status(), StatusCode::OK);

    let list = app.html("/polls", None).await;
    let early_card = card(&list, "Closed early?");
    assert!(early_card.contains("Closed early"), "{early_card}");
    let late_card = card(&list, "Ran out?");
    assert!(!late_card.contains("Closed early"), "{late_card}");
    assert!(late_card.contains("Closed <time"), "{late_card}");

    let page = app.html(&format!("/polls/{early}"), None).await;
    assert!(page.contains(r#"<span data-field="closed-note">Closed early</span>"#));
    let page = app.html(&format!("/polls/{late}"), None).await;
    assert!(page.contains(r#"<span data-field="closed-note" hidden>Closed early</span>"#));
}

#[tokio::test]
async fn poll_text_is_escaped_on_every_page() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let question = "<script>alert(1)</script>";
    let option = r#""><img src=x onerror=alert(2)>"#;
    let (poll, _) = app
        .open_poll(&admin, question, &[option, "fine & <b>bold</b>"])
        .await;

    for path in [
        "/polls".to_string(),
        format!("/polls/{poll}"),
        "/admin".into(),
    ] {
        let body = app.html(&path, Some(&admin)).await;
        assert!(escaped_in(&body, question), "{path}: question not escaped");
        assert!(!body.contains("<script>alert"), "{path}: raw script tag");
        assert!(!body.contains("<img src=x"), "{path}: raw img tag");
        assert!(!body.contains("<b>bold"), "{path}: raw b tag");
    }
    let page = app.html(&format!("/polls/{poll}"), None).await;
    assert!(escaped_in(&page, option), "option label not escaped");
    assert!(escaped_in(&page, "fine & <b>bold</b>"));
}

#[tokio::test]
async fn bad_or_unknown_poll_ids_get_an_html_404() {
    spawn_app()
        .await
        .assert_bad_ids_get_an_html_404("polls")
        .await;
}

#[tokio::test]
async fn admin_page_has_a_polls_section_for_admins_only() {
    let (app, admin, (poll, options)) = spawn_with_open_poll("Ship it?", &["Yes", "No"]).await;
    app.cast_vote(poll, &app.user().await.token, options[0])
        .await;

    let user = app.user().await;
    let body = app
        .html_status("/admin", Some(&user), StatusCode::FORBIDDEN)
        .await;
    assert!(!body.contains("New poll"));
    assert!(!body.contains("Ship it?"));

    let body = app.html("/admin", Some(&admin)).await;
    assert!(body.contains("New poll"));
    assert!(body.contains(r#"data-form="create-poll""#));
    assert!(body.contains(r#"data-min-options="2" data-max-options="20""#));
    assert_eq!(
        body.matches(r#"data-action="remove-option""#).count(),
        3,
        "two option inputs to start with, plus the template's"
    );
    assert!(body.contains(r#"data-action="add-option""#));
    assert!(body.contains(r#"<label for="poll-opens">"#));
    assert!(body.contains(r#"type="datetime-local""#));
    assert!(body.contains(&format!(r#"<tr data-poll-id="{poll}">"#)));
    assert!(body.contains(r#"<td data-label="Voters" class="num" data-field="voters">1</td>"#));
    assert!(body.contains(r#"data-action="close-poll">Close<"#));
}

#[tokio::test]
async fn admin_poll_list_api_has_live_voters_and_is_admin_only() {
    let (app, admin, (poll, options)) = spawn_with_open_poll("Tabs?", &["Tabs", "Spaces"]).await;
    for _ in 0..3 {
        app.cast_vote(poll, &app.user().await.token, options[1])
            .await;
    }

    app.assert_get_error(
        "/api/admin/polls",
        None,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    let user = app.user().await;
    assert_eq!(
        app.get("/api/admin/polls", Some(&user.token))
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
    let list: Value = app.get_json("/api/admin/polls", Some(&admin.token)).await;
    let row = &list.as_array().unwrap()[0];
    assert_eq!(row["id"], poll);
    assert_eq!(row["question"], "Tabs?");
    assert_eq!(row["status"], "open");
    assert_eq!(row["voters"], 3);
}

#[tokio::test]
async fn poll_pages_carry_security_headers() {
    let (app, admin, (poll, _)) = spawn_with_open_poll("Headers?", &["On", "Off"]).await;
    for (path, status) in [
        ("/polls".to_string(), StatusCode::OK),
        (format!("/polls/{poll}"), StatusCode::OK),
        ("/polls/abc".to_string(), StatusCode::NOT_FOUND),
        ("/polls/424242".to_string(), StatusCode::NOT_FOUND),
    ] {
        let resp = app.browse(&path, Some(&admin)).await;
        assert_eq!(resp.status(), status, "{path}");
        let h = assert_page_is_locked_down(resp, &path).await;
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY", "{path}");
        assert_eq!(h[header::CACHE_CONTROL], "no-store", "{path}");
    }
}

/// A poll of each ballot kind renders that kind's controls, with the settings
/// the page's script reads in data attributes and the rule in words.
#[tokio::test]
async fn each_ballot_kind_renders_its_controls() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let labels = ["Tea", "Coffee", "Cocoa"];
    let open = async |question: &str, settings: Value| {
        app.open_poll_with(&admin, question, &labels, settings)
            .await
    };
    let (multi, options) = open("Drinks?", json!({"ballot": "multi", "max_choices": 2})).await;
    let body = app.html(&format!("/polls/{multi}"), None).await;
    assert!(body.contains(r#"data-ballot="multi""#));
    assert!(body.contains(r#"data-max-choices="2""#));
    assert!(body.contains(&format!(
        r#"<input type="checkbox" name="option" value="{}""#,
        options[0]
    )));
    assert!(!body.contains(r#"type="radio""#));
    assert!(body.contains(r#"data-field="counter" aria-live="polite">0 of 2 chosen<"#));
    assert!(body.contains(r#"data-field="rule">Pick up to 2<"#));

    let (budget, options) = open(
        "Spend?",
        json!({"ballot": "budget", "votes_per_user": 10, "max_per_option": 4}),
    )
    .await;
    let body = app.html(&format!("/polls/{budget}"), None).await;
    assert!(body.contains(r#"data-ballot="budget""#));
    assert!(body.contains(r#"data-votes-per-user="10""#));
    assert!(body.contains(r#"data-max-per-option="4""#));
    assert!(body.contains(&format!(
        r#"class="stepper-row" data-option-id="{}" data-given="0""#,
        options[1]
    )));
    assert!(body.contains(r#"aria-label="One vote more for Coffee""#));
    assert!(body.contains(r#"aria-label="One vote fewer for Coffee""#));
    assert!(body.contains(">10 of 10 votes left<"));
    assert!(body.contains("10 votes to share, at most 4 on one option"));

    let (ranked, options) = open("Order?", json!({"ballot": "ranked", "allow_change": true})).await;
    let body = app.html(&format!("/polls/{ranked}"), None).await;
    assert!(body.contains(r#"data-ballot="ranked""#));
    assert!(body.contains(r#"data-allow-change="true""#));
    assert!(body.contains(&format!(
        r#"class="choice rank-pick" data-option-id="{}" aria-pressed="false""#,
        options[2]
    )));
    assert!(body.contains(r#"data-field="ranking""#));
    assert!(
        body.contains(
            "Rank the options, favourite first; you may change your vote until the close"
        )
    );
    assert!(body.contains(r#"data-action="change" hidden>Change my vote<"#));

    let (single, _) = app.open_poll(&admin, "One?", &labels).await;
    let body = app.html(&format!("/polls/{single}"), None).await;
    assert!(body.contains(r#"data-ballot="single""#));
    assert!(body.contains(r#"type="radio""#));
    assert!(body.contains(r#"data-field="rule">One vote per person<"#));
}

/// The voter's ballot of every kind shows on their next visit: checked boxes, the
/// votes given and left, the ranking in order; the voters hash's `<seq>|<ballot>`
/// values never break the page.
#[tokio::test]
async fn a_voters_ballot_of_each_kind_shows_on_the_next_visit() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let user = app.user().await;
    let labels = ["Tea", "Coffee", "Cocoa"];
    let open = async |question: &str, settings: Value| {
        app.open_poll_with(&admin, question, &labels, settings)
            .await
    };

    let (multi, o) = open("Drinks?", json!({"ballot": "multi"})).await;
    app.cast_ballot(multi, &user.token, json!({"option_ids": [o[0], o[2]]}))
        .await;
    let body = app.html(&format!("/polls/{multi}"), Some(&user)).await;
    assert!(body.contains(r#"data-voted="true""#));
    assert!(body.contains(&format!(r#"value="{}" checked"#, o[0])));
    assert!(body.contains(&format!(r#"value="{}" checked"#, o[2])));
    assert!(!body.contains(&format!(r#"value="{}" checked"#, o[1])));
    assert!(body.contains(">2 of 3 chosen<"));
    assert!(body.contains("You already voted in this poll."));

    let (budget, o) = open("Spend?", json!({"ballot": "budget", "votes_per_user": 10})).await;
    app.cast_ballot(budget, &user.token, json!({"option_id": o[1], "count": 3}))
        .await;
    let answer = app
        .cast_ballot(budget, &user.token, json!({"option_id": o[1], "count": 2}))
        .await;
    assert_eq!(answer["remaining"], 5);
    let body = app.html(&format!("/polls/{budget}"), Some(&user)).await;
    assert!(body.contains(&format!(r#"data-option-id="{}" data-given="5""#, o[1])));
    assert!(body.contains(">5 of 10 votes left<"));
    assert!(body.contains("You have given 5 of your 10 votes."));

    let (ranked, o) = open("Order?", json!({"ballot": "ranked", "allow_change": true})).await;
    app.cast_ballot(ranked, &user.token, json!({"ranking": [o[1], o[0]]}))
        .await;
    let again = app
        .cast_ballot(ranked, &user.token, json!({"ranking": [o[2], o[1]]}))
        .await;
    assert_eq!(again["replaced"], true);
    let body = app.html(&format!("/polls/{ranked}"), Some(&user)).await;
    let first = body
        .find(&format!(r#"<li data-option-id="{}">"#, o[2]))
        .expect("ranked first");
    let second = body
        .find(&format!(r#"<li data-option-id="{}">"#, o[1]))
        .expect("ranked second");
    assert!(first < second, "the ranking in order");
    assert!(!body.contains(&format!(r#"<li data-option-id="{}">"#, o[0])));
    assert!(body.contains(">2 of 3 ranked<"));
}

/// Hidden results of every kind: the words, the voters, no tally in the page.
#[tokio::test]
async fn hidden_results_of_each_kind_leak_no_tally() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let labels = ["Tea", "Coffee", "Cocoa"];
    for settings in [
        json!({"ballot": "multi", "results": "after_close"}),
        json!({"ballot": "budget", "votes_per_user": 9, "results": "after_close"}),
        json!({"ballot": "ranked", "results": "after_close"}),
    ] {
        let (poll, o) = app
            .open_poll_with(&admin, "Secret?", &labels, settings.clone())
            .await;
        let vote = match settings["ballot"].as_str().unwrap() {
            "multi" => json!({"option_ids": [o[0], o[1]]}),
            "budget" => json!({"option_id": o[0], "count": 7}),
            _ => json!({"ranking": [o[0], o[2]]}),
        };
        let voter = app.user().await;
        app.cast_ballot(poll, &voter.token, vote).await;
        for who in [None, Some(&voter)] {
            let body = app.html(&format!("/polls/{poll}"), who).await;
            let shown = [
                "Results at the end of the vote",
                r#"data-field="voters">1 voter<"#,
                r#"<strong data-field="votes"></strong>"#,
            ];
            let hidden = [
                r#"<progress max="1" value="1""#,
                r#"data-field="votes">1<"#,
                r#"data-field="votes">7<"#,
            ];
            assert_contains(&body, &shown, &hidden, &settings.to_string());
            assert!(
                !body.contains(r#"value="7""#),
                "{settings}: no budget tally"
            );
        }
    }
}

/// A poll whose results show after the vote: its card on `/polls` tells a voter
/// who has not voted to vote, and shows one who has what the poll page does (it
/// said "Results after you vote" to them too).
#[tokio::test]
async fn the_list_card_of_an_after_vote_poll_knows_the_viewer_voted() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let question = "Card after voting?";
    let (poll, options) = app
        .open_poll_with(
            &admin,
            question,
            &["A", "B"],
            json!({"results": "after_vote"}),
        )
        .await;
    let voter = app.user().await;
    let other = app.user().await;
    app.cast_vote(poll, &voter.token, options[0]).await;
    let list = app.html("/polls", Some(&voter)).await;
    assert!(
        !card(&list, question).contains("Results after you vote"),
        "{}",
        card(&list, question)
    );
    let list = app.html("/polls", Some(&other)).await;
    assert!(card(&list, question).contains("Results after you vote"));
    let list = app.html("/polls", None).await;
    assert!(card(&list, question).contains("Results after you vote"));
}

/// A closed ranked poll's note no longer says its count by rounds comes at the
/// close: it is below the tallies, or, hidden, comes with the results.
#[tokio::test]
async fn a_closed_ranked_polls_note_says_where_its_count_by_rounds_is() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let ranked = json!({"ballot": "ranked"});
    let (open, _) = app
        .open_poll_with(&admin, "Ranked open?", &["A", "B", "C"], ranked.clone())
        .await;
    let (shown, o) = app
        .open_poll_with(&admin, "Ranked shown?", &["A", "B", "C"], ranked)
        .await;
    let (hidden, h) = app
        .open_poll_with(
            &admin,
            "Ranked hidden?",
            &["A", "B", "C"],
            json!({"ballot": "ranked", "results": "on_reveal"}),
        )
        .await;
    // One first preference each: C goes (listed last), its ballot to B.
    let voters = app.create_users(3, false).await;
    for (poll, o) in [(shown, &o), (hidden, &h)] {
        for (voter, ranking) in voters
            .iter()
            .zip([vec![o[1], o[0]], vec![o[0]], vec![o[2], o[1]]])
        {
            app.cast_ballot(poll, &voter.token, json!({ "ranking": ranking }))
                .await;
        }
        assert_eq!(app.close_poll(&admin, poll).await.status(), StatusCode::OK);
    }
    let page = app.html(&format!("/polls/{open}"), None).await;
    assert!(page.contains("the full count by rounds comes at the close"));
    assert!(page.contains(r#"data-field="runoff" aria-labelledby="runoff-heading" hidden"#));
    let page = app.html(&format!("/polls/{shown}"), None).await;
    assert!(!page.contains("comes at the close"), "closed, shown");
    assert!(page.contains("the count by rounds is below"));
    // ... and it is there without script.
    assert!(page.contains(r#"data-field="runoff" aria-labelledby="runoff-heading">"#));
    assert!(page.contains("Winner: B, after 2 rounds of counting 3 ballots."));
    assert!(page.contains("<caption>Round 1</caption>"));
    assert!(page.contains("<caption>Round 2</caption>"));
    assert!(page.contains("<td>C (eliminated)</td><td class=\"num\">1</td>"));
    assert!(page.contains("<td>B</td><td class=\"num\">2</td>"));
    assert!(page.contains("Eliminated: C."));
    let page = app.html(&format!("/polls/{hidden}"), None).await;
    assert!(!page.contains("comes at the close"), "closed, hidden");
    assert!(page.contains("the count by rounds comes with the results"));
    assert!(
        !page.contains("Winner:") && !page.contains("Round 1"),
        "hidden"
    );
}
