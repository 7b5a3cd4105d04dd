//! Rebuilding a sale's Redis state from Postgres (the [`Restore`] of sales, driven
//! by [`crate::recover`]): the buyers hash, units left, units per buyer, the window
//! and the run stamp, from the settled orders, the unsettled entries still in the
//! stream and the pending orders Redis still knows; then the stock changes still
//! pending.
//!
//! The order of the reads matters: Redis first (stream, pending hash, buyers hash),
//! then Postgres. An entry the settlement worker moves meanwhile is still seen in
//! one of the two, because it deletes a stream entry only after the commit.

use std::collections::HashSet;
use std::sync::LazyLock;

use futures_util::future::BoxFuture;
use sqlx::PgPool;

use crate::domain::SaleId;
use crate::error::AppError;
use crate::keys::Keys;
use crate::lua::lua_script;
use crate::redis_conn::Redis;
use crate::restore::{
    CHUNK, Listed, Rebuilt, Restore, Stores, each_entry, fence, interrupted, scan_all,
};
use crate::sale::record::{self as sales, SaleRow};
use crate::sale::stock::{self, ChangeResult};
use crate::settle::ensure_group;

mod write;
use write::{SaleSeen, SeenOrder, restore_buyers, restore_keys, restore_units};

static RESTORE_SALE: LazyLock<crate::lua::Script> = lua_script!("restore_sale.lua");

/// Stock changes still pending after this long are finished by the sweep.
const STALE_CHANGE_MS: i64 = 2_000;

/// The sales, as the recovery driver sees them.
pub struct Sales {
    /// `purchase_key_ttl`: the idempotency keys of orders accepted less than this
    /// long ago are restored.
    pub key_ttl: std::time::Duration,
}

impl Restore for Sales {
    type Id = SaleId;

    fn state_keys(&self, keys: &Keys, id: SaleId) -> (String, String) {
        let k = keys.sale(id);
        (k.meta, k.stock)
    }

    fn list<'a>(
        &'a self,
        db: &'a PgPool,
        days: Option<i32>,
    ) -> BoxFuture<'a, Result<Vec<Listed<SaleId>>, AppError>> {
        Box::pin(async move {
            let rows: Vec<(SaleId, i32, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
                "SELECT id, CASE WHEN closed OR ends_at <= now() THEN 2
                         WHEN starts_at > now() THEN 1 ELSE 0 END, ends_at
         FROM sales
         WHERE $1::int IS NULL OR ends_at > now() - make_interval(days => $1)",
            )
            .bind(days)
            .fetch_all(db)
            .await?;
            Ok(rows.into_iter().map(Listed::from).collect())
        })
    }

    fn rebuild<'a>(
        &'a self,
        stores: Stores<'a>,
        id: SaleId,
    ) -> BoxFuture<'a, Result<Option<Rebuilt>, AppError>> {
        Box::pin(rebuild_sale(stores, id, self.key_ttl))
    }

    /// Stock changes left pending in Postgres by an instance that died between
    /// its commit and Redis: applied now; a sale whose change must wait for a
    /// rebuild is returned.
    fn finish_pending<'a>(
        &'a self,
        stores: Stores<'a>,
    ) -> BoxFuture<'a, Result<Vec<SaleId>, AppError>> {
        Box::pin(async move {
            let mut rebuild = Vec::new();
            for sale in stock::sales_with_pending_changes(stores.db, STALE_CHANGE_MS).await? {
                let mut redis = stores.redis.clone();
                let results =
                    stock::apply_pending(stores.db, &mut redis, stores.keys, sale).await?;
                if results.iter().any(|(_, r)| *r == ChangeResult::Deferred) {
                    rebuild.push(sale);
                }
                if results
                    .iter()
                    .any(|(_, r)| matches!(r, ChangeResult::Applied { .. }))
                {
                    // Units offered moved: the cached record (and list page) goes,
                    // as after an admin's change (each process's own copy lives a
                    // second at most).
                    drop_cached(&mut redis, stores.keys, sale).await;
                }
            }
            Ok(rebuild)
        })
    }
}

async fn rebuild_sale(
    stores: Stores<'_>,
    id: SaleId,
    key_ttl: std::time::Duration,
) -> Result<Option<Rebuilt>, AppError> {
    let mut redis = stores.redis.clone();
    let k = stores.keys.sale(id);
    // Every live server writes the orders of this sale it accepted and settlement
    // has not committed (Redis may have lost them), and the reads below find them
    // in Postgres. Before the row lock: the flushes take no lock, but a rebuild
    // must not hold a connection while it waits for them. Redis decides nothing
    // for the sale meanwhile (its state is missing or untrusted: that is why it is
    // rebuilt; a repair of a trusted sale reads what was decided since from Redis).
    // Only a sale open now, or within the time an order is kept, can have one
    // kept: a restart's sweep over a catalog of ended sales asks nobody. (A minute
    // of margin at the start: Redis's clock decides the opening, not Postgres's.)
    let keep_s = crate::settle::kept::MAX_AGE.as_secs_f64();
    let may_keep: Option<bool> = sqlx::query_scalar(
        "SELECT starts_at <= now() + interval '1 minute' AND ends_at > now() - make_interval(secs => $2)
         FROM sales WHERE id = $1",
    )
    .bind(id.get())
    .bind(keep_s)
    .fetch_optional(stores.db)
    .await?;
    if may_keep == Some(true) {
        let waited = crate::roster::barrier(stores.db, crate::roster::Kind::Sale, id.get()).await?;
        if waited.missed > 0 {
            tracing::warn!(sale = %id, ?waited, "a live server did not answer the rebuild's flush request");
        }
    }
    let mut tx = stores.db.begin().await?;
    // The row lock: stock changes and window changes of this sale wait for us.
    let Some(sale) = sqlx::query_as::<_, SaleRow>(concat!(
        "SELECT ",
        sales::sale_columns!(),
        " FROM sales WHERE id = $1 FOR UPDATE"
    ))
    .bind(id.get())
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Ok(None);
    };
    let token = fence(&mut redis, &k.meta, &k.rebuild).await?;
    // An earlier version's buyers set joins the buyers hash first: its buyers are
    // known to Redis like the hash's.
    super::legacy::fold(&mut redis, &k).await?;

    let seen = read_sale(&mut redis, &mut tx, &k, &sale, key_ttl).await?;
    restore_keys(&mut redis, &k, &seen, key_ttl).await?;
    let folded = if sale.rebuy_after_expiry {
        release_expired(&mut tx, &mut redis, &k, id, &seen).await?
    } else {
        Vec::new()
    };
    if sale.max_per_user > 1 {
        restore_units(&mut redis, &k, &seen).await?;
    }
    restore_buyers(&mut redis, id, &k, &seen).await?;
    if sale.waiting_room {
        super::queue::restore::restore(&mut tx, &mut redis, &k, id, &seen.buyers).await?;
    } else if sale.is_draw() {
        super::draw::pass::restore(&mut tx, &mut redis, &k, id, &seen.buyers).await?;
    }
    let (left, sold): (i64, i64) = RESTORE_SALE
        .key(&k.meta)
        .key(&k.stock)
        .key(&k.buyers)
        .key(&k.changes)
        .key(&k.rebuild)
        .key(&k.sold)
        .key(&k.buyers_legacy)
        .arg(&token)
        .arg(sale.starts_at.timestamp_millis())
        .arg(sale.ends_at.timestamp_millis())
        .arg(u8::from(sale.closed))
        .arg(sale.units_ever_offered())
        .arg(sale.max_per_user)
        .arg(super::queue::room::rate_in_meta(&sale))
        .arg(super::queue::room::opens_ms_in_meta(&sale))
        .arg(super::legacy::MARKER)
        .arg(&folded)
        .invoke_async(&mut redis)
        .await?;
    if left == crate::restore::TOKEN_GONE {
        tracing::warn!(sale = %id, "Redis lost the rebuild token (wiped or restarted again)");
        return Err(interrupted());
    }
    if sold > sale.units_ever_offered() {
        // Only possible when writes were lost before this rebuild existed.
        tracing::error!(sale = %id, sold, offered = sale.units_ever_offered(), "more buyers than units");
    }
    ensure_group(&mut redis, &k.orders).await?;
    for chunk in seen.settled_pending.chunks(CHUNK) {
        super::pending::drop_settled(&mut redis, &k.pending, chunk).await?;
    }
    let applied = stock::apply_pending_locked(&mut tx, &mut redis, stores.keys, id).await?;
    let stock_left: Option<i64> = redis::cmd("GET")
        .arg(&k.stock)
        .query_async(&mut redis)
        .await?;
    tx.commit().await?;
    if applied
        .iter()
        .any(|(_, r)| matches!(r, ChangeResult::Applied { .. }))
    {
        drop_cached(&mut redis, stores.keys, id).await;
    }
    Ok(Some(Rebuilt {
        settled: seen.orders.iter().filter(|o| o.holds).count(),
        unsettled: seen.unsettled.len(),
        total: sold as usize,
        stock_left,
    }))
}

/// On a sale whose expired buyers may buy again: buyers whose only orders expired
/// leave the buyers hash (a lost `HDEL` of their return), and returns still pending
/// are recorded as applied, since units left are counted from this set next (the
/// unit is back by construction; applying the return again would count it twice).
/// Returns their change ids: `restore_sale.lua` remembers them as applied in Redis
/// too, so that if this rebuild's transaction never commits, applying them later
/// changes nothing. The caller holds the sale's row lock, so no expiry commits
/// between its read of the orders and this.
async fn release_expired(
    tx: &mut sqlx::PgConnection,
    redis: &mut Redis,
    k: &crate::keys::SaleKeys,
    id: SaleId,
    seen: &SaleSeen,
) -> Result<Vec<i64>, AppError> {
    let gone: Vec<i64> = seen
        .orders
        .iter()
        .filter(|o| !o.holds && seen.known.contains(&o.user) && !seen.buyers.contains(&o.user))
        .map(|o| o.user)
        .collect::<HashSet<i64>>()
        .into_iter()
        .collect();
    for chunk in gone.chunks(CHUNK) {
        let _: i64 = redis::cmd("HDEL")
            .arg(&k.buyers)
            .arg(chunk)
            .query_async(&mut *redis)
            .await?;
    }
    Ok(sqlx::query_scalar(
        "UPDATE stock_changes SET status = 'applied', delta = 0, applied_at = now()
         WHERE sale_id = $1 AND kind = 'return' AND status = 'pending' RETURNING id",
    )
    .bind(id.get())
    .fetch_all(&mut *tx)
    .await?)
}

async fn read_sale(
    redis: &mut Redis,
    tx: &mut sqlx::PgConnection,
    k: &crate::keys::SaleKeys,
    sale: &SaleRow,
    key_ttl: std::time::Duration,
) -> Result<SaleSeen, AppError> {
    // Earlier versions' stream too: orders an older server accepted during an upgrade.
    let mut stream = stream_orders(redis, &k.orders).await?;
    stream.extend(stream_orders(redis, &k.orders_legacy).await?);
    let pending = super::pending::PendingHash::orders(scan_all(redis, "HSCAN", &k.pending).await?);
    // HSCAN answers field, value, field, ...: the fields are the buyers.
    let known: HashSet<i64> = scan_all::<String>(redis, "HSCAN", &k.buyers)
        .await?
        .iter()
        .step_by(2)
        .filter_map(|user| user.parse().ok())
        .collect();
    let key_ttl_ms = i64::try_from(key_ttl.as_millis()).unwrap_or(i64::MAX);
    let rows: Vec<(uuid::Uuid, i64, i32, bool, Option<String>)> = sqlx::query_as(
        "SELECT id, user_id, quantity,
                (status NOT IN ('expired', 'cancelled', 'refunded') OR NOT $2),
                CASE WHEN accepted_at > now() - make_interval(secs => $3::float8 / 1000)
                     THEN idempotency_key END
         FROM orders WHERE sale_id = $1",
    )
    .bind(sale.id)
    .bind(sale.rebuy_after_expiry)
    .bind(key_ttl_ms)
    .fetch_all(&mut *tx)
    .await?;
    let stored = |user: i64, key: &str, units: i64, order: &uuid::Uuid| {
        (format!("{user}:{key}"), format!("{units}:0:0:{order}"))
    };
    let mut keys = Vec::new();
    let mut orders = Vec::with_capacity(rows.len());
    for (id, user, units, holds, key) in rows {
        if let Some(key) = key {
            keys.push(stored(user, &key, i64::from(units), &id));
        }
        orders.push(SeenOrder {
            id,
            user,
            units: i64::from(units),
            holds,
        });
    }
    let in_pg: HashSet<uuid::Uuid> = orders.iter().map(|o| o.id).collect();
    let since_ms = chrono::Utc::now()
        .timestamp_millis()
        .saturating_sub(key_ttl_ms);
    let mut unsettled = Vec::new();
    for o in stream.into_iter().filter(|o| !in_pg.contains(&o.order)) {
        if let Some(key) = o.key.as_deref().filter(|_| o.at_ms > since_ms) {
            keys.push(stored(o.user, key, o.units, &o.order));
        }
        unsettled.push((o.order, o.user, o.units));
    }
    let mut buyers: HashSet<i64> = orders.iter().filter(|o| o.holds).map(|o| o.user).collect();
    buyers.extend(unsettled.iter().map(|(_, user, _)| *user));
    buyers.extend(
        pending
            .iter()
            .filter(|(order, _)| uuid::Uuid::parse_str(order).map_or(true, |o| !in_pg.contains(&o)))
            .map(|(_, user)| *user),
    );
    let settled_pending = pending
        .iter()
        .filter(|(order, _)| uuid::Uuid::parse_str(order).is_ok_and(|o| in_pg.contains(&o)))
        .map(|(order, _)| order.clone())
        .collect();
    let pending = pending
        .iter()
        .filter_map(|(order, user)| Some((uuid::Uuid::parse_str(order).ok()?, *user)))
        .filter(|(order, _)| !in_pg.contains(order))
        .collect();
    Ok(SaleSeen {
        orders,
        unsettled,
        keys,
        known,
        buyers,
        pending,
        settled_pending,
    })
}

/// The orders in a sale's stream.
async fn stream_orders(
    redis: &mut Redis,
    stream: &str,
) -> Result<Vec<super::entry::EntryOrder>, AppError> {
    let mut out = Vec::new();
    each_entry(redis, stream, |entry| {
        out.extend(super::entry::orders_of(entry).unwrap_or_default());
    })
    .await?;
    Ok(out)
}

/// Drops the sale's cached record and the list's first page after a stock change
/// this module applied (a failure leaves them their time to live).
async fn drop_cached<C: redis::aio::ConnectionLike>(redis: &mut C, keys: &Keys, sale: SaleId) {
    let views = [keys.sale_view(sale), keys.sales_list()];
    if let Err(e) = crate::cache::invalidate_keys(redis, &views).await {
        tracing::warn!(%sale, error = %e, "the sale's cached record was not dropped after a stock change");
    }
}
