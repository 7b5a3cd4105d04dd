//! The draw's arithmetic, byte for byte as `docs/api.md` ("Draw sales") publishes
//! it, so anyone can recompute it (`stampede verify-draw` does, from this file):
//!
//! - the seed: 32 random bytes, published as 64 lower-case hex digits after the draw;
//! - the commitment: SHA-256 of those 32 bytes, as 64 lower-case hex digits;
//! - the entries digest: SHA-256 of every entry id in the draw, smallest first,
//!   each written in decimal ASCII digits (no sign, no leading zeros) followed by
//!   one `\n` (`0x0a`);
//! - the order key ([`Recipe::Entries`], every draw made since migration 0031):
//!   HMAC-SHA-256 with the 32 seed bytes as the key and the digest's 64 lower-case
//!   hex digits as the message. Whoever reads the seed before the draw still cannot
//!   tell any entry's key: it depends on every entry, up to the last. (A draw of
//!   [`Recipe::Seed`], made before, used the seed itself.)
//! - each entry's key: HMAC-SHA-256 with the 32 bytes of the order key as the key
//!   and the entry id written in decimal ASCII digits (no sign, no leading zeros,
//!   no newline) as the message;
//! - the order: entries by their 32-byte key compared as unsigned bytes, first
//!   byte first (a tie, never seen in practice, by the smaller entry id);
//! - the first `winners(stock, max_per_user, entries)` entries of that order win;
//!   a win that passes goes to the next entries in the same order.
//!
//! No I/O here: a leaf the server, the CLI and the tests share.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Bytes of a seed.
pub const SEED_BYTES: usize = 32;

/// A new secret seed from the thread's CSPRNG.
pub fn new_seed() -> [u8; SEED_BYTES] {
    use rand::RngCore;
    let mut seed = [0u8; SEED_BYTES];
    rand::rng().fill_bytes(&mut seed);
    seed
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The bytes of a hex text (either case); `None` unless it is whole bytes of hex.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

/// The commitment published from the sale's creation: hex SHA-256 of the seed.
pub fn commitment(seed: &[u8]) -> String {
    hex(&Sha256::digest(seed))
}

/// How a draw keys its entries (`sale_draws.recipe`, published as `recipe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    /// 1: with the seed itself (draws made before migration 0031).
    Seed,
    /// 2: with HMAC-SHA-256(seed, hex entries digest): fixed only by the last entry.
    Entries,
}

impl Recipe {
    /// The recipe of its number; `None` for one this version does not know.
    pub fn of(n: i64) -> Option<Recipe> {
        match n {
            1 => Some(Recipe::Seed),
            2 => Some(Recipe::Entries),
            _ => None,
        }
    }

    pub fn number(self) -> i16 {
        match self {
            Recipe::Seed => 1,
            Recipe::Entries => 2,
        }
    }
}

/// The entries digest: SHA-256 of the entry ids, smallest first, each in decimal
/// followed by `\n`. The order `entries` come in does not matter.
pub fn entries_digest(entries: &[i64]) -> [u8; 32] {
    let mut ids = entries.to_vec();
    ids.sort_unstable();
    let mut hash = Sha256::new();
    let mut digits = itoa::Buffer::new();
    for id in ids {
        hash.update(digits.format(id).as_bytes());
        hash.update(b"\n");
    }
    hash.finalize().into()
}

/// The key the entries are keyed with: the seed (recipe 1), or
/// HMAC-SHA-256(seed, hex `digest`) (recipe 2).
pub fn order_key(recipe: Recipe, seed: &[u8], digest: &[u8; 32]) -> Vec<u8> {
    match recipe {
        Recipe::Seed => seed.to_vec(),
        Recipe::Entries => {
            let mut mac =
                Hmac::<Sha256>::new_from_slice(seed).expect("HMAC accepts any key length");
            mac.update(hex(digest).as_bytes());
            mac.finalize().into_bytes().to_vec()
        }
    }
}

/// An entry's key in the draw: HMAC-SHA-256(order key, decimal entry id).
pub fn entry_key(key: &[u8], entry_id: i64) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
    let mut digits = itoa::Buffer::new();
    mac.update(digits.format(entry_id).as_bytes());
    mac.finalize().into_bytes().into()
}

/// The entry ids in the order of a draw made now ([`Recipe::Entries`]).
pub fn order(seed: &[u8], entries: &[i64]) -> Vec<i64> {
    order_with(Recipe::Entries, seed, entries)
}

/// The entry ids in the order of a draw of `recipe`.
pub fn order_with(recipe: Recipe, seed: &[u8], entries: &[i64]) -> Vec<i64> {
    let key = order_key(recipe, seed, &entries_digest(entries));
    order_keyed(&key, entries)
        .into_iter()
        .map(|(_, id)| id)
        .collect()
}

/// The entries in the order their keys under `key` (an [`order_key`]) give, each
/// with its key's first 8 bytes as [`key8`] gives them (what `draw_order` stores).
pub fn order_keyed(key: &[u8], entries: &[i64]) -> Vec<(i64, i64)> {
    let mut keyed: Vec<([u8; 32], i64)> =
        entries.iter().map(|&id| (entry_key(key, id), id)).collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(k, id)| (key8(&k), id)).collect()
}

/// The first 8 bytes of an entry's key as a signed number that sorts as the
/// bytes do (big-endian, the top bit flipped): non-decreasing along the order.
pub fn key8(key: &[u8; 32]) -> i64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&key[..8]);
    (u64::from_be_bytes(first) ^ (1 << 63)) as i64
}

/// How many entries win at the draw: one per unit, or `ceil(stock / max_per_user)`
/// when a customer may buy several; never more than there are entries.
pub fn winners(stock: i64, max_per_user: i64, entries: usize) -> usize {
    let per = max_per_user.max(1);
    let wanted = (stock.max(0) + per - 1) / per;
    usize::try_from(wanted).unwrap_or(usize::MAX).min(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commitment_is_the_hex_sha256_of_the_seed() {
        // SHA-256 of 32 zero bytes.
        assert_eq!(
            commitment(&[0u8; 32]),
            "66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925"
        );
        assert_eq!(unhex(&hex(&[0, 1, 254, 255])), Some(vec![0, 1, 254, 255]));
        assert_eq!(unhex("0g"), None);
        assert_eq!(unhex("abc"), None);
    }

    #[test]
    fn an_entry_key_is_the_hmac_of_its_decimal_id() {
        let seed = [7u8; 32];
        let mut mac = Hmac::<Sha256>::new_from_slice(&seed).unwrap();
        mac.update(b"12345");
        let want: [u8; 32] = mac.finalize().into_bytes().into();
        assert_eq!(entry_key(&seed, 12345), want);
    }

    #[test]
    fn the_digest_is_the_sha256_of_the_sorted_ids_one_a_line() {
        // printf '1\n2\n10\n' | sha256sum
        assert_eq!(
            hex(&entries_digest(&[10, 1, 2])),
            hex(&Sha256::digest(b"1\n2\n10\n"))
        );
        let seed = [4u8; 32];
        let digest = entries_digest(&[1, 2, 10]);
        let mut mac = Hmac::<Sha256>::new_from_slice(&seed).unwrap();
        mac.update(hex(&digest).as_bytes());
        let want: [u8; 32] = mac.finalize().into_bytes().into();
        assert_eq!(order_key(Recipe::Entries, &seed, &digest), want.to_vec());
        assert_eq!(order_key(Recipe::Seed, &seed, &digest), seed.to_vec());
        assert_eq!(Recipe::of(2), Some(Recipe::Entries));
        assert_eq!(Recipe::of(1).map(Recipe::number), Some(1));
        assert_eq!(Recipe::of(3), None);
    }

    #[test]
    fn knowing_the_seed_before_the_close_tells_no_entry_its_place() {
        // Under recipe 1 the keys of the entries so far stay as they are when one
        // more enters; under recipe 2 the last entry moves every key.
        let seed = [6u8; 32];
        let before: Vec<i64> = (1..=100).collect();
        let after: Vec<i64> = (1..=101).collect();
        let key = |recipe, ids: &[i64]| order_key(recipe, &seed, &entries_digest(ids));
        let old = |ids: &[i64]| entry_key(&key(Recipe::Seed, ids), 7);
        assert_eq!(old(&before), old(&after));
        let new = |ids: &[i64]| entry_key(&key(Recipe::Entries, ids), 7);
        assert_ne!(new(&before), new(&after));
        let without_last: Vec<i64> = order(&seed, &after)
            .into_iter()
            .filter(|&id| id != 101)
            .collect();
        assert_ne!(order(&seed, &before), without_last);
    }

    #[test]
    fn the_order_follows_the_keys_and_depends_on_the_seed() {
        let ids: Vec<i64> = (1..=200).collect();
        let a = order(&[1u8; 32], &ids);
        let b = order(&[2u8; 32], &ids);
        assert_ne!(a, b);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, ids, "every entry once");
        let key = order_key(Recipe::Entries, &[1u8; 32], &entries_digest(&ids));
        for w in a.windows(2) {
            assert!(entry_key(&key, w[0]) < entry_key(&key, w[1]));
        }
        let seeded = order_with(Recipe::Seed, &[1u8; 32], &ids);
        for w in seeded.windows(2) {
            assert!(entry_key(&[1u8; 32], w[0]) < entry_key(&[1u8; 32], w[1]));
        }
        // The order of the entries given does not matter.
        let mut reversed = ids.clone();
        reversed.reverse();
        assert_eq!(order(&[1u8; 32], &reversed), a);
    }

    #[test]
    fn key8_sorts_as_the_keys_do() {
        let ids: Vec<i64> = (1..=500).collect();
        let keyed = order_keyed(&[3u8; 32], &ids);
        assert!(
            keyed
                .iter()
                .all(|&(k, id)| k == key8(&entry_key(&[3u8; 32], id)))
        );
        assert!(keyed.windows(2).all(|w| w[0].0 <= w[1].0));
        assert_eq!(key8(&[0u8; 32]), i64::MIN);
        assert_eq!(key8(&[0xffu8; 32]), i64::MAX);
        let mut mid = [0u8; 32];
        mid[0] = 0x80;
        assert_eq!(key8(&mid), 0);
    }

    #[test]
    fn winners_are_units_or_customers_never_more_than_entries() {
        assert_eq!(winners(10, 1, 100), 10);
        assert_eq!(winners(10, 3, 100), 4);
        assert_eq!(winners(9, 3, 100), 3);
        assert_eq!(winners(10, 1, 4), 4);
        assert_eq!(winners(0, 1, 4), 0);
    }
}
