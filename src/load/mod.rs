//! `stampede load`: rehearse a flash sale against a running server, the way an
//! operator does before the real day. It prepares what it needs (users in bulk with
//! tokens minted from the server's secret, a sale opening at a given moment, or a
//! poll), fires the storm with a light HTTP/1.1 client of its own, shows a live
//! progress line, prints throughput, latency percentiles from an HDR histogram and
//! every answer by kind, then checks the invariants through the admin API and
//! Postgres (after waiting for settlement) and exits non-zero naming any that broke.
//!
//! Modes: `storm` (every user tries once, all released at the opening), `repeat`
//! (users keep trying for `--seconds`), `soldout` (a sale with no stock), `vote`
//! (users keep voting in a poll) and `healthz` (a trivial route: how fast this
//! generator itself is, to compare with `wrk`).

mod client;
mod prepare;
mod run;

use std::path::PathBuf;

use chrono::{DateTime, Utc};

pub use run::run;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every user tries to buy once, all released at the opening (like the real day).
    Storm,
    /// Users keep buying for --seconds (or --requests): repeat buyers after the first.
    Repeat,
    /// Buys of a sale with no stock left (answered from the server's sold-out flag).
    Soldout,
    /// Users keep voting in a poll.
    Vote,
    /// GET /healthz only: the generator's own ceiling, to compare with wrk.
    Healthz,
}

#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    /// What to fire.
    #[arg(value_enum)]
    pub mode: Mode,
    /// The server to drive (its base URL). Loopback only, unless --allow-remote.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Drive a server on another host, on purpose (a staging server you own).
    #[arg(long)]
    pub allow_remote: bool,
    /// Users to make (storm: each tries once; repeat and vote: they take turns).
    #[arg(long, default_value_t = 10_000)]
    pub users: usize,
    /// Units of the sale the run makes (storm, repeat).
    #[arg(long, default_value_t = 100)]
    pub stock: i64,
    /// Storm: seconds from now until the sale the run makes opens; the requests are
    /// released then, on connections opened before.
    #[arg(long, default_value_t = 3)]
    pub opens_in: u64,
    /// Storm: the moment the sale opens, an RFC 3339 time within the next day
    /// (`2030-06-01T12:00:00Z`, `2030-06-01T14:00:00+02:00`), instead of --opens-in.
    /// The sale the run makes opens then; with --sale, the storm is released then.
    #[arg(long, value_name = "TIME", conflicts_with = "opens_in", value_parser = parse_time)]
    pub opens_at: Option<DateTime<Utc>>,
    /// Use this existing sale instead of making one (storm, repeat, soldout).
    #[arg(long, conflicts_with = "poll")]
    pub sale: Option<i64>,
    /// Use this existing poll instead of making one (vote).
    #[arg(long)]
    pub poll: Option<i64>,
    /// Requests in flight at once (one connection each).
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// How long repeat, soldout, vote and healthz run.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Stop after this many requests (all modes but storm).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Send each user's requests with `X-Forwarded-For: <an address of its own>`, so
    /// that per-address limits see many clients. The server believes it only from a
    /// trusted proxy: start it with STAMPEDE_TRUSTED_PROXIES=127.0.0.1.
    #[arg(long)]
    pub forwarded_for: bool,
    /// Buy as the sale page does on a sale that requires purchase tickets: each
    /// attempt asks `POST /api/sales/{id}/ticket` first, then buys with it. The sale
    /// the run makes then requires tickets; latency is that of the pair.
    #[arg(long, conflicts_with = "prepare_only")]
    pub tickets: bool,
    /// How long to wait for settlement before the Postgres checks.
    #[arg(long, default_value_t = 60)]
    pub settle_timeout: u64,
    /// Print the report as one JSON object (for machines) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Only prepare, for an outside load generator (`wrk`, scripts/bench): write the
    /// request path (and, after a space, the JSON body), then one token per line.
    #[arg(long)]
    pub prepare_only: Option<PathBuf>,
    /// With --prepare-only: let every user make one request first (and fail unless
    /// each succeeds), so that every later request is a repeat.
    #[arg(long, requires = "prepare_only")]
    pub warm_up: bool,
}

/// `--opens-at`: an RFC 3339 time, with its offset.
fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("not an RFC 3339 time ({e}); for example 2030-06-01T12:00:00Z"))
}
