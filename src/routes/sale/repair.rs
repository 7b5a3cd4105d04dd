//! Upkeep of sales by an admin: Redis against Postgres for one sale, its repair,
//! and removing the rehearsals.

use actix_web::{HttpResponse, web};

use crate::auth::AdminUser;
use crate::domain::SaleId;
use crate::error::{AppError, ErrorBody};
use crate::sale::{self, reconcile, rehearsal};
use crate::state::AppState;

/// Redis against Postgres for one sale: who bought, what is pending, what settled.
#[utoipa::path(get, path = "/api/admin/sales/{id}/reconcile", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The report", body = reconcile::Reconciliation),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
))]
pub(super) async fn admin_reconcile(
    state: web::Data<AppState>,
    _: AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let report = sale::admin::reconciliation(state.get_ref(), id).await?;
    Ok(HttpResponse::Ok().json(report))
}

/// Makes Redis agree with Postgres for one sale: the rebuild of [`crate::recover`].
#[utoipa::path(post, path = "/api/admin/sales/{id}/reconcile", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "Rebuilt from Postgres: the new report", body = reconcile::Reconciliation),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
))]
pub(super) async fn admin_repair(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let report = sale::admin::repair(state.get_ref(), id).await?;
    tracing::warn!(sale = %id, admin = %admin.id, consistent = report.consistent, "sale repaired from Postgres");
    Ok(HttpResponse::Ok().json(report))
}

/// Removes every rehearsal sale (`stampede load`'s) with its orders, payments,
/// stock changes, admin changes and Redis keys, and the rehearsal users nothing
/// else names; never a real sale or user. The same as `stampede load --cleanup`.
#[utoipa::path(post, path = "/api/admin/rehearsals/cleanup", tag = "admin", security(("bearer" = [])), responses(
    (status = 200, description = "What was removed", body = rehearsal::Cleaned),
))]
pub(super) async fn admin_cleanup_rehearsals(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
) -> Result<HttpResponse, AppError> {
    let cleaned = rehearsal::cleanup(
        &state.db,
        &mut state.redis.clone(),
        &state.keys,
        state.config.token_ttl,
    )
    .await?;
    tracing::warn!(admin = %admin.id, sales = cleaned.sales, orders = cleaned.orders, users = cleaned.users, "rehearsals cleaned up");
    Ok(HttpResponse::Ok().json(cleaned))
}
