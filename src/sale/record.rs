//! A sale's record: the `sales` row ([`SaleRow`]), the view the API and pages show
//! ([`SaleView`]: the record plus live numbers), and the reads of one row.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::queue::numbers::QueueNumbers;
use crate::domain::SaleId;

/// A sale as stored in Postgres (and, as JSON, in the view cache).
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct SaleRow {
    #[schema(value_type = i64)]
    pub id: SaleId,
    pub name: String,
    pub description: String,
    pub price_cents: i64,
    pub stock_total: i64,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub closed: bool,
    /// The picture: an `https://` address or a path on this site; none shows the
    /// placeholder. (Default: views cached before pictures existed have none.)
    #[serde(default)]
    pub image_url: Option<String>,
    /// A purchase must carry a ticket (see [`super::ticket`]); chosen at creation,
    /// never changed. No serde default: a view cached by a binary from before
    /// tickets does not parse, so it is rebuilt from Postgres instead of being read
    /// as "no ticket" (which `TicketRules` would then remember).
    pub requires_ticket: bool,
    /// Seconds a buyer has to pay (`POST /api/orders/{id}/pay`) before the order
    /// expires and its unit goes back; 0: no payment step. Fixed at creation.
    pub payment_window_s: i32,
    /// Whether a buyer whose order expired unpaid may buy again. Fixed at creation.
    pub rebuy_after_expiry: bool,
    /// Most units one buyer may hold (a purchase may ask for several: `quantity`).
    /// Fixed once the sale opens.
    pub max_per_user: i32,
    /// When an admin archived the sale: off the public lists and the home page, its
    /// page and orders still reachable by link. (Default: views cached before
    /// archiving existed are of sales not archived.)
    #[serde(default)]
    pub archived_at: Option<DateTime<Utc>>,
    /// A rehearsal (`stampede load`): fixed at creation, never on a public page or
    /// list (only admins see it), removed with its orders by
    /// [`super::rehearsal::cleanup`]. No serde default, like `requires_ticket`: a
    /// view cached before rehearsals existed is rebuilt, never read as public.
    pub rehearsal: bool,
    /// A waiting room (see [`super::queue`]): the sale sells only to shoppers
    /// admitted from its line. Fixed once the sale opens. No serde default, like
    /// `requires_ticket`: a view cached before waiting rooms existed is rebuilt.
    pub waiting_room: bool,
    /// With a waiting room: when its line opens (at or before `starts_at`).
    pub queue_opens_at: Option<DateTime<Utc>>,
    /// With a waiting room: shoppers admitted a second from the opening.
    pub admit_per_second: Option<i32>,
}

/// A sale as the API shows it: the record plus live numbers from Redis.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct SaleView {
    #[serde(flatten)]
    pub sale: SaleRow,
    pub stock_left: i64,
    pub sold: i64,
    pub status: crate::domain::SaleStatus,
    /// A sale with a waiting room: its line in numbers (an open page follows its
    /// place with `served`). Absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<QueueNumbers>,
}

impl SaleView {
    pub fn new(sale: SaleRow, stock_left: i64, sold: i64, now: DateTime<Utc>) -> Self {
        let status = crate::domain::SaleStatus::of(
            sale.closed,
            now,
            sale.starts_at,
            sale.ends_at,
            stock_left,
        );
        SaleView {
            sale,
            stock_left,
            sold,
            status,
            line: None,
        }
    }
}

/// The columns of [`SaleRow`], as a literal so queries stay `&'static str`.
macro_rules! sale_columns {
    () => {
        "id, name, description, price_cents, stock_total, starts_at, ends_at, closed, image_url, requires_ticket, \
         payment_window_s, rebuy_after_expiry, max_per_user, archived_at, rehearsal, waiting_room, \
         queue_opens_at, admit_per_second"
    };
}
pub(crate) use sale_columns;

pub async fn fetch_sale(db: &PgPool, id: SaleId) -> Result<Option<SaleRow>, sqlx::Error> {
    sqlx::query_as::<_, SaleRow>(concat!(
        "SELECT ",
        sale_columns!(),
        " FROM sales WHERE id = $1"
    ))
    .bind(id.get())
    .fetch_optional(db)
    .await
}

/// Whether a sale of that name has not ended yet (the demo seed creates one once).
pub async fn unended_named(db: &PgPool, name: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM sales WHERE name = $1 AND ends_at > now())")
        .bind(name)
        .fetch_one(db)
        .await
}

#[cfg(test)]
impl SaleRow {
    /// A plain sale for unit tests: one per customer, no ticket, no waiting room.
    pub(crate) fn sample(
        starts_at: DateTime<Utc>,
        ends_at: DateTime<Utc>,
        closed: bool,
        stock_total: i64,
    ) -> SaleRow {
        SaleRow {
            id: crate::domain::Id::new(1).expect("a positive id"),
            name: "x".into(),
            description: String::new(),
            price_cents: 1,
            stock_total,
            starts_at,
            ends_at,
            closed,
            image_url: None,
            requires_ticket: false,
            payment_window_s: 0,
            rebuy_after_expiry: false,
            max_per_user: 1,
            archived_at: None,
            rehearsal: false,
            waiting_room: false,
            queue_opens_at: None,
            admit_per_second: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_follows_time_and_stock() {
        let now = Utc::now();
        let minute = chrono::Duration::minutes(1);
        let row = |closed| SaleRow::sample(now - minute, now + minute, closed, 10);
        assert_eq!(SaleView::new(row(false), 5, 5, now).status, "live");
        assert_eq!(SaleView::new(row(false), 0, 10, now).status, "sold_out");
        assert_eq!(SaleView::new(row(true), 5, 5, now).status, "closed");
        assert_eq!(
            SaleView::new(row(false), 5, 5, now + chrono::Duration::minutes(2)).status,
            "ended"
        );
        assert_eq!(
            SaleView::new(row(false), 5, 5, now - chrono::Duration::minutes(2)).status,
            "upcoming"
        );
    }
}
