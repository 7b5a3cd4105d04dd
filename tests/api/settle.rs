//! Nothing lost: a settlement worker that dies mid-batch leaves its entries pending,
//! and a new worker lands every accepted order exactly once.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use reqwest::StatusCode;
use stampede::config::SettleConfig;
use stampede::settle::Settler;
use tokio::sync::watch;

use crate::helpers::{TestApp, spawn_app_with, spawn_with_live_sale_and};

async fn buy_all(app: &TestApp, sale: i64, n: usize) -> HashSet<i64> {
    let users = app.create_users(n, false).await;
    let mut accepted = HashSet::new();
    for u in &users {
        if app.purchase(sale, &u.token).await.status() == StatusCode::ACCEPTED {
            accepted.insert(u.id);
        }
    }
    accepted
}

pub(crate) async fn settler(
    app: &TestApp,
    consumer: &str,
    batch: usize,
    claim_idle: Duration,
) -> Settler {
    settler_on(
        app,
        app.db.clone(),
        SettleConfig {
            batch_size: batch,
            block: Duration::from_millis(100),
            claim_idle,
            consumer: Some(consumer.to_string()),
            ..SettleConfig::default()
        },
    )
    .await
}

/// A worker of `app`'s Redis namespace writing to `db`, configured by `config`.
async fn settler_on(app: &TestApp, db: sqlx::PgPool, config: SettleConfig) -> Settler {
    Settler::connect(
        db,
        &stampede::redis_conn::Target::from_config(&app.config),
        app.keys.clone(),
        config,
        stampede::startup::settlers(),
    )
    .await
    .unwrap()
}

async fn pending_in_group(app: &TestApp, sale: i64) -> i64 {
    let key = app.sale_keys(sale).orders;
    let summary: redis::Value = app
        .redis_query(redis::cmd("XPENDING").arg(&key).arg("settle"))
        .await;
    match summary {
        redis::Value::Array(items) => match &items[0] {
            redis::Value::Int(n) => *n,
            _ => 0,
        },
        _ => 0,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn worker_killed_mid_batch_loses_nothing_and_duplicates_nothing() {
    let (app, _, sale) = spawn_with_live_sale_and(300, |c| c.settle_in_serve = false).await;
    let accepted = buy_all(&app, sale, 300).await;
    assert_eq!(accepted.len(), 300);
    assert!(app.orders_in_db(sale).await.is_empty(), "no worker ran yet");

    // Worker A settles in batches of 20 and is killed as soon as something landed:
    // its current batch was read but not acknowledged.
    let a = settler(&app, "worker-a", 20, Duration::from_secs(60)).await;
    let (_tx, rx) = watch::channel(false);
    let task = tokio::spawn(a.run(rx));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while app.orders_in_db(sale).await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "worker A never settled anything"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    task.abort();
    let _ = task.await;
    let landed_by_a = app.orders_in_db(sale).await.len();
    assert!(
        landed_by_a < 300,
        "A must die before finishing (landed {landed_by_a})"
    );

    // Simulate a crash after reading but before acknowledging: read a batch as a
    // consumer that then vanishes.
    app.read_as_dead_consumer(sale, "ghost", 25).await;
    assert!(
        pending_in_group(&app, sale).await > 0,
        "entries are pending for dead consumers"
    );

    // Worker B takes over everything idle (claim_idle 0 ms here) and drains.
    let mut b = settler(&app, "worker-b", 50, Duration::ZERO).await;
    b.drain().await.unwrap();

    let orders = app.orders_in_db(sale).await;
    assert_eq!(orders.len(), 300, "every accepted order landed");
    let users: HashSet<i64> = orders.iter().map(|(_, u)| *u).collect();
    assert_eq!(users, accepted, "exactly the accepted buyers, once each");
    assert_eq!(
        pending_in_group(&app, sale).await,
        0,
        "nothing left unacknowledged"
    );
    let pending_hash: i64 = app
        .redis_query(redis::cmd("HLEN").arg(app.sale_keys(sale).pending))
        .await;
    assert_eq!(pending_hash, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn redelivered_entries_are_written_once() {
    let (app, _, sale) = spawn_with_live_sale_and(20, |c| c.settle_in_serve = false).await;
    let accepted = buy_all(&app, sale, 10).await;

    // Copy the stream entries, settle, then put the copies back as new entries:
    // the same order ids arrive twice.
    let key = app.sale_keys(sale).orders;
    let entries: Vec<(String, Vec<(String, String)>)> = app
        .redis_query(redis::cmd("XRANGE").arg(&key).arg("-").arg("+"))
        .await;
    let metrics = std::sync::Arc::new(stampede::metrics::Metrics::default());
    let mut w = settler(&app, "w1", 4, Duration::ZERO)
        .await
        .with_metrics(metrics.clone());
    // The drain reports the rows written so far after each batch (of 4 here).
    let mut progress = Vec::new();
    assert_eq!(
        w.drain_reporting(|rows| progress.push(rows)).await.unwrap(),
        10
    );
    assert_eq!(progress, [4, 8, 10]);
    assert_eq!(app.orders_in_db(sale).await.len(), 10);
    assert_eq!(
        metrics.settle_rewrites.get(),
        0,
        "new orders go in with plain inserts"
    );
    for (_, fields) in entries {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&key).arg("*");
        for (f, v) in fields {
            cmd.arg(f).arg(v);
        }
        let _: String = cmd.query_async(&mut app.redis.clone()).await.unwrap();
    }
    // New orders behind the copies: a batch of 4 holds both, and the new ones of
    // such a batch must land when it is written again, skipping the copies.
    let later = buy_all(&app, sale, 10).await;
    assert_eq!(later.len(), 10);
    w.drain().await.unwrap();
    let orders = app.orders_in_db(sale).await;
    assert_eq!(orders.len(), 20);
    assert_eq!(
        orders.iter().map(|(_, u)| *u).collect::<HashSet<_>>(),
        accepted.union(&later).copied().collect()
    );
    assert!(
        metrics.settle_rewrites.get() >= 1,
        "the copies met their rows: their batches were written again"
    );
    assert_eq!(
        metrics.settle_conflicts.get(),
        0,
        "a redelivery is no conflict"
    );
    assert_eq!(pending_in_group(&app, sale).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_order_conflicting_with_a_settled_one_is_counted_not_retried_forever() {
    let (app, admin, sale) = spawn_with_live_sale_and(10, |c| c.settle_in_serve = false).await;
    let buyer = app.user().await;
    app.buy(sale, &buyer.token).await;
    let metrics = std::sync::Arc::new(stampede::metrics::Metrics::default());
    let mut w = settler(&app, "w1", 10, Duration::ZERO)
        .await
        .with_metrics(metrics.clone());
    w.drain().await.unwrap();
    assert_eq!(app.orders_in_db(sale).await.len(), 1);

    // Redis forgets the buyer (lost state): the script accepts a second order.
    let _: () = app
        .redis_query(
            redis::cmd("HDEL")
                .arg(app.sale_keys(sale).buyers)
                .arg(buyer.id),
        )
        .await;
    app.buy(sale, &buyer.token).await;
    w.drain().await.unwrap();

    // Postgres keeps one order per (sale, user); the conflict is counted, the entry is
    // not left to be retried forever, and reconcile sees the stores disagree.
    assert_eq!(app.orders_in_db(sale).await.len(), 1);
    assert_eq!(metrics.settle_conflicts.get(), 1);
    assert_eq!(pending_in_group(&app, sale).await, 0);
    let report: serde_json::Value = app
        .get_json(
            &format!("/api/admin/sales/{sale}/reconcile"),
            Some(&admin.token),
        )
        .await;
    assert_eq!(report["consistent"], false, "{report}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vote_conflicting_with_a_settled_one_is_counted_not_dropped_silently() {
    let app = spawn_app_with(|c| c.settle_in_serve = false).await;
    let admin = app.admin().await;
    let (poll, options) = app.open_poll(&admin, "Tea?", &["yes", "no"]).await;
    let voter = app.user().await;
    app.cast_vote(poll, &voter.token, options[0]).await;
    let metrics = std::sync::Arc::new(stampede::metrics::Metrics::default());
    let mut w = settler(&app, "w1", 10, Duration::ZERO)
        .await
        .with_metrics(metrics.clone());
    w.drain().await.unwrap();

    // Redis forgets the voter (lost state): the script takes a second ballot, under
    // the same seq, for the other option.
    let voters = app
        .keys
        .poll(stampede::domain::Id::new(poll).unwrap())
        .voters;
    let _: () = app
        .redis_query(redis::cmd("HDEL").arg(voters).arg(voter.id))
        .await;
    app.cast_vote(poll, &voter.token, options[1]).await;
    w.drain().await.unwrap();

    // Postgres keeps the first ballot; the other is counted as a conflict, not
    // dropped without a word.
    let rows: Vec<(i64, i32)> =
        sqlx::query_as("SELECT option_id, seq FROM votes WHERE poll_id = $1 AND user_id = $2")
            .bind(poll)
            .bind(voter.id)
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(rows, [(options[0], 1)]);
    assert_eq!(metrics.settle_conflicts.get(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn one_transaction_holds_at_most_batch_size_rows_across_all_streams() {
    let app = spawn_app_with(|c| c.settle_in_serve = false).await;
    let admin = app.admin().await;
    let mut streams = Vec::new();
    let mut total = 0;
    for _ in 0..5 {
        let sale = app.live_sale(&admin, 30).await;
        total += buy_all(&app, sale, 30).await.len();
        streams.push(stampede::sale::settlement::stream(
            &app.keys,
            stampede::domain::Id::new(sale).unwrap(),
        ));
    }
    assert_eq!(total, 150);
    let mut worker = settler(&app, "batcher", 20, Duration::from_secs(60)).await;
    let mut inserted = 0;
    for _ in 0..100 {
        let done = worker.step(&streams).await.unwrap();
        assert!(
            done.read <= 20,
            "a batch of {} rows across streams",
            done.read
        );
        inserted += done.inserted;
        if done.read == 0 {
            break;
        }
    }
    assert_eq!(inserted, 150, "everything settled, 20 at a time at most");
}

#[tokio::test(flavor = "multi_thread")]
async fn consumers_dead_longer_than_the_claim_time_leave_the_group() {
    let (app, _, sale) = spawn_with_live_sale_and(10, |c| c.settle_in_serve = false).await;
    buy_all(&app, sale, 10).await;
    // A worker that read entries and died, and one that never read anything.
    app.read_as_dead_consumer(sale, "ghost-with-entries", 4)
        .await;
    let key = app.sale_keys(sale).orders;
    app.create_consumer(sale, "ghost-idle").await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut worker = settler(&app, "survivor", 100, Duration::from_millis(200)).await;
    worker.drain().await.unwrap();
    assert_eq!(
        app.orders_in_db(sale).await.len(),
        10,
        "the ghost's entries were taken over"
    );
    // The ghost that held entries is idle too once they were claimed; the next pass
    // removes it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.drain().await.unwrap();
    let consumers: Vec<String> = {
        let reply: redis::streams::StreamInfoConsumersReply =
            redis::AsyncCommands::xinfo_consumers(&mut app.redis.clone(), &key, "settle")
                .await
                .unwrap();
        reply.consumers.into_iter().map(|c| c.name).collect()
    };
    assert_eq!(consumers, vec!["survivor".to_string()]);
}

/// A rolling upgrade: a server of the previous version still takes purchases and
/// writes them its way, one entry per order in `{sale:N}:orders` (a worker of that
/// version reads only that stream, so it never meets a batch entry it could not
/// parse). This version's worker finds that stream holding entries and settles
/// them with the batch entries of `{sale:N}:accepted`, each order once.
#[tokio::test(flavor = "multi_thread")]
async fn orders_an_earlier_version_wrote_to_its_own_stream_are_settled() {
    let (app, admin, sale) = spawn_with_live_sale_and(10, |c| c.settle_in_serve = false).await;
    let new_buyers = buy_all(&app, sale, 3).await;
    let k = app.sale_keys(sale);
    let old_buyers = app.create_users(2, false).await;
    let mut redis = app.redis.clone();
    let mut old_orders = HashSet::new();
    for user in &old_buyers {
        let order =
            stampede::sale::order_id::new_order_id(stampede::domain::Id::new(sale).unwrap());
        old_orders.insert(order);
        let _: String = redis::cmd("XADD")
            .arg(&k.orders_legacy)
            .arg("*")
            .arg("order_id")
            .arg(order.to_string())
            .arg("sale_id")
            .arg(sale)
            .arg("user_id")
            .arg(user.id)
            .arg("at_ms")
            .arg(chrono::Utc::now().timestamp_millis())
            .query_async(&mut redis)
            .await
            .unwrap();
        let _: () = redis::pipe()
            .hset(&k.pending, order.to_string(), user.id)
            .ignore()
            .hset(&k.buyers, user.id, "")
            .ignore()
            .decr(&k.stock, 1)
            .ignore()
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    assert_ne!(k.orders, k.orders_legacy);

    let mut w = settler(&app, "w1", 100, Duration::ZERO).await;
    assert_eq!(w.drain().await.unwrap(), 5);
    let orders = app.orders_in_db(sale).await;
    assert_eq!(orders.len(), 5, "{orders:?}");
    let users: HashSet<i64> = orders.iter().map(|(_, u)| *u).collect();
    assert!(new_buyers.iter().all(|u| users.contains(u)));
    assert!(old_buyers.iter().all(|u| users.contains(&u.id)));
    assert!(
        old_orders
            .iter()
            .all(|o| orders.iter().any(|(id, _)| id == o))
    );
    let (legacy_left, accepted_left, pending_left): (i64, i64, i64) = redis::pipe()
        .xlen(&k.orders_legacy)
        .xlen(&k.orders)
        .hlen(&k.pending)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!((legacy_left, accepted_left, pending_left), (0, 0, 0));
    // Drained again: nothing twice.
    assert_eq!(w.drain().await.unwrap(), 0);
    assert_eq!(app.orders_in_db(sale).await.len(), 5);
    // The sale's reconcile agrees in both stores.
    assert_eq!(app.reconcile_report(&admin, sale).await["consistent"], true);
}

/// The pending hash holds one field per decision batch, under the batch tag its
/// order ids share. Two batches that drew the same tag share the field (the second
/// appends), so no order is lost; settlement drops exactly the orders it settled,
/// once (a redelivery drops nothing), and the counters and the hash go at zero:
/// order by order while the field holds more than the settled entry, whole once it
/// holds just that entry. An earlier version's field (one per order) is read and
/// dropped beside them.
#[tokio::test(flavor = "multi_thread")]
async fn batches_sharing_a_tag_share_a_pending_field_and_settle_order_by_order() {
    use stampede::sale::buy::{BuyRequest, PurchaseBatch};
    use stampede::sale::order_id::{batch_tag, new_order_ids};
    use stampede::sale::pending;

    let (app, admin, sale) = spawn_with_live_sale_and(10, |c| c.settle_in_serve = false).await;
    let id = stampede::domain::Id::new(sale).unwrap();
    let users = app.create_users(6, false).await;
    let k = app.sale_keys(sale);
    let mut redis = app.redis.clone();
    let batch = PurchaseBatch {
        keys: &app.keys,
        sale: id,
        policies: &[],
        now_ms: None,
        key_ttl: Duration::from_secs(86_400),
    };
    let buyer = |u: &crate::helpers::User| BuyRequest {
        user: stampede::domain::Id::new(u.id).unwrap(),
        quantity: 1,
        ip: None,
        key: None,
    };
    // Five ids of one tag: three for a first batch, two for a second.
    let ids = new_order_ids(id, 5);
    let texts: Vec<String> = ids.iter().map(ToString::to_string).collect();
    let tag = batch_tag(&texts[0]).unwrap().to_string();
    let first: Vec<BuyRequest> = users[..3].iter().map(buyer).collect();
    let second: Vec<BuyRequest> = users[3..5].iter().map(buyer).collect();
    for (buyers, ids) in [(&first, ids[..3].to_vec()), (&second, ids[3..].to_vec())] {
        let replies = batch.run_with_ids(&mut redis, buyers, ids).await.unwrap();
        assert!(
            replies.iter().all(|r| matches!(
                r.outcome,
                stampede::sale::buy::PurchaseOutcome::Accepted { .. }
            )),
            "{replies:?}"
        );
    }
    // An earlier version's pending order: its own field, order id -> user.
    let legacy = new_order_ids(id, 1)[0].to_string();
    let _: () = redis::pipe()
        .hset(&k.pending, &legacy, users[5].id)
        .ignore()
        .hset(&k.buyers, users[5].id, "")
        .ignore()
        .decr(&k.stock, 1)
        .ignore()
        .query_async(&mut redis)
        .await
        .unwrap();

    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(&k.pending)
        .query_async(&mut redis)
        .await
        .unwrap();
    let fields: HashSet<String> = fields.into_iter().collect();
    let expected: HashSet<String> = [tag.clone(), "#".into(), "#b".into(), legacy.clone()]
        .into_iter()
        .collect();
    assert_eq!(fields, expected);
    let count = |app: &TestApp| {
        let mut redis = app.redis.clone();
        let keys = app.keys.clone();
        async move { pending::count(&mut redis, &keys, id).await.unwrap() }
    };
    assert_eq!(count(&app).await, 6);
    // Each pending order is its owner's, and nobody else's.
    let owners = texts.iter().chain([&legacy]).zip(&users);
    for (order, user) in owners.clone() {
        let answer = app
            .get_json(&format!("/api/orders/{order}"), Some(&user.token))
            .await;
        assert_eq!(answer["status"], "pending", "{answer}");
        assert_eq!(answer["user_id"], user.id);
    }
    let other = app
        .get(&format!("/api/orders/{}", texts[0]), Some(&users[4].token))
        .await;
    assert_eq!(other.status(), StatusCode::NOT_FOUND);
    assert_eq!(app.reconcile_report(&admin, sale).await["consistent"], true);

    // What settlement hands over: each stream entry's `orders` text.
    let entries: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(&k.orders)
        .arg("-")
        .arg("+")
        .query_async(&mut redis)
        .await
        .unwrap();
    let records: Vec<String> = entries
        .into_iter()
        .map(|(_, fields)| fields["orders"].clone())
        .collect();
    assert_eq!(records.len(), 2, "{records:?}");
    assert!(records[0].starts_with(&texts[0]), "{records:?}");

    // The first batch settles: its three orders go, the second's two stay.
    let dropped = pending::drop_settled(&mut redis, &k.pending, &records[..1])
        .await
        .unwrap();
    assert_eq!(dropped, 3);
    assert_eq!(count(&app).await, 3);
    let again = pending::drop_settled(&mut redis, &k.pending, &records[..1])
        .await
        .unwrap();
    assert_eq!(again, 0, "a redelivery drops nothing");
    assert_eq!(count(&app).await, 3);
    for (order, user) in owners.clone().skip(3) {
        let answer = app
            .get_json(&format!("/api/orders/{order}"), Some(&user.token))
            .await;
        assert_eq!(answer["status"], "pending", "{answer}");
    }
    let gone = app
        .get(&format!("/api/orders/{}", texts[0]), Some(&users[0].token))
        .await;
    assert_eq!(
        gone.status(),
        StatusCode::NOT_FOUND,
        "settled here, not in Postgres"
    );

    // The rest, with the earlier version's order: the hash is gone.
    let rest = [records[1].clone(), legacy.clone()];
    let dropped = pending::drop_settled(&mut redis, &k.pending, &rest)
        .await
        .unwrap();
    assert_eq!(dropped, 3);
    let again = pending::drop_settled(&mut redis, &k.pending, &rest)
        .await
        .unwrap();
    assert_eq!(again, 0, "a redelivery drops nothing");
    let exists: bool = redis::cmd("EXISTS")
        .arg(&k.pending)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(
        !exists,
        "an empty pending hash is removed, counters and all"
    );
    assert_eq!(count(&app).await, 0);
}

/// The settlement worker's guard against recreating a removed sale's stream
/// (`lua/drop_empty_stream.lua`): a stream goes only while it has no entries, so
/// an accepted order is never dropped with it.
#[tokio::test]
async fn the_recreated_stream_guard_removes_only_an_empty_stream() {
    let app = crate::helpers::spawn_app().await;
    let guard = redis::Script::new(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/lua/drop_empty_stream.lua"
    )));
    let mut redis = app.redis.clone();
    let sale = stampede::domain::Id::new(990_001).unwrap();
    let empty = app.keys.sale(sale).orders;
    let full = app
        .keys
        .sale(stampede::domain::Id::new(990_002).unwrap())
        .orders;
    for key in [&empty, &full] {
        stampede::settle::ensure_group(&mut redis, key)
            .await
            .unwrap();
    }
    let _: String = redis::cmd("XADD")
        .arg(&full)
        .arg("*")
        .arg("o")
        .arg("1")
        .query_async(&mut redis)
        .await
        .unwrap();

    // A one-key integer reply (XLEN, EXISTS).
    async fn count(redis: &mut stampede::redis_conn::Redis, cmd: &str, key: &str) -> i64 {
        redis::cmd(cmd).arg(key).query_async(redis).await.unwrap()
    }
    let removed: i64 = guard.key(&full).invoke_async(&mut redis).await.unwrap();
    assert_eq!(removed, 0, "a stream with an entry stays");
    assert_eq!(count(&mut redis, "XLEN", &full).await, 1);
    let removed: i64 = guard.key(&empty).invoke_async(&mut redis).await.unwrap();
    assert_eq!(removed, 1, "an empty stream goes");
    assert_eq!(count(&mut redis, "EXISTS", &empty).await, 0);
    let removed: i64 = guard.key(&empty).invoke_async(&mut redis).await.unwrap();
    assert_eq!(removed, 0, "an absent stream is left absent");
    assert_eq!(
        count(&mut redis, "EXISTS", &empty).await,
        0,
        "and is not created"
    );
}

/// A listed sale whose stream is gone (a wipe of that key, a sale removed before
/// the next listing) is skipped by the reclaim pass (`XINFO` answers "no such key"
/// there, not `NOGROUP`): the other sales' orders still settle, and a drain does
/// not fail.
#[tokio::test(flavor = "multi_thread")]
async fn a_listed_sale_without_its_stream_does_not_stop_the_reclaim_pass_or_a_drain() {
    let (app, admin, gone) = spawn_with_live_sale_and(10, |c| c.settle_in_serve = false).await;
    let kept = app.live_sale(&admin, 10).await;
    buy_all(&app, gone, 3).await;
    let bought = buy_all(&app, kept, 4).await;
    assert_eq!(bought.len(), 4);
    let _: i64 = app
        .redis_query(redis::cmd("DEL").arg(app.sale_keys(gone).orders))
        .await;
    let mut worker = settler(&app, "after-the-loss", 100, Duration::from_millis(200)).await;
    assert_eq!(worker.drain().await.unwrap(), 4);
    assert_eq!(app.orders_in_db(kept).await.len(), 4);
    assert_eq!(worker.drain().await.unwrap(), 0);
}

/// The removal of a dead consumer looks again, in the same step, at what it holds
/// (`lua/forget_consumer.lua`): a worker that stalled past the claim time and then
/// read entries (after the reclaim pass saw it idle with nothing pending) keeps
/// them, where `XGROUP DELCONSUMER` alone would drop them from the group's pending
/// list and their orders would never be settled.
#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_that_holds_entries_is_never_removed_as_dead() {
    let (app, _, sale) = spawn_with_live_sale_and(3, |c| c.settle_in_serve = false).await;
    buy_all(&app, sale, 3).await;
    let key = app.sale_keys(sale).orders;
    let script = redis::Script::new(include_str!("../../lua/forget_consumer.lua"));
    let forget = |name: &'static str| {
        let (mut redis, invocation) = (app.redis.clone(), {
            let mut i = script.prepare_invoke();
            i.key(&key).arg("settle").arg(name);
            i
        });
        async move { invocation.invoke_async::<i64>(&mut redis).await.unwrap() }
    };
    let consumers = |app: &TestApp| {
        let (mut redis, key) = (app.redis.clone(), key.clone());
        async move {
            let reply: redis::streams::StreamInfoConsumersReply =
                redis::AsyncCommands::xinfo_consumers(&mut redis, &key, "settle")
                    .await
                    .unwrap();
            reply
                .consumers
                .into_iter()
                .map(|c| (c.name, c.pending))
                .collect::<Vec<_>>()
        }
    };
    // The stalled worker came back and read entries: it is kept, holding them.
    app.read_as_dead_consumer(sale, "stalled", 4).await;
    let held = consumers(&app).await;
    assert!(
        held.iter()
            .any(|(name, pending)| name == "stalled" && *pending > 0),
        "{held:?}"
    );
    assert_eq!(forget("stalled").await, 0);
    assert_eq!(consumers(&app).await, held, "nothing it held was dropped");
    // One that holds nothing goes.
    app.create_consumer(sale, "idle").await;
    assert_eq!(forget("idle").await, 1);
    assert_eq!(consumers(&app).await, held);
}

/// Who has read a sale's stream (the settlement group's consumers).
async fn readers(app: &TestApp, sale: i64) -> Vec<String> {
    let reply: redis::RedisResult<redis::streams::StreamInfoConsumersReply> =
        redis::AsyncCommands::xinfo_consumers(
            &mut app.redis.clone(),
            app.sale_keys(sale).orders,
            "settle",
        )
        .await;
    let mut names: Vec<String> = reply
        .map(|r| r.consumers.into_iter().map(|c| c.name).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// Waits (at most `within`) until `sale` has `n` orders in Postgres.
async fn wait_settled(app: &TestApp, sale: i64, n: usize, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let settled = app.orders_in_db(sale).await.len();
        if settled == n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{settled} of {n} orders settled after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two running workers (`exclusive`, the default): one reads every stream and the
/// other stands by, so a storm is settled in the one worker's batches. When the
/// leader stops, it lets the lease go and the standby settles what comes next.
#[tokio::test(flavor = "multi_thread")]
async fn one_worker_settles_at_a_time_and_a_standby_takes_over_when_it_stops() {
    let (app, _, sale) = spawn_with_live_sale_and(100, |c| c.settle_in_serve = false).await;
    // The leader first, so that which one leads is known.
    let (metrics_a, metrics_b) = (
        std::sync::Arc::new(stampede::metrics::Metrics::default()),
        std::sync::Arc::new(stampede::metrics::Metrics::default()),
    );
    let (stop_a, rx_a) = watch::channel(false);
    let a = tokio::spawn(
        settler(&app, "worker-a", 100, Duration::from_secs(60))
            .await
            .with_metrics(metrics_a.clone())
            .run(rx_a),
    );
    let lease = app.keys.lock(stampede::settle::SETTLE_LEASE);
    let leading = |m: &std::sync::Arc<stampede::metrics::Metrics>| {
        m.settle_leading.load(std::sync::atomic::Ordering::Relaxed)
    };
    // The worker sets its flag once Redis has answered its SET: wait for both.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while redis_get(&app, &lease).await.is_none() || !leading(&metrics_a) {
        assert!(
            std::time::Instant::now() < deadline,
            "worker A never took the lease and said so (stampede_settle_leading): \
             lease {:?}, flag {}",
            redis_get(&app, &lease).await,
            leading(&metrics_a)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (stop_b, rx_b) = watch::channel(false);
    let b = tokio::spawn(
        settler(&app, "worker-b", 100, Duration::from_secs(60))
            .await
            .with_metrics(metrics_b.clone())
            .run(rx_b),
    );

    let first = buy_all(&app, sale, 40).await;
    assert_eq!(first.len(), 40);
    wait_settled(&app, sale, 40, Duration::from_secs(10)).await;
    // A claim about a stretch of time: B, running, asks for the lease once a
    // second and reads nothing while A leads. Time has to pass for B to ask (its
    // asks leave no trace to poll for), so this waits for time and then asserts
    // the state: B still running, not leading, and no reader but A.
    tokio::time::sleep(stampede::settle::STANDBY_EVERY + Duration::from_millis(200)).await;
    assert!(!b.is_finished(), "worker B stopped");
    assert!(!leading(&metrics_b), "B leads beside A");
    assert_eq!(
        readers(&app, sale).await,
        ["worker-a"],
        "the standby read nothing"
    );

    // A stops: it lets the lease go (B may take it at once), and B leads at its
    // next attempt.
    let a_token = redis_get(&app, &lease).await.expect("A holds the lease");
    stop_a.send_replace(true);
    a.await.unwrap();
    assert_ne!(
        redis_get(&app, &lease).await,
        Some(a_token),
        "A released the lease"
    );
    let second = buy_all(&app, sale, 30).await;
    assert_eq!(second.len(), 30);
    wait_settled(
        &app,
        sale,
        70,
        stampede::settle::STANDBY_EVERY + Duration::from_secs(10),
    )
    .await;
    assert_eq!(readers(&app, sale).await, ["worker-a", "worker-b"]);
    let users: HashSet<i64> = app
        .orders_in_db(sale)
        .await
        .iter()
        .map(|(_, u)| *u)
        .collect();
    assert_eq!(users, &first | &second, "every buyer once");

    stop_b.send_replace(true);
    b.await.unwrap();
    assert_eq!(redis_get(&app, &lease).await, None, "B released the lease");
    assert!(
        !leading(&metrics_a) && !leading(&metrics_b),
        "neither leads any more"
    );
}

/// A lease someone else holds (a worker that died holding it, here a lock taken by
/// hand) keeps a worker standing by until it expires; then the worker settles.
/// With `exclusive` off, the same worker reads at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_waits_out_a_lease_it_does_not_hold_unless_not_exclusive() {
    let (app, admin, sale) = spawn_with_live_sale_and(10, |c| c.settle_in_serve = false).await;
    let bought = buy_all(&app, sale, 5).await;
    assert_eq!(bought.len(), 5);

    let key = app.keys.lock(stampede::settle::SETTLE_LEASE);
    let held = stampede::lock::Lock::try_acquire(&app.redis, key.clone(), 60_000)
        .await
        .unwrap()
        .expect("the lease is free");
    let (stop, rx) = watch::channel(false);
    let worker = tokio::spawn(
        settler(&app, "standby", 100, Duration::from_secs(60))
            .await
            .run(rx),
    );
    // A claim about a stretch of time (nothing settles while the lease is another's):
    // long enough for two attempts, which leave no trace to poll for, so this waits
    // for time and then asserts the state, the worker still running.
    tokio::time::sleep(stampede::settle::STANDBY_EVERY * 2 + Duration::from_millis(300)).await;
    assert!(!worker.is_finished(), "the standby stopped");
    assert!(
        app.orders_in_db(sale).await.is_empty(),
        "nothing settled under another's lease"
    );
    assert!(readers(&app, sale).await.is_empty());
    // The holder "died": its lease runs out (at once here), never released.
    std::mem::forget(held);
    let _: () = app
        .redis_query(redis::cmd("PEXPIRE").arg(&key).arg(100))
        .await;
    wait_settled(
        &app,
        sale,
        5,
        stampede::settle::STANDBY_EVERY + Duration::from_secs(10),
    )
    .await;
    stop.send_replace(true);
    worker.await.unwrap();

    // Not exclusive: a second sale settles though the lease is held.
    let other = app.live_sale(&admin, 10).await;
    let bought = buy_all(&app, other, 3).await;
    assert_eq!(bought.len(), 3);
    let _held = stampede::lock::Lock::try_acquire(&app.redis, key, 60_000)
        .await
        .unwrap()
        .expect("the lease is free again");
    let free = settler_on(
        &app,
        app.db.clone(),
        SettleConfig {
            block: Duration::from_millis(100),
            consumer: Some("free".to_string()),
            exclusive: false,
            ..SettleConfig::default()
        },
    )
    .await;
    let (stop, rx) = watch::channel(false);
    let worker = tokio::spawn(free.run(rx));
    wait_settled(&app, other, 3, Duration::from_secs(10)).await;
    stop.send_replace(true);
    worker.await.unwrap();
}

/// A leader that cannot settle (its Postgres unreachable here, while its watchdog
/// keeps the lease alive) hands the lease over after a few failures in a row, and
/// a worker that can settles.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_that_cannot_settle_hands_the_lease_over() {
    let (app, _, sale) = spawn_with_live_sale_and(10, |c| c.settle_in_serve = false).await;
    let bought = buy_all(&app, sale, 4).await;
    assert_eq!(bought.len(), 4);

    let unreachable = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(200))
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .unwrap();
    let broken = settler_on(
        &app,
        unreachable,
        SettleConfig {
            block: Duration::from_millis(100),
            consumer: Some("broken".to_string()),
            ..SettleConfig::default()
        },
    )
    .await;
    let (stop_a, rx_a) = watch::channel(false);
    let a = tokio::spawn(broken.run(rx_a));
    let lease = app.keys.lock(stampede::settle::SETTLE_LEASE);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while redis_get(&app, &lease).await.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the broken worker never took the lease"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (stop_b, rx_b) = watch::channel(false);
    let b = tokio::spawn(
        settler(&app, "working", 100, Duration::from_secs(60))
            .await
            .run(rx_b),
    );
    wait_settled(&app, sale, 4, Duration::from_secs(20)).await;
    assert_eq!(readers(&app, sale).await, ["working"]);
    stop_a.send_replace(true);
    stop_b.send_replace(true);
    a.await.unwrap();
    b.await.unwrap();
}

async fn redis_get(app: &TestApp, key: &str) -> Option<String> {
    app.redis_query(redis::cmd("GET").arg(key)).await
}

/// A drain settles what it may take, and says what other readers still hold: a
/// reader that read and stopped less than `claim_idle_ms` ago keeps its entries
/// (`stampede settle --drain` then fails, naming it, instead of "settled N").
#[tokio::test(flavor = "multi_thread")]
async fn a_drain_names_what_other_readers_still_hold() {
    let (app, _admin, sale) = spawn_with_live_sale_and(20, |c| c.settle_in_serve = false).await;
    let accepted = buy_all(&app, sale, 10).await;
    assert_eq!(accepted.len(), 10);
    app.read_as_dead_consumer(sale, "stopped-just-now", 4).await;
    let mut w = settler(&app, "drainer", 50, Duration::from_secs(600)).await;
    w.drain().await.unwrap();
    assert_eq!(
        app.orders_in_db(sale).await.len(),
        6,
        "all but the held four"
    );
    let held = w.held_by_others().await.unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!((held[0].0.as_str(), held[0].1), ("stopped-just-now", 4));
    // Once taken over (idle long enough), nothing is left to name.
    let mut w = settler(&app, "drainer", 50, Duration::ZERO).await;
    w.drain().await.unwrap();
    assert_eq!(app.orders_in_db(sale).await.len(), 10);
    assert!(w.held_by_others().await.unwrap().is_empty());
}
