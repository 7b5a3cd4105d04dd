//! Orders: their ids (UUIDv8 that carry their sale's id, so an order can be found in
//! its sale's pending hash before it reaches Postgres), the SQL that reads the
//! settled ones, and a buyer's orders with the units still pending (see
//! [`super::pending`]).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::pending;
use super::store::SaleView;
use crate::cache::CachedReads;
use crate::domain::{Id, SaleId, UserId};
use crate::error::AppError;
use crate::paging::Limit;

/// Where a settled order stands: the `orders.status` column. Postgres writes
/// `accepted` or `awaiting_payment` at settlement, `paid` and `expired` later; a
/// value this version does not know fails the read (an error, never a guess).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    /// The sale has no payment step: the order is complete.
    Accepted,
    AwaitingPayment,
    Paid,
    /// Not paid in time: its units went back on sale.
    Expired,
    /// Cancelled by the buyer (unpaid) or an admin: its units went back on sale.
    Cancelled,
    /// A paid order an admin cancelled: the payment was refunded and its units went
    /// back on sale.
    Refunded,
}

impl OrderStatus {
    pub const ALL: [OrderStatus; 6] = [
        OrderStatus::Accepted,
        OrderStatus::AwaitingPayment,
        OrderStatus::Paid,
        OrderStatus::Expired,
        OrderStatus::Cancelled,
        OrderStatus::Refunded,
    ];

    /// The statuses whose units went back on sale (in SQL: `status IN ('expired',
    /// 'cancelled', 'refunded')`).
    pub fn returned(self) -> bool {
        matches!(
            self,
            OrderStatus::Expired | OrderStatus::Cancelled | OrderStatus::Refunded
        )
    }

    /// The column's text.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Accepted => "accepted",
            OrderStatus::AwaitingPayment => "awaiting_payment",
            OrderStatus::Paid => "paid",
            OrderStatus::Expired => "expired",
            OrderStatus::Cancelled => "cancelled",
            OrderStatus::Refunded => "refunded",
        }
    }

    pub fn parse(text: &str) -> Option<OrderStatus> {
        OrderStatus::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

impl sqlx::Type<sqlx::Postgres> for OrderStatus {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <&str as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for OrderStatus {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let text = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
        OrderStatus::parse(text).ok_or_else(|| format!("unknown order status {text:?}").into())
    }
}

/// A settled order, as Postgres holds it.
#[derive(Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct OrderRow {
    pub id: Uuid,
    pub sale_id: i64,
    pub user_id: i64,
    pub accepted_at: DateTime<Utc>,
    pub settled_at: DateTime<Utc>,
    pub status: OrderStatus,
    /// The payment deadline (sales with a payment window).
    pub pay_by: Option<DateTime<Utc>>,
    pub paid_at: Option<DateTime<Utc>>,
    /// Units bought.
    pub quantity: i32,
}

/// A settled order of the caller, with its sale's name and price.
#[derive(Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct MyOrder {
    pub id: Uuid,
    pub sale_id: i64,
    pub sale_name: String,
    // The price of one unit (the page multiplies it by the quantity).
    pub price_cents: i64,
    pub accepted_at: DateTime<Utc>,
    pub settled_at: DateTime<Utc>,
    pub status: OrderStatus,
    pub pay_by: Option<DateTime<Utc>>,
    pub paid_at: Option<DateTime<Utc>>,
    pub quantity: i32,
    /// `pay_by <= now()` by Postgres's clock, as the payment decides it (the page
    /// shows it; the API answers `pay_by`).
    #[serde(skip)]
    pub overdue: bool,
}

/// The columns of [`OrderRow`], as a literal so queries stay `&'static str`.
macro_rules! order_columns {
    () => {
        "id, sale_id, user_id, accepted_at, settled_at, status, pay_by, paid_at, quantity"
    };
}

/// The settled order with this id.
pub async fn find(db: &PgPool, id: Uuid) -> sqlx::Result<Option<OrderRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        order_columns!(),
        " FROM orders WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(db)
    .await
}

/// A user's settled orders, newest first (at most 500).
pub async fn of_user(db: &PgPool, user: UserId) -> sqlx::Result<Vec<MyOrder>> {
    sqlx::query_as(
        "SELECT o.id, o.sale_id, s.name AS sale_name, s.price_cents, o.accepted_at, o.settled_at,
                o.status, o.pay_by, o.paid_at, o.quantity,
                COALESCE(o.pay_by <= now(), false) AS overdue
         FROM orders o JOIN sales s ON s.id = o.sale_id
         WHERE o.user_id = $1 ORDER BY o.accepted_at DESC LIMIT 500",
    )
    .bind(user.get())
    .fetch_all(db)
    .await
}

/// Units a buyer holds of a sale whose order has not settled yet.
pub struct PendingUnits {
    pub sale_id: i64,
    pub sale_name: String,
    pub units: i32,
    /// What the units cost together.
    pub price_cents: i64,
}

/// A buyer's orders: the pending units first, then the settled orders (as
/// [`of_user`]).
pub struct MyOrders {
    pub pending: Vec<PendingUnits>,
    pub settled: Vec<MyOrder>,
}

/// Sales whose buyers set is asked about the buyer (pending orders): the list's
/// cached first page, where open sales, the only ones taking orders, come first.
/// (A pending order lives until settlement, a moment; one of a sale past this page
/// shows once settled.)
const PENDING_SCAN: Limit = super::cached::FIRST_PAGE_CACHED;

/// The buyer's settled orders ([`of_user`]) and the units they hold whose order
/// has not settled yet: of a sale of the list's first page, whose buyers include
/// them, when no settled order of theirs holds a unit of it.
pub async fn of_user_with_pending<S: CachedReads + ?Sized>(
    reads: &S,
    user: UserId,
) -> Result<MyOrders, AppError> {
    let sales = super::cached::load_page(reads, None, PENDING_SCAN)
        .await?
        .items;
    // Redis before Postgres: an order that settles in between shows as confirmed.
    let asked: Vec<(SaleId, i32)> = sales
        .iter()
        .map(|s| {
            let id = s.sale.id;
            (id, s.sale.max_per_user)
        })
        .collect();
    let bought = pending::bought_of(&mut reads.redis().clone(), reads.keys(), &asked, user).await?;
    let settled = of_user(reads.db(), user).await?;
    // A buyer stays in the sale's buyers set while an order holds the unit; an
    // expired order holds it no more when the sale lets its buyer buy again (the
    // buyer left the set, and is in it again only for a new, maybe pending, order).
    let holds = |sale: &SaleView| {
        settled.iter().any(|o| {
            o.sale_id == sale.sale.id.get()
                && (!o.status.returned() || !sale.sale.rebuy_after_expiry)
        })
    };
    let pending = sales
        .iter()
        .zip(bought)
        .filter(|(sale, (bought, _))| *bought && !holds(sale))
        // No settled order holds a unit of the sale: the units held are all pending.
        .map(|(sale, (_, held))| PendingUnits {
            sale_id: sale.sale.id.get(),
            sale_name: sale.sale.name.clone(),
            units: held,
            price_cents: sale.sale.price_cents * i64::from(held),
        })
        .collect();
    Ok(MyOrders { pending, settled })
}

/// Most settled orders of one buyer [`of_buyers_in_sale`] names.
const BUYER_ORDERS: i64 = 100;

/// How long a process remembers what a buyer holds of a sale (see [`HeldOrders`]).
pub const HELD_ORDERS_TTL: std::time::Duration = std::time::Duration::from_secs(10);
/// Most (sale, buyer) pairs a process remembers (about 100 bytes each); past
/// that it starts over.
pub const HELD_ORDERS_MAX: usize = 65_536;
/// How long an `already_bought` waits for the buyer's orders before it answers
/// without them: the refusal never waits on a slow Postgres.
pub const HELD_ORDERS_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// What buyers hold of a sale, as the `already_bought` answer names it, in this
/// process's memory for [`HELD_ORDERS_TTL`]: a storm of repeat buyers (tens of
/// thousands of refusals a second) costs one Postgres read per buyer and sale
/// every ten seconds, not one per refusal. Only a settled order that still holds
/// its units is remembered (a pending one settles in a moment; a cancel may show
/// for up to the TTL).
#[derive(Default)]
pub struct HeldOrders {
    known: std::sync::Mutex<std::collections::HashMap<(SaleId, UserId), Remembered>>,
}

/// When a buyer's orders were read, and what they were.
type Remembered = (std::time::Instant, Vec<Uuid>);

impl HeldOrders {
    fn get(&self, sale: SaleId, user: UserId) -> Option<Vec<Uuid>> {
        let known = self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        known
            .get(&(sale, user))
            .filter(|(at, _)| at.elapsed() < HELD_ORDERS_TTL)
            .map(|(_, ids)| ids.clone())
    }

    fn remember(&self, sale: SaleId, user: UserId, ids: &[Uuid]) {
        let mut known = self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if known.len() >= HELD_ORDERS_MAX {
            known.clear();
        }
        known.insert((sale, user), (std::time::Instant::now(), ids.to_vec()));
    }
}

/// [`HeldReader`] through this process's memory ([`HeldOrders`]), waiting at most
/// [`HELD_ORDERS_WAIT`]: `None` when the orders could not be read in time
/// (Postgres or Redis slow or down, or the read's queue long), so the refusal goes
/// out without them.
pub async fn held_by(
    memory: &HeldOrders,
    reader: &std::sync::Arc<crate::batch::Batcher<HeldReader>>,
    sale: SaleId,
    user: UserId,
) -> Option<Vec<Uuid>> {
    if let Some(ids) = memory.get(sale, user) {
        return Some(ids);
    }
    match tokio::time::timeout(HELD_ORDERS_WAIT, reader.submit(sale, user)).await {
        Ok(Ok(Some(held))) => {
            if held.settled_holds {
                memory.remember(sale, user, &held.ids);
            }
            Some(held.ids)
        }
        _ => None,
    }
}

/// Most buyers of one sale whose orders one read asks for.
pub const HELD_READ_MAX: usize = 256;
/// Most reads of one sale's buyers' orders out at once, per HTTP worker.
pub const HELD_READS_IN_FLIGHT: usize = 2;

/// Reads what buyers hold of a sale for their `already_bought` answers in
/// batches (see [`crate::batch`]): the refusals of one sale that wait together
/// are one Postgres query, not one each. A storm of repeat buyers' first
/// refusals (each buyer's first in [`HELD_ORDERS_TTL`]) would otherwise be a
/// query per refusal, which costs the machine about as much as ten refusals. A
/// refusal that stopped waiting is left out of the next read
/// ([`crate::batch::Decider::DROP_ABANDONED`]), and a read takes at most
/// [`HELD_ORDERS_WAIT`], so while Postgres is slow the queue holds at most what
/// arrives in about that time.
pub struct HeldReader {
    pub db: PgPool,
    /// The process's shared connection, not the worker's: a long `XRANGE` reply
    /// never holds up the decisions on the worker's connection.
    pub redis: crate::redis_conn::Redis,
    pub keys: crate::keys::Keys,
}

/// A buyer's orders of one sale, as [`of_buyers_in_sale`] found them.
#[derive(Clone, Debug, PartialEq)]
pub struct Held {
    /// Settled (any status) or pending, oldest first.
    pub ids: Vec<Uuid>,
    /// A settled order among them still holds its units: the answer stays true
    /// until a cancel, so it may be remembered.
    pub settled_holds: bool,
}

impl crate::batch::Decider for HeldReader {
    type Key = SaleId;
    type Request = UserId;
    /// `None`: not read in time, or the read failed (the refusal goes without).
    type Reply = Option<Held>;
    const DROP_ABANDONED: bool = true;

    async fn decide(
        &self,
        _worker_redis: crate::redis_conn::Redis,
        sale: SaleId,
        users: Vec<UserId>,
    ) -> Result<Vec<Option<Held>>, AppError> {
        let deadline = tokio::time::Instant::now() + HELD_ORDERS_WAIT;
        let mut redis = self.redis.clone();
        Ok(of_buyers_in_sale(&self.db, &mut redis, &self.keys, sale, &users, deadline).await)
    }
}

/// Each buyer's orders of one sale, settled (any status) or pending, oldest first
/// (at most [`BUYER_ORDERS`] settled ones): what `already_bought` names. A refusal,
/// so it reads off the hot path, bounded, for a batch of buyers at once: their
/// settled orders (one query); for those of them none of whose orders holds its
/// units (none, or all expired or cancelled), also the pending ones (one `XRANGE`
/// of at most [`pending::BUYER_SCAN`] entries), and for those with none pending,
/// Postgres again (an order settled between the two reads). One answer per buyer
/// asked for, in order (a buyer asked twice is read once): `None` for a buyer whose
/// reads failed or were not done by `deadline` (a buyer whose settled order holds
/// is answered by the first query alone, whatever the later reads do).
pub async fn of_buyers_in_sale<C: redis::aio::ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &crate::keys::Keys,
    sale: SaleId,
    users: &[UserId],
    deadline: tokio::time::Instant,
) -> Vec<Option<Held>> {
    let mut distinct: Vec<i64> = users.iter().map(|u| u.get()).collect();
    distinct.sort_unstable();
    distinct.dedup();
    let Some(settled) = by_deadline(deadline, sale, settled_of_buyers(db, sale, &distinct)).await
    else {
        return vec![None; users.len()];
    };
    let holds = |found: Option<&Vec<(Uuid, bool)>>| {
        found.is_some_and(|f| f.iter().any(|(_, returned)| !returned))
    };
    let unsure: Vec<i64> = distinct
        .iter()
        .copied()
        .filter(|u| !holds(settled.get(u)))
        .collect();
    // The pending orders of those, and their settled ones read again where none is.
    let later = async {
        if unsure.is_empty() {
            return Ok(Default::default());
        }
        let pending = pending::of_buyers(redis, keys, sale, &unsure).await?;
        let again: Vec<i64> = unsure
            .iter()
            .copied()
            .filter(|u| pending.get(u).is_none_or(Vec::is_empty))
            .collect();
        let reread = if again.is_empty() {
            Default::default()
        } else {
            settled_of_buyers(db, sale, &again).await?
        };
        Ok::<_, AppError>((pending, reread))
    };
    let later = by_deadline(deadline, sale, later).await;
    let ids_of = |found: Option<&Vec<(Uuid, bool)>>| -> Vec<Uuid> {
        found.into_iter().flatten().map(|(id, _)| *id).collect()
    };
    users
        .iter()
        .map(|user| {
            let u = user.get();
            if holds(settled.get(&u)) {
                return Some(Held {
                    ids: ids_of(settled.get(&u)),
                    settled_holds: true,
                });
            }
            let (pending, reread) = later.as_ref()?;
            let pending = pending.get(&u).map(Vec::as_slice).unwrap_or_default();
            // No pending order: Postgres's second answer (an order may have settled
            // between the reads; it holds then).
            let found = if pending.is_empty() {
                reread.get(&u)
            } else {
                settled.get(&u)
            };
            let mut ids = ids_of(found);
            for id in pending {
                if !ids.contains(id) {
                    ids.push(*id);
                }
            }
            Some(Held {
                ids,
                settled_holds: holds(found),
            })
        })
        .collect()
}

/// A read of [`of_buyers_in_sale`] done by `deadline`, or `None` (it failed or took
/// too long: the refusals it was for go without their orders).
async fn by_deadline<T, E: std::fmt::Debug>(
    deadline: tokio::time::Instant,
    sale: SaleId,
    read: impl std::future::Future<Output = Result<T, E>>,
) -> Option<T> {
    match tokio::time::timeout_at(deadline, read).await {
        Ok(Ok(found)) => return Some(found),
        Ok(Err(e)) => {
            tracing::debug!(sale = %sale, error = ?e, "already_bought without its orders")
        }
        Err(_) => {
            tracing::debug!(sale = %sale, "already_bought without its orders: not read in time")
        }
    }
    None
}

/// Each buyer's settled orders of the sale, oldest first, at most [`BUYER_ORDERS`]
/// each, with whether each was returned (expired, cancelled or refunded): one
/// query for them all, each buyer's through the `(user_id)` index. A buyer
/// without any is absent.
async fn settled_of_buyers(
    db: &PgPool,
    sale: SaleId,
    users: &[i64],
) -> sqlx::Result<std::collections::HashMap<i64, Vec<(Uuid, bool)>>> {
    let rows: Vec<(i64, Uuid, bool)> = sqlx::query_as(
        "SELECT b.user_id, o.id, o.returned
         FROM unnest($2::bigint[]) AS b(user_id)
         CROSS JOIN LATERAL (
             SELECT id, accepted_at, status IN ('expired', 'cancelled', 'refunded') AS returned
             FROM orders WHERE user_id = b.user_id AND sale_id = $1
             ORDER BY accepted_at, id LIMIT $3) o
         ORDER BY b.user_id, o.accepted_at, o.id",
    )
    .bind(sale.get())
    .bind(users)
    .bind(BUYER_ORDERS)
    .fetch_all(db)
    .await?;
    let mut found: std::collections::HashMap<i64, Vec<(Uuid, bool)>> =
        std::collections::HashMap::new();
    for (user, id, returned) in rows {
        found.entry(user).or_default().push((id, returned));
    }
    Ok(found)
}

/// A sale's settled orders, oldest first (at most `limit`).
pub async fn of_sale(db: &PgPool, sale: SaleId, limit: i64) -> sqlx::Result<Vec<OrderRow>> {
    sqlx::query_as(concat!(
        "SELECT ",
        order_columns!(),
        " FROM orders WHERE sale_id = $1 ORDER BY accepted_at LIMIT $2"
    ))
    .bind(sale.get())
    .bind(limit)
    .fetch_all(db)
    .await
}

/// A settled order of a sale with its buyer's name, as the admin's page of the
/// sale's orders reads it.
#[derive(sqlx::FromRow)]
pub struct BuyerOrder {
    pub id: Uuid,
    pub username: String,
    pub accepted_at: DateTime<Utc>,
    pub settled_at: DateTime<Utc>,
    pub status: OrderStatus,
    pub pay_by: Option<DateTime<Utc>>,
    pub paid_at: Option<DateTime<Utc>>,
    /// `pay_by <= now()` by Postgres's clock.
    pub overdue: bool,
    /// Units bought.
    pub quantity: i32,
}

/// A page of a sale's settled orders with their buyers' names, oldest first (the
/// id breaking ties), so pages do not shift as orders settle.
pub async fn page_of_sale(
    db: &PgPool,
    sale: SaleId,
    limit: i64,
    offset: i64,
) -> sqlx::Result<Vec<BuyerOrder>> {
    sqlx::query_as(
        "SELECT o.id, u.username, o.accepted_at, o.settled_at, o.status, o.pay_by, o.paid_at,
                COALESCE(o.pay_by <= now(), false) AS overdue, o.quantity
         FROM orders o JOIN users u ON u.id = o.user_id
         WHERE o.sale_id = $1 ORDER BY o.accepted_at, o.id LIMIT $2 OFFSET $3",
    )
    .bind(sale.get())
    .bind(limit)
    .bind(offset)
    .fetch_all(db)
    .await
}

/// How many settled orders the sale has.
pub async fn count_of_sale(db: &PgPool, sale: SaleId) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT count(*) FROM orders WHERE sale_id = $1")
        .bind(sale.get())
        .fetch_one(db)
        .await
}

/// Order ids carry their sale id in the first six bytes (a UUIDv8), so an order's
/// status can be found in its sale's pending hash before it reaches Postgres.
pub fn new_order_id(sale: SaleId) -> Uuid {
    new_order_ids(sale, 1)[0]
}

/// `n` order ids for one decision batch: the sale id in bytes 0 to 5, then the
/// batch tag in bytes 6 to 11, which the batch shares: beside the UUID's version
/// and variant bits, 32 bits of the time in milliseconds (wrapping every 49.7
/// days) and then 10 random bits; then four random bytes of each order's own. The
/// sale's pending hash keeps a batch's orders under its tag ([`batch_tag`]), so the
/// script writes one field per batch (two batches that draw the same tag share it).
///
/// Time first: a sale's orders reach the primary key of `orders` in about the
/// order they were accepted, so settlement's inserts land on the index's newest
/// leaf pages instead of pages all over it (with random tags, 5.9 to 6.0 µs of
/// Postgres per inserted order against 4.5 to 4.6 µs; see docs/capacity.md). An
/// id tells when its batch was decided (to the millisecond, within 49.7 days),
/// which its order's `accepted_at` tells too; only its owner and admins see it.
pub fn new_order_ids(sale: SaleId, n: usize) -> Vec<Uuid> {
    use rand::RngCore;
    let mut rng = rand::rng();
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let tag = batch_tag_bits(ms, u64::from(rng.next_u32()));
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&sale.get().to_be_bytes()[2..]);
    bytes[6..12].copy_from_slice(&tag);
    (0..n)
        .map(|_| {
            rng.fill_bytes(&mut bytes[12..]);
            Uuid::new_v8(bytes)
        })
        .collect()
}

/// Bytes 6 to 11 of an order id: 42 bits (the low 32 bits of `ms`, then the low
/// 10 of `random`) spread around the version nibble (the high half of byte 6) and
/// the variant bits (the top two of byte 8), which [`Uuid::new_v8`] sets, so that
/// ids compare (bytewise, as Postgres does) in the order of their times.
fn batch_tag_bits(ms: u64, random: u64) -> [u8; 6] {
    let v = ((ms & 0xffff_ffff) << 10) | (random & 0x3ff);
    [
        ((v >> 38) & 0x0f) as u8,
        (v >> 30) as u8,
        ((v >> 24) & 0x3f) as u8,
        (v >> 16) as u8,
        (v >> 8) as u8,
        v as u8,
    ]
}

/// The batch tag of an order id as text, the field of its batch in the sale's
/// pending hash: characters 15 to 28 of the hyphenated id (bytes 6 to 11), as
/// `lua/purchase_batch.lua` takes them.
pub fn batch_tag(order: &str) -> Option<&str> {
    order.get(14..28)
}

/// The sale an order id was minted for, if it is one of ours.
pub fn sale_of_order(order: &Uuid) -> Option<SaleId> {
    if order.get_version_num() != 8 {
        return None;
    }
    let b = order.as_bytes();
    let mut raw = [0u8; 8];
    raw[2..].copy_from_slice(&b[..6]);
    Id::new(i64::from_be_bytes(raw))
}

/// Largest sale id an order id can carry (48 bits).
pub const MAX_ORDERABLE_SALE_ID: i64 = (1 << 48) - 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_ids_of_later_batches_sort_after_earlier_ones_and_keep_their_sale() {
        let sale = Id::new(42).unwrap();
        let mut last: Option<Uuid> = None;
        // Milliseconds apart, and across a carry in every part of the tag.
        for ms in [
            1_700_000_000_000u64,
            1_700_000_000_001,
            1_700_000_001_023,
            1_700_004_194_304,
        ] {
            for random in [0u64, 0x155, 0x3ff] {
                let mut bytes = [0u8; 16];
                bytes[..6].copy_from_slice(&42i64.to_be_bytes()[2..]);
                bytes[6..12].copy_from_slice(&batch_tag_bits(ms, random));
                let id = Uuid::new_v8(bytes);
                assert_eq!(sale_of_order(&id), Some(sale));
                assert_eq!(id.get_version_num(), 8);
                if let Some(prev) = last {
                    assert!(prev < id, "{prev} then {id} (ms {ms}, random {random:#x})");
                }
                last = Some(id);
            }
        }
        // The ids of one call share their tag, and their sale.
        let ids = new_order_ids(sale, 3);
        let tags: Vec<String> = ids
            .iter()
            .map(|id| batch_tag(&id.to_string()).unwrap().to_string())
            .collect();
        assert!(tags.iter().all(|t| *t == tags[0]), "{tags:?}");
        assert!(ids.iter().all(|id| sale_of_order(id) == Some(sale)));
        assert_eq!(
            ids.iter().collect::<std::collections::HashSet<_>>().len(),
            3
        );
    }

    #[test]
    fn order_statuses_read_back_what_they_write_and_nothing_else() {
        for status in OrderStatus::ALL {
            assert_eq!(OrderStatus::parse(status.as_str()), Some(status));
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::json!(status.as_str())
            );
        }
        assert_eq!(OrderStatus::parse("shipped"), None);
    }

    #[test]
    fn order_ids_carry_their_sale() {
        for raw in [1, 42, 1 << 40, MAX_ORDERABLE_SALE_ID] {
            let sale = Id::new(raw).unwrap();
            let order = new_order_id(sale);
            assert_eq!(order.get_version_num(), 8);
            assert_eq!(sale_of_order(&order), Some(sale));
        }
        assert_eq!(sale_of_order(&Uuid::new_v4()), None);
    }

    #[test]
    fn a_batch_shares_its_tag_and_nothing_else() {
        let sale = Id::new(7).unwrap();
        let ids = new_order_ids(sale, 64);
        let texts: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        let tag = batch_tag(&texts[0]).unwrap();
        assert_eq!(tag.len(), 14);
        assert!(texts.iter().all(|t| batch_tag(t) == Some(tag)));
        let distinct: std::collections::HashSet<&Uuid> = ids.iter().collect();
        assert_eq!(distinct.len(), 64);
        for id in &ids {
            assert_eq!(id.get_version_num(), 8);
            assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
            assert_eq!(sale_of_order(id), Some(sale));
        }
        let other = new_order_ids(sale, 1)[0].to_string();
        assert_ne!(batch_tag(&other), Some(tag));
    }
}
