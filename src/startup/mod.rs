//! Building and running the server. [`Application::build`] binds the listener
//! (port 0 picks a free one, which tests use) and returns before serving, so the
//! caller learns the port first.

use crate::redis_conn::Target;
use std::sync::Arc;

use actix_web::dev::Server;
use actix_web::web;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::auth::token::TokenKey;
use crate::config::Config;
use crate::recover::Recovery;
use crate::sale::SoldOutFlags;
use crate::settle::Settler;
use crate::state::AppState;

mod connect;
mod jobs;
mod server;
pub mod settle_role;
mod worker;

use connect::{Pool, Stores, connect_pool, connect_stores};
pub use connect::{connect_db, connect_redis, connect_worker_redis, migrate};
pub use jobs::{EXPIRE_LOCK, expire_once};
use jobs::{expire_forever, sweep_forever, upkeep_forever};
pub use server::api_routes;
use server::{LISTEN_BACKLOG, http_server, listen, metrics_server};

/// How long `serve` may take to stop after its drain period: the requests in
/// flight (up to 10 s, the HTTP server's shutdown timeout), then the settlement
/// worker's batch and the background jobs. Past it the process exits anyway.
pub const STOP_BOUND: std::time::Duration = std::time::Duration::from_secs(15);

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
        .map_err(|e| anyhow::Error::from(e).context("cannot load ended sessions"))?;
        // In the roster before anything is accepted (see `crate::roster`).
        let roster = crate::roster::Roster::join(&stores.background)
            .await
            .map_err(|e| {
                anyhow::Error::from(e).context("cannot join the server roster in Postgres")
            })?;
        let roster_db = connect_pool(&config, Pool::Roster).await?;
        let background_db = stores.background.clone();
        let queue_db = stores.background.clone();
        let draw_db = stores.background.clone();
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
            tokio::spawn(crate::sale::draw::run::draw_forever(
                draw_db,
                state.redis.clone(),
                state.keys.clone(),
                config.draw_claim_max,
                state.wake.draws.clone(),
                shutdown_rx.clone(),
            )),
            tokio::spawn(roster.serve(
                roster_db,
                config.database_url.clone(),
                vec![
                    state.kept.clone() as Arc<dyn crate::roster::Keeper>,
                    state.kept_votes.clone(),
                ],
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

    /// Serves until SIGINT or SIGTERM, then drains: `/readyz` answers 503 for
    /// `drain_ms` while every route still answers (each answer closing its
    /// connection); then it stops accepting, ends the event streams (a last
    /// `retry:` asks pages to reconnect within 1 to 3 s), finishes the requests in
    /// flight, batches included (up to 10 s), and lets the settlement worker commit
    /// and acknowledge its batch. It returns within `drain_ms` +
    /// [`STOP_BOUND`] whatever hangs (a warning says what was cut short).
    pub async fn run_until_signal(self) -> anyhow::Result<()> {
        let handle = self.server.handle();
        let server = tokio::spawn(self.server);
        let metrics = self.metrics.map(|(_, m)| (m.handle(), tokio::spawn(m)));
        wait_for_signal().await;
        let drain = self.state.config.drain;
        let rest = Stopping {
            state: self.state,
            handle,
            server,
            metrics,
            shutdown: self.shutdown,
            settler: self.settler,
            background: self.background,
        };
        tokio::select! {
            () = rest.stop(drain) => tracing::info!("shut down cleanly"),
            () = tokio::time::sleep(drain + STOP_BOUND) => tracing::warn!(
                bound_ms = (drain + STOP_BOUND).as_millis() as u64,
                "stopping took longer than the drain and its bound: exiting now (what \
                 settlement did not acknowledge is taken over after claim_idle_ms)"
            ),
        }
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
        polls: Arc::new(crate::vote::rebuild::Polls {
            key_ttl: config.purchase_key_ttl,
        }),
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
    if !config.limits.enabled {
        // Worth a line in the log: the start box says it too (scripts/start-box).
        tracing::warn!(
            "rate limits are off (STAMPEDE_LIMITS=off, or enabled = false under [limits])"
        );
    }
    Ok(web::Data::new(AppState {
        metrics: metrics.clone(),
        tokens: TokenKey::new(config.token_secret.as_bytes()),
        tickets: crate::sale::ticket::TicketKey::new(config.token_secret.as_bytes()),
        ticket_rules: Default::default(),
        gates: crate::gate::Keeper::new(config.token_secret.as_bytes()),
        held_orders: Default::default(),
        kept: crate::sale::kept::KeptOrders::new(crate::sale::settlement::Orders, metrics.clone()),
        kept_votes: crate::vote::kept::KeptVotes::new(
            crate::vote::settlement::Votes,
            metrics.clone(),
        ),
        sessions,
        sold_out: SoldOutFlags::new(config.sold_out_cache),
        limiter: crate::limit::http::Limiter::new(
            limits,
            redis.clone(),
            keys.clone(),
            metrics.clone(),
            config.trusted_proxies.clone(),
        ),
        cache: crate::cache::Cache::new(redis.clone()),
        recovery,
        live: Arc::new(crate::live::Feeds::new(
            config.live_interval,
            config.max_streams_per_client,
            metrics,
        )),
        postgres: Default::default(),
        draining: Default::default(),
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

/// Returns on SIGINT or SIGTERM (what Kubernetes and systemd send to stop a process).
pub async fn wait_for_signal() {
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

/// What is left to stop once SIGTERM (or SIGINT) came.
struct Stopping {
    state: web::Data<AppState>,
    handle: actix_web::dev::ServerHandle,
    server: JoinHandle<std::io::Result<()>>,
    metrics: Option<(
        actix_web::dev::ServerHandle,
        JoinHandle<std::io::Result<()>>,
    )>,
    shutdown: watch::Sender<bool>,
    settler: Option<JoinHandle<()>>,
    background: Vec<JoinHandle<()>>,
}

impl Stopping {
    /// The drain, then everything in order (see [`Application::run_until_signal`]).
    async fn stop(self, drain: std::time::Duration) {
        tracing::info!(
            drain_ms = drain.as_millis() as u64,
            "stopping: /readyz answers 503, still serving for the drain period"
        );
        self.state
            .draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
        // A second signal (an impatient Ctrl-C) cuts the drain short.
        tokio::select! {
            _ = tokio::time::sleep(drain) => {}
            _ = wait_for_signal() => {}
        }
        tracing::info!("shutting down: no new connections, finishing in-flight requests");
        // Open pages' event streams never finish by themselves: end them first.
        self.state.live.close();
        self.handle.stop(true).await;
        if let Some((handle, server)) = self.metrics {
            handle.stop(false).await;
            let _ = server.await;
        }
        let _ = self.server.await;
        let _ = self.shutdown.send(true);
        if let Some(settler) = self.settler {
            let _ = settler.await;
        }
        for task in self.background {
            let _ = task.await;
        }
    }
}
