//! A poll's ballot as the poll page shows it: the rule in words, and the voter's
//! own ballot (what counts now) from the voters hash.

use crate::vote::rebuild::Held;
use crate::vote::setting::{BallotKind, BallotSettings};

/// The ballot's settings as the page's controls need them.
pub struct BallotView {
    pub kind: BallotKind,
    /// multi, ranked: most options on one ballot (every option when not set).
    pub max_choices: usize,
    /// budget: votes each voter may spend; 0 for other kinds.
    pub votes_per_user: i64,
    /// budget: most votes of one voter on one option; 0 for other kinds.
    pub max_per_option: i64,
    pub allow_change: bool,
    /// The rule in a few words ("Pick up to 2").
    pub rule: String,
    /// What the tallies count, where that is not one vote per voter.
    pub counts_note: &'static str,
}

impl BallotView {
    pub fn new(s: BallotSettings, options: usize) -> Self {
        let max_choices = s.choices_allowed(options);
        let votes_per_user = i64::from(s.votes_per_user.unwrap_or(0));
        let max_per_option = i64::from(s.max_per_option.unwrap_or(0));
        let rule = rule_words(s.kind, max_choices, options, votes_per_user, max_per_option);
        let rule = if s.allow_change {
            format!("{rule}; you may change your vote until the close")
        } else {
            rule
        };
        BallotView {
            kind: s.kind,
            max_choices,
            votes_per_user,
            max_per_option,
            allow_change: s.allow_change,
            rule,
            counts_note: counts_note(s.kind),
        }
    }

    pub fn is(&self, kind: &str) -> bool {
        self.kind.as_str() == kind
    }

    /// The tag on one of the voter's options in the results: "Your vote",
    /// "Your choice", "Your #2", "Your 3 votes" (as `static/js/poll.js` writes it).
    pub fn mine_tag(&self, mine: &MyBallot, option: &i64) -> String {
        match self.kind {
            BallotKind::Single => "Your vote".into(),
            BallotKind::Multi => "Your choice".into(),
            BallotKind::Ranked => format!("Your #{}", mine.rank(option)),
            BallotKind::Budget => match mine.given(option) {
                1 => "Your vote".into(),
                n => format!("Your {n} votes"),
            },
        }
    }
}

/// A closed ranked poll's note, its count by rounds shown below the tallies (as
/// `static/js/poll.js` writes it when the count comes).
pub const RANKED_COUNTED_NOTE: &str = "Counts first preferences; the count by rounds is below.";
/// A closed ranked poll's note while its results are hidden.
pub const RANKED_CLOSED_HIDDEN_NOTE: &str =
    "Counts first preferences; the count by rounds comes with the results.";

impl BallotView {
    /// The note under the tallies once the poll closed: a ranked poll's count by
    /// rounds is no longer to come at the close. `shown`: the results show.
    pub fn closed(&mut self, shown: bool) {
        if self.kind == BallotKind::Ranked {
            self.counts_note = if shown {
                RANKED_COUNTED_NOTE
            } else {
                RANKED_CLOSED_HIDDEN_NOTE
            };
        }
    }
}

fn counts_note(kind: BallotKind) -> &'static str {
    match kind {
        BallotKind::Single => "",
        BallotKind::Multi => "Each voter may pick several options: shares are of all picks.",
        BallotKind::Budget => "Counts every vote given: each voter shares several.",
        BallotKind::Ranked => {
            "Counts first preferences; the full count by rounds comes at the close."
        }
    }
}

fn rule_words(kind: BallotKind, most: usize, options: usize, budget: i64, cap: i64) -> String {
    match kind {
        BallotKind::Single => "One vote per person".into(),
        BallotKind::Multi if most >= options => "Pick as many as you like".into(),
        BallotKind::Multi if most == 1 => "Pick 1".into(),
        BallotKind::Multi => format!("Pick up to {most}"),
        BallotKind::Ranked if most >= options => "Rank the options, favourite first".into(),
        BallotKind::Ranked => format!("Rank up to {most}, favourite first"),
        BallotKind::Budget if cap >= budget => {
            format!("{budget} votes to share as you like")
        }
        BallotKind::Budget => format!("{budget} votes to share, at most {cap} on one option"),
    }
}

/// The caller's ballot as it counts now.
#[derive(Default)]
pub struct MyBallot {
    pub voted: bool,
    /// single, multi, ranked: the options in the order sent.
    pub choices: Vec<i64>,
    /// budget: votes given per option.
    pub spent: Vec<(i64, i64)>,
}

impl MyBallot {
    /// From the voters hash value of a poll of `kind` (`None`: no ballot).
    pub fn from_held(kind: BallotKind, value: Option<&str>) -> Self {
        let Some(value) = value else {
            return MyBallot::default();
        };
        match Held::parse(kind, value) {
            Some(held) => MyBallot {
                voted: true,
                choices: held.choices,
                spent: held.spent,
            },
            // A value this page cannot read still says the caller voted.
            None => MyBallot {
                voted: true,
                ..MyBallot::default()
            },
        }
    }

    /// Votes given to `option` (budget). (By reference: as templates call it.)
    pub fn given(&self, option: &i64) -> i64 {
        self.spent
            .iter()
            .filter(|(o, _)| o == option)
            .map(|(_, c)| c)
            .sum()
    }

    pub fn spent_total(&self) -> i64 {
        self.spent.iter().map(|(_, c)| c).sum()
    }

    /// 1-based place of `option` in the ballot's choices, 0 when not chosen.
    pub fn rank(&self, option: &i64) -> usize {
        self.choices
            .iter()
            .position(|o| o == option)
            .map_or(0, |i| i + 1)
    }

    /// Whether `option` is part of the ballot (chosen, or given a vote).
    pub fn has(&self, option: &i64) -> bool {
        self.rank(option) > 0 || self.given(option) > 0
    }
}

/// The ballot settings' fields of the admin's create and edit forms.
pub struct BallotForm {
    /// The ids' prefix (`poll`, `edit`): both forms may share a page's ids.
    pub prefix: &'static str,
    pub kind: &'static str,
    /// Empty when not set (every option).
    pub max_choices: String,
    pub votes_per_user: String,
    pub max_per_option: String,
    pub allow_change: bool,
    pub kinds: [(&'static str, &'static str); 4],
}

impl BallotForm {
    /// The fields holding `settings` (a create's: the defaults).
    pub fn new(prefix: &'static str, settings: BallotSettings) -> Self {
        let text = |v: Option<i32>| v.map(|n| n.to_string()).unwrap_or_default();
        BallotForm {
            prefix,
            kind: settings.kind.as_str(),
            max_choices: text(settings.max_choices),
            votes_per_user: text(settings.votes_per_user),
            max_per_option: text(settings.max_per_option),
            allow_change: settings.allow_change,
            kinds: [
                ("single", "One choice"),
                ("multi", "Several choices"),
                ("budget", "A budget of votes to share"),
                ("ranked", "A ranking"),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(kind: BallotKind) -> BallotSettings {
        BallotSettings {
            kind,
            ..BallotSettings::default()
        }
    }

    #[test]
    fn each_kind_says_its_rule() {
        let rule = |s: BallotSettings| BallotView::new(s, 4).rule;
        assert_eq!(rule(settings(BallotKind::Single)), "One vote per person");
        let mut multi = settings(BallotKind::Multi);
        assert_eq!(rule(multi), "Pick as many as you like");
        multi.max_choices = Some(2);
        assert_eq!(rule(multi), "Pick up to 2");
        let mut ranked = settings(BallotKind::Ranked);
        ranked.max_choices = Some(3);
        ranked.allow_change = true;
        assert_eq!(
            rule(ranked),
            "Rank up to 3, favourite first; you may change your vote until the close"
        );
        let mut budget = settings(BallotKind::Budget);
        budget.votes_per_user = Some(10);
        budget.max_per_option = Some(4);
        assert_eq!(rule(budget), "10 votes to share, at most 4 on one option");
    }

    #[test]
    fn a_held_budget_ballot_gives_votes_per_option() {
        let mine = MyBallot::from_held(BallotKind::Budget, Some("3|8:2,4:1"));
        assert!(mine.voted);
        assert_eq!((mine.given(&8), mine.given(&4), mine.given(&5)), (2, 1, 0));
        assert_eq!(mine.spent_total(), 3);
        let ranked = MyBallot::from_held(BallotKind::Ranked, Some("1|5,3"));
        assert_eq!(
            (ranked.rank(&3), ranked.rank(&5), ranked.rank(&9)),
            (2, 1, 0)
        );
        assert!(!MyBallot::from_held(BallotKind::Single, None).voted);
        assert_eq!(
            MyBallot::from_held(BallotKind::Single, Some("7")).choices,
            [7]
        );
    }
}
