//! Paged lists: the page size a client may ask for ([`Limit`]), the opaque cursor
//! that says where the next page starts ([`encode_cursor`], [`decode_cursor`]) and
//! a page of items ([`Page`]). What a cursor holds (the sort key of the last item
//! shown) is the list's own business: `sale::list::SaleCursor`,
//! `vote::list::PollCursor`.

use std::borrow::Cow;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};

use crate::error::{AppError, ErrorCode};

/// Items per page when the client names no `limit`.
pub const DEFAULT_LIMIT: u16 = 50;
/// The largest `limit` a client may ask for.
pub const MAX_LIMIT: u16 = 200;
/// No cursor this server writes is longer; a longer one is refused before decoding.
const MAX_CURSOR_LEN: usize = 160;

/// How many items a page holds: 1 to [`MAX_LIMIT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit(u16);

impl Limit {
    pub const DEFAULT: Limit = Limit(DEFAULT_LIMIT);

    /// A fixed page size of the code's own (the pages' sizes); panics outside the range.
    pub const fn fixed(n: u16) -> Limit {
        assert!(n >= 1 && n <= MAX_LIMIT);
        Limit(n)
    }

    /// The `limit` query parameter: absent is [`DEFAULT_LIMIT`]; anything but a
    /// whole number from 1 to [`MAX_LIMIT`] is a 400 `invalid_limit`.
    pub fn parse(raw: Option<&str>) -> Result<Limit, AppError> {
        let Some(raw) = raw else {
            return Ok(Limit::DEFAULT);
        };
        match raw.parse::<u16>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(Limit(n)),
            _ => Err(AppError::new(
                ErrorCode::InvalidLimit,
                format!("limit must be a whole number from 1 to {MAX_LIMIT}"),
            )),
        }
    }

    pub const fn get(self) -> u16 {
        self.0
    }

    /// As SQL's `LIMIT` wants it, with one more row to tell whether a next page exists.
    pub fn with_one_more(self) -> i64 {
        i64::from(self.0) + 1
    }

    pub fn as_usize(self) -> usize {
        usize::from(self.0)
    }
}

/// Now, as Postgres keeps time (whole microseconds): the moment a list's order is
/// taken at, so that a cursor carrying it compares in Rust exactly as in SQL.
pub fn list_moment() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
}

/// One page of a list, and the cursor of the next page (none on the last).
#[derive(Debug)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

impl<T> Page<T> {
    /// `rows` as read with [`Limit::with_one_more`]: the first `limit` of them, and a
    /// cursor from the last of those (made by `cursor`) when a row was left over.
    pub fn from_rows(mut rows: Vec<T>, limit: Limit, cursor: impl Fn(&T) -> String) -> Self {
        let more = rows.len() > limit.as_usize();
        rows.truncate(limit.as_usize());
        let next = if more { rows.last().map(cursor) } else { None };
        Page { items: rows, next }
    }

    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page {
            items: self.items.into_iter().map(f).collect(),
            next: self.next,
        }
    }
}

/// An opaque cursor: `tag` (which list, which version of its key) and the fields of
/// the sort key, as base64url text. Opaque to clients, not secret: a hand-made
/// cursor only moves the start of a page, so it is not signed.
pub fn encode_cursor(tag: &str, fields: &[i64]) -> String {
    let mut text = String::from(tag);
    for field in fields {
        text.push('.');
        text.push_str(itoa::Buffer::new().format(*field));
    }
    URL_SAFE_NO_PAD.encode(text)
}

/// The fields of a cursor made by [`encode_cursor`] with the same `tag` and `N`
/// fields; anything else is a 400 `invalid_query`.
pub fn decode_cursor<const N: usize>(tag: &str, cursor: &str) -> Result<[i64; N], AppError> {
    if cursor.is_empty() {
        return Err(bad_cursor("empty"));
    }
    let text = (cursor.len() <= MAX_CURSOR_LEN)
        .then(|| URL_SAFE_NO_PAD.decode(cursor).ok())
        .flatten()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| bad_cursor("not a cursor this server issued"))?;
    let mut parts = text.split('.');
    if parts.next() != Some(tag) {
        return Err(bad_cursor("a cursor of another list"));
    }
    let mut fields = [0i64; N];
    for field in &mut fields {
        *field = parts
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| bad_cursor("not a cursor this server issued"))?;
    }
    if parts.next().is_some() {
        return Err(bad_cursor("not a cursor this server issued"));
    }
    Ok(fields)
}

/// Postgres's earliest `timestamptz` (4714-11-24 00:00 BC), in microseconds since
/// 1970. Its latest (294276) is past chrono's (262142), which bounds the other end.
const POSTGRES_MIN_MICROS: i64 = -210_866_803_200_000_000;

/// A time field of a cursor (microseconds since 1970): one Postgres can compare
/// with, else a 400 `invalid_query`. A cursor is not signed, so its times are
/// whatever the client wrote: one before Postgres's range parsed as a time but
/// failed the list's query ("timestamp out of range"), a 500.
pub fn cursor_time(us: i64) -> Result<DateTime<Utc>, AppError> {
    (us >= POSTGRES_MIN_MICROS)
        .then(|| DateTime::from_timestamp_micros(us))
        .flatten()
        .ok_or_else(|| bad_cursor("a time out of range"))
}

/// A 400 `invalid_query` about the `cursor` parameter.
pub fn bad_cursor(why: impl Into<Cow<'static, str>>) -> AppError {
    AppError::new(
        ErrorCode::InvalidQuery,
        format!("cursor: {}; start again without one", why.into()),
    )
}

/// Which sales or polls a list shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ListScope {
    /// The public lists and the home page: every one not archived.
    #[default]
    Public,
    /// The admin's, by state: all not archived, open (a sale live or sold out),
    /// upcoming, ended (or closed early), or the archived ones.
    All,
    Live,
    Upcoming,
    Ended,
    Archived,
    /// The sale-day console's live sales: archived ones too (an archived sale
    /// still sells by link while it runs). Not a filter of the lists.
    Console,
}

impl ListScope {
    pub fn as_str(self) -> &'static str {
        match self {
            ListScope::Public => "public",
            ListScope::All => "all",
            ListScope::Live => "live",
            ListScope::Upcoming => "upcoming",
            ListScope::Ended => "ended",
            ListScope::Archived => "archived",
            ListScope::Console => "console",
        }
    }
}

impl ListScope {
    /// The admin's filter by name (`all` when none): 400 `invalid_query` otherwise.
    pub fn parse_filter(raw: Option<&str>) -> Result<ListScope, crate::error::AppError> {
        match raw.unwrap_or("all") {
            "all" => Ok(ListScope::All),
            "live" => Ok(ListScope::Live),
            "upcoming" => Ok(ListScope::Upcoming),
            "ended" => Ok(ListScope::Ended),
            "archived" => Ok(ListScope::Archived),
            _ => Err(crate::error::AppError::new(
                crate::error::ErrorCode::InvalidQuery,
                "filter must be one of all, live, upcoming, ended, archived",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_times_are_the_ones_postgres_compares() {
        assert!(cursor_time(POSTGRES_MIN_MICROS).is_ok());
        assert!(cursor_time(0).is_ok());
        for bad in [
            POSTGRES_MIN_MICROS - 1,
            -300_000_000_000_000_000,
            i64::MIN,
            i64::MAX,
        ] {
            let e = cursor_time(bad).unwrap_err();
            assert_eq!(e.code(), "invalid_query", "{bad}");
        }
    }

    #[test]
    fn limit_is_1_to_200_and_50_by_default() {
        assert_eq!(Limit::parse(None).unwrap().get(), 50);
        assert_eq!(Limit::parse(Some("1")).unwrap().get(), 1);
        assert_eq!(Limit::parse(Some("200")).unwrap().get(), 200);
        for bad in ["0", "201", "-1", "", "abc", "1.5", "99999999999", " 5"] {
            let e = Limit::parse(Some(bad)).unwrap_err();
            assert_eq!(e.code(), "invalid_limit", "{bad:?}");
        }
    }

    #[test]
    fn cursors_round_trip_and_refuse_anything_else() {
        let c = encode_cursor("s1", &[1_700_000_000_000_000, 0, -5, 42]);
        assert!(
            c.chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_'),
            "{c}"
        );
        assert_eq!(
            decode_cursor::<4>("s1", &c).unwrap(),
            [1_700_000_000_000_000, 0, -5, 42]
        );
        let refused = |tag: &str, cursor: &str| {
            decode_cursor::<4>(tag, cursor).unwrap_err().code() == "invalid_query"
        };
        assert!(refused("p1", &c), "another list's cursor");
        assert!(refused("s1", &encode_cursor("s1", &[1, 2, 3])), "too few");
        assert!(
            refused("s1", &encode_cursor("s1", &[1, 2, 3, 4, 5])),
            "too many"
        );
        assert!(refused("s1", "not base64!"));
        assert!(refused("s1", ""));
        let empty = decode_cursor::<4>("s1", "").unwrap_err().public_message();
        assert_eq!(empty, "cursor: empty; start again without one");
        assert!(refused("s1", &"A".repeat(500)));
        assert!(refused("s1", &URL_SAFE_NO_PAD.encode("s1.1.2.x.4")));
        assert!(refused("s1", &URL_SAFE_NO_PAD.encode([0xff, 0xfe])));
    }

    #[test]
    fn a_page_has_a_next_cursor_only_when_a_row_was_left_over() {
        let limit = Limit::fixed(3);
        let page = Page::from_rows(vec![1, 2, 3, 4], limit, |n| n.to_string());
        assert_eq!((page.items, page.next), (vec![1, 2, 3], Some("3".into())));
        let last = Page::from_rows(vec![1, 2, 3], limit, |n| n.to_string());
        assert_eq!((last.items, last.next), (vec![1, 2, 3], None));
    }
}
