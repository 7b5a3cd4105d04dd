//! Polls and their results as the pages show them.

use chrono::{DateTime, Utc};

use super::text::{Moment, shares};
use crate::domain::PollStatus;
use crate::vote::store::PollRow;
use crate::vote::visibility::{PollResults, ResultsVisibility, Until, hidden_until};

/// A poll as the list and the admin table show it.
pub struct PollCard {
    pub id: i64,
    pub question: String,
    /// Also the row's CSS class.
    pub status: PollStatus,
    pub status_label: &'static str,
    /// Closed by an admin before its time, rather than run out.
    pub closed_early: bool,
    pub voters: i64,
    pub opens_at: Moment,
    pub closes_at: Moment,
    /// The `results` setting (`live`, `after_vote`, ...).
    pub results: ResultsVisibility,
    /// What the lists say while anyone but a voter or an admin waits for the
    /// results; `None` when they show.
    pub results_note: Option<&'static str>,
    /// Leading zero bits of the proof each vote carries (0: none): the page
    /// solves one before each vote.
    pub proof_of_work: i16,
}

impl PollCard {
    /// `voted`: the viewer's ballot is in (a poll whose results show after the
    /// vote then shows them to them; `false` where nobody asked).
    pub fn new(poll: PollRow, voters: i64, voted: bool, now: DateTime<Utc>) -> Self {
        let status = crate::vote::store::status(&poll, now);
        let closed = status == PollStatus::Closed;
        PollCard {
            results: poll.results,
            results_note: hidden_until(&poll, closed, voted).map(|u| hidden_words(u, closed)),
            id: poll.id,
            status,
            status_label: status.label(),
            closed_early: closed_early(&poll, now),
            proof_of_work: poll.proof_of_work,
            voters,
            opens_at: poll.opens_at.into(),
            closes_at: poll.closes_at.into(),
            question: poll.question,
        }
    }
}

/// Whether an admin closed the poll before its closing time: by when it was
/// closed; a poll closed before that was kept, by the clock (which tells only
/// until the closing time passes).
pub fn closed_early(poll: &PollRow, now: DateTime<Utc>) -> bool {
    match poll.closed_at {
        Some(at) => poll.closed && at < poll.closes_at,
        None => poll.closed && now < poll.closes_at,
    }
}

/// What a page shows instead of tallies that are hidden from this caller: plain
/// words for what they wait for (`closed`: the poll is, so a vote is no way in).
pub fn hidden_words(until: Until, closed: bool) -> &'static str {
    match until {
        Until::Vote if closed => "Results are shown only to those who voted",
        Until::Vote => "Results after you vote",
        Until::Close => "Results at the end of the vote",
        Until::Reveal => "Results when the organisers reveal them",
    }
}

/// The admin's words for each `results` setting.
pub fn results_words(setting: ResultsVisibility) -> &'static str {
    match setting {
        ResultsVisibility::Live => "Live: everyone sees the results as votes come in",
        ResultsVisibility::AfterVote => "After voting: each voter sees them once they have voted",
        ResultsVisibility::AfterClose => "After the close: everyone sees them once the poll closes",
        ResultsVisibility::OnReveal => {
            "On reveal: hidden, after the close too, until you reveal them"
        }
    }
}

/// One choice of the `results` setting in the admin's forms.
pub struct ResultsChoice {
    pub value: &'static str,
    pub label: &'static str,
}

/// The `results` setting's choices, the default first, in words short enough for
/// a phone's select (the form's help text says the rest).
pub fn results_choices() -> Vec<ResultsChoice> {
    ResultsVisibility::ALL
        .into_iter()
        .map(|v| ResultsChoice {
            value: v.as_str(),
            label: match v {
                ResultsVisibility::Live => "Live, as votes come in",
                ResultsVisibility::AfterVote => "To voters, once they vote",
                ResultsVisibility::AfterClose => "After the poll closes",
                ResultsVisibility::OnReveal => "When you reveal them",
            },
        })
        .collect()
}

/// One option of a poll with its live share of the votes.
pub struct OptionResult {
    pub id: i64,
    pub label: String,
    pub votes: i64,
    pub percent: i64,
}

/// The options in the poll's order with their tallies; `total` is what the
/// percentages are of (never 0, so an empty poll shows 0% bars). Hidden results
/// have no tallies: every option then counts 0, and pages show no number.
pub fn option_results(
    options: Vec<(i64, String)>,
    results: &PollResults,
) -> (Vec<OptionResult>, i64) {
    let votes_of = |id: i64| match results {
        PollResults::Shown(results) => results
            .tallies
            .iter()
            .find(|t| t.option_id == id)
            .map_or(0, |t| t.votes),
        PollResults::Hidden(_) => 0,
    };
    let counted: i64 = options.iter().map(|(id, _)| votes_of(*id)).sum();
    let total = match results {
        PollResults::Shown(r) => r.voters.max(counted),
        PollResults::Hidden(_) => 0,
    };
    let votes: Vec<i64> = options.iter().map(|(id, _)| votes_of(*id)).collect();
    let percents = shares(&votes, total);
    let rows = options
        .into_iter()
        .zip(votes.into_iter().zip(percents))
        .map(|((id, label), (votes, percent))| OptionResult {
            id,
            label,
            votes,
            percent,
        })
        .collect();
    (rows, total)
}

#[cfg(test)]
mod tests {
    use super::super::text::voters_text;
    use super::*;

    #[test]
    fn open_polls_come_first() {
        use PollStatus::*;
        let mut statuses = [Closed, Upcoming, Open, Closed, Open];
        statuses.sort_by_key(|s| s.rank());
        assert_eq!(
            statuses.map(PollStatus::as_str),
            ["open", "open", "upcoming", "closed", "closed"]
        );
    }

    #[test]
    fn options_keep_their_order_and_get_their_tallies() {
        use crate::vote::store::{Results, Tally};
        let results = Results {
            poll_id: 1,
            closed: false,
            hidden: false,
            voters: 4,
            runoff: None,
            stamp: Default::default(),
            tallies: vec![
                Tally {
                    option_id: 10,
                    votes: 1,
                },
                Tally {
                    option_id: 11,
                    votes: 3,
                },
            ],
        };
        let (rows, total) = option_results(
            vec![
                (11, "Blue".into()),
                (10, "Red".into()),
                (12, "Green".into()),
            ],
            &PollResults::Shown(results),
        );
        assert_eq!(total, 4);
        let got: Vec<_> = rows
            .iter()
            .map(|r| (r.label.as_str(), r.votes, r.percent))
            .collect();
        assert_eq!(got, [("Blue", 3, 75), ("Red", 1, 25), ("Green", 0, 0)]);
        assert_eq!(voters_text(1), "1 voter");
        assert_eq!(voters_text(0), "0 voters");
    }
}
