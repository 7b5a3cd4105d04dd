//! Sale records: the `sales` table's SQL, the scripts that put a sale into Redis
//! (`lua/new_sale.lua`, `lua/update_meta.lua`), its live numbers, and what a purchase
//! can come to. Stock changes are in [`super::stock`], order ids in
//! [`super::orders`], the comparison of the two stores in [`super::reconcile`].

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::{Id, SaleId};
use crate::error::AppError;
use crate::keys::Keys;
use crate::lua::lua_script;

static NEW_SALE: LazyLock<crate::lua::Script> = lua_script!("new_sale.lua");
static UPDATE_META: LazyLock<crate::lua::Script> = lua_script!("update_meta.lua");

/// A sale as stored in Postgres (and, as JSON, in the view cache).
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct SaleRow {
    #[schema(value_type = i64)]
    pub id: SaleId,
    pub name: String,
    pub description: String,
    pub price_cents: i64,
    pub stock_total: i64,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub closed: bool,
    /// The picture: an `https://` address or a path on this site; none shows the
    /// placeholder. (Default: views cached before pictures existed have none.)
    #[serde(default)]
    pub image_url: Option<String>,
    /// A purchase must carry a ticket (see [`super::ticket`]); chosen at creation,
    /// never changed. No serde default: a view cached by a binary from before
    /// tickets does not parse, so it is rebuilt from Postgres instead of being read
    /// as "no ticket" (which `TicketRules` would then remember).
    pub requires_ticket: bool,
    /// Seconds a buyer has to pay (`POST /api/orders/{id}/pay`) before the order
    /// expires and its unit goes back; 0: no payment step. Fixed at creation.
    pub payment_window_s: i32,
    /// Whether a buyer whose order expired unpaid may buy again. Fixed at creation.
    pub rebuy_after_expiry: bool,
    /// Most units one buyer may hold (a purchase may ask for several: `quantity`).
    /// Fixed once the sale opens.
    pub max_per_user: i32,
    /// When an admin archived the sale: off the public lists and the home page, its
    /// page and orders still reachable by link. (Default: views cached before
    /// archiving existed are of sales not archived.)
    #[serde(default)]
    pub archived_at: Option<DateTime<Utc>>,
    /// A rehearsal (`stampede load`): fixed at creation, never on a public page or
    /// list (only admins see it), removed with its orders by
    /// [`super::rehearsal::cleanup`]. No serde default, like `requires_ticket`: a
    /// view cached before rehearsals existed is rebuilt, never read as public.
    pub rehearsal: bool,
    /// A waiting room (see [`super::queue`]): the sale sells only to shoppers
    /// admitted from its line. Fixed once the sale opens. No serde default, like
    /// `requires_ticket`: a view cached before waiting rooms existed is rebuilt.
    pub waiting_room: bool,
    /// With a waiting room: when its line opens (at or before `starts_at`).
    pub queue_opens_at: Option<DateTime<Utc>>,
    /// With a waiting room: shoppers admitted a second from the opening.
    pub admit_per_second: Option<i32>,
}

/// A sale as the API shows it: the record plus live numbers from Redis.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct SaleView {
    #[serde(flatten)]
    pub sale: SaleRow,
    pub stock_left: i64,
    pub sold: i64,
    pub status: crate::domain::SaleStatus,
    /// A sale with a waiting room: its line in numbers (an open page follows its
    /// place with `served`). Absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<super::queue::QueueNumbers>,
}

impl SaleView {
    pub fn new(sale: SaleRow, stock_left: i64, sold: i64, now: DateTime<Utc>) -> Self {
        let status = crate::domain::SaleStatus::of(
            sale.closed,
            now,
            sale.starts_at,
            sale.ends_at,
            stock_left,
        );
        SaleView {
            sale,
            stock_left,
            sold,
            status,
            line: None,
        }
    }
}

/// The columns of [`SaleRow`], as a literal so queries stay `&'static str`.
macro_rules! sale_columns {
    () => {
        "id, name, description, price_cents, stock_total, starts_at, ends_at, closed, image_url, requires_ticket, \
         payment_window_s, rebuy_after_expiry, max_per_user, archived_at, rehearsal, waiting_room, \
         queue_opens_at, admit_per_second"
    };
}
pub(crate) use sale_columns;

pub async fn fetch_sale(db: &PgPool, id: SaleId) -> Result<Option<SaleRow>, sqlx::Error> {
    sqlx::query_as::<_, SaleRow>(concat!(
        "SELECT ",
        sale_columns!(),
        " FROM sales WHERE id = $1"
    ))
    .bind(id.get())
    .fetch_optional(db)
    .await
}

/// Whether a sale of that name has not ended yet (the demo seed creates one once).
pub async fn unended_named(db: &PgPool, name: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM sales WHERE name = $1 AND ends_at > now())")
        .bind(name)
        .fetch_one(db)
        .await
}

/// A sale open now or ended in the last ten minutes, as a scrape of `/metrics`
/// reads it.
pub struct Watched {
    pub id: i64,
    /// A rehearsal (`stampede load`): its gauges say so.
    pub rehearsal: bool,
    /// Units left, when Redis holds them.
    pub stock_left: Option<i64>,
    /// Its orders accepted and not yet in Postgres (its pending hash: a stream
    /// entry carries a whole decision batch), and the stream entries settlement
    /// read and has not acknowledged (see [`crate::redis_conn::stream_backlog`]).
    pub backlog: Option<(u64, u64)>,
}

/// The sales open now or ended in the last ten minutes, with their units left and
/// their settlement backlog. Best effort: no sales when Postgres cannot answer, and
/// `None` for what Redis cannot.
pub async fn watched<C: ConnectionLike>(db: &PgPool, redis: &mut C, keys: &Keys) -> Vec<Watched> {
    let ids: Vec<(i64, bool)> = sqlx::query_as(
        "SELECT id, rehearsal FROM sales
         WHERE starts_at <= now() AND ends_at > now() - interval '10 minutes'",
    )
    .fetch_all(db)
    .await
    .unwrap_or_default();
    let mut watched = Vec::with_capacity(ids.len());
    for (id, rehearsal) in ids {
        let Some(sale) = Id::new(id) else {
            continue;
        };
        let k = keys.sale(sale);
        let left: redis::RedisResult<Option<i64>> =
            redis::cmd("GET").arg(&k.stock).query_async(redis).await;
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

/// Up to `limit` sales, latest start first: `stampede reconcile` walks them all.
pub async fn list_sales(db: &PgPool, limit: i64) -> Result<Vec<SaleRow>, sqlx::Error> {
    sqlx::query_as::<_, SaleRow>(concat!(
        "SELECT ",
        sale_columns!(),
        " FROM sales ORDER BY starts_at DESC, id DESC LIMIT $1"
    ))
    .bind(limit)
    .fetch_all(db)
    .await
}

/// The order of every sale list (`GET /api/sales`, the admin's, the pages): by
/// [`list_rank`] as of one moment (the first page's, carried by the cursor, so a
/// walk through the pages sees one order even as sales open and end meanwhile);
/// upcoming sales soonest opening first, the others latest start first; the id
/// (highest first) breaks ties. Live and sold-out sales share a rank: which one a
/// sale is, only Redis knows.
///
/// Keyset paging: a page reads the sales after the cursor's key, never an offset.
/// The rank depends on the clock, so no index serves this order; sorting the whole
/// table (thousands of rows) for a page costs about a millisecond.
///
/// Rehearsals are in it only when `rehearsals` (the admin's lists): a public list
/// never holds one, filtered here, before the cache stores the first page.
pub async fn list_page(
    db: &PgPool,
    at: DateTime<Utc>,
    after: Option<&SaleCursor>,
    limit: i64,
    scope: crate::paging::ListScope,
) -> Result<Vec<SaleRow>, sqlx::Error> {
    sqlx::query_as::<_, SaleRow>(concat!(
        "SELECT ",
        sale_columns!(),
        " FROM (SELECT ",
        sale_columns!(),
        ", CASE WHEN closed THEN 3 WHEN ends_at <= $1 THEN 2 WHEN starts_at > $1 THEN 1 ELSE 0 END
                  AS list_rank
            FROM sales) s
         WHERE ($2::int2 IS NULL
            OR list_rank > $2
            OR (list_rank = $2 AND CASE WHEN $2 = 1
                  THEN (starts_at, -id) > ($3::timestamptz, -$4::int8)
                  ELSE (starts_at, id) < ($3::timestamptz, $4::int8) END))
           AND CASE $6::text
                 WHEN 'archived' THEN archived_at IS NOT NULL
                 WHEN 'live' THEN archived_at IS NULL AND list_rank = 0
                 WHEN 'upcoming' THEN archived_at IS NULL AND list_rank = 1
                 WHEN 'ended' THEN archived_at IS NULL AND list_rank >= 2
                 WHEN 'public' THEN archived_at IS NULL AND NOT rehearsal
                 ELSE archived_at IS NULL END
         ORDER BY list_rank, CASE WHEN list_rank = 1 THEN starts_at END ASC, starts_at DESC, id DESC
         LIMIT $5"
    ))
    .bind(at)
    .bind(after.map(|c| c.rank))
    .bind(after.map(|c| c.starts_at))
    .bind(after.map(|c| c.id))
    .bind(limit)
    .bind(scope.as_str())
    .fetch_all(db)
    .await
}

/// A sale's place in the list order at `at` (the `list_rank` of [`list_page`]'s
/// SQL, which this must match): 0 open (live or sold out), 1 upcoming, 2 ended,
/// 3 closed early.
pub fn list_rank(sale: &SaleRow, at: DateTime<Utc>) -> i16 {
    if sale.closed {
        3
    } else if sale.ends_at <= at {
        2
    } else if sale.starts_at > at {
        1
    } else {
        0
    }
}

/// Where the next page of a sale list starts: the moment the walk's order is taken
/// at, and the sort key of the last sale shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaleCursor {
    pub at: DateTime<Utc>,
    pub rank: i16,
    pub starts_at: DateTime<Utc>,
    pub id: i64,
}

impl SaleCursor {
    const TAG: &'static str = "s1";

    /// The cursor after `last`, in the order taken at `at`.
    pub fn after(last: &SaleRow, at: DateTime<Utc>) -> Self {
        SaleCursor {
            at,
            rank: list_rank(last, at),
            starts_at: last.starts_at,
            id: last.id.get(),
        }
    }

    pub fn encode(&self) -> String {
        crate::paging::encode_cursor(
            Self::TAG,
            &[
                self.at.timestamp_micros(),
                i64::from(self.rank),
                self.starts_at.timestamp_micros(),
                self.id,
            ],
        )
    }

    /// A cursor of a sale list; anything else is a 400 `invalid_query`.
    pub fn parse(raw: &str) -> Result<Self, AppError> {
        let [at, rank, starts_at, id] = crate::paging::decode_cursor::<4>(Self::TAG, raw)?;
        let time = |us| {
            DateTime::from_timestamp_micros(us)
                .ok_or_else(|| crate::paging::bad_cursor("a time out of range"))
        };
        let rank = i16::try_from(rank)
            .ok()
            .filter(|r| (0..=3).contains(r))
            .ok_or_else(|| crate::paging::bad_cursor("an unknown rank"))?;
        if id < 1 {
            return Err(crate::paging::bad_cursor("an id that is not positive"));
        }
        Ok(SaleCursor {
            at: time(at)?,
            rank,
            starts_at: time(starts_at)?,
            id,
        })
    }
}

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
    /// A waiting room, checked (see [`super::queue::WaitingRoom::check`]); the sale
    /// then requires a ticket (an admission is one).
    pub waiting_room: Option<super::queue::WaitingRoom>,
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
    let mut tx = db.begin().await?;
    let row = sqlx::query_as::<_, SaleRow>(concat!(
        "INSERT INTO sales (name, description, price_cents, stock_total, starts_at, ends_at, image_url,
                            requires_ticket, payment_window_s, rebuy_after_expiry, max_per_user, rehearsal,
                            waiting_room, queue_opens_at, admit_per_second)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) RETURNING ",
        sale_columns!()
    ))
    .bind(&new.name)
    .bind(&new.description)
    .bind(new.price_cents)
    .bind(new.stock)
    .bind(new.starts_at)
    .bind(new.ends_at)
    .bind(&new.image_url)
    .bind(new.requires_ticket || new.waiting_room.is_some())
    .bind(new.payment_window_s)
    .bind(new.rebuy_after_expiry)
    .bind(new.max_per_user)
    .bind(new.rehearsal)
    .bind(new.waiting_room.is_some())
    .bind(new.waiting_room.map(|w| w.queue_opens_at))
    .bind(new.waiting_room.map(|w| w.admit_per_second))
    .fetch_one(&mut *tx)
    .await?;
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
        .arg(row.starts_at.timestamp_millis())
        .arg(row.ends_at.timestamp_millis())
        .arg(u8::from(row.closed))
        .arg(row.stock_total)
        .arg(row.max_per_user)
        .arg(super::queue::rate_in_meta(row))
        .arg(super::queue::opens_ms_in_meta(row))
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
    let written: i64 = UPDATE_META
        .key(&k.meta)
        .arg("starts_ms")
        .arg(sale.starts_at.timestamp_millis())
        .arg("ends_ms")
        .arg(sale.ends_at.timestamp_millis())
        .arg("closed")
        .arg(u8::from(sale.closed))
        .invoke_async(redis)
        .await?;
    Ok(written == 1)
}

/// Live units left and units sold of each sale, in one pipelined round trip.
pub async fn live_numbers<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    ids: &[i64],
) -> Result<Vec<(i64, i64)>, AppError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for &id in ids {
        let k =
            keys.sale(Id::new(id).ok_or_else(|| AppError::Internal(anyhow::anyhow!("bad id")))?);
        pipe.get(&k.stock).scard(&k.buyers).get(&k.sold);
    }
    let flat: Vec<Option<i64>> = pipe.query_async(redis).await?;
    // Units sold: the counter of a sale of more than one per customer, else buyers.
    Ok(flat
        .chunks(3)
        .map(|n| (n[0].unwrap_or(0), n[2].or(n[1]).unwrap_or(0)))
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
        .map(|(row, (left, sold))| SaleView::new(row, left, sold, now))
        .collect();
    // The waiting rooms' lines, in one more round trip when there are any.
    let with_line: Vec<usize> = (0..views.len())
        .filter(|&i| views[i].sale.waiting_room)
        .collect();
    if !with_line.is_empty() {
        let mut pipe = redis::pipe();
        for &i in &with_line {
            super::queue::pipe_numbers(&mut pipe, &keys.sale(views[i].sale.id));
        }
        let replies: Vec<redis::Value> = pipe.query_async(redis).await?;
        for (n, &i) in with_line.iter().enumerate() {
            let at = |j: usize| replies.get(n * 3 + j).cloned().unwrap_or(redis::Value::Nil);
            let line: i64 = redis::from_redis_value(at(0)).unwrap_or(0);
            let state: Vec<Option<i64>> = redis::from_redis_value(at(1)).unwrap_or_default();
            let open: i64 = redis::from_redis_value(at(2)).unwrap_or(0);
            views[i].line = Some(super::queue::QueueNumbers::from_replies(line, &state, open));
        }
    }
    Ok(views)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurchaseOutcome {
    Accepted {
        order_id: Uuid,
        stock_left: i64,
    },
    AlreadyBought,
    NotStarted {
        starts_in_ms: i64,
    },
    Ended,
    UnknownSale,
    SoldOut,
    /// Redis does not hold this sale: unknown, or lost (wiped). Postgres decides which.
    NotLoaded,
    /// Redis holds the sale but this Redis run has not verified it (a restart may have
    /// lost writes), or a rebuild is in progress: rebuild before deciding.
    Recovering,
    /// A policy of the buy route refused; nothing was counted or consumed.
    RateLimited {
        retry_after_ms: u64,
    },
    /// A token-bucket policy costs more than it can ever hold.
    RateLimitUnsatisfiable,
    /// The units asked for would take the buyer past the sale's `max_per_user`;
    /// nothing taken. `held`: units the buyer holds already.
    OverPerUserCap {
        held: i64,
    },
    /// Fewer units left than asked for (but some): nothing taken.
    NotEnoughLeft {
        left: i64,
    },
    /// The idempotency key was first used with another quantity: nothing decided.
    KeyReused {
        quantity: i64,
    },
    /// A sale with a waiting room: the buyer holds no admission, or it expired.
    NotAdmitted,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_follows_time_and_stock() {
        let now = Utc::now();
        let row = |closed| SaleRow {
            id: Id::new(1).unwrap(),
            name: "x".into(),
            description: String::new(),
            price_cents: 1,
            stock_total: 10,
            starts_at: now - chrono::Duration::minutes(1),
            ends_at: now + chrono::Duration::minutes(1),
            closed,
            image_url: None,
            requires_ticket: false,
            payment_window_s: 0,
            rebuy_after_expiry: false,
            max_per_user: 1,
            archived_at: None,
            rehearsal: false,
            waiting_room: false,
            queue_opens_at: None,
            admit_per_second: None,
        };
        assert_eq!(SaleView::new(row(false), 5, 5, now).status, "live");
        assert_eq!(SaleView::new(row(false), 0, 10, now).status, "sold_out");
        assert_eq!(SaleView::new(row(true), 5, 5, now).status, "closed");
        assert_eq!(
            SaleView::new(row(false), 5, 5, now + chrono::Duration::minutes(2)).status,
            "ended"
        );
        assert_eq!(
            SaleView::new(row(false), 5, 5, now - chrono::Duration::minutes(2)).status,
            "upcoming"
        );
    }

    #[test]
    fn list_rank_groups_open_upcoming_ended_closed() {
        let now = Utc::now();
        let minute = chrono::Duration::minutes(1);
        let row = |starts_at, ends_at, closed| SaleRow {
            id: Id::new(1).unwrap(),
            name: "x".into(),
            description: String::new(),
            price_cents: 1,
            stock_total: 0,
            starts_at,
            ends_at,
            closed,
            image_url: None,
            requires_ticket: false,
            payment_window_s: 0,
            rebuy_after_expiry: false,
            max_per_user: 1,
            archived_at: None,
            rehearsal: false,
            waiting_room: false,
            queue_opens_at: None,
            admit_per_second: None,
        };
        // Sold out (stock 0) is open: only Redis knows stock.
        assert_eq!(list_rank(&row(now - minute, now + minute, false), now), 0);
        assert_eq!(
            list_rank(&row(now, now + minute, false), now),
            0,
            "opens now"
        );
        assert_eq!(
            list_rank(&row(now + minute, now + minute * 2, false), now),
            1
        );
        assert_eq!(
            list_rank(&row(now - minute * 2, now, false), now),
            2,
            "ends now"
        );
        assert_eq!(
            list_rank(&row(now + minute, now + minute * 2, true), now),
            3
        );
    }

    #[test]
    fn sale_cursors_round_trip_and_refuse_bad_fields() {
        let at = crate::paging::list_moment();
        let cursor = SaleCursor {
            at,
            rank: 1,
            starts_at: at + chrono::Duration::hours(1),
            id: 42,
        };
        assert_eq!(SaleCursor::parse(&cursor.encode()).unwrap(), cursor);
        let at_us = at.timestamp_micros();
        for fields in [
            [at_us, 4, at_us, 1],
            [at_us, -1, at_us, 1],
            [at_us, 0, at_us, 0],
            [i64::MAX, 0, at_us, 1],
        ] {
            let raw = crate::paging::encode_cursor("s1", &fields);
            assert_eq!(SaleCursor::parse(&raw).unwrap_err().code(), "invalid_query");
        }
    }
}
