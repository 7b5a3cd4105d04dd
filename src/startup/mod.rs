//! Building and running the server. [`Application::build`] binds the listener
//! (port 0 picks a free one, which tests use) and returns before serving, so the
//! caller learns the port first.

use std::net::TcpListener;

use crate::redis_conn::Target;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::{App, HttpServer, web};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::auth::token::TokenKey;
use crate::config::Config;
use crate::error::{AppError, ErrorCode};
use crate::recover::Recovery;
use crate::sale::SoldOutFlags;
use crate::settle::Settler;
use crate::state::AppState;

mod connect;
mod jobs;

use connect::{Pool, Stores, connect_pool, connect_stores};
pub use connect::{connect_db, connect_redis, connect_worker_redis, migrate};
pub use jobs::{EXPIRE_LOCK, expire_once};
use jobs::{expire_forever, sweep_forever, upkeep_forever};

/// How many finished handshakes the kernel holds for the acceptor (capped by
/// `net.core.somaxconn`, 4096 on current kernels). At a sale's opening thousands of
/// buyers connect in the same second; with std's default of 128 the kernel dropped
/// the rest and each of them waited out a 1 s SYN retry, or worse.
const LISTEN_BACKLOG: i32 = 4096;

/// A listening socket with our backlog. `std::net::TcpListener::bind` always listens
/// with 128, and actix's own `backlog` setting applies only to addresses it binds
/// itself, not to a listener handed to it.
fn listen(addr: std::net::SocketAddr, backlog: i32) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(backlog)?;
    Ok(socket.into())
}

pub struct Application {
    port: u16,
    server: Server,
    /// The listener that serves only `/metrics` (see `Config::metrics_listen`).
    metrics: Option<(u16, Server)>,
    state: web::Data<AppState>,
    shutdown: watch::Sender<bool>,
    settler: Option<JoinHandle<()>>,
    /// The sweep, the expiry, the ended-sessions feed, the metrics upkeep and the
    /// Postgres probe: each stops when `shutdown` turns true.
    background: Vec<JoinHandle<()>>,
    /// Turns true once the startup sweep has run (see [`Application::swept`]).
    swept: watch::Receiver<bool>,
}

impl Application {
    /// Connects to the stores, runs migrations, creates the configured admin,
    /// binds the listener and starts the background work: the sweep (whose first
    /// pass rebuilds what Redis lost, in the background: the listener is bound at
    /// once, and a request that needs a sale not rebuilt yet starts its rebuild
    /// and is answered 503 `recovering` meanwhile), settlement, expiry.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let stores = connect_stores(&config).await?;
        let metrics = Arc::new(if config.metrics_served() {
            crate::metrics::Metrics::default()
        } else {
            crate::metrics::Metrics::off()
        });
        let recovery = Recovery::new(
            stores.background.clone(),
            stores.redis.clone(),
            stores.keys.clone(),
            metrics.clone(),
            features(&config),
        );
        let mut redis = stores.redis.clone();
        // What has ended, from Postgres, before anything is served.
        let (sessions, sessions_resume) = crate::auth::session::Sessions::load(
            stores.keys.clone(),
            &stores.background,
            &mut redis,
        )
        .await
        .map_err(|e| anyhow::anyhow!("cannot load ended sessions: {e}"))?;
        let background_db = stores.background.clone();
        let queue_db = stores.background.clone();
        let state = app_state(&config, stores, metrics, recovery, sessions)?;

        let (shutdown, shutdown_rx) = watch::channel(false);
        let (swept_tx, swept) = watch::channel(false);
        let background = vec![
            tokio::spawn(sweep_forever(
                state.recovery.clone(),
                config.sweep,
                shutdown_rx.clone(),
                swept_tx,
            )),
            tokio::spawn(expire_forever(
                state.clone(),
                config.expire,
                shutdown_rx.clone(),
            )),
            tokio::spawn(state.sessions.clone().follow(
                sessions_resume,
                state.redis.clone(),
                crate::redis_conn::Target::from_config(&config),
                background_db,
                config.session_sync,
                shutdown_rx.clone(),
            )),
            tokio::spawn(upkeep_forever(state.clone(), shutdown_rx.clone())),
            tokio::spawn(crate::sale::queue::admit::admit_forever(
                queue_db,
                state.redis.clone(),
                state.keys.clone(),
                config.queue_admission,
                state.metrics.clone(),
                state.wake.rooms.clone(),
                shutdown_rx.clone(),
            )),
            tokio::spawn(crate::observe::probe_postgres(
                state.clone(),
                shutdown_rx.clone(),
            )),
        ];
        let settler = spawn_settler(&config, &state, shutdown_rx).await?;

        let listener = listen(config.listen, LISTEN_BACKLOG)
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
        let port = listener.local_addr()?.port();
        let server = http_server(&config, state.clone(), listener)?;
        let metrics = match config.metrics_listen {
            Some(addr) => Some(metrics_server(addr, state.clone())?),
            None => None,
        };
        Ok(Application {
            port,
            server,
            metrics,
            state,
            shutdown,
            settler,
            background,
            swept,
        })
    }

    /// Resolves once the startup sweep (the first pass of the sweep, which
    /// rebuilds every sale and poll Redis lost) has run, whether or not it
    /// repaired everything. Serving does not wait for it; tests that need a whole
    /// Redis before their first request do.
    pub fn swept(&self) -> impl std::future::Future<Output = ()> + use<> {
        let mut swept = self.swept.clone();
        async move {
            let _ = swept.wait_for(|done| *done).await;
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Port of the metrics listener, when there is one.
    pub fn metrics_port(&self) -> Option<u16> {
        self.metrics.as_ref().map(|(port, _)| *port)
    }

    pub fn state(&self) -> web::Data<AppState> {
        self.state.clone()
    }

    /// Serves until SIGINT or SIGTERM, then stops accepting, lets in-flight requests
    /// finish, and lets the settlement worker commit and acknowledge its batch.
    pub async fn run_until_signal(self) -> anyhow::Result<()> {
        let handle = self.server.handle();
        let server = tokio::spawn(self.server);
        let metrics = self.metrics.map(|(_, m)| (m.handle(), tokio::spawn(m)));
        wait_for_signal().await;
        tracing::info!("shutting down: no new connections, finishing in-flight requests");
        // Open pages' event streams never finish by themselves: end them first.
        self.state.live.close();
        handle.stop(true).await;
        if let Some((handle, server)) = metrics {
            handle.stop(false).await;
            let _ = server.await;
        }
        let _ = server.await;
        let _ = self.shutdown.send(true);
        if let Some(settler) = self.settler {
            let _ = settler.await;
        }
        for task in self.background {
            let _ = task.await;
        }
        tracing::info!("shut down cleanly");
        Ok(())
    }

    /// Serves until the server stops (tests spawn this).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let metrics = self.metrics.map(|(_, m)| (m.handle(), tokio::spawn(m)));
        let result = self.server.await;
        if let Some((handle, server)) = metrics {
            handle.stop(false).await;
            let _ = server.await;
        }
        let _ = self.shutdown.send(true);
        if let Some(settler) = self.settler {
            let _ = settler.await;
        }
        for task in self.background {
            let _ = task.await;
        }
        result
    }
}
/// The features whose Redis state the recovery driver rebuilds.
pub fn features(config: &Config) -> crate::recover::Features {
    crate::recover::Features {
        sales: Arc::new(crate::sale::rebuild::Sales {
            key_ttl: config.purchase_key_ttl,
        }),
        polls: Arc::new(crate::vote::rebuild::Polls),
    }
}

/// The features whose accepted decisions the settlement worker writes to
/// Postgres, in the order it tags their streams (orders first: a stream made by
/// [`crate::sale::settlement::stream`] alone is settled as orders).
pub fn settlers() -> Vec<Arc<dyn crate::settle::Settle>> {
    vec![
        Arc::new(crate::sale::settlement::Orders),
        Arc::new(crate::vote::settlement::Votes),
    ]
}

/// The state every request and background task shares.
fn app_state(
    config: &Config,
    stores: Stores,
    metrics: Arc<crate::metrics::Metrics>,
    recovery: Arc<Recovery>,
    sessions: crate::auth::session::Sessions,
) -> anyhow::Result<web::Data<AppState>> {
    let Stores {
        db, redis, keys, ..
    } = stores;
    let limits = crate::limit::Limits::from_config(&config.limits)
        .map_err(crate::config::ConfigError::Invalid)?;
    Ok(web::Data::new(AppState {
        metrics: metrics.clone(),
        tokens: TokenKey::new(config.token_secret.as_bytes()),
        tickets: crate::sale::ticket::TicketKey::new(config.token_secret.as_bytes()),
        ticket_rules: Default::default(),
        held_orders: Default::default(),
        sessions,
        sold_out: SoldOutFlags::new(config.sold_out_cache),
        limiter: crate::limit::Limiter::new(
            limits,
            redis.clone(),
            keys.clone(),
            metrics.clone(),
            config.trusted_proxies.clone(),
        ),
        cache: crate::cache::Cache::new(redis.clone()),
        recovery,
        live: Arc::new(crate::live::Feeds::new(config.live_interval, metrics)),
        postgres: Default::default(),
        wake: Default::default(),
        keys,
        redis,
        db,
        config: Arc::new(config.clone()),
    }))
}

/// The settlement worker of this process, unless `settle_in_serve` is off.
async fn spawn_settler(
    config: &Config,
    state: &AppState,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Option<JoinHandle<()>>> {
    if !config.settle_in_serve {
        return Ok(None);
    }
    let settler = Settler::connect(
        connect_pool(config, Pool::Settlement).await?,
        &Target::from_config(config),
        state.keys.clone(),
        config.settle.clone(),
        settlers(),
    )
    .await?
    .with_metrics(state.metrics.clone())
    .with_wakes(state.wake.settle.clone(), state.wake.expire.clone());
    Ok(Some(tokio::spawn(settler.run(shutdown))))
}

/// The HTTP server on `listener`: the middleware, the routes and what one client
/// may hold.
fn http_server(
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
    .max_connections(config.max_connections)
    .listen(listener)?;
    if config.workers > 0 {
        server = server.workers(config.workers);
    }
    Ok(server.run())
}

/// The listener that serves only `/metrics` (loopback by default), and its port.
fn metrics_server(
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

/// One worker's own Redis connection (and, with `replica_acks`, the connections of
/// its buy and vote batches) and batchers, made on the worker's thread.
async fn build_worker(state: web::Data<AppState>) -> anyhow::Result<crate::state::Worker> {
    use crate::batch::{Batcher, Connections, Counters};
    use crate::limit::Route;
    let redis = connect_worker_redis(&state.config).await?;
    let max = state.config.batch_max;
    // With replica acknowledgements a batch's `WAIT` holds its connection until a
    // replica answers: the buy and vote batchers then share `batch_in_flight`
    // connections of their own, a batch taking the least busy, so batches rarely
    // queue behind another's `WAIT`, and the worker's own connection (the queue's
    // and the held orders' batches, sessions) never does.
    let own = Connections::new(vec![redis.clone()]);
    let deciding = if state.config.replica_acks > 0 {
        let mut deciding = Vec::new();
        for _ in 0..state.config.batch_in_flight() {
            deciding.push(connect_worker_redis(&state.config).await?);
        }
        Connections::new(deciding)
    } else {
        own.clone()
    };
    Ok(crate::state::Worker {
        buys: Batcher::new(
            crate::sale::buy::BuyDecider {
                keys: state.keys.clone(),
                policies: state.limiter.limits().for_route(Route::Buy).to_vec(),
                replica_acks: crate::redis_conn::acks::ReplicaAcks::from_config(&state.config),
                key_ttl: state.config.purchase_key_ttl,
            },
            deciding.clone(),
            max,
            state.config.batch_in_flight(),
            Counters {
                metrics: state.metrics.clone(),
                batches: |m| &m.buy_batches,
                requests: |m| &m.buy_batched,
                sizes: |m| &m.observed.buy_batch_size,
            },
        ),
        votes: Batcher::new(
            crate::vote::cast::VoteDecider {
                keys: state.keys.clone(),
                policies: state.limiter.limits().for_route(Route::Vote).to_vec(),
                replica_acks: crate::redis_conn::acks::ReplicaAcks::from_config(&state.config),
            },
            deciding.clone(),
            max,
            state.config.batch_in_flight(),
            Counters {
                metrics: state.metrics.clone(),
                batches: |m| &m.vote_batches,
                requests: |m| &m.vote_batched,
                sizes: |m| &m.observed.vote_batch_size,
            },
        ),
        queue: Batcher::new(
            crate::sale::queue::join::QueueDecider {
                keys: state.keys.clone(),
            },
            own.clone(),
            max,
            state.config.batch_in_flight(),
            Counters {
                metrics: state.metrics.clone(),
                batches: |m| &m.queue_batches,
                requests: |m| &m.queue_batched,
                sizes: |m| &m.observed.queue_batch_size,
            },
        ),
        held: Batcher::new(
            crate::sale::held::HeldReader {
                db: state.db.clone(),
                redis: state.redis.clone(),
                keys: state.keys.clone(),
            },
            own,
            crate::sale::held::HELD_READ_MAX,
            crate::sale::held::HELD_READS_IN_FLIGHT,
            Counters {
                metrics: state.metrics.clone(),
                batches: |m| &m.held_batches,
                requests: |m| &m.held_batched,
                sizes: |m| &m.observed.held_batch_size,
            },
        ),
        redis,
    })
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn json_config(limit: usize, body_timeout: Duration) -> web::JsonConfig {
    web::JsonConfig::default()
        .limit(limit)
        .error_handler(move |err, _req| {
            use actix_web::error::JsonPayloadError as E;
            let e = match &err {
                E::OverflowKnownLength { .. } | E::Overflow { .. } => AppError::new(
                    ErrorCode::PayloadTooLarge,
                    format!("request body is larger than {limit} bytes"),
                ),
                E::Payload(p) => crate::conn::body_read_error(p, body_timeout),
                E::ContentType => AppError::new(
                    ErrorCode::UnsupportedMediaType,
                    "send the body as application/json",
                ),
                E::Deserialize(d) if d.is_data() => {
                    AppError::new(ErrorCode::InvalidBody, d.to_string())
                }
                E::Deserialize(d) => AppError::new(ErrorCode::InvalidJson, d.to_string()),
                other => AppError::new(ErrorCode::InvalidJson, other.to_string()),
            };
            e.into()
        })
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
const API_GROUPS: &[(Configure, RouteList)] = &[
    (crate::routes::sale::configure, crate::routes::sale::ROUTES),
    (crate::routes::vote::configure, crate::routes::vote::ROUTES),
    (crate::routes::auth::configure, crate::routes::auth::ROUTES),
    (crate::openapi::configure, crate::openapi::ROUTES),
];

fn api_scope() -> actix_web::Scope {
    API_GROUPS
        .iter()
        .fold(web::scope("/api"), |scope, (configure, _)| {
            scope.configure(*configure)
        })
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
