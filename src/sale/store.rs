//! The Rust side of the sale scripts and the sale tables.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::{Id, SaleId, UserId};
use crate::error::AppError;
use crate::keys::{Keys, SaleKeys};

static PURCHASE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/purchase.lua")));
static STOCK: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/stock.lua")));
static REPAIR_STOCK: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/repair_stock.lua")));
static LOAD_SALE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/load_sale.lua")));

/// Name of the consumer group the settlement worker reads order streams with.
pub const SETTLE_GROUP: &str = "settle";

/// A sale as stored in Postgres (and, as JSON, in the view cache).
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow)]
pub struct SaleRow {
    pub id: i64,
    pub name: String,
    pub description: String,
    pub price_cents: i64,
    pub stock_total: i64,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub closed: bool,
}

/// A sale as the API shows it: the record plus live numbers from Redis.
#[derive(Clone, Debug, Serialize)]
pub struct SaleView {
    #[serde(flatten)]
    pub sale: SaleRow,
    pub stock_left: i64,
    pub sold: i64,
    /// `upcoming`, `live`, `sold_out`, `ended` or `closed`.
    pub status: &'static str,
}

impl SaleView {
    pub fn new(sale: SaleRow, stock_left: i64, sold: i64, now: DateTime<Utc>) -> Self {
        let status = if sale.closed {
            "closed"
        } else if now >= sale.ends_at {
            "ended"
        } else if now < sale.starts_at {
            "upcoming"
        } else if stock_left <= 0 {
            "sold_out"
        } else {
            "live"
        };
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
        "id, name, description, price_cents, stock_total, starts_at, ends_at, closed"
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
}

/// Inserts the sale and loads it into Redis inside one transaction: if Redis refuses,
/// the row is rolled back, so no sale exists that buyers cannot reach.
pub async fn create_sale<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    new: NewSale,
) -> Result<SaleRow, AppError> {
    let mut tx = db.begin().await?;
    let row = sqlx::query_as::<_, SaleRow>(concat!(
        "INSERT INTO sales (name, description, price_cents, stock_total, starts_at, ends_at)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING ",
        sale_columns!()
    ))
    .bind(&new.name)
    .bind(&new.description)
    .bind(new.price_cents)
    .bind(new.stock)
    .bind(new.starts_at)
    .bind(new.ends_at)
    .fetch_one(&mut *tx)
    .await?;
    load_into_redis(redis, keys, &row, new.stock).await?;
    tx.commit().await?;
    Ok(row)
}

/// Writes a sale's window into Redis and, when the stock key is absent, its stock.
/// Also creates the settlement consumer group on its order stream.
pub async fn load_into_redis<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    sale: &SaleRow,
    stock_if_absent: i64,
) -> Result<(), AppError> {
    let id = sale_id(sale)?;
    let k = keys.sale(id);
    let _: i64 = LOAD_SALE
        .key(&k.meta)
        .key(&k.stock)
        .arg(sale.starts_at.timestamp_millis())
        .arg(sale.ends_at.timestamp_millis())
        .arg(u8::from(sale.closed))
        .arg(stock_if_absent)
        .invoke_async(redis)
        .await?;
    ensure_group(redis, &k.orders).await?;
    Ok(())
}

/// `XGROUP CREATE ... MKSTREAM`, tolerating an existing group.
pub async fn ensure_group<C: ConnectionLike>(
    redis: &mut C,
    stream: &str,
) -> Result<(), redis::RedisError> {
    let created: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(SETTLE_GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(redis)
        .await;
    match created {
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        other => other,
    }
}

/// Makes sure every sale in Postgres has its state in Redis (after a Redis restart
/// without persistence, say). Units left are rebuilt as `stock_total - orders`, and
/// the buyers set from the orders table, only for sales whose keys are missing.
pub async fn ensure_all_loaded<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
) -> Result<usize, AppError> {
    let sales = sqlx::query_as::<_, SaleRow>(concat!("SELECT ", sale_columns!(), " FROM sales"))
        .fetch_all(db)
        .await?;
    let mut rebuilt = 0;
    for sale in &sales {
        let k = keys.sale(sale_id(sale)?);
        let present: bool = redis::cmd("EXISTS").arg(&k.meta).query_async(redis).await?;
        if present {
            ensure_group(redis, &k.orders).await?;
            continue;
        }
        let buyers: Vec<i64> = sqlx::query_scalar("SELECT user_id FROM orders WHERE sale_id = $1")
            .bind(sale.id)
            .fetch_all(db)
            .await?;
        if !buyers.is_empty() {
            let _: () = redis::cmd("SADD")
                .arg(&k.buyers)
                .arg(&buyers)
                .query_async(redis)
                .await?;
        }
        let left = (sale.stock_total - buyers.len() as i64).max(0);
        load_into_redis(redis, keys, sale, left).await?;
        rebuilt += 1;
    }
    Ok(rebuilt)
}

fn sale_id(sale: &SaleRow) -> Result<SaleId, AppError> {
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
    Accepted { order_id: Uuid, stock_left: i64 },
    AlreadyBought,
    NotStarted { starts_in_ms: i64 },
    Ended,
    UnknownSale,
    SoldOut,
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

#[tracing::instrument(level = "debug", skip_all, fields(sale = %sale, user = %user))]
pub async fn purchase<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
    user: UserId,
) -> Result<PurchaseOutcome, redis::RedisError> {
    if sale.get() > MAX_ORDERABLE_SALE_ID {
        return Ok(PurchaseOutcome::UnknownSale);
    }
    let k = keys.sale(sale);
    let order_id = new_order_id(sale);
    let (code, value): (i64, i64) = PURCHASE
        .key(&k.meta)
        .key(&k.stock)
        .key(&k.buyers)
        .key(&k.orders)
        .key(&k.pending)
        .arg(user.get())
        .arg(order_id.to_string())
        .arg(sale.get())
        .invoke_async(redis)
        .await?;
    Ok(match code {
        0 => PurchaseOutcome::Accepted {
            order_id,
            stock_left: value,
        },
        1 => PurchaseOutcome::AlreadyBought,
        2 => PurchaseOutcome::NotStarted {
            starts_in_ms: value,
        },
        3 => PurchaseOutcome::Ended,
        4 => PurchaseOutcome::UnknownSale,
        _ => PurchaseOutcome::SoldOut,
    })
}

async fn run_stock<C: ConnectionLike>(
    redis: &mut C,
    k: &SaleKeys,
    mode: &str,
    amount: i64,
) -> redis::RedisResult<(i64, i64)> {
    STOCK
        .key(&k.stock)
        .key(&k.buyers)
        .key(&k.meta)
        .arg(mode)
        .arg(amount)
        .invoke_async(redis)
        .await
}

pub enum StockChange {
    Set(i64),
    Add(i64),
}

/// Applies a stock change in Redis, then records the new total in Postgres.
/// Returns (units left, units sold).
pub async fn change_stock<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    sale: &SaleRow,
    change: StockChange,
) -> Result<(i64, i64), AppError> {
    let k = keys.sale(sale_id(sale)?);
    let (mode, amount) = match change {
        StockChange::Set(n) => ("set", n),
        StockChange::Add(n) => ("add", n),
    };
    let (mut left, mut sold) = run_stock(redis, &k, mode, amount).await?;
    if left < 0 {
        // Not in Redis (flushed?): load it from the record, then apply the change.
        let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE sale_id = $1")
            .bind(sale.id)
            .fetch_one(db)
            .await?;
        load_into_redis(redis, keys, sale, (sale.stock_total - orders).max(0)).await?;
        (left, sold) = run_stock(redis, &k, mode, amount).await?;
    }
    sqlx::query("UPDATE sales SET stock_total = $2, updated_at = now() WHERE id = $1")
        .bind(sale.id)
        .bind(left + sold)
        .execute(db)
        .await?;
    Ok((left, sold))
}

/// How Redis and Postgres agree on one sale.
#[derive(Debug, Clone, Serialize)]
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

/// Makes Redis agree with Postgres again: every buyer with a settled order joins the
/// buyers set (so no one buys twice), then units left become `stock_total - buyers`.
/// Buyers whose orders are still pending stay. Meant for a quiet sale; it is safe
/// during one (each step is atomic), but the report may be stale by the time it ends.
pub async fn repair<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    sale: &SaleRow,
) -> Result<Reconciliation, AppError> {
    let k = keys.sale(sale_id(sale)?);
    let settled: Vec<i64> = sqlx::query_scalar("SELECT user_id FROM orders WHERE sale_id = $1")
        .bind(sale.id)
        .fetch_all(db)
        .await?;
    // In chunks: a script never loops over unbounded data.
    for chunk in settled.chunks(1000) {
        let _: i64 = redis::cmd("SADD")
            .arg(&k.buyers)
            .arg(chunk)
            .query_async(redis)
            .await?;
    }
    let _: i64 = REPAIR_STOCK
        .key(&k.stock)
        .key(&k.buyers)
        .arg(sale.stock_total)
        .invoke_async(redis)
        .await?;
    reconcile(db, redis, keys, sale).await
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
