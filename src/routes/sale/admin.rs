//! The admin's set-up of sales: create and list. A running sale's controls (stock,
//! open, close) are `controls.rs`; what sold is `sold.rs`; reconcile, repair and the
//! rehearsals' cleanup are `repair.rs`.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::Deserialize;

use crate::auth::AdminUser;
use crate::domain;
use crate::error::{AppError, ErrorBody, ErrorCode};
use crate::paging::ListScope;
use crate::routes::paged_json_with;
use crate::sale::cached::admin_page;
use crate::sale::draw::DrawFields;
use crate::sale::list::SaleCursor;
use crate::sale::queue::room::WaitingRoom;
use crate::sale::record;
use crate::sale::store::NewSale;
use crate::sale::{self, lifecycle};
use crate::state::AppState;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateSale {
    name: String,
    #[serde(default)]
    description: String,
    price_cents: i64,
    stock: i64,
    /// When the sale opens. Required, except for a draw sale, whose start is its
    /// draw: send `draw_at` (or the same time in both).
    #[serde(default)]
    starts_at: Option<DateTime<Utc>>,
    ends_at: DateTime<Utc>,
    /// The picture: an `https://` address or a path on this site (`/static/...`);
    /// blank or absent for none (pages show a placeholder).
    #[serde(default)]
    image_url: Option<String>,
    /// Every purchase must carry a ticket from `POST /api/sales/{id}/ticket`, which
    /// is issued only once the sale is open: a bot firing before the opening gets
    /// nothing. Default true; fixed once the sale exists.
    #[serde(default = "yes")]
    #[schema(default = true)]
    requires_ticket: bool,
    /// Seconds a buyer has to pay (`POST /api/orders/{id}/pay`) once the order is
    /// accepted; an order not paid by then expires and its unit goes back on sale.
    /// 0 (the default): no payment step. At most 86400. Fixed once the sale exists.
    #[serde(default)]
    #[schema(default = 0, minimum = 0, maximum = 86400)]
    payment_window_s: i64,
    /// Whether a buyer whose order expired unpaid may buy again. Default false: the
    /// unit goes back on sale for others only. Fixed once the sale exists.
    #[serde(default)]
    #[schema(default = false)]
    rebuy_after_expiry: bool,
    /// Most units one customer may buy (a purchase may ask for several, all or
    /// nothing). Default 1; at most 100. Fixed once the sale exists.
    #[serde(default = "one")]
    #[schema(default = 1, minimum = 1, maximum = 100)]
    max_per_user: i64,
    /// A rehearsal (`stampede load` makes its sales so): never on a public page or
    /// list, buyable by anyone who knows its id, removed with its orders by
    /// `POST /api/admin/rehearsals/cleanup`. Default false; fixed once the sale exists.
    #[serde(default)]
    #[schema(default = false)]
    rehearsal: bool,
    /// A waiting room (a fair line at the opening): shoppers join it from
    /// `queue_opens_at` (`POST /api/sales/{id}/queue`), those who joined before
    /// `starts_at` are put in a random order, later ones follow in arrival order,
    /// and from the opening they are admitted at `admit_per_second`; only an
    /// admitted shopper buys (the sale then requires a ticket: an admission is one).
    /// Default false; fixed once the sale opens.
    #[serde(default)]
    #[schema(default = false)]
    waiting_room: bool,
    /// With a waiting room: when its line opens, at or before `starts_at`.
    #[serde(default)]
    queue_opens_at: Option<DateTime<Utc>>,
    /// With a waiting room: shoppers admitted a second from the opening, 1 to 100000.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100000)]
    admit_per_second: Option<i64>,
    /// Leading zero bits of a proof of work asked with the purchase ticket and
    /// the waiting room's join (`GET /api/sales/{id}/challenge`, then the
    /// `Proof-Of-Work` header): 0 (the default, off) to 24; only on a sale that
    /// requires a ticket or has a waiting room. Else 422 `invalid_fairness`.
    #[schema(value_type = Option<i32>, minimum = 0, maximum = 24)]
    #[serde(default)]
    proof_of_work: Option<serde_json::Value>,
    /// Least age of an account that may join, take a ticket or buy, in seconds
    /// before the opening (or before the request, when later): 0 (the default,
    /// off) to 31622400 (366 days). Else 422 `invalid_fairness`.
    #[schema(value_type = Option<i32>, minimum = 0, maximum = 31622400)]
    #[serde(default)]
    min_account_age_s: Option<serde_json::Value>,
    /// `first_come` (the default: the first to buy get the units) or `draw`:
    /// shoppers enter (`POST /api/sales/{id}/entry`) from `entries_open_at` until
    /// `draw_at`, and the draw's winners buy (see "Draw sales" in docs/api.md).
    /// Fixed at creation; a draw cannot also have a waiting room.
    #[serde(default)]
    mode: record::SaleMode,
    /// A draw: when entries open, before `draw_at`. Editable until then.
    #[serde(default)]
    entries_open_at: Option<DateTime<Utc>>,
    /// A draw: when it is drawn (the sale's `starts_at`). Editable until entries open.
    #[serde(default)]
    draw_at: Option<DateTime<Utc>>,
    /// A draw: seconds each winner has to buy before the win passes to the next
    /// entry, 60 to 86400 (default 900). Editable until entries open.
    #[serde(default)]
    #[schema(minimum = 60, maximum = 86400)]
    claim_window_s: Option<i64>,
}

fn one() -> i64 {
    1
}

fn yes() -> bool {
    true
}

impl CreateSale {
    fn validate(self) -> Result<NewSale, AppError> {
        let name = domain::parse_line("name", &self.name, 200)?;
        let description = domain::parse_text("description", &self.description, 5000, true)?;
        let price_cents = domain::parse_price(self.price_cents)?;
        let stock = domain::parse_stock("stock", self.stock)?;
        let image_url = domain::parse_image_url(self.image_url.as_deref())?;
        let payment_window_s = domain::parse_payment_window(self.payment_window_s)?;
        let max_per_user = domain::parse_max_per_user(self.max_per_user)?;
        let (starts_at, draw) = DrawFields {
            starts_at: self.starts_at,
            draw_at: self.draw_at,
            entries_open_at: self.entries_open_at,
            claim_window_s: self.claim_window_s,
        }
        .settle(self.mode, self.waiting_room)?;
        let starts_at = starts_at
            .ok_or_else(|| AppError::new(ErrorCode::InvalidBody, "missing field `starts_at`"))?;
        lifecycle::check_window(starts_at, self.ends_at)?;
        let waiting_room = if self.waiting_room {
            Some(WaitingRoom::check(
                self.queue_opens_at,
                self.admit_per_second,
                starts_at,
            )?)
        } else if self.queue_opens_at.is_some() || self.admit_per_second.is_some() {
            return Err(AppError::new(
                ErrorCode::InvalidWaitingRoom,
                "queue_opens_at and admit_per_second go with waiting_room: true",
            ));
        } else {
            None
        };
        let fairness = crate::gate::FairnessFields {
            proof_of_work: self.proof_of_work,
            min_account_age_s: self.min_account_age_s,
        }
        .parse()?;
        let proof_of_work = fairness.proof_of_work.unwrap_or(0);
        // A draw sale always asks for a ticket (a win's).
        let ticketed = self.requires_ticket || draw.is_some();
        crate::gate::check_sale_proof(proof_of_work, ticketed, waiting_room.is_some())?;
        Ok(NewSale {
            name,
            description,
            price_cents,
            stock,
            starts_at,
            ends_at: self.ends_at,
            image_url,
            requires_ticket: self.requires_ticket,
            payment_window_s,
            rebuy_after_expiry: self.rebuy_after_expiry,
            max_per_user,
            rehearsal: self.rehearsal,
            waiting_room,
            proof_of_work,
            min_account_age_s: fairness.min_account_age_s.unwrap_or(0),
            draw,
        })
    }
}

/// Creates a sale.
#[utoipa::path(post, path = "/api/admin/sales", tag = "admin", request_body = CreateSale, security(("bearer" = [])), responses(
    (status = 201, description = "The new sale", body = record::SaleView),
    (status = 422, description = "A field that fails validation (`invalid_text`, `invalid_price`, `invalid_stock`, `invalid_window`, `invalid_waiting_room`, `invalid_draw`, `invalid_fairness`, ...) or `invalid_body`", body = ErrorBody<'static>),
))]
pub(super) async fn admin_create(
    state: web::Data<AppState>,
    AdminUser(admin): AdminUser,
    body: crate::routes::extract::JsonObject<CreateSale>,
) -> Result<HttpResponse, AppError> {
    let new = body.into_inner().validate()?;
    let view = sale::admin::create(state.get_ref(), new, admin.id).await?;
    state.wake.catalog_changed();
    tracing::info!(sale = %view.sale.id, admin = %admin.id, "sale created");
    Ok(HttpResponse::Created().json(view))
}

/// The admin's list query: a page, and which sales.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct AdminListQuery {
    /// Items per page: a whole number from 1 to 200 (default 50); else 400 `invalid_limit`.
    #[param(value_type = Option<u16>, minimum = 1, maximum = 200)]
    limit: Option<String>,
    /// Where the page starts: the `X-Next-Cursor` of the page before (opaque).
    cursor: Option<String>,
    /// `all` (the default: every sale not archived), `live` (open, sold out or
    /// not), `upcoming`, `ended` (or closed early) or `archived`; else 400
    /// `invalid_query`.
    filter: Option<String>,
}

/// A page of sales with live stock, in the order of `GET /api/sales`, rehearsals
/// and archived sales included by `filter`.
#[utoipa::path(get, path = "/api/admin/sales", tag = "admin", params(AdminListQuery), security(("bearer" = [])), responses(
    (status = 200, description = "A page of sales; the next page in `Link` and `X-Next-Cursor`, as `GET /api/sales`", body = [record::SaleView], headers(
        ("Link" = String, description = "`</api/admin/sales?limit=50&filter=all&cursor=...>; rel=\"next\"`: the next page"),
        ("X-Next-Cursor" = String, description = "The `cursor` of the next page"))),
    (status = 400, description = "`invalid_limit` (not 1 to 200) or `invalid_query` (an unknown filter, or a cursor this server did not issue for this list)", body = ErrorBody<'static>),
))]
pub(super) async fn admin_list(
    req: HttpRequest,
    state: web::Data<AppState>,
    _: AdminUser,
    query: web::Query<AdminListQuery>,
) -> Result<HttpResponse, AppError> {
    let limit = crate::paging::Limit::parse(query.limit.as_deref())?;
    let after = query.cursor.as_deref().map(SaleCursor::parse).transpose()?;
    let scope = ListScope::parse_filter(query.filter.as_deref())?;
    let page = admin_page(state.get_ref(), after.as_ref(), limit, scope).await?;
    let extra = format!("&filter={}", scope.as_str());
    Ok(paged_json_with(&req, limit, page, &extra))
}
