//! A sale's orders stream entry, as `lua/purchase_batch.lua` writes it: one entry
//! per decision batch that accepted, carrying all of the batch's orders, so that
//! the script appends once and settlement reads, acknowledges and deletes once per
//! batch, not per order. Every reader of the stream (settlement, the pending
//! orders' views, the rebuild) parses entries here.
//!
//! An entry has `sale_id`, `at_ms` (when the script accepted the batch) and
//! `orders`: one `<order>:<user>:<quantity>[:<key>]` per order, separated by single
//! spaces (a purchase key has no space and comes last, so a `:` in it is its own).
//! An entry written before this layout (one order: `order_id`, `user_id`, `at_ms`,
//! `quantity` when more than one, `idem` with a key) is read too, so an upgrade
//! settles what the previous version accepted.

use redis::streams::StreamId;
use uuid::Uuid;

use crate::domain::PurchaseKey;

/// One accepted order of a stream entry.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryOrder {
    pub order: Uuid,
    pub user: i64,
    /// Units bought (1 for a sale of one per customer).
    pub units: i64,
    /// When the purchase script accepted it (its clock, in ms).
    pub at_ms: i64,
    /// The purchase's idempotency key, if it carried one.
    pub key: Option<String>,
}

/// The entry's sale id, when it names one.
pub fn sale_of(entry: &StreamId) -> Option<i64> {
    entry.get("sale_id")
}

/// The orders an entry carries, in the order the script accepted them; `None` for
/// an entry that is not one of ours (a field missing, a piece that does not parse).
pub fn orders_of(entry: &StreamId) -> Option<Vec<EntryOrder>> {
    // `at_ms` is the script's clock; the entry id starts with the same
    // milliseconds, should the field be missing.
    let at_ms = entry
        .get::<i64>("at_ms")
        .or_else(|| entry.id.split_once('-').and_then(|(ms, _)| ms.parse().ok()))?;
    if let Some(packed) = entry.get::<String>("orders") {
        return packed
            .split(' ')
            .map(|piece| order_of_piece(piece, at_ms))
            .collect();
    }
    // One order per entry (written before batch entries).
    let order = Uuid::parse_str(&entry.get::<String>("order_id")?).ok()?;
    let units = match entry.get::<i64>("quantity") {
        Some(q) if q >= 1 => q,
        Some(_) => return None,
        None => 1,
    };
    Some(vec![EntryOrder {
        order,
        user: entry.get("user_id")?,
        units,
        at_ms,
        key: entry.get::<String>("idem").and_then(checked_key),
    }])
}

/// `<order>:<user>:<quantity>[:<key>]`.
fn order_of_piece(piece: &str, at_ms: i64) -> Option<EntryOrder> {
    let mut parts = piece.splitn(4, ':');
    let order = Uuid::parse_str(parts.next()?).ok()?;
    let user: i64 = parts.next()?.parse().ok()?;
    let units: i64 = parts.next()?.parse().ok().filter(|q| *q >= 1)?;
    Some(EntryOrder {
        order,
        user,
        units,
        at_ms,
        key: parts.next().and_then(|k| checked_key(k.to_string())),
    })
}

/// Only a parsed key reached the script; should anything else be there, the order
/// goes on without it (never lost over its key).
fn checked_key(key: String) -> Option<String> {
    PurchaseKey::parse(key.as_bytes()).is_ok().then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;
    use std::collections::HashMap;

    fn entry(id: &str, fields: &[(&str, &str)]) -> StreamId {
        StreamId {
            id: id.into(),
            map: fields
                .iter()
                .map(|(k, v)| (k.to_string(), Value::BulkString(v.as_bytes().to_vec())))
                .collect::<HashMap<_, _>>(),
            ..Default::default()
        }
    }

    const A: &str = "6f0c7b62-0d3b-4c1e-9d5e-2a7a1c9b8e01";
    const B: &str = "6f0c7b62-0d3b-4c1e-9d5e-2a7a1c9b8e02";

    #[test]
    fn a_batch_entry_gives_each_order_with_the_batch_time() {
        let orders = format!("{A}:7:1 {B}:9:3:retry:abc-1");
        let e = entry(
            "1700000000000-0",
            &[
                ("sale_id", "4"),
                ("at_ms", "1700000000123"),
                ("orders", &orders),
            ],
        );
        assert_eq!(sale_of(&e), Some(4));
        let got = orders_of(&e).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0],
            EntryOrder {
                order: A.parse().unwrap(),
                user: 7,
                units: 1,
                at_ms: 1_700_000_000_123,
                key: None
            }
        );
        assert_eq!(got[1].user, 9);
        assert_eq!(got[1].units, 3);
        assert_eq!(got[1].key.as_deref(), Some("retry:abc-1"));
    }

    #[test]
    fn an_entry_of_one_order_from_before_batch_entries_is_read() {
        let e = entry(
            "1700000000000-5",
            &[
                ("order_id", A),
                ("sale_id", "4"),
                ("user_id", "7"),
                ("quantity", "2"),
                ("idem", "k1"),
            ],
        );
        let got = orders_of(&e).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].units, 2);
        assert_eq!(got[0].at_ms, 1_700_000_000_000, "the entry id's time");
        assert_eq!(got[0].key.as_deref(), Some("k1"));
    }

    #[test]
    fn a_piece_that_does_not_parse_makes_the_entry_not_ours() {
        for orders in [
            format!("{A}:7:1 nonsense"),
            format!("{A}:7:0"),
            format!("{A}:x:1"),
            format!("{A}:7:1  {B}:8:1"),
            String::new(),
        ] {
            let e = entry(
                "1-0",
                &[("sale_id", "4"), ("at_ms", "1"), ("orders", &orders)],
            );
            assert_eq!(orders_of(&e), None, "{orders:?}");
        }
        assert_eq!(orders_of(&entry("1-0", &[("sale_id", "4")])), None);
    }

    #[test]
    fn a_key_that_is_not_a_purchase_key_is_dropped_not_the_order() {
        let orders = format!("{A}:7:1:bad/key");
        let e = entry("1-0", &[("at_ms", "1"), ("orders", &orders)]);
        let got = orders_of(&e).unwrap();
        assert_eq!(got[0].key, None);
    }
}
