//! What each HTTP worker holds of its own: its Redis connections and batchers.

use actix_web::web;

use super::connect::connect_worker_redis;
use crate::state::AppState;

/// One worker's own Redis connection (and, with `replica_acks`, the connections of
/// its buy and vote batches) and batchers, made on the worker's thread.
pub(super) async fn build_worker(
    state: web::Data<AppState>,
) -> anyhow::Result<crate::state::Worker> {
    use crate::batch::{Batcher, Connections, Counters};
    use crate::limit::Route;
    let redis = connect_worker_redis(&state.config).await?;
    let max = state.config.batch_max;
    // With replica acknowledgements a batch's `WAIT` holds its connection until a
    // replica answers: the buy and vote batchers then share `batch_in_flight`
    // connections of their own, a batch taking the least busy, so batches rarely
    // queue behind another's `WAIT`, and the worker's own connection (the queue's
    // and the held orders' batches, sessions) never does.
    let own = Connections::new(vec![redis.clone()]);
    let deciding = if state.config.replica_acks > 0 {
        let mut deciding = Vec::new();
        for _ in 0..state.config.batch_in_flight() {
            deciding.push(connect_worker_redis(&state.config).await?);
        }
        Connections::new(deciding)
    } else {
        own.clone()
    };
    // Connections left idle through a Redis fault, made whole once it heals (one
    // node: a cluster connection reconnects each node on its own).
    if !redis.is_cluster() {
        let mut watched = vec![redis.clone()];
        if state.config.replica_acks > 0 {
            watched.extend(deciding.all());
        }
        actix_web::rt::spawn(crate::redis_conn::watch::watch(watched));
    }
    Ok(crate::state::Worker {
        buys: Batcher::new(
            crate::sale::buy::BuyDecider {
                keys: state.keys.clone(),
                policies: state.limiter.limits().for_route(Route::Buy).to_vec(),
                replica_acks: crate::redis_conn::acks::ReplicaAcks::from_config(&state.config),
                key_ttl: state.config.purchase_key_ttl,
                kept: Some(state.kept.clone()),
            },
            deciding.clone(),
            max,
            state.config.batch_in_flight(),
            Counters {
                metrics: state.metrics.clone(),
                batches: |m| &m.buy_batches,
                requests: |m| &m.buy_batched,
                sizes: |m| &m.observed.buy_batch_size,
            },
        ),
        votes: Batcher::new(
            crate::vote::cast::VoteDecider {
                keys: state.keys.clone(),
                policies: state.limiter.limits().for_route(Route::Vote).to_vec(),
                replica_acks: crate::redis_conn::acks::ReplicaAcks::from_config(&state.config),
                key_ttl_ms: u64::try_from(state.config.purchase_key_ttl.as_millis())
                    .unwrap_or(u64::MAX),
                kept: Some(state.kept_votes.clone()),
            },
            deciding.clone(),
            max,
            state.config.batch_in_flight(),
            Counters {
                metrics: state.metrics.clone(),
                batches: |m| &m.vote_batches,
                requests: |m| &m.vote_batched,
                sizes: |m| &m.observed.vote_batch_size,
            },
        ),
        queue: Batcher::new(
            crate::sale::queue::join::QueueDecider {
                keys: state.keys.clone(),
            },
            own.clone(),
            max,
            state.config.batch_in_flight(),
            Counters {
                metrics: state.metrics.clone(),
                batches: |m| &m.queue_batches,
                requests: |m| &m.queue_batched,
                sizes: |m| &m.observed.queue_batch_size,
            },
        ),
        held: Batcher::new(
            crate::sale::held::HeldReader {
                db: state.db.clone(),
                redis: state.redis.clone(),
                keys: state.keys.clone(),
            },
            own.clone(),
            crate::sale::held::HELD_READ_MAX,
            crate::sale::held::HELD_READS_IN_FLIGHT,
            Counters {
                metrics: state.metrics.clone(),
                batches: |m| &m.held_batches,
                requests: |m| &m.held_batched,
                sizes: |m| &m.observed.held_batch_size,
            },
        ),
        // Postgres transactions: the connection is unused, `in_flight` bounds the
        // pool's connections one sale's entries hold per worker.
        entries: Batcher::new(
            crate::sale::draw::enter::EntryWriter {
                db: state.db.clone(),
            },
            own,
            max,
            crate::config::BATCH_IN_FLIGHT,
            Counters {
                metrics: state.metrics.clone(),
                batches: |m| &m.entry_batches,
                requests: |m| &m.entry_batched,
                sizes: |m| &m.observed.entry_batch_size,
            },
        ),
        redis,
    })
}
