//! The invariants every fault scenario ends with, in one function:
//! [`assert_invariants`]. It first waits for settlement to finish, then checks the
//! client's records against both stores and panics with every broken invariant.
//! Polls of ballot kinds (`Op::Ballot`) are checked by `ballot_invariants.rs`,
//! with the helpers made `pub(crate)` here.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::Value;
use uuid::Uuid;

use crate::ballot_invariants::{Held, Kind, parse_held, receipt_of};
use crate::harness::Stack;
use crate::storm::{self, Op, Outcome, Record, Work};

/// Which accepted answers a scenario may lose, by design of the fault.
#[derive(Clone, Copy, Debug)]
pub enum AllowedLoss {
    /// Every 202 reaches Postgres: what every scenario whose servers run through
    /// the fault must keep, a Redis wipe included (the servers keep what they
    /// accepted until it is settled, docs/operations.md, "What a 202 means").
    None,
    /// Redis lost the writes it made from `from` until it died at `to`: only 202s
    /// of the sales in `sales` (ids as bits: bit N for sale N) answered after
    /// `from` and sent before `to` may be lost. The AOF cut back to its size at
    /// `from` and Redis killed at `to` (`everysec` losing its last second; see
    /// [`AllowedLoss::answered_within`]), or a primary whose replica had every
    /// write up to `from` (and was stopped just after) dying at `to`, the replica
    /// taking over, its shard's sales in `sales`. A 202 sent after `to` (answered
    /// by the Redis that came back) is never forgiven.
    AnsweredWithin {
        from: Instant,
        to: Instant,
        sales: u64,
    },
}

impl AllowedLoss {
    /// [`AllowedLoss::AnsweredWithin`] `from` and `to`, for every sale of `sales`
    /// (ids below 64).
    pub fn answered_within(from: Instant, to: Instant, sales: &[i64]) -> AllowedLoss {
        let sales = sales.iter().fold(0u64, |bits, &s| {
            assert!((0..64).contains(&s), "sale id {s} does not fit the bits");
            bits | 1 << s
        });
        AllowedLoss::AnsweredWithin { from, to, sales }
    }

    pub(crate) fn allows(&self, r: &Record) -> bool {
        match *self {
            AllowedLoss::None => false,
            // Decided by a Redis that died at `to` (so sent before it) after the
            // last write it kept, at `from` (so answered after it). The answer of a
            // decision made just before the kill may reach the client after.
            AllowedLoss::AnsweredWithin { from, to, sales } => {
                r.answered >= from
                    && r.sent <= to
                    && r.sale()
                        .is_some_and(|s| (0..64).contains(&s) && sales & (1 << s) != 0)
            }
        }
    }
}

/// What a scenario's fault may leave behind, by design: the accepted answers it may
/// lose, and how many requests may go unanswered. Unanswered requests (timed out,
/// reset, body cut off, connection refused) are counted, printed and bounded: a
/// server that hangs or drops connections fails "every request answered". The
/// bound is 0 by default. A scenario that kills servers names them and its bound:
/// connections refused by a killed server (nothing listening: the kill itself, and
/// the storm goes on to the next server) are printed but not counted; the bound is
/// for the rest, the requests in flight at the kill.
#[derive(Clone, Copy, Debug)]
pub struct Allowed {
    pub loss: AllowedLoss,
    /// Attempts without an answer, at most (not counting those refused by a
    /// killed server).
    pub unanswered: usize,
    /// Servers the scenario killed, as bits (bit N for server #N).
    pub killed: u64,
}

impl From<AllowedLoss> for Allowed {
    fn from(loss: AllowedLoss) -> Allowed {
        Allowed {
            loss,
            unanswered: 0,
            killed: 0,
        }
    }
}

impl AllowedLoss {
    /// This loss, with servers `killed` by the scenario: connections they refused
    /// are not counted, and up to `unanswered` other attempts may go unanswered.
    pub fn with_kills(self, killed: &[usize], unanswered: usize) -> Allowed {
        Allowed {
            loss: self,
            unanswered,
            killed: killed.iter().fold(0, |bits, i| bits | 1 << i),
        }
    }
}

/// Attempts that may go unanswered when a server is killed mid-storm: those in
/// flight on it at the kill (cut off or reset). A few at the storms' rates (0 or 1
/// measured); the bound leaves room for a loaded machine's slower answers, and is
/// far below what a server that hangs after the fault would leave (every request
/// for 15 s, the client's timeout).
pub const CUT_AT_A_KILL: usize = 32;

/// What the check found besides failures.
#[derive(Debug, Default)]
pub struct Report {
    /// Accepted (202) requests that never reached Postgres, all allowed.
    pub lost: Vec<Record>,
    /// Requests without an answer (within the scenario's bound).
    pub unanswered: usize,
    pub settled_in: Duration,
}

/// Waits until every 202 of `records` is in Postgres, nothing is left pending in
/// Redis and no stock change is left pending (or nothing has been left for 3 s
/// while something is still missing, or 60 s passed), then asserts:
///
/// 1. every 202 purchase's order id is in Postgres `orders`, for its sale and
///    user (unless `loss` allows losing it); every 202 vote is in `votes`, its
///    receipt naming its row;
/// 2. no user got two 202s for one sale or poll (not counting an allowed loss,
///    nor the 202 of an order that expired on a sale whose expired buyers may
///    buy again), Postgres has at most one live (not expired) order per (sale,
///    user) and one row of `votes` per (poll, user) where the poll allows no
///    change, and every order and every voter's row in Postgres was answered
///    202 or was an ambiguous attempt (no answer, 503); on a sale of one per
///    customer, the buyer of such an order was told of it by their last decided
///    answer after that attempt, if any (409 `already_bought` naming it, see
///    [`check_untold_orders`]);
/// 3. per sale: Postgres orders <= `stock_total`; Redis units left + buyers ==
///    `stock_total`; the Redis buyers hash equals the Postgres buyers (the users of
///    its orders; on a sale with `rebuy_after_expiry`, of its orders not expired:
///    those buyers left the set with their unit); the
///    reconcile endpoint says `consistent: true`. Per poll: the Redis tally equals
///    the per-option counts of every row of `votes` and `store::settled_tallies`,
///    and the Redis voters hash holds each voter's last row;
/// 4. no 5xx but 503, every 503 has `Retry-After` and a JSON error code, and
///    every answer is one the endpoint documents (or a 408 for a request the
///    server never read, which the storm sends again);
/// 5. every request answered: attempts without an answer (timeouts, refused or
///    reset connections) are counted by kind, printed, and at most
///    `allowed.unanswered` (0 unless the scenario says otherwise), not counting
///    connections refused by a server the scenario killed.
///
/// `allowed` is an [`AllowedLoss`] (no request left unanswered) or an [`Allowed`].
pub async fn assert_invariants(
    stack: &Stack,
    records: &[Record],
    sales: &[i64],
    polls: &[i64],
    allowed: impl Into<Allowed>,
) -> Report {
    let settled_in = wait_settled(stack, records, sales, polls).await;
    let (loss, mut failures, mut report) = check_every_answer(records, settled_in, allowed.into());

    check_orders(stack, records, sales, loss, &mut failures, &mut report).await;
    for &sale in sales {
        check_sale_stores(stack, sale, &mut failures).await;
    }
    for &poll in polls {
        check_poll(stack, records, poll, loss, &mut failures, &mut report).await;
    }

    let (r, s, p) = (records.len(), sales.len(), polls.len());
    panic_on_failures(
        &report,
        &failures,
        &format!("invariants: {r} records, {s} sales, {p} polls"),
    );
    report
}

/// Invariants 4 and 5 (every answer documented, every request answered), once
/// settling took `settled_in`: the loss `allowed`, the failures so far, the report.
pub(crate) fn check_every_answer(
    records: &[Record],
    settled_in: Duration,
    allowed: Allowed,
) -> (AllowedLoss, Vec<String>, Report) {
    let mut failures = Vec::new();
    check_answers(records, &mut failures);
    let unanswered = check_unanswered(records, allowed.unanswered, allowed.killed, &mut failures);
    let report = Report {
        settled_in,
        unanswered,
        ..Report::default()
    };
    (allowed.loss, failures, report)
}

/// Prints `what` was checked, how long settling took and the allowed losses, then
/// panics with every broken invariant, if any.
pub(crate) fn panic_on_failures(report: &Report, failures: &[String], what: &str) {
    println!(
        "{what}, settled in {:.1?}, {} allowed losses",
        report.settled_in,
        report.lost.len()
    );
    if !report.lost.is_empty() {
        println!("lost (allowed by the scenario): {}", describe(&report.lost));
    }
    if !failures.is_empty() {
        panic!(
            "{} invariant(s) broken:\n- {}",
            failures.len(),
            failures.join("\n- ")
        );
    }
}

/// Adds `message(found)` to `failures` when `found` holds anything: one broken
/// invariant, with what broke it.
pub(crate) fn fail_on<T>(
    failures: &mut Vec<String>,
    found: &[T],
    message: impl FnOnce(&[T]) -> String,
) {
    if !found.is_empty() {
        failures.push(message(found));
    }
}

/// On `poll`: the accepted `what.0` (202s) that never reached Postgres
/// (`unexpected`), and the 202s whose receipt `what.1` (`wrong`), a failure each.
pub(crate) fn fail_lost_or_misnamed(
    failures: &mut Vec<String>,
    poll: i64,
    what: (&str, &str),
    unexpected: &[Record],
    wrong: &[String],
) {
    let (accepted, receipt) = what;
    fail_on(failures, unexpected, |u| {
        let (n, u) = (u.len(), describe(u));
        format!("poll {poll}: {n} accepted {accepted} never reached Postgres: {u}")
    });
    fail_on(failures, wrong, |w| {
        let (n, w) = (w.len(), first_ten(w));
        format!("poll {poll}: {n} 202(s) whose receipt {receipt}: {w}")
    });
}

pub(crate) fn describe(records: &[Record]) -> String {
    let shown: Vec<String> = records
        .iter()
        .take(20)
        .map(|r| {
            format!(
                "user {} {:?} order {:?} answered {:.2?} before the check",
                r.user,
                r.op,
                r.order_id(),
                r.answered.elapsed()
            )
        })
        .collect();
    let more = records.len().saturating_sub(shown.len());
    if more > 0 {
        format!("{} (and {more} more)", shown.join("; "))
    } else {
        shown.join("; ")
    }
}

async fn pg_orders(stack: &Stack, sales: &[i64]) -> Option<HashMap<Uuid, (i64, i64)>> {
    let rows: Vec<(Uuid, i64, i64)> =
        sqlx::query_as("SELECT id, sale_id, user_id FROM orders WHERE sale_id = ANY($1)")
            .bind(sales)
            .fetch_all(&stack.db)
            .await
            .ok()?;
    Some(rows.into_iter().map(|(id, s, u)| (id, (s, u))).collect())
}

/// Every row of `votes` of `poll`, per voter, in seq order: (seq, option). Not a
/// map of one option per voter: a second row of one voter must stay visible.
async fn pg_votes(stack: &Stack, poll: i64) -> Option<BTreeMap<i64, Vec<(i32, i64)>>> {
    let rows: Vec<(i64, i32, i64)> = sqlx::query_as(
        "SELECT user_id, seq, option_id FROM votes WHERE poll_id = $1 ORDER BY user_id, seq",
    )
    .bind(poll)
    .fetch_all(&stack.db)
    .await
    .ok()?;
    let mut by_user: BTreeMap<i64, Vec<(i32, i64)>> = BTreeMap::new();
    for (user, seq, option) in rows {
        by_user.entry(user).or_default().push((seq, option));
    }
    Some(by_user)
}

/// Stock changes recorded but not yet applied to both stores.
async fn pending_stock_changes(stack: &Stack, sales: &[i64]) -> Option<i64> {
    sqlx::query_scalar(
        "SELECT count(*) FROM stock_changes WHERE sale_id = ANY($1) AND status = 'pending'",
    )
    .bind(sales)
    .fetch_one(&stack.db)
    .await
    .ok()
}

/// Entries still on their way to Postgres: pending orders and stream entries.
pub(crate) async fn redis_backlog(stack: &Stack, sales: &[i64], polls: &[i64]) -> Option<i64> {
    let mut conn = stack.try_redis().await?;
    let mut pipe = redis::pipe();
    for &sale in sales {
        let k = stack.keys.sale(stampede::domain::Id::new(sale)?);
        pipe.hlen(k.pending).xlen(k.orders);
    }
    for &poll in polls {
        pipe.xlen(stack.keys.poll(stampede::domain::Id::new(poll)?).votes);
    }
    let counts: Vec<i64> = pipe.query_async(&mut conn).await.ok()?;
    Some(counts.iter().sum())
}

/// Per sale with a backlog: `sale N: pending P, stream S`, for a message.
async fn backlog_by_key(stack: &Stack, sales: &[i64]) -> String {
    let Some(mut conn) = stack.try_redis().await else {
        return "Redis not reachable".into();
    };
    let mut out = Vec::new();
    for &sale in sales {
        let Some(id) = stampede::domain::Id::new(sale) else {
            continue;
        };
        let k = stack.keys.sale(id);
        let counts: Option<(i64, i64)> = redis::pipe()
            .hlen(&k.pending)
            .xlen(&k.orders)
            .query_async(&mut conn)
            .await
            .ok();
        if let Some((p, x)) = counts.filter(|(p, x)| p + x > 0) {
            out.push(format!("sale {sale}: pending {p}, stream {x}"));
        }
    }
    out.join("; ")
}

async fn wait_settled(stack: &Stack, records: &[Record], sales: &[i64], polls: &[i64]) -> Duration {
    let orders: HashSet<Uuid> = records
        .iter()
        .filter(|r| r.is_accepted())
        .filter_map(Record::order_id)
        .collect();
    let votes: HashSet<(i64, i64)> = records
        .iter()
        .filter(|r| r.is_accepted())
        .filter_map(|r| match r.op {
            Op::Vote { poll, .. } => Some((poll, r.user)),
            _ => None,
        })
        .collect();
    let waited = wait_quiet(async || {
        let mut all_in = false;
        if let Some(pg) = pg_orders(stack, sales).await {
            all_in = orders.iter().all(|id| pg.contains_key(id));
            for &poll in polls {
                match pg_votes(stack, poll).await {
                    Some(v) => {
                        all_in &= votes
                            .iter()
                            .filter(|(p, _)| *p == poll)
                            .all(|(_, u)| v.contains_key(u))
                    }
                    None => all_in = false,
                }
            }
        }
        let backlog = match (
            redis_backlog(stack, sales, polls).await,
            pending_stock_changes(stack, sales).await,
        ) {
            (Some(b), Some(c)) => Some(b + c),
            _ => None,
        };
        (all_in, backlog)
    })
    .await;
    match waited {
        Ok(waited) => waited,
        Err((waited, backlog)) => {
            println!(
                "settlement not finished after 60 s (Redis backlog {backlog:?}: {})",
                backlog_by_key(stack, sales).await
            );
            waited
        }
    }
}

/// Looks at the stores every 200 ms with `look` (whether every 202 is in
/// Postgres, and the Redis backlog) until all are in and the backlog is 0, or the
/// backlog has been 0 for 3 s with something still missing (what is missing now
/// will not come): Ok with the time it took. After 60 s: Err with the time and the
/// last backlog.
pub(crate) async fn wait_quiet(
    mut look: impl AsyncFnMut() -> (bool, Option<i64>),
) -> Result<Duration, (Duration, Option<i64>)> {
    let start = Instant::now();
    let deadline = start + Duration::from_secs(60);
    let mut quiet_since: Option<Instant> = None;
    loop {
        let (all_in, backlog) = look().await;
        if all_in && backlog == Some(0) {
            return Ok(start.elapsed());
        }
        if backlog == Some(0) {
            let since = *quiet_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_secs(3) {
                return Ok(start.elapsed());
            }
        } else {
            quiet_since = None;
        }
        if Instant::now() > deadline {
            return Err((start.elapsed(), backlog));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Invariant 5: counts the attempts without an answer by kind (see
/// [`storm::Outcome::of`]), prints them, and fails past `bound`; connections
/// refused by a server of `killed` (bits) are printed apart and not counted.
/// Returns the count.
fn check_unanswered(
    records: &[Record],
    bound: usize,
    killed: u64,
    failures: &mut Vec<String>,
) -> usize {
    let mut kinds: BTreeMap<&str, (usize, &Record)> = BTreeMap::new();
    let mut refused_by_killed = 0;
    for r in records {
        if let Outcome::NoAnswer(why) = &r.outcome {
            let kind = why.split(':').next().unwrap_or("other");
            if kind == "refused" && r.server < 64 && killed & (1 << r.server) != 0 {
                refused_by_killed += 1;
                continue;
            }
            kinds.entry(kind).or_insert((0, r)).0 += 1;
        }
    }
    let total: usize = kinds.values().map(|(n, _)| n).sum();
    let shown: Vec<String> = kinds
        .iter()
        .map(|(kind, (n, r))| {
            let Outcome::NoAnswer(why) = &r.outcome else {
                unreachable!()
            };
            format!(
                "{n} x {kind} (e.g. user {} {:?} on server #{}: {why})",
                r.user, r.op, r.server
            )
        })
        .collect();
    println!(
        "unanswered requests: {total} (bound {bound}){}{}; refused by a killed server (not counted): {refused_by_killed}",
        if shown.is_empty() { "" } else { ": " },
        shown.join("; ")
    );
    if total > bound {
        failures.push(format!(
            "{total} request(s) got no answer, more than the scenario's bound of {bound}: {}",
            shown.join("; ")
        ));
    }
    total
}

/// Invariant 4, and that every answer is a documented one.
fn check_answers(records: &[Record], failures: &mut Vec<String>) {
    let mut bad: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for r in records {
        let Outcome::Answer {
            status,
            code,
            retry_after,
            ..
        } = &r.outcome
        else {
            continue;
        };
        let problem = match (*status, code.as_deref()) {
            (503, None) => Some("503 without a JSON error code"),
            (503, Some(_)) if retry_after.is_none() => Some("503 without Retry-After"),
            (503, Some(_)) => None,
            (500..=599, _) => Some("5xx other than 503"),
            // The server never read that request (see `Record::retry_after`).
            (408, _) => None,
            _ => {
                // 403 and 422 only on a sale with a waiting room: an admission used
                // up or run out (waiting_room.rs); `per_user_limit` only on a sale
                // of more than one per customer. Stock: 200 applied; 202 recorded,
                // applied once Redis holds the sale.
                let refusals: &[(u16, &str)] = match r.op {
                    Op::Purchase { .. } => &[
                        (409, "already_bought"),
                        (409, "per_user_limit"),
                        (410, "sold_out"),
                        (403, "not_admitted"),
                        (422, "ticket_expired"),
                    ],
                    Op::Vote { .. } => &[(409, "already_voted")],
                    Op::Stock { .. } => &[],
                    Op::Ballot { .. } => &[
                        (409, "already_voted"),
                        (409, "budget_spent"),
                        (422, "over_budget"),
                    ],
                };
                let documented = *status == 202
                    || (*status == 200 && matches!(r.op, Op::Stock { .. }))
                    || refusals
                        .iter()
                        .any(|&(st, c)| st == *status && code.as_deref() == Some(c));
                (!documented).then_some("an answer this endpoint should not give here")
            }
        };
        if let Some(p) = problem {
            let e = bad
                .entry(format!("{p}: {}", r.label()))
                .or_insert((0, String::new()));
            e.0 += 1;
            if e.1.is_empty() {
                e.1 = format!(
                    "e.g. user {} {:?} on server #{}, answered in {:.2?}",
                    r.user,
                    r.op,
                    r.server,
                    r.answered - r.sent
                );
            }
        }
    }
    for (what, (n, example)) in bad {
        failures.push(format!("{n} x {what} ({example})"));
    }
}

/// Invariants 1 and 2 for purchases.
async fn check_orders(
    stack: &Stack,
    records: &[Record],
    sales: &[i64],
    loss: AllowedLoss,
    failures: &mut Vec<String>,
    report: &mut Report,
) {
    let Some(pg) = pg_orders(stack, sales).await else {
        failures.push("cannot read orders from Postgres".into());
        return;
    };
    // Orders that expired on a sale whose expired buyers may buy again: their
    // buyer may rightly have a second 202 (for a new order).
    let released: HashSet<Uuid> = sqlx::query_scalar(
        "SELECT o.id FROM orders o JOIN sales s ON s.id = o.sale_id
         WHERE o.sale_id = ANY($1) AND o.status = 'expired' AND s.rebuy_after_expiry",
    )
    .bind(sales)
    .fetch_all(&stack.db)
    .await
    .expect("read the expired orders of sales with rebuy_after_expiry")
    .into_iter()
    .collect();
    // Units one customer may hold, per sale (1 unless `max_per_user` says more).
    let caps: HashMap<i64, i64> =
        sqlx::query_as::<_, (i64, i32)>("SELECT id, max_per_user FROM sales WHERE id = ANY($1)")
            .bind(sales)
            .fetch_all(&stack.db)
            .await
            .expect("read the sales' max_per_user")
            .into_iter()
            .map(|(id, cap)| (id, i64::from(cap)))
            .collect();
    let mut unexpected_losses = Vec::new();
    // Per (sale, user): the orders its 202s named (a replay names its first
    // answer's order again), and those lost with the scenario's leave.
    type Named = (HashSet<Uuid>, HashSet<Uuid>);
    let mut per_pair: HashMap<(i64, i64), Named> = HashMap::new();
    for r in records.iter().filter(|r| r.is_accepted()) {
        let Some(sale) = r.sale() else { continue };
        let pair = per_pair.entry((sale, r.user)).or_default();
        let Some(id) = r.order_id() else {
            failures.push(format!(
                "a 202 without an order id: user {} sale {sale}",
                r.user
            ));
            continue;
        };
        if !released.contains(&id) {
            pair.0.insert(id);
        }
        match pg.get(&id) {
            Some(&(s, u)) if (s, u) == (sale, r.user) => {}
            Some(&(s, u)) => {
                failures.push(format!(
                    "order {id} was accepted for sale {sale} user {}, Postgres has sale {s} user {u}",
                    r.user
                ));
            }
            None if loss.allows(r) => {
                pair.1.insert(id);
                report.lost.push(r.clone());
            }
            None => unexpected_losses.push(r.clone()),
        }
    }
    fail_on(failures, &unexpected_losses, |l| {
        let n = l.len();
        format!(
            "{n} accepted order(s) (202) never reached Postgres: {}",
            describe(l)
        )
    });
    let twice: Vec<String> = per_pair
        .iter()
        .filter(|((s, _), (seen, lost))| {
            (seen.difference(lost).count() as i64) > caps.get(s).copied().unwrap_or(1)
        })
        .map(|((s, u), (seen, lost))| {
            format!(
                "user {u} sale {s}: {} orders accepted ({} lost), at most {} per customer",
                seen.len(),
                lost.len(),
                caps.get(s).copied().unwrap_or(1)
            )
        })
        .take(10)
        .collect();
    fail_on(failures, &twice, |t| {
        let t = t.join("; ");
        format!("users got more accepted purchases of one sale than it allows: {t}")
    });
    let dupes: Vec<(i64, i64, i64)> = sqlx::query_as(
        "SELECT o.sale_id, o.user_id, sum(o.quantity)::int8 FROM orders o
         JOIN sales s ON s.id = o.sale_id
         WHERE o.sale_id = ANY($1) AND o.status NOT IN ('expired', 'cancelled', 'refunded')
         GROUP BY o.sale_id, o.user_id HAVING sum(o.quantity) > max(s.max_per_user)",
    )
    .bind(sales)
    .fetch_all(&stack.db)
    .await
    .expect("count the live units per (sale, user)");
    fail_on(failures, &dupes, |d| {
        format!("Postgres has more live units per (sale, user) than the sale allows: {d:?}")
    });
    check_untold_orders(records, &pg, &released, &caps, failures);
}

/// Every order in Postgres that no 202 named must come from a request whose
/// answer we never saw, or a 503 after the script may have run (an ambiguous
/// attempt of its sale and user). And on a sale of one per customer (the order
/// not released by an expiry its buyer may buy again after), the buyer must have
/// been told of it by the last decided answer sent after the last such attempt,
/// if there is one: a 409 `already_bought` whose `order_ids` names it. A 202 of
/// another order, a 410, 403 or 422 there is a buyer told they do not hold what
/// they hold. Except a 410 `sold_out` to a purchase without an `Idempotency-Key`:
/// a server that has seen the sale sold out answers those from memory, before it
/// knows the buyer (docs/api.md, "Purchase answers"). Decided answers sent before
/// the last ambiguous attempt do not count: that attempt may be the one that
/// bought, after them (units return to a sale by a top-up or an expiry).
fn check_untold_orders(
    records: &[Record],
    pg: &HashMap<Uuid, (i64, i64)>,
    released: &HashSet<Uuid>,
    caps: &HashMap<i64, i64>,
    failures: &mut Vec<String>,
) {
    let accepted: HashSet<Uuid> = records
        .iter()
        .filter(|r| r.is_accepted())
        .filter_map(Record::order_id)
        .collect();
    // Per (sale, user): its attempts, in the order sent.
    let mut attempts: HashMap<(i64, i64), Vec<&Record>> = HashMap::new();
    for r in records {
        if let Some(sale) = r.sale() {
            attempts.entry((sale, r.user)).or_default().push(r);
        }
    }
    for tried in attempts.values_mut() {
        tried.sort_by_key(|r| r.sent);
    }
    let answers = |tried: &[&Record]| -> String {
        tried
            .iter()
            .map(|r| match (r.order_id(), r.order_ids()) {
                (Some(id), _) => format!("{} {id}", r.label()),
                (None, []) => r.label(),
                (None, ids) => format!("{} naming {ids:?}", r.label()),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut phantoms = Vec::new();
    let mut untold = Vec::new();
    let (mut unnamed, mut told, mut undecided, mut from_memory) = (0, 0, 0, 0);
    for (id, &(s, u)) in pg.iter().filter(|(id, _)| !accepted.contains(id)) {
        let tried: &[&Record] = attempts.get(&(s, u)).map_or(&[], Vec::as_slice);
        let Some(last_ambiguous) = tried.iter().rposition(|r| r.is_ambiguous()) else {
            phantoms.push(format!(
                "order {id} sale {s} user {u} (its answers: {})",
                answers(tried)
            ));
            continue;
        };
        unnamed += 1;
        if released.contains(id) || caps.get(&s).copied().unwrap_or(1) > 1 {
            continue;
        }
        // 408: the server never read that request.
        let last = tried[last_ambiguous + 1..]
            .iter()
            .rev()
            .find(|r| r.status() != Some(408));
        match last {
            None => undecided += 1,
            Some(r)
                if r.status() == Some(409)
                    && r.code() == Some("already_bought")
                    && r.order_ids().contains(id) =>
            {
                told += 1
            }
            Some(r) if !r.keyed && r.status() == Some(410) && r.code() == Some("sold_out") => {
                from_memory += 1
            }
            Some(r) => untold.push(format!(
                "order {id} sale {s} user {u}: last told {} (its answers: {})",
                r.label(),
                answers(tried)
            )),
        }
    }
    println!(
        "orders in Postgres no 202 named: {unnamed}, each after an ambiguous attempt; of those on sales of one per customer, \
         {told} named by the 409 already_bought answered last, {undecided} with no decided answer after, \
         {from_memory} answered 410 sold_out last (unkeyed: from memory), {} told otherwise",
        untold.len()
    );
    fail_on(failures, &phantoms, |p| {
        let p = first_ten(p);
        format!("orders in Postgres that no request was accepted for: {p}")
    });
    fail_on(failures, &untold, |u| {
        format!(
            "{} order(s) in Postgres whose buyer's last answer does not name them (a 409 already_bought with the order in order_ids): {}",
            u.len(),
            first_ten(u)
        )
    });
}

/// Invariant 3 for one sale, and the reconcile endpoint.
async fn check_sale_stores(stack: &Stack, sale: i64, failures: &mut Vec<String>) {
    let (total, cap): (i64, i32) =
        sqlx::query_as("SELECT stock_total, max_per_user FROM sales WHERE id = $1")
            .bind(sale)
            .fetch_one(&stack.db)
            .await
            .expect("read sale");
    // Units per buyer holding them, as the reconcile endpoint counts them.
    let pg_units: HashMap<i64, i64> = sqlx::query_as::<_, (i64, i64)>(
        "SELECT o.user_id, sum(o.quantity)::int8 FROM orders o JOIN sales s ON s.id = o.sale_id
         WHERE o.sale_id = $1
           AND (o.status NOT IN ('expired', 'cancelled', 'refunded') OR NOT s.rebuy_after_expiry)
         GROUP BY o.user_id",
    )
    .bind(sale)
    .fetch_all(&stack.db)
    .await
    .expect("read orders")
    .into_iter()
    .collect();
    let pg_buyers: HashSet<i64> = pg_units.keys().copied().collect();
    let k = stack.keys.sale(stampede::domain::Id::new(sale).unwrap());
    let mut conn = stack.redis().await;
    type Keys = (Option<i64>, Vec<i64>, Option<i64>, HashMap<i64, i64>);
    let (left, buyers, sold_counter, redis_units): Keys = redis::pipe()
        .get(&k.stock)
        .hkeys(&k.buyers)
        .get(&k.sold)
        .hgetall(&k.units)
        .query_async(&mut conn)
        .await
        .expect("read sale keys");
    let redis_buyers: HashSet<i64> = buyers.into_iter().collect();
    let orders: i64 = pg_units.values().sum();
    // A sale of one per customer counts its units sold with the buyers hash; one of
    // more, with its units-sold counter and units per buyer.
    let sold = if cap > 1 {
        sold_counter.unwrap_or(0)
    } else {
        redis_buyers.len() as i64
    };
    println!(
        "sale {sale}: stock_total {total}, Postgres units {orders} ({} buyers), Redis units left {left:?}, Redis units sold {sold} ({} buyers)",
        pg_buyers.len(),
        redis_buyers.len()
    );
    if orders > total {
        failures.push(format!(
            "sale {sale} oversold: {orders} units in Postgres orders for stock_total {total}"
        ));
    }
    match left {
        None => failures.push(format!("sale {sale}: Redis has no units-left key")),
        Some(left) => {
            if left < 0 {
                failures.push(format!("sale {sale}: Redis units left is {left}"));
            }
            if left + sold != total {
                failures.push(format!(
                    "sale {sale}: Redis units left {left} + sold {sold} = {} != Postgres stock_total {total}",
                    left + sold
                ));
            }
        }
    }
    if sold != orders {
        failures.push(format!(
            "sale {sale}: {sold} units sold in Redis, {orders} in Postgres orders"
        ));
    }
    if cap > 1 && redis_units != pg_units {
        let differ: Vec<String> = pg_units
            .iter()
            .filter(|(u, n)| redis_units.get(u) != Some(n))
            .map(|(u, n)| {
                format!(
                    "user {u}: {n} in Postgres, {:?} in Redis",
                    redis_units.get(u)
                )
            })
            .chain(
                redis_units
                    .iter()
                    .filter(|(u, n)| **n != 0 && !pg_units.contains_key(u))
                    .map(|(u, n)| format!("user {u}: {n} in Redis, none in Postgres")),
            )
            .take(10)
            .collect();
        fail_on(failures, &differ, |d| {
            format!("sale {sale}: units per buyer differ: {}", d.join("; "))
        });
    }
    if redis_buyers != pg_buyers {
        let mut only_redis: Vec<_> = redis_buyers.difference(&pg_buyers).copied().collect();
        let mut only_pg: Vec<_> = pg_buyers.difference(&redis_buyers).copied().collect();
        only_redis.sort_unstable();
        only_pg.sort_unstable();
        only_redis.truncate(10);
        only_pg.truncate(10);
        failures.push(format!(
            "sale {sale}: buyer sets differ: only in Redis {only_redis:?}, only in Postgres {only_pg:?}"
        ));
    }
    if cap == 1 {
        check_held(stack, sale, &k, &pg_buyers, failures).await;
    }
    match reconcile(stack, sale).await {
        Some(report) if report["consistent"] == Value::Bool(true) => {}
        Some(report) => failures.push(format!("sale {sale}: reconcile says {report}")),
        None => failures.push(format!(
            "sale {sale}: the reconcile endpoint did not answer 200"
        )),
    }
}

/// On a sale of one per customer: every buyer has, in the buyers hash, one of
/// their own orders of the sale (what `already_bought` names without Postgres).
async fn check_held(
    stack: &Stack,
    sale: i64,
    k: &stampede::keys::SaleKeys,
    pg_buyers: &HashSet<i64>,
    failures: &mut Vec<String>,
) {
    let own: HashSet<(i64, String)> =
        sqlx::query_as::<_, (i64, Uuid)>("SELECT user_id, id FROM orders WHERE sale_id = $1")
            .bind(sale)
            .fetch_all(&stack.db)
            .await
            .expect("read orders")
            .into_iter()
            .map(|(user, id)| (user, id.to_string()))
            .collect();
    let held: HashMap<i64, String> = redis::cmd("HGETALL")
        .arg(&k.buyers)
        .query_async(&mut stack.redis().await)
        .await
        .expect("read held orders");
    // The sale's 14 characters every order id of it starts with.
    let prefix = stampede::sale::order_id::new_order_id(stampede::domain::Id::new(sale).unwrap())
        .to_string()[..14]
        .to_string();
    let wrong: Vec<String> = pg_buyers
        .iter()
        .filter_map(|u| match held.get(u) {
            None => Some(format!("user {u}: none")),
            Some(v) if !own.contains(&(*u, format!("{prefix}{v}"))) => {
                Some(format!("user {u}: {prefix}{v}, not theirs"))
            }
            Some(_) => None,
        })
        .take(10)
        .collect();
    fail_on(failures, &wrong, |w| {
        format!("sale {sale}: held orders wrong: {}", w.join("; "))
    });
}

/// `GET /api/admin/sales/{id}/reconcile`, retried for a while on anything but 200.
pub async fn reconcile(stack: &Stack, sale: i64) -> Option<Value> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let resp = stack
            .http
            .get(format!(
                "{}/api/admin/sales/{sale}/reconcile",
                stack.live_base()
            ))
            .bearer_auth(&stack.admin.token)
            .send()
            .await;
        if let Ok(resp) = resp {
            if resp.status() == reqwest::StatusCode::OK {
                return resp.json().await.ok();
            }
            println!(
                "reconcile of sale {sale}: {} {}",
                resp.status(),
                resp.text().await.unwrap_or_default()
            );
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Invariants 1 to 3 for one poll of plain votes (`Op::Vote`), from every row of
/// `votes` (not one per voter, which would hide a second row):
///
/// - on a poll that does not allow changes, exactly one row per voter;
/// - every 202 in Postgres, as the option it asked for, its receipt naming that
///   row (unless `loss` allows losing it); nobody with two 202s;
/// - no row for a voter never answered 202, unless an attempt of theirs on this
///   poll went unanswered or got a 503 (the script may have run), as for orders;
/// - the tally counted from every row (from each voter's last row where changes
///   are allowed) equals Redis's tally and `store::settled_tallies`, and the
///   Redis voters hash holds each voter's last row (seq and option).
async fn check_poll(
    stack: &Stack,
    records: &[Record],
    poll: i64,
    loss: AllowedLoss,
    failures: &mut Vec<String>,
    report: &mut Report,
) {
    let Some(rows) = pg_votes(stack, poll).await else {
        failures.push(format!("poll {poll}: cannot read votes"));
        return;
    };
    let (kind, allow_change): (String, bool) =
        sqlx::query_as("SELECT ballot, allow_change FROM polls WHERE id = $1")
            .bind(poll)
            .fetch_one(&stack.db)
            .await
            .expect("read the poll's ballot settings");
    assert_eq!(
        kind, "single",
        "poll {poll}: plain votes are checked on single polls"
    );
    let row_count: usize = rows.values().map(Vec::len).sum();
    if !allow_change {
        let many: Vec<String> = rows
            .iter()
            .filter(|(_, rs)| rs.len() != 1)
            .map(|(u, rs)| format!("user {u}: (seq, option) {rs:?}"))
            .collect();
        fail_on(failures, &many, |m| {
            format!(
                "poll {poll}: {} voter(s) with more than one row of votes on a poll that does not allow changes: {}",
                m.len(),
                first_ten(m)
            )
        });
    }
    // Each voter's ballot that counts: the row with the highest seq.
    let pg_now: BTreeMap<i64, (i32, i64)> = rows
        .iter()
        .map(|(&u, rs)| (u, *rs.last().expect("a voter has rows")))
        .collect();

    let mut unexpected = Vec::new();
    let mut wrong_receipts = Vec::new();
    let mut per_user: HashMap<i64, (usize, usize)> = HashMap::new();
    for r in records.iter().filter(|r| r.is_accepted()) {
        let Op::Vote { poll: p, option } = r.op else {
            continue;
        };
        if p != poll {
            continue;
        }
        let slot = per_user.entry(r.user).or_default();
        slot.0 += 1;
        match rows.get(&r.user) {
            Some(rs) if rs.iter().any(|&(_, o)| o == option) => {
                let named = r.receipt().is_some_and(|id| {
                    rs.iter()
                        .any(|&(seq, o)| o == option && receipt_of(stack, poll, r.user, seq) == id)
                });
                if !named && !loss.allows(r) {
                    wrong_receipts.push(format!(
                        "user {} voted {option}: receipt {:?}, rows {rs:?}",
                        r.user,
                        r.receipt()
                    ));
                }
            }
            Some(rs) => failures.push(format!(
                "poll {poll}: user {} voted {option} (202), Postgres has (seq, option) {rs:?}",
                r.user
            )),
            None if loss.allows(r) => {
                slot.1 += 1;
                report.lost.push(r.clone());
            }
            None => unexpected.push(r.clone()),
        }
    }
    let what = ("vote(s)", "names no row of the vote");
    fail_lost_or_misnamed(failures, poll, what, &unexpected, &wrong_receipts);
    let twice: Vec<i64> = per_user
        .iter()
        .filter(|(_, (seen, lost))| seen - lost > 1)
        .map(|(u, _)| *u)
        .take(10)
        .collect();
    fail_on(failures, &twice, |t| {
        format!("poll {poll}: users with two accepted votes: {t:?}")
    });
    // A row nobody was told about must come from a request whose answer we never
    // saw (or a 503 after the script may have run), as for orders.
    let mine = || {
        records
            .iter()
            .filter(move |r| matches!(r.op, Op::Vote { poll: p, .. } if p == poll))
    };
    let told: HashSet<i64> = mine().filter(|r| r.is_accepted()).map(|r| r.user).collect();
    let ambiguous: HashSet<i64> = mine()
        .filter(|r| r.status().is_none_or(|s| s == 503))
        .map(|r| r.user)
        .collect();
    let phantoms: Vec<String> = rows
        .iter()
        .filter(|(u, _)| !told.contains(u) && !ambiguous.contains(u))
        .map(|(u, rs)| {
            let answers: Vec<String> = mine().filter(|r| r.user == *u).map(Record::label).collect();
            format!(
                "user {u}: (seq, option) {rs:?} (its answers: {})",
                answers.join(", ")
            )
        })
        .collect();
    fail_on(failures, &phantoms, |p| {
        let (n, p) = (p.len(), first_ten(p));
        format!(
            "poll {poll}: {n} voter(s) with rows in Postgres that no vote was accepted for: {p}"
        )
    });

    // The tally from every row (a second row of one voter counts: it must not
    // be there), or from each voter's last where a later vote replaces one.
    let mut counted: BTreeMap<i64, i64> = BTreeMap::new();
    if allow_change {
        for &(_, o) in pg_now.values() {
            *counted.entry(o).or_default() += 1;
        }
    } else {
        for &(_, o) in rows.values().flatten() {
            *counted.entry(o).or_default() += 1;
        }
    }
    let settled = settled_tallies(stack, poll).await;
    let (voters, redis_tally) = redis_poll(stack, poll).await;
    println!(
        "poll {poll}: Postgres {} voters, {row_count} rows, tally counted from the rows {counted:?}, settled_tallies {settled:?}; Redis voters {} tally {redis_tally:?}",
        rows.len(),
        voters.len()
    );
    if redis_tally != counted || settled != counted {
        failures.push(format!(
            "poll {poll}: tallies differ: counted from the rows of votes {counted:?}, Redis {redis_tally:?}, settled_tallies {settled:?}"
        ));
    }
    let mut redis_now: BTreeMap<i64, (i32, i64)> = BTreeMap::new();
    for (&u, held) in &voters {
        match parse_held(held, Kind::Single) {
            Some((seq, Held::Choices(option))) if option.len() == 1 => {
                redis_now.insert(u, (seq, option[0]));
            }
            _ => failures.push(format!("poll {poll}: user {u}: Redis holds {held:?}")),
        }
    }
    if redis_now != pg_now {
        let differ = users_differing(&pg_now, &redis_now);
        failures.push(format!(
            "poll {poll}: Redis voters ({}) and Postgres votes ({} voters) differ for {} user(s) (seq, option): {}",
            redis_now.len(),
            pg_now.len(),
            differ.len(),
            first_ten(&differ)
        ));
    }
}

/// "Nobody buys twice", tested directly: tops every sale up by a few units (so
/// that a refusal cannot be a sold-out answer), waits out the servers' sold-out
/// flags, then has every buyer in Postgres try their sale again. Each must end at
/// 409 `already_bought`. Returns the records (for a final [`assert_invariants`]).
pub async fn assert_buyers_cannot_buy_again(stack: &Stack, sales: &[i64]) -> Vec<Record> {
    let mut records = Vec::new();
    let admin: std::sync::Arc<str> = stack.admin.token.as_str().into();
    let top_ups: Vec<Work> = sales
        .iter()
        .map(|&sale| Work {
            user: stack.admin.id,
            token: admin.clone(),
            op: Op::Stock {
                sale,
                body: r#"{"add": 5}"#.into(),
            },
            server: 0,
        })
        .collect();
    records.extend(storm::run_all(&stack.http, stack.live_bases(), top_ups).await);
    // A server trusts its own sold-out flag for up to a second (sold_out_cache_ms).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let buyers: Vec<(i64, i64)> =
        sqlx::query_as("SELECT sale_id, user_id FROM orders WHERE sale_id = ANY($1)")
            .bind(sales)
            .fetch_all(&stack.db)
            .await
            .expect("read buyers");
    let what = format!("{} earlier buyers tried again", buyers.len());
    let again = send_as_users(
        stack,
        &what,
        buyers
            .iter()
            .map(|&(sale, user)| (user, Op::Purchase { sale })),
    )
    .await;
    let finals = final_answers(&again);
    let bought_again: Vec<String> = finals
        .iter()
        .filter(|r| r.status() != Some(409) || r.code() != Some("already_bought"))
        .take(10)
        .map(|r| format!("user {} {:?}: {}", r.user, r.op, r.label()))
        .collect();
    assert!(
        bought_again.is_empty(),
        "earlier buyers were not refused with 409 already_bought: {}",
        bought_again.join("; ")
    );
    records.extend(again);
    records
}

/// Sends each (user, op) of `ops` once as that user (a fresh token), spread over
/// the live servers; prints `what` was sent and the answers' summary; returns the
/// records.
pub(crate) async fn send_as_users(
    stack: &Stack,
    what: &str,
    ops: impl Iterator<Item = (i64, Op)>,
) -> Vec<Record> {
    let mut work: Vec<Work> = ops
        .map(|(user, op)| Work {
            user,
            token: token_for(stack, user).into(),
            op,
            server: 0,
        })
        .collect();
    let bases = stack.live_bases();
    storm::spread(&mut work, bases.len());
    let again = storm::run_all(&stack.http, bases, work).await;
    println!("{what}: {}", storm::summary(&again));
    again
}

/// A fresh token of `user` (not an admin), minted with the servers' secret.
pub fn token_for(stack: &Stack, user: i64) -> String {
    stack.tokens.issue(stampede::auth::token::Claims {
        user_id: stampede::domain::Id::new(user).unwrap(),
        admin: false,
        expires_at: chrono::Utc::now().timestamp() + 3600,
        generation: 0,
        session: rand::random(),
        account_created: None,
    })
}

/// The last answer of each (user, op): what the client finally heard.
pub fn final_answers(records: &[Record]) -> Vec<&Record> {
    let mut last: HashMap<(i64, Op), &Record> = HashMap::new();
    for r in records {
        let e = last.entry((r.user, r.op.clone())).or_insert(r);
        if r.sent >= e.sent {
            *e = r;
        }
    }
    last.into_values().collect()
}

/// The users whose entries differ between Postgres's map and Redis's, each in
/// words (both sides).
pub(crate) fn users_differing<V: PartialEq + std::fmt::Debug>(
    pg: &BTreeMap<i64, V>,
    redis: &BTreeMap<i64, V>,
) -> Vec<String> {
    pg.keys()
        .chain(redis.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|u| pg.get(u) != redis.get(u))
        .map(|u| {
            format!(
                "user {u}: Postgres {:?}, Redis {:?}",
                pg.get(u),
                redis.get(u)
            )
        })
        .collect()
}

/// At most the first ten of `items`, joined for a failure's message.
pub(crate) fn first_ten(items: &[String]) -> String {
    items
        .iter()
        .take(10)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ")
}

/// The Redis voters hash and tally of `poll` (options with no vote left out).
pub(crate) async fn redis_poll(
    stack: &Stack,
    poll: i64,
) -> (HashMap<i64, String>, BTreeMap<i64, i64>) {
    let k = stack.keys.poll(stampede::domain::Id::new(poll).unwrap());
    let (voters, tally): (HashMap<i64, String>, HashMap<i64, i64>) = redis::pipe()
        .hgetall(&k.voters)
        .hgetall(&k.tally)
        .query_async(&mut stack.redis().await)
        .await
        .expect("read poll keys");
    (voters, tally.into_iter().filter(|(_, n)| *n != 0).collect())
}

/// `store::settled_tallies` of the poll, options with no vote left out.
pub(crate) async fn settled_tallies(stack: &Stack, poll: i64) -> BTreeMap<i64, i64> {
    stampede::vote::store::settled_tallies(&stack.db, stampede::domain::Id::new(poll).unwrap())
        .await
        .expect("settled_tallies")
        .into_iter()
        .filter(|(_, n)| *n != 0)
        .collect()
}
