//! Polls: one vote per user per poll, decided by one Lua script
//! (`lua/vote.lua`), tallies live in Redis, votes settled into Postgres by the
//! settlement worker.

mod routes;
pub mod store;

pub use routes::{MAX_OPTIONS, MIN_OPTIONS, configure};
