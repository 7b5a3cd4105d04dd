//! Issue 53, scenarios 2 and 4 during a vote storm: 1,500 voters each voting in
//! three polls (and 3% of them trying a second time, which must answer 409),
//! while one server's Redis link is stalled then healed (scenario 2), or one of
//! two servers is cut off from Redis, its proxy a blackhole (scenario 4). Each
//! asserts: every answer within [`ANSWER_BOUND`] (a 503 with `Retry-After`, never
//! a 500 or a hang), every vote sent [`RECOVERY`] after the heal decided,
//! `/readyz` true to the link (503 on the stalled or cut-off server, never on the
//! other), and the shared invariants for polls (every 202 vote in Postgres once,
//! one vote per voter, the Redis tally equal to the `votes` table per option),
//! and prints its figures (`FIGURES ...`).

use std::time::{Duration, Instant};

use rand::Rng;
use rand::seq::SliceRandom;

use crate::harness::{Options, Stack};
use crate::invariants::{AllowedLoss, assert_invariants};
use crate::net::{
    RECOVERY, Sampler, assert_answers_bounded, assert_recovered, fault_length, plan_around,
    print_figures, sent_between, statuses,
};
use crate::storm::{Work, spread, summary, votes};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Server #0's Redis link stalled (the only server).
    Stall,
    /// Server #1 of two cut off from Redis.
    Partition,
}

/// Every voter in every poll, shuffled, 3% of them again later.
fn ballots(users: &[crate::harness::User], polls: &[(i64, Vec<i64>)], servers: usize) -> Vec<Work> {
    let mut work: Vec<Work> = polls
        .iter()
        .flat_map(|(poll, options)| votes(users, *poll, options, 1))
        .collect();
    let mut rng = rand::rng();
    work.shuffle(&mut rng);
    let again: Vec<Work> = work.iter().take(work.len() * 3 / 100).cloned().collect();
    for w in again {
        let at = rng.random_range(work.len() / 2..=work.len());
        work.insert(at, w);
    }
    spread(&mut work, servers);
    work
}

async fn vote_storm_through(name: &str, fault: Fault, length: Duration) {
    let servers = match fault {
        Fault::Stall => 1,
        Fault::Partition => 2,
    };
    let stack = Stack::start(name, Options::proxied(servers)).await;
    let users = stack.create_users(1500, false).await;
    let mut polls = Vec::new();
    for _ in 0..3 {
        polls.push(stack.create_poll(&["red", "green", "blue", "yellow"]).await);
    }
    let sampler = Sampler::start(&stack.http, stack.bases(), "/readyz");
    let plan = plan_around(150.0, length, Duration::from_secs(5));
    let storm = stack.storm(ballots(&users, &polls, servers), plan);
    storm.wait_accepted(150, Duration::from_secs(20)).await;
    let faulty = servers - 1;
    let link = &stack.links[faulty].redis;
    let from = Instant::now();
    match fault {
        Fault::Stall => link.stall(),
        Fault::Partition => link.blackhole(),
    }
    println!(
        "{fault:?} of server #{faulty}'s Redis link from {:.1?} for {length:?}",
        storm.elapsed()
    );
    tokio::time::sleep(length).await;
    link.heal();
    let healed = Instant::now();
    println!("healed at {:.1?}", storm.elapsed());
    let records = storm.finish().await;
    let samples = sampler.finish().await;
    let during = sent_between(&records, from, healed);
    let all: Vec<usize> = (0..servers).collect();
    let recovered = assert_recovered(&records, healed, &all);
    let on = |server: usize| -> Vec<_> {
        during
            .iter()
            .filter(|r| r.server == server)
            .cloned()
            .collect()
    };
    print_figures(name, &records, &during, recovered, "votes settle (below)");
    for server in 0..servers {
        let readyz = statuses(&samples, server, from, healed);
        println!(
            "during: server #{server} {}; /readyz {} of {} not 200",
            summary(&on(server)),
            readyz.iter().filter(|s| **s != Some(200)).count(),
            readyz.len()
        );
    }

    assert_answers_bounded(&records, "votes");
    assert!(
        on(faulty).iter().any(|r| r.status() == Some(503)),
        "server #{faulty} never answered 503: the fault did not land"
    );
    let cut = statuses(&samples, faulty, from + Duration::from_millis(1500), healed);
    assert!(
        cut.contains(&Some(503)),
        "/readyz of server #{faulty} stayed 200 without Redis: {cut:?}"
    );
    if fault == Fault::Partition {
        let linked = on(0);
        assert!(
            linked.iter().all(|r| r.is_decided()),
            "the server still linked to Redis left votes undecided: {}",
            summary(&linked)
        );
        assert!(
            linked.iter().any(|r| r.is_accepted()),
            "the server still linked to Redis took no vote during the partition"
        );
        let ready0 = statuses(&samples, 0, from, Instant::now());
        assert!(
            ready0.iter().all(|s| *s == Some(200)),
            "/readyz of the linked server: {ready0:?}"
        );
    }
    for server in 0..servers {
        let after = statuses(&samples, server, healed + RECOVERY, Instant::now());
        assert!(
            after.iter().all(|s| *s == Some(200)),
            "/readyz of server #{server} after healing: {after:?}"
        );
    }
    let ids: Vec<i64> = polls.iter().map(|(p, _)| *p).collect();
    assert_invariants(&stack, &records, &[], &ids, AllowedLoss::None).await;
}

scenario_tests! {
    /// Scenario 2 in a vote storm (4 s in CI, 15 s in `scripts/faults`).
    votes_through_a_stalled_redis_answer_503_in_time_and_lose_nothing =>
        vote_storm_through("net-votes-stall", Fault::Stall, fault_length(4, 15));
    /// Scenario 4 in a vote storm (4 s in CI, 15 s in `scripts/faults`).
    votes_on_one_of_two_servers_cut_off_from_redis_the_other_keeps_counting =>
        vote_storm_through("net-votes-partition", Fault::Partition, fault_length(4, 15));
}
