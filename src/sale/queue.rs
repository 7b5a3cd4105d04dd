//! A sale's waiting room: a fair line at the opening, a live place in it, and
//! admission at a set pace.
//!
//! A sale created with `waiting_room: true` has a line that opens at
//! `queue_opens_at`, and sells only to shoppers admitted from it:
//!
//! - **Joining** (`lua/queue_place.lua`): one place per account, the same answer
//!   however often it joins. A place is a score in the line (a sorted set): whoever
//!   joins before `starts_at` holds a random one below 2^52 drawn by the server, so
//!   the line's early part is in random order whenever they came (arriving a second
//!   early earns nothing); a later joiner holds 2^52 + n, n counting the late joins,
//!   so they follow in arrival order.
//! - **Admission** (`lua/queue_admit.lua`, run by every server's [`admit_forever`]
//!   a few times a second): atomic and paced by the Redis clock, so any number of
//!   servers admit at `admit_per_second` together, from the opening on. It first
//!   moves admissions past their life (an admission lasts `queue_admission_ms`,
//!   30 s by default) out of the open set: they passed. Then it admits from the head
//!   of the line at most min(credit, units left - admissions open), so never more
//!   shoppers are admitted and unexpired than units are left; an admission that
//!   passes frees its room for the next in line.
//! - **Buying**: an admission is a purchase ticket (`POST /api/sales/{id}/ticket`
//!   issues one only to an admitted shopper, valid as long as the admission), and
//!   the purchase script checks the admission itself (`lua/purchase_batch.lua`,
//!   code 13): a purchase without one is refused with nothing taken. A purchase
//!   accepted uses the admission up.
//! - **Where am I** (the same script, reading only): state, place, people ahead (a `ZCOUNT`:
//!   logarithmic in the line), an estimated wait. The sale's view carries the
//!   line's numbers (`served`: places the admission has reached), so an open page
//!   learns its place once and follows it over the sale's event stream.
//!
//! **Durability.** Redis (AOF) holds the line; a restart keeps every place. Postgres
//! keeps what a wipe must not lose: the admitter copies joins into `queue_places`
//! and admissions into `queue_admissions` (a step behind, about 100 ms) from two
//! streams the scripts fill, so one whose write failed, or whose server died first,
//! is written by a later step or another server. A sale's rebuild after a wipe
//! ([`restore`]) puts the line back from `queue_places`, every admission back as
//! given (nobody is admitted a second time; one still running is open again), and
//! the head after the last place admitted. What the last step before a wipe had not
//! copied yet is lost with Redis: a join (that shopper joins again, at the end), or
//! an admission, usable for those few milliseconds only (a purchase it allowed is
//! an order, and its buyer is in the buyers set the rebuild restores, so it is not
//! sold twice); its holder, if they did not buy, is admitted again in turn.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use redis::aio::ConnectionLike;
use serde::Serialize;
use sqlx::PgPool;

use crate::domain::{SaleId, UserId};
use crate::error::{AppError, ErrorCode};
use crate::keys::{Keys, SaleKeys};
use crate::lua::{lua_script, unexpected_reply};
use crate::metrics::Metrics;

use super::store::SaleRow;

static QUEUE_PLACE: LazyLock<crate::lua::Script> = lua_script!("queue_place.lua");
static QUEUE_ADMIT: LazyLock<crate::lua::Script> = lua_script!("queue_admit.lua");

/// Most shoppers one admission step admits.
const ADMIT_MAX: usize = 1000;
/// Joins copied to Postgres per round trip.
const COPY_BATCH: usize = 2000;
/// The first place of a late joiner (2^52): every early place is below it.
pub const LATE_PLACES: f64 = 4_503_599_627_370_496.0;
/// Most admissions a second a sale may set.
pub const MAX_ADMIT_PER_SECOND: i32 = 100_000;

/// A sale's waiting-room settings, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitingRoom {
    pub queue_opens_at: DateTime<Utc>,
    pub admit_per_second: i32,
}

impl WaitingRoom {
    /// The settings of a new sale (or an edit before its opening): the line opens
    /// at or before the sale, and admits 1 to 100,000 a second.
    pub fn check(
        queue_opens_at: Option<DateTime<Utc>>,
        admit_per_second: Option<i64>,
        starts_at: DateTime<Utc>,
    ) -> Result<WaitingRoom, AppError> {
        let refuse = |m: &str| Err(AppError::new(ErrorCode::InvalidWaitingRoom, m.to_string()));
        let Some(queue_opens_at) = queue_opens_at else {
            return refuse("a waiting room needs queue_opens_at (when its line opens)");
        };
        if queue_opens_at > starts_at {
            return refuse("queue_opens_at must be at or before starts_at");
        }
        let Some(rate) = admit_per_second else {
            return refuse("a waiting room needs admit_per_second (1 to 100000)");
        };
        if !(1..=i64::from(MAX_ADMIT_PER_SECOND)).contains(&rate) {
            return refuse("admit_per_second must be 1 to 100000");
        }
        Ok(WaitingRoom {
            queue_opens_at,
            admit_per_second: rate as i32,
        })
    }
}

/// The meta hash's `wr`: admissions a second, 0 without a waiting room.
pub fn rate_in_meta(row: &SaleRow) -> i32 {
    if row.waiting_room {
        row.admit_per_second.unwrap_or(1).max(1)
    } else {
        0
    }
}

/// The meta hash's `q_opens_ms`: when the line opens (the sale's start without one).
pub fn opens_ms_in_meta(row: &SaleRow) -> i64 {
    row.queue_opens_at
        .filter(|_| row.waiting_room)
        .unwrap_or(row.starts_at)
        .timestamp_millis()
}

fn ms(t: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(t)
        .single()
        .unwrap_or_else(Utc::now)
}

/// Where a shopper stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum QueueState {
    /// Not in the line.
    NotJoined,
    /// In the line, not yet admitted.
    Waiting,
    /// Admitted: the ticket buys until `expires_at`.
    Admitted,
    /// Admitted, and the admission expired unused: the room went to the next.
    Passed,
    /// Bought (the admission is used).
    Bought,
    /// Waiting, and no unit is left.
    SoldOut,
}

/// Where a shopper stands, as `lua/queue_place.lua` reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    pub state: QueueState,
    /// 1-based place in the line (0: none).
    pub position: i64,
    /// People waiting before this one; `None` before the opening (the early
    /// joiners' order is drawn then) and unless waiting.
    pub ahead: Option<i64>,
    /// When an admission ends (admitted only), Redis clock.
    pub expires_ms: Option<i64>,
    /// People not yet reached by admission.
    pub waiting: i64,
    pub now_ms: i64,
    /// The sale's opening (ms): the draw, and the first admissions.
    pub starts_ms: i64,
    /// Shoppers admitted a second.
    pub admit_per_second: i64,
}

/// Why a waiting room's script did nothing.
#[derive(Debug)]
pub enum Unavailable {
    NotLoaded,
    Recovering,
    NoWaitingRoom,
}

/// What a join (or a read) came to.
#[derive(Debug)]
pub enum Place {
    /// Where the shopper stands; `new`: this call took the place.
    Standing {
        new: bool,
        standing: Standing,
    },
    NotOpenYet {
        opens_in_ms: i64,
    },
    Ended,
    SoldOut,
    Unavailable(Unavailable),
}

/// One shopper's ask of a batch: a place (`join`) or only where it stands.
#[derive(Clone, Copy, Debug)]
pub struct Ask {
    pub user: UserId,
    pub join: bool,
}

/// `lua/queue_place.lua` for a batch of shoppers of one sale, in one call: each
/// joins (with `join`: a place, the same one again if held) and reads where it
/// stands. One answer per ask, in order.
pub async fn places<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
    asks: &[Ask],
    now_ms: Option<i64>,
) -> Result<Vec<Place>, AppError> {
    let k = keys.sale(sale);
    let mut call = QUEUE_PLACE.prepare_invoke();
    call.key(&k.meta)
        .key(&k.stock)
        .key(&k.queue)
        .key(&k.queue_state)
        .key(&k.queue_joins)
        .key(&k.queue_open)
        .key(&k.queue_admitted)
        .key(&k.buyers)
        .arg(now_ms.map(|t| t.to_string()).unwrap_or_default());
    for ask in asks {
        // The early place: uniform in [1, 2^52), exact in a double.
        let early: u64 = rand::random_range(1..(1u64 << 52));
        call.arg(ask.user.get())
            .arg(early)
            .arg(if ask.join { "1" } else { "0" });
    }
    let reply: Vec<i64> = call.invoke_async(redis).await?;
    let bad = || unexpected_reply("queue_place.lua", reply.len());
    let [now, starts, rate, waiting] = reply.first_chunk::<4>().copied().ok_or_else(bad)?;
    let rows = &reply[4..];
    if rows.len() != asks.len() * 6 {
        return Err(bad());
    }
    rows.chunks(6)
        .map(|row| {
            let &[code, value, state, position, ahead, expiry] = row else {
                return Err(bad());
            };
            Ok(match code {
                0 => {
                    let state = match state {
                        0 => QueueState::NotJoined,
                        1 => QueueState::Waiting,
                        2 => QueueState::Admitted,
                        3 => QueueState::Passed,
                        4 => QueueState::Bought,
                        5 => QueueState::SoldOut,
                        other => {
                            return Err(unexpected_reply("queue_place.lua", ("state", other)));
                        }
                    };
                    Place::Standing {
                        new: value == 1,
                        standing: Standing {
                            state,
                            position,
                            ahead: (state == QueueState::Waiting && ahead >= 0).then_some(ahead),
                            expires_ms: (state == QueueState::Admitted).then_some(expiry),
                            waiting,
                            now_ms: now,
                            starts_ms: starts,
                            admit_per_second: rate.max(1),
                        },
                    }
                }
                2 => Place::NotOpenYet { opens_in_ms: value },
                3 => Place::Ended,
                4 => Place::Unavailable(Unavailable::NotLoaded),
                5 => Place::SoldOut,
                6 => Place::Unavailable(Unavailable::Recovering),
                13 => Place::Unavailable(Unavailable::NoWaitingRoom),
                other => return Err(unexpected_reply("queue_place.lua", other)),
            })
        })
        .collect()
}

/// [`places`] for one shopper.
pub async fn place<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
    user: UserId,
    join: bool,
    now_ms: Option<i64>,
) -> Result<Place, AppError> {
    let mut one = places(redis, keys, sale, &[Ask { user, join }], now_ms).await?;
    one.pop()
        .ok_or_else(|| unexpected_reply("queue_place.lua", "no answer"))
}

/// Answers the joins and position queries of one sale in batches (see
/// [`crate::batch`]): a storm of joins at the line's opening, or of pages asking
/// where they stand, costs one script call per batch, like purchases.
pub struct QueueDecider {
    pub keys: Keys,
}

impl crate::batch::Decider for QueueDecider {
    type Key = SaleId;
    type Request = Ask;
    type Reply = Place;

    async fn decide(
        &self,
        mut redis: crate::redis_conn::Redis,
        sale: SaleId,
        batch: Vec<Ask>,
    ) -> Result<Vec<Place>, AppError> {
        places(&mut redis, &self.keys, sale, &batch, None).await
    }
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
    match code {
        0 | 2 | 3 => {}
        4 => return Ok(Err(Unavailable::NotLoaded)),
        6 => return Ok(Err(Unavailable::Recovering)),
        13 => return Ok(Err(Unavailable::NoWaitingRoom)),
        other => return Err(unexpected_reply("queue_admit.lua", other)),
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

/// A sale's line in numbers (the view, the admin page, `/metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct QueueNumbers {
    /// Places ever taken in the line.
    pub line: i64,
    /// Places the admission has reached (admitted, or skipped as admitted before).
    pub served: i64,
    /// People still waiting: `line - served`.
    pub waiting: i64,
    /// Admissions given.
    pub admitted: i64,
    /// Admissions that expired unused.
    pub passed: i64,
    /// Admissions running now (admitted, not yet bought or expired).
    pub open: i64,
}

/// Adds the reads of [`QueueNumbers`] to a pipeline (three replies).
pub fn pipe_numbers(pipe: &mut redis::Pipeline, k: &SaleKeys) {
    pipe.zcard(&k.queue)
        .cmd("HMGET")
        .arg(&k.queue_state)
        .arg(&["served", "admitted", "passed"])
        .zcard(&k.queue_open);
}

/// Reads [`QueueNumbers`] of one sale.
pub async fn numbers<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    sale: SaleId,
) -> Result<QueueNumbers, AppError> {
    let k = keys.sale(sale);
    let mut pipe = redis::pipe();
    pipe_numbers(&mut pipe, &k);
    let (line, state, open): (i64, Vec<Option<i64>>, i64) = pipe.query_async(redis).await?;
    Ok(QueueNumbers::from_replies(line, &state, open))
}

impl QueueNumbers {
    pub fn from_replies(line: i64, state: &[Option<i64>], open: i64) -> Self {
        let at = |i: usize| state.get(i).copied().flatten().unwrap_or(0);
        let served = at(0).min(line);
        QueueNumbers {
            line,
            served,
            waiting: line - served,
            admitted: at(1),
            passed: at(2),
            open,
        }
    }
}

/// Puts back what Redis lost of a sale's waiting room (called by the sale's
/// rebuild, under its row lock, before the state is trusted again). It merges,
/// never replaces: after a restart Redis still holds places and admissions newer
/// than Postgres's copy, and keeps them. From Postgres: every place it holds
/// (`ZADD NX`), every admission (nobody is admitted twice; one still running is
/// open again unless its holder bought), and, when the line's state is gone (a
/// wipe), the head after the last place admitted, with the pace starting over.
pub async fn restore<C: ConnectionLike>(
    tx: &mut sqlx::PgConnection,
    redis: &mut C,
    k: &SaleKeys,
    sale: SaleId,
    buyers: &std::collections::HashSet<i64>,
) -> Result<(), AppError> {
    let places: Vec<(i64, f64)> =
        sqlx::query_as("SELECT user_id, place FROM queue_places WHERE sale_id = $1 ORDER BY place")
            .bind(sale.get())
            .fetch_all(&mut *tx)
            .await?;
    let admissions: Vec<(i64, DateTime<Utc>)> =
        sqlx::query_as("SELECT user_id, expires_at FROM queue_admissions WHERE sale_id = $1")
            .bind(sale.get())
            .fetch_all(&mut *tx)
            .await?;
    for chunk in places.chunks(COPY_BATCH) {
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(&k.queue).arg("NX");
        for (user, place) in chunk {
            cmd.arg(format!("{place:.0}")).arg(user);
        }
        let _: i64 = cmd.query_async(redis).await?;
    }
    let now = Utc::now().timestamp_millis();
    for chunk in admissions.chunks(COPY_BATCH) {
        let mut pipe = redis::pipe();
        for (user, expires) in chunk {
            let e = expires.timestamp_millis();
            pipe.hset_nx(&k.queue_admitted, user, e).ignore();
            if e > now && !buyers.contains(user) {
                pipe.cmd("ZADD")
                    .arg(&k.queue_open)
                    .arg("NX")
                    .arg(e)
                    .arg(user)
                    .ignore();
            }
        }
        let _: () = pipe.query_async(redis).await?;
    }
    let state_kept: bool = redis::cmd("EXISTS")
        .arg(&k.queue_state)
        .query_async(redis)
        .await?;
    if state_kept {
        return Ok(());
    }
    // The head: the last place in line order whose holder was admitted.
    let admitted: std::collections::HashSet<i64> = admissions.iter().map(|(u, _)| *u).collect();
    let mut head: Option<f64> = None;
    let mut served = 0i64;
    for (i, (user, place)) in places.iter().enumerate() {
        if admitted.contains(user) {
            head = Some(*place);
            served = i as i64 + 1;
        }
    }
    let late = places
        .iter()
        .map(|(_, p)| *p)
        .filter(|p| *p >= LATE_PLACES)
        .fold(LATE_PLACES, f64::max);
    let passed = admissions
        .iter()
        .filter(|(u, e)| e.timestamp_millis() <= now && !buyers.contains(u))
        .count();
    let mut state = redis::cmd("HSET");
    state
        .arg(&k.queue_state)
        .arg("served")
        .arg(served)
        .arg("admitted")
        .arg(admissions.len())
        .arg("passed")
        .arg(passed)
        .arg("joins")
        .arg(places.len())
        .arg("seq")
        .arg(format!("{:.0}", late - LATE_PLACES))
        .arg("last_ms")
        .arg(now)
        .arg("credit")
        .arg(0);
    if let Some(h) = head {
        state.arg("head").arg(format!("{h:.0}"));
    }
    let _: i64 = state.query_async(redis).await?;
    Ok(())
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
            match rooms_soon(&db, LIST_IDLE_EVERY).await {
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
            if let Err(e) = step_once(&db, &mut redis, &keys, sale, life, &metrics).await {
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
