//! Decisions in batches: requests for the same sale (or poll) that arrive together
//! are decided by one script call, each answered in order.
//!
//! Group commit, no timer: the first request for a key finds no batch in flight and
//! goes at once, alone, so a quiet sale keeps its latency. Up to `in_flight`
//! batches of one key go at once (each takes what is waiting when it starts);
//! requests that arrive while they are all out wait for the first to come back (at
//! most one Redis round trip) and then go together, at most `max` per call. A hot
//! sale thus costs one FCALL (its run check's `INFO` read once per Redis process)
//! per batch instead of per buyer; this is what lets one sale go past the one-call-per-request ceiling of a
//! Redis core. Several batches in flight matter under `appendfsync always`: Redis
//! answers a write only after an `fsync`, one per event-loop turn for everything it
//! read in that turn, so the batches that reach it during one `fsync` share the
//! next. Each script is atomic, so batches in flight together never break an
//! invariant; their order is the order Redis runs them.
//!
//! Each HTTP worker has its own batcher and its own Redis connection (see
//! `startup`), so a request, its batch and the Redis I/O stay on one thread. Two
//! batchers decide with Postgres instead, by the same group commit: the reads of
//! buyers' orders (`sale::held::HeldReader`) and the draw entries
//! (`sale::draw::enter::EntryWriter`, one transaction a batch).
//!
//! `batcher.rs` holds the group commit ([`Batcher`], [`Decider`]); `call.rs` the
//! KEYS/ARGV layout and the reply rows the batch scripts share ([`Call`]). The
//! replica acknowledgements a batch may wait for are Redis plumbing:
//! [`crate::redis_conn::acks`].

mod batcher;
mod call;

pub use batcher::{Batcher, Connections, Counters, Decider};
pub use call::{BUCKETS, Call, Item, ItemArg, REPLAYED, Row};
