//! `stampede settle`: the settlement worker alone (the settling role), until
//! SIGINT or SIGTERM (then it commits and acknowledges the batch in hand); or,
//! with `--drain`, what is pending now. Unless `STAMPEDE_METRICS_LISTEN` is off,
//! it serves `/metrics` (settlement's counters: rows, errors, whether it holds
//! the settling lease) and `/healthz` on that address, as `serve`'s metrics
//! listener does, so a Prometheus (the Kubernetes ServiceMonitor) scrapes it too.

use std::sync::Arc;

use actix_web::{App, HttpResponse, HttpServer, web};

use super::server::listen;
use crate::config::Config;
use crate::keys::Keys;
use crate::metrics::Metrics;
use crate::settle::Settler;

/// Runs the settling role (see the module docs).
pub async fn settle(config: &Config, drain: bool) -> anyhow::Result<()> {
    let db = super::connect::connect_db(config).await?;
    let keys = Keys::new(&config.redis_namespace);
    let settler = Settler::connect(
        db,
        &crate::redis_conn::Target::from_config(config),
        keys,
        config.settle.clone(),
        super::settlers(),
    )
    .await?;
    if drain {
        return drain_all(settler).await;
    }
    let metrics = Arc::new(match config.metrics_listen {
        Some(_) => Metrics::default(),
        None => Metrics::off(),
    });
    let settler = settler.with_metrics(metrics.clone());
    let (tx, rx) = tokio::sync::watch::channel(false);
    let listener = match config.metrics_listen {
        Some(addr) => {
            let (port, server) = metrics_server(addr, metrics.clone())?;
            tracing::info!(%addr, port, "settling role: /metrics and /healthz");
            Some((server.handle(), tokio::spawn(server)))
        }
        None => None,
    };
    let upkeep = tokio::spawn(upkeep(metrics, rx.clone()));
    let worker = tokio::spawn(settler.run(rx));
    super::wait_for_signal().await; // SIGTERM too: how Kubernetes stops a pod
    let _ = tx.send(true);
    worker.await?;
    let _ = upkeep.await;
    if let Some((handle, server)) = listener {
        handle.stop(false).await;
        let _ = server.await;
    }
    Ok(())
}

/// The metrics listener of the settling role: `/metrics` and `/healthz` (200
/// while the process runs), and its port.
fn metrics_server(
    addr: std::net::SocketAddr,
    metrics: Arc<Metrics>,
) -> anyhow::Result<(u16, actix_web::dev::Server)> {
    let listener = listen(addr, 1024).map_err(|e| {
        anyhow::anyhow!(
            "cannot listen on {addr} (metrics): {e}; set STAMPEDE_METRICS_LISTEN to \
             another address, or to off"
        )
    })?;
    let port = listener.local_addr()?.port();
    let metrics = web::Data::from(metrics);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(metrics.clone())
            .route("/metrics", web::get().to(render))
            .route("/healthz", web::get().to(healthz))
    })
    .disable_signals()
    .workers(1)
    .shutdown_timeout(1)
    .listen(listener)?
    .run();
    Ok((port, server))
}

async fn render(metrics: web::Data<Metrics>) -> HttpResponse {
    metrics.observed.gauge(
        "stampede_settle_leading",
        "1 while this process's settlement worker holds the settling lease and reads the streams (settle.exclusive), else 0.",
        f64::from(u8::from(
            metrics
                .settle_leading
                .load(std::sync::atomic::Ordering::Relaxed),
        )),
    );
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(metrics.render())
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

/// Drains the histograms' pending samples, as `serve` does.
async fn upkeep(metrics: Arc<Metrics>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    while !*shutdown.borrow() {
        tokio::select! {
            _ = metrics.observed.until_upkeep() => {}
            _ = shutdown.changed() => break,
        }
        metrics.observed.upkeep();
    }
}

/// `--drain`: everything pending, a progress line on stderr every 2 s.
async fn drain_all(mut settler: Settler) -> anyhow::Result<()> {
    // A backlog of millions takes minutes: a line on stderr every 2 s.
    let started = std::time::Instant::now();
    let mut reported = started;
    let n = settler
        .drain_reporting(|rows| {
            if reported.elapsed() >= std::time::Duration::from_secs(2) {
                reported = std::time::Instant::now();
                eprintln!(
                    "settling: {rows} rows written so far, {:.0} a second",
                    rows as f64 / started.elapsed().as_secs_f64()
                );
            }
        })
        .await?;
    let secs = started.elapsed().as_secs_f64();
    if n == 0 {
        println!("nothing to settle");
    } else {
        println!(
            "settled {n} new orders and votes in {secs:.1} s ({:.0} a second)",
            n as f64 / secs.max(0.001)
        );
    }
    // What other readers hold was not this drain's to settle: say so, and fail,
    // so a script that drains before maintenance does not go on with orders left.
    let held = settler.held_by_others().await?;
    if held.is_empty() {
        return Ok(());
    }
    let left: usize = held.iter().map(|(_, n, _)| n).sum();
    for (name, n, idle_ms) in &held {
        eprintln!("still held by the settlement reader {name}: {n} entries (idle {idle_ms} ms)");
    }
    anyhow::bail!(
        "{left} entries left pending, held by other readers: a running worker settles its \
         own; a stopped one's are taken over once idle for claim_idle_ms \
         (STAMPEDE_SETTLE_CLAIM_IDLE_MS), by a running worker or by --drain again then"
    )
}
