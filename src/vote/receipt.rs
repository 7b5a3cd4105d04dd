//! Vote receipts (issue 51): every accepted vote request has one, derived from
//! (poll, voter, seq) — the voter's `seq`-th accepted ballot of the poll, as
//! `votes.seq` stores it — with an HMAC under the server's token secret. Nothing
//! else is stored: the same receipt on every server, after a restart and after a
//! rebuild, and one nobody can make for another voter's ballot without the secret.
//! (A new `token_secret` gives every ballot a new receipt.)

use hmac::Mac;
use uuid::Uuid;

use crate::auth::token::HmacSha256;
use crate::domain::{PollId, UserId};

/// The receipt of `user`'s `seq`-th accepted ballot of `poll` (a UUID, version 8).
pub fn receipt(secret: &[u8], poll: PollId, user: UserId, seq: i32) -> Uuid {
    let mac = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    receipt_keyed(&mac, poll, user, seq)
}

/// [`receipt`] with the HMAC already keyed with the secret (the server's
/// [`crate::auth::token::TokenKey::mac`]): a copy of it, not the key's two hash
/// blocks again for every receipt of a vote, a ballot's list or an export.
pub fn receipt_keyed(keyed: &HmacSha256, poll: PollId, user: UserId, seq: i32) -> Uuid {
    let mut mac = keyed.clone();
    mac.update(b"stampede vote receipt:");
    mac.update(&poll.get().to_be_bytes());
    mac.update(&user.get().to_be_bytes());
    mac.update(&seq.to_be_bytes());
    let digest = mac.finalize().into_bytes();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    Uuid::new_v8(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(poll: i64, user: i64) -> (PollId, UserId) {
        (PollId::new(poll).unwrap(), UserId::new(user).unwrap())
    }

    #[test]
    fn a_receipt_is_the_same_each_time_and_differs_by_poll_voter_seq_and_secret() {
        let (p, u) = ids(3, 7);
        let r = receipt(b"secret", p, u, 1);
        assert_eq!(r, receipt(b"secret", p, u, 1));
        assert_eq!(r.get_version_num(), 8);
        let (p2, u2) = ids(4, 8);
        let keyed = HmacSha256::new_from_slice(b"secret").unwrap();
        assert_eq!(receipt_keyed(&keyed, p, u, 1), r);
        assert_eq!(
            receipt_keyed(&keyed, p, u, 1),
            r,
            "the keyed HMAC is not used up"
        );
        for other in [
            receipt(b"secret", p, u, 2),
            receipt(b"secret", p2, u, 1),
            receipt(b"secret", p, u2, 1),
            receipt(b"other", p, u, 1),
        ] {
            assert_ne!(r, other);
        }
    }
}
