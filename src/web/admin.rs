//! The admin page: create sales, change stock, open and close. The page only shows;
//! its buttons call the admin JSON API (`/api/admin/...`) from `app.js`.

use actix_web::{Either, HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;

use super::error::PageError;
use super::pages::{list_cards, load_nav, to_signin};
use super::view::{Nav, SaleCard};
use crate::state::AppState;

#[derive(Template, WebTemplate)]
#[template(path = "admin.html")]
pub struct AdminPage {
    nav: Nav,
    sales: Vec<SaleCard>,
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
    match list_cards(&state).await {
        Ok(sales) => Ok(Either::Left(AdminPage { nav, sales })),
        Err(e) => Err(PageError::from_app(e, nav)),
    }
}
