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
pub mod health;
pub mod sale;
pub mod vote;
