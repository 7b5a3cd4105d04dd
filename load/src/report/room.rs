//! The waiting room's part of the report (`storm --waiting-room`).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::latency::Latency;

/// The waiting room's part of the report.
#[derive(Serialize)]
pub struct WaitingRoomReport {
    pub admit_per_second: u32,
    /// Users in the line (their join answered 200).
    pub joined: usize,
    pub join_seconds: f64,
    pub joins_per_second: f64,
    /// Whether every join was answered before the opening.
    pub joined_before_opening: bool,
    pub join_latency: Latency,
    /// `GET .../queue/me` requests, and the most one user sent.
    pub polls: u64,
    pub polls_per_user_max: u32,
    pub poll_latency: Latency,
    /// Admissions given (Postgres `queue_admissions`), the seconds from the opening
    /// to the last one, and their rate over that time.
    pub admitted: i64,
    pub admission_seconds: f64,
    pub admissions_per_second: f64,
    /// Admissions that expired unused (the line's `passed`).
    pub passes: i64,
    /// Purchases accepted (202).
    pub purchases: u64,
    pub purchase_latency: Latency,
    /// Seconds from the opening until every standing was final (or the bound).
    pub follow_seconds: f64,
    /// Users by how their standing ended (`bought`, `sold_out`, `passed`, ...;
    /// `waiting` when the bound came first).
    pub standings: BTreeMap<String, usize>,
    /// The line's numbers at the end (`GET /api/sales/{id}`).
    pub line: Value,
}

/// Prints the waiting room's lines of the text report.
pub fn print_waiting_room(w: &WaitingRoomReport) {
    println!("waiting room:");
    println!(
        "  joins:       {} in {:.2} s = {:.0}/s (p50 {:.2} ms, p99 {:.2} ms){}",
        w.joined,
        w.join_seconds,
        w.joins_per_second,
        w.join_latency.p50_ms,
        w.join_latency.p99_ms,
        if w.joined_before_opening {
            ", all before the opening"
        } else {
            ", NOT all before the opening"
        }
    );
    println!(
        "  admissions:  {} in {:.2} s from the opening = {:.0}/s (set: {}/s; never more than the units left)",
        w.admitted, w.admission_seconds, w.admissions_per_second, w.admit_per_second
    );
    println!(
        "  standings:   {} GET queue/me (at most {} by one user; p50 {:.2} ms, p99 {:.2} ms)",
        w.polls, w.polls_per_user_max, w.poll_latency.p50_ms, w.poll_latency.p99_ms
    );
    println!(
        "  purchases:   {} accepted (p50 {:.2} ms, p99 {:.2} ms); passes: {}",
        w.purchases, w.purchase_latency.p50_ms, w.purchase_latency.p99_ms, w.passes
    );
    println!(
        "  after {:.2} s of following: {}",
        w.follow_seconds,
        w.standings
            .iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("  line: {}", w.line);
}
