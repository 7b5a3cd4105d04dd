//! Polls: one vote per user per poll, decided in per-poll batches by one Lua script
//! (`lua/vote_batch.lua`, the vote route's limits inside), tallies live in Redis,
//! votes settled into Postgres by the settlement worker.

pub mod cast;
pub(crate) mod routes;
pub mod store;

pub(crate) use routes::Api;
pub use routes::{MAX_OPTIONS, MIN_OPTIONS, ROUTES, configure, load_view};
