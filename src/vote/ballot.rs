//! A ballot as the voter sends it (`POST /api/polls/{id}/votes`): [`VoteBody`], one
//! JSON shape per kind, checked into the [`Ballot`] the vote script decides (which
//! checks its kind against the poll's), and the 422 refusals that say what is wrong
//! with it (`invalid_ballot`, naming what the poll takes, and `unknown_option`).

use std::borrow::Cow;
use std::collections::HashSet;

use serde::Deserialize;

use crate::cache::CachedReads;
use crate::domain::PollId;
use crate::error::{AppError, ErrorCode};
use crate::vote::MAX_OPTIONS;
use crate::vote::cached::cached_record;
use crate::vote::cast::Ballot;
use crate::vote::setting::BallotKind;

/// A ballot, in the shape of the poll's kind: `{"option_id"}` (single),
/// `{"option_ids": [..]}` (multi), `{"option_id", "count"}` (budget),
/// `{"ranking": [..]}` (ranked, most preferred first).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VoteBody {
    /// single and budget: the option.
    option_id: Option<i64>,
    /// budget: how many of the voter's votes to spend on it, at least 1.
    count: Option<i64>,
    /// multi: 1 to `max_choices` distinct options.
    option_ids: Option<Vec<i64>>,
    /// ranked: 1 to `max_choices` distinct options, most preferred first.
    ranking: Option<Vec<i64>>,
}

/// Most votes one budget request may ask for (more than any budget: refused by
/// the budget, with the numbers left, not by the shape).
const MAX_COUNT: i64 = 1_000_000;

fn invalid(message: impl Into<Cow<'static, str>>) -> AppError {
    AppError::new(ErrorCode::InvalidBallot, message)
}

/// 422 `unknown_option`: an option of another poll, or none.
pub fn unknown_option() -> AppError {
    AppError::new(
        ErrorCode::UnknownOption,
        "that option does not belong to this poll",
    )
}

/// A list of options: 1 to 20 positive, distinct ids.
fn ids(field: &str, ids: Vec<i64>) -> Result<Vec<i64>, AppError> {
    if ids.is_empty() || ids.len() > MAX_OPTIONS {
        return Err(invalid(format!("{field} lists 1 to {MAX_OPTIONS} options")));
    }
    if ids.iter().any(|&id| id <= 0) {
        return Err(unknown_option());
    }
    let mut seen = HashSet::new();
    if !ids.iter().all(|id| seen.insert(*id)) {
        return Err(invalid(format!("{field} names an option twice")));
    }
    Ok(ids)
}

impl VoteBody {
    /// The ballot this body sends (its kind is checked against the poll's in
    /// Redis), or 422 `invalid_ballot` / `unknown_option`.
    pub fn ballot(self) -> Result<Ballot, AppError> {
        match (self.option_id, self.count, self.option_ids, self.ranking) {
            (Some(option), None, None, None) if option > 0 => Ok(Ballot::Single(option)),
            (Some(option), Some(count), None, None) if option > 0 => {
                if count < 1 {
                    return Err(invalid("count must be at least 1"));
                }
                Ok(Ballot::Budget {
                    option,
                    count: count.min(MAX_COUNT) as u32,
                })
            }
            (Some(_), _, None, None) => Err(unknown_option()),
            (None, None, Some(list), None) => Ok(Ballot::Multi(ids("option_ids", list)?)),
            (None, None, None, Some(list)) => Ok(Ballot::Ranked(ids("ranking", list)?)),
            _ => Err(invalid(
                "send one of {\"option_id\"} (single), {\"option_ids\": [..]} (multi), \
                 {\"option_id\", \"count\"} (budget) or {\"ranking\": [..]} (ranked)",
            )),
        }
    }
}

/// 422 `invalid_ballot` for a ballot the script found not to fit `poll`, saying
/// what this poll takes (its record through the view cache; without it, only
/// that the ballot does not fit).
pub async fn invalid_for<S: CachedReads + ?Sized>(state: &S, poll: PollId) -> AppError {
    let Ok(Some(record)) = cached_record(state, poll).await else {
        return invalid("this ballot does not fit this poll's kind");
    };
    let s = record.poll.ballot_settings();
    let most = s.choices_allowed(record.options.len());
    invalid(match s.kind {
        BallotKind::Single => "this poll takes one option: {\"option_id\": n}".to_string(),
        BallotKind::Multi => {
            format!("this poll takes 1 to {most} distinct options: {{\"option_ids\": [..]}}")
        }
        BallotKind::Ranked => format!(
            "this poll takes a ranking of 1 to {most} distinct options, most preferred first: {{\"ranking\": [..]}}"
        ),
        BallotKind::Budget => {
            "this poll takes votes from a budget: {\"option_id\": n, \"count\": c}".to_string()
        }
    })
}
