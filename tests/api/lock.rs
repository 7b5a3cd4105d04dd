//! The Redis lock against a real Redis: ownership, expiry, extension, the watchdog,
//! and the reclaim pass of the settlement worker that runs under it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use stampede::lock::{self, Lock, LockGuard, Released};
use stampede::redis_conn::Redis;

use crate::helpers::{RedisNamespace, redis_get, redis_pttl};

/// Takes a lock that is free (panics if it is held), with a lease of `lease_ms`.
async fn take_free(redis: &Redis, key: &str, lease_ms: u64) -> LockGuard {
    Lock::try_acquire(redis, key, lease_ms)
        .await
        .unwrap()
        .expect("the lock is free")
}

#[tokio::test]
async fn the_owner_releases_and_the_lock_is_exclusive_until_then() {
    let RedisNamespace { redis, keys } = &RedisNamespace::new().await;
    let key = keys.lock("job");
    let guard = Lock::try_acquire(redis, key.as_str(), 10_000)
        .await
        .unwrap()
        .expect("free lock is taken");
    assert_eq!(guard.token().len(), 32, "128-bit hex token");
    assert_eq!(redis_get(redis, &key).await.as_deref(), Some(guard.token()));
    let ttl = redis_pttl(redis, &key).await;
    assert!(ttl > 9_000 && ttl <= 10_000, "lease set with PX: {ttl}");
    assert!(
        Lock::try_acquire(redis, key.as_str(), 10_000)
            .await
            .unwrap()
            .is_none(),
        "held lock cannot be taken twice"
    );
    assert_eq!(guard.release().await.unwrap(), Released::Released);
    assert_eq!(redis_get(redis, &key).await, None);
    let again = Lock::try_acquire(redis, key.as_str(), 10_000)
        .await
        .unwrap();
    assert!(again.is_some(), "a released lock can be taken again");
    again.unwrap().release().await.unwrap();
}

#[tokio::test]
async fn only_one_of_many_concurrent_callers_gets_the_lock() {
    let RedisNamespace { redis, keys } = &RedisNamespace::new().await;
    let key = keys.lock("contended");
    let barrier = Arc::new(tokio::sync::Barrier::new(100));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let (redis, key, barrier) = (redis.clone(), key.clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            Lock::try_acquire(&redis, key, 10_000).await.unwrap()
        });
    }
    let winners: Vec<_> = tasks.join_all().await.into_iter().flatten().collect();
    assert_eq!(winners.len(), 1);
    for w in winners {
        w.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_release_with_a_wrong_token_is_not_owner_and_the_key_survives() {
    let RedisNamespace { redis, keys } = &RedisNamespace::new().await;
    let key = keys.lock("job");
    let guard = take_free(redis, &key, 10_000).await;
    let answer = lock::release(&mut redis.clone(), &key, "not-the-token")
        .await
        .unwrap();
    assert_eq!(answer, Released::NotOwner);
    assert_eq!(redis_get(redis, &key).await.as_deref(), Some(guard.token()));
    assert_eq!(guard.release().await.unwrap(), Released::Released);
}

#[tokio::test]
async fn an_expired_holder_cannot_release_the_next_holders_lock() {
    let RedisNamespace { redis, keys } = &RedisNamespace::new().await;
    let key = keys.lock("job");
    let a = take_free(redis, &key, 100).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let b = Lock::try_acquire(redis, key.as_str(), 10_000)
        .await
        .unwrap()
        .expect("A's lease ran out, so B gets the lock");
    assert_eq!(a.release().await.unwrap(), Released::NotOwner);
    assert_eq!(
        redis_get(redis, &key).await.as_deref(),
        Some(b.token()),
        "B's lock must survive A's late release"
    );
    assert_eq!(b.release().await.unwrap(), Released::Released);
}

#[tokio::test]
async fn extend_with_a_wrong_token_or_after_expiry_fails_and_creates_nothing() {
    let RedisNamespace { redis, keys } = &RedisNamespace::new().await;

    // Wrong token: refused, and the holder's lease is untouched.
    let key = keys.lock("held");
    let guard = take_free(redis, &key, 5_000).await;
    assert!(
        !lock::extend(&mut redis.clone(), &key, "not-the-token", 60_000)
            .await
            .unwrap()
    );
    assert!(redis_pttl(redis, &key).await <= 5_000);
    assert_eq!(redis_get(redis, &key).await.as_deref(), Some(guard.token()));
    // The owner may extend.
    assert!(guard.extend(60_000).await.unwrap());
    assert!(redis_pttl(redis, &key).await > 5_000);
    guard.release().await.unwrap();

    // After expiry: refused, and the key is not brought back.
    let key = keys.lock("expired");
    let guard = take_free(redis, &key, 100).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!guard.extend(60_000).await.unwrap());
    assert_eq!(
        redis_get(redis, &key).await,
        None,
        "extend must not recreate the key"
    );

    // After expiry and a new holder: refused, and the new holder's lease is untouched.
    let b = take_free(redis, &key, 5_000).await;
    assert!(!guard.extend(60_000).await.unwrap());
    assert!(redis_pttl(redis, &key).await <= 5_000);
    assert_eq!(redis_get(redis, &key).await.as_deref(), Some(b.token()));
    b.release().await.unwrap();
    assert_eq!(guard.release().await.unwrap(), Released::NotOwner);
}

#[tokio::test]
async fn a_watchdog_keeps_a_1500ms_lease_alive_through_4s_of_work() {
    // A lease long enough that a loaded 2-core CI machine (the fault suite runs
    // beside this) cannot starve three extensions in a row, yet work outlasts it.
    let RedisNamespace { redis, keys } = &RedisNamespace::new().await;
    let key = keys.lock("long-job");
    let mut guard = take_free(redis, &key, 1_500).await;
    let mut lost = guard.start_watchdog();
    let work = tokio::time::sleep(Duration::from_secs(4));
    tokio::select! {
        _ = work => {}
        _ = lost.lost() => panic!("the watchdog let the lease run out"),
    }
    assert!(!lost.is_lost());
    assert_eq!(redis_get(redis, &key).await.as_deref(), Some(guard.token()));
    assert!(redis_pttl(redis, &key).await > 0);
    assert_eq!(guard.release().await.unwrap(), Released::Released);
    assert_eq!(redis_get(redis, &key).await, None);
    // Stopped on release: no extension recreates anything, no loss is reported. A
    // claim about a stretch of time (two of the watchdog's 500 ms turns), so this
    // waits for time, then asserts the state.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(redis_get(redis, &key).await, None);
    assert!(!lost.is_lost());
}

#[tokio::test]
async fn the_watchdog_tells_the_holder_when_the_lock_was_lost() {
    let RedisNamespace { redis, keys } = &RedisNamespace::new().await;
    let key = keys.lock("stolen");
    let mut guard = take_free(redis, &key, 300).await;
    let mut lost = guard.start_watchdog();
    // Someone else now holds it (as after a pause longer than the lease).
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("someone-else")
        .arg("PX")
        .arg(10_000)
        .query_async(&mut redis.clone())
        .await
        .unwrap();
    // The watchdog checks every third of the lease; the bound is generous.
    tokio::time::timeout(Duration::from_secs(10), lost.lost())
        .await
        .expect("loss not reported within 10 s");
    assert!(lost.is_lost());
    assert_eq!(guard.release().await.unwrap(), Released::NotOwner);
    assert_eq!(
        redis_get(redis, &key).await.as_deref(),
        Some("someone-else")
    );
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut redis.clone())
        .await
        .unwrap();
}

#[tokio::test]
async fn acquire_waits_for_a_release_but_only_as_long_as_asked() {
    let RedisNamespace { redis, keys } = &RedisNamespace::new().await;
    let key = keys.lock("queue");
    let first = take_free(redis, &key, 10_000).await;

    // It waits as long as asked (time cannot pass faster on a loaded machine, so
    // that bound holds), then gives up rather than wait out the holder's 10 s
    // lease: `None`, within a generous bound well short of the lease.
    let started = Instant::now();
    let none = tokio::time::timeout(
        Duration::from_secs(5),
        Lock::acquire(redis, key.as_str(), 10_000, Duration::from_millis(150)),
    )
    .await
    .expect("acquire still waiting 5 s into its 150 ms")
    .unwrap();
    let waited = started.elapsed();
    assert!(none.is_none(), "taken though another holds it");
    assert!(waited >= Duration::from_millis(150), "{waited:?}");

    let releaser = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        first.release().await.unwrap()
    });
    let started = Instant::now();
    let second = Lock::acquire(redis, key.as_str(), 10_000, Duration::from_secs(3))
        .await
        .unwrap()
        .expect("taken once the first holder released");
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(releaser.await.unwrap(), Released::Released);
    second.release().await.unwrap();
}

#[tokio::test]
async fn a_dropped_guard_is_released_without_waiting_for_its_lease() {
    let RedisNamespace { redis, keys } = &RedisNamespace::new().await;
    let key = keys.lock("dropped");
    let guard = take_free(redis, &key, 60_000).await;
    drop(guard);
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis_get(redis, &key).await.is_some() {
        assert!(
            Instant::now() < deadline,
            "dropped lock still held after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A pending entry of a dead consumer is reclaimed only by the holder of the reclaim
/// lock: while another instance holds it, a settler skips the pass.
#[tokio::test]
async fn reclaim_runs_on_one_instance_at_a_time() {
    use crate::helpers::spawn_app_with;

    let app = spawn_app_with(|c| c.settle_in_serve = false).await;
    let admin = app.admin().await;
    let user = app.user().await;
    let sale = app.live_sale(&admin, 5).await;
    app.buy(sale, &user.token).await;

    // A consumer reads the entry and dies without acknowledging it.
    app.read_as_dead_consumer(sale, "dead-consumer", 10).await;

    let settle_config = stampede::config::SettleConfig {
        claim_idle: Duration::ZERO,
        block: Duration::from_millis(10),
        ..Default::default()
    };
    let mut settler = stampede::settle::Settler::connect(
        app.db.clone(),
        &stampede::redis_conn::Target::from_config(&app.config),
        app.keys.clone(),
        settle_config,
        stampede::startup::settlers(),
    )
    .await
    .unwrap();

    let other_instance = Lock::try_acquire(
        &app.redis,
        app.keys.lock(stampede::settle::reclaim::RECLAIM_LOCK),
        10_000,
    )
    .await
    .unwrap()
    .expect("reclaim lock is free");
    assert_eq!(
        settler.drain().await.unwrap(),
        0,
        "pass skipped under the lock"
    );
    assert!(app.orders_in_db(sale).await.is_empty());

    assert_eq!(other_instance.release().await.unwrap(), Released::Released);
    assert_eq!(settler.drain().await.unwrap(), 1, "reclaimed and settled");
    assert_eq!(app.orders_in_db(sale).await.len(), 1);
    assert_eq!(
        redis_get(
            &app.redis,
            &app.keys.lock(stampede::settle::reclaim::RECLAIM_LOCK)
        )
        .await,
        None,
        "the settler released the reclaim lock"
    );
}
