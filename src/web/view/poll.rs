//! Polls and their results as the pages show them.

use chrono::{DateTime, Utc};

use super::text::{Moment, percent};
use crate::domain::PollStatus;
use crate::vote::store::{PollRow, Results};

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
}

impl PollCard {
    pub fn new(poll: PollRow, voters: i64, now: DateTime<Utc>) -> Self {
        let status = crate::vote::store::status(&poll, now);
        PollCard {
            id: poll.id,
            status,
            status_label: status.label(),
            closed_early: poll.closed && now < poll.closes_at,
            voters,
            opens_at: poll.opens_at.into(),
            closes_at: poll.closes_at.into(),
            question: poll.question,
        }
    }
}

/// One option of a poll with its live share of the votes.
pub struct OptionResult {
    pub id: i64,
    pub label: String,
    pub votes: i64,
    pub percent: i64,
}

/// The options in the poll's order with their tallies; `total` is what the
/// percentages are of (never 0, so an empty poll shows 0% bars).
pub fn option_results(options: Vec<(i64, String)>, results: &Results) -> (Vec<OptionResult>, i64) {
    let votes_of = |id: i64| {
        results
            .tallies
            .iter()
            .find(|t| t.option_id == id)
            .map_or(0, |t| t.votes)
    };
    let counted: i64 = options.iter().map(|(id, _)| votes_of(*id)).sum();
    let total = results.voters.max(counted);
    let rows = options
        .into_iter()
        .map(|(id, label)| {
            let votes = votes_of(id);
            OptionResult {
                id,
                label,
                votes,
                percent: percent(votes, total),
            }
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
        use crate::vote::store::Tally;
        let results = Results {
            poll_id: 1,
            closed: false,
            voters: 4,
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
            &results,
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
