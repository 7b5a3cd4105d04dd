//! Sale lists: the order every list shares ([`list_rank`]), its keyset query
//! ([`list_page`]) and the opaque cursor of the next page ([`SaleCursor`]).

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::record::{SaleRow, sale_columns, sale_fields};
use crate::error::AppError;

/// Up to `limit` sales, latest start first: `stampede reconcile` walks them all.
pub async fn list_sales(db: &PgPool, limit: i64) -> Result<Vec<SaleRow>, sqlx::Error> {
    sqlx::query_as::<_, SaleRow>(concat!(
        "SELECT ",
        sale_columns!(),
        " FROM sales ORDER BY starts_at DESC, id DESC LIMIT $1"
    ))
    .bind(limit)
    .fetch_all(db)
    .await
}

/// The order of every sale list (`GET /api/sales`, the admin's, the pages): by
/// [`list_rank`] as of one moment (the first page's, carried by the cursor, so a
/// walk through the pages sees one order even as sales open and end meanwhile);
/// upcoming sales soonest opening first, the others latest start first; the id
/// (highest first) breaks ties. Live and sold-out sales share a rank: which one a
/// sale is, only Redis knows.
///
/// Keyset paging: a page reads the sales after the cursor's key, never an offset.
/// The rank depends on the clock, so no index serves this order; sorting the whole
/// table (thousands of rows) for a page costs about a millisecond.
///
/// Rehearsals are in it only when `rehearsals` (the admin's lists): a public list
/// never holds one, filtered here, before the cache stores the first page.
pub async fn list_page(
    db: &PgPool,
    at: DateTime<Utc>,
    after: Option<&SaleCursor>,
    limit: i64,
    scope: crate::paging::ListScope,
) -> Result<Vec<SaleRow>, sqlx::Error> {
    sqlx::query_as::<_, SaleRow>(concat!(
        "SELECT ",
        sale_fields!(),
        " FROM (SELECT ",
        sale_columns!(),
        ", CASE WHEN closed THEN 3 WHEN ends_at <= $1 THEN 2 WHEN starts_at > $1 THEN 1 ELSE 0 END
                  AS list_rank
            FROM sales) s
         WHERE ($2::int2 IS NULL
            OR list_rank > $2
            OR (list_rank = $2 AND CASE WHEN $2 = 1
                  THEN (starts_at, -id) > ($3::timestamptz, -$4::int8)
                  ELSE (starts_at, id) < ($3::timestamptz, $4::int8) END))
           AND CASE $6::text
                 WHEN 'archived' THEN archived_at IS NOT NULL
                 WHEN 'live' THEN archived_at IS NULL AND list_rank = 0
                 WHEN 'console' THEN list_rank = 0
                 WHEN 'upcoming' THEN archived_at IS NULL AND list_rank = 1
                 WHEN 'ended' THEN archived_at IS NULL AND list_rank >= 2
                 WHEN 'public' THEN archived_at IS NULL AND NOT rehearsal
                 ELSE archived_at IS NULL END
         ORDER BY list_rank, CASE WHEN list_rank = 1 THEN starts_at END ASC, starts_at DESC, id DESC
         LIMIT $5"
    ))
    .bind(at)
    .bind(after.map(|c| c.rank))
    .bind(after.map(|c| c.starts_at))
    .bind(after.map(|c| c.id))
    .bind(limit)
    .bind(scope.as_str())
    .fetch_all(db)
    .await
}

/// A sale's place in the list order at `at` (the `list_rank` of [`list_page`]'s
/// SQL, which this must match): 0 open (live or sold out), 1 upcoming, 2 ended,
/// 3 closed early.
pub fn list_rank(sale: &SaleRow, at: DateTime<Utc>) -> i16 {
    if sale.closed {
        3
    } else if sale.ends_at <= at {
        2
    } else if sale.starts_at > at {
        1
    } else {
        0
    }
}

/// Where the next page of a sale list starts: the moment the walk's order is taken
/// at, and the sort key of the last sale shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaleCursor {
    pub at: DateTime<Utc>,
    pub rank: i16,
    pub starts_at: DateTime<Utc>,
    pub id: i64,
}

impl SaleCursor {
    const TAG: &'static str = "s1";

    /// The cursor after `last`, in the order taken at `at`.
    pub fn after(last: &SaleRow, at: DateTime<Utc>) -> Self {
        SaleCursor {
            at,
            rank: list_rank(last, at),
            starts_at: last.starts_at,
            id: last.id.get(),
        }
    }

    pub fn encode(&self) -> String {
        crate::paging::encode_cursor(
            Self::TAG,
            &[
                self.at.timestamp_micros(),
                i64::from(self.rank),
                self.starts_at.timestamp_micros(),
                self.id,
            ],
        )
    }

    /// A cursor of a sale list; anything else is a 400 `invalid_query`.
    pub fn parse(raw: &str) -> Result<Self, AppError> {
        let [at, rank, starts_at, id] = crate::paging::decode_cursor::<4>(Self::TAG, raw)?;
        let time = crate::paging::cursor_time;
        let rank = i16::try_from(rank)
            .ok()
            .filter(|r| (0..=3).contains(r))
            .ok_or_else(|| crate::paging::bad_cursor("an unknown rank"))?;
        if id < 1 {
            return Err(crate::paging::bad_cursor("an id that is not positive"));
        }
        Ok(SaleCursor {
            at: time(at)?,
            rank,
            starts_at: time(starts_at)?,
            id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_rank_groups_open_upcoming_ended_closed() {
        let now = Utc::now();
        let minute = chrono::Duration::minutes(1);
        let row = |starts_at, ends_at, closed| SaleRow::sample(starts_at, ends_at, closed, 0);
        // Sold out (stock 0) is open: only Redis knows stock.
        assert_eq!(list_rank(&row(now - minute, now + minute, false), now), 0);
        assert_eq!(
            list_rank(&row(now, now + minute, false), now),
            0,
            "opens now"
        );
        assert_eq!(
            list_rank(&row(now + minute, now + minute * 2, false), now),
            1
        );
        assert_eq!(
            list_rank(&row(now - minute * 2, now, false), now),
            2,
            "ends now"
        );
        assert_eq!(
            list_rank(&row(now + minute, now + minute * 2, true), now),
            3
        );
    }

    #[test]
    fn sale_cursors_round_trip_and_refuse_bad_fields() {
        let at = crate::paging::list_moment();
        let cursor = SaleCursor {
            at,
            rank: 1,
            starts_at: at + chrono::Duration::hours(1),
            id: 42,
        };
        assert_eq!(SaleCursor::parse(&cursor.encode()).unwrap(), cursor);
        let at_us = at.timestamp_micros();
        for fields in [
            [at_us, 4, at_us, 1],
            [at_us, -1, at_us, 1],
            [at_us, 0, at_us, 0],
            [i64::MAX, 0, at_us, 1],
        ] {
            let raw = crate::paging::encode_cursor("s1", &fields);
            assert_eq!(SaleCursor::parse(&raw).unwrap_err().code(), "invalid_query");
        }
    }
}
