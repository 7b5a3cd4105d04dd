//! The vote decision: `lua/vote_batch.lua` and its one Rust type, [`VoteBatch`]
//! (KEYS and ARGV in the layout of [`crate::batch::Call`], the reply parsed
//! exhaustively), and [`VoteDecider`] for [`crate::batch::Batcher`].

use std::net::IpAddr;
use std::sync::LazyLock;

use redis::aio::ConnectionLike;

use crate::redis_conn::Redis;

use crate::batch::{Decider, Item, ItemArg};
use crate::domain::{PollId, PurchaseKey, UserId};
use crate::error::AppError;
use crate::keys::Keys;
use crate::limit::{Decision, Policy};
use crate::lua::{lua_function, unexpected_reply};
use crate::redis_conn::acks::ReplicaAcks;
use crate::settle::{Accepted, VoteDetail};

static VOTE_BATCH: LazyLock<crate::lua::Script> = lua_function!("vote_batch.lua", "vote_batch");

/// The vote decision script (`lua/vote_batch.lua`, run as a Redis function): for
/// the tools that measure it alone (`examples/lua_function.rs`).
pub fn decision_script() -> &'static crate::lua::Script {
    &VOTE_BATCH
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoteOutcome {
    Accepted {
        /// The first choice's count now.
        count: i64,
        /// The voter's accepted requests in this poll, this one included: it names
        /// the receipt (`receipt.rs`).
        seq: i32,
        /// A ballot replaced the voter's earlier one (`allow_change`).
        replaced: bool,
        /// A budget poll: votes the voter has left, overall and for this option
        /// (0 in other polls).
        remaining: i64,
        option_remaining: i64,
    },
    /// A budget poll: the voter has nothing left to spend.
    BudgetSpent {
        option_remaining: i64,
    },
    /// A budget poll: more than is left, overall or for the option; nothing spent.
    OverBudget {
        remaining: i64,
        option_remaining: i64,
    },
    /// The ballot's shape is not this poll's kind, or it lists too many options.
    InvalidBallot,
    /// The Idempotency-Key was first used with another ballot.
    KeyReused,
    AlreadyVoted,
    NotOpen {
        opens_in_ms: i64,
    },
    Closed,
    UnknownOption,
    /// Redis does not hold this poll: unknown, or lost (wiped). Postgres decides which.
    NotLoaded,
    /// Redis holds the poll but this Redis run has not verified it: rebuild first.
    Recovering,
    /// A policy of the vote route refused; nothing was counted.
    RateLimited {
        retry_after_ms: u64,
    },
    /// A token-bucket policy costs more than it can ever hold.
    RateLimitUnsatisfiable,
}

/// What a voter sends, by the poll's kind (checked as it is parsed,
/// `ballot::VoteBody::ballot`: positive ids, distinct, a count of at least 1; the
/// script checks the rest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ballot {
    Single(i64),
    Multi(Vec<i64>),
    Ranked(Vec<i64>),
    Budget { option: i64, count: u32 },
}

impl Ballot {
    /// The first choice (a budget vote's option).
    pub fn first(&self) -> i64 {
        match self {
            Ballot::Single(o) | Ballot::Budget { option: o, .. } => *o,
            Ballot::Multi(ids) | Ballot::Ranked(ids) => ids.first().copied().unwrap_or(0),
        }
    }

    /// The ballot as `lua/vote_batch.lua` reads it: `7`, `m7,9`, `r9,7`, `7*3`.
    pub fn lua_text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let list = |out: &mut String, prefix: char, ids: &[i64]| {
            out.push(prefix);
            for (k, id) in ids.iter().enumerate() {
                if k > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{id}");
            }
        };
        match self {
            Ballot::Single(o) => {
                let _ = write!(out, "{o}");
            }
            Ballot::Multi(ids) => list(&mut out, 'm', ids),
            Ballot::Ranked(ids) => list(&mut out, 'r', ids),
            Ballot::Budget { option, count } => {
                let _ = write!(out, "{option}*{count}");
            }
        }
        out
    }
}

/// One voter's request.
#[derive(Clone, Debug)]
pub struct VoteRequest {
    pub user: UserId,
    pub ballot: Ballot,
    /// The request's Idempotency-Key, if any.
    pub key: Option<PurchaseKey>,
    /// The client address, when a policy counts per address.
    pub ip: Option<IpAddr>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct VoteReply {
    pub outcome: VoteOutcome,
    /// One per policy of the vote route, in order.
    pub limits: Vec<Decision>,
    /// The first answer to this Idempotency-Key, given again.
    pub replayed: bool,
}

/// `lua/vote_batch.lua` for one poll.
pub struct VoteBatch<'a> {
    pub keys: &'a Keys,
    pub poll: PollId,
    pub policies: &'a [Policy],
    /// Tests only: decide at this Redis time instead of the Redis clock.
    pub now_ms: Option<i64>,
    /// How long the poll's Idempotency-Keys are remembered after the last, in ms.
    pub key_ttl_ms: u64,
}

impl VoteBatch<'_> {
    /// Decides every vote in order, in one call.
    pub async fn run<C: ConnectionLike>(
        &self,
        redis: &mut C,
        voters: &[VoteRequest],
    ) -> Result<Vec<VoteReply>, AppError> {
        if voters.is_empty() {
            return Ok(Vec::new());
        }
        let k = self.keys.poll(self.poll);
        let items: Vec<Item> = voters
            .iter()
            .map(|voter| Item {
                user: voter.user,
                ip: voter.ip,
                arg: match (&voter.ballot, voter.key) {
                    (Ballot::Single(option), None) => ItemArg::Option(*option),
                    (ballot, None) => ItemArg::Text(ballot.lua_text()),
                    (ballot, Some(key)) => {
                        ItemArg::Text(format!("{} {}", ballot.lua_text(), key.as_str()))
                    }
                },
            })
            .collect();
        let rows = crate::batch::Call {
            script: &VOTE_BATCH,
            name: "vote_batch.lua",
            state_keys: &[&k.meta, &k.options, &k.voters, &k.tally, &k.votes, &k.keys],
            id: self.poll.get(),
            policies: self.policies,
            limit_key: &|policy, subject| self.keys.poll_rate_limit(self.poll, policy, subject),
            now_ms: self.now_ms,
            extra: self.key_ttl_ms,
        }
        .run(redis, &items)
        .await?;
        rows.into_iter()
            .map(|row| {
                let (outcome, replayed) = if row.code == crate::batch::REPLAYED {
                    (replayed(row.text.as_deref().unwrap_or_default())?, true)
                } else {
                    (outcome(row.code, row.value, row.text.as_deref())?, false)
                };
                Ok(VoteReply {
                    outcome,
                    limits: row.limits,
                    replayed,
                })
            })
            .collect()
    }
}

/// A replay's stored answer: `<code>:<value>:<text>`.
fn replayed(stored: &str) -> Result<VoteOutcome, AppError> {
    let wrong = || unexpected_reply("vote_batch.lua", ("replayed", stored.to_string()));
    let mut parts = stored.splitn(3, ':');
    let code = parts
        .next()
        .and_then(|c| c.parse().ok())
        .ok_or_else(wrong)?;
    let value = parts
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(wrong)?;
    let text = parts.next().filter(|t| !t.is_empty());
    match code {
        0 | 1 | 9 | 10 => outcome(code, value, text),
        _ => Err(wrong()),
    }
}

/// `n` numbers of an answer's text, separated by ':'.
fn numbers<const N: usize>(text: Option<&str>) -> Option<[i64; N]> {
    let mut out = [0; N];
    let mut parts = text?.split(':');
    for slot in &mut out {
        *slot = parts.next()?.parse().ok()?;
    }
    parts.next().is_none().then_some(out)
}

fn outcome(code: i64, value: i64, text: Option<&str>) -> Result<VoteOutcome, AppError> {
    let wrong = || unexpected_reply("vote_batch.lua", (code, value, text.map(str::to_string)));
    let Some(code) = VoteCode::of(code) else {
        return Err(wrong());
    };
    Ok(match code {
        VoteCode::Accepted => match text {
            // A first single ballot says nothing more.
            None => VoteOutcome::Accepted {
                count: value,
                seq: 1,
                replaced: false,
                remaining: 0,
                option_remaining: 0,
            },
            Some(_) => {
                let [seq, replaced, remaining, option_remaining] =
                    numbers::<4>(text).ok_or_else(wrong)?;
                VoteOutcome::Accepted {
                    count: value,
                    seq: i32::try_from(seq).map_err(|_| wrong())?,
                    replaced: replaced == 1,
                    remaining,
                    option_remaining,
                }
            }
        },
        VoteCode::BudgetSpent => {
            let [_, option_remaining] = numbers::<2>(text).ok_or_else(wrong)?;
            VoteOutcome::BudgetSpent { option_remaining }
        }
        VoteCode::OverBudget => {
            let [remaining, option_remaining] = numbers::<2>(text).ok_or_else(wrong)?;
            VoteOutcome::OverBudget {
                remaining,
                option_remaining,
            }
        }
        VoteCode::Replayed => return Err(wrong()),
        VoteCode::KeyReused => VoteOutcome::KeyReused,
        VoteCode::InvalidBallot => VoteOutcome::InvalidBallot,
        VoteCode::AlreadyVoted => VoteOutcome::AlreadyVoted,
        VoteCode::NotOpen => VoteOutcome::NotOpen { opens_in_ms: value },
        VoteCode::Closed => VoteOutcome::Closed,
        VoteCode::NotLoaded => VoteOutcome::NotLoaded,
        VoteCode::UnknownOption => VoteOutcome::UnknownOption,
        VoteCode::Recovering => VoteOutcome::Recovering,
        VoteCode::RateLimited => VoteOutcome::RateLimited {
            retry_after_ms: value.max(0) as u64,
        },
        VoteCode::LimitNever => VoteOutcome::RateLimitUnsatisfiable,
    })
}

crate::lua::reply_codes! {
    /// What `lua/vote_batch.lua` answers for each voter, as its header lists them.
    pub enum VoteCode in "vote_batch.lua", checked_by vote_codes_are_the_scripts {
        Accepted = 0, "accepted";
        AlreadyVoted = 1, "already voted";
        NotOpen = 2, "not open yet";
        Closed = 3, "closed";
        NotLoaded = 4, "not loaded";
        UnknownOption = 5, "unknown option";
        Recovering = 6, "recovering";
        RateLimited = 7, "rate limited";
        LimitNever = 8, "rate limit never satisfiable";
        BudgetSpent = 9, "budget spent";
        OverBudget = 10, "over budget";
        Replayed = 11, "replayed";
        KeyReused = 12, "key used with another ballot";
        InvalidBallot = 13, "invalid ballot";
    }
}

/// Decides the votes of one poll in batches (see [`crate::batch`]).
pub struct VoteDecider {
    pub keys: Keys,
    /// The vote route's policies; empty when limits are off.
    pub policies: Vec<Policy>,
    /// Replicas that must have an accepted decision before it is answered.
    pub replica_acks: Option<ReplicaAcks>,
    /// How long Idempotency-Keys are remembered (the purchase's setting).
    pub key_ttl_ms: u64,
    /// Where accepted votes are kept until settled (see [`crate::settle::kept`]).
    pub kept: Option<std::sync::Arc<super::kept::KeptVotes>>,
}

impl Decider for VoteDecider {
    type Key = PollId;
    type Request = VoteRequest;
    type Reply = VoteReply;

    async fn decide(
        &self,
        mut redis: Redis,
        poll: PollId,
        batch: Vec<VoteRequest>,
    ) -> Result<Vec<VoteReply>, AppError> {
        let call = VoteBatch {
            keys: &self.keys,
            poll,
            policies: &self.policies,
            now_ms: None,
            key_ttl_ms: self.key_ttl_ms,
        };
        // Held until the batch's accepted votes are kept: a rebuild's flush waits
        // for it, since Redis may have accepted them before the rebuild's fence.
        let _deciding = self.kept.as_ref().map(|k| k.deciding(poll.get()));
        let keep = |replies: &[VoteReply]| {
            if let Some(kept) = &self.kept {
                kept.keep_decided(kept_rows(poll, &batch, replies));
            }
        };
        let Some(acks) = &self.replica_acks else {
            let replies = call.run(&mut redis, &batch).await?;
            keep(&replies);
            return Ok(replies);
        };
        let key = self.keys.poll(poll).tally;
        let mut redis = acks.then_wait(&mut redis, &key);
        let replies = call.run(&mut redis, &batch).await?;
        // Kept whether or not a replica has them (as purchases are).
        keep(&replies);
        redis.confirm(
            replies
                .iter()
                .any(|r| matches!(r.outcome, VoteOutcome::Accepted { .. })),
        )?;
        Ok(replies)
    }
}

/// The votes a batch of `poll` accepted, to keep, as `lua/vote_batch.lua` records
/// them in the stream, each with whether it was a replay (a replay's ballot is its
/// key's first: the script answers another ballot `idempotency_key_reused`).
fn kept_rows(poll: PollId, batch: &[VoteRequest], replies: &[VoteReply]) -> Vec<(bool, Accepted)> {
    let at = chrono::Utc::now();
    batch
        .iter()
        .zip(replies)
        .filter_map(|(req, reply)| match reply {
            VoteReply {
                outcome: VoteOutcome::Accepted { seq, .. },
                replayed,
                ..
            } => Some((
                *replayed,
                Accepted {
                    id: None,
                    owner: poll.get(),
                    user: req.user.get(),
                    value: req.ballot.first(),
                    at,
                    key: req.key.as_ref().map(|k| k.as_str().to_owned()),
                    vote: Some(VoteDetail {
                        seq: *seq,
                        choices: match &req.ballot {
                            Ballot::Multi(ids) | Ballot::Ranked(ids) => Some(ids.clone()),
                            Ballot::Single(_) | Ballot::Budget { .. } => None,
                        },
                        count: match req.ballot {
                            Ballot::Budget { count, .. } => {
                                i32::try_from(count).unwrap_or(i32::MAX)
                            }
                            _ => 1,
                        },
                    }),
                },
            )),
            _ => None,
        })
        .collect()
}
