//! Browser pages: askama templates (`templates/`), native ES modules and one style
//! sheet (`static/`: `app.js` is the entry, which runs the page's controller from
//! `static/js/` by the body's `data-page`). Pages only read; every state change goes
//! through the JSON API (`static/js/api.js`), so CSRF and validation live in one
//! place.
//!
//! Pages answer errors as HTML pages (404, 403, 503), never as JSON, and carry a
//! strict Content-Security-Policy: no inline script or style (modules from `'self'`
//! only), so page data travels in `data-` attributes that the scripts read.

mod admin;
mod draw;
mod error;
mod pages;
mod polls;
mod view;

use std::path::PathBuf;

use actix_web::http::header;
use actix_web::middleware::DefaultHeaders;
use actix_web::{HttpRequest, HttpResponse, Responder, web};

pub use error::PageError;

/// Sent on every page. `'self'` only: the pages load nothing from elsewhere and run
/// no inline script, which is what makes an escaping slip hard to exploit.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data: https:; connect-src 'self'; object-src 'none'; \
     base-uri 'self'; form-action 'self'; frame-ancestors 'none'";

pub fn configure(cfg: &mut web::ServiceConfig) {
    page(cfg, "/", pages::index);
    page(cfg, "/sales/{id}", pages::sale);
    page(cfg, "/sales/{id}/draw", draw::page);
    page(cfg, "/polls", polls::index);
    page(cfg, "/polls/{id}", polls::poll);
    page(cfg, "/signin", pages::signin);
    page(cfg, "/signup", pages::signup);
    page(cfg, "/me/orders", pages::my_orders);
    page(cfg, "/admin", admin::list::page);
    page(cfg, "/admin/sales/{id}", admin::sale::page);
    page(cfg, "/admin/sales/{id}/orders", admin::orders::sale_orders);
    page(cfg, "/admin/polls/{id}", admin::poll::poll_tallies);
    cfg.service(
        web::scope("/static")
            .wrap(
                DefaultHeaders::new()
                    .add((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
                    // Revalidate every time (a cheap 304 thanks to the ETag), so a
                    // deploy never leaves browsers running an old module.
                    .add((header::CACHE_CONTROL, "no-cache")),
            )
            .service(actix_files::Files::new("", static_dir())),
    );
}

/// Registers a GET page with the security headers. The headers wrap the resource,
/// so error pages answered by the handler carry them too.
fn page<F, Args>(cfg: &mut web::ServiceConfig, path: &str, handler: F)
where
    F: actix_web::Handler<Args>,
    Args: actix_web::FromRequest + 'static,
    F::Output: Responder + 'static,
{
    cfg.service(
        web::resource(path)
            .wrap(security_headers())
            .wrap(actix_web::middleware::from_fn(fix_csrf_cookie))
            .route(web::get().to(handler)),
    );
}

/// A page answered to a cookie session whose CSRF cookie is not its session's
/// token (signed in before it was bound to the session) sets it right, so the
/// page's scripts send the one the API checks.
async fn fix_csrf_cookie(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody>,
) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error> {
    let fix = req
        .app_data::<web::Data<crate::state::AppState>>()
        .and_then(|state| {
            crate::auth::csrf_cookie_fix(req.request(), &state.tokens, state.config.cookie_secure)
        });
    let mut res = next.call(req).await?;
    if let Some(cookie) = fix {
        res.response_mut().add_cookie(&cookie)?;
    }
    Ok(res)
}

/// The headers of every HTML answer.
const PAGE_HEADERS: [(header::HeaderName, &str); 5] = [
    (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::REFERRER_POLICY, "same-origin"),
    (header::X_FRAME_OPTIONS, "DENY"),
    // Pages show who is signed in: never keep them in a shared cache.
    (header::CACHE_CONTROL, "no-store"),
];

fn security_headers() -> DefaultHeaders {
    PAGE_HEADERS
        .into_iter()
        .fold(DefaultHeaders::new(), |headers, pair| headers.add(pair))
}

/// `static/` under the working directory (the container's `/app/static`), else the
/// one next to `Cargo.toml`, so `cargo run` and the tests find it from anywhere.
fn static_dir() -> PathBuf {
    let local = PathBuf::from("static");
    if local.join("app.js").is_file() {
        local
    } else {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/static"))
    }
}

/// The server's answer to a path no route knows: an HTML page for a browser
/// navigating outside `/api`, the usual JSON error for everything else.
pub async fn fallback(req: HttpRequest) -> HttpResponse {
    let wants_html = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"));
    if wants_html && !req.path().starts_with("/api/") {
        let mut resp = actix_web::ResponseError::error_response(&PageError::not_found(
            view::Nav::anonymous(),
            "There is no page at this address.",
        ));
        for (name, value) in PAGE_HEADERS {
            resp.headers_mut()
                .insert(name, header::HeaderValue::from_static(value));
        }
        resp
    } else {
        let mut resp = actix_web::ResponseError::error_response(
            &crate::error::AppError::not_found("no such route"),
        );
        // As every answer of the API's scope: a JSON error is never sniffed.
        resp.headers_mut().insert(
            header::X_CONTENT_TYPE_OPTIONS,
            header::HeaderValue::from_static("nosniff"),
        );
        resp
    }
}
