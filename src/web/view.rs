//! What templates show, computed in Rust so templates stay free of logic:
//! the header's account links, sales and polls as cards, prices, times and vote
//! shares as text.

use crate::sale::orders::OrderStatus;
use actix_web::HttpRequest;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::domain::{PollStatus, SaleStatus};
use crate::error::AppError;
use crate::routes::auth::{self, AuthUser};
use crate::sale::queue::numbers::QueueNumbers;
use crate::sale::record::SaleView;
use crate::vote::store::{PollRow, Results};

/// The account part of the page header.
pub struct Nav {
    pub user: Option<NavUser>,
    /// `?next=<this page>` for the header's sign-in and sign-up links, so a visitor
    /// lands back where they were; empty on the home page and the auth pages
    /// (whose own `next` the script carries over).
    pub next: String,
}

pub struct NavUser {
    pub username: String,
    pub admin: bool,
}

impl Nav {
    pub fn anonymous() -> Self {
        Nav {
            user: None,
            next: String::new(),
        }
    }

    /// The caller and their name. One indexed query: fine for pages, which is why
    /// the buy path never calls this. A token whose user was deleted counts as
    /// signed out.
    pub async fn load(req: &HttpRequest, db: &PgPool) -> Result<(Nav, Option<AuthUser>), AppError> {
        let Some(user) = auth::optional_user(req)? else {
            return Ok((
                Nav {
                    user: None,
                    next: next_query(req.path()),
                },
                None,
            ));
        };
        Ok(match crate::auth::user_view(db, user.id).await? {
            Some(account) => (
                Nav {
                    user: Some(NavUser {
                        username: account.username,
                        admin: account.is_admin,
                    }),
                    next: String::new(),
                },
                Some(user),
            ),
            None => (
                Nav {
                    user: None,
                    next: next_query(req.path()),
                },
                None,
            ),
        })
    }
}

/// `?next=%2Fsales%2F3` for a page path; nothing for the home page and the auth
/// pages themselves.
pub fn next_query(path: &str) -> String {
    if path == "/" || path == "/signin" || path == "/signup" || !path.starts_with('/') {
        String::new()
    } else {
        format!("?next={}", encode_component(path))
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn encode_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// An instant as the page shows it: machine-readable for `<time>` and for the
/// script (milliseconds), plus a UTC text that the script turns into local time.
pub struct Moment {
    pub iso: String,
    pub text: String,
    pub ms: i64,
}

impl From<DateTime<Utc>> for Moment {
    fn from(at: DateTime<Utc>) -> Self {
        Moment {
            iso: at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            text: at.format("%Y-%m-%d %H:%M UTC").to_string(),
            ms: at.timestamp_millis(),
        }
    }
}

/// A sale as pages show it.
pub struct SaleCard {
    pub id: i64,
    pub name: String,
    pub description: String,
    pub price: String,
    /// Also the card's CSS class (`sold_out`, ...).
    pub status: SaleStatus,
    pub status_label: &'static str,
    pub stock_left: i64,
    pub stock_total: i64,
    pub sold: i64,
    pub starts_at: Moment,
    pub ends_at: Moment,
    /// The end time has passed (a closed sale may be reopened only before it).
    pub past_end: bool,
    /// The picture; `None` shows the placeholder (`/static/products/placeholder.svg`).
    pub image_url: Option<String>,
    /// A purchase must carry a ticket: the page gets one right before it buys.
    pub requires_ticket: bool,
    /// Seconds a buyer has to pay once the order is accepted; 0: no payment step.
    pub payment_window_s: i32,
    /// A buyer whose order expired unpaid may buy again.
    pub rebuy_after_expiry: bool,
    /// Most units one buyer may hold; more than 1: the page offers a quantity.
    pub max_per_user: i32,
    /// A rehearsal (`stampede load`): only admins see it, marked "Rehearsal".
    pub rehearsal: bool,
    /// Shoppers buy through a waiting room (see `crate::sale::queue`): the sale
    /// page shows the line instead of a plain Buy.
    pub waiting_room: bool,
    /// With a waiting room: when its line opens.
    pub queue_opens_at: Option<Moment>,
    /// With a waiting room: shoppers admitted a second from the opening.
    pub admit_per_second: i32,
    /// With a waiting room: the line in numbers when the page was made.
    pub line: Option<QueueNumbers>,
}

impl SaleCard {
    pub fn stock_left_text(&self) -> String {
        group_digits(self.stock_left)
    }

    /// The picture to show: the sale's, or the placeholder.
    pub fn picture(&self) -> &str {
        self.image_url
            .as_deref()
            .unwrap_or("/static/products/placeholder.svg")
    }

    pub fn stock_total_text(&self) -> String {
        group_digits(self.stock_total)
    }

    pub fn sold_text(&self) -> String {
        group_digits(self.sold)
    }

    /// A buyer may take more than one unit: the sale page shows a quantity.
    pub fn sells_several(&self) -> bool {
        self.max_per_user > 1
    }

    /// "One per customer", "Up to 3 per customer".
    pub fn limit_text(&self) -> String {
        if self.sells_several() {
            format!("Up to {} per customer", self.max_per_user)
        } else {
            "One per customer".to_string()
        }
    }

    /// The quantities a buyer may ask for at once: 1 to `max_per_user`.
    pub fn quantities(&self) -> std::ops::RangeInclusive<i32> {
        1..=self.max_per_user.max(1)
    }

    pub fn has_payment_step(&self) -> bool {
        self.payment_window_s > 0
    }

    /// "1 minute", "90 seconds": how long a buyer has to pay.
    pub fn payment_window_text(&self) -> String {
        duration_text(i64::from(self.payment_window_s))
    }

    /// The admin actions that make sense in the sale's state; `app.js`
    /// (`saleActions`) decides the same after every refresh.
    pub fn can_change_stock(&self) -> bool {
        !self.past_end
    }

    pub fn can_open(&self) -> bool {
        matches!(self.status, SaleStatus::Upcoming | SaleStatus::Closed) && !self.past_end
    }

    /// "1,000 a second": the pace of the waiting room's admissions.
    pub fn admission_rate_text(&self) -> String {
        format!(
            "{} a second",
            group_digits(i64::from(self.admit_per_second))
        )
    }

    /// A waiting room's line in numbers, as the sale's admin page lists them (the
    /// `field` is the view's `line` member that `js/admin-sale.js` keeps current).
    pub fn line_facts(&self) -> Vec<LineFact> {
        let Some(n) = self.line else {
            return Vec::new();
        };
        [
            ("Joined", "line", n.line),
            ("Waiting", "waiting", n.waiting),
            ("Let in", "admitted", n.admitted),
            ("Let in, not bought yet", "open", n.open),
            ("Passed unused", "passed", n.passed),
        ]
        .into_iter()
        .map(|(label, field, value)| LineFact {
            label,
            field,
            value: group_digits(value),
        })
        .collect()
    }

    pub fn can_close(&self) -> bool {
        matches!(
            self.status,
            SaleStatus::Upcoming | SaleStatus::Live | SaleStatus::SoldOut
        )
    }
}

/// One number of a waiting room's line on the admin page.
pub struct LineFact {
    pub label: &'static str,
    pub field: &'static str,
    pub value: String,
}

impl From<SaleView> for SaleCard {
    fn from(view: SaleView) -> Self {
        let sale = view.sale;
        SaleCard {
            past_end: Utc::now() >= sale.ends_at,
            id: sale.id.get(),
            price: format_price(sale.price_cents),
            status: view.status,
            status_label: view.status.label(),
            stock_left: view.stock_left.max(0),
            // Units left can exceed the record for a moment during a top-up.
            stock_total: sale.stock_total.max(view.stock_left),
            sold: view.sold,
            starts_at: sale.starts_at.into(),
            ends_at: sale.ends_at.into(),
            name: sale.name,
            description: sale.description,
            image_url: sale.image_url,
            requires_ticket: sale.requires_ticket,
            payment_window_s: sale.payment_window_s,
            rebuy_after_expiry: sale.rebuy_after_expiry,
            max_per_user: sale.max_per_user,
            rehearsal: sale.rehearsal,
            waiting_room: sale.waiting_room,
            queue_opens_at: sale
                .queue_opens_at
                .filter(|_| sale.waiting_room)
                .map(Moment::from),
            admit_per_second: sale.admit_per_second.unwrap_or(0),
            line: view.line,
        }
    }
}

/// Where a settled order stands, as pages show it.
pub enum OrderState {
    /// The sale has no payment step: the order is complete.
    Confirmed,
    /// To be paid before `pay_by`.
    AwaitingPayment { pay_by: Moment },
    /// `paid_at` is missing only for a row that lost it (the schema does not tie them).
    Paid { paid_at: Option<Moment> },
    /// Not paid in time: its unit went back on sale.
    Expired,
    /// Cancelled (by the buyer or an admin): its units went back on sale.
    Cancelled,
    /// Cancelled by an admin after payment: refunded.
    Refunded,
}

impl OrderState {
    /// From the `orders` row. `overdue` is Postgres's `pay_by <= now()`: an order
    /// past its deadline is shown expired before the expiry job gets to it, since a
    /// payment would be refused the same way.
    pub fn of(
        status: OrderStatus,
        overdue: bool,
        pay_by: Option<DateTime<Utc>>,
        paid_at: Option<DateTime<Utc>>,
    ) -> Self {
        match (status, pay_by) {
            (OrderStatus::AwaitingPayment, Some(pay_by)) if !overdue => {
                OrderState::AwaitingPayment {
                    pay_by: pay_by.into(),
                }
            }
            (OrderStatus::AwaitingPayment | OrderStatus::Expired, _) => OrderState::Expired,
            (OrderStatus::Paid, _) => OrderState::Paid {
                paid_at: paid_at.map(Moment::from),
            },
            (OrderStatus::Accepted, _) => OrderState::Confirmed,
            (OrderStatus::Cancelled, _) => OrderState::Cancelled,
            (OrderStatus::Refunded, _) => OrderState::Refunded,
        }
    }

    /// The row's `data-payment`: the script's name for the state.
    pub fn as_str(&self) -> &'static str {
        match self {
            OrderState::Confirmed => "none",
            OrderState::AwaitingPayment { .. } => "awaiting_payment",
            OrderState::Paid { .. } => "paid",
            OrderState::Expired => "expired",
            OrderState::Cancelled => "cancelled",
            OrderState::Refunded => "refunded",
        }
    }
}

/// "1d 02:03:04", "02:03:04" or "03:04", as the script's `formatDuration` writes
/// a time left (whole seconds, rounded up; never negative).
pub fn clock_text(ms: i64) -> String {
    let total = (ms.max(0) + 999) / 1000;
    let (days, h, m, s) = (
        total / 86_400,
        total % 86_400 / 3600,
        total % 3600 / 60,
        total % 60,
    );
    match days {
        0 if h == 0 => format!("{m:02}:{s:02}"),
        0 => format!("{h:02}:{m:02}:{s:02}"),
        _ => format!("{days}d {h:02}:{m:02}:{s:02}"),
    }
}

/// "1 minute", "15 minutes", "45 seconds", "2 hours", "1 min 30 s".
pub fn duration_text(seconds: i64) -> String {
    let plural = |n: i64, unit: &str| {
        if n == 1 {
            format!("1 {unit}")
        } else {
            format!("{n} {unit}s")
        }
    };
    match seconds {
        s if s >= 3600 && s % 3600 == 0 => plural(s / 3600, "hour"),
        s if s >= 60 && s % 60 == 0 => plural(s / 60, "minute"),
        s if s < 60 => plural(s, "second"),
        s => format!("{} min {} s", s / 60, s % 60),
    }
}

/// The home page's order: what can be bought now, then what opens soonest, then
/// sold-out, ended and closed sales (the store's order within those groups).
pub fn sort_for_shop(sales: &mut [SaleCard]) {
    sales.sort_by_key(|sale| {
        let soonest = if sale.status == SaleStatus::Upcoming {
            sale.starts_at.ms
        } else {
            0
        };
        (sale.status.shop_rank(), soonest)
    });
}

/// A poll as the list and the admin table show it.
pub struct PollCard {
    pub id: i64,
    pub question: String,
    /// Also the row's CSS class.
    pub status: PollStatus,
    pub status_label: &'static str,
    /// Closed by an admin before its time, rather than run out.
    pub closed_early: bool,
    pub voters: i64,
    pub opens_at: Moment,
    pub closes_at: Moment,
}

impl PollCard {
    pub fn new(poll: PollRow, voters: i64, now: DateTime<Utc>) -> Self {
        let status = crate::vote::store::status(&poll, now);
        PollCard {
            id: poll.id,
            status,
            status_label: status.label(),
            closed_early: poll.closed && now < poll.closes_at,
            voters,
            opens_at: poll.opens_at.into(),
            closes_at: poll.closes_at.into(),
            question: poll.question,
        }
    }
}

/// One option of a poll with its live share of the votes.
pub struct OptionResult {
    pub id: i64,
    pub label: String,
    pub votes: i64,
    pub percent: i64,
}

/// The options in the poll's order with their tallies; `total` is what the
/// percentages are of (never 0, so an empty poll shows 0% bars).
pub fn option_results(options: Vec<(i64, String)>, results: &Results) -> (Vec<OptionResult>, i64) {
    let votes_of = |id: i64| {
        results
            .tallies
            .iter()
            .find(|t| t.option_id == id)
            .map_or(0, |t| t.votes)
    };
    let counted: i64 = options.iter().map(|(id, _)| votes_of(*id)).sum();
    let total = results.voters.max(counted);
    let rows = options
        .into_iter()
        .map(|(id, label)| {
            let votes = votes_of(id);
            OptionResult {
                id,
                label,
                votes,
                percent: percent(votes, total),
            }
        })
        .collect();
    (rows, total)
}

/// `votes` of `total` in whole percent, rounded half up like the script's
/// `Math.round`, so the first render and the live updates agree.
pub fn percent(votes: i64, total: i64) -> i64 {
    if total <= 0 {
        0
    } else {
        (votes.max(0) * 200 + total) / (2 * total)
    }
}

/// "1 voter", "2 voters".
pub fn voters_text(voters: i64) -> String {
    if voters == 1 {
        "1 voter".to_string()
    } else {
        format!("{voters} voters")
    }
}

/// The shop's currency symbol. Prices are stored in cents of one currency.
const CURRENCY: &str = "$";

/// `49900` -> `$499.00`, `123456789` -> `$1,234,567.89`.
pub fn format_price(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    let cents = cents.unsigned_abs();
    format!(
        "{sign}{CURRENCY}{}.{:02}",
        group_unsigned(cents / 100),
        cents % 100
    )
}

/// `1234567` -> `1,234,567`, as the script's `groupDigits` writes it.
pub fn group_digits(n: i64) -> String {
    let sign = if n < 0 { "-" } else { "" };
    format!("{sign}{}", group_unsigned(n.unsigned_abs()))
}

fn group_unsigned(n: u64) -> String {
    let digits = n.to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_group_thousands() {
        assert_eq!(format_price(0), "$0.00");
        assert_eq!(format_price(5), "$0.05");
        assert_eq!(format_price(49_900), "$499.00");
        assert_eq!(format_price(100_000), "$1,000.00");
        assert_eq!(format_price(123_456_789), "$1,234,567.89");
        assert_eq!(format_price(-150), "-$1.50");
    }

    #[test]
    fn counts_group_thousands() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1_000), "1,000");
        assert_eq!(group_digits(1_234_567), "1,234,567");
        assert_eq!(group_digits(-12_345), "-12,345");
    }

    #[test]
    fn next_keeps_the_page_and_encodes_it() {
        assert_eq!(next_query("/sales/3"), "?next=%2Fsales%2F3");
        assert_eq!(next_query("/polls/a b&c"), "?next=%2Fpolls%2Fa%20b%26c");
        assert_eq!(next_query("/"), "");
        assert_eq!(next_query("/signup"), "");
        assert_eq!(next_query("/signin"), "");
    }

    #[test]
    fn buyable_sales_come_first() {
        use SaleStatus::*;
        let mut statuses = [Closed, Ended, SoldOut, Upcoming, Live, Upcoming];
        statuses.sort_by_key(|s| s.shop_rank());
        assert_eq!(
            statuses.map(SaleStatus::as_str),
            [
                "live", "upcoming", "upcoming", "sold_out", "ended", "closed"
            ]
        );
    }

    #[test]
    fn percentages_round_half_up_and_survive_no_votes() {
        assert_eq!(percent(0, 0), 0);
        assert_eq!(percent(1, 3), 33);
        assert_eq!(percent(2, 3), 67);
        assert_eq!(percent(1, 8), 13); // 12.5 rounds up, as Math.round does
        assert_eq!(percent(5, 5), 100);
    }

    #[test]
    fn options_keep_their_order_and_get_their_tallies() {
        use crate::vote::store::Tally;
        let results = Results {
            poll_id: 1,
            closed: false,
            voters: 4,
            tallies: vec![
                Tally {
                    option_id: 10,
                    votes: 1,
                },
                Tally {
                    option_id: 11,
                    votes: 3,
                },
            ],
        };
        let (rows, total) = option_results(
            vec![
                (11, "Blue".into()),
                (10, "Red".into()),
                (12, "Green".into()),
            ],
            &results,
        );
        assert_eq!(total, 4);
        let got: Vec<_> = rows
            .iter()
            .map(|r| (r.label.as_str(), r.votes, r.percent))
            .collect();
        assert_eq!(got, [("Blue", 3, 75), ("Red", 1, 25), ("Green", 0, 0)]);
        assert_eq!(voters_text(1), "1 voter");
        assert_eq!(voters_text(0), "0 voters");
    }

    #[test]
    fn open_polls_come_first() {
        use PollStatus::*;
        let mut statuses = [Closed, Upcoming, Open, Closed, Open];
        statuses.sort_by_key(|s| s.rank());
        assert_eq!(
            statuses.map(PollStatus::as_str),
            ["open", "open", "upcoming", "closed", "closed"]
        );
    }

    #[test]
    fn clocks_count_whole_seconds_up() {
        assert_eq!(clock_text(-5), "00:00");
        assert_eq!(clock_text(1), "00:01");
        assert_eq!(clock_text(59_001), "01:00");
        assert_eq!(clock_text(3_600_000), "01:00:00");
        assert_eq!(clock_text(90_061_000), "1d 01:01:01");
    }

    #[test]
    fn payment_windows_read_in_whole_units() {
        assert_eq!(duration_text(1), "1 second");
        assert_eq!(duration_text(45), "45 seconds");
        assert_eq!(duration_text(60), "1 minute");
        assert_eq!(duration_text(900), "15 minutes");
        assert_eq!(duration_text(90), "1 min 30 s");
        assert_eq!(duration_text(3600), "1 hour");
        assert_eq!(duration_text(5400), "90 minutes");
        assert_eq!(duration_text(86_400), "24 hours");
    }

    #[test]
    fn an_order_past_its_deadline_shows_expired_before_the_job_runs() {
        let at = Utc::now();
        let state = |status: &str, overdue, pay_by, paid_at| {
            OrderState::of(
                OrderStatus::parse(status).unwrap(),
                overdue,
                pay_by,
                paid_at,
            )
            .as_str()
        };
        assert_eq!(state("accepted", false, None, None), "none");
        assert_eq!(
            state("awaiting_payment", false, Some(at), None),
            "awaiting_payment"
        );
        assert_eq!(state("awaiting_payment", true, Some(at), None), "expired");
        assert_eq!(state("expired", true, Some(at), None), "expired");
        assert_eq!(state("paid", false, Some(at), Some(at)), "paid");
        assert!(matches!(
            OrderState::of(OrderStatus::Paid, true, Some(at), Some(at)),
            OrderState::Paid { paid_at: Some(_) }
        ));
    }

    #[test]
    fn moments_are_utc_text_and_millis() {
        let at = DateTime::parse_from_rfc3339("2030-01-02T03:04:05Z")
            .unwrap()
            .with_timezone(&Utc);
        let m = Moment::from(at);
        assert_eq!(m.iso, "2030-01-02T03:04:05Z");
        assert_eq!(m.text, "2030-01-02 03:04 UTC");
        assert_eq!(m.ms, at.timestamp_millis());
    }
}
