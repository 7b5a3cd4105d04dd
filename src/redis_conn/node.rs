//! One Redis node's connection, replaced when it stops answering.
//!
//! redis-rs's `ConnectionManager` opens a new socket when a command fails with a
//! broken connection (a reset, a closed socket), but a command that only timed
//! out leaves the connection as it is: a link whose peer vanished without a reset
//! (a failover behind one address, a VM gone, a route dropped for good) never
//! fails any other way, so every command on it would time out for ever, a 503 to
//! every buyer of that worker until the process restarts. So a command that times
//! out here has the connection probed ([`Node::suspect`]): a `PING` within
//! [`PROBE_WAIT`]; unanswered, a new connection is made and, once it answers,
//! every clone of this `Node` sends on it. The old one is dropped (what it still
//! had in flight has already been answered with its timeout). A connection that
//! is only slow answers the probe and is kept; a Redis that is down or stalled
//! accepts no new connection either (its handshake times out), so the old one is
//! kept for the moment it comes back; the next timeout probes again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// How long the probe's `PING` waits before the connection counts as dead.
pub const PROBE_WAIT: Duration = Duration::from_secs(2);

/// On a connection without a response timeout (one that blocks: settlement's
/// `XREADGROUP ... BLOCK`), how long any other command may take: its acks, its
/// scripts and `CLIENT ID` would otherwise wait for ever on a dead link. A
/// blocking read is bounded by its caller (its block and a margin).
pub const UNBLOCKED_LIMIT: Duration = Duration::from_secs(10);

/// A node connection shared by its clones, replaced as a whole (see the module
/// docs).
#[derive(Clone)]
pub struct Node(Arc<Inner>);

struct Inner {
    current: ArcSwap<ConnectionManager>,
    client: redis::Client,
    config: ConnectionManagerConfig,
    /// A probe is running: another timeout meanwhile starts none.
    probing: AtomicBool,
    /// [`UNBLOCKED_LIMIT`] on a connection without a response timeout.
    bound: Option<Duration>,
}

impl Node {
    /// `blocks`: the connection has no response timeout (see [`UNBLOCKED_LIMIT`]).
    pub async fn connect(
        client: redis::Client,
        config: ConnectionManagerConfig,
        blocks: bool,
    ) -> RedisResult<Node> {
        let conn = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        Ok(Node(Arc::new(Inner {
            current: ArcSwap::from_pointee(conn),
            client,
            config,
            probing: AtomicBool::new(false),
            bound: blocks.then_some(UNBLOCKED_LIMIT),
        })))
    }

    /// `answer` within this connection's bound, if it has one and `bounded`.
    async fn within<T>(
        &self,
        bounded: bool,
        answer: impl std::future::Future<Output = RedisResult<T>>,
    ) -> RedisResult<T> {
        match self.0.bound.filter(|_| bounded) {
            None => answer.await,
            Some(limit) => match tokio::time::timeout(limit, answer).await {
                Ok(answer) => answer,
                Err(_) => Err(redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("Redis did not answer within {} ms", limit.as_millis()),
                ))),
            },
        }
    }

    /// The connection to send on now (a cheap clone of a shared handle).
    fn conn(&self) -> ConnectionManager {
        ConnectionManager::clone(&self.0.current.load())
    }

    /// A command on this connection did not answer in time (or a caller's own
    /// wait for it ran out): probe it, and replace it if it is dead, in the
    /// background. At most one probe at a time.
    pub fn suspect(&self) {
        if self.0.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = self.0.clone();
        tokio::spawn(async move {
            let stale = inner.current.load_full();
            if !answers(&mut ConnectionManager::clone(&stale)).await {
                let fresh =
                    ConnectionManager::new_with_config(inner.client.clone(), inner.config.clone());
                match tokio::time::timeout(PROBE_WAIT * 2, fresh).await {
                    Ok(Ok(mut fresh)) => {
                        if answers(&mut fresh).await {
                            inner.current.compare_and_swap(&stale, Arc::new(fresh));
                            tracing::warn!(
                                "a Redis connection stopped answering (a PING waited {} ms) while a new one answers: replaced",
                                PROBE_WAIT.as_millis()
                            );
                        }
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "a Redis connection does not answer, and no new one can be made yet")
                    }
                    Err(_) => tracing::debug!(
                        "a Redis connection does not answer, and a new one could not be made in time"
                    ),
                }
            }
            inner.probing.store(false, Ordering::Release);
        });
    }

    /// `result`, having suspected this connection when it is a timeout.
    fn checked<T>(&self, result: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &result
            && e.is_timeout()
        {
            self.suspect();
        }
        result
    }
}

/// Whether `cmd` may block by design (`XREAD`/`XREADGROUP ... BLOCK`).
fn blocks(cmd: &Cmd) -> bool {
    cmd.args_iter()
        .any(|a| matches!(a, redis::Arg::Simple(b) if b.eq_ignore_ascii_case(b"BLOCK")))
}

/// Whether `conn` answers a `PING` within [`PROBE_WAIT`].
async fn answers(conn: &mut ConnectionManager) -> bool {
    let ping = redis::cmd("PING");
    matches!(
        tokio::time::timeout(PROBE_WAIT, ping.query_async::<()>(conn)).await,
        Ok(Ok(()))
    )
}

impl ConnectionLike for Node {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut conn = self.conn();
            let answer = self
                .within(!blocks(cmd), conn.req_packed_command(cmd))
                .await;
            self.checked(answer)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut conn = self.conn();
            let pipelined = conn.req_packed_commands(pipeline, offset, count);
            let answer = self.within(true, pipelined).await;
            self.checked(answer)
        })
    }

    fn get_db(&self) -> i64 {
        self.conn().get_db()
    }
}
