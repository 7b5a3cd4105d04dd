//! A sale's line in numbers (the view, the admin page, `/metrics`).

use redis::aio::ConnectionLike;
use serde::Serialize;

use crate::domain::SaleId;
use crate::error::AppError;
use crate::keys::{Keys, SaleKeys};

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
    /// An admin paused admissions (`POST /api/admin/sales/{id}/line`): nobody is
    /// let in until resumed; places are kept.
    pub paused: bool,
    /// An admin closed the line to new joins; those in it keep their places.
    pub joins_closed: bool,
}

/// Replies [`pipe_numbers`] adds to a pipeline.
pub const REPLIES: usize = 4;

/// Adds the reads of [`QueueNumbers`] to a pipeline ([`REPLIES`] replies).
pub fn pipe_numbers(pipe: &mut redis::Pipeline, k: &SaleKeys) {
    pipe.zcard(&k.queue)
        .cmd("HMGET")
        .arg(&k.queue_state)
        .arg(&["served", "admitted", "passed"])
        .zcard(&k.queue_open)
        .cmd("HMGET")
        .arg(&k.meta)
        .arg(&["q_paused", "q_closed"]);
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
    let replies: Vec<redis::Value> = pipe.query_async(redis).await?;
    Ok(QueueNumbers::from_replies(&replies))
}

impl QueueNumbers {
    /// The numbers from the [`REPLIES`] replies of [`pipe_numbers`] (missing or
    /// unreadable ones count as none).
    pub fn from_replies(replies: &[redis::Value]) -> Self {
        let at = |j: usize| replies.get(j).cloned().unwrap_or(redis::Value::Nil);
        let line: i64 = redis::from_redis_value(at(0)).unwrap_or(0);
        let state: Vec<Option<i64>> = redis::from_redis_value(at(1)).unwrap_or_default();
        let open: i64 = redis::from_redis_value(at(2)).unwrap_or(0);
        let flags: Vec<Option<i64>> = redis::from_redis_value(at(3)).unwrap_or_default();
        let of = |v: &[Option<i64>], i: usize| v.get(i).copied().flatten().unwrap_or(0);
        let served = of(&state, 0).min(line);
        QueueNumbers {
            line,
            served,
            waiting: line - served,
            admitted: of(&state, 1),
            passed: of(&state, 2),
            open,
            paused: of(&flags, 0) == 1,
            joins_closed: of(&flags, 1) == 1,
        }
    }
}
