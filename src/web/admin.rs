//! The admin page: create sales, change stock, open and close; create and close
//! polls. The page only shows; its buttons call the admin JSON API
//! (`/api/admin/...`) from `app.js`.

use actix_web::{Either, HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;

use super::error::PageError;
use super::pages::{list_url, load_nav, page_of_cards, to_signin};
use super::polls;
use super::view::{Moment, Nav, OrderState, PollCard, SaleCard, format_price, option_results};
use crate::domain::{PollId, SaleId};
use crate::error::AppError;
use crate::paging::{Limit, ListScope};
use crate::sale::{
    self,
    export::{self, SaleTotals},
    payment::{self, OrderCounts},
};
use crate::state::AppState;
use crate::vote::{MAX_OPTIONS, MIN_OPTIONS};
use chrono::Utc;

#[derive(Template, WebTemplate)]
#[template(path = "admin.html")]
pub struct AdminPage {
    nav: Nav,
    sales: Vec<SaleCard>,
    polls: Vec<PollCard>,
    /// Bounds of the option list of the poll form.
    min_options: usize,
    max_options: usize,
    /// The next page of each table (the other table stays on its page); none on
    /// the last.
    sales_next_url: Option<String>,
    polls_next_url: Option<String>,
    /// Either table is past its first page: the page offers the way back.
    later_page: bool,
    /// The API pages with the same rows, which the scripts read to keep them current.
    sales_list_url: String,
    polls_list_url: String,
    /// Which sales and polls the tables show, and the links to the others.
    sales_filter: &'static str,
    polls_filter: &'static str,
    sales_filters: Vec<FilterLink>,
    polls_filters: Vec<FilterLink>,
}

/// One tab of a table's filter: its words, its address, whether it is shown now.
pub struct FilterLink {
    pub label: &'static str,
    pub url: String,
    pub current: bool,
}

/// The filters of the admin's tables, in the order of their tabs.
const FILTERS: [(ListScope, &str); 5] = [
    (ListScope::All, "All"),
    (ListScope::Live, "Live"),
    (ListScope::Upcoming, "Upcoming"),
    (ListScope::Ended, "Ended"),
    (ListScope::Archived, "Archived"),
];

/// Rows per page of each table of the admin page.
const ADMIN_PAGE_ROWS: Limit = Limit::DEFAULT;

/// `?sales_cursor=` and `?polls_cursor=`: where each table of the admin page
/// starts; `?sales=` and `?polls=`: which ones each shows (an admin list filter).
#[derive(serde::Deserialize, Default)]
pub struct AdminCursors {
    sales_cursor: Option<String>,
    polls_cursor: Option<String>,
    sales: Option<String>,
    polls: Option<String>,
}

impl AdminCursors {
    fn of(req: &HttpRequest) -> Self {
        web::Query::<AdminCursors>::from_query(req.query_string())
            .map(web::Query::into_inner)
            .unwrap_or_default()
    }

    /// The admin page with the sales table at `sales` and the polls table at
    /// `polls`, each showing its filter.
    fn url(
        sales: Option<&str>,
        polls: Option<&str>,
        filters: (ListScope, ListScope),
        anchor: &str,
    ) -> String {
        let mut params: Vec<String> = [("sales_cursor", sales), ("polls_cursor", polls)]
            .into_iter()
            .filter_map(|(name, cursor)| cursor.map(|c| format!("{name}={c}")))
            .collect();
        for (name, scope) in [("sales", filters.0), ("polls", filters.1)] {
            if scope != ListScope::All {
                params.push(format!("{name}={}", scope.as_str()));
            }
        }
        format!("/admin?{}#{anchor}", params.join("&"))
    }
}

/// The tabs of one table's filter; the other table keeps its own.
fn filter_links(
    current: ListScope,
    other: ListScope,
    sales_table: bool,
    anchor: &str,
) -> Vec<FilterLink> {
    FILTERS
        .iter()
        .map(|(scope, label)| FilterLink {
            label,
            url: if sales_table {
                AdminCursors::url(None, None, (*scope, other), anchor)
            } else {
                AdminCursors::url(None, None, (other, *scope), anchor)
            },
            current: *scope == current,
        })
        .collect()
}

/// Anonymous callers are sent to sign in; signed-in non-admins get a 403 page.
/// The flag is taken from the token, exactly as the admin API decides.
pub async fn page(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<Either<AdminPage, HttpResponse>, PageError> {
    let (nav, user) = load_nav(&req, &state).await?;
    let Some(user) = user else {
        return Ok(Either::Right(to_signin("/admin")));
    };
    if !user.admin {
        return Err(PageError::forbidden(
            nav,
            "This page is for shop administrators. Sign in with an admin account to use it.",
        ));
    }
    let at = AdminCursors::of(&req);
    let (sales_at, polls_at) = (at.sales_cursor.as_deref(), at.polls_cursor.as_deref());
    // An unknown filter shows everything not archived, as no filter does.
    let sales_scope = ListScope::parse_filter(at.sales.as_deref()).unwrap_or(ListScope::All);
    let polls_scope = ListScope::parse_filter(at.polls.as_deref()).unwrap_or(ListScope::All);
    let filters = (sales_scope, polls_scope);
    let with_filter = |url: String, scope: ListScope| match scope {
        ListScope::All => url,
        _ => format!("{url}&filter={}", scope.as_str()),
    };
    match tokio::try_join!(
        page_of_cards(&state, sales_at, ADMIN_PAGE_ROWS, sales_scope),
        polls::page_of_cards(&state, polls_at, ADMIN_PAGE_ROWS, polls_scope)
    ) {
        Ok((sales, polls)) => Ok(Either::Left(AdminPage {
            nav,
            sales_next_url: sales
                .next
                .as_deref()
                .map(|next| AdminCursors::url(Some(next), polls_at, filters, "sales-heading")),
            polls_next_url: polls
                .next
                .as_deref()
                .map(|next| AdminCursors::url(sales_at, Some(next), filters, "polls-heading")),
            later_page: sales_at.is_some() || polls_at.is_some(),
            sales_list_url: with_filter(
                list_url("/api/admin/sales", ADMIN_PAGE_ROWS, sales_at),
                sales_scope,
            ),
            polls_list_url: with_filter(
                list_url("/api/admin/polls", ADMIN_PAGE_ROWS, polls_at),
                polls_scope,
            ),
            sales_filter: sales_scope.as_str(),
            polls_filter: polls_scope.as_str(),
            sales_filters: filter_links(sales_scope, polls_scope, true, "sales-heading"),
            polls_filters: filter_links(polls_scope, sales_scope, false, "polls-heading"),
            sales: sales.items,
            polls: polls.items,
            min_options: MIN_OPTIONS,
            max_options: MAX_OPTIONS,
        })),
        Err(e) => Err(PageError::from_app(e, nav)),
    }
}

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
    /// The orders by payment status, for a sale with a payment window.
    payments: Option<OrderCounts>,
    /// Units and revenue of every settled order.
    totals: SaleTotals,
    revenue_paid: String,
    revenue_awaiting: String,
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

/// Anonymous callers are sent to sign in, non-admins get a 403 page; the nav and
/// the admin user for pages under `/admin`.
pub(super) async fn admin_nav(
    req: &HttpRequest,
    state: &AppState,
    back: &'static str,
) -> Result<Result<Nav, HttpResponse>, PageError> {
    let (nav, user) = load_nav(req, state).await?;
    let Some(user) = user else {
        return Ok(Err(to_signin(back)));
    };
    if !user.admin {
        return Err(PageError::forbidden(
            nav,
            "This page is for shop administrators. Sign in with an admin account to use it.",
        ));
    }
    Ok(Ok(nav))
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
    let payments = async {
        if sale.has_payment_step() {
            payment::counts(&state.db, id).await.map(Some)
        } else {
            Ok(None)
        }
    };
    let totals = export::totals(&state.db, id, price_cents);
    match tokio::try_join!(load_orders(&state, id, page, price_cents), payments, totals) {
        Ok((found, payments, totals)) => {
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
                payments,
                revenue_paid: format_price(totals.revenue_paid_cents),
                revenue_awaiting: format_price(totals.revenue_awaiting_cents),
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

#[derive(Template, WebTemplate)]
#[template(path = "admin_poll.html")]
pub struct PollTalliesPage {
    nav: Nav,
    poll: PollCard,
    options: Vec<TallyRow>,
    live_voters: i64,
    settled_voters: i64,
    /// Not open yet: the edit form is offered.
    editable: bool,
    /// Options one per line, for the edit form.
    options_text: String,
    archived_at: Option<Moment>,
    /// Someone voted: delete is not offered.
    has_votes: bool,
    history: Vec<super::admin_sale::HistoryRow>,
}

pub struct TallyRow {
    /// The option's id: the page script finds its row by it.
    pub id: i64,
    pub label: String,
    pub live: i64,
    pub settled: i64,
    pub percent: i64,
}

impl TallyRow {
    /// Votes counted in Redis that the settlement worker has not written yet.
    pub fn unsettled(&self) -> i64 {
        (self.live - self.settled).max(0)
    }
}

/// A poll's tallies for the admin: live (Redis) and settled (Postgres) per option.
pub async fn poll_tallies(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<Either<PollTalliesPage, HttpResponse>, PageError> {
    let nav = match admin_nav(&req, &state, "/admin").await? {
        Ok(nav) => nav,
        Err(redirect) => return Ok(Either::Right(redirect)),
    };
    let Ok(id) = PollId::parse(&path) else {
        return Err(PageError::not_found(
            nav,
            "Poll addresses end in a number, like /admin/polls/1.",
        ));
    };
    let view = match crate::vote::load_view(&state, id).await {
        Ok(view) => view,
        Err(e) => return Err(PageError::from_app(e, nav)),
    };
    let settled = match crate::vote::store::settled_tallies(&state.db, id).await {
        Ok(rows) => rows,
        Err(e) => return Err(PageError::from_app(e.into(), nav)),
    };
    let options: Vec<(i64, String)> = view
        .record
        .options
        .iter()
        .map(|o| (o.id, o.label.clone()))
        .collect();
    let settled_of = |option: i64| {
        settled
            .iter()
            .find(|(id, _)| *id == option)
            .map_or(0, |(_, n)| *n)
    };
    let options_text = options
        .iter()
        .map(|(_, label)| label.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let history = match crate::audit::history(
        &state.db,
        crate::audit::Subject::Poll(id),
        super::admin_sale::HISTORY_SHOWN,
    )
    .await
    {
        Ok(rows) => rows,
        Err(e) => return Err(PageError::from_app(e, nav)),
    };
    let (results, _) = option_results(options, &view.results);
    let rows = results
        .into_iter()
        .map(|r| TallyRow {
            id: r.id,
            settled: settled_of(r.id),
            label: r.label,
            live: r.votes,
            percent: r.percent,
        })
        .collect();
    let settled_voters: i64 = settled.iter().map(|(_, n)| n).sum();
    let poll = &view.record.poll;
    Ok(Either::Left(PollTalliesPage {
        nav,
        editable: poll.opens_at > Utc::now() && !poll.closed,
        options_text,
        archived_at: poll.archived_at.map(Moment::from),
        has_votes: view.results.voters > 0 || settled_voters > 0,
        history: history.iter().map(Into::into).collect(),
        live_voters: view.results.voters,
        settled_voters,
        poll: PollCard::new(view.record.poll, view.results.voters, Utc::now()),
        options: rows,
    }))
}
