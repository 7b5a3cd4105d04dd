//! Flash sales: records, the purchase script and its batch decider, stock changes,
//! orders settled and pending, an admin's changes across both stores,
//! tickets and order ids. Their HTTP routes are `routes::sale`.
//!
//! Postgres holds each sale's record; Redis holds its live state under the keys of
//! [`crate::keys::SaleKeys`]. A purchase is decided by one Lua script
//! (`lua/purchase_batch.lua`, a batch of buyers per call, see [`crate::batch`]);
//! the accepted order travels on the sale's stream to the settlement worker, which
//! writes it to Postgres.

pub mod admin;
pub mod buy;
pub mod cached;
pub mod cancel;
pub mod console;
pub mod delete;
pub mod draw;
pub mod entry;
pub mod export;
pub mod held;
pub mod kept;
pub mod legacy;
pub mod lifecycle;
pub mod list;
pub mod numbers;
pub mod order_id;
pub mod orders;
pub mod payment;
pub mod pending;
pub mod queue;
pub mod rebuild;
pub mod reconcile;
pub mod record;
pub mod rehearsal;
pub mod settlement;
pub mod stock;
pub mod store;
pub mod ticket;

pub use cached::{find_view, load_page, load_public_view, load_view};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::domain::SaleId;

/// Process-local memory of sales this process saw sold out, so the stampede after
/// the last unit is answered without a Redis round trip. An entry is trusted for
/// `ttl` only: a top-up made through another instance is noticed within that time.
pub struct SoldOutFlags {
    ttl: Duration,
    // Read by every HTTP worker on every purchase, written when a sale sells out,
    // is topped up, or its flag is refreshed (at most every ttl / 2): a snapshot
    // swapped whole (ArcSwap), so a read takes no lock and writes no cache line
    // the other workers read. A lock's counter did, on every read.
    seen: ArcSwap<HashMap<SaleId, Instant>>,
}

impl SoldOutFlags {
    pub fn new(ttl: Duration) -> Self {
        SoldOutFlags {
            ttl,
            seen: ArcSwap::from_pointee(HashMap::new()),
        }
    }

    pub fn is_sold_out(&self, sale: SaleId) -> bool {
        if self.ttl.is_zero() {
            return false;
        }
        self.seen
            .load()
            .get(&sale)
            .is_some_and(|at| at.elapsed() < self.ttl)
    }

    /// Remembers that the script answered sold out now. A flag younger than half
    /// its trust is left as it is: a batch of sold-out answers copies the map once.
    pub fn mark(&self, sale: SaleId) {
        if self.ttl.is_zero() {
            return;
        }
        let fresh = |seen: &HashMap<SaleId, Instant>| {
            seen.get(&sale)
                .is_some_and(|at| at.elapsed() < self.ttl / 2)
        };
        if fresh(&self.seen.load()) {
            return;
        }
        self.seen.rcu(|seen| {
            let mut seen = HashMap::clone(seen);
            seen.retain(|_, at| at.elapsed() < self.ttl);
            seen.insert(sale, Instant::now());
            Arc::new(seen)
        });
    }

    pub fn clear(&self, sale: SaleId) {
        if !self.seen.load().contains_key(&sale) {
            return;
        }
        self.seen.rcu(|seen| {
            let mut seen = HashMap::clone(seen);
            seen.remove(&sale);
            Arc::new(seen)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Id;

    #[test]
    fn flags_expire_and_clear() {
        let flags = SoldOutFlags::new(Duration::from_millis(30));
        let id = Id::new(1).unwrap();
        assert!(!flags.is_sold_out(id));
        flags.mark(id);
        assert!(flags.is_sold_out(id));
        flags.clear(id);
        assert!(!flags.is_sold_out(id));
        flags.mark(id);
        std::thread::sleep(Duration::from_millis(40));
        assert!(!flags.is_sold_out(id), "a stale flag must not be trusted");
    }

    #[test]
    fn zero_ttl_disables_the_flag() {
        let flags = SoldOutFlags::new(Duration::ZERO);
        let id = Id::new(1).unwrap();
        flags.mark(id);
        assert!(!flags.is_sold_out(id));
    }
}
