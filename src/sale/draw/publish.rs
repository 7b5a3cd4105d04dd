//! What a drawn sale publishes, so anyone can check it (`stampede verify-draw`):
//! the seed, its commitment, the number of entries, the wins in the seeded order
//! (`GET /api/sales/{id}/draw`), and every entry with its time
//! (`GET /api/sales/{id}/draw/entries.csv`, streamed).

use actix_web::web::Bytes;
use chrono::{DateTime, Utc};
use futures_util::{Stream, TryStreamExt};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::cache::CachedReads;
use crate::csv::{self, CsvOut};
use crate::domain::SaleId;
use crate::error::AppError;

/// A drawn sale's draw, as published (and cached: `Keys::draw_view`).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Published {
    #[schema(value_type = i64)]
    pub sale_id: SaleId,
    /// The 32-byte seed, 64 lower-case hex digits.
    pub seed: String,
    /// Hex SHA-256 of the seed: the sale's `draw_commitment` since its creation.
    pub commitment: String,
    /// How the entries were keyed (`docs/api.md`, "Draw sales"): 2, with the seed
    /// and `entries_digest`; 1, with the seed alone (draws made before
    /// migration 0031).
    pub recipe: i16,
    /// Recipe 2: hex SHA-256 of every entry id, smallest first, each followed by
    /// `\n`: what `entries.csv` must give. Absent for recipe 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries_digest: Option<String>,
    pub drawn_at: DateTime<Utc>,
    /// Entries in the draw (every row of `entries.csv`).
    pub entries: i64,
    /// Entries that won at the draw itself (the first of `winners`).
    pub winners_at_draw: i64,
    /// The units the draw divided among them (the sale's stock at the draw; a
    /// later top-up, cancel or refund moves the sale's, not this). Absent for a
    /// draw made before it was kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stock_at_draw: Option<i64>,
    /// When every entry had had its turn, or the sale closed or ended first (no
    /// win runs or may pass on any more): units still left then are not for sale
    /// to anyone. Absent until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// Every entry offered a win so far, in the seeded order: those of the draw,
    /// then those a passed win went to.
    pub winners: Vec<Winner>,
}

/// One win, in the seeded order.
#[derive(Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Winner {
    /// 1 is the first in the seeded order.
    pub rank: i32,
    pub entry_id: i64,
    pub won_at: DateTime<Utc>,
    pub claim_until: DateTime<Utc>,
    /// `bought` or `passed` once settled; absent while the claim runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

/// What a sale's draw publishes now.
pub enum Publication {
    Drawn(Published),
    /// Not drawn yet: in this many ms by the draw's time (0 when due).
    Pending {
        in_ms: i64,
    },
    /// Not a draw sale.
    NoDraw,
}

#[derive(sqlx::FromRow)]
struct DrawRow {
    seed: Vec<u8>,
    recipe: i16,
    entries_digest: Option<Vec<u8>>,
    drawn_at: Option<DateTime<Utc>>,
    entries: Option<i32>,
    stock_at_draw: Option<i64>,
    finished_at: Option<DateTime<Utc>>,
    in_ms: f64,
}

/// The publication of `sale`'s draw.
pub async fn published(db: &PgPool, sale: SaleId) -> Result<Publication, AppError> {
    let draw: Option<DrawRow> = sqlx::query_as(
        "SELECT d.seed, d.recipe, d.entries_digest, d.drawn_at, d.entries, d.stock_at_draw,
                d.finished_at, GREATEST(EXTRACT(EPOCH FROM s.starts_at - clock_timestamp()), 0)::float8 * 1000
                    AS in_ms
         FROM sale_draws d JOIN sales s ON s.id = d.sale_id WHERE d.sale_id = $1",
    )
    .bind(sale.get())
    .fetch_optional(db)
    .await?;
    let Some(DrawRow {
        seed,
        recipe,
        entries_digest,
        drawn_at,
        entries,
        stock_at_draw,
        finished_at,
        in_ms,
    }) = draw
    else {
        return Ok(Publication::NoDraw);
    };
    let Some(drawn_at) = drawn_at else {
        return Ok(Publication::Pending {
            in_ms: in_ms.ceil() as i64,
        });
    };
    let winners: Vec<Winner> = sqlx::query_as(
        "SELECT rank, id AS entry_id, won_at, claim_until, outcome FROM draw_entries
         WHERE sale_id = $1 AND won_at IS NOT NULL ORDER BY rank",
    )
    .bind(sale.get())
    .fetch_all(db)
    .await?;
    let winners_at_draw = winners.iter().filter(|w| w.won_at == drawn_at).count() as i64;
    Ok(Publication::Drawn(Published {
        sale_id: sale,
        seed: super::order::hex(&seed),
        commitment: super::order::commitment(&seed),
        recipe,
        entries_digest: entries_digest.map(|d| super::order::hex(&d)),
        drawn_at,
        entries: i64::from(entries.unwrap_or(0)),
        winners_at_draw,
        stock_at_draw,
        finished_at,
        winners,
    }))
}

/// How long a drawn sale's publication is cached: a win bought or passed shows in
/// it this late at most (a pass step drops the copy when it changes one).
const PUBLISHED_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// The publication of a drawn sale, cached a second across servers
/// (`Keys::draw_view`: one Postgres read per miss, the waiting readers of a
/// process share it): the seed and the first wins never change once drawn, and a
/// storm of readers at the draw would otherwise each read every win. `refusal`
/// answers a sale not drawn yet or without a draw (not cached).
pub async fn cached<S: CachedReads + ?Sized>(
    state: &S,
    sale: SaleId,
    refusal: impl FnOnce(Publication) -> AppError,
) -> Result<Published, AppError> {
    let db = state.db();
    state
        .cache()
        .get_or_rebuild(
            &state.keys().draw_view(sale),
            PUBLISHED_TTL,
            || async move {
                match published(db, sale).await? {
                    Publication::Drawn(published) => Ok(published),
                    not_drawn => Err(refusal(not_drawn)),
                }
            },
        )
        .await
}

/// When `sale`'s draw finished (every entry had its turn, or the sale closed or
/// ended first), `None` until then or without a draw; cached a second across
/// servers (`Keys::draw_finished`: the draw, and a pass step that finishes it,
/// drop it), so the sale's views, its event stream and the lists read a few
/// bytes, not the publication with every win.
pub async fn finished_at<S: CachedReads + ?Sized>(
    state: &S,
    sale: SaleId,
) -> Result<Option<DateTime<Utc>>, AppError> {
    let db = state.db();
    state
        .cache()
        .get_or_rebuild(
            &state.keys().draw_finished(sale),
            PUBLISHED_TTL,
            || async move {
                let at: Option<Option<DateTime<Utc>>> =
                    sqlx::query_scalar("SELECT finished_at FROM sale_draws WHERE sale_id = $1")
                        .bind(sale.get())
                        .fetch_optional(db)
                        .await?;
                Ok(at.flatten())
            },
        )
        .await
}

/// The first line of `entries.csv`.
pub const CSV_HEADER: &str = "entry_id,entered_at\n";

/// Every entry of `sale`'s draw, by id, as CSV streamed from one query.
pub fn entries_csv(
    db: PgPool,
    sale: SaleId,
    turn: csv::Turn,
) -> impl Stream<Item = Result<Bytes, AppError>> + 'static {
    let span = tracing::warn_span!("draw_entries_csv", sale = %sale);
    csv::stream(span, CSV_HEADER, Some(turn), move |out| {
        write_csv(db, sale, out)
    })
}

async fn write_csv(db: PgPool, sale: SaleId, mut out: CsvOut) -> Result<(), AppError> {
    let mut tx = csv::download_transaction(&db).await?;
    {
        let mut rows = sqlx::query_as::<_, (i64, DateTime<Utc>)>(
            "SELECT id, entered_at FROM draw_entries WHERE sale_id = $1 ORDER BY id",
        )
        .bind(sale.get())
        .fetch(&mut *tx);
        let mut digits = itoa::Buffer::new();
        while let Some((id, at)) = rows.try_next().await? {
            let buf = out.buf();
            buf.push_str(digits.format(id));
            buf.push(',');
            buf.push_str(&csv::time(Some(at)));
            buf.push('\n');
            if !out.row_done().await {
                return Ok(());
            }
        }
    }
    tx.commit().await?;
    out.finish().await;
    Ok(())
}
