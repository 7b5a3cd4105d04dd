//! The admin's sale-day console (`GET /api/admin/console`, the top of `/admin`):
//! the live and the upcoming sales, at most [`CONSOLE_SALES`] of each, each with
//! its live numbers, the revenue its settled orders paid and, for a waiting room,
//! where its line stands.
//!
//! What it costs, whatever the catalog: the two admin lists' queries (records, one
//! pipelined Redis round trip each for their numbers and lines) and one query for
//! the revenue of all the sales listed, never one a sale.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::cached::admin_page;
use super::record::SaleView;
use crate::cache::CachedReads;
use crate::domain::SaleStatus;
use crate::error::AppError;
use crate::paging::{Limit, ListScope};

/// Sales of each group the console lists (live, upcoming): a sale day has a few;
/// the admin's table below lists the rest.
pub const CONSOLE_SALES: Limit = Limit::fixed(20);

/// The sale-day console.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Console {
    /// Open sales (live or sold out), latest opening first.
    pub live: Vec<ConsoleSale>,
    /// Sales not open yet, soonest first.
    pub upcoming: Vec<ConsoleSale>,
    /// More live sales than listed (`GET /api/admin/sales?filter=live` has them).
    pub more_live: bool,
    /// More upcoming sales than listed.
    pub more_upcoming: bool,
}

/// One sale of the console: the sale as `GET /api/admin/sales` shows it, plus its
/// money and its line.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ConsoleSale {
    #[serde(flatten)]
    pub view: SaleView,
    /// The price times the units of its settled orders that are paid, or accepted on
    /// a sale without a payment step: the `revenue_paid_cents` of its orders'
    /// totals (`GET /api/admin/sales/{id}/orders`).
    pub revenue_paid_cents: i64,
    /// The price times the units of its settled orders awaiting payment.
    pub revenue_awaiting_cents: i64,
    /// A sale with a waiting room: where its line stands. Absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line_state: Option<LineState>,
}

/// Where a waiting room's line stands, from its window and the sale's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LineState {
    /// Before `queue_opens_at`: nobody may join yet.
    NotOpen,
    /// Open for joining; the admission starts at the sale's opening.
    Joining,
    /// The sale is open: shoppers are let in at its pace.
    Admitting,
    /// Sold out, ended or closed: nobody more is let in.
    Over,
}

impl LineState {
    /// The line of `view`'s waiting room at `now`; `None` without one.
    pub fn of(view: &SaleView, now: DateTime<Utc>) -> Option<LineState> {
        let sale = &view.sale;
        if !sale.waiting_room {
            return None;
        }
        Some(match view.status {
            SaleStatus::Upcoming if sale.queue_opens_at.is_some_and(|at| now < at) => {
                LineState::NotOpen
            }
            SaleStatus::Upcoming => LineState::Joining,
            SaleStatus::Live => LineState::Admitting,
            SaleStatus::SoldOut | SaleStatus::Ended | SaleStatus::Closed => LineState::Over,
        })
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            LineState::NotOpen => "not_open",
            LineState::Joining => "joining",
            LineState::Admitting => "admitting",
            LineState::Over => "over",
        }
    }
}

/// The console as of now.
pub async fn console<S: CachedReads + ?Sized>(state: &S) -> Result<Console, AppError> {
    let (live, upcoming) = tokio::try_join!(
        admin_page(state, None, CONSOLE_SALES, ListScope::Console),
        admin_page(state, None, CONSOLE_SALES, ListScope::Upcoming),
    )?;
    let ids: Vec<i64> = live
        .items
        .iter()
        .chain(&upcoming.items)
        .map(|v| v.sale.id.get())
        .collect();
    let units = paid_and_awaiting(state.db(), &ids).await?;
    let now = Utc::now();
    let with_money = |views: Vec<SaleView>| -> Vec<ConsoleSale> {
        views
            .into_iter()
            .map(|view| {
                let (paid, awaiting) = units.get(&view.sale.id.get()).copied().unwrap_or((0, 0));
                let price = view.sale.price_cents;
                ConsoleSale {
                    revenue_paid_cents: paid.saturating_mul(price),
                    revenue_awaiting_cents: awaiting.saturating_mul(price),
                    line_state: LineState::of(&view, now),
                    view,
                }
            })
            .collect()
    };
    Ok(Console {
        more_live: live.next.is_some(),
        more_upcoming: upcoming.next.is_some(),
        live: with_money(live.items),
        upcoming: with_money(upcoming.items),
    })
}

/// Units paid and units awaiting payment of each of `sales`' settled orders, in
/// one query: by the rule of `export::totals` (paid: `paid`, and `accepted`, which
/// is complete on a sale without a payment step; awaiting: `awaiting_payment`).
/// `tests/api/admin_console.rs` holds the two to the same answer.
async fn paid_and_awaiting(
    db: &sqlx::PgPool,
    sales: &[i64],
) -> Result<HashMap<i64, (i64, i64)>, AppError> {
    if sales.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<(i64, i64, i64)> = sqlx::query_as(
        "SELECT sale_id,
                COALESCE(sum(quantity) FILTER (WHERE status IN ('accepted', 'paid')), 0)::int8,
                COALESCE(sum(quantity) FILTER (WHERE status = 'awaiting_payment'), 0)::int8
         FROM orders WHERE sale_id = ANY($1) GROUP BY sale_id",
    )
    .bind(sales)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(sale, paid, awaiting)| (sale, (paid, awaiting)))
        .collect())
}

#[cfg(test)]
mod tests {
    use chrono::Duration;

    use super::*;
    use crate::sale::record::SaleRow;

    fn view_at(now: DateTime<Utc>, opens_in: i64, starts_in: i64, left: i64) -> SaleView {
        let starts = now + Duration::seconds(starts_in);
        let mut row = SaleRow::sample(starts, now + Duration::hours(1), false, 5);
        row.waiting_room = true;
        row.queue_opens_at = Some(now + Duration::seconds(opens_in));
        SaleView::new(row, Some(left), now)
    }

    #[test]
    fn the_line_follows_its_window_and_the_sale() {
        let now = Utc::now();
        let state = |opens_in, starts_in, left| {
            LineState::of(&view_at(now, opens_in, starts_in, left), now)
        };
        assert_eq!(state(60, 120, 5), Some(LineState::NotOpen));
        assert_eq!(state(-60, 120, 5), Some(LineState::Joining));
        assert_eq!(state(-120, -60, 5), Some(LineState::Admitting));
        assert_eq!(state(-120, -60, 0), Some(LineState::Over));
        let mut plain = view_at(now, -60, -30, 5);
        plain.sale.waiting_room = false;
        assert_eq!(LineState::of(&plain, now), None);
    }
}
