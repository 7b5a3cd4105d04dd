//! Proof of work: `GET /api/sales/{id}/challenge` (and a poll's) issues a
//! challenge, and the join, entry, ticket or vote carries
//! `Proof-Of-Work: <challenge>:<nonce>`, where SHA-256 of that whole text (the
//! challenge, `:`, the nonce) starts with the sale's or poll's `proof_of_work`
//! zero bits.
//!
//! A challenge is `<payload>.<mac>`, both base64url, like a purchase ticket: the
//! payload is `w1:<s|p><id>:<user id>:<expiry, unix ms>:<16 random hex>`, the MAC
//! HMAC-SHA256 under a key derived from the token secret for challenges only.
//! Issuing one writes nothing. Checking one costs a SHA-256, an HMAC and, once it
//! holds, one `SET NX` of a key in the sale's or poll's slot that lives until the
//! challenge expires ([`claim`]): a challenge counts once, whichever server sees it.

use hmac::Mac;
use redis::aio::ConnectionLike;
use sha2::{Digest, Sha256};

use super::settings::Subject;
use crate::auth::token::{self, HmacSha256};
use crate::domain::{Id, UserId};
use crate::keys::Keys;

/// How long a challenge stays good: long enough to solve the hardest one in a
/// slow browser and send it, short enough that solved challenges are not stocked
/// up ahead of an opening in numbers.
pub const CHALLENGE_TTL_MS: i64 = 300_000;

/// Longest `Proof-Of-Work` header read (a challenge is about 110 characters).
const MAX_HEADER: usize = 256;

/// Longest nonce: 1 to 64 letters, digits, `_` or `-`.
const MAX_NONCE: usize = 64;

/// Why a proof was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("the proof is not of the form <challenge>:<nonce>")]
    Malformed,
    #[error("the proof's hash has too few leading zero bits")]
    TooEasy,
    #[error("the challenge was not issued here")]
    BadSignature,
    #[error("the challenge is for another sale or poll")]
    OtherSubject,
    #[error("the challenge is for another user")]
    OtherUser,
    #[error("the challenge has expired")]
    Expired,
}

/// A proof that holds: what [`claim`] records so it counts once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Solved {
    /// Hex of the challenge's MAC (first 16 bytes): names the challenge.
    pub id: String,
    /// The challenge's expiry (unix ms).
    pub expires_ms: i64,
}

/// Signs and checks challenges.
#[derive(Clone)]
pub struct ChallengeKey {
    mac: HmacSha256,
}

fn subject_text(subject: Subject) -> String {
    match subject {
        Subject::Sale(id) => format!("s{id}"),
        Subject::Poll(id) => format!("p{id}"),
    }
}

/// The number of leading zero bits of `hash`.
pub fn leading_zero_bits(hash: &[u8]) -> u32 {
    let mut bits = 0;
    for byte in hash {
        if *byte == 0 {
            bits += 8;
        } else {
            return bits + byte.leading_zeros();
        }
    }
    bits
}

impl ChallengeKey {
    /// The challenge key derived from the server's token secret.
    pub fn new(secret: &[u8]) -> Self {
        let mut derive = HmacSha256::new_from_slice(secret).expect("HMAC accepts any key length");
        derive.update(b"stampede proof-of-work challenge v1");
        let key = derive.finalize().into_bytes();
        ChallengeKey {
            mac: HmacSha256::new_from_slice(&key).expect("HMAC accepts any key length"),
        }
    }

    /// A new challenge for `user` and `subject`, good until `expires_ms`.
    pub fn issue(&self, subject: Subject, user: UserId, expires_ms: i64) -> String {
        let salt: u64 = rand::random();
        token::sign(
            &self.mac,
            &format!(
                "w1:{}:{user}:{expires_ms}:{salt:016x}",
                subject_text(subject)
            ),
        )
    }

    /// Checks a `Proof-Of-Work` header: the hash first (one SHA-256: a wrong
    /// nonce costs nothing more), then the challenge's signature, subject, user
    /// and expiry.
    pub fn verify(
        &self,
        proof: &[u8],
        subject: Subject,
        user: UserId,
        difficulty: u8,
        now_ms: i64,
    ) -> Result<Solved, ProofError> {
        if proof.len() > MAX_HEADER {
            return Err(ProofError::Malformed);
        }
        let text = std::str::from_utf8(proof).map_err(|_| ProofError::Malformed)?;
        let (challenge, nonce) = text.rsplit_once(':').ok_or(ProofError::Malformed)?;
        if nonce.is_empty()
            || nonce.len() > MAX_NONCE
            || !nonce
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(ProofError::Malformed);
        }
        if leading_zero_bits(&Sha256::digest(proof)) < u32::from(difficulty) {
            return Err(ProofError::TooEasy);
        }
        let payload = token::open(&self.mac, challenge, MAX_HEADER).map_err(|e| match e {
            token::TokenError::BadSignature => ProofError::BadSignature,
            _ => ProofError::Malformed,
        })?;
        let payload = std::str::from_utf8(&payload).map_err(|_| ProofError::Malformed)?;
        let Some(["w1", for_subject, for_user, expires, _salt]) = token::fields(payload) else {
            return Err(ProofError::Malformed);
        };
        if for_subject != subject_text(subject) {
            return Err(ProofError::OtherSubject);
        }
        let for_user: UserId = for_user
            .parse()
            .ok()
            .and_then(Id::new)
            .ok_or(ProofError::Malformed)?;
        if for_user != user {
            return Err(ProofError::OtherUser);
        }
        let expires_ms: i64 = expires.parse().map_err(|_| ProofError::Malformed)?;
        if expires_ms <= now_ms {
            return Err(ProofError::Expired);
        }
        // The MAC names the challenge: the text after the last `.` of it.
        let (_, mac) = challenge.rsplit_once('.').ok_or(ProofError::Malformed)?;
        let id: String = Sha256::digest(mac.as_bytes())[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(Solved { id, expires_ms })
    }
}

/// The key that marks a challenge used: `ns:{sale:42}:pow:<id>` (or the poll's
/// slot), so it lives beside the sale's or poll's keys on a cluster. The id is
/// hex this server made, never the client's text.
pub fn used_key(keys: &Keys, subject: Subject, solved: &Solved) -> String {
    let tag = match subject {
        Subject::Sale(id) => format!("sale:{id}"),
        Subject::Poll(id) => format!("poll:{id}"),
    };
    format!("{}:{{{tag}}}:pow:{}", keys.namespace(), solved.id)
}

/// Records the challenge used: true the first time (one `SET NX PX`, which
/// expires with the challenge), false when it was used before.
pub async fn claim<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    subject: Subject,
    solved: &Solved,
    now_ms: i64,
) -> redis::RedisResult<bool> {
    // A little past the expiry: a server whose clock runs behind may still take
    // the challenge for good for that long.
    let ttl_ms = (solved.expires_ms - now_ms).max(1) + 60_000;
    let set: Option<String> = redis::cmd("SET")
        .arg(used_key(keys, subject, solved))
        .arg(1)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .query_async(redis)
        .await?;
    Ok(set.is_some())
}

/// Makes a claimed challenge good again (a vote a limit refused, see
/// `routes::fair::Spent`): one `DEL` of its used key.
pub async fn release<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    subject: Subject,
    solved: &Solved,
) -> redis::RedisResult<()> {
    redis::cmd("DEL")
        .arg(used_key(keys, subject, solved))
        .query_async(redis)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id<T>(n: i64) -> Id<T> {
        Id::new(n).unwrap()
    }

    /// The first nonce that solves `challenge` to `bits`.
    fn solve(challenge: &str, bits: u8) -> String {
        (0u64..)
            .map(|n| format!("{challenge}:{n}"))
            .find(|p| leading_zero_bits(&Sha256::digest(p.as_bytes())) >= u32::from(bits))
            .unwrap()
    }

    #[test]
    fn leading_zero_bits_counts_across_bytes() {
        assert_eq!(leading_zero_bits(&[0xff]), 0);
        assert_eq!(leading_zero_bits(&[0x01, 0xff]), 7);
        assert_eq!(leading_zero_bits(&[0x00, 0x10]), 11);
        assert_eq!(leading_zero_bits(&[0, 0]), 16);
    }

    #[test]
    fn a_solved_challenge_holds_for_its_user_and_subject_until_it_expires() {
        let key = ChallengeKey::new(b"0123456789abcdef0123456789abcdef");
        let sale = Subject::Sale(id(7));
        let c = key.issue(sale, id(42), 2_000);
        let proof = solve(&c, 8);
        let solved = key
            .verify(proof.as_bytes(), sale, id(42), 8, 1_000)
            .unwrap();
        assert_eq!(solved.expires_ms, 2_000);
        assert_eq!(solved.id.len(), 32);
        assert_eq!(
            key.verify(proof.as_bytes(), sale, id(42), 8, 2_000),
            Err(ProofError::Expired)
        );
        assert_eq!(
            key.verify(proof.as_bytes(), sale, id(43), 8, 1_000),
            Err(ProofError::OtherUser)
        );
        assert_eq!(
            key.verify(proof.as_bytes(), Subject::Sale(id(8)), id(42), 8, 1_000),
            Err(ProofError::OtherSubject)
        );
        assert_eq!(
            key.verify(proof.as_bytes(), Subject::Poll(id(7)), id(42), 8, 1_000),
            Err(ProofError::OtherSubject)
        );
        // Two challenges of the same user and sale are two challenges.
        let again = key.issue(sale, id(42), 2_000);
        assert_ne!(again, c);
        let other = key.verify(solve(&again, 0).as_bytes(), sale, id(42), 0, 1_000);
        assert_ne!(other.unwrap().id, solved.id);
    }

    #[test]
    fn unsolved_forged_and_garbage_proofs_are_refused() {
        let key = ChallengeKey::new(b"0123456789abcdef0123456789abcdef");
        let foreign = ChallengeKey::new(b"another-secret-another-secret-xx");
        let sale = Subject::Sale(id(7));
        let c = key.issue(sale, id(42), 2_000);
        // A nonce that does not reach 12 bits (found, then checked at 12).
        let weak = (0u64..)
            .map(|n| format!("{c}:{n}"))
            .find(|p| leading_zero_bits(&Sha256::digest(p.as_bytes())) < 12)
            .unwrap();
        assert_eq!(
            key.verify(weak.as_bytes(), sale, id(42), 12, 1_000),
            Err(ProofError::TooEasy)
        );
        let forged = solve(&foreign.issue(sale, id(42), 2_000), 4);
        assert_eq!(
            key.verify(forged.as_bytes(), sale, id(42), 4, 1_000),
            Err(ProofError::BadSignature)
        );
        for junk in [
            "",
            "abc",
            ":1",
            &format!("{c}:"),
            &format!("{c}:a b"),
            &format!("{c}:{}", "9".repeat(65)),
            &"x".repeat(300),
        ] {
            assert_eq!(
                key.verify(junk.as_bytes(), sale, id(42), 0, 1_000),
                Err(ProofError::Malformed),
                "{junk:?}"
            );
        }
    }

    #[test]
    fn a_ticket_or_token_is_not_a_challenge() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let ticket = crate::sale::ticket::TicketKey::new(secret).issue(id(7), id(42), 2_000);
        let key = ChallengeKey::new(secret);
        assert_eq!(
            key.verify(
                format!("{ticket}:1").as_bytes(),
                Subject::Sale(id(7)),
                id(42),
                0,
                1_000
            ),
            Err(ProofError::BadSignature)
        );
    }
}
