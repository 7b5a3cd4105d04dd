//! Sale records: the `sales` table's SQL, the scripts that put a sale into Redis
//! (`lua/new_sale.lua`, `lua/update_meta.lua`), its live numbers, and what a purchase
//! can come to. Stock changes are in [`super::stock`], order ids in
//! [`super::orders`], the comparison of the two stores in [`super::reconcile`].

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::{Id, SaleId};
use crate::error::AppError;
use crate::keys::Keys;
use crate::lua::lua_script;

static NEW_SALE: LazyLock<crate::lua::Script> = lua_script!("new_sale.lua");
static UPDATE_META: LazyLock<crate::lua::Script> = lua_script!("update_meta.lua");

/// A sale as stored in Postgres (and, as JSON, in the view cache).
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct SaleRow {
    pub id: i64,
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
    /// Fixed at creation.
    pub max_per_user: i32,
}

/// A sale as the API shows it: the record plus live numbers from Redis.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct SaleView {
    #[serde(flatten)]
    pub sale: SaleRow,
    pub stock_left: i64,
    pub sold: i64,
    pub status: crate::domain::SaleStatus,
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
        }
    }
}

/// The columns of [`SaleRow`], as a literal so queries stay `&'static str`.
macro_rules! sale_columns {
    () => {
        "id, name, description, price_cents, stock_total, starts_at, ends_at, closed, image_url, requires_ticket, \
         payment_window_s, rebuy_after_expiry, max_per_user"
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

pub async fn list_sales(db: &PgPool, limit: i64) -> Result<Vec<SaleRow>, sqlx::Error> {
    sqlx::query_as::<_, SaleRow>(concat!(
        "SELECT ",
        sale_columns!(),
        " FROM sales ORDER BY starts_at DESC, id DESC LIMIT $1"
    ))
    .bind(limit)
    .fetch_all(db)
    .await
}

pub struct NewSale {
    pub name: String,
    pub description: String,
    pub price_cents: i64,
    pub stock: i64,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub image_url: Option<String>,
    pub requires_ticket: bool,
    pub payment_window_s: i32,
    pub rebuy_after_expiry: bool,
    pub max_per_user: i32,
}

/// Inserts the sale and puts it into Redis inside one transaction: if Redis refuses,
/// the row is rolled back, so no sale exists that buyers cannot reach.
pub async fn create_sale<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    new: NewSale,
) -> Result<SaleRow, AppError> {
    let mut tx = db.begin().await?;
    let row = sqlx::query_as::<_, SaleRow>(concat!(
        "INSERT INTO sales (name, description, price_cents, stock_total, starts_at, ends_at, image_url,
                            requires_ticket, payment_window_s, rebuy_after_expiry, max_per_user)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING ",
        sale_columns!()
    ))
    .bind(&new.name)
    .bind(&new.description)
    .bind(new.price_cents)
    .bind(new.stock)
    .bind(new.starts_at)
    .bind(new.ends_at)
    .bind(&new.image_url)
    .bind(new.requires_ticket)
    .bind(new.payment_window_s)
    .bind(new.rebuy_after_expiry)
    .bind(new.max_per_user)
    .fetch_one(&mut *tx)
    .await?;
    put_new_sale(redis, keys, &row).await?;
    tx.commit().await?;
    Ok(row)
}

/// Writes a new sale (window, `stock_total` units left, this Redis run's stamp)
/// into Redis and creates its order stream's consumer group.
pub async fn put_new_sale<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    row: &SaleRow,
) -> Result<(), AppError> {
    let k = keys.sale(sale_id(row)?);
    let _: i64 = NEW_SALE
        .key(&k.meta)
        .key(&k.stock)
        .key(&k.sold)
        .arg(row.starts_at.timestamp_millis())
        .arg(row.ends_at.timestamp_millis())
        .arg(u8::from(row.closed))
        .arg(row.stock_total)
        .arg(row.max_per_user)
        .invoke_async(redis)
        .await?;
    crate::settle::ensure_group(redis, &k.orders).await?;
    Ok(())
}

/// An admin's change of a sale's window.
pub enum WindowChange {
    /// Open now: the start moves to now if it is later, and a closed sale reopens.
    Open,
    /// Close now.
    Close,
}

/// Applies `change` to the sale's row; the row after it, or `None` for no such sale.
pub async fn set_window(
    db: &PgPool,
    id: SaleId,
    change: WindowChange,
) -> sqlx::Result<Option<SaleRow>> {
    let sql = match change {
        WindowChange::Open => concat!(
            "UPDATE sales SET starts_at = LEAST(starts_at, now()), closed = FALSE, updated_at = now()
             WHERE id = $1 RETURNING ",
            sale_columns!()
        ),
        WindowChange::Close => concat!(
            "UPDATE sales SET closed = TRUE, updated_at = now() WHERE id = $1 RETURNING ",
            sale_columns!()
        ),
    };
    sqlx::query_as::<_, SaleRow>(sql)
        .bind(id.get())
        .fetch_optional(db)
        .await
}

/// Writes a sale's window (as Postgres has it now) into its Redis meta hash, when
/// Redis holds the sale. Returns false when it does not: then the sale needs a
/// rebuild (see [`crate::recover`]), which writes the window from Postgres.
pub async fn update_window<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    sale: &SaleRow,
) -> Result<bool, AppError> {
    let k = keys.sale(sale_id(sale)?);
    let written: i64 = UPDATE_META
        .key(&k.meta)
        .arg("starts_ms")
        .arg(sale.starts_at.timestamp_millis())
        .arg("ends_ms")
        .arg(sale.ends_at.timestamp_millis())
        .arg("closed")
        .arg(u8::from(sale.closed))
        .invoke_async(redis)
        .await?;
    Ok(written == 1)
}

pub(crate) fn sale_id(sale: &SaleRow) -> Result<SaleId, AppError> {
    Id::new(sale.id)
        .ok_or_else(|| AppError::Internal(anyhow::anyhow!("sale id {} not positive", sale.id)))
}

/// Live units left and units sold of each sale, in one pipelined round trip.
pub async fn live_numbers<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    ids: &[i64],
) -> Result<Vec<(i64, i64)>, AppError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for &id in ids {
        let k =
            keys.sale(Id::new(id).ok_or_else(|| AppError::Internal(anyhow::anyhow!("bad id")))?);
        pipe.get(&k.stock).scard(&k.buyers).get(&k.sold);
    }
    let flat: Vec<Option<i64>> = pipe.query_async(redis).await?;
    // Units sold: the counter of a sale of more than one per customer, else buyers.
    Ok(flat
        .chunks(3)
        .map(|n| (n[0].unwrap_or(0), n[2].or(n[1]).unwrap_or(0)))
        .collect())
}

pub async fn views<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    rows: Vec<SaleRow>,
) -> Result<Vec<SaleView>, AppError> {
    let ids: Vec<i64> = rows.iter().map(|s| s.id).collect();
    let numbers = live_numbers(redis, keys, &ids).await?;
    let now = Utc::now();
    Ok(rows
        .into_iter()
        .zip(numbers)
        .map(|(row, (left, sold))| SaleView::new(row, left, sold, now))
        .collect())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurchaseOutcome {
    Accepted {
        order_id: Uuid,
        stock_left: i64,
    },
    AlreadyBought,
    NotStarted {
        starts_in_ms: i64,
    },
    Ended,
    UnknownSale,
    SoldOut,
    /// Redis does not hold this sale: unknown, or lost (wiped). Postgres decides which.
    NotLoaded,
    /// Redis holds the sale but this Redis run has not verified it (a restart may have
    /// lost writes), or a rebuild is in progress: rebuild before deciding.
    Recovering,
    /// A policy of the buy route refused; nothing was counted or consumed.
    RateLimited {
        retry_after_ms: u64,
    },
    /// A token-bucket policy costs more than it can ever hold.
    RateLimitUnsatisfiable,
    /// The units asked for would take the buyer past the sale's `max_per_user`;
    /// nothing taken. `held`: units the buyer holds already.
    OverPerUserCap {
        held: i64,
    },
    /// Fewer units left than asked for (but some): nothing taken.
    NotEnoughLeft {
        left: i64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_follows_time_and_stock() {
        let now = Utc::now();
        let row = |closed| SaleRow {
            id: 1,
            name: "x".into(),
            description: String::new(),
            price_cents: 1,
            stock_total: 10,
            starts_at: now - chrono::Duration::minutes(1),
            ends_at: now + chrono::Duration::minutes(1),
            closed,
            image_url: None,
            requires_ticket: false,
            payment_window_s: 0,
            rebuy_after_expiry: false,
            max_per_user: 1,
        };
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
