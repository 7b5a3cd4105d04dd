//! Admission at the sale's pace (`lua/queue_admit.lua`), run by every server's
//! [`admit_forever`], and the copies of joins and admissions into Postgres.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use redis::aio::ConnectionLike;
use sqlx::PgPool;

use super::join::Unavailable;
use crate::domain::{SaleId, UserId};
use crate::error::AppError;
use crate::keys::Keys;
use crate::lua::{lua_function, unexpected_reply};
use crate::metrics::Metrics;

static QUEUE_ADMIT: LazyLock<crate::lua::Script> = lua_function!("queue_admit.lua", "queue_admit");

/// The script of one waiting-room step (for `examples/lua_function.rs`).
pub fn script() -> &'static crate::lua::Script {
    &QUEUE_ADMIT
}

crate::lua::reply_codes! {
    /// What `lua/queue_admit.lua` answers, as its header lists them.
    pub enum AdmitCode in "queue_admit.lua", checked_by admit_codes_are_the_scripts {
        Done = 0, "done";
        NotOpenYet = 2, "not open yet";
        Ended = 3, "ended or closed";
        NotLoaded = 4, "not loaded";
        Recovering = 6, "recovering";
        NoWaitingRoom = 13, "no waiting room";
        Paused = 14, "paused";
    }
}

/// Joins copied to Postgres per round trip (and places put back per round trip).
pub const COPY_BATCH: usize = 2000;
/// Most shoppers one admission step admits.
const ADMIT_MAX: usize = 1000;
fn ms(t: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(t)
        .single()
        .unwrap_or_else(Utc::now)
}

/// What one admission step did.
#[derive(Debug, Default)]
pub struct Step {
    /// Admissions that expired unused in this step.
    pub passed: i64,
    /// Shoppers admitted, with their admission's end (Redis clock, ms).
    pub admitted: Vec<(UserId, i64)>,
}

/// `lua/queue_admit.lua` once for `sale`; `Err(Unavailable)` when Redis does not
/// hold it (the rebuild puts it back first).
pub async fn admit_step<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
    life_ms: i64,
    now_ms: Option<i64>,
) -> Result<Result<Step, Unavailable>, AppError> {
    let k = keys.sale(sale);
    let reply: Vec<i64> = QUEUE_ADMIT
        .key(&k.meta)
        .key(&k.stock)
        .key(&k.queue)
        .key(&k.queue_state)
        .key(&k.queue_open)
        .key(&k.queue_admitted)
        .key(&k.queue_admits)
        .arg(now_ms.map(|t| t.to_string()).unwrap_or_default())
        .arg(life_ms)
        .arg(ADMIT_MAX)
        .invoke_async(redis)
        .await?;
    let (Some(&code), Some(&passed)) = (reply.first(), reply.get(1)) else {
        return Err(unexpected_reply("queue_admit.lua", reply));
    };
    match AdmitCode::of(code) {
        Some(AdmitCode::Done | AdmitCode::NotOpenYet | AdmitCode::Ended | AdmitCode::Paused) => {}
        Some(AdmitCode::NotLoaded) => return Ok(Err(Unavailable::NotLoaded)),
        Some(AdmitCode::Recovering) => return Ok(Err(Unavailable::Recovering)),
        Some(AdmitCode::NoWaitingRoom) => return Ok(Err(Unavailable::NoWaitingRoom)),
        None => return Err(unexpected_reply("queue_admit.lua", code)),
    }
    let mut admitted = Vec::with_capacity(reply.len() / 2);
    for pair in reply[2..].chunks(2) {
        let [user, expiry] = pair else {
            return Err(unexpected_reply("queue_admit.lua", reply));
        };
        let user = UserId::new(*user)
            .ok_or_else(|| unexpected_reply("queue_admit.lua", ("user", *user)))?;
        admitted.push((user, *expiry));
    }
    Ok(Ok(Step { passed, admitted }))
}

/// Writes admissions into `queue_admissions` (once each).
pub async fn record_admissions(
    db: &PgPool,
    sale: SaleId,
    admitted: &[(UserId, i64)],
) -> Result<(), AppError> {
    if admitted.is_empty() {
        return Ok(());
    }
    let users: Vec<i64> = admitted.iter().map(|(u, _)| u.get()).collect();
    let ends: Vec<DateTime<Utc>> = admitted.iter().map(|(_, e)| ms(*e)).collect();
    sqlx::query(
        "INSERT INTO queue_admissions (sale_id, user_id, expires_at)
         SELECT $1, u, e FROM unnest($2::bigint[], $3::timestamptz[]) AS t(u, e)
         ON CONFLICT DO NOTHING",
    )
    .bind(sale.get())
    .bind(&users)
    .bind(&ends)
    .execute(db)
    .await?;
    Ok(())
}

/// Drains `stream` into Postgres: reads its entries oldest first, [`COPY_BATCH`] at
/// a time, hands each read to `write` (which writes it, idempotently: several
/// servers may drain at once), and only then deletes what it read. An entry whose
/// write failed stays for the next drain. Returns how many entries it took.
async fn drain<C, W, Fut>(redis: &mut C, stream: &str, mut write: W) -> Result<usize, AppError>
where
    C: ConnectionLike,
    W: FnMut(Vec<redis::streams::StreamId>) -> Fut,
    Fut: std::future::Future<Output = Result<(), AppError>>,
{
    let mut copied = 0;
    loop {
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(stream)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(COPY_BATCH)
            .query_async(redis)
            .await?;
        let n = reply.ids.len();
        if n == 0 {
            return Ok(copied);
        }
        let ids: Vec<String> = reply.ids.iter().map(|e| e.id.clone()).collect();
        write(reply.ids).await?;
        let _: i64 = redis::cmd("XDEL")
            .arg(stream)
            .arg(&ids)
            .query_async(redis)
            .await?;
        copied += n;
        if n < COPY_BATCH {
            return Ok(copied);
        }
    }
}

/// A field of a stream entry, parsed.
fn field<T: std::str::FromStr>(entry: &redis::streams::StreamId, name: &str) -> Option<T> {
    entry.get::<String>(name).and_then(|s| s.parse().ok())
}

/// Writes the admissions Redis gave and has not yet seen written (its admissions
/// stream, filled by `lua/queue_admit.lua` in the step that gives them) into
/// `queue_admissions`, then drops them from the stream. An admission whose write
/// failed (Postgres down) or whose server died before it is written by the next
/// step of any server. Returns how many were written.
pub async fn copy_admissions<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
) -> Result<usize, AppError> {
    let k = keys.sale(sale);
    drain(redis, &k.queue_admits, |entries| async move {
        let mut admitted = Vec::with_capacity(entries.len());
        for entry in &entries {
            match (field(entry, "u").and_then(UserId::new), field(entry, "e")) {
                (Some(u), Some(e)) => admitted.push((u, e)),
                _ => {
                    tracing::warn!(sale = %sale, id = %entry.id, "a malformed admission entry was dropped")
                }
            }
        }
        record_admissions(db, sale, &admitted).await
    })
    .await
}

/// Copies the joins Redis holds and Postgres does not yet into `queue_places`,
/// then drops them from the joins stream. Several servers may copy at once: the
/// insert ignores places already there. Returns how many were copied.
pub async fn copy_joins<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
) -> Result<usize, AppError> {
    let k = keys.sale(sale);
    drain(redis, &k.queue_joins, |entries| async move {
        let mut users = Vec::with_capacity(entries.len());
        let mut places = Vec::with_capacity(entries.len());
        let mut times = Vec::with_capacity(entries.len());
        for entry in &entries {
            let (Some(u), Some(p), Some(t)) = (
                field::<i64>(entry, "u"),
                field::<f64>(entry, "p"),
                field::<i64>(entry, "t"),
            ) else {
                tracing::warn!(sale = %sale, id = %entry.id, "a malformed join entry was dropped");
                continue;
            };
            users.push(u);
            places.push(p);
            times.push(ms(t));
        }
        sqlx::query(
            "INSERT INTO queue_places (sale_id, user_id, place, joined_at)
             SELECT $1, u, p, t FROM unnest($2::bigint[], $3::float8[], $4::timestamptz[]) AS x(u, p, t)
             ON CONFLICT DO NOTHING",
        )
        .bind(sale.get())
        .bind(&users)
        .bind(&places)
        .bind(&times)
        .execute(db)
        .await?;
        Ok(())
    })
    .await
}

/// A waiting room's sales that may need a step: line open or sale open, not ended,
/// not closed (read from Postgres every few seconds by [`admit_forever`]).
pub async fn active_sales(db: &PgPool) -> Result<Vec<SaleId>, AppError> {
    Ok(rooms_soon(db, Duration::ZERO).await?.0)
}

/// [`active_sales`], and in how long the first line to open within `within`
/// after them does (`None`: none).
async fn rooms_soon(
    db: &PgPool,
    within: Duration,
) -> Result<(Vec<SaleId>, Option<Duration>), AppError> {
    let rows: Vec<(i64, f64)> = sqlx::query_as(
        "SELECT id, greatest(extract(epoch FROM queue_opens_at - now()), 0)::float8 FROM sales
         WHERE waiting_room AND NOT closed
           AND queue_opens_at <= now() + interval '1 second' + make_interval(secs => $1)
           AND ends_at > now() - interval '1 minute'
         ORDER BY id LIMIT 1000",
    )
    .bind(within.as_secs_f64())
    .fetch_all(db)
    .await?;
    let (active, soon): (Vec<_>, Vec<_>) = rows.into_iter().partition(|&(_, s)| s <= 1.0);
    let next = soon
        .into_iter()
        .map(|(_, s)| s)
        .reduce(f64::min)
        .map(|s| Duration::from_secs_f64(s - 1.0));
    Ok((
        active
            .into_iter()
            .filter_map(|(id, _)| SaleId::new(id))
            .collect(),
        next,
    ))
}

/// How often each server steps every active waiting room.
pub const STEP_EVERY: Duration = Duration::from_millis(100);
/// How long one sale's step may wait (for Postgres, mostly) before it is given up
/// and tried at the next (see [`crate::error::within`]).
const STEP_LIMIT: Duration = Duration::from_secs(30);
/// How often the active waiting rooms are read again from Postgres while some are
/// active.
const LIST_EVERY: Duration = Duration::from_secs(2);
/// How often, while none is active: a room created or changed in this process is
/// listed at once (`wake`), one opening at a time set in advance within this, and
/// one created elsewhere to open at once within this.
const LIST_IDLE_EVERY: Duration = Duration::from_secs(5);

/// Every [`STEP_EVERY`], for each active waiting room: copy its new joins into
/// Postgres, then one admission step, then write into Postgres the admissions not
/// yet written (this step's, and any a failed write or a dead server left).
/// Every server runs it; the script paces them together.
pub async fn admit_forever<C: ConnectionLike + Clone + Send>(
    db: PgPool,
    redis: C,
    keys: Keys,
    life: Duration,
    metrics: std::sync::Arc<Metrics>,
    wake: std::sync::Arc<tokio::sync::Notify>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut sales: Vec<SaleId> = Vec::new();
    let mut list_at = Instant::now() + STEP_EVERY;
    while !*shutdown.borrow() {
        // With no waiting room active, nothing to step: wake only to list them
        // again (an idle server wakes every 5 s here, not 10 times a second).
        let pause = if sales.is_empty() {
            list_at.saturating_duration_since(Instant::now())
        } else {
            STEP_EVERY
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = wake.notified() => list_at = Instant::now(),
            _ = shutdown.changed() => break,
        }
        if Instant::now() >= list_at {
            let listed = rooms_soon(&db, LIST_IDLE_EVERY);
            match crate::error::within("listing waiting rooms", STEP_LIMIT, listed).await {
                Ok((active, opening)) => {
                    sales = active;
                    let every = if sales.is_empty() {
                        LIST_IDLE_EVERY
                    } else {
                        LIST_EVERY
                    };
                    // A line that opens within that: listed as it opens.
                    let every = opening.map_or(every, |o| o.min(every)).max(STEP_EVERY);
                    list_at = Instant::now() + every;
                }
                Err(e) => {
                    tracing::debug!(error = ?e, "listing waiting rooms failed; retrying");
                    list_at = Instant::now() + STEP_EVERY * 10;
                }
            }
        }
        for &sale in &sales {
            let mut redis = redis.clone();
            let step = step_once(&db, &mut redis, &keys, sale, life, &metrics);
            if let Err(e) = crate::error::within("a waiting room step", STEP_LIMIT, step).await {
                tracing::debug!(sale = %sale, error = ?e, "waiting room step failed; retrying");
            }
        }
    }
}

/// One sale's copy and admission step.
pub async fn step_once<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
    life: Duration,
    metrics: &Metrics,
) -> Result<(), AppError> {
    copy_joins(db, redis, keys, sale).await?;
    let life_ms = i64::try_from(life.as_millis()).unwrap_or(i64::MAX).max(1);
    // Not in Redis, or not trusted: the sweep (or the next request) rebuilds it.
    if let Ok(step) = admit_step(redis, keys, sale, life_ms, None).await? {
        metrics.queue_admitted.add(step.admitted.len() as u64);
        metrics.queue_passed.add(step.passed.max(0) as u64);
    }
    // This step's admissions, and any an earlier step could not write.
    copy_admissions(db, redis, keys, sale).await?;
    Ok(())
}
