//! The one application error type. Every failure a handler can meet becomes an
//! [`AppError`], which answers with a status and a JSON body
//! `{"error": "<code>", "message": "<text>"}`. Server-side causes are logged with
//! their chain and never sent to the client.

use std::borrow::Cow;

use actix_web::http::{StatusCode, header};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

mod code;
mod outage;

pub use code::ErrorCode;
use outage::is_db_unreachable;
pub use outage::{
    RETRY_AFTER_OUTAGE_SECS, is_redis_not_ready, is_redis_unreachable, is_unique_violation,
    postgres_timed_out, within,
};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// A refusal the client caused or can act on (4xx), or a known 503.
    #[error("{message}")]
    Client {
        code: ErrorCode,
        /// Borrowed when fixed (the refusals of a storm allocate nothing for it).
        message: Cow<'static, str>,
        /// Extra response headers (Retry-After, RateLimit, ...).
        headers: Vec<(header::HeaderName, String)>,
        /// Extra fields of the body beside `error` and `message` (`allowed_at` of
        /// `account_too_new`); none for nearly every refusal.
        fields: Vec<(&'static str, serde_json::Value)>,
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
    pub fn new(code: ErrorCode, message: impl Into<Cow<'static, str>>) -> Self {
        AppError::Client {
            code,
            message: message.into(),
            headers: Vec::new(),
            fields: Vec::new(),
        }
    }

    /// Adds a field to the body of a refusal (beside `error` and `message`).
    pub fn with_field(mut self, name: &'static str, value: serde_json::Value) -> Self {
        if let AppError::Client { fields, .. } = &mut self {
            fields.push((name, value));
        }
        self
    }

    pub fn with_header(mut self, name: header::HeaderName, value: impl Into<String>) -> Self {
        if let AppError::Client { headers, .. } = &mut self {
            headers.push((name, value.into()));
        }
        self
    }

    /// 404 `not_found`, the commonest refusal.
    pub fn not_found(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorCode::NotFound, message)
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
        self.error_code().as_str()
    }

    pub fn error_code(&self) -> ErrorCode {
        match self {
            AppError::Client { code, .. } => *code,
            AppError::Redis(e) if is_redis_unreachable(e) => ErrorCode::RedisUnavailable,
            AppError::Database(e) if is_db_unreachable(e) => ErrorCode::DatabaseUnavailable,
            _ => ErrorCode::Internal,
        }
    }
}

impl ResponseError for AppError {
    fn status_code(&self) -> StatusCode {
        self.error_code().status()
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        match self {
            // A refusal is the normal answer of a flash sale (sold out, already
            // bought, rate limited): thousands a second in a storm, so debug only.
            AppError::Client { code, .. } => {
                tracing::debug!(
                    status = status.as_u16(),
                    code = code.as_str(),
                    "request refused"
                )
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
        let body = ErrorBody {
            error: self.code(),
            message: &message,
        };
        match self {
            AppError::Client { fields, .. } if !fields.is_empty() => {
                let mut map = serde_json::Map::new();
                map.insert("error".into(), body.error.into());
                map.insert("message".into(), body.message.into());
                for (name, value) in fields {
                    map.insert((*name).into(), value.clone());
                }
                builder.json(map)
            }
            _ => builder.json(body),
        }
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
        let resp =
            AppError::new(ErrorCode::AlreadyBought, "you already bought this").error_response();
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
