//! `storm --waiting-room` from end to end: join, follow, buy, check, report.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use stampede::rehearse::Store;

use super::ask::Tally;
use super::checks::{admissions_span, queue_checks, wait_copied};
use super::follow::{Followed, follow_all};
use super::join::join_all;
use crate::aim::Aim;
use crate::args::LoadArgs;
use crate::checks::{Check, sale_view, verify};
use crate::client::Target;
use crate::fire::UserSeen;
use crate::latency::Latency;
use crate::prepare;
use crate::progress::{Line, Progress};
use crate::report::room::WaitingRoomReport;
use crate::report::{Part, Report, print_text};

/// `storm --waiting-room`: join, follow, buy, check (see the module's note).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    args: &LoadArgs,
    target: &Target,
    store: &Store,
    admin: &str,
    user_ids: &[i64],
    tokens: Vec<String>,
    aim: &Aim,
) -> anyhow::Result<bool> {
    let sale = aim.sale.expect("a storm aims at a sale");
    let opens_at = aim.opens_at.expect("a storm has an opening");
    let release = aim.release_at.expect("a storm has an opening");
    let rate = args.admit_per_second;
    let before = sale_view(target, admin, sale).await?;
    let tokens = Arc::new(tokens);
    let started = Instant::now();

    // 1. Every user joins the line.
    if !args.json {
        eprintln!(
            "sale {sale} opens at {} (in {:.1} s), its line is open: {} users join ({} connections), \
             then {rate} are admitted a second",
            opens_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            release
                .saturating_duration_since(Instant::now())
                .as_secs_f64(),
            args.users,
            args.concurrency
        );
    }
    let join_progress = Arc::new(Progress::default());
    let line = Line::start("joining", join_progress.clone());
    let join_started = Instant::now();
    let (join_tally, joined) = join_all(
        target,
        sale,
        tokens.clone(),
        args.concurrency,
        join_progress,
    )
    .await;
    let join_elapsed = join_started.elapsed();
    let joined_before_opening = Instant::now() < release;
    drop(line);
    let joined_count = joined.iter().filter(|j| **j).count();
    if !args.json {
        eprintln!(
            "{joined_count} joined in {:.2} s ({:.0}/s){}",
            join_elapsed.as_secs_f64(),
            joined_count as f64 / join_elapsed.as_secs_f64().max(1e-9),
            if joined_before_opening {
                String::new()
            } else {
                " - after the opening: give a later --opens-in for a line all joined before it"
                    .to_string()
            }
        );
    }

    // 2. From the opening, each user follows its standing and buys when admitted.
    tokio::time::sleep_until(release.into()).await;
    let follow_from = Instant::now();
    let cap = (args.stock.max(0) as u64).min(args.users as u64);
    let bound = Duration::from_secs(30 + 2 * cap.div_ceil(u64::from(rate)));
    let deadline = follow_from + bound;
    let progress = Arc::new(Progress::default());
    let line = Line::start("following", progress.clone());
    let Followed {
        polls,
        buys,
        views: view_tally,
        followers,
        ended,
    } = follow_all(
        target, admin, sale, &tokens, &joined, args, deadline, progress,
    )
    .await?;
    let follow_elapsed = ended - follow_from;
    drop(line);
    let elapsed = started.elapsed();
    let final_view = prepare_view(target, admin, sale).await?;

    // 3. The checks: the storm's, then the waiting room's.
    let mut checks = Vec::new();
    let server_errors = join_tally.server_errors
        + polls.server_errors
        + buys.server_errors
        + view_tally.server_errors;
    let no_answer = join_tally.no_answer + polls.no_answer + buys.no_answer + view_tally.no_answer;
    checks.push(Check {
        invariant: "no 5xx".to_string(),
        ok: server_errors == 0,
        detail: format!(
            "{server_errors} answers 500 or over ({no_answer} requests never answered, each sent again)"
        ),
    });
    let mut standings: BTreeMap<String, usize> = BTreeMap::new();
    for f in &followers {
        *standings
            .entry(f.state.clone().unwrap_or_else(|| "unknown".to_string()))
            .or_default() += 1;
    }
    let unfinished = followers.iter().filter(|f| !f.done).count();
    checks.push(Check {
        invariant: "every standing final".to_string(),
        ok: unfinished == 0 && joined_count == args.users,
        detail: format!(
            "{joined_count} of {} users joined; after {:.1} s (bound {} s): {}",
            args.users,
            follow_elapsed.as_secs_f64(),
            bound.as_secs(),
            standings
                .iter()
                .map(|(s, n)| format!("{n} {s}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    });
    let per_user: HashMap<usize, UserSeen> = followers
        .iter()
        .map(|f| (f.index, f.seen.clone()))
        .collect();
    verify(
        args,
        target,
        admin,
        Some(store),
        Some(sale),
        None,
        Some(&before),
        None,
        user_ids,
        &per_user,
        &mut checks,
    )
    .await?;
    let admitted_in_redis = final_view["line"]["admitted"].as_i64().unwrap_or(0);
    let pg = wait_copied(args, store, sale, joined_count as i64, admitted_in_redis).await?;
    let purchases = followers
        .iter()
        .map(|f| {
            f.seen
                .keys
                .values()
                .filter(|k| !k.orders.is_empty())
                .count() as u64
        })
        .sum::<u64>();
    let twice = followers.iter().filter(|f| f.admissions.len() > 1).count();
    queue_checks(
        store,
        sale,
        opens_at,
        rate,
        &pg,
        admitted_in_redis,
        twice,
        purchases,
        (before.0, final_view["stock_left"].as_i64().unwrap_or(-1)),
        &mut checks,
    )
    .await?;

    let pace = admissions_span(store, sale, opens_at).await?;
    let wr = WaitingRoomReport {
        admit_per_second: rate,
        joined: joined_count,
        join_seconds: join_elapsed.as_secs_f64(),
        joins_per_second: joined_count as f64 / join_elapsed.as_secs_f64().max(1e-9),
        joined_before_opening,
        join_latency: Latency::of(&join_tally.latency_us),
        polls: polls.latency_us.len(),
        polls_per_user_max: followers.iter().map(|f| f.polls).max().unwrap_or(0),
        poll_latency: Latency::of(&polls.latency_us),
        admitted: pace.0,
        admission_seconds: pace.1,
        admissions_per_second: pace.0 as f64 / pace.1.max(1e-9),
        passes: final_view["line"]["passed"].as_i64().unwrap_or(0),
        purchases,
        purchase_latency: Latency::of(&buys.latency_us),
        follow_seconds: follow_elapsed.as_secs_f64(),
        standings,
        line: final_view["line"].clone(),
    };
    let mut all = Tally::new();
    for t in [join_tally, polls, buys, view_tally] {
        all.add(t);
    }
    let report = Report::with_part(
        args,
        aim,
        elapsed,
        &all.latency_us,
        all.answers,
        checks,
        Part::WaitingRoom(wr),
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    Ok(report.ok)
}

/// `GET /api/sales/{id}` as the run's admin (a rehearsal shows to admins only).
async fn prepare_view(target: &Target, admin: &str, sale: i64) -> anyhow::Result<Value> {
    prepare::call(target, "GET", &format!("/api/sales/{sale}"), admin, None).await
}
