//! The group commit itself: [`Batcher`], one queue per key, and [`Decider`], what a
//! feature implements to decide a batch of its requests in one script call.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::error::{AppError, ErrorCode, is_redis_unreachable};
use crate::metrics::{Counter, Metrics};
use crate::redis_conn::Redis;

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
            message: "Redis did not answer in time, and may have decided: retry with the same \
                      Idempotency-Key (under it a retry is never counted twice; without one, a \
                      retry is a new request)"
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

/// A request, its answer's sender, and when it was queued.
type Waiting<D> = (
    <D as Decider>::Request,
    oneshot::Sender<Result<<D as Decider>::Reply, Failed>>,
    Instant,
);

/// A request that has waited this long behind a batch that Redis did not answer
/// (a timeout: a stalled or cut-off link) gets that batch's 503 at once instead of
/// going in the next batch, which would make it wait a whole response timeout
/// more: no purchase waits much longer than the response timeout plus this, under
/// the documented bound of the timeout plus a second (issue 53: a stalled link
/// answered purchases in 3.97 s, twice the 2 s timeout; with a second here, 3.01
/// s). It was never sent, so its retry is safe. Requests that waited less go as
/// usual (after a reset, the next batch on the new connection decides them).
const STALE_BEHIND_A_FAILURE: Duration = Duration::from_millis(500);

/// Logs a batch that Redis did not answer (its requests get a 503 each, logged
/// by nobody else): the cause, how long the call took and the batch's size, at
/// most once a second per process, with the number not logged since (an outage
/// fails every batch).
fn warn_unavailable(
    key: &dyn std::fmt::Display,
    requests: usize,
    took: Duration,
    e: &redis::RedisError,
) {
    use std::sync::atomic::AtomicU64;
    static LAST_SECOND: AtomicU64 = AtomicU64::new(0);
    static SINCE: AtomicU64 = AtomicU64::new(0);
    let second = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST_SECOND.load(Ordering::Relaxed);
    if last == second
        || LAST_SECOND
            .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        SINCE.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let not_logged = SINCE.swap(0, Ordering::Relaxed);
    tracing::warn!(
        %key,
        requests,
        took_ms = took.as_millis() as u64,
        error = %e,
        not_logged,
        "Redis did not answer a batched decision: its requests get 503 redis_unavailable"
    );
}

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

    /// Every connection (to watch them, see [`crate::redis_conn::watch`]).
    pub fn all(&self) -> Vec<Redis> {
        self.0.iter().map(|(c, _)| c.clone()).collect()
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
                    queue.waiting.push_back((request, tx, Instant::now()));
                    let go = queue.flushing < self.in_flight;
                    queue.flushing += usize::from(go);
                    go
                }
                None => {
                    queues.insert(
                        key,
                        Queue {
                            waiting: VecDeque::from([(request, tx, Instant::now())]),
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
                    queue.waiting.retain(|(_, tx, _)| !tx.is_closed());
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
            let (requests, senders): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|(r, tx, _)| (r, tx)).unzip();
            let n = requests.len();
            let c = &self.counters;
            (c.batches)(&c.metrics).add(1);
            (c.requests)(&c.metrics).add(n as u64);
            (c.sizes)(&c.metrics).record(n as f64);
            let (redis, out) = self.connections.least_busy();
            let started = Instant::now();
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
                            warn_unavailable(&key, n, started.elapsed(), e);
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
                        // Postgres unreachable (a batch written there: draw entries).
                        Err(e)
                            if e.error_code().status()
                                == actix_web::http::StatusCode::SERVICE_UNAVAILABLE =>
                        {
                            Failed::Unavailable {
                                code: e.error_code(),
                                message: e.public_message(),
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
                    if let Failed::Unavailable { code, .. } = &failed
                        && *code == ErrorCode::RedisUnavailable
                    {
                        crate::redis_conn::watch::trouble();
                    }
                    if let Failed::Unavailable { .. } = failed {
                        for (_, tx, _) in self.stale_waiters(key) {
                            let _ = tx.send(Err(failed.clone()));
                        }
                    }
                    for tx in senders {
                        let _ = tx.send(Err(failed.clone()));
                    }
                }
            }
        }
    }

    /// The requests of `key` queued for longer than [`STALE_BEHIND_A_FAILURE`],
    /// out of the queue (see there).
    fn stale_waiters(&self, key: D::Key) -> Vec<Waiting<D>> {
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(queue) = queues.get_mut(&key) else {
            return Vec::new();
        };
        let mut stale = Vec::new();
        for waiting in std::mem::take(&mut queue.waiting) {
            match waiting.2.elapsed() > STALE_BEHIND_A_FAILURE {
                true => stale.push(waiting),
                false => queue.waiting.push_back(waiting),
            }
        }
        stale
    }
}
