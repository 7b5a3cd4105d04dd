//! What a sale sold, for its admin: its orders with their buyers and totals, and
//! every order as CSV.

use actix_web::{HttpResponse, web};
use serde::{Deserialize, Serialize};

use crate::auth::AdminUser;
use crate::domain::SaleId;
use crate::error::{AppError, ErrorBody, ErrorCode};
use crate::sale::{self, export, orders};
use crate::state::AppState;

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct Page {
    /// At most this many orders (1 to 10000, default 1000).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<i64>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct SaleOrders {
    sale_id: i64,
    /// Orders in Postgres, oldest first.
    confirmed: Vec<orders::OrderRow>,
    /// Accepted orders not yet in Postgres.
    pending_count: i64,
    /// Units sold and returned, revenue paid, awaiting and refunded, of all the
    /// sale's settled orders (not only those listed).
    totals: export::SaleTotals,
}

/// A sale's confirmed orders and how many are still pending.
#[utoipa::path(get, path = "/api/admin/sales/{id}/orders", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1), Page), security(("bearer" = [])), responses(
    (status = 200, description = "The orders", body = SaleOrders),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
))]
pub(super) async fn admin_orders(
    state: web::Data<AppState>,
    _: AdminUser,
    path: web::Path<String>,
    page: web::Query<Page>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let limit = page.limit.unwrap_or(1000);
    if !(1..=10_000).contains(&limit) {
        return Err(AppError::new(
            ErrorCode::InvalidLimit,
            "limit must be 1 to 10000",
        ));
    }
    let (orders, pending) = sale::admin::orders(state.get_ref(), id, limit).await?;
    let record = sale::admin::record(&state.db, id).await?;
    let totals = export::totals(&state.db, id, record.price_cents).await?;
    Ok(HttpResponse::Ok().json(SaleOrders {
        sale_id: id.get(),
        confirmed: orders,
        pending_count: pending,
        totals,
    }))
}

/// Every settled order of the sale as CSV, oldest first, streamed: a header row,
/// then `order_id,buyer,user_id,units,status,accepted_at,settled_at,paid_at,expired_at,
/// cancelled_at,refunded_at,amount_paid_cents,amount_awaiting_cents,amount_refunded_cents`
/// (times empty when they did not happen; the order's worth, the price times the
/// units, in the one money column its status puts it in, so each column sums to
/// the matching `totals` of `GET /api/admin/sales/{id}/orders`).
#[utoipa::path(get, path = "/api/admin/sales/{id}/orders.csv", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "`text/csv`, as an attachment", content_type = "text/csv", body = String, headers(
        ("Content-Disposition" = String, description = "`attachment; filename=\"sale-<id>-orders.csv\"`"))),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
))]
pub(super) async fn admin_orders_csv(
    state: web::Data<AppState>,
    _: AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let record = sale::admin::record(&state.db, id).await?;
    let body = export::orders_csv(state.db.clone(), id, record.price_cents);
    Ok(crate::csv::attachment(
        &format!("sale-{id}-orders.csv"),
        body,
    ))
}
