//! A sale's orders for the admin (`/admin/sales/{id}/orders`): settled ones paged,
//! pending ones from Redis, and the totals.

use actix_web::{Either, HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;

use super::admin_nav;
use crate::domain::SaleId;
use crate::error::AppError;
use crate::sale::{
    self,
    export::{self, SaleTotals},
};
use crate::state::AppState;
use crate::web::error::PageError;
use crate::web::view::{Moment, Nav, OrderState, SaleCard, format_price, group_digits};

/// Orders shown per page of a sale's orders.
const ORDERS_PER_PAGE: i64 = 50;
/// Pending orders listed by name, oldest first (the count is always exact): the
/// orders stream is short-lived and normally small, and this bounds the page's
/// Redis work.
const PENDING_SHOWN: usize = 100;

#[derive(Template, WebTemplate)]
#[template(path = "admin_orders.html")]
pub struct SaleOrdersPage {
    nav: Nav,
    sale: SaleCard,
    confirmed: Vec<OrderRow>,
    confirmed_total: i64,
    pending: Vec<PendingRow>,
    pending_total: i64,
    page: i64,
    pages: i64,
    /// Position of the first row of this page, from 1.
    first: i64,
    /// Units and revenue of every settled order (the page's script refreshes
    /// them from `GET /api/admin/sales/{id}/orders` after each cancel).
    totals: SaleTotals,
    revenue_paid: String,
    revenue_awaiting: String,
    revenue_refunded: String,
}

impl SaleOrdersPage {
    /// A count of units as the page writes it (and its script, `groupDigits`).
    fn units(&self, n: &i64) -> String {
        group_digits(*n)
    }
}

pub struct OrderRow {
    pub number: i64,
    pub buyer: String,
    pub order_id: String,
    pub ordered: Moment,
    pub settled: Moment,
    pub state: OrderState,
    pub units: i32,
    /// The price times the units.
    pub amount: String,
}

pub struct PendingRow {
    pub buyer: String,
    pub order_id: String,
    /// When the purchase script accepted it: the time its order will carry once
    /// settled.
    pub ordered: Moment,
}

#[derive(serde::Deserialize)]
pub struct PageQuery {
    page: Option<String>,
}

/// A sale's orders for the admin: who bought, order ids, times, confirmed or
/// pending, a page at a time (oldest first, so pages do not shift as orders settle).
pub async fn sale_orders(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    query: web::Query<PageQuery>,
) -> Result<Either<SaleOrdersPage, HttpResponse>, PageError> {
    let nav = match admin_nav(&req, &state, "/admin").await? {
        Ok(nav) => nav,
        Err(redirect) => return Ok(Either::Right(redirect)),
    };
    let Ok(id) = SaleId::parse(&path) else {
        return Err(PageError::not_found(
            nav,
            "Sale addresses end in a number, like /admin/sales/1/orders.",
        ));
    };
    let page = match query.page.as_deref().map(str::parse::<i64>) {
        None => 1,
        Some(Ok(n)) if (1..=1_000_000).contains(&n) => n,
        Some(_) => {
            return Err(PageError::not_found(
                nav,
                "Page numbers are whole numbers from 1.",
            ));
        }
    };
    let (sale, price_cents) = match crate::sale::find_view(&state, id).await {
        Ok(Some(view)) => {
            let price = view.sale.price_cents;
            (SaleCard::from(view), price)
        }
        Ok(None) => return Err(PageError::not_found(nav, "There is no such sale.")),
        Err(e) => return Err(PageError::from_app(e, nav)),
    };
    let totals = export::totals(&state.db, id, price_cents);
    match tokio::try_join!(load_orders(&state, id, page, price_cents), totals) {
        Ok((found, totals)) => {
            let pages = ((found.confirmed_total + ORDERS_PER_PAGE - 1) / ORDERS_PER_PAGE).max(1);
            if page > pages {
                return Err(PageError::not_found(
                    nav,
                    format!("This sale's orders fill {pages} page(s)."),
                ));
            }
            Ok(Either::Left(SaleOrdersPage {
                nav,
                sale,
                confirmed: found.confirmed,
                confirmed_total: found.confirmed_total,
                pending: found.pending,
                pending_total: found.pending_total,
                page,
                pages,
                first: (page - 1) * ORDERS_PER_PAGE + 1,
                revenue_paid: format_price(totals.revenue_paid_cents),
                revenue_awaiting: format_price(totals.revenue_awaiting_cents),
                revenue_refunded: format_price(totals.revenue_refunded_cents),
                totals,
            }))
        }
        Err(e) => Err(PageError::from_app(e, nav)),
    }
}

struct FoundOrders {
    confirmed: Vec<OrderRow>,
    confirmed_total: i64,
    pending: Vec<PendingRow>,
    pending_total: i64,
}

async fn load_orders(
    state: &AppState,
    id: SaleId,
    page: i64,
    price_cents: i64,
) -> Result<FoundOrders, AppError> {
    let offset = (page - 1) * ORDERS_PER_PAGE;
    let found = sale::admin::orders_page(state, id, offset, ORDERS_PER_PAGE, PENDING_SHOWN).await?;
    let pending = found
        .pending
        .into_iter()
        .map(|(e, name)| PendingRow {
            buyer: name.unwrap_or_else(|| format!("user #{}", e.user)),
            order_id: e.order_id,
            ordered: e.accepted.into(),
        })
        .collect();
    Ok(FoundOrders {
        confirmed: found
            .confirmed
            .into_iter()
            .zip(offset + 1..)
            .map(|(o, number)| OrderRow {
                number,
                state: OrderState::of(o.status, o.overdue, o.pay_by, o.paid_at),
                buyer: o.username,
                order_id: o.id.to_string(),
                ordered: o.accepted_at.into(),
                settled: o.settled_at.into(),
                units: o.quantity,
                amount: format_price(i64::from(o.quantity).saturating_mul(price_cents)),
            })
            .collect(),
        confirmed_total: found.confirmed_total,
        pending,
        pending_total: found.pending_total,
    })
}
