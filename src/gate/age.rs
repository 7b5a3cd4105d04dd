//! `min_account_age_s`: an account made less than that before the opening may
//! not join, enter, take a ticket, buy or vote until it is that old.
//!
//! The account's creation time comes with the caller: sign-in writes it into the
//! session token ([`crate::auth::token::Claims::account_created`]), so the check
//! is arithmetic, no query. A token without it (minted by an earlier version, or
//! by a tool) has it read from Postgres once per account and process
//! ([`AccountAges`]).

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::DateTime;
use serde_json::Value;
use sqlx::PgPool;

use super::settings::Gates;
use crate::domain::UserId;
use crate::error::{AppError, ErrorCode};

/// When an account made at `created_s` (unix secs) may act under `gates`:
/// `Ok` when it is old enough at the later of the opening and `now_ms`, else
/// the moment it will be (unix secs).
pub fn check(gates: &Gates, created_s: i64, now_ms: i64) -> Result<(), i64> {
    if gates.min_account_age_s <= 0 {
        return Ok(());
    }
    let allowed_s = created_s.saturating_add(i64::from(gates.min_account_age_s));
    let at_ms = now_ms.max(gates.opens_ms);
    if allowed_s.saturating_mul(1000) <= at_ms {
        Ok(())
    } else {
        Err(allowed_s)
    }
}

/// 403 `account_too_new`, with `allowed_at` when that comes before `closes_ms`
/// (the close of the sale or poll); without it, the account never may.
pub fn too_new(allowed_s: i64, closes_ms: i64) -> AppError {
    let allowed = DateTime::from_timestamp(allowed_s, 0);
    match allowed {
        Some(at) if allowed_s.saturating_mul(1000) < closes_ms => AppError::new(
            ErrorCode::AccountTooNew,
            format!(
                "this account is too new to take part yet; it may from {}",
                at.to_rfc3339()
            ),
        )
        .with_field("allowed_at", Value::String(at.to_rfc3339())),
        _ => AppError::new(
            ErrorCode::AccountTooNew,
            "this account is too new to take part before this closes",
        ),
    }
}

/// Most accounts [`AccountAges`] remembers (about 40 bytes each); past that it
/// starts over.
const REMEMBERED_MAX: usize = 100_000;

/// The creation times read for tokens that do not carry one, per process. A
/// creation time never changes, so an entry is never stale.
#[derive(Default)]
pub struct AccountAges {
    known: Mutex<HashMap<UserId, i64>>,
}

impl AccountAges {
    /// When `user`'s account was made (unix secs): `carried` (the token's), else
    /// remembered, else read once. An account that is gone counts as made now.
    pub async fn created(
        &self,
        db: &PgPool,
        user: UserId,
        carried: Option<i64>,
    ) -> Result<i64, AppError> {
        if let Some(created) = carried {
            return Ok(created);
        }
        if let Some(created) = self.lock().get(&user).copied() {
            return Ok(created);
        }
        let created = crate::auth::created_at(db, user)
            .await?
            .unwrap_or_else(|| chrono::Utc::now().timestamp());
        let mut known = self.lock();
        if known.len() >= REMEMBERED_MAX {
            known.clear();
        }
        known.insert(user, created);
        Ok(created)
    }

    /// A std mutex: held for a map lookup or insert, never across an await.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<UserId, i64>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gates(min_age_s: i32, opens_ms: i64) -> Gates {
        Gates {
            proof_of_work: 0,
            min_account_age_s: min_age_s,
            opens_ms,
            waiting_room: false,
            entries_open_ms: None,
        }
    }

    #[test]
    fn the_age_counts_at_the_opening_or_later() {
        // A day old at the opening (made a day and a second before): allowed, even
        // before the opening (a join).
        let g = gates(86_400, 100_000_000);
        assert_eq!(check(&g, 100_000 - 86_401, 50_000_000), Ok(()));
        // Made an hour before the opening: allowed 23 hours after it.
        let created = 100_000 - 3_600;
        assert_eq!(check(&g, created, 50_000_000), Err(created + 86_400));
        assert_eq!(
            check(&g, created, (created + 86_400) * 1000 - 1),
            Err(created + 86_400)
        );
        assert_eq!(check(&g, created, (created + 86_400) * 1000), Ok(()));
        // Off: anything goes.
        assert_eq!(check(&gates(0, 0), i64::MAX, 0), Ok(()));
    }

    #[test]
    fn the_refusal_names_the_moment_only_before_the_close() {
        let body = |e: AppError| match e {
            AppError::Client { code, fields, .. } => (code, fields),
            _ => unreachable!(),
        };
        let (code, fields) = body(too_new(1_000, 2_000_000));
        assert_eq!(code, ErrorCode::AccountTooNew);
        assert_eq!(fields[0].0, "allowed_at");
        assert_eq!(fields[0].1, "1970-01-01T00:16:40+00:00");
        let (code, fields) = body(too_new(3_000, 2_000_000));
        assert_eq!(code, ErrorCode::AccountTooNew);
        assert!(fields.is_empty());
    }
}
