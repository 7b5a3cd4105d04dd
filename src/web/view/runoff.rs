//! A closed ranked poll's count by rounds as its page shows it without script
//! (`static/js/receipt.js`, `showRunoff`, writes the same words when the results
//! come again, so the two agree).

use crate::vote::runoff::Runoff;

/// The count by rounds: a table per round, who won, and the tie rule.
pub struct RunoffView {
    pub winner: String,
    pub rounds: Vec<RoundView>,
    pub rule: String,
}

/// One round: its standing options, most votes first (ties in the poll's order).
pub struct RoundView {
    pub round: u32,
    pub rows: Vec<RoundRow>,
    /// Who went out, and the ballots with no choice left ("" for neither).
    pub note: String,
}

pub struct RoundRow {
    pub option_id: i64,
    /// The option's label, with " (eliminated)" when it went out this round.
    pub label: String,
    pub votes: u64,
    pub out: bool,
}

impl RunoffView {
    /// `runoff` in words, options named by `labels` (id, label).
    pub fn new(runoff: &Runoff, labels: &[(i64, String)]) -> RunoffView {
        let name = |id: i64| {
            labels
                .iter()
                .find(|(o, _)| *o == id)
                .map_or_else(|| format!("Option {id}"), |(_, l)| l.clone())
        };
        let rounds = runoff
            .rounds
            .iter()
            .map(|round| {
                let mut tallies: Vec<_> = round.tallies.iter().collect();
                tallies.sort_by_key(|t| std::cmp::Reverse(t.votes));
                let rows = tallies
                    .into_iter()
                    .map(|t| {
                        let out = round.eliminated.contains(&t.option_id);
                        let label = name(t.option_id);
                        RoundRow {
                            option_id: t.option_id,
                            label: if out {
                                format!("{label} (eliminated)")
                            } else {
                                label
                            },
                            votes: t.votes,
                            out,
                        }
                    })
                    .collect();
                let mut notes = Vec::new();
                if !round.eliminated.is_empty() {
                    let names: Vec<String> = round.eliminated.iter().map(|&id| name(id)).collect();
                    notes.push(format!("Eliminated: {}.", names.join(", ")));
                }
                if round.exhausted > 0 {
                    notes.push(format!(
                        "{} {} no choice left.",
                        round.exhausted,
                        if round.exhausted == 1 {
                            "ballot has"
                        } else {
                            "ballots have"
                        }
                    ));
                }
                RoundView {
                    round: round.round,
                    rows,
                    note: notes.join(" "),
                }
            })
            .collect::<Vec<_>>();
        let ballots = format!(
            "{} {}",
            runoff.ballots,
            if runoff.ballots == 1 {
                "ballot"
            } else {
                "ballots"
            }
        );
        let winner = match runoff.winner {
            Some(id) => {
                let n = rounds.len();
                let after = if n == 1 {
                    "1 round".to_owned()
                } else {
                    format!("{n} rounds")
                };
                format!("Winner: {}, after {after} of counting {ballots}.", name(id))
            }
            None => format!("No winner: {ballots} counted."),
        };
        RunoffView {
            winner,
            rounds,
            rule: format!("Ties: {}", runoff.tie_rule),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vote::runoff::instant_runoff;

    #[test]
    fn rounds_in_words_as_the_page_script_writes_them() {
        // A 2, B 2, C 1 first preferences; C goes, its ballot to B.
        let ballots: [&[i64]; 5] = [&[1], &[1], &[2], &[2], &[3, 2]];
        let runoff = instant_runoff(&[1, 2, 3], ballots);
        let labels = [
            (1, "A".to_owned()),
            (2, "B".to_owned()),
            (3, "C".to_owned()),
        ];
        let view = RunoffView::new(&runoff, &labels);
        assert_eq!(
            view.winner,
            "Winner: B, after 2 rounds of counting 5 ballots."
        );
        assert_eq!(view.rounds.len(), 2);
        let first: Vec<_> = view.rounds[0]
            .rows
            .iter()
            .map(|r| (r.label.as_str(), r.votes, r.out))
            .collect();
        assert_eq!(
            first,
            [
                ("A", 2, false),
                ("B", 2, false),
                ("C (eliminated)", 1, true)
            ]
        );
        assert_eq!(view.rounds[0].note, "Eliminated: C.");
        let second: Vec<_> = view.rounds[1]
            .rows
            .iter()
            .map(|r| (r.label.as_str(), r.votes))
            .collect();
        assert_eq!(second, [("B", 3), ("A", 2)]);
        assert_eq!(view.rounds[1].note, "");
        assert!(view.rule.starts_with("Ties: Each round"));
        let none = instant_runoff(&[1, 2], std::iter::empty::<&[i64]>());
        assert_eq!(
            RunoffView::new(&none, &labels).winner,
            "No winner: 0 ballots counted."
        );
    }
}
