//! HTTP routes of sales, one file per concern: public reads (`buyer.rs`), the
//! purchase (`purchase.rs`; its body, read by hand, in `purchase_body.rs`), its
//! ticket (`ticket.rs`), the waiting room (`queue.rs`), a draw's entry, standing
//! and publication (`draw.rs`), an order's status and payment (`orders.rs`), the
//! admin's set-up (`admin.rs`: create, list), a sale's controls (`controls.rs`:
//! stock, open, close), the sale-day console (`console.rs`), what sold (`sold.rs`),
//! upkeep (`repair.rs`), edit, archive, delete and history (`lifecycle.rs`), a
//! waiting room's line controls (`line.rs`); the refusals the purchase, the ticket
//! and the waiting room share are in `answers.rs`. This file holds the route table,
//! the OpenAPI group and the sold-out answer given before routing.

use actix_web::{HttpResponse, web};

use crate::domain::SaleId;
use crate::metrics::Metrics;
use crate::state::AppState;

mod admin;
mod answers;
mod buyer;
mod console;
mod controls;
mod draw;
mod draw_admin;
mod lifecycle;
mod line;
mod orders;
mod purchase;
mod purchase_body;
mod queue;
mod repair;
mod sold;
mod ticket;

// Routes under `/api` (see `startup`). The purchase is in a group of its own,
// `configure_hot`, registered first of all (before the vote's, then the rest): the
// router tries the patterns in order, and each dynamic one it tries costs a regex
// match, so the storm's routes are the first it tries.
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    purchase::purchase,
    ticket::ticket,
    queue::join,
    queue::me,
    draw::enter,
    draw::me,
    draw::draw,
    draw::entries_csv,
    draw_admin::admin_draw,
    buyer::list,
    buyer::show,
    buyer::events,
    orders::order_status,
    orders::pay,
    orders::cancel,
    buyer::my_orders,
    admin::admin_create,
    admin::admin_list,
    controls::admin_stock,
    controls::admin_open,
    controls::admin_close,
    line::admin_line,
    sold::admin_orders,
    sold::admin_orders_csv,
    repair::admin_reconcile,
    repair::admin_repair,
    lifecycle::admin_edit,
    lifecycle::admin_archive,
    lifecycle::admin_unarchive,
    lifecycle::admin_delete,
    lifecycle::admin_history,
    orders::admin_cancel,
    repair::admin_cleanup_rehearsals,
    console::admin_console
))]
pub(crate) struct Api;

super::routes! {
    pub fn configure_hot, pub const HOT_ROUTES; mounted "/api";
    post "/sales/{id}/purchase" => purchase::purchase,
}

super::routes! {
    pub fn configure, pub const ROUTES; mounted "/api";
    post "/sales/{id}/ticket" => ticket::ticket,
    post "/sales/{id}/queue" => queue::join,
    get "/sales/{id}/queue/me" => queue::me,
    post "/sales/{id}/entry" => draw::enter,
    get "/sales/{id}/entry/me" => draw::me,
    get "/sales/{id}/draw" => draw::draw,
    get "/sales/{id}/draw/entries.csv" => draw::entries_csv,
    get "/sales" => buyer::list,
    get "/sales/{id}" => buyer::show,
    get "/sales/{id}/events" => buyer::events,
    get "/orders/{id}" => orders::order_status,
    post "/orders/{id}/pay" => orders::pay,
    post "/orders/{id}/cancel" => orders::cancel,
    get "/me/orders" => buyer::my_orders,
    post "/admin/sales" => admin::admin_create,
    get "/admin/sales" => admin::admin_list,
    post "/admin/sales/{id}/stock" => controls::admin_stock,
    post "/admin/sales/{id}/open" => controls::admin_open,
    post "/admin/sales/{id}/close" => controls::admin_close,
    post "/admin/sales/{id}/line" => line::admin_line,
    get "/admin/sales/{id}/orders" => sold::admin_orders,
    get "/admin/sales/{id}/draw" => draw_admin::admin_draw,
    get "/admin/sales/{id}/orders.csv" => sold::admin_orders_csv,
    get "/admin/sales/{id}/reconcile" => repair::admin_reconcile,
    post "/admin/sales/{id}/reconcile" => repair::admin_repair,
    patch "/admin/sales/{id}" => lifecycle::admin_edit,
    delete "/admin/sales/{id}" => lifecycle::admin_delete,
    post "/admin/sales/{id}/archive" => lifecycle::admin_archive,
    post "/admin/sales/{id}/unarchive" => lifecycle::admin_unarchive,
    get "/admin/sales/{id}/history" => lifecycle::admin_history,
    post "/admin/orders/{id}/cancel" => orders::admin_cancel,
    post "/admin/rehearsals/cleanup" => repair::admin_cleanup_rehearsals,
    get "/admin/console" => console::admin_console,
}

/// The purchase route's whole pattern (the `RouteLabel` its resource carries).
pub const PURCHASE_ROUTE: &str = "/api/sales/{id}/purchase";

/// `POST /api/sales/{id}/purchase` of a sale this process already knows is sold
/// out, answered before routing (`conn::guard`, as its `early` answer; with the
/// route's label) with the handler's own first
/// answer: the flag is the first thing [`purchase::purchase`] checks, before the token, so
/// the answer is the same, and the storm's most frequent request costs no match
/// against the route patterns. Anything else, including a path only the router
/// would decode to this route, is left to the router (`None`), and so is a
/// purchase with an `Idempotency-Key` (the handler does not answer it from memory:
/// it may be a retry whose first answer was a 202).
pub fn sold_out_before_routing(
    req: &actix_web::dev::ServiceRequest,
) -> Option<(HttpResponse, &'static str)> {
    if req.method() != actix_web::http::Method::POST
        || req.headers().contains_key("idempotency-key")
    {
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
    Some((answers::sold_out_from_memory(), PURCHASE_ROUTE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purchase_label_is_the_registered_route() {
        assert!(HOT_ROUTES.contains(&("post", "/sales/{id}/purchase")));
        assert_eq!(PURCHASE_ROUTE, "/api/sales/{id}/purchase");
    }
}
