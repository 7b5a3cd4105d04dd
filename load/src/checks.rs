//! The invariant checks after a run: the sale's stock through the admin API
//! (Redis and Postgres), and the orders or votes in Postgres once settled.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde::Serialize;
use stampede::rehearse::Store;
use uuid::Uuid;

use crate::args::{LoadArgs, Mode};
use crate::client::Target;
use crate::fire::{STORM_TRIES, UserSeen};
use crate::prepare;

#[derive(Serialize)]
pub struct Check {
    pub invariant: String,
    pub ok: bool,
    pub detail: String,
}

/// A recorder of checks into `checks`: `record(invariant, ok, detail)`.
pub fn recorder(checks: &mut Vec<Check>) -> impl FnMut(&str, bool, String) + '_ {
    |invariant, ok, detail| {
        checks.push(Check {
            invariant: invariant.to_string(),
            ok,
            detail,
        })
    }
}

/// A sale's `stock_total` (its Postgres record) and `stock_left` (Redis), read in one
/// call of the admin API: its report comparing Redis with Postgres.
pub async fn sale_view(target: &Target, admin: &str, sale: i64) -> anyhow::Result<(i64, i64)> {
    let path = format!("/api/admin/sales/{sale}/reconcile");
    let view = prepare::call(target, "GET", &path, admin, None).await?;
    let total = view["stock_total"].as_i64();
    let left = view["stock_left"].as_i64();
    match (total, left) {
        (Some(total), Some(left)) => Ok((total, left)),
        _ => anyhow::bail!("sale {sale}: no stock_total / stock_left in {view}"),
    }
}

#[allow(clippy::too_many_arguments)]
pub async fn verify(
    args: &LoadArgs,
    target: &Target,
    admin: &str,
    store: Option<&Store>,
    sale: Option<i64>,
    poll: Option<i64>,
    before: Option<&(i64, i64)>,
    votes_before: Option<i64>,
    user_ids: &[i64],
    per_user: &HashMap<usize, UserSeen>,
    checks: &mut Vec<Check>,
) -> anyhow::Result<()> {
    let mut check = recorder(checks);
    // Distinct order ids: a 202 given again under the same key names the same order.
    let distinct = |u: &UserSeen| -> Vec<Uuid> {
        let mut ids: Vec<Uuid> = Vec::new();
        for id in u.accepted.iter().flatten() {
            if !ids.contains(id) {
                ids.push(*id);
            }
        }
        ids
    };
    let accepted: Vec<Uuid> = per_user.values().flat_map(distinct).collect();
    let accepted_count: usize = per_user
        .values()
        .map(|u| {
            let ids = distinct(u).len();
            // Answers without an order id in their body still count, once each.
            ids + u.accepted.iter().filter(|id| id.is_none()).count()
        })
        .sum();
    let replays: usize =
        per_user.values().map(|u| u.accepted.len()).sum::<usize>() - accepted_count;
    let twice: Vec<usize> = per_user
        .iter()
        .filter(|(_, u)| distinct(u).len() > 1)
        .map(|(user, _)| *user)
        .collect();
    check(
        "nobody accepted twice",
        twice.is_empty(),
        format!(
            "{accepted_count} orders accepted for {} users ({replays} more 202s were the same order \
             again, under its key){}",
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
        // A draw's buyers are its winners who claim: the draw's checks count them.
        if args.mode() == Mode::Storm && !args.draw {
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
        if let Some(store) = store {
            let (settled, held) =
                wait_settled(args, store, sale, total - left_after, &accepted).await?;
            let missing = accepted.iter().filter(|id| !settled.contains(id)).count();
            if per_user.values().any(|u| !u.keys.is_empty()) {
                let (ok, detail) = exactly_once(store, sale, user_ids, per_user).await?;
                check("units per buyer = keys accepted", ok, detail);
            }
            check(
                "every accepted order in Postgres, once",
                missing == 0 && held == total - left_after,
                format!(
                    "Postgres holds {} orders for the sale, their units held {held}, {} units sold; {missing} of the {} accepted order ids missing",
                    settled.len(),
                    total - left_after,
                    accepted.len()
                ),
            );
        }
    }
    if let (Some(poll), Some(store), Some(before)) = (poll, store, votes_before) {
        let expected = before + taken as i64;
        let votes = wait_votes(args, store, poll, user_ids, before, expected).await?;
        check(
            "every accepted vote in Postgres, once",
            votes == expected,
            format!("{votes} votes of the run's users in Postgres, {expected} expected"),
        );
    }
    Ok(())
}

/// Exactly once under `Idempotency-Key`: every key's 202s name one order, and no
/// buyer holds more units in Postgres than the keys that got a 202 (one unit
/// each), plus the keys whose last answer was ambiguous (decided, answer lost, out
/// of tries). Fewer (orders not settled in time) is the next check's to report.
async fn exactly_once(
    store: &Store,
    sale: i64,
    user_ids: &[i64],
    per_user: &HashMap<usize, UserSeen>,
) -> anyhow::Result<(bool, String)> {
    let units = store.units_by_user(sale, user_ids).await?;
    let (mut split, mut over, mut under, mut unresolved_held, mut keys_accepted) = (0, 0, 0, 0, 0);
    for (index, seen) in per_user {
        let accepted = seen.keys.values().filter(|k| !k.orders.is_empty()).count() as i64;
        let unresolved = seen
            .keys
            .values()
            .filter(|k| k.orders.is_empty() && k.unresolved)
            .count() as i64;
        split += seen.keys.values().filter(|k| k.orders.len() > 1).count();
        keys_accepted += accepted;
        let held = user_ids
            .get(*index)
            .and_then(|id| units.get(id))
            .copied()
            .unwrap_or(0);
        if held > accepted + unresolved {
            over += 1;
        } else if held < accepted {
            // Not settled (yet): the check of accepted orders in Postgres says so.
            under += 1;
        } else if held > accepted {
            unresolved_held += 1;
        }
    }
    Ok((
        split == 0 && over == 0,
        format!(
            "{keys_accepted} keys got a 202; {split} keys named two orders; {over} buyers hold \
             more units in Postgres than keys accepted; {under} hold fewer (not settled); \
             {unresolved_held} hold a unit whose every answer was lost (503 or none, out of \
             tries)"
        ),
    ))
}

/// Waits (with a progress line) until the sale's orders in Postgres hold `sold`
/// units and every accepted id is there, or `--settle-timeout` passes; returns the
/// ids it holds and their units held.
async fn wait_settled(
    args: &LoadArgs,
    store: &Store,
    sale: i64,
    sold: i64,
    accepted: &[Uuid],
) -> anyhow::Result<(HashSet<Uuid>, i64)> {
    let bar = settling_bar(args, sold, "units");
    let deadline = Instant::now() + Duration::from_secs(args.settle_timeout);
    loop {
        let ids: HashSet<Uuid> = store.order_ids(sale).await?.into_iter().collect();
        // Units held, not order rows: an order may hold several units, and an
        // earlier order returned (cancelled, refunded, expired) holds none.
        let held = store.units_held(sale).await?;
        bar.set_position(held.max(0) as u64);
        let all = held >= sold && accepted.iter().all(|id| ids.contains(id));
        if all || Instant::now() >= deadline {
            bar.finish_and_clear();
            return Ok((ids, held));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (with a progress line) until Postgres holds `expected` votes of the run's
/// users in the poll, or `--settle-timeout` passes; returns how many it holds.
async fn wait_votes(
    args: &LoadArgs,
    store: &Store,
    poll: i64,
    users: &[i64],
    before: i64,
    expected: i64,
) -> anyhow::Result<i64> {
    let bar = settling_bar(args, expected - before, "votes");
    let deadline = Instant::now() + Duration::from_secs(args.settle_timeout);
    loop {
        let votes = store.votes_of(poll, users).await?;
        bar.set_position((votes - before).max(0) as u64);
        if votes >= expected || Instant::now() >= deadline {
            bar.finish_and_clear();
            return Ok(votes);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The progress bar of settlement: `settling [...] pos/len <what> in Postgres`
/// (hidden with --json).
pub fn settling_bar(args: &LoadArgs, len: i64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len.max(0) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "settling {{bar:30}} {{pos}}/{{len}} {what} in Postgres"
        ))
        .expect("a valid template"),
    );
    if args.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar
}
