//! One table per route group that both registers the routes and lists them, so the
//! OpenAPI test (`tests/api/openapi.rs`) compares the document with exactly what the
//! server serves, not with a second list kept by hand.

/// `routes! { pub fn configure, pub const ROUTES; mounted "/api"; post "/sales" => create, ... }`
/// defines `configure` (each line becomes a resource for that path and method,
/// `web::post().to(create)`) and `ROUTES`, the `(method, path)` pairs in the same
/// order, methods lower-case as OpenAPI spells them. `mounted` is where the group's
/// scope is: each resource carries its whole pattern as a [`RouteLabel`]
/// (`crate::metrics::RouteLabel`), which the request metrics read instead of
/// matching the path against every pattern again.
macro_rules! routes {
    ($vis:vis fn $configure:ident, $lvis:vis const $list:ident; mounted $mount:literal;
     $($method:ident $path:literal => $handler:path),* $(,)?) => {
        /// The routes of this group, as `(method, path)` relative to the group's
        /// scope; registered by the `configure` beside it.
        $lvis const $list: &[(&str, &str)] = &[$((stringify!($method), $path)),*];

        /// Registers this group's routes (see the `ROUTES` list beside it): one
        /// resource per line, guarded by its method like `cfg.route` does, so
        /// several methods of one path are several resources.
        $vis fn $configure(cfg: &mut actix_web::web::ServiceConfig) {
            $(cfg.service(
                actix_web::web::resource($path)
                    .guard(actix_web::guard::Method($crate::routes::http_method!($method)))
                    .app_data($crate::metrics::RouteLabel(concat!($mount, $path)))
                    .route(actix_web::web::$method().to($handler)),
            );)*
        }
    };
}

/// The `http::Method` of a `routes!` line's method.
macro_rules! http_method {
    (get) => {
        actix_web::http::Method::GET
    };
    (post) => {
        actix_web::http::Method::POST
    };
    (put) => {
        actix_web::http::Method::PUT
    };
    (patch) => {
        actix_web::http::Method::PATCH
    };
    (delete) => {
        actix_web::http::Method::DELETE
    };
}

pub(crate) use http_method;
pub(crate) use routes;

pub mod auth;
pub mod challenge;
mod extract;
pub mod fair;
pub mod health;
pub mod sale;
pub mod vote;

/// The query of a paged list: `?limit=` (1 to 200, default 50) and `?cursor=`
/// (from the previous page's `X-Next-Cursor`, or its `Link` header).
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PageQuery {
    /// Items per page: a whole number from 1 to 200 (default 50); else 400 `invalid_limit`.
    #[param(value_type = Option<u16>, minimum = 1, maximum = 200)]
    limit: Option<String>,
    /// Where the page starts: the `X-Next-Cursor` of the page before (opaque); none
    /// for the first page. One not issued for this list is 400 `invalid_query`.
    cursor: Option<String>,
}

impl PageQuery {
    /// The page size asked for (400 `invalid_limit` when out of range) and the
    /// cursor, parsed by the list's own `parse` (400 `invalid_query` when malformed).
    pub(crate) fn parse<C>(
        &self,
        parse_cursor: impl FnOnce(&str) -> Result<C, crate::error::AppError>,
    ) -> Result<(crate::paging::Limit, Option<C>), crate::error::AppError> {
        let limit = crate::paging::Limit::parse(self.limit.as_deref())?;
        let cursor = self.cursor.as_deref().map(parse_cursor).transpose()?;
        Ok((limit, cursor))
    }
}

/// A page of a list as JSON: the items as an array (the answer's shape from before
/// lists were paged), and where there is a next page, its address in
/// `Link: <...>; rel="next"` and its cursor in `X-Next-Cursor`.
pub(crate) fn paged_json<T: serde::Serialize>(
    req: &actix_web::HttpRequest,
    limit: crate::paging::Limit,
    page: crate::paging::Page<T>,
) -> actix_web::HttpResponse {
    paged_json_with(req, limit, page, "")
}

/// [`paged_json`] for a list with more in its query than the page: `extra`
/// (`&name=value...`, nothing in it to escape) goes into the next page's link.
pub(crate) fn paged_json_with<T: serde::Serialize>(
    req: &actix_web::HttpRequest,
    limit: crate::paging::Limit,
    page: crate::paging::Page<T>,
    extra: &str,
) -> actix_web::HttpResponse {
    let mut answer = actix_web::HttpResponse::Ok();
    if let Some(next) = &page.next {
        // Cursors are base64url: nothing in them needs escaping in a query.
        let link = format!(
            "<{}?limit={}{extra}&cursor={next}>; rel=\"next\"",
            req.path(),
            limit.get()
        );
        answer.insert_header((actix_web::http::header::LINK, link));
        answer.insert_header((NEXT_CURSOR, next.as_str()));
    }
    answer.json(page.items)
}

/// The header that carries the next page's cursor alone.
pub(crate) const NEXT_CURSOR: &str = "x-next-cursor";
