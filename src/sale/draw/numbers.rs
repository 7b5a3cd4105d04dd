//! A draw's numbers now, for the sale's admin page (`GET /api/admin/sales/{id}/draw`):
//! entries, whether it was drawn, and its wins by how they stand.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::domain::SaleId;

/// A draw's numbers now.
#[derive(Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct DrawNumbers {
    /// Entries so far (before the draw: still growing).
    pub entries: i64,
    /// When it was drawn; null before.
    pub drawn_at: Option<DateTime<Utc>>,
    /// Entries that won at the draw itself.
    pub winners_at_draw: i64,
    /// Every win so far: the draw's, then those passed wins went to.
    pub wins: i64,
    /// Wins not settled yet: their time to buy runs (or ran out within the last
    /// second and is about to be passed on).
    pub running: i64,
    /// Wins used to buy (a win buys once, whatever happened to its order since).
    pub bought: i64,
    /// Of `bought`, those whose order has since been cancelled, refunded or
    /// expired: its units went back on sale (and to the next entrants), so
    /// `bought - returned` is the wins that still hold their units.
    pub returned: i64,
    /// Wins not used: in time (passed on), or before the sale closed or ended.
    pub passed: i64,
    /// When the draw finished: every entry had its turn (or the sale closed or
    /// ended), so no win is given any more; null while wins may still be given.
    /// Units left after it (a draw with fewer entries than units, an order
    /// returned late, a top-up) are units no entrant can buy.
    pub finished_at: Option<DateTime<Utc>>,
}

/// The numbers of `sale`'s draw; none when it has no draw.
pub async fn numbers(db: &PgPool, sale: SaleId) -> sqlx::Result<Option<DrawNumbers>> {
    sqlx::query_as(
        "SELECT count(e.id) AS entries, d.drawn_at,
                count(e.id) FILTER (WHERE e.won_at = d.drawn_at) AS winners_at_draw,
                count(e.won_at) AS wins,
                count(e.won_at) FILTER (WHERE e.outcome IS NULL) AS running,
                count(e.id) FILTER (WHERE e.outcome = 'bought') AS bought,
                count(e.id) FILTER (WHERE e.outcome = 'bought'
                    AND EXISTS (SELECT 1 FROM orders o WHERE o.sale_id = e.sale_id
                                  AND o.user_id = e.user_id
                                  AND o.status IN ('expired', 'cancelled', 'refunded'))
                    AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.sale_id = e.sale_id
                                  AND o.user_id = e.user_id
                                  AND o.status NOT IN ('expired', 'cancelled', 'refunded')))
                    AS returned,
                count(e.id) FILTER (WHERE e.outcome = 'passed') AS passed,
                d.finished_at
         FROM sale_draws d LEFT JOIN draw_entries e ON e.sale_id = d.sale_id
         WHERE d.sale_id = $1 GROUP BY d.drawn_at, d.finished_at",
    )
    .bind(sale.get())
    .fetch_optional(db)
    .await
}
