//! The purchase's optional body (`{"ticket", "quantity"}`), read by hand: most
//! purchases carry none and pay for no buffer.

use actix_web::http::header;
use actix_web::{HttpRequest, web};
use futures_util::StreamExt;
use serde::Deserialize;

use crate::error::{AppError, ErrorCode};

/// The purchase's optional body. No body (or `{}`) means no ticket, one unit.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PurchaseBody {
    /// The ticket from `POST /api/sales/{id}/ticket`, for a sale that requires one.
    #[serde(default)]
    pub(super) ticket: Option<String>,
    /// Units to buy, all or nothing: 1 (the default) to the sale's `max_per_user`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100)]
    pub(super) quantity: Option<i64>,
}

/// Longest purchase body read (a ticket is about 100 bytes).
const MAX_PURCHASE_BODY: usize = 4096;

impl PurchaseBody {
    /// Reads the body only when there is one: most purchases carry none, and they
    /// pay for no buffer (the `web::Bytes` extractor reserves 8 KiB for every
    /// request). A body that cannot be read is answered like the JSON extractor's
    /// errors (408 `body_timeout`, 413, 400).
    pub(super) async fn read(
        req: &HttpRequest,
        mut payload: web::Payload,
        body_timeout: std::time::Duration,
    ) -> Result<Self, AppError> {
        let headers = req.headers();
        let has_body = headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|n| n.as_bytes() != b"0")
            || headers.contains_key(header::TRANSFER_ENCODING);
        if !has_body {
            return Ok(PurchaseBody::default());
        }
        let mut body = web::BytesMut::new();
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(|e| crate::conn::body_read_error(&e, body_timeout))?;
            if body.len() + chunk.len() > MAX_PURCHASE_BODY {
                return Err(AppError::new(
                    ErrorCode::PayloadTooLarge,
                    format!("a purchase body is at most {MAX_PURCHASE_BODY} bytes"),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        // A body with something in it is JSON, said so, as on every other route.
        if !body.iter().all(u8::is_ascii_whitespace) && !crate::conn::is_json(req) {
            return Err(AppError::new(
                ErrorCode::UnsupportedMediaType,
                "send the purchase body as application/json (or send none)",
            ));
        }
        Self::parse(&body)
    }

    fn parse(body: &[u8]) -> Result<Self, AppError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(PurchaseBody::default());
        }
        serde_json::from_slice::<crate::conn::Object<Self>>(body).map(|o| o.0).map_err(|e| {
            let message =
                format!("the purchase body must be empty or {{\"ticket\": \"...\", \"quantity\": n}} (both optional): {e}");
            if e.is_data() {
                AppError::new(ErrorCode::InvalidBody, message)
            } else {
                AppError::new(ErrorCode::InvalidJson, message)
            }
        })
    }
}
