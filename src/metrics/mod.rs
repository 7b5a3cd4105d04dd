//! What operators read at `GET /metrics`, in the Prometheus text format, all
//! rendered by one `metrics-exporter-prometheus` recorder ([`observed`]). The
//! histograms, gauges and limiter counters are `metrics` crate handles; the counters
//! bumped on every request are sharded atomics ([`Counter`]: one relaxed add on a
//! cache line of this thread's own, where a shared handle would move one line
//! between the cores), handed to the recorder as absolute values at scrape time.

pub mod observed;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

pub use observed::Observed;

macro_rules! counters {
    ($($field:ident : $help:literal),* $(,)?) => {
        #[derive(Default)]
        pub struct Metrics {
            $(pub $field: Counter,)*
            /// Histograms and gauges (see [`observed`]).
            pub observed: Observed,
            /// Whether this process's settlement worker holds the settling lease
            /// (`stampede_settle_leading`, set by `settle/lease.rs`).
            pub settle_leading: std::sync::atomic::AtomicBool,
        }

        impl Metrics {
            /// Metrics that nothing will ever read (`/metrics` served nowhere, or a
            /// CLI command): the counters still count (an atomic add each, no
            /// memory), the histograms record nothing (see [`Observed::off`]).
            pub fn off() -> Self {
                Metrics {
                    $($field: Counter::default(),)*
                    observed: Observed::off(),
                    settle_leading: Default::default(),
                }
            }

            /// Prometheus exposition text of every counter, histogram and gauge.
            pub fn render(&self) -> String {
                $(
                    self.observed.counter_total(
                        concat!("stampede_", stringify!($field), "_total"),
                        $help,
                        self.$field.get(),
                    );
                )*
                self.observed.render()
            }
        }
    };
}

counters! {
    purchase_accepted: "Purchases accepted by the purchase script.",
    purchase_already_bought: "Purchases refused: the user already bought from the sale.",
    purchase_sold_out: "Purchases refused as sold out by the script.",
    purchase_sold_out_local: "Purchases refused as sold out from the process-local flag, without Redis.",
    purchase_not_open: "Purchases refused: sale not started, ended or closed.",
    purchase_limited: "Purchases refused by a rate limit inside the purchase script.",
    purchase_unavailable: "Purchases answered 503 because the sale's Redis state was missing or untrusted (being rebuilt).",
    rebuilds: "Sales and polls rebuilt in Redis from Postgres by this process.",
    buy_batches: "Purchase script calls (each decides a batch of purchases of one sale).",
    buy_batched: "Purchases decided in batches; divided by buy_batches, the mean batch size.",
    live_reads: "Reads of a sale's or poll's live view for its event streams (one per watched sale or poll per interval, however many pages watch it).",
    live_refused: "Event streams refused as one too many for their client address (max_streams_per_client).",
    vote_batches: "Vote script calls (each decides a batch of votes of one poll).",
    vote_batched: "Votes decided in batches.",
    vote_accepted: "Votes accepted by the vote script.",
    vote_refused: "Votes refused (already voted, unknown option, poll not open).",
    rate_limited: "Requests refused by a rate limit.",
    settled_rows: "Orders and votes written to Postgres by this process's settlement worker.",
    settle_errors: "Settlement steps that failed and will be retried.",
    settle_rewrites: "Settlement batches written a second time with ON CONFLICT DO NOTHING, because their plain INSERT met a row already there (a redelivery after a failure, an order in conflict, or a second order under an idempotency key Redis had forgotten, which settles without the key).",
    settle_timeouts: "Settlement transactions given up after settle.write_timeout_ms (Postgres did not answer: a link that died without a reset, or a lock held that long): their connection closed, their batch written again on another.",
    order_cancels_buyer: "Orders cancelled by their buyer (units returned).",
    order_cancels_admin: "Orders cancelled or refunded by an admin (units returned).",
    order_cancels_refused: "Cancels refused as not_cancellable (already cancelled, expired, or paid for a buyer).",
    queue_batches: "Waiting-room script calls (each answers a batch of joins and position queries of one sale).",
    queue_batched: "Joins and position queries answered in batches.",
    held_batches: "Reads of buyers' orders for already_bought answers the purchase script could not name (a sale bought before it kept each buyer's order), each for the refusals of one sale that waited together: one Postgres query, and for buyers without a settled order that holds its units one XRANGE and at most one more query.",
    held_batched: "Refusals whose buyer's orders were read in batches (a buyer asked twice in one batch is read once).",
    held_unread: "already_bought answers sent without the buyer's orders: not read within 100 ms (Postgres or Redis slow or down, or the read's queue long) or the read failed.",
    entry_batches: "Postgres transactions writing draw entries (each the entries of one sale that waited together).",
    entry_batched: "Draw entries written or found in batches; divided by entry_batches, the mean batch size.",
    queue_joins: "Places taken in waiting rooms (a join again of a place held is not counted).",
    queue_admitted: "Shoppers admitted from waiting rooms by this process's admitter.",
    queue_passed: "Admissions that expired unused (their room went to the next in line), as this process's admitter found them.",
    kept_flushed: "Accepted orders this process kept until settled and wrote into Postgres itself, because a rebuild of their sale asked (Redis wiped, restarted or failed over before settlement read them); orders already there are not counted.",
    kept_dropped: "Accepted orders this process stopped keeping before settlement committed them (more than 500,000 kept, or unsettled for 15 minutes): a Redis that lost them after that would lose them.",
    kept_late: "Accepted orders this process kept but did not write when a rebuild asked, because the rebuild had stopped waiting for it (this process did not answer within 5 s): written then, a unit could be sold twice; lost if Redis lost them.",
    settle_conflicts: "Accepted orders or votes Postgres refused because another order holds their (sale, user) (or their sale or user is gone: a user a rehearsal cleanup removed), or another ballot holds their (poll, user, seq): Redis and Postgres disagree.",
}

impl Metrics {
    pub fn inc(counter: &Counter) {
        counter.add(1);
    }
}

/// Shards per counter: more than the threads that count (the HTTP workers, the
/// runtime's threads), so each gets a shard of its own.
const SHARDS: usize = 16;

/// One shard, alone on its cache lines (128 bytes: adjacent-line prefetch pairs).
#[derive(Default)]
#[repr(align(128))]
struct Shard(AtomicU64);

/// A counter bumped by every HTTP worker on every request. One shared atomic
/// would move its cache line between the cores on every bump (and, packed with
/// the other counters, theirs too); each thread adds to its own shard instead,
/// and a read sums them.
#[derive(Default)]
pub struct Counter {
    shards: [Shard; SHARDS],
}

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's shard, handed out in turn the first time it counts.
    static SHARD: usize = NEXT_SHARD.fetch_add(1, Relaxed) % SHARDS;
}

impl Counter {
    pub fn add(&self, n: u64) {
        let shard = SHARD.with(|s| *s);
        self.shards[shard].0.fetch_add(n, Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.shards.iter().map(|s| s.0.load(Relaxed)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        Metrics::inc(&m.purchase_accepted);
        Metrics::inc(&m.purchase_accepted);
        let text = m.render();
        assert!(text.contains("# TYPE stampede_purchase_accepted_total counter"));
        assert!(text.contains("\nstampede_purchase_accepted_total 2\n"));
        assert!(text.contains("\nstampede_vote_accepted_total 0\n"));
    }

    #[test]
    fn a_counter_sums_what_every_thread_added() {
        let counter = std::sync::Arc::new(Counter::default());
        let threads: Vec<_> = (0..20)
            .map(|_| {
                let counter = counter.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        counter.add(1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        counter.add(5);
        assert_eq!(counter.get(), 20_005);
    }
}

/// The pattern a request was routed by (`/api/sales/{id}/purchase`), set where the
/// route is registered (`routes!`, as resource data) or where a request is answered
/// before routing (`conn::guard`, as a request extension): the label of the request
/// metrics, so the path is not matched against the patterns a second time.
#[derive(Clone, Copy, Debug)]
pub struct RouteLabel(pub &'static str);
