//! Polls: one vote per user per poll, decided in per-poll batches by one Lua script
//! (`lua/vote_batch.lua`, the vote route's limits inside), tallies live in Redis,
//! shown to each caller as the poll's `results` setting (`setting.rs`) says (`visibility.rs`; an
//! admin's reveal in `reveal.rs`), votes settled into Postgres by the settlement
//! worker. Their HTTP routes are `routes::vote`.

/// The columns of a `store::PollRow`, in its order, for every query that reads one
/// (a literal, so queries built with `concat!` stay static SQL). Defined before
/// the modules, so each of them may use it.
macro_rules! poll_columns {
    () => {
        "id, question, opens_at, closes_at, closed, closed_at, archived_at, results, revealed_at, ballot, \
         max_choices, votes_per_user, max_per_option, allow_change, proof_of_work, min_account_age_s"
    };
}

pub mod ballot;
pub mod cached;
pub mod cast;
pub mod export;
pub mod kept;
pub mod lifecycle;
pub mod list;
pub mod mine;
pub mod rebuild;
pub mod receipt;
pub mod result;
pub mod reveal;
pub mod runoff;
pub mod setting;
pub mod settlement;
pub mod store;
pub mod visibility;

pub use cached::{PollView, load_view};

/// Fewest options a poll has.
pub const MIN_OPTIONS: usize = 2;
/// Most options a poll has.
pub const MAX_OPTIONS: usize = 20;
