//! A sale's admin page (`/admin/sales/{id}`): its edit form, archive and delete,
//! and the record of every admin change. The page only shows; its buttons call
//! the admin JSON API (`PATCH`, `archive`, `unarchive`, `DELETE`) from
//! `js/admin-sale.js`.

use actix_web::{Either, HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;
use chrono::Utc;

use super::admin::admin_nav;
use super::error::PageError;
use super::view::{Moment, Nav, SaleCard};
use crate::audit::{self, Subject};
use crate::domain::SaleId;
use crate::state::AppState;

/// Changes shown on the page, newest first (the API gives up to 500).
pub(super) const HISTORY_SHOWN: i64 = 100;

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

/// One admin change as the page lists it.
pub struct HistoryRow {
    pub at: Moment,
    pub admin: String,
    pub action: &'static str,
    /// "price_cents: 19900 → 12345", one per field changed.
    pub details: Vec<String>,
}

impl From<&audit::Entry> for HistoryRow {
    fn from(e: &audit::Entry) -> Self {
        HistoryRow {
            at: e.at.into(),
            admin: e
                .admin
                .clone()
                .unwrap_or_else(|| "a removed account".into()),
            action: action_words(&e.action),
            details: details(e),
        }
    }
}

/// What an action is called on the page.
pub(super) fn action_words(action: &str) -> &'static str {
    match audit::Action::parse(action) {
        Some(audit::Action::Create) => "Created",
        Some(audit::Action::Edit) => "Edited",
        Some(audit::Action::Stock) => "Stock changed",
        Some(audit::Action::Open) => "Opened",
        Some(audit::Action::Close) => "Closed",
        Some(audit::Action::Archive) => "Archived",
        Some(audit::Action::Unarchive) => "Unarchived",
        Some(audit::Action::Delete) => "Deleted",
        Some(audit::Action::Cancel) => "Order cancelled",
        Some(audit::Action::Refund) => "Order refunded",
        None => "Changed",
    }
}

/// A JSON value in a line of the history: strings as they are, at most 80
/// characters.
fn short(value: &serde_json::Value) -> String {
    let text = match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "none".to_string(),
        other => other.to_string(),
    };
    if text.chars().count() > 80 {
        format!("{}…", text.chars().take(79).collect::<String>())
    } else {
        text
    }
}

/// The lines of one change: each field of `after` with its value before, when the
/// change names a few fields (a create or a delete shows none: the row is the sale).
pub(super) fn details(entry: &audit::Entry) -> Vec<String> {
    let (Some(after), before) = (entry.after.as_ref(), entry.before.as_ref()) else {
        return Vec::new();
    };
    let Some(fields) = after.as_object() else {
        return Vec::new();
    };
    if matches!(entry.action.as_str(), "create") {
        return Vec::new();
    }
    let mut lines: Vec<String> = fields
        .iter()
        .map(|(name, new)| match before.and_then(|b| b.get(name)) {
            Some(old) => format!("{name}: {} → {}", short(old), short(new)),
            None => format!("{name}: {}", short(new)),
        })
        .collect();
    if let Some(order) = entry.order_id {
        lines.insert(0, format!("order {order}"));
    }
    lines
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
    let opened = view.sale.starts_at <= Utc::now();
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
