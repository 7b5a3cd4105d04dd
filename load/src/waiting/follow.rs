//! The second phase: from the opening each user follows its standing, gently, and
//! buys with its admission's ticket once admitted; one reader follows the line's
//! numbers for all.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use uuid::Uuid;

use super::ask::{Tally, ask, no_detail, state_of};
use crate::args::LoadArgs;
use crate::client::{Conn, Request, Target};
use crate::fire::{REQUEST_TIMEOUT, STORM_TRIES, UserSeen};
use crate::progress::Progress;

/// How often a user whose turn is near asks where it stands.
const NEAR_EVERY: Duration = Duration::from_millis(250);
/// How often a user far back in the line asks (its page would follow the line's
/// `served` over the event stream, and ask only when its turn comes).
const FAR_EVERY: Duration = Duration::from_secs(5);
/// How often the line's numbers are read (`GET /api/sales/{id}`, one for all).
const VIEW_EVERY: Duration = Duration::from_millis(100);

/// What the line's readers share.
struct Shared {
    /// The line's `served`: places the admission has reached.
    served: AtomicI64,
    /// The sale has no unit left: everyone still waiting is sold out.
    no_stock: AtomicBool,
    /// The follow phase is over (every standing final, or the bound).
    stop: AtomicBool,
}

/// One user as the run follows it.
#[derive(Default)]
pub struct Follower {
    pub index: usize,
    /// 1-based place, once drawn.
    pub position: Option<i64>,
    /// The last standing read (`waiting`, `admitted`, ...), or what ended it.
    pub state: Option<String>,
    pub done: bool,
    pub last_poll: Option<Instant>,
    pub polls: u32,
    /// Every distinct `expires_at` of an admission seen: more than one would be an
    /// admission given twice.
    pub admissions: Vec<String>,
    /// Its purchases, as a storm records them (for the storm's checks).
    pub seen: UserSeen,
}

/// What the follow phase saw: the standings' and purchases' answers, the line's
/// readings, every user as followed, and when the last standing was final (or
/// the bound came).
pub struct Followed {
    pub polls: Tally,
    pub buys: Tally,
    pub views: Tally,
    pub followers: Vec<Follower>,
    pub ended: Instant,
}

/// The follow phase: `--concurrency` connections, each following its share of
/// the users who `joined` (the others are `not_joined` at once) until every
/// standing is final or `deadline`, while one reader follows the line's numbers.
#[allow(clippy::too_many_arguments)]
pub async fn follow_all(
    target: &Target,
    admin: &str,
    sale: i64,
    tokens: &Arc<Vec<String>>,
    joined: &[bool],
    args: &LoadArgs,
    deadline: Instant,
    progress: Arc<Progress>,
) -> anyhow::Result<Followed> {
    let shared = Arc::new(Shared {
        served: AtomicI64::new(0),
        no_stock: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    });
    let watcher = tokio::spawn(watch_line(
        target.clone(),
        admin.to_string(),
        sale,
        shared.clone(),
        progress.clone(),
    ));
    let concurrency = args.concurrency.max(1);
    let mut shares: Vec<Vec<Follower>> = (0..concurrency).map(|_| Vec::new()).collect();
    for (i, ok) in joined.iter().enumerate() {
        shares[i % concurrency].push(Follower {
            index: i,
            done: !ok,
            state: (!ok).then(|| "not_joined".to_string()),
            ..Follower::default()
        });
    }
    // Users near the head: those admitted within half a second.
    let near = i64::from(args.admit_per_second / 2).max(1);
    let tasks: Vec<_> = shares
        .into_iter()
        .map(|mine| {
            tokio::spawn(follow(
                Conn::new(target.clone(), REQUEST_TIMEOUT),
                mine,
                tokens.clone(),
                sale,
                near,
                deadline,
                shared.clone(),
                progress.clone(),
            ))
        })
        .collect();
    let (mut polls, mut buys) = (Tally::new(), Tally::new());
    let mut followers = Vec::new();
    for task in tasks {
        let (p, b, mine) = task.await?;
        polls.add(p);
        buys.add(b);
        followers.extend(mine);
    }
    let ended = Instant::now();
    shared.stop.store(true, Ordering::Relaxed);
    let (views, _) = watcher.await?;
    Ok(Followed {
        polls,
        buys,
        views,
        followers,
        ended,
    })
}

/// The line's numbers, every [`VIEW_EVERY`], until the follow phase stops: the
/// last view read.
async fn watch_line(
    target: Target,
    admin: String,
    sale: i64,
    shared: Arc<Shared>,
    progress: Arc<Progress>,
) -> (Tally, Option<Value>) {
    let mut tally = Tally::new();
    let mut conn = Conn::new(target, REQUEST_TIMEOUT);
    let path = format!("/api/sales/{sale}");
    let mut last = None;
    while !shared.stop.load(Ordering::Relaxed) {
        let req = Request {
            method: "GET",
            path: &path,
            token: Some(&admin),
            forwarded_for: None,
            idempotency_key: None,
            body: None,
        };
        let a = ask(
            &mut conn,
            &req,
            "sale view",
            &mut tally,
            &progress,
            no_detail,
        )
        .await;
        if let (200, Some(view)) = (a.status, a.body) {
            if let Some(served) = view["line"]["served"].as_i64() {
                shared.served.store(served, Ordering::Relaxed);
            }
            if view["stock_left"].as_i64().is_some_and(|left| left <= 0) {
                shared.no_stock.store(true, Ordering::Relaxed);
            }
            last = Some(view);
        }
        tokio::time::sleep(VIEW_EVERY).await;
    }
    (tally, last)
}

/// Buys with the admission's (or a draw win's) `ticket` (one key, retried on a
/// 503 or a lost answer), recording it in `u`; whether the standing is final
/// after it, and what it ended as.
pub async fn buy(
    conn: &mut Conn,
    path: &str,
    token: &str,
    ticket: &str,
    u: &mut UserSeen,
    tally: &mut Tally,
    progress: &Progress,
) -> Option<&'static str> {
    let key = Uuid::new_v4().simple().to_string();
    let body = serde_json::json!({ "ticket": ticket }).to_string();
    let req = Request {
        method: "POST",
        path,
        token: Some(token),
        forwarded_for: None,
        idempotency_key: Some(&key),
        body: Some(body.as_bytes()),
    };
    let mut last = None;
    for attempt in 1..=STORM_TRIES {
        let a = ask(conn, &req, "purchase", tally, progress, no_detail).await;
        let order = a
            .body
            .as_ref()
            .and_then(|v| v["order_id"].as_str().and_then(|s| s.parse().ok()));
        let k = u.keys.entry(key.clone()).or_default();
        k.unresolved = matches!(a.status, 0 | 503);
        match a.status {
            202 => {
                u.accepted.push(order);
                if let Some(order) = order.filter(|o| !k.orders.contains(o)) {
                    k.orders.push(order);
                }
            }
            0 | 503 => u.ambiguous = true,
            _ => {}
        }
        u.already |= a
            .kind
            .code
            .as_deref()
            .is_some_and(|c| c.starts_with("already_"));
        if !matches!(a.status, 0 | 503) {
            last = Some(a);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
    }
    let a = last?;
    match (a.status, a.kind.code.as_deref()) {
        (202, _) | (409, Some("already_bought")) => Some("bought"),
        (410, _) => Some("sold_out"),
        // The admission ended meanwhile: ask again where it stands.
        (403, _) => None,
        _ => Some("purchase refused"),
    }
}

/// One connection following its share of the users (every `concurrency`-th).
#[allow(clippy::too_many_arguments)]
async fn follow(
    mut conn: Conn,
    mut mine: Vec<Follower>,
    tokens: Arc<Vec<String>>,
    sale: i64,
    near: i64,
    deadline: Instant,
    shared: Arc<Shared>,
    progress: Arc<Progress>,
) -> (Tally, Tally, Vec<Follower>) {
    let (mut polls, mut buys) = (Tally::new(), Tally::new());
    let me_path = format!("/api/sales/{sale}/queue/me");
    let buy_path = format!("/api/sales/{sale}/purchase");
    let mut left = mine.iter().filter(|f| !f.done).count();
    while left > 0 && Instant::now() < deadline {
        let served = shared.served.load(Ordering::Relaxed);
        let no_stock = shared.no_stock.load(Ordering::Relaxed);
        let mut asked = false;
        for f in mine.iter_mut().filter(|f| !f.done) {
            let since = f.last_poll.map(|t| t.elapsed());
            let due = match (since, f.position) {
                (None, _) => true,
                // Where it stands is not known yet (a 503, say): ask gently.
                (Some(since), None) => since >= NEAR_EVERY,
                (Some(since), Some(p)) => {
                    let near =
                        p <= served + near || no_stock || f.state.as_deref() != Some("waiting");
                    since >= if near { NEAR_EVERY } else { FAR_EVERY }
                }
            };
            if !due {
                continue;
            }
            asked = true;
            f.last_poll = Some(Instant::now());
            f.polls += 1;
            let token = &tokens[f.index];
            let req = Request {
                method: "GET",
                path: &me_path,
                token: Some(token),
                forwarded_for: None,
                idempotency_key: None,
                body: None,
            };
            let a = ask(&mut conn, &req, "queue/me", &mut polls, &progress, state_of).await;
            let Some(v) = a.body.filter(|_| a.status == 200) else {
                continue;
            };
            if let Some(p) = v["position"].as_i64() {
                f.position = Some(p);
            }
            let state = v["state"].as_str().unwrap_or("").to_string();
            let ended = match state.as_str() {
                "waiting" => None,
                "admitted" => {
                    if let Some(e) = v["expires_at"].as_str()
                        && !f.admissions.iter().any(|x| x == e)
                    {
                        f.admissions.push(e.to_string());
                    }
                    match v["ticket"].as_str() {
                        Some(ticket) => {
                            let ticket = ticket.to_string();
                            buy(
                                &mut conn,
                                &buy_path,
                                token,
                                &ticket,
                                &mut f.seen,
                                &mut buys,
                                &progress,
                            )
                            .await
                        }
                        None => Some("admitted without a ticket"),
                    }
                }
                "passed" => Some("passed"),
                "bought" => Some("bought"),
                "sold_out" => Some("sold_out"),
                "not_joined" => Some("not_joined"),
                _ => Some("unknown"),
            };
            f.state = Some(ended.map(String::from).unwrap_or(state));
            if ended.is_some() {
                f.done = true;
                f.seen.decided = true;
                left -= 1;
            }
        }
        if !asked {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    (polls, buys, mine)
}
