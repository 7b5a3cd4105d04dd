//! Scenario 5: Redis wiped (`FLUSHALL`) mid-storm. The servers rebuild each sale
//! and poll from Postgres on their own, answering 503 `recovering` meanwhile, and
//! then decide again without a restart. A purchase or vote accepted before the
//! wipe and not yet settled is not lost: the server that accepted it kept it, and
//! the rebuild asked for it (`settle/kept.rs`, `roster.rs`); the tests make that
//! tail long by taking the settling lease away from the servers before the wipe
//! (at least 150 orders, 100 votes; read in the same transaction as the
//! `FLUSHALL`, and printed). Nothing may be lost, and nobody buys or votes twice.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use stampede::domain::Id;
use stampede::sale::pending::PendingHash;
use stampede::vote::settlement::votes_of;

use crate::harness::{Db, Options, Stack};
use crate::invariants::{
    AllowedLoss, assert_buyers_cannot_buy_again, assert_invariants, final_answers,
};
use crate::storm::{self, Plan, Record, Work, purchases, votes};

/// After the wipe the server decides `what`s (purchases, votes) again without a
/// restart (`serving`), and some sent after the wipe were accepted.
fn assert_serving_after_the_wipe(serving: bool, after: &[Record], what: &str) {
    assert!(
        serving,
        "{what}s are decided again after the wipe, without restarting the server"
    );
    assert!(
        after.iter().any(|r| r.is_accepted()),
        "no {what} was accepted after the wipe"
    );
}

/// `FLUSHALL`, in one transaction with a read of what Redis holds unsettled: the
/// accepted orders of `sales` in their pending hashes and the accepted votes of
/// `polls` in their streams' entries. Returns that count: the unsettled tail the wipe takes.
pub async fn flushall_measuring_the_tail(stack: &Stack, sales: &[i64], polls: &[i64]) -> usize {
    let mut pipe = redis::pipe();
    pipe.atomic();
    for &sale in sales {
        pipe.hgetall(stack.keys.sale(Id::new(sale).unwrap()).pending);
    }
    for &poll in polls {
        let stream = stack.keys.poll(Id::new(poll).unwrap()).votes;
        pipe.cmd("XRANGE").arg(stream).arg("-").arg("+");
    }
    pipe.cmd("FLUSHALL").ignore();
    let mut conn = stack.redis().await;
    let (orders, votes): (usize, usize) = if polls.is_empty() {
        let hashes: Vec<Vec<(String, String)>> = pipe
            .query_async(&mut conn)
            .await
            .expect("read pending, FLUSHALL");
        let orders = hashes.into_iter().map(|h| PendingHash::orders(h).len());
        (orders.sum(), 0)
    } else {
        assert!(sales.is_empty(), "sales or polls, one kind at a time");
        // A batch's entry carries each of its votes (`votes_of`).
        let streams: Vec<redis::streams::StreamRangeReply> =
            pipe.query_async(&mut conn).await.expect("XRANGE, FLUSHALL");
        let votes = streams
            .iter()
            .flat_map(|s| &s.ids)
            .map(|entry| votes_of(entry).map_or(1, |v| v.len()))
            .sum();
        (0, votes)
    };
    orders + votes
}

/// Takes the settling lease from whichever server holds it, for a minute: no
/// server settles anything new until the lease is gone (the wipe removes it).
pub async fn take_the_settling_lease(stack: &Stack) {
    // `settle/lease.rs`: SETTLE_LEASE.
    let lease = stack.keys.lock("settle");
    let _: () = redis::cmd("SET")
        .arg(&lease)
        .arg("the-test")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut stack.redis().await)
        .await
        .expect("take the settling lease");
}

/// Unsettled orders (in the sales' pending hashes) now.
async fn unsettled_orders(stack: &Stack, sales: &[i64]) -> usize {
    let mut conn = stack.redis().await;
    let mut n = 0;
    for &sale in sales {
        let pending: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(stack.keys.sale(Id::new(sale).unwrap()).pending)
            .query_async(&mut conn)
            .await
            .unwrap();
        n += PendingHash::orders(pending).len();
    }
    n
}

/// Unsettled votes (in the polls' streams: settlement deletes what it committed)
/// now.
async fn unsettled_votes(stack: &Stack, polls: &[i64]) -> usize {
    let mut conn = stack.redis().await;
    let mut n = 0;
    for &poll in polls {
        let stream: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(stack.keys.poll(Id::new(poll).unwrap()).votes)
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .unwrap();
        n += stream
            .ids
            .iter()
            .map(|entry| votes_of(entry).map_or(1, |v| v.len()))
            .sum::<usize>();
    }
    n
}

/// Stops settlement ([`take_the_settling_lease`]) and waits until the polls'
/// unsettled votes are at least `at_least` (at most 20 s), so that a wipe then
/// takes a long tail only Redis and the servers' memory hold.
pub async fn stop_settling_votes_until(stack: &Stack, polls: &[i64], at_least: usize) {
    take_the_settling_lease(stack).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while unsettled_votes(stack, polls).await < at_least {
        assert!(
            Instant::now() < deadline,
            "the unsettled tail never reached {at_least} votes with settlement stopped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wipes every node of the stack's Redis: on one Redis [`flushall_measuring_the_tail`];
/// on a cluster, the tail read first, then `FLUSHALL` on each node (a replica
/// refuses it, and follows its primary). Returns the tail.
async fn wipe_sales(stack: &Stack, sales: &[i64]) -> usize {
    let Some(cluster) = &stack.cluster else {
        return flushall_measuring_the_tail(stack, sales, &[]).await;
    };
    let tail = unsettled_orders(stack, sales).await;
    for node in cluster.nodes.iter().filter(|n| n.is_running()) {
        let client = redis::Client::open(node.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: redis::RedisResult<()> = redis::cmd("FLUSHALL").query_async(&mut conn).await;
    }
    tail
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_wiped_mid_storm_rebuilds_sales_without_a_restart_and_nobody_buys_twice() {
    wiped_mid_storm_with_settlement_behind("wipe-sales", Options::servers(2)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wiped_cluster_loses_no_accepted_purchase_and_nobody_buys_twice() {
    let options = Options {
        cluster: true,
        ..Options::servers(2)
    };
    wiped_mid_storm_with_settlement_behind("wipe-cluster", options).await;
}

async fn wiped_mid_storm_with_settlement_behind(name: &str, options: Options) {
    let stack = Stack::start(name, options).await;
    let (users, sales) = stack.shoppers_and_sales().await;
    let storm = stack.storm(purchases(&users, &sales, 1, 0.05), Plan::at_rate(250.0));
    storm.wait_accepted(300, Duration::from_secs(20)).await;
    // Settled buyers before the wipe: the rebuild must keep them from buying again.
    stack.wait_settling(&sales).await;
    // Then settlement stops, so that the wipe takes a long unsettled tail.
    take_the_settling_lease(&stack).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while unsettled_orders(&stack, &sales).await < 150 {
        assert!(
            Instant::now() < deadline,
            "the unsettled tail never reached 150 orders with settlement stopped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tail = wipe_sales(&stack, &sales).await;
    assert!(
        tail >= 150,
        "the wipe took {tail} unsettled orders, not at least 150"
    );
    let wiped = Instant::now();
    let settled_before: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&stack.db)
        .await
        .unwrap();
    println!(
        "FLUSHALL at {:.1?}, {settled_before} orders settled by then, {tail} unsettled",
        storm.elapsed()
    );
    let serving = storm.wait_decided(200, Duration::from_secs(30)).await;
    let records = storm.finish().await;
    let after: Vec<_> = records
        .iter()
        .filter(|r| r.sent >= wiped)
        .cloned()
        .collect();
    println!("sent after the wipe: {}", storm::summary(&after));
    assert_serving_after_the_wipe(serving, &after, "purchase");
    // Every 202 in Postgres, the tail's too.
    let report = assert_invariants(&stack, &records, &sales, &[], AllowedLoss::None).await;
    println!(
        "{} accepted purchases lost with a wipe that took {tail} unsettled",
        report.lost.len()
    );
    let mut all = records;
    all.extend(assert_buyers_cannot_buy_again(&stack, &sales).await);
    assert_invariants(&stack, &all, &sales, &[], AllowedLoss::None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_wiped_mid_vote_rebuilds_the_poll_and_every_voter_keeps_one_vote() {
    let stack = Stack::start("wipe-poll", Options::default()).await;
    let voters = stack.create_users(900, false).await;
    let (poll, options) = stack.create_poll(&["red", "green", "blue", "yellow"]).await;
    let (early, late) = voters.split_at(300);

    // Votes settled before the wipe.
    let mut records =
        storm::run_all(&stack.http, stack.bases(), votes(early, poll, &options, 1)).await;
    assert_eq!(
        records.iter().filter(|r| r.is_accepted()).count(),
        early.len(),
        "every early voter's vote is accepted"
    );
    assert_invariants(&stack, &records, &[], &[poll], AllowedLoss::None).await;

    // New voters, and the early ones again (they must get 409), while Redis is wiped.
    let mut work: Vec<Work> = votes(late, poll, &options, 1);
    work.extend(votes(early, poll, &options, 1));
    {
        use rand::seq::SliceRandom;
        work.shuffle(&mut rand::rng());
    }
    let storm = stack.storm(work, Plan::at_rate(120.0));
    storm.wait_accepted(50, Duration::from_secs(20)).await;
    // Settlement stops, so that the wipe takes a long unsettled tail: the server
    // kept it (`settle/kept.rs`), and the rebuild finds it in Postgres.
    stop_settling_votes_until(&stack, &[poll], 100).await;
    let tail = flushall_measuring_the_tail(&stack, &[], &[poll]).await;
    assert!(
        tail >= 100,
        "the wipe took {tail} unsettled votes, not at least 100"
    );
    let wiped = Instant::now();
    println!(
        "FLUSHALL at {:.1?}, {tail} votes unsettled",
        storm.elapsed()
    );
    let serving = storm.wait_decided(100, Duration::from_secs(30)).await;
    let wave = storm.finish().await;
    let after: Vec<_> = wave.iter().filter(|r| r.sent >= wiped).cloned().collect();
    println!("sent after the wipe: {}", storm::summary(&after));
    records.extend(wave.iter().cloned());
    assert_serving_after_the_wipe(serving, &after, "vote");
    let early_ids: HashSet<i64> = early.iter().map(|u| u.id).collect();
    let revoted: Vec<i64> = wave
        .iter()
        .filter(|r| r.is_accepted() && early_ids.contains(&r.user))
        .map(|r| r.user)
        .collect();
    assert!(
        revoted.is_empty(),
        "{} voters whose vote was settled before the wipe voted again: {:?}",
        revoted.len(),
        &revoted[..revoted.len().min(10)]
    );
    let loss = AllowedLoss::None;
    let report = assert_invariants(&stack, &records, &[], &[poll], loss).await;
    println!(
        "{} accepted votes lost with a wipe that took {tail} unsettled",
        report.lost.len()
    );

    // Everyone whose vote Postgres holds tries again: 409 already_voted each.
    let settled: Vec<i64> = stack
        .scalars("SELECT user_id FROM votes WHERE poll_id = $1", poll)
        .await;
    let settled: HashSet<i64> = settled.into_iter().collect();
    let again_users: Vec<_> = voters
        .iter()
        .filter(|u| settled.contains(&u.id))
        .cloned()
        .collect();
    let again = storm::run_all(
        &stack.http,
        stack.bases(),
        votes(&again_users, poll, &options, 1),
    )
    .await;
    let not_refused: Vec<String> = final_answers(&again)
        .iter()
        .filter(|r| r.code() != Some("already_voted"))
        .take(10)
        .map(|r| format!("user {}: {}", r.user, r.label()))
        .collect();
    assert!(
        not_refused.is_empty(),
        "voters in Postgres were not refused with 409 already_voted: {}",
        not_refused.join("; ")
    );
    records.extend(again);
    assert_invariants(&stack, &records, &[], &[poll], loss).await;
}
