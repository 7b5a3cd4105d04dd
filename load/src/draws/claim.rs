//! The third and fourth phases: standings asked, winners buying with their
//! win's ticket (or letting it pass), losers refused, and the passed wins
//! followed until every win is settled.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::each::{Work, each};
use crate::client::{Request, Target};
use crate::fire::UserSeen;
use crate::prepare;
use crate::progress::Progress;
use crate::waiting::ask::{Tally, ask, no_detail, state_of};
use crate::waiting::follow::buy;

/// A user's standing in the draw (`GET .../entry/me`).
pub struct Standing {
    pub index: usize,
    /// `won`, `waitlisted`, `not_drawn`, ... (`none` without an answer).
    pub state: String,
    pub ticket: Option<String>,
    pub claim_until: Option<DateTime<Utc>>,
}

/// The draw's side of the run: what it asked and what it saw.
pub struct Claims {
    pub standings: Tally,
    pub buys: Tally,
    pub refused: Tally,
    /// Per buyer (by index): its purchases.
    pub seen: HashMap<usize, UserSeen>,
    /// Winners who let their win pass, and the losers' purchases answered 403
    /// `not_drawn` of those tried.
    pub unclaimed: Vec<usize>,
    pub losers_tried: usize,
    pub losers_refused: usize,
}

/// The standings of `users`.
pub async fn standings(
    target: &Target,
    sale: i64,
    tokens: &Arc<Vec<String>>,
    users: Vec<usize>,
    concurrency: usize,
    progress: &Arc<Progress>,
) -> anyhow::Result<(Tally, Vec<Standing>)> {
    let path = Arc::new(format!("/api/sales/{sale}/entry/me"));
    let tokens = tokens.clone();
    each(target, users, concurrency, progress, move |mut w, index| {
        let (tokens, path) = (tokens.clone(), path.clone());
        async move {
            let req = Request {
                method: "GET",
                path: &path,
                token: Some(&tokens[index]),
                forwarded_for: None,
                idempotency_key: None,
                body: None,
            };
            let a = ask(
                &mut w.conn,
                &req,
                "entry/me",
                &mut w.tally,
                &w.progress,
                state_of,
            )
            .await;
            let body = a.body.unwrap_or(Value::Null);
            let standing = Standing {
                index,
                state: body["state"].as_str().unwrap_or("none").to_string(),
                ticket: body["ticket"].as_str().map(String::from),
                claim_until: body["claim_until"].as_str().and_then(|t| t.parse().ok()),
            };
            (w, standing)
        }
    })
    .await
}

/// Winners buy with their ticket: all of them, or only the first `share`
/// percent (`share` < 100: the others are returned, their wins left to pass).
pub async fn buy_wins(
    target: &Target,
    sale: i64,
    tokens: &Arc<Vec<String>>,
    winners: Vec<(usize, String)>,
    share: u32,
    concurrency: usize,
    progress: &Arc<Progress>,
) -> anyhow::Result<(Tally, HashMap<usize, UserSeen>, Vec<usize>)> {
    let claiming = (winners.len() * share as usize).div_ceil(100);
    let unclaimed = winners[claiming..].iter().map(|(i, _)| *i).collect();
    let buyers = winners[..claiming].to_vec();
    let path = Arc::new(format!("/api/sales/{sale}/purchase"));
    let tokens = tokens.clone();
    let (tally, seen) = each(
        target,
        buyers,
        concurrency,
        progress,
        move |mut w, (i, ticket)| {
            let (tokens, path) = (tokens.clone(), path.clone());
            async move {
                let mut seen = UserSeen::default();
                let Work {
                    conn,
                    tally,
                    progress,
                } = &mut w;
                buy(conn, &path, &tokens[i], &ticket, &mut seen, tally, progress).await;
                (w, (i, seen))
            }
        },
    )
    .await?;
    Ok((tally, seen.into_iter().collect(), unclaimed))
}

/// `users`, who did not win, try to buy without a ticket: how many were
/// answered 403 `not_drawn`.
pub async fn losers_try(
    target: &Target,
    sale: i64,
    tokens: &Arc<Vec<String>>,
    users: Vec<usize>,
    progress: &Arc<Progress>,
) -> anyhow::Result<(Tally, usize)> {
    let path = Arc::new(format!("/api/sales/{sale}/purchase"));
    let tokens = tokens.clone();
    let (tally, refused) = each(target, users, 4, progress, move |mut w, i| {
        let (tokens, path) = (tokens.clone(), path.clone());
        async move {
            let key = uuid::Uuid::new_v4().simple().to_string();
            let req = Request {
                method: "POST",
                path: &path,
                token: Some(&tokens[i]),
                forwarded_for: None,
                idempotency_key: Some(&key),
                body: Some(b"{}".as_slice()),
            };
            let a = ask(
                &mut w.conn,
                &req,
                "purchase without a win",
                &mut w.tally,
                &w.progress,
                no_detail,
            )
            .await;
            let refused = a.status == 403 && a.kind.code.as_deref() == Some("not_drawn");
            (w, refused)
        }
    })
    .await?;
    Ok((tally, refused.into_iter().filter(|r| *r).count()))
}

/// The passes: until `deadline`, reads the published draw every 250 ms; every
/// entry a passed win went to asks its standing and buys. Ends once every
/// published win is settled and the stock is sold or every entry was offered.
/// The last publication read.
#[allow(clippy::too_many_arguments)]
pub async fn follow_passes(
    target: &Target,
    admin: &str,
    sale: i64,
    tokens: &Arc<Vec<String>>,
    user_of: &HashMap<i64, usize>,
    stock: i64,
    deadline: Instant,
    claims: &mut Claims,
    progress: &Arc<Progress>,
) -> anyhow::Result<Value> {
    let draw_path = format!("/api/sales/{sale}/draw");
    let mut known: usize = claims.seen.len() + claims.unclaimed.len();
    loop {
        let draw = prepare::call(target, "GET", &draw_path, admin, None).await?;
        let winners = draw["winners"].as_array().cloned().unwrap_or_default();
        let fresh: Vec<usize> = winners
            .iter()
            .skip(known)
            .filter_map(|w| {
                w["entry_id"]
                    .as_i64()
                    .and_then(|e| user_of.get(&e))
                    .copied()
            })
            .collect();
        known = winners.len();
        if !fresh.is_empty() {
            let (t, got) = standings(target, sale, tokens, fresh, 16, progress).await?;
            claims.standings.add(t);
            let wins = got
                .into_iter()
                .filter_map(|s| s.ticket.map(|t| (s.index, t)))
                .collect();
            let (t, seen, _) = buy_wins(target, sale, tokens, wins, 100, 16, progress).await?;
            claims.buys.add(t);
            claims.seen.extend(seen);
        }
        let settled = winners.iter().all(|w| w["outcome"].is_string());
        let bought = winners.iter().filter(|w| w["outcome"] == "bought").count() as i64;
        let offered_all = draw["entries"].as_u64() == Some(winners.len() as u64);
        if (settled && (bought >= stock || offered_all)) || Instant::now() >= deadline {
            return Ok(draw);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
