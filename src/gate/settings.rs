//! The settings of fair openings and what the checks read of them: [`Gates`]
//! (a sale's or poll's, as the checks need them), [`Subject`], the settings as a
//! create or an edit sends them ([`FairnessFields`]) and checked ([`Fairness`]).

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::domain::{PollId, SaleId};
use crate::error::{AppError, ErrorCode};

/// Most leading zero bits a proof may be asked for (about 16.7 million hashes
/// on average: seconds for native code, far longer in a browser).
pub const MAX_PROOF_OF_WORK: i16 = 24;
/// Longest `min_account_age_s`: 366 days.
pub const MAX_ACCOUNT_AGE_S: i32 = 366 * 86_400;

/// What a proof or an account's age is asked for: a sale or a poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    Sale(SaleId),
    Poll(PollId),
}

/// A sale's or poll's gates as the checks need them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gates {
    /// Leading zero bits of a proof; 0: none asked.
    pub proof_of_work: u8,
    /// Least age of an account, seconds; 0: any.
    pub min_account_age_s: i32,
    /// The opening (unix ms): the age counts at the later of it and the request.
    pub opens_ms: i64,
    /// A sale with a waiting room: the proof comes with the join, and the
    /// admission (a ticket) stands for it afterwards.
    pub waiting_room: bool,
    /// A draw sale's `entries_open_at` (unix ms; its `opens_ms` is the draw):
    /// the entry route's window comes from here, without a read. `None`: not a
    /// draw.
    pub entries_open_ms: Option<i64>,
}

impl Gates {
    pub fn new(
        proof_of_work: i16,
        min_account_age_s: i32,
        opens_at: DateTime<Utc>,
        waiting_room: bool,
        entries_open_at: Option<DateTime<Utc>>,
    ) -> Gates {
        Gates {
            proof_of_work: u8::try_from(proof_of_work.clamp(0, MAX_PROOF_OF_WORK)).unwrap_or(0),
            min_account_age_s: min_account_age_s.max(0),
            opens_ms: opens_at.timestamp_millis(),
            waiting_room,
            entries_open_ms: entries_open_at.map(|at| at.timestamp_millis()),
        }
    }

    /// Neither gate is set: nothing to check.
    pub fn none(&self) -> bool {
        self.proof_of_work == 0 && self.min_account_age_s == 0
    }
}

/// The two settings as a create or an edit sends them (`None`: not sent, or
/// `null`), checked by [`FairnessFields::parse`].
#[derive(Debug, Default)]
pub struct FairnessFields {
    pub proof_of_work: Option<Value>,
    pub min_account_age_s: Option<Value>,
}

/// The settings checked: each `None` when not sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fairness {
    pub proof_of_work: Option<i16>,
    pub min_account_age_s: Option<i32>,
}

impl FairnessFields {
    /// Each setting an integer in its range, else 422 `invalid_fairness` naming it.
    pub fn parse(&self) -> Result<Fairness, AppError> {
        let number = |name: &str, raw: &Option<Value>, max: i64| -> Result<Option<i64>, AppError> {
            match raw {
                None | Some(Value::Null) => Ok(None),
                Some(v) => match v.as_i64() {
                    Some(n) if (0..=max).contains(&n) => Ok(Some(n)),
                    _ => Err(AppError::new(
                        ErrorCode::InvalidFairness,
                        format!("{name} must be a whole number from 0 to {max}"),
                    )),
                },
            }
        };
        Ok(Fairness {
            proof_of_work: number(
                "proof_of_work",
                &self.proof_of_work,
                i64::from(MAX_PROOF_OF_WORK),
            )?
            .map(|n| n as i16),
            min_account_age_s: number(
                "min_account_age_s",
                &self.min_account_age_s,
                i64::from(MAX_ACCOUNT_AGE_S),
            )?
            .map(|n| n as i32),
        })
    }
}

/// A sale asks for its proof with the purchase ticket or the waiting room's join,
/// so one with `proof_of_work` needs either (422 `invalid_fairness`).
pub fn check_sale_proof(
    proof_of_work: i16,
    requires_ticket: bool,
    waiting_room: bool,
) -> Result<(), AppError> {
    if proof_of_work > 0 && !requires_ticket && !waiting_room {
        return Err(AppError::new(
            ErrorCode::InvalidFairness,
            "proof_of_work is asked with the purchase ticket or the waiting room's join: \
             a sale with it requires a ticket or has a waiting room",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(pow: Value, age: Value) -> Result<Fairness, ErrorCode> {
        FairnessFields {
            proof_of_work: Some(pow),
            min_account_age_s: Some(age),
        }
        .parse()
        .map_err(|e| e.error_code())
    }

    #[test]
    fn settings_are_checked_whole_and_in_range() {
        assert_eq!(
            parse(json!(0), json!(0)),
            Ok(Fairness {
                proof_of_work: Some(0),
                min_account_age_s: Some(0)
            })
        );
        assert_eq!(
            parse(json!(24), json!(MAX_ACCOUNT_AGE_S)),
            Ok(Fairness {
                proof_of_work: Some(24),
                min_account_age_s: Some(MAX_ACCOUNT_AGE_S)
            })
        );
        assert_eq!(parse(Value::Null, Value::Null), Ok(Fairness::default()));
        for (pow, age) in [
            (json!(25), json!(0)),
            (json!(-1), json!(0)),
            (json!(1.5), json!(0)),
            (json!("8"), json!(0)),
            (json!(0), json!(-1)),
            (json!(0), json!(i64::from(MAX_ACCOUNT_AGE_S) + 1)),
            (json!(0), json!(true)),
        ] {
            assert_eq!(parse(pow, age), Err(ErrorCode::InvalidFairness));
        }
    }
}
