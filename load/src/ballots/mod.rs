//! `vote --ballot single|multi|budget|ranked`: a rehearsal of a poll of that kind
//! (issue 51). The run makes the poll (`kind.rs`), writes each voter's requests
//! and the answer the rules give each (`script.rs`), fires them, voters side by
//! side and each voter's requests in order (`fire.rs`), then checks:
//!
//! - every answer as the rules say, a replay of a key answered as the first time
//!   (`answers.rs`);
//! - every 202's receipt in Postgres once settled, and no row no answer named;
//! - the first voters' `my-ballot`: the same receipts, settled, the ballot that
//!   counts;
//! - Redis's tallies (the admin view's live ones) = the settled ones = the tallies
//!   of the voters' ballots that count (a replaced ballot counts once);
//! - budget: no voter over its budget, no option over `max_per_option`
//!   (`checks.rs`).
//!
//! `run.rs` runs it and reports.

pub mod answers;
mod checks;
mod fire;
pub mod kind;
mod run;
mod script;

pub use self::run::{Voters, run};
