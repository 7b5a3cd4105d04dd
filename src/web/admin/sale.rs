//! A sale's admin page (`/admin/sales/{id}`): its edit form, archive and delete,
//! and the record of every admin change. The page only shows; its buttons call
//! the admin JSON API (`PATCH`, `archive`, `unarchive`, `DELETE`) from
//! `js/admin-sale.js`.

use actix_web::{Either, HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;
use chrono::Utc;

use super::admin_nav;
use super::history::{HISTORY_SHOWN, HistoryRow};
use crate::audit::{self, Subject};
use crate::domain::SaleId;
use crate::state::AppState;
use crate::web::error::PageError;
use crate::web::view::{Moment, Nav, SaleCard};

#[derive(Template, WebTemplate)]
#[template(path = "admin_sale.html")]
pub struct AdminSalePage {
    nav: Nav,
    sale: SaleCard,
    /// The price as the form takes it: "199.00".
    price_input: String,
    /// The sale has opened: only the words, the picture and a later end may change.
    opened: bool,
    archived_at: Option<Moment>,
    /// Someone bought (delete is refused then; the button is not offered).
    has_orders: bool,
    history: Vec<HistoryRow>,
}

/// `/admin/sales/{id}`: anonymous callers sign in first, others get a 403 page.
pub async fn page(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<Either<AdminSalePage, HttpResponse>, PageError> {
    let nav = match admin_nav(&req, &state, "/admin").await? {
        Ok(nav) => nav,
        Err(redirect) => return Ok(Either::Right(redirect)),
    };
    let Ok(id) = SaleId::parse(&path) else {
        return Err(PageError::not_found(
            nav,
            "Sale addresses end in a number, like /admin/sales/1.",
        ));
    };
    let view = match crate::sale::find_view(&state, id).await {
        Ok(Some(view)) => view,
        Ok(None) => return Err(PageError::not_found(nav, "There is no such sale.")),
        Err(e) => return Err(PageError::from_app(e, nav)),
    };
    let has_orders = crate::sale::delete::has_orders(&state.db, id);
    let history = audit::history(&state.db, Subject::Sale(id), HISTORY_SHOWN);
    let (has_orders, history) = match tokio::try_join!(has_orders, history) {
        Ok(found) => found,
        Err(e) => return Err(PageError::from_app(e, nav)),
    };
    let opened = view.sale.terms_fixed_at() <= Utc::now();
    let cents = view.sale.price_cents;
    let archived_at = view.sale.archived_at.map(Moment::from);
    let sold = view.sold > 0;
    Ok(Either::Left(AdminSalePage {
        nav,
        price_input: format!("{}.{:02}", cents / 100, cents % 100),
        opened,
        archived_at,
        has_orders: has_orders || sold,
        history: history.iter().map(HistoryRow::from).collect(),
        sale: SaleCard::from(view),
    }))
}
