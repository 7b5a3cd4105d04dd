//! `storm --draw`: a rehearsal of a draw sale (issue 52, see `src/sale/draw/`).
//! The sale the run makes takes entries from now until its draw, --opens-in
//! seconds ahead, with a claim window of 60 s (the least a sale may have; a
//! server started with `STAMPEDE_DRAW_CLAIM_MAX_MS` gives shorter claims).
//!
//! 1. **Enter**: every user enters (`POST .../entry`, `--concurrency`
//!    connections); every tenth sends its entry again and must get the same one.
//! 2. **Draw**: from the draw's time, `GET .../draw` until it is published.
//! 3. **Claim**: every user asks its standing (`GET .../entry/me`); the first
//!    `--claim-share` percent of the winners buy with their win's ticket, the
//!    others let it pass; a few users who did not win try to buy without one.
//! 4. **Pass**: when the claims end within `--claim-wait` s of the draw, the run
//!    follows the published wins until every one is settled: an entry a passed
//!    win went to asks its standing and buys.
//! 5. **Check**: the storm's checks of the stock and the orders (Redis and
//!    Postgres), then the draw's: one entry per account, exactly one draw, the
//!    published draw recomputed from its seed (`stampede::sale::draw::verify`,
//!    as `stampede verify-draw`), only winners bought, every claim bought, and
//!    the unclaimed wins passed on in the seeded order.
//!
//! `run.rs` runs the phases and reports; `enter.rs` is the first, `claim.rs`
//! the third and fourth (over `each.rs`, a user list split over connections),
//! `checks.rs` the draw's own checks.

mod checks;
mod claim;
mod each;
mod enter;
mod run;

pub use self::run::run;
