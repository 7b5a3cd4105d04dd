//! A waiting room's settings: checked at creation and edit, and as the sale's meta
//! hash holds them.

use chrono::{DateTime, Utc};

use crate::error::{AppError, ErrorCode};
use crate::sale::record::SaleRow;

/// Most admissions a second a sale may set.
pub const MAX_ADMIT_PER_SECOND: i32 = 100_000;

/// A sale's waiting-room settings, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitingRoom {
    pub queue_opens_at: DateTime<Utc>,
    pub admit_per_second: i32,
}

impl WaitingRoom {
    /// The settings of a new sale (or an edit before its opening): the line opens
    /// at or before the sale, and admits 1 to 100,000 a second.
    pub fn check(
        queue_opens_at: Option<DateTime<Utc>>,
        admit_per_second: Option<i64>,
        starts_at: DateTime<Utc>,
    ) -> Result<WaitingRoom, AppError> {
        let refuse = |m: &str| Err(AppError::new(ErrorCode::InvalidWaitingRoom, m.to_string()));
        let Some(queue_opens_at) = queue_opens_at else {
            return refuse("a waiting room needs queue_opens_at (when its line opens)");
        };
        if queue_opens_at > starts_at {
            return refuse("queue_opens_at must be at or before starts_at");
        }
        // Bounded as a sale's window is (a time out of Postgres's range, such as
        // a signed year far back, was a failed insert: a 500).
        let max_days = crate::domain::MAX_SALE_DAYS;
        if starts_at - queue_opens_at > chrono::Duration::days(max_days) {
            return Err(AppError::new(
                ErrorCode::InvalidWaitingRoom,
                format!("queue_opens_at may be at most {max_days} days before starts_at"),
            ));
        }
        let Some(rate) = admit_per_second else {
            return refuse("a waiting room needs admit_per_second (1 to 100000)");
        };
        if !(1..=i64::from(MAX_ADMIT_PER_SECOND)).contains(&rate) {
            return refuse("admit_per_second must be 1 to 100000");
        }
        Ok(WaitingRoom {
            queue_opens_at,
            admit_per_second: rate as i32,
        })
    }
}

/// The meta hash's `wr`: admissions a second, 0 without a waiting room, -1 for a
/// draw sale (admissions, its wins, are given by the draw: `lua/draw_admit.lua`;
/// the purchase wants one as with a waiting room, and no line is joined).
pub fn rate_in_meta(row: &SaleRow) -> i32 {
    if row.waiting_room {
        row.admit_per_second.unwrap_or(1).max(1)
    } else if row.is_draw() {
        -1
    } else {
        0
    }
}

/// The meta hash's `q_opens_ms`: when the line opens (the sale's start without one).
pub fn opens_ms_in_meta(row: &SaleRow) -> i64 {
    row.queue_opens_at
        .filter(|_| row.waiting_room)
        .unwrap_or(row.starts_at)
        .timestamp_millis()
}
