//! What needs the application state to observe: the middleware that times every
//! request, the scrape-time reads of settlement lag and stock, and the `/metrics`
//! handlers. The histograms and counters themselves live in [`crate::metrics`], a
//! leaf every capability may use.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, HttpResponse, web};

use crate::error::ErrorCode;
use crate::metrics::RouteLabel;
use crate::state::AppState;

/// The middleware (`actix_web::middleware::from_fn`) that times every request.
/// Requests no route matched count under the route `unmatched`.
pub async fn measure(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = std::time::Instant::now();
    let state = req.app_data::<web::Data<AppState>>().cloned();
    let res = next.call(req).await?;
    if let Some(state) = state {
        let request = res.request();
        // The label the route was registered with (an API route's resource, or the
        // sold-out answer given before routing); else the path matched again.
        let label = request
            .app_data::<RouteLabel>()
            .copied()
            .or_else(|| request.extensions().get::<RouteLabel>().copied());
        let matched;
        let route = match label {
            Some(RouteLabel(route)) => route,
            None => {
                matched = request.match_pattern();
                matched.as_deref().unwrap_or("unmatched")
            }
        };
        state
            .metrics
            .observed
            .request(route, res.status().as_u16(), started.elapsed());
    }
    Ok(res)
}

/// Reads the settlement lag of every open sale and poll (and those closed in the
/// last ten minutes), and each live sale's units left, into the gauges; called at
/// each scrape. Best effort: a stream Redis cannot read is left out of this scrape.
/// Which sales and polls those are comes from Postgres, within [`IDS_TIMEOUT`];
/// when Postgres does not answer, the last scrape's list is read again, so the
/// backlog a Postgres outage builds stays in sight (its alert needs it).
pub async fn read_settlement_lag(state: &AppState) {
    let observed = &state.metrics.observed;
    let mut redis = state.redis.clone();
    let ids = async {
        let sales = crate::sale::numbers::watched_ids(&state.db).await?;
        let polls = crate::vote::store::watched_poll_ids(&state.db).await?;
        Ok::<_, sqlx::Error>((sales, polls))
    };
    let (sale_ids, poll_ids) = match tokio::time::timeout(IDS_TIMEOUT, ids).await {
        Ok(Ok(ids)) => {
            *last_watched() = ids.clone();
            ids
        }
        _ => last_watched().clone(),
    };
    let sales = crate::sale::numbers::watched(&mut redis, &state.keys, &sale_ids).await;
    for sale in sales {
        if let Some(left) = sale.stock_left {
            observed.stock_left(sale.id, sale.rehearsal, left);
        }
        if let Some((entries, pending)) = sale.backlog {
            observed.settlement_lag("sale", sale.id, Some(sale.rehearsal), entries, pending);
        }
    }
    let rooms = tokio::time::timeout(
        IDS_TIMEOUT,
        crate::sale::queue::admit::active_sales(&state.db),
    );
    if let Ok(Ok(rooms)) = rooms.await {
        for sale in rooms {
            if let Ok(n) = crate::sale::queue::numbers::numbers(&mut redis, &state.keys, sale).await
            {
                observed.queue(sale.get(), n.waiting, n.open);
            }
        }
    }
    let polls = crate::vote::store::watched_backlogs(&mut redis, &state.keys, &poll_ids).await;
    for (id, (entries, pending)) in polls {
        observed.settlement_lag("poll", id, None, entries, pending);
    }
}

/// How long a scrape waits for Postgres's list of the sales and polls to watch.
const IDS_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);
/// How long a scrape reads the backlogs, in all: a scrape answers within about
/// this plus [`REDIS_PROBE_TIMEOUT`], inside Prometheus's 5 s scrape timeout,
/// whatever Redis and Postgres do (the gauges not read keep their last values).
const LAG_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The sales `(id, rehearsal, live)` and polls the last scrape watched.
type WatchedIds = (Vec<(i64, bool, bool)>, Vec<i64>);

fn last_watched() -> std::sync::MutexGuard<'static, WatchedIds> {
    static LAST: std::sync::Mutex<WatchedIds> = std::sync::Mutex::new((Vec::new(), Vec::new()));
    LAST.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How often [`probe_postgres`] asks.
const PROBE_EVERY: std::time::Duration = std::time::Duration::from_secs(2);
/// How long it waits for an answer.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Takes a connection from the requests' pool every [`PROBE_EVERY`] (sqlx pings a
/// connection when it is taken from the pool, and when it goes back: two round
/// trips, where a `SELECT 1` was three) and keeps whether it came in time in
/// `state.postgres`, for `/readyz` (which then answers at
/// once, whatever Postgres does) and for `/metrics` (`stampede_postgres_up`). A
/// pool whose connections are all stuck counts as down: the routes that need
/// Postgres cannot be served either.
pub async fn probe_postgres(
    state: web::Data<AppState>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    while !*shutdown.borrow() {
        let up = matches!(
            tokio::time::timeout(PROBE_TIMEOUT, state.db.acquire()).await,
            Ok(Ok(_))
        );
        if up != state.postgres.is_up() {
            if up {
                tracing::info!("Postgres answers again");
            } else {
                tracing::warn!(
                    "Postgres does not answer within a second: the routes that need it answer 503; purchases and votes go on"
                );
            }
        }
        state.postgres.set(up);
        tokio::select! {
            _ = tokio::time::sleep(PROBE_EVERY) => {}
            _ = shutdown.changed() => break,
        }
    }
}

/// `GET /metrics` on the main listener: only with the configured bearer token
/// (`metrics_token`). Without a configured token the route does not exist there
/// (404); the metrics listener (loopback by default) serves [`endpoint`] freely.
pub async fn guarded_endpoint(
    state: web::Data<AppState>,
    req: actix_web::HttpRequest,
) -> Result<HttpResponse, crate::error::AppError> {
    use crate::error::AppError;
    let Some(expected) = state.config.metrics_token.as_deref() else {
        return Err(AppError::not_found(
            "/metrics is served on the metrics listener (metrics_listen)",
        ));
    };
    let given = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    use subtle::ConstantTimeEq;
    let ok =
        given.len() == expected.len() && bool::from(given.as_bytes().ct_eq(expected.as_bytes()));
    if !ok {
        return Err(AppError::new(
            ErrorCode::Unauthorized,
            "/metrics needs the metrics bearer token",
        )
        .with_header(actix_web::http::header::WWW_AUTHENTICATE, "Bearer"));
    }
    Ok(endpoint(state).await)
}

/// How long a scrape waits for Redis's `PING` (`stampede_redis_up`).
const REDIS_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

pub async fn endpoint(state: web::Data<AppState>) -> HttpResponse {
    // Redis first, bounded: a Redis that hangs still lets the scrape answer, with
    // `stampede_redis_up` 0 (reading the backlogs first, a command at a time
    // with the response timeout each, outlasted the scrape's timeout, and the
    // alert on it never fired).
    let redis_up = tokio::time::timeout(REDIS_PROBE_TIMEOUT, state.redis.clone().ping_all())
        .await
        .is_ok_and(|answer| answer.is_ok());
    if redis_up {
        let _ = tokio::time::timeout(LAG_TIMEOUT, read_settlement_lag(&state)).await;
    }
    let cache = state.cache.stats();
    for (name, help, value) in [
        (
            "stampede_cache_hits_total",
            "Cached views served from Redis.",
            cache.hits,
        ),
        (
            "stampede_cache_loads_total",
            "Cached views rebuilt from Postgres (one query each).",
            cache.loads,
        ),
        (
            "stampede_cache_shared_total",
            "Misses served by another caller's rebuild in this process.",
            cache.shared,
        ),
        (
            "stampede_cache_waited_total",
            "Misses served by another instance's rebuild.",
            cache.waited,
        ),
        (
            "stampede_cache_fallbacks_total",
            "Misses that gave up waiting and loaded without storing.",
            cache.fallbacks,
        ),
        (
            "stampede_lock_acquired_total",
            "Lock attempts that got the lock (rebuilds, cache fills, settlement reclaim, the settling lease).",
            crate::lock::STATS.acquired.get(),
        ),
        (
            "stampede_lock_contended_total",
            "Lock attempts that found the lock held by another holder (a standby settlement worker's, once a second).",
            crate::lock::STATS.contended.get(),
        ),
        (
            "stampede_lock_lost_total",
            "Held locks a watchdog found gone or could not extend in time.",
            crate::lock::STATS.lost.get(),
        ),
    ] {
        state.metrics.observed.counter_total(name, help, value);
    }
    state.metrics.observed.gauge(
        "stampede_settle_leading",
        "1 while this process's settlement worker holds the settling lease and reads the streams (settle.exclusive), else 0.",
        f64::from(u8::from(
            state
                .metrics
                .settle_leading
                .load(std::sync::atomic::Ordering::Relaxed),
        )),
    );
    state.metrics.observed.gauge(
        "stampede_postgres_up",
        "1 when Postgres answered the last probe (every 2 s) within a second, else 0.",
        f64::from(u8::from(state.postgres.is_up())),
    );
    // Asked at the scrape (PING on every primary, as `/readyz` does), above.
    state.metrics.observed.gauge(
        "stampede_redis_up",
        "1 when every Redis primary answered PING within a second at this scrape, else 0.",
        f64::from(u8::from(redis_up)),
    );
    let text = state.metrics.render();
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(text)
}
