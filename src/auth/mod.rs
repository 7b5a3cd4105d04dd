//! Accounts and sessions: sign-up, sign-in, sign-out (this session, or all of an
//! account's), password change, and the `AuthUser` / `AdminUser` extractors that
//! check a signed token and, through [`session`], that its session still stands
//! (this process's memory of what has ended; never Postgres in normal running).

pub mod password;
pub mod session;
pub mod token;

use actix_web::cookie::Cookie;
use actix_web::http::{Method, header};
use actix_web::{HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::domain::{Password, UserId, Username};
use crate::error::{AppError, ErrorCode, is_unique_violation};
use token::{Claims, TokenError, TokenKey};

pub const SESSION_COOKIE: &str = "stampede_session";
/// Double-submit CSRF cookie: readable by our own page scripts, echoed back in the
/// `X-CSRF-Token` header on every state-changing request authenticated by cookie.
pub const CSRF_COOKIE: &str = "stampede_csrf";
pub const CSRF_HEADER: &str = "x-csrf-token";

/// A signed-in caller, taken from `Authorization: Bearer` or the session cookie (the
/// extractor, which reads the keys from the application state, is in
/// `routes::auth`; the checks are [`authenticate`]).
#[derive(Clone, Copy, Debug)]
pub struct AuthUser {
    pub id: UserId,
    pub admin: bool,
    /// When the account was made (unix secs), as its token says; `None` for a
    /// token without it (see [`token::Claims::account_created`]).
    pub created_at: Option<i64>,
}

/// A signed-in caller whose token carries the admin flag.
#[derive(Clone, Copy, Debug)]
pub struct AdminUser(pub AuthUser);

/// The token's claims, checked: signature, expiry, CSRF for a cookie on an unsafe
/// method, and that its session stands.
pub fn authenticate(
    req: &HttpRequest,
    tokens: &TokenKey,
    sessions: &session::Sessions,
) -> Result<(AuthUser, Claims), AppError> {
    let claims = verified_claims(req, tokens)?;
    match sessions.standing(&claims) {
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
            created_at: claims.account_created,
        },
        claims,
    ))
}

/// Signature, expiry and (cookie, unsafe method) CSRF: no store involved.
pub fn verified_claims(req: &HttpRequest, tokens: &TokenKey) -> Result<Claims, AppError> {
    // The header's text is borrowed (every purchase and vote comes this way); a
    // cookie is parsed into a value of its own, kept here while the token is read.
    let cookie;
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
            (token.trim(), false)
        }
        None => match req.cookie(SESSION_COOKIE) {
            Some(c) => {
                cookie = c;
                (cookie.value(), true)
            }
            None => return Err(AppError::new(ErrorCode::Unauthorized, "sign in first")),
        },
    };
    let claims = tokens
        .verify(token, chrono::Utc::now().timestamp())
        .map_err(|e| match e {
            TokenError::Expired => AppError::new(
                ErrorCode::TokenExpired,
                "your session expired; sign in again",
            ),
            _ => AppError::new(ErrorCode::InvalidToken, "the session token is not valid"),
        })?;
    if from_cookie && !is_safe_method(req.method()) {
        check_session_csrf(req, tokens, &claims)?;
    }
    Ok(claims)
}

/// A cookie session's unsafe request must carry its session's CSRF token
/// ([`TokenKey::csrf_of`]) in `X-CSRF-Token`: another site can neither read it
/// nor, without the secret, make it.
fn check_session_csrf(
    req: &HttpRequest,
    tokens: &TokenKey,
    claims: &Claims,
) -> Result<(), AppError> {
    let header = req.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok());
    match header {
        Some(h) if constant_time_eq(&tokens.csrf_of(claims), h) => Ok(()),
        _ => Err(AppError::new(
            ErrorCode::CsrfFailed,
            "missing or wrong X-CSRF-Token header for a cookie-authenticated request",
        )),
    }
}

/// The `stampede_csrf` cookie: the session's CSRF token for the page's scripts to
/// read (not `HttpOnly`), sent only to this site (`SameSite=Strict`).
pub fn csrf_cookie(value: String, secure: bool, max_age_s: i64) -> Cookie<'static> {
    Cookie::build(CSRF_COOKIE, value)
        .path("/")
        .http_only(false)
        .same_site(actix_web::cookie::SameSite::Strict)
        .secure(secure)
        .max_age(actix_web::cookie::time::Duration::seconds(max_age_s))
        .finish()
}

/// For a page answered to a cookie session whose `stampede_csrf` cookie is not
/// its session's CSRF token (a session signed in before the token was bound to
/// it, or a cookie someone else set): the cookie that puts it right, so the page's
/// scripts send the right one.
pub fn csrf_cookie_fix(
    req: &HttpRequest,
    tokens: &TokenKey,
    secure: bool,
) -> Option<Cookie<'static>> {
    let session = req.cookie(SESSION_COOKIE)?;
    let now = chrono::Utc::now().timestamp();
    let claims = tokens.verify(session.value(), now).ok()?;
    let want = tokens.csrf_of(&claims);
    if req.cookie(CSRF_COOKIE).is_some_and(|c| c.value() == want) {
        return None;
    }
    Some(csrf_cookie(want, secure, claims.expires_at - now))
}

fn is_safe_method(m: &Method) -> bool {
    matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// A cross-site form or script cannot read our CSRF cookie, so it cannot echo it.
/// (The sign-out of a cookie whose token does not verify, which ends nothing; a
/// session's requests check [`TokenKey::csrf_of`] instead.)
pub fn check_csrf(req: &HttpRequest) -> Result<(), AppError> {
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

pub use crate::random::token_hex as random_token_hex;

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

/// Argon2 costs tens of milliseconds of CPU and 19 MiB: run it on the blocking
/// pool, at most one hash per core, in memory kept for it ([`password`]), so the
/// async workers keep answering buyers and a storm of sign-ins waits its turn
/// instead of asking for memory (503 `busy` after [`password::TURN_WAIT`]).
pub async fn hash_password(password: Password) -> Result<String, AppError> {
    password::hash(password.expose().to_string()).await
}

pub async fn verify_password(hash: String, password: String) -> Result<bool, AppError> {
    password::verify(hash, password).await
}

/// Whether a stored password hash is one a password can match: an account made
/// without a password (a load test's rehearsal shoppers, `stampede load`) holds
/// text that is not, and signs in with nothing.
pub fn has_password(stored: &str) -> bool {
    password::parses(stored)
}

/// A fixed, valid hash to verify against when the user does not exist, so a wrong
/// username costs as much time as a wrong password (no user enumeration by timing).
pub const DUMMY_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$Ww3b3lR3H1mN1bV1c0o8q2mS3M4xYk9q1r0pQ6m5m7E";

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

/// What sign-in needs of an account: its id, password hash, admin flag and
/// session generation.
pub struct Account {
    pub id: i64,
    pub password_hash: String,
    pub admin: bool,
    pub session_gen: i64,
    /// When the account was made, unix secs (its tokens carry it).
    pub created_at: i64,
}

/// The account with this username.
pub async fn account(db: &PgPool, username: &Username) -> sqlx::Result<Option<Account>> {
    let row: Option<(i64, String, bool, i64, i64)> = sqlx::query_as(
        "SELECT id, password_hash, is_admin, session_gen,
                floor(extract(epoch FROM created_at))::bigint
         FROM users WHERE username = $1",
    )
    .bind(username.as_str())
    .fetch_optional(db)
    .await?;
    Ok(row.map(
        |(id, password_hash, admin, session_gen, created_at)| Account {
            id,
            password_hash,
            admin,
            session_gen,
            created_at,
        },
    ))
}

/// When the account was made (unix secs); `None` for an account that is gone.
/// Read only for a token that does not carry it (see
/// [`token::Claims::account_created`]).
pub async fn created_at(db: &PgPool, user: UserId) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar(
        "SELECT floor(extract(epoch FROM created_at))::bigint FROM users WHERE id = $1",
    )
    .bind(user.get())
    .fetch_optional(db)
    .await
}

/// The user's id, name and admin flag; `None` for an account that is gone.
pub async fn user_view(db: &PgPool, user: UserId) -> sqlx::Result<Option<UserView>> {
    sqlx::query_as("SELECT id, username, is_admin FROM users WHERE id = $1")
        .bind(user.get())
        .fetch_optional(db)
        .await
}

/// The names of those of `users` that exist, `(id, username)` in no order.
pub async fn usernames(db: &PgPool, users: &[i64]) -> sqlx::Result<Vec<(i64, String)>> {
    sqlx::query_as("SELECT id, username FROM users WHERE id = ANY($1)")
        .bind(users)
        .fetch_all(db)
        .await
}

/// Whether the account of this name is an admin; `None` when no account has it.
pub async fn is_admin_named(db: &PgPool, username: &Username) -> sqlx::Result<Option<bool>> {
    sqlx::query_scalar("SELECT is_admin FROM users WHERE username = $1")
        .bind(username.as_str())
        .fetch_optional(db)
        .await
}

/// Takes the admin flag from the named account and ends every session it has (a
/// token carries the flag it was signed with: the account's tokens must stop working,
/// and a new sign-in gets a token without it). The account's id and its new session
/// generation, to announce ([`session::announce_end_all`]); `None` when no admin
/// has the name (nothing changes).
pub async fn revoke_admin(db: &PgPool, username: &Username) -> sqlx::Result<Option<(i64, i64)>> {
    sqlx::query_as(
        "UPDATE users SET is_admin = FALSE, session_gen = session_gen + 1
         WHERE username = $1 AND is_admin
         RETURNING id, session_gen",
    )
    .bind(username.as_str())
    .fetch_optional(db)
    .await
}

/// Makes the named account an admin; false when there is no such account.
pub async fn promote_admin(db: &PgPool, username: &Username) -> sqlx::Result<bool> {
    let promoted = sqlx::query("UPDATE users SET is_admin = TRUE WHERE username = $1")
        .bind(username.as_str())
        .execute(db)
        .await?;
    Ok(promoted.rows_affected() > 0)
}

/// The user's password hash; `None` for an account that is gone.
pub async fn password_hash_of(db: &PgPool, user: UserId) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar("SELECT password_hash FROM users WHERE id = $1")
        .bind(user.get())
        .fetch_optional(db)
        .await
}

/// Ends every session of the user: the next session generation, which every token
/// of an earlier one fails; `None` for an account that is gone.
pub async fn next_session_gen(db: &PgPool, user: UserId) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar(
        "UPDATE users SET session_gen = session_gen + 1 WHERE id = $1 RETURNING session_gen",
    )
    .bind(user.get())
    .fetch_optional(db)
    .await
}

/// Sets the user's password hash and ends every session of the user in the same
/// statement: the new session generation.
pub async fn set_password(db: &PgPool, user: UserId, hash: String) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "UPDATE users SET password_hash = $2, session_gen = session_gen + 1 WHERE id = $1
         RETURNING session_gen",
    )
    .bind(user.get())
    .bind(hash)
    .fetch_one(db)
    .await
}

/// An answer that clears the session and CSRF cookies.
pub fn cleared_cookies(mut builder: actix_web::HttpResponseBuilder) -> HttpResponse {
    let mut session = Cookie::build(SESSION_COOKIE, "").path("/").finish();
    session.make_removal();
    let mut csrf = Cookie::build(CSRF_COOKIE, "").path("/").finish();
    csrf.make_removal();
    builder.cookie(session).cookie(csrf).finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix_web::test]
    async fn dummy_hash_is_checked_at_full_cost_and_matches_nothing() {
        // A wrong username goes through a whole hash, never an error.
        assert!(
            !verify_password(DUMMY_HASH.into(), "password".into())
                .await
                .unwrap()
        );
        assert!(DUMMY_HASH.contains("$m=19456,t=2,p=1$"));
    }

    #[test]
    fn constant_time_eq_works() {
        assert!(constant_time_eq("abc", "abc"));
        assert!(!constant_time_eq("abc", "abd"));
        assert!(!constant_time_eq("abc", "ab"));
    }
}
