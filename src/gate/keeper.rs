//! What the checks keep per process ([`Keeper`], one in the application state).

use super::age::AccountAges;
use super::memory::Memory;
use super::proof::ChallengeKey;
use crate::domain::{PollId, SaleId};

/// What the checks keep per process: the challenge key, the gates read, the
/// creation times read (one in the application state).
pub struct Keeper {
    pub challenges: ChallengeKey,
    pub sales: Memory<SaleId>,
    pub polls: Memory<PollId>,
    pub ages: AccountAges,
}

impl Keeper {
    pub fn new(secret: &[u8]) -> Self {
        Keeper {
            challenges: ChallengeKey::new(secret),
            sales: Default::default(),
            polls: Default::default(),
            ages: Default::default(),
        }
    }
}
