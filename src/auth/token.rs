//! Signed, expiring session tokens. A token is `<payload>.<mac>`, both base64url:
//! the payload is `v1:<user id>:<admin 0|1>:<expiry unix secs>` and the mac is
//! HMAC-SHA256 over it. Checking one costs a hash, no database or Redis call.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::domain::{Id, UserId};

type HmacSha256 = Hmac<Sha256>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claims {
    pub user_id: UserId,
    pub admin: bool,
    pub expires_at: i64,
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
        let payload = format!(
            "v1:{}:{}:{}",
            claims.user_id,
            u8::from(claims.admin),
            claims.expires_at
        );
        let mut mac = self.mac.clone();
        mac.update(payload.as_bytes());
        let sig = mac.finalize().into_bytes();
        format!("{}.{}", B64.encode(payload), B64.encode(sig))
    }

    pub fn verify(&self, token: &str, now_unix: i64) -> Result<Claims, TokenError> {
        if token.len() > 512 {
            return Err(TokenError::Malformed);
        }
        let (payload_b64, sig_b64) = token.split_once('.').ok_or(TokenError::Malformed)?;
        let payload = B64.decode(payload_b64).map_err(|_| TokenError::Malformed)?;
        let sig = B64.decode(sig_b64).map_err(|_| TokenError::Malformed)?;
        let mut mac = self.mac.clone();
        mac.update(&payload);
        // Constant-time comparison.
        mac.verify_slice(&sig)
            .map_err(|_| TokenError::BadSignature)?;

        let text = std::str::from_utf8(&payload).map_err(|_| TokenError::Malformed)?;
        let mut parts = text.split(':');
        let (Some("v1"), Some(uid), Some(admin), Some(exp), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
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
        if expires_at <= now_unix {
            return Err(TokenError::Expired);
        }
        Ok(Claims {
            user_id,
            admin,
            expires_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(exp: i64) -> Claims {
        Claims {
            user_id: Id::new(7).unwrap(),
            admin: true,
            expires_at: exp,
        }
    }

    #[test]
    fn round_trip() {
        let key = TokenKey::new(b"0123456789abcdef0123456789abcdef");
        let t = key.issue(claims(2000));
        assert_eq!(key.verify(&t, 1000).unwrap(), claims(2000));
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
        let forged = format!("{}.{}", B64.encode("v1:7:1:9999999999"), sig);
        assert_eq!(key.verify(&forged, 1000), Err(TokenError::BadSignature));
        for junk in ["", ".", "abc", "a.b.c", "!!!.???"] {
            assert!(key.verify(junk, 1000).is_err());
        }
    }
}
