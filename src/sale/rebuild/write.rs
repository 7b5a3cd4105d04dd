//! What a sale's rebuild writes into Redis besides the buyers hash and the stock:
//! the idempotency keys, units per buyer (a sale of more than one per customer)
//! and the buyers hash with their orders.

use std::collections::{HashMap, HashSet};

use crate::error::AppError;
use crate::redis_conn::Redis;
use crate::restore::CHUNK;

/// One order of a sale as its rebuild reads it from Postgres.
pub(super) struct SeenOrder {
    pub(super) id: uuid::Uuid,
    pub(super) user: i64,
    pub(super) units: i64,
    /// It holds its units: not expired, or expired on a sale whose expired buyers
    /// stay buyers.
    pub(super) holds: bool,
}

/// What a sale's rebuild reads, Redis first and Postgres second (see the module doc).
pub(super) struct SaleSeen {
    /// Orders in Postgres.
    pub(super) orders: Vec<SeenOrder>,
    /// Orders in the stream that Postgres does not have yet: order, user, units.
    /// (An entry left behind by a worker that died after its commit is Postgres's.)
    pub(super) unsettled: Vec<(uuid::Uuid, i64, i64)>,
    /// Idempotency keys of orders accepted within `purchase_key_ttl`, settled or
    /// not: `<user>:<key>` and the answer stored under it.
    pub(super) keys: Vec<(String, String)>,
    /// The buyers hash as Redis has it.
    pub(super) known: HashSet<i64>,
    /// Users holding units: of the orders that hold theirs, of the unsettled ones,
    /// and of pending orders Postgres does not have.
    pub(super) buyers: HashSet<i64>,
    /// The pending orders (the pending hash's) Postgres does not have: order, user.
    pub(super) pending: Vec<(uuid::Uuid, i64)>,
    /// The pending hash's orders Postgres has: left behind when settlement's drop
    /// of them was lost (a failover to a replica that had the stream's
    /// acknowledgement but not the drop); the rebuild drops them.
    pub(super) settled_pending: Vec<String>,
}

/// The idempotency keys of the orders read (those accepted within the TTL), written
/// into the sale's keys hash before the sale is stamped trusted: a retry with a key
/// whose 202 Redis forgot gets that 202 again, never a second order. What the hash
/// still holds stays (a refusal's answer, kept by a restart). Its expiry is reset.
pub(super) async fn restore_keys(
    redis: &mut Redis,
    k: &crate::keys::SaleKeys,
    seen: &SaleSeen,
    key_ttl: std::time::Duration,
) -> Result<(), AppError> {
    if seen.keys.is_empty() {
        return Ok(());
    }
    for chunk in seen.keys.chunks(CHUNK) {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(&k.idem);
        for (field, answer) in chunk {
            cmd.arg(field).arg(answer);
        }
        let _: i64 = cmd.query_async(&mut *redis).await?;
    }
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(&k.idem)
        .arg(u64::try_from(key_ttl.as_millis()).unwrap_or(u64::MAX))
        .query_async(&mut *redis)
        .await?;
    Ok(())
}

/// On a sale of more than one per customer: units per buyer and units sold, counted
/// from the orders that hold units in Postgres and the unsettled ones, written over
/// what Redis had. Then units left are units ever offered minus units sold.
pub(super) async fn restore_units(
    redis: &mut Redis,
    k: &crate::keys::SaleKeys,
    seen: &SaleSeen,
) -> Result<(), AppError> {
    let mut units: HashMap<i64, i64> = HashMap::new();
    for o in seen.orders.iter().filter(|o| o.holds) {
        *units.entry(o.user).or_default() += o.units;
    }
    for (_, user, n) in &seen.unsettled {
        *units.entry(*user).or_default() += n;
    }
    let sold: i64 = units.values().sum();
    let _: () = redis::cmd("DEL")
        .arg(&k.units)
        .query_async(&mut *redis)
        .await?;
    let flat: Vec<i64> = units.iter().flat_map(|(u, n)| [*u, *n]).collect();
    for chunk in flat.chunks(2 * CHUNK) {
        let _: i64 = redis::cmd("HSET")
            .arg(&k.units)
            .arg(chunk)
            .query_async(&mut *redis)
            .await?;
    }
    let _: () = redis::cmd("SET")
        .arg(&k.sold)
        .arg(sold)
        .query_async(&mut *redis)
        .await?;
    Ok(())
}

/// An order as the buyers hash keeps it: from its 15th character (the first
/// 14 are its sale's; `lua/purchase_batch.lua` puts them back). `None` for an id
/// that does not carry the sale's (none is made so; the refusal then reads it).
fn held_value(sale: crate::domain::SaleId, order: &uuid::Uuid) -> Option<String> {
    let carries_sale = order.as_bytes()[..6] == sale.get().to_be_bytes()[2..];
    carries_sale.then(|| order.to_string()[14..].to_string())
}

/// Every buyer the orders name, with the order that makes them one (one that
/// holds its units in Postgres, else the unsettled one, else the pending one),
/// written into the buyers hash over what it had, so an `already_bought` after
/// the rebuild names it without Postgres ('' for an order id that does not carry
/// the sale's: the refusal then reads it). A buyer without any order found (only
/// Redis knew them) keeps what the hash had.
pub(super) async fn restore_buyers(
    redis: &mut Redis,
    sale: crate::domain::SaleId,
    k: &crate::keys::SaleKeys,
    seen: &SaleSeen,
) -> Result<(), AppError> {
    let mut held: HashMap<i64, uuid::Uuid> = HashMap::new();
    for o in seen.orders.iter().filter(|o| o.holds) {
        held.entry(o.user).or_insert(o.id);
    }
    let later = seen.unsettled.iter().map(|(order, user, _)| (order, user));
    for (order, user) in later.chain(seen.pending.iter().map(|(o, u)| (o, u))) {
        held.entry(*user).or_insert(*order);
    }
    let flat: Vec<String> = held
        .iter()
        .filter(|(user, _)| seen.buyers.contains(user))
        .flat_map(|(user, order)| {
            [
                user.to_string(),
                held_value(sale, order).unwrap_or_default(),
            ]
        })
        .collect();
    for chunk in flat.chunks(2 * CHUNK) {
        let _: i64 = redis::cmd("HSET")
            .arg(&k.buyers)
            .arg(chunk)
            .query_async(&mut *redis)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::held_value;
    use crate::domain::Id;

    #[test]
    fn a_held_value_is_the_id_after_its_sales_prefix() {
        let sale = Id::new(4242).unwrap();
        let order = crate::sale::order_id::new_order_id(sale);
        let text = order.to_string();
        let kept = held_value(sale, &order).unwrap();
        assert_eq!(kept.len(), 22);
        assert_eq!(format!("{}{kept}", &text[..14]), text);
        assert_eq!(held_value(Id::new(4243).unwrap(), &order), None);
        assert_eq!(held_value(sale, &uuid::Uuid::new_v4()), None);
    }
}
