//! Distributions for `/metrics`, on the `metrics` crate and its Prometheus exporter
//! (a recorder of this process's own, not the global one: each server in a test
//! process keeps its own numbers): request latency by route and status class, the
//! batch sizes of the buy and vote paths, the duration of each settlement batch,
//! and, read at each scrape, the settlement lag of every open sale and poll. The
//! plain counters stay the sharded ones of [`crate::metrics`] (a relaxed add on the
//! hot path); this module renders after them. The middleware that times requests
//! and the scrape-time reads live in [`crate::observe`], which holds the state.

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ::metrics::{Counter, Histogram, Key, Label, Level, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use metrics_util::MetricKindMask;
use tokio::sync::Notify;

/// How often `serve` drains the histograms' pending samples (see
/// [`Observed::upkeep`]): at 100,000 requests a second, 250 ms holds about 25,000
/// samples at most. Every 5 s was measured too: the held samples and the
/// allocator's slack around them made RSS saw between 72 and 100 MB in
/// `scripts/soak` with metrics on. At 1 s RSS still stepped up by 5 to 10 MB in a
/// 40 s run (an upkeep late under load, the allocator keeping what the larger
/// backlog took), only with metrics on. After an interval in which nothing was
/// recorded the loop waits for the next sample instead ([`Observed::until_upkeep`]):
/// an idle server is not woken four times a second for nothing.
pub const UPKEEP_EVERY: Duration = Duration::from_millis(250);
/// How long a gauge nobody sets stays in `/metrics`.
const GAUGE_IDLE_SECS: u64 = 120;
const REQUEST_SECONDS: &str = "stampede_http_request_duration_seconds";
const BUY_BATCH: &str = "stampede_buy_batch_size";
const VOTE_BATCH: &str = "stampede_vote_batch_size";
const QUEUE_BATCH: &str = "stampede_queue_batch_size";
const HELD_BATCH: &str = "stampede_held_batch_size";
const ENTRY_BATCH: &str = "stampede_entry_batch_size";
const SETTLE_SECONDS: &str = "stampede_settle_batch_duration_seconds";
const STREAM_ENTRIES: &str = "stampede_settle_stream_entries";
const PENDING_ENTRIES: &str = "stampede_settle_pending_entries";
const STOCK_LEFT: &str = "stampede_sale_stock_left";
const QUEUE_WAITING: &str = "stampede_queue_waiting";
const QUEUE_OPEN: &str = "stampede_queue_admissions_open";
const LIMIT_DECISIONS: &str = "stampede_limit_decisions_total";

static META: Metadata<'static> = Metadata::new("stampede", Level::INFO, None);

/// Status classes of final answers, as labels, by the first digit of the status.
const CLASSES: [&str; 4] = ["2xx", "3xx", "4xx", "5xx"];

pub struct Observed {
    /// False when nothing will ever scrape: requests are not timed at all.
    enabled: bool,
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// Latency histograms by route pattern, one per status class. Registered the
    /// first time a route answers; read-locked on every request after that.
    requests: RwLock<HashMap<String, [Histogram; 4]>>,
    /// Limiter decisions by policy, one counter per answer (allowed, denied, never).
    limits: RwLock<HashMap<String, [Counter; 3]>>,
    pub buy_batch_size: Histogram,
    pub vote_batch_size: Histogram,
    pub queue_batch_size: Histogram,
    pub held_batch_size: Histogram,
    pub entry_batch_size: Histogram,
    pub settle_batch_seconds: Histogram,
    /// Set by the first sample after an upkeep (see [`Observed::touched`]): an
    /// upkeep loop that found nothing new waits on `wake` instead of a timer.
    dirty: AtomicBool,
    wake: Notify,
}

impl Default for Observed {
    fn default() -> Self {
        let seconds = [
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
        ];
        let sizes = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];
        let recorder = PrometheusBuilder::new()
            // The per-sale and per-poll gauges are set on every scrape while the sale
            // or poll is open (or ended less than ten minutes ago); after that nothing
            // sets them, and they leave the output instead of showing their last value
            // for ever.
            .idle_timeout(
                MetricKindMask::GAUGE,
                Some(Duration::from_secs(GAUGE_IDLE_SECS)),
            )
            .set_buckets_for_metric(Matcher::Full(REQUEST_SECONDS.into()), &seconds)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(SETTLE_SECONDS.into()), &seconds))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(BUY_BATCH.into()), &sizes))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(VOTE_BATCH.into()), &sizes))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(QUEUE_BATCH.into()), &sizes))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(HELD_BATCH.into()), &sizes))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(ENTRY_BATCH.into()), &sizes))
            .expect("non-empty bucket lists")
            .build_recorder();
        let describe = |name: &'static str, unit: Unit, help: &'static str| {
            recorder.describe_histogram(name.into(), Some(unit), SharedString::const_str(help));
        };
        describe(
            REQUEST_SECONDS,
            Unit::Seconds,
            "Time from a request's arrival to its answer's head, by route pattern and status class.",
        );
        describe(
            BUY_BATCH,
            Unit::Count,
            "Purchases decided by one purchase script call.",
        );
        describe(
            QUEUE_BATCH,
            Unit::Count,
            "Joins and position queries of a waiting room answered by one script call.",
        );
        describe(
            HELD_BATCH,
            Unit::Count,
            "Refusals whose buyer's orders one read answered (already_bought).",
        );
        describe(
            ENTRY_BATCH,
            Unit::Count,
            "Draw entries of one sale written or found by one Postgres transaction.",
        );
        describe(
            VOTE_BATCH,
            Unit::Count,
            "Votes decided by one vote script call.",
        );
        describe(
            SETTLE_SECONDS,
            Unit::Seconds,
            "One settlement batch: the Postgres transaction and the acknowledgement in Redis.",
        );
        recorder.describe_gauge(
            STREAM_ENTRIES.into(),
            Some(Unit::Count),
            SharedString::const_str(
                "Accepted orders or votes of an open sale or poll not yet settled into Postgres (its stream's length).",
            ),
        );
        recorder.describe_gauge(
            PENDING_ENTRIES.into(),
            Some(Unit::Count),
            SharedString::const_str(
                "Entries of an open sale's or poll's stream delivered to a settlement worker and not yet acknowledged.",
            ),
        );
        recorder.describe_counter(
            LIMIT_DECISIONS.into(),
            Some(Unit::Count),
            SharedString::const_str(
                "What each rate-limit policy answered, for the answers that report it: allowed (an answer with RateLimit headers: a buy's or vote's 202, any answer of the routes limited outside the decision), denied (429) or never (422). A buy or vote the script refused otherwise (already bought, sold out) counts toward the limit but not here.",
            ),
        );
        recorder.describe_gauge(
            STOCK_LEFT.into(),
            Some(Unit::Count),
            SharedString::const_str("Units left of an open sale, as Redis holds them."),
        );
        recorder.describe_gauge(
            QUEUE_WAITING.into(),
            Some(Unit::Count),
            SharedString::const_str(
                "People in a sale's waiting room not yet reached by admission (the line's length still to serve).",
            ),
        );
        recorder.describe_gauge(
            QUEUE_OPEN.into(),
            Some(Unit::Count),
            SharedString::const_str(
                "Admissions of a sale's waiting room running now (admitted, not yet bought or expired).",
            ),
        );
        let histogram =
            |name: &'static str| recorder.register_histogram(&Key::from_name(name), &META);
        Observed {
            enabled: true,
            buy_batch_size: histogram(BUY_BATCH),
            vote_batch_size: histogram(VOTE_BATCH),
            queue_batch_size: histogram(QUEUE_BATCH),
            held_batch_size: histogram(HELD_BATCH),
            entry_batch_size: histogram(ENTRY_BATCH),
            settle_batch_seconds: histogram(SETTLE_SECONDS),
            handle: recorder.handle(),
            requests: RwLock::new(HashMap::new()),
            limits: RwLock::new(HashMap::new()),
            recorder,
            dirty: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }
}

impl Observed {
    /// Records nothing: for a process whose `/metrics` nobody can read. The
    /// exporter's histograms keep every sample until a render or an upkeep drains
    /// it, so recording into a recorder nobody renders would grow without bound.
    pub fn off() -> Self {
        Observed {
            enabled: false,
            buy_batch_size: Histogram::noop(),
            vote_batch_size: Histogram::noop(),
            queue_batch_size: Histogram::noop(),
            held_batch_size: Histogram::noop(),
            entry_batch_size: Histogram::noop(),
            settle_batch_seconds: Histogram::noop(),
            ..Observed::default()
        }
    }

    /// Drains the samples histograms hold since the last render into their
    /// buckets, and drops gauges idle past their timeout. The exporter does this
    /// only when asked: without it, every sample recorded between two scrapes
    /// (or for ever, when nothing scrapes) stays in memory. `serve` calls it every
    /// [`UPKEEP_EVERY`] while samples come.
    pub fn upkeep(&self) {
        if self.enabled {
            self.handle.run_upkeep();
        }
    }

    /// Says a sample was recorded (call it after recording): wakes an upkeep loop
    /// that waits for one. One relaxed load per sample while samples come (the
    /// flag is already set).
    pub fn touched(&self) {
        if !self.dirty.load(Ordering::Relaxed) && !self.dirty.swap(true, Ordering::AcqRel) {
            self.wake.notify_one();
        }
    }

    /// The upkeep loop's pause: [`UPKEEP_EVERY`] while samples come; after an
    /// interval with none, until the next one (an idle server's upkeep does not
    /// wake it at all).
    pub async fn until_upkeep(&self) {
        tokio::time::sleep(UPKEEP_EVERY).await;
        if !self.dirty.swap(false, Ordering::AcqRel) {
            // A sample recorded after the swap leaves a permit: no wait then.
            self.wake.notified().await;
            self.dirty.store(false, Ordering::Release);
            tokio::time::sleep(UPKEEP_EVERY).await;
        }
    }

    /// Records one answered request.
    pub fn request(&self, route: &str, status: u16, took: Duration) {
        if !self.enabled {
            return;
        }
        let class = usize::from(status / 100).clamp(2, 5) - 2;
        with_handles(
            &self.requests,
            route,
            |histograms| histograms[class].record(took.as_secs_f64()),
            || {
                CLASSES.map(|status| {
                    let labels = vec![
                        Label::new("route", route.to_string()),
                        Label::new("status", status),
                    ];
                    self.recorder
                        .register_histogram(&Key::from_parts(REQUEST_SECONDS, labels), &META)
                })
            },
        );
        self.touched();
    }

    /// Counts one policy's answer for one request: `answer` 0 allowed, 1 denied,
    /// 2 never.
    pub fn limit_decision(&self, policy: &str, answer: usize) {
        const ANSWERS: [&str; 3] = ["allowed", "denied", "never"];
        if !self.enabled {
            return;
        }
        with_handles(
            &self.limits,
            policy,
            |counters| counters[answer].increment(1),
            || {
                ANSWERS.map(|answer| {
                    let labels = vec![
                        Label::new("policy", policy.to_string()),
                        Label::new("answer", answer),
                    ];
                    self.recorder
                        .register_counter(&Key::from_parts(LIMIT_DECISIONS, labels), &META)
                })
            },
        );
    }

    /// Sets the settlement-lag gauges of one sale's or poll's stream. A sale's
    /// carry `rehearsal="true"` or `"false"` (`stampede load`'s sales), so that
    /// dashboards and alerts can leave rehearsals out; a poll's have no such label.
    pub fn settlement_lag(
        &self,
        kind: &'static str,
        id: i64,
        rehearsal: Option<bool>,
        entries: u64,
        pending: u64,
    ) {
        for (name, value) in [(STREAM_ENTRIES, entries), (PENDING_ENTRIES, pending)] {
            let mut labels = vec![Label::new("kind", kind), Label::new("id", id.to_string())];
            if let Some(rehearsal) = rehearsal {
                labels.push(Label::new("rehearsal", rehearsal_label(rehearsal)));
            }
            self.recorder
                .register_gauge(&Key::from_parts(name, labels), &META)
                .set(value as f64);
        }
    }

    /// Sets the stock-left gauge of one sale (labelled `rehearsal` as above).
    pub fn stock_left(&self, id: i64, rehearsal: bool, left: i64) {
        let labels = vec![
            Label::new("id", id.to_string()),
            Label::new("rehearsal", rehearsal_label(rehearsal)),
        ];
        self.recorder
            .register_gauge(&Key::from_parts(STOCK_LEFT, labels), &META)
            .set(left as f64);
    }

    /// Sets the waiting-room gauges of one sale: people waiting, admissions open.
    pub fn queue(&self, id: i64, waiting: i64, open: i64) {
        for (name, value) in [(QUEUE_WAITING, waiting), (QUEUE_OPEN, open)] {
            self.recorder
                .register_gauge(
                    &Key::from_parts(name, vec![Label::new("id", id.to_string())]),
                    &META,
                )
                .set(value as f64);
        }
    }

    /// Sets the counter `name` to `value`, for counters kept elsewhere (the sharded
    /// counters of [`super::Metrics`], the cache's and the lock's): the same
    /// recorder renders them with everything else. Scrape time only.
    pub fn counter_total(&self, name: &'static str, help: &'static str, value: u64) {
        self.recorder
            .describe_counter(name.into(), None, SharedString::const_str(help));
        self.recorder
            .register_counter(&Key::from_static_name(name), &META)
            .absolute(value);
    }

    /// Sets the gauge `name` to `value` (scrape time only).
    pub fn gauge(&self, name: &'static str, help: &'static str, value: f64) {
        self.recorder
            .describe_gauge(name.into(), None, SharedString::const_str(help));
        self.recorder
            .register_gauge(&Key::from_static_name(name), &META)
            .set(value);
    }

    /// The Prometheus text of everything above.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

fn rehearsal_label(rehearsal: bool) -> &'static str {
    if rehearsal { "true" } else { "false" }
}

/// Runs `use_` on the handles registered for `name`: under the read lock when they
/// exist (every request after the first of a route or policy), else registered by
/// `register` under the write lock.
fn with_handles<H, const N: usize>(
    map: &RwLock<HashMap<String, [H; N]>>,
    name: &str,
    use_: impl FnOnce(&[H; N]),
    register: impl FnOnce() -> [H; N],
) {
    if let Some(handles) = map
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(name)
    {
        return use_(handles);
    }
    let mut map = map
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    use_(map.entry(name.to_string()).or_insert_with(register));
}
