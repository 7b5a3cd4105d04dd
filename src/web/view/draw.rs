//! A draw sale's facts as its pages show them (see `crate::sale::draw`).

use super::text::{Moment, duration_text};
use crate::sale::record::SaleRow;

/// What the sale page and "How this draw was made" show of a draw sale.
pub struct DrawFacts {
    /// When entries open.
    pub entries_open_at: Moment,
    /// When it is drawn: the sale's `starts_at`.
    pub draw_at: Moment,
    /// Seconds each winner has to buy.
    pub claim_window_s: i32,
    /// Hex SHA-256 of the seed, public from the sale's creation.
    pub commitment: String,
}

impl DrawFacts {
    /// The draw of `sale`; none for a first-come sale.
    pub fn of(sale: &SaleRow) -> Option<DrawFacts> {
        if !sale.is_draw() {
            return None;
        }
        Some(DrawFacts {
            entries_open_at: sale.entries_open_at.unwrap_or(sale.starts_at).into(),
            draw_at: sale.starts_at.into(),
            claim_window_s: sale.claim_window_s.unwrap_or(0),
            commitment: sale.draw_commitment.clone().unwrap_or_default(),
        })
    }

    /// "15 min": how long a winner has to buy.
    pub fn claim_window_text(&self) -> String {
        duration_text(i64::from(self.claim_window_s))
    }
}
