//! `stampede load` (the binary) against a real server: a storm with exact counts and
//! a report whose invariants hold, repeat, soldout and vote runs, a broken invariant
//! named with a failing exit, `--opens-at`, and the loopback guard.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

use crate::helpers::{Db, TestApp, spawn_app, spawn_app_with, spawn_with_live_sale};

/// Runs `stampede load <args> --json` against `app` (`args` split at spaces); the exit
/// status and the report.
async fn load(app: &TestApp, args: &str) -> (std::process::ExitStatus, Value, String) {
    let (status, stdout, stderr) = load_text(app, &format!("{args} --json")).await;
    let report = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (status, report, stderr)
}

/// The `stampede-load` beside `stampede`, built once per test process. It is the
/// binary of another package of the workspace (`load/`), which cargo builds for
/// this package's tests only when asked: `cargo build -p stampede-load` in the
/// profile (and target) `stampede` was built in, into the same directory, so that
/// `stampede load` runs the current one.
fn load_binary() -> &'static std::path::Path {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let stampede = std::path::Path::new(env!("CARGO_BIN_EXE_stampede"));
        let dir = stampede.parent().expect("the profile's directory");
        let profile = match dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev",
            Some(name) => name,
            None => panic!("no profile directory in {}", stampede.display()),
        };
        let mut target_dir = dir.parent().expect("the target directory");
        let mut cmd = std::process::Command::new(option_env!("CARGO").unwrap_or("cargo"));
        // `target/<triple>/<profile>/` when built with `--target`.
        if !target_dir.join("CACHEDIR.TAG").exists()
            && let Some(triple) = target_dir.file_name()
        {
            cmd.arg("--target").arg(triple);
            target_dir = target_dir.parent().expect("the target directory");
        }
        let status = cmd
            .args([
                "build",
                "--quiet",
                "-p",
                "stampede-load",
                "--profile",
                profile,
            ])
            .arg("--manifest-path")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
            .arg("--target-dir")
            .arg(target_dir)
            .status()
            .expect("run cargo build -p stampede-load");
        assert!(status.success(), "cargo build -p stampede-load failed");
        let load = dir.join(format!("stampede-load{}", std::env::consts::EXE_SUFFIX));
        assert!(load.exists(), "{} not built", load.display());
        load
    })
}

/// Runs `stampede load <args>` against `app` (`args` split at spaces); the exit
/// status, stdout and stderr.
async fn load_text(app: &TestApp, args: &str) -> (std::process::ExitStatus, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_stampede"));
    cmd.arg("load")
        .args(args.split_whitespace())
        .arg("--url")
        .arg(&app.address)
        .env("DATABASE_URL", &app.config.database_url)
        .env("STAMPEDE_TOKEN_SECRET", &app.config.token_secret)
        // The same Redis and namespace (for --cleanup).
        .env("REDIS_URL", &app.config.redis_url)
        .env("STAMPEDE_REDIS_NAMESPACE", &app.config.redis_namespace)
        .env("STAMPEDE_REDIS_CLUSTER", app.config.redis_cluster.join(","))
        .env_remove("STAMPEDE_CONFIG")
        .env("RUST_LOG", "warn");
    // The server runs in this test's runtime: wait for the child off it.
    let out = tokio::task::spawn_blocking(move || {
        load_binary();
        cmd.output().expect("run stampede load")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    (out.status, stdout, stderr)
}

/// Runs `stampede load <args> --prepare-only FILE`, which must succeed; the file's
/// text and stderr.
async fn prepared(app: &TestApp, args: &str) -> (String, String) {
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("prepared-{}.tokens", uuid::Uuid::new_v4().simple()));
    let (status, _, stderr) =
        load_text(app, &format!("{args} --prepare-only {}", file.display())).await;
    assert!(status.success(), "{stderr}");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    (text, stderr)
}

/// The sale id in a prepared file's first line, `/api/sales/<id><suffix>`.
fn sale_in(text: &str, suffix: &str) -> i64 {
    let path = text.lines().next().unwrap();
    path.strip_prefix("/api/sales/")
        .and_then(|p| p.strip_suffix(suffix))
        .expect(path)
        .parse()
        .unwrap()
}

/// The report's checks: (invariant, ok).
fn checks(report: &Value) -> Vec<(String, bool)> {
    report["checks"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|c| {
            (
                c["invariant"].as_str().unwrap().to_string(),
                c["ok"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// A `repeat` run's report: its `answers`, and its four checks, all holding but
/// "every accepted order in Postgres, once", which is `in_postgres`.
fn assert_repeat_report(report: &Value, answers: Value, in_postgres: bool) {
    assert_eq!(report["answers"], answers, "{report:#}");
    assert_eq!(
        checks(report),
        [
            ("nobody accepted twice".to_string(), true),
            ("stock left = stock - accepted".to_string(), true),
            ("units per buyer = keys accepted".to_string(), true),
            (
                "every accepted order in Postgres, once".to_string(),
                in_postgres
            ),
        ],
        "{report:#}"
    );
}

/// `stampede load <args>` against `app` with `--json`, which must succeed: its
/// report.
async fn load_ok(app: &TestApp, args: &str) -> Value {
    let (status, report, stderr) = load(app, args).await;
    assert!(status.success(), "{stderr}\n{report:#}");
    report
}

/// [`load_ok`] on a new app: the app and the report.
async fn load_on_new_app(args: &str) -> (TestApp, Value) {
    let app = spawn_app().await;
    let report = load_ok(&app, args).await;
    (app, report)
}

/// Each (kind, count) of `expected` is the count of that kind in the report's
/// answers.
fn assert_answers(report: &Value, expected: &[(&str, u64)]) {
    for &(kind, count) in expected {
        assert_eq!(answers(report, kind), count, "{kind}: {report:#}");
    }
}

fn answers(report: &Value, kind: &str) -> u64 {
    report["answers"][kind].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_storm_of_300_on_50_units_sells_exactly_50_and_every_check_holds() {
    let (app, report) =
        load_on_new_app("storm --users 300 --stock 50 --opens-in 1 --concurrency 64").await;
    assert_answers(&report, &[("202", 50), ("410 sold_out", 250)]);
    assert_eq!(report["ok"], true);
    let checks = report["checks"].as_array().unwrap();
    let names: Vec<&str> = checks
        .iter()
        .map(|c| c["invariant"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "nobody accepted twice",
            "accepted = min(stock, buyers)",
            "stock left = stock - accepted",
            "units per buyer = keys accepted",
            "every accepted order in Postgres, once"
        ]
    );
    assert!(checks.iter().all(|c| c["ok"] == true), "{checks:#?}");
    // What the report says, seen independently.
    let sale = report["sale"].as_i64().unwrap();
    assert_eq!(app.orders_in_db(sale).await.len(), 50);
    for key in ["p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"] {
        assert!(report["latency"][key].as_f64().unwrap() > 0.0, "{key}");
    }
}

/// `--tickets`: the sale requires tickets, each buyer asks for one at the opening
/// (a ticket asked for a moment early is refused and asked for again) and buys with
/// it; the counts are those of a storm without tickets. Without `--tickets`, a
/// ticket sale given by `--sale` is refused up front with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn a_storm_with_tickets_sells_exactly_the_stock_to_ticket_holders() {
    let (app, report) =
        load_on_new_app("storm --tickets --users 200 --stock 30 --opens-in 1 --concurrency 32")
            .await;
    assert_answers(
        &report,
        &[
            ("202", 30),
            ("410 sold_out", 170),
            ("428 ticket_required", 0),
        ],
    );
    let sale = report["sale"].as_i64().unwrap();
    let requires: bool = app
        .scalar("SELECT requires_ticket FROM sales WHERE id = $1", sale)
        .await;
    assert!(requires, "the run's sale requires tickets");

    let (status, _, stderr) = load(&app, &format!("repeat --sale {sale} --users 5")).await;
    assert!(!status.success());
    assert!(
        stderr.contains("requires purchase tickets: add --tickets"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vote_run_counts_each_voter_once_in_postgres() {
    let (app, report) = load_on_new_app("vote --users 100 --requests 300 --concurrency 16").await;
    assert_answers(&report, &[("202", 100), ("409 already_voted", 200)]);
    let poll = report["poll"].as_i64().unwrap();
    assert_eq!(app.votes_in_db(poll).await, 100);
}

/// A `--ballot` run on a new app: the report's checks, all of which must hold (their names
/// listed), and its ballot figures.
async fn ballot_run_checking(args: &str, names: &[&str]) -> (TestApp, Value) {
    let (app, report) = load_on_new_app(args).await;
    let got = checks(&report);
    assert!(got.iter().all(|(_, ok)| *ok), "{report:#}");
    let got: Vec<&str> = got.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(got, names, "{report:#}");
    (app, report)
}

/// [`ballot_run_checking`] the [`BALLOT_CHECKS`].
async fn ballot_run(args: &str) -> (TestApp, Value) {
    ballot_run_checking(args, &BALLOT_CHECKS).await
}

const BALLOT_CHECKS: [&str; 5] = [
    "every answer as the ballot's rules say",
    "every 202 receipt in Postgres, once",
    "Redis tallies = settled tallies",
    "tallies = the voters' ballots that count",
    "my-ballot: every receipt once, settled, the ballot that counts",
];

fn figure(report: &Value, name: &str) -> u64 {
    report["ballot"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no ballot.{name} in {report:#}"))
}

/// Each (name, value) of `expected` is that figure of the report's ballot.
fn assert_figures(report: &Value, expected: &[(&str, u64)]) {
    for &(name, value) in expected {
        assert_eq!(figure(report, name), value, "{name}: {report:#}");
    }
}

/// The settled tallies of the report, summed.
fn settled_sum(report: &Value) -> i64 {
    let tallies = report["ballot"]["settled_tallies"].as_object().unwrap();
    tallies.values().map(|v| v.as_i64().unwrap()).sum()
}

/// Single with `--allow-change`: every voter's ballot is in once; a fifth send a
/// changed one, accepted as a replacement; each counts once in the tallies.
#[tokio::test(flavor = "multi_thread")]
async fn a_single_ballot_run_with_changes_counts_each_voter_once() {
    let (app, report) =
        ballot_run("vote --ballot single --allow-change --users 80 --concurrency 16").await;
    let replaced = figure(&report, "replaced");
    assert_figures(&report, &[("voters", 80), ("accepted", 80 + replaced)]);
    assert!(
        replaced > 0,
        "a fifth of 80 voters change their ballot: {report:#}"
    );
    assert_eq!(report["ballot"]["refused"], json!({}), "{report:#}");
    assert_eq!(figure(&report, "unexpected"), 0);
    // Every 202, replays included, in the answers; one row per accepted request.
    let replays_of_202 = answers(&report, "202") - figure(&report, "accepted");
    assert!(replays_of_202 <= figure(&report, "replays"), "{report:#}");
    let poll = report["poll"].as_i64().unwrap();
    assert_eq!(app.votes_in_db(poll).await as u64, 80 + replaced);
    assert_eq!(settled_sum(&report), 80);
}

/// Multi without `allow_change`: a second ballot is 409 `already_voted` and changes
/// nothing; each voter's options count once.
#[tokio::test(flavor = "multi_thread")]
async fn a_multi_ballot_run_refuses_a_second_ballot_and_counts_each_choice_once() {
    let (app, report) =
        ballot_run("vote --ballot multi --max-choices 2 --users 80 --concurrency 16").await;
    assert_figures(&report, &[("accepted", 80), ("replaced", 0)]);
    let refused = report["ballot"]["refused"]["already_voted"]
        .as_u64()
        .unwrap();
    assert!(refused > 0, "{report:#}");
    assert!(
        answers(&report, "409 already_voted") >= refused,
        "{report:#}"
    );
    let poll = report["poll"].as_i64().unwrap();
    assert_eq!(app.votes_in_db(poll).await, 80);
    let votes = settled_sum(&report);
    assert!(
        (80..=160).contains(&votes),
        "1 or 2 options each: {report:#}"
    );
}

/// Budget: each voter spends exactly its budget over several requests, keyed and
/// some replayed; one more is `budget_spent`, a request over what is left (overall
/// or for its option) is `over_budget`; no budget or cap is passed in Postgres.
#[tokio::test(flavor = "multi_thread")]
async fn a_budget_run_spends_every_budget_exactly_and_never_more() {
    let mut names = BALLOT_CHECKS.to_vec();
    names.insert(2, "no budget exceeded, no option past its cap");
    let (app, report) = ballot_run_checking(
        "vote --ballot budget --votes-per-user 10 --max-per-option 4 --users 50 --concurrency 16",
        &names,
    )
    .await;
    assert_eq!(figure(&report, "votes_given"), 500, "{report:#}");
    assert_eq!(
        report["ballot"]["refused"]["budget_spent"],
        json!(50),
        "{report:#}"
    );
    assert!(figure(&report, "replays") > 0, "{report:#}");
    assert_eq!(settled_sum(&report), 500);
    let poll = report["poll"].as_i64().unwrap();
    let spent: i64 = app
        .scalar(
            "SELECT COALESCE(sum(count), 0)::int8 FROM votes WHERE poll_id = $1",
            poll,
        )
        .await;
    assert_eq!(spent, 500);
}

/// Ranked with `--allow-change`: the tallies count each voter's first preference of
/// the ballot that counts, once.
#[tokio::test(flavor = "multi_thread")]
async fn a_ranked_run_counts_each_voters_first_preference_once() {
    let (app, report) = ballot_run(
        "vote --ballot ranked --allow-change --max-choices 3 --users 80 --concurrency 16",
    )
    .await;
    let replaced = figure(&report, "replaced");
    assert_eq!(figure(&report, "accepted"), 80 + replaced, "{report:#}");
    assert_eq!(settled_sum(&report), 80, "{report:#}");

    let (status, _, stderr) = load(&app, "repeat --ballot ranked --users 5").await;
    assert!(!status.success());
    assert!(stderr.contains("--ballot is for vote"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn another_host_is_refused_unless_asked_for() {
    let out = tokio::task::spawn_blocking(|| {
        load_binary();
        std::process::Command::new(env!("CARGO_BIN_EXE_stampede"))
            .args(["load", "healthz", "--url", "http://192.0.2.1:80"])
            .env_remove("STAMPEDE_CONFIG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--allow-remote"), "{stderr}");
}

/// `repeat`: each user's first try is a 202 and every later one `already_bought`,
/// and nothing else; every check holds.
#[tokio::test(flavor = "multi_thread")]
async fn a_repeat_run_accepts_each_user_once_then_answers_already_bought() {
    let (app, report) =
        load_on_new_app("repeat --users 20 --stock 100 --requests 100 --concurrency 8").await;
    assert_repeat_report(&report, json!({"202": 20, "409 already_bought": 80}), true);
    let sale = report["sale"].as_i64().unwrap();
    assert_eq!(app.orders_in_db(sale).await.len(), 20);
    assert_eq!(app.stock_left(sale).await, 80);
}

/// `soldout`: a sale with no stock answers every try `410 sold_out`, and nothing
/// else; every check holds.
#[tokio::test(flavor = "multi_thread")]
async fn a_soldout_run_answers_only_sold_out() {
    let (app, report) = load_on_new_app("soldout --users 20 --requests 60 --concurrency 8").await;
    assert_eq!(report["answers"], json!({"410 sold_out": 60}), "{report:#}");
    let checks = checks(&report);
    assert_eq!(checks.len(), 4, "{report:#}");
    assert!(checks.iter().all(|(_, ok)| *ok), "{report:#}");
    let sale = report["sale"].as_i64().unwrap();
    assert!(app.orders_in_db(sale).await.is_empty());
}

/// Three units vanish from the sale's Redis stock behind the server's back before
/// the run (nobody bought them, so no order will ever settle for them): the run's
/// purchases and the stock it sees move together, but Postgres never holds as many
/// orders as units sold. Exactly that invariant is reported broken, and the run
/// exits non-zero, with `--json` and with the text report.
#[tokio::test(flavor = "multi_thread")]
async fn a_broken_invariant_is_named_and_the_run_fails() {
    let (app, _, sale) = spawn_with_live_sale(10).await;
    assert_eq!(app.stock_left(sale).await, 10);
    let stock = app.sale_keys(sale).stock;
    let _: () = app.redis_query(redis::cmd("SET").arg(&stock).arg(7)).await;
    let args =
        format!("repeat --sale {sale} --users 5 --requests 10 --concurrency 4 --settle-timeout 1");

    let (status, report, stderr) = load(&app, &args).await;
    assert!(!status.success(), "{report:#}");
    assert_eq!(status.code(), Some(1));
    assert!(
        stderr.contains("an invariant broke (see the checks in the JSON report)"),
        "{stderr}"
    );
    assert_eq!(report["ok"], false);
    assert_repeat_report(&report, json!({"202": 5, "409 already_bought": 5}), false);

    // The text report names it too (2 units left: 2 more buyers).
    let (status, stdout, stderr) = load_text(&app, &args).await;
    assert_eq!(status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("an invariant broke (see BROKEN above)"),
        "{stderr}"
    );
    assert!(
        stdout.contains("BROKEN  every accepted order in Postgres, once"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok      stock left = stock - accepted"),
        "{stdout}"
    );
    assert_eq!(stdout.matches("BROKEN").count(), 1, "{stdout}");
}

/// `--sale` on a sale with an order cancelled before the run: the returned unit
/// is offered again, so units sold are the units live orders hold, not the order
/// rows; every check holds.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_on_a_sale_with_a_cancelled_order_passes_its_checks() {
    let (app, _, sale) = spawn_with_live_sale(10).await;
    let early = app.user().await;
    app.buy(sale, &early.token).await;
    let (order, _) = app.wait_for_orders(sale, 1).await[0];
    let cancelled = app
        .post(&format!("/api/orders/{order}/cancel"), Some(&early.token))
        .await;
    assert_eq!(cancelled.status(), reqwest::StatusCode::OK);
    assert_eq!(app.stock_left(sale).await, 10);
    let args =
        format!("repeat --sale {sale} --users 5 --requests 10 --concurrency 4 --settle-timeout 20");
    let (status, report, stderr) = load(&app, &args).await;
    assert!(status.success(), "{report:#}\n{stderr}");
    assert_repeat_report(&report, json!({"202": 5, "409 already_bought": 5}), true);
}

/// `--opens-at`: the sale opens at that moment and no request is answered before
/// it; a moment in the past, more than a day ahead, or with --opens-in is refused.
#[tokio::test(flavor = "multi_thread")]
async fn opens_at_releases_the_storm_at_that_moment_and_refuses_the_past() {
    let app = spawn_app().await;
    // Built before the clock starts: the 6 s are the run's, not cargo's.
    tokio::task::spawn_blocking(load_binary).await.unwrap();
    let opens = Utc::now() + chrono::Duration::seconds(6);
    let opens_arg = opens.to_rfc3339_opts(SecondsFormat::Millis, true);
    let opens: DateTime<Utc> = opens_arg.parse().unwrap();
    let (status, report, stderr) = load(
        &app,
        &format!("storm --users 60 --stock 10 --opens-at {opens_arg} --concurrency 16"),
    )
    .await;
    assert!(status.success(), "{stderr}\n{report:#}");
    assert_answers(&report, &[("202", 10), ("410 sold_out", 50)]);
    let reported: DateTime<Utc> = report["opens_at"].as_str().unwrap().parse().unwrap();
    assert_eq!(reported, opens);
    let first: DateTime<Utc> = report["first_answer_at"].as_str().unwrap().parse().unwrap();
    assert!(
        first >= opens,
        "first answer {first} before the opening {opens}"
    );
    assert!(
        first < opens + chrono::Duration::seconds(5),
        "first answer {first} long after the opening {opens}"
    );
    let sale = report["sale"].as_i64().unwrap();
    let starts: DateTime<Utc> = app
        .scalar("SELECT starts_at FROM sales WHERE id = $1", sale)
        .await;
    assert_eq!(starts, opens);

    let past =
        (Utc::now() - chrono::Duration::seconds(60)).to_rfc3339_opts(SecondsFormat::Secs, true);
    let (status, _, stderr) = load(&app, &format!("storm --opens-at {past}")).await;
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("--opens-at {past} is in the past")),
        "{stderr}"
    );

    let far = (Utc::now() + chrono::Duration::hours(25)).to_rfc3339_opts(SecondsFormat::Secs, true);
    let (status, _, stderr) = load(&app, &format!("storm --opens-at {far}")).await;
    assert!(!status.success());
    assert!(stderr.contains("more than a day ahead"), "{stderr}");

    let (status, _, stderr) = load(&app, "storm --opens-at tomorrow").await;
    assert!(!status.success());
    assert!(stderr.contains("not an RFC 3339 time"), "{stderr}");

    let soon =
        (Utc::now() + chrono::Duration::minutes(5)).to_rfc3339_opts(SecondsFormat::Secs, true);
    let (status, _, stderr) = load(&app, &format!("storm --opens-at {soon} --opens-in 3")).await;
    assert!(!status.success());
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

/// The load generator is a binary of its own, `stampede-load`, and `stampede load`
/// runs the one beside it: the binary alone drives a run, and a `stampede` with no
/// `stampede-load` beside it says how to build it.
#[tokio::test(flavor = "multi_thread")]
async fn stampede_load_runs_the_stampede_load_binary_beside_it() {
    let app = spawn_app().await;
    let address = app.address.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(load_binary())
            .args("healthz --requests 40 --concurrency 4 --json".split(' '))
            .args(["--url", &address])
            .env_remove("STAMPEDE_CONFIG")
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["answers"], json!({"200": 40}), "{report:#}");

    // `stampede` alone in a directory (a hard link: `current_exe` names the link).
    let alone = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("alone-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&alone).unwrap();
    let stampede = alone.join("stampede");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_stampede"), &stampede).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_stampede"), &stampede).unwrap();
    }
    let out = std::process::Command::new(&stampede)
        .args(["load", "healthz"])
        .env_remove("STAMPEDE_CONFIG")
        .output()
        .unwrap();
    std::fs::remove_dir_all(&alone).unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("stampede-load, which is not there")
            && stderr.contains("cargo build --release --bins"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_storm_makes_a_rehearsal_that_cleanup_removes_with_its_users() {
    let (app, _, real) = spawn_with_live_sale(5).await;
    let buyer = app.user().await;
    app.buy(real, &buyer.token).await;
    let report = load_ok(
        &app,
        "storm --users 40 --stock 10 --opens-in 1 --concurrency 16",
    )
    .await;
    let sale = report["sale"].as_i64().expect("the report names its sale");
    let rehearsal: bool = app
        .scalar("SELECT rehearsal FROM sales WHERE id = $1", sale)
        .await;
    assert!(rehearsal, "stampede load makes rehearsal sales");
    let users: i64 = sqlx::query_scalar("SELECT count(*) FROM users WHERE rehearsal")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(users, 41, "40 shoppers and the run's admin");
    let public = app.get_json("/api/sales", None).await;
    assert!(
        !public.as_array().unwrap().iter().any(|s| s["id"] == sale),
        "a rehearsal is on no public list"
    );

    let (status, stdout, stderr) = load_text(&app, "--cleanup --json").await;
    assert!(status.success(), "{stderr}");
    let cleaned: Value = serde_json::from_str(stdout.trim()).expect(&stdout);
    assert_eq!(cleaned["sales"], 1, "{cleaned}");
    assert_eq!(cleaned["orders"], 10, "{cleaned}");
    assert_eq!(cleaned["users"], 40, "the shoppers alone: {cleaned}");
    assert_eq!(
        cleaned["admins"], 1,
        "the run's own admin, apart: {cleaned}"
    );
    let left: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM sales WHERE rehearsal) + (SELECT count(*) FROM users WHERE rehearsal)",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(left, 0);
    let meta: bool = app
        .redis_query(redis::cmd("EXISTS").arg(app.sale_keys(sale).meta))
        .await;
    assert!(!meta);
    assert_eq!(
        app.orders_in_db(real).await.len(),
        1,
        "the real sale keeps its order"
    );
}

/// `storm --waiting-room`: 300 users join the line of a 50-unit sale before its
/// opening, follow their standing, and the 50 admitted (at the head of the line, at
/// the set pace) buy with their admission's ticket; the other 250 end sold out.
/// Every check holds, storm's and the waiting room's, and `--cleanup` then removes
/// the line from Postgres and Redis.
#[tokio::test(flavor = "multi_thread")]
async fn a_waiting_room_storm_admits_in_line_order_and_sells_only_to_the_admitted() {
    let (app, report) = load_on_new_app(
        "storm --waiting-room --admit-per-second 200 --users 300 --stock 50 --opens-in 2 \
         --concurrency 32",
    )
    .await;
    assert_eq!(report["ok"], true, "{report:#}");
    assert_answers(
        &report,
        &[
            ("join 200 waiting", 300),
            ("purchase 202", 50),
            ("queue/me 200 sold_out", 250),
        ],
    );
    let names: Vec<String> = checks(&report).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "no 5xx",
            "every standing final",
            "nobody accepted twice",
            "accepted = min(stock, buyers)",
            "stock left = stock - accepted",
            "units per buyer = keys accepted",
            "every accepted order in Postgres, once",
            "every order's buyer was admitted",
            "nobody admitted twice",
            "admissions follow the line order",
            "admissions never ahead of the pace",
            "orders = units sold",
        ],
        "{report:#}"
    );
    assert!(checks(&report).iter().all(|(_, ok)| *ok), "{report:#}");
    let wr = &report["waiting_room"];
    assert_eq!(wr["joined"], 300, "{wr:#}");
    assert_eq!(wr["joined_before_opening"], true, "{wr:#}");
    assert_eq!(wr["admitted"], 50, "{wr:#}");
    assert_eq!(wr["purchases"], 50, "{wr:#}");
    assert_eq!(wr["passes"], 0, "{wr:#}");
    assert_eq!(
        wr["standings"],
        json!({"bought": 50, "sold_out": 250}),
        "{wr:#}"
    );

    // What the report says, seen independently.
    let sale = report["sale"].as_i64().unwrap();
    let waiting_room: bool = app
        .scalar("SELECT waiting_room FROM sales WHERE id = $1", sale)
        .await;
    assert!(waiting_room, "the run's sale has a waiting room");
    assert_eq!(app.orders_in_db(sale).await.len(), 50);
    assert_line_rows(&app, sale, (300, 50), "after the run").await;

    // --cleanup removes the line too: its rows and its Redis keys.
    let (status, _, stderr) = load_text(&app, "--cleanup --json").await;
    assert!(status.success(), "{stderr}");
    assert_line_rows(&app, sale, (0, 0), "after --cleanup").await;
    let k = app.sale_keys(sale);
    let left: i64 = app
        .redis_query(
            redis::cmd("EXISTS")
                .arg(&k.queue)
                .arg(&k.queue_state)
                .arg(&k.queue_open)
                .arg(&k.queue_admitted)
                .arg(&k.queue_joins),
        )
        .await;
    assert_eq!(left, 0, "the line's Redis keys are gone");
}

/// The sale's (places, admissions) rows in Postgres are `expected`, `when`.
async fn assert_line_rows(app: &TestApp, sale: i64, expected: (i64, i64), when: &str) {
    let (places, admissions): (i64, i64) = app
        .row(
            "SELECT (SELECT count(*) FROM queue_places WHERE sale_id = $1),
                (SELECT count(*) FROM queue_admissions WHERE sale_id = $1)",
            sale,
        )
        .await;
    assert_eq!((places, admissions), expected, "{when}");
}

/// `--waiting-room` is for a storm on a sale the run makes; with `--prepare-only
/// --warm-up` (scripts/bench-queue) it writes the join and every user is in line.
#[tokio::test(flavor = "multi_thread")]
async fn waiting_room_is_refused_outside_a_storm_of_its_own() {
    let app = spawn_app().await;
    let (text, _) = prepared(
        &app,
        "storm --waiting-room --users 20 --opens-in 60 --warm-up",
    )
    .await;
    let sale = sale_in(&text, "/queue");
    assert_eq!(text.lines().count(), 21, "the path, then 20 tokens");
    let line: i64 = app
        .redis_query(redis::cmd("ZCARD").arg(app.sale_keys(sale).queue))
        .await;
    assert_eq!(line, 20, "every user joined in the warm-up");

    let (status, _, stderr) = load(&app, "repeat --waiting-room --users 5").await;
    assert!(!status.success());
    assert!(stderr.contains("--waiting-room is for storm"), "{stderr}");
    let (status, _, stderr) = load(&app, "storm --waiting-room --sale 1 --users 5").await;
    assert!(!status.success());
    assert!(stderr.contains("cannot be used with"), "{stderr}");
    let (status, _, stderr) = load(&app, "storm --admit-per-second 10 --users 5").await;
    assert!(!status.success());
    assert!(stderr.contains("--waiting-room"), "{stderr}");
}

/// `--warm-up` asks again whoever got an ambiguous answer. Here every purchase is
/// decided but answered 503 `not_replicated` (more replica acknowledgements asked
/// for than the test Redis has replicas); asked again, each user is found to have
/// bought (409 `already_bought`: a batch that accepted nothing waits for no
/// replica), so the warm-up succeeds with each user holding exactly one order.
#[tokio::test(flavor = "multi_thread")]
async fn a_warm_up_asks_again_whoever_got_an_ambiguous_answer() {
    let app = spawn_app_with(|c| {
        c.replica_acks = 5;
        c.replica_ack_timeout = std::time::Duration::from_millis(50);
    })
    .await;
    let (text, stderr) = prepared(&app, "repeat --users 20 --stock 100 --warm-up").await;
    assert!(
        stderr.contains("warm-up: 20 of 20 users got no clear answer; asking them again"),
        "{stderr}"
    );
    let sale = sale_in(&text, "/purchase");
    assert_eq!(app.buyers(sale).await.len(), 20, "each user bought once");
    assert_eq!(app.stock_left(sale).await, 80);
    assert_eq!(app.wait_for_orders(sale, 20).await.len(), 20);
}

/// `storm --draw`: 120 users enter a 30-unit draw before it (a tenth twice, the
/// same entry), the draw is published, 24 of the 30 winners buy with their
/// win's ticket and 6 let it pass; with claims cut to 1.5 s the 6 wins pass to
/// the next 6 entries of the seeded order, who buy. Losers trying to buy are
/// refused `not_drawn`. Every check holds, the draw's included (recomputed from
/// the published seed as `stampede verify-draw` does).
#[tokio::test(flavor = "multi_thread")]
async fn a_draw_rehearsal_draws_once_sells_only_to_winners_and_passes_unclaimed_wins() {
    let app = spawn_app_with(|c| c.draw_claim_max = std::time::Duration::from_millis(1500)).await;
    let report = load_ok(
        &app,
        "storm --draw --users 120 --stock 30 --opens-in 3 --concurrency 16 --claim-share 80",
    )
    .await;
    assert_eq!(report["ok"], true, "{report:#}");
    let names: Vec<String> = checks(&report).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "no 5xx",
            "nobody accepted twice",
            "stock left = stock - accepted",
            "units per buyer = keys accepted",
            "every accepted order in Postgres, once",
            "one entry per account",
            "exactly one draw",
            "the published draw checks out (verify-draw)",
            "only winners bought",
            "every claimed win bought",
            "unclaimed wins passed on in the seeded order",
        ],
        "{report:#}"
    );
    let d = &report["draw"];
    assert_eq!(d["entries"], 120, "{d:#}");
    assert_eq!(d["entered_before_draw"], true, "{d:#}");
    assert_eq!(d["winners_at_draw"], 30, "{d:#}");
    assert_eq!(
        (d["claims"].clone(), d["unclaimed"].clone()),
        (json!(30), json!(6)),
        "{d:#}"
    );
    assert_eq!(d["passes"], 6, "{d:#}");
    assert_answers(&report, &[("entry 200 entered", 132), ("purchase 202", 30)]);
    assert_eq!(
        answers(&report, "purchase without a win 403 not_drawn"),
        20,
        "{report:#}"
    );

    // What the report says, seen independently: 30 orders, each of a winner.
    let sale = report["sale"].as_i64().unwrap();
    assert_eq!(app.orders_in_db(sale).await.len(), 30);
    let (winners, bought, passed): (i64, i64, i64) = app
        .row(
            "SELECT count(*) FILTER (WHERE won_at IS NOT NULL),
                    count(*) FILTER (WHERE outcome = 'bought'),
                    count(*) FILTER (WHERE outcome = 'passed')
             FROM draw_entries WHERE sale_id = $1",
            sale,
        )
        .await;
    assert_eq!((winners, bought, passed), (36, 30, 6));
}
