//! Decisions in batches: requests for the same sale (or poll) that arrive together
//! are decided by one script call, each answered in order.
//!
//! Group commit, no timer: the first request for a key finds no batch in flight and
//! goes at once, alone, so a quiet sale keeps its latency. Up to `in_flight`
//! batches of one key go at once (each takes what is waiting when it starts);
//! requests that arrive while they are all out wait for the first to come back (at
//! most one Redis round trip) and then go together, at most `max` per call. A hot
//! sale thus costs one EVALSHA and one `INFO` run check per batch instead of per
//! buyer; this is what lets one sale go past the one-call-per-request ceiling of a
//! Redis core. Several batches in flight matter under `appendfsync always`: Redis
//! answers a write only after an `fsync`, one per event-loop turn for everything it
//! read in that turn, so the batches that reach it during one `fsync` share the
//! next. Each script is atomic, so batches in flight together never break an
//! invariant; their order is the order Redis runs them.
//!
//! Each HTTP worker has its own batcher and its own Redis connection (see
//! `startup`), so a request, its batch and the Redis I/O stay on one thread.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use std::net::IpAddr;

use redis::aio::ConnectionLike;

use crate::redis_conn::Redis;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::domain::UserId;
use crate::error::{AppError, ErrorCode, is_redis_unreachable};
use crate::limit::{Decision, Policy, Subject, Verdict};
use crate::lua::unexpected_reply;
use crate::metrics::{Counter, Metrics};

/// One kind of batched decision: how a batch of requests for one key is decided.
pub trait Decider: Send + Sync + 'static {
    type Key: Copy + Eq + Hash + Send + std::fmt::Display + 'static;
    type Request: Send + 'static;
    type Reply: Send + 'static;

    /// Whether a request whose caller stopped waiting (its answer's receiver
    /// dropped: a timeout, a closed connection) is left out of the next batch. A
    /// decision is made whoever waits for it (a purchase taken is taken); a read
    /// nobody waits for is work for nobody, and leaving it out bounds the queue of
    /// a key whose reads are slow by what arrives while its callers still wait.
    const DROP_ABANDONED: bool = false;

    /// Decides `batch` in one script call; one reply per request, in order.
    fn decide(
        &self,
        redis: Redis,
        key: Self::Key,
        batch: Vec<Self::Request>,
    ) -> impl Future<Output = Result<Vec<Self::Reply>, AppError>> + Send;
}

/// Why a whole batch got no decision. Every request of the batch gets it.
#[derive(Clone, Debug)]
enum Failed {
    /// Redis did not answer (down, too slow, loading), or a replica did not confirm
    /// the decision in time: 503, retry.
    Unavailable {
        code: ErrorCode,
        message: std::borrow::Cow<'static, str>,
    },
    /// Anything else: a bug. 500, logged once for the batch.
    Broken,
}

impl Failed {
    fn redis_unavailable() -> Self {
        Failed::Unavailable {
            code: ErrorCode::RedisUnavailable,
            message: "Redis did not answer in time; try again with the same Idempotency-Key \
                      (a retry under it never buys a second unit)"
                .into(),
        }
    }
}

impl From<Failed> for AppError {
    fn from(f: Failed) -> Self {
        match f {
            Failed::Unavailable { code, message } => AppError::new(code, message),
            Failed::Broken => AppError::Internal(anyhow::anyhow!("a batched decision failed")),
        }
    }
}

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
                "the decision was not confirmed by a Redis replica in time; try again \
                 (a retry never buys a second unit)",
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
            if name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL"));
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

type Waiting<D> = (
    <D as Decider>::Request,
    oneshot::Sender<Result<<D as Decider>::Reply, Failed>>,
);

struct Queue<D: Decider> {
    waiting: VecDeque<Waiting<D>>,
    /// Batches of this key out now (flush tasks running).
    flushing: usize,
}

/// The batcher of one worker for one kind of decision.
pub struct Batcher<D: Decider> {
    decider: D,
    /// The connections this batcher's batches go on (see [`Connections`]).
    connections: Arc<Connections>,
    max: usize,
    /// Most batches of one key out at once.
    in_flight: usize,
    /// Keys with a batch in flight, and who waits for the next one. A std mutex:
    /// held for a queue push or drain, never across an await.
    queues: Mutex<HashMap<D::Key, Queue<D>>>,
    counters: Counters,
}

/// Redis connections that batchers of one worker share, each with the number of
/// batches out on it now: a batch takes the least busy and sends its call and
/// whatever follows it on that one. With `replica_acks`, each batch's `WAIT` holds
/// its connection in Redis until the replicas answer, so batches out on one
/// connection wait for each other's `WAIT`: the buy and vote batchers then share
/// `batch_in_flight` connections of their own (see `startup`), counted together.
/// Otherwise a batcher has the worker's one connection.
pub struct Connections(Vec<(Redis, AtomicUsize)>);

impl Connections {
    pub fn new(connections: Vec<Redis>) -> Arc<Self> {
        assert!(!connections.is_empty(), "a batcher needs a connection");
        Arc::new(Connections(
            connections
                .into_iter()
                .map(|c| (c, AtomicUsize::new(0)))
                .collect(),
        ))
    }

    /// The connection with the fewest batches out now, and its count.
    fn least_busy(&self) -> &(Redis, AtomicUsize) {
        self.0
            .iter()
            .min_by_key(|(_, out)| out.load(Ordering::Relaxed))
            .unwrap_or(&self.0[0])
    }
}

/// One batch out on a connection, counted while it lives (a batch whose task ends
/// early, a panic, counts no more).
struct Out<'a>(&'a AtomicUsize);

impl<'a> Out<'a> {
    fn count(out: &'a AtomicUsize) -> Self {
        out.fetch_add(1, Ordering::Relaxed);
        Out(out)
    }
}

impl Drop for Out<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where a batcher counts, for `/metrics`: batches sent and requests decided.
pub struct Counters {
    pub metrics: Arc<Metrics>,
    pub batches: fn(&Metrics) -> &Counter,
    pub requests: fn(&Metrics) -> &Counter,
    /// The histogram of batch sizes.
    pub sizes: fn(&Metrics) -> &::metrics::Histogram,
}

impl<D: Decider> Batcher<D> {
    /// `max`: most requests in one call (1: every request alone); `in_flight`: most
    /// calls of one key out at once. Each batch takes the least busy of
    /// `connections`.
    pub fn new(
        decider: D,
        connections: Arc<Connections>,
        max: usize,
        in_flight: usize,
        counters: Counters,
    ) -> Arc<Self> {
        Arc::new(Batcher {
            decider,
            connections,
            max: max.max(1),
            in_flight: in_flight.max(1),
            queues: Mutex::new(HashMap::new()),
            counters,
        })
    }

    /// Decides `request` in the next batch for `key` and returns its own reply.
    pub async fn submit(
        self: &Arc<Self>,
        key: D::Key,
        request: D::Request,
    ) -> Result<D::Reply, AppError> {
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
            match queues.get_mut(&key) {
                // Batches are in flight: start another if fewer than `in_flight`
                // are, else ride with the next one.
                Some(queue) => {
                    queue.waiting.push_back((request, tx));
                    let go = queue.flushing < self.in_flight;
                    queue.flushing += usize::from(go);
                    go
                }
                None => {
                    queues.insert(
                        key,
                        Queue {
                            waiting: VecDeque::from([(request, tx)]),
                            flushing: 1,
                        },
                    );
                    true
                }
            }
        };
        if lead {
            let this = self.clone();
            tokio::spawn(async move { this.flush(key).await });
        }
        match rx.await {
            Ok(reply) => reply.map_err(AppError::from),
            Err(_) => Err(AppError::Internal(anyhow::anyhow!(
                "the batch of {key} ended without an answer"
            ))),
        }
    }

    /// Sends batches for `key` until nobody waits; then the next request leads.
    async fn flush(self: Arc<Self>, key: D::Key) {
        loop {
            let batch: Vec<Waiting<D>> = {
                let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
                let Some(queue) = queues.get_mut(&key) else {
                    return;
                };
                if D::DROP_ABANDONED {
                    queue.waiting.retain(|(_, tx)| !tx.is_closed());
                }
                if queue.waiting.is_empty() {
                    queue.flushing -= 1;
                    if queue.flushing == 0 {
                        queues.remove(&key);
                    }
                    return;
                }
                let n = queue.waiting.len().min(self.max);
                queue.waiting.drain(..n).collect()
            };
            let (requests, senders): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
            let n = requests.len();
            let c = &self.counters;
            (c.batches)(&c.metrics).add(1);
            (c.requests)(&c.metrics).add(n as u64);
            (c.sizes)(&c.metrics).record(n as f64);
            let (redis, out) = self.connections.least_busy();
            let decided = {
                let _out = Out::count(out);
                self.decider.decide(redis.clone(), key, requests).await
            };
            match decided {
                Ok(replies) if replies.len() == n => {
                    for (tx, reply) in senders.into_iter().zip(replies) {
                        let _ = tx.send(Ok(reply));
                    }
                }
                outcome => {
                    let failed = match &outcome {
                        Err(AppError::Redis(e)) if is_redis_unreachable(e) => {
                            Failed::redis_unavailable()
                        }
                        Err(AppError::Client { code, message, .. })
                            if code.status()
                                == actix_web::http::StatusCode::SERVICE_UNAVAILABLE =>
                        {
                            Failed::Unavailable {
                                code: *code,
                                message: message.clone(),
                            }
                        }
                        Err(e) => {
                            tracing::error!(%key, error = %crate::error::error_chain(e), "batched decision failed");
                            Failed::Broken
                        }
                        Ok(replies) => {
                            tracing::error!(%key, asked = n, answered = replies.len(), "batched decision answered the wrong number of requests");
                            Failed::Broken
                        }
                    };
                    for tx in senders {
                        let _ = tx.send(Err(failed.clone()));
                    }
                }
            }
        }
    }
}

/// One request of a batch script call: who asks, from where (when a policy counts
/// per address), and its second argument. Its limit keys are built by
/// [`Call::run`], one per policy, in order.
pub struct Item {
    pub user: UserId,
    pub ip: Option<IpAddr>,
    pub arg: ItemArg,
}

/// An item's second argument: the order id a purchase gets if accepted, with the
/// units it asks for and its idempotency key (sent as `<uuid>`, `<uuid>:<quantity>`
/// when more than one, `<uuid>:<quantity>:<key>` with a key), or the option a vote
/// is for.
#[derive(Clone, Copy, Debug)]
pub enum ItemArg {
    Order(Uuid, u32, Option<crate::domain::PurchaseKey>),
    Option(i64),
}

impl redis::ToRedisArgs for ItemArg {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        match self {
            ItemArg::Order(id, quantity, key) => {
                let mut buf = Uuid::encode_buffer();
                let id = id.hyphenated().encode_lower(&mut buf);
                if let Some(key) = key {
                    out.write_arg_fmt(format_args!("{id}:{quantity}:{}", key.as_str()));
                } else if *quantity > 1 {
                    out.write_arg_fmt(format_args!("{id}:{quantity}"));
                } else {
                    out.write_arg(id.as_bytes());
                }
            }
            ItemArg::Option(n) => n.write_redis_args(out),
        }
    }
}

/// What a batch script answered for one item: its code, value, and each policy's
/// decision (empty unless the answer reports them: see [`rows`]), and the stored
/// answer a replay carries.
pub struct Row {
    pub code: i64,
    pub value: i64,
    pub limits: Vec<Decision>,
    pub text: Option<String>,
}

/// A call of a batch decision script, in the layout `lua/lib/batch.lua` reads:
/// KEYS = the script's state keys, one key per policy (a per-user policy's buckets
/// are named after it), then each item's keys of the per-address policies; ARGV =
/// id, number of policies, now override, the script's own number, five per policy
/// (the fifth: `u` per user, `k` a key per item), then two per item (user id, then
/// [`ItemArg`]).
pub struct Call<'a> {
    pub script: &'a crate::lua::Script,
    /// The script's file name, for errors.
    pub name: &'a str,
    /// The script's own keys; the items' limit keys follow them.
    pub state_keys: &'a [&'a str],
    pub id: i64,
    pub policies: &'a [Policy],
    /// A policy's limit key for a subject (`Keys::sale_rate_limit` of the sale, or
    /// the poll's); called once per policy: with `b` for the name a per-user
    /// policy's buckets start with, with an empty subject for a per-address
    /// policy's prefix.
    pub limit_key: &'a (dyn Fn(&str, &str) -> String + Sync),
    /// Tests only: decide at this Redis time instead of the Redis clock.
    pub now_ms: Option<i64>,
    /// The script's own number (ARGV[4]): for the purchase, how long the keys hash
    /// lives after its last write, in ms; 0 for the vote.
    pub extra: u64,
}

impl Call<'_> {
    /// Runs the script for `items`; checks the reply's shape (see [`rows`]).
    pub async fn run<C: ConnectionLike>(
        &self,
        redis: &mut C,
        items: &[Item],
    ) -> Result<Vec<Row>, AppError> {
        let mut inv = self.script.prepare_invoke();
        for key in self.state_keys.iter().copied() {
            inv.key(key);
        }
        let prefixes: Vec<String> = self
            .policies
            .iter()
            .map(|p| match p.subject {
                Subject::User => (self.limit_key)(&p.name, BUCKETS),
                Subject::Ip => (self.limit_key)(&p.name, ""),
            })
            .collect();
        for prefix in &prefixes {
            inv.key(prefix.as_str());
        }
        self.address_keys(&mut inv, items, &prefixes)?;
        inv.arg(self.id)
            .arg(self.policies.len())
            .arg(self.now_ms.map(|n| n.to_string()).unwrap_or_default())
            .arg(self.extra);
        for policy in self.policies {
            let (code, a, b, c) = policy.algorithm.lua_args();
            let subject = match policy.subject {
                Subject::User => "u",
                Subject::Ip => "k",
            };
            inv.arg(code).arg(a).arg(b).arg(c).arg(subject);
        }
        for item in items {
            inv.arg(item.user.get()).arg(item.arg);
        }
        let flat: Vec<redis::Value> = inv.invoke_async(redis).await?;
        rows(self.name, &flat, self.policies.len(), items.len())
    }

    /// Adds each item's keys of the per-address policies, in the policies' order:
    /// the policy's prefix, then the address. (A per-user policy keeps its users'
    /// states as fields of its buckets, named by the user ids the items carry.)
    fn address_keys(
        &self,
        inv: &mut crate::lua::Invocation<'_>,
        items: &[Item],
        prefixes: &[String],
    ) -> Result<(), AppError> {
        // A batch's keys are built in one buffer, with no formatting machinery: a
        // hot sale's batch holds up to a few hundred of them.
        let mut key = String::new();
        let mut last_ip: Option<(IpAddr, String)> = None;
        for item in items {
            for (policy, prefix) in self.policies.iter().zip(prefixes) {
                if policy.subject != Subject::Ip {
                    continue;
                }
                let Some(ip) = item.ip else {
                    return Err(AppError::Internal(anyhow::anyhow!(
                        "policy {} counts per address, but no address was given",
                        policy.name
                    )));
                };
                key.clear();
                key.push_str(prefix);
                // Requests of a batch mostly come from few addresses.
                match &last_ip {
                    Some((seen, text)) if *seen == ip => key.push_str(text),
                    _ => {
                        let text = crate::limit::client::ip_subject(ip);
                        key.push_str(&text);
                        last_ip = Some((ip, text));
                    }
                }
                inv.key(key.as_str());
            }
        }
        Ok(())
    }
}

/// What the name of a per-user policy's buckets starts with, after the policy's
/// prefix (`ns:{sale:42}:rl:buy-user:b`; the bucket's number follows, see
/// `limits_cache` in `lua/lib/limits.lua`). A policy counts either users or
/// addresses, so its buckets never meet a per-address key; an earlier version's
/// per-user keys (`...:buy-user:u7`) are not read, and expire within a window.
pub const BUCKETS: &str = "b";

/// How many numbers per policy an answer carries (see `batch_answer` in
/// `lua/lib/batch.lua`): rate limited and never satisfiable 4 (verdict, remaining,
/// ms until allowed, ms until reset); accepted 2 (remaining, ms until reset: an
/// allowed request's wait is read by nobody, so the script neither computes nor
/// sends it); the others none, a code and a value only.
fn numbers_per_policy(code: i64) -> usize {
    match code {
        7 | 8 => 4,
        0 => 2,
        _ => 0,
    }
}

/// The answer that carries a string after its code and value: a replay
/// (`REPLY_REPLAYED` in `lua/lib/batch.lua`), with the answer stored under its key.
pub const REPLAYED: i64 = 11;

/// Splits a batch script's flat reply into one row per item: code, value, the
/// [`numbers_per_policy`] of each policy, one string after a [`REPLAYED`].
/// Anything but exactly `items` rows, or a string anywhere else, is an error.
fn rows(
    script: &str,
    flat: &[redis::Value],
    policies: usize,
    items: usize,
) -> Result<Vec<Row>, AppError> {
    let wrong = || unexpected_reply(script, format!("{} values for {items} items", flat.len()));
    let int = |v: &redis::Value| match v {
        redis::Value::Int(n) => Ok(*n),
        _ => Err(wrong()),
    };
    let mut out = Vec::with_capacity(items);
    let mut numbers = Vec::with_capacity(4 * policies);
    let mut rest = flat;
    while let [code, value, tail @ ..] = rest {
        let (code, value) = (int(code)?, int(value)?);
        let (limits, tail) = match numbers_per_policy(code) {
            0 => (Vec::new(), tail),
            each => {
                let (mine, tail) = tail.split_at_checked(each * policies).ok_or_else(wrong)?;
                numbers.clear();
                for v in mine {
                    numbers.push(int(v)?);
                }
                let limits = numbers
                    .chunks(each)
                    .map(|n| match *n {
                        [remaining, reset] => decision(script, &[1, remaining, 0, reset]),
                        _ => decision(script, n),
                    })
                    .collect::<Result<_, _>>()?;
                (limits, tail)
            }
        };
        let (text, tail) = match (code, tail) {
            (REPLAYED, [redis::Value::BulkString(s), tail @ ..]) => {
                (Some(String::from_utf8_lossy(s).into_owned()), tail)
            }
            (REPLAYED, _) => return Err(wrong()),
            _ => (None, tail),
        };
        out.push(Row {
            code,
            value,
            limits,
            text,
        });
        rest = tail;
    }
    if !rest.is_empty() || out.len() != items {
        return Err(wrong());
    }
    Ok(out)
}

/// One policy's answer: allowed (1, 0, or -1 never), remaining, ms until allowed,
/// ms until reset. Any other verdict is an error, never read as a refusal.
fn decision(script: &str, four: &[i64]) -> Result<Decision, AppError> {
    Ok(Decision {
        verdict: match four[0] {
            1 => Verdict::Allowed,
            0 => Verdict::Denied,
            -1 => Verdict::Never,
            other => return Err(unexpected_reply(script, ("verdict", other))),
        },
        remaining: four[1].max(0) as u64,
        retry_after_ms: four[2].max(0) as u64,
        reset_ms: four[3].max(0) as u64,
        now_ms: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_carry_policy_numbers_only_where_the_answer_reports_them() {
        // Two policies: accepted (remaining and reset of both), already bought (none),
        // limited (all four of both).
        let ints =
            |n: &[i64]| -> Vec<redis::Value> { n.iter().map(|&n| redis::Value::Int(n)).collect() };
        let flat = ints(&[
            0, 9, 4, 10, 99, 10, 1, 0, 7, 500, 0, 0, 500, 900, 1, 98, 0, 10,
        ]);
        let parsed = rows("t.lua", &flat, 2, 3).unwrap();
        assert_eq!(
            parsed
                .iter()
                .map(|r| (r.code, r.value, r.limits.len()))
                .collect::<Vec<_>>(),
            [(0, 9, 2), (1, 0, 0), (7, 500, 2)]
        );
        assert_eq!(parsed[2].limits[0].verdict, Verdict::Denied);
        assert_eq!(parsed[2].limits[0].retry_after_ms, 500);
        let accepted = &parsed[0].limits;
        assert_eq!(
            accepted
                .iter()
                .map(|d| (d.verdict, d.remaining, d.retry_after_ms, d.reset_ms))
                .collect::<Vec<_>>(),
            [(Verdict::Allowed, 4, 0, 10), (Verdict::Allowed, 99, 0, 10)]
        );
        // Too few or too many numbers, or rows, are an error, never a guess.
        assert!(rows("t.lua", &flat[..flat.len() - 1], 2, 3).is_err());
        assert!(rows("t.lua", &flat, 2, 2).is_err());
        assert!(rows("t.lua", &ints(&[1, 0, 5]), 2, 1).is_err());
        // An unknown verdict is an error too.
        assert!(rows("t.lua", &ints(&[7, 1, 3, 0, 0, 0]), 1, 1).is_err());
        // A replay carries its stored answer; a string anywhere else is an error.
        let mut replay = ints(&[REPLAYED, 0]);
        replay.push(redis::Value::BulkString(b"1:0:5:x".to_vec()));
        replay.extend(ints(&[1, 0]));
        let parsed = rows("t.lua", &replay, 2, 2).unwrap();
        assert_eq!(parsed[0].text.as_deref(), Some("1:0:5:x"));
        assert_eq!(parsed[1].text, None);
        assert!(rows("t.lua", &ints(&[REPLAYED, 0]), 2, 1).is_err());
        let mut stray = ints(&[1, 0]);
        stray.push(redis::Value::BulkString(b"x".to_vec()));
        assert!(rows("t.lua", &stray, 2, 1).is_err());
    }
}
