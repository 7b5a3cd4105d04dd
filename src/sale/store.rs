//! Writing a sale: its creation in both stores (`lua/new_sale.lua`), and an
//! admin's open and close (`lua/update_meta.lua`). The record is in
//! [`super::record`], stock changes in [`super::stock`], the comparison of the two
//! stores in [`super::reconcile`].

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;

use sqlx::PgPool;

use super::record::{SaleRow, sale_columns};
use crate::domain::SaleId;
use crate::error::AppError;
use crate::keys::Keys;
use crate::lua::lua_script;

static NEW_SALE: LazyLock<crate::lua::Script> = lua_script!("new_sale.lua");

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
    pub rehearsal: bool,
    /// A waiting room, checked (see [`super::queue::room::WaitingRoom::check`]); the sale
    /// then requires a ticket (an admission is one).
    pub waiting_room: Option<super::queue::room::WaitingRoom>,
    /// Leading zero bits of the proof asked with the ticket or the join (0: none).
    pub proof_of_work: i16,
    /// Least age of an account that may take part, seconds (0: any).
    pub min_account_age_s: i32,
    /// A draw sale's settings (see [`super::draw`]): its seed is drawn here, its
    /// commitment stored on the row; the sale then requires a ticket (a win's).
    pub draw: Option<super::draw::DrawSettings>,
}

/// Inserts the sale and puts it into Redis inside one transaction: if Redis refuses,
/// the row is rolled back, so no sale exists that buyers cannot reach.
pub async fn create_sale<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    new: NewSale,
    admin: Option<crate::domain::UserId>,
) -> Result<SaleRow, AppError> {
    let seed = new.draw.map(|_| super::draw::order::new_seed());
    let mut tx = db.begin().await?;
    let row = sqlx::query_as::<_, SaleRow>(concat!(
        "INSERT INTO sales (name, description, price_cents, stock_total, starts_at, ends_at, image_url,
                            requires_ticket, payment_window_s, rebuy_after_expiry, max_per_user, rehearsal,
                            waiting_room, queue_opens_at, admit_per_second, proof_of_work,
                            min_account_age_s, mode, entries_open_at, claim_window_s,
                            draw_commitment)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                 $18, $19, $20, $21) RETURNING ",
        sale_columns!()
    ))
    .bind(&new.name)
    .bind(&new.description)
    .bind(new.price_cents)
    .bind(new.stock)
    .bind(new.starts_at)
    .bind(new.ends_at)
    .bind(&new.image_url)
    .bind(new.requires_ticket || new.waiting_room.is_some() || new.draw.is_some())
    .bind(new.payment_window_s)
    .bind(new.rebuy_after_expiry)
    .bind(new.max_per_user)
    .bind(new.rehearsal)
    .bind(new.waiting_room.is_some())
    .bind(new.waiting_room.map(|w| w.queue_opens_at))
    .bind(new.waiting_room.map(|w| w.admit_per_second))
    .bind(new.proof_of_work)
    .bind(new.min_account_age_s)
    .bind(if new.draw.is_some() { "draw" } else { "first_come" })
    .bind(new.draw.map(|d| d.entries_open_at))
    .bind(new.draw.map(|d| d.claim_window_s))
    .bind(seed.map(|s| super::draw::order::commitment(&s)))
    .fetch_one(&mut *tx)
    .await?;
    if let Some(seed) = seed {
        sqlx::query("INSERT INTO sale_draws (sale_id, seed) VALUES ($1, $2)")
            .bind(row.id.get())
            .bind(&seed[..])
            .execute(&mut *tx)
            .await?;
    }
    if let Some(admin) = admin {
        let after = serde_json::to_value(&row).map_err(|e| AppError::Internal(e.into()))?;
        crate::audit::record(
            &mut tx,
            crate::audit::Change {
                admin,
                action: crate::audit::Action::Create,
                subject: crate::audit::Subject::Sale(row.id),
                before: None,
                after: Some(after),
            },
        )
        .await?;
    }
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
    let k = keys.sale(row.id);
    let _: i64 = NEW_SALE
        .key(&k.meta)
        .key(&k.stock)
        .key(&k.sold)
        .key(&k.buyers_legacy)
        .arg(row.starts_at.timestamp_millis())
        .arg(row.ends_at.timestamp_millis())
        .arg(u8::from(row.closed))
        .arg(row.units_ever_offered())
        .arg(row.max_per_user)
        .arg(super::queue::room::rate_in_meta(row))
        .arg(super::queue::room::opens_ms_in_meta(row))
        .arg(super::legacy::MARKER)
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

/// Applies `change` to the sale's row, recorded as the admin's; the row after it,
/// or `None` for no such sale.
pub async fn set_window(
    db: &PgPool,
    id: SaleId,
    change: WindowChange,
    admin: crate::domain::UserId,
) -> Result<Option<SaleRow>, AppError> {
    let action = match change {
        WindowChange::Open => crate::audit::Action::Open,
        WindowChange::Close => crate::audit::Action::Close,
    };
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
    let mut tx = db.begin().await?;
    let before: Option<(DateTime<Utc>, bool)> =
        sqlx::query_as("SELECT starts_at, closed FROM sales WHERE id = $1 FOR UPDATE")
            .bind(id.get())
            .fetch_optional(&mut *tx)
            .await?;
    let Some((starts_at, closed)) = before else {
        return Ok(None);
    };
    let row = sqlx::query_as::<_, SaleRow>(sql)
        .bind(id.get())
        .fetch_one(&mut *tx)
        .await?;
    crate::audit::record(
        &mut tx,
        crate::audit::Change {
            admin,
            action,
            subject: crate::audit::Subject::Sale(id),
            before: Some(serde_json::json!({ "starts_at": starts_at, "closed": closed })),
            after: Some(serde_json::json!({ "starts_at": row.starts_at, "closed": row.closed })),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(Some(row))
}

/// Writes a sale's window (as Postgres has it now) into its Redis meta hash, when
/// Redis holds the sale. Returns false when it does not: then the sale needs a
/// rebuild (see [`crate::recover`]), which writes the window from Postgres.
pub async fn update_window<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    sale: &SaleRow,
) -> Result<bool, AppError> {
    let k = keys.sale(sale.id);
    crate::restore::update_meta(redis, &k.meta, &window_fields(sale)).await
}

/// The window's fields of the meta hash.
fn window_fields(sale: &SaleRow) -> Vec<(&'static str, i64)> {
    vec![
        ("starts_ms", sale.starts_at.timestamp_millis()),
        ("ends_ms", sale.ends_at.timestamp_millis()),
        ("closed", i64::from(sale.closed)),
    ]
}

/// [`update_window`] failed after the change committed: written from Postgres in
/// the background (see [`crate::restore::resync_meta`]).
pub fn resync_window(db: &PgPool, redis: &crate::redis_conn::Redis, keys: &Keys, id: SaleId) {
    let db = db.clone();
    crate::restore::resync_meta(
        redis.clone(),
        keys.sale(id).meta,
        format!("sale {id}"),
        move || {
            let db = db.clone();
            async move {
                let row = super::record::fetch_sale(&db, id)
                    .await?
                    .ok_or_else(|| AppError::not_found(format!("no sale with id {id}")))?;
                Ok(window_fields(&row))
            }
        },
    );
}
