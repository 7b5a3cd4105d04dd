//! The checks of a `--ballot` run once its answers are in: every receipt in
//! Postgres once (after settlement) and in the voter's `my-ballot`, Redis's
//! tallies against the settled ones and against the voters' ballots, and a budget
//! never exceeded.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde_json::Value;
use stampede::rehearse::{BallotRow, Store, vote_receipt};
use uuid::Uuid;

use super::answers::{Counted, current};
use super::fire::Voted;
use super::script::{Rules, Step};
use crate::args::{Ballot, LoadArgs};
use crate::checks::{Check, recorder, settling_bar};
use crate::client::Target;
use crate::prepare;

/// Voters whose `my-ballot` the run reads (the first ones).
const MY_BALLOT_VOTERS: usize = 200;

/// What the run holds to check against.
pub struct Fired<'a> {
    pub poll: i64,
    pub rules: &'a Rules,
    pub voters: &'a [Vec<Step>],
    pub voted: &'a [Voted],
    pub receipts: &'a [Vec<Uuid>],
    pub user_ids: &'a [i64],
    pub tokens: &'a [String],
}

/// Waits for settlement, then checks the receipts against Postgres.
pub async fn receipts_in_postgres(
    args: &LoadArgs,
    store: &Store,
    secret: &str,
    f: &Fired<'_>,
    checks: &mut Vec<Check>,
) -> anyhow::Result<Vec<BallotRow>> {
    let expected: usize = f.receipts.iter().map(Vec::len).sum();
    let bar = settling_bar(args, expected as i64, "votes");
    let deadline = Instant::now() + Duration::from_secs(args.settle_timeout);
    let rows = loop {
        let rows = store.ballot_rows(f.poll, f.user_ids).await?;
        bar.set_position(rows.len() as u64);
        if rows.len() >= expected || Instant::now() >= deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    bar.finish_and_clear();
    let index: HashMap<i64, usize> = f
        .user_ids
        .iter()
        .enumerate()
        .map(|(i, &u)| (u, i))
        .collect();
    let mut held: Vec<Vec<Uuid>> = vec![Vec::new(); f.receipts.len()];
    for row in &rows {
        if let Some(&i) = index.get(&row.user_id) {
            held[i].push(vote_receipt(
                secret.as_bytes(),
                f.poll,
                row.user_id,
                row.seq,
            )?);
        }
    }
    let (mut missing, mut unseen, mut unseen_unresolved) = (0, 0, 0);
    for (i, (seen, held)) in f.receipts.iter().zip(&held).enumerate() {
        missing += seen.iter().filter(|r| !held.contains(r)).count();
        let extra = held.iter().filter(|r| !seen.contains(r)).count();
        match f.voted[i].unresolved {
            true => unseen_unresolved += extra,
            false => unseen += extra,
        }
    }
    recorder(checks)(
        "every 202 receipt in Postgres, once",
        missing == 0
            && unseen == 0
            && unseen_unresolved <= f.voted.iter().filter(|v| v.unresolved).count(),
        format!(
            "{} rows in Postgres for {expected} receipts answered 202; {missing} receipts not \
             there; {unseen} rows whose receipt no answer named ({unseen_unresolved} of voters \
             whose last request got no answer)",
            rows.len()
        ),
    );
    Ok(rows)
}

/// A budget never exceeded, no option past its cap, in Postgres.
pub fn budgets(rules: &Rules, rows: &[BallotRow], checks: &mut Vec<Check>) {
    let mut spent: HashMap<i64, (i64, BTreeMap<i64, i64>)> = HashMap::new();
    for row in rows {
        let s = spent.entry(row.user_id).or_default();
        s.0 += i64::from(row.count);
        *s.1.entry(row.option_id).or_default() += i64::from(row.count);
    }
    let over = spent
        .values()
        .filter(|s| s.0 > i64::from(rules.votes_per_user))
        .count();
    let capped = spent
        .values()
        .filter(|s| s.1.values().any(|&n| n > i64::from(rules.max_per_option)))
        .count();
    let most = spent.values().map(|s| s.0).max().unwrap_or(0);
    recorder(checks)(
        "no budget exceeded, no option past its cap",
        over == 0 && capped == 0,
        format!(
            "{} voters in Postgres, at most {most} votes each (budget {}); {over} over their \
             budget, {capped} over {} on an option",
            spent.len(),
            rules.votes_per_user,
            rules.max_per_option
        ),
    );
}

/// Redis's tallies (the admin view's live ones) against the settled ones, and
/// against the tallies the voters' answers make.
pub async fn tallies(
    target: &Target,
    admin: &str,
    poll: i64,
    counted: &Counted,
    unresolved_rows: &BTreeMap<i64, i64>,
    checks: &mut Vec<Check>,
) -> anyhow::Result<(BTreeMap<i64, i64>, BTreeMap<i64, i64>)> {
    let view = prepare::call(
        target,
        "GET",
        &format!("/api/admin/polls/{poll}"),
        admin,
        None,
    )
    .await?;
    let read = |v: &Value| -> BTreeMap<i64, i64> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| Some((t["option_id"].as_i64()?, t["votes"].as_i64()?)))
            .collect()
    };
    let live = read(&view["results"]["tallies"]);
    let settled = read(&view["settled"]);
    let mut check = recorder(checks);
    check(
        "Redis tallies = settled tallies",
        live == settled,
        format!("live {live:?}, settled in Postgres {settled:?}"),
    );
    let mut expected = counted.tallies.clone();
    for (o, n) in unresolved_rows {
        *expected.entry(*o).or_default() += n;
    }
    check(
        "tallies = the voters' ballots that count",
        live == expected,
        format!(
            "live {live:?}; the accepted ballots that count make {expected:?}{}",
            if unresolved_rows.is_empty() {
                String::new()
            } else {
                " (with Postgres's ballots of voters whose last answer was lost)".to_string()
            }
        ),
    );
    Ok((live, settled))
}

/// The ballots of voters whose last request got no answer, as Postgres holds them
/// (settled rows: for the tally check).
pub fn unresolved_ballots(f: &Fired<'_>, rows: &[BallotRow]) -> BTreeMap<i64, i64> {
    let mut out = BTreeMap::new();
    for (i, v) in f.voted.iter().enumerate() {
        if !v.unresolved {
            continue;
        }
        let mine: Vec<&BallotRow> = rows.iter().filter(|r| r.user_id == f.user_ids[i]).collect();
        let counted: Vec<&BallotRow> = match f.rules.kind {
            Ballot::Budget => mine,
            _ => mine.last().into_iter().copied().collect(),
        };
        for r in counted {
            match (f.rules.kind, &r.choices) {
                (Ballot::Multi, Some(choices)) => {
                    for o in choices {
                        *out.entry(*o).or_default() += 1;
                    }
                }
                _ => *out.entry(r.option_id).or_default() += i64::from(r.count),
            }
        }
    }
    out
}

/// Each of the first voters' `GET .../my-ballot`: its receipts those the voter got,
/// all settled, and its ballot the one that counts (a budget's `remaining`).
pub async fn my_ballots(
    target: &Target,
    f: &Fired<'_>,
    checks: &mut Vec<Check>,
) -> anyhow::Result<()> {
    let path = format!("/api/polls/{}/my-ballot", f.poll);
    let (mut read, mut wrong) = (0, Vec::new());
    for i in (0..f.voters.len())
        .filter(|&i| !f.voted[i].unresolved)
        .take(MY_BALLOT_VOTERS)
    {
        let mine = prepare::call(target, "GET", &path, &f.tokens[i], None).await?;
        read += 1;
        let receipts: Vec<Uuid> = mine["receipts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["receipt"].as_str()?.parse().ok())
            .collect();
        let counts = current(f.rules.kind, &f.voters[i], &f.voted[i]);
        let ballot_ok = match f.rules.kind {
            Ballot::Budget => {
                let spent: i64 = counts.values().sum();
                mine["remaining"].as_i64() == Some(i64::from(f.rules.votes_per_user) - spent)
            }
            _ => {
                let mut choices: Vec<i64> = mine["choices"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_i64)
                    .collect();
                if f.rules.kind == Ballot::Ranked {
                    choices.truncate(1);
                }
                choices.sort_unstable();
                choices == counts.keys().copied().collect::<Vec<_>>()
            }
        };
        if receipts != f.receipts[i] || mine["settled"] != Value::Bool(true) || !ballot_ok {
            wrong.push(i);
        }
    }
    recorder(checks)(
        "my-ballot: every receipt once, settled, the ballot that counts",
        wrong.is_empty(),
        format!(
            "{read} voters' my-ballot read; {} differ from their answers{}",
            wrong.len(),
            match wrong.first() {
                Some(i) => format!(" (voter #{i} first)"),
                None => String::new(),
            }
        ),
    );
    Ok(())
}
