//! Issue 53, scenarios 5 and 6: the link between the server and Postgres goes bad
//! mid-storm, through the fault proxy: stalled (bytes stop, connections stay
//! open), then healed; and every connection reset every 0.5 s, mid-settlement
//! batch. Purchases need Redis alone, so every one is decided throughout;
//! `/readyz` stays 200 and names Postgres, `/readyz/postgres` fails in the stall;
//! a user's order list (which needs Postgres) answers within [`ANSWER_BOUND`];
//! the backlog settles once healed; the shared invariants.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::harness::{Db, Options, Stack};
use crate::invariants::{AllowedLoss, assert_invariants};
use crate::net::{
    ANSWER_BOUND, RECOVERY, Sampler, assert_answers_bounded, assert_recovered, fault_length,
    plan_around, print_figures, sent_between, statuses,
};
use crate::storm::purchases;

#[derive(Clone, Copy, Debug)]
enum Fault {
    Stall,
    /// Every connection reset every 0.5 s (settlement's batches among them).
    Resets,
}

/// `/readyz/postgres` asks the probe's last answer, taken every 2 s
/// (`PROBE_EVERY` in `src/observe.rs`): healed, it says so within this.
const PROBE_LAG: Duration = Duration::from_secs(2);

/// `GET /api/me/orders` (Postgres) every 300 ms until `until`: each answer's
/// status (`None`: no answer in 10 s) and time.
async fn order_lists(stack: &Stack, token: &str, until: Instant) -> Vec<(Option<u16>, Duration)> {
    let mut out = Vec::new();
    while Instant::now() < until {
        let at = Instant::now();
        let status = order_list(stack, token).await;
        out.push((status, at.elapsed()));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    out
}

async fn count_orders(stack: &Stack, sales: &[i64]) -> i64 {
    let query = "SELECT count(*) FROM orders WHERE sale_id = ANY($1)";
    stack.scalar(query, sales).await
}

async fn postgres_link_fault_mid_storm(name: &str, fault: Fault, length: Duration) {
    let stack = Stack::start(name, Options::proxied(1)).await;
    let links = &stack.links[0];
    let (users, sales) = stack.shoppers_and_sales().await;
    let ready = Sampler::start(&stack.http, stack.bases(), "/readyz");
    let ready_pg = Sampler::start(&stack.http, stack.bases(), "/readyz/postgres");
    let plan = plan_around(120.0, length, Duration::from_secs(6));
    let storm = stack.storm(purchases(&users, &sales, 1, 0.03), plan);
    storm.wait_accepted(150, Duration::from_secs(20)).await;
    let settled_before: i64 = count_orders(&stack, &sales).await;
    let from = Instant::now();
    match fault {
        Fault::Stall => links.pg.stall(),
        Fault::Resets => links.pg.reset_every(Duration::from_millis(500)),
    }
    println!(
        "Postgres {fault:?} from {:.1?} for {length:?}",
        storm.elapsed()
    );
    let lists = order_lists(&stack, &users[0].token, from + length).await;
    let backlog = stack.pending_orders(&sales).await;
    let settled_during = count_orders(&stack, &sales).await - settled_before;
    links.pg.heal();
    let healed = Instant::now();
    println!("healed at {:.1?}", storm.elapsed());
    let records = storm.finish().await;
    let (ready, ready_pg) = (ready.finish().await, ready_pg.finish().await);
    let during = sent_between(&records, from, healed);
    let recovered = assert_recovered(&records, healed, &[0]);
    let pg_ready_again = ready_pg
        .iter()
        .filter(|s| s.at >= healed && s.status == Some(200))
        .map(|s| s.at + s.took - healed)
        .min();
    let stats = links.pg.stats();
    let settlement = format!(
        "{settled_during} orders settled during the fault, {backlog} waiting at the heal; /readyz/postgres 200 again {pg_ready_again:.2?} after healing; proxy: {} connections, {} reset, {} replies cut",
        stats.accepted.load(Ordering::Relaxed),
        stats.reset.load(Ordering::Relaxed),
        stats.cut.load(Ordering::Relaxed),
    );
    print_figures(name, &records, &during, recovered, &settlement);
    let slowest_list = lists.iter().map(|(_, d)| *d).max().unwrap_or_default();
    println!(
        "order lists during the fault: {:?}; slowest {slowest_list:.2?}",
        lists.iter().map(|(s, _)| *s).collect::<Vec<_>>()
    );

    assert_answers_bounded(&records, "purchases");
    let undecided = during.iter().filter(|r| !r.is_decided()).count();
    assert_eq!(
        undecided,
        0,
        "purchases need Redis alone, yet {undecided} were not decided during the fault: {}",
        crate::storm::summary(&during)
    );
    let readyz = statuses(&ready, 0, from, Instant::now());
    assert!(
        readyz.iter().all(|s| *s == Some(200)),
        "/readyz (Redis) must stay 200 while Postgres is {fault:?}: {readyz:?}"
    );
    let late_lists: Vec<_> = lists.iter().filter(|(_, d)| *d > ANSWER_BOUND).collect();
    assert!(
        late_lists.is_empty(),
        "order lists answered later than {ANSWER_BOUND:?}: {late_lists:?}"
    );
    assert!(
        lists.iter().all(|(s, _)| matches!(s, Some(200 | 503))),
        "order lists: {lists:?}"
    );
    let after = statuses(&ready_pg, 0, healed + RECOVERY + PROBE_LAG, Instant::now());
    assert!(
        !after.is_empty() && after.iter().all(|s| *s == Some(200)),
        "/readyz/postgres after healing: {after:?}"
    );
    if let Fault::Stall = fault {
        let stalled = statuses(
            &ready_pg,
            0,
            from + PROBE_LAG + Duration::from_secs(1),
            healed,
        );
        assert!(
            stalled.contains(&Some(503)),
            "/readyz/postgres stayed 200 through a stalled Postgres: {stalled:?}"
        );
        assert!(backlog > 0, "no accepted order waited for Postgres");
    } else {
        let reset = stats.reset.load(Ordering::Relaxed);
        assert!(reset >= 2, "only {reset} Postgres connections reset");
    }
    assert_invariants(&stack, &records, &sales, &[], AllowedLoss::None).await;
}

/// How long a settlement transaction may wait here (`settle.write_timeout_ms`,
/// 30 s by default): short, so the test does not wait out the default.
const WRITE_TIMEOUT_MS: &str = "2000";

/// Every link to Postgres goes silent for good mid-storm, without a reset (a
/// failover behind the same address, a VM gone): each connection open then
/// swallows what it is sent and never closes; new connections work at once. The
/// server must find its dead connections and settle on new ones: every 202 in
/// Postgres, once, and the pool whole again (order lists 200). Before,
/// settlement waited on its first dead connection for ever.
async fn postgres_severed_mid_storm(name: &str) {
    let options =
        Options::proxied(1).with(&[("STAMPEDE_SETTLE_WRITE_TIMEOUT_MS", WRITE_TIMEOUT_MS)]);
    let stack = Stack::start(name, options).await;
    let links = &stack.links[0];
    let (users, sales) = stack.shoppers_and_sales().await;
    let plan = plan_around(120.0, Duration::from_secs(2), Duration::from_secs(6));
    let storm = stack.storm(purchases(&users, &sales, 1, 0.03), plan);
    storm.wait_accepted(150, Duration::from_secs(20)).await;
    let token = &users[0].token;
    assert_eq!(
        order_list(&stack, token).await,
        Some(200),
        "an order list before the fault"
    );
    links.pg.sever();
    let severed = Instant::now();
    println!("Postgres links severed at {:.1?}", storm.elapsed());
    // The requests' pool finds its dead connections as it takes them (a ping
    // within the acquire timeout): an order list answers 200 again.
    let mut lists = Vec::new();
    let listed = loop {
        let status = order_list(&stack, token).await;
        lists.push(status);
        if status == Some(200) || severed.elapsed() > Duration::from_secs(30) {
            break severed.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let records = storm.finish().await;
    let stats = links.pg.stats();
    let settlement = format!(
        "order lists after the sever {lists:?}, 200 again {listed:.2?} after it; proxy: {} connections, {} directions severed, {} still open",
        stats.accepted.load(Ordering::Relaxed),
        stats.severed.load(Ordering::Relaxed),
        stats.severed_open.load(Ordering::Relaxed),
    );
    let during = sent_between(&records, severed, severed + Duration::from_secs(2));
    print_figures(name, &records, &during, listed, &settlement);
    assert_answers_bounded(&records, "purchases");
    assert!(
        stats.severed.load(Ordering::Relaxed) >= 2,
        "no connection was open to sever"
    );
    assert!(
        lists.iter().all(|s| matches!(s, Some(200 | 503))),
        "order lists after the sever (a 503 while a dead connection is found, never a hang): {lists:?}"
    );
    assert_eq!(
        lists.last(),
        Some(&Some(200)),
        "order lists never answered 200 again: {lists:?}"
    );
    assert_invariants(&stack, &records, &sales, &[], AllowedLoss::None).await;
}

/// `GET /api/me/orders`: its status, `None` when it did not answer in 10 s. A 503
/// must carry `Retry-After`.
async fn order_list(stack: &Stack, token: &str) -> Option<u16> {
    let resp = stack
        .http
        .get(format!("{}/api/me/orders", stack.live_base()))
        .bearer_auth(token)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .ok()?;
    let status = resp.status().as_u16();
    if status == 503 {
        assert!(
            resp.headers().contains_key(reqwest::header::RETRY_AFTER),
            "a 503 order list without Retry-After"
        );
    }
    Some(status)
}

scenario_tests! {
    /// Every Postgres link silent for good mid-storm (a failover without resets).
    postgres_links_severed_mid_storm_settle_on_new_connections =>
        postgres_severed_mid_storm("net-pg-sever");
    /// Scenario 5 (5 s in CI, 30 s in `scripts/faults`).
    postgres_stalled_mid_storm_purchases_go_on_and_the_backlog_settles =>
        postgres_link_fault_mid_storm("net-pg-stall", Fault::Stall, fault_length(5, 30));
    /// Scenario 6 (4 s in CI, 20 s in `scripts/faults`).
    postgres_connections_reset_mid_settlement_lose_nothing =>
        postgres_link_fault_mid_storm("net-pg-resets", Fault::Resets, fault_length(4, 20));
}
