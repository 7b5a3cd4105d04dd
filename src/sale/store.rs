//! The Rust side of the sale scripts and the sale tables.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::{Id, MAX_STOCK, SaleId, UserId};
use crate::error::AppError;
use crate::keys::Keys;
use crate::lua::{lua_script, unexpected_reply};

static NEW_SALE: LazyLock<redis::Script> = lua_script!("new_sale.lua");
static UPDATE_META: LazyLock<redis::Script> = lua_script!("update_meta.lua");
static STOCK_CHANGE: LazyLock<redis::Script> = lua_script!("stock_change.lua");

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
    /// never changed. (Default: views cached before tickets existed.)
    #[serde(default)]
    pub requires_ticket: bool,
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
        "id, name, description, price_cents, stock_total, starts_at, ends_at, closed, image_url, requires_ticket"
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
                            requires_ticket)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING ",
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
        .arg(row.starts_at.timestamp_millis())
        .arg(row.ends_at.timestamp_millis())
        .arg(u8::from(row.closed))
        .arg(row.stock_total)
        .invoke_async(redis)
        .await?;
    crate::settle::ensure_group(redis, &k.orders).await?;
    Ok(())
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
        pipe.get(&k.stock).scard(&k.buyers);
    }
    let flat: Vec<Option<i64>> = pipe.query_async(redis).await?;
    Ok(flat
        .chunks(2)
        .map(|pair| (pair[0].unwrap_or(0), pair[1].unwrap_or(0)))
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
}

/// Order ids carry their sale id in the first six bytes (a UUIDv8), so an order's
/// status can be found in its sale's pending hash before it reaches Postgres.
pub fn new_order_id(sale: SaleId) -> Uuid {
    use rand::RngCore;
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    bytes[..6].copy_from_slice(&sale.get().to_be_bytes()[2..]);
    Uuid::new_v8(bytes)
}

/// The sale an order id was minted for, if it is one of ours.
pub fn sale_of_order(order: &Uuid) -> Option<SaleId> {
    if order.get_version_num() != 8 {
        return None;
    }
    let b = order.as_bytes();
    let mut raw = [0u8; 8];
    raw[2..].copy_from_slice(&b[..6]);
    Id::new(i64::from_be_bytes(raw))
}

/// Largest sale id an order id can carry (48 bits).
pub const MAX_ORDERABLE_SALE_ID: i64 = (1 << 48) - 1;

/// An admin's stock change, as the API takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StockChange {
    /// Units left become exactly this.
    Set(i64),
    /// Units left grow by this.
    Add(i64),
}

impl StockChange {
    fn kind(self) -> &'static str {
        match self {
            StockChange::Set(_) => "set",
            StockChange::Add(_) => "add",
        }
    }

    fn amount(self) -> i64 {
        match self {
            StockChange::Set(n) | StockChange::Add(n) => n,
        }
    }
}

/// What became of one recorded stock change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeResult {
    /// Units left moved by `delta` in Redis, and `stock_total` by the same delta in
    /// Postgres, once.
    Applied { delta: i64, left: i64, sold: i64 },
    /// Units ever offered would pass [`MAX_STOCK`]: nothing changed.
    Refused { left: i64, sold: i64 },
    /// Not applied yet: Redis does not hold the sale, or holds state this Redis run has
    /// not verified. The change stays recorded and is applied after the rebuild.
    Deferred,
}

/// Records a stock change in Postgres; [`apply_pending`] applies it. Never
/// read-modify-write across the two stores: Redis computes the delta, Postgres adds it.
pub async fn record_stock_change(
    db: &PgPool,
    sale: SaleId,
    change: StockChange,
    admin: UserId,
) -> Result<i64, AppError> {
    Ok(sqlx::query_scalar(
        "INSERT INTO stock_changes (sale_id, kind, amount, admin_id) VALUES ($1, $2, $3, $4)
         RETURNING id",
    )
    .bind(sale.get())
    .bind(change.kind())
    .bind(change.amount())
    .bind(admin.get())
    .fetch_one(db)
    .await?)
}

/// Applies every recorded, not yet applied stock change of the sale, oldest first,
/// holding the sale's row lock, so that concurrent changes on any number of instances
/// (and a rebuild, which takes the same lock) take turns. Returns each change's result.
pub async fn apply_pending<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
) -> Result<Vec<(i64, ChangeResult)>, AppError> {
    let mut tx = db.begin().await?;
    let exists: Option<i64> = sqlx::query_scalar("SELECT id FROM sales WHERE id = $1 FOR UPDATE")
        .bind(sale.get())
        .fetch_optional(&mut *tx)
        .await?;
    if exists.is_none() {
        return Ok(Vec::new());
    }
    let results = apply_pending_locked(&mut tx, redis, keys, sale).await?;
    tx.commit().await?;
    Ok(results)
}

/// [`apply_pending`] for a caller that already holds the sale's row lock in `tx`.
///
/// Crash safety: Redis applies a change once and remembers its delta under the
/// change id; the row turns `applied` (and `stock_total` moves) in `tx`. If `tx` never
/// commits, the row stays `pending` and the next call gets the remembered delta back
/// from Redis instead of applying it again.
pub async fn apply_pending_locked<C: ConnectionLike>(
    tx: &mut sqlx::PgConnection,
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
) -> Result<Vec<(i64, ChangeResult)>, AppError> {
    let pending: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT id, kind, amount FROM stock_changes
         WHERE sale_id = $1 AND status = 'pending' ORDER BY id",
    )
    .bind(sale.get())
    .fetch_all(&mut *tx)
    .await?;
    let k = keys.sale(sale);
    let mut results = Vec::with_capacity(pending.len());
    for (id, kind, amount) in pending {
        let (code, delta, left, sold): (i64, i64, i64, i64) = STOCK_CHANGE
            .key(&k.meta)
            .key(&k.stock)
            .key(&k.buyers)
            .key(&k.changes)
            .arg(id)
            .arg(&kind)
            .arg(amount)
            .arg(MAX_STOCK)
            .invoke_async(redis)
            .await?;
        let result = match code {
            0 => ChangeResult::Applied { delta, left, sold },
            1 => ChangeResult::Refused { left, sold },
            4 | 6 => {
                // This and every later change wait for the rebuild.
                results.push((id, ChangeResult::Deferred));
                break;
            }
            other => return Err(unexpected_reply("stock_change.lua", (other, delta))),
        };
        let (status, applied_delta) = match result {
            ChangeResult::Applied { delta, .. } => ("applied", delta),
            _ => ("refused", 0),
        };
        let done = sqlx::query(
            "UPDATE stock_changes SET status = $2, delta = $3, applied_at = now()
             WHERE id = $1 AND status = 'pending'",
        )
        .bind(id)
        .bind(status)
        .bind(applied_delta)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 1 && applied_delta != 0 {
            sqlx::query(
                "UPDATE sales SET stock_total = stock_total + $2, updated_at = now() WHERE id = $1",
            )
            .bind(sale.get())
            .bind(applied_delta)
            .execute(&mut *tx)
            .await?;
        }
        results.push((id, result));
    }
    Ok(results)
}

/// The outcome of a change as Postgres records it now, with live numbers from Redis.
pub async fn change_result<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
    change_id: i64,
) -> Result<ChangeResult, AppError> {
    let (status, delta): (String, Option<i64>) =
        sqlx::query_as("SELECT status, delta FROM stock_changes WHERE id = $1")
            .bind(change_id)
            .fetch_one(db)
            .await?;
    let numbers = live_numbers(redis, keys, &[sale.get()]).await?;
    let (left, sold) = numbers.first().copied().unwrap_or((0, 0));
    Ok(match status.as_str() {
        "applied" => ChangeResult::Applied {
            delta: delta.unwrap_or(0),
            left,
            sold,
        },
        "refused" => ChangeResult::Refused { left, sold },
        _ => ChangeResult::Deferred,
    })
}

/// Sales with stock changes recorded more than `older_than_ms` ago and still not
/// applied (their admin request died, or the sale was being rebuilt).
pub async fn sales_with_pending_changes(
    db: &PgPool,
    older_than_ms: i64,
) -> Result<Vec<SaleId>, sqlx::Error> {
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT DISTINCT sale_id FROM stock_changes
         WHERE status = 'pending' AND created_at < now() - make_interval(secs => $1::float8 / 1000)",
    )
    .bind(older_than_ms)
    .fetch_all(db)
    .await?;
    Ok(ids.into_iter().filter_map(Id::new).collect())
}

/// How Redis and Postgres agree on one sale.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Reconciliation {
    pub sale_id: i64,
    /// Users in the Redis buyers set.
    pub redis_sold: i64,
    /// Accepted orders not yet settled (the pending hash).
    pub pending: i64,
    /// Orders in Postgres.
    pub postgres_orders: i64,
    /// Buyers in Redis with no order in Postgres and none pending: should be empty.
    pub missing_in_postgres: Vec<i64>,
    /// Orders in Postgres whose buyer is not in the Redis buyers set: should be empty.
    pub missing_in_redis: Vec<i64>,
    pub stock_left: i64,
    pub stock_total: i64,
    /// `stock_total == stock_left + redis_sold` and both lists empty.
    pub consistent: bool,
}

/// Compares a sale's Redis state with its Postgres record. Reads only; a buyer whose
/// order is still pending is not reported missing.
pub async fn reconcile<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    sale: &SaleRow,
) -> Result<Reconciliation, AppError> {
    let k = keys.sale(sale_id(sale)?);
    let (buyers, pending_owners, left): (Vec<i64>, Vec<i64>, Option<i64>) = redis::pipe()
        .smembers(&k.buyers)
        .hvals(&k.pending)
        .get(&k.stock)
        .query_async(redis)
        .await?;
    let settled: Vec<i64> = sqlx::query_scalar("SELECT user_id FROM orders WHERE sale_id = $1")
        .bind(sale.id)
        .fetch_all(db)
        .await?;
    let buyers_set: std::collections::HashSet<i64> = buyers.iter().copied().collect();
    let settled_set: std::collections::HashSet<i64> = settled.iter().copied().collect();
    let pending_set: std::collections::HashSet<i64> = pending_owners.iter().copied().collect();
    let mut missing_in_postgres: Vec<i64> = buyers_set
        .iter()
        .filter(|u| !settled_set.contains(u) && !pending_set.contains(u))
        .copied()
        .collect();
    let mut missing_in_redis: Vec<i64> = settled_set.difference(&buyers_set).copied().collect();
    missing_in_postgres.sort_unstable();
    missing_in_redis.sort_unstable();
    let stock_left = left.unwrap_or(0);
    let redis_sold = buyers.len() as i64;
    Ok(Reconciliation {
        sale_id: sale.id,
        redis_sold,
        pending: pending_owners.len() as i64,
        postgres_orders: settled.len() as i64,
        consistent: missing_in_postgres.is_empty()
            && missing_in_redis.is_empty()
            && sale.stock_total == stock_left + redis_sold,
        missing_in_postgres,
        missing_in_redis,
        stock_left,
        stock_total: sale.stock_total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_ids_carry_their_sale() {
        for raw in [1, 42, 1 << 40, MAX_ORDERABLE_SALE_ID] {
            let sale = Id::new(raw).unwrap();
            let order = new_order_id(sale);
            assert_eq!(order.get_version_num(), 8);
            assert_eq!(sale_of_order(&order), Some(sale));
        }
        assert_eq!(sale_of_order(&Uuid::new_v4()), None);
    }

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
