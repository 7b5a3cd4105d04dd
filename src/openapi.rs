//! `GET /api/openapi.json`: the API described by an OpenAPI 3.1 document that utoipa
//! generates from the handlers' `#[utoipa::path]` attributes and the `ToSchema`
//! types they answer with. The answers every route shares (400 for a malformed id or
//! body, 401 and 403 for the token, 503 with `Retry-After` when a store is not
//! ready) are added by [`CommonAnswers`] from what each operation declares
//! (parameters, body, security), so no handler can forget them.
//! `tests/api/openapi.rs` fails when a route the server serves is missing here, or
//! when the document lists one it does not serve.

use std::sync::LazyLock;

use actix_web::{HttpResponse, http::header};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    self, Content, Object, Ref, RefOr, Response, Type, header::Header, path::Operation,
};
use utoipa::{Modify, OpenApi};

crate::routes::routes! {
    pub fn configure, pub const ROUTES; mounted "/api";
    get "/openapi.json" => document,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Stampede",
        description = "Flash-sale and voting backend. Every error answers \
            `{\"error\": code, \"message\": text}`; a 503 carries `Retry-After`.",
    ),
    paths(document),
    components(schemas(crate::error::ErrorBody))
)]
struct Meta;

/// The whole document: each route group's own `Api` (its handlers' attributes),
/// merged, then the shared answers added.
pub fn document_value() -> openapi::OpenApi {
    let mut doc = Meta::openapi();
    doc.merge(crate::routes::health::Api::openapi());
    doc.merge(crate::routes::auth::Api::openapi());
    doc.merge(crate::routes::sale::Api::openapi());
    doc.merge(crate::routes::vote::Api::openapi());
    doc.merge(crate::routes::challenge::Api::openapi());
    CommonAnswers.modify(&mut doc);
    doc
}

/// The document, rendered once.
static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    document_value()
        .to_json()
        .expect("the OpenAPI document serializes")
});

/// This document.
#[utoipa::path(
    get,
    path = "/api/openapi.json",
    tag = "meta",
    responses((status = 200, description = "This OpenAPI 3.1 document", content_type = "application/json", body = Object)),
)]
pub async fn document() -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "application/json"))
        .body(DOCUMENT.as_str())
}

/// The security scheme name used by the handlers' `security(("bearer" = []))`.
pub const BEARER: &str = "bearer";

/// Adds the bearer scheme and the answers shared by many operations.
struct CommonAnswers;

impl Modify for CommonAnswers {
    fn modify(&self, doc: &mut openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The token of POST /api/auth/signin. Browsers send the session \
                         cookie instead, and echo the stampede_csrf cookie in \
                         X-CSRF-Token on every POST.",
                    ))
                    .build(),
            ),
        );
        for (path, item) in doc.paths.paths.iter_mut() {
            let stores = path.starts_with("/api/") && path != "/api/openapi.json";
            if let Some(op) = item.get.as_mut() {
                add_common(op, stores, false);
            }
            for op in [
                item.post.as_mut(),
                item.patch.as_mut(),
                item.delete.as_mut(),
            ]
            .into_iter()
            .flatten()
            {
                add_common(op, stores, true);
            }
        }
    }
}

fn add_common(op: &mut Operation, stores: bool, is_post: bool) {
    let has_params = op.parameters.as_ref().is_some_and(|p| !p.is_empty());
    let has_body = op.request_body.is_some();
    let signed_in = op.security.as_ref().is_some_and(|s| !s.is_empty());
    let admin = op
        .tags
        .as_ref()
        .is_some_and(|t| t.iter().any(|t| t == "admin"));
    let responses = &mut op.responses.responses;
    let mut add = |status: &str, response: Response| {
        responses
            .entry(status.to_string())
            .or_insert(RefOr::T(response));
    };
    if has_params || has_body {
        add(
            "400",
            error(
                "Malformed request: `invalid_id` (an id that is not a positive integer), \
                 `invalid_json`, `invalid_path`, `invalid_query`, `invalid_limit`",
            ),
        );
    }
    if has_body {
        add(
            "413",
            error("`payload_too_large`: the body is larger than `max_body_bytes`"),
        );
        add(
            "415",
            error("`unsupported_media_type`: send the body as application/json"),
        );
        add(
            "422",
            error(
                "`invalid_body` (wrong types, unknown or missing fields) or a field that fails validation",
            ),
        );
    }
    if signed_in {
        add(
            "401",
            error("`unauthorized`, `invalid_token`, `token_expired`, `session_ended`: sign in"),
        );
        if admin || is_post {
            add(
                "403",
                error(
                    "`forbidden` (this needs an admin account) or `csrf_failed` (a cookie \
                     session without the X-CSRF-Token header)",
                ),
            );
        }
    }
    if stores {
        add(
            "503",
            with_retry_after(error(
                "Redis or Postgres is not ready (`redis_unavailable`, `database_unavailable`), \
                 or the sale or poll is being rebuilt from Postgres (`recovering`, `busy`)",
            )),
        );
    }
}

/// A response whose body is the JSON error.
pub fn error(description: &str) -> Response {
    let mut response = Response::new(description);
    response.content.insert(
        "application/json".to_string(),
        Content::new(Some(Ref::from_schema_name("ErrorBody"))),
    );
    response
}

pub fn with_retry_after(mut response: Response) -> Response {
    let mut retry = Header::new(Object::with_type(Type::Integer));
    retry.description = Some("Seconds to wait before trying again".to_string());
    response.headers.insert("Retry-After".to_string(), retry);
    response
}
