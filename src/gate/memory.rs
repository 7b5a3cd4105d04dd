//! Each sale's or poll's [`Gates`] as this process last read them, so the hot
//! path of a sale or poll that asks for neither costs a map lookup, not a read.
//!
//! Both settings may change until the opening and never after it (an edit of
//! an opened sale or poll refuses them), so what was read of an opened one is
//! kept for good; what was read before its opening is trusted for
//! [`TRUST_BEFORE_OPENING_MS`] (a join storm before an opening reads the cached
//! record once a second per process, and an admin's edit reaches every server
//! within that second).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::settings::Gates;

/// How long gates read before the opening are trusted.
pub const TRUST_BEFORE_OPENING_MS: i64 = 1_000;

/// Most sales or polls remembered at once; past that the memory starts over.
pub const REMEMBERED_MAX: usize = 4096;

/// The gates of the sales (or polls) this process has read.
pub struct Memory<K> {
    known: ArcSwap<HashMap<K, (Gates, i64)>>,
}

impl<K> Default for Memory<K> {
    fn default() -> Self {
        Memory {
            known: ArcSwap::from_pointee(HashMap::new()),
        }
    }
}

impl<K: Copy + Eq + Hash> Memory<K> {
    /// The gates of `id`, if read and still trusted at `now_ms`.
    pub fn get(&self, id: K, now_ms: i64) -> Option<Gates> {
        match self.known.load().get(&id) {
            Some((gates, until_ms)) if now_ms < *until_ms => Some(*gates),
            _ => None,
        }
    }

    /// Forgets `id` (an edit here: this process reads it again at once).
    pub fn forget(&self, id: K) {
        if self.known.load().contains_key(&id) {
            self.known.rcu(|known| {
                let mut known = HashMap::clone(known);
                known.remove(&id);
                Arc::new(known)
            });
        }
    }

    /// Remembers what was read at `now_ms`: for good once opened, else briefly.
    pub fn remember(&self, id: K, gates: Gates, now_ms: i64) {
        let until_ms = if now_ms >= gates.opens_ms {
            i64::MAX
        } else {
            now_ms.saturating_add(TRUST_BEFORE_OPENING_MS)
        };
        self.known.rcu(|known| {
            let mut known = if known.len() >= REMEMBERED_MAX {
                HashMap::new()
            } else {
                HashMap::clone(known)
            };
            known.insert(id, (gates, until_ms));
            Arc::new(known)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gates(opens_ms: i64) -> Gates {
        Gates {
            proof_of_work: 8,
            min_account_age_s: 0,
            opens_ms,
            waiting_room: false,
            entries_open_ms: None,
        }
    }

    #[test]
    fn opened_gates_are_kept_and_earlier_ones_for_a_second() {
        let memory = Memory::<i64>::default();
        assert_eq!(memory.get(1, 0), None);
        memory.remember(1, gates(10_000), 5_000);
        assert_eq!(memory.get(1, 5_999), Some(gates(10_000)));
        assert_eq!(memory.get(1, 6_000), None);
        memory.remember(2, gates(10_000), 10_000);
        assert_eq!(memory.get(2, i64::MAX - 1), Some(gates(10_000)));
    }

    #[test]
    fn the_memory_is_bounded() {
        let memory = Memory::<i64>::default();
        for n in 0..(3 * REMEMBERED_MAX as i64) {
            memory.remember(n, gates(0), 1);
            assert_eq!(memory.get(n, 1), Some(gates(0)));
        }
        assert!(memory.known.load().len() <= REMEMBERED_MAX);
    }
}
