//! The admin's sale-day console: the live and upcoming sales with their numbers,
//! revenue and line (`sale::console`), which the top of `/admin` shows and polls.

use actix_web::{HttpResponse, web};

use crate::auth::AdminUser;
use crate::error::AppError;
use crate::sale::console::{self, Console};
use crate::state::AppState;

/// The live and the upcoming sales (at most 20 of each), each as
/// `GET /api/admin/sales` shows it plus `revenue_paid_cents`,
/// `revenue_awaiting_cents` and, with a waiting room, `line_state`.
#[utoipa::path(get, path = "/api/admin/console", tag = "admin", security(("bearer" = [])), responses(
    (status = 200, description = "The console", body = Console),
))]
pub(super) async fn admin_console(
    state: web::Data<AppState>,
    _: AdminUser,
) -> Result<HttpResponse, AppError> {
    Ok(HttpResponse::Ok().json(console::console(state.get_ref()).await?))
}
