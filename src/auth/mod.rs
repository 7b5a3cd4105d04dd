//! Accounts and sessions: sign-up, sign-in, sign-out (this session, or all of an
//! account's), password change, and the `AuthUser` / `AdminUser` extractors that
//! check a signed token and, through [`session`], that its session still stands
//! (Redis, cached in the process for about a second; never Postgres in normal running).

pub mod session;
pub mod token;

use actix_web::cookie::{Cookie, SameSite, time::Duration as CookieDuration};
use actix_web::http::{Method, header};
use actix_web::{FromRequest, HttpRequest, HttpResponse, dev::Payload, web};
use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use futures_util::future::{Ready, ready};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::domain::{Id, Password, UserId, Username};
use crate::error::{AppError, ErrorBody, ErrorCode, is_unique_violation};
use crate::limit::Route;
use crate::state::AppState;
use token::{Claims, TokenError};

pub const SESSION_COOKIE: &str = "stampede_session";
/// Double-submit CSRF cookie: readable by our own page scripts, echoed back in the
/// `X-CSRF-Token` header on every state-changing request authenticated by cookie.
pub const CSRF_COOKIE: &str = "stampede_csrf";
pub const CSRF_HEADER: &str = "x-csrf-token";

// Routes under `/api` (see `startup`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(signup, signin, signout, signout_all, me, change_password))]
pub(crate) struct Api;

crate::routes::routes! {
    pub fn configure, pub const ROUTES;
    post "/auth/signup" => signup,
    post "/auth/signin" => signin,
    post "/auth/signout" => signout,
    post "/auth/signout-all" => signout_all,
    get "/me" => me,
    post "/me/password" => change_password,
}

/// A signed-in caller, taken from `Authorization: Bearer` or the session cookie.
#[derive(Clone, Copy, Debug)]
pub struct AuthUser {
    pub id: UserId,
    pub admin: bool,
}

/// A signed-in caller whose token carries the admin flag.
#[derive(Clone, Copy, Debug)]
pub struct AdminUser(pub AuthUser);

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

fn app_state(req: &HttpRequest) -> Result<&web::Data<AppState>, AppError> {
    req.app_data::<web::Data<AppState>>()
        .ok_or_else(|| AppError::Internal(anyhow::anyhow!("app state missing")))
}

/// This worker's own Redis connection when there is one, else the shared one.
fn redis_of(req: &HttpRequest, state: &AppState) -> crate::redis_conn::Redis {
    match req.app_data::<web::Data<crate::state::Worker>>() {
        Some(worker) => worker.redis.clone(),
        None => state.redis.clone(),
    }
}

/// The token's claims, checked: signature, expiry, CSRF for a cookie on an unsafe
/// method, and that its session stands.
fn authenticate(req: &HttpRequest) -> Result<(AuthUser, Claims), AppError> {
    let state = app_state(req)?;
    let claims = verified_claims(req, state)?;
    match state.sessions.standing(&claims) {
        session::Standing::Valid => {}
        session::Standing::SignedOut => {
            return Err(AppError::new(
                ErrorCode::SessionEnded,
                "this session was signed out; sign in again",
            ));
        }
        session::Standing::Superseded => {
            return Err(AppError::new(
                ErrorCode::SessionEnded,
                "every session of this account was ended; sign in again",
            ));
        }
    }
    Ok((
        AuthUser {
            id: claims.user_id,
            admin: claims.admin,
        },
        claims,
    ))
}

/// Signature, expiry and (cookie, unsafe method) CSRF: no store involved.
fn verified_claims(req: &HttpRequest, state: &AppState) -> Result<Claims, AppError> {
    let (token, from_cookie) = match req.headers().get(header::AUTHORIZATION) {
        Some(value) => {
            let value = value.to_str().map_err(|_| {
                AppError::new(ErrorCode::Unauthorized, "malformed Authorization header")
            })?;
            let token = value.strip_prefix("Bearer ").ok_or_else(|| {
                AppError::new(
                    ErrorCode::Unauthorized,
                    "Authorization must be 'Bearer <token>'",
                )
            })?;
            (token.trim().to_string(), false)
        }
        None => match req.cookie(SESSION_COOKIE) {
            Some(c) => (c.value().to_string(), true),
            None => return Err(AppError::new(ErrorCode::Unauthorized, "sign in first")),
        },
    };
    let claims = state
        .tokens
        .verify(&token, chrono::Utc::now().timestamp())
        .map_err(|e| match e {
            TokenError::Expired => AppError::new(
                ErrorCode::TokenExpired,
                "your session expired; sign in again",
            ),
            _ => AppError::new(ErrorCode::InvalidToken, "the session token is not valid"),
        })?;
    if from_cookie && !is_safe_method(req.method()) {
        check_csrf(req)?;
    }
    Ok(claims)
}

fn is_safe_method(m: &Method) -> bool {
    matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// A cross-site form or script cannot read our CSRF cookie, so it cannot echo it.
fn check_csrf(req: &HttpRequest) -> Result<(), AppError> {
    let cookie = req.cookie(CSRF_COOKIE);
    let header = req.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok());
    match (cookie, header) {
        (Some(c), Some(h)) if !h.is_empty() && constant_time_eq(c.value(), h) => Ok(()),
        _ => Err(AppError::new(
            ErrorCode::CsrfFailed,
            "missing or wrong X-CSRF-Token header for a cookie-authenticated request",
        )),
    }
}

fn constant_time_eq(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

pub fn random_token_hex(bytes: usize) -> String {
    use rand::RngCore;
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

#[derive(Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct UserView {
    pub id: i64,
    pub username: String,
    pub is_admin: bool,
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

/// Argon2 costs tens of milliseconds of CPU: run it on the blocking pool so the
/// async workers keep answering buyers.
pub async fn hash_password(password: Password) -> Result<String, AppError> {
    web::block(move || {
        let mut salt_bytes = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut salt_bytes);
        let salt =
            SaltString::encode_b64(&salt_bytes).map_err(|e| anyhow::anyhow!("argon2 salt: {e}"))?;
        Argon2::default()
            .hash_password(password.expose().as_bytes(), &salt)
            .map(|h| h.to_string())
            .map_err(|e| anyhow::anyhow!("argon2 hash failed: {e}"))
    })
    .await
    .map_err(|e| AppError::Internal(anyhow::anyhow!("blocking pool: {e}")))?
    .map_err(AppError::Internal)
}

async fn verify_password(hash: String, password: String) -> Result<bool, AppError> {
    web::block(move || {
        let parsed = PasswordHash::new(&hash).map_err(|e| anyhow::anyhow!("stored hash: {e}"))?;
        Ok::<_, anyhow::Error>(
            Argon2::default()
                .verify_password(password.as_bytes(), &parsed)
                .is_ok(),
        )
    })
    .await
    .map_err(|e| AppError::Internal(anyhow::anyhow!("blocking pool: {e}")))?
    .map_err(AppError::Internal)
}

/// A fixed, valid hash to verify against when the user does not exist, so a wrong
/// username costs as much time as a wrong password (no user enumeration by timing).
const DUMMY_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$Ww3b3lR3H1mN1bV1c0o8q2mS3M4xYk9q1r0pQ6m5m7E";

pub async fn create_user(
    db: &PgPool,
    username: &Username,
    password: Password,
    admin: bool,
) -> Result<UserView, AppError> {
    let hash = hash_password(password).await?;
    sqlx::query_as::<_, UserView>(
        "INSERT INTO users (username, password_hash, is_admin) VALUES ($1, $2, $3)
         RETURNING id, username, is_admin",
    )
    .bind(username.as_str())
    .bind(hash)
    .bind(admin)
    .fetch_one(db)
    .await
    .map_err(|e| {
        if is_unique_violation(&e) {
            AppError::new(ErrorCode::UsernameTaken, "that username is taken")
        } else {
            e.into()
        }
    })
}

/// Creates the user, or sets its password and admin flag when it exists. Used by the
/// admin bootstrap and the demo seed, so running them twice changes nothing.
pub async fn upsert_user(
    db: &PgPool,
    username: &Username,
    password: Password,
    admin: bool,
) -> Result<UserView, AppError> {
    let hash = hash_password(password).await?;
    Ok(sqlx::query_as::<_, UserView>(
        "INSERT INTO users (username, password_hash, is_admin) VALUES ($1, $2, $3)
         ON CONFLICT (username) DO UPDATE
           SET password_hash = EXCLUDED.password_hash, is_admin = EXCLUDED.is_admin
         RETURNING id, username, is_admin",
    )
    .bind(username.as_str())
    .bind(hash)
    .bind(admin)
    .fetch_one(db)
    .await?)
}

/// Creates a shopper's account.
#[utoipa::path(post, path = "/api/auth/signup", tag = "auth", request_body = Credentials, responses(
    (status = 201, description = "The new user", body = UserView),
    (status = 409, description = "`username_taken`", body = ErrorBody<'static>),
    (status = 422, description = "`invalid_username`, `invalid_password`, `invalid_body`", body = ErrorBody<'static>),
    (status = 429, description = "`rate_limited`: too many sign-ups from this address", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"),
        ("RateLimit" = String), ("RateLimit-Policy" = String))),
))]
async fn signup(
    state: web::Data<AppState>,
    body: web::Json<Credentials>,
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
))]
#[tracing::instrument(skip_all)]
async fn signin(
    state: web::Data<AppState>,
    body: web::Json<Credentials>,
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
    let row: Option<(i64, String, bool, i64)> = sqlx::query_as(
        "SELECT id, password_hash, is_admin, session_gen FROM users WHERE username = $1",
    )
    .bind(username.as_str())
    .fetch_optional(&state.db)
    .await?;
    let (hash, found) = match &row {
        Some((_, hash, _, _)) => (hash.clone(), true),
        None => (DUMMY_HASH.to_string(), false),
    };
    let ok = verify_password(hash, body.password).await?;
    let Some((id, _, is_admin, generation)) = row.filter(|_| ok && found) else {
        return Err(wrong());
    };
    let user_id = Id::new(id).ok_or_else(|| AppError::Internal(anyhow::anyhow!("bad user id")))?;
    let expires_at = chrono::Utc::now().timestamp() + state.config.token_ttl_secs as i64;
    let token = state.tokens.issue(Claims {
        user_id,
        admin: is_admin,
        expires_at,
        generation,
        session: rand::random(),
    });
    let csrf = random_token_hex(16);
    let max_age = CookieDuration::seconds(state.config.token_ttl_secs as i64);
    let session = Cookie::build(SESSION_COOKIE, token.clone())
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(state.config.cookie_secure)
        .max_age(max_age)
        .finish();
    let csrf_cookie = Cookie::build(CSRF_COOKIE, csrf.clone())
        .path("/")
        .http_only(false)
        .same_site(SameSite::Strict)
        .secure(state.config.cookie_secure)
        .max_age(max_age)
        .finish();
    tracing::info!(user_id = id, "user signed in");
    let resp = HttpResponse::Ok()
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

/// Ends this session: its token stops working on every instance (within
/// `session_sync_ms` on the others), and the cookies are cleared. Without a valid
/// token there is nothing to end and the answer is the same 204. A browser session
/// must echo its CSRF cookie, so another site cannot sign people out.
#[utoipa::path(post, path = "/api/auth/signout", tag = "auth", responses(
    (status = 204, description = "This session ended (when the token was valid); cookies cleared"),
    (status = 403, description = "`csrf_failed`: a cookie session without the X-CSRF-Token header", body = ErrorBody<'static>),
))]
async fn signout(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, AppError> {
    if req.headers().get(header::AUTHORIZATION).is_none() && req.cookie(SESSION_COOKIE).is_some() {
        check_csrf(&req)?;
    }
    // A CSRF failure was answered above; any other failure is a token that does
    // not work anyway, so there is nothing to end.
    if let Ok(claims) = verified_claims(&req, &state) {
        let mut redis = redis_of(&req, &state);
        state
            .sessions
            .sign_out(&mut redis, &state.db, &claims)
            .await?;
        tracing::info!(user_id = claims.user_id.get(), "user signed out");
    }
    Ok(cleared_cookies(HttpResponse::NoContent()))
}

fn cleared_cookies(mut builder: actix_web::HttpResponseBuilder) -> HttpResponse {
    let mut session = Cookie::build(SESSION_COOKIE, "").path("/").finish();
    session.make_removal();
    let mut csrf = Cookie::build(CSRF_COOKIE, "").path("/").finish();
    csrf.make_removal();
    builder.cookie(session).cookie(csrf).finish()
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
    let generation: i64 = sqlx::query_scalar(
        "UPDATE users SET session_gen = session_gen + 1 WHERE id = $1 RETURNING session_gen",
    )
    .bind(user.id.get())
    .fetch_optional(&state.db)
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
))]
async fn change_password(
    req: HttpRequest,
    state: web::Data<AppState>,
    user: AuthUser,
    body: web::Json<PasswordChange>,
) -> Result<HttpResponse, AppError> {
    // Counted like sign-in: this route also tells whether a password is right.
    let granted = state.limiter.check(Route::Signin, None, &req).await?;
    let body = body.into_inner();
    let new_password = Password::parse(body.new_password)?;
    let hash: Option<String> = sqlx::query_scalar("SELECT password_hash FROM users WHERE id = $1")
        .bind(user.id.get())
        .fetch_optional(&state.db)
        .await?;
    let hash = hash
        .ok_or_else(|| AppError::new(ErrorCode::Unauthorized, "this account no longer exists"))?;
    if body.current_password.len() > 1024 || !verify_password(hash, body.current_password).await? {
        return Err(AppError::new(
            ErrorCode::WrongPassword,
            "the current password is wrong",
        ));
    }
    let new_hash = hash_password(new_password).await?;
    let generation: i64 = sqlx::query_scalar(
        "UPDATE users SET password_hash = $2, session_gen = session_gen + 1 WHERE id = $1
         RETURNING session_gen",
    )
    .bind(user.id.get())
    .bind(new_hash)
    .fetch_one(&state.db)
    .await?;
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
    let view =
        sqlx::query_as::<_, UserView>("SELECT id, username, is_admin FROM users WHERE id = $1")
            .bind(user.id.get())
            .fetch_optional(&state.db)
            .await?
            .ok_or_else(|| {
                AppError::new(ErrorCode::Unauthorized, "this account no longer exists")
            })?;
    Ok(HttpResponse::Ok().json(view))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dummy_hash_parses() {
        assert!(PasswordHash::new(DUMMY_HASH).is_ok());
    }

    #[test]
    fn constant_time_eq_works() {
        assert!(constant_time_eq("abc", "abc"));
        assert!(!constant_time_eq("abc", "abd"));
        assert!(!constant_time_eq("abc", "ab"));
    }
}
