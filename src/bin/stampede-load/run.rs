//! One `stampede load` run: prepare, fire, report, verify.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{ConnectOptions, PgPool};
use stampede::config::Config;

use crate::checks::{count_votes, sale_view, verify};
use crate::client::{Conn, Request, Target};
use crate::fire::{Plan, REQUEST_TIMEOUT, Stop, fire};
use crate::prepare;
use crate::progress::{Line, Progress};
use crate::report::{Merged, Report, print_text};
use crate::{LoadArgs, Mode};

/// Runs `stampede load`; `Ok(false)` when an invariant broke.
pub async fn run(args: LoadArgs, config: &Config) -> anyhow::Result<bool> {
    let target = Target::parse(&args.url, args.allow_remote)?;
    preflight(&args, &target).await?;
    let needs_users = args.mode() != Mode::Healthz;
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
    if let (true, Some(db), None) = (args.waiting_room, &db, &args.prepare_only) {
        return crate::waiting::run(&args, &target, db, &admin, &user_ids, tokens, &aim).await;
    }
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
        check_opens_at(args.mode(), at, Utc::now())?;
    }
    anyhow::ensure!(
        !args.waiting_room || args.mode() == Mode::Storm,
        "--waiting-room is for storm (the line is joined before the opening)"
    );
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
pub struct Aim {
    pub sale: Option<i64>,
    pub poll: Option<i64>,
    path: String,
    body: Option<Vec<u8>>,
    pub opens_at: Option<DateTime<Utc>>,
    pub release_at: Option<Instant>,
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
    match args.mode() {
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
            let opens_at = match (args.mode(), args.sale) {
                (Mode::Storm, None) => Some(args.opens_at.unwrap_or_else(|| {
                    Utc::now() + chrono::Duration::seconds(args.opens_in.max(1) as i64)
                })),
                (_, Some(_)) => args.opens_at,
                _ => None,
            };
            let sale = match args.sale {
                Some(sale) => sale,
                None => {
                    let stock = if args.mode() == Mode::Soldout {
                        0
                    } else {
                        args.stock
                    };
                    let opens =
                        opens_at.unwrap_or_else(|| Utc::now() - chrono::Duration::seconds(5));
                    // --waiting-room: the line opens now, the sale at the opening.
                    let room = args.waiting_room.then(|| prepare::WaitingRoom {
                        opens_at: Utc::now() - chrono::Duration::seconds(5),
                        admit_per_second: args.admit_per_second,
                    });
                    prepare::create_sale(target, admin, stock, opens, args.tickets, room).await?
                }
            };
            // --waiting-room --prepare-only: the request an outside generator sends
            // is the join.
            let path = match args.waiting_room {
                true => format!("/api/sales/{sale}/queue"),
                false => format!("/api/sales/{sale}/purchase"),
            };
            Ok(Aim {
                sale: Some(sale),
                opens_at,
                release_at: opens_at.map(release_instant).transpose()?,
                ..aim(path)
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
        mode: args.mode(),
        path: aim.path.clone(),
        body: aim.body.clone(),
        tokens,
        addresses,
        ticket_path,
        keys: aim.sale.is_some() && !args.no_keys && !args.waiting_room,
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

/// How often `--warm-up` asks a user whose answer was ambiguous.
const WARM_UP_TRIES: u32 = 5;

/// `--warm-up`: every user once, so that every later request is a repeat (in a
/// storm plan each user has one turn anyway; otherwise the request cap does it).
/// Each user's first request must succeed (2xx). One whose answer was ambiguous
/// (a 503, such as `not_replicated` when a replica was slow to confirm, or none)
/// may have bought or voted all the same: it is asked again after a pause, up to
/// [`WARM_UP_TRIES`] times in all, and then a 2xx or an `already_*` answer (its
/// first request went through) is as good. Any other answer fails the warm-up.
async fn warm_up(args: &LoadArgs, target: &Target, plan: &Arc<Plan>) -> anyhow::Result<()> {
    let mut left: Vec<usize> = (0..plan.tokens.len()).collect();
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    for attempt in 1..=WARM_UP_TRIES {
        let round = Arc::new(plan.of_users(&left));
        let progress = Arc::new(Progress::default());
        let seen = fire(
            target,
            round.clone(),
            args.concurrency,
            None,
            Stop {
                deadline: Instant::now() + Duration::from_secs(600),
                max_requests: round.tokens.len() as u64,
            },
            progress.clone(),
        )
        .await;
        for (k, n) in progress.counts() {
            *kinds.entry(k.label()).or_default() += n;
        }
        let users: std::collections::HashMap<usize, crate::fire::UserSeen> =
            seen.into_iter().flat_map(|s| s.users).collect();
        let mut again = Vec::new();
        for (j, &user) in left.iter().enumerate() {
            // No answer at all (the request never got one) is as ambiguous as a 503.
            let (done, ambiguous) = match users.get(&j) {
                Some(u) => (u.succeeded || (attempt > 1 && u.already), u.ambiguous),
                None => (false, true),
            };
            if done {
                continue;
            }
            anyhow::ensure!(
                ambiguous,
                "warm-up: each of the {} users' first request must succeed (a 503 or no \
                 answer is asked again), got {kinds:?}",
                plan.tokens.len()
            );
            again.push(user);
        }
        if again.is_empty() {
            return Ok(());
        }
        if !args.json {
            eprintln!(
                "warm-up: {} of {} users got no clear answer; asking them again",
                again.len(),
                plan.tokens.len()
            );
        }
        left = again;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    anyhow::bail!(
        "warm-up: {} of the {} users got no clear answer in {WARM_UP_TRIES} tries: {kinds:?}",
        left.len(),
        plan.tokens.len()
    )
}

/// `--prepare-only`: the request and the tokens for an outside generator.
async fn prepare_only(
    args: &LoadArgs,
    target: &Target,
    plan: &Arc<Plan>,
    file: &std::path::Path,
) -> anyhow::Result<bool> {
    if args.warm_up && !plan.tokens.is_empty() {
        warm_up(args, target, plan).await?;
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

/// `stampede load --cleanup`: every rehearsal sale and user out of Postgres and
/// Redis (`stampede::sale::rehearsal::cleanup`, as the admin API does).
pub async fn cleanup(config: &Config, json: bool) -> anyhow::Result<()> {
    let db = stampede::startup::connect_db(config).await?;
    let mut redis = stampede::startup::connect_redis(config).await?;
    let keys = stampede::keys::Keys::new(&config.redis_namespace);
    let cleaned = stampede::sale::rehearsal::cleanup(&db, &mut redis, &keys, config.token_ttl)
        .await
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    if json {
        println!("{}", serde_json::to_string(&cleaned)?);
    } else {
        println!(
            "removed {} rehearsal sales, {} orders, {} users{}",
            cleaned.sales,
            cleaned.orders,
            cleaned.users,
            match cleaned.users_kept {
                0 => String::new(),
                n => format!(" ({n} rehearsal users kept: a real sale, poll or change names them)"),
            }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
