//! The command line of `stampede load` (`stampede-load`): the mode and its options.

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use clap::Parser;

/// What to fire.
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

/// `vote --ballot`: the kind of poll the run makes (issue 51), each voter's ballot
/// in its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Ballot {
    /// One option; with --allow-change a second ballot replaces the first.
    Single,
    /// 1 to --max-choices options, each counted once.
    Multi,
    /// --votes-per-user votes spent over several requests, at most
    /// --max-per-option on one option.
    Budget,
    /// 1 to --max-choices options, most preferred first (first preferences count).
    Ranked,
}

impl Ballot {
    pub fn as_str(self) -> &'static str {
        match self {
            Ballot::Single => "single",
            Ballot::Multi => "multi",
            Ballot::Budget => "budget",
            Ballot::Ranked => "ranked",
        }
    }
}

/// Rehearse a sale against a running server: prepare users and a sale (or poll),
/// fire a storm, print throughput, latency percentiles and every answer, then check
/// the invariants (exit 1 when one broke). See "Rehearse a sale" in docs/operations.md.
#[derive(Parser, Debug)]
#[command(name = "stampede load", version)]
pub struct LoadArgs {
    /// TOML config file, as for the server (its database URL and token secret);
    /// environment variables override it.
    #[arg(long, env = "STAMPEDE_CONFIG")]
    pub config: Option<PathBuf>,
    /// What to fire (not with --cleanup).
    #[arg(value_enum, required_unless_present = "cleanup")]
    mode: Option<Mode>,
    /// Fire nothing: remove every rehearsal sale (the sales this tool made) with
    /// its orders, payments, stock changes and Redis keys, and the users it made,
    /// from the database and Redis of the config (DATABASE_URL, REDIS_URL). Never
    /// touches a sale or user that is not a rehearsal one. Prints the counts.
    #[arg(long, conflicts_with_all = ["mode", "sale", "poll", "prepare_only"])]
    pub cleanup: bool,
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
    /// Vote: make a poll of this kind and let each voter send its ballots in that
    /// shape (single, multi, ranked: one, and a changed second one for a fifth of
    /// the voters; budget: the budget spent over several requests, some over it),
    /// with an `Idempotency-Key` each and some sent twice; then check every answer,
    /// the tallies and every receipt (see "A poll of each ballot kind" in docs/operations.md).
    /// Without it, vote is the plain repeat of one single-choice ballot.
    #[arg(long, value_enum, conflicts_with_all = ["poll", "sale"])]
    pub ballot: Option<Ballot>,
    /// With --ballot single, multi or ranked: the poll lets a voter replace its
    /// ballot (a fifth of the voters send a changed one, answered 202 `replaced`;
    /// without it their second ballot is 409 `already_voted`).
    #[arg(long, requires = "ballot")]
    pub allow_change: bool,
    /// With --ballot budget: each voter's budget (1 to 1000).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub votes_per_user: u32,
    /// With --ballot budget: most votes of a voter on one option (default: the
    /// budget).
    #[arg(long, requires = "ballot", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_per_option: Option<u32>,
    /// With --ballot multi or ranked: most options on one ballot (default: all 4).
    #[arg(long, requires = "ballot", value_parser = clap::value_parser!(u32).range(1..=4))]
    pub max_choices: Option<u32>,
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
    /// Storm: the sale the run makes has a waiting room (issue 29) whose line opens
    /// now: every user joins it before the opening, then follows its standing
    /// (`GET .../queue/me`, gently: often only when its turn is near) and buys with
    /// its admission's ticket when admitted. Prints joins/s, admissions/s against the
    /// set pace, passes and purchases, and checks the waiting room's invariants in
    /// Postgres (see "Rehearse a sale" in docs/operations.md). With --prepare-only:
    /// the request written is the join (`POST /api/sales/{id}/queue`), and with
    /// --warm-up every user is in the line (scripts/bench-queue).
    #[arg(long, conflicts_with_all = ["sale", "poll", "tickets"])]
    pub waiting_room: bool,
    /// With --waiting-room: shoppers admitted a second from the opening (1 to 100000).
    #[arg(long, default_value_t = 1000, requires = "waiting_room",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub admit_per_second: u32,
    /// Storm: the sale the run makes is a draw (issue 52) whose entries open now
    /// and whose draw is --opens-in seconds from now: every user enters before
    /// it, the run waits for the draw, then every user asks its standing and
    /// --claim-share percent of the winners buy with their win's ticket (the
    /// others let it pass); a few losers try to buy without one. When the claim
    /// windows end within --claim-wait seconds, the run waits for the unclaimed
    /// wins to pass and the next winners buy too. Checks one entry per account,
    /// exactly one draw, the published draw recomputed from its seed (as
    /// `stampede verify-draw`), only winners bought, no unit twice, and the stock
    /// in Redis and Postgres (see "Rehearse a sale" in docs/operations.md).
    /// With --prepare-only: the request written is the entry
    /// (`POST /api/sales/{id}/entry`) of a draw --opens-in seconds ahead, and
    /// with --warm-up every user has entered (scripts/bench-queue).
    #[arg(long, conflicts_with_all = ["sale", "poll", "tickets", "waiting_room"])]
    pub draw: bool,
    /// With --draw: percent of the winners who buy (the others let their win pass).
    #[arg(long, default_value_t = 80, requires = "draw",
          value_parser = clap::value_parser!(u32).range(0..=100))]
    pub claim_share: u32,
    /// With --draw: the longest the run waits for unclaimed wins to pass, in
    /// seconds from the draw. A sale's claim window is at least 60 s; a server
    /// started with STAMPEDE_DRAW_CLAIM_MAX_MS shortens it (a rehearsal server).
    /// When the claims end later, the passes are not rehearsed (the report says so).
    #[arg(long, default_value_t = 90, requires = "draw")]
    pub claim_wait: u64,
    /// Send purchases without an `Idempotency-Key` (by default each purchase has a
    /// new one, and a storm retries an ambiguous answer with the same key).
    #[arg(long)]
    pub no_keys: bool,
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
    /// each succeeds), so that every later request is a repeat. A user answered 503
    /// or not at all is asked again, up to five tries, and then an `already_*`
    /// answer counts as success (the first request went through).
    #[arg(long, requires = "prepare_only")]
    pub warm_up: bool,
}

impl LoadArgs {
    /// What to fire (the argument is required unless --cleanup, which fires nothing).
    pub fn mode(&self) -> Mode {
        self.mode.unwrap_or(Mode::Storm)
    }
}

/// `--opens-at`: an RFC 3339 time, with its offset.
fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("not an RFC 3339 time ({e}); for example 2030-06-01T12:00:00Z"))
}
