//! Ranked and multi ballots through faults (issue 51), as `ballots.rs` takes
//! budget and single ones: a `ranked` poll (a ranking of up to 3 of 5 options,
//! most preferred first, `allow_change`) and a `multi` poll ("pick three": up to
//! 3 of 5 options, no change) voted on together by 300 voters while Redis is
//! killed (`kill -9`, under `appendfsync always`) and restarted, a server is
//! killed and restarted, or Redis is wiped (`FLUSHALL`, settlement stopped
//! first so the wipe takes a long unsettled tail).
//! Every request has its own `Idempotency-Key`, which every retry after a 503 or
//! a lost answer reuses; 3 in 4 voters send a second, different ranking (some a
//! third), half send a second, different multi ballot (409 `already_voted`), and
//! a tenth of the first requests are sent again later under the same key.
//!
//! The storm ends with `assert_ballot_invariants`: every 202's receipt in
//! Postgres once with the choices sent (the ranking in order, the multi's set),
//! each voter's last ballot the one that counts, in Redis as in Postgres; the
//! multi's tallies each option's ballots, the ranked one's the first
//! preferences, equal in Redis, `settled_tallies` and the published results;
//! one multi ballot per voter. Then probes: every accepted key sent again
//! answers its first 202 and writes nothing, every multi voter's different
//! ballot is refused 409, and the closed ranked poll's runoff is the one
//! Postgres's ballots give.

use rand::Rng;
use rand::seq::SliceRandom;
use serde_json::json;

use crate::ballot_invariants::{
    assert_ballot_invariants, assert_closed_runoff_counts_postgres_ballots, assert_keys_replay,
    assert_second_ballots_refused,
};
use crate::ballots::{Fault, ballot, in_storm_order, storm_through};
use crate::harness::{Options, Stack, User};
use crate::storm::{Record, Work};

const OPTIONS: [&str; 5] = ["alto", "bass", "cello", "drum", "flute"];
const VOTERS: usize = 300;
const MAX_CHOICES: usize = 3;

/// 1 to [`MAX_CHOICES`] distinct options, in a random order.
fn pick(options: &[i64]) -> Vec<i64> {
    let mut rng = rand::rng();
    let mut picked = options.to_vec();
    picked.shuffle(&mut rng);
    picked.truncate(rng.random_range(1..=MAX_CHOICES));
    picked
}

/// A pick unlike every one of `than`: another ranking (the same options in
/// another order count as one), or another set of options (`as_set`).
fn another(options: &[i64], than: &[&[i64]], as_set: bool) -> Vec<i64> {
    let key = |b: &[i64]| {
        let mut b = b.to_vec();
        if as_set {
            b.sort_unstable();
        }
        b
    };
    loop {
        let b = pick(options);
        if than.iter().all(|t| key(t) != key(&b)) {
            return b;
        }
    }
}

/// Per voter: a first ranking and a first multi ballot; then (`later`) 3 in 4
/// voters' second, different ranking (a fifth of those a third one too), half
/// the voters' second, different multi ballot (whichever of the two Redis
/// decides first counts, the other is refused), and a tenth of the first ones
/// again under their key.
fn ballots(voters: &[User], ranked: (i64, &[i64]), multi: (i64, &[i64])) -> Vec<Work> {
    let mut rng = rand::rng();
    let (mut first, mut later) = (Vec::new(), Vec::new());
    for u in voters {
        let ranking = |r: &[i64]| json!({ "ranking": r });
        let r1 = pick(ranked.1);
        first.push(ballot(u, ranked.0, ranking(&r1), format!("r-{}-1", u.id)));
        if rng.random_bool(0.75) {
            let r2 = another(ranked.1, &[&r1], false);
            later.push(ballot(u, ranked.0, ranking(&r2), format!("r-{}-2", u.id)));
            if rng.random_bool(0.2) {
                let r3 = another(ranked.1, &[&r1, &r2], false);
                later.push(ballot(u, ranked.0, ranking(&r3), format!("r-{}-3", u.id)));
            }
        }
        let set = |m: &[i64]| json!({ "option_ids": m });
        let m1 = pick(multi.1);
        first.push(ballot(u, multi.0, set(&m1), format!("m-{}-1", u.id)));
        if rng.random_bool(0.5) {
            let m2 = another(multi.1, &[&m1], true);
            later.push(ballot(u, multi.0, set(&m2), format!("m-{}-2", u.id)));
        }
    }
    in_storm_order(first, later)
}

/// The storm did what the scenario is about: many voters changed their ranking
/// (a later key accepted) and many second multi ballots were refused.
fn assert_the_storm_changed_and_refused(records: &[Record], ranked: i64, multi: i64) {
    let changed = records
        .iter()
        .filter(|r| r.is_accepted() && !r.is_replayed())
        .filter(|r| {
            r.ballot()
                .is_some_and(|(p, k)| p == ranked && !k.ends_with("-1"))
        })
        .count();
    let refused = records
        .iter()
        .filter(|r| r.ballot().is_some_and(|(p, _)| p == multi))
        .filter(|r| r.code() == Some("already_voted"))
        .count();
    println!("{changed} rankings changed, {refused} second multi ballots refused");
    assert!(
        changed >= 100 && refused >= 50,
        "the storm changed {changed} rankings (at least 100 expected) and refused {refused} second multi ballots (at least 50)"
    );
}

/// The rows of `votes` of `polls` (once settled: what the probes must not move).
async fn rows_of(stack: &Stack, polls: &[i64]) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM votes WHERE poll_id = ANY($1)")
        .bind(polls)
        .fetch_one(&stack.db)
        .await
        .expect("count votes")
}

async fn ranked_and_multi_through(name: &str, fault: Fault) {
    let servers = fault.servers();
    let mut stack = Stack::start(name, Options::servers(servers)).await;
    let voters = stack.create_users(VOTERS, false).await;
    let settings = json!({ "ballot": "ranked", "max_choices": MAX_CHOICES, "allow_change": true });
    let (ranked, ranked_options) = stack.create_poll_with(&OPTIONS, settings).await;
    let settings = json!({ "ballot": "multi", "max_choices": MAX_CHOICES });
    let (multi, multi_options) = stack.create_poll_with(&OPTIONS, settings).await;
    let polls = [ranked, multi];
    let work = ballots(&voters, (ranked, &ranked_options), (multi, &multi_options));
    let (mut records, allowed) = storm_through(fault, &mut stack, work, &polls).await;
    assert_the_storm_changed_and_refused(&records, ranked, multi);

    // Probes: nothing they send may write a row.
    let rows = rows_of(&stack, &polls).await;
    for poll in polls {
        records.extend(assert_keys_replay(&stack, &records, poll).await);
    }
    records.extend(assert_second_ballots_refused(&stack, multi).await);
    assert_ballot_invariants(&stack, &records, &polls, allowed).await;
    assert_eq!(
        rows_of(&stack, &polls).await,
        rows,
        "the keys sent again and the refused second ballots wrote rows of votes"
    );
    assert_closed_runoff_counts_postgres_ballots(&stack, ranked).await;
}

scenario_tests! {
    ranked_and_multi_ballots_survive_redis_kill9_under_fsync_always =>
        ranked_and_multi_through("ranked-redis-kill9", Fault::RedisKill9);
    ranked_and_multi_ballots_survive_a_server_kill9_and_restart =>
        ranked_and_multi_through("ranked-app-kill", Fault::ServerKill);
    /// With settlement stopped before the wipe: no accepted ballot lost, no
    /// changed ranking back to an earlier one, no second multi ballot counted.
    ranked_and_multi_ballots_survive_a_redis_wipe_mid_storm =>
        ranked_and_multi_through("ranked-wipe", Fault::Wipe);
}
