//! HTTP routes of sales, one file per concern: public reads (`buyer.rs`), the
//! purchase and its ticket (`purchase.rs`), an order's status and payment
//! (`orders.rs`), the admin's set-up (`admin.rs`), edit, archive, delete and
//! history (`lifecycle.rs`). This file holds the route table,
//! the OpenAPI group, the sold-out answer given before routing and the refusals the
//! purchase and the ticket share.

use actix_web::http::header;
use actix_web::{HttpResponse, web};

use crate::domain::SaleId;
use crate::error::{AppError, ErrorCode};
use crate::metrics::Metrics;
use crate::state::AppState;

mod admin;
mod buyer;
mod lifecycle;
mod orders;
mod purchase;
mod queue;

// Routes under `/api` (see `startup`): the purchase first, so the hot path matches
// the first pattern the router tries.
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    purchase::purchase,
    purchase::ticket,
    queue::join,
    queue::me,
    buyer::list,
    buyer::show,
    buyer::events,
    orders::order_status,
    orders::pay,
    orders::cancel,
    buyer::my_orders,
    admin::admin_create,
    admin::admin_list,
    admin::admin_stock,
    admin::admin_open,
    admin::admin_close,
    admin::admin_orders,
    admin::admin_orders_csv,
    admin::admin_reconcile,
    admin::admin_repair,
    lifecycle::admin_edit,
    lifecycle::admin_archive,
    lifecycle::admin_unarchive,
    lifecycle::admin_delete,
    lifecycle::admin_history,
    orders::admin_cancel,
    admin::admin_cleanup_rehearsals
))]
pub(crate) struct Api;

super::routes! {
    pub fn configure, pub const ROUTES; mounted "/api";
    post "/sales/{id}/purchase" => purchase::purchase,
    post "/sales/{id}/ticket" => purchase::ticket,
    post "/sales/{id}/queue" => queue::join,
    get "/sales/{id}/queue/me" => queue::me,
    get "/sales" => buyer::list,
    get "/sales/{id}" => buyer::show,
    get "/sales/{id}/events" => buyer::events,
    get "/orders/{id}" => orders::order_status,
    post "/orders/{id}/pay" => orders::pay,
    post "/orders/{id}/cancel" => orders::cancel,
    get "/me/orders" => buyer::my_orders,
    post "/admin/sales" => admin::admin_create,
    get "/admin/sales" => admin::admin_list,
    post "/admin/sales/{id}/stock" => admin::admin_stock,
    post "/admin/sales/{id}/open" => admin::admin_open,
    post "/admin/sales/{id}/close" => admin::admin_close,
    get "/admin/sales/{id}/orders" => admin::admin_orders,
    get "/admin/sales/{id}/orders.csv" => admin::admin_orders_csv,
    get "/admin/sales/{id}/reconcile" => admin::admin_reconcile,
    post "/admin/sales/{id}/reconcile" => admin::admin_repair,
    patch "/admin/sales/{id}" => lifecycle::admin_edit,
    delete "/admin/sales/{id}" => lifecycle::admin_delete,
    post "/admin/sales/{id}/archive" => lifecycle::admin_archive,
    post "/admin/sales/{id}/unarchive" => lifecycle::admin_unarchive,
    get "/admin/sales/{id}/history" => lifecycle::admin_history,
    post "/admin/orders/{id}/cancel" => orders::admin_cancel,
    post "/admin/rehearsals/cleanup" => admin::admin_cleanup_rehearsals,
}

/// The purchase route's whole pattern (the `RouteLabel` its resource carries).
pub const PURCHASE_ROUTE: &str = "/api/sales/{id}/purchase";

/// `POST /api/sales/{id}/purchase` of a sale this process already knows is sold
/// out, answered before routing (`conn::guard`, as its `early` answer; with the
/// route's label) with the handler's own first
/// answer: the flag is the first thing [`purchase::purchase`] checks, before the token, so
/// the answer is the same, and the storm's most frequent request costs no match
/// against the route patterns. Anything else, including a path only the router
/// would decode to this route, is left to the router (`None`).
pub fn sold_out_before_routing(
    req: &actix_web::dev::ServiceRequest,
) -> Option<(HttpResponse, &'static str)> {
    if req.method() != actix_web::http::Method::POST {
        return None;
    }
    let id = req
        .path()
        .strip_prefix("/api/sales/")?
        .strip_suffix("/purchase")?;
    let sale = SaleId::parse(id).ok()?;
    let state = req.app_data::<web::Data<AppState>>()?;
    if !state.sold_out.is_sold_out(sale) {
        return None;
    }
    Metrics::inc(&state.metrics.purchase_sold_out_local);
    Some((sold_out_from_memory(), PURCHASE_ROUTE))
}

const SOLD_OUT_BODY: &[u8] = br#"{"error":"sold_out","message":"sold out"}"#;

/// The answer of the process's sold-out flag: the hottest answer of a flash sale
/// (everyone after the last unit), so a fixed body with no error value, no
/// serializer and no allocation for it. [`sold_out`]'s answer, byte for byte (a
/// unit test compares them).
fn sold_out_from_memory() -> HttpResponse {
    HttpResponse::Gone()
        .content_type(actix_web::http::header::ContentType::json())
        .body(SOLD_OUT_BODY)
}

/// 409 `not_started`, with `Retry-After` in whole seconds until the opening.
fn not_started(starts_in_ms: i64) -> AppError {
    let secs = (starts_in_ms + 999) / 1000;
    AppError::new(
        ErrorCode::NotStarted,
        format!("this sale has not started; it opens in {secs} s"),
    )
    .with_header(header::RETRY_AFTER, secs.max(1).to_string())
}

fn ended() -> AppError {
    AppError::new(ErrorCode::Ended, "this sale has ended")
}

fn sold_out() -> AppError {
    AppError::new(ErrorCode::SoldOut, "sold out")
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::ResponseError;
    use actix_web::body::to_bytes;

    #[test]
    fn the_purchase_label_is_the_registered_route() {
        assert!(ROUTES.contains(&("post", "/sales/{id}/purchase")));
        assert_eq!(PURCHASE_ROUTE, "/api/sales/{id}/purchase");
    }

    #[actix_web::test]
    async fn the_sold_out_flag_answers_what_the_script_answers() {
        let from_script = sold_out().error_response();
        let from_memory = sold_out_from_memory();
        assert_eq!(from_memory.status(), from_script.status());
        assert_eq!(
            from_memory.headers().get(header::CONTENT_TYPE),
            from_script.headers().get(header::CONTENT_TYPE)
        );
        assert_eq!(
            to_bytes(from_memory.into_body()).await.unwrap(),
            to_bytes(from_script.into_body()).await.unwrap()
        );
    }
}
