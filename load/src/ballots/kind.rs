//! A `--ballot` poll's settings as the run makes it, and the bodies of its kind.

use serde_json::{Value, json};

use crate::args::{Ballot, LoadArgs};

/// Options of the poll a `--ballot` run makes (the plain vote run makes two).
pub const OPTIONS: usize = 4;

/// The ballot settings of `POST /api/admin/polls` for the run's `--ballot` (`{}`
/// without one: a single-choice poll, as before ballots).
pub fn settings(args: &LoadArgs) -> Value {
    let Some(kind) = args.ballot else {
        return json!({});
    };
    let mut s = json!({ "ballot": kind.as_str() });
    match kind {
        Ballot::Budget => {
            s["votes_per_user"] = json!(args.votes_per_user);
            if let Some(cap) = args.max_per_option {
                s["max_per_option"] = json!(cap);
            }
        }
        Ballot::Multi | Ballot::Ranked => {
            s["allow_change"] = json!(args.allow_change);
            if let Some(n) = args.max_choices {
                s["max_choices"] = json!(n);
            }
        }
        Ballot::Single => s["allow_change"] = json!(args.allow_change),
    }
    s
}

/// The body of a ballot of `kind` for `choices` (single: the first; budget: the
/// first, `count` votes).
pub fn body(kind: Ballot, choices: &[i64], count: u32) -> Value {
    match kind {
        Ballot::Single => json!({ "option_id": choices[0] }),
        Ballot::Multi => json!({ "option_ids": choices }),
        Ballot::Ranked => json!({ "ranking": choices }),
        Ballot::Budget => json!({ "option_id": choices[0], "count": count }),
    }
}

/// What every request of a plain run (or `--prepare-only`) sends: the first
/// option, or the first two on a multi or ranked ballot, or one budget vote.
pub fn repeated_body(args: &LoadArgs, options: &[i64]) -> Value {
    match args.ballot {
        None => json!({ "option_id": options[0] }),
        Some(kind) => {
            let n = (args.max_choices.unwrap_or(2) as usize).clamp(1, 2);
            body(kind, &options[..n.min(options.len())], 1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_sends_its_own_shape() {
        assert_eq!(body(Ballot::Single, &[3, 4], 1), json!({"option_id": 3}));
        assert_eq!(
            body(Ballot::Multi, &[3, 4], 1),
            json!({"option_ids": [3, 4]})
        );
        assert_eq!(body(Ballot::Ranked, &[4, 3], 1), json!({"ranking": [4, 3]}));
        assert_eq!(
            body(Ballot::Budget, &[5], 7),
            json!({"option_id": 5, "count": 7})
        );
    }
}
