//! Typed database ids: a [`SaleId`] where a sale's id is wanted, parsed from the path.

use std::fmt;
use std::marker::PhantomData;

use crate::error::{AppError, ErrorCode};

/// Positive database id of a `T` (a [`Sale`], [`Poll`] or [`User`]). Parsed from
/// the path, never used as raw text, so it is safe inside a Redis key and its hash
/// tag. One type per entity: a user's id where a sale's is wanted does not compile.
pub struct Id<T>(i64, PhantomData<fn() -> T>);

/// What an [`Id`] is the id of (its name, for error messages).
pub trait Entity {
    const NAME: &'static str;
}

/// A flash sale.
pub enum Sale {}
/// A poll.
pub enum Poll {}
/// An account.
pub enum User {}

impl Entity for Sale {
    const NAME: &'static str = "sale";
}
impl Entity for Poll {
    const NAME: &'static str = "poll";
}
impl Entity for User {
    const NAME: &'static str = "user";
}

pub type SaleId = Id<Sale>;
pub type UserId = Id<User>;
pub type PollId = Id<Poll>;

impl<T> Id<T> {
    pub fn new(raw: i64) -> Option<Self> {
        (raw > 0).then_some(Id(raw, PhantomData))
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

impl<T: Entity> Id<T> {
    /// Parses a path segment. Only plain decimal digits: no sign, no spaces, no `+`.
    pub fn parse(raw: &str) -> Result<Self, AppError> {
        let invalid = || {
            AppError::new(
                ErrorCode::InvalidId,
                format!(
                    "{} id must be a positive integer, got {:?}",
                    T::NAME,
                    truncate(raw, 40)
                ),
            )
        };
        if raw.is_empty() || raw.len() > 19 || !raw.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid());
        }
        raw.parse::<i64>()
            .ok()
            .and_then(Id::new)
            .ok_or_else(invalid)
    }
}

// By hand, not derived: a derive would ask the same of `T`, which is never built.
impl<T> Clone for Id<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Id<T> {}
impl<T> PartialEq for Id<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl<T> Eq for Id<T> {}
impl<T> std::hash::Hash for Id<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}
impl<T> PartialOrd for Id<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Id<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}
impl<T> fmt::Debug for Id<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
impl<T> fmt::Display for Id<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
impl<T> serde::Serialize for Id<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(self.0)
    }
}

impl<'de, T> serde::Deserialize<'de> for Id<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = i64::deserialize(d)?;
        Id::new(raw).ok_or_else(|| serde::de::Error::custom(format!("not an id: {raw}")))
    }
}

// Rows carry typed ids: a `BIGINT` column reads as an `Id` (a value not positive
// fails the read) and an `Id` binds as a `BIGINT`.
impl<T> sqlx::Type<sqlx::Postgres> for Id<T> {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <i64 as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <i64 as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r, T> sqlx::Decode<'r, sqlx::Postgres> for Id<T> {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let raw = <i64 as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
        Id::new(raw).ok_or_else(|| format!("not an id: {raw}").into())
    }
}

impl<T> sqlx::Encode<'_, sqlx::Postgres> for Id<T> {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <i64 as sqlx::Encode<sqlx::Postgres>>::encode_by_ref(&self.0, buf)
    }
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}
