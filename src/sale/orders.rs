//! Order ids: UUIDv8 that carry their sale's id, so an order can be found in its
//! sale's pending hash before it reaches Postgres.

use uuid::Uuid;

use crate::domain::{Id, SaleId};

/// Order ids carry their sale id in the first six bytes (a UUIDv8), so an order's
/// status can be found in its sale's pending hash before it reaches Postgres.
pub fn new_order_id(sale: SaleId) -> Uuid {
    use rand::RngCore;
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    bytes[..6].copy_from_slice(&sale.get().to_be_bytes()[2..]);
    Uuid::new_v8(bytes)
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
    fn order_ids_carry_their_sale() {
        for raw in [1, 42, 1 << 40, MAX_ORDERABLE_SALE_ID] {
            let sale = Id::new(raw).unwrap();
            let order = new_order_id(sale);
            assert_eq!(order.get_version_num(), 8);
            assert_eq!(sale_of_order(&order), Some(sale));
        }
        assert_eq!(sale_of_order(&Uuid::new_v4()), None);
    }
}
