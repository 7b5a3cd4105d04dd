//! The caller's own ballot as `GET /api/polls/{id}/my-ballot` answers it: what
//! the voters hash holds now (`rebuild::Held`) and which of the voter's accepted
//! requests (seqs) Postgres has ([`mine`]), made into the answer's body
//! ([`Mine::answer`]: the receipts, what counts, what is left of a budget).

use std::collections::HashSet;

use redis::aio::ConnectionLike;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::auth::token::HmacSha256;
use crate::domain::{PollId, UserId};
use crate::keys::Keys;
use crate::vote::rebuild::Held;
use crate::vote::receipt::receipt_keyed;
use crate::vote::setting::BallotKind;

/// A voter's ballot in one poll.
pub struct Mine {
    /// The ballot that counts now; `None` before any vote (or a value this
    /// version cannot read).
    pub held: Option<Held>,
    /// Seqs of the voter's requests Postgres holds.
    pub settled: Vec<i32>,
}

/// The voter's ballot in `poll` (of `kind`): one pipelined `EXISTS` + `HGET`, then
/// one query for the settled seqs. `Ok(None)`: Redis does not hold the poll (it
/// needs a rebuild).
pub async fn mine<C: ConnectionLike>(
    redis: &mut C,
    db: &PgPool,
    keys: &Keys,
    (poll, kind): (PollId, BallotKind),
    user: UserId,
) -> Result<Option<Mine>, crate::error::AppError> {
    let k = keys.poll(poll);
    let (loaded, value): (bool, Option<String>) = redis::pipe()
        .exists(&k.meta)
        .hget(&k.voters, user.get())
        .query_async(redis)
        .await?;
    if !loaded {
        return Ok(None);
    }
    let held = value.as_deref().and_then(|v| Held::parse(kind, v));
    let settled: Vec<i32> =
        sqlx::query_scalar("SELECT seq FROM votes WHERE poll_id = $1 AND user_id = $2")
            .bind(poll.get())
            .bind(user.get())
            .fetch_all(db)
            .await?;
    Ok(Some(Mine { held, settled }))
}

/// One accepted request of the voter.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Receipt {
    receipt: Uuid,
    /// 1 for the voter's first accepted request of the poll, then 2, ...
    seq: i32,
    /// In Postgres (settlement has written it).
    settled: bool,
    /// A later ballot replaced this one (single, multi, ranked with `allow_change`).
    replaced: bool,
}

/// One option of a budget voter's votes.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Spent {
    option_id: i64,
    count: i64,
}

/// The caller's ballot as it counts now.
#[derive(Serialize, utoipa::ToSchema)]
pub struct MyBallot {
    #[schema(value_type = i64)]
    poll_id: PollId,
    /// The poll's kind: `single`, `multi`, `budget` or `ranked`.
    ballot: BallotKind,
    /// Whether the caller has a ballot (any vote) in this poll.
    voted: bool,
    /// single, multi, ranked: the options of the ballot that counts, in the order
    /// sent (ranked: most preferred first); empty before voting.
    #[serde(skip_serializing_if = "Option::is_none")]
    choices: Option<Vec<i64>>,
    /// budget: votes per option, in the order first given.
    #[serde(skip_serializing_if = "Option::is_none")]
    votes: Option<Vec<Spent>>,
    /// budget: votes left to spend.
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining: Option<i64>,
    /// Every accepted request, first first.
    receipts: Vec<Receipt>,
    /// Every request that counts is in Postgres.
    settled: bool,
}

impl Mine {
    /// `user`'s ballot in `poll` (of `kind`, giving each voter `votes_per_user` if a
    /// budget) as `my-ballot` answers it: a receipt (keyed with `mac`, the server's
    /// [`crate::auth::token::TokenKey::mac`]) for each accepted request up to the one
    /// that counts, all but the last replaced unless the poll is a budget's; the
    /// choices, or the votes per option and what is left to spend; and whether
    /// Postgres has every request that counts.
    pub fn answer(
        self,
        (poll, kind): (PollId, BallotKind),
        votes_per_user: Option<i32>,
        user: UserId,
        mac: &HmacSha256,
    ) -> MyBallot {
        let Mine { held, settled } = self;
        let last = held.as_ref().map_or(0, |h| h.seq);
        // A set: a voter who changed their ballot often has as many rows as receipts,
        // and a list's `contains` for each would cost their square.
        let settled: HashSet<i32> = settled.into_iter().collect();
        let receipts: Vec<Receipt> = (1..=last)
            .map(|seq| Receipt {
                receipt: receipt_keyed(mac, poll, user, seq),
                seq,
                settled: settled.contains(&seq),
                replaced: kind != BallotKind::Budget && seq < last,
            })
            .collect();
        let all_settled = receipts.iter().filter(|r| !r.replaced).all(|r| r.settled);
        let budget = kind == BallotKind::Budget;
        let spent: i64 = held
            .as_ref()
            .map_or(0, |h| h.spent.iter().map(|(_, c)| c).sum());
        MyBallot {
            poll_id: poll,
            ballot: kind,
            voted: held.is_some(),
            choices: (!budget)
                .then(|| held.as_ref().map(|h| h.choices.clone()).unwrap_or_default()),
            votes: budget.then(|| {
                held.as_ref()
                    .map(|h| {
                        h.spent
                            .iter()
                            .map(|&(option_id, count)| Spent { option_id, count })
                            .collect()
                    })
                    .unwrap_or_default()
            }),
            remaining: budget
                .then(|| i64::from(votes_per_user.unwrap_or(0)) - spent)
                .map(|r| r.max(0)),
            receipts,
            settled: all_settled,
        }
    }
}
