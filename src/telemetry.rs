//! Logging: human-readable lines by default, JSON with `STAMPEDE_LOG_FORMAT=json`;
//! the level comes from `RUST_LOG` (default `info`, with redis-rs's cluster client
//! at `error`). Each request runs in a span
//! that carries its request id (tracing-actix-web). Refused requests (4xx) log at
//! debug, server errors at error; no colour codes unless stdout is a terminal.

use tracing_subscriber::EnvFilter;

pub fn init() {
    // redis-rs's cluster client warns once per command and retry while a primary
    // fails over (hundreds of lines a second in a storm); what it means for
    // requests is logged by Stampede itself (503s, settlement retries, rebuilds).
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new("info,sqlx=warn,actix_server=warn,redis::cluster_handling=error")
    });
    let json = std::env::var("STAMPEDE_LOG_FORMAT").is_ok_and(|v| v == "json");
    // Colour codes only for a person at a terminal, never into a file or a collector.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_target(false);
    // try_init: tests may call this more than once.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// The root span of every request: tracing-actix-web's own (method, route, client,
/// request id, status), built only when INFO is enabled, and without its
/// `Display` + `Debug` pre-formatting of every error answer. That pre-formatting
/// runs whether or not anything is logged, and in a storm nearly every answer is a
/// refusal (sold out, already bought, rate limited): it cost every refusal two
/// string allocations and a `Debug` walk of the error (about 1% of the server's
/// CPU on the buy path, perf). The span records the status and the error's
/// message; a 5xx's cause chain is logged by `AppError` itself, as before.
pub struct RequestSpan;

impl tracing_actix_web::RootSpanBuilder for RequestSpan {
    fn on_request_start(request: &actix_web::dev::ServiceRequest) -> tracing::Span {
        if tracing::level_enabled!(tracing::Level::INFO) {
            tracing_actix_web::root_span!(request)
        } else {
            tracing::Span::none()
        }
    }

    fn on_request_end<B: actix_web::body::MessageBody>(
        span: tracing::Span,
        outcome: &Result<actix_web::dev::ServiceResponse<B>, actix_web::Error>,
    ) {
        if span.is_disabled() {
            return;
        }
        let (status, error) = match outcome {
            Ok(response) => (
                response.status(),
                response.response().error().map(|e| e.as_response_error()),
            ),
            Err(e) => (
                e.as_response_error().status_code(),
                Some(e.as_response_error()),
            ),
        };
        span.record("http.status_code", i64::from(status.as_u16()));
        let server_error = status.is_server_error();
        span.record(
            "otel.status_code",
            if server_error { "ERROR" } else { "OK" },
        );
        if let Some(error) = error {
            span.record("exception.message", tracing::field::display(error));
        }
    }
}
