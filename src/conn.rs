//! What one client can hold. actix-web's own settings (applied in `startup`) close a
//! connection whose request head does not arrive within `client_request_timeout_ms`
//! and an idle keep-alive connection after `keep_alive_secs`, and cap connections per
//! worker. Two limits it does not have are added here, as one middleware: a request
//! head larger than `max_header_bytes` (431) and a body that does not arrive within
//! `body_timeout_ms` of the head (408). Both answers carry the JSON error body and
//! close the connection. While the server drains (SIGTERM, `drain_ms`), every
//! answer closes its connection too, so a proxy's kept-alive connections are gone
//! before the port closes and none is cut under a request sent on it.

use std::io;
use std::time::Duration;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::http::{StatusCode, header};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, ResponseError};
use futures_util::StreamExt;

use crate::error::{AppError, ErrorCode};
use crate::metrics::RouteLabel;

#[derive(Clone, Copy)]
pub struct ClientLimits {
    pub max_header_bytes: usize,
    pub body_timeout: Duration,
    /// A request answered here, before routing, and its route's label (the
    /// sold-out purchase: `routes::sale::sold_out_before_routing`), when one is set.
    pub early: Option<EarlyAnswer>,
    /// Whether the server is draining (stopping), so that each answer closes its
    /// connection: given by the composition (`startup`), which holds that flag.
    pub draining: fn(&ServiceRequest) -> bool,
}

/// An answer some request gets before routing (`None`: route it), with the label
/// of the route that would have answered it the same.
pub type EarlyAnswer = fn(&ServiceRequest) -> Option<(actix_web::HttpResponse, &'static str)>;

/// Size of the request line and headers as they came on the wire (near enough:
/// each header counts `name: value\r\n`).
fn head_bytes(req: &ServiceRequest) -> usize {
    let target = req.uri().path_and_query().map_or(1, |p| p.as_str().len());
    let line = req.method().as_str().len() + target + 12;
    req.headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum::<usize>()
        + line
}

fn has_body(req: &ServiceRequest) -> bool {
    let headers = req.headers();
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

/// The middleware (`actix_web::middleware::from_fn`).
pub async fn guard(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let limits = *req
        .app_data::<actix_web::web::Data<ClientLimits>>()
        .expect("ClientLimits registered in startup")
        .get_ref();
    if head_bytes(&req) > limits.max_header_bytes {
        let e = AppError::new(
            ErrorCode::HeadersTooLarge,
            format!(
                "the request line and headers are larger than {} bytes",
                limits.max_header_bytes
            ),
        );
        let (req, _) = req.into_parts();
        return Ok(closing(ServiceResponse::new(req, e.error_response())));
    }
    let draining = (limits.draining)(&req);
    if let Some((answer, route)) = limits.early.and_then(|early| early(&req)) {
        req.extensions_mut().insert(RouteLabel(route));
        let (req, _) = req.into_parts();
        let res = ServiceResponse::new(req, answer);
        return Ok(if draining { closing(res) } else { res });
    }
    if has_body(&req) {
        let payload = with_deadline(req.take_payload(), limits.body_timeout);
        req.set_payload(payload);
    }
    let res = next.call(req).await?.map_into_boxed_body();
    Ok(if draining || res.status() == StatusCode::REQUEST_TIMEOUT {
        closing(res)
    } else {
        res
    })
}

/// The answer, and no further request on this connection.
fn closing(mut res: ServiceResponse<BoxBody>) -> ServiceResponse<BoxBody> {
    res.response_mut()
        .head_mut()
        .set_connection_type(actix_web::http::ConnectionType::Close);
    res
}

/// The body stream, failing with `TimedOut` once `limit` has passed since the head.
fn with_deadline(payload: Payload, limit: Duration) -> Payload {
    let deadline = tokio::time::Instant::now() + limit;
    let stream = futures_util::stream::unfold(Some(payload), move |state| async move {
        let mut payload = state?;
        match tokio::time::timeout_at(deadline, payload.next()).await {
            Ok(Some(item)) => Some((item, Some(payload))),
            Ok(None) => None,
            Err(_) => Some((
                Err(PayloadError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "body_timeout",
                ))),
                None,
            )),
        }
    });
    let stream: std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<actix_web::web::Bytes, PayloadError>>>,
    > = Box::pin(stream);
    Payload::from(stream)
}

/// A body read that ran out of time (see [`with_deadline`]).
fn is_body_timeout(e: &PayloadError) -> bool {
    matches!(e, PayloadError::Io(io) if io.kind() == io::ErrorKind::TimedOut)
}

/// A body that a handler could not read itself, as the JSON extractor's handler
/// answers it: 413 `payload_too_large`, 408 `body_timeout` (which closes the
/// connection), else 400 `invalid_json`.
pub fn body_read_error(e: &PayloadError, body_timeout: Duration) -> AppError {
    match e {
        PayloadError::Overflow => {
            AppError::new(ErrorCode::PayloadTooLarge, "the request body is too large")
        }
        p if is_body_timeout(p) => body_timeout_error(body_timeout),
        _ => AppError::new(
            ErrorCode::InvalidJson,
            format!("the request body could not be read: {e}"),
        ),
    }
}

fn body_timeout_error(limit: Duration) -> AppError {
    AppError::new(
        ErrorCode::BodyTimeout,
        format!(
            "the request body did not arrive within {} ms",
            limit.as_millis()
        ),
    )
}

/// How this server answers a JSON body it cannot take, in the JSON extractor
/// (`startup`'s `JsonConfig`) and in [`json_body`] alike: 413
/// `payload_too_large` past `limit`, 408 `body_timeout`, 415
/// `unsupported_media_type`, 422 `invalid_body` (JSON of the wrong shape), else
/// 400 `invalid_json`.
pub fn json_error(
    err: &actix_web::error::JsonPayloadError,
    limit: usize,
    body_timeout: Duration,
) -> AppError {
    use actix_web::error::JsonPayloadError as E;
    match err {
        E::OverflowKnownLength { .. } | E::Overflow { .. } => AppError::new(
            ErrorCode::PayloadTooLarge,
            format!("request body is larger than {limit} bytes"),
        ),
        E::Payload(p) => body_read_error(p, body_timeout),
        E::ContentType => AppError::new(
            ErrorCode::UnsupportedMediaType,
            "send the body as application/json",
        ),
        E::Deserialize(d) if d.is_data() => AppError::new(ErrorCode::InvalidBody, d.to_string()),
        E::Deserialize(d) => AppError::new(ErrorCode::InvalidJson, d.to_string()),
        other => AppError::new(ErrorCode::InvalidJson, other.to_string()),
    }
}

/// Whether the request says its body is JSON (`application/json`, or a
/// `+json` type), as `web::Json` asks.
pub fn is_json(req: &actix_web::HttpRequest) -> bool {
    matches!(req.mime_type(), Ok(Some(mime))
        if mime.subtype() == actix_web::mime::JSON
            || mime.suffix() == Some(actix_web::mime::JSON))
}

/// A JSON body read as `web::Json` reads it with this server's `JsonConfig` (the
/// content type, the limit before and while reading, a compressed body
/// decompressed, the same answers: [`json_error`]), for a storm's route (the
/// vote): without the extractor's future, its 8 KiB buffer per request and the
/// shared state's `Arc` cloned per extractor.
pub async fn json_body<T: serde::de::DeserializeOwned>(
    req: &actix_web::HttpRequest,
    payload: actix_web::web::Payload,
    limit: usize,
    body_timeout: Duration,
) -> Result<T, AppError> {
    use actix_web::error::JsonPayloadError as E;
    let fail = |e: E| json_error(&e, limit, body_timeout);
    if !is_json(req) {
        return Err(fail(E::ContentType));
    }
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(length) = length
        && length > limit
    {
        return Err(fail(E::OverflowKnownLength { length, limit }));
    }
    let mut body = actix_web::dev::Decompress::from_headers(payload.into_inner(), req.headers());
    let mut buf = actix_web::web::BytesMut::with_capacity(length.unwrap_or(0).min(limit));
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| fail(E::Payload(e)))?;
        if buf.len() + chunk.len() > limit {
            return Err(fail(E::Overflow { limit }));
        }
        buf.extend_from_slice(&chunk);
    }
    serde_json::from_slice::<Object<T>>(&buf)
        .map(|o| o.0)
        .map_err(|e| fail(E::Deserialize(e)))
}

/// A body that must be a JSON object: serde's derived structs also take a JSON
/// array of their fields in order (`[1, null]` for `{"option_id": 1}`), which no
/// route documents; through this they are 422 `invalid_body` ("expected a JSON
/// object"), and the struct's own checks (unknown fields, types) run as before.
pub struct Object<T>(pub T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectOf<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for ObjectOf<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(ObjectOf(std::marker::PhantomData))
            .map(Object)
    }
}
