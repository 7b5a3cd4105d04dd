//! The health checks: `/healthz` (the process runs) and `/readyz` (both stores
//! answer).

use std::time::Duration;

use actix_web::{HttpResponse, web};

use crate::state::AppState;

super::routes! {
    pub fn configure, pub const HEALTH_ROUTES; mounted "";
    get "/healthz" => healthz,
    get "/readyz" => readyz,
}

#[derive(utoipa::OpenApi)]
#[openapi(paths(healthz, readyz))]
pub(crate) struct Api;

#[derive(serde::Serialize, utoipa::ToSchema)]
struct Health {
    /// Always `ok`.
    status: &'static str,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
struct Readiness {
    /// `ready` or `unavailable`.
    status: &'static str,
    /// `ok` or `down`.
    redis: &'static str,
    /// `ok` or `down`.
    postgres: &'static str,
}

/// Liveness: the process runs.
#[utoipa::path(get, path = "/healthz", tag = "meta",
    responses((status = 200, description = "The process runs", body = Health)))]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health { status: "ok" })
}

/// Ready when both stores answer within a second.
#[utoipa::path(get, path = "/readyz", tag = "meta", responses(
    (status = 200, description = "Redis and Postgres answer", body = Readiness),
    (status = 503, description = "Redis or Postgres does not answer (which one is said)", body = Readiness),
))]
async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let timeout = Duration::from_secs(1);
    let mut redis = state.redis.clone();
    // On a cluster: every primary answers.
    let redis_ok = matches!(
        tokio::time::timeout(timeout, redis.ping_all()).await,
        Ok(Ok(()))
    );
    let db_ok = matches!(
        tokio::time::timeout(timeout, sqlx::query("SELECT 1").execute(&state.db)).await,
        Ok(Ok(_))
    );
    let body = Readiness {
        status: if redis_ok && db_ok {
            "ready"
        } else {
            "unavailable"
        },
        redis: if redis_ok { "ok" } else { "down" },
        postgres: if db_ok { "ok" } else { "down" },
    };
    if redis_ok && db_ok {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}
