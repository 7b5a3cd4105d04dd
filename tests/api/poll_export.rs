//! Every vote of a poll as CSV (issue 51): `GET /api/admin/polls/{id}/votes.csv`,
//! one row per accepted vote request with its receipt, voter, options, count,
//! times and whether a later ballot replaced it; streamed; admins only.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Duration, Utc};
use reqwest::StatusCode;
use stampede::domain::Id;
use stampede::vote::receipt::receipt;

use crate::helpers::{TestApp, User, assert_error, spawn_app};

const HEADER: [&str; 12] = [
    "receipt",
    "voter_id",
    "voter_name",
    "ballot",
    "option_id",
    "option_label",
    "choices",
    "choice_labels",
    "count",
    "voted_at",
    "settled_at",
    "replaced",
];

/// The records of an RFC 4180 text (quoted fields, doubled quotes, CRLF lines).
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => record.push(std::mem::take(&mut field)),
            (false, '\r') => {
                assert_eq!(chars.next(), Some('\n'), "lines end CRLF");
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
            }
            (false, c) => field.push(c),
        }
    }
    assert!(
        field.is_empty() && record.is_empty(),
        "the last line ends CRLF"
    );
    records
}

/// The poll's CSV as the admin downloads it: its text, after checking the answer's
/// headers.
async fn csv_text(app: &TestApp, admin: &User, poll: i64) -> String {
    let path = format!("/api/admin/polls/{poll}/votes.csv");
    let resp = app.get(&path, Some(&admin.token)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let headers = resp.headers().clone();
    assert_eq!(headers["content-type"], "text/csv; charset=utf-8");
    assert_eq!(
        headers["content-disposition"],
        format!("attachment; filename=\"poll-{poll}-votes.csv\"").as_str()
    );
    resp.text().await.unwrap()
}

/// The CSV's rows, each by column name, after checking its header.
fn rows_of(text: &str) -> Vec<HashMap<&'static str, String>> {
    let mut records = parse_csv(text).into_iter();
    assert_eq!(records.next().unwrap(), HEADER);
    records
        .map(|r| {
            assert_eq!(r.len(), HEADER.len(), "{r:?}");
            HEADER.into_iter().zip(r).collect()
        })
        .collect()
}

/// The receipt of `user`'s `seq`-th ballot of `poll`, under the test server's secret.
fn receipt_of(app: &TestApp, poll: i64, user: i64, seq: i32) -> String {
    let secret = app.config.token_secret.as_bytes();
    receipt(secret, Id::new(poll).unwrap(), Id::new(user).unwrap(), seq).to_string()
}

async fn rename(app: &TestApp, user: &User, name: &str) {
    sqlx::query("UPDATE users SET username = $2 WHERE id = $1")
        .bind(user.id)
        .bind(name)
        .execute(&app.db)
        .await
        .unwrap();
}

#[tokio::test]
async fn every_vote_of_a_single_poll_is_a_row_with_its_receipt_voter_and_option() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let labels = ["Tea", "Coffee, black", "@home"];
    let (poll, options) = app.open_poll(&admin, "Morning drink?", &labels).await;
    let voters = app.create_users(3, false).await;
    // Names the sign-up would refuse, set in Postgres: the CSV must still be safe.
    let names = [
        app.username_of(&voters[0]).await,
        "Smith, \"Jo\"".to_string(),
        "=HYPERLINK(\"http://x\")".to_string(),
    ];
    rename(&app, &voters[1], &names[1]).await;
    rename(&app, &voters[2], &names[2]).await;
    let picks = [1, 0, 2];
    for (voter, &pick) in voters.iter().zip(&picks) {
        app.cast_vote(poll, &voter.token, options[pick]).await;
        // Distinct `voted_at`, so the rows' order is the votes'.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(app.wait_for_votes(poll, 3).await, 3);

    let text = csv_text(&app, &admin, poll).await;
    assert!(text.contains(",\"Smith, \"\"Jo\"\"\","), "{text}");
    assert!(
        text.contains(",\"'=HYPERLINK(\"\"http://x\"\")\","),
        "{text}"
    );
    assert!(text.contains(",\"'@home\","), "{text}");
    let rows = rows_of(&text);
    assert_eq!(rows.len(), 3, "one row per vote: {text}");
    for (((row, voter), name), &pick) in rows.iter().zip(&voters).zip(&names).zip(&picks) {
        assert_eq!(row["receipt"], receipt_of(&app, poll, voter.id, 1));
        assert_eq!(row["voter_id"], voter.id.to_string());
        let shown = if name.starts_with('=') {
            format!("'{name}")
        } else {
            name.clone()
        };
        assert_eq!(row["voter_name"], shown);
        assert_eq!(row["ballot"], "single");
        let option = options[pick].to_string();
        let label = if pick == 2 { "'@home" } else { labels[pick] };
        assert_eq!(row["option_id"], option);
        assert_eq!(row["option_label"], label);
        assert_eq!(row["choices"], option);
        assert_eq!(row["choice_labels"], label);
        assert_eq!(row["count"], "1");
        assert_eq!(row["replaced"], "false");
        for column in ["voted_at", "settled_at"] {
            assert!(row[column].ends_with('Z'), "{}", row[column]);
            DateTime::parse_from_rfc3339(&row[column]).unwrap();
        }
    }
    let receipts: HashSet<&str> = rows.iter().map(|r| r["receipt"].as_str()).collect();
    assert_eq!(receipts.len(), 3);
    assert_eq!(
        csv_text(&app, &admin, poll).await,
        text,
        "the same file twice"
    );

    // The admin's poll page links it.
    let page = app
        .html(&format!("/admin/polls/{poll}"), Some(&admin))
        .await;
    assert!(
        page.contains(&format!(r#"href="/api/admin/polls/{poll}/votes.csv""#)),
        "{page}"
    );
    assert!(page.contains("Download every vote (CSV)"));
}

#[tokio::test]
async fn the_votes_csv_needs_an_admin_and_a_poll() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let voter = app.user().await;
    let (poll, _) = app.open_poll(&admin, "Anyone?", &["Yes", "No"]).await;
    let path = format!("/api/admin/polls/{poll}/votes.csv");
    app.assert_get_error(&path, None, StatusCode::UNAUTHORIZED, "unauthorized")
        .await;
    app.assert_get_error(
        &path,
        Some(&voter.token),
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    assert_error(
        app.get("/api/admin/polls/999999/votes.csv", Some(&admin.token))
            .await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    assert_error(
        app.get("/api/admin/polls/x1/votes.csv", Some(&admin.token))
            .await,
        StatusCode::BAD_REQUEST,
        "invalid_id",
    )
    .await;
    // A poll nobody voted in: the header alone.
    assert_eq!(
        csv_text(&app, &admin, poll).await,
        format!("{}\r\n", HEADER.join(","))
    );
}

/// One row of `votes`, written as settlement writes it.
struct Row {
    user: i64,
    seq: i32,
    choices: Vec<i64>,
    count: i32,
    /// Milliseconds after the first vote.
    at_ms: i64,
}

/// Sets the poll's ballot and writes `rows` into `votes` with SQL: the vote API of
/// multi, budget and ranked ballots is being written apart (issue 51), so these
/// rows stand for what its settlement will write. `option_id` is the first choice;
/// `choices` is NULL for single and budget, as migration 0019 says.
async fn ballot_rows(app: &TestApp, poll: i64, ballot: &str, rows: &[Row]) -> DateTime<Utc> {
    let settings = match ballot {
        "budget" => "votes_per_user = 10, max_per_option = 5",
        _ => "max_choices = 3, allow_change = true",
    };
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE polls SET ballot = $2, {settings} WHERE id = $1"
    )))
    .bind(poll)
    .bind(ballot)
    .execute(&app.db)
    .await
    .unwrap();
    let start = Utc::now() - Duration::seconds(30);
    for row in rows {
        sqlx::query(
            "INSERT INTO votes (poll_id, user_id, seq, option_id, choices, count, voted_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(poll)
        .bind(row.user)
        .bind(row.seq)
        .bind(row.choices[0])
        .bind((ballot != "budget").then_some(&row.choices))
        .bind(row.count)
        .bind(start + Duration::milliseconds(row.at_ms))
        .execute(&app.db)
        .await
        .unwrap();
    }
    start
}

/// The CSV's (voter, receipt is seq's, option_id, choices, choice_labels, count,
/// replaced) per row, in its order.
type Seen = (String, bool, String, String, String, String, String);

async fn seen(app: &TestApp, admin: &User, poll: i64, rows: &[Row]) -> Vec<Seen> {
    let text = csv_text(app, admin, poll).await;
    let csv = rows_of(&text);
    assert_eq!(csv.len(), rows.len(), "{text}");
    csv.into_iter()
        .zip(rows)
        .map(|(r, row)| {
            (
                r["voter_id"].clone(),
                r["receipt"] == receipt_of(app, poll, row.user, row.seq),
                r["option_id"].clone(),
                r["choices"].clone(),
                r["choice_labels"].clone(),
                r["count"].clone(),
                r["replaced"].clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn multi_ranked_and_budget_rows_carry_their_choices_counts_and_replacements() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let [a, b] = [app.user().await.id, app.user().await.id];
    let (s, t) = (a.to_string(), b.to_string());
    let labels = ["Red", "Green", "Blue"];
    for ballot in ["multi", "ranked"] {
        let (poll, o) = app.open_poll(&admin, "Colours?", &labels).await;
        // a's first ballot, replaced by a's second; b's one ballot, between them.
        let rows = [
            Row {
                user: a,
                seq: 1,
                choices: vec![o[2], o[0]],
                count: 1,
                at_ms: 0,
            },
            Row {
                user: b,
                seq: 1,
                choices: vec![o[1], o[2], o[0]],
                count: 1,
                at_ms: 10,
            },
            Row {
                user: a,
                seq: 2,
                choices: vec![o[1]],
                count: 1,
                at_ms: 20,
            },
        ];
        ballot_rows(&app, poll, ballot, &rows).await;
        let id = |i: usize| o[i].to_string();
        let seen = seen(&app, &admin, poll, &rows).await;
        assert_eq!(
            seen,
            [
                (
                    s.clone(),
                    true,
                    id(2),
                    format!("{};{}", id(2), id(0)),
                    "Blue;Red".into(),
                    "1".into(),
                    "true".into()
                ),
                (
                    t.clone(),
                    true,
                    id(1),
                    format!("{};{};{}", id(1), id(2), id(0)),
                    "Green;Blue;Red".into(),
                    "1".into(),
                    "false".into()
                ),
                (
                    s.clone(),
                    true,
                    id(1),
                    id(1),
                    "Green".into(),
                    "1".into(),
                    "false".into()
                ),
            ],
            "{ballot}"
        );
        let text = csv_text(&app, &admin, poll).await;
        assert!(
            text.lines()
                .skip(1)
                .all(|l| l.contains(&format!(",{ballot},")))
        );
    }

    // Budget: every request counts, none is replaced.
    let (poll, o) = app.open_poll(&admin, "Spend 10", &labels).await;
    let rows = [
        Row {
            user: a,
            seq: 1,
            choices: vec![o[0]],
            count: 3,
            at_ms: 0,
        },
        Row {
            user: a,
            seq: 2,
            choices: vec![o[2]],
            count: 5,
            at_ms: 10,
        },
        Row {
            user: b,
            seq: 1,
            choices: vec![o[0]],
            count: 1,
            at_ms: 20,
        },
    ];
    ballot_rows(&app, poll, "budget", &rows).await;
    let id = |i: usize| o[i].to_string();
    assert_eq!(
        seen(&app, &admin, poll, &rows).await,
        [
            (
                s.clone(),
                true,
                id(0),
                id(0),
                "Red".into(),
                "3".into(),
                "false".into()
            ),
            (
                s.clone(),
                true,
                id(2),
                id(2),
                "Blue".into(),
                "5".into(),
                "false".into()
            ),
            (
                t.clone(),
                true,
                id(0),
                id(0),
                "Red".into(),
                "1".into(),
                "false".into()
            ),
        ]
    );
}

#[tokio::test]
async fn twenty_thousand_votes_stream_whole() {
    const VOTES: usize = 20_000;
    let app = spawn_app().await;
    let admin = app.admin().await;
    let (poll, options) = app.open_poll(&admin, "Many?", &["Yes", "No"]).await;
    let voters = app.create_users(VOTES, false).await;
    let ids: Vec<i64> = voters.iter().map(|v| v.id).collect();
    // Written with SQL: 20,000 votes through the API would take the test's time
    // for what `every_vote_of_a_single_poll_...` checks already.
    sqlx::query(
        "INSERT INTO votes (poll_id, user_id, option_id, voted_at)
         SELECT $1, u, $2, now() - interval '1 hour' + n * interval '1 ms'
         FROM unnest($3::int8[]) WITH ORDINALITY AS t(u, n)",
    )
    .bind(poll)
    .bind(options[0])
    .bind(&ids)
    .execute(&app.db)
    .await
    .unwrap();

    let started = std::time::Instant::now();
    let text = csv_text(&app, &admin, poll).await;
    let took = started.elapsed();
    assert!(text.len() > 4 * 32 * 1024, "more than the chunks in flight");
    let rows = rows_of(&text);
    assert_eq!(rows.len(), VOTES);
    let voters_in_order: Vec<i64> = rows
        .iter()
        .map(|r| r["voter_id"].parse().unwrap())
        .collect();
    assert_eq!(voters_in_order, ids, "by voted_at");
    let receipts: HashSet<&str> = rows.iter().map(|r| r["receipt"].as_str()).collect();
    assert_eq!(receipts.len(), VOTES);
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
}
