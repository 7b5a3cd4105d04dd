//! The admin's controls of a sale, before or while it runs (the admin pages' Top
//! up, Open now and Close): its stock set or topped up, opened now, closed early.

use actix_web::{HttpResponse, web};
use serde::{Deserialize, Serialize};

use crate::auth::AdminUser;
use crate::domain::{self, SaleId};
use crate::error::{AppError, ErrorBody, ErrorCode};
use crate::sale;
use crate::sale::cached::load_view;
use crate::sale::record;
use crate::sale::stock::{ChangeResult, StockChange};
use crate::state::AppState;

/// Exactly one of `set` and `add`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct StockBody {
    /// Units left become exactly this.
    set: Option<i64>,
    /// Units left grow by this.
    add: Option<i64>,
}

/// Sets or tops up a sale's stock, before or during the sale.
#[utoipa::path(post, path = "/api/admin/sales/{id}/stock", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), request_body = StockBody, security(("bearer" = [])), responses(
    (status = 200, description = "Applied: the sale", body = record::SaleView),
    (status = 202, description = "Recorded; applied once the sale's Redis state is rebuilt. Do not send it again", body = StockPending),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 422, description = "`invalid_stock` (not exactly one of set/add, or out of range), `stock_too_large`", body = ErrorBody<'static>),
))]
pub(super) async fn admin_stock(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
    body: crate::routes::extract::JsonObject<StockBody>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let change = match (body.set, body.add) {
        (Some(n), None) => StockChange::Set(domain::parse_stock("set", n)?),
        (None, Some(n)) => StockChange::Add(domain::parse_stock("add", n)?),
        _ => {
            return Err(AppError::new(
                ErrorCode::InvalidStock,
                "send exactly one of {\"set\": n} or {\"add\": n}",
            ));
        }
    };
    let (change_id, result) =
        sale::admin::change_stock(state.get_ref(), id, change, admin.id).await?;
    match result {
        ChangeResult::Applied { delta, left, sold } => {
            tracing::info!(sale = %id, admin = %admin.id, change = change_id, delta, left, sold, "stock changed");
            Ok(HttpResponse::Ok().json(load_view(&state, id).await?))
        }
        ChangeResult::Refused { left, sold } => {
            // `sold`: the units its buyers hold, with the returned ones whose buyers
            // may not buy again (offered a second time, so counted twice).
            let most_left = (domain::MAX_STOCK - sold).max(0);
            Err(AppError::new(
                ErrorCode::StockTooLarge,
                format!(
                    "a sale may offer at most {} units in all, its buyers' {sold} included (returned units whose buyers may not buy again count too): this one may have at most {most_left} left ({} more than the {left} it has)",
                    domain::MAX_STOCK,
                    (most_left - left).max(0)
                ),
            ))
        }
        ChangeResult::Deferred => Ok(HttpResponse::Accepted().json(StockPending {
            status: "pending",
            change_id,
            sale_id: id.get(),
            message: "the change is recorded and will be applied as soon as Redis holds the \
                      sale again; do not send it again",
        })),
    }
}

#[derive(Serialize, utoipa::ToSchema)]
struct StockPending {
    /// Always `pending`.
    status: &'static str,
    change_id: i64,
    sale_id: i64,
    message: &'static str,
}

/// Opens a sale now (moves `starts_at` back to now, clears an early close).
#[utoipa::path(post, path = "/api/admin/sales/{id}/open", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The sale", body = record::SaleView),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 409, description = "`past_end`: its end time has passed", body = ErrorBody<'static>),
))]
pub(super) async fn admin_open(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    sale::admin::open(state.get_ref(), id, admin.id).await?;
    state.gates.sales.forget(id);
    state.wake.catalog_changed();
    tracing::info!(sale = %id, admin = %admin.id, "sale opened");
    Ok(HttpResponse::Ok().json(load_view(&state, id).await?))
}

/// Closes a sale early.
#[utoipa::path(post, path = "/api/admin/sales/{id}/close", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The sale", body = record::SaleView),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
))]
pub(super) async fn admin_close(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    sale::admin::close(state.get_ref(), id, admin.id).await?;
    state.wake.catalog_changed();
    tracing::info!(sale = %id, admin = %admin.id, "sale closed");
    Ok(HttpResponse::Ok().json(load_view(&state, id).await?))
}
