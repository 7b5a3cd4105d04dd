//! What the voters' answers add up to, and whether each is the one the ballot's
//! rules give (the script knows them all in advance: see `script.rs`).

use std::collections::BTreeMap;

use serde::Serialize;
use uuid::Uuid;

use super::fire::{Answer, Voted};
use super::script::{Expect, Step};
use crate::args::Ballot;

/// The run's answers, counted.
#[derive(Serialize, Default)]
pub struct Counted {
    /// Voters with at least one accepted request.
    pub voters: usize,
    /// Requests accepted (202), each once: a replay is not another.
    pub accepted: usize,
    /// Of them, ballots that replaced the voter's earlier one.
    pub replaced: usize,
    /// Budget votes given in the accepted requests.
    pub votes_given: i64,
    /// Requests sent a second time with the same key and body.
    pub replays: usize,
    /// Requests refused (not replays), by code.
    pub refused: BTreeMap<String, usize>,
    /// Voters who stopped at a request that got no clear answer.
    pub unresolved: usize,
    /// Answers (replays included) other than the rules say.
    pub unexpected: usize,
    /// A few of them, to show.
    #[serde(skip)]
    pub examples: Vec<String>,
    /// The tallies the voters' accepted ballots make: option id -> votes (every
    /// option present).
    pub tallies: BTreeMap<i64, i64>,
}

/// Each voter's receipts of its accepted requests, in order (replays left out).
pub fn receipts(voters: &[Vec<Step>], voted: &[Voted]) -> Vec<Vec<Uuid>> {
    voters
        .iter()
        .zip(voted)
        .map(|(steps, v)| {
            steps
                .iter()
                .zip(&v.answers)
                .filter(|(s, a)| s.replay_of.is_none() && a.status == 202)
                .filter_map(|(_, a)| a.receipt)
                .collect()
        })
        .collect()
}

/// The ballot that counts now of each voter (single, multi, ranked: the last
/// accepted; budget: votes per option), as the voter's answers say.
pub fn current(kind: Ballot, steps: &[Step], voted: &Voted) -> BTreeMap<i64, i64> {
    let mut out = BTreeMap::new();
    let mut accepted = steps
        .iter()
        .zip(&voted.answers)
        .filter(|(s, a)| s.replay_of.is_none() && a.status == 202)
        .map(|(s, _)| s);
    match kind {
        Ballot::Budget => {
            for s in accepted {
                *out.entry(s.choices[0]).or_default() += i64::from(s.count);
            }
        }
        Ballot::Ranked => {
            if let Some(s) = accepted.next_back() {
                out.insert(s.choices[0], 1);
            }
        }
        Ballot::Single | Ballot::Multi => {
            if let Some(s) = accepted.next_back() {
                out.extend(s.choices.iter().map(|&o| (o, 1)));
            }
        }
    }
    out
}

/// Counts the answers and checks each against the rules.
pub fn count(kind: Ballot, options: &[i64], voters: &[Vec<Step>], voted: &[Voted]) -> Counted {
    let mut c = Counted {
        tallies: options.iter().map(|&o| (o, 0)).collect(),
        ..Counted::default()
    };
    for (i, (steps, v)) in voters.iter().zip(voted).enumerate() {
        c.unresolved += usize::from(v.unresolved);
        let mut any = false;
        for (j, (step, answer)) in steps.iter().zip(&v.answers).enumerate() {
            let why = match step.replay_of {
                Some(first) => {
                    c.replays += 1;
                    (answer != &v.answers[first]).then(|| {
                        format!("answered {answer:?}, the first time {:?}", v.answers[first])
                    })
                }
                None => {
                    if answer.status == 202 {
                        any = true;
                        c.accepted += 1;
                        c.replaced += usize::from(answer.replaced == Some(true));
                        if kind == Ballot::Budget {
                            c.votes_given += i64::from(step.count);
                        }
                    } else {
                        let code = answer
                            .code
                            .clone()
                            .unwrap_or_else(|| answer.status.to_string());
                        *c.refused.entry(code).or_default() += 1;
                    }
                    mismatch(&step.expect, answer)
                }
            };
            if let Some(why) = why {
                c.unexpected += 1;
                if c.examples.len() < 5 {
                    c.examples
                        .push(format!("voter #{i} request {}: {} {why}", j + 1, step.body));
                }
            }
        }
        c.voters += usize::from(any);
        for (option, n) in current(kind, steps, v) {
            *c.tallies.entry(option).or_default() += n;
        }
    }
    c
}

/// Why `answer` is not what `expect` says (`None`: it is).
fn mismatch(expect: &Expect, answer: &Answer) -> Option<String> {
    let ok = match expect {
        Expect::Accepted {
            replaced,
            remaining,
        } => {
            answer.status == 202
                && answer.receipt.is_some()
                && answer.replaced == Some(*replaced)
                && (remaining.is_none() || answer.remaining == *remaining)
        }
        Expect::Refused(code) => {
            matches!(answer.status, 409 | 422) && answer.code.as_deref() == Some(*code)
        }
    };
    (!ok).then(|| format!("expected {expect:?}, answered {answer:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(choices: Vec<i64>, count: u32, expect: Expect, replay_of: Option<usize>) -> Step {
        Step {
            body: String::new(),
            key: String::new(),
            choices,
            count,
            expect,
            replay_of,
        }
    }

    fn answer(status: u16, code: Option<&str>, receipt: u128, replaced: bool) -> Answer {
        Answer {
            status,
            code: code.map(String::from),
            receipt: (status == 202).then(|| Uuid::from_u128(receipt)),
            replaced: (status == 202).then_some(replaced),
            remaining: None,
        }
    }

    #[test]
    fn a_replaced_ballot_counts_once_and_a_replay_must_repeat_the_first_answer() {
        let changed = Expect::Accepted {
            replaced: true,
            remaining: None,
        };
        let first = Expect::Accepted {
            replaced: false,
            remaining: None,
        };
        let voters = vec![vec![
            step(vec![1, 2], 1, first.clone(), None),
            step(vec![1, 2], 1, first, Some(0)),
            step(vec![3], 1, changed, None),
        ]];
        let voted = vec![Voted {
            answers: vec![
                answer(202, None, 1, false),
                answer(202, None, 1, false),
                answer(202, None, 2, true),
            ],
            unresolved: false,
        }];
        let c = count(Ballot::Multi, &[1, 2, 3], &voters, &voted);
        assert_eq!(
            (c.accepted, c.replaced, c.replays, c.unexpected),
            (2, 1, 1, 0)
        );
        assert_eq!(c.tallies, BTreeMap::from([(1, 0), (2, 0), (3, 1)]));
        assert_eq!(
            receipts(&voters, &voted),
            [vec![Uuid::from_u128(1), Uuid::from_u128(2)]]
        );

        let mut wrong = voted;
        wrong[0].answers[1] = answer(202, None, 9, false);
        assert_eq!(
            count(Ballot::Multi, &[1, 2, 3], &voters, &wrong).unexpected,
            1
        );
    }
}
