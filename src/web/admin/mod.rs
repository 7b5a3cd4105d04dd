//! The admin pages: the sale-day console, create sales, change stock, open and
//! close; create and close polls; a sale's and a poll's own page, a sale's orders. The page only shows; its buttons call the admin JSON API
//! (`/api/admin/...`) from `app.js`.

mod console;
mod history;
pub(super) mod list;
pub(super) mod orders;
pub(super) mod poll;
pub(super) mod sale;

use actix_web::{HttpRequest, HttpResponse};

use super::error::PageError;
use super::pages::{load_nav, to_signin};
use super::view::Nav;
use crate::state::AppState;

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
