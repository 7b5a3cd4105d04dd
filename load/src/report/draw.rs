//! The draw's part of the report (`storm --draw`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::latency::Latency;

/// The draw's part of the report.
#[derive(Serialize)]
pub struct DrawReport {
    /// Entries answered 200 (one per user), how long they took and their rate.
    pub entries: usize,
    pub entry_seconds: f64,
    pub entries_per_second: f64,
    /// Whether every entry was answered before the draw.
    pub entered_before_draw: bool,
    pub entry_latency: Latency,
    /// The draw's time, when the server made it (its `drawn_at`), the seconds
    /// between, and the seconds from the draw's time until the run saw it published.
    pub draw_at: DateTime<Utc>,
    pub drawn_at: Option<DateTime<Utc>>,
    pub draw_seconds: f64,
    pub published_after_seconds: f64,
    pub winners_at_draw: i64,
    /// Winners who bought (202) and who let their win pass; wins passed on.
    pub claims: usize,
    pub unclaimed: usize,
    pub passes: usize,
    /// Why the passes were not followed, when they were not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passes_not_rehearsed: Option<String>,
    pub purchase_latency: Latency,
    /// The standings asked after the draw, by state.
    pub standings: BTreeMap<String, usize>,
}

/// Prints the draw's lines of the text report.
pub fn print_draw(d: &DrawReport) {
    println!("draw:");
    println!(
        "  entries:     {} in {:.2} s = {:.0}/s (p50 {:.2} ms, p99 {:.2} ms){}",
        d.entries,
        d.entry_seconds,
        d.entries_per_second,
        d.entry_latency.p50_ms,
        d.entry_latency.p99_ms,
        if d.entered_before_draw {
            ", all before the draw"
        } else {
            ", NOT all before the draw: give a later --opens-in"
        }
    );
    println!(
        "  the draw:    at {}, made {:.3} s after its time, seen published {:.2} s after; {} won at it",
        d.draw_at
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        d.draw_seconds,
        d.published_after_seconds,
        d.winners_at_draw
    );
    println!(
        "  standings:   {}",
        d.standings
            .iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  claims:      {} bought (p50 {:.2} ms, p99 {:.2} ms), {} let pass; {} wins passed on",
        d.claims, d.purchase_latency.p50_ms, d.purchase_latency.p99_ms, d.unclaimed, d.passes
    );
    if let Some(why) = &d.passes_not_rehearsed {
        println!("  passes not rehearsed: {why}");
    }
}
