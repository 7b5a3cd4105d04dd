//! A sale's live numbers from Redis: units left and sold for the views
//! ([`live_numbers`], [`views`]) and what `/metrics` shows of open sales
//! ([`watched`]).

use chrono::Utc;
use redis::aio::ConnectionLike;
use sqlx::PgPool;

use super::record::{SaleRow, SaleView};
use crate::domain::Id;
use crate::error::AppError;
use crate::keys::Keys;

/// A sale open now or ended in the last ten minutes, as a scrape of `/metrics`
/// reads it.
pub struct Watched {
    pub id: i64,
    /// A rehearsal (`stampede load`): its gauges say so.
    pub rehearsal: bool,
    /// Units left, when the sale is live and Redis holds them.
    pub stock_left: Option<i64>,
    /// Its orders accepted and not yet in Postgres (its pending hash: a stream
    /// entry carries a whole decision batch), and the stream entries settlement
    /// read and has not acknowledged (see [`crate::redis_conn::stream_backlog`]).
    pub backlog: Option<(u64, u64)>,
}

/// The sales open now or ended in the last ten minutes, `(id, rehearsal, live)`:
/// those [`watched`] reads. `live`: open and not closed early, the only sales
/// whose units left are shown (a sale closed early, its end perhaps days away,
/// would otherwise show units left that nobody can buy, for StampedeStockStuck to
/// read as buyers turned away).
pub async fn watched_ids(db: &PgPool) -> Result<Vec<(i64, bool, bool)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, rehearsal, NOT closed AND ends_at > now() FROM sales
         WHERE starts_at <= now() AND ends_at > now() - interval '10 minutes'",
    )
    .fetch_all(db)
    .await
}

/// These sales' units left and settlement backlog. Best effort: `None` for what
/// Redis cannot answer.
pub async fn watched<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    ids: &[(i64, bool, bool)],
) -> Vec<Watched> {
    let mut watched = Vec::with_capacity(ids.len());
    for &(id, rehearsal, live) in ids {
        let Some(sale) = Id::new(id) else {
            continue;
        };
        let k = keys.sale(sale);
        let left: redis::RedisResult<Option<i64>> = if live {
            redis::cmd("GET").arg(&k.stock).query_async(redis).await
        } else {
            Ok(None)
        };
        let orders: Result<u64, AppError> = super::pending::count(redis, keys, sale)
            .await
            .map(|n| u64::try_from(n).unwrap_or(0));
        let backlog =
            crate::redis_conn::stream_backlog(redis, &k.orders, crate::settle::SETTLE_GROUP)
                .await
                .and_then(|(_, delivered)| Some((orders.ok()?, delivered)));
        watched.push(Watched {
            id,
            rehearsal,
            stock_left: left.ok().flatten(),
            backlog,
        });
    }
    watched
}

/// Live units left (`None`: Redis does not hold the sale) and units in the
/// buyers' hands (returned units whose buyer may not buy again included: what the
/// stock arithmetic counts) of each sale, in one pipelined round trip.
pub async fn live_numbers<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    ids: &[i64],
) -> Result<Vec<(Option<i64>, i64)>, AppError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for &id in ids {
        let k =
            keys.sale(Id::new(id).ok_or_else(|| AppError::Internal(anyhow::anyhow!("bad id")))?);
        pipe.get(&k.stock).hlen(&k.buyers).get(&k.sold);
    }
    let flat: Vec<Option<i64>> = pipe.query_async(redis).await?;
    // Units sold: the counter of a sale of more than one per customer, else buyers.
    Ok(flat
        .chunks(3)
        .map(|n| (n[0], n[2].or(n[1]).unwrap_or(0)))
        .collect())
}

pub async fn views<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    rows: Vec<SaleRow>,
) -> Result<Vec<SaleView>, AppError> {
    let ids: Vec<i64> = rows.iter().map(|s| s.id.get()).collect();
    let numbers = live_numbers(redis, keys, &ids).await?;
    let now = Utc::now();
    let mut views: Vec<SaleView> = rows
        .into_iter()
        .zip(numbers)
        .map(|(row, (left, _))| SaleView::new(row, left, now))
        .collect();
    // The waiting rooms' lines, in one more round trip when there are any.
    let with_line: Vec<usize> = (0..views.len())
        .filter(|&i| views[i].sale.waiting_room)
        .collect();
    if !with_line.is_empty() {
        let mut pipe = redis::pipe();
        for &i in &with_line {
            super::queue::numbers::pipe_numbers(&mut pipe, &keys.sale(views[i].sale.id));
        }
        let replies: Vec<redis::Value> = pipe.query_async(redis).await?;
        let per = super::queue::numbers::REPLIES;
        for (n, &i) in with_line.iter().enumerate() {
            let replies = replies.get(n * per..(n + 1) * per).unwrap_or_default();
            views[i].line = Some(super::queue::numbers::QueueNumbers::from_replies(replies));
        }
    }
    Ok(views)
}
