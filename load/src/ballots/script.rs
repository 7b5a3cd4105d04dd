//! What each voter of a `--ballot` run sends, and the answer the ballot's rules
//! give each request: the voter's requests go one after another, so the run knows
//! the exact answer of every one before it fires.
//!
//! - single, multi, ranked: one ballot; a fifth of the voters then send a changed
//!   one (202 `replaced` with `allow_change`, else 409 `already_voted`).
//! - budget: the budget spent over several requests of random counts on random
//!   options; a fifth of the requests ask for one vote more than is left (overall
//!   or for the option: 422 `over_budget`); once spent, one more (409
//!   `budget_spent`).
//!
//! Every request has an `Idempotency-Key` of its own, and a quarter are sent a
//! second time with the same key and body: a replay, answered as the first.

use rand::Rng;
use rand::seq::SliceRandom;
use uuid::Uuid;

use super::kind::body;
use crate::args::Ballot;

/// The answer the rules give a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// 202: `replaced` as said; a budget vote's `remaining` after it.
    Accepted {
        replaced: bool,
        remaining: Option<i64>,
    },
    /// The refusal's code (`already_voted`, `over_budget`, `budget_spent`).
    Refused(&'static str),
}

/// One request of a voter.
pub struct Step {
    pub body: String,
    pub key: String,
    /// The ballot it casts: its options (budget: the option) and votes.
    pub choices: Vec<i64>,
    pub count: u32,
    pub expect: Expect,
    /// The step it sends again (same key and body), whose answer it must get.
    pub replay_of: Option<usize>,
}

/// A poll as the voters see it.
pub struct Rules {
    pub kind: Ballot,
    pub options: Vec<i64>,
    pub allow_change: bool,
    pub max_choices: usize,
    pub votes_per_user: u32,
    pub max_per_option: u32,
}

/// Share of voters who send a second ballot, and of requests sent twice.
const CHANGERS: f64 = 0.2;
const REPLAYS: f64 = 0.25;
/// Share of budget requests that ask for one vote more than is left.
const OVER: f64 = 0.2;
/// Most accepted budget requests before the rest is spent in one.
const BUDGET_STEPS: usize = 8;

impl Rules {
    /// One voter's requests.
    pub fn voter<R: Rng>(&self, rng: &mut R) -> Vec<Step> {
        let mut steps = Vec::new();
        if self.kind == Ballot::Budget {
            self.budget(rng, &mut steps);
            return steps;
        }
        let first = self.ballot(rng);
        let accepted = Expect::Accepted {
            replaced: false,
            remaining: None,
        };
        self.push(&mut steps, first.clone(), 1, accepted, rng);
        if rng.random_bool(CHANGERS) {
            let mut second = self.ballot(rng);
            while second == first {
                second = self.ballot(rng);
            }
            let expect = match self.allow_change {
                true => Expect::Accepted {
                    replaced: true,
                    remaining: None,
                },
                false => Expect::Refused("already_voted"),
            };
            self.push(&mut steps, second, 1, expect, rng);
        }
        steps
    }

    /// Adds a request casting `choices` (budget: `count` votes), with a key of its
    /// own, and now and then its replay.
    fn push<R: Rng>(
        &self,
        steps: &mut Vec<Step>,
        choices: Vec<i64>,
        count: u32,
        expect: Expect,
        rng: &mut R,
    ) {
        steps.push(Step {
            body: body(self.kind, &choices, count).to_string(),
            key: format!("l{}", Uuid::new_v4().simple()),
            choices,
            count,
            expect,
            replay_of: None,
        });
        replay_maybe(steps, rng);
    }

    /// A random ballot: single, one option; multi and ranked, 1 to `max_choices`
    /// distinct options in a random order.
    fn ballot(&self, rng: &mut impl Rng) -> Vec<i64> {
        let mut options = self.options.clone();
        options.shuffle(rng);
        let n = match self.kind {
            Ballot::Multi | Ballot::Ranked => rng.random_range(1..=self.max_choices),
            _ => 1,
        };
        options.truncate(n);
        options
    }

    /// A budget voter: random counts on random options until the budget is spent,
    /// some over what is left; then one more.
    fn budget<R: Rng>(&self, rng: &mut R, steps: &mut Vec<Step>) {
        let mut remaining = self.votes_per_user;
        let mut spent = vec![0u32; self.options.len()];
        let mut accepted = 0;
        while remaining > 0 {
            let open: Vec<usize> = (0..spent.len())
                .filter(|&i| spent[i] < self.max_per_option)
                .collect();
            let Some(&i) = open.get(rng.random_range(0..open.len().max(1))) else {
                // Every option at its cap: votes left that no option takes.
                let expect = Expect::Refused("over_budget");
                self.push(steps, vec![self.options[0]], 1, expect, rng);
                return;
            };
            let option = self.options[i];
            let most = remaining.min(self.max_per_option - spent[i]);
            if rng.random_bool(OVER) {
                let expect = Expect::Refused("over_budget");
                self.push(steps, vec![option], most + 1, expect, rng);
                continue;
            }
            let count = match accepted + 1 >= BUDGET_STEPS {
                true => most,
                false => rng.random_range(1..=most.min(self.votes_per_user.div_ceil(3))),
            };
            remaining -= count;
            spent[i] += count;
            accepted += 1;
            let expect = Expect::Accepted {
                replaced: false,
                remaining: Some(i64::from(remaining)),
            };
            self.push(steps, vec![option], count, expect, rng);
        }
        let expect = Expect::Refused("budget_spent");
        self.push(steps, vec![self.options[0]], 1, expect, rng);
    }
}

/// Sends the last step again, now and then: same key, same body.
fn replay_maybe(steps: &mut Vec<Step>, rng: &mut impl Rng) {
    if !rng.random_bool(REPLAYS) {
        return;
    }
    let last = steps.len() - 1;
    let s = &steps[last];
    let replay = Step {
        body: s.body.clone(),
        key: s.key.clone(),
        choices: s.choices.clone(),
        count: s.count,
        expect: s.expect.clone(),
        replay_of: Some(last),
    };
    steps.push(replay);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(kind: Ballot) -> Rules {
        Rules {
            kind,
            options: vec![11, 12, 13, 14],
            allow_change: true,
            max_choices: 3,
            votes_per_user: 10,
            max_per_option: 4,
        }
    }

    #[test]
    fn a_budget_voter_spends_exactly_its_budget_within_each_cap_then_is_told_so() {
        let mut rng = rand::rng();
        for _ in 0..200 {
            let steps = rules(Ballot::Budget).voter(&mut rng);
            let mut per = std::collections::HashMap::new();
            for s in steps.iter().filter(|s| s.replay_of.is_none()) {
                if matches!(s.expect, Expect::Accepted { .. }) {
                    *per.entry(s.choices[0]).or_insert(0) += s.count;
                }
            }
            assert_eq!(per.values().sum::<u32>(), 10);
            assert!(per.values().all(|&n| n <= 4), "{per:?}");
            let last = steps.iter().rfind(|s| s.replay_of.is_none()).unwrap();
            assert_eq!(last.expect, Expect::Refused("budget_spent"));
        }
    }

    #[test]
    fn a_changed_ballot_differs_from_the_first() {
        let mut rng = rand::rng();
        for _ in 0..200 {
            let steps = rules(Ballot::Ranked).voter(&mut rng);
            let firsts: Vec<&Step> = steps.iter().filter(|s| s.replay_of.is_none()).collect();
            assert!(firsts[0].choices.len() <= 3);
            if let [a, b] = firsts[..] {
                assert_ne!(a.choices, b.choices);
            }
        }
    }
}
