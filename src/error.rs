//! The one application error type. Every failure a handler can meet becomes an
//! [`AppError`], which answers with a status and a JSON body
//! `{"error": "<code>", "message": "<text>"}`. Server-side causes are logged with
//! their chain and never sent to the client.

use std::borrow::Cow;

use actix_web::http::{StatusCode, header};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// A refusal the client caused or can act on (4xx), or a known 503.
    #[error("{message}")]
    Client {
        status: StatusCode,
        code: &'static str,
        /// Borrowed when fixed (the refusals of a storm allocate nothing for it).
        message: Cow<'static, str>,
        /// Extra response headers (Retry-After, RateLimit, ...).
        headers: Vec<(header::HeaderName, String)>,
    },
    #[error("redis error")]
    Redis(#[from] redis::RedisError),
    #[error("database error")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// The body of every error answer.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody<'a> {
    /// Machine-readable code, such as `sold_out` or `invalid_id`.
    pub error: &'a str,
    /// What happened, for people.
    pub message: &'a str,
}

impl AppError {
    pub fn new(
        status: StatusCode,
        code: &'static str,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        AppError::Client {
            status,
            code,
            message: message.into(),
            headers: Vec::new(),
        }
    }

    pub fn with_header(mut self, name: header::HeaderName, value: impl Into<String>) -> Self {
        if let AppError::Client { headers, .. } = &mut self {
            headers.push((name, value.into()));
        }
        self
    }

    pub fn bad_request(code: &'static str, message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn unprocessable(code: &'static str, message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    pub fn not_found(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn conflict(code: &'static str, message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    pub fn unauthorized(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn forbidden(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub fn unavailable(code: &'static str, message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
    }

    /// The message sent to the client: a refusal's own, else a fixed one (the
    /// cause of a 5xx goes to the log only).
    pub fn public_message(&self) -> Cow<'static, str> {
        match self {
            AppError::Client { message, .. } => message.clone(),
            _ if self.status_code() == StatusCode::SERVICE_UNAVAILABLE => {
                Cow::Borrowed("a backing service is unavailable; try again shortly")
            }
            _ => Cow::Borrowed("internal error"),
        }
    }

    /// The machine-readable code sent as `error`.
    pub fn code(&self) -> &'static str {
        match self {
            AppError::Client { code, .. } => code,
            AppError::Redis(e) if is_redis_unreachable(e) => "redis_unavailable",
            AppError::Database(e) if is_db_unreachable(e) => "database_unavailable",
            _ => "internal",
        }
    }
}

/// Redis answers that mean "not now" rather than "you sent something wrong": the
/// server is loading its dataset after a restart, a failover is in progress, a
/// replica refuses writes, persistence is failing, memory is full, a script is busy.
/// Each is an outage (503 with `Retry-After`), never a bug (500).
const REDIS_NOT_READY: &[&str] = &[
    "LOADING",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "READONLY",
    "NOREPLICAS",
    "MISCONF",
    "OOM",
    "BUSY",
];

/// Connection-level Redis failures, and a Redis that is up but not ready, are an
/// outage (503), not a bug (500).
pub fn is_redis_unreachable(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || is_redis_not_ready(e)
        // Redis Cluster: no node for the slot yet, or MOVED/ASK/CLUSTERDOWN still
        // after redis-rs's retries (a failover in progress).
        || e.kind() == redis::ErrorKind::ClusterConnectionNotFound
        || e.is_cluster_error()
}

/// Redis answered, but with a "not now" error (see [`REDIS_NOT_READY`]).
pub fn is_redis_not_ready(e: &redis::RedisError) -> bool {
    e.code().is_some_and(|code| REDIS_NOT_READY.contains(&code))
}

/// Seconds a client should wait before retrying after an outage answer.
pub const RETRY_AFTER_OUTAGE_SECS: u32 = 1;

/// Postgres down, restarting, shutting down or out of connections: an outage (503).
/// SQLSTATE class 08 is a connection exception, 57P01 to 57P05 are "the server is
/// shutting down / starting up", 53300 is too many connections.
fn is_db_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P") || c == "53300"),
        _ => false,
    }
}

/// The SQLSTATE of a unique-constraint violation.
pub fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("23505"))
}

impl ResponseError for AppError {
    fn status_code(&self) -> StatusCode {
        match self {
            AppError::Client { status, .. } => *status,
            AppError::Redis(e) if is_redis_unreachable(e) => StatusCode::SERVICE_UNAVAILABLE,
            AppError::Database(e) if is_db_unreachable(e) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        match self {
            // A refusal is the normal answer of a flash sale (sold out, already
            // bought, rate limited): thousands a second in a storm, so debug only.
            AppError::Client { code, .. } => {
                tracing::debug!(status = status.as_u16(), code, "request refused")
            }
            other => tracing::error!(error = %error_chain(other), "request failed"),
        }
        let message = self.public_message();
        let mut builder = HttpResponse::build(status);
        if let AppError::Client { headers, .. } = self {
            for (name, value) in headers {
                builder.insert_header((name.clone(), value.as_str()));
            }
        }
        // Every 503 tells the client when to come back, whichever store was down.
        if status == StatusCode::SERVICE_UNAVAILABLE
            && !matches!(self, AppError::Client { headers, .. }
                if headers.iter().any(|(n, _)| n == header::RETRY_AFTER))
        {
            builder.insert_header((header::RETRY_AFTER, RETRY_AFTER_OUTAGE_SECS.to_string()));
        }
        builder.json(ErrorBody {
            error: self.code(),
            message: &message,
        })
    }
}

/// `outer: inner: innermost`, for logs.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::body::to_bytes;

    #[actix_web::test]
    async fn client_errors_render_code_and_message() {
        let resp = AppError::conflict("already_bought", "you already bought this").error_response();
        assert_eq!(resp.status(), StatusCode::CONFLICT);
        let body = to_bytes(resp.into_body()).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"], "already_bought");
        assert_eq!(v["message"], "you already bought this");
    }

    #[test]
    fn redis_not_ready_answers_are_outages() {
        for code in [
            "LOADING",
            "MASTERDOWN",
            "TRYAGAIN",
            "CLUSTERDOWN",
            "READONLY",
            "MISCONF",
        ] {
            let parsed = parse_server_error(code);
            assert!(is_redis_unreachable(&parsed), "{code}: {parsed:?}");
            let resp = AppError::Redis(parsed).error_response();
            assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "{code}");
            assert_eq!(resp.headers().get(header::RETRY_AFTER).unwrap(), "1");
        }
        assert!(!is_redis_unreachable(&parse_server_error("WRONGTYPE")));
        assert!(!is_redis_unreachable(&parse_server_error("ERR")));
    }

    /// A server error as redis-rs parses it off the wire.
    fn parse_server_error(code: &str) -> redis::RedisError {
        let wire = format!("-{code} something is not ready\r\n");
        redis::parse_redis_value(wire.as_bytes())
            .and_then(|v| v.extract_error())
            .expect_err("an error reply")
    }

    #[actix_web::test]
    async fn internal_errors_hide_details() {
        let resp = AppError::Internal(anyhow::anyhow!("secret detail")).error_response();
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = to_bytes(resp.into_body()).await.unwrap();
        assert!(!String::from_utf8_lossy(&body).contains("secret detail"));
    }
}
