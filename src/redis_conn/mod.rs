//! The one Redis connection type the rest of the code holds: one node (`REDIS_URL`,
//! redis-rs's `ConnectionManager`) or Redis Cluster (`STAMPEDE_REDIS_CLUSTER`,
//! redis-rs's async cluster connection). Both are multiplexed and cheap to clone.
//! Code above this module never asks which one it has: it sends commands, scripts
//! and pipelines through [`ConnectionLike`], and every key it names carries the hash
//! tag of its sale, poll, lock or limit (see [`crate::keys`]), so a script's keys
//! are on one shard.
//!
//! On a cluster, redis-rs routes a command, an `EVALSHA` or an `FCALL` by its first
//! key, follows `MOVED`/`ASK` after a failover or resharding, and `lua::Script`
//! sends a script as `EVAL` where a node answers `NOSCRIPT` (and loads a function
//! where one answers "Function not found"). Two things differ, and are handled here
//! or by the caller:
//! - a pipeline whose commands name keys of different slots (one `GET` per sale of a
//!   list) cannot go to one node: [`Redis`] sends its commands one by one, all at
//!   once, and answers in order (a pipeline of one slot stays one round trip);
//! - a blocking `XREADGROUP` over several streams is a `CROSSSLOT` error: the
//!   settlement worker reads stream by stream on a cluster (see `settle`).
//!
//! `watch.rs`: after a Redis fault, each worker's idle connections are made whole
//! before a request finds them broken.

pub mod acks;
pub mod node;
pub mod watch;

use node::Node;

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr,
};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// Where Redis is: one node, or the seed nodes of a cluster (any reachable primary
/// or replica; the rest of the cluster is discovered from it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Node(String),
    Cluster(Vec<String>),
}

impl Target {
    /// The cluster when seed nodes are configured, else the one node.
    pub fn from_config(config: &crate::config::Config) -> Self {
        if config.redis_cluster.is_empty() {
            Target::Node(config.redis_url.clone())
        } else {
            Target::Cluster(config.redis_cluster.clone())
        }
    }

    /// For messages: the URLs with their passwords hidden.
    pub fn describe(&self) -> String {
        match self {
            Target::Node(url) => crate::config::redact_url(url),
            Target::Cluster(nodes) => format!(
                "the cluster of {}",
                nodes
                    .iter()
                    .map(|u| crate::config::redact_url(u))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// How a connection waits, and whether it sends a command again. `response: None`
/// is for a connection that runs blocking commands (the settlement worker's
/// `XREADGROUP ... BLOCK`).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub response: Option<Duration>,
    /// Cluster only: let redis-rs send a failed command again (it follows `MOVED`,
    /// waits out `CLUSTERDOWN`, and also resends after a broken connection, when
    /// the command may already have run). Never for decisions: a purchase script
    /// that ran on a primary killed before it answered, sent again after the
    /// failover, would answer `already_bought` to the buyer who holds that very
    /// order. Without resending the caller gets the error (a 503 whose retry is
    /// safe), and redis-rs still refreshes its slot map for the next command. One
    /// answer is sent again even so: `MOVED` to a single command (see
    /// [`MOVED_RETRIES`]).
    pub resend: bool,
}

/// A cluster node answered a single command `MOVED`: the slot has another owner and
/// the command did not run, so sending it again is safe even on a connection that
/// never resends (unlike after a broken connection, see [`Timeouts::resend`]).
/// redis-rs refreshes its slot map on the error; the command is sent again after a
/// short wait (20, 40, 60 ms), at most this many times, before the error reaches
/// the caller (a 503). A connection whose map went stale during a slot move (one the
/// move's own redirects never reached) otherwise answered one 503 on its first use
/// after the move, seconds later (the fault suite's slot move saw one at 6 to 8 s
/// after healing). Every script a request runs is one command (`EVALSHA` or `FCALL`): the
/// decisions of a purchase or a vote, a place in the waiting room, a draw's
/// admission. A pipeline over several slots goes key by key, each a single command
/// here; a pipeline on one slot and a transaction are not sent again: a node that
/// lost the slot between two of their commands may have run the first.
pub const MOVED_RETRIES: u32 = 3;
const MOVED_WAIT: Duration = Duration::from_millis(20);

fn is_moved(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Moved)
}

#[derive(Clone)]
pub enum Redis {
    /// Replaced as a whole when it stops answering (see [`node`]).
    Node(Node),
    /// `resend`: [`Timeouts::resend`], which redis-rs applies; without it a single
    /// command answered `MOVED` is still sent again here.
    Cluster {
        conn: ClusterConnection,
        resend: bool,
    },
}

impl Redis {
    pub async fn connect(target: &Target, timeouts: Timeouts) -> RedisResult<Redis> {
        match target {
            Target::Node(url) => {
                let client = redis::Client::open(url.as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeouts.connect))
                    .set_response_timeout(timeouts.response)
                    .set_number_of_retries(2);
                let blocks = timeouts.response.is_none();
                Ok(Redis::Node(Node::connect(client, config, blocks).await?))
            }
            Target::Cluster(nodes) => {
                let mut builder = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                    .connection_timeout(timeouts.connect)
                    // A failover takes the cluster a few seconds (node timeout plus
                    // the election): retry a moved or unreachable slot for about that
                    // long before an error reaches the caller (and becomes a 503).
                    .retries(if timeouts.resend { 6 } else { 0 })
                    .min_retry_wait(50)
                    .max_retry_wait(1000);
                builder = match timeouts.response {
                    Some(t) => builder.response_timeout(t).overall_response_timeout(None),
                    None => builder
                        .response_timeout(Duration::from_secs(24 * 3600))
                        .overall_response_timeout(None),
                };
                let client = builder.build()?;
                Ok(Redis::Cluster {
                    conn: client.get_async_connection().await?,
                    resend: timeouts.resend,
                })
            }
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Redis::Cluster { .. })
    }

    /// A caller's own wait for this connection ran out (a blocking read that
    /// outlived its block): on one node, probe it and replace it if it is dead
    /// (see [`node`]). A cluster's connection manages its nodes' sockets itself.
    pub fn suspect(&self) {
        if let Redis::Node(node) = self {
            node.suspect();
        }
    }

    /// Runs `cmd` on every primary (on one node: on it) and returns each node's
    /// answer with its address. For commands without a key that describe a node:
    /// `CONFIG GET` (the startup checks of persistence), `PING` (`/readyz`).
    pub async fn on_every_primary(&mut self, cmd: &Cmd) -> RedisResult<Vec<(String, Value)>> {
        match self {
            Redis::Node(conn) => {
                let value = conn.req_packed_command(cmd).await?;
                Ok(vec![("node".to_string(), value)])
            }
            Redis::Cluster { conn, .. } => {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                match conn.route_command(cmd.clone(), routing).await? {
                    Value::Map(pairs) => pairs
                        .into_iter()
                        .map(|(addr, value)| Ok((redis::from_redis_value(addr)?, value)))
                        .collect(),
                    other => Ok(vec![("cluster".to_string(), other)]),
                }
            }
        }
    }

    /// `pipeline` on the primary of `key`'s slot, over one link: its commands go
    /// out in one write and are answered or lost together (a reconnect between
    /// them cannot happen). A command's server error is its answer
    /// (`Value::ServerError`), not the call's error, except on a cluster for the
    /// errors redis-rs acts on (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`,
    /// `READONLY`, `LOADING`, `MASTERDOWN`): they fail the whole pipeline, which a
    /// connection made without `resend` does not send again.
    pub async fn pipeline_on_primary_of(
        &mut self,
        key: &str,
        pipeline: Pipeline,
    ) -> RedisResult<Vec<Value>> {
        let count = pipeline.len();
        match self {
            Redis::Node(conn) => conn.req_packed_commands(&pipeline, 0, count).await,
            Redis::Cluster { conn, .. } => {
                let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
                conn.route_pipeline(
                    pipeline,
                    0,
                    count,
                    SingleNodeRoutingInfo::SpecificNode(route),
                )
                .await
            }
        }
    }

    /// Every key matching `pattern` on the node that holds `slot_key`'s slot
    /// (`SCAN ... MATCH`, all of it): on a cluster the one primary of that slot,
    /// so `pattern` should only match keys of that hash tag. For rare admin work
    /// (removing a rehearsal's keys), never a request's path.
    pub async fn keys_in_slot_of(
        &mut self,
        slot_key: &str,
        pattern: &str,
    ) -> RedisResult<Vec<String>> {
        let mut found = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            let answer = match self {
                Redis::Node(conn) => conn.req_packed_command(&cmd).await?,
                Redis::Cluster { conn, .. } => {
                    let route = Route::with_key(slot_key.as_bytes(), SlotAddr::Master);
                    let routing =
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                    conn.route_command(cmd, routing).await?
                }
            };
            let (next, keys): (u64, Vec<String>) =
                redis::from_redis_value(answer.extract_error()?)?;
            found.extend(keys);
            if next == 0 {
                return Ok(found);
            }
            cursor = next;
        }
    }

    /// `PING` on every primary: all must answer (`/readyz`).
    pub async fn ping_all(&mut self) -> RedisResult<()> {
        for (node, answer) in self.on_every_primary(&redis::cmd("PING")).await? {
            if let Value::ServerError(e) = answer {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "a primary does not answer PING",
                    format!("{node}: {e:?}"),
                )));
            }
        }
        Ok(())
    }
}

impl ConnectionLike for Redis {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Redis::Node(conn) => conn.req_packed_command(cmd),
            Redis::Cluster { conn, resend: true } => conn.req_packed_command(cmd),
            Redis::Cluster {
                conn,
                resend: false,
            } => Box::pin(async move {
                let mut moved = 0;
                loop {
                    match conn.req_packed_command(cmd).await {
                        Err(e) if moved < MOVED_RETRIES && is_moved(&e) => {
                            moved += 1;
                            tokio::time::sleep(MOVED_WAIT * moved).await;
                        }
                        answer => return answer,
                    }
                }
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Redis::Node(conn) => conn.req_packed_commands(pipeline, offset, count),
            // Keys of several slots cannot go to one node: one command per key, all
            // in flight at once, answered in order (each a single command, so one
            // answered `MOVED` is sent again as above). A transaction is never split.
            Redis::Cluster { .. } if !pipeline.is_transaction() && spans_slots(pipeline) => {
                let this = self.clone();
                Box::pin(async move {
                    let each = pipeline.cmd_iter().map(|cmd| {
                        let mut this = this.clone();
                        async move { this.req_packed_command(cmd).await }
                    });
                    futures_util::future::try_join_all(each).await
                })
            }
            Redis::Cluster { conn, .. } => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Redis::Node(conn) => conn.get_db(),
            Redis::Cluster { conn, .. } => conn.get_db(),
        }
    }
}

/// Whether the pipeline's commands name keys of more than one slot. Every command
/// our pipelines send names its key first (`GET key`, `HLEN key`, `XACK key ..`),
/// or right after a subcommand (`XINFO CONSUMERS key ..`, `XGROUP ..`).
fn spans_slots(pipeline: &Pipeline) -> bool {
    let mut slots = pipeline.cmd_iter().filter_map(|cmd| {
        let mut args = cmd.args_iter();
        let at = match args.next() {
            Some(redis::Arg::Simple(name))
                if name.eq_ignore_ascii_case(b"XINFO") || name.eq_ignore_ascii_case(b"XGROUP") =>
            {
                1
            }
            _ => 0,
        };
        match args.nth(at) {
            Some(redis::Arg::Simple(key)) => Some(Slot::for_key(key)),
            _ => None,
        }
    });
    match slots.next() {
        Some(first) => slots.any(|slot| slot != first),
        None => false,
    }
}

/// A stream's length and how many of its entries `group` has read and not yet
/// acknowledged (`XLEN`, and the count of `XPENDING`'s summary). Best effort, for
/// the gauges a scrape reads: `None` when the length cannot be read; a pending
/// count that cannot be read (no group yet) counts 0.
pub async fn stream_backlog<C: ConnectionLike>(
    redis: &mut C,
    stream: &str,
    group: &str,
) -> Option<(u64, u64)> {
    let entries: RedisResult<u64> = redis::cmd("XLEN").arg(stream).query_async(redis).await;
    // XPENDING's summary: [count, first id, last id, consumers].
    let pending: RedisResult<(u64, Value, Value, Value)> = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .query_async(redis)
        .await;
    let entries = entries.ok()?;
    Some((entries, pending.map(|p| p.0).unwrap_or(0)))
}
