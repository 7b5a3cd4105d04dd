//! `stampede-load` (run as `stampede load`, which forwards here): rehearse a flash
//! sale against a running server, the way an operator does before the real day. It
//! prepares what it needs (users in bulk with tokens minted from the server's
//! secret, a sale opening at a given moment, or a poll), fires the storm with a light
//! HTTP/1.1 client of its own, shows a live progress line, prints throughput, latency
//! percentiles from an HDR histogram and every answer by kind, then checks the
//! invariants through the admin API and Postgres (after waiting for settlement) and
//! exits non-zero naming any that broke.
//!
//! Modes: `storm` (every user tries once, all released at the opening), `repeat`
//! (users keep trying for `--seconds`), `soldout` (a sale with no stock), `vote`
//! (users keep voting in a poll) and `healthz` (a trivial route: how fast this
//! generator itself is, to compare with `wrk`). `storm --waiting-room` rehearses a
//! sale with a waiting room: join, follow the line, buy when admitted
//! (`waiting/`); `storm --draw` a draw sale: enter, the draw, claims and passes
//! (`draws/`).
//!
//! A client, not part of the server: a package of its own (`load/`) over the
//! library's public types (`Config`, the token key and claims, `Id`) and
//! `stampede::rehearse`, the only way it reaches the stores, so the server carries
//! none of it. Its files import one another without a loop, each under 400 lines
//! (`shape.rs` checks both).

mod aim;
mod args;
mod ballots;
mod checks;
mod cleanup;
mod client;
mod draws;
mod fire;
mod latency;
mod prepare;
mod prepare_only;
mod progress;
mod report;
mod run;
mod waiting;

use clap::Parser;
use stampede::config::Config;

use args::LoadArgs;

/// Like the server's: a storm allocates and frees many small buffers, and this
/// client must cost far less than the server it measures.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One thread, as when this ran inside `stampede`'s own runtime: the rates it reports
/// (and `scripts/bench` compares with `wrk -t1`) are those of a single-threaded
/// client.
#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    stampede::telemetry::init();
    let args = LoadArgs::parse();
    match load(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn load(args: LoadArgs) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref())?;
    if args.cleanup {
        return cleanup::cleanup(&config, args.json).await;
    }
    let json = args.json;
    if !run::run(args, &config).await? {
        anyhow::bail!(if json {
            "an invariant broke (see the checks in the JSON report)"
        } else {
            "an invariant broke (see BROKEN above)"
        });
    }
    Ok(())
}

#[cfg(test)]
mod shape;
