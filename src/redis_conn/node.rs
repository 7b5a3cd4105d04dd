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
}

impl Node {
    pub async fn connect(
        client: redis::Client,
        config: ConnectionManagerConfig,
    ) -> RedisResult<Node> {
        let conn = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        Ok(Node(Arc::new(Inner {
            current: ArcSwap::from_pointee(conn),
            client,
            config,
            probing: AtomicBool::new(false),
        })))
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
            let answer = self.conn().req_packed_command(cmd).await;
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
            let answer = self
                .conn()
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.checked(answer)
        })
    }

    fn get_db(&self) -> i64 {
        self.conn().get_db()
    }
}
