//! The health checks: `/healthz` (the process runs), `/readyz` (this instance
//! can decide purchases and votes: Redis answers; Postgres's state is in the
//! body) and `/readyz/postgres` (the routes that need Postgres can be served too).

use std::time::Duration;

use actix_web::{HttpResponse, web};

use crate::state::AppState;

super::routes! {
    pub fn configure, pub const HEALTH_ROUTES; mounted "";
    get "/healthz" => healthz,
    get "/readyz" => readyz,
    get "/readyz/postgres" => readyz_postgres,
}

#[derive(utoipa::OpenApi)]
#[openapi(paths(healthz, readyz, readyz_postgres))]
pub(crate) struct Api;

#[derive(serde::Serialize, utoipa::ToSchema)]
struct Health {
    /// Always `ok`.
    status: &'static str,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
struct Readiness {
    /// `ready`, `unavailable`, or `draining` (stopping: SIGTERM, for `drain_ms`).
    status: &'static str,
    /// `ok` or `down`: every Redis primary answered a `PING` within a second.
    redis: &'static str,
    /// `ok` or `down`: Postgres answered the last probe (every second) within a
    /// second.
    postgres: &'static str,
}

/// Liveness: the process runs.
#[utoipa::path(get, path = "/healthz", tag = "meta",
    responses((status = 200, description = "The process runs", body = Health)))]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health { status: "ok" })
}

/// Ready to decide purchases and votes: Redis answers. Deciding needs Redis
/// alone (settlement waits for Postgres and catches up), so a slow or down
/// Postgres leaves this 200 and says so in `postgres`; a load balancer that
/// routes the buy path by it keeps deciding servers in rotation.
#[utoipa::path(get, path = "/readyz", tag = "meta", responses(
    (status = 200, description = "Redis answers (Postgres's state in the body)", body = Readiness),
    (status = 503, description = "Redis does not answer, or the server is stopping (`status` `draining`)", body = Readiness),
))]
async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let redis_ok = redis_answers(&state).await;
    answer(&state, redis_ok, state.postgres.is_up(), redis_ok)
}

/// Ready for every route, the pages and reads that need Postgres too: Redis
/// answers and Postgres answered its last probe.
#[utoipa::path(get, path = "/readyz/postgres", tag = "meta", responses(
    (status = 200, description = "Redis and Postgres answer", body = Readiness),
    (status = 503, description = "Redis or Postgres does not answer (which one is said), or the server is stopping (`status` `draining`)", body = Readiness),
))]
async fn readyz_postgres(state: web::Data<AppState>) -> HttpResponse {
    let redis_ok = redis_answers(&state).await;
    let db_ok = state.postgres.is_up();
    answer(&state, redis_ok, db_ok, redis_ok && db_ok)
}

/// Every primary answers a `PING` within a second.
async fn redis_answers(state: &AppState) -> bool {
    let mut redis = state.redis.clone();
    let answered = matches!(
        tokio::time::timeout(Duration::from_secs(1), redis.ping_all()).await,
        Ok(Ok(()))
    );
    if !answered {
        crate::redis_conn::watch::trouble();
    }
    answered
}

/// A stopping server (SIGTERM, see `Application::run_until_signal`) is not ready
/// whatever its stores say: the balancer takes it out while it still answers.
fn answer(state: &AppState, redis_ok: bool, db_ok: bool, ready: bool) -> HttpResponse {
    let word = |ok: bool| if ok { "ok" } else { "down" };
    let draining = state.draining.load(std::sync::atomic::Ordering::Relaxed);
    let ready = ready && !draining;
    let body = Readiness {
        status: match (draining, ready) {
            (true, _) => "draining",
            (false, true) => "ready",
            (false, false) => "unavailable",
        },
        redis: word(redis_ok),
        postgres: word(db_ok),
    };
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable()
            .insert_header((
                actix_web::http::header::RETRY_AFTER,
                crate::error::RETRY_AFTER_OUTAGE_SECS.to_string(),
            ))
            .json(body)
    }
}
