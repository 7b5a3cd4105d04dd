//! The draw, exactly once, and the loop every server runs ([`draw_forever`]).
//!
//! Any server may draw a sale whose time has come. A Redis lock (`SET NX`, see
//! [`crate::lock`]) keeps the others from starting the same work meanwhile; what
//! makes it exact is Postgres: the draw is one transaction that takes the draw
//! row `FOR UPDATE`, goes on only while `drawn_at` is unset, waits for the entries
//! in flight (the draw's advisory lock, which they hold shared), and sets it with
//! the ranks and the first wins. A server that dies in it leaves nothing (the
//! transaction rolls back) and the next one draws the same winners, since the
//! order follows from the seed and the entries alone.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::order;
use crate::domain::SaleId;
use crate::error::AppError;
use crate::keys::Keys;
use crate::lock::Lock;
use crate::redis_conn::Redis;

/// How often each server steps the drawn sales still passing on, and looks again
/// while a draw is due.
pub const STEP_EVERY: Duration = Duration::from_millis(500);
/// How often a server with no draw to tend looks for one (sooner when the next
/// falls due sooner): a draw due at a sale's opening is drawn when the look at
/// that moment finds it; a draw sale created, edited or opened now in this
/// process wakes the loop at once (`state.wake.draws`), one made on another
/// server is found within this. (Entries close by Postgres's clock whatever the
/// loop does.) An idle server's looks every 500 ms were its busiest Postgres work.
pub const IDLE_EVERY: Duration = Duration::from_secs(2);
/// How long the look for draws may wait for Postgres (on a connection whose link
/// died without a reset, for ever) before it is given up and tried again.
const LOOK_LIMIT: Duration = Duration::from_secs(10);
/// The draw lock's lease; its watchdog extends it while a large draw runs.
const LOCK_TTL_MS: u64 = 10_000;
/// How long one sale's draw step may wait (for Postgres, mostly) before it is
/// given up and tried at the next (see [`crate::error::within`]).
const TEND_LIMIT: Duration = Duration::from_secs(60);

/// What a draw made: entries ordered and wins given at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drawn {
    pub entries: usize,
    pub winners: usize,
}

#[derive(sqlx::FromRow)]
struct Due {
    seed: Vec<u8>,
    stock: i64,
    max_per_user: i32,
    claim_window_s: i32,
    now: DateTime<Utc>,
}

/// Draws `sale` if its time has come and nobody drew it: `None` when it is drawn
/// already, not due, or being drawn by another server.
pub async fn draw_once(
    db: &PgPool,
    redis: &Redis,
    keys: &Keys,
    sale: SaleId,
    claim_max: Duration,
) -> Result<Option<Drawn>, AppError> {
    let lock = keys.lock(&format!("draw:sale:{sale}"));
    let Some(mut guard) = Lock::try_acquire(redis, lock, LOCK_TTL_MS).await? else {
        return Ok(None);
    };
    let _lost = guard.start_watchdog();
    let drawn = draw_locked(db, sale, claim_max).await;
    let _ = guard.release().await;
    if let Ok(Some(_)) = &drawn {
        // Drawn (and finished at once when nobody won): what was cached of the
        // draw before it goes.
        super::pass::drop_view(&mut redis.clone(), keys, sale).await;
    }
    drawn
}

async fn draw_locked(
    db: &PgPool,
    sale: SaleId,
    claim_max: Duration,
) -> Result<Option<Drawn>, AppError> {
    let mut tx = db.begin().await?;
    // A draw of a million entries outlasts the pool's statement timeout.
    sqlx::query("SET LOCAL statement_timeout = 0")
        .execute(&mut *tx)
        .await?;
    let due: Option<Due> = sqlx::query_as(
        "SELECT d.seed, s.stock_total - s.units_reoffered AS stock, s.max_per_user,
                s.claim_window_s, clock_timestamp() AS now
         FROM sale_draws d JOIN sales s ON s.id = d.sale_id
         WHERE d.sale_id = $1 AND d.drawn_at IS NULL AND s.starts_at <= clock_timestamp()
         FOR UPDATE OF d SKIP LOCKED",
    )
    .bind(sale.get())
    .fetch_optional(&mut *tx)
    .await?;
    let Some(due) = due else {
        return Ok(None);
    };
    // The entries in flight done, and no more (see `enter.rs`): they hold this
    // lock shared; the ones after it find the sale drawn.
    sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
        .bind(super::DRAW_LOCK_CLASS)
        .bind(super::draw_lock_key(sale))
        .execute(&mut *tx)
        .await?;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM draw_entries WHERE sale_id = $1")
        .bind(sale.get())
        .fetch_all(&mut *tx)
        .await?;
    // This version draws by recipe 2 whenever the sale was made; the row records
    // it with the digest (a server of the version before leaves recipe 1).
    let recipe = order::Recipe::Entries;
    let seed = due.seed;
    let (ordered, digest) = tokio::task::spawn_blocking(move || {
        let digest = order::entries_digest(&ids);
        let key = order::order_key(recipe, &seed, &digest);
        (order::order_keyed(&key, &ids), digest)
    })
    .await
    .map_err(|e| AppError::Internal(e.into()))?;
    let entries = ordered.len();
    let winners = order::winners(due.stock, i64::from(due.max_per_user), entries);
    // The whole order in its own sequence (see migrations/0023_draw_order.sql),
    // then the first wins.
    let (keys, ids): (Vec<i64>, Vec<i64>) = ordered.into_iter().unzip();
    sqlx::query(
        "INSERT INTO draw_order (sale_id, rank, key8, entry_id)
         SELECT $1, r.rank::int4, r.key8, r.id
         FROM unnest($2::int8[], $3::int8[]) WITH ORDINALITY AS r(key8, id, rank)",
    )
    .bind(sale.get())
    .bind(&keys)
    .bind(&ids)
    .execute(&mut *tx)
    .await?;
    let claim = super::pass::claim_of(due.claim_window_s, claim_max);
    super::pass::offer(&mut tx, sale, 0, winners as i32, due.now, due.now + claim).await?;
    sqlx::query(
        "UPDATE sale_draws SET drawn_at = $2, entries = $3, offered = $4,
                finished_at = CASE WHEN $4 = 0 THEN $2 END, stock_at_draw = $5,
                recipe = $7, entries_digest = $6
         WHERE sale_id = $1",
    )
    .bind(sale.get())
    .bind(due.now)
    .bind(entries as i32)
    .bind(winners as i32)
    .bind(due.stock)
    .bind(digest.as_slice())
    .bind(recipe.number())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some(Drawn { entries, winners }))
}

/// The draw sales to look at: due and not drawn, or drawn and still passing on;
/// and, when none is, how soon the next draw falls due (within [`IDLE_EVERY`]).
pub async fn active(db: &PgPool) -> Result<(Vec<SaleId>, Option<Duration>), AppError> {
    let rows: Vec<(i64, f64)> = sqlx::query_as(
        "SELECT d.sale_id,
                greatest(extract(epoch FROM s.starts_at - clock_timestamp()), 0)::float8
         FROM sale_draws d JOIN sales s ON s.id = d.sale_id
         WHERE d.finished_at IS NULL
           AND s.starts_at <= clock_timestamp() + make_interval(secs => $1)
         ORDER BY d.sale_id",
    )
    .bind(IDLE_EVERY.as_secs_f64())
    .fetch_all(db)
    .await?;
    let due: Vec<SaleId> = rows
        .iter()
        .filter(|(_, in_s)| *in_s <= 0.0)
        .filter_map(|(id, _)| SaleId::new(*id))
        .collect();
    let next = rows
        .iter()
        .map(|(_, in_s)| *in_s)
        .filter(|in_s| *in_s > 0.0)
        .min_by(f64::total_cmp)
        .map(Duration::from_secs_f64);
    Ok((due, next))
}

/// One look at one sale: its draw if due, its step if drawn, its wins given in
/// Redis.
pub async fn tend(
    db: &PgPool,
    redis: &Redis,
    keys: &Keys,
    sale: SaleId,
    claim_max: Duration,
) -> Result<(), AppError> {
    if let Some(drawn) = draw_once(db, redis, keys, sale, claim_max).await? {
        tracing::info!(sale = %sale, entries = drawn.entries, winners = drawn.winners, "drawn");
    }
    let mut conn = redis.clone();
    if let Some(newly) = super::pass::step(db, &mut conn, keys, sale, claim_max).await?
        && newly > 0
    {
        tracing::info!(sale = %sale, newly, "wins passed on");
    }
    super::pass::admit(db, &mut conn, keys, sale).await?;
    Ok(())
}

/// Every [`STEP_EVERY`] (or [`IDLE_EVERY`] with nothing to tend) until shutdown: the draws due, drawn, and the drawn ones
/// stepped (see [`super::pass`]). Every server runs it; the locks make each
/// draw and each step one server's.
pub async fn draw_forever(
    db: PgPool,
    redis: Redis,
    keys: Keys,
    claim_max: Duration,
    woken: std::sync::Arc<tokio::sync::Notify>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut pause = STEP_EVERY;
    while !*shutdown.borrow() {
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            () = woken.notified() => {}
            _ = shutdown.changed() => break,
        }
        let started = Instant::now();
        let sales = match crate::error::within("the look for draws", LOOK_LIMIT, active(&db)).await
        {
            Ok((sales, next)) => {
                pause = match next {
                    _ if !sales.is_empty() => STEP_EVERY,
                    // At the moment it falls due (the clock's rounding: 10 ms more).
                    Some(next) => (next + Duration::from_millis(10)).min(IDLE_EVERY),
                    None => IDLE_EVERY,
                };
                sales
            }
            Err(e) => {
                pause = STEP_EVERY;
                tracing::debug!(error = ?e, "listing draws failed; retrying");
                continue;
            }
        };
        for sale in sales {
            let tended = tend(&db, &redis, &keys, sale, claim_max);
            if let Err(e) = crate::error::within("a draw step", TEND_LIMIT, tended).await {
                tracing::warn!(sale = %sale, error = ?e, "draw step failed; retrying");
            }
        }
        tracing::trace!(took = ?started.elapsed(), "draws tended");
    }
}
