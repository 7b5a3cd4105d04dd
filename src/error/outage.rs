//! Which failures of Redis and Postgres are outages (503, try again) rather than bugs.

/// Redis answers that mean "not now" rather than "you sent something wrong": the
/// server is loading its dataset after a restart, a failover is in progress, a
/// replica refuses writes, persistence is failing, memory is full, a script is busy.
/// Each is an outage (503 with `Retry-After`), never a bug (500).
const REDIS_NOT_READY: &[&str] = &[
    "LOADING",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "READONLY",
    "NOREPLICAS",
    "MISCONF",
    "OOM",
    "BUSY",
];

/// Connection-level Redis failures, and a Redis that is up but not ready, are an
/// outage (503), not a bug (500).
pub fn is_redis_unreachable(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || is_redis_not_ready(e)
        // Redis Cluster: no node for the slot yet, or MOVED/ASK/CLUSTERDOWN still
        // after redis-rs's retries (a failover in progress).
        || e.kind() == redis::ErrorKind::ClusterConnectionNotFound
        || e.is_cluster_error()
        || is_reply_cut_off(e)
}

/// The connection closed in the middle of a reply: redis-rs's async decoder reports
/// the partial reply at the stream's end as a parse error of the RESP stream
/// (combine's "Parse error at <byte>"), not as an unexpected EOF. The command may
/// have run (a purchase made, its answer lost): an outage whose outcome is unknown,
/// a 503 whose retry under its `Idempotency-Key` is safe, never a 500. Found by the
/// fault proxy's resets (issue 53: a purchase answered 500 was in Postgres). A reply
/// of the wrong type (`from_redis_value`) says "Response was of incompatible type",
/// and stays a bug.
fn is_reply_cut_off(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Parse && e.to_string().contains("Parse error at")
}

/// Redis answered, but with a "not now" error (see [`REDIS_NOT_READY`]).
pub fn is_redis_not_ready(e: &redis::RedisError) -> bool {
    e.code().is_some_and(|code| REDIS_NOT_READY.contains(&code))
}

/// Seconds a client should wait before retrying after an outage answer.
pub const RETRY_AFTER_OUTAGE_SECS: u32 = 1;

/// Postgres down, restarting, shutting down, out of connections or too slow: an
/// outage (503). SQLSTATE class 08 is a connection exception, 57P01 to 57P05 are
/// "the server is shutting down / starting up", 53300 is too many connections,
/// 57014 a statement cancelled by `statement_timeout` (a read stuck behind a lock
/// or a slow server, see `database_statement_timeout_ms`), 55P03 a lock not
/// available in time.
pub(super) fn is_db_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| {
            c.starts_with("08")
                || c.starts_with("57P")
                || matches!(c.as_ref(), "53300" | "57014" | "55P03")
        }),
        _ => false,
    }
}

/// The SQLSTATE of a unique-constraint violation.
pub fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("23505"))
}

/// A wait for Postgres that ran out: an I/O error (an outage, 503), saying what
/// was given up and after how long.
pub fn postgres_timed_out(what: &str, limit: std::time::Duration) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "{what}: Postgres did not answer within {} ms; given up, its connection closed",
            limit.as_millis()
        ),
    ))
}

/// `work` within `limit`, else [`postgres_timed_out`]. For work that waits on
/// Postgres outside a request (settlement, rebuilds, expiry, draws, waiting
/// rooms): a link that died without a reset (a failover, a dropped route) never
/// answers, and the work would wait for ever, holding its lock, its loop and its
/// connection. Given up, the work is dropped with its connections, which the pool
/// closes instead of keeping (its ping on release is bounded: see
/// `startup::connect`), and the next turn tries again on new ones.
pub async fn within<T, E: From<sqlx::Error>>(
    what: &str,
    limit: std::time::Duration,
    work: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    match tokio::time::timeout(limit, work).await {
        Ok(done) => done,
        Err(_) => Err(postgres_timed_out(what, limit).into()),
    }
}
