//! Where a sale or a poll stands, for the API and the pages.

use std::fmt;

/// Where a sale stands: the API's `status`, the pages' CSS class and label, and the
/// shop's order. Serialized as `upcoming`, `live`, `sold_out`, `ended`, `closed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SaleStatus {
    Upcoming,
    Live,
    SoldOut,
    Ended,
    Closed,
}

impl SaleStatus {
    /// Closed by an admin wins; then the window; then the stock.
    pub fn of(
        closed: bool,
        now: chrono::DateTime<chrono::Utc>,
        starts_at: chrono::DateTime<chrono::Utc>,
        ends_at: chrono::DateTime<chrono::Utc>,
        stock_left: i64,
    ) -> Self {
        if closed {
            SaleStatus::Closed
        } else if now >= ends_at {
            SaleStatus::Ended
        } else if now < starts_at {
            SaleStatus::Upcoming
        } else if stock_left <= 0 {
            SaleStatus::SoldOut
        } else {
            SaleStatus::Live
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            SaleStatus::Upcoming => "upcoming",
            SaleStatus::Live => "live",
            SaleStatus::SoldOut => "sold_out",
            SaleStatus::Ended => "ended",
            SaleStatus::Closed => "closed",
        }
    }

    /// For people.
    pub const fn label(self) -> &'static str {
        match self {
            SaleStatus::Upcoming => "Upcoming",
            SaleStatus::Live => "Live",
            SaleStatus::SoldOut => "Sold out",
            SaleStatus::Ended => "Ended",
            SaleStatus::Closed => "Closed",
        }
    }

    /// Shoppers see first what they can buy now, then what opens soon, then the
    /// rest (sorting by this is stable: the store's order holds within a rank).
    pub const fn shop_rank(self) -> u8 {
        match self {
            SaleStatus::Live => 0,
            SaleStatus::Upcoming => 1,
            SaleStatus::SoldOut => 2,
            SaleStatus::Ended => 3,
            SaleStatus::Closed => 4,
        }
    }
}

/// Where a poll stands. Serialized as `upcoming`, `open`, `closed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PollStatus {
    Upcoming,
    Open,
    Closed,
}

impl PollStatus {
    /// Closed by an admin or run out; else not yet open; else open.
    pub fn of(
        closed: bool,
        now: chrono::DateTime<chrono::Utc>,
        opens_at: chrono::DateTime<chrono::Utc>,
        closes_at: chrono::DateTime<chrono::Utc>,
    ) -> Self {
        if closed || now >= closes_at {
            PollStatus::Closed
        } else if now < opens_at {
            PollStatus::Upcoming
        } else {
            PollStatus::Open
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            PollStatus::Upcoming => "upcoming",
            PollStatus::Open => "open",
            PollStatus::Closed => "closed",
        }
    }

    pub const fn label(self) -> &'static str {
        match self {
            PollStatus::Upcoming => "Upcoming",
            PollStatus::Open => "Open",
            PollStatus::Closed => "Closed",
        }
    }

    /// Voters see first the polls they can vote in, then the ones that open soon.
    pub const fn rank(self) -> u8 {
        match self {
            PollStatus::Open => 0,
            PollStatus::Upcoming => 1,
            PollStatus::Closed => 2,
        }
    }
}

/// Both statuses print as their wire name (the templates use it as a CSS class)
/// and compare with it (`{% if sale.status == "closed" %}`).
macro_rules! status_text {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl PartialEq<&str> for $t {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl PartialEq<str> for $t {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }
    )*};
}
status_text!(SaleStatus, PollStatus);
