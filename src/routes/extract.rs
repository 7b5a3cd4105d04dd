//! The `AuthUser` / `AdminUser` extractors, which take the token key and the
//! sessions from the application state and run [`auth::authenticate`]: no I/O.

use actix_web::{FromRequest, HttpRequest, dev::Payload, web};
use futures_util::future::{Ready, ready};

use crate::auth::token::Claims;
use crate::auth::{self, AdminUser, AuthUser};
use crate::error::{AppError, ErrorCode};
use crate::state::AppState;

impl AuthUser {
    /// The caller of `req`, checked as the extractor checks it (for a handler that
    /// answers some requests before it looks at who asks).
    pub fn of(req: &HttpRequest) -> Result<AuthUser, AppError> {
        authenticate(req).map(|(user, _)| user)
    }
}

impl FromRequest for AuthUser {
    type Error = AppError;
    type Future = Ready<Result<Self, AppError>>;

    /// No I/O: the token is checked here and its session in this process's memory,
    /// so the buy path's extractor is ready at once.
    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(authenticate(req).map(|(user, _)| user))
    }
}

impl FromRequest for AdminUser {
    type Error = AppError;
    type Future = Ready<Result<Self, AppError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(authenticate(req).and_then(|(user, _)| {
            if user.admin {
                Ok(AdminUser(user))
            } else {
                Err(AppError::new(
                    ErrorCode::Forbidden,
                    "this needs an admin account",
                ))
            }
        }))
    }
}

/// The caller, if any valid token of a standing session came with the request
/// (pages use this). A store failure is the caller's failure, not "signed out".
pub fn optional_user(req: &HttpRequest) -> Result<Option<AuthUser>, AppError> {
    match authenticate(req) {
        Ok((user, _)) => Ok(Some(user)),
        Err(e @ (AppError::Redis(_) | AppError::Database(_) | AppError::Internal(_))) => Err(e),
        Err(_) => Ok(None),
    }
}

/// The caller as a poll's results see them (polls import nothing of `auth`).
impl From<Option<AuthUser>> for crate::vote::visibility::Viewer {
    fn from(user: Option<AuthUser>) -> Self {
        use crate::vote::visibility::Viewer;
        match user {
            Some(u) if u.admin => Viewer::Admin,
            Some(u) => Viewer::User(u.id),
            None => Viewer::Anyone,
        }
    }
}

pub(super) fn app_state(req: &HttpRequest) -> Result<&web::Data<AppState>, AppError> {
    req.app_data::<web::Data<AppState>>()
        .ok_or_else(|| AppError::Internal(anyhow::anyhow!("app state missing")))
}

/// The shared state and this worker's, borrowed from the request: for the storm's
/// routes (the purchase, the vote), where a `web::Data` extractor would clone the
/// shared state's `Arc`, one cache line every worker thread then writes twice a
/// request.
pub(crate) fn state_and_worker(
    req: &HttpRequest,
) -> Result<(&web::Data<AppState>, &web::Data<crate::state::Worker>), AppError> {
    let worker = req
        .app_data::<web::Data<crate::state::Worker>>()
        .ok_or_else(|| AppError::Internal(anyhow::anyhow!("worker state missing")))?;
    Ok((app_state(req)?, worker))
}

/// This worker's own Redis connection when there is one, else the shared one.
pub(super) fn redis_of(req: &HttpRequest, state: &AppState) -> crate::redis_conn::Redis {
    match req.app_data::<web::Data<crate::state::Worker>>() {
        Some(worker) => worker.redis.clone(),
        None => state.redis.clone(),
    }
}

/// The caller's token checked against this process's keys and sessions (see
/// [`auth::authenticate`]).
pub(super) fn authenticate(req: &HttpRequest) -> Result<(AuthUser, Claims), AppError> {
    let state = app_state(req)?;
    auth::authenticate(req, &state.tokens, &state.sessions)
        .map_err(|e| with_csrf_fix(e, req, state))
}

/// A `csrf_failed` answer to a cookie session whose CSRF cookie is not its
/// session's token (a page opened before the token was bound to the session, or a
/// sign-in on a server of the version before, during a rolling upgrade) sets it
/// right: the page's script (`static/js/api.js`) sends the request again once,
/// with the token from the cookie now.
pub(super) fn with_csrf_fix(e: AppError, req: &HttpRequest, state: &AppState) -> AppError {
    if e.error_code() != ErrorCode::CsrfFailed {
        return e;
    }
    match auth::csrf_cookie_fix(req, &state.tokens, state.config.cookie_secure) {
        Some(cookie) => e.with_header(actix_web::http::header::SET_COOKIE, cookie.to_string()),
        None => e,
    }
}

/// `web::Json` for a body that must be a JSON object (see [`crate::conn::Object`]):
/// the same limits and answers (the server's `JsonConfig`), and an array of the
/// fields in order is 422 `invalid_body`.
pub struct JsonObject<T>(pub T);

impl<T> JsonObject<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> std::ops::Deref for JsonObject<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: serde::de::DeserializeOwned + 'static> FromRequest for JsonObject<T> {
    type Error = actix_web::Error;
    type Future = futures_util::future::LocalBoxFuture<'static, Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let body = web::Json::<crate::conn::Object<T>>::from_request(req, payload);
        Box::pin(async move { Ok(JsonObject(body.await?.into_inner().0)) })
    }
}
