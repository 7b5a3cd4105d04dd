//! One `stampede load` run: prepare, fire, report, verify.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::Value;
use sqlx::{ConnectOptions, PgPool};
use stampede::config::Config;
use uuid::Uuid;

use crate::client::{Conn, Request, Target};
use crate::prepare;
use crate::{LoadArgs, Mode};

/// Tries per user in a storm: a 503, a request the server never answered, or one
/// that came a moment before the opening is sent again (after 50 ms, 100 ms, ...).
const STORM_TRIES: u32 = 20;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// An answer as the report counts it: status and error code; status 0: none came.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Kind {
    status: u16,
    code: Option<String>,
}

impl Kind {
    fn label(&self) -> String {
        match (self.status, &self.code) {
            (0, _) => "no answer".to_string(),
            (s, Some(code)) => format!("{s} {code}"),
            (s, None) => s.to_string(),
        }
    }

    /// The label on the live progress line: short, so that every kind seen fits on
    /// one line (429s and 503s counted together whatever their code).
    fn short(&self) -> String {
        match (self.status, &self.code) {
            (202, _) => "202 accepted".to_string(),
            (429 | 503, _) => self.status.to_string(),
            _ => self.label(),
        }
    }

    fn retry_in_storm(&self) -> bool {
        matches!(self.status, 0 | 503) || self.code.as_deref() == Some("not_started")
    }
}

/// What every request of the run sends.
struct Plan {
    mode: Mode,
    path: String,
    body: Option<Vec<u8>>,
    tokens: Vec<String>,
    /// `X-Forwarded-For` per user, when asked for.
    addresses: Vec<String>,
    /// `--tickets`: where each purchase gets its ticket first.
    ticket_path: Option<String>,
}

impl Plan {
    fn request(&self, user: usize) -> Request<'_> {
        Request {
            method: if self.mode == Mode::Healthz {
                "GET"
            } else {
                "POST"
            },
            path: &self.path,
            token: self.tokens.get(user).map(String::as_str),
            forwarded_for: self.addresses.get(user).map(String::as_str),
            body: self.body.as_deref(),
        }
    }
}

/// Live counts of every answer kind, for the progress line and the report. A kind
/// gets its counter the first time any connection sees it (under the lock); each
/// connection keeps its own handles ([`Seen::counters`]), so an answer costs one
/// relaxed add.
#[derive(Default)]
struct Progress {
    kinds: Mutex<Vec<(Kind, Arc<AtomicU64>)>>,
}

impl Progress {
    fn counter(&self, kind: &Kind) -> Arc<AtomicU64> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, counter)) = kinds.iter().find(|(k, _)| k == kind) {
            return counter.clone();
        }
        let counter = Arc::new(AtomicU64::new(0));
        kinds.push((kind.clone(), counter.clone()));
        counter
    }

    /// Every kind seen so far and its count, by status (no answer last).
    fn counts(&self) -> Vec<(Kind, u64)> {
        let kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        let mut counts: Vec<(Kind, u64)> = kinds
            .iter()
            .map(|(k, n)| (k.clone(), n.load(Ordering::Relaxed)))
            .collect();
        counts.sort_by(|(a, _), (b, _)| (a.status == 0, a).cmp(&(b.status == 0, b)));
        counts
    }
}

/// The progress line's text: requests, rate, then `label count` of every kind
/// seen so far (`202 accepted 100 · 409 already_bought 20 · 410 sold_out 180`).
fn progress_message(what: &str, counts: &[(Kind, u64)], rate: f64) -> String {
    let done: u64 = counts.iter().map(|(_, n)| n).sum();
    let mut merged: Vec<(String, u64)> = Vec::new();
    for (kind, n) in counts {
        let label = kind.short();
        match merged.last_mut() {
            Some((last, total)) if *last == label => *total += n,
            _ => merged.push((label, *n)),
        }
    }
    let mut text = format!("{what}: {done} requests, {rate:.0}/s now");
    for (label, n) in merged {
        text.push_str(" · ");
        text.push_str(&label);
        text.push(' ');
        text.push_str(itoa::Buffer::new().format(n));
    }
    text
}

/// What one connection's task saw.
struct Seen {
    latency_us: Histogram<u64>,
    /// This connection's handles on the live counters of [`Progress`].
    counters: HashMap<Kind, Arc<AtomicU64>>,
    /// When this connection got its first answer.
    first_answer: Option<DateTime<Utc>>,
    /// Per user: 202s (with the order id of a purchase), and whether an answer was
    /// ambiguous (503 or none: the decision may have run) or `already_*`.
    users: HashMap<usize, UserSeen>,
}

#[derive(Default, Clone)]
struct UserSeen {
    accepted: Vec<Option<Uuid>>,
    ambiguous: bool,
    already: bool,
    decided: bool,
}

impl Seen {
    fn new() -> Self {
        Seen {
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
            counters: HashMap::new(),
            first_answer: None,
            users: HashMap::new(),
        }
    }
}

/// With `--tickets`: the user's ticket, then the purchase carrying it. A ticket
/// refused (not started yet, ended, sold out, ...) is the attempt's answer.
async fn with_ticket(
    conn: &mut Conn,
    plan: &Plan,
    user: usize,
    ticket_path: &str,
) -> anyhow::Result<crate::client::Response> {
    let request = plan.request(user);
    let ticket = conn
        .send(&Request {
            path: ticket_path,
            body: None,
            ..request
        })
        .await?;
    let parsed = (ticket.status == 200)
        .then(|| serde_json::from_slice::<Value>(&ticket.body).ok())
        .flatten();
    let Some(ticket) = parsed.as_ref().and_then(|v| v["ticket"].as_str()) else {
        return Ok(ticket);
    };
    let body = serde_json::json!({ "ticket": ticket }).to_string();
    conn.send(&Request {
        body: Some(body.as_bytes()),
        ..request
    })
    .await
}

/// Sends one request (with `--tickets`, a ticket request and the purchase) and
/// records it; returns its kind.
async fn one(
    conn: &mut Conn,
    plan: &Plan,
    user: usize,
    seen: &mut Seen,
    progress: &Progress,
) -> Kind {
    let started = Instant::now();
    let answer = match &plan.ticket_path {
        Some(ticket_path) => with_ticket(conn, plan, user, ticket_path).await,
        None => conn.send(&plan.request(user)).await,
    };
    let micros = started.elapsed().as_micros().max(1) as u64;
    let _ = seen.latency_us.record(micros.min(60_000_000));
    let (kind, order) = match answer {
        Ok(resp) => {
            let parsed = (plan.mode != Mode::Healthz)
                .then(|| serde_json::from_slice::<Value>(&resp.body).ok())
                .flatten();
            let code = parsed
                .as_ref()
                .filter(|_| resp.status >= 400)
                .and_then(|v| v["error"].as_str().map(String::from));
            let order = parsed
                .as_ref()
                .and_then(|v| v["order_id"].as_str().and_then(|s| s.parse().ok()));
            (
                Kind {
                    status: resp.status,
                    code,
                },
                order,
            )
        }
        Err(_) => (
            Kind {
                status: 0,
                code: None,
            },
            None,
        ),
    };
    if seen.first_answer.is_none() {
        seen.first_answer = Some(Utc::now());
    }
    match seen.counters.get(&kind) {
        Some(counter) => counter.fetch_add(1, Ordering::Relaxed),
        None => {
            let counter = progress.counter(&kind);
            seen.counters.insert(kind.clone(), counter.clone());
            counter.fetch_add(1, Ordering::Relaxed)
        }
    };
    if plan.mode != Mode::Healthz {
        let u = seen.users.entry(user).or_default();
        match kind.status {
            202 => u.accepted.push(order),
            0 | 503 => u.ambiguous = true,
            _ => {}
        }
        u.already |= kind
            .code
            .as_deref()
            .is_some_and(|c| c.starts_with("already_"));
        u.decided |= matches!(kind.status, 200..=299 | 409 | 410) && !kind.retry_in_storm();
    }
    kind
}

/// When the firing stops.
struct Stop {
    deadline: Instant,
    max_requests: u64,
}

/// `concurrency` connections; in a storm each takes the next user until every user
/// had its turn, else each sends the next request until `stop`.
async fn fire(
    target: &Target,
    plan: Arc<Plan>,
    concurrency: usize,
    release_at: Option<Instant>,
    stop: Stop,
    progress: Arc<Progress>,
) -> Vec<Seen> {
    let next = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(stop);
    let users = plan.tokens.len().max(1);
    let tasks: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (plan, next, stop, progress) =
                (plan.clone(), next.clone(), stop.clone(), progress.clone());
            let mut conn = Conn::new(target.clone(), REQUEST_TIMEOUT);
            tokio::spawn(async move {
                let mut seen = Seen::new();
                if let Some(at) = release_at {
                    // Connect before the opening, so the storm is requests, not handshakes.
                    let _ = conn.send(&Request::HEALTHZ).await;
                    tokio::time::sleep_until(at.into()).await;
                }
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if plan.mode == Mode::Storm {
                        if i >= users {
                            break;
                        }
                        for attempt in 1..=STORM_TRIES {
                            let kind = one(&mut conn, &plan, i, &mut seen, &progress).await;
                            if !kind.retry_in_storm() || attempt == STORM_TRIES {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt)))
                                .await;
                        }
                    } else {
                        if i as u64 >= stop.max_requests || Instant::now() >= stop.deadline {
                            break;
                        }
                        one(&mut conn, &plan, i % users, &mut seen, &progress).await;
                    }
                }
                seen
            })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        if let Ok(seen) = task.await {
            out.push(seen);
        }
    }
    out
}

/// The progress line while something runs; cleared when dropped.
struct Line {
    bar: indicatif::ProgressBar,
    task: tokio::task::JoinHandle<()>,
}

impl Line {
    fn start(what: &'static str, progress: Arc<Progress>) -> Line {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            // `wide_msg`: cut to the terminal's width, the rate first so it stays.
            indicatif::ProgressStyle::with_template("{spinner} {elapsed:>3} {wide_msg}")
                .expect("a valid template"),
        );
        let shown = bar.clone();
        let task = tokio::spawn(async move {
            let mut last = (Instant::now(), 0u64);
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let counts = progress.counts();
                let done: u64 = counts.iter().map(|(_, n)| n).sum();
                let rate = done.saturating_sub(last.1) as f64 / last.0.elapsed().as_secs_f64();
                last = (Instant::now(), done);
                shown.set_message(progress_message(what, &counts, rate));
                shown.tick();
            }
        });
        Line { bar, task }
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}

#[derive(Serialize)]
struct Latency {
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
}

#[derive(Serialize)]
struct Check {
    invariant: String,
    ok: bool,
    detail: String,
}

#[derive(Serialize)]
struct Report {
    mode: Mode,
    url: String,
    sale: Option<i64>,
    poll: Option<i64>,
    users: usize,
    concurrency: usize,
    requests: u64,
    seconds: f64,
    requests_per_second: f64,
    /// Storm: the opening (--opens-in or --opens-at); the requests were released a
    /// moment after it.
    opens_at: Option<DateTime<Utc>>,
    /// When the first answer came.
    first_answer_at: Option<DateTime<Utc>>,
    latency: Latency,
    answers: BTreeMap<String, u64>,
    checks: Vec<Check>,
    ok: bool,
}

/// Runs `stampede load`; `Ok(false)` when an invariant broke.
pub async fn run(args: LoadArgs, config: &Config) -> anyhow::Result<bool> {
    let target = Target::parse(&args.url, args.allow_remote)?;
    preflight(&args, &target).await?;
    let needs_users = args.mode != Mode::Healthz;
    let db = match needs_users {
        true => Some(connect_db(config).await?),
        false => None,
    };
    let (admin, user_ids, tokens) = match &db {
        Some(db) => {
            let prepared = progress_note(&args, "making users", async {
                prepare::make_users(db, &config.token_secret, args.users.max(1), 6 * 3600).await
            })
            .await?;
            (prepared.admin, prepared.ids, prepared.tokens)
        }
        None => (String::new(), Vec::new(), Vec::new()),
    };
    let aim = aim(&args, &target, &admin).await?;
    let plan = Arc::new(plan(&args, &target, &admin, &aim, tokens).await?);
    if let Some(file) = &args.prepare_only {
        return prepare_only(&args, &target, &plan, file).await;
    }

    let before = match aim.sale {
        Some(sale) => Some(sale_view(&target, &admin, sale).await?),
        None => None,
    };
    let poll_votes_before = match (&db, aim.poll) {
        (Some(db), Some(poll)) => Some(count_votes(db, poll, &user_ids).await?),
        _ => None,
    };
    announce(&args, &aim)?;
    let progress = Arc::new(Progress::default());
    let line = Line::start("firing", progress.clone());
    let fired_from = aim.release_at.unwrap_or_else(Instant::now);
    let seen = fire(
        &target,
        plan.clone(),
        args.concurrency,
        aim.release_at,
        Stop {
            deadline: fired_from + Duration::from_secs(args.seconds.max(1)),
            max_requests: args.requests.unwrap_or(u64::MAX),
        },
        progress.clone(),
    )
    .await;
    let elapsed = fired_from.elapsed();
    drop(line);
    let merged = Merged::of(seen);

    let mut checks = Vec::new();
    if aim.sale.is_some() || aim.poll.is_some() {
        verify(
            &args,
            &target,
            &admin,
            db.as_ref(),
            aim.sale,
            aim.poll,
            before.as_ref(),
            poll_votes_before,
            &user_ids,
            &merged.per_user,
            &mut checks,
        )
        .await?;
    }
    let report = Report::new(
        &args,
        &aim,
        needs_users,
        elapsed,
        &merged,
        &progress,
        checks,
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    Ok(report.ok)
}

/// Refuses a bad `--opens-at`, and a URL where no Stampede answers.
async fn preflight(args: &LoadArgs, target: &Target) -> anyhow::Result<()> {
    if let Some(at) = args.opens_at {
        check_opens_at(args.mode, at, Utc::now())?;
    }
    anyhow::ensure!(
        Conn::new(target.clone(), REQUEST_TIMEOUT)
            .send(&Request::HEALTHZ)
            .await
            .is_ok_and(|r| r.status == 200),
        "no Stampede answers GET {}/healthz: start one (scripts/run) or pass --url",
        args.url
    );
    Ok(())
}

/// The run's own small pool, quiet: making 20,000 users in one INSERT is meant to
/// take a while, and sqlx would warn about a slow statement.
async fn connect_db(config: &Config) -> anyhow::Result<PgPool> {
    anyhow::ensure!(
        config.token_secret.len() >= 32,
        "stampede load mints tokens with the server's secret: set STAMPEDE_TOKEN_SECRET \
         (and DATABASE_URL) as for the server (`set -a; . .data/env` after scripts/run)"
    );
    let options: sqlx::postgres::PgConnectOptions = config
        .database_url
        .parse::<sqlx::postgres::PgConnectOptions>()?
        .disable_statement_logging();
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot connect to Postgres at {}: {e}",
                stampede::config::redact_url(&config.database_url)
            )
        })
}

/// What the run fires at: the sale or poll (made now, or given), its route and
/// body, and for a storm the opening and the moment the requests are released.
struct Aim {
    sale: Option<i64>,
    poll: Option<i64>,
    path: String,
    body: Option<Vec<u8>>,
    opens_at: Option<DateTime<Utc>>,
    release_at: Option<Instant>,
}

async fn aim(args: &LoadArgs, target: &Target, admin: &str) -> anyhow::Result<Aim> {
    let aim = |path: String| Aim {
        sale: None,
        poll: None,
        path,
        body: None,
        opens_at: None,
        release_at: None,
    };
    match args.mode {
        Mode::Healthz => Ok(aim("/healthz".to_string())),
        Mode::Vote => {
            let (poll, option) = match args.poll {
                Some(poll) => {
                    let view =
                        prepare::call(target, "GET", &format!("/api/polls/{poll}"), admin, None)
                            .await?;
                    let option = view["options"][0]["id"]
                        .as_i64()
                        .ok_or_else(|| anyhow::anyhow!("poll {poll} has no options"))?;
                    (poll, option)
                }
                None => {
                    let (poll, options) = prepare::create_poll(target, admin).await?;
                    (poll, options[0])
                }
            };
            let body = serde_json::json!({ "option_id": option }).to_string();
            Ok(Aim {
                poll: Some(poll),
                body: Some(body.into_bytes()),
                ..aim(format!("/api/polls/{poll}/votes"))
            })
        }
        Mode::Storm | Mode::Repeat | Mode::Soldout => {
            // A storm opens at --opens-at, or --opens-in seconds from now (a sale it
            // makes; a given sale only with --opens-at); the others buy at once.
            let opens_at = match (args.mode, args.sale) {
                (Mode::Storm, None) => Some(args.opens_at.unwrap_or_else(|| {
                    Utc::now() + chrono::Duration::seconds(args.opens_in.max(1) as i64)
                })),
                (_, Some(_)) => args.opens_at,
                _ => None,
            };
            let sale = match args.sale {
                Some(sale) => sale,
                None => {
                    let stock = if args.mode == Mode::Soldout {
                        0
                    } else {
                        args.stock
                    };
                    let opens =
                        opens_at.unwrap_or_else(|| Utc::now() - chrono::Duration::seconds(5));
                    prepare::create_sale(target, admin, stock, opens, args.tickets).await?
                }
            };
            Ok(Aim {
                sale: Some(sale),
                opens_at,
                release_at: opens_at.map(release_instant).transpose()?,
                ..aim(format!("/api/sales/{sale}/purchase"))
            })
        }
    }
}

/// What every connection sends: the route, body, tokens, forwarded addresses and
/// the ticket route. Refuses a given sale that requires tickets without --tickets.
async fn plan(
    args: &LoadArgs,
    target: &Target,
    admin: &str,
    aim: &Aim,
    tokens: Vec<String>,
) -> anyhow::Result<Plan> {
    let addresses = if args.forwarded_for {
        (0..tokens.len())
            .map(|i| format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255))
            .collect()
    } else {
        Vec::new()
    };
    let ticket_path = match (aim.sale, args.tickets) {
        (Some(sale), true) => Some(format!("/api/sales/{sale}/ticket")),
        (None, true) => anyhow::bail!("--tickets is for the buy modes (storm, repeat, soldout)"),
        _ => None,
    };
    if let (Some(sale), false) = (args.sale, args.tickets) {
        let view = prepare::call(target, "GET", &format!("/api/sales/{sale}"), admin, None).await?;
        anyhow::ensure!(
            view["requires_ticket"] != Value::Bool(true),
            "sale {sale} requires purchase tickets: add --tickets (each purchase then asks for its \
             ticket first, as the sale page does)"
        );
    }
    Ok(Plan {
        mode: args.mode,
        path: aim.path.clone(),
        body: aim.body.clone(),
        tokens,
        addresses,
        ticket_path,
    })
}

/// Before a storm: fails when preparing took past the opening; says when it opens.
fn announce(args: &LoadArgs, aim: &Aim) -> anyhow::Result<()> {
    let (Some(at), Some(release)) = (aim.opens_at, aim.release_at) else {
        return Ok(());
    };
    let shown = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    anyhow::ensure!(
        release > Instant::now(),
        "preparing took until after the opening ({shown}): give a later --opens-at"
    );
    if !args.json {
        eprintln!(
            "sale {} opens at {shown} (in {:.1} s): {} users, {} connections",
            aim.sale.unwrap_or_default(),
            release
                .saturating_duration_since(Instant::now())
                .as_secs_f64(),
            args.users,
            args.concurrency
        );
    }
    Ok(())
}

/// What all the connections saw, merged.
struct Merged {
    latency: Histogram<u64>,
    per_user: HashMap<usize, UserSeen>,
    first_answer_at: Option<DateTime<Utc>>,
}

impl Merged {
    fn of(seen: Vec<Seen>) -> Merged {
        let mut merged = Merged {
            latency: Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds"),
            per_user: HashMap::new(),
            first_answer_at: None,
        };
        for s in seen {
            merged.latency.add(&s.latency_us).expect("same bounds");
            merged.first_answer_at = match (merged.first_answer_at, s.first_answer) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            for (user, u) in s.users {
                let e = merged.per_user.entry(user).or_default();
                e.accepted.extend(u.accepted);
                e.ambiguous |= u.ambiguous;
                e.already |= u.already;
                e.decided |= u.decided;
            }
        }
        merged
    }
}

impl Report {
    fn new(
        args: &LoadArgs,
        aim: &Aim,
        needs_users: bool,
        elapsed: Duration,
        merged: &Merged,
        progress: &Progress,
        checks: Vec<Check>,
    ) -> Report {
        let latency = &merged.latency;
        let requests = latency.len();
        let ms = |q: f64| latency.value_at_quantile(q) as f64 / 1000.0;
        Report {
            mode: args.mode,
            url: args.url.clone(),
            sale: aim.sale,
            poll: aim.poll,
            users: if needs_users { args.users } else { 0 },
            concurrency: args.concurrency,
            requests,
            seconds: elapsed.as_secs_f64(),
            requests_per_second: requests as f64 / elapsed.as_secs_f64().max(1e-9),
            opens_at: aim.opens_at,
            first_answer_at: merged.first_answer_at,
            latency: Latency {
                p50_ms: ms(0.50),
                p90_ms: ms(0.90),
                p99_ms: ms(0.99),
                p999_ms: ms(0.999),
                max_ms: latency.max() as f64 / 1000.0,
            },
            answers: progress
                .counts()
                .iter()
                .map(|(k, n)| (k.label(), *n))
                .collect(),
            ok: checks.iter().all(|c| c.ok),
            checks,
        }
    }
}

/// `--opens-at` must be a moment to come, within a day, and is for a storm.
fn check_opens_at(mode: Mode, at: DateTime<Utc>, now: DateTime<Utc>) -> anyhow::Result<()> {
    let shown = at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let now_shown = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    anyhow::ensure!(
        mode == Mode::Storm,
        "--opens-at is for storm (the moment its requests are released)"
    );
    anyhow::ensure!(
        at > now,
        "--opens-at {shown} is in the past (it is {now_shown} now): give a moment to come, \
         within a day"
    );
    anyhow::ensure!(
        at <= now + chrono::Duration::days(1),
        "--opens-at {shown} is more than a day ahead (it is {now_shown} now): the run's \
         tokens and connections are not meant to wait that long"
    );
    Ok(())
}

/// When to release the requests for a sale opening at `at`: a moment after it (the
/// server decides by its Redis clock, and a request a moment early is only sent
/// again), as an [`Instant`]. An error when that moment has passed.
fn release_instant(at: DateTime<Utc>) -> anyhow::Result<Instant> {
    let wait = (at - Utc::now()).to_std().map_err(|_| {
        anyhow::anyhow!(
            "the opening {} has passed: give a later --opens-at",
            at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        )
    })?;
    Ok(Instant::now() + wait + Duration::from_millis(20))
}

/// Runs `fut` with a one-line note on stderr (none with --json).
async fn progress_note<T>(
    args: &LoadArgs,
    what: &str,
    fut: impl std::future::Future<Output = T>,
) -> T {
    if !args.json {
        eprintln!("{what} ...");
    }
    fut.await
}

/// `--prepare-only`: the request and the tokens for an outside generator.
async fn prepare_only(
    args: &LoadArgs,
    target: &Target,
    plan: &Arc<Plan>,
    file: &std::path::Path,
) -> anyhow::Result<bool> {
    if args.warm_up && !plan.tokens.is_empty() {
        // Every user once, so that every later request is a repeat (in a storm
        // plan each user has one turn anyway; otherwise the request cap does it).
        let progress = Arc::new(Progress::default());
        fire(
            target,
            plan.clone(),
            args.concurrency,
            None,
            Stop {
                deadline: Instant::now() + Duration::from_secs(600),
                max_requests: plan.tokens.len() as u64,
            },
            progress.clone(),
        )
        .await;
        let counts = progress.counts();
        let accepted: u64 = counts
            .iter()
            .filter(|(k, _)| (200..300).contains(&k.status))
            .map(|(_, n)| n)
            .sum();
        let kinds: BTreeMap<String, u64> = counts.iter().map(|(k, n)| (k.label(), *n)).collect();
        anyhow::ensure!(
            accepted == plan.tokens.len() as u64,
            "warm-up: each of the {} users' first request must succeed, got {kinds:?}",
            plan.tokens.len()
        );
    }
    let mut text = plan.path.clone();
    if let Some(body) = &plan.body {
        text.push(' ');
        text.push_str(std::str::from_utf8(body)?);
    }
    text.push('\n');
    for token in &plan.tokens {
        text.push_str(token);
        text.push('\n');
    }
    std::fs::write(file, text)?;
    Ok(true)
}

/// A sale's `stock_total` (its Postgres record) and `stock_left` (Redis), read in one
/// call of the admin API: its report comparing Redis with Postgres.
async fn sale_view(target: &Target, admin: &str, sale: i64) -> anyhow::Result<(i64, i64)> {
    let path = format!("/api/admin/sales/{sale}/reconcile");
    let view = prepare::call(target, "GET", &path, admin, None).await?;
    let total = view["stock_total"].as_i64();
    let left = view["stock_left"].as_i64();
    match (total, left) {
        (Some(total), Some(left)) => Ok((total, left)),
        _ => anyhow::bail!("sale {sale}: no stock_total / stock_left in {view}"),
    }
}

async fn count_votes(db: &PgPool, poll: i64, users: &[i64]) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM votes WHERE poll_id = $1 AND user_id = ANY($2)")
            .bind(poll)
            .bind(users)
            .fetch_one(db)
            .await?,
    )
}

#[allow(clippy::too_many_arguments)]
async fn verify(
    args: &LoadArgs,
    target: &Target,
    admin: &str,
    db: Option<&PgPool>,
    sale: Option<i64>,
    poll: Option<i64>,
    before: Option<&(i64, i64)>,
    votes_before: Option<i64>,
    user_ids: &[i64],
    per_user: &HashMap<usize, UserSeen>,
    checks: &mut Vec<Check>,
) -> anyhow::Result<()> {
    let mut check = |invariant: &str, ok: bool, detail: String| {
        checks.push(Check {
            invariant: invariant.to_string(),
            ok,
            detail,
        })
    };
    let accepted: Vec<Uuid> = per_user
        .values()
        .flat_map(|u| u.accepted.iter().flatten().copied())
        .collect();
    let accepted_count: usize = per_user.values().map(|u| u.accepted.len()).sum();
    let twice: Vec<usize> = per_user
        .iter()
        .filter(|(_, u)| u.accepted.len() > 1)
        .map(|(user, _)| *user)
        .collect();
    check(
        "nobody accepted twice",
        twice.is_empty(),
        format!(
            "{accepted_count} accepted answers for {} users{}",
            per_user.values().filter(|u| !u.accepted.is_empty()).count(),
            if twice.is_empty() {
                String::new()
            } else {
                format!("; accepted twice: users #{twice:?}")
            }
        ),
    );
    // A user who never saw a 202 but was told `already_*` after a 503 or a lost
    // answer holds a unit (or a vote) the run did not see accepted; on a sale the
    // run made, `already_*` alone says the same (nobody bought it before).
    let made_here = args.sale.is_none() && args.poll.is_none();
    let unseen = per_user
        .values()
        .filter(|u| u.accepted.is_empty() && u.already && (u.ambiguous || made_here))
        .count();
    let taken = accepted_count + unseen;

    if let (Some(sale), Some(&(total, left_before))) = (sale, before) {
        if args.mode == Mode::Storm {
            let undecided = per_user.values().filter(|u| !u.decided).count()
                + args.users.saturating_sub(per_user.len());
            if undecided == 0 {
                let expected = (left_before as usize).min(args.users);
                check(
                    "accepted = min(stock, buyers)",
                    taken == expected,
                    format!(
                        "{taken} units taken ({accepted_count} answered 202, {unseen} after an ambiguous answer); stock {left_before}, buyers {}",
                        args.users
                    ),
                );
            } else {
                check(
                    "accepted = min(stock, buyers)",
                    taken <= left_before as usize,
                    format!(
                        "{undecided} users got no decision (429, 503 or no answer after {STORM_TRIES} tries): only checked that {taken} units taken <= {left_before}"
                    ),
                );
            }
        }
        let (_, left_after) = sale_view(target, admin, sale).await?;
        check(
            "stock left = stock - accepted",
            left_after == left_before - taken as i64,
            format!(
                "{left_after} left after, {left_before} before, {taken} taken{}",
                if made_here {
                    ""
                } else {
                    " (an existing sale: other buyers meanwhile would count too)"
                }
            ),
        );
        if let Some(db) = db {
            let settled = wait_settled(args, db, sale, total - left_after, &accepted).await?;
            let missing = accepted.iter().filter(|id| !settled.contains(id)).count();
            check(
                "every accepted order in Postgres, once",
                missing == 0 && settled.len() as i64 == total - left_after,
                format!(
                    "Postgres holds {} orders for the sale, {} units sold; {missing} of the {} accepted order ids missing",
                    settled.len(),
                    total - left_after,
                    accepted.len()
                ),
            );
        }
    }
    if let (Some(poll), Some(db), Some(before)) = (poll, db, votes_before) {
        let expected = before + taken as i64;
        let votes = wait_votes(args, db, poll, user_ids, before, expected).await?;
        check(
            "every accepted vote in Postgres, once",
            votes == expected,
            format!("{votes} votes of the run's users in Postgres, {expected} expected"),
        );
    }
    Ok(())
}

/// Waits (with a progress line) until Postgres holds `sold` orders for the sale and
/// every accepted id, or `--settle-timeout` passes; returns the ids it holds.
async fn wait_settled(
    args: &LoadArgs,
    db: &PgPool,
    sale: i64,
    sold: i64,
    accepted: &[Uuid],
) -> anyhow::Result<HashSet<Uuid>> {
    let bar = indicatif::ProgressBar::new(sold.max(0) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("settling {bar:30} {pos}/{len} orders in Postgres")
            .expect("a valid template"),
    );
    if args.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let deadline = Instant::now() + Duration::from_secs(args.settle_timeout);
    loop {
        let ids: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM orders WHERE sale_id = $1")
            .bind(sale)
            .fetch_all(db)
            .await?;
        let ids: HashSet<Uuid> = ids.into_iter().collect();
        bar.set_position(ids.len() as u64);
        let all = ids.len() as i64 >= sold && accepted.iter().all(|id| ids.contains(id));
        if all || Instant::now() >= deadline {
            bar.finish_and_clear();
            return Ok(ids);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (with a progress line) until Postgres holds `expected` votes of the run's
/// users in the poll, or `--settle-timeout` passes; returns how many it holds.
async fn wait_votes(
    args: &LoadArgs,
    db: &PgPool,
    poll: i64,
    users: &[i64],
    before: i64,
    expected: i64,
) -> anyhow::Result<i64> {
    let bar = indicatif::ProgressBar::new((expected - before).max(0) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("settling {bar:30} {pos}/{len} votes in Postgres")
            .expect("a valid template"),
    );
    if args.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let deadline = Instant::now() + Duration::from_secs(args.settle_timeout);
    loop {
        let votes = count_votes(db, poll, users).await?;
        bar.set_position((votes - before).max(0) as u64);
        if votes >= expected || Instant::now() >= deadline {
            bar.finish_and_clear();
            return Ok(votes);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn print_text(r: &Report) {
    println!(
        "{} against {}{}: {} requests in {:.2} s = {:.0} req/s ({} connections)",
        match r.mode {
            Mode::Storm => "storm",
            Mode::Repeat => "repeat",
            Mode::Soldout => "soldout",
            Mode::Vote => "vote",
            Mode::Healthz => "healthz",
        },
        r.url,
        match (r.sale, r.poll) {
            (Some(s), _) => format!(", sale {s}"),
            (_, Some(p)) => format!(", poll {p}"),
            _ => String::new(),
        },
        r.requests,
        r.seconds,
        r.requests_per_second,
        r.concurrency
    );
    if let (Some(opens), Some(first)) = (r.opens_at, r.first_answer_at) {
        println!(
            "opened at {}, first answer at {}",
            opens.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            first.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        );
    }
    let l = &r.latency;
    println!(
        "latency: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
        l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms
    );
    println!("answers:");
    for (kind, n) in &r.answers {
        println!("  {n:>9}  {kind}");
    }
    let limited = r.answers.get("429 rate_limited").copied().unwrap_or(0);
    if limited * 2 > r.requests {
        println!(
            "note: most answers were 429. The per-address limits count every simulated \
             user as this one machine: start the server with STAMPEDE_LIMITS=off, or with \
             STAMPEDE_TRUSTED_PROXIES=127.0.0.1 and pass --forwarded-for (an address per user)."
        );
    }
    if !r.checks.is_empty() {
        println!("invariants:");
        for c in &r.checks {
            println!(
                "  {}  {}: {}",
                if c.ok { "ok    " } else { "BROKEN" },
                c.invariant,
                c.detail
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(status: u16, code: Option<&str>) -> Kind {
        Kind {
            status,
            code: code.map(String::from),
        }
    }

    #[test]
    fn the_progress_line_counts_every_kind_seen_in_a_few_words() {
        let progress = Progress::default();
        for (k, n) in [
            (kind(410, Some("sold_out")), 180),
            (kind(202, None), 100),
            (kind(409, Some("already_bought")), 20),
            (kind(503, Some("recovering")), 2),
            (kind(503, Some("busy")), 1),
            (kind(0, None), 4),
        ] {
            progress.counter(&k).fetch_add(n, Ordering::Relaxed);
        }
        // The same kind again shares its counter.
        progress
            .counter(&kind(202, None))
            .fetch_add(1, Ordering::Relaxed);
        assert_eq!(
            progress_message("firing", &progress.counts(), 1234.4),
            "firing: 308 requests, 1234/s now · 202 accepted 101 · 409 already_bought 20 · \
             410 sold_out 180 · 503 3 · no answer 4"
        );
        assert_eq!(
            progress_message("firing", &[], 0.0),
            "firing: 0 requests, 0/s now"
        );
    }

    #[test]
    fn opens_at_is_a_moment_to_come_within_a_day_for_a_storm() {
        let now = Utc::now();
        let soon = now + chrono::Duration::minutes(1);
        assert!(check_opens_at(Mode::Storm, soon, now).is_ok());
        let past = check_opens_at(Mode::Storm, now - chrono::Duration::seconds(1), now);
        assert!(past.unwrap_err().to_string().contains("is in the past"));
        let far = check_opens_at(Mode::Storm, now + chrono::Duration::hours(25), now);
        assert!(
            far.unwrap_err()
                .to_string()
                .contains("more than a day ahead")
        );
        let vote = check_opens_at(Mode::Vote, soon, now);
        assert!(vote.unwrap_err().to_string().contains("is for storm"));
        assert!(release_instant(now - chrono::Duration::seconds(1)).is_err());
    }
}
