//! The admin's routes for the days around a sale: edit, archive and unarchive,
//! delete, and the record of every change (see [`crate::sale::lifecycle`]).

use actix_web::{HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer};

use crate::audit::{self, Subject};
use crate::auth::AdminUser;
use crate::domain::{self, SaleId};
use crate::error::{AppError, ErrorBody, ErrorCode};
use crate::sale::delete;
use crate::sale::lifecycle::{self, SaleEdit};
use crate::sale::record;

use crate::state::AppState;

/// A field that may be sent as `null` (`Some(None)`), as a value, or not at all.
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// Any of a sale's fields. Before the opening every one may change; once the sale
/// has opened only `name`, `description`, `image_url` and a later `ends_at`
/// (409 `sale_started` for the rest). A field sent with its current value is no
/// change. Each is checked as in `POST /api/admin/sales`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct EditSale {
    name: Option<String>,
    description: Option<String>,
    price_cents: Option<i64>,
    /// An `https://` address or a path on this site; `null` or blank removes the
    /// picture.
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>)]
    image_url: Option<Option<String>>,
    starts_at: Option<DateTime<Utc>>,
    ends_at: Option<DateTime<Utc>>,
    requires_ticket: Option<bool>,
    #[schema(minimum = 0, maximum = 86400)]
    payment_window_s: Option<i64>,
    rebuy_after_expiry: Option<bool>,
    #[schema(minimum = 1, maximum = 100)]
    max_per_user: Option<i64>,
    /// A waiting room (see creation); with it the sale requires a ticket.
    waiting_room: Option<bool>,
    /// When the waiting room's line opens, at or before `starts_at`.
    queue_opens_at: Option<DateTime<Utc>>,
    /// Shoppers admitted a second from the opening, 1 to 100000.
    #[schema(minimum = 1, maximum = 100000)]
    admit_per_second: Option<i64>,
    /// Leading zero bits of a proof of work asked with the purchase ticket and
    /// the waiting room's join (`GET /api/sales/{id}/challenge`, then the
    /// `Proof-Of-Work` header): 0 (the default, off) to 24; only on a sale that
    /// requires a ticket or has a waiting room. Else 422 `invalid_fairness`.
    #[schema(value_type = Option<i32>, minimum = 0, maximum = 24)]
    proof_of_work: Option<serde_json::Value>,
    /// Least age of an account that may join, take a ticket or buy, in seconds
    /// before the opening (or before the request, when later): 0 (the default,
    /// off) to 31622400 (366 days). Else 422 `invalid_fairness`.
    #[schema(value_type = Option<i32>, minimum = 0, maximum = 31622400)]
    min_account_age_s: Option<serde_json::Value>,
    /// A draw sale: when it is drawn (moves `starts_at`), until entries open.
    draw_at: Option<DateTime<Utc>>,
    /// A draw sale: when entries open, before `draw_at`; until they open.
    entries_open_at: Option<DateTime<Utc>>,
    /// A draw sale: a winner's seconds to buy, 60 to 86400; until entries open.
    #[schema(minimum = 60, maximum = 86400)]
    claim_window_s: Option<i64>,
}

impl EditSale {
    fn validate(self) -> Result<SaleEdit, AppError> {
        let fairness = crate::gate::FairnessFields {
            proof_of_work: self.proof_of_work,
            min_account_age_s: self.min_account_age_s,
        }
        .parse()?;
        Ok(SaleEdit {
            proof_of_work: fairness.proof_of_work,
            min_account_age_s: fairness.min_account_age_s,
            name: self
                .name
                .map(|n| domain::parse_line("name", &n, 200))
                .transpose()?,
            description: self
                .description
                .map(|d| domain::parse_text("description", &d, 5000, true))
                .transpose()?,
            price_cents: self.price_cents.map(domain::parse_price).transpose()?,
            image_url: self
                .image_url
                .map(|u| domain::parse_image_url(u.as_deref()))
                .transpose()?,
            starts_at: self.starts_at,
            ends_at: self.ends_at,
            requires_ticket: self.requires_ticket,
            payment_window_s: self
                .payment_window_s
                .map(domain::parse_payment_window)
                .transpose()?,
            rebuy_after_expiry: self.rebuy_after_expiry,
            max_per_user: self
                .max_per_user
                .map(domain::parse_max_per_user)
                .transpose()?,
            waiting_room: self.waiting_room,
            queue_opens_at: self.queue_opens_at,
            admit_per_second: self
                .admit_per_second
                .map(|r| {
                    i32::try_from(r)
                        .ok()
                        .filter(|r| {
                            (1..=crate::sale::queue::room::MAX_ADMIT_PER_SECOND).contains(r)
                        })
                        .ok_or_else(|| {
                            AppError::new(
                                ErrorCode::InvalidWaitingRoom,
                                "admit_per_second must be 1 to 100000",
                            )
                        })
                })
                .transpose()?,
            draw_at: self.draw_at,
            entries_open_at: self.entries_open_at,
            claim_window_s: self
                .claim_window_s
                .map(|c| {
                    i32::try_from(c)
                        .ok()
                        .filter(|c| crate::sale::draw::CLAIM_WINDOW_S.contains(&i64::from(*c)))
                        .ok_or_else(|| {
                            AppError::new(
                                ErrorCode::InvalidDraw,
                                "claim_window_s must be 60 to 86400",
                            )
                        })
                })
                .transpose()?,
        })
    }
}

/// Edits a sale. Open pages and caches show the change within a second.
#[utoipa::path(patch, path = "/api/admin/sales/{id}", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), request_body = EditSale, security(("bearer" = [])), responses(
    (status = 200, description = "The sale as it is now", body = record::SaleView),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 409, description = "`sale_started`: a field fixed once the sale has opened, or a draw's entries have (or an earlier `ends_at`)", body = ErrorBody<'static>),
    (status = 422, description = "A field that fails its check (`invalid_text`, `invalid_price`, `invalid_window`, `invalid_image_url`, `invalid_payment_window`, `invalid_quantity`, `invalid_waiting_room`, `invalid_draw`, `invalid_fairness`) or `invalid_body`", body = ErrorBody<'static>),
))]
pub(super) async fn admin_edit(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
    body: crate::routes::extract::JsonObject<EditSale>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let edit = body.into_inner().validate()?;
    let view = lifecycle::edit(state.get_ref(), id, edit, admin.id).await?;
    state.gates.sales.forget(id);
    state.wake.catalog_changed();
    tracing::info!(sale = %id, admin = %admin.id, "sale edited");
    Ok(HttpResponse::Ok().json(view))
}

/// Archives a sale: off the home page and the public lists (`GET /api/sales`); its
/// page and orders stay reachable by link and in the admin (`?filter=archived`).
#[utoipa::path(post, path = "/api/admin/sales/{id}/archive", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The sale, with `archived_at`", body = record::SaleView),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
))]
pub(super) async fn admin_archive(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let view = lifecycle::set_archived(state.get_ref(), id, true, admin.id).await?;
    tracing::info!(sale = %id, admin = %admin.id, "sale archived");
    Ok(HttpResponse::Ok().json(view))
}

/// Brings an archived sale back onto the public lists.
#[utoipa::path(post, path = "/api/admin/sales/{id}/unarchive", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The sale, `archived_at` null", body = record::SaleView),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
))]
pub(super) async fn admin_unarchive(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let view = lifecycle::set_archived(state.get_ref(), id, false, admin.id).await?;
    tracing::info!(sale = %id, admin = %admin.id, "sale unarchived");
    Ok(HttpResponse::Ok().json(view))
}

/// Deletes a sale that never had an order, from Postgres and Redis.
#[utoipa::path(delete, path = "/api/admin/sales/{id}", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 204, description = "Deleted"),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 409, description = "`has_orders`: the sale had an order (archive it instead)", body = ErrorBody<'static>),
))]
pub(super) async fn admin_delete(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    delete::delete(state.get_ref(), id, admin.id).await?;
    tracing::info!(sale = %id, admin = %admin.id, "sale deleted");
    Ok(HttpResponse::NoContent().finish())
}

/// How many changes a history answers: the newest first.
pub(crate) const HISTORY_LIMIT: i64 = 500;

/// Every admin change of a sale (create, edit, stock, open, close, archive,
/// unarchive, delete, and cancels and refunds of its orders), newest first, at most
/// 500: who, when, what, and the fields before and after.
#[utoipa::path(get, path = "/api/admin/sales/{id}/history", tag = "admin", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The changes, newest first (also those of a deleted sale)", body = [audit::Entry]),
))]
pub(super) async fn admin_history(
    state: web::Data<AppState>,
    _: AdminUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let entries = audit::history(&state.db, Subject::Sale(id), HISTORY_LIMIT).await?;
    Ok(HttpResponse::Ok().json(entries))
}
