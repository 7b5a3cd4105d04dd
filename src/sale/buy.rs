//! The purchase decision: `lua/purchase_batch.lua` and its one Rust type,
//! [`PurchaseBatch`], which owns the script's KEYS and ARGV order (the layout of
//! [`crate::batch::Call`]) and parses its reply exhaustively; and [`BuyDecider`],
//! which lets [`crate::batch::Batcher`] decide the purchases of one sale in batches.

use std::net::IpAddr;
use std::sync::LazyLock;

use redis::aio::ConnectionLike;

use crate::redis_conn::Redis;
use uuid::Uuid;

use super::order_id::{MAX_ORDERABLE_SALE_ID, new_order_ids};
use crate::batch::{Decider, Item, ItemArg};
use crate::cache::CachedReads;
use crate::domain::{self, PurchaseKey, SaleId, UserId};
use crate::error::{AppError, ErrorCode};
use crate::keys::Keys;
use crate::limit::{Decision, Policy};
use crate::lua::{lua_function, unexpected_reply};
use crate::redis_conn::acks::ReplicaAcks;

static PURCHASE_BATCH: LazyLock<crate::lua::Script> =
    lua_function!("purchase_batch.lua", "purchase_batch");

/// The purchase decision script (`lua/purchase_batch.lua`, run as a Redis
/// function): for the tools that measure it alone (`examples/lua_function.rs`).
pub fn decision_script() -> &'static crate::lua::Script {
    &PURCHASE_BATCH
}

/// One buyer's request.
#[derive(Clone, Debug)]
pub struct BuyRequest {
    pub user: UserId,
    /// Units asked for, all or nothing (1 unless the sale allows more per customer).
    pub quantity: u32,
    /// The client address, when a policy counts per address.
    pub ip: Option<IpAddr>,
    /// The `Idempotency-Key` the purchase carried, if any.
    pub key: Option<PurchaseKey>,
}

/// What the script decided for one buyer, and what each policy said.
#[derive(Clone, Debug, PartialEq)]
pub struct BuyReply {
    pub outcome: PurchaseOutcome,
    /// One per policy of the buy route, in order (empty when limits are off, and unless the
    /// answer is accepted or refused by a limit: see `batch::call::rows`).
    pub limits: Vec<Decision>,
    /// The answer first given to this idempotency key, given again (no limit
    /// counted it, nothing was decided).
    pub replayed: bool,
}

/// `lua/purchase_batch.lua` for one sale.
pub struct PurchaseBatch<'a> {
    pub keys: &'a Keys,
    pub sale: SaleId,
    /// The buy route's policies, checked inside the decision.
    pub policies: &'a [Policy],
    /// Tests only: decide at this Redis time instead of the Redis clock.
    pub now_ms: Option<i64>,
    /// How long the sale's idempotency keys hash lives after its last write
    /// (`purchase_key_ttl`).
    pub key_ttl: std::time::Duration,
}

impl PurchaseBatch<'_> {
    /// Decides every buyer in order, in one call. A batch with a user twice
    /// answers the second `AlreadyBought` (or a refusal by a limit).
    pub async fn run<C: ConnectionLike>(
        &self,
        redis: &mut C,
        buyers: &[BuyRequest],
    ) -> Result<Vec<BuyReply>, AppError> {
        if self.sale.get() > MAX_ORDERABLE_SALE_ID {
            let unknown = BuyReply {
                outcome: PurchaseOutcome::UnknownSale,
                limits: Vec::new(),
                replayed: false,
            };
            return Ok(vec![unknown; buyers.len()]);
        }
        if buyers.is_empty() {
            return Ok(Vec::new());
        }
        self.run_with_ids(redis, buyers, new_order_ids(self.sale, buyers.len()))
            .await
    }

    /// [`Self::run`] with the order ids given, one per buyer, all of one batch tag
    /// (see [`new_order_ids`]; tests make two batches share one).
    pub async fn run_with_ids<C: ConnectionLike>(
        &self,
        redis: &mut C,
        buyers: &[BuyRequest],
        order_ids: Vec<Uuid>,
    ) -> Result<Vec<BuyReply>, AppError> {
        // The script makes each id's first 14 characters from the sale id (see
        // `ItemArg::Order`): every id must carry this sale.
        let tag = |id: &Uuid| -> [u8; 6] { id.as_bytes()[6..12].try_into().unwrap_or_default() };
        if order_ids.len() != buyers.len()
            || order_ids.iter().any(|id| {
                tag(id) != tag(&order_ids[0])
                    || super::order_id::sale_of_order(id) != Some(self.sale)
            })
        {
            return Err(AppError::Internal(anyhow::anyhow!(
                "a purchase batch needs one order id per buyer, all of its sale and one batch tag"
            )));
        }
        let k = self.keys.sale(self.sale);
        let items: Vec<Item> = buyers
            .iter()
            .zip(&order_ids)
            .map(|(buyer, order_id)| Item {
                user: buyer.user,
                ip: buyer.ip,
                arg: ItemArg::Order(*order_id, buyer.quantity, buyer.key),
            })
            .collect();
        let rows = crate::batch::Call {
            script: &PURCHASE_BATCH,
            name: "purchase_batch.lua",
            state_keys: &[
                &k.meta,
                &k.stock,
                &k.buyers,
                &k.orders,
                &k.pending,
                &k.units,
                &k.sold,
                &k.idem,
                &k.queue_open,
            ],
            id: self.sale.get(),
            policies: self.policies,
            limit_key: &|policy, subject| self.keys.sale_rate_limit(self.sale, policy, subject),
            now_ms: self.now_ms,
            extra: u64::try_from(self.key_ttl.as_millis()).unwrap_or(u64::MAX),
        }
        .run(redis, &items)
        .await?;
        rows.into_iter()
            .zip(order_ids)
            .map(|(row, order_id)| match row.text {
                Some(stored) if row.code == crate::batch::REPLAYED => Ok(BuyReply {
                    outcome: replayed(&stored)?,
                    limits: row.limits,
                    replayed: true,
                }),
                _ => Ok(BuyReply {
                    outcome: outcome(row.code, row.value, order_id, row.text.as_deref())?,
                    limits: row.limits,
                    replayed: false,
                }),
            })
            .collect()
    }
}

/// The units asked for: 1 unless the body says otherwise; more only up to the
/// sale's `max_per_user` (its record, read through the cache, only for a request
/// that asks for more than one).
pub async fn check_quantity<S: CachedReads + ?Sized>(
    reads: &S,
    sale: SaleId,
    quantity: Option<i64>,
) -> Result<u32, AppError> {
    let q = match quantity {
        None | Some(1) => return Ok(1),
        Some(q) if (2..=i64::from(domain::MAX_PER_USER)).contains(&q) => q,
        Some(_) => {
            return Err(AppError::new(
                ErrorCode::InvalidQuantity,
                format!(
                    "quantity must be between 1 and the sale's max_per_user (at most {})",
                    domain::MAX_PER_USER
                ),
            ));
        }
    };
    let row = super::cached::sale_row(reads, sale)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no sale with id {sale}")))?;
    if q > i64::from(row.max_per_user) {
        return Err(AppError::new(
            ErrorCode::InvalidQuantity,
            format!(
                "this sale sells at most {} per customer: quantity must be 1 to {}",
                row.max_per_user, row.max_per_user
            ),
        ));
    }
    Ok(q as u32)
}

/// What a purchase came to: one per buyer of a decision batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurchaseOutcome {
    Accepted {
        order_id: Uuid,
        stock_left: i64,
    },
    /// Refused: one per customer. `order`: the order that makes them a buyer, as
    /// the script found it in the buyers hash (`None`: not named there, a buyer
    /// of an earlier version's set; the route reads it off the batch).
    AlreadyBought {
        order: Option<Uuid>,
    },
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

crate::lua::reply_codes! {
    /// What `lua/purchase_batch.lua` answers for each buyer, as its header lists them.
    pub enum PurchaseCode in "purchase_batch.lua", checked_by purchase_codes_are_the_scripts {
        Accepted = 0, "accepted";
        AlreadyBought = 1, "already bought";
        NotStarted = 2, "not started";
        Ended = 3, "ended or closed";
        NotLoaded = 4, "not loaded";
        SoldOut = 5, "sold out";
        Recovering = 6, "recovering";
        RateLimited = 7, "rate limited";
        LimitNever = 8, "rate limit never satisfiable";
        OverCap = 9, "over the per-customer cap";
        NotEnoughLeft = 10, "fewer units left than asked for";
        Replayed = crate::batch::REPLAYED, "replayed";
        KeyReused = 12, "key used with another quantity";
        NotAdmitted = 13, "not admitted";
    }
}

/// The answer stored under an idempotency key (`<quantity>:<code>:<value>:<order
/// id>`, see `lua/purchase_batch.lua`), given again. Only a decision is stored: any
/// other code, or text of another shape, is an error.
fn replayed(stored: &str) -> Result<PurchaseOutcome, AppError> {
    let bad = || unexpected_reply("purchase_batch.lua", ("stored answer", stored.to_string()));
    let mut parts = stored.splitn(4, ':');
    let (Some(_quantity), Some(code), Some(value), Some(order)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let code: i64 = code.parse().map_err(|_| bad())?;
    let value: i64 = value.parse().map_err(|_| bad())?;
    match PurchaseCode::of(code) {
        Some(PurchaseCode::Accepted) => {
            let order_id = Uuid::parse_str(order).map_err(|_| bad())?;
            outcome(code, value, order_id, None)
        }
        // An already bought remembered with its held order (or '' before it was).
        Some(PurchaseCode::AlreadyBought) => outcome(code, value, Uuid::nil(), Some(order)),
        Some(PurchaseCode::SoldOut | PurchaseCode::OverCap | PurchaseCode::NotEnoughLeft) => {
            outcome(code, value, Uuid::nil(), None)
        }
        _ => Err(bad()),
    }
}

/// Every code the script answers, and nothing else: an unknown code is an error,
/// never read as some refusal.
/// `text`: the string after the code and value, for an already bought its held
/// order (empty, or absent, when unknown).
fn outcome(
    code: i64,
    value: i64,
    order_id: Uuid,
    text: Option<&str>,
) -> Result<PurchaseOutcome, AppError> {
    let Some(code) = PurchaseCode::of(code) else {
        return Err(unexpected_reply("purchase_batch.lua", (code, value)));
    };
    Ok(match code {
        PurchaseCode::Accepted => PurchaseOutcome::Accepted {
            order_id,
            stock_left: value,
        },
        PurchaseCode::AlreadyBought => PurchaseOutcome::AlreadyBought {
            order: text.and_then(|t| Uuid::parse_str(t).ok()),
        },
        PurchaseCode::NotStarted => PurchaseOutcome::NotStarted {
            starts_in_ms: value,
        },
        PurchaseCode::Ended => PurchaseOutcome::Ended,
        PurchaseCode::NotLoaded => PurchaseOutcome::NotLoaded,
        PurchaseCode::SoldOut => PurchaseOutcome::SoldOut,
        PurchaseCode::Recovering => PurchaseOutcome::Recovering,
        PurchaseCode::RateLimited => PurchaseOutcome::RateLimited {
            retry_after_ms: value.max(0) as u64,
        },
        PurchaseCode::LimitNever => PurchaseOutcome::RateLimitUnsatisfiable,
        PurchaseCode::OverCap => PurchaseOutcome::OverPerUserCap { held: value },
        PurchaseCode::NotEnoughLeft => PurchaseOutcome::NotEnoughLeft { left: value },
        PurchaseCode::KeyReused => PurchaseOutcome::KeyReused { quantity: value },
        PurchaseCode::NotAdmitted => PurchaseOutcome::NotAdmitted,
        // A replay carries its stored answer (`batch::call::rows`); without it, a bug.
        PurchaseCode::Replayed => {
            return Err(unexpected_reply("purchase_batch.lua", (code as i64, value)));
        }
    })
}

/// Decides the purchases of one sale in batches (see [`crate::batch`]).
pub struct BuyDecider {
    pub keys: Keys,
    /// The buy route's policies; empty when limits are off.
    pub policies: Vec<Policy>,
    /// Replicas that must have an accepted decision before it is answered.
    pub replica_acks: Option<ReplicaAcks>,
    /// `purchase_key_ttl`.
    pub key_ttl: std::time::Duration,
    /// Where accepted orders are kept until settled (see [`super::kept`]).
    pub kept: Option<std::sync::Arc<super::kept::KeptOrders>>,
}

impl Decider for BuyDecider {
    type Key = SaleId;
    type Request = BuyRequest;
    type Reply = BuyReply;

    async fn decide(
        &self,
        mut redis: Redis,
        sale: SaleId,
        batch: Vec<BuyRequest>,
    ) -> Result<Vec<BuyReply>, AppError> {
        let call = PurchaseBatch {
            keys: &self.keys,
            sale,
            policies: &self.policies,
            now_ms: None,
            key_ttl: self.key_ttl,
        };
        // Held until the batch's accepted orders are kept: a rebuild's flush waits
        // for it, since Redis may have accepted them before the rebuild's fence.
        let _deciding = self.kept.as_ref().map(|k| k.deciding(sale.get()));
        let keep = |replies: &[BuyReply]| {
            if let Some(kept) = &self.kept {
                let decided: Vec<_> = batch
                    .iter()
                    .zip(replies)
                    .filter_map(|(req, r)| match r {
                        BuyReply {
                            outcome: PurchaseOutcome::Accepted { order_id, .. },
                            replayed,
                            ..
                        } => Some((
                            *replayed,
                            (
                                *order_id,
                                req.user.get(),
                                req.quantity,
                                req.key.as_ref().map(|k| k.as_str()),
                            ),
                        )),
                        _ => None,
                    })
                    .collect();
                let rows = super::kept::accepted(sale, decided.iter().map(|(_, o)| *o));
                kept.keep_decided(decided.iter().map(|(replayed, _)| *replayed).zip(rows));
            }
        };
        let Some(acks) = &self.replica_acks else {
            let replies = call.run(&mut redis, &batch).await?;
            keep(&replies);
            return Ok(replies);
        };
        let key = self.keys.sale(sale).stock;
        let mut redis = acks.then_wait(&mut redis, &key);
        let replies = call.run(&mut redis, &batch).await?;
        // Kept whether or not a replica has them: a failover that loses them finds
        // them here.
        keep(&replies);
        // A replayed acceptance is waited for too: its first answer may have been a
        // 503 `not_replicated` (the script writes on a replay, so the `WAIT` covers
        // the first decision).
        redis.confirm(
            replies
                .iter()
                .any(|r| matches!(r.outcome, PurchaseOutcome::Accepted { .. })),
        )?;
        Ok(replies)
    }
}
