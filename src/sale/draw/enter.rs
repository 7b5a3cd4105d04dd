//! An entry into a draw (one per account) and a shopper's standing in it.
//!
//! The entry is written in Postgres, under the draw's advisory lock held shared
//! and with Postgres's clock: the draw takes that lock alone and only once its
//! time has passed, so an entry either is in the draw or was refused
//! `entries_closed`, never lost between the two. Entries that arrive together are
//! written together ([`EntryWriter`]): one call of the `draw_enter` function
//! (migration 0028), answered only once it has committed.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;
use serde::Serialize;
use sqlx::PgPool;

use crate::domain::{SaleId, UserId};
use crate::error::AppError;
use crate::keys::Keys;
use crate::sale::record::SaleRow;

/// An entry: its id (what the draw hashes) and when it was made.
#[derive(Clone, Copy, Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Entry {
    pub entry_id: i64,
    pub entered_at: DateTime<Utc>,
}

/// What an entry came to.
#[derive(Clone, Copy, Debug)]
pub enum Entered {
    /// Entered (now or before: the same entry).
    Entry(Entry),
    /// Entries open in this many ms (Postgres's clock).
    NotOpen { in_ms: i64 },
    /// The draw's time has come (or it is drawn).
    Closed,
    /// No such draw.
    NoDraw,
}

/// Writes draw entries in batches (see [`crate::batch`]): the entries of one sale
/// that wait together are one call of `draw_enter` (the draw's lock held shared,
/// the draw's window read, one read of those already entered, one `INSERT` of the
/// rest), one round trip and one commit, not one each. One transaction per entry
/// held the draw's row `FOR SHARE` once per request, so an entry storm queued on
/// that row's lock and on a commit each: 2,561 fresh entries a second against
/// 13,176 joins of a waiting room in `scripts/bench-queue`. The batch as a
/// transaction of its own statements took seven round trips.
pub struct EntryWriter {
    pub db: PgPool,
}

impl crate::batch::Decider for EntryWriter {
    type Key = SaleId;
    type Request = UserId;
    type Reply = Entered;

    async fn decide(
        &self,
        _worker_redis: crate::redis_conn::Redis,
        sale: SaleId,
        users: Vec<UserId>,
    ) -> Result<Vec<Entered>, AppError> {
        enter_all(&self.db, sale, &users).await
    }
}

/// Enters each of `users` into `sale`'s draw, or finds the entry made before: one
/// answer per user, in order (a user asked twice gets the same entry twice).
///
/// One call of the `draw_enter` function (migration 0028), in its own implicit
/// transaction: the draw's lock held shared, the window read by Postgres's
/// clock, the entries read and written. The draw takes that lock alone (`run.rs`),
/// so it waits for the entries in flight and they for it. An advisory lock, not
/// the draw row's `FOR SHARE`: a row lock writes the row (a multixact once several
/// batches hold it) and makes even a batch of entries made before a write to
/// commit.
pub async fn enter_all(
    db: &PgPool,
    sale: SaleId,
    users: &[UserId],
) -> Result<Vec<Entered>, AppError> {
    let asked: Vec<i64> = users.iter().map(|u| u.get()).collect();
    type Answer = (
        String,
        Option<f64>,
        Option<i64>,
        Option<i64>,
        Option<DateTime<Utc>>,
    );
    let rows: Vec<Answer> = sqlx::query_as(
        "SELECT answer, opens_in_ms, entrant, entry, made_at FROM draw_enter($1, $2, $3, $4)",
    )
    .bind(sale.get())
    .bind(&asked)
    .bind(super::DRAW_LOCK_CLASS)
    .bind(super::draw_lock_key(sale))
    .fetch_all(db)
    .await?;
    let all = |answer: Entered| Ok(vec![answer; users.len()]);
    let mut found = HashMap::with_capacity(rows.len());
    for (answer, opens_in_ms, entrant, entry, made_at) in rows {
        match (answer.as_str(), entrant, entry, made_at) {
            ("entry", Some(user), Some(entry_id), Some(entered_at)) => {
                found.insert(
                    user,
                    Entry {
                        entry_id,
                        entered_at,
                    },
                );
            }
            ("no_draw", ..) => return all(Entered::NoDraw),
            ("closed", ..) => return all(Entered::Closed),
            ("not_open", ..) => {
                return all(Entered::NotOpen {
                    in_ms: opens_in_ms.unwrap_or(0.0).ceil() as i64,
                });
            }
            _ => {
                return Err(AppError::Internal(anyhow::anyhow!(
                    "draw_enter answered {answer:?} for sale {sale}"
                )));
            }
        }
    }
    users
        .iter()
        .map(|user| match found.get(&user.get()) {
            Some(entry) => Ok(Entered::Entry(*entry)),
            None => Err(AppError::Internal(anyhow::anyhow!(
                "the entry of user {user} into sale {sale} was neither written nor found"
            ))),
        })
        .collect()
}

/// Where an entrant stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Entered; the draw has not been made.
    Entered,
    /// Won: may buy until `claim_until`.
    Won { claim_until: DateTime<Utc> },
    /// Won and bought.
    Bought,
    /// Won, and not used: the claim window ended (the win passed on), or the
    /// sale closed or ended first.
    ClaimPassed,
    /// Not (yet) won, and a win may still pass to this entry: `position` 1 is next.
    Waitlisted { position: i64 },
    /// Not won, and no win can pass on any more (sold, ended, or no entries left).
    NotDrawn,
}

impl Standing {
    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Entered => "entered",
            Standing::Won { .. } => "won",
            Standing::Bought => "bought",
            Standing::ClaimPassed => "claim_passed",
            Standing::Waitlisted { .. } => "waitlisted",
            Standing::NotDrawn => "not_drawn",
        }
    }
}

#[derive(sqlx::FromRow)]
struct Row {
    entry_id: i64,
    entered_at: DateTime<Utc>,
    rank: Option<i32>,
    claim_until: Option<DateTime<Utc>>,
    outcome: Option<String>,
    drawn: bool,
    offered: i32,
    finished: bool,
    /// The sale closed early or its end passed (by Postgres's clock, as the draw's
    /// step reads it): no win is used any more, none passes on.
    over: bool,
    seed: Vec<u8>,
    recipe: i16,
    entries_digest: Option<Vec<u8>>,
    now: DateTime<Utc>,
}

/// `user`'s entry into `sale`'s draw and where it stands; `None` without one.
/// Whether a winner bought is read from Redis (the purchase's own record).
pub async fn standing<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    sale: &SaleRow,
    user: UserId,
) -> Result<Option<(Entry, Standing)>, AppError> {
    let row: Option<Row> = sqlx::query_as(
        "SELECT e.id AS entry_id, e.entered_at, e.rank, e.claim_until, e.outcome,
                d.drawn_at IS NOT NULL AS drawn, d.offered, d.finished_at IS NOT NULL AS finished,
                s.closed OR s.ends_at <= clock_timestamp() AS over,
                d.seed, d.recipe, d.entries_digest, clock_timestamp() AS now
         FROM draw_entries e JOIN sale_draws d ON d.sale_id = e.sale_id
           JOIN sales s ON s.id = e.sale_id
         WHERE e.sale_id = $1 AND e.user_id = $2",
    )
    .bind(sale.id.get())
    .bind(user.get())
    .fetch_optional(db)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let entry = Entry {
        entry_id: row.entry_id,
        entered_at: row.entered_at,
    };
    let k = keys.sale(sale.id);
    let standing = if !row.drawn {
        Standing::Entered
    } else if let Some(claim_until) = row.claim_until {
        if row.outcome.as_deref() == Some("bought")
            || super::pass::bought(redis, &k, sale.max_per_user, &[user.get()]).await?[0]
        {
            Standing::Bought
        } else if row.outcome.is_none() && claim_until > row.now && !row.over {
            Standing::Won { claim_until }
        } else {
            Standing::ClaimPassed
        }
    } else {
        let left: Option<i64> = redis::cmd("GET").arg(&k.stock).query_async(redis).await?;
        let open = !row.finished && !row.over;
        let rank = match row.rank {
            _ if !open || left.unwrap_or(0) <= 0 => 0,
            Some(rank) => i64::from(rank),
            None => place(db, sale.id, &order_key(&row)?, row.entry_id).await?,
        };
        if rank > i64::from(row.offered) {
            Standing::Waitlisted {
                position: rank - i64::from(row.offered),
            }
        } else {
            Standing::NotDrawn
        }
    };
    Ok(Some((entry, standing)))
}

/// The key a drawn sale's entries are keyed with (the seed, or the seed and the
/// entries digest the draw kept: see [`super::order`]).
fn order_key(row: &Row) -> Result<Vec<u8>, AppError> {
    use super::order::{Recipe, order_key};
    let digest: Option<[u8; 32]> = row
        .entries_digest
        .as_deref()
        .and_then(|d| d.try_into().ok());
    match (Recipe::of(i64::from(row.recipe)), digest) {
        (Some(Recipe::Seed), _) => Ok(row.seed.clone()),
        (Some(recipe), Some(digest)) => Ok(order_key(recipe, &row.seed, &digest)),
        _ => Err(AppError::Internal(anyhow::anyhow!(
            "entry {}: a drawn sale without its recipe {} or entries digest",
            row.entry_id,
            row.recipe
        ))),
    }
}

/// An entry's place in the seeded order (1 first), found in `draw_order` by its
/// key under `key` (migrations/0023_draw_order.sql); 0 when the order does not
/// hold it.
async fn place(db: &PgPool, sale: SaleId, key: &[u8], entry: i64) -> Result<i64, AppError> {
    let key = super::order::key8(&super::order::entry_key(key, entry));
    let rank: Option<i32> = sqlx::query_scalar(
        "SELECT rank FROM draw_order WHERE sale_id = $1 AND key8 = $2 AND entry_id = $3",
    )
    .bind(sale.get())
    .bind(key)
    .bind(entry)
    .fetch_optional(db)
    .await?;
    Ok(rank.map_or(0, i64::from))
}
