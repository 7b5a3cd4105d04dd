//! Every vote of a poll as CSV, for its admin.

use actix_web::{HttpResponse, web};

use crate::auth::AdminUser;
use crate::domain::PollId;
use crate::error::{AppError, ErrorBody};
use crate::state::AppState;
use crate::vote::{export, store};

/// Every settled vote of the poll as CSV, streamed: a header row, then one row per
/// accepted vote request, by `voted_at`, voter and seq:
/// `receipt,voter_id,voter_name,ballot,option_id,option_label,choices,choice_labels,
/// count,voted_at,settled_at,replaced` (`choices` and `choice_labels` every option
/// of the ballot in the order sent, joined with `;`; `count` the votes of the row,
/// more than 1 only in a budget poll; `replaced` whether a later ballot of the same
/// voter replaced it, never in a budget poll).
#[utoipa::path(get, path = "/api/admin/polls/{id}/votes.csv", tag = "admin", params(("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "`text/csv`, as an attachment", content_type = "text/csv", body = String, headers(
        ("Content-Disposition" = String, description = "`attachment; filename=\"poll-<id>-votes.csv\"`"))),
    (status = 404, description = "`not_found`: no such poll", body = ErrorBody<'static>),
))]
pub(super) async fn admin_votes_csv(
    state: web::Data<AppState>,
    _: AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = PollId::parse(&path)?;
    let record = store::fetch_record(&state.db, id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no poll with id {id}")))?;
    let mac = state.tokens.mac().clone();
    let body = export::votes_csv(state.db.clone(), record, mac)?;
    Ok(crate::csv::attachment(
        &format!("poll-{id}-votes.csv"),
        body,
    ))
}
