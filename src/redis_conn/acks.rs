//! Replica acknowledgements: a batch whose decisions are answered only once enough
//! replicas of its primary have them (`WAIT` behind each script call).

use redis::aio::ConnectionLike;

use super::Redis;
use crate::error::{AppError, ErrorCode};

/// With `replica_acks` set, an accepted decision is answered only once that many
/// replicas of its primary have it (`WAIT`), so a failover to one of them cannot
/// forget a 202. See "Redis Cluster" in docs/operations.md.
#[derive(Clone, Copy, Debug)]
pub struct ReplicaAcks {
    pub replicas: u32,
    pub timeout: std::time::Duration,
}

impl ReplicaAcks {
    /// From the config: `None` when `replica_acks` is 0.
    pub fn from_config(config: &crate::config::Config) -> Option<Self> {
        (config.replica_acks > 0).then_some(ReplicaAcks {
            replicas: config.replica_acks,
            timeout: config.replica_ack_timeout,
        })
    }

    /// `redis` for one batch whose accepted decisions must reach the replicas of
    /// `key`'s primary before they are answered: see [`ThenWait`].
    pub fn then_wait<'a>(&self, redis: &'a mut Redis, key: &'a str) -> ThenWait<'a> {
        ThenWait {
            redis,
            key,
            acks: *self,
            waited: None,
        }
    }

    /// `WAIT replicas timeout`.
    fn wait_cmd(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("WAIT");
        // 0 would mean "wait for ever".
        cmd.arg(self.replicas)
            .arg((self.timeout.as_millis() as u64).max(1));
        cmd
    }
}

/// A connection for one batch with replica acknowledgements: it sends each script
/// call (`EVALSHA`, and `EVAL` after a `NOSCRIPT`) with `WAIT` right behind it, in
/// one pipeline to the primary of the batch's key, so both travel on one link and
/// are lost together. Sent one after the other, a reconnect in between (or, on a
/// cluster, a slot map refreshed after a failover) would put the `WAIT` on a link
/// that has written nothing, and Redis answers such a `WAIT` at once with every
/// replica: a 202 that no replica may have. Other commands pass through.
///
/// The `WAIT` goes with every call, also one that accepts nothing, and waits until
/// a replica has the client's replication offset: as of its last command on Redis
/// 7.0 (everything written so far), of its last command that wrote from 7.2 (a
/// batch that wrote nothing, no decision and no limit state, waits only for the
/// connection's earlier writes).
/// That is about one round trip to the replica; with the replica gone, the whole
/// timeout. [`ThenWait::confirm`] reads its answer only when the batch accepted. A
/// replayed acceptance writes (the purchase script refreshes its keys hash), so its
/// `WAIT` covers the first decision on every version.
pub struct ThenWait<'a> {
    redis: &'a mut Redis,
    key: &'a str,
    acks: ReplicaAcks,
    /// What the `WAIT` behind the last script call answered.
    waited: Option<redis::RedisResult<u32>>,
}

impl ThenWait<'_> {
    /// Whether the batch may be answered: always when it accepted nothing, else
    /// only when the `WAIT` behind its script saw enough replicas have it. Too few
    /// in time: 503 `not_replicated` for the whole batch. Its decisions stand on the
    /// primary, so a retry answers `already_bought` (or `already_voted`) while that
    /// primary lives, and the order settles; a retry after a failover that lost
    /// them decides again.
    ///
    /// A `WAIT` that Redis refuses (the node that took the writes was demoted to a
    /// replica, a failover in flight) confirms nothing either: the same 503, never
    /// a 500.
    pub fn confirm(self, accepted: bool) -> Result<(), AppError> {
        if !accepted {
            return Ok(());
        }
        let acked = match self.waited {
            Some(Ok(acked)) => acked,
            Some(Err(e))
                if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) =>
            {
                tracing::warn!(error = %e, "WAIT refused: the decisions are not confirmed");
                0
            }
            Some(Err(e)) => return Err(e.into()),
            // No script was sent, so nothing was accepted: never reached.
            None => 0,
        };
        if acked < self.acks.replicas {
            return Err(AppError::new(
                ErrorCode::NotReplicated,
                "the decision was not confirmed by a Redis replica in time, but stands on the \
                 primary; retry with the same Idempotency-Key (under it a retry is never \
                 counted twice)",
            ));
        }
        Ok(())
    }
}

impl ConnectionLike for ThenWait<'_> {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        let script = matches!(cmd.args_iter().next(), Some(redis::Arg::Simple(name))
            if name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL")
                || name.eq_ignore_ascii_case(b"FCALL"));
        if !script {
            return self.redis.req_packed_command(cmd);
        }
        Box::pin(async move {
            let mut pipe = redis::pipe();
            pipe.add_command(cmd.clone())
                .add_command(self.acks.wait_cmd());
            let mut answers = self.redis.pipeline_on_primary_of(self.key, pipe).await?;
            let (Some(waited), Some(answer), true) =
                (answers.pop(), answers.pop(), answers.is_empty())
            else {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "a script and its WAIT did not get two answers",
                )));
            };
            // An error of the WAIT (refused by a node demoted to a replica) as its
            // own kind, not as "not a number".
            self.waited = Some(
                waited
                    .extract_error()
                    .and_then(|v| Ok(redis::from_redis_value(v)?)),
            );
            Ok(answer)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.redis.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.redis.get_db()
    }
}
