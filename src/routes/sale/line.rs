//! An admin's controls of a sale's waiting-room line: pause, resume, close to new
//! joins, reopen (see [`crate::sale::queue::line`]).

use actix_web::{HttpResponse, web};
use serde::Deserialize;

use crate::auth::AdminUser;
use crate::domain::SaleId;
use crate::error::{AppError, ErrorBody};
use crate::sale::queue::line::{self, LineAction, LineState};
use crate::state::AppState;

/// What to do to the line.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LineControl {
    /// `pause` (nobody is let in until `resume`), `resume`, `close` (new joins are
    /// refused with 409 `line_closed`; those in line keep their places), `reopen`.
    action: LineAction,
}

/// Pauses or resumes a waiting room's admissions, or closes or reopens its line to
/// new joins. Holds on every server and across restarts; recorded in the sale's
/// history. The same action twice changes nothing the second time.
#[utoipa::path(post, path = "/api/admin/sales/{id}/line", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), request_body = LineControl, security(("bearer" = [])), responses(
    (status = 200, description = "The line as it is now", body = LineState),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 409, description = "`no_waiting_room`: the sale has no line", body = ErrorBody<'static>),
    (status = 422, description = "`invalid_body`: no `action`, or not one of `pause`, `resume`, `close`, `reopen`", body = ErrorBody<'static>),
))]
pub(super) async fn admin_line(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
    body: crate::routes::extract::JsonObject<LineControl>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let action = body.into_inner().action;
    let answer = line::control(state.get_ref(), id, action, admin.id).await?;
    tracing::info!(sale = %id, admin = %admin.id, ?action, "waiting room line changed");
    Ok(HttpResponse::Ok().json(answer))
}
