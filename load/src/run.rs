//! One `stampede load` run: prepare, fire, report, verify.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use stampede::config::Config;
use stampede::rehearse::Store;

use crate::aim::{Aim, aim, plan};
use crate::args::{LoadArgs, Mode};
use crate::checks::{sale_view, verify};
use crate::client::{Conn, Request, Target};
use crate::fire::{REQUEST_TIMEOUT, Stop, fire};
use crate::prepare;
use crate::prepare_only::prepare_only;
use crate::progress::{Line, Progress};
use crate::report::{Merged, Report, print_text};

/// Runs `stampede load`; `Ok(false)` when an invariant broke.
pub async fn run(args: LoadArgs, config: &Config) -> anyhow::Result<bool> {
    let target = Target::parse(&args.url, args.allow_remote)?;
    preflight(&args, &target).await?;
    let needs_users = args.mode() != Mode::Healthz;
    let db = match needs_users {
        true => Some(connect(config).await?),
        false => None,
    };
    let (admin, user_ids, tokens) = match &db {
        Some(store) => {
            let prepared = progress_note(&args, "making users", async {
                let ttl = stampede::sale::rehearsal::LOAD_TOKEN_TTL.as_secs() as i64;
                prepare::make_users(store, &config.token_secret, args.users.max(1), ttl).await
            })
            .await?;
            (prepared.admin, prepared.ids, prepared.tokens)
        }
        None => (String::new(), Vec::new(), Vec::new()),
    };
    // A draw makes its own sale (and with --prepare-only writes its entry route).
    if let (true, Some(store)) = (args.draw, &db) {
        return crate::draws::run(&args, &target, store, &admin, &user_ids, tokens).await;
    }
    let aim = aim(&args, &target, &admin).await?;
    if let (true, Some(store), None) = (args.waiting_room, &db, &args.prepare_only) {
        return crate::waiting::run(&args, &target, store, &admin, &user_ids, tokens, &aim).await;
    }
    if let (Some(_), Some(store), None) = (args.ballot, &db, &args.prepare_only) {
        let voters = crate::ballots::Voters {
            admin: &admin,
            ids: &user_ids,
            tokens,
            secret: &config.token_secret,
        };
        return crate::ballots::run(&args, &target, store, voters, &aim).await;
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
        (Some(store), Some(poll)) => Some(store.votes_of(poll, &user_ids).await?),
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

/// Most users a `storm --draw` makes.
const MAX_DRAW_USERS: usize = 1_000_000;

/// Refuses a bad `--opens-at`, and a URL where no Stampede answers.
async fn preflight(args: &LoadArgs, target: &Target) -> anyhow::Result<()> {
    if let Some(at) = args.opens_at {
        check_opens_at(args.mode(), at, Utc::now())?;
    }
    anyhow::ensure!(
        args.ballot.is_none() || args.mode() == Mode::Vote,
        "--ballot is for vote (the kind of poll the run makes)"
    );
    anyhow::ensure!(
        !args.draw || (args.mode() == Mode::Storm && args.users <= MAX_DRAW_USERS),
        "--draw is for storm, with at most {MAX_DRAW_USERS} --users (the run keeps every \
         standing)"
    );
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

/// The run's connection to Postgres (`stampede::rehearse`), for its users and its
/// checks; it mints their tokens with the server's secret, which must be set.
async fn connect(config: &Config) -> anyhow::Result<Store> {
    anyhow::ensure!(
        config.token_secret.len() >= 32,
        "stampede load mints tokens with the server's secret: set STAMPEDE_TOKEN_SECRET \
         (and DATABASE_URL) as for the server (`set -a; . .data/env` after scripts/run)"
    );
    Store::connect(config).await
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
    }
}
