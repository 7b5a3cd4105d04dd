//! A draw (issue 52) through faults: two servers, entries, and at the draw's time
//! server #0 killed with SIGKILL (before, during or after its attempt at the
//! draw: whichever it was, the invariant is the same), then Redis killed and
//! started again once the draw is made. Afterwards: drawn once (one rank per
//! entry, the first wins at the draw's moment), the winners the seeded order's
//! first, their wins put back in Redis (they buy), nobody else buying.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stampede::sale::draw::order;

use crate::harness::{Options, Stack, User};

const ENTRANTS: usize = 200;
const UNITS: i64 = 5;

/// A GET or POST to the first live server, retried through 503s and dropped
/// connections for up to 20 s: status and JSON body.
async fn ask(
    stack: &Stack,
    post: bool,
    path: &str,
    user: &User,
    body: Option<&Value>,
) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let base = stack.live_base();
        let url = format!("{base}{path}");
        let mut req = if post {
            stack.http.post(url)
        } else {
            stack.http.get(url)
        };
        req = req.bearer_auth(&user.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        if let Ok(resp) = req.send().await {
            let status = resp.status().as_u16();
            let json: Value = resp.json().await.unwrap_or(Value::Null);
            assert!(status < 500 || status == 503, "{path}: {status} {json}");
            if status != 503 {
                return (status, json);
            }
        }
        assert!(Instant::now() < deadline, "{path}: no answer within 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A draw sale of `UNITS` units, entries open since a minute ago, drawn at `draw_at`.
async fn draw_sale(stack: &Stack, draw_at: chrono::DateTime<chrono::Utc>) -> i64 {
    let now = chrono::Utc::now();
    stack
        .create_sale_with(
            UNITS,
            json!({
                "mode": "draw",
                "starts_at": draw_at,
                "draw_at": draw_at,
                "entries_open_at": now - chrono::Duration::seconds(60),
                "claim_window_s": 600,
            }),
        )
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_draw_through_a_server_kill_and_a_redis_restart_is_made_once_with_the_same_winners() {
    let mut stack = Stack::start("draw", Options::servers(2)).await;
    let users = stack.create_users(ENTRANTS, false).await;
    let draw_at = chrono::Utc::now() + chrono::Duration::seconds(8);
    let sale = draw_sale(&stack, draw_at).await;
    let mut entries = Vec::new();
    for u in &users {
        let (status, body) = ask(&stack, true, &format!("/api/sales/{sale}/entry"), u, None).await;
        assert_eq!(status, 200, "{body}");
        entries.push(body["entry_id"].as_i64().unwrap());
    }
    let wait = (draw_at - chrono::Utc::now())
        .to_std()
        .expect("entered before the draw");
    tokio::time::sleep(wait).await;
    stack.servers[0].kill9();

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let drawn: bool =
            sqlx::query_scalar("SELECT drawn_at IS NOT NULL FROM sale_draws WHERE sale_id = $1")
                .bind(sale)
                .fetch_one(&stack.db)
                .await
                .unwrap();
        if drawn {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not drawn within 20 s of its time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stack.redis.kill9();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stack.start_redis().await;
    stack.restart_server(0).await;

    // Drawn once: every entry one rank, the first UNITS won at the draw's moment.
    let (ranked, distinct, at_draw): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(DISTINCT entry_id) FROM draw_order WHERE sale_id = $1),
                (SELECT count(DISTINCT rank) FROM draw_order WHERE sale_id = $1),
                count(*) FILTER (WHERE won_at = (SELECT drawn_at FROM sale_draws WHERE sale_id = $1))
         FROM draw_entries WHERE sale_id = $1",
    )
    .bind(sale)
    .fetch_one(&stack.db)
    .await
    .unwrap();
    assert_eq!(
        (ranked, distinct, at_draw),
        (ENTRANTS as i64, ENTRANTS as i64, UNITS)
    );
    let (_, published) = ask(
        &stack,
        false,
        &format!("/api/sales/{sale}/draw"),
        &users[0],
        None,
    )
    .await;
    let seed = order::unhex(published["seed"].as_str().unwrap()).unwrap();
    let ordered = order::order(&seed, &entries);
    let winners: Vec<i64> = published["winners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["entry_id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        winners,
        ordered[..UNITS as usize].to_vec(),
        "the seeded order's first"
    );

    // The wins came back with Redis: each winner buys; nobody else does.
    let user_of = |entry: i64| &users[entries.iter().position(|&e| e == entry).unwrap()];
    for &entry in &ordered[..UNITS as usize] {
        let user = user_of(entry);
        let (_, me) = ask(
            &stack,
            false,
            &format!("/api/sales/{sale}/entry/me"),
            user,
            None,
        )
        .await;
        assert_eq!(me["state"], "won", "{me}");
        let body = json!({ "ticket": me["ticket"] });
        let (status, answer) = ask(
            &stack,
            true,
            &format!("/api/sales/{sale}/purchase"),
            user,
            Some(&body),
        )
        .await;
        assert_eq!(status, 202, "{answer}");
    }
    for &entry in &ordered[UNITS as usize..UNITS as usize + 10] {
        let (status, answer) = ask(
            &stack,
            true,
            &format!("/api/sales/{sale}/purchase"),
            user_of(entry),
            None,
        )
        .await;
        assert_eq!((status, answer["error"].as_str()), (403, Some("not_drawn")));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let buyers: Vec<i64> =
            sqlx::query_scalar("SELECT user_id FROM orders WHERE sale_id = $1 ORDER BY user_id")
                .bind(sale)
                .fetch_all(&stack.db)
                .await
                .unwrap();
        if buyers.len() as i64 >= UNITS {
            let mut want: Vec<i64> = ordered[..UNITS as usize]
                .iter()
                .map(|&e| user_of(e).id)
                .collect();
            want.sort_unstable();
            assert_eq!(buyers, want, "the winners, each once, nobody else");
            break;
        }
        assert!(Instant::now() < deadline, "orders not settled within 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One entry POST to server `server`: status, `Retry-After` and JSON body.
async fn post_entry(
    stack: &Stack,
    server: usize,
    sale: i64,
    user: &User,
) -> (u16, Option<String>, Value) {
    let url = format!("{}/api/sales/{sale}/entry", stack.bases()[server]);
    let resp = stack
        .http
        .post(url)
        .bearer_auth(&user.token)
        .send()
        .await
        .expect("an answer");
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry, resp.json().await.unwrap_or(Value::Null))
}

/// Entries are written in batches (one Postgres transaction for the entries of a
/// sale that arrive together). Every entrant enters twice at once, once through
/// each of two servers: one entry each, both answers naming it. Then Postgres
/// is stopped: entries, old and new, answer 503 `database_unavailable` with
/// `Retry-After` (no 500, nothing written), and once it is back every one
/// enters, the old entrants with the entries they had.
#[tokio::test(flavor = "multi_thread")]
async fn entries_sent_together_through_two_servers_and_a_stopped_postgres_are_one_per_account() {
    use crate::harness::PgStop;
    use futures_util::future::join_all;
    const TOGETHER: usize = 120;
    const LATE: usize = 30;
    let mut stack = Stack::start("draw-entries", Options::servers(2)).await;
    let users = stack.create_users(TOGETHER + LATE, false).await;
    let sale = draw_sale(&stack, chrono::Utc::now() + chrono::Duration::seconds(3600)).await;
    let (early, late) = users.split_at(TOGETHER);
    let answers = join_all(
        early
            .iter()
            .flat_map(|u| [(0, u), (1, u)])
            .map(|(server, u)| post_entry(&stack, server, sale, u)),
    )
    .await;
    let mut ids = Vec::new();
    for (pair, u) in answers.chunks(2).zip(early) {
        let [(s0, _, a0), (s1, _, a1)] = pair else {
            unreachable!()
        };
        assert_eq!((*s0, *s1), (200, 200), "user {}: {a0} {a1}", u.id);
        assert_eq!(a0["entry_id"], a1["entry_id"], "user {}: one entry", u.id);
        ids.push(a0["entry_id"].as_i64().unwrap());
    }
    let count = |db: sqlx::PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM draw_entries WHERE sale_id = $1")
            .bind(sale)
            .fetch_one(&db)
            .await
            .unwrap()
    };
    assert_eq!(
        count(stack.db.clone()).await,
        TOGETHER as i64,
        "one row per account"
    );

    stack.pg.stop(PgStop::Fast);
    let asked: Vec<&User> = early[..LATE].iter().chain(late).collect();
    let answers = join_all(
        asked
            .iter()
            .enumerate()
            .map(|(i, u)| post_entry(&stack, i % 2, sale, u)),
    )
    .await;
    for (status, retry, body) in &answers {
        assert_eq!(
            (*status, body["error"].as_str()),
            (503, Some("database_unavailable")),
            "{body}"
        );
        assert!(retry.is_some(), "a 503 says when to come back: {body}");
    }
    stack.pg.start();
    for (i, u) in asked.iter().enumerate() {
        let (status, body) = ask(&stack, true, &format!("/api/sales/{sale}/entry"), u, None).await;
        assert_eq!(status, 200, "{body}");
        if i < LATE {
            assert_eq!(
                body["entry_id"].as_i64(),
                Some(ids[i]),
                "the entry made before"
            );
        }
    }
    assert_eq!(
        count(stack.db.clone()).await,
        (TOGETHER + LATE) as i64,
        "one row per account, none while Postgres was down"
    );
}
