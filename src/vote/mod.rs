//! Polls: one vote per user per poll, decided in per-poll batches by one Lua script
//! (`lua/vote_batch.lua`, the vote route's limits inside), tallies live in Redis,
//! votes settled into Postgres by the settlement worker. Their HTTP routes are
//! `routes::vote`.

pub mod cached;
pub mod cast;
pub mod lifecycle;
pub mod list;
pub mod rebuild;
pub mod settlement;
pub mod store;

pub use cached::{PollView, load_view};

/// Fewest options a poll has.
pub const MIN_OPTIONS: usize = 2;
/// Most options a poll has.
pub const MAX_OPTIONS: usize = 20;
