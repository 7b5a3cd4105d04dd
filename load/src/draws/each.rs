//! Work over a list of users on `--concurrency` connections: each connection
//! takes every `concurrency`-th item in turn, with its own [`Tally`].

use std::future::Future;
use std::sync::Arc;

use crate::client::{Conn, Target};
use crate::fire::REQUEST_TIMEOUT;
use crate::progress::Progress;
use crate::waiting::ask::Tally;

/// One connection's tools: its connection, its tally, the live line.
pub struct Work {
    pub conn: Conn,
    pub tally: Tally,
    pub progress: Arc<Progress>,
}

/// Runs `f` on every item, `concurrency` connections at once; the merged tally
/// and every result (in no particular order).
pub async fn each<T, R, F, Fut>(
    target: &Target,
    items: Vec<T>,
    concurrency: usize,
    progress: &Arc<Progress>,
    f: F,
) -> anyhow::Result<(Tally, Vec<R>)>
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(Work, T) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = (Work, R)> + Send + 'static,
{
    let n = concurrency.max(1).min(items.len().max(1));
    let mut shares: Vec<Vec<T>> = (0..n).map(|_| Vec::new()).collect();
    for (i, item) in items.into_iter().enumerate() {
        shares[i % n].push(item);
    }
    let tasks: Vec<_> = shares
        .into_iter()
        .map(|share| {
            let f = f.clone();
            let mut work = Work {
                conn: Conn::new(target.clone(), REQUEST_TIMEOUT),
                tally: Tally::new(),
                progress: progress.clone(),
            };
            tokio::spawn(async move {
                let mut out = Vec::with_capacity(share.len());
                for item in share {
                    let (w, r) = f(work, item).await;
                    work = w;
                    out.push(r);
                }
                (work.tally, out)
            })
        })
        .collect();
    let mut tally = Tally::new();
    let mut all = Vec::new();
    for task in tasks {
        let (t, out) = task.await?;
        tally.add(t);
        all.extend(out);
    }
    Ok((tally, all))
}
