//! The shopper's pages: the list of sales, one sale, sign-in, sign-up, my orders.

use actix_web::http::header;
use actix_web::{Either, HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;

use super::error::PageError;
use super::view::{self, Nav, OrderState, SaleCard};
use crate::domain::{SaleId, UserId};
use crate::error::AppError;
use crate::paging::{Limit, ListScope, Page};
use crate::sale::list::SaleCursor;
use crate::sale::{orders, pending};
use crate::state::AppState;

#[derive(Template, WebTemplate)]
#[template(path = "index.html")]
pub struct IndexPage {
    nav: Nav,
    sales: Vec<SaleCard>,
    /// The server's clock when rendering, so the cards' countdowns can correct for skew.
    server_now_ms: i64,
    /// The next page of sales (`/?cursor=...`); none on the last.
    next_url: Option<String>,
    /// A page after the first: it offers the way back.
    later_page: bool,
    /// The API page with the same sales, which the script reads to keep the cards
    /// current.
    list_url: String,
}

/// Sales on one page of the home page: the shop's first screens, not its whole
/// stock (the list was 195 KB of HTML at 3,000 sales).
pub const HOME_PAGE_SALES: Limit = Limit::fixed(24);

/// `?cursor=` of the pages that list: the `X-Next-Cursor` of the API list they show.
#[derive(serde::Deserialize)]
pub struct CursorQuery {
    cursor: Option<String>,
}

pub async fn index(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<impl actix_web::Responder, PageError> {
    let (nav, _) = load_nav(&req, &state).await?;
    let cursor = cursor_param(&req);
    match load_cards(&state, cursor.as_deref()).await {
        Ok(mut page) => {
            // The list order puts live and sold-out sales together (only Redis knows
            // which is which); on the page, what can be bought comes first.
            view::sort_for_shop(&mut page.items);
            Ok(IndexPage {
                nav,
                sales: page.items,
                server_now_ms: chrono::Utc::now().timestamp_millis(),
                next_url: page.next.map(|next| format!("/?cursor={next}")),
                later_page: cursor.is_some(),
                list_url: list_url("/api/sales", HOME_PAGE_SALES, cursor.as_deref()),
            })
        }
        Err(e) => Err(PageError::from_app(e, nav)),
    }
}

/// One page of sale cards, as the API lists them.
async fn load_cards(state: &AppState, cursor: Option<&str>) -> Result<Page<SaleCard>, AppError> {
    page_of_cards(state, cursor, HOME_PAGE_SALES, ListScope::Public).await
}

/// `limit` sales of `scope` after `cursor` (a sale list's, else 400) with their
/// live numbers: the public list through the cache, the admin's from Postgres.
pub(super) async fn page_of_cards(
    state: &AppState,
    cursor: Option<&str>,
    limit: Limit,
    scope: ListScope,
) -> Result<Page<SaleCard>, AppError> {
    let after = cursor.map(SaleCursor::parse).transpose()?;
    let page = match scope {
        ListScope::Public => crate::sale::load_page(state, after.as_ref(), limit).await?,
        _ => crate::sale::cached::admin_page(state, after.as_ref(), limit, scope).await?,
    };
    Ok(page.map(SaleCard::from))
}

/// The `cursor` query parameter of a listing page; an unreadable query has none.
pub(super) fn cursor_param(req: &HttpRequest) -> Option<String> {
    web::Query::<CursorQuery>::from_query(req.query_string())
        .ok()
        .and_then(|q| q.into_inner().cursor)
}

/// The API address of the page a listing page shows (`limit` items after `cursor`).
pub(super) fn list_url(api: &str, limit: Limit, cursor: Option<&str>) -> String {
    match cursor {
        // A cursor that reached here parsed: base64url, nothing to escape.
        Some(cursor) => format!("{api}?limit={}&cursor={cursor}", limit.get()),
        None => format!("{api}?limit={}", limit.get()),
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "sale.html")]
pub struct SalePage {
    nav: Nav,
    sale: SaleCard,
    /// The server's clock when rendering, so the countdown can correct for skew.
    server_now_ms: i64,
    signed_in: bool,
    /// The caller can buy no more of this sale: they hold an order of a sale of
    /// one per customer, or `max_per_user` units of one of more.
    bought: bool,
    /// Units the caller holds of a sale of more than one per customer (0 otherwise).
    held: i64,
    /// Units counted against that sale's `max_per_user` for the caller: `held`,
    /// plus returned ones on a sale that does not let a buyer buy again.
    counted: i64,
    /// How the caller's order ended when it holds a unit no more (`cancelled`,
    /// `cancelled_by_you`, `refunded`, `expired`; empty otherwise): the page says
    /// whether they may buy again (the sale's `rebuy_after_expiry`).
    returned: &'static str,
    signin_url: String,
    signup_url: String,
}

pub async fn sale(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<impl actix_web::Responder, PageError> {
    let (nav, user) = load_nav(&req, &state).await?;
    let Ok(id) = SaleId::parse(&path) else {
        return Err(PageError::not_found(
            nav,
            "Sale addresses end in a number, like /sales/1.",
        ));
    };
    let admin = user.as_ref().is_some_and(|u| u.admin);
    let card = match load_card(&state, id, admin).await {
        Ok(Some(card)) => card,
        Ok(None) => return Err(PageError::not_found(nav, "There is no such sale.")),
        Err(e) => return Err(PageError::from_app(e, nav)),
    };
    let holding = match user {
        Some(user) => {
            let mut redis = state.redis.clone();
            let asked = pending::holding(&mut redis, &state.keys, id, card.max_per_user, user.id);
            match asked.await {
                Ok(holding) => holding,
                Err(e) => return Err(PageError::from_app(e, nav)),
            }
        }
        None => pending::Holding {
            bought: false,
            held: 0,
        },
    };
    // A sale of several that does not let a buyer buy again keeps returned units
    // counted against the cap: what the caller holds now is the count less them.
    let counted = holding.held;
    let held = match user {
        Some(user) if counted > 0 && !card.rebuy_after_expiry => {
            match orders::returned_units(&state.db, id, user.id).await {
                Ok(returned) => (counted - returned).max(0),
                Err(e) => return Err(PageError::from_app(e.into(), nav)),
            }
        }
        _ => counted,
    };
    let returned = match user {
        Some(user) => match returned_of(&state, id, &card, &holding, held, user.id).await {
            Ok(returned) => returned,
            Err(e) => return Err(PageError::from_app(e.into(), nav)),
        },
        None => None,
    };
    Ok(SalePage {
        signed_in: nav.user.is_some(),
        nav,
        signin_url: format!("/signin?next=%2Fsales%2F{id}"),
        signup_url: format!("/signup?next=%2Fsales%2F{id}"),
        sale: card,
        server_now_ms: chrono::Utc::now().timestamp_millis(),
        bought: holding.bought,
        held,
        counted,
        returned: returned.map_or("", orders::Returned::as_str),
    })
}

/// How the caller's order of the sale ended, asked of Postgres only when it can
/// matter: a buyer who may buy again and holds nothing now, or one who may not
/// and is still counted a buyer (a one-per-customer sale's returned order keeps
/// its buyer in the buyers hash; a sale of several keeps the returned units
/// counted: `held`, what the caller holds now, is then less than the count).
async fn returned_of(
    state: &AppState,
    id: SaleId,
    card: &SaleCard,
    holding: &pending::Holding,
    held: i64,
    user: UserId,
) -> sqlx::Result<Option<orders::Returned>> {
    // Holding a unit now (settled or not: the units hash counts an order before
    // Postgres has it), the caller reads nothing of an order returned before.
    if held > 0 {
        return Ok(None);
    }
    let counted_not_held = holding.held > 0;
    if card.rebuy_after_expiry == holding.bought && !counted_not_held {
        return Ok(None);
    }
    orders::returned_order(&state.db, id, user).await
}

/// The sale's card; none for no such sale, or a rehearsal shown to anyone but an
/// admin.
pub(super) async fn load_card(
    state: &AppState,
    id: SaleId,
    admin: bool,
) -> Result<Option<SaleCard>, AppError> {
    Ok(crate::sale::find_view(state, id)
        .await?
        .filter(|view| admin || !view.sale.rehearsal)
        .map(SaleCard::from))
}

#[derive(Template, WebTemplate)]
#[template(path = "signin.html")]
pub struct SigninPage {
    nav: Nav,
}

pub async fn signin(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<Either<SigninPage, HttpResponse>, PageError> {
    if let Some(clean) = refuse_foreign_next(&req, "/signin") {
        return Ok(Either::Right(clean));
    }
    let (nav, _) = load_nav(&req, &state).await?;
    Ok(Either::Left(SigninPage { nav }))
}

#[derive(Template, WebTemplate)]
#[template(path = "signup.html")]
pub struct SignupPage {
    nav: Nav,
}

pub async fn signup(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<Either<SignupPage, HttpResponse>, PageError> {
    if let Some(clean) = refuse_foreign_next(&req, "/signup") {
        return Ok(Either::Right(clean));
    }
    let (nav, _) = load_nav(&req, &state).await?;
    Ok(Either::Left(SignupPage { nav }))
}

/// The sign-in and sign-up pages send the browser to `?next=` once signed in
/// (`static/app.js`). A `next` that is not a path on this site gets a 303 to the
/// same page without it, so a crafted link cannot even load the page with it.
fn refuse_foreign_next(req: &HttpRequest, page: &'static str) -> Option<HttpResponse> {
    #[derive(serde::Deserialize)]
    struct Next {
        next: Option<String>,
    }
    let next = match web::Query::<Next>::from_query(req.query_string()) {
        Ok(q) => q.into_inner().next,
        Err(_) => Some(String::new()),
    };
    match next {
        Some(next) if !is_local_path(&next) => Some(
            HttpResponse::SeeOther()
                .insert_header((header::LOCATION, page))
                .finish(),
        ),
        _ => None,
    }
}

/// A path on this origin, the way a browser's URL parser would read it: one leading
/// `/`, not `//` (another host), and no backslash (read as `/`) or control character
/// (tabs and newlines are dropped, so `/\t/evil.example` is `//evil.example`).
pub fn is_local_path(next: &str) -> bool {
    next.starts_with('/')
        && !next.starts_with("//")
        && !next.chars().any(|c| c == '\\' || c.is_control())
}

#[derive(Template, WebTemplate)]
#[template(path = "orders.html")]
pub struct OrdersPage {
    nav: Nav,
    orders: Vec<OrderLine>,
    /// Some order has (or had) a payment step: the page explains deadlines.
    payment_step: bool,
    /// The server's clock when rendering, so the payment countdowns can correct for skew.
    server_now_ms: i64,
}

/// One of the caller's orders: settled (in Postgres) or pending (accepted by
/// Redis, on its way to Postgres).
pub struct OrderLine {
    pub sale_id: i64,
    pub sale_name: String,
    /// Units of the order (of a pending one: the units the buyer holds).
    pub quantity: i32,
    /// Of all its units.
    pub price: String,
    /// `None` while pending: the order has no id or state to show yet.
    pub settled: Option<SettledOrder>,
}

pub struct SettledOrder {
    pub order_id: String,
    /// The sale lets a buyer whose order was cancelled, refunded or expired buy again.
    pub rebuy: bool,
    /// The sale's units per customer.
    pub max_per_user: i32,
    /// `draw` or `line`: what the purchase used up (see `MyOrder::gate`).
    pub gate: Option<String>,
    pub ordered: view::Moment,
    pub state: OrderState,
}

impl SettledOrder {
    /// The sale's rule for a returned order, as `static/js/orders.js` words it too.
    pub fn returned_rule(&self) -> String {
        if let Some(gate) = &self.gate {
            let what = if gate == "draw" {
                "A win"
            } else {
                "A turn in the line"
            };
            format!("{what} buys once: a returned order does not give another.")
        } else if self.rebuy {
            "You may buy from this sale again.".into()
        } else if self.max_per_user > 1 {
            format!(
                "Returned units still count toward this sale's limit of {} per customer.",
                self.max_per_user
            )
        } else {
            "This sale allows one purchase per customer, cancelled or not.".into()
        }
    }
}

impl OrdersPage {
    /// The time left to pay, as the countdown starts (the script takes over).
    pub fn time_left(&self, pay_by: &view::Moment) -> String {
        view::clock_text(pay_by.ms - self.server_now_ms)
    }
}

/// Confirmed orders from Postgres, and pending ones found in Redis: a sale of the
/// list whose buyers include the caller but whose order has not settled yet.
pub async fn my_orders(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<Either<OrdersPage, HttpResponse>, PageError> {
    let (nav, user) = load_nav(&req, &state).await?;
    let Some(user) = user else {
        return Ok(Either::Right(to_signin("/me/orders")));
    };
    match load_orders(&state, user.id).await {
        Ok(orders) => Ok(Either::Left(OrdersPage {
            nav,
            payment_step: orders.iter().any(|o| {
                o.settled
                    .as_ref()
                    .is_some_and(|s| !matches!(s.state, OrderState::Confirmed))
            }),
            orders,
            server_now_ms: chrono::Utc::now().timestamp_millis(),
        })),
        Err(e) => Err(PageError::from_app(e, nav)),
    }
}

/// The caller's orders as the page lists them: the units still pending first,
/// then the settled orders, newest first.
async fn load_orders(state: &AppState, user: UserId) -> Result<Vec<OrderLine>, AppError> {
    let mine = orders::of_user_with_pending(state, user).await?;
    let mut lines: Vec<OrderLine> = mine
        .pending
        .into_iter()
        .map(|p| OrderLine {
            sale_id: p.sale_id,
            sale_name: p.sale_name,
            quantity: p.units,
            price: view::format_price(p.price_cents),
            settled: None,
        })
        .collect();
    lines.extend(mine.settled.into_iter().map(|o| OrderLine {
        sale_id: o.sale_id,
        sale_name: o.sale_name,
        quantity: o.quantity,
        price: view::format_price(o.price_cents * i64::from(o.quantity)),
        settled: Some(SettledOrder {
            order_id: o.id.to_string(),
            rebuy: o.rebuy_after_expiry,
            max_per_user: o.max_per_user,
            gate: o.gate,
            ordered: o.accepted_at.into(),
            state: OrderState::of(o.status, o.overdue, o.pay_by, o.paid_at),
        }),
    }));
    Ok(lines)
}

/// The header's account part; a store failure here is the page's failure.
pub(super) async fn load_nav(
    req: &HttpRequest,
    state: &AppState,
) -> Result<(Nav, Option<crate::auth::AuthUser>), PageError> {
    Nav::load(req, &state.db)
        .await
        .map_err(|e| PageError::from_app(e, Nav::anonymous()))
}

/// 303 to the sign-in page, which returns to `back` (a fixed local path) after.
pub(super) fn to_signin(back: &'static str) -> HttpResponse {
    debug_assert!(is_local_path(back));
    let next = back.replace('/', "%2F");
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, format!("/signin?next={next}")))
        .finish()
}

#[cfg(test)]
mod tests {
    use super::is_local_path;

    #[test]
    fn only_paths_on_this_origin_are_local() {
        for good in [
            "/",
            "/sales/1",
            "/polls/2?x=1#y",
            "/%2F%2Fevil.example",
            "/a//b",
        ] {
            assert!(is_local_path(good), "{good:?}");
        }
        for bad in [
            "",
            "sales/1",
            "//evil.example",
            "/\\evil.example",
            "\\\\evil.example",
            "/\t/evil.example",
            "/\n/evil.example",
            "/\r/evil.example",
            "/\t\\evil.example",
            "https://evil.example/",
            "/\u{7f}/x",
            "/\u{85}/x",
        ] {
            assert!(!is_local_path(bad), "{bad:?}");
        }
    }
}
