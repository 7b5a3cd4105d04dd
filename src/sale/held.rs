//! What `already_bought` names: each refused buyer's orders of the sale, read
//! off the hot path in batches ([`HeldReader`]) and remembered for a few seconds
//! per process ([`HeldOrders`]).

use sqlx::PgPool;
use uuid::Uuid;

use super::pending;
use crate::domain::{SaleId, UserId};
use crate::error::AppError;

/// Most settled orders of one buyer [`of_buyers_in_sale`] names.
const BUYER_ORDERS: i64 = 100;

/// How long a process remembers what a buyer holds of a sale (see [`HeldOrders`]).
pub const HELD_ORDERS_TTL: std::time::Duration = std::time::Duration::from_secs(10);
/// Most (sale, buyer) pairs a process remembers (about 100 bytes each); past
/// that it starts over.
pub const HELD_ORDERS_MAX: usize = 65_536;
/// How long an `already_bought` waits for the buyer's orders before it answers
/// without them: the refusal never waits on a slow Postgres.
pub const HELD_ORDERS_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// What buyers hold of a sale, as the `already_bought` answer names it, in this
/// process's memory for [`HELD_ORDERS_TTL`]: a storm of repeat buyers (tens of
/// thousands of refusals a second) costs one Postgres read per buyer and sale
/// every ten seconds, not one per refusal. Only a settled order that still holds
/// its units is remembered (a pending one settles in a moment; a cancel may show
/// for up to the TTL).
#[derive(Default)]
pub struct HeldOrders {
    known: std::sync::Mutex<std::collections::HashMap<(SaleId, UserId), Remembered>>,
}

/// When a buyer's orders were read, and what they were.
type Remembered = (std::time::Instant, Vec<Uuid>);

impl HeldOrders {
    fn get(&self, sale: SaleId, user: UserId) -> Option<Vec<Uuid>> {
        let known = self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        known
            .get(&(sale, user))
            .filter(|(at, _)| at.elapsed() < HELD_ORDERS_TTL)
            .map(|(_, ids)| ids.clone())
    }

    fn remember(&self, sale: SaleId, user: UserId, ids: &[Uuid]) {
        let mut known = self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if known.len() >= HELD_ORDERS_MAX {
            known.clear();
        }
        known.insert((sale, user), (std::time::Instant::now(), ids.to_vec()));
    }
}

/// [`HeldReader`] through this process's memory ([`HeldOrders`]), waiting at most
/// [`HELD_ORDERS_WAIT`]: `None` when the orders could not be read in time
/// (Postgres or Redis slow or down, or the read's queue long), so the refusal goes
/// out without them.
pub async fn held_by(
    memory: &HeldOrders,
    reader: &std::sync::Arc<crate::batch::Batcher<HeldReader>>,
    sale: SaleId,
    user: UserId,
) -> Option<Vec<Uuid>> {
    if let Some(ids) = memory.get(sale, user) {
        return Some(ids);
    }
    match tokio::time::timeout(HELD_ORDERS_WAIT, reader.submit(sale, user)).await {
        Ok(Ok(Some(held))) => {
            if held.settled_holds {
                memory.remember(sale, user, &held.ids);
            }
            Some(held.ids)
        }
        _ => None,
    }
}

/// Most buyers of one sale whose orders one read asks for.
pub const HELD_READ_MAX: usize = 256;
/// Most reads of one sale's buyers' orders out at once, per HTTP worker.
pub const HELD_READS_IN_FLIGHT: usize = 2;

/// Reads what buyers hold of a sale for their `already_bought` answers in
/// batches (see [`crate::batch`]): the refusals of one sale that wait together
/// are one Postgres query, not one each. A storm of repeat buyers' first
/// refusals (each buyer's first in [`HELD_ORDERS_TTL`]) would otherwise be a
/// query per refusal, which costs the machine about as much as ten refusals. A
/// refusal that stopped waiting is left out of the next read
/// ([`crate::batch::Decider::DROP_ABANDONED`]), and a read takes at most
/// [`HELD_ORDERS_WAIT`], so while Postgres is slow the queue holds at most what
/// arrives in about that time.
pub struct HeldReader {
    pub db: PgPool,
    /// The process's shared connection, not the worker's: a long `XRANGE` reply
    /// never holds up the decisions on the worker's connection.
    pub redis: crate::redis_conn::Redis,
    pub keys: crate::keys::Keys,
}

/// A buyer's orders of one sale, as [`of_buyers_in_sale`] found them.
#[derive(Clone, Debug, PartialEq)]
pub struct Held {
    /// Settled (any status) or pending, oldest first.
    pub ids: Vec<Uuid>,
    /// A settled order among them still holds its units: the answer stays true
    /// until a cancel, so it may be remembered.
    pub settled_holds: bool,
}

impl crate::batch::Decider for HeldReader {
    type Key = SaleId;
    type Request = UserId;
    /// `None`: not read in time, or the read failed (the refusal goes without).
    type Reply = Option<Held>;
    const DROP_ABANDONED: bool = true;

    async fn decide(
        &self,
        _worker_redis: crate::redis_conn::Redis,
        sale: SaleId,
        users: Vec<UserId>,
    ) -> Result<Vec<Option<Held>>, AppError> {
        let deadline = tokio::time::Instant::now() + HELD_ORDERS_WAIT;
        let mut redis = self.redis.clone();
        Ok(of_buyers_in_sale(&self.db, &mut redis, &self.keys, sale, &users, deadline).await)
    }
}

/// Each buyer's orders of one sale, settled (any status) or pending, oldest first
/// (at most [`BUYER_ORDERS`] settled ones): what `already_bought` names. A refusal,
/// so it reads off the hot path, bounded, for a batch of buyers at once: their
/// settled orders (one query); for those of them none of whose orders holds its
/// units (none, or all expired or cancelled), also the pending ones (one `XRANGE`
/// of at most [`pending::BUYER_SCAN`] entries), and for those with none pending,
/// Postgres again (an order settled between the two reads). One answer per buyer
/// asked for, in order (a buyer asked twice is read once): `None` for a buyer whose
/// reads failed or were not done by `deadline` (a buyer whose settled order holds
/// is answered by the first query alone, whatever the later reads do).
pub async fn of_buyers_in_sale<C: redis::aio::ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &crate::keys::Keys,
    sale: SaleId,
    users: &[UserId],
    deadline: tokio::time::Instant,
) -> Vec<Option<Held>> {
    let mut distinct: Vec<i64> = users.iter().map(|u| u.get()).collect();
    distinct.sort_unstable();
    distinct.dedup();
    let Some(settled) = by_deadline(deadline, sale, settled_of_buyers(db, sale, &distinct)).await
    else {
        return vec![None; users.len()];
    };
    let holds = |found: Option<&Vec<(Uuid, bool)>>| {
        found.is_some_and(|f| f.iter().any(|(_, returned)| !returned))
    };
    let unsure: Vec<i64> = distinct
        .iter()
        .copied()
        .filter(|u| !holds(settled.get(u)))
        .collect();
    // The pending orders of those, and their settled ones read again where none is.
    let later = async {
        if unsure.is_empty() {
            return Ok(Default::default());
        }
        let pending = pending::of_buyers(redis, keys, sale, &unsure).await?;
        let again: Vec<i64> = unsure
            .iter()
            .copied()
            .filter(|u| pending.get(u).is_none_or(Vec::is_empty))
            .collect();
        let reread = if again.is_empty() {
            Default::default()
        } else {
            settled_of_buyers(db, sale, &again).await?
        };
        Ok::<_, AppError>((pending, reread))
    };
    let later = by_deadline(deadline, sale, later).await;
    let ids_of = |found: Option<&Vec<(Uuid, bool)>>| -> Vec<Uuid> {
        found.into_iter().flatten().map(|(id, _)| *id).collect()
    };
    users
        .iter()
        .map(|user| {
            let u = user.get();
            if holds(settled.get(&u)) {
                return Some(Held {
                    ids: ids_of(settled.get(&u)),
                    settled_holds: true,
                });
            }
            let (pending, reread) = later.as_ref()?;
            let pending = pending.get(&u).map(Vec::as_slice).unwrap_or_default();
            // No pending order: Postgres's second answer (an order may have settled
            // between the reads; it holds then).
            let found = if pending.is_empty() {
                reread.get(&u)
            } else {
                settled.get(&u)
            };
            let mut ids = ids_of(found);
            for id in pending {
                if !ids.contains(id) {
                    ids.push(*id);
                }
            }
            Some(Held {
                ids,
                settled_holds: holds(found),
            })
        })
        .collect()
}

/// A read of [`of_buyers_in_sale`] done by `deadline`, or `None` (it failed or took
/// too long: the refusals it was for go without their orders).
async fn by_deadline<T, E: std::fmt::Debug>(
    deadline: tokio::time::Instant,
    sale: SaleId,
    read: impl std::future::Future<Output = Result<T, E>>,
) -> Option<T> {
    match tokio::time::timeout_at(deadline, read).await {
        Ok(Ok(found)) => return Some(found),
        Ok(Err(e)) => {
            tracing::debug!(sale = %sale, error = ?e, "already_bought without its orders")
        }
        Err(_) => {
            tracing::debug!(sale = %sale, "already_bought without its orders: not read in time")
        }
    }
    None
}

/// Each buyer's settled orders of the sale, oldest first, at most [`BUYER_ORDERS`]
/// each, with whether each was returned (expired, cancelled or refunded): one
/// query for them all, each buyer's through the `(user_id)` index. A buyer
/// without any is absent.
async fn settled_of_buyers(
    db: &PgPool,
    sale: SaleId,
    users: &[i64],
) -> sqlx::Result<std::collections::HashMap<i64, Vec<(Uuid, bool)>>> {
    let rows: Vec<(i64, Uuid, bool)> = sqlx::query_as(
        "SELECT b.user_id, o.id, o.returned
         FROM unnest($2::bigint[]) AS b(user_id)
         CROSS JOIN LATERAL (
             SELECT id, accepted_at, status IN ('expired', 'cancelled', 'refunded') AS returned
             FROM orders WHERE user_id = b.user_id AND sale_id = $1
             ORDER BY accepted_at, id LIMIT $3) o
         ORDER BY b.user_id, o.accepted_at, o.id",
    )
    .bind(sale.get())
    .bind(users)
    .bind(BUYER_ORDERS)
    .fetch_all(db)
    .await?;
    let mut found: std::collections::HashMap<i64, Vec<(Uuid, bool)>> =
        std::collections::HashMap::new();
    for (user, id, returned) in rows {
        found.entry(user).or_default().push((id, returned));
    }
    Ok(found)
}
