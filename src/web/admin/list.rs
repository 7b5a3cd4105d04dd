//! The admin page (`/admin`): the sale-day console first (`console.rs`), then the
//! sales and polls tables, paged and filtered, each with its form behind a button.

use actix_web::{Either, HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;

use super::console::ConsoleView;
use crate::paging::{Limit, ListScope};
use crate::state::AppState;
use crate::vote::{MAX_OPTIONS, MIN_OPTIONS};
use crate::web::error::PageError;
use crate::web::pages::{list_url, load_nav, page_of_cards, to_signin};
use crate::web::polls;
use crate::web::view::{BallotForm, Nav, PollCard, ResultsChoice, SaleCard, results_choices};

#[derive(Template, WebTemplate)]
#[template(path = "admin.html")]
pub struct AdminPage {
    nav: Nav,
    /// The sale-day view: live and upcoming sales, with their buttons.
    console: ConsoleView,
    sales: Vec<SaleCard>,
    polls: Vec<PollCard>,
    /// The polls could not be listed because one is being restored into Redis (503
    /// `recovering`): the page shows the rest and says so, never fails for it.
    polls_restoring: bool,
    /// Bounds of the option list of the poll form.
    min_options: usize,
    max_options: usize,
    /// The poll form's choices of who sees the results when.
    results_choices: Vec<ResultsChoice>,
    /// The New poll form's ballot settings, at their defaults.
    ballot_form: BallotForm,
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
    let polls = async {
        // A poll being restored (Redis lost it) refuses its list for a moment: the
        // sale-day console above it must not go with it.
        match polls::page_of_cards(
            &state,
            polls_at,
            ADMIN_PAGE_ROWS,
            polls_scope,
            crate::vote::visibility::Viewer::Admin,
        )
        .await
        {
            Err(e) if e.error_code() == crate::error::ErrorCode::Recovering => {
                let none = crate::paging::Page {
                    items: Vec::new(),
                    next: None,
                };
                Ok((none, true))
            }
            other => other.map(|page| (page, false)),
        }
    };
    match tokio::try_join!(
        crate::sale::console::console(state.get_ref()),
        page_of_cards(&state, sales_at, ADMIN_PAGE_ROWS, sales_scope),
        polls,
    ) {
        Ok((console, sales, (polls, polls_restoring))) => Ok(Either::Left(AdminPage {
            nav,
            console: console.into(),
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
            polls_restoring,
            min_options: MIN_OPTIONS,
            max_options: MAX_OPTIONS,
            results_choices: results_choices(),
            ballot_form: BallotForm::new("poll", Default::default()),
        })),
        Err(e) => Err(PageError::from_app(e, nav)),
    }
}
