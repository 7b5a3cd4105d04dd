//! Scenario 2: Postgres stopped for 10 s mid-storm. Purchases are decided by
//! Redis alone meanwhile, `/readyz` (the buy path's readiness) stays 200 and
//! names Postgres as down, `/readyz/postgres` answers 503, and the backlog of
//! accepted orders settles once Postgres is back.

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::harness::{Options, PgStop, Stack};
use crate::invariants::{AllowedLoss, assert_invariants};
use crate::storm::{Plan, purchases};

const OUTAGE: Duration = Duration::from_secs(10);

async fn postgres_outage_mid_storm(name: &str, mode: PgStop) {
    let mut stack = Stack::start(name, Options::default()).await;
    let (users, sales) = stack.shoppers_and_sales().await;
    let storm = stack.storm(
        purchases(&users, &sales, 1, 0.03),
        // Slow enough that the sales still have units during the outage.
        Plan::at_rate(120.0).lasting(Duration::from_secs(22)),
    );
    storm.wait_accepted(150, Duration::from_secs(20)).await;
    // Prometheus scrapes all along: once before the outage here.
    let before = scraped_backlog(&stack).await;
    assert!(
        before.is_some(),
        "a scrape before the outage has the backlog"
    );
    let down_at = Instant::now();
    stack.pg.stop(mode);
    println!("Postgres stopped ({mode:?}) at {:.1?}", storm.elapsed());
    let mut readyz_down = None;
    let mut buy_path_unready = 0;
    // The settlement backlog a scrape reports, first and last seen in the outage.
    let mut backlog_seen: (Option<f64>, Option<f64>) = (None, None);
    while down_at.elapsed() < OUTAGE {
        if let Some(n) = scraped_backlog(&stack).await {
            backlog_seen.0.get_or_insert(n);
            backlog_seen.1 = Some(n);
        }
        if let Some((status, body)) = stack.readyz_postgres(0).await
            && status == StatusCode::SERVICE_UNAVAILABLE
            && body["postgres"] == "down"
        {
            readyz_down.get_or_insert(body);
        }
        match stack.readyz(0).await {
            Some((StatusCode::OK, body)) if body["redis"] == "ok" => {}
            other => {
                println!("/readyz during the outage: {other:?}");
                buy_path_unready += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let backlog = stack.pending_orders(&sales).await;
    let up_at = Instant::now();
    stack.pg.start();
    println!(
        "Postgres back at {:.1?}; {backlog} accepted orders waited for it",
        storm.elapsed()
    );
    let ready_again = wait_ready(&stack, Duration::from_secs(20)).await;
    let records = storm.finish().await;

    let during: Vec<_> = records
        .iter()
        .filter(|r| r.sent >= down_at && r.answered < up_at)
        .collect();
    let decided = during.iter().filter(|r| r.is_decided()).count();
    let accepted = during.iter().filter(|r| r.is_accepted()).count();
    // A 408 is a request the server never read (see `Record::retry_after`).
    let refused = during
        .iter()
        .filter(|r| !r.is_decided() && r.status() != Some(408))
        .count();
    println!(
        "during the outage: {} purchases, {decided} decided ({accepted} accepted), {refused} not",
        during.len()
    );
    assert_invariants(&stack, &records, &sales, &[], AllowedLoss::None).await;
    let body =
        readyz_down.expect("/readyz/postgres never answered 503 with \"postgres\": \"down\"");
    assert_eq!(
        body["redis"], "ok",
        "readyz/postgres during the outage: {body}"
    );
    assert_eq!(
        buy_path_unready, 0,
        "/readyz must stay 200 while Redis decides purchases"
    );
    assert!(
        ready_again,
        "/readyz/postgres did not answer 200 again within 20 s"
    );
    assert!(
        accepted > 0,
        "no purchase was accepted while Postgres was down"
    );
    assert_eq!(
        refused, 0,
        "purchases need only Redis, yet {refused} were not decided during the outage"
    );
    assert!(backlog > 0, "no accepted order waited for Postgres");
    // The backlog stays in sight while Postgres is down (the sales to read are the
    // last scrape's), and grows as purchases go on: its alert can fire.
    let (Some(first), Some(last)) = backlog_seen else {
        panic!("no scrape of /metrics answered with the backlog during the outage");
    };
    assert!(
        last > first,
        "the scraped backlog did not grow during the outage: {first} then {last}"
    );
}

/// The sum of `stampede_settle_stream_entries` of sales in one scrape of server
/// 0's `/metrics` (`None`: no scrape within 5 s, or no such gauge).
async fn scraped_backlog(stack: &Stack) -> Option<f64> {
    let text = stack.scrape(0).await?;
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("stampede_settle_stream_entries{") && l.contains("kind=\"sale\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

async fn wait_ready(stack: &Stack, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some((StatusCode::OK, _)) = stack.readyz_postgres(0).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

scenario_tests! {
    postgres_stopped_mid_storm_purchases_go_on_and_the_backlog_settles =>
        postgres_outage_mid_storm("pg-stop-fast", PgStop::Fast);
    postgres_crashed_mid_storm_purchases_go_on_and_the_backlog_settles =>
        postgres_outage_mid_storm("pg-stop-immediate", PgStop::Immediate);
}
