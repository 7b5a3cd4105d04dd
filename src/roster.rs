//! The serving processes, and the rebuilds that ask them for what they keep.
//!
//! A server answers 202 once Redis has accepted an order or a vote; settlement
//! copies it into Postgres a little later. One Redis loses in between (a wipe, a
//! restart that lost its AOF tail, a failover to a replica that had not received
//! it) would be gone, and its buyer could buy again (its voter vote again). So
//! every server keeps the orders and votes it accepted in memory until settlement
//! has committed them (a [`Keeper`] of each [`Kind`]: `settle/kept.rs`), and every
//! rebuild of a sale's or poll's Redis state asks them first ([`barrier`]): before
//! it reads Postgres, it records a flush request (`flush_requests`, with its kind)
//! and notifies the servers (`NOTIFY stampede_flush`); each live server writes what
//! it keeps of that sale or poll into Postgres as settlement would (idempotent: a
//! row already there is skipped) and records the request as seen
//! (`server_roster.seen`); the rebuild reads Postgres once every live server has,
//! so what they wrote counts.
//!
//! A server is live while it writes its beat (every 2 s) and for
//! [`LIVE_WINDOW_S`] after; one that stops gracefully writes what it keeps and
//! leaves the roster. A live server that does not answer within [`BARRIER_MAX`] is
//! marked as having missed, and the rebuild goes on without it (a later barrier
//! waits for it again only once it has beaten since): only a server that dies, or
//! is cut off from Postgres, while Redis loses its orders may lose them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use sqlx::PgPool;
use tokio::sync::{Notify, watch};
use uuid::Uuid;

use crate::error::AppError;

/// What a flush request asks for: a sale's orders or a poll's votes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Sale,
    Poll,
}

impl Kind {
    /// As `flush_requests.kind` holds it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Sale => "sale",
            Kind::Poll => "poll",
        }
    }

    fn parse(text: &str) -> Option<Kind> {
        match text {
            "sale" => Some(Kind::Sale),
            "poll" => Some(Kind::Poll),
            _ => None,
        }
    }
}

/// A flush request not answered yet: its id, kind and sale or poll.
type Request = (i64, String, i64);

/// What a server keeps of the orders or votes it accepted (`settle/kept.rs`).
pub trait Keeper: Send + Sync {
    /// What it keeps.
    fn kind(&self) -> Kind;
    /// Writes into Postgres what it keeps of sale or poll `sale` (of every one with
    /// `None`), as settlement would, and forgets it; the rows written. With
    /// `after`, only while a flush request of it later than that is open: it holds
    /// them `FOR SHARE` in the write's transaction (see [`open_requests`]); when
    /// every one is closed it writes nothing, and forgets what it kept.
    fn flush<'a>(
        &'a self,
        db: &'a PgPool,
        sale: Option<i64>,
        after: Option<i64>,
    ) -> BoxFuture<'a, Result<usize, AppError>>;
    /// Forgets what settlement has committed; whether anything is still kept.
    fn release<'a>(&'a self, db: &'a PgPool) -> BoxFuture<'a, Result<bool, AppError>>;
    /// Whether anything is kept.
    fn any(&self) -> bool;
}

/// A server whose beat is older than this is not waited for. Long enough for a
/// Postgres outage to pass without the servers dropping out: during one no server
/// can beat, and the first rebuild after it starts before their next beat, so a
/// window shorter than the outage waited for nobody and every server's kept rows
/// came too late. A server that died costs one barrier [`BARRIER_MAX`] within
/// this window (it is then marked as having missed, and not waited for again).
pub const LIVE_WINDOW_S: f64 = 60.0;
/// How long a rebuild waits for the live servers to answer its request (more than
/// a flush waits for the sale's decisions in flight, `sale/kept.rs`).
pub const BARRIER_MAX: Duration = Duration::from_secs(5);
/// How often a server writes its beat (and looks for requests a lost notification
/// did not announce), in one statement: an idle server's only Postgres work.
const BEAT: Duration = Duration::from_secs(2);
/// How often a server that keeps orders asks Postgres which are settled.
const RELEASE_EVERY: Duration = Duration::from_millis(250);
/// The channel of the flush requests' notifications.
const CHANNEL: &str = "stampede_flush";
/// Beats between two clean-ups of the roster's old rows.
const CLEAN_EVERY: u32 = 300;

/// This server's place in the roster.
pub struct Roster {
    id: Uuid,
    seen: i64,
}

impl Roster {
    /// Joins the roster before the server accepts anything: a flush request made
    /// before this concerns nothing this server keeps.
    pub async fn join(db: &PgPool) -> Result<Roster, AppError> {
        let id = Uuid::new_v4();
        let seen: i64 = sqlx::query_scalar(
            "INSERT INTO server_roster (id, seen)
             VALUES ($1, (SELECT coalesce(max(id), 0) FROM flush_requests)) RETURNING seen",
        )
        .bind(id)
        .fetch_one(db)
        .await?;
        Ok(Roster { id, seen })
    }

    /// Answers flush requests, beats and releases what settlement committed, until
    /// `shutdown`; then writes everything it keeps and leaves the roster.
    /// `database_url`: the notifications' own connection.
    pub async fn serve(
        mut self,
        db: PgPool,
        database_url: String,
        keepers: Vec<Arc<dyn Keeper>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let woken = Arc::new(Notify::new());
        let listening = tokio::spawn(listen(database_url, woken.clone()));
        let mut beat = tokio::time::interval(BEAT);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut release = tokio::time::interval(RELEASE_EVERY);
        release.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut beats = 0u32;
        let mut keeping = false;
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                () = woken.notified() => {
                    within("answering flush requests", self.answer(&db, &keepers)).await;
                }
                _ = beat.tick() => {
                    let clean = beats.is_multiple_of(CLEAN_EVERY);
                    within("the roster beat", async {
                        if let Some(requests) = self.beat(&db, clean).await {
                            self.answer_these(&db, &keepers, requests).await;
                        }
                    })
                    .await;
                    beats = beats.wrapping_add(1);
                    keeping = keepers.iter().any(|k| k.any());
                }
                _ = release.tick(), if keeping => {
                    keeping = false;
                    for keeper in keepers.iter().filter(|k| k.any()) {
                        keeping |= released(keeper.as_ref(), &db).await;
                    }
                }
            }
        }
        listening.abort();
        // Requests not answered yet first (a closed one's rows are not written),
        // then the rest: settlement would have to read it from Redis otherwise.
        within(
            "writing what this server keeps at shutdown",
            self.leave(&db, &keepers),
        )
        .await;
    }

    /// At shutdown: writes everything kept, then leaves the roster.
    async fn leave(&mut self, db: &PgPool, keepers: &[Arc<dyn Keeper>]) {
        self.answer(db, keepers).await;
        for keeper in keepers {
            let kind = keeper.kind().as_str();
            match keeper.flush(db, None, None).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    kind,
                    rows = n,
                    "wrote the unsettled orders or votes this server kept"
                ),
                Err(e) => {
                    tracing::warn!(kind, error = %e, "writing the kept orders or votes at shutdown failed")
                }
            }
        }
        let _ = sqlx::query("DELETE FROM server_roster WHERE id = $1")
            .bind(self.id)
            .execute(db)
            .await;
    }

    /// Writes what is kept of the sales of the requests not seen yet, then records
    /// them as seen. A failure leaves them unseen: the next beat tries again.
    async fn answer(&mut self, db: &PgPool, keepers: &[Arc<dyn Keeper>]) {
        let requests: Vec<Request> = match sqlx::query_as(
            "SELECT id, kind, sale_id FROM flush_requests WHERE id > $1 ORDER BY id",
        )
        .bind(self.seen)
        .fetch_all(db)
        .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "reading flush requests failed");
                return;
            }
        };
        self.answer_these(db, keepers, requests).await;
    }

    /// [`Roster::answer`] of the requests read.
    async fn answer_these(
        &mut self,
        db: &PgPool,
        keepers: &[Arc<dyn Keeper>],
        requests: Vec<Request>,
    ) {
        let Some(&(last, ..)) = requests.last() else {
            return;
        };
        // A kind this version does not know asks for nothing it keeps.
        let asked: BTreeSet<(Kind, i64)> = requests
            .iter()
            .filter_map(|(_, kind, id)| Some((Kind::parse(kind)?, *id)))
            .collect();
        for (kind, id) in asked {
            let Some(keeper) = keepers.iter().find(|k| k.kind() == kind) else {
                continue;
            };
            let kind = kind.as_str();
            match keeper.flush(db, Some(id), Some(self.seen)).await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(
                    kind,
                    id,
                    rows = n,
                    "a rebuild asked: wrote the unsettled orders or votes this server kept"
                ),
                Err(e) => {
                    tracing::warn!(kind, id, error = %e, "writing kept orders or votes failed; will retry");
                    return;
                }
            }
        }
        match sqlx::query("UPDATE server_roster SET seen = $2, beat_at = now() WHERE id = $1")
            .bind(self.id)
            .bind(last)
            .execute(db)
            .await
        {
            Ok(_) => self.seen = last,
            Err(e) => tracing::debug!(error = %e, "recording flush requests as seen failed"),
        }
    }

    /// The beat, and the requests not seen yet, in one statement; a row gone
    /// (cleaned up while Postgres was out of reach) is written again. Now and then,
    /// rows of servers and requests an hour old go. `None` when it failed.
    async fn beat(&self, db: &PgPool, clean: bool) -> Option<Vec<Request>> {
        let requests = sqlx::query_as(
            "WITH b AS (INSERT INTO server_roster (id, seen) VALUES ($1, $2)
                        ON CONFLICT (id) DO UPDATE SET beat_at = now())
             SELECT id, kind, sale_id FROM flush_requests WHERE id > $2 ORDER BY id",
        )
        .bind(self.id)
        .bind(self.seen)
        .fetch_all(db)
        .await;
        let requests = match requests {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "the roster beat failed");
                return None;
            }
        };
        if clean {
            let _ = sqlx::query(
                "WITH s AS (DELETE FROM server_roster WHERE beat_at < now() - interval '1 hour')
                 DELETE FROM flush_requests WHERE at < now() - interval '1 hour'",
            )
            .execute(db)
            .await;
        }
        Some(requests)
    }
}

/// Whether `keeper` still keeps rows after releasing those settlement committed
/// (true when that could not be read).
async fn released(keeper: &dyn Keeper, db: &PgPool) -> bool {
    let read = within("reading which kept rows are settled", keeper.release(db)).await;
    read.is_none_or(|r| {
        r.unwrap_or_else(|e| {
            tracing::debug!(error = %e, "reading which kept rows are settled failed");
            true
        })
    })
}

/// How long one turn of the roster's loop (a beat and the flushes it asks for, an
/// answer, a release) may wait for Postgres: past it the turn is given up, its
/// connections closed (see `startup::connect`), and the next beat tries again. A
/// link that died without a reset would otherwise stop the beats for ever, and
/// with them this server's answers to every rebuild.
const TURN_LIMIT: Duration = Duration::from_secs(15);

/// `work` within [`TURN_LIMIT`]; `None` (and a warning) when it took longer.
async fn within<T>(what: &str, work: impl Future<Output = T>) -> Option<T> {
    match tokio::time::timeout(TURN_LIMIT, work).await {
        Ok(done) => Some(done),
        Err(_) => {
            tracing::warn!(
                limit_ms = TURN_LIMIT.as_millis() as u64,
                "{what}: Postgres did not answer in time; given up, tried again at the next beat"
            );
            None
        }
    }
}

/// Wakes the roster's loop on each flush request's notification, on a connection
/// of its own (reconnected by `PgListener` when it drops; a notification lost
/// meanwhile is found by the next beat).
async fn listen(database_url: String, woken: Arc<Notify>) {
    loop {
        let listener = async {
            let mut l = sqlx::postgres::PgListener::connect(&database_url).await?;
            l.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(l)
        };
        match listener.await {
            Ok(mut l) => loop {
                match l.recv().await {
                    Ok(_) => woken.notify_one(),
                    Err(e) => {
                        tracing::debug!(error = %e, "the flush requests' listener failed");
                        break;
                    }
                }
            },
            Err(e) => tracing::debug!(error = %e, "cannot listen for flush requests"),
        }
        tokio::time::sleep(BEAT).await;
    }
}

/// In a flush's transaction: the open flush requests of sale or poll `sale`
/// later than `after`, held `FOR SHARE` until its commit, so that a rebuild that
/// closes one waits for the write and then reads it. None: every such request was
/// closed.
pub async fn open_requests(
    tx: &mut sqlx::PgConnection,
    kind: Kind,
    sale: i64,
    after: i64,
) -> Result<usize, sqlx::Error> {
    let open: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM flush_requests
         WHERE kind = $3 AND sale_id = $1 AND id > $2 AND closed_at IS NULL FOR SHARE",
    )
    .bind(sale)
    .bind(after)
    .bind(kind.as_str())
    .fetch_all(tx)
    .await?;
    Ok(open.len())
}

/// What a [`barrier`] waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waited {
    /// Live servers that did not answer within [`BARRIER_MAX`].
    pub missed: i64,
    pub took: Duration,
}

/// Asks every live server to write what it keeps of sale or poll `sale` into
/// Postgres, and waits until each has (see the module docs). Called by a rebuild
/// before it reads Postgres.
pub async fn barrier(db: &PgPool, kind: Kind, sale: i64) -> Result<Waited, AppError> {
    let start = Instant::now();
    let id: i64 = sqlx::query_scalar(
        "WITH r AS (INSERT INTO flush_requests (sale_id, kind) VALUES ($1, $3) RETURNING id)
         SELECT id FROM r, pg_notify($2, r.id::text) AS n",
    )
    .bind(sale)
    .bind(CHANNEL)
    .bind(kind.as_str())
    .fetch_one(db)
    .await?;
    // Live, not answered yet, and not marked as having missed an earlier request
    // without beating since.
    macro_rules! waiting {
        () => {
            " WHERE seen < $1
              AND beat_at > now() - make_interval(secs => $2)
              AND (missed_at IS NULL OR beat_at > missed_at)"
        };
    }
    let mut pause = Duration::from_millis(2);
    loop {
        let waiting: i64 =
            sqlx::query_scalar(concat!("SELECT count(*) FROM server_roster", waiting!()))
                .bind(id)
                .bind(LIVE_WINDOW_S)
                .fetch_one(db)
                .await?;
        if waiting == 0 {
            close(db, id).await?;
            return Ok(Waited {
                missed: 0,
                took: start.elapsed(),
            });
        }
        if start.elapsed() >= BARRIER_MAX {
            close(db, id).await?;
            let missed = sqlx::query(concat!(
                "UPDATE server_roster SET missed_at = now()",
                waiting!()
            ))
            .bind(id)
            .bind(LIVE_WINDOW_S)
            .execute(db)
            .await?
            .rows_affected();
            tracing::warn!(
                kind = kind.as_str(),
                id = sale,
                missed,
                "rebuilding without the unsettled orders or votes of servers that did not answer"
            );
            return Ok(Waited {
                missed: i64::try_from(missed).unwrap_or(i64::MAX),
                took: start.elapsed(),
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// Closes a request: waits for the writes that hold it (see [`open_requests`]),
/// and no server writes for it after.
async fn close(db: &PgPool, id: i64) -> Result<(), AppError> {
    sqlx::query("UPDATE flush_requests SET closed_at = now() WHERE id = $1")
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}
