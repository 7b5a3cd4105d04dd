//! The waiting room (issue 29) under faults: a line of a few hundred shoppers,
//! admitted at a pace while they buy, and in the middle of the admissions a server
//! killed with SIGKILL and restarted, Redis (AOF, `appendfsync always`) killed and
//! restarted, Redis wiped, or Postgres stopped for a moment. Afterwards: places
//! kept, nobody admitted twice (the `queue_admissions` key, and Redis's admissions
//! equal to Postgres's), no unit sold without an admission, and the purchase
//! invariants of every scenario (`invariants.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reqwest::Client;
use serde_json::{Value, json};
use stampede::domain::Id;
use stampede::keys::SaleKeys;

use crate::harness::{Db, Fsync, Options, PgStop, Stack, User, connect_within_a_second};
use crate::invariants::{Allowed, AllowedLoss, CUT_AT_A_KILL, assert_invariants};
use crate::storm::{Op, Outcome, Record};

/// An admission's life (`STAMPEDE_QUEUE_ADMISSION_MS`).
const LIFE_MS: i64 = 2000;
const RATE: i64 = 40;
const UNITS: i64 = 120;
const EARLY: usize = 300;
const LATE: usize = 100;

/// An account that lets its admission pass.
fn skips(user: i64) -> bool {
    user % 7 == 0
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// SIGKILL of server #0 (of two), restarted a second later.
    KillServer,
    /// SIGKILL of Redis, started again (same AOF) a second later.
    RestartRedis,
    /// `FLUSHALL`.
    WipeRedis,
    /// Postgres stopped (fast) for seven seconds.
    StopPostgres,
}

/// What the shoppers need, cloned into their tasks (the stack itself is changed by
/// the fault meanwhile).
#[derive(Clone)]
struct Shop {
    http: Client,
    bases: Vec<String>,
    redis_url: String,
    k: SaleKeys,
    sale: i64,
}

/// One HTTP attempt: when sent and answered, and what came back (the JSON body too).
async fn attempt(
    shop: &Shop,
    server: usize,
    post: bool,
    path: &str,
    token: &str,
    body: Option<&Value>,
) -> (Instant, Instant, Outcome, Value) {
    let url = format!("{}{path}", shop.bases[server % shop.bases.len()]);
    let mut req = if post {
        shop.http.post(url)
    } else {
        shop.http.get(url)
    };
    req = req.bearer_auth(token);
    if let Some(b) = body {
        req = req.json(b);
    }
    let sent = Instant::now();
    let (outcome, json) = Outcome::of(req.send().await).await;
    (sent, Instant::now(), outcome, json)
}

/// Worth another try: no answer, 503, or 408 (never read).
fn again(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::NoAnswer(_)
            | Outcome::Answer {
                status: 408 | 503,
                ..
            }
    )
}

/// A join's answer: the user, the status and error code, and when the attempt
/// that got it was sent. (Its send time, not its answer's: a join sent before a
/// wipe may run before it and be answered after it, and the wipe may take it: only
/// a join sent after the wipe must keep its place.)
struct Joined {
    user: i64,
    status: u16,
    code: Option<String>,
    sent: Instant,
}

/// A join, tried (on the servers in turn) until answered.
async fn join(shop: Shop, user: User, first: usize) -> Joined {
    let path = format!("/api/sales/{}/queue", shop.sale);
    for i in 0..100 {
        let (sent, _, outcome, body) =
            attempt(&shop, first + i, true, &path, &user.token, None).await;
        if again(&outcome) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let Outcome::Answer { status, code, .. } = outcome else {
            unreachable!()
        };
        assert!(status < 500, "join of user {}: {status} {body}", user.id);
        return Joined {
            user: user.id,
            status,
            code,
            sent,
        };
    }
    panic!("user {}'s join never answered", user.id);
}

/// The joins that got a place (200): user -> when sent.
fn placed(joins: &[Joined]) -> HashMap<i64, Instant> {
    joins
        .iter()
        .filter(|j| j.status == 200)
        .map(|j| (j.user, j.sent))
        .collect()
}

/// The late joiners: one every `gap`, or all at once (16 at a time).
async fn late_joins(shop: Shop, users: Vec<User>, gap: Option<Duration>) -> Vec<Joined> {
    match gap {
        Some(gap) => {
            let mut got = Vec::new();
            for (i, u) in users.into_iter().enumerate() {
                got.push(join(shop.clone(), u, i).await);
                tokio::time::sleep(gap).await;
            }
            got
        }
        None => {
            use futures_util::stream::{self, StreamExt};
            stream::iter(
                users
                    .into_iter()
                    .enumerate()
                    .map(|(i, u)| join(shop.clone(), u, i)),
            )
            .buffer_unordered(16)
            .collect()
            .await
        }
    }
}

/// Every late join is answered 200 (a place) or 410 `sold_out` (the line closes
/// when the units are gone), and some get their place. Returns the failures.
fn check_late_joins(late: &[Joined]) -> Vec<String> {
    let mut failures = Vec::new();
    let refused: Vec<String> = late
        .iter()
        .filter(|j| j.status != 200 && !(j.status == 410 && j.code.as_deref() == Some("sold_out")))
        .take(10)
        .map(|j| format!("user {}: {} {:?}", j.user, j.status, j.code))
        .collect();
    if !refused.is_empty() {
        failures.push(format!(
            "late joins answered neither 200 nor 410 sold_out: {}",
            refused.join("; ")
        ));
    }
    let got = late.iter().filter(|j| j.status == 200).count();
    println!(
        "late joins: {got} of {} got a place, {} were refused as sold out",
        late.len(),
        late.len() - got
    );
    if late.len() != LATE {
        failures.push(format!("{} late joins answered, {LATE} sent", late.len()));
    }
    if got == 0 {
        failures.push("no late joiner got a place".into());
    }
    failures
}

/// An admitted shopper: its ticket from queue/me, then the purchase, each tried
/// until answered. Every purchase attempt is a record.
async fn buy(shop: Shop, user: User, first: usize) -> Vec<Record> {
    let me = format!("/api/sales/{}/queue/me", shop.sale);
    let purchase = format!("/api/sales/{}/purchase", shop.sale);
    let mut records = Vec::new();
    for i in 0..100 {
        let server = first + i;
        let (_, _, outcome, standing) = attempt(&shop, server, false, &me, &user.token, None).await;
        if again(&outcome) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        if standing["state"] != "admitted" {
            // Bought (an answer we did not hear), or its admission ran out meanwhile.
            return records;
        }
        let body = json!({ "ticket": standing["ticket"] });
        let (sent, answered, outcome, _) =
            attempt(&shop, server, true, &purchase, &user.token, Some(&body)).await;
        let retry = again(&outcome);
        records.push(Record {
            user: user.id,
            op: Op::Purchase { sale: shop.sale },
            keyed: false,
            server: server % shop.bases.len(),
            attempt: i as u32,
            sent,
            answered,
            outcome,
        });
        if !retry {
            return records;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    records
}

/// Reads the open admissions and the units left (`None` while Redis cannot tell).
async fn open_and_left(shop: &Shop) -> Option<(Vec<i64>, Option<i64>)> {
    let mut conn = connect_within_a_second(&shop.redis_url).await?;
    tokio::time::timeout(
        Duration::from_secs(1),
        redis::pipe()
            .atomic()
            .zrange(&shop.k.queue_open, 0, -1)
            .get(&shop.k.stock)
            .query_async(&mut conn),
    )
    .await
    .ok()?
    .ok()
}

/// Shoppers: every admitted account that does not skip buys at once, until the sale
/// is sold out (or `stop`). Returns the purchase records.
async fn shoppers(
    shop: Shop,
    users: Arc<HashMap<i64, User>>,
    stop: Arc<AtomicBool>,
) -> Vec<Record> {
    let mut seen = HashSet::new();
    let mut buys = tokio::task::JoinSet::new();
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        if let Some((open, left)) = open_and_left(&shop).await {
            for u in open {
                if seen.insert(u) && !skips(u) {
                    n += 1;
                    buys.spawn(buy(shop.clone(), users[&u].clone(), n));
                }
            }
            if left == Some(0) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    buys.join_all().await.into_iter().flatten().collect()
}

async fn admin_open(stack: &Stack, sale: i64) {
    let resp = stack
        .http
        .post(format!("{}/api/admin/sales/{sale}/open", stack.live_base()))
        .bearer_auth(&stack.admin.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
}

async fn places_in_db(stack: &Stack, sale: i64) -> HashMap<i64, i64> {
    let rows: Vec<(i64, f64)> = stack
        .rows(
            "SELECT user_id, place FROM queue_places WHERE sale_id = $1",
            sale,
        )
        .await;
    rows.into_iter().map(|(u, p)| (u, p as i64)).collect()
}

async fn admissions_in_db(stack: &Stack, sale: i64) -> HashMap<i64, i64> {
    let rows: Vec<(i64, i64)> = stack
        .rows(
            "SELECT user_id, round(extract(epoch FROM expires_at) * 1000)::bigint
         FROM queue_admissions WHERE sale_id = $1",
            sale,
        )
        .await;
    rows.into_iter().collect()
}

async fn line_in_redis(stack: &Stack, k: &SaleKeys) -> HashMap<i64, i64> {
    let raw: Vec<(i64, f64)> = redis::cmd("ZRANGE")
        .arg(&k.queue)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut stack.redis().await)
        .await
        .unwrap();
    raw.into_iter().map(|(u, p)| (u, p as i64)).collect()
}

/// Waits until no admission is open (each one used or run out) and every join and
/// admission is copied to Postgres (both streams drained), polling, and fails the
/// test when that has not happened within 20 s, saying what it saw.
async fn wait_for_line_at_rest(stack: &Stack, k: &SaleKeys) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (open, joins, admits): (i64, i64, i64) = redis::pipe()
            .zcard(&k.queue_open)
            .xlen(&k.queue_joins)
            .xlen(&k.queue_admits)
            .query_async(&mut stack.redis().await)
            .await
            .unwrap();
        if open == 0 && joins == 0 && admits == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the line did not come to rest in 20 s: {open} admissions open, {joins} joins \
             and {admits} admissions not copied to Postgres"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How long after a fault its effects may still keep an admitted shopper from
/// buying (a server's reconnection to Redis, a restarted server's start).
const RECOVERY_MS: i64 = 2000;

/// The admissions (user -> expiry ms) as (admitted at ms, user), in the order given;
/// split at a wipe (`wipe_ms`): the wipe takes the line's head and the pace's state,
/// so each side is checked alone.
fn admission_runs(admissions: &HashMap<i64, i64>, wipe_ms: Option<i64>) -> Vec<Vec<(i64, i64)>> {
    let mut all: Vec<(i64, i64)> = admissions.iter().map(|(u, e)| (e - LIFE_MS, *u)).collect();
    all.sort_unstable();
    match wipe_ms {
        None => vec![all],
        Some(w) => {
            let (before, after): (Vec<_>, Vec<_>) = all.into_iter().partition(|(t, _)| *t < w);
            vec![before, after]
        }
    }
}

/// Line order: an admission given in a later step than another has a later place
/// (the admitter takes the line from its head; ties share a step's instant). A
/// shopper admitted without a place is a failure too, except across a wipe (a
/// place not yet copied to Postgres is gone with it).
fn check_admission_order(
    admissions: &HashMap<i64, i64>,
    places: &HashMap<i64, i64>,
    wipe_ms: Option<i64>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for run in admission_runs(admissions, wipe_ms) {
        // Highest place of the earlier steps, and of the current step.
        let (mut earlier, mut this_step, mut step_at) = (i64::MIN, i64::MIN, i64::MIN);
        for (t, u) in run {
            let Some(&p) = places.get(&u) else {
                if wipe_ms.is_none() {
                    failures.push(format!("user {u} was admitted and has no place"));
                }
                continue;
            };
            if t != step_at {
                earlier = earlier.max(this_step);
                step_at = t;
            }
            if p <= earlier {
                failures.push(format!(
                    "user {u} (place {p}) admitted at {t} ms, after a later place ({earlier}): out of line order"
                ));
            }
            this_step = this_step.max(p);
        }
    }
    failures.truncate(10);
    failures
}

/// The pace: in any span of admissions from t1 to t2 (ms), at most
/// RATE + RATE * (t2 - t1) / 1000 (the admitter's credit holds one second's worth
/// at most and grows at RATE a second: `lua/queue_admit.lua`), plus one for the
/// millisecond rounding of the expiry in Postgres. A correctness bound, not a
/// speed one: the Redis clock paces the script, whatever the machine's load.
fn check_admission_pace(admissions: &HashMap<i64, i64>, wipe_ms: Option<i64>) -> Vec<String> {
    let mut failures = Vec::new();
    for run in admission_runs(admissions, wipe_ms) {
        for j in 0..run.len() {
            for i in 0..=j {
                let (n, span) = ((j - i + 1) as i64, run[j].0 - run[i].0);
                let most = RATE + RATE * span / 1000 + 1;
                if n > most {
                    failures.push(format!(
                        "{n} admissions within {span} ms, more than {most} at {RATE} a second"
                    ));
                    break;
                }
            }
        }
    }
    failures.truncate(10);
    failures
}

async fn scenario(name: &str, fault: Fault) {
    let started = Instant::now();
    let mut stack = Stack::start(
        name,
        Options {
            servers: 2,
            fsync: Fsync::Always,
            extra: vec![("STAMPEDE_QUEUE_ADMISSION_MS", "2000")],
            ..Options::default()
        },
    )
    .await;
    let users = stack.create_users(EARLY + LATE, false).await;
    let now = chrono::Utc::now();
    let sale = stack
        .create_sale_with(
            UNITS,
            json!({
                "starts_at": now + chrono::Duration::seconds(1800),
                "waiting_room": true,
                "queue_opens_at": now - chrono::Duration::seconds(5),
                "admit_per_second": RATE,
            }),
        )
        .await;
    let k = stack.keys.sale(Id::new(sale).unwrap());
    let shop = Shop {
        http: stack.http.clone(),
        bases: stack.bases(),
        redis_url: stack.redis.url(),
        k: k.clone(),
        sale,
    };
    let by_id: Arc<HashMap<i64, User>> =
        Arc::new(users.iter().map(|u| (u.id, u.clone())).collect());

    // The early joiners, then the opening.
    let early: Vec<Joined> = futures_util::future::join_all(
        users[..EARLY]
            .iter()
            .enumerate()
            .map(|(i, u)| join(shop.clone(), u.clone(), i)),
    )
    .await;
    let mut joined = placed(&early);
    assert_eq!(joined.len(), EARLY, "every early joiner got a place");
    admin_open(&stack, sale).await;
    let opened = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let shopping = tokio::spawn(shoppers(shop.clone(), by_id.clone(), stop.clone()));

    // Admissions run; the late joiners come while the fault happens (one every
    // 20 ms), or, before Postgres stops, all at once: while it is down nobody
    // joins, so the admitter has no join to copy and goes on admitting.
    // (A server lists the active waiting rooms every 2 s: the first admissions
    // may take that long.)
    let deadline = Instant::now() + Duration::from_secs(15);
    while admissions_in_db(&stack, sale).await.len() < 40 {
        assert!(
            Instant::now() < deadline,
            "admissions had not begun after 15 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gap = match fault {
        Fault::StopPostgres => None,
        _ => Some(Duration::from_millis(20)),
    };
    let mut late = Some(tokio::spawn(late_joins(
        shop.clone(),
        users[EARLY..].to_vec(),
        gap,
    )));
    let mut late_answers = None;
    if gap.is_none() {
        let answers = late.take().unwrap().await.unwrap();
        joined.extend(placed(&answers));
        late_answers = Some(answers);
        // ... and every join is copied already.
        let deadline = Instant::now() + Duration::from_secs(10);
        while places_in_db(&stack, sale).await.len() < joined.len() {
            assert!(Instant::now() < deadline, "joins not copied in 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let admitted_before = admissions_in_db(&stack, sale).await;
    let copied_before = places_in_db(&stack, sale).await;
    let fault_at = Instant::now();
    let fault_ms = chrono::Utc::now().timestamp_millis();
    println!(
        "{fault:?} at {:.1?} after the opening: {} admitted, {} places copied",
        opened.elapsed(),
        admitted_before.len(),
        copied_before.len()
    );
    assert!(!admitted_before.is_empty(), "admissions had begun");
    let loss = AllowedLoss::None;
    let mut allowed = Allowed::from(loss);
    let mut wiped = None;
    match fault {
        Fault::KillServer => {
            // Connections server #0 refuses while down are the kill's.
            allowed = loss.with_kills(&[0], CUT_AT_A_KILL);
            stack.servers[0].kill9();
            tokio::time::sleep(Duration::from_secs(1)).await;
            stack.restart_server(0).await;
        }
        Fault::RestartRedis => {
            stack.redis.kill9();
            tokio::time::sleep(Duration::from_secs(1)).await;
            stack.start_redis().await;
        }
        Fault::WipeRedis => {
            // A wipe loses no 202: the servers keep what they accepted until it is
            // settled, and the rebuild asks them for it (docs/operations.md,
            // "What a 202 means"), so `loss` stays `None`.
            stack.flushall().await;
            wiped = Some(Instant::now());
        }
        Fault::StopPostgres => {
            stack.pg.stop(PgStop::Fast);
            // Longer than the background pool's 5 s wait for a connection: the
            // admitter's listing of sales gives up, and it steps the sales it knows.
            tokio::time::sleep(Duration::from_secs(7)).await;
            stack.pg.start();
        }
    }
    println!("fault over at {:.1?}", fault_at.elapsed());
    let over_ms = chrono::Utc::now().timestamp_millis();
    if let Some(late) = late {
        let answers = late.await.unwrap();
        joined.extend(placed(&answers));
        late_answers = Some(answers);
    }
    let late_answers = late_answers.expect("the late joins ended");

    // Until sold out (bounded).
    let sell_out = tokio::time::timeout(Duration::from_secs(40), async {
        loop {
            if let Some((_, Some(0))) = open_and_left(&shop).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let records = shopping.await.unwrap();
    println!(
        "sold out: {} ({:.1?} after the opening), {} purchase attempts, {:.1?} in all",
        sell_out.is_ok(),
        opened.elapsed(),
        records.len(),
        started.elapsed()
    );
    assert!(sell_out.is_ok(), "the sale sells out after the fault");

    // The purchase invariants: every 202 in Postgres once, no oversell, units
    // arithmetic exact in both stores, no 5xx.
    assert_invariants(&stack, &records, &[sale], &[], allowed).await;
    // Admissions running out pass; the copy of joins catches up.
    wait_for_line_at_rest(&stack, &k).await;

    let mut failures: Vec<String> = check_late_joins(&late_answers);
    // Places kept.
    let line = line_in_redis(&stack, &k).await;
    let copied = places_in_db(&stack, sale).await;
    match fault {
        Fault::WipeRedis => {
            // A join sent after the wipe keeps its place; one before it, if it
            // was copied to Postgres before the wipe.
            let wiped = wiped.unwrap();
            for (u, at) in &joined {
                if *at > wiped && !line.contains_key(u) {
                    failures.push(format!(
                        "user {u} joined (200, sent after the wipe) and is not in the line"
                    ));
                }
            }
            for (u, p) in &copied_before {
                if line.get(u) != Some(p) {
                    failures.push(format!(
                        "user {u}'s place {p} (in queue_places before the wipe) is {:?} after it",
                        line.get(u)
                    ));
                }
            }
        }
        _ => {
            for u in joined.keys() {
                if !line.contains_key(u) {
                    failures.push(format!("user {u} got a place (200) and is not in the line"));
                }
            }
            if line.len() != joined.len() {
                failures.push(format!("{} in line, {} joined", line.len(), joined.len()));
            }
        }
    }
    for (u, p) in &copied {
        if line.get(u) != Some(p) {
            failures.push(format!(
                "user {u}: place {p} in Postgres, {:?} in Redis",
                line.get(u)
            ));
        }
    }
    if copied.len() != line.len() {
        failures.push(format!(
            "{} places in Postgres, {} in Redis",
            copied.len(),
            line.len()
        ));
    }

    // Nobody admitted twice: Redis's admissions (user -> expiry) are Postgres's,
    // and every admission given before the fault is there as given.
    let admissions = admissions_in_db(&stack, sale).await;
    let in_redis: HashMap<i64, i64> = redis::cmd("HGETALL")
        .arg(&k.queue_admitted)
        .query_async(&mut stack.redis().await)
        .await
        .unwrap();
    if in_redis != admissions {
        let unwritten: i64 = redis::cmd("XLEN")
            .arg(&k.queue_admits)
            .query_async(&mut stack.redis().await)
            .await
            .unwrap();
        failures.push(format!(
            "{unwritten} admissions still in the stream to Postgres"
        ));
        let only_redis: Vec<_> = in_redis
            .iter()
            .filter(|(u, e)| admissions.get(u) != Some(e))
            .take(10)
            .collect();
        let only_pg: Vec<_> = admissions
            .iter()
            .filter(|(u, e)| in_redis.get(u) != Some(e))
            .take(10)
            .collect();
        failures.push(format!(
            "admissions differ: {} in Redis, {} in Postgres; Redis only/other {only_redis:?}; Postgres only/other {only_pg:?}",
            in_redis.len(),
            admissions.len()
        ));
    }
    for (u, e) in &admitted_before {
        if admissions.get(u) != Some(e) {
            failures.push(format!(
                "user {u} admitted until {e} before the fault, now {:?}",
                admissions.get(u)
            ));
        }
    }
    // No unit sold without an admission.
    let buyers: Vec<i64> = stack
        .scalars("SELECT user_id FROM orders WHERE sale_id = $1", sale)
        .await;
    let unadmitted: Vec<i64> = buyers
        .iter()
        .copied()
        .filter(|u| !admissions.contains_key(u))
        .collect();
    if !unadmitted.is_empty() {
        failures.push(format!("orders of users never admitted: {unadmitted:?}"));
    }
    // Only those who skip let an admission pass unused... unless its holder's
    // purchase was in flight when the fault came (then it may have run out): an
    // admission whose life met the fault, or the recovery after it.
    let bought: HashSet<i64> = buyers.iter().copied().collect();
    let mut idle: Vec<(i64, i64)> = admissions
        .iter()
        .filter(|(u, _)| !bought.contains(u) && !skips(**u))
        .map(|(u, e)| (*u, *e))
        .collect();
    idle.sort_unstable_by_key(|&(_, e)| e);
    let (from, to) = (fault_ms, over_ms + RECOVERY_MS);
    let unexplained: Vec<String> = idle
        .iter()
        .filter(|&&(_, e)| e < from || e - LIFE_MS > to)
        .map(|(u, e)| {
            format!(
                "user {u} admitted {} ms after the fault began",
                e - LIFE_MS - from
            )
        })
        .collect();
    println!(
        "line {}, {} admitted, {} orders, admitted and not buying though not skipping: {idle:?} \
         ({} of them with an admission that did not meet the fault)",
        line.len(),
        admissions.len(),
        buyers.len(),
        unexplained.len()
    );
    if !unexplained.is_empty() {
        failures.push(format!(
            "admitted shoppers who do not skip let their admission pass, away from the fault: {}",
            unexplained.join("; ")
        ));
    }
    // Admitted in line order, never faster than the pace.
    let places: HashMap<i64, i64> = copied
        .iter()
        .chain(line.iter())
        .map(|(u, p)| (*u, *p))
        .collect();
    let wipe_ms = wiped.map(|_| fault_ms);
    failures.extend(check_admission_order(&admissions, &places, wipe_ms));
    failures.extend(check_admission_pace(&admissions, wipe_ms));
    assert!(
        failures.is_empty(),
        "{} waiting-room invariant(s) broken:\n- {}",
        failures.len(),
        failures.join("\n- ")
    );
}

scenario_tests! {
    waiting_room_keeps_places_and_admissions_when_a_server_is_killed_mid_admission =>
        scenario("wr-kill", Fault::KillServer);
    waiting_room_keeps_places_and_admissions_when_redis_restarts_mid_admission =>
        scenario("wr-redis-restart", Fault::RestartRedis);
    waiting_room_comes_back_from_postgres_after_a_redis_wipe_mid_admission =>
        scenario("wr-wipe", Fault::WipeRedis);
    waiting_room_records_every_admission_when_postgres_stops_mid_admission =>
        scenario("wr-pg-stop", Fault::StopPostgres);
}
