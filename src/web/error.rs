//! Errors of pages, answered as an HTML page with the right status. The JSON API
//! keeps `AppError`; a page turns one into this with [`PageError::from_app`].

use std::fmt;

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use askama::Template;

use super::view::Nav;
use crate::error::{AppError, RETRY_AFTER_OUTAGE_SECS, error_chain};

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    nav: &'a Nav,
    status: u16,
    heading: &'a str,
    detail: &'a str,
}

pub struct PageError {
    status: StatusCode,
    heading: &'static str,
    detail: String,
    nav: Nav,
    /// A 503's `Retry-After` (seconds): the refusal's own, else the outage's.
    retry_after: Option<String>,
}

impl PageError {
    pub fn new(status: StatusCode, nav: Nav, heading: &'static str, detail: String) -> Self {
        PageError {
            status,
            heading,
            detail,
            nav,
            retry_after: None,
        }
    }

    pub fn not_found(nav: Nav, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, nav, "Page not found", detail.into())
    }

    pub fn forbidden(nav: Nav, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, nav, "Not allowed", detail.into())
    }

    /// Client errors keep their message; store failures become a 503/500 page
    /// whose cause goes to the log only.
    pub fn from_app(err: AppError, nav: Nav) -> Self {
        let status = err.status_code();
        match err {
            AppError::Client {
                message, headers, ..
            } => {
                let heading = match status {
                    StatusCode::NOT_FOUND => "Page not found",
                    StatusCode::FORBIDDEN => "Not allowed",
                    StatusCode::SERVICE_UNAVAILABLE => "Temporarily unavailable",
                    _ => "Something is not right",
                };
                let mut page = Self::new(status, nav, heading, message.into_owned());
                page.retry_after = headers
                    .into_iter()
                    .find(|(name, _)| name == header::RETRY_AFTER)
                    .map(|(_, value)| value);
                page
            }
            other => {
                tracing::error!(error = %error_chain(&other), "page failed");
                let (heading, detail) = if status == StatusCode::SERVICE_UNAVAILABLE {
                    (
                        "Temporarily unavailable",
                        "A service this page needs is not answering. Please try again in a moment.",
                    )
                } else {
                    (
                        "Something went wrong",
                        "We could not show this page. Please try again.",
                    )
                };
                Self::new(status, nav, heading, detail.to_string())
            }
        }
    }
}

impl fmt::Debug for PageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PageError({}, {})", self.status, self.detail)
    }
}

impl fmt::Display for PageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.heading, self.detail)
    }
}

impl ResponseError for PageError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let page = ErrorPage {
            nav: &self.nav,
            status: self.status.as_u16(),
            heading: self.heading,
            detail: &self.detail,
        };
        match page.render() {
            Ok(body) => {
                let mut builder = HttpResponse::build(self.status);
                builder.insert_header((
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/html; charset=utf-8"),
                ));
                // Every 503 page tells when to come back, as the API's do.
                if self.status == StatusCode::SERVICE_UNAVAILABLE {
                    let seconds = self.retry_after.clone();
                    builder.insert_header((
                        header::RETRY_AFTER,
                        seconds.unwrap_or_else(|| RETRY_AFTER_OUTAGE_SECS.to_string()),
                    ));
                }
                builder.body(body)
            }
            Err(e) => {
                tracing::error!(error = %e, "rendering the error page failed");
                HttpResponse::build(self.status)
                    .content_type("text/plain; charset=utf-8")
                    .body(self.detail.clone())
            }
        }
    }
}
