//! The HTTP side: the listener, the server with its middleware and routes, the
//! metrics listener, and how a malformed body, path or query is answered.

use std::net::TcpListener;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::{App, HttpServer, web};

use super::worker::build_worker;
use crate::config::Config;
use crate::error::{AppError, ErrorCode};
use crate::state::AppState;

/// How many finished handshakes the kernel holds for the acceptor (capped by
/// `net.core.somaxconn`, 4096 on current kernels). At a sale's opening thousands of
/// buyers connect in the same second; with std's default of 128 the kernel dropped
/// the rest and each of them waited out a 1 s SYN retry, or worse.
pub(super) const LISTEN_BACKLOG: i32 = 4096;

/// A listening socket with our backlog. `std::net::TcpListener::bind` always listens
/// with 128, and actix's own `backlog` setting applies only to addresses it binds
/// itself, not to a listener handed to it.
pub(super) fn listen(addr: std::net::SocketAddr, backlog: i32) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(backlog)?;
    Ok(socket.into())
}

/// The HTTP server on `listener`: the middleware, the routes and what one client
/// may hold.
pub(super) fn http_server(
    config: &Config,
    state: web::Data<AppState>,
    listener: TcpListener,
) -> anyhow::Result<Server> {
    let max_body = config.max_body_bytes;
    let body_timeout = config.body_timeout;
    let client_limits = web::Data::new(crate::conn::ClientLimits {
        max_header_bytes: config.max_header_bytes,
        body_timeout,
        // A storm's most frequent request, answered before routing.
        early: Some(crate::routes::sale::sold_out_before_routing),
        draining: |req| {
            req.app_data::<web::Data<AppState>>()
                .is_some_and(|s| s.draining.load(std::sync::atomic::Ordering::Relaxed))
        },
    });
    let mut server = HttpServer::new(move || {
        let worker_state = state.clone();
        App::new()
            .wrap(actix_web::middleware::from_fn(crate::conn::guard))
            // Outside the client limits: a request they refuse is timed too.
            .wrap(actix_web::middleware::from_fn(crate::observe::measure))
            .wrap(tracing_actix_web::TracingLogger::<
                crate::telemetry::RequestSpan,
            >::new())
            .app_data(client_limits.clone())
            .data_factory(move || build_worker(worker_state.clone()))
            .app_data(state.clone())
            .app_data(json_config(max_body, body_timeout))
            .app_data(path_config())
            .app_data(query_config())
            .app_data(web::PayloadConfig::new(max_body))
            .configure(crate::routes::health::configure)
            .route("/metrics", web::get().to(crate::observe::guarded_endpoint))
            // The JSON API in one scope: a page or static request never runs
            // through the API's patterns, and the other way round.
            .service(api_scope())
            .configure(crate::web::configure)
            .default_service(web::to(crate::web::fallback))
    })
    // We handle SIGTERM/SIGINT ourselves, to stop settlement in order.
    .disable_signals()
    .shutdown_timeout(10)
    // What one client can hold (docs/api.md, "Limits on connections"): the head must
    // come within client_request_timeout (else 408, or a silent close when
    // nothing came), idle keep-alive connections close, each worker holds at
    // most max_connections; a response not taken within a second is dropped.
    .client_request_timeout(config.client_request_timeout)
    .client_disconnect_timeout(Duration::from_secs(1))
    .keep_alive(config.keep_alive)
    .max_connections(fit_connections(config))
    .listen(listener)?;
    if config.workers > 0 {
        server = server.workers(config.workers);
    }
    Ok(server.run())
}

/// Descriptors kept for everything but the clients' connections (Redis and
/// Postgres pools, blocking readers, files, the runtime's own), at most a quarter
/// of the limit.
const RESERVED_FDS: u64 = 1024;

/// `max_connections` per worker, lowered where the workers together could hold
/// more client connections than the process may open files (after raising its
/// soft limit to the hard one): a process out of descriptors can open no Redis or
/// Postgres connection and answers nobody, where a worker at its cap only stops
/// accepting for a while (new clients wait in the listen backlog).
fn fit_connections(config: &Config) -> usize {
    let workers = if config.workers > 0 {
        config.workers
    } else {
        std::thread::available_parallelism().map_or(1, usize::from)
    } as u64;
    let limit = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(e) => {
            tracing::debug!(error = %e, "open-files limit not read");
            return config.max_connections;
        }
    };
    let per_worker = fitted(config.max_connections, limit, workers);
    if per_worker < config.max_connections {
        tracing::info!(
            max_connections = config.max_connections,
            fitted = per_worker,
            open_files_limit = limit,
            workers,
            "max_connections lowered to fit the open-files limit (raise `ulimit -n` to keep it)"
        );
    }
    per_worker
}

/// The connections per worker that `workers` workers may hold within an open-files
/// `limit`, at most `wanted` and at least 1.
fn fitted(wanted: usize, limit: u64, workers: u64) -> usize {
    let reserved = RESERVED_FDS.min(limit / 4);
    let per_worker = limit.saturating_sub(reserved) / workers.max(1);
    usize::try_from(per_worker).map_or(wanted, |n| n.clamp(1, wanted.max(1)))
}

/// The listener that serves only `/metrics` (loopback by default), and its port.
pub(super) fn metrics_server(
    addr: std::net::SocketAddr,
    state: web::Data<AppState>,
) -> anyhow::Result<(u16, Server)> {
    let listener = listen(addr, 1024).map_err(|e| {
        anyhow::anyhow!(
            "cannot listen on {addr} (metrics): {e}; another Stampede may hold \
                 it: set STAMPEDE_METRICS_LISTEN to another address, or to off"
        )
    })?;
    let port = listener.local_addr()?.port();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .route("/metrics", web::get().to(crate::observe::endpoint))
    })
    .disable_signals()
    .workers(1)
    .shutdown_timeout(1)
    .listen(listener)?
    .run();
    Ok((port, server))
}

fn json_config(limit: usize, body_timeout: Duration) -> web::JsonConfig {
    web::JsonConfig::default()
        .limit(limit)
        .error_handler(move |err, _req| crate::conn::json_error(&err, limit, body_timeout).into())
}

fn path_config() -> web::PathConfig {
    web::PathConfig::default()
        .error_handler(|err, _| AppError::new(ErrorCode::InvalidPath, err.to_string()).into())
}

fn query_config() -> web::QueryConfig {
    web::QueryConfig::default()
        .error_handler(|err, _| AppError::new(ErrorCode::InvalidQuery, err.to_string()).into())
}

type Configure = fn(&mut web::ServiceConfig);
type RouteList = &'static [(&'static str, &'static str)];

/// The JSON API's route groups, mounted under `/api`. One table builds the scope and
/// lists the routes ([`api_routes`]), so the OpenAPI test checks what is served.
/// The router tries the patterns in this order, a regex match for each dynamic one:
/// the purchase and the vote, the storms' routes, come first.
const API_GROUPS: &[(Configure, RouteList)] = &[
    (
        crate::routes::sale::configure_hot,
        crate::routes::sale::HOT_ROUTES,
    ),
    (
        crate::routes::vote::configure_hot,
        crate::routes::vote::HOT_ROUTES,
    ),
    (crate::routes::sale::configure, crate::routes::sale::ROUTES),
    (crate::routes::vote::configure, crate::routes::vote::ROUTES),
    (crate::routes::auth::configure, crate::routes::auth::ROUTES),
    (
        crate::routes::challenge::configure,
        crate::routes::challenge::ROUTES,
    ),
    (crate::openapi::configure, crate::openapi::ROUTES),
];

/// The JSON API's scope. Every answer says `nosniff`: a browser never reads an
/// answer (a CSV, a JSON body holding user text) as another type than it says.
fn api_scope() -> actix_web::Scope<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    API_GROUPS
        .iter()
        .fold(web::scope("/api"), |scope, (configure, _)| {
            scope.configure(*configure)
        })
        .wrap(
            actix_web::middleware::DefaultHeaders::new()
                .add((actix_web::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff")),
        )
}

/// Every route of the API and the health checks as `(method, full path)`: what the
/// OpenAPI document must describe (`/metrics` and the pages are not part of it).
pub fn api_routes() -> Vec<(&'static str, String)> {
    let api = API_GROUPS.iter().flat_map(|(_, routes)| {
        routes
            .iter()
            .map(|(method, path)| (*method, format!("/api{path}")))
    });
    crate::routes::health::HEALTH_ROUTES
        .iter()
        .map(|(method, path)| (*method, path.to_string()))
        .chain(api)
        .collect()
}

#[cfg(test)]
mod fit_tests {
    use super::fitted;

    #[test]
    fn connections_fit_the_open_files_limit() {
        // The reported case: 2 workers of 25,000 under a limit of 20,000.
        assert_eq!(fitted(25_000, 20_000, 2), 9_488);
        // A limit with room: the setting as it is.
        assert_eq!(fitted(25_000, 1_048_576, 2), 25_000);
        // A small limit keeps three quarters for clients.
        assert_eq!(fitted(25_000, 1_024, 2), 384);
        assert_eq!(fitted(25_000, 0, 2), 1);
    }
}
