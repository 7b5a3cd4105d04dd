//! The admin page: create sales, change stock, open and close; create and close
//! polls. The page only shows; its buttons call the admin JSON API
//! (`/api/admin/...`) from `app.js`.

use actix_web::{Either, HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;

use super::error::PageError;
use super::pages::{list_cards, load_nav, to_signin};
use super::polls;
use super::view::{Nav, PollCard, SaleCard};
use crate::state::AppState;
use crate::vote::{MAX_OPTIONS, MIN_OPTIONS};

#[derive(Template, WebTemplate)]
#[template(path = "admin.html")]
pub struct AdminPage {
    nav: Nav,
    sales: Vec<SaleCard>,
    polls: Vec<PollCard>,
    /// Bounds of the option list of the poll form.
    min_options: usize,
    max_options: usize,
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
    match tokio::try_join!(list_cards(&state), polls::list_cards(&state)) {
        Ok((sales, polls)) => Ok(Either::Left(AdminPage {
            nav,
            sales,
            polls,
            min_options: MIN_OPTIONS,
            max_options: MAX_OPTIONS,
        })),
        Err(e) => Err(PageError::from_app(e, nav)),
    }
}
