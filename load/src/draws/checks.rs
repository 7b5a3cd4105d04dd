//! The draw's own checks, after the storm's (stock and orders in Redis and
//! Postgres): one entry per account, exactly one draw, the published draw
//! recomputed from its seed, only winners bought, every claim bought, and the
//! unclaimed wins passed on in the seeded order.

use std::collections::{HashMap, HashSet};

use serde_json::Value;
use stampede::rehearse::DrawRecord;
use stampede::sale::draw::verify;

use super::enter::Entered;
use crate::checks::{Check, recorder};

/// What the checks read: the run's own records and what the server published.
pub struct Seen<'a> {
    pub users: usize,
    pub entered: &'a Entered,
    pub record: Option<DrawRecord>,
    /// The sale's view when the run made it (its `draw_commitment` then).
    pub sale_at_creation: &'a Value,
    /// The last publication read, and `entries.csv`.
    pub draw: &'a Value,
    pub csv: &'a [u8],
    /// The buyers in Postgres (user id, units), and the run's user ids by index.
    pub buyers: &'a [(i64, i64)],
    pub user_ids: &'a [i64],
    /// Winners who bought, who let their win pass, and those who tried to buy
    /// without a win (and were refused `not_drawn`).
    pub claimed: usize,
    pub claims_bought: usize,
    pub unclaimed: &'a [usize],
    pub losers: (usize, usize),
    /// Whether the run waited for the passes.
    pub passes_followed: bool,
}

pub fn draw_checks(s: &Seen, checks: &mut Vec<Check>) {
    let mut check = recorder(checks);
    let e = s.entered;
    let entered = e.entries.iter().flatten().count();
    let distinct: HashSet<i64> = e.entries.iter().flatten().copied().collect();
    let rows = s.record.as_ref().map_or(-1, |r| r.entry_rows);
    check(
        "one entry per account",
        entered == s.users
            && distinct.len() == entered
            && e.repeats_differing == 0
            && rows == entered as i64,
        format!(
            "{entered} of {} users entered, {} distinct entries, {rows} in Postgres; {} sent \
             again, {} of them answered another entry",
            s.users,
            distinct.len(),
            e.repeats,
            e.repeats_differing
        ),
    );
    let published = s.draw["entries"].as_i64();
    let (ok, detail) = match &s.record {
        Some(r) => (
            r.drawn
                && r.counted.map(i64::from) == Some(r.entry_rows)
                && r.order_rows == r.entry_rows
                && r.order_entries == r.order_rows
                && published == Some(r.entry_rows),
            format!(
                "drawn: {}; the draw counted {:?} entries, published {published:?}; its order \
                 has {} rows naming {} entries, of {} entries",
                r.drawn, r.counted, r.order_rows, r.order_entries, r.entry_rows
            ),
        ),
        None => (false, "no draw in Postgres".to_string()),
    };
    check("exactly one draw", ok, detail);
    let (ok, detail) = match verify::check(s.sale_at_creation, s.draw, s.csv) {
        Ok(found) => (
            found.iter().all(|f| f.ok),
            found
                .iter()
                .map(|f| format!("{}{}", if f.ok { "" } else { "MISMATCH " }, f.what))
                .collect::<Vec<_>>()
                .join("; "),
        ),
        Err(err) => (false, format!("{err:#}")),
    };
    check("the published draw checks out (verify-draw)", ok, detail);

    let winners = s.draw["winners"].as_array().cloned().unwrap_or_default();
    let winning: HashSet<i64> = winners
        .iter()
        .filter_map(|w| w["entry_id"].as_i64())
        .collect();
    let entry_of: HashMap<i64, i64> = s
        .user_ids
        .iter()
        .zip(&e.entries)
        .filter_map(|(u, e)| e.map(|e| (*u, e)))
        .collect();
    let not_won = s
        .buyers
        .iter()
        .filter(|(u, _)| !entry_of.get(u).is_some_and(|e| winning.contains(e)))
        .count();
    let twice = s.buyers.iter().filter(|(_, units)| *units > 1).count();
    check(
        "only winners bought",
        not_won == 0 && twice == 0 && s.losers.1 == s.losers.0,
        format!(
            "{} buyers in Postgres, {not_won} without a published win, {twice} with more than \
             one unit; {} of {} users without a win answered 403 not_drawn",
            s.buyers.len(),
            s.losers.1,
            s.losers.0
        ),
    );
    check(
        "every claimed win bought",
        s.claims_bought == s.claimed,
        format!(
            "{} of the {} winners who claimed got a 202",
            s.claims_bought, s.claimed
        ),
    );
    if s.passes_followed {
        passes(s, &winners, &entry_of, &mut check);
    }
}

/// Every win left unclaimed passed, each to the next entry in the seeded order
/// (the published winners are a prefix of it, which the draw's check holds):
/// as many wins as the draw's plus the passed, while entries remain.
fn passes(
    s: &Seen,
    winners: &[Value],
    entry_of: &HashMap<i64, i64>,
    check: &mut impl FnMut(&str, bool, String),
) {
    let outcome: HashMap<i64, &str> = winners
        .iter()
        .filter_map(|w| {
            Some((
                w["entry_id"].as_i64()?,
                w["outcome"].as_str().unwrap_or("open"),
            ))
        })
        .collect();
    let unclaimed_passed = s
        .unclaimed
        .iter()
        .filter_map(|i| s.user_ids.get(*i).and_then(|u| entry_of.get(u)))
        .filter(|e| outcome.get(*e) == Some(&"passed"))
        .count();
    let passed = outcome.values().filter(|o| **o == "passed").count();
    let at_draw = s.draw["winners_at_draw"].as_u64().unwrap_or(0) as usize;
    let entries = s.draw["entries"].as_u64().unwrap_or(0) as usize;
    let want = (at_draw + passed).min(entries);
    let open = outcome.values().filter(|o| **o == "open").count();
    check(
        "unclaimed wins passed on in the seeded order",
        unclaimed_passed == s.unclaimed.len()
            && passed == s.unclaimed.len()
            && winners.len() == want
            && open == 0,
        format!(
            "{unclaimed_passed} of the {} unclaimed wins passed ({passed} passed in all); {} \
             wins published, {at_draw} at the draw + {passed} passed (of {entries} entries) \
             make {want}; {open} still running",
            s.unclaimed.len(),
            winners.len()
        ),
    );
}
