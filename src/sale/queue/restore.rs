//! A sale's waiting room put back from Postgres after Redis lost it.

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;

use super::admit::COPY_BATCH;
use crate::domain::SaleId;
use crate::error::AppError;
use crate::keys::SaleKeys;

/// Admissions `(user, expires ms, open)` put back into Redis, merged with what
/// it holds: each recorded as given (`HSETNX queue:admitted`: nobody admitted
/// twice) and, when `open`, running again (`ZADD NX queue:open`). A waiting
/// room's admissions and a draw's wins (`sale::draw::pass::restore`) alike.
pub async fn put_back_admissions<C: ConnectionLike>(
    redis: &mut C,
    k: &SaleKeys,
    admissions: impl IntoIterator<Item = (i64, i64, bool)>,
) -> Result<(), AppError> {
    let admissions: Vec<(i64, i64, bool)> = admissions.into_iter().collect();
    for chunk in admissions.chunks(COPY_BATCH) {
        let mut pipe = redis::pipe();
        for (user, e, open) in chunk {
            pipe.hset_nx(&k.queue_admitted, user, e).ignore();
            if *open {
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
    Ok(())
}

/// The first place of a late joiner (2^52): every early place is below it.
pub const LATE_PLACES: f64 = 4_503_599_627_370_496.0;
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
    let back = admissions.iter().map(|(user, expires)| {
        let e = expires.timestamp_millis();
        (*user, e, e > now && !buyers.contains(user))
    });
    put_back_admissions(redis, k, back).await?;
    // An admin's pause or close, as Postgres holds it (Redis may have lost it).
    super::line::write_back(tx, redis, k, sale).await?;
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
    // The admissions that ended (bought or passed), and the share of passes over
    // them, as `lua/queue_admit.lua` keeps it (over at most its last 50).
    let running = admissions
        .iter()
        .filter(|(u, e)| e.timestamp_millis() > now && !buyers.contains(u))
        .count();
    let ended = admissions.len() - running;
    let share = if ended > 0 {
        passed as f64 / ended as f64
    } else {
        0.0
    };
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
        .arg(0)
        .arg("ended")
        .arg(ended)
        .arg("pshare")
        .arg(share)
        .arg("pweight")
        .arg(ended.min(50));
    if let Some(h) = head {
        state.arg("head").arg(format!("{h:.0}"));
    }
    let _: i64 = state.query_async(redis).await?;
    Ok(())
}
