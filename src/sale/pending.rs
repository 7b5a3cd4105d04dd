//! Orders accepted in Redis and not yet settled in Postgres: the sale's pending hash
//! (one field per decision batch, see [`PendingHash`]), its orders stream (what the purchase script wrote, with the
//! time it accepted it), and what a buyer holds of a sale (its buyers hash, or its
//! units per buyer for a sale of more than one per customer). The purchase script
//! writes them (`lua/purchase_batch.lua`), settlement empties them; the API and the
//! pages read them only here.

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;

use super::order_id::{batch_tag, sale_of_order};
use crate::domain::{SaleId, UserId};
use crate::error::AppError;
use crate::keys::Keys;
use uuid::Uuid;

/// The layout of a sale's pending hash (written by `lua/purchase_batch.lua`, emptied
/// by `lua/settle_pending.lua`):
/// - one field per decision batch, named by the batch tag its order ids share
///   ([`batch_tag`]), whose value is the batch's orders as its stream entry holds
///   them (`<order>:<user>:<quantity>[:<key>]`, separated by spaces);
/// - `#`, the orders the batch fields hold, and `#b`, the batch fields (both absent
///   when there are none);
/// - fields of a whole order id (36 characters), an earlier version's: order id ->
///   user, counted by neither counter.
pub struct PendingHash;

impl PendingHash {
    /// Field counting the orders of the batch fields.
    pub const ORDERS: &'static str = "#";
    /// Field counting the batch fields.
    pub const FIELDS: &'static str = "#b";

    /// Every pending order of a hash read whole (`HGETALL`): order id and user.
    pub fn orders(fields: Vec<(String, String)>) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        for (field, value) in fields {
            if field == Self::ORDERS || field == Self::FIELDS {
                continue;
            }
            if field.len() == 36 {
                if let Ok(user) = value.parse() {
                    out.push((field, user));
                }
                continue;
            }
            out.extend(value.split(' ').filter_map(Self::item));
        }
        out
    }

    /// One order of a batch field: `<order>:<user>:...`.
    fn item(item: &str) -> Option<(String, i64)> {
        let mut parts = item.splitn(3, ':');
        let order = parts.next()?;
        let user = parts.next()?.parse().ok()?;
        (order.len() == 36).then(|| (order.to_string(), user))
    }

    /// The pending orders, from `HLEN` and the two counters: the batch fields'
    /// orders, and an earlier version's fields one order each.
    pub fn count(len: i64, orders: Option<i64>, fields: Option<i64>) -> i64 {
        let counters = i64::from(orders.is_some()) + i64::from(fields.is_some());
        let legacy = len - counters - fields.unwrap_or(0);
        orders.unwrap_or(0) + legacy.max(0)
    }
}

static SETTLE_PENDING: std::sync::LazyLock<crate::lua::Script> = std::sync::LazyLock::new(|| {
    crate::lua::Script::new(include_str!("../../lua/settle_pending.lua"))
});

/// Drops settled orders from a sale's pending hash (`lua/settle_pending.lua`, see
/// [`PendingHash`]); `records`: per settled stream entry, its `orders` text (a
/// batch's field holds the same string: dropped whole, without work per order,
/// when it holds nothing else) or an earlier version's entry's order id. Returns
/// how many orders it held. Orders it no longer holds (a redelivery) count nothing.
pub async fn drop_settled<C: ConnectionLike>(
    redis: &mut C,
    pending: &str,
    records: &[String],
) -> redis::RedisResult<i64> {
    SETTLE_PENDING
        .key(pending)
        .arg(records)
        .invoke_async(redis)
        .await
}

/// [`drop_settled`], and in the same call (one event-loop turn of Redis, so one
/// fsync under `appendfsync always`) `XACK` and `XDEL` of the settled `entries` of
/// `stream` for consumer group `group`: the entries go exactly when their orders
/// leave the hash.
pub async fn drop_settled_and_acknowledge<C: ConnectionLike>(
    redis: &mut C,
    pending: &str,
    records: &[String],
    stream: &str,
    group: &str,
    entries: &[&str],
) -> redis::RedisResult<i64> {
    SETTLE_PENDING
        .key(pending)
        .key(stream)
        .arg(group)
        .arg(entries.len())
        .arg(entries)
        .arg(records)
        .invoke_async(redis)
        .await
}

/// An order accepted and not yet in Postgres: its sale (carried by the id) and its
/// owner, from the sale's pending hash.
pub async fn owner<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    order: &Uuid,
) -> Result<Option<(SaleId, i64)>, AppError> {
    let Some(sale) = sale_of_order(order) else {
        return Ok(None);
    };
    let id = order.to_string();
    let Some(tag) = batch_tag(&id) else {
        return Ok(None);
    };
    let (legacy, batch): (Option<i64>, Option<String>) = redis::cmd("HMGET")
        .arg(&keys.sale(sale).pending)
        .arg(&id)
        .arg(tag)
        .query_async(redis)
        .await?;
    let owner = legacy.or_else(|| {
        batch?
            .split(' ')
            .filter_map(PendingHash::item)
            .find(|(o, _)| *o == id)
            .map(|(_, user)| user)
    });
    Ok(owner.map(|owner| (sale, owner)))
}

/// How many of the sale's accepted orders are not in Postgres yet.
pub async fn count<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
) -> Result<i64, AppError> {
    let pending = &keys.sale(sale).pending;
    let (len, orders, fields): (i64, Option<i64>, Option<i64>) = redis::pipe()
        .hlen(pending)
        .hget(pending, PendingHash::ORDERS)
        .hget(pending, PendingHash::FIELDS)
        .query_async(redis)
        .await?;
    Ok(PendingHash::count(len, orders, fields))
}

/// An accepted order as its sale's orders stream holds it (`lua/purchase_batch.lua`).
pub struct PendingOrder {
    pub order_id: String,
    pub user: i64,
    /// When the purchase script accepted it: the time its order will carry once
    /// settled.
    pub accepted: DateTime<Utc>,
}

impl PendingOrder {
    /// The orders of one stream entry (see [`super::entry`]).
    fn of_entry(entry: &redis::streams::StreamId) -> Vec<Self> {
        super::entry::orders_of(entry)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|o| {
                Some(PendingOrder {
                    order_id: o.order.to_string(),
                    user: o.user,
                    accepted: DateTime::from_timestamp_millis(o.at_ms)?,
                })
            })
            .collect()
    }
}

/// The exact count of the sale's pending orders and the oldest `shown` of them, in
/// one round trip. The purchase script writes an accepted order to the pending hash
/// and the stream together, and settlement drops it from both, so the stream's
/// entries hold the pending orders, with the time each was accepted.
pub async fn oldest<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
    shown: usize,
) -> Result<(i64, Vec<PendingOrder>), AppError> {
    let keys = keys.sale(sale);
    let (len, orders, fields, stream): (
        i64,
        Option<i64>,
        Option<i64>,
        redis::streams::StreamRangeReply,
    ) = redis::pipe()
        .hlen(&keys.pending)
        .hget(&keys.pending, PendingHash::ORDERS)
        .hget(&keys.pending, PendingHash::FIELDS)
        .cmd("XRANGE")
        .arg(&keys.orders)
        .arg("-")
        .arg("+")
        .arg("COUNT")
        .arg(shown)
        .query_async(redis)
        .await?;
    let mut entries: Vec<PendingOrder> =
        stream.ids.iter().flat_map(PendingOrder::of_entry).collect();
    entries.truncate(shown);
    Ok((PendingHash::count(len, orders, fields), entries))
}

/// Most stream entries [`of_buyers`] reads (each a decision batch's orders): the
/// pending orders of a sale are those accepted within the settlement lag, normally
/// far fewer.
pub const BUYER_SCAN: usize = 1000;

/// The buyers' orders of the sale that are not in Postgres yet, among the first
/// [`BUYER_SCAN`] entries of its orders stream (one `XRANGE` for them all): for the
/// answer `already_bought`, which names them. Each buyer asked for is in the map,
/// with no orders when none is pending; orders in the order of the stream.
pub async fn of_buyers<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
    users: &[i64],
) -> Result<std::collections::HashMap<i64, Vec<Uuid>>, AppError> {
    let stream: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(&keys.sale(sale).orders)
        .arg("-")
        .arg("+")
        .arg("COUNT")
        .arg(BUYER_SCAN)
        .query_async(redis)
        .await?;
    let mut found: std::collections::HashMap<i64, Vec<Uuid>> =
        users.iter().map(|u| (*u, Vec::new())).collect();
    for order in stream
        .ids
        .iter()
        .flat_map(|e| super::entry::orders_of(e).unwrap_or_default())
    {
        if let Some(orders) = found.get_mut(&order.user) {
            orders.push(order.order);
        }
    }
    Ok(found)
}

/// What a buyer holds of one sale, as its page shows it.
pub struct Holding {
    /// The buyer can buy no more: an order of a sale of one per customer, or
    /// `max_per_user` units of a sale of more.
    pub bought: bool,
    /// Units held of a sale of more than one per customer (0 otherwise).
    pub held: i64,
}

/// A sale of one per customer: a buyer in its buyers hash has bought. A sale of more
/// counts the units each buyer holds: one may buy again up to the cap.
pub async fn holding<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
    max_per_user: i32,
    user: UserId,
) -> Result<Holding, AppError> {
    let keys = keys.sale(sale);
    if max_per_user > 1 {
        let held: Option<i64> = redis::cmd("HGET")
            .arg(&keys.units)
            .arg(user.get())
            .query_async(redis)
            .await?;
        let held = held.unwrap_or(0).max(0);
        Ok(Holding {
            bought: held >= i64::from(max_per_user),
            held,
        })
    } else {
        let member: bool = redis::cmd("HEXISTS")
            .arg(&keys.buyers)
            .arg(user.get())
            .query_async(redis)
            .await?;
        Ok(Holding {
            bought: member,
            held: 0,
        })
    }
}

/// For each of `sales` (`(id, max_per_user)`), in one round trip: whether the user
/// is in its buyers hash, and the units they hold (of a sale of more than one per
/// customer; else 1), from 1 to 1,000.
pub async fn bought_of<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    sales: &[(SaleId, i32)],
    user: UserId,
) -> Result<Vec<(bool, i32)>, AppError> {
    if sales.is_empty() {
        return Ok(Vec::new());
    }
    let user = user.get();
    let mut pipe = redis::pipe();
    for &(sale, max_per_user) in sales {
        let keys = keys.sale(sale);
        pipe.hexists(&keys.buyers, user);
        if max_per_user > 1 {
            pipe.hget(&keys.units, user);
        }
    }
    let answers: Vec<Option<i64>> = pipe.query_async(redis).await?;
    let mut answers = answers.into_iter();
    Ok(sales
        .iter()
        .map(|&(_, max_per_user)| {
            let member = answers.next().flatten().unwrap_or(0) == 1;
            let held = if max_per_user > 1 {
                answers.next().flatten().unwrap_or(1)
            } else {
                1
            };
            (member, i32::try_from(held.clamp(1, 1000)).unwrap_or(1))
        })
        .collect())
}
