//! The caller's own ballot as `GET /api/polls/{id}/my-ballot` answers it: what
//! the voters hash holds now (`rebuild::Held`) and which of the voter's accepted
//! requests (seqs) Postgres has.

use redis::aio::ConnectionLike;
use sqlx::PgPool;

use crate::domain::{PollId, UserId};
use crate::keys::Keys;
use crate::vote::rebuild::Held;
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
