//! The admin's live numbers of a draw sale (the sale's admin page polls them):
//! entries, whether and when it was drawn, and its wins by how they stand.

use actix_web::http::header;
use actix_web::{HttpResponse, web};

use super::draw::draw_row;
use crate::auth::AdminUser;
use crate::domain::SaleId;
use crate::error::{AppError, ErrorBody};
use crate::sale::draw::numbers::{self, DrawNumbers};
use crate::state::AppState;

/// The draw's numbers, for the sale's admin page.
#[utoipa::path(get, path = "/api/admin/sales/{id}/draw", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The draw's numbers now", body = DrawNumbers),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 409, description = "`not_a_draw`", body = ErrorBody<'static>),
))]
pub(super) async fn admin_draw(
    state: web::Data<AppState>,
    _admin: AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let sale = SaleId::parse(&path)?;
    draw_row(&state, sale).await?;
    let found = numbers::numbers(&state.db, sale).await?;
    let numbers = found.ok_or_else(|| AppError::not_found(format!("no draw for sale {sale}")))?;
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(numbers))
}
