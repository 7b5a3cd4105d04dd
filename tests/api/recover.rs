//! Redis state that was wiped, or that a new Redis run cannot trust, is rebuilt from
//! Postgres without a restart; meanwhile the sale answers 503 `recovering`, never a
//! decision on partial state. Stock changes move both stores by the same delta once.
//! (The suite in `tests/faults/` causes the real faults with its own processes; these
//! tests reproduce the states those faults leave, in the shared test servers.)

use std::collections::HashSet;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use stampede::domain::Id;

use crate::helpers::{
    Db, TestApp, User, assert_status, spawn_app, spawn_sibling, spawn_with_live_sale,
    spawn_with_open_poll,
};

/// A purchase, retried while the sale answers 503 `recovering` (with Retry-After).
/// Returns the final status and how many 503s came first.
async fn buy_through_recovery(app: &TestApp, sale: i64, user: &User) -> (StatusCode, usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut unavailable = 0;
    loop {
        let resp = app.purchase(sale, &user.token).await;
        if resp.status() != StatusCode::SERVICE_UNAVAILABLE {
            return (resp.status(), unavailable);
        }
        assert!(
            resp.headers().contains_key("retry-after"),
            "a 503 says when to retry"
        );
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"], "recovering", "{body}");
        unavailable += 1;
        assert!(Instant::now() < deadline, "the sale never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Units left + buyers in Redis, and `stock_total` in Postgres.
async fn both_stores(app: &TestApp, sale: i64) -> (i64, i64) {
    let redis_total = app.stock_left(sale).await + app.buyers(sale).await.len() as i64;
    (redis_total, app.stock_total(sale).await)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wiped_sale_is_rebuilt_without_restart_and_no_earlier_buyer_buys_again() {
    let (app, _, sale) = spawn_with_live_sale(10).await;
    let users = app.create_users(8, false).await;
    for u in &users[..6] {
        app.buy(sale, &u.token).await;
    }
    assert_eq!(app.wait_for_orders(sale, 6).await.len(), 6);

    app.wipe().await;

    let (status, _) = buy_through_recovery(&app, sale, &users[0]).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "an earlier buyer stays a buyer"
    );
    for u in &users[1..6] {
        assert_eq!(
            app.purchase(sale, &u.token).await.status(),
            StatusCode::CONFLICT
        );
    }
    for u in &users[6..] {
        app.buy(sale, &u.token).await;
    }
    assert_eq!(app.stock_left(sale).await, 2, "10 units, 8 buyers");
    assert_eq!(both_stores(&app, sale).await, (10, 10));
    assert_eq!(app.wait_for_orders(sale, 8).await.len(), 8);
}

#[tokio::test(flavor = "multi_thread")]
async fn state_from_another_redis_run_is_fenced_and_rebuilt_with_the_buyers_it_forgot() {
    let app = spawn_app_with_slow_sweep().await;
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 5).await;
    let users = app.create_users(5, false).await;
    for u in &users[..3] {
        app.buy(sale, &u.token).await;
    }
    assert_eq!(app.wait_for_orders(sale, 3).await.len(), 3);

    // What an everysec AOF that lost its last second leaves behind: Redis forgot
    // users[0]'s purchase (settled in Postgres meanwhile), and the state is stamped by
    // the Redis process before the restart.
    let k = app.sale_keys(sale);
    let _: () = redis::pipe()
        .hdel(&k.buyers, users[0].id)
        .incr(&k.stock, 1)
        .hset(&k.meta, "run", "0123456789abcdef0123456789abcdef01234567")
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();

    let resp = app.purchase(sale, &users[0].token).await;
    assert_eq!(
        resp.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "no decision on untrusted state"
    );
    let (status, _) = buy_through_recovery(&app, sale, &users[0]).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "the forgotten buyer is remembered from Postgres"
    );
    assert_eq!(app.stock_left(sale).await, 2);
    for u in &users[3..] {
        app.buy(sale, &u.token).await;
    }
    let late = app.user().await;
    let body = crate::helpers::assert_error(
        app.purchase(sale, &late.token).await,
        StatusCode::GONE,
        "sold_out",
    )
    .await;
    assert_eq!(body["error"], "sold_out");
    assert_eq!(both_stores(&app, sale).await, (5, 5));
}

/// The periodic sweep would fix the state before the first request; these tests
/// want to see the request meet it.
async fn spawn_app_with_slow_sweep() -> TestApp {
    crate::helpers::spawn_app_with(|c| c.sweep = Duration::ZERO).await
}

#[tokio::test(flavor = "multi_thread")]
async fn unsettled_orders_in_the_stream_count_when_a_sale_is_rebuilt() {
    let app = crate::helpers::spawn_app_with(|c| {
        c.settle_in_serve = false;
        c.sweep = Duration::ZERO;
    })
    .await;
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 4).await;
    let users = app.create_users(4, false).await;
    for u in &users[..2] {
        app.buy(sale, &u.token).await;
    }
    // Nothing settled; Redis forgets the buyers hash but keeps the stream.
    let k = app.sale_keys(sale);
    let _: () = redis::pipe()
        .del(&k.buyers)
        .set(&k.stock, 4)
        .hset(&k.meta, "run", "fenced")
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();
    let (status, _) = buy_through_recovery(&app, sale, &users[1]).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        app.stock_left(sale).await,
        2,
        "two unsettled orders still hold units"
    );
    app.buy(sale, &users[2].token).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_stock_changes_over_two_instances_leave_both_stores_equal() {
    let app = spawn_app().await;
    let other = spawn_sibling(&app, |_| {}).await;
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 100).await;
    let buyers = app.create_users(60, false).await;
    for round in 0..3 {
        let mut tasks = Vec::new();
        for i in 0..60usize {
            let target = if i % 2 == 0 { &app } else { &other };
            let body = if i % 6 == 0 {
                json!({ "set": 40 + i as i64 })
            } else {
                json!({ "add": 1 })
            };
            let url = target.url(&format!("/api/admin/sales/{sale}/stock"));
            let client = target.client.clone();
            let token = admin.token.clone();
            tasks.push(tokio::spawn(async move {
                client
                    .post(url)
                    .bearer_auth(token)
                    .json(&body)
                    .send()
                    .await
                    .unwrap()
                    .status()
            }));
        }
        for (i, u) in buyers.iter().enumerate().filter(|(i, _)| i % 3 == round) {
            let target = if i % 2 == 0 { &app } else { &other };
            let url = target.url(&format!("/api/sales/{sale}/purchase"));
            let client = target.client.clone();
            let token = u.token.clone();
            tasks.push(tokio::spawn(async move {
                client
                    .post(url)
                    .bearer_auth(token)
                    .send()
                    .await
                    .unwrap()
                    .status()
            }));
        }
        for t in tasks {
            let status = t.await.unwrap();
            assert!(
                [StatusCode::OK, StatusCode::ACCEPTED, StatusCode::CONFLICT].contains(&status),
                "round {round}: {status}"
            );
        }
        let (redis_total, pg_total) = both_stores(&app, sale).await;
        assert_eq!(
            redis_total, pg_total,
            "round {round}: stock_total = left + sold"
        );
    }
    let pending = app
        .count("SELECT count(*) FROM stock_changes WHERE status = 'pending'")
        .await;
    assert_eq!(pending, 0, "every change was applied");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stock_change_on_a_wiped_sale_counts_every_settled_unit() {
    let (app, admin, sale) = spawn_with_live_sale(100).await;
    let users = app.new_buyers(sale, 60).await;
    assert_eq!(app.wait_for_orders(sale, 60).await.len(), 60);
    app.wipe().await;

    let resp = app.change_stock(&admin, sale, &json!({"add": 1})).await;
    assert_status(resp, StatusCode::OK).await;
    assert_eq!(app.stock_total(sale).await, 101);
    assert_eq!(app.stock_left(sale).await, 41);
    let buyers: HashSet<i64> = app.buyers(sale).await.into_iter().collect();
    assert_eq!(buyers.len(), 60);
    for u in &users {
        assert_eq!(
            app.purchase(sale, &u.token).await.status(),
            StatusCode::CONFLICT
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn stock_total_cannot_pass_the_maximum_by_adding() {
    let (app, admin, sale) = spawn_with_live_sale(9_000_000).await;
    let resp = app
        .change_stock(&admin, sale, &json!({"add": 1_000_000}))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = app.change_stock(&admin, sale, &json!({"add": 1})).await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "stock_too_large");
    // One buyer holds a unit: the sale may have 9,999,999 left, none more.
    app.buy(sale, &app.user().await.token).await;
    let resp = app
        .change_stock(&admin, sale, &json!({"set": 10_000_000}))
        .await;
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "stock_too_large", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("may have at most 9999999 left (0 more than the 9999999 it has)"),
        "{body}"
    );
    let resp = app
        .change_stock(&admin, sale, &json!({"set": 9_999_999}))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(app.stock_total(sale).await, 10_000_000);
    assert_eq!(both_stores(&app, sale).await, (10_000_000, 10_000_000));

    // The history tells the refused changes from the applied ones.
    let history = app
        .get_json(
            &format!("/api/admin/sales/{sale}/history"),
            Some(&admin.token),
        )
        .await;
    let stock: Vec<(Value, Value, Value)> = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "stock")
        .map(|e| {
            let a = &e["after"];
            let amount = a.get("add").or(a.get("set")).cloned().unwrap();
            (amount, a["outcome"].clone(), a["delta"].clone())
        })
        .collect();
    assert_eq!(
        stock,
        [
            (json!(9_999_999), json!("applied"), json!(0)),
            (json!(10_000_000), json!("refused"), json!(0)),
            (json!(1), json!("refused"), json!(0)),
            (json!(1_000_000), json!("applied"), json!(1_000_000)),
        ],
        "{history}"
    );
    let page = app
        .html(&format!("/admin/sales/{sale}"), Some(&admin))
        .await;
    assert_eq!(page.matches("Stock change refused").count(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wiped_poll_votes_again_with_tallies_equal_to_postgres() {
    let (app, admin, (poll, options)) = spawn_with_open_poll("Best?", &["a", "b", "c"]).await;
    let users = app.create_users(9, false).await;
    for (i, u) in users[..6].iter().enumerate() {
        app.cast_vote(poll, &u.token, options[i % 3]).await;
    }
    assert_eq!(app.wait_for_votes(poll, 6).await, 6, "votes never settled");
    app.wipe().await;

    // The poll's page says it is coming back (503 with Retry-After, which starts
    // its rebuild), never that there is no such poll.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let resp = app.browse(&format!("/polls/{poll}"), None).await;
        if resp.status() == StatusCode::OK {
            break;
        }
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(resp.headers().contains_key("retry-after"));
        assert!(Instant::now() < deadline, "the poll's page never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.wipe().await;

    // Results come back (503 recovering until the rebuild), with the settled votes.
    let deadline = Instant::now() + Duration::from_secs(20);
    let results: Value = loop {
        let resp = app.get(&format!("/api/polls/{poll}/results"), None).await;
        if resp.status() == StatusCode::OK {
            break resp.json().await.unwrap();
        }
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(Instant::now() < deadline, "the poll never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(results["voters"], 6);
    let again = app.vote(poll, &users[0].token, options[1]).await;
    crate::helpers::assert_error(again, StatusCode::CONFLICT, "already_voted").await;
    for u in &users[6..] {
        app.cast_vote(poll, &u.token, options[2]).await;
    }
    let tally: std::collections::HashMap<i64, i64> = app
        .redis_query(redis::cmd("HGETALL").arg(app.keys.poll(Id::new(poll).unwrap()).tally))
        .await;
    assert_eq!(tally.get(&options[0]), Some(&2));
    assert_eq!(tally.get(&options[1]), Some(&2));
    assert_eq!(tally.get(&options[2]), Some(&5));

    // The poll lists never show a lost poll as one of no votes: 503 with
    // Retry-After (starting its rebuild) until it is back with its 9 voters.
    assert_eq!(app.wait_for_votes(poll, 9).await, 9, "votes never settled");
    app.wipe().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut refused = false;
    loop {
        let resp = app.get("/api/polls", None).await;
        if resp.status() == StatusCode::OK {
            let list: Value = resp.json().await.unwrap();
            let entry = list.as_array().unwrap().iter().find(|p| p["id"] == poll);
            assert_eq!(entry.unwrap()["results"]["voters"], 9, "{list}");
            break;
        }
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(resp.headers().contains_key("retry-after"));
        refused = true;
        assert!(Instant::now() < deadline, "the poll list never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused, "the list never saw the poll missing");
    // The admin's page keeps its sale-day console: the polls say they are coming
    // back instead of failing the page.
    // (A sweep tick may restore the poll between the wipe and the page: then
    // again.)
    let mut restoring = false;
    for _ in 0..5 {
        app.wipe().await;
        let resp = app.browse("/admin", Some(&admin)).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let page = resp.text().await.unwrap();
        if page.contains(r#"data-field="polls-restoring""#) {
            restoring = true;
            break;
        }
        assert!(
            page.contains("Best?"),
            "neither the poll nor the notice: {page}"
        );
    }
    assert!(restoring, "the admin page never saw the poll missing");
    app.wipe().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let resp = app.browse("/polls", None).await;
        if resp.status() == StatusCode::OK {
            let page = resp.text().await.unwrap();
            assert!(page.contains("<strong>9</strong> voters"), "{page}");
            break;
        }
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(Instant::now() < deadline, "the polls page never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_starting_on_a_wiped_redis_rebuilds_every_sale_in_the_background() {
    let app = crate::helpers::spawn_app_with(|c| c.sweep = Duration::ZERO).await;
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 10).await;
    let buyer = app.user().await;
    app.buy(sale, &buyer.token).await;
    assert_eq!(app.wait_for_orders(sale, 1).await.len(), 1);
    app.wipe().await;

    // A new instance (no periodic sweep, no request yet) rebuilds at startup
    // (spawn_sibling waits for its startup sweep; serving does not).
    let sibling = spawn_sibling(&app, |c| c.sweep = Duration::ZERO).await;
    let state = sibling
        .state
        .recovery
        .check_many(&[stampede::recover::Target::Sale(Id::new(sale).unwrap())])
        .await
        .unwrap();
    assert_eq!(state, [stampede::recover::StateCheck::Trusted]);
    assert_eq!(app.stock_left(sale).await, 9);
    assert_eq!(app.buyers(sale).await, vec![buyer.id]);
}

/// The sweep's check tells the three states apart, for several sales in one round
/// trip (on a cluster: keys of several slots): whole and stamped by the running
/// Redis; stamped by another run, or missing its stock key (untrusted); no meta
/// hash at all (not loaded). Nothing is rebuilt by the check itself.
#[tokio::test(flavor = "multi_thread")]
async fn the_sweeps_check_tells_trusted_untrusted_and_missing_state_apart() {
    use stampede::recover::{StateCheck, Target};
    let app = crate::helpers::spawn_app_with(|c| c.sweep = Duration::ZERO).await;
    let admin = app.admin().await;
    let mut sales = Vec::new();
    for _ in 0..4 {
        sales.push(Id::new(app.live_sale(&admin, 10).await).unwrap());
    }
    let targets: Vec<Target> = sales.iter().map(|s| Target::Sale(*s)).collect();
    let recovery = &app.state.recovery;
    assert_eq!(
        recovery.check_many(&targets).await.unwrap(),
        [StateCheck::Trusted; 4]
    );
    let mut redis = app.redis.clone();
    let _: () = redis::cmd("HSET")
        .arg(app.keys.sale(sales[1]).meta)
        .arg("run")
        .arg("0123456789abcdef0123456789abcdef01234567")
        .query_async(&mut redis)
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(app.keys.sale(sales[2]).stock)
        .query_async(&mut redis)
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(app.keys.sale(sales[3]).meta)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(
        recovery.check_many(&targets).await.unwrap(),
        [
            StateCheck::Trusted,
            StateCheck::Untrusted,
            StateCheck::Untrusted,
            StateCheck::NotLoaded
        ]
    );
    assert_eq!(recovery.check_many(&[]).await.unwrap(), []);
}

/// A stock change left pending (its instance died between Postgres and Redis) and
/// applied by the sweep: the cached record goes with it, so the sale's numbers
/// show the units it added at once, not after the record's time to live.
#[tokio::test(flavor = "multi_thread")]
async fn a_pending_change_the_sweep_applies_shows_at_once() {
    let app = crate::helpers::spawn_app_with(|c| c.sweep = Duration::from_millis(200)).await;
    let admin = app.admin().await;
    let sale = app.live_sale(&admin, 10).await;
    app.new_buyers(sale, 2).await;
    let before = app.get_json(&format!("/api/sales/{sale}"), None).await;
    assert_eq!(
        (&before["stock_total"], &before["stock_left"]),
        (&json!(10), &json!(8))
    );
    sqlx::query(
        "INSERT INTO stock_changes (sale_id, kind, amount, admin_id, created_at)
         VALUES ($1, 'add', 5, $2, now() - interval '10 seconds')",
    )
    .bind(sale)
    .bind(admin.id)
    .execute(&app.db)
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while app
        .count("SELECT count(*) FROM stock_changes WHERE status = 'pending'")
        .await
        > 0
    {
        assert!(
            Instant::now() < deadline,
            "the sweep never applied the change"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = app.get_json(&format!("/api/sales/{sale}"), None).await;
    assert_eq!(
        (&after["stock_total"], &after["stock_left"]),
        (&json!(15), &json!(13)),
        "{after}"
    );
}

/// An order accepted and not yet settled when Redis is wiped: its status, payment
/// and cancel answer 503 `recovering` until the sale's rebuild has written it into
/// Postgres (the server kept it), never a final 404 for an order its buyer holds a
/// 202 for; then it is found, and cancels.
#[tokio::test(flavor = "multi_thread")]
async fn an_unsettled_order_wiped_from_redis_is_recovering_never_not_found() {
    let (app, _, sale) =
        crate::helpers::spawn_with_live_sale_and(10, |c| c.settle_in_serve = false).await;
    let user = app.user().await;
    let resp = app.purchase(sale, &user.token).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let body: Value = resp.json().await.unwrap();
    let order = body["order_id"].as_str().unwrap().to_string();
    app.wipe().await;

    let first = app
        .get(&format!("/api/orders/{order}"), Some(&user.token))
        .await;
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(first.headers().contains_key("retry-after"));
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["error"], "recovering", "{first}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let shown = loop {
        let resp = app
            .get(&format!("/api/orders/{order}"), Some(&user.token))
            .await;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        if status != StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(status, StatusCode::OK, "{body}");
            break body;
        }
        assert_eq!(body["error"], "recovering", "{body}");
        assert!(Instant::now() < deadline, "the order never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(shown["status"], "confirmed", "{shown}");
    let cancelled = app
        .post(&format!("/api/orders/{order}/cancel"), Some(&user.token))
        .await;
    assert_eq!(cancelled.status(), StatusCode::OK);
    // An order id of no order on a sound sale stays a 404.
    let unknown = stampede::sale::order_id::new_order_id(Id::new(sale).unwrap());
    assert_eq!(
        app.get(&format!("/api/orders/{unknown}"), Some(&user.token))
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
}
