//! A sale's waiting room: a fair line at the opening, a live place in it, and
//! admission at a set pace.
//!
//! A sale created with `waiting_room: true` has a line that opens at
//! `queue_opens_at`, and sells only to shoppers admitted from it:
//!
//! - **Joining** (`lua/queue_place.lua`): one place per account, the same answer
//!   however often it joins. A place is a score in the line (a sorted set): whoever
//!   joins before `starts_at` holds a random one below 2^52 drawn by the server, so
//!   the line's early part is in random order whenever they came (arriving a second
//!   early earns nothing); a later joiner holds 2^52 + n, n counting the late joins,
//!   so they follow in arrival order.
//! - **Admission** (`lua/queue_admit.lua`, run by every server's [`admit::admit_forever`]
//!   a few times a second): atomic and paced by the Redis clock, so any number of
//!   servers admit at `admit_per_second` together, from the opening on. It first
//!   moves admissions past their life (an admission lasts `queue_admission_ms`,
//!   30 s by default) out of the open set: they passed. Then it admits from the head
//!   of the line at most min(credit, units left - admissions open), so never more
//!   shoppers are admitted and unexpired than units are left; an admission that
//!   passes frees its room for the next in line.
//! - **Buying**: an admission is a purchase ticket (`POST /api/sales/{id}/ticket`
//!   issues one only to an admitted shopper, valid as long as the admission), and
//!   the purchase script checks the admission itself (`lua/purchase_batch.lua`,
//!   code 13): a purchase without one is refused with nothing taken. A purchase
//!   accepted uses the admission up.
//! - **Where am I** (the same script, reading only): state, place, people ahead (a `ZCOUNT`:
//!   logarithmic in the line), and what moves the line (units left, admissions
//!   running and when they end, the recent share of passes), from which
//!   [`estimate`] gives a range of waits and a chance. The sale's view carries the
//!   line's numbers (`served`: places the admission has reached), so an open page
//!   learns its place once and follows it over the sale's event stream.
//! - **Controls** ([`line`]): an admin pauses admissions or closes the line to new
//!   joins; both held in Postgres and in the meta hash the scripts read.
//!
//! **Durability.** Redis (AOF) holds the line; a restart keeps every place. Postgres
//! keeps what a wipe must not lose: the admitter copies joins into `queue_places`
//! and admissions into `queue_admissions` (a step behind, about 100 ms) from two
//! streams the scripts fill, so one whose write failed, or whose server died first,
//! is written by a later step or another server. A sale's rebuild after a wipe
//! ([`restore::restore`]) puts the line back from `queue_places`, every admission back as
//! given (nobody is admitted a second time; one still running is open again), and
//! the head after the last place admitted. What the last step before a wipe had not
//! copied yet is lost with Redis: a join (that shopper joins again, at the end), or
//! an admission, usable for those few milliseconds only (a purchase it allowed is
//! an order, and its buyer is in the buyers hash the rebuild restores, so it is not
//! sold twice); its holder, if they did not buy, is admitted again in turn.

pub mod admit;
pub mod estimate;
pub mod join;
pub mod line;
pub mod numbers;
pub mod restore;
pub mod room;
