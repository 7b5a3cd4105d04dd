//! The sale-day console at the top of `/admin` (`sale::console`): the live and
//! upcoming sales with sold, left, revenue paid and their line, and the buttons of
//! the day (Open now, Close, Top up). `js/admin-console.js` keeps it current from
//! `GET /api/admin/console` and words the line as [`line_text`] does.

use crate::sale::console::{Console, ConsoleSale, LineState};
use crate::sale::queue::numbers::QueueNumbers;
use crate::web::view::{SaleCard, format_price, group_digits};

/// The console as the page shows it: the live sales, then the upcoming ones.
pub struct ConsoleView {
    pub rows: Vec<ConsoleRow>,
    /// More live or upcoming sales than listed: the table below has them.
    pub more: bool,
}

/// One sale of the console.
pub struct ConsoleRow {
    pub sale: SaleCard,
    /// "$1,497.00": revenue paid.
    pub revenue: String,
    /// The line's state (`LineState::as_str`), empty without a waiting room.
    pub line_state: &'static str,
    /// The line in words ("12 waiting, 3 let in now"); "No line" without one.
    pub line: String,
}

impl From<Console> for ConsoleView {
    fn from(console: Console) -> Self {
        ConsoleView {
            more: console.more_live || console.more_upcoming,
            rows: console
                .live
                .into_iter()
                .chain(console.upcoming)
                .map(ConsoleRow::from)
                .collect(),
        }
    }
}

impl From<ConsoleSale> for ConsoleRow {
    fn from(row: ConsoleSale) -> Self {
        let line = line_text(row.line_state, row.view.line, row.view.stock_left);
        ConsoleRow {
            revenue: format_price(row.revenue_paid_cents),
            line_state: row.line_state.map_or("", LineState::as_str),
            line,
            sale: SaleCard::from(row.view),
        }
    }
}

/// A line in words, set against the units left ("979 waiting for 29 units left"),
/// as `js/admin-console.js` (`lineText`) words it.
pub fn line_text(state: Option<LineState>, numbers: Option<QueueNumbers>, left: i64) -> String {
    let n = numbers.unwrap_or_default();
    let units = format!(
        "{} {} left",
        group_digits(left),
        if left == 1 { "unit" } else { "units" }
    );
    let paused = if n.paused { ", paused" } else { "" };
    let closed = if n.joins_closed {
        ", closed to new joins"
    } else {
        ""
    };
    match state {
        None => "No line".into(),
        Some(LineState::NotOpen) => "Not open yet".into(),
        Some(LineState::Joining) => format!(
            "{} in line for {units}, let in from the opening{paused}{closed}",
            group_digits(n.line)
        ),
        Some(LineState::Admitting) => format!(
            "{} waiting for {units}, {} let in now{paused}{closed}",
            group_digits(n.waiting),
            group_digits(n.open)
        ),
        Some(LineState::Over) => format!("Over, {} never let in", group_digits(n.waiting)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_in_words() {
        let n = QueueNumbers {
            line: 1200,
            served: 200,
            waiting: 1000,
            admitted: 200,
            passed: 5,
            open: 30,
            paused: false,
            joins_closed: false,
        };
        assert_eq!(line_text(None, None, 5), "No line");
        assert_eq!(line_text(Some(LineState::NotOpen), None, 5), "Not open yet");
        assert_eq!(
            line_text(Some(LineState::Joining), Some(n), 50),
            "1,200 in line for 50 units left, let in from the opening"
        );
        assert_eq!(
            line_text(Some(LineState::Admitting), Some(n), 29),
            "1,000 waiting for 29 units left, 30 let in now"
        );
        let paused = QueueNumbers {
            paused: true,
            joins_closed: true,
            ..n
        };
        assert_eq!(
            line_text(Some(LineState::Admitting), Some(paused), 1),
            "1,000 waiting for 1 unit left, 30 let in now, paused, closed to new joins"
        );
        assert_eq!(
            line_text(Some(LineState::Over), Some(n), 0),
            "Over, 1,000 never let in"
        );
    }
}
