//! Fair openings (issue 52): what a sale or poll may ask of a caller before the
//! first step into it (the waiting room's join, a draw's entry, a purchase
//! ticket, a vote). Both off by default:
//! - `proof_of_work`: a nonce that gives SHA-256(challenge ":" nonce) that many
//!   leading zero bits, for a stateless challenge of this server
//!   ([`proof`]; each challenge counts once, across servers);
//! - `min_account_age_s`: the account must be that old at the opening, or at
//!   the request when later ([`age`]; the creation time rides in the session
//!   token, so the check costs no query).
//!
//! [`memory::Memory`] keeps each sale's or poll's settings in this process, so
//! a sale or poll with neither costs a map lookup on its hot path.

pub mod age;
mod keeper;
pub mod memory;
pub mod proof;
mod settings;

pub use keeper::Keeper;
pub use settings::{
    Fairness, FairnessFields, Gates, MAX_ACCOUNT_AGE_S, MAX_PROOF_OF_WORK, Subject,
    check_sale_proof,
};
