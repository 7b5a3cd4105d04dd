//! Joining the line and where one stands (`lua/queue_place.lua`), a batch of
//! shoppers of one sale a call.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use serde::Serialize;

use super::estimate::LineNow;
use crate::domain::{SaleId, UserId};
use crate::error::AppError;
use crate::keys::Keys;
use crate::lua::{lua_function, unexpected_reply};

static QUEUE_PLACE: LazyLock<crate::lua::Script> = lua_function!("queue_place.lua", "queue_place");

/// The script that places shoppers in the line (for `examples/lua_function.rs`).
pub fn script() -> &'static crate::lua::Script {
    &QUEUE_PLACE
}

/// Numbers of the reply's head, before the shoppers' rows.
const HEAD: usize = 13;

crate::lua::reply_codes! {
    /// What `lua/queue_place.lua` answers for each shopper, as its header lists them.
    pub enum PlaceCode in "queue_place.lua", checked_by place_codes_are_the_scripts {
        Done = 0, "done";
        NotOpenYet = 2, "the line does not open yet";
        Ended = 3, "ended or closed";
        NotLoaded = 4, "not loaded";
        SoldOut = 5, "sold out";
        Recovering = 6, "recovering";
        NoWaitingRoom = 13, "the sale has no waiting room";
        JoinsClosed = 14, "the line is closed to new joins";
    }
}

crate::lua::reply_codes! {
    /// Where `lua/queue_place.lua` says a shopper stands (with [`PlaceCode::Done`]).
    pub enum PlaceState in "queue_place.lua" under "The standing, with code 0",
        checked_by place_states_are_the_scripts {
        NotInLine = 0, "not in line";
        Waiting = 1, "waiting";
        Admitted = 2, "admitted";
        Passed = 3, "passed";
        Bought = 4, "bought";
        SoldOut = 5, "sold out";
    }
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
#[derive(Clone, Copy, Debug, PartialEq)]
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
    /// What moves the line, for the estimate ([`Standing::line_now`]).
    pub moves: LineMoves,
}

/// What moves a sale's line, as the script read it with a standing (Redis clock).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LineMoves {
    pub units_left: i64,
    /// Admissions running now.
    pub open: i64,
    /// An admin paused admissions.
    pub paused: bool,
    /// An admin closed the line to new joins.
    pub joins_closed: bool,
    /// The recent share of passes and how many ended admissions it is over.
    pub pass_share: Option<(f64, f64)>,
    /// When the soonest and the latest open admission end.
    pub open_ends_ms: Option<(i64, i64)>,
    /// Units one shopper may buy (the sale's `max_per_user`): each let in before
    /// this shopper may take that many.
    pub per_user: i64,
    /// Waiting only: when the open admission ends whose pass is the soonest this
    /// shopper's turn can come (the turn needs passes), see `lua/queue_place.lua`.
    pub needed_end_ms: Option<i64>,
}

impl Standing {
    /// The line as this shopper sees it, for [`LineNow::estimate`]: waiting, after
    /// the opening, only.
    pub fn line_now(&self, life_ms: i64) -> Option<LineNow> {
        let ahead = self.ahead?;
        let m = &self.moves;
        let until = |at: i64| (at - self.now_ms).max(0);
        Some(LineNow {
            ahead,
            units_left: m.units_left,
            open: m.open,
            rate: self.admit_per_second,
            life_ms,
            open_ends_in_ms: m.open_ends_ms.map(|(a, b)| (until(a), until(b))),
            needed_end_in_ms: m.needed_end_ms.map(until),
            pass_share: m.pass_share,
            per_user: m.per_user,
        })
    }
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
    /// An admin closed the line to new joins (the shopper holds no place).
    JoinsClosed,
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
    let [
        now,
        starts,
        rate,
        waiting,
        units_left,
        open,
        paused,
        joins_closed,
        share_ppm,
        share_over,
        first_end,
        last_end,
        per_user,
    ] = reply.first_chunk::<HEAD>().copied().ok_or_else(bad)?;
    let moves = LineMoves {
        units_left,
        open,
        paused: paused == 1,
        joins_closed: joins_closed == 1,
        pass_share: (share_ppm >= 0 && share_over > 0)
            .then(|| (share_ppm as f64 / 1e6, share_over as f64)),
        open_ends_ms: (open > 0).then_some((first_end, last_end)),
        needed_end_ms: None,
        per_user: per_user.max(1),
    };
    let rows = &reply[HEAD..];
    if rows.len() != asks.len() * 6 {
        return Err(bad());
    }
    rows.chunks(6)
        .map(|row| {
            let &[code, value, state, position, ahead, expiry] = row else {
                return Err(bad());
            };
            let Some(code) = PlaceCode::of(code) else {
                return Err(unexpected_reply("queue_place.lua", code));
            };
            Ok(match code {
                PlaceCode::Done => {
                    let state = match PlaceState::of(state) {
                        Some(PlaceState::NotInLine) => QueueState::NotJoined,
                        Some(PlaceState::Waiting) => QueueState::Waiting,
                        Some(PlaceState::Admitted) => QueueState::Admitted,
                        Some(PlaceState::Passed) => QueueState::Passed,
                        Some(PlaceState::Bought) => QueueState::Bought,
                        Some(PlaceState::SoldOut) => QueueState::SoldOut,
                        None => {
                            return Err(unexpected_reply("queue_place.lua", ("state", state)));
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
                            moves: LineMoves {
                                needed_end_ms: (state == QueueState::Waiting && expiry > 0)
                                    .then_some(expiry),
                                ..moves
                            },
                        },
                    }
                }
                PlaceCode::NotOpenYet => Place::NotOpenYet { opens_in_ms: value },
                PlaceCode::Ended => Place::Ended,
                PlaceCode::NotLoaded => Place::Unavailable(Unavailable::NotLoaded),
                PlaceCode::SoldOut => Place::SoldOut,
                PlaceCode::Recovering => Place::Unavailable(Unavailable::Recovering),
                PlaceCode::NoWaitingRoom => Place::Unavailable(Unavailable::NoWaitingRoom),
                PlaceCode::JoinsClosed => Place::JoinsClosed,
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

/// `s`, a used turn told apart from one that passed. The script reads a turn as
/// bought only while the buyers hash holds the shopper, and an order returned
/// (cancelled, refunded, expired) on a sale whose buyers may buy again takes them
/// out of it: their turn read `passed`, "let in, did not buy in time". A passed
/// standing whose shopper has an order of the sale in Postgres (where an order is
/// before it can be returned) used its turn: `bought`. One indexed read, for a
/// passed standing only.
pub async fn tell_used_turn(
    db: &sqlx::PgPool,
    sale: SaleId,
    user: UserId,
    mut s: Standing,
) -> Result<Standing, AppError> {
    if s.state == QueueState::Passed {
        let used: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM orders WHERE sale_id = $1 AND user_id = $2)",
        )
        .bind(sale.get())
        .bind(user.get())
        .fetch_one(db)
        .await?;
        if used {
            s.state = QueueState::Bought;
        }
    }
    Ok(s)
}
