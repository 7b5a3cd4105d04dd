//! Every answer kind, their live counts, and the progress line that shows them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An answer as the report counts it: status and error code; status 0: none came.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kind {
    pub status: u16,
    pub code: Option<String>,
}

impl Kind {
    pub fn label(&self) -> String {
        match (self.status, &self.code) {
            (0, _) => "no answer".to_string(),
            (s, Some(code)) => format!("{s} {code}"),
            (s, None) => s.to_string(),
        }
    }

    /// The label on the live progress line: short, so that every kind seen fits on
    /// one line (429s and 503s counted together whatever their code).
    pub fn short(&self) -> String {
        match (self.status, &self.code) {
            (202, _) => "202 accepted".to_string(),
            (429 | 503, _) => self.status.to_string(),
            _ => self.label(),
        }
    }

    /// A storm sends it again (with the same key): a 503, no answer, or one a
    /// moment before the opening.
    pub fn retry_in_storm(&self) -> bool {
        matches!(self.status, 0 | 503) || self.code.as_deref() == Some("not_started")
    }
}

/// Live counts of every answer kind, for the progress line and the report. A kind
/// gets its counter the first time any connection sees it (under the lock); each
/// connection keeps its own handles ([`Seen::counters`]), so an answer costs one
/// relaxed add.
#[derive(Default)]
pub struct Progress {
    kinds: Mutex<Vec<(Kind, Arc<AtomicU64>)>>,
}

impl Progress {
    pub fn counter(&self, kind: &Kind) -> Arc<AtomicU64> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, counter)) = kinds.iter().find(|(k, _)| k == kind) {
            return counter.clone();
        }
        let counter = Arc::new(AtomicU64::new(0));
        kinds.push((kind.clone(), counter.clone()));
        counter
    }

    /// Every kind seen so far and its count, by status (no answer last).
    pub fn counts(&self) -> Vec<(Kind, u64)> {
        let kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        let mut counts: Vec<(Kind, u64)> = kinds
            .iter()
            .map(|(k, n)| (k.clone(), n.load(Ordering::Relaxed)))
            .collect();
        counts.sort_by(|(a, _), (b, _)| (a.status == 0, a).cmp(&(b.status == 0, b)));
        counts
    }
}

/// The progress line's text: requests, rate, then `label count` of every kind
/// seen so far (`202 accepted 100 · 409 already_bought 20 · 410 sold_out 180`).
fn progress_message(what: &str, counts: &[(Kind, u64)], rate: f64) -> String {
    let done: u64 = counts.iter().map(|(_, n)| n).sum();
    let mut merged: Vec<(String, u64)> = Vec::new();
    for (kind, n) in counts {
        let label = kind.short();
        match merged.last_mut() {
            Some((last, total)) if *last == label => *total += n,
            _ => merged.push((label, *n)),
        }
    }
    let mut text = format!("{what}: {done} requests, {rate:.0}/s now");
    for (label, n) in merged {
        text.push_str(" · ");
        text.push_str(&label);
        text.push(' ');
        text.push_str(itoa::Buffer::new().format(n));
    }
    text
}

/// The progress line while something runs; cleared when dropped.
pub struct Line {
    bar: indicatif::ProgressBar,
    task: tokio::task::JoinHandle<()>,
}

impl Line {
    pub fn start(what: &'static str, progress: Arc<Progress>) -> Line {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            // `wide_msg`: cut to the terminal's width, the rate first so it stays.
            indicatif::ProgressStyle::with_template("{spinner} {elapsed:>3} {wide_msg}")
                .expect("a valid template"),
        );
        let shown = bar.clone();
        let task = tokio::spawn(async move {
            let mut last = (Instant::now(), 0u64);
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let counts = progress.counts();
                let done: u64 = counts.iter().map(|(_, n)| n).sum();
                let rate = done.saturating_sub(last.1) as f64 / last.0.elapsed().as_secs_f64();
                last = (Instant::now(), done);
                shown.set_message(progress_message(what, &counts, rate));
                shown.tick();
            }
        });
        Line { bar, task }
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(status: u16, code: Option<&str>) -> Kind {
        Kind {
            status,
            code: code.map(String::from),
        }
    }

    #[test]
    fn the_progress_line_counts_every_kind_seen_in_a_few_words() {
        let progress = Progress::default();
        for (k, n) in [
            (kind(410, Some("sold_out")), 180),
            (kind(202, None), 100),
            (kind(409, Some("already_bought")), 20),
            (kind(503, Some("recovering")), 2),
            (kind(503, Some("busy")), 1),
            (kind(0, None), 4),
        ] {
            progress.counter(&k).fetch_add(n, Ordering::Relaxed);
        }
        // The same kind again shares its counter.
        progress
            .counter(&kind(202, None))
            .fetch_add(1, Ordering::Relaxed);
        assert_eq!(
            progress_message("firing", &progress.counts(), 1234.4),
            "firing: 308 requests, 1234/s now · 202 accepted 101 · 409 already_bought 20 · \
             410 sold_out 180 · 503 3 · no answer 4"
        );
        assert_eq!(
            progress_message("firing", &[], 0.0),
            "firing: 0 requests, 0/s now"
        );
    }
}
