//! The report's part for `vote --ballot`: the poll's kind, what the voters' answers
//! add up to, and the tallies.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::args::Ballot;
use crate::ballots::answers::Counted;

#[derive(Serialize)]
pub struct BallotReport {
    pub ballot: Ballot,
    /// The poll's settings as made (`ballot` and the rest of its kind).
    pub settings: serde_json::Value,
    /// Voters who sent requests (the run's users).
    pub voters_sent: usize,
    #[serde(flatten)]
    pub counted: Counted,
    /// Redis's tallies at the end, and Postgres's once settled: option id -> votes.
    pub live_tallies: BTreeMap<i64, i64>,
    pub settled_tallies: BTreeMap<i64, i64>,
}

pub fn print_ballot(b: &BallotReport) {
    let c = &b.counted;
    println!("ballot: {} {}", b.ballot.as_str(), b.settings);
    println!(
        "voters: {} sent, {} with an accepted ballot; {} requests accepted ({} replaced an \
         earlier ballot{}), {} replays of a key, {} voters without a clear last answer",
        b.voters_sent,
        c.voters,
        c.accepted,
        c.replaced,
        match b.ballot {
            Ballot::Budget => format!(", {} votes given", c.votes_given),
            _ => String::new(),
        },
        c.replays,
        c.unresolved
    );
    let refused: Vec<String> = c.refused.iter().map(|(k, n)| format!("{n} {k}")).collect();
    println!(
        "refused as the rules say: {}",
        if refused.is_empty() {
            "none".to_string()
        } else {
            refused.join(", ")
        }
    );
    println!(
        "tallies: live {:?}, settled {:?}, the voters' ballots {:?}",
        b.live_tallies, b.settled_tallies, c.tallies
    );
    for e in &c.examples {
        println!("unexpected: {e}");
    }
}
