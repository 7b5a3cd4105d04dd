//! Ballot kinds through faults (issue 51): a budget poll (5 votes a voter, at
//! most 3 on one option) and a single poll with `allow_change`, voted on together
//! by 300 voters while Redis restarts (gracefully and with `kill -9`, under
//! `appendfsync always`), a server is killed and restarted, or Redis is wiped.
//! Budget voters spend in several requests, each under its own
//! `Idempotency-Key`, and ask for more than they have; changing voters send a
//! second, different ballot; some requests are sent again later under the same
//! key, and every retry after a 503 or a lost answer reuses it. The storm
//! ends with `assert_ballot_invariants` (seqs 1..n, every 202's receipt in
//! Postgres once and as asked, budgets kept, both stores and `settled_tallies`
//! equal), then probes: every accepted key sent again answers its first 202,
//! and every voter who spent the whole budget is refused 409 `budget_spent`.

use std::time::{Duration, Instant};

use rand::Rng;
use rand::seq::{IndexedRandom, SliceRandom};
use serde_json::json;

use crate::ballot_invariants::{
    assert_ballot_invariants, assert_keys_replay, assert_spent_budgets_stay_spent,
};
use crate::harness::{Options, Stack, User};
use crate::invariants::{Allowed, AllowedLoss, CUT_AT_A_KILL, Report};
use crate::redis_wipe::{flushall_measuring_the_tail, stop_settling_votes_until};
use crate::storm::{self, Op, Plan, Record, Storm, Work};

const OPTIONS: [&str; 4] = ["red", "green", "blue", "yellow"];
const VOTERS: usize = 300;
const VOTES_PER_USER: i64 = 5;
const MAX_PER_OPTION: i64 = 3;

/// `user`'s ballot `body` on `poll` under the `Idempotency-Key` `key`.
pub(crate) fn ballot(user: &User, poll: i64, body: serde_json::Value, key: String) -> Work {
    Work {
        user: user.id,
        token: user.token.as_str().into(),
        op: Op::Ballot {
            poll,
            body: body.to_string().into(),
            key: key.into(),
        },
        server: 0,
    }
}

/// Per voter: budget pieces of 1 to 3 votes on random options until they ask for
/// more than the budget (so some end 409 `budget_spent` or 422 `over_budget`), and
/// a first single ballot; then (`later`) 3 in 4 voters' second, different single
/// ballot and a tenth of all requests again under their key.
fn ballots(voters: &[User], budget: (i64, &[i64]), change: (i64, &[i64])) -> Vec<Work> {
    let mut rng = rand::rng();
    let (mut first, mut later) = (Vec::new(), Vec::new());
    for u in voters {
        let mut asked = 0;
        for i in 0.. {
            if asked > VOTES_PER_USER {
                break;
            }
            let count = rng.random_range(1..=MAX_PER_OPTION);
            let option = *budget.1.choose(&mut rng).unwrap();
            let body = json!({ "option_id": option, "count": count });
            first.push(ballot(u, budget.0, body, format!("b-{}-{i}", u.id)));
            asked += count;
        }
        let a = *change.1.choose(&mut rng).unwrap();
        first.push(ballot(
            u,
            change.0,
            json!({ "option_id": a }),
            format!("s-{}-1", u.id),
        ));
        if rng.random_bool(0.75) {
            let b = *change
                .1
                .iter()
                .filter(|&&o| o != a)
                .collect::<Vec<_>>()
                .choose(&mut rng)
                .unwrap();
            later.push(ballot(
                u,
                change.0,
                json!({ "option_id": b }),
                format!("s-{}-2", u.id),
            ));
        }
    }
    in_storm_order(first, later)
}

/// The `first` requests shuffled, a tenth of them sent again (same key, same
/// body), and those and the `later` ones each at a random place after the first
/// half of the first ones.
pub(crate) fn in_storm_order(mut first: Vec<Work>, mut later: Vec<Work>) -> Vec<Work> {
    let mut rng = rand::rng();
    first.shuffle(&mut rng);
    let repeats: Vec<Work> = first.iter().take(first.len() / 10).cloned().collect();
    later.extend(repeats);
    // The later ones after (most of) the first ones.
    for w in later {
        let at = rng.random_range(first.len() / 2..=first.len());
        first.insert(at, w);
    }
    first
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Fault {
    /// `redis-cli shutdown`, restarted 2 s later.
    RedisShutdown,
    /// SIGKILL to Redis, restarted 2 s later.
    RedisKill9,
    /// SIGKILL to server #0 of two, restarted.
    ServerKill,
    /// `FLUSHALL`.
    Wipe,
}

impl Fault {
    /// Servers of the stack: two where one is killed, so the storm goes on.
    pub(crate) fn servers(self) -> usize {
        match self {
            Fault::ServerKill => 2,
            _ => 1,
        }
    }

    /// Accepted ballots to wait for before the fault, of `work` to send. The wipe
    /// comes once most ballots are in, changes among them (they are sent in the
    /// storm's second half): a rebuild that kept a voter's first ballot instead of
    /// the last would then leave Redis's tally unlike Postgres's.
    pub(crate) fn accepted_before(self, work: usize) -> usize {
        match self {
            Fault::Wipe => work * 55 / 100,
            _ => 300,
        }
    }
}

/// What [`inject`] did: what the fault allows to go wrong ([`Allowed`]), when it
/// began and when the stack was back, and (a wipe) the unsettled tail it took.
pub(crate) struct Injected {
    pub(crate) allowed: Allowed,
    pub(crate) window: (Instant, Instant),
    pub(crate) tail: Option<usize>,
}

/// Breaks `stack` as `fault` says, mid-storm, and brings it back: Redis down 2 s
/// (shut down or killed, `appendfsync always`: nothing lost), server #0 killed
/// and restarted (requests in flight on it may go unanswered), or, with
/// settlement stopped until `polls` hold at least 100 unsettled ballots, Redis
/// wiped (the servers kept that tail and the rebuild finds it: nothing lost).
pub(crate) async fn inject(fault: Fault, stack: &mut Stack, polls: &[i64]) -> Injected {
    let from = Instant::now();
    let mut tail = None;
    let allowed: Allowed = match fault {
        Fault::RedisShutdown | Fault::RedisKill9 => {
            match fault {
                Fault::RedisShutdown => stack.redis.shutdown(),
                _ => stack.redis.kill9(),
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            stack.start_redis().await;
            AllowedLoss::None.into()
        }
        Fault::ServerKill => {
            stack.servers[0].kill9();
            stack.restart_server(0).await;
            AllowedLoss::None.with_kills(&[0], CUT_AT_A_KILL)
        }
        Fault::Wipe => {
            // Settlement stopped first: the wipe takes a long unsettled tail, which
            // the server kept and the rebuild finds in Postgres. Nothing is lost.
            stop_settling_votes_until(stack, polls, 100).await;
            tail = Some(flushall_measuring_the_tail(stack, &[], polls).await);
            AllowedLoss::None.into()
        }
    };
    Injected {
        allowed,
        window: (from, Instant::now()),
        tail,
    }
}

/// The storm after `injected`: ballots are decided again, the storm ends, and
/// the fault landed ([`assert_the_fault_landed`]). Returns every record.
pub(crate) async fn after_the_fault(
    fault: Fault,
    storm: Storm,
    injected: &Injected,
) -> Vec<Record> {
    let (from, to) = injected.window;
    println!(
        "{fault:?} at {:.1?}, over after {:.1?}",
        from - storm.started,
        to - from
    );
    assert!(
        storm.wait_decided(100, Duration::from_secs(30)).await,
        "ballots are decided again after {fault:?}"
    );
    let records = storm.finish().await;
    assert_the_fault_landed(fault, &records, injected.window);
    records
}

/// A wipe took a long unsettled tail (at least 100 ballots), and lost none of it
/// (`report` of the invariants after it).
pub(crate) fn assert_the_wipe_took_a_tail(injected: &Injected, report: &Report) {
    if let Some(tail) = injected.tail {
        assert!(
            tail >= 100,
            "the wipe took {tail} unsettled ballots, not at least 100"
        );
        println!(
            "{} accepted ballots lost with a wipe that took {tail} unsettled",
            report.lost.len()
        );
    }
}

/// The fault landed: Redis down gave 503s while it was down; the killed server
/// refused connections or cut requests.
pub(crate) fn assert_the_fault_landed(
    fault: Fault,
    records: &[Record],
    (from, to): (Instant, Instant),
) {
    let during: Vec<Record> = records
        .iter()
        .filter(|r| r.sent >= from && r.sent < to)
        .cloned()
        .collect();
    println!(
        "sent during the fault ({fault:?}): {}",
        storm::summary(&during)
    );
    match fault {
        Fault::RedisShutdown | Fault::RedisKill9 => assert!(
            during.iter().any(|r| r.status() == Some(503)),
            "no ballot sent while Redis was down got a 503: the fault did not land"
        ),
        Fault::ServerKill | Fault::Wipe => {}
    }
}

/// The ballots sent at 150 a second over the stack's servers, `fault` injected
/// once enough are accepted, then `assert_ballot_invariants` over `polls` (and,
/// for a wipe, that it took a tail of unsettled ballots): the answers recorded,
/// and what the fault was allowed to cost.
pub(crate) async fn storm_through(
    fault: Fault,
    stack: &mut Stack,
    mut work: Vec<Work>,
    polls: &[i64],
) -> (Vec<Record>, Allowed) {
    storm::spread(&mut work, fault.servers());
    println!("{} ballots to send", work.len());
    let before_the_fault = fault.accepted_before(work.len());
    let plan = Plan::at_rate(150.0).lasting(Duration::from_secs(40));
    let storm = stack.storm(work, plan);
    storm
        .wait_accepted(before_the_fault, Duration::from_secs(30))
        .await;

    let injected = inject(fault, stack, polls).await;
    let allowed = injected.allowed;
    let records = after_the_fault(fault, storm, &injected).await;
    let report = assert_ballot_invariants(stack, &records, polls, allowed).await;
    assert_the_wipe_took_a_tail(&injected, &report);
    (records, allowed)
}

async fn ballots_through(name: &str, fault: Fault) {
    let servers = fault.servers();
    let mut stack = Stack::start(name, Options::servers(servers)).await;
    let voters = stack.create_users(VOTERS, false).await;
    let settings = json!({
        "ballot": "budget", "votes_per_user": VOTES_PER_USER, "max_per_option": MAX_PER_OPTION,
    });
    let (budget, budget_options) = stack.create_poll_with(&OPTIONS, settings).await;
    let allow = json!({ "allow_change": true });
    let (change, change_options) = stack.create_poll_with(&OPTIONS, allow).await;
    let polls = [budget, change];
    let work = ballots(
        &voters,
        (budget, &budget_options),
        (change, &change_options),
    );
    let (mut records, allowed) = storm_through(fault, &mut stack, work, &polls).await;
    for poll in polls {
        records.extend(assert_keys_replay(&stack, &records, poll).await);
    }
    records.extend(assert_spent_budgets_stay_spent(&stack, budget).await);
    assert_ballot_invariants(&stack, &records, &polls, allowed).await;
}

scenario_tests! {
    budget_and_changing_ballots_survive_a_redis_shutdown_mid_storm =>
        ballots_through("ballots-redis-restart", Fault::RedisShutdown);
    budget_and_changing_ballots_survive_redis_kill9_under_fsync_always =>
        ballots_through("ballots-redis-kill9", Fault::RedisKill9);
    budget_and_changing_ballots_survive_a_server_kill9_and_restart =>
        ballots_through("ballots-app-kill", Fault::ServerKill);
    /// With settlement stopped before the wipe: no accepted ballot lost.
    budget_and_changing_ballots_survive_a_redis_wipe_and_no_budget_is_spent_twice =>
        ballots_through("ballots-wipe", Fault::Wipe);
}
