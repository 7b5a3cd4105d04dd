//! Sales and their orders as the pages show them.

use chrono::{DateTime, Utc};

use super::draw::DrawFacts;
use super::text::{Moment, duration_text, format_price, group_digits};
use crate::domain::SaleStatus;
use crate::sale::orders::OrderStatus;
use crate::sale::queue::numbers::QueueNumbers;
use crate::sale::record::SaleView;

/// A sale as pages show it.
pub struct SaleCard {
    pub id: i64,
    pub name: String,
    pub description: String,
    pub price: String,
    /// The sale's status (`sold_out`, ...; the card's CSS class is
    /// [`SaleCard::badge`]'s).
    pub status: SaleStatus,
    /// A live draw sale whose draw finished (`SaleView::draw_finished_at`): every
    /// entry had its turn, so its units left are not for sale to anyone.
    pub draw_over: bool,
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
    /// Archived: off the public lists, still selling by link while it runs (the
    /// sale-day console marks it "Archived").
    pub archived: bool,
    /// Shoppers buy through a waiting room (see `crate::sale::queue`): the sale
    /// page shows the line instead of a plain Buy.
    pub waiting_room: bool,
    /// With a waiting room: when its line opens.
    pub queue_opens_at: Option<Moment>,
    /// With a waiting room: shoppers admitted a second from the opening.
    pub admit_per_second: i32,
    /// With a waiting room: the line in numbers when the page was made.
    pub line: Option<QueueNumbers>,
    /// Leading zero bits of the proof the join or the ticket carries (0: none).
    pub proof_of_work: i16,
    /// Least age of an account, in seconds before the opening (0: any).
    pub min_account_age_s: i32,
    /// A draw sale: its entries, draw and commitment; none for first come.
    pub draw: Option<DrawFacts>,
}

impl SaleCard {
    /// The badge's CSS class, `badge-` and this: the status, or `draw_over`.
    pub fn badge(&self) -> &'static str {
        if self.draw_over {
            "draw_over"
        } else {
            self.status.as_str()
        }
    }

    /// The badge's words: the status's, or "Draw over".
    pub fn status_label(&self) -> &'static str {
        if self.draw_over {
            "Draw over"
        } else {
            self.status.label()
        }
    }

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

    /// "979 waiting for 29 units left": the line set against the stock.
    pub fn line_summary(&self) -> Option<String> {
        let n = self.line?;
        Some(line_summary_text(n.waiting, self.stock_left))
    }

    /// What the admin's controls have made of the line ("" without a line).
    pub fn line_state_text(&self) -> &'static str {
        match self.line {
            None => "",
            Some(n) => line_state_words(n.paused, n.joins_closed),
        }
    }

    /// A waiting room whose admissions an admin paused.
    pub fn line_paused(&self) -> bool {
        self.line.is_some_and(|n| n.paused)
    }

    pub fn can_close(&self) -> bool {
        matches!(
            self.status,
            SaleStatus::Upcoming | SaleStatus::Live | SaleStatus::SoldOut
        )
    }
}

/// "979 waiting for 29 units left" (the admin page's script says the same).
pub fn line_summary_text(waiting: i64, units_left: i64) -> String {
    let units = if units_left == 1 { "unit" } else { "units" };
    format!(
        "{} waiting for {} {units} left",
        group_digits(waiting),
        group_digits(units_left)
    )
}

/// The line's controls in words (the admin page's script says the same).
pub fn line_state_words(paused: bool, joins_closed: bool) -> &'static str {
    match (paused, joins_closed) {
        (false, false) => "Letting shoppers in; open to new joins.",
        (true, false) => "Paused: nobody is let in; open to new joins.",
        (false, true) => "Letting shoppers in; closed to new joins.",
        (true, true) => "Paused: nobody is let in; closed to new joins.",
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
        let draw = DrawFacts::of(&sale);
        let draw_over = view.status == SaleStatus::Live && view.draw_finished_at.is_some();
        SaleCard {
            draw,
            draw_over,
            past_end: Utc::now() >= sale.ends_at,
            id: sale.id.get(),
            price: format_price(sale.price_cents),
            status: view.status,
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
            archived: sale.archived_at.is_some(),
            waiting_room: sale.waiting_room,
            queue_opens_at: sale
                .queue_opens_at
                .filter(|_| sale.waiting_room)
                .map(Moment::from),
            admit_per_second: sale.admit_per_second.unwrap_or(0),
            line: view.line,
            proof_of_work: sale.proof_of_work,
            min_account_age_s: sale.min_account_age_s,
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

/// The home page's order: what can be bought now, then what opens soonest, then
/// sold-out, ended (with them draws that are over) and closed sales (the store's
/// order within those groups).
pub fn sort_for_shop(sales: &mut [SaleCard]) {
    sales.sort_by_key(|sale| {
        let soonest = if sale.status == SaleStatus::Upcoming {
            sale.starts_at.ms
        } else {
            0
        };
        // A draw that is over sells nothing more: with the sales that ended.
        let rank = if sale.draw_over {
            SaleStatus::Ended.shop_rank()
        } else {
            sale.status.shop_rank()
        };
        (rank, soonest)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_is_set_against_the_units_left() {
        assert_eq!(line_summary_text(979, 29), "979 waiting for 29 units left");
        assert_eq!(line_summary_text(1_204, 1), "1,204 waiting for 1 unit left");
        assert_eq!(
            line_state_words(true, false),
            "Paused: nobody is let in; open to new joins."
        );
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
}
