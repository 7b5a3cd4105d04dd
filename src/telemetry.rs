//! Logging: human-readable lines by default, JSON with `STAMPEDE_LOG_FORMAT=json`;
//! the level comes from `RUST_LOG` (default `info`). Each request runs in a span
//! that carries its request id (tracing-actix-web). Refused requests (4xx) log at
//! debug, server errors at error; no colour codes unless stdout is a terminal.

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,actix_server=warn"));
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
