//! `storm --waiting-room`: a rehearsal of a sale with a waiting room (issue 29, see
//! `src/sale/queue.rs`). The sale the run makes has a line that opens now and a
//! sale that opens at the storm's opening, admitting `--admit-per-second`.
//!
//! 1. **Join**: every user joins the line before the opening (`POST .../queue`,
//!    `--concurrency` connections, a progress line); a 503 or a lost answer is sent
//!    again, like a storm's purchase.
//! 2. **Follow**: from the opening each user follows its standing as a sale page
//!    does, gently: one `GET .../queue/me` to learn its place once the order is
//!    drawn, then again every 250 ms only while its place is near the line's
//!    `served` (read every 100 ms from `GET /api/sales/{id}`, one request for all),
//!    else every 5 s. Once the sale has no unit left, every one still waiting asks
//!    once more (its answer is then `sold_out`). An admitted user buys at once with
//!    its admission's ticket (`{"ticket": ...}`, an `Idempotency-Key`, retried on a
//!    503 or a lost answer). The phase ends when every user's standing is final
//!    (bought, passed, sold out) or after a bound (30 s + twice the admissions the
//!    stock allows at the set pace).
//! 3. **Check**: the storm's own invariants, then the waiting room's, through
//!    Postgres: every order's buyer was admitted, nobody admitted twice,
//!    admissions in line order, never ahead of the pace, orders = units sold, no
//!    5xx, every standing final.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::LoadArgs;
use crate::checks::{Check, sale_view, verify};
use crate::client::{Conn, Request, Target};
use crate::fire::{Kind, REQUEST_TIMEOUT, STORM_TRIES, UserSeen};
use crate::progress::{Line, Progress};
use crate::report::{Latency, Report, print_text};
use crate::run::Aim;

/// How often a user whose turn is near asks where it stands.
const NEAR_EVERY: Duration = Duration::from_millis(250);
/// How often a user far back in the line asks (its page would follow the line's
/// `served` over the event stream, and ask only when its turn comes).
const FAR_EVERY: Duration = Duration::from_secs(5);
/// How often the line's numbers are read (`GET /api/sales/{id}`, one for all).
const VIEW_EVERY: Duration = Duration::from_millis(100);

/// Answers and latency of one phase's requests on one connection.
struct Tally {
    latency_us: Histogram<u64>,
    /// `<phase> <status> [code or state]` -> count.
    answers: BTreeMap<String, u64>,
    /// Answers 500 and over, and requests never answered.
    server_errors: u64,
    no_answer: u64,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
            answers: BTreeMap::new(),
            server_errors: 0,
            no_answer: 0,
        }
    }

    fn add(&mut self, other: Tally) {
        self.latency_us.add(&other.latency_us).expect("same bounds");
        for (k, n) in other.answers {
            *self.answers.entry(k).or_default() += n;
        }
        self.server_errors += other.server_errors;
        self.no_answer += other.no_answer;
    }
}

/// One answer: status (0: none came), the JSON body, its kind.
struct Answer {
    status: u16,
    body: Option<Value>,
    kind: Kind,
}

/// Sends `req`, records it in `tally` (labelled `phase`, with `detail` of a 200
/// when given: the standing's state) and in `progress` (the live line).
async fn ask(
    conn: &mut Conn,
    req: &Request<'_>,
    phase: &str,
    tally: &mut Tally,
    progress: &Progress,
    detail: fn(&Value) -> Option<String>,
) -> Answer {
    let started = Instant::now();
    let resp = conn.send(req).await;
    let micros = started.elapsed().as_micros().max(1) as u64;
    let _ = tally.latency_us.record(micros.min(60_000_000));
    let (status, body) = match resp {
        Ok(r) => (r.status, serde_json::from_slice::<Value>(&r.body).ok()),
        Err(_) => (0, None),
    };
    let code = match (status, &body) {
        (400.., Some(v)) => v["error"].as_str().map(String::from),
        (200, Some(v)) => detail(v),
        _ => None,
    };
    let kind = Kind { status, code };
    progress.counter(&kind).fetch_add(1, Ordering::Relaxed);
    *tally
        .answers
        .entry(format!("{phase} {}", kind.label()))
        .or_default() += 1;
    match status {
        0 => tally.no_answer += 1,
        500.. => tally.server_errors += 1,
        _ => {}
    }
    Answer { status, body, kind }
}

fn no_detail(_: &Value) -> Option<String> {
    None
}

fn state_of(v: &Value) -> Option<String> {
    v["state"].as_str().map(String::from)
}

/// What the line's readers share.
struct Shared {
    /// The line's `served`: places the admission has reached.
    served: AtomicI64,
    /// The sale has no unit left: everyone still waiting is sold out.
    no_stock: AtomicBool,
    /// The follow phase is over (every standing final, or the bound).
    stop: AtomicBool,
}

/// One user as the run follows it.
#[derive(Default)]
struct Follower {
    index: usize,
    /// 1-based place, once drawn.
    position: Option<i64>,
    /// The last standing read (`waiting`, `admitted`, ...), or what ended it.
    state: Option<String>,
    done: bool,
    last_poll: Option<Instant>,
    polls: u32,
    /// Every distinct `expires_at` of an admission seen: more than one would be an
    /// admission given twice.
    admissions: Vec<String>,
    /// Its purchases, as a storm records them (for the storm's checks).
    seen: UserSeen,
}

/// Every user's join, before the opening.
async fn join_all(
    target: &Target,
    sale: i64,
    tokens: Arc<Vec<String>>,
    concurrency: usize,
    progress: Arc<Progress>,
) -> (Tally, Vec<bool>) {
    let next = Arc::new(AtomicUsize::new(0));
    let path = Arc::new(format!("/api/sales/{sale}/queue"));
    let tasks: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (tokens, next, path, progress) =
                (tokens.clone(), next.clone(), path.clone(), progress.clone());
            let mut conn = Conn::new(target.clone(), REQUEST_TIMEOUT);
            tokio::spawn(async move {
                let mut tally = Tally::new();
                let mut joined = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= tokens.len() {
                        break;
                    }
                    let req = Request {
                        method: "POST",
                        path: &path,
                        token: Some(&tokens[i]),
                        forwarded_for: None,
                        idempotency_key: None,
                        body: None,
                    };
                    let mut ok = false;
                    for attempt in 1..=STORM_TRIES {
                        let a = ask(&mut conn, &req, "join", &mut tally, &progress, state_of).await;
                        ok = a.status == 200;
                        if !matches!(a.status, 0 | 503) {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                    }
                    joined.push((i, ok));
                }
                (tally, joined)
            })
        })
        .collect();
    let mut tally = Tally::new();
    let mut joined = vec![false; tokens.len()];
    for task in tasks {
        if let Ok((t, j)) = task.await {
            tally.add(t);
            for (i, ok) in j {
                joined[i] = ok;
            }
        }
    }
    (tally, joined)
}

/// The line's numbers, every [`VIEW_EVERY`], until the follow phase stops: the
/// last view read.
async fn watch_line(
    target: Target,
    admin: String,
    sale: i64,
    shared: Arc<Shared>,
    progress: Arc<Progress>,
) -> (Tally, Option<Value>) {
    let mut tally = Tally::new();
    let mut conn = Conn::new(target, REQUEST_TIMEOUT);
    let path = format!("/api/sales/{sale}");
    let mut last = None;
    while !shared.stop.load(Ordering::Relaxed) {
        let req = Request {
            method: "GET",
            path: &path,
            token: Some(&admin),
            forwarded_for: None,
            idempotency_key: None,
            body: None,
        };
        let a = ask(
            &mut conn,
            &req,
            "sale view",
            &mut tally,
            &progress,
            no_detail,
        )
        .await;
        if let (200, Some(view)) = (a.status, a.body) {
            if let Some(served) = view["line"]["served"].as_i64() {
                shared.served.store(served, Ordering::Relaxed);
            }
            if view["stock_left"].as_i64().is_some_and(|left| left <= 0) {
                shared.no_stock.store(true, Ordering::Relaxed);
            }
            last = Some(view);
        }
        tokio::time::sleep(VIEW_EVERY).await;
    }
    (tally, last)
}

/// Buys with the admission's `ticket` (one key, retried on a 503 or a lost
/// answer); whether the standing is final after it, and what it ended as.
async fn buy(
    conn: &mut Conn,
    path: &str,
    token: &str,
    ticket: &str,
    f: &mut Follower,
    tally: &mut Tally,
    progress: &Progress,
) -> Option<&'static str> {
    let key = Uuid::new_v4().simple().to_string();
    let body = serde_json::json!({ "ticket": ticket }).to_string();
    let req = Request {
        method: "POST",
        path,
        token: Some(token),
        forwarded_for: None,
        idempotency_key: Some(&key),
        body: Some(body.as_bytes()),
    };
    let mut last = None;
    for attempt in 1..=STORM_TRIES {
        let a = ask(conn, &req, "purchase", tally, progress, no_detail).await;
        let order = a
            .body
            .as_ref()
            .and_then(|v| v["order_id"].as_str().and_then(|s| s.parse().ok()));
        let u = &mut f.seen;
        let k = u.keys.entry(key.clone()).or_default();
        k.unresolved = matches!(a.status, 0 | 503);
        match a.status {
            202 => {
                u.accepted.push(order);
                if let Some(order) = order.filter(|o| !k.orders.contains(o)) {
                    k.orders.push(order);
                }
            }
            0 | 503 => u.ambiguous = true,
            _ => {}
        }
        u.already |= a
            .kind
            .code
            .as_deref()
            .is_some_and(|c| c.starts_with("already_"));
        if !matches!(a.status, 0 | 503) {
            last = Some(a);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
    }
    let a = last?;
    match (a.status, a.kind.code.as_deref()) {
        (202, _) | (409, Some("already_bought")) => Some("bought"),
        (410, _) => Some("sold_out"),
        // The admission ended meanwhile: ask again where it stands.
        (403, _) => None,
        _ => Some("purchase refused"),
    }
}

/// One connection following its share of the users (every `concurrency`-th).
#[allow(clippy::too_many_arguments)]
async fn follow(
    mut conn: Conn,
    mut mine: Vec<Follower>,
    tokens: Arc<Vec<String>>,
    sale: i64,
    near: i64,
    deadline: Instant,
    shared: Arc<Shared>,
    progress: Arc<Progress>,
) -> (Tally, Tally, Vec<Follower>) {
    let (mut polls, mut buys) = (Tally::new(), Tally::new());
    let me_path = format!("/api/sales/{sale}/queue/me");
    let buy_path = format!("/api/sales/{sale}/purchase");
    let mut left = mine.iter().filter(|f| !f.done).count();
    while left > 0 && Instant::now() < deadline {
        let served = shared.served.load(Ordering::Relaxed);
        let no_stock = shared.no_stock.load(Ordering::Relaxed);
        let mut asked = false;
        for f in mine.iter_mut().filter(|f| !f.done) {
            let since = f.last_poll.map(|t| t.elapsed());
            let due = match (since, f.position) {
                (None, _) => true,
                // Where it stands is not known yet (a 503, say): ask gently.
                (Some(since), None) => since >= NEAR_EVERY,
                (Some(since), Some(p)) => {
                    let near =
                        p <= served + near || no_stock || f.state.as_deref() != Some("waiting");
                    since >= if near { NEAR_EVERY } else { FAR_EVERY }
                }
            };
            if !due {
                continue;
            }
            asked = true;
            f.last_poll = Some(Instant::now());
            f.polls += 1;
            let token = &tokens[f.index];
            let req = Request {
                method: "GET",
                path: &me_path,
                token: Some(token),
                forwarded_for: None,
                idempotency_key: None,
                body: None,
            };
            let a = ask(&mut conn, &req, "queue/me", &mut polls, &progress, state_of).await;
            let Some(v) = a.body.filter(|_| a.status == 200) else {
                continue;
            };
            if let Some(p) = v["position"].as_i64() {
                f.position = Some(p);
            }
            let state = v["state"].as_str().unwrap_or("").to_string();
            let ended = match state.as_str() {
                "waiting" => None,
                "admitted" => {
                    if let Some(e) = v["expires_at"].as_str()
                        && !f.admissions.iter().any(|x| x == e)
                    {
                        f.admissions.push(e.to_string());
                    }
                    match v["ticket"].as_str() {
                        Some(ticket) => {
                            let ticket = ticket.to_string();
                            buy(
                                &mut conn, &buy_path, token, &ticket, f, &mut buys, &progress,
                            )
                            .await
                        }
                        None => Some("admitted without a ticket"),
                    }
                }
                "passed" => Some("passed"),
                "bought" => Some("bought"),
                "sold_out" => Some("sold_out"),
                "not_joined" => Some("not_joined"),
                _ => Some("unknown"),
            };
            f.state = Some(ended.map(String::from).unwrap_or(state));
            if ended.is_some() {
                f.done = true;
                f.seen.decided = true;
                left -= 1;
            }
        }
        if !asked {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    (polls, buys, mine)
}

/// The waiting room's part of the report.
#[derive(Serialize)]
pub struct WaitingRoomReport {
    pub admit_per_second: u32,
    /// Users in the line (their join answered 200).
    pub joined: usize,
    pub join_seconds: f64,
    pub joins_per_second: f64,
    /// Whether every join was answered before the opening.
    pub joined_before_opening: bool,
    pub join_latency: Latency,
    /// `GET .../queue/me` requests, and the most one user sent.
    pub polls: u64,
    pub polls_per_user_max: u32,
    pub poll_latency: Latency,
    /// Admissions given (Postgres `queue_admissions`), the seconds from the opening
    /// to the last one, and their rate over that time.
    pub admitted: i64,
    pub admission_seconds: f64,
    pub admissions_per_second: f64,
    /// Admissions that expired unused (the line's `passed`).
    pub passes: i64,
    /// Purchases accepted (202).
    pub purchases: u64,
    pub purchase_latency: Latency,
    /// Seconds from the opening until every standing was final (or the bound).
    pub follow_seconds: f64,
    /// Users by how their standing ended (`bought`, `sold_out`, `passed`, ...;
    /// `waiting` when the bound came first).
    pub standings: BTreeMap<String, usize>,
    /// The line's numbers at the end (`GET /api/sales/{id}`).
    pub line: Value,
}

/// `storm --waiting-room`: join, follow, buy, check (see the module's note).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    args: &LoadArgs,
    target: &Target,
    db: &PgPool,
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
    let shared = Arc::new(Shared {
        served: AtomicI64::new(0),
        no_stock: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    });
    let progress = Arc::new(Progress::default());
    let line = Line::start("following", progress.clone());
    let watcher = tokio::spawn(watch_line(
        target.clone(),
        admin.to_string(),
        sale,
        shared.clone(),
        progress.clone(),
    ));
    let concurrency = args.concurrency.max(1);
    let mut shares: Vec<Vec<Follower>> = (0..concurrency).map(|_| Vec::new()).collect();
    for (i, ok) in joined.iter().enumerate() {
        shares[i % concurrency].push(Follower {
            index: i,
            done: !ok,
            state: (!ok).then(|| "not_joined".to_string()),
            ..Follower::default()
        });
    }
    // Users near the head: those admitted within half a second.
    let near = i64::from(rate / 2).max(1);
    let tasks: Vec<_> = shares
        .into_iter()
        .map(|mine| {
            tokio::spawn(follow(
                Conn::new(target.clone(), REQUEST_TIMEOUT),
                mine,
                tokens.clone(),
                sale,
                near,
                deadline,
                shared.clone(),
                progress.clone(),
            ))
        })
        .collect();
    let (mut polls, mut buys) = (Tally::new(), Tally::new());
    let mut followers = Vec::new();
    for task in tasks {
        let (p, b, mine) = task.await?;
        polls.add(p);
        buys.add(b);
        followers.extend(mine);
    }
    let follow_elapsed = follow_from.elapsed();
    shared.stop.store(true, Ordering::Relaxed);
    let (view_tally, _) = watcher.await?;
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
        Some(db),
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
    let pg = wait_copied(args, db, sale, joined_count as i64, admitted_in_redis).await?;
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
        db,
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

    let pace = admissions_span(db, sale, opens_at).await?;
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
    let report = Report::waiting_room(args, aim, elapsed, &all.latency_us, all.answers, checks, wr);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    Ok(report.ok)
}

/// `GET /api/sales/{id}` as the run's admin (a rehearsal shows to admins only).
async fn prepare_view(target: &Target, admin: &str, sale: i64) -> anyhow::Result<Value> {
    crate::prepare::call(target, "GET", &format!("/api/sales/{sale}"), admin, None).await
}

/// What Postgres holds of the line once copied: places in line order, and the
/// admissions (user, admitted_at).
struct Copied {
    places: Vec<i64>,
    admissions: Vec<(i64, DateTime<Utc>)>,
}

/// Waits (at most `--settle-timeout`) until Postgres holds every place and every
/// admission Redis gave (the admitter copies them a few hundred ms behind).
async fn wait_copied(
    args: &LoadArgs,
    db: &PgPool,
    sale: i64,
    places: i64,
    admitted: i64,
) -> anyhow::Result<Copied> {
    let deadline = Instant::now() + Duration::from_secs(args.settle_timeout);
    loop {
        let (p, a): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM queue_places WHERE sale_id = $1),
                    (SELECT count(*) FROM queue_admissions WHERE sale_id = $1)",
        )
        .bind(sale)
        .fetch_one(db)
        .await?;
        if (p >= places && a >= admitted) || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let places: Vec<i64> = sqlx::query_scalar(
        "SELECT user_id FROM queue_places WHERE sale_id = $1 ORDER BY place, user_id",
    )
    .bind(sale)
    .fetch_all(db)
    .await?;
    // In the order given: by admitted_at (one admitter step's admissions share it),
    // then by place; an admission without a place last.
    let admissions: Vec<(i64, DateTime<Utc>)> = sqlx::query_as(
        "SELECT a.user_id, a.admitted_at FROM queue_admissions a
           LEFT JOIN queue_places p ON p.sale_id = a.sale_id AND p.user_id = a.user_id
         WHERE a.sale_id = $1 ORDER BY a.admitted_at, p.place NULLS LAST, a.user_id",
    )
    .bind(sale)
    .fetch_all(db)
    .await?;
    Ok(Copied { places, admissions })
}

/// Admissions given, and seconds from the opening to the last one.
async fn admissions_span(
    db: &PgPool,
    sale: i64,
    opens_at: DateTime<Utc>,
) -> anyhow::Result<(i64, f64)> {
    let (count, last): (i64, Option<DateTime<Utc>>) = sqlx::query_as(
        "SELECT count(*), max(admitted_at) FROM queue_admissions WHERE sale_id = $1",
    )
    .bind(sale)
    .fetch_one(db)
    .await?;
    let seconds = last
        .map(|t| (t - opens_at).num_microseconds().unwrap_or(0) as f64 / 1e6)
        .unwrap_or(0.0);
    Ok((count, seconds))
}

/// The waiting room's invariants, through Postgres.
#[allow(clippy::too_many_arguments)]
async fn queue_checks(
    db: &PgPool,
    sale: i64,
    opens_at: DateTime<Utc>,
    rate: u32,
    pg: &Copied,
    admitted_in_redis: i64,
    seen_twice: usize,
    purchases: u64,
    (stock_total, stock_left): (i64, i64),
    checks: &mut Vec<Check>,
) -> anyhow::Result<()> {
    let mut check = super::checks::recorder(checks);
    let (orders, units, not_admitted): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), COALESCE(SUM(quantity), 0)::int8,
                count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM queue_admissions a
                                                   WHERE a.sale_id = o.sale_id AND a.user_id = o.user_id))
         FROM orders o WHERE o.sale_id = $1",
    )
    .bind(sale)
    .fetch_one(db)
    .await?;
    check(
        "every order's buyer was admitted",
        not_admitted == 0,
        format!("{orders} orders in Postgres, {not_admitted} of a user never admitted"),
    );

    let given = pg.admissions.len() as i64;
    let mut users: Vec<i64> = pg.admissions.iter().map(|(u, _)| *u).collect();
    users.sort_unstable();
    users.dedup();
    check(
        "nobody admitted twice",
        users.len() as i64 == given && given == admitted_in_redis && seen_twice == 0,
        format!(
            "{given} admissions in Postgres for {} users; Redis counts {admitted_in_redis} given; {seen_twice} users saw two different admissions",
            users.len()
        ),
    );

    let admitted: Vec<i64> = pg.admissions.iter().map(|(u, _)| *u).collect();
    let prefix = &pg.places[..admitted.len().min(pg.places.len())];
    let first_off = admitted
        .iter()
        .zip(prefix)
        .position(|(a, p)| a != p)
        .or((admitted.len() > prefix.len()).then_some(prefix.len()));
    check(
        "admissions follow the line order",
        first_off.is_none(),
        match first_off {
            None => format!(
                "the {} admitted are the first {} of the {} places, in order",
                admitted.len(),
                admitted.len(),
                pg.places.len()
            ),
            Some(i) => format!(
                "admission #{} went to user {} where the line's place #{} is user {:?} ({} places)",
                i + 1,
                admitted[i],
                i + 1,
                pg.places.get(i),
                pg.places.len()
            ),
        },
    );

    // By each moment an admission was written down, at most `rate` a second from the
    // opening (plus one second's worth: the admitter's step and the write).
    let rate = f64::from(rate);
    let (mut worst, mut early) = (None::<(usize, f64, f64)>, 0usize);
    for (i, (_, at)) in pg.admissions.iter().enumerate() {
        // Once per moment: at its last admission, all given by then are counted.
        if pg.admissions.get(i + 1).is_some_and(|(_, next)| next == at) {
            continue;
        }
        let count = i + 1;
        let since = (*at - opens_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
        if since < 0.0 {
            early += 1;
        }
        let allowed = rate * since.max(0.0) + rate;
        let slack = allowed - count as f64;
        if worst.is_none_or(|(_, _, s)| slack < s) {
            worst = Some((count, since, slack));
        }
    }
    check(
        "admissions never ahead of the pace",
        early == 0 && worst.is_none_or(|(_, _, slack)| slack >= 0.0),
        match worst {
            None => "no admission given".to_string(),
            Some((count, since, slack)) => format!(
                "{early} admissions before the opening; the nearest to the pace: {count} admitted by +{since:.2} s, {:.0} allowed ({rate:.0}/s from the opening, plus one second's)",
                count as f64 + slack
            ),
        },
    );

    let sold = stock_total - stock_left;
    check(
        "orders = units sold",
        units == sold && purchases as i64 == sold,
        format!(
            "{units} units in {orders} orders in Postgres, {sold} units sold (stock {stock_total}, {stock_left} left), {purchases} purchases accepted"
        ),
    );
    Ok(())
}
