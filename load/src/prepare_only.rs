//! `--prepare-only`: the run prepares and writes the request and the tokens for an
//! outside generator (`wrk`, scripts/bench), after a `--warm-up` if asked.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::args::LoadArgs;
use crate::client::Target;
use crate::fire::{Plan, Stop, UserSeen, fire};
use crate::progress::Progress;

/// `--prepare-only`: the request and the tokens for an outside generator.
pub async fn prepare_only(
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
        let users: HashMap<usize, UserSeen> = seen.into_iter().flat_map(|s| s.users).collect();
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
