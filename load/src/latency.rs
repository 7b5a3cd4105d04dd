//! Latency: the HDR histogram every connection records into, and the percentiles
//! the report gives of it.

use std::time::Instant;

use hdrhistogram::Histogram;
use serde::Serialize;

/// A histogram of microseconds from 1 us to a minute, three significant digits:
/// every connection's, so that they merge.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
}

/// Records the time since `started` (at least 1 us, at most a minute).
pub fn record_since(h: &mut Histogram<u64>, started: Instant) {
    let micros = started.elapsed().as_micros().max(1) as u64;
    let _ = h.record(micros.min(60_000_000));
}

/// The percentiles of a histogram of microseconds, in milliseconds.
#[derive(Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    pub fn of(h: &Histogram<u64>) -> Latency {
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        Latency {
            p50_ms: ms(0.50),
            p90_ms: ms(0.90),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: h.max() as f64 / 1000.0,
        }
    }
}
