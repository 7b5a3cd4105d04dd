//! `storm --waiting-room`: a rehearsal of a sale with a waiting room (issue 29, see
//! `src/sale/queue/`). The sale the run makes has a line that opens now and a
//! sale that opens at the storm's opening, admitting `--admit-per-second`.
//!
//! 1. **Join**: every user joins the line before the opening (`POST .../queue`,
//!    `--concurrency` connections, a progress line); a 503 or a lost answer is sent
//!    again, like a storm's purchase.
//! 2. **Follow**: from the opening each user follows its standing as a sale page
//!    does, gently: one `GET .../queue/me` to learn its place once the order is
//!    drawn, then again every 250 ms only while its place is near the line's
//!    `served` (read every 100 ms from `GET /api/sales/{id}`, one request for all),
//!    else every 5 s. Once the sale has no unit left, every one still waiting asks
//!    once more (its answer is then `sold_out`). An admitted user buys at once with
//!    its admission's ticket (`{"ticket": ...}`, an `Idempotency-Key`, retried on a
//!    503 or a lost answer). The phase ends when every user's standing is final
//!    (bought, passed, sold out) or after a bound (30 s + twice the admissions the
//!    stock allows at the set pace).
//! 3. **Check**: the storm's own invariants, then the waiting room's, through
//!    Postgres: every order's buyer was admitted, nobody admitted twice,
//!    admissions in line order, never ahead of the pace, orders = units sold, no
//!    5xx, every standing final.
//!
//! `run.rs` runs the three phases and reports; `join.rs` is the first, `follow.rs`
//! the second, `checks.rs` the waiting room's own checks; `ask.rs` records each
//! request by phase.

pub mod ask;
mod checks;
pub mod follow;
mod join;
mod run;

pub use self::run::run;
