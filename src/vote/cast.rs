//! The vote decision: `lua/vote_batch.lua` and its one Rust type, [`VoteBatch`]
//! (KEYS and ARGV in the layout of [`crate::batch::Call`], the reply parsed
//! exhaustively), and [`VoteDecider`] for [`crate::batch::Batcher`].

use std::net::IpAddr;
use std::sync::LazyLock;

use redis::aio::ConnectionLike;

use crate::redis_conn::Redis;

use crate::batch::{Decider, Item, ItemArg};
use crate::domain::{PollId, UserId};
use crate::error::AppError;
use crate::keys::Keys;
use crate::limit::{Decision, Policy};
use crate::lua::{lua_script, unexpected_reply};
use crate::redis_conn::acks::ReplicaAcks;

static VOTE_BATCH: LazyLock<crate::lua::Script> = lua_script!("vote_batch.lua");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoteOutcome {
    Accepted {
        count: i64,
    },
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

/// One voter's request.
#[derive(Clone, Debug)]
pub struct VoteRequest {
    pub user: UserId,
    pub option: i64,
    /// The client address, when a policy counts per address.
    pub ip: Option<IpAddr>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct VoteReply {
    pub outcome: VoteOutcome,
    /// One per policy of the vote route, in order.
    pub limits: Vec<Decision>,
}

/// `lua/vote_batch.lua` for one poll.
pub struct VoteBatch<'a> {
    pub keys: &'a Keys,
    pub poll: PollId,
    pub policies: &'a [Policy],
    /// Tests only: decide at this Redis time instead of the Redis clock.
    pub now_ms: Option<i64>,
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
                arg: ItemArg::Option(voter.option),
            })
            .collect();
        let rows = crate::batch::Call {
            script: &VOTE_BATCH,
            name: "vote_batch.lua",
            state_keys: &[&k.meta, &k.options, &k.voters, &k.tally, &k.votes],
            id: self.poll.get(),
            policies: self.policies,
            limit_key: &|policy, subject| self.keys.poll_rate_limit(self.poll, policy, subject),
            now_ms: self.now_ms,
            extra: 0,
        }
        .run(redis, &items)
        .await?;
        rows.into_iter()
            .map(|row| {
                Ok(VoteReply {
                    outcome: outcome(row.code, row.value)?,
                    limits: row.limits,
                })
            })
            .collect()
    }
}

fn outcome(code: i64, value: i64) -> Result<VoteOutcome, AppError> {
    let Some(code) = VoteCode::of(code) else {
        return Err(unexpected_reply("vote_batch.lua", (code, value)));
    };
    Ok(match code {
        VoteCode::Accepted => VoteOutcome::Accepted { count: value },
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
    }
}

/// Decides the votes of one poll in batches (see [`crate::batch`]).
pub struct VoteDecider {
    pub keys: Keys,
    /// The vote route's policies; empty when limits are off.
    pub policies: Vec<Policy>,
    /// Replicas that must have an accepted decision before it is answered.
    pub replica_acks: Option<ReplicaAcks>,
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
        };
        let Some(acks) = &self.replica_acks else {
            return call.run(&mut redis, &batch).await;
        };
        let key = self.keys.poll(poll).tally;
        let mut redis = acks.then_wait(&mut redis, &key);
        let replies = call.run(&mut redis, &batch).await?;
        redis.confirm(
            replies
                .iter()
                .any(|r| matches!(r.outcome, VoteOutcome::Accepted { .. })),
        )?;
        Ok(replies)
    }
}
