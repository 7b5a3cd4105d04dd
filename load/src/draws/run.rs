//! `storm --draw` from end to end: enter, draw, claim, pass, check, report.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use stampede::rehearse::Store;

use super::checks::{Seen, draw_checks};
use super::claim::{Claims, buy_wins, follow_passes, losers_try, standings};
use super::enter::enter_all;
use crate::aim::Aim;
use crate::args::LoadArgs;
use crate::checks::{Check, sale_view, verify};
use crate::client::{Conn, Request, Target};
use crate::latency::Latency;
use crate::prepare;
use crate::progress::{Line, Progress};
use crate::report::draw::DrawReport;
use crate::report::{Part, Report, print_text};
use crate::waiting::ask::Tally;

/// Users without a win who try to buy anyway.
const LOSERS_TRYING: usize = 20;

/// `storm --draw`: enter, draw, claim, pass, check (see the module's note).
pub async fn run(
    args: &LoadArgs,
    target: &Target,
    store: &Store,
    admin: &str,
    user_ids: &[i64],
    tokens: Vec<String>,
) -> anyhow::Result<bool> {
    let draw_at = Utc::now() + chrono::Duration::seconds(args.opens_in.max(1) as i64);
    let sale = create_draw(target, admin, args.stock, draw_at).await?;
    if let Some(file) = &args.prepare_only {
        return prepare_entries(args, target, sale, tokens, file).await;
    }
    let sale_at_creation =
        prepare::call(target, "GET", &format!("/api/sales/{sale}"), admin, None).await?;
    let before = sale_view(target, admin, sale).await?;
    let tokens = Arc::new(tokens);
    let started = Instant::now();
    let note = |text: String| {
        if !args.json {
            eprintln!("{text}");
        }
    };
    note(format!(
        "draw sale {sale}: {} users enter ({} connections); drawn at {} (in {:.1} s)",
        args.users,
        args.concurrency,
        draw_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        (draw_at - Utc::now()).num_milliseconds() as f64 / 1000.0
    ));

    // 1. Every user enters.
    let progress = Arc::new(Progress::default());
    let line = Line::start("entering", progress.clone());
    let entry_started = Instant::now();
    let mut entered = enter_all(target, sale, tokens.clone(), args.concurrency, &progress).await?;
    let entry_seconds = entry_started.elapsed().as_secs_f64();
    let entered_before_draw = Utc::now() < draw_at;
    drop(line);
    let entries = entered.entries.iter().flatten().count();
    note(format!(
        "{entries} entered in {entry_seconds:.2} s ({:.0}/s)",
        entries as f64 / entry_seconds.max(1e-9)
    ));

    // 2. The draw, once published.
    let (first_draw, published_after) = await_draw(target, admin, sale, draw_at).await?;
    note(format!(
        "drawn, seen published {published_after:.2} s after its time"
    ));

    // 3. Standings, claims, losers refused.
    let line = Line::start("claiming", progress.clone());
    let who: Vec<usize> = (0..tokens.len())
        .filter(|i| entered.entries[*i].is_some())
        .collect();
    let (standings_tally, got) =
        standings(target, sale, &tokens, who, args.concurrency, &progress).await?;
    let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
    for s in &got {
        *by_state.entry(s.state.clone()).or_default() += 1;
    }
    let mut wins: Vec<(usize, String, Option<DateTime<Utc>>)> = got
        .iter()
        .filter_map(|s| Some((s.index, s.ticket.clone()?, s.claim_until)))
        .collect();
    wins.sort_by_key(|w| w.0);
    let claim_ends = wins.iter().filter_map(|w| w.2).max();
    let losers: Vec<usize> = got
        .iter()
        .filter(|s| s.ticket.is_none())
        .map(|s| s.index)
        .take(LOSERS_TRYING)
        .collect();
    let wins_only = wins.iter().map(|(i, t, _)| (*i, t.clone())).collect();
    let (buys, seen, unclaimed) = buy_wins(
        target,
        sale,
        &tokens,
        wins_only,
        args.claim_share,
        args.concurrency,
        &progress,
    )
    .await?;
    let losers_tried = losers.len();
    let (refused, losers_refused) = losers_try(target, sale, &tokens, losers, &progress).await?;
    let mut claims = Claims {
        standings: standings_tally,
        buys,
        refused,
        seen,
        unclaimed,
        losers_tried,
        losers_refused,
    };

    // 4. The passes, when the claims end soon enough.
    let user_of: HashMap<i64, usize> = entered
        .entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| e.map(|e| (e, i)))
        .collect();
    let wait_until = draw_at + chrono::Duration::seconds(args.claim_wait as i64);
    let passes_not_rehearsed = match claim_ends {
        _ if claims.unclaimed.is_empty() => Some("every winner claimed (--claim-share 100)".into()),
        Some(end) if end > wait_until => Some(format!(
            "the claims end at {} (the claim window; a rehearsal server shortens it with \
             STAMPEDE_DRAW_CLAIM_MAX_MS), after --claim-wait {} s",
            end.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            args.claim_wait
        )),
        _ => None,
    };
    let last_draw = match (&passes_not_rehearsed, claim_ends) {
        (None, Some(end)) => {
            let left = (end - Utc::now()).to_std().unwrap_or_default();
            let deadline = Instant::now() + left + Duration::from_secs(20);
            follow_passes(
                target,
                admin,
                sale,
                &tokens,
                &user_of,
                args.stock,
                deadline,
                &mut claims,
                &progress,
            )
            .await?
        }
        _ => first_draw.clone(),
    };
    drop(line);
    let elapsed = started.elapsed();

    // 5. The checks: the storm's (stock, orders), then the draw's.
    let mut checks = Vec::new();
    let mut all = Tally::new();
    let purchase_latency = Latency::of(&claims.buys.latency_us);
    let entry_latency = Latency::of(&entered.tally.latency_us);
    let entry_tally = std::mem::replace(&mut entered.tally, Tally::new());
    for t in [entry_tally, claims.standings, claims.buys, claims.refused] {
        all.add(t);
    }
    let server_errors = all.server_errors;
    checks.push(Check {
        invariant: "no 5xx".to_string(),
        ok: server_errors == 0,
        detail: format!(
            "{server_errors} answers 500 or over ({} requests never answered, each sent again)",
            all.no_answer
        ),
    });
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
        &claims.seen,
        &mut checks,
    )
    .await?;
    let csv = get_raw(
        target,
        admin,
        &format!("/api/sales/{sale}/draw/entries.csv"),
    )
    .await?;
    let buyers = store.buyers(sale).await?;
    let claimed = claims.seen.len();
    let claims_bought = claims
        .seen
        .values()
        .filter(|u| !u.accepted.is_empty())
        .count();
    let passes = count_outcome(&last_draw, "passed");
    draw_checks(
        &Seen {
            users: args.users,
            entered: &entered,
            record: store.draw_record(sale).await?,
            sale_at_creation: &sale_at_creation,
            draw: &last_draw,
            csv: &csv,
            buyers: &buyers,
            user_ids,
            claimed,
            claims_bought,
            unclaimed: &claims.unclaimed,
            losers: (claims.losers_tried, claims.losers_refused),
            passes_followed: passes_not_rehearsed.is_none(),
        },
        &mut checks,
    );

    let drawn_at: Option<DateTime<Utc>> =
        first_draw["drawn_at"].as_str().and_then(|t| t.parse().ok());
    let part = DrawReport {
        entries,
        entry_seconds,
        entries_per_second: entries as f64 / entry_seconds.max(1e-9),
        entered_before_draw,
        entry_latency,
        draw_at,
        drawn_at,
        draw_seconds: drawn_at.map_or(-1.0, |d| (d - draw_at).num_milliseconds() as f64 / 1000.0),
        published_after_seconds: published_after,
        winners_at_draw: first_draw["winners_at_draw"].as_i64().unwrap_or(0),
        claims: claims_bought,
        unclaimed: claims.unclaimed.len(),
        passes,
        passes_not_rehearsed,
        purchase_latency,
        standings: by_state,
    };
    let aim = Aim {
        sale: Some(sale),
        poll: None,
        path: format!("/api/sales/{sale}/entry"),
        body: None,
        options: Vec::new(),
        opens_at: Some(draw_at),
        release_at: None,
    };
    let report = Report::with_part(
        args,
        &aim,
        elapsed,
        &all.latency_us,
        all.answers,
        checks,
        Part::Draw(part),
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    Ok(report.ok)
}

/// `--draw --prepare-only FILE`: the entry route and the tokens for an outside
/// generator; with `--warm-up` every user has entered first (each must be
/// answered 200), so that every later entry is the same answer again.
async fn prepare_entries(
    args: &LoadArgs,
    target: &Target,
    sale: i64,
    tokens: Vec<String>,
    file: &std::path::Path,
) -> anyhow::Result<bool> {
    let tokens = Arc::new(tokens);
    if args.warm_up {
        let progress = Arc::new(Progress::default());
        let entered = enter_all(target, sale, tokens.clone(), args.concurrency, &progress).await?;
        let missing = entered.entries.iter().filter(|e| e.is_none()).count();
        anyhow::ensure!(
            missing == 0,
            "warm-up: {missing} of {} users' entries were not answered 200: {:?}",
            tokens.len(),
            entered.tally.answers
        );
    }
    let mut text = format!("/api/sales/{sale}/entry\n");
    for token in tokens.iter() {
        text.push_str(token);
        text.push('\n');
    }
    std::fs::write(file, text)?;
    Ok(true)
}

/// A new rehearsal draw sale of `stock` units: entries open now, the draw at
/// `draw_at`, claims of 60 s (the least allowed).
async fn create_draw(
    target: &Target,
    admin: &str,
    stock: i64,
    draw_at: DateTime<Utc>,
) -> anyhow::Result<i64> {
    let body = json!({
        "name": format!("Load test draw {}", Utc::now().format("%H:%M:%S")),
        "description": "Made by stampede load.",
        "price_cents": 100,
        "stock": stock,
        "mode": "draw",
        "entries_open_at": Utc::now() - chrono::Duration::seconds(5),
        "draw_at": draw_at,
        "ends_at": draw_at + chrono::Duration::hours(1),
        "claim_window_s": 60,
        "rehearsal": true,
    });
    let sale = prepare::call(target, "POST", "/api/admin/sales", admin, Some(&body)).await?;
    sale["id"]
        .as_i64()
        .ok_or_else(|| anyhow::anyhow!("no sale id in {sale}"))
}

/// Waits for the draw's publication from its time (at most a minute after): the
/// publication and the seconds from the draw's time until it was seen.
async fn await_draw(
    target: &Target,
    admin: &str,
    sale: i64,
    draw_at: DateTime<Utc>,
) -> anyhow::Result<(Value, f64)> {
    if let Ok(wait) = (draw_at - Utc::now()).to_std() {
        tokio::time::sleep(wait).await;
    }
    let path = format!("/api/sales/{sale}/draw");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(draw) = prepare::call(target, "GET", &path, admin, None).await {
            let after = (Utc::now() - draw_at).num_milliseconds() as f64 / 1000.0;
            return Ok((draw, after));
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "sale {sale} was not drawn within a minute of its time"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The body of `GET path` as the run's admin (a rehearsal's draw shows to admins
/// only), which must answer 200.
async fn get_raw(target: &Target, admin: &str, path: &str) -> anyhow::Result<Vec<u8>> {
    let mut conn = Conn::new(target.clone(), Duration::from_secs(60));
    let req = Request {
        method: "GET",
        path,
        token: Some(admin),
        forwarded_for: None,
        idempotency_key: None,
        body: None,
    };
    let resp = conn.send(&req).await?;
    anyhow::ensure!(resp.status == 200, "GET {path}: {}", resp.status);
    Ok(resp.body)
}

/// Published wins settled as `outcome`.
fn count_outcome(draw: &Value, outcome: &str) -> usize {
    draw["winners"]
        .as_array()
        .map_or(0, |w| w.iter().filter(|w| w["outcome"] == outcome).count())
}
