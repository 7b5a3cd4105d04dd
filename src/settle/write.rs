//! The write step: a batch of events into Postgres in one transaction, then the
//! entries acknowledged (and dropped from their pending hash).

use std::collections::HashMap;
use std::time::Instant;

use super::{Accepted, Entries, Event, Insert, SETTLE_GROUP, Settled, Settler};
use crate::metrics::Metrics;

impl Settler {
    /// Writes a batch in one transaction, each feature its own rows; returns the
    /// rows inserted and the ids in conflict. Plain inserts first; a batch that
    /// meets a row already there (a redelivery, or an order in conflict) is
    /// written again, skipping those rows.
    async fn write(&self, events: &[Event]) -> Result<(u64, Vec<String>), sqlx::Error> {
        match self.write_within(events, Insert::Fresh).await {
            Err(e)
                if e.as_database_error()
                    .is_some_and(|d| d.is_unique_violation()) =>
            {
                Metrics::inc(&self.metrics.settle_rewrites);
                tracing::debug!(
                    error = %e,
                    "a settlement batch met rows already in Postgres; writing it again, skipping them"
                );
                self.write_within(events, Insert::Tolerant).await
            }
            written => written,
        }
    }

    /// [`Settler::write_as`] within `settle.write_timeout_ms`. Past it, the
    /// transaction is dropped with its connection, which the pool closes rather
    /// than keeps (its ping on release is bounded: see `startup::connect`), and
    /// the batch is left pending, to be written again on another connection: a
    /// link to Postgres that died without a reset would otherwise hold settlement
    /// for ever, every 202 after it unsettled. Whether a commit cut off here
    /// landed does not matter: the next write skips the rows already there.
    async fn write_within(
        &self,
        events: &[Event],
        insert: Insert,
    ) -> Result<(u64, Vec<String>), sqlx::Error> {
        let limit = self.config.write_timeout;
        match tokio::time::timeout(limit, self.write_as(events, insert)).await {
            Ok(written) => written,
            Err(_) => {
                Metrics::inc(&self.metrics.settle_timeouts);
                Err(crate::error::postgres_timed_out(
                    "a settlement batch's transaction (settle.write_timeout_ms)",
                    limit,
                ))
            }
        }
    }

    async fn write_as(
        &self,
        events: &[Event],
        insert: Insert,
    ) -> Result<(u64, Vec<String>), sqlx::Error> {
        let mut tx = self.db.begin().await?;
        let (mut inserted, mut conflicting) = (0, Vec::new());
        for (feature, settle) in self.features.iter().enumerate() {
            let rows: Vec<Accepted> = events
                .iter()
                .filter(|e| e.feature == feature)
                .flat_map(|e| e.accepted.iter().cloned())
                .collect();
            if rows.is_empty() {
                continue;
            }
            let written = settle.write(&mut tx, &rows, insert).await?;
            inserted += written.inserted;
            conflicting.extend(written.conflicting);
        }
        tx.commit().await?;
        Ok((inserted, conflicting))
    }

    /// Writes a batch of events, then acknowledges their entries.
    pub(super) async fn settle(&mut self, events: Vec<Event>) -> anyhow::Result<Settled> {
        if events.is_empty() {
            return Ok(Settled::default());
        }
        let started = Instant::now();
        let (inserted, conflicting) = self.write(&events).await?;
        self.report_conflicts(&conflicting);
        self.metrics.settled_rows.add(inserted);
        // Only now, with the rows committed, may the entries be acknowledged. If this
        // fails, they are delivered again and the insert above skips them.
        self.acknowledge(&events).await?;
        self.metrics
            .observed
            .settle_batch_seconds
            .record(started.elapsed().as_secs_f64());
        self.metrics.observed.touched();
        if let Some(settled) = &self.settled {
            settled.notify_one();
        }
        Ok(Settled {
            read: events.iter().map(|e| e.accepted.len()).sum(),
            inserted,
        })
    }

    /// Logs (and counts) accepted decisions that Postgres could not take.
    fn report_conflicts(&self, conflicting: &[String]) {
        if !conflicting.is_empty() {
            // Redis accepted these, but Postgres already holds another order of the
            // same user for the same sale (or the sale or the user is gone), or
            // another ballot under the same (poll, user, seq): the two stores
            // disagree (Redis lost its buyers or voters hash, or two deployments
            // share one database). Nothing to retry; say so loudly and leave the
            // repair to `stampede reconcile`.
            self.metrics.settle_conflicts.add(conflicting.len() as u64);
            tracing::error!(
                count = conflicting.len(),
                decisions = ?conflicting,
                "accepted decisions conflict with settled ones of the same user; \
                 Redis and Postgres disagree: run `stampede reconcile` (sales), compare \
                 the poll's tallies with GET /api/admin/polls/{{id}} (votes)"
            );
        }
    }

    /// Acknowledges (and deletes) the entries of committed events, once their
    /// decisions are dropped from their streams' pending hashes.
    async fn acknowledge(&mut self, events: &[Event]) -> anyhow::Result<()> {
        // Per stream: its entry ids, and the pending hash with the order ids to drop.
        #[derive(Default)]
        struct Done<'a> {
            entries: Vec<&'a str>,
            pending: Option<&'a str>,
            feature: usize,
            records: Vec<String>,
        }
        let mut by_stream: HashMap<&str, Done<'_>> = HashMap::new();
        for ev in events {
            let done = by_stream.entry(ev.stream.as_str()).or_default();
            done.entries.push(ev.entry_id.as_str());
            done.pending = ev.pending.as_deref();
            done.feature = ev.feature;
            done.records.extend(ev.record.iter().cloned());
        }
        // A stream with a pending hash: its orders leave the hash and its entries
        // are acknowledged and deleted in one call. The others (and a feature that
        // leaves it to us): `XACK` and `XDEL`, pipelined. A failure before leaves
        // the entries to be delivered again, which finds their rows written and
        // their orders gone.
        let mut pipe = redis::pipe();
        let mut piped = false;
        for (stream, done) in &by_stream {
            if let Some(pending) = done.pending
                && !done.records.is_empty()
            {
                let entries = Entries {
                    stream,
                    group: SETTLE_GROUP,
                    ids: &done.entries,
                };
                if self.features[done.feature]
                    .drop_pending(&mut self.redis, pending, &done.records, entries)
                    .await?
                {
                    continue;
                }
            }
            pipe.xack(*stream, SETTLE_GROUP, &done.entries).ignore();
            pipe.xdel(*stream, &done.entries).ignore();
            piped = true;
        }
        if piped {
            let _: () = pipe.query_async(&mut self.redis).await?;
        }
        Ok(())
    }
}
