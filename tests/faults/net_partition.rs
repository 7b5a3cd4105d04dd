//! Issue 53, scenario 4: one of two servers cut off from Redis (its proxy a
//! blackhole: new connections held, existing ones stalled) mid-storm. The other
//! keeps selling, every purchase sent to it decided; the cut-off one answers 503
//! with `Retry-After` within [`ANSWER_BOUND`]; `/readyz` fails on it and only on
//! it; both back to normal within [`RECOVERY`] of healing; the shared invariants.

use std::time::{Duration, Instant};

use crate::harness::{Options, Stack};
use crate::invariants::{AllowedLoss, assert_invariants};
use crate::net::{
    RECOVERY, Sampler, assert_answers_bounded, assert_recovered, fault_length, plan_around,
    print_figures, sent_between, statuses,
};
use crate::storm::purchases;

async fn one_server_partitioned_from_redis(name: &str, length: Duration) {
    let stack = Stack::start(name, Options::proxied(2)).await;
    let cut = &stack.links[1];
    let (users, sales) = stack.shoppers_and_sales().await;
    let sampler = Sampler::start(&stack.http, stack.bases(), "/readyz");
    let plan = plan_around(150.0, length, Duration::from_secs(5));
    let storm = stack.storm(purchases(&users, &sales, 2, 0.03), plan);
    storm.wait_accepted(150, Duration::from_secs(20)).await;
    let from = Instant::now();
    cut.redis.blackhole();
    println!("server #1 cut off from Redis at {:.1?}", storm.elapsed());
    tokio::time::sleep(length).await;
    let backlog = stack.pending_orders(&sales).await;
    cut.redis.heal();
    let healed = Instant::now();
    println!("healed at {:.1?}", storm.elapsed());
    let records = storm.finish().await;
    let samples = sampler.finish().await;
    let during = sent_between(&records, from, healed);
    let recovered = assert_recovered(&records, healed, &[0, 1]);
    let on = |server: usize| -> Vec<_> {
        during
            .iter()
            .filter(|r| r.server == server)
            .cloned()
            .collect()
    };
    let (on_healthy, on_cut) = (on(0), on(1));
    let settlement = format!("{backlog} accepted orders unsettled at the heal");
    print_figures(name, &records, &during, recovered, &settlement);
    println!(
        "during: server #0 {}; server #1 {}",
        crate::storm::summary(&on_healthy),
        crate::storm::summary(&on_cut)
    );

    assert_answers_bounded(&records, "purchases");
    let undecided: Vec<String> = on_healthy
        .iter()
        .filter(|r| !r.is_decided())
        .take(10)
        .map(|r| r.label())
        .collect();
    assert!(
        undecided.is_empty(),
        "the server still linked to Redis left purchases undecided: {undecided:?}"
    );
    assert!(
        on_healthy.iter().any(|r| r.is_accepted()),
        "the server still linked to Redis sold nothing during the partition"
    );
    assert!(
        on_cut.iter().any(|r| r.status() == Some(503)),
        "the cut-off server never answered 503: the partition did not land"
    );
    // /readyz: the cut-off server fails (once its PING has waited its second),
    // the other never does; both ready again after healing.
    let ready0 = statuses(&samples, 0, from, Instant::now());
    assert!(
        ready0.iter().all(|s| *s == Some(200)),
        "/readyz of the linked server: {ready0:?}"
    );
    let ready1 = statuses(&samples, 1, from + Duration::from_millis(1500), healed);
    assert!(
        ready1.contains(&Some(503)),
        "/readyz of the cut-off server stayed 200: {ready1:?}"
    );
    let after = statuses(&samples, 1, healed + RECOVERY, Instant::now());
    assert!(
        after.iter().all(|s| *s == Some(200)),
        "/readyz of server #1 after healing: {after:?}"
    );
    assert_invariants(&stack, &records, &sales, &[], AllowedLoss::None).await;
}

scenario_tests! {
    /// Scenario 4 (4 s in CI, 15 s in `scripts/faults`).
    one_of_two_servers_cut_off_from_redis_the_other_keeps_selling =>
        one_server_partitioned_from_redis("net-partition", fault_length(4, 15));
}
