//! `stampede load` (the binary) against a real server: a storm with exact counts and
//! a report whose invariants hold, a vote run, and the loopback guard.

use serde_json::Value;

use crate::helpers::{TestApp, spawn_app};

/// Runs `stampede load <args> --json` against `app`; the exit status and the report.
async fn load(app: &TestApp, args: &[&str]) -> (std::process::ExitStatus, Value, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_stampede"));
    cmd.arg("load")
        .args(args)
        .arg("--json")
        .arg("--url")
        .arg(&app.address)
        .env("DATABASE_URL", &app.config.database_url)
        .env("STAMPEDE_TOKEN_SECRET", &app.config.token_secret)
        .env_remove("STAMPEDE_CONFIG")
        .env("RUST_LOG", "warn");
    // The server runs in this test's runtime: wait for the child off it.
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run stampede load"))
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status, report, stderr)
}

fn answers(report: &Value, kind: &str) -> u64 {
    report["answers"][kind].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_storm_of_300_on_50_units_sells_exactly_50_and_every_check_holds() {
    let app = spawn_app().await;
    let (status, report, stderr) = load(
        &app,
        &[
            "storm",
            "--users",
            "300",
            "--stock",
            "50",
            "--opens-in",
            "1",
            "--concurrency",
            "64",
        ],
    )
    .await;
    assert!(status.success(), "{stderr}\n{report:#}");
    assert_eq!(answers(&report, "202"), 50, "{report:#}");
    assert_eq!(answers(&report, "410 sold_out"), 250, "{report:#}");
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
            "every accepted order in Postgres, once"
        ]
    );
    assert!(checks.iter().all(|c| c["ok"] == true), "{checks:#?}");
    // What the report says, seen independently.
    let sale = report["sale"].as_i64().unwrap();
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE sale_id = $1")
        .bind(sale)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(orders, 50);
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
    let app = spawn_app().await;
    let (status, report, stderr) = load(
        &app,
        &[
            "storm",
            "--tickets",
            "--users",
            "200",
            "--stock",
            "30",
            "--opens-in",
            "1",
            "--concurrency",
            "32",
        ],
    )
    .await;
    assert!(status.success(), "{stderr}\n{report:#}");
    assert_eq!(answers(&report, "202"), 30, "{report:#}");
    assert_eq!(answers(&report, "410 sold_out"), 170, "{report:#}");
    assert_eq!(answers(&report, "428 ticket_required"), 0, "{report:#}");
    let sale = report["sale"].as_i64().unwrap();
    let requires: bool = sqlx::query_scalar("SELECT requires_ticket FROM sales WHERE id = $1")
        .bind(sale)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert!(requires, "the run's sale requires tickets");

    let (status, _, stderr) = load(
        &app,
        &["repeat", "--sale", &sale.to_string(), "--users", "5"],
    )
    .await;
    assert!(!status.success());
    assert!(
        stderr.contains("requires purchase tickets: add --tickets"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vote_run_counts_each_voter_once_in_postgres() {
    let app = spawn_app().await;
    let (status, report, stderr) = load(
        &app,
        &[
            "vote",
            "--users",
            "100",
            "--requests",
            "300",
            "--concurrency",
            "16",
        ],
    )
    .await;
    assert!(status.success(), "{stderr}\n{report:#}");
    assert_eq!(answers(&report, "202"), 100, "{report:#}");
    assert_eq!(answers(&report, "409 already_voted"), 200, "{report:#}");
    let poll = report["poll"].as_i64().unwrap();
    let votes: i64 = sqlx::query_scalar("SELECT count(*) FROM votes WHERE poll_id = $1")
        .bind(poll)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(votes, 100);
}

#[tokio::test(flavor = "multi_thread")]
async fn another_host_is_refused_unless_asked_for() {
    let out = tokio::task::spawn_blocking(|| {
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
