//! Signed, expiring session tokens. A token is `<payload>.<mac>`, both base64url:
//! the payload is `v3:<user id>:<admin 0|1>:<expiry unix secs>:<generation>:<session
//! id>:<account created, unix secs>` (a `v2` token, of an earlier version, has no
//! creation time and is still read) and the mac is HMAC-SHA256 over it. The
//! account's creation time rides in the token so a sale's or poll's
//! `min_account_age_s` costs no query (see [`crate::gate::age`]). Checking the signature costs a hash; whether
//! the session still stands (not signed out, generation current) is
//! [`super::session`]'s business.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::domain::{Id, UserId};

pub(crate) type HmacSha256 = Hmac<Sha256>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claims {
    pub user_id: UserId,
    pub admin: bool,
    pub expires_at: i64,
    /// The account's session generation at sign-in: ending all sessions (or a
    /// password change) raises it, and older tokens stop working.
    pub generation: i64,
    /// Random id of this session, so signing out ends this one only.
    pub session: u64,
    /// When the account was made (unix secs); `None` in a token of an earlier
    /// version (`v2`) or one minted without it (the account's age is then read
    /// once per process from Postgres, when a sale or poll asks for it).
    pub account_created: Option<i64>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed token")]
    Malformed,
    #[error("bad token signature")]
    BadSignature,
    #[error("token expired")]
    Expired,
}

#[derive(Clone)]
pub struct TokenKey {
    mac: HmacSha256,
}

impl TokenKey {
    pub fn new(secret: &[u8]) -> Self {
        TokenKey {
            mac: HmacSha256::new_from_slice(secret).expect("HMAC accepts any key length"),
        }
    }

    pub fn issue(&self, claims: Claims) -> String {
        let head = format!(
            "{}:{}:{}:{}:{:016x}",
            claims.user_id,
            u8::from(claims.admin),
            claims.expires_at,
            claims.generation,
            claims.session
        );
        let payload = match claims.account_created {
            Some(created) => format!("v3:{head}:{created}"),
            None => format!("v2:{head}"),
        };
        sign(&self.mac, &payload)
    }

    /// The HMAC keyed with the token secret, for what else the secret signs (vote
    /// receipts: [`crate::vote::receipt::receipt_keyed`]); each use clones it.
    pub fn mac(&self) -> &HmacSha256 {
        &self.mac
    }

    /// The CSRF token of the session `claims` names: an HMAC of the account and the
    /// session under the token secret, 32 hex digits. A page's script sends it back
    /// in `X-CSRF-Token` (it reads it from the `stampede_csrf` cookie); being bound
    /// to the session, a value someone else set in that cookie (from a sibling
    /// subdomain, or over plain HTTP) does not pass.
    pub fn csrf_of(&self, claims: &Claims) -> String {
        use hmac::Mac;
        let mut mac = self.mac.clone();
        mac.update(format!("csrf:{}:{:016x}", claims.user_id, claims.session).as_bytes());
        mac.finalize().into_bytes()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    pub fn verify(&self, token: &str, now_unix: i64) -> Result<Claims, TokenError> {
        let payload = open(&self.mac, token, 512)?;
        let text = std::str::from_utf8(&payload).map_err(|_| TokenError::Malformed)?;
        Self::claims(text, now_unix)
    }

    fn claims(text: &str, now_unix: i64) -> Result<Claims, TokenError> {
        let (uid, admin, exp, generation, session, account_created) =
            if let Some(["v3", uid, admin, exp, generation, session, created]) = fields(text) {
                let created: i64 = created.parse().map_err(|_| TokenError::Malformed)?;
                (uid, admin, exp, generation, session, Some(created))
            } else if let Some(["v2", uid, admin, exp, generation, session]) = fields(text) {
                (uid, admin, exp, generation, session, None)
            } else {
                return Err(TokenError::Malformed);
            };
        let user_id = uid
            .parse()
            .ok()
            .and_then(Id::new)
            .ok_or(TokenError::Malformed)?;
        let admin = match admin {
            "0" => false,
            "1" => true,
            _ => return Err(TokenError::Malformed),
        };
        let expires_at: i64 = exp.parse().map_err(|_| TokenError::Malformed)?;
        let generation: i64 = generation
            .parse()
            .ok()
            .filter(|g| *g >= 0)
            .ok_or(TokenError::Malformed)?;
        if session.len() != 16 {
            return Err(TokenError::Malformed);
        }
        let session = u64::from_str_radix(session, 16).map_err(|_| TokenError::Malformed)?;
        if expires_at <= now_unix {
            return Err(TokenError::Expired);
        }
        Ok(Claims {
            user_id,
            admin,
            expires_at,
            generation,
            session,
            account_created,
        })
    }
}

/// Exactly `N` `:`-separated fields of a signed payload, or `None`.
pub(crate) fn fields<const N: usize>(text: &str) -> Option<[&str; N]> {
    let mut parts = text.split(':');
    let fields: [Option<&str>; N] = std::array::from_fn(|_| parts.next());
    if parts.next().is_some() || fields.iter().any(Option::is_none) {
        return None;
    }
    Some(fields.map(Option::unwrap_or_default))
}

/// `<payload>.<mac>`, both base64url, the MAC HMAC-SHA256 of the payload under
/// `mac`'s key: the shape of session tokens and purchase tickets.
pub(crate) fn sign(mac: &HmacSha256, payload: &str) -> String {
    let mut mac = mac.clone();
    mac.update(payload.as_bytes());
    let sig = mac.finalize().into_bytes();
    format!("{}.{}", B64.encode(payload), B64.encode(sig))
}

/// The payload of a [`sign`]ed text whose MAC checks out (compared in constant
/// time); `Malformed` for anything longer than `max_len` or not of the shape.
pub(crate) fn open(mac: &HmacSha256, signed: &str, max_len: usize) -> Result<Vec<u8>, TokenError> {
    if signed.len() > max_len {
        return Err(TokenError::Malformed);
    }
    let (payload_b64, sig_b64) = signed.split_once('.').ok_or(TokenError::Malformed)?;
    let payload = B64.decode(payload_b64).map_err(|_| TokenError::Malformed)?;
    // A MAC is 32 bytes: decoded on the stack (anything longer does not fit: malformed).
    let mut sig = [0u8; 48];
    let sig_len = B64
        .decode_slice(sig_b64, &mut sig)
        .map_err(|_| TokenError::Malformed)?;
    let mut mac = mac.clone();
    mac.update(&payload);
    mac.verify_slice(&sig[..sig_len])
        .map_err(|_| TokenError::BadSignature)?;
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(exp: i64) -> Claims {
        Claims {
            user_id: Id::new(7).unwrap(),
            admin: true,
            expires_at: exp,
            generation: 3,
            session: 0xdead_beef_0000_0001,
            account_created: Some(1_700_000_000),
        }
    }

    #[test]
    fn round_trip() {
        let key = TokenKey::new(b"0123456789abcdef0123456789abcdef");
        let t = key.issue(claims(2000));
        assert_eq!(key.verify(&t, 1000).unwrap(), claims(2000));
        // Without the creation time: a token of the earlier shape, still read.
        let old = Claims {
            account_created: None,
            ..claims(2000)
        };
        let t = key.issue(old);
        assert!(
            B64.decode(t.split_once('.').unwrap().0)
                .unwrap()
                .starts_with(b"v2:")
        );
        assert_eq!(key.verify(&t, 1000).unwrap(), old);
    }

    #[test]
    fn expired_forged_and_garbage_are_refused() {
        let key = TokenKey::new(b"0123456789abcdef0123456789abcdef");
        let other = TokenKey::new(b"another-secret-another-secret-xx");
        let t = key.issue(claims(2000));
        assert_eq!(key.verify(&t, 2000), Err(TokenError::Expired));
        assert_eq!(
            key.verify(&other.issue(claims(2000)), 1000),
            Err(TokenError::BadSignature)
        );
        // Payload changed (admin flag flipped), signature kept.
        let (_, sig) = t.split_once('.').unwrap();
        let forged = format!(
            "{}.{}",
            B64.encode("v2:7:1:9999999999:3:deadbeef00000001"),
            sig
        );
        assert_eq!(key.verify(&forged, 1000), Err(TokenError::BadSignature));
        // Not of the shape: malformed; of the shape but with no MAC: a bad signature.
        for (junk, refusal) in [
            ("", TokenError::Malformed),
            (".", TokenError::BadSignature),
            ("abc", TokenError::Malformed),
            ("a.b.c", TokenError::Malformed),
            ("!!!.???", TokenError::Malformed),
        ] {
            assert_eq!(key.verify(junk, 1000), Err(refusal), "{junk:?}");
        }
    }
}
