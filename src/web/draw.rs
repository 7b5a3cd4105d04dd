//! "How this draw was made" (`/sales/{id}/draw`): a draw sale's commitment from
//! the start; after the draw the page's script (`js/draw-proof.js`) shows the
//! published seed and winners and checks them in the browser.

use actix_web::{HttpRequest, web};
use askama::Template;
use askama_web::WebTemplate;

use super::error::PageError;
use super::pages::{load_card, load_nav};
use super::view::{DrawFacts, Nav, SaleCard};
use crate::domain::SaleId;
use crate::state::AppState;

#[derive(Template, WebTemplate)]
#[template(path = "draw.html")]
pub struct DrawPage {
    nav: Nav,
    sale: SaleCard,
    draw: DrawFacts,
    /// This server's address as the visitor reached it, for the CLI command.
    url: String,
    server_now_ms: i64,
}

pub async fn page(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<DrawPage, PageError> {
    let (nav, user) = load_nav(&req, &state).await?;
    let Ok(id) = SaleId::parse(&path) else {
        return Err(PageError::not_found(
            nav,
            "Sale addresses end in a number, like /sales/1/draw.",
        ));
    };
    let admin = user.as_ref().is_some_and(|u| u.admin);
    let mut sale = match load_card(&state, id, admin).await {
        Ok(Some(card)) => card,
        Ok(None) => return Err(PageError::not_found(nav, "There is no such sale.")),
        Err(e) => return Err(PageError::from_app(e, nav)),
    };
    let Some(draw) = sale.draw.take() else {
        return Err(PageError::not_found(
            nav,
            "This sale sells to the first who buy: it has no draw.",
        ));
    };
    let info = req.connection_info();
    let url = format!("{}://{}", info.scheme(), info.host());
    Ok(DrawPage {
        nav,
        sale,
        draw,
        url,
        server_now_ms: chrono::Utc::now().timestamp_millis(),
    })
}
