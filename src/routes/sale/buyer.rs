//! Public reads of sales (the list, one sale, its live events) and the caller's
//! orders.

use actix_web::{HttpRequest, HttpResponse, web};

use crate::auth::AuthUser;
use crate::domain::SaleId;
use crate::error::{AppError, ErrorBody};
use crate::live::Topic;
use crate::routes::auth::optional_user;
use crate::routes::{PageQuery, paged_json};
use crate::sale::cached::{find_view, load_page, load_public_view};
use crate::sale::list::SaleCursor;
use crate::sale::orders;
use crate::sale::record;
use crate::state::AppState;

/// A page of sales, with live stock, in the list order: open sales (live or sold
/// out) first, then upcoming ones (soonest opening first), then ended and closed
/// ones; latest start first within a group except upcoming; the id breaks ties.
/// The order is taken at the first page's moment for the whole walk.
#[utoipa::path(get, path = "/api/sales", tag = "sales", params(PageQuery), responses(
    (status = 200, description = "A page of sales with live `stock_left`, `sold` and `status`; the next page's address in `Link` and its cursor in `X-Next-Cursor`, both absent on the last page", body = [record::SaleView], headers(
        ("Link" = String, description = "`</api/sales?limit=50&cursor=...>; rel=\"next\"`: the next page"),
        ("X-Next-Cursor" = String, description = "The `cursor` of the next page"))),
    (status = 400, description = "`invalid_limit` (not 1 to 200) or `invalid_query` (a cursor this server did not issue for this list)", body = ErrorBody<'static>),
))]
pub(super) async fn list(
    req: HttpRequest,
    state: web::Data<AppState>,
    query: web::Query<PageQuery>,
) -> Result<HttpResponse, AppError> {
    let (limit, after) = query.parse(SaleCursor::parse)?;
    let page = load_page(&state, after.as_ref(), limit).await?;
    Ok(paged_json(&req, limit, page))
}

/// One sale, with live stock. A rehearsal is 404 except to an admin.
#[utoipa::path(get, path = "/api/sales/{id}", tag = "sales", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), responses(
    (status = 200, description = "The sale", body = record::SaleView),
    (status = 404, description = "`not_found`: no such sale (or a rehearsal, to anyone but an admin)", body = ErrorBody<'static>),
))]
pub(super) async fn show(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let admin = optional_user(&req)?.is_some_and(|u| u.admin);
    Ok(HttpResponse::Ok().json(load_public_view(&state, id, admin).await?))
}

/// The sale's live view as server-sent events: the JSON of `GET /api/sales/{id}`
/// at once, then again whenever stock or status change (read once a second per
/// sale in each process, however many pages watch it: see [`crate::live`]).
#[utoipa::path(get, path = "/api/sales/{id}/events", tag = "sales", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), responses(
    (status = 200, description = "`text/event-stream`: each `data:` line a sale, as `GET /api/sales/{id}` answers", content_type = "text/event-stream", body = crate::live::LiveEvent),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 429, description = "`too_many_streams`: this client address holds as many streams as it may", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds before trying again"))),
    (status = 503, description = "The sale cannot be read now", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds before trying again"))),
))]
pub(super) async fn events(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = SaleId::parse(&path)?;
    let reader = state.clone();
    let load = move || {
        let state = reader.clone();
        async move {
            match find_view(&state, id).await? {
                Some(view) => Ok(Some(crate::live::json(&view)?)),
                None => Ok(None),
            }
        }
    };
    let client = state.limiter.client_ip(&req);
    state
        .live
        .stream(client, Topic::Sale(id), "sale", load)
        .await
}

/// The caller's confirmed orders (at most 500, newest first).
#[utoipa::path(get, path = "/api/me/orders", tag = "sales", security(("bearer" = [])), responses(
    (status = 200, description = "Confirmed orders", body = [orders::MyOrder]),
))]
pub(super) async fn my_orders(
    state: web::Data<AppState>,
    user: AuthUser,
) -> Result<HttpResponse, AppError> {
    Ok(HttpResponse::Ok()
        .insert_header((actix_web::http::header::CACHE_CONTROL, "private, no-store"))
        .json(orders::of_user(&state.db, user.id).await?))
}
