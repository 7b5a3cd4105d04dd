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
    /// Units offered: the stock the admin set plus top-ups. A returned unit (a
    /// cancelled, refunded or expired order's) goes back to units left without
    /// changing it. (The column `sales.stock_total` also counts returned units
    /// offered again, `units_reoffered`: see [`SaleRow::units_ever_offered`].)
    pub stock_total: i64,
    /// Returned units offered again on a sale whose buyers may not buy again (their
    /// buyer keeps their place in the buyers hash): read from Postgres only, by the
    /// rebuild and the reconciliation; 0 in a cached view, which never needs it.
    #[serde(skip)]
    pub units_reoffered: i64,
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
    /// Leading zero bits of the proof of work asked with the ticket and the
    /// waiting room's join (see [`crate::gate`]); 0: none. Fixed once the sale
    /// opens. (Default: views cached before it existed are of sales without.)
    #[serde(default)]
    pub proof_of_work: i16,
    /// Least age of an account that may join, take a ticket or buy, seconds
    /// before the opening (see [`crate::gate::age`]); 0: any. Fixed once the
    /// sale opens.
    #[serde(default)]
    pub min_account_age_s: i32,
    /// `first_come` (the default) or `draw` (see [`super::draw`]): fixed at creation.
    #[serde(default)]
    #[sqlx(try_from = "String")]
    pub mode: SaleMode,
    /// A draw: when entries open (before `starts_at`, which is the draw).
    #[serde(default)]
    pub entries_open_at: Option<DateTime<Utc>>,
    /// A draw: seconds each winner has to buy (60 to 86400).
    #[serde(default)]
    pub claim_window_s: Option<i32>,
    /// A draw: hex SHA-256 of the secret seed drawn at creation, public from the
    /// start, so the seed cannot be chosen once the entries are known.
    #[serde(default)]
    pub draw_commitment: Option<String>,
}

/// How a sale sells: to the first who buy, or to the winners of a draw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SaleMode {
    #[default]
    FirstCome,
    Draw,
}

impl SaleMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SaleMode::FirstCome => "first_come",
            SaleMode::Draw => "draw",
        }
    }
}

impl TryFrom<String> for SaleMode {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "first_come" => Ok(SaleMode::FirstCome),
            "draw" => Ok(SaleMode::Draw),
            _ => Err(format!("unknown sale mode {s:?}")),
        }
    }
}

impl SaleRow {
    /// What the stock arithmetic of both stores counts: units left plus the units
    /// the buyers hash holds (returned units offered again included).
    pub fn units_ever_offered(&self) -> i64 {
        self.stock_total + self.units_reoffered
    }

    /// A draw sale: only the winners of its draw buy.
    pub fn is_draw(&self) -> bool {
        self.mode == SaleMode::Draw
    }

    /// When the sale's terms become fixed: its opening, or for a draw the earlier
    /// moment its entries open (an edit then may change only the words, the
    /// picture and a later end).
    pub fn terms_fixed_at(&self) -> DateTime<Utc> {
        self.entries_open_at
            .map_or(self.starts_at, |at| at.min(self.starts_at))
    }
}

/// A sale as the API shows it: the record plus live numbers from Redis.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct SaleView {
    #[serde(flatten)]
    pub sale: SaleRow,
    /// Units left to sell, live from Redis (0, with `sold` 0, while Redis does not
    /// hold the sale: after a wipe, until its rebuild; `status` then goes by the
    /// sale's window).
    pub stock_left: i64,
    /// Units sold: held by accepted orders (settled or not) that are not
    /// cancelled, refunded or expired: `stock_total - stock_left`.
    pub sold: i64,
    pub status: crate::domain::SaleStatus,
    /// A sale with a waiting room: its line in numbers (an open page follows its
    /// place with `served`). Absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<QueueNumbers>,
    /// A draw sale: when it is drawn (its `starts_at`). Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draw_at: Option<DateTime<Utc>>,
    /// A live draw sale whose draw is over (every entry had its turn, or the sale
    /// closed or ended before and was reopened: no win runs or passes on any
    /// more): when it finished. Units still left then are not for sale to anyone,
    /// though `status` says `live` until the sale's end. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draw_finished_at: Option<DateTime<Utc>>,
}

impl SaleView {
    /// The view of `sale` with `stock_left` units left in Redis (`None`: Redis does
    /// not hold the sale now, so nothing is known sold or left).
    pub fn new(sale: SaleRow, stock_left: Option<i64>, now: DateTime<Utc>) -> Self {
        // Units left can exceed the record for a moment during a top-up.
        let sold = stock_left.map_or(0, |left| (sale.stock_total - left).max(0));
        // Unknown stock is not none left: the status then goes by the window alone
        // (a live sale Redis is rebuilding said "sold out" until the rebuild).
        let status = crate::domain::SaleStatus::of(
            sale.closed,
            now,
            sale.starts_at,
            sale.ends_at,
            stock_left.unwrap_or(1),
        );
        let stock_left = stock_left.unwrap_or(0);
        SaleView {
            draw_at: sale.is_draw().then_some(sale.starts_at),
            draw_finished_at: None,
            stock_left,
            sold,
            status,
            line: None,
            sale,
        }
    }
}

/// The columns of [`SaleRow`] read from `sales`, as a literal so queries stay
/// `&'static str`: `stock_total` is the units offered (the column less
/// `units_reoffered`).
macro_rules! sale_columns {
    () => {
        "id, name, description, price_cents, stock_total - units_reoffered AS stock_total, \
         units_reoffered, starts_at, ends_at, closed, image_url, requires_ticket, \
         payment_window_s, rebuy_after_expiry, max_per_user, archived_at, rehearsal, waiting_room, \
         queue_opens_at, admit_per_second, proof_of_work, min_account_age_s, mode, entries_open_at, \
         claim_window_s, draw_commitment"
    };
}
pub(crate) use sale_columns;

/// The names of [`SaleRow`]'s fields, to read them from a subquery that selected
/// [`sale_columns!`].
macro_rules! sale_fields {
    () => {
        "id, name, description, price_cents, stock_total, units_reoffered, starts_at, ends_at, \
         closed, image_url, requires_ticket, payment_window_s, rebuy_after_expiry, max_per_user, \
         archived_at, rehearsal, waiting_room, queue_opens_at, admit_per_second, proof_of_work, \
         min_account_age_s, mode, entries_open_at, claim_window_s, draw_commitment"
    };
}
pub(crate) use sale_fields;

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
            units_reoffered: 0,
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
            proof_of_work: 0,
            min_account_age_s: 0,
            mode: SaleMode::FirstCome,
            entries_open_at: None,
            claim_window_s: None,
            draw_commitment: None,
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
        assert_eq!(SaleView::new(row(false), Some(5), now).status, "live");
        assert_eq!(SaleView::new(row(false), Some(0), now).status, "sold_out");
        assert_eq!(SaleView::new(row(true), Some(5), now).status, "closed");
        assert_eq!(
            SaleView::new(row(false), Some(5), now + chrono::Duration::minutes(2)).status,
            "ended"
        );
        assert_eq!(
            SaleView::new(row(false), Some(5), now - chrono::Duration::minutes(2)).status,
            "upcoming"
        );
    }

    #[test]
    fn sold_is_what_was_offered_less_what_is_left() {
        let now = Utc::now();
        let minute = chrono::Duration::minutes(1);
        // 100 offered; 7 bought, 4 of them returned (offered again): 97 left.
        let mut row = SaleRow::sample(now - minute, now + minute, false, 100);
        row.units_reoffered = 4;
        assert_eq!(row.units_ever_offered(), 104);
        let view = SaleView::new(row.clone(), Some(97), now);
        assert_eq!(
            (view.sale.stock_total, view.stock_left, view.sold),
            (100, 97, 3)
        );
        // A top-up applied in Redis a moment before Postgres has it.
        let view = SaleView::new(row.clone(), Some(105), now);
        assert_eq!((view.stock_left, view.sold), (105, 0));
        // Redis does not hold the sale (a wipe, before its rebuild): nothing is
        // known sold or left, and the sale is live, not sold out.
        let view = SaleView::new(row, None, now);
        assert_eq!((view.stock_left, view.sold), (0, 0));
        assert_eq!(view.status, "live");
    }
}
