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
