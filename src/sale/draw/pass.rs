//! A drawn sale's wins in Redis, and their passing on.
//!
//! A win is a waiting room's admission (`queue:open`, user -> claim end ms), given
//! once by `lua/draw_admit.lua` (the `queue:admitted` hash remembers it), used up
//! by the purchase. Each step of [`step`] (every server, every half second, one
//! at a time per sale under the draw row's lock) settles the wins whose claim
//! ended: bought (the buyers hash or units hash holds the winner) or passed, and
//! offers as many next entries in the seeded order as the units left want. Once
//! the sale is over (closed early, or its end passed) the step settles every win
//! still running the same way, offers none, and finishes the draw ([`end`]).

use std::sync::LazyLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;
use sqlx::PgPool;

use crate::domain::SaleId;
use crate::error::AppError;
use crate::keys::{Keys, SaleKeys};
use crate::lua::lua_script;

static DRAW_ADMIT: LazyLock<crate::lua::Script> = lua_script!("draw_admit.lua");
static DRAW_OVER: LazyLock<crate::lua::Script> = lua_script!("draw_over.lua");

/// How long after a claim's end a step waits before it calls the win passed: the
/// purchase script decides by the Redis clock, this by Postgres's.
const CLAIM_GRACE: chrono::TimeDelta = chrono::TimeDelta::milliseconds(250);

/// Whether each of `users` bought from the sale (Redis: the buyers hash, or the
/// units hash of a sale of more than one per customer).
pub async fn bought<C: ConnectionLike>(
    redis: &mut C,
    k: &SaleKeys,
    max_per_user: i32,
    users: &[i64],
) -> Result<Vec<bool>, AppError> {
    if users.is_empty() {
        return Ok(Vec::new());
    }
    if max_per_user > 1 {
        let units: Vec<Option<i64>> = redis::cmd("HMGET")
            .arg(&k.units)
            .arg(users)
            .query_async(redis)
            .await?;
        return Ok(units.into_iter().map(|u| u.unwrap_or(0) > 0).collect());
    }
    let held: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(&k.buyers)
        .arg(users)
        .query_async(redis)
        .await?;
    Ok(held.into_iter().map(|order| order.is_some()).collect())
}

/// The wins offered and not settled whose claim still runs: (user, claim end).
async fn running(
    db: impl sqlx::PgExecutor<'_>,
    sale: SaleId,
) -> Result<Vec<(i64, DateTime<Utc>)>, AppError> {
    Ok(sqlx::query_as(
        "SELECT user_id, claim_until FROM draw_entries
         WHERE sale_id = $1 AND won_at IS NOT NULL AND outcome IS NULL
           AND claim_until > clock_timestamp()",
    )
    .bind(sale.get())
    .fetch_all(db)
    .await?)
}

/// Gives the running wins of `sale` in Redis (each once, from any server: what
/// was given stays as it is). False when Redis does not hold the sale now.
pub async fn admit<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
) -> Result<bool, AppError> {
    let wins = running(db, sale).await?;
    if wins.is_empty() {
        return Ok(true);
    }
    let k = keys.sale(sale);
    for chunk in wins.chunks(1000) {
        let mut call = DRAW_ADMIT.key(&k.meta);
        call.key(&k.queue_open).key(&k.queue_admitted);
        for (user, until) in chunk {
            call.arg(*user).arg(until.timestamp_millis());
        }
        let given: i64 = call.invoke_async(redis).await?;
        if given < 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Gives one user's running win in Redis now, when a purchase with their ticket
/// found no admission: the draw (or a step) is committed in Postgres and its wins
/// are given right after, so a winner quick enough to buy in between would be
/// refused. True when the win is open in Redis now, given by this call or by a
/// server's step since the refusal (the purchase may run again); false when the
/// user holds no running win or Redis had it already and it is used up.
pub async fn admit_one<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
    user: i64,
) -> Result<bool, AppError> {
    let until: Option<DateTime<Utc>> = sqlx::query_scalar(
        "SELECT claim_until FROM draw_entries
         WHERE sale_id = $1 AND user_id = $2 AND won_at IS NOT NULL AND outcome IS NULL
           AND claim_until > clock_timestamp()",
    )
    .bind(sale.get())
    .bind(user)
    .fetch_optional(db)
    .await?;
    let Some(until) = until else {
        return Ok(false);
    };
    let k = keys.sale(sale);
    let given: i64 = DRAW_ADMIT
        .key(&k.meta)
        .key(&k.queue_open)
        .key(&k.queue_admitted)
        .arg(user)
        .arg(until.timestamp_millis())
        .invoke_async(redis)
        .await?;
    if given != 0 {
        return Ok(given == 1);
    }
    // Given already: by a server's step between the refusal and this call (the
    // admission is open, and the purchase may run again), or earlier and used
    // up or expired since (the refusal stands).
    let open: Option<f64> = redis::cmd("ZSCORE")
        .arg(&k.queue_open)
        .arg(user)
        .query_async(redis)
        .await?;
    Ok(open.is_some())
}

/// Puts back the running wins of a drawn sale after Redis lost them (the sale's
/// rebuild, under its row lock): each not yet bought is given again, merged
/// with what Redis still holds.
pub async fn restore<C: ConnectionLike>(
    tx: &mut sqlx::PgConnection,
    redis: &mut C,
    k: &SaleKeys,
    sale: SaleId,
    buyers: &std::collections::HashSet<i64>,
) -> Result<(), AppError> {
    let wins = running(&mut *tx, sale).await?;
    let back = wins
        .iter()
        .filter(|(u, _)| !buyers.contains(u))
        .map(|(user, until)| (*user, until.timestamp_millis(), true));
    crate::sale::queue::restore::put_back_admissions(redis, k, back).await
}

#[derive(sqlx::FromRow)]
struct Draw {
    offered: i32,
    entries: i32,
    max_per_user: i32,
    claim_window_s: i32,
    over: bool,
    now: DateTime<Utc>,
}

/// One step of a drawn sale (see the module): wins settled, next entries offered,
/// the draw finished once every entry was offered and none is running, or once
/// the sale is over (its running wins settled first: [`end`]). `None` when there
/// is nothing to step (not drawn, finished, another server steps it now, or Redis
/// does not hold the sale or still sells it); else the wins newly offered.
pub async fn step<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
    claim_max: Duration,
) -> Result<Option<u64>, AppError> {
    let mut tx = db.begin().await?;
    let draw: Option<Draw> = sqlx::query_as(
        "SELECT d.offered, d.entries, s.max_per_user, s.claim_window_s,
                s.closed OR s.ends_at <= clock_timestamp() AS over, clock_timestamp() AS now
         FROM sale_draws d JOIN sales s ON s.id = d.sale_id
         WHERE d.sale_id = $1 AND d.drawn_at IS NOT NULL AND d.finished_at IS NULL
         FOR UPDATE OF d SKIP LOCKED",
    )
    .bind(sale.get())
    .fetch_optional(&mut *tx)
    .await?;
    let Some(draw) = draw else {
        return Ok(None);
    };
    if draw.over {
        return end(tx, redis, keys, sale, &draw).await;
    }
    let k = keys.sale(sale);
    let wins: Vec<(i64, DateTime<Utc>)> = sqlx::query_as(
        "SELECT user_id, claim_until FROM draw_entries
         WHERE sale_id = $1 AND won_at IS NOT NULL AND outcome IS NULL",
    )
    .bind(sale.get())
    .fetch_all(&mut *tx)
    .await?;
    let users: Vec<i64> = wins.iter().map(|(u, _)| *u).collect();
    // Who bought, then the stock, in that order: a winner who buys between the
    // two reads is still counted a running win while the stock already lacks
    // their unit, so this step offers too few (the next one offers the rest).
    // The other way round (the stock first), such a winner was counted bought
    // while the stock still held their unit, and the step offered a win for a
    // unit that was gone: two winners raced for one.
    let bought = bought(redis, &k, draw.max_per_user, &users).await?;
    let left: Option<i64> = redis::cmd("GET").arg(&k.stock).query_async(redis).await?;
    let Some(left) = left else {
        // Redis does not hold the sale: its rebuild first.
        return Ok(None);
    };
    let (mut sold_to, mut passed, mut open) = (Vec::new(), Vec::new(), 0i64);
    for ((user, until), bought) in wins.iter().zip(bought) {
        if bought {
            sold_to.push(*user);
        } else if *until + CLAIM_GRACE <= draw.now {
            passed.push(*user);
        } else {
            open += 1;
        }
    }
    settle(&mut tx, sale, &sold_to, &passed).await?;
    let wanted = super::order::winners(left, i64::from(draw.max_per_user), usize::MAX) as i64;
    let want = (wanted - open).max(0);
    let mut newly = 0u64;
    if want > 0 && draw.offered < draw.entries {
        let claim = claim_of(draw.claim_window_s, claim_max);
        let n = want.min(i64::from(i32::MAX)) as i32;
        newly = offer(&mut tx, sale, draw.offered, n, draw.now, draw.now + claim).await?;
    }
    let offered = draw.offered + newly as i32;
    let done = offered >= draw.entries && open == 0 && newly == 0;
    finish(&mut tx, sale, offered, done).await?;
    tx.commit().await?;
    // The publication changed: a win settled or offered, or the draw finished.
    if done || !sold_to.is_empty() || !passed.is_empty() || newly > 0 {
        drop_view(redis, keys, sale).await;
    }
    Ok(Some(newly))
}

/// The step of a sale that is over (closed early, or its end passed) while its
/// draw is not finished: every win still running is settled as at the end of its
/// claim, bought or passed (none is offered any more), and the draw finished. A
/// close is written to Redis after its commit, and the purchase reads its end by
/// the Redis clock: the wins are settled only once Redis takes no purchase of the
/// sale either (`lua/draw_over.lua`), so who bought is final. `None` until then.
async fn end<C: ConnectionLike>(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
    draw: &Draw,
) -> Result<Option<u64>, AppError> {
    let users: Vec<i64> = sqlx::query_scalar(
        "SELECT user_id FROM draw_entries
         WHERE sale_id = $1 AND won_at IS NOT NULL AND outcome IS NULL",
    )
    .bind(sale.get())
    .fetch_all(&mut *tx)
    .await?;
    if !users.is_empty() {
        let k = keys.sale(sale);
        let over: i64 = DRAW_OVER.key(&k.meta).invoke_async(redis).await?;
        if over != 1 {
            // Still selling in Redis (the next step looks again), or Redis does
            // not hold the sale (its rebuild first).
            return Ok(None);
        }
        let bought = bought(redis, &k, draw.max_per_user, &users).await?;
        let (mut sold_to, mut passed) = (Vec::new(), Vec::new());
        for (user, bought) in users.iter().zip(bought) {
            if bought {
                sold_to.push(*user);
            } else {
                passed.push(*user);
            }
        }
        settle(&mut tx, sale, &sold_to, &passed).await?;
        tracing::info!(%sale, bought = sold_to.len(), passed = passed.len(), "sale over: wins settled");
    }
    finish(&mut tx, sale, draw.offered, true).await?;
    tx.commit().await?;
    // Its wins settled, and it finished: the publication says so.
    drop_view(redis, keys, sale).await;
    Ok(Some(0))
}

/// Records the outcome of wins: `sold_to` bought, `passed` passed.
async fn settle(
    tx: &mut sqlx::PgConnection,
    sale: SaleId,
    sold_to: &[i64],
    passed: &[i64],
) -> Result<(), AppError> {
    for (outcome, users) in [("bought", sold_to), ("passed", passed)] {
        if !users.is_empty() {
            // Planned with its values (see migration 0028: a generic plan made on
            // a small draw reads all of the sale's entries).
            sqlx::query(
                "UPDATE draw_entries SET outcome = $3 WHERE sale_id = $1 AND user_id = ANY($2)",
            )
            .persistent(false)
            .bind(sale.get())
            .bind(users)
            .bind(outcome)
            .execute(&mut *tx)
            .await?;
        }
    }
    Ok(())
}

/// The publication changed: its cached copy goes, and the cached moment the draw
/// finished (a failure leaves them a second at most, `Keys::draw_view`,
/// `Keys::draw_finished`).
pub(super) async fn drop_view<C: ConnectionLike>(redis: &mut C, keys: &Keys, sale: SaleId) {
    let cached = [keys.draw_view(sale), keys.draw_finished(sale)];
    if let Err(e) = crate::cache::invalidate_keys(redis, &cached).await {
        tracing::warn!(%sale, error = %e, "the draw's cached publication was not dropped");
    }
}

/// Offers a win to the `n` entries after the first `offered` of the seeded
/// order (`draw_order`): their rank, the win's moment and its claim's end. The
/// number offered.
pub async fn offer(
    tx: &mut sqlx::PgConnection,
    sale: SaleId,
    offered: i32,
    n: i32,
    now: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<u64, AppError> {
    if n <= 0 {
        return Ok(0);
    }
    Ok(sqlx::query(
        "UPDATE draw_entries e SET rank = o.rank, won_at = $4, claim_until = $5
         FROM draw_order o
         WHERE o.sale_id = $1 AND o.rank > $2 AND o.rank <= $2 + $3
           AND e.sale_id = $1 AND e.id = o.entry_id",
    )
    .bind(sale.get())
    .bind(offered)
    .bind(n)
    .bind(now)
    .bind(until)
    .execute(&mut *tx)
    .await?
    .rows_affected())
}

async fn finish(
    tx: &mut sqlx::PgConnection,
    sale: SaleId,
    offered: i32,
    done: bool,
) -> Result<(), AppError> {
    sqlx::query(
        "UPDATE sale_draws SET offered = $2,
                finished_at = CASE WHEN $3 THEN clock_timestamp() END
         WHERE sale_id = $1",
    )
    .bind(sale.get())
    .bind(offered)
    .bind(done)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// A win's claim window: the sale's, at most `claim_max` (the server's setting,
/// which tests shorten).
pub fn claim_of(claim_window_s: i32, claim_max: Duration) -> chrono::TimeDelta {
    let window = Duration::from_secs(u64::try_from(claim_window_s).unwrap_or(0)).min(claim_max);
    chrono::TimeDelta::from_std(window).unwrap_or(chrono::TimeDelta::zero())
}
