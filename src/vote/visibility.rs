//! Who sees a poll's tallies (issue 51): the poll's `results` setting, the answer a
//! caller gets when they may not see them yet, and the decision between the two.
//!
//! The decision is made per request from the poll's record (cached), whether it is
//! closed (the server's clock against `closes_at`, as the poll's `status` is
//! decided, or an admin's early close) and who asks. A hidden answer carries no
//! per-option number at all, and its shape does not depend on any count but the
//! voters (which is public): two polls that differ only in their tallies answer the
//! same bytes.

use chrono::{DateTime, Utc};
use serde::Serialize;

pub use super::setting::ResultsVisibility;
use super::store::{PollRow, Results};
use crate::domain::{PollStatus, UserId};

/// What a caller waits for before the tallies show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Until {
    /// Their own vote (`after_vote`).
    Vote,
    /// The poll's close (`after_close`).
    Close,
    /// An admin's reveal (`on_reveal`).
    Reveal,
}

impl Until {
    pub const fn as_str(self) -> &'static str {
        match self {
            Until::Vote => "vote",
            Until::Close => "close",
            Until::Reveal => "reveal",
        }
    }
}

/// Results a caller may not see yet: `{"closed": b, "hidden": true, "until": ...,
/// "voters": n}` and nothing else.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct HiddenResults {
    /// Closed (early by an admin, or its `closes_at` passed), as shown results
    /// say it (public, as the poll's status is): a page whose tallies are hidden
    /// learns of the close too.
    closed: bool,
    /// Always `true`.
    hidden: bool,
    until: Until,
    /// How many voted (public, as on the poll lists).
    voters: i64,
}

/// A poll's results as one caller gets them: the tallies, or hidden.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum PollResults {
    Shown(Results),
    Hidden(HiddenResults),
}

impl PollResults {
    /// `results` as a caller who must wait for `until` gets them (`None`: shown).
    pub fn of(results: Results, until: Option<Until>) -> Self {
        match until {
            None => PollResults::Shown(results),
            Some(until) => PollResults::Hidden(HiddenResults {
                closed: results.closed,
                hidden: true,
                until,
                voters: results.voters,
            }),
        }
    }

    pub fn voters(&self) -> i64 {
        match self {
            PollResults::Shown(r) => r.voters,
            PollResults::Hidden(h) => h.voters,
        }
    }

    /// What the caller waits for; `None` when the tallies are shown.
    pub fn until(&self) -> Option<Until> {
        match self {
            PollResults::Shown(_) => None,
            PollResults::Hidden(h) => Some(h.until),
        }
    }
}

/// Who asks for a poll's results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Viewer {
    /// Signed out (or a caller whose own vote does not matter: a shared stream).
    Anyone,
    /// Signed in, not an admin: their vote counts for `after_vote`.
    User(UserId),
    /// An admin: always the tallies.
    Admin,
}

/// Whether the poll counts as closed for its results: an admin closed it (the
/// record's or Redis's flag) or the server's clock passed `closes_at`, exactly as
/// its `status` is decided.
pub fn is_closed(poll: &PollRow, closed_in_redis: bool, now: DateTime<Utc>) -> bool {
    closed_in_redis || crate::vote::store::status(poll, now) == PollStatus::Closed
}

/// What a caller who is not an admin waits for, `voted` saying whether their
/// ballot is in (asked only of `after_vote` polls); `None`: the tallies show.
pub fn hidden_until(poll: &PollRow, closed: bool, voted: bool) -> Option<Until> {
    match poll.results {
        ResultsVisibility::Live => None,
        ResultsVisibility::AfterVote => (!voted).then_some(Until::Vote),
        ResultsVisibility::AfterClose => (!closed).then_some(Until::Close),
        ResultsVisibility::OnReveal => poll.revealed_at.is_none().then_some(Until::Reveal),
    }
}

/// Whether deciding for a signed-in caller needs to know if their ballot is in.
pub fn asks_for_vote(poll: &PollRow, viewer: Viewer) -> bool {
    matches!(viewer, Viewer::User(_)) && poll.results == ResultsVisibility::AfterVote
}

/// `results` as `viewer` gets them at `now`; `voted`: the caller's ballot is in
/// (read only where [`asks_for_vote`]; else `false`).
pub fn decide(
    poll: &PollRow,
    results: Results,
    viewer: Viewer,
    voted: bool,
    now: DateTime<Utc>,
) -> PollResults {
    let closed = is_closed(poll, results.closed, now);
    // Closed on schedule says so too: a feed that follows only the results (or
    // their stream) learns the vote ended.
    let results = Results { closed, ..results };
    let until = match viewer {
        Viewer::Admin => None,
        Viewer::Anyone => hidden_until(poll, closed, false),
        Viewer::User(_) => hidden_until(poll, closed, voted),
    };
    PollResults::of(results, until)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vote::store::Tally;

    fn row(results: ResultsVisibility, revealed: bool) -> PollRow {
        let now = Utc::now();
        PollRow {
            id: 1,
            question: "Q".into(),
            opens_at: now - chrono::Duration::hours(1),
            closes_at: now + chrono::Duration::hours(1),
            closed: false,
            closed_at: None,
            archived_at: None,
            results,
            revealed_at: revealed.then_some(now),
            ballot: Default::default(),
            max_choices: None,
            votes_per_user: None,
            max_per_option: None,
            allow_change: false,
            proof_of_work: 0,
            min_account_age_s: 0,
        }
    }

    fn results(tallies: &[i64]) -> Results {
        Results {
            poll_id: 1,
            closed: false,
            hidden: false,
            voters: tallies.iter().sum(),
            runoff: None,
            stamp: Default::default(),
            tallies: tallies
                .iter()
                .enumerate()
                .map(|(i, &votes)| Tally {
                    option_id: i as i64 + 1,
                    votes,
                })
                .collect(),
        }
    }

    #[test]
    fn each_setting_hides_until_its_moment() {
        use ResultsVisibility::*;
        assert_eq!(hidden_until(&row(Live, false), false, false), None);
        assert_eq!(
            hidden_until(&row(AfterVote, false), true, false),
            Some(Until::Vote)
        );
        assert_eq!(hidden_until(&row(AfterVote, false), false, true), None);
        assert_eq!(
            hidden_until(&row(AfterClose, false), false, true),
            Some(Until::Close)
        );
        assert_eq!(hidden_until(&row(AfterClose, false), true, false), None);
        assert_eq!(
            hidden_until(&row(OnReveal, false), true, true),
            Some(Until::Reveal)
        );
        assert_eq!(hidden_until(&row(OnReveal, true), true, false), None);
    }

    #[test]
    fn a_hidden_answer_is_the_same_bytes_whatever_the_tallies() {
        let a = PollResults::of(results(&[5, 0, 1]), Some(Until::Close));
        let b = PollResults::of(results(&[0, 6, 0]), Some(Until::Close));
        let a = serde_json::to_string(&a).unwrap();
        assert_eq!(a, serde_json::to_string(&b).unwrap());
        assert_eq!(
            a,
            r#"{"closed":false,"hidden":true,"until":"close","voters":6}"#
        );
    }

    #[test]
    fn settings_parse_by_name_only() {
        for v in ResultsVisibility::ALL {
            let json = serde_json::to_value(v).unwrap();
            assert_eq!(ResultsVisibility::from_setting(&json).unwrap(), v);
        }
        for bad in [
            serde_json::json!("Live"),
            serde_json::json!(1),
            serde_json::json!(""),
        ] {
            let e = ResultsVisibility::from_setting(&bad).unwrap_err();
            assert!(e.to_string().contains("results"), "{e}");
        }
    }
}
