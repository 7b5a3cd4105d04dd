//! The first phase: every user enters the draw, before it.

use std::sync::Arc;
use std::time::Duration;

use super::each::{Work, each};
use crate::client::{Request, Target};
use crate::fire::STORM_TRIES;
use crate::progress::Progress;
use crate::waiting::ask::{Tally, ask, state_of};

/// What the entries got.
pub struct Entered {
    pub tally: Tally,
    /// Per user (by index): its entry id, when its entry was answered 200.
    pub entries: Vec<Option<i64>>,
    /// Entries sent a second time, and how many of them named another entry (or
    /// were refused).
    pub repeats: usize,
    pub repeats_differing: usize,
}

/// Every user's entry (every tenth sent twice), a 503 or a lost answer sent again.
pub async fn enter_all(
    target: &Target,
    sale: i64,
    tokens: Arc<Vec<String>>,
    concurrency: usize,
    progress: &Arc<Progress>,
) -> anyhow::Result<Entered> {
    let path = Arc::new(format!("/api/sales/{sale}/entry"));
    let n = tokens.len();
    let users: Vec<usize> = (0..n).collect();
    let (tally, results) = each(target, users, concurrency, progress, move |mut w, i| {
        let (tokens, path) = (tokens.clone(), path.clone());
        async move {
            let first = enter(&mut w, &path, &tokens[i]).await;
            let again = match (first, i % 10) {
                (Some(_), 0) => Some(enter(&mut w, &path, &tokens[i]).await),
                _ => None,
            };
            (w, (i, first, again))
        }
    })
    .await?;
    let mut entries = vec![None; n];
    let (mut repeats, mut repeats_differing) = (0, 0);
    for (i, first, again) in results {
        entries[i] = first;
        if let Some(again) = again {
            repeats += 1;
            repeats_differing += usize::from(again != first);
        }
    }
    Ok(Entered {
        tally,
        entries,
        repeats,
        repeats_differing,
    })
}

/// One entry: its id when answered 200.
async fn enter(w: &mut Work, path: &str, token: &str) -> Option<i64> {
    let req = Request {
        method: "POST",
        path,
        token: Some(token),
        forwarded_for: None,
        idempotency_key: None,
        body: None,
    };
    for attempt in 1..=STORM_TRIES {
        let a = ask(
            &mut w.conn,
            &req,
            "entry",
            &mut w.tally,
            &w.progress,
            state_of,
        )
        .await;
        match a.status {
            200 => return a.body.and_then(|b| b["entry_id"].as_i64()),
            0 | 503 => tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await,
            _ => return None,
        }
    }
    None
}
