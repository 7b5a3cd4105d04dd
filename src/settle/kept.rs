//! The decisions this server accepted that settlement has not committed yet (a
//! sale's orders, a poll's votes), kept in memory so that a Redis that loses them
//! (wiped, restarted without its AOF tail, failed over to a replica that had not
//! received them) does not lose them: a rebuild of the sale or poll asks every live
//! server to write them into Postgres first ([`crate::roster`]), and reads them
//! there.
//!
//! The purchase and vote deciders keep each batch's accepted decisions before they
//! answer them ([`Kept::keep`]), and count their batches in flight so that a flush
//! waits for a decision Redis may have made before the rebuild's fence. Every 250
//! ms while anything is kept the roster asks Postgres which batches are settled
//! (one row of each, by primary key: settlement commits a batch's rows together,
//! a stream entry being one batch) and they are forgotten. At most [`MAX_ROWS`] are
//! kept, each for at most [`MAX_AGE`]; past either the oldest are let go and
//! counted (`stampede_kept_dropped_total`). What differs between orders and votes
//! (the flush requests' kind, how a row is looked for in Postgres) is
//! [`KeptRows`]; the write is the feature's settlement ([`Settle::write`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use sqlx::PgPool;
use uuid::Uuid;

use super::{Accepted, Insert, Settle};
use crate::error::AppError;
use crate::metrics::Metrics;
use crate::roster::Kind;

/// Rows kept at most, of one kind (about 100 bytes each); past it the oldest are
/// let go.
pub const MAX_ROWS: usize = 500_000;
/// A row unsettled for this long is let go (settlement that far behind has
/// failed for other reasons; Redis still holds it).
pub const MAX_AGE: Duration = Duration::from_secs(15 * 60);
/// How long a flush waits for the sale's decisions in flight.
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(3);
/// Rows per insert of a flush.
const FLUSH_CHUNK: usize = 5_000;

/// What differs between the kinds of kept rows (see the module docs).
pub trait KeptRows: Settle + Send + Sync + 'static {
    /// The kind of the flush requests that ask for these rows.
    const KIND: Kind;

    /// Which of `probes` (one row of each kept batch) Postgres holds: their
    /// indexes.
    fn settled<'a>(
        &'a self,
        db: &'a PgPool,
        probes: &'a [&'a Accepted],
    ) -> BoxFuture<'a, Result<HashSet<usize>, sqlx::Error>>;
}

/// One decision batch's accepted rows.
struct Batch {
    at: Instant,
    orders: Vec<Accepted>,
}

#[derive(Default)]
struct Inner {
    sales: HashMap<i64, Vec<Batch>>,
    orders: usize,
    in_flight: HashMap<i64, usize>,
}

/// See the module docs. Shared by every HTTP worker's decider of its kind.
pub struct Kept<R: KeptRows> {
    rows: R,
    /// A std mutex: held for a push or a removal, never across an await.
    inner: Mutex<Inner>,
    metrics: Arc<Metrics>,
}

/// A decision batch of a sale or poll in flight (see [`Kept::deciding`]).
pub struct Deciding<R: KeptRows> {
    kept: Arc<Kept<R>>,
    sale: i64,
}

impl<R: KeptRows> Drop for Deciding<R> {
    fn drop(&mut self) {
        let mut inner = self.kept.lock();
        if let Some(n) = inner.in_flight.get_mut(&self.sale) {
            *n -= 1;
            if *n == 0 {
                inner.in_flight.remove(&self.sale);
            }
        }
    }
}

impl<R: KeptRows> Kept<R> {
    pub fn new(rows: R, metrics: Arc<Metrics>) -> Arc<Kept<R>> {
        Arc::new(Kept {
            rows,
            inner: Mutex::new(Inner::default()),
            metrics,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A decision batch of sale or poll `owner` is about to run: held until its
    /// accepted rows are kept.
    pub fn deciding(self: &Arc<Self>, owner: i64) -> Deciding<R> {
        *self.lock().in_flight.entry(owner).or_default() += 1;
        Deciding {
            kept: self.clone(),
            sale: owner,
        }
    }

    /// Keeps the rows a batch of one sale or poll accepted (each row's `owner`);
    /// see [`Kept::keep_decided`] for replays.
    pub fn keep(&self, orders: Vec<Accepted>) {
        let Some(owner) = orders.first().map(|r| r.owner) else {
            return;
        };
        let mut inner = self.lock();
        inner.orders += orders.len();
        inner.sales.entry(owner).or_default().push(Batch {
            at: Instant::now(),
            orders,
        });
        let mut dropped = 0;
        while inner.orders > MAX_ROWS {
            dropped += drop_oldest(&mut inner);
        }
        drop(inner);
        self.metrics.kept_dropped.add(dropped as u64);
    }

    /// Keeps a decision batch's accepted rows, each marked whether it was a replay:
    /// the fresh ones as the batch, each replay on its own. A replay is kept too: its
    /// first call may have failed after Redis ran it (a response timeout, a reply
    /// cut), keeping nothing; and alone, since its first batch was another (the
    /// release's probe of a batch is its first row).
    pub fn keep_decided(&self, rows: impl IntoIterator<Item = (bool, Accepted)>) {
        let (replays, fresh): (Vec<_>, Vec<_>) = rows.into_iter().partition(|(r, _)| *r);
        self.keep(fresh.into_iter().map(|(_, row)| row).collect());
        for (_, row) in replays {
            self.keep(vec![row]);
        }
    }

    /// Rows kept now.
    pub fn len(&self) -> usize {
        self.lock().orders
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes every batch of `sale` (all with `None`), once its decisions in flight
    /// are done (at most [`IN_FLIGHT_WAIT`]).
    async fn take(&self, sale: Option<i64>) -> Vec<Batch> {
        let deadline = Instant::now() + IN_FLIGHT_WAIT;
        loop {
            {
                let mut inner = self.lock();
                let busy = match sale {
                    Some(s) => inner.in_flight.contains_key(&s),
                    None => !inner.in_flight.is_empty(),
                };
                if !busy || Instant::now() >= deadline {
                    let taken: Vec<Batch> = match sale {
                        Some(s) => inner.sales.remove(&s).unwrap_or_default(),
                        None => inner.sales.drain().flat_map(|(_, b)| b).collect(),
                    };
                    inner.orders -= taken.iter().map(|b| b.orders.len()).sum::<usize>();
                    return taken;
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Puts back batches a flush could not write.
    fn put_back(&self, batches: Vec<Batch>) {
        let mut inner = self.lock();
        for b in batches {
            inner.orders += b.orders.len();
            let sale = b.orders[0].owner;
            inner.sales.entry(sale).or_default().insert(0, b);
        }
    }

    async fn flush_now(
        &self,
        db: &PgPool,
        sale: Option<i64>,
        after: Option<i64>,
    ) -> Result<usize, AppError> {
        let batches = self.take(sale).await;
        if batches.is_empty() {
            return Ok(0);
        }
        let rows: Vec<Accepted> = batches.iter().flat_map(|b| b.orders.clone()).collect();
        let written = async {
            let mut tx = db.begin().await?;
            if let (Some(sale), Some(after)) = (sale, after)
                && crate::roster::open_requests(&mut tx, R::KIND, sale, after).await? == 0
            {
                return Ok(None);
            }
            let mut inserted = 0;
            for chunk in rows.chunks(FLUSH_CHUNK) {
                inserted += self
                    .rows
                    .write(&mut tx, chunk, Insert::Tolerant)
                    .await?
                    .inserted;
            }
            tx.commit().await?;
            Ok::<Option<u64>, sqlx::Error>(Some(inserted))
        };
        match written.await {
            Ok(Some(inserted)) => {
                self.metrics.kept_flushed.add(inserted);
                Ok(rows.len())
            }
            Ok(None) => {
                // The rebuild that asked did without them: written now, a unit the
                // rebuilt sale sold again could be sold twice. Settlement still
                // writes whatever Redis kept of them.
                tracing::error!(
                    kind = R::KIND.as_str(),
                    id = sale,
                    rows = rows.len(),
                    "kept orders or votes not written: the rebuild that asked for them stopped waiting"
                );
                self.metrics.kept_late.add(rows.len() as u64);
                Ok(0)
            }
            Err(e) => {
                self.put_back(batches);
                Err(e.into())
            }
        }
    }

    async fn release_now(&self, db: &PgPool) -> Result<bool, AppError> {
        let probes: Vec<Accepted> = {
            let inner = self.lock();
            inner
                .sales
                .values()
                .flatten()
                .map(|b| b.orders[0].clone())
                .collect()
        };
        if probes.is_empty() {
            return Ok(false);
        }
        let refs: Vec<&Accepted> = probes.iter().collect();
        let found = self.rows.settled(db, &refs).await?;
        let settled: HashSet<RowKey> = found.into_iter().map(|i| row_key(&probes[i])).collect();
        let mut inner = self.lock();
        let mut released = 0;
        let mut dropped = 0;
        for batches in inner.sales.values_mut() {
            batches.retain(|b| {
                let settled = settled.contains(&row_key(&b.orders[0]));
                let old = b.at.elapsed() > MAX_AGE;
                if settled {
                    released += b.orders.len();
                } else if old {
                    dropped += b.orders.len();
                }
                !settled && !old
            });
        }
        inner.sales.retain(|_, b| !b.is_empty());
        inner.orders -= released + dropped;
        let any = !inner.sales.is_empty();
        drop(inner);
        self.metrics.kept_dropped.add(dropped as u64);
        Ok(any)
    }
}

/// A kept row's identity: its owner, user, id (an order's) and seq (a vote's).
type RowKey = (i64, i64, Option<Uuid>, i32);

fn row_key(r: &Accepted) -> RowKey {
    (r.owner, r.user, r.id, r.vote.as_ref().map_or(0, |v| v.seq))
}

/// Lets the oldest batch of all go; its orders.
fn drop_oldest(inner: &mut Inner) -> usize {
    let Some((&sale, _)) = inner
        .sales
        .iter()
        .filter(|(_, b)| !b.is_empty())
        .min_by_key(|(_, b)| b[0].at)
    else {
        inner.orders = 0;
        return 0;
    };
    let batches = inner.sales.get_mut(&sale).expect("just found");
    let gone = batches.remove(0).orders.len();
    if batches.is_empty() {
        inner.sales.remove(&sale);
    }
    inner.orders -= gone;
    gone
}

impl<R: KeptRows> crate::roster::Keeper for Kept<R> {
    fn kind(&self) -> Kind {
        R::KIND
    }

    fn flush<'a>(
        &'a self,
        db: &'a PgPool,
        sale: Option<i64>,
        after: Option<i64>,
    ) -> BoxFuture<'a, Result<usize, AppError>> {
        Box::pin(self.flush_now(db, sale, after))
    }

    fn release<'a>(&'a self, db: &'a PgPool) -> BoxFuture<'a, Result<bool, AppError>> {
        Box::pin(self.release_now(db))
    }

    fn any(&self) -> bool {
        !self.is_empty()
    }
}
