//! One table per route group that both registers the routes and lists them, so the
//! OpenAPI test (`tests/api/openapi.rs`) compares the document with exactly what the
//! server serves, not with a second list kept by hand.

/// `routes! { pub fn configure, pub const ROUTES; post "/sales" => create, ... }`
/// defines `configure` (each line becomes `cfg.route(path, web::post().to(create))`)
/// and `ROUTES`, the `(method, path)` pairs in the same order, methods lower-case as
/// OpenAPI spells them.
macro_rules! routes {
    ($vis:vis fn $configure:ident, $lvis:vis const $list:ident;
     $($method:ident $path:literal => $handler:path),* $(,)?) => {
        /// The routes of this group, as `(method, path)` relative to the group's
        /// scope; registered by the `configure` beside it.
        $lvis const $list: &[(&str, &str)] = &[$((stringify!($method), $path)),*];

        /// Registers this group's routes (see the `ROUTES` list beside it).
        $vis fn $configure(cfg: &mut actix_web::web::ServiceConfig) {
            $(cfg.route($path, actix_web::web::$method().to($handler));)*
        }
    };
}

pub(crate) use routes;

pub mod auth;
pub mod health;
pub mod sale;
pub mod vote;
