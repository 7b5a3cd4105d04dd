//! Draw sales (issue 52): shoppers enter from `entries_open_at` until the draw
//! (the sale's `starts_at`, shown as `draw_at`); at the draw the entries are
//! ordered by a keyed hash under a seed committed at creation ([`order`]), and the
//! first of them win: each may buy, with the ticket its standing gives, until its
//! claim window ends, when the win passes to the next entries in the same order.
//!
//! - [`order`]: the arithmetic, byte for byte (no I/O; the CLI's check uses it);
//! - [`enter`]: an entry, and a shopper's standing (`entered`, `won`, ...);
//! - [`run`]: the draw itself, exactly once, and the loop every server runs;
//! - [`pass`]: wins given in Redis, passed on, and put back after a Redis loss;
//! - [`publish`]: what is published after the draw (seed, winners, entries);
//! - [`verify`]: a published draw checked (no I/O; `verify-draw` and `stampede load`).
//!
//! Postgres is the record (`sale_draws`, `draw_entries`): the draw is one
//! transaction under the draw row's lock, so it happens once whichever servers
//! run it and however often they die in it. Redis holds the wins as a waiting
//! room's admissions (`{sale:N}:queue:open`, `queue:admitted`), which the purchase
//! script already checks and uses up (the meta hash's `wr` is -1 for a draw).

use chrono::{DateTime, Utc};

use crate::error::{AppError, ErrorCode};
use crate::sale::record::SaleMode;

pub mod enter;
pub mod numbers;
pub mod order;
pub mod pass;
pub mod publish;
pub mod run;
pub mod verify;

/// Shortest and longest claim window an admin may set, in seconds.
pub const CLAIM_WINDOW_S: std::ops::RangeInclusive<i64> = 60..=86_400;
/// The claim window when none is sent: 15 minutes.
pub const DEFAULT_CLAIM_WINDOW_S: i64 = 900;

/// The draw's Postgres advisory lock, `pg_advisory_xact_lock(class, key)`: held
/// shared by the transactions that write a sale's entries, alone by its draw
/// (`enter.rs`, `run.rs`). The class is Stampede's own ("StDw").
pub(crate) const DRAW_LOCK_CLASS: i32 = 0x5374_4477;

/// The draw lock's key of `sale` (two sales whose ids differ by 2^31 - 1 share
/// one: they then only wait for each other, never wrongly pass).
pub(crate) fn draw_lock_key(sale: crate::domain::SaleId) -> i32 {
    i32::try_from(sale.get() % i64::from(i32::MAX)).unwrap_or(0)
}

/// A draw's settings, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrawSettings {
    pub entries_open_at: DateTime<Utc>,
    pub claim_window_s: i32,
}

/// The fields of a draw as a creation or an edit sends them.
#[derive(Clone, Copy, Debug, Default)]
pub struct DrawFields {
    pub starts_at: Option<DateTime<Utc>>,
    pub draw_at: Option<DateTime<Utc>>,
    pub entries_open_at: Option<DateTime<Utc>>,
    pub claim_window_s: Option<i64>,
}

impl DrawFields {
    fn any_draw_field(&self) -> bool {
        self.draw_at.is_some() || self.entries_open_at.is_some() || self.claim_window_s.is_some()
    }

    /// The start a sale of `mode` gets (a draw's is its draw) and its draw's
    /// settings: 422 `invalid_draw` for draw fields on a first-come sale, a draw
    /// with a waiting room, a `starts_at` other than `draw_at`, or settings out
    /// of bounds ([`DrawSettings::check`]).
    pub fn settle(
        self,
        mode: SaleMode,
        waiting_room: bool,
    ) -> Result<(Option<DateTime<Utc>>, Option<DrawSettings>), AppError> {
        match mode {
            SaleMode::FirstCome if self.any_draw_field() => Err(invalid(
                "entries_open_at, draw_at and claim_window_s go with mode: \"draw\"",
            )),
            SaleMode::FirstCome => Ok((self.starts_at, None)),
            SaleMode::Draw => {
                if waiting_room {
                    return Err(invalid("a draw sale cannot also have a waiting room"));
                }
                let draw_at = match (self.starts_at, self.draw_at) {
                    (Some(s), Some(d)) if s != d => {
                        return Err(invalid(
                            "for a draw sale starts_at is the draw: send draw_at (or the same \
                             time in both)",
                        ));
                    }
                    (s, d) => d
                        .or(s)
                        .ok_or_else(|| invalid("a draw sale needs draw_at"))?,
                };
                let settings = DrawSettings::check(
                    self.entries_open_at,
                    draw_at,
                    Some(self.claim_window_s.unwrap_or(DEFAULT_CLAIM_WINDOW_S)),
                )?;
                Ok((Some(draw_at), Some(settings)))
            }
        }
    }
}

impl DrawSettings {
    /// Entries open before the draw; the claim window is 60 s to a day.
    pub fn check(
        entries_open_at: Option<DateTime<Utc>>,
        draw_at: DateTime<Utc>,
        claim_window_s: Option<i64>,
    ) -> Result<DrawSettings, AppError> {
        let Some(entries_open_at) = entries_open_at else {
            return Err(invalid("a draw sale needs entries_open_at"));
        };
        if entries_open_at >= draw_at {
            return Err(invalid("draw_at must be after entries_open_at"));
        }
        // Bounded as a sale's window is (a time out of Postgres's range, such as
        // a signed year far back, was a failed insert: a 500).
        let max_days = crate::domain::MAX_SALE_DAYS;
        if draw_at - entries_open_at > chrono::Duration::days(max_days) {
            return Err(AppError::new(
                ErrorCode::InvalidDraw,
                format!("entries_open_at may be at most {max_days} days before draw_at"),
            ));
        }
        let claim = claim_window_s.unwrap_or(DEFAULT_CLAIM_WINDOW_S);
        if !CLAIM_WINDOW_S.contains(&claim) {
            return Err(invalid("claim_window_s must be 60 to 86400"));
        }
        Ok(DrawSettings {
            entries_open_at,
            claim_window_s: claim as i32,
        })
    }
}

fn invalid(message: &'static str) -> AppError {
    AppError::new(ErrorCode::InvalidDraw, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_900_000_000 + s, 0).unwrap()
    }

    fn code(r: Result<(Option<DateTime<Utc>>, Option<DrawSettings>), AppError>) -> &'static str {
        match r {
            Ok(_) => "ok",
            Err(e) => e.code(),
        }
    }

    #[test]
    fn a_draw_needs_its_times_in_order_and_a_claim_window_in_bounds() {
        let ok = DrawFields {
            draw_at: Some(at(100)),
            entries_open_at: Some(at(0)),
            ..Default::default()
        };
        let (start, settings) = ok.settle(SaleMode::Draw, false).unwrap();
        assert_eq!(start, Some(at(100)));
        assert_eq!(settings.unwrap().claim_window_s, 900);
        let same = DrawFields {
            starts_at: Some(at(100)),
            ..ok
        };
        assert_eq!(code(same.settle(SaleMode::Draw, false)), "ok");
        for bad in [
            DrawFields {
                starts_at: Some(at(99)),
                ..ok
            },
            DrawFields {
                entries_open_at: None,
                ..ok
            },
            DrawFields {
                entries_open_at: Some(at(100)),
                ..ok
            },
            DrawFields {
                draw_at: None,
                ..ok
            },
            DrawFields {
                claim_window_s: Some(59),
                ..ok
            },
            DrawFields {
                claim_window_s: Some(86_401),
                ..ok
            },
        ] {
            assert_eq!(
                code(bad.settle(SaleMode::Draw, false)),
                "invalid_draw",
                "{bad:?}"
            );
        }
        assert_eq!(code(ok.settle(SaleMode::Draw, true)), "invalid_draw");
        assert_eq!(code(ok.settle(SaleMode::FirstCome, false)), "invalid_draw");
        let plain = DrawFields {
            starts_at: Some(at(5)),
            ..Default::default()
        };
        assert_eq!(
            plain.settle(SaleMode::FirstCome, false).unwrap(),
            (Some(at(5)), None)
        );
    }
}
