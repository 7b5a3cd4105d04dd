//! The instant-runoff (IRV) result of a `ranked` poll, computed from its stored ballots.
//!
//! Pure: no Redis, no SQL. The same ballots give the same [`Runoff`] on every server and
//! after a restart, whatever order the ballots come in: options are indices in their poll
//! position order, tallies are arrays, and no hash map is ever iterated.
//!
//! # The count
//! - A ballot is a ranking, most preferred first. Ids that are not options of the poll are
//!   skipped, and so are repeats after an id's first occurrence. A ballot left with no
//!   option of the poll is not counted (it is not in [`Runoff::ballots`]).
//! - Each round, every ballot counts for its highest-ranked option still standing; a ballot
//!   with none left is exhausted.
//! - An option with more than half of the round's non-exhausted votes wins, and the count
//!   stops. If only one option stands, it wins.
//! - Otherwise exactly one option is eliminated: the one with the fewest votes this round.
//!   Ties are broken by [`TIE_RULE`]: among those tied for fewest, the one with fewer
//!   first-preference votes (round 1) goes; still tied, the one with fewer votes in the
//!   previous round, going back round by round; still tied, the one listed later in the
//!   poll goes. The same rule settles options tied at zero votes, one per round.
//! - With no counted ballot there is one round with every option at 0, no elimination, and
//!   no winner.
//!
//! # Cost
//! Ballots are turned once into slices of option indices; each ballot keeps a cursor on its
//! current choice that only moves forward, so a round is one pass over the ballots and the
//! whole count is O(rounds × ballots + total ranking length).

/// The tie-break rule, served with every result.
pub const TIE_RULE: &str = "Each round the option with the fewest votes is eliminated, one per round; \
     among options tied for fewest, the one with fewer first-preference votes goes, then the one \
     with fewer votes in the previous round (going back round by round), and if still tied the \
     one listed later in the poll goes.";

/// One round of the count.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Round {
    /// 1, 2, ...
    pub round: u32,
    /// Every option still standing this round, in the poll's option order, with its votes.
    pub tallies: Vec<RoundTally>,
    /// Ballots with no standing option left.
    pub exhausted: u64,
    /// Option ids eliminated at the end of this round (empty in the final round).
    pub eliminated: Vec<i64>,
}

/// One standing option's votes in a round.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct RoundTally {
    pub option_id: i64,
    pub votes: u64,
}

/// The instant-runoff result of a ranked poll.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Runoff {
    /// Ballots counted (those naming at least one option of the poll).
    pub ballots: u64,
    pub rounds: Vec<Round>,
    /// `None` only when no ballot was counted.
    pub winner: Option<i64>,
    /// One sentence stating the tie-break rule ([`TIE_RULE`]).
    pub tie_rule: &'static str,
}

/// Counts `ballots` by instant runoff.
///
/// `options`: the poll's option ids in their position order (a repeated id is kept at its
/// first position only). `ballots`: each a ranking, most preferred first; ids not in
/// `options` are skipped, repeats after the first occurrence are skipped; never panics.
pub fn instant_runoff<'a>(options: &[i64], ballots: impl IntoIterator<Item = &'a [i64]>) -> Runoff {
    let options = distinct(options);
    let ballots = Ballots::index(&options, ballots);
    let (rounds, winner) = if ballots.is_empty() {
        (vec![round_without_ballots(&options)], None)
    } else {
        let (rounds, winner) = count_rounds(&options, &ballots);
        (rounds, Some(winner))
    };
    Runoff {
        ballots: ballots.len() as u64,
        rounds,
        winner,
        tie_rule: TIE_RULE,
    }
}

/// The single round of a count without ballots: every option at 0, none eliminated.
fn round_without_ballots(options: &[i64]) -> Round {
    Round {
        round: 1,
        tallies: options
            .iter()
            .map(|&option_id| RoundTally {
                option_id,
                votes: 0,
            })
            .collect(),
        exhausted: 0,
        eliminated: Vec::new(),
    }
}

/// Rounds until one option wins; `ballots` is not empty, so one does.
fn count_rounds(options: &[i64], ballots: &Ballots) -> (Vec<Round>, i64) {
    let mut standing = vec![true; options.len()];
    let mut cursors = ballots.starts();
    // Every round's tallies by option index, for the tie-break's look back.
    let mut history: Vec<Vec<u64>> = Vec::new();
    let mut rounds = Vec::new();
    loop {
        let (tally, exhausted) = ballots.tally(&mut cursors, &standing);
        let alive: Vec<usize> = (0..options.len()).filter(|&i| standing[i]).collect();
        let tallies = alive
            .iter()
            .map(|&i| RoundTally {
                option_id: options[i],
                votes: tally[i],
            })
            .collect();
        let live = ballots.len() as u64 - exhausted;
        let winner = winner(&alive, &tally, live);
        history.push(tally);
        let eliminated = match winner {
            Some(_) => Vec::new(),
            None => {
                let loser = loser(&alive, &history);
                standing[loser] = false;
                vec![options[loser]]
            }
        };
        rounds.push(Round {
            round: rounds.len() as u32 + 1,
            tallies,
            exhausted,
            eliminated,
        });
        if let Some(i) = winner {
            return (rounds, options[i]);
        }
    }
}

/// The option (index) that wins this round: more than half of the `live` (non-exhausted)
/// votes, or the last one standing.
fn winner(alive: &[usize], tally: &[u64], live: u64) -> Option<usize> {
    match alive {
        [only] => Some(*only),
        _ => alive.iter().copied().find(|&i| tally[i] * 2 > live),
    }
}

/// `options` without repeats, each at its first position.
fn distinct(options: &[i64]) -> Vec<i64> {
    let mut out: Vec<i64> = Vec::with_capacity(options.len());
    for &id in options {
        if !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

/// The option (index) eliminated this round: the last round of `history` is this one.
/// Fewest votes now; then fewer in round 1; then fewer in each earlier round, latest
/// first; then the later position.
fn loser(alive: &[usize], history: &[Vec<u64>]) -> usize {
    let now = history.len() - 1;
    let order = std::iter::once(now)
        .chain(std::iter::once(0))
        .chain((0..now).rev());
    let mut tied = alive.to_vec();
    for r in order {
        let fewest = tied.iter().map(|&i| history[r][i]).min().unwrap_or(0);
        tied.retain(|&i| history[r][i] == fewest);
        if tied.len() == 1 {
            break;
        }
    }
    // `tied` is in position order and never empty: the later position goes.
    *tied.last().expect("at least one option tied for fewest")
}

/// Ballots as slices of option indices in one flat buffer (one allocation, not one per
/// ballot: there may be hundreds of thousands).
struct Ballots {
    choices: Vec<u32>,
    /// `ends[b]`: where ballot `b`'s choices end in `choices`; it starts at `ends[b - 1]`.
    ends: Vec<usize>,
}

impl Ballots {
    fn index<'a>(options: &[i64], ballots: impl IntoIterator<Item = &'a [i64]>) -> Self {
        let mut by_id: Vec<(i64, u32)> = options
            .iter()
            .enumerate()
            .map(|(i, &id)| (id, i as u32))
            .collect();
        by_id.sort_unstable();
        let mut seen = vec![false; options.len()];
        let mut choices = Vec::new();
        let mut ends = Vec::new();
        for ranking in ballots {
            let start = choices.len();
            for id in ranking {
                let Ok(at) = by_id.binary_search_by_key(id, |&(id, _)| id) else {
                    continue;
                };
                let i = by_id[at].1;
                if !std::mem::replace(&mut seen[i as usize], true) {
                    choices.push(i);
                }
            }
            for &i in &choices[start..] {
                seen[i as usize] = false;
            }
            if choices.len() > start {
                ends.push(choices.len());
            }
        }
        Ballots { choices, ends }
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Each ballot's cursor on its first choice.
    fn starts(&self) -> Vec<usize> {
        std::iter::once(0)
            .chain(self.ends.iter().copied())
            .take(self.ends.len())
            .collect()
    }

    /// Moves each cursor to its ballot's highest-ranked standing option and counts the
    /// votes by option index, and the exhausted ballots.
    fn tally(&self, cursors: &mut [usize], standing: &[bool]) -> (Vec<u64>, u64) {
        let mut tally = vec![0u64; standing.len()];
        let mut exhausted = 0;
        for (cursor, &end) in cursors.iter_mut().zip(&self.ends) {
            while *cursor < end && !standing[self.choices[*cursor] as usize] {
                *cursor += 1;
            }
            if *cursor < end {
                tally[self.choices[*cursor] as usize] += 1;
            } else {
                exhausted += 1;
            }
        }
        (tally, exhausted)
    }
}

/// Parses a ballot as the voters hash keeps it: `"<ids>"` or `"<seq>|<ids>"`, `<ids>`
/// comma-separated decimal option ids (`"7"`, `"3|12,7,9"`). The ids in order, or `None`
/// for malformed text.
pub fn parse_stored(value: &str) -> Option<Vec<i64>> {
    let ids = match value.split_once('|') {
        Some((seq, ids)) => {
            decimal(seq)?;
            ids
        }
        None => value,
    };
    ids.split(',').map(decimal).collect()
}

/// A non-empty run of ASCII digits that fits an `i64`.
fn decimal(text: &str) -> Option<i64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    /// `n` copies of each ranking, in the order given.
    fn ballots(spec: &[(usize, &[i64])]) -> Vec<Vec<i64>> {
        spec.iter()
            .flat_map(|&(n, ranking)| std::iter::repeat_n(ranking.to_vec(), n))
            .collect()
    }

    fn count(options: &[i64], ballots: &[Vec<i64>]) -> Runoff {
        instant_runoff(options, ballots.iter().map(Vec::as_slice))
    }

    /// A round's tallies as `(option_id, votes)` pairs.
    fn tallies(round: &Round) -> Vec<(i64, u64)> {
        round
            .tallies
            .iter()
            .map(|t| (t.option_id, t.votes))
            .collect()
    }

    fn eliminated(result: &Runoff) -> Vec<i64> {
        result
            .rounds
            .iter()
            .flat_map(|r| r.eliminated.clone())
            .collect()
    }

    #[test]
    fn a_majority_of_first_preferences_wins_in_round_one() {
        let result = count(&[1, 2, 3], &ballots(&[(3, &[1]), (1, &[2, 1]), (1, &[3])]));
        assert_eq!(result.ballots, 5);
        assert_eq!(result.rounds.len(), 1);
        assert_eq!(tallies(&result.rounds[0]), [(1, 3), (2, 1), (3, 1)]);
        assert!(result.rounds[0].eliminated.is_empty());
        assert_eq!(result.winner, Some(1));
        assert_eq!(result.tie_rule, TIE_RULE);
    }

    #[test]
    fn the_plurality_leader_loses_to_transfers_in_round_three() {
        let result = count(
            &[1, 2, 3, 4],
            &ballots(&[(8, &[1]), (7, &[2, 3]), (6, &[3]), (2, &[4, 3])]),
        );
        let rounds: Vec<_> = result
            .rounds
            .iter()
            .map(|r| (r.round, tallies(r), r.exhausted, r.eliminated.clone()))
            .collect();
        assert_eq!(
            rounds,
            [
                (1, vec![(1, 8), (2, 7), (3, 6), (4, 2)], 0, vec![4]),
                (2, vec![(1, 8), (2, 7), (3, 8)], 0, vec![2]),
                (3, vec![(1, 8), (3, 15)], 0, vec![]),
            ]
        );
        assert_eq!(result.winner, Some(3));
    }

    #[test]
    fn exhausted_ballots_leave_the_majority_threshold() {
        // Round 2: 4 of the 7 ballots still counting is a majority, 4 of 9 would not be.
        let result = count(&[1, 2, 3], &ballots(&[(4, &[1]), (3, &[2]), (2, &[3])]));
        assert_eq!(result.rounds.len(), 2);
        assert_eq!(result.rounds[0].eliminated, [3]);
        assert_eq!(tallies(&result.rounds[1]), [(1, 4), (2, 3)]);
        assert_eq!(result.rounds[1].exhausted, 2);
        assert_eq!(result.winner, Some(1));
    }

    #[test]
    fn a_tie_for_fewest_eliminates_the_one_with_fewer_first_preferences() {
        // Round 2: 2 and 3 tie at 4; 2 had 3 first preferences, 3 had 4. (Position
        // alone would have eliminated 3.)
        let result = count(
            &[1, 2, 3, 4],
            &ballots(&[(6, &[1]), (3, &[2]), (4, &[3]), (1, &[4, 2])]),
        );
        assert_eq!(tallies(&result.rounds[1]), [(1, 6), (2, 4), (3, 4)]);
        assert_eq!(eliminated(&result), [4, 2]);
        assert_eq!(result.rounds[2].exhausted, 4);
        assert_eq!(result.winner, Some(1));
    }

    #[test]
    fn a_tie_in_first_preferences_eliminates_the_one_with_fewer_votes_the_round_before() {
        // Round 3: 2 and 3 tie at 4 and had 3 first preferences each; in round 2, 2 had 3
        // and 3 had 4, so 2 goes. (Position alone would have eliminated 3.)
        let result = count(
            &[1, 2, 3, 4, 5],
            &ballots(&[
                (8, &[1]),
                (3, &[2]),
                (3, &[3]),
                (1, &[4, 2]),
                (1, &[4]),
                (1, &[5, 3]),
            ]),
        );
        assert_eq!(
            tallies(&result.rounds[0]),
            [(1, 8), (2, 3), (3, 3), (4, 2), (5, 1)]
        );
        assert_eq!(tallies(&result.rounds[1]), [(1, 8), (2, 3), (3, 4), (4, 2)]);
        assert_eq!(tallies(&result.rounds[2]), [(1, 8), (2, 4), (3, 4)]);
        assert_eq!(eliminated(&result), [5, 4, 2]);
        assert_eq!(result.winner, Some(1));
    }

    #[test]
    fn a_tie_through_every_round_eliminates_the_one_listed_later() {
        // 4 and 5 tie at zero (one a round, the later first), then 1 and 2 tie at 2 in every
        // round: 2, listed later, goes.
        let result = count(
            &[1, 2, 3, 4, 5],
            &ballots(&[(2, &[1]), (2, &[2]), (1, &[3])]),
        );
        assert_eq!(eliminated(&result), [5, 4, 3, 2]);
        assert_eq!(tallies(&result.rounds[3]), [(1, 2), (2, 2)]);
        assert_eq!(result.rounds[3].exhausted, 1);
        assert_eq!(tallies(&result.rounds[4]), [(1, 2)]);
        assert_eq!(result.winner, Some(1));
    }

    #[test]
    fn the_position_rule_follows_the_options_order_not_the_ids() {
        let result = count(
            &[30, 10, 20],
            &ballots(&[(1, &[30]), (1, &[10]), (1, &[20])]),
        );
        assert_eq!(eliminated(&result), [20, 10]);
        assert_eq!(result.winner, Some(30));
    }

    #[test]
    fn no_ballots_give_one_round_at_zero_and_no_winner() {
        let empty = count(&[4, 2, 9], &[]);
        assert_eq!(
            empty,
            Runoff {
                ballots: 0,
                rounds: vec![Round {
                    round: 1,
                    tallies: vec![
                        RoundTally {
                            option_id: 4,
                            votes: 0
                        },
                        RoundTally {
                            option_id: 2,
                            votes: 0
                        },
                        RoundTally {
                            option_id: 9,
                            votes: 0
                        },
                    ],
                    exhausted: 0,
                    eliminated: vec![],
                }],
                winner: None,
                tie_rule: TIE_RULE,
            }
        );
        // A ballot naming no option of the poll is not counted.
        assert_eq!(count(&[4, 2, 9], &[vec![], vec![5, 6]]), empty);
    }

    #[test]
    fn unknown_ids_and_repeats_are_skipped() {
        let messy = vec![
            vec![99, 10, 10, 20],
            vec![20, 20, -1, 30],
            vec![30, 99, 20, 30],
        ];
        let clean = vec![vec![10, 20], vec![20, 30], vec![30, 20]];
        let result = count(&[10, 20, 30], &messy);
        assert_eq!(result, count(&[10, 20, 30], &clean));
        assert_eq!(result.ballots, 3);
        assert_eq!(tallies(&result.rounds[0]), [(10, 1), (20, 1), (30, 1)]);
        assert_eq!(eliminated(&result), [30]);
        assert_eq!(tallies(&result.rounds[1]), [(10, 1), (20, 2)]);
        assert_eq!(result.winner, Some(20));
    }

    #[test]
    fn a_repeated_option_id_counts_once_at_its_first_position() {
        let result = count(&[1, 2, 1], &ballots(&[(1, &[1]), (1, &[2])]));
        assert_eq!(tallies(&result.rounds[0]), [(1, 1), (2, 1)]);
        assert_eq!(result.winner, Some(1));
    }

    #[test]
    fn the_result_is_the_same_whatever_the_ballot_order() {
        let mut rng = StdRng::seed_from_u64(51);
        let options = [5, 3, 8, 1, 13, 2];
        let mut all = random_ballots(&mut rng, &options, 2_000);
        let first = count(&options, &all);
        assert!(first.rounds.len() > 1, "a count worth shuffling");
        for _ in 0..20 {
            all.shuffle(&mut rng);
            assert_eq!(count(&options, &all), first);
        }
    }

    #[test]
    fn parse_stored_reads_ids_with_or_without_a_sequence() {
        assert_eq!(parse_stored("7"), Some(vec![7]));
        assert_eq!(parse_stored("3|12,7,9"), Some(vec![12, 7, 9]));
        assert_eq!(parse_stored("12,7"), Some(vec![12, 7]));
        assert_eq!(parse_stored("0|7"), Some(vec![7]));
        for bad in [
            "",
            "|",
            "|7",
            "3|",
            "a",
            "7a",
            "1,,2",
            "1,",
            ",1",
            " 1",
            "1 ",
            "+1",
            "-1",
            "1|2|3",
            "x|3",
            "3|x",
            "99999999999999999999",
        ] {
            assert_eq!(parse_stored(bad), None, "{bad:?}");
        }
    }

    /// Rankings of 1 to all `options`, with now and then an unknown id or a repeat.
    fn random_ballots(rng: &mut StdRng, options: &[i64], n: usize) -> Vec<Vec<i64>> {
        (0..n)
            .map(|_| {
                let mut ranking = options.to_vec();
                ranking.shuffle(rng);
                ranking.truncate(rng.random_range(1..=options.len()));
                if rng.random_ratio(1, 10) {
                    let at = rng.random_range(0..=ranking.len());
                    let noise = if rng.random_bool(0.5) {
                        1_000
                    } else {
                        ranking[0]
                    };
                    ranking.insert(at, noise);
                }
                ranking
            })
            .collect()
    }

    #[test]
    fn random_elections_keep_the_count_invariants() {
        let mut rng = StdRng::seed_from_u64(0x1a51);
        for election in 0..400 {
            let mut options: Vec<i64> = (1..=rng.random_range(1..=6)).collect();
            options.shuffle(&mut rng);
            let n = rng.random_range(0..=40);
            let all = random_ballots(&mut rng, &options, n);
            let result = count(&options, &all);
            let ctx = format!("election {election}: {options:?} {all:?} -> {result:#?}");

            let mut standing = options.clone();
            let last = result.rounds.len() - 1;
            for (k, round) in result.rounds.iter().enumerate() {
                assert_eq!(round.round as usize, k + 1, "{ctx}");
                let ids: Vec<i64> = round.tallies.iter().map(|t| t.option_id).collect();
                assert_eq!(ids, standing, "standing options in position order; {ctx}");
                let votes: u64 = round.tallies.iter().map(|t| t.votes).sum();
                assert_eq!(votes + round.exhausted, result.ballots, "{ctx}");
                if k == last {
                    assert!(round.eliminated.is_empty(), "{ctx}");
                    continue;
                }
                assert_eq!(round.eliminated.len(), 1, "{ctx}");
                let gone = round.eliminated[0];
                let fewest = round.tallies.iter().map(|t| t.votes).min();
                let gone_votes = round.tallies.iter().find(|t| t.option_id == gone);
                assert_eq!(gone_votes.map(|t| t.votes), fewest, "{ctx}");
                standing.retain(|&id| id != gone);
            }

            let counted = all
                .iter()
                .filter(|b| b.iter().any(|id| options.contains(id)));
            assert_eq!(result.ballots, counted.count() as u64, "{ctx}");
            let final_round = &result.rounds[last];
            match result.winner {
                None => {
                    assert_eq!(result.ballots, 0, "{ctx}");
                    assert_eq!(result.rounds.len(), 1, "{ctx}");
                }
                Some(winner) => {
                    let votes = final_round.tallies.iter().find(|t| t.option_id == winner);
                    let votes = votes.expect("the winner stands in the final round").votes;
                    let live = result.ballots - final_round.exhausted;
                    assert!(votes * 2 > live || final_round.tallies.len() == 1, "{ctx}");
                }
            }
        }
    }
}
