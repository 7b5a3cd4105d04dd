//! `vote --ballot` from end to end: script, fire, check, report.

use std::sync::Arc;
use std::time::Instant;

use stampede::rehearse::Store;

use super::answers::{count, receipts};
use super::checks::{
    Fired, budgets, my_ballots, receipts_in_postgres, tallies, unresolved_ballots,
};
use super::fire::fire_voters;
use super::kind::{OPTIONS, settings};
use super::script::Rules;
use crate::aim::Aim;
use crate::args::{Ballot, LoadArgs};
use crate::checks::{Check, recorder};
use crate::client::Target;
use crate::progress::{Line, Progress};
use crate::report::ballot::BallotReport;
use crate::report::{Part, Report, print_text};

/// The run's users, as `run` gives them.
pub struct Voters<'a> {
    pub admin: &'a str,
    pub ids: &'a [i64],
    pub tokens: Vec<String>,
    /// The server's `token_secret`, for the receipts of Postgres's rows.
    pub secret: &'a str,
}

/// `vote --ballot`: every voter's requests, then the checks (see the module's note).
pub async fn run(
    args: &LoadArgs,
    target: &Target,
    store: &Store,
    users: Voters<'_>,
    aim: &Aim,
) -> anyhow::Result<bool> {
    let kind = args.ballot.expect("a --ballot run");
    let poll = aim.poll.expect("a vote run aims at a poll");
    let votes_per_user = args.votes_per_user;
    let rules = Rules {
        kind,
        options: aim.options.clone(),
        allow_change: args.allow_change,
        max_choices: args
            .max_choices
            .map_or(OPTIONS, |n| n as usize)
            .min(aim.options.len()),
        votes_per_user,
        max_per_option: args
            .max_per_option
            .unwrap_or(votes_per_user)
            .min(votes_per_user),
    };
    let mut rng = rand::rng();
    let voters: Vec<_> = (0..users.tokens.len())
        .map(|_| rules.voter(&mut rng))
        .collect();
    let voters = Arc::new(voters);
    let tokens = Arc::new(users.tokens);
    if !args.json {
        eprintln!(
            "poll {poll} ({} {}): {} voters send {} requests ({} connections)",
            kind.as_str(),
            settings(args),
            voters.len(),
            voters.iter().map(Vec::len).sum::<usize>(),
            args.concurrency
        );
    }

    let progress = Arc::new(Progress::default());
    let line = Line::start("voting", progress.clone());
    let started = Instant::now();
    let (latency, voted) = fire_voters(
        target,
        &aim.path,
        tokens.clone(),
        voters.clone(),
        args.concurrency,
        progress.clone(),
    )
    .await;
    let elapsed = started.elapsed();
    drop(line);

    let counted = count(kind, &rules.options, &voters, &voted);
    let mut checks: Vec<Check> = Vec::new();
    recorder(&mut checks)(
        "every answer as the ballot's rules say",
        counted.unexpected == 0,
        format!(
            "{} requests ({} replays of a key); {} answered otherwise{}",
            latency.len(),
            counted.replays,
            counted.unexpected,
            match counted.examples.first() {
                Some(e) => format!(", first: {e}"),
                None => String::new(),
            }
        ),
    );
    let receipts = receipts(&voters, &voted);
    let fired = Fired {
        poll,
        rules: &rules,
        voters: &voters,
        voted: &voted,
        receipts: &receipts,
        user_ids: users.ids,
        tokens: &tokens,
    };
    let rows = receipts_in_postgres(args, store, users.secret, &fired, &mut checks).await?;
    if kind == Ballot::Budget {
        budgets(&rules, &rows, &mut checks);
    }
    let lost = unresolved_ballots(&fired, &rows);
    let (live, settled) = tallies(target, users.admin, poll, &counted, &lost, &mut checks).await?;
    my_ballots(target, &fired, &mut checks).await?;

    let answers = progress
        .counts()
        .iter()
        .map(|(k, n)| (k.label(), *n))
        .collect();
    let ballot = BallotReport {
        ballot: kind,
        settings: settings(args),
        voters_sent: voters.len(),
        counted,
        live_tallies: live,
        settled_tallies: settled,
    };
    let report = Report::with_part(
        args,
        aim,
        elapsed,
        &latency,
        answers,
        checks,
        Part::Ballot(ballot),
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    Ok(report.ok)
}
