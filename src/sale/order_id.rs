//! Order ids: UUIDv8 that carry their sale's id, so an order can be found in its
//! sale's pending hash before it reaches Postgres, and a batch tag its decision
//! batch shares.

use uuid::Uuid;

use crate::domain::{Id, SaleId};

/// Order ids carry their sale id in the first six bytes (a UUIDv8), so an order's
/// status can be found in its sale's pending hash before it reaches Postgres.
pub fn new_order_id(sale: SaleId) -> Uuid {
    new_order_ids(sale, 1)[0]
}

/// `n` order ids for one decision batch: the sale id in bytes 0 to 5, then the
/// batch tag in bytes 6 to 11, which the batch shares: beside the UUID's version
/// and variant bits, 32 bits of the time in milliseconds (wrapping every 49.7
/// days) and then 10 random bits; then four random bytes of each order's own. The
/// sale's pending hash keeps a batch's orders under its tag ([`batch_tag`]), so the
/// script writes one field per batch (two batches that draw the same tag share it).
///
/// Time first: a sale's orders reach the primary key of `orders` in about the
/// order they were accepted, so settlement's inserts land on the index's newest
/// leaf pages instead of pages all over it (with random tags, 5.9 to 6.0 µs of
/// Postgres per inserted order against 4.5 to 4.6 µs; see docs/capacity.md). An
/// id tells when its batch was decided (to the millisecond, within 49.7 days),
/// which its order's `accepted_at` tells too; only its owner and admins see it.
pub fn new_order_ids(sale: SaleId, n: usize) -> Vec<Uuid> {
    use rand::RngCore;
    let mut rng = rand::rng();
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let tag = batch_tag_bits(ms, u64::from(rng.next_u32()));
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&sale.get().to_be_bytes()[2..]);
    bytes[6..12].copy_from_slice(&tag);
    (0..n)
        .map(|_| {
            rng.fill_bytes(&mut bytes[12..]);
            Uuid::new_v8(bytes)
        })
        .collect()
}

/// Bytes 6 to 11 of an order id: 42 bits (the low 32 bits of `ms`, then the low
/// 10 of `random`) spread around the version nibble (the high half of byte 6) and
/// the variant bits (the top two of byte 8), which [`Uuid::new_v8`] sets, so that
/// ids compare (bytewise, as Postgres does) in the order of their times.
fn batch_tag_bits(ms: u64, random: u64) -> [u8; 6] {
    let v = ((ms & 0xffff_ffff) << 10) | (random & 0x3ff);
    [
        ((v >> 38) & 0x0f) as u8,
        (v >> 30) as u8,
        ((v >> 24) & 0x3f) as u8,
        (v >> 16) as u8,
        (v >> 8) as u8,
        v as u8,
    ]
}

/// The batch tag of an order id as text, the field of its batch in the sale's
/// pending hash: characters 15 to 28 of the hyphenated id (bytes 6 to 11), as
/// `lua/purchase_batch.lua` takes them.
pub fn batch_tag(order: &str) -> Option<&str> {
    order.get(14..28)
}

/// The sale an order id was minted for, if it is one of ours.
pub fn sale_of_order(order: &Uuid) -> Option<SaleId> {
    if order.get_version_num() != 8 {
        return None;
    }
    let b = order.as_bytes();
    let mut raw = [0u8; 8];
    raw[2..].copy_from_slice(&b[..6]);
    Id::new(i64::from_be_bytes(raw))
}

/// Largest sale id an order id can carry (48 bits).
pub const MAX_ORDERABLE_SALE_ID: i64 = (1 << 48) - 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_ids_of_later_batches_sort_after_earlier_ones_and_keep_their_sale() {
        let sale = Id::new(42).unwrap();
        let mut last: Option<Uuid> = None;
        // Milliseconds apart, and across a carry in every part of the tag.
        for ms in [
            1_700_000_000_000u64,
            1_700_000_000_001,
            1_700_000_001_023,
            1_700_004_194_304,
        ] {
            for random in [0u64, 0x155, 0x3ff] {
                let mut bytes = [0u8; 16];
                bytes[..6].copy_from_slice(&42i64.to_be_bytes()[2..]);
                bytes[6..12].copy_from_slice(&batch_tag_bits(ms, random));
                let id = Uuid::new_v8(bytes);
                assert_eq!(sale_of_order(&id), Some(sale));
                assert_eq!(id.get_version_num(), 8);
                if let Some(prev) = last {
                    assert!(prev < id, "{prev} then {id} (ms {ms}, random {random:#x})");
                }
                last = Some(id);
            }
        }
        // The ids of one call share their tag, and their sale.
        let ids = new_order_ids(sale, 3);
        let tags: Vec<String> = ids
            .iter()
            .map(|id| batch_tag(&id.to_string()).unwrap().to_string())
            .collect();
        assert!(tags.iter().all(|t| *t == tags[0]), "{tags:?}");
        assert!(ids.iter().all(|id| sale_of_order(id) == Some(sale)));
        assert_eq!(
            ids.iter().collect::<std::collections::HashSet<_>>().len(),
            3
        );
    }

    #[test]
    fn order_ids_carry_their_sale() {
        for raw in [1, 42, 1 << 40, MAX_ORDERABLE_SALE_ID] {
            let sale = Id::new(raw).unwrap();
            let order = new_order_id(sale);
            assert_eq!(order.get_version_num(), 8);
            assert_eq!(sale_of_order(&order), Some(sale));
        }
        assert_eq!(sale_of_order(&Uuid::new_v4()), None);
    }

    #[test]
    fn a_batch_shares_its_tag_and_nothing_else() {
        let sale = Id::new(7).unwrap();
        let ids = new_order_ids(sale, 64);
        let texts: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        let tag = batch_tag(&texts[0]).unwrap();
        assert_eq!(tag.len(), 14);
        assert!(texts.iter().all(|t| batch_tag(t) == Some(tag)));
        let distinct: std::collections::HashSet<&Uuid> = ids.iter().collect();
        assert_eq!(distinct.len(), 64);
        for id in &ids {
            assert_eq!(id.get_version_num(), 8);
            assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
            assert_eq!(sale_of_order(id), Some(sale));
        }
        let other = new_order_ids(sale, 1)[0].to_string();
        assert_ne!(batch_tag(&other), Some(tag));
    }
}
