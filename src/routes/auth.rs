//! HTTP routes of accounts and sessions (sign-up, sign-in, sign-out, password
//! change). The `AuthUser` / `AdminUser` extractors are in `extract.rs`.

use actix_web::cookie::{Cookie, SameSite, time::Duration as CookieDuration};
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};

use crate::auth::token::Claims;
use crate::auth::{
    self, Credentials, DUMMY_HASH, SESSION_COOKIE, UserView, check_csrf, cleared_cookies,
    create_user, hash_password, verified_claims, verify_password,
};
use crate::domain::{Id, Password, Username};
use crate::error::{AppError, ErrorBody, ErrorCode};
use crate::limit::Route;
use crate::state::AppState;

// The callers the extractors produce (`extract.rs`): the pages take them from
// here, beside `optional_user`.
pub use super::extract::optional_user;
use super::extract::redis_of;
pub use crate::auth::AuthUser;

// Routes under `/api` (see `startup`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(signup, signin, signout, signout_all, me, change_password))]
pub(crate) struct Api;

super::routes! {
    pub fn configure, pub const ROUTES; mounted "/api";
    post "/auth/signup" => signup,
    post "/auth/signin" => signin,
    post "/auth/signout" => signout,
    post "/auth/signout-all" => signout_all,
    get "/me" => me,
    post "/me/password" => change_password,
}

#[derive(Serialize, utoipa::ToSchema)]
struct SigninResponse {
    /// Send as `Authorization: Bearer <token>`.
    token: String,
    /// Unix seconds.
    expires_at: i64,
    csrf_token: String,
    user: UserView,
}

/// Creates a shopper's account.
#[utoipa::path(post, path = "/api/auth/signup", tag = "auth", request_body = Credentials, responses(
    (status = 201, description = "The new user", body = UserView),
    (status = 409, description = "`username_taken`", body = ErrorBody<'static>),
    (status = 422, description = "`invalid_username`, `invalid_password`, `invalid_body`", body = ErrorBody<'static>),
    (status = 429, description = "`rate_limited`: too many sign-ups from this address", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"),
        ("RateLimit" = String), ("RateLimit-Policy" = String))),
    (status = 503, description = "`busy`: more sign-ins at once than hashing turns for 5 s", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"))),
))]
async fn signup(
    state: web::Data<AppState>,
    body: crate::routes::extract::JsonObject<Credentials>,
    req: HttpRequest,
) -> Result<HttpResponse, AppError> {
    let granted = state.limiter.check(Route::Signup, None, &req).await?;
    let body = body.into_inner();
    let username = Username::parse(&body.username)?;
    let password = Password::parse(body.password)?;
    let user = create_user(&state.db, &username, password, false).await?;
    tracing::info!(user_id = user.id, "user signed up");
    Ok(granted.attach(HttpResponse::Created().json(user)))
}

/// Signs in: a token for `Authorization: Bearer`, and the session and CSRF cookies.
#[utoipa::path(post, path = "/api/auth/signin", tag = "auth", request_body = Credentials, responses(
    (status = 200, description = "Signed in; also sets the `stampede_session` and `stampede_csrf` cookies", body = SigninResponse),
    (status = 401, description = "`bad_credentials`: wrong username or password", body = ErrorBody<'static>),
    (status = 429, description = "`rate_limited`: too many sign-ins", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"),
        ("RateLimit" = String), ("RateLimit-Policy" = String))),
    (status = 503, description = "`busy`: more sign-ins at once than hashing turns for 5 s", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"))),
))]
#[tracing::instrument(skip_all)]
async fn signin(
    state: web::Data<AppState>,
    body: crate::routes::extract::JsonObject<Credentials>,
    req: HttpRequest,
) -> Result<HttpResponse, AppError> {
    // Every attempt counts, right or wrong: that is what stops password guessing.
    let granted = state.limiter.check(Route::Signin, None, &req).await?;
    let body = body.into_inner();
    let wrong = || AppError::new(ErrorCode::BadCredentials, "wrong username or password");
    // A malformed username cannot exist; still answer the same way as a wrong one.
    let username = Username::parse(&body.username).map_err(|_| wrong())?;
    if body.password.len() > 1024 {
        return Err(wrong());
    }
    let row = auth::account(&state.db, &username).await?;
    // An account without a password (a load test's shopper) answers as a wrong
    // one, after the same hash: never a 500, nor a faster answer that names it.
    let (hash, found) = match &row {
        Some(account) if auth::has_password(&account.password_hash) => {
            (account.password_hash.clone(), true)
        }
        _ => (DUMMY_HASH.to_string(), false),
    };
    let ok = verify_password(hash, body.password).await?;
    let Some(auth::Account {
        id,
        admin: is_admin,
        session_gen: generation,
        created_at,
        ..
    }) = row.filter(|_| ok && found)
    else {
        return Err(wrong());
    };
    let user_id = Id::new(id).ok_or_else(|| AppError::Internal(anyhow::anyhow!("bad user id")))?;
    let expires_at = chrono::Utc::now().timestamp() + state.config.token_ttl.as_secs() as i64;
    let claims = Claims {
        user_id,
        admin: is_admin,
        expires_at,
        generation,
        session: rand::random(),
        account_created: Some(created_at),
    };
    let csrf = state.tokens.csrf_of(&claims);
    let token = state.tokens.issue(claims);
    let max_age = CookieDuration::seconds(state.config.token_ttl.as_secs() as i64);
    let session = Cookie::build(SESSION_COOKIE, token.clone())
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(state.config.cookie_secure)
        .max_age(max_age)
        .finish();
    let csrf_cookie = auth::csrf_cookie(
        csrf.clone(),
        state.config.cookie_secure,
        state.config.token_ttl.as_secs() as i64,
    );
    tracing::info!(user_id = id, "user signed in");
    let resp = HttpResponse::Ok()
        // The answer carries the token: never kept by a cache.
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .cookie(session)
        .cookie(csrf_cookie)
        .json(SigninResponse {
            token,
            expires_at,
            csrf_token: csrf,
            user: UserView {
                id,
                username: username.as_str().to_string(),
                is_admin,
            },
        });
    Ok(granted.attach(resp))
}

/// Ends this session: its token stops working on every instance (on the others as
/// soon as they read the announcement, a Redis round trip later), and the cookies
/// are cleared. Without a valid
/// token there is nothing to end and the answer is the same 204. A browser session
/// must echo its CSRF cookie, so another site cannot sign people out.
#[utoipa::path(post, path = "/api/auth/signout", tag = "auth", responses(
    (status = 204, description = "This session ended (when the token was valid); cookies cleared"),
    (status = 403, description = "`csrf_failed`: a cookie session without the X-CSRF-Token header", body = ErrorBody<'static>),
))]
async fn signout(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, AppError> {
    // A cookie session's sign-out must carry its session's CSRF token (checked by
    // verified_claims); a cookie whose token does not verify ends nothing, and is
    // held to the cookie's echo only. Any other failure is a token that does not
    // work anyway: nothing to end. A session already ended (signed out, or every
    // session of the account) has nothing more to end: the same 204, and no write,
    // so a replayed sign-out costs Postgres and every server's followers nothing.
    let claims = match verified_claims(&req, &state.tokens) {
        Ok(claims) => Some(claims),
        Err(e) if e.error_code() == ErrorCode::CsrfFailed => {
            return Err(super::extract::with_csrf_fix(e, &req, &state));
        }
        Err(_) => {
            if req.headers().get(header::AUTHORIZATION).is_none()
                && req.cookie(SESSION_COOKIE).is_some()
            {
                check_csrf(&req)?;
            }
            None
        }
    };
    if let Some(claims) = claims
        && state.sessions.standing(&claims) == crate::auth::session::Standing::Valid
    {
        let mut redis = redis_of(&req, &state);
        state
            .sessions
            .sign_out(&mut redis, &state.db, &claims)
            .await?;
        tracing::info!(user_id = claims.user_id.get(), "user signed out");
    }
    Ok(cleared_cookies(HttpResponse::NoContent()))
}

/// Ends every session of the caller's account, this one included.
#[utoipa::path(post, path = "/api/auth/signout-all", tag = "auth", security(("bearer" = [])), responses(
    (status = 204, description = "Every session of the account ended; cookies cleared"),
))]
async fn signout_all(
    req: HttpRequest,
    state: web::Data<AppState>,
    user: AuthUser,
) -> Result<HttpResponse, AppError> {
    let generation = auth::next_session_gen(&state.db, user.id)
        .await?
        .ok_or_else(|| AppError::new(ErrorCode::Unauthorized, "this account no longer exists"))?;
    state
        .sessions
        .end_all(&mut redis_of(&req, &state), user.id, generation)
        .await?;
    tracing::info!(user_id = user.id.get(), "every session ended");
    Ok(cleared_cookies(HttpResponse::NoContent()))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PasswordChange {
    pub current_password: String,
    pub new_password: String,
}

/// Changes the password and ends every session of the account (this one too): a
/// thief holding a token loses it. The client signs in again with the new password.
#[utoipa::path(post, path = "/api/me/password", tag = "auth", request_body = PasswordChange, security(("bearer" = [])), responses(
    (status = 204, description = "Password changed; every session of the account ended"),
    (status = 403, description = "`wrong_password`: the current password is wrong; `csrf_failed`", body = ErrorBody<'static>),
    (status = 422, description = "`invalid_password`, `invalid_body`", body = ErrorBody<'static>),
    (status = 429, description = "`rate_limited` (counted like sign-in)", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"),
        ("RateLimit" = String), ("RateLimit-Policy" = String))),
    (status = 503, description = "`busy`: more sign-ins at once than hashing turns for 5 s", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"))),
))]
async fn change_password(
    req: HttpRequest,
    state: web::Data<AppState>,
    user: AuthUser,
    body: crate::routes::extract::JsonObject<PasswordChange>,
) -> Result<HttpResponse, AppError> {
    // Counted like sign-in: this route also tells whether a password is right.
    let granted = state.limiter.check(Route::Signin, None, &req).await?;
    let body = body.into_inner();
    let new_password = Password::parse(body.new_password)?;
    let hash = auth::password_hash_of(&state.db, user.id)
        .await?
        .ok_or_else(|| AppError::new(ErrorCode::Unauthorized, "this account no longer exists"))?;
    if body.current_password.len() > 1024 || !verify_password(hash, body.current_password).await? {
        return Err(AppError::new(
            ErrorCode::WrongPassword,
            "the current password is wrong",
        ));
    }
    let new_hash = hash_password(new_password).await?;
    let generation = auth::set_password(&state.db, user.id, new_hash).await?;
    state
        .sessions
        .end_all(&mut redis_of(&req, &state), user.id, generation)
        .await?;
    tracing::info!(
        user_id = user.id.get(),
        "password changed; every session ended"
    );
    Ok(granted.attach(cleared_cookies(HttpResponse::NoContent())))
}

/// The signed-in user.
#[utoipa::path(get, path = "/api/me", tag = "auth", security(("bearer" = [])), responses(
    (status = 200, description = "The caller", body = UserView),
))]
async fn me(state: web::Data<AppState>, user: AuthUser) -> Result<HttpResponse, AppError> {
    let view = auth::user_view(&state.db, user.id)
        .await?
        .ok_or_else(|| AppError::new(ErrorCode::Unauthorized, "this account no longer exists"))?;
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "private, no-store"))
        .json(view))
}
