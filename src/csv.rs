//! CSV downloads streamed from one Postgres query (a sale's orders, a poll's
//! votes): rows gathered into chunks and handed to the client through a small
//! bounded channel as it takes them, never the whole file in memory, and fields
//! written as RFC 4180 wants them, safe to open in a spreadsheet.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix_web::web::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use futures_util::Stream;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::{Semaphore, SemaphorePermit, mpsc};
use tracing::Instrument;

use crate::error::{AppError, ErrorCode};

/// Bytes gathered before a chunk is handed to the client.
const CHUNK_BYTES: usize = 32 * 1024;
/// Chunks in flight between the query and the client: what a slow client makes
/// the server hold is about this times [`CHUNK_BYTES`].
const CHUNKS_AHEAD: usize = 4;

/// How long a chunk may wait for the client to take it. A client that takes
/// nothing for this long (a reader stalled on purpose, or a paused download) ends
/// its download, cut: the download holds a Postgres connection and a transaction
/// while it runs, and without this a client that keeps its connection open and
/// never reads would hold them for as long as it likes.
pub const STALL: Duration = Duration::from_secs(30);

/// Downloads anyone may start (a drawn sale's entries) running at once in a
/// process: each holds a connection of the requests' pool while it runs, so a
/// crowd of them (or one client opening many) leaves the other requests theirs.
/// Past it: 503 `busy` with `Retry-After`. The admins' downloads are not counted.
pub const PUBLIC_DOWNLOADS: usize = 4;
static PUBLIC: Semaphore = Semaphore::const_new(PUBLIC_DOWNLOADS);

/// How long a public download may run in all: a client that takes a chunk just
/// before each [`STALL`] would otherwise keep its turn (and a connection, and an
/// open transaction) for hours. A million entries (about 40 MB) within it need
/// about 70 KB a second.
pub const PUBLIC_DEADLINE: Duration = Duration::from_secs(600);

/// A public download's turn (see [`PUBLIC_DOWNLOADS`]), held by its writer until
/// the download ends.
pub struct Turn {
    _permit: SemaphorePermit<'static>,
}

/// A turn for a public download now, or 503 `busy` with `Retry-After`.
pub fn public_turn() -> Result<Turn, AppError> {
    PUBLIC
        .try_acquire()
        .map(|_permit| Turn { _permit })
        .map_err(|_| {
            AppError::new(
                ErrorCode::Busy,
                "too many downloads of this kind at once; try again in a few seconds",
            )
            .with_header(actix_web::http::header::RETRY_AFTER, "5")
        })
}

/// Where a download's rows go: the chunk being filled, and the channel to the
/// client.
pub struct CsvOut {
    buf: String,
    out: mpsc::Sender<Result<Bytes, AppError>>,
    /// See [`STALL`].
    stall: Duration,
    /// Set when the client took nothing for `stall`, or a public download passed
    /// [`PUBLIC_DEADLINE`]: the body ends with an error.
    cut: Arc<AtomicBool>,
}

impl CsvOut {
    /// The chunk being filled: push a whole row (its `\r\n` included), then call
    /// [`Self::row_done`].
    pub fn buf(&mut self) -> &mut String {
        &mut self.buf
    }

    /// Hands the chunk to the client once it is full, waiting while
    /// [`CHUNKS_AHEAD`] are still in flight. `false` when the client left: stop.
    pub async fn row_done(&mut self) -> bool {
        if self.buf.len() < CHUNK_BYTES {
            return true;
        }
        let chunk = Bytes::from(std::mem::take(&mut self.buf));
        self.buf.reserve(CHUNK_BYTES + 512);
        self.send(chunk).await
    }

    /// Hands the last chunk to the client.
    pub async fn finish(mut self) {
        if !self.buf.is_empty() {
            let chunk = Bytes::from(std::mem::take(&mut self.buf));
            self.send(chunk).await;
        }
    }

    /// `false` when the client left, or took nothing for [`STALL`] (then the
    /// download is marked cut).
    async fn send(&self, chunk: Bytes) -> bool {
        match tokio::time::timeout(self.stall, self.out.send(Ok(chunk))).await {
            Ok(sent) => sent.is_ok(),
            Err(_) => {
                tracing::warn!(
                    stall_s = self.stall.as_secs(),
                    "CSV download cut: the client took nothing for that long"
                );
                self.cut.store(true, Ordering::Relaxed);
                false
            }
        }
    }
}

/// A CSV download: `header`, then what `write` pushes into its [`CsvOut`], which
/// it runs on a task of its own (in `span`) as the client takes the chunks. An
/// error of `write` is logged and ends the body with it (the client sees a cut
/// download, never a complete-looking one), and so does a client that took
/// nothing for [`STALL`]. `turn`: a public download's (see [`public_turn`]),
/// given back when the writer ends.
pub fn stream<F, Fut>(
    span: tracing::Span,
    header: &'static str,
    turn: Option<Turn>,
    write: F,
) -> impl Stream<Item = Result<Bytes, AppError>> + 'static
where
    F: FnOnce(CsvOut) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), AppError>> + Send + 'static,
{
    let deadline = turn.is_some().then_some(PUBLIC_DEADLINE);
    stream_stalling_after(span, header, turn, STALL, deadline, write)
}

fn stream_stalling_after<F, Fut>(
    span: tracing::Span,
    header: &'static str,
    turn: Option<Turn>,
    stall: Duration,
    deadline: Option<Duration>,
    write: F,
) -> impl Stream<Item = Result<Bytes, AppError>> + 'static
where
    F: FnOnce(CsvOut) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), AppError>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<Bytes, AppError>>(CHUNKS_AHEAD);
    let mut buf = String::with_capacity(CHUNK_BYTES + 512);
    buf.push_str(header);
    let cut = Arc::new(AtomicBool::new(false));
    let out = CsvOut {
        buf,
        out: tx.clone(),
        stall,
        cut: cut.clone(),
    };
    let timed_out = cut.clone();
    actix_web::rt::spawn(
        async move {
            let written = match deadline {
                Some(deadline) => match tokio::time::timeout(deadline, write(out)).await {
                    Ok(written) => written,
                    Err(_) => {
                        // The writer (its transaction and connection) is dropped.
                        tracing::warn!(
                            deadline_s = deadline.as_secs(),
                            "CSV download cut: not done within its deadline"
                        );
                        timed_out.store(true, Ordering::Relaxed);
                        Ok(())
                    }
                },
                None => write(out).await,
            };
            // The turn is given back before waiting on a client that may not read.
            drop(turn);
            if let Err(e) = written {
                tracing::warn!(error = ?e, "CSV download cut short");
                let _ = tokio::time::timeout(stall, tx.send(Err(e))).await;
            }
        }
        .instrument(span),
    );
    // The chunks as they come; after the last, an error when the download was cut
    // (a stalled client: the writer could not queue one, the channel was full; or
    // the deadline, which dropped the writer).
    futures_util::stream::unfold(Some(rx), move |rx| {
        let cut = cut.clone();
        async move {
            let mut rx = rx?;
            match rx.recv().await {
                Some(item) => Some((item, Some(rx))),
                None if cut.load(Ordering::Relaxed) => Some((
                    Err(AppError::Internal(anyhow::anyhow!(
                        "CSV download cut: the client took nothing for {} s, or the \
                         download outran its deadline",
                        stall.as_secs()
                    ))),
                    None,
                )),
                None => None,
            }
        }
    })
}

/// The answer of a download: `body` as `text/csv`, an attachment named `filename`.
pub fn attachment(
    filename: &str,
    body: impl Stream<Item = Result<Bytes, AppError>> + 'static,
) -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok()
        .content_type("text/csv; charset=utf-8")
        .insert_header((
            actix_web::http::header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"{filename}\""),
        ))
        .streaming(body)
}

/// A transaction on one connection of `db` whose statements may last as long as
/// the download (the pool's statement timeout lifted inside it).
pub async fn download_transaction(db: &PgPool) -> Result<Transaction<'static, Postgres>, AppError> {
    let mut tx = db.begin().await?;
    sqlx::query("SET LOCAL statement_timeout = 0")
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

/// A time as the downloads write it: RFC 3339 UTC with milliseconds; empty when
/// it did not happen.
pub fn time(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// One field of text, as RFC 4180 wants it: quoted (inner quotes doubled) when it
/// holds a comma, a quote or a line break. Text a spreadsheet would run as a
/// formula (starting with `=`, `+`, `-`, `@`, a tab or a carriage return) gets a
/// leading `'` and quotes, as OWASP advises for CSV files opened in spreadsheets.
pub fn push_field(buf: &mut String, text: &str) {
    let formula = text.starts_with(['=', '+', '-', '@', '\t', '\r']);
    let quote = formula || text.contains([',', '"', '\r', '\n']);
    if !quote {
        buf.push_str(text);
        return;
    }
    buf.push('"');
    if formula {
        buf.push('\'');
    }
    for c in text.chars() {
        if c == '"' {
            buf.push('"');
        }
        buf.push(c);
    }
    buf.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(text: &str) -> String {
        let mut buf = String::new();
        push_field(&mut buf, text);
        buf
    }

    /// A client that takes nothing ends its download after the stall (the writer
    /// stops, its turn is given back) and the body it may still read ends with an
    /// error, not like a whole file.
    #[actix_web::test]
    async fn a_stalled_client_ends_its_download_cut() {
        use futures_util::StreamExt;
        let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let rows = written.clone();
        let (stopped_tx, stopped) = tokio::sync::oneshot::channel();
        let body = stream_stalling_after(
            tracing::Span::none(),
            "n\r\n",
            Some(public_turn().unwrap()),
            Duration::from_millis(100),
            None,
            move |mut out| async move {
                loop {
                    out.buf().push_str(&"x".repeat(1000));
                    out.buf().push_str("\r\n");
                    rows.fetch_add(1, Ordering::Relaxed);
                    if !out.row_done().await {
                        break;
                    }
                }
                let _ = stopped_tx.send(());
                Ok(())
            },
        );
        tokio::time::timeout(Duration::from_secs(5), stopped)
            .await
            .expect("the writer of a stalled download stopped")
            .unwrap();
        // It queued what the channel holds, then waited for the client, in vain.
        let rows = written.load(Ordering::Relaxed);
        assert!(
            rows < (CHUNKS_AHEAD + 2) * CHUNK_BYTES / 1000,
            "{rows} rows"
        );
        let items: Vec<_> = body.collect().await;
        let (last, chunks) = items.split_last().unwrap();
        assert!(last.is_err(), "the body ends with an error");
        assert_eq!(chunks.len(), CHUNKS_AHEAD);
        assert!(chunks.iter().all(|c| c.is_ok()));
        // Its turn came back when the writer ended: every turn is free, and the
        // one too many is busy. (Here, not in a test of its own: tests run at once
        // and the turns are the process's.)
        let turns: Vec<Turn> = (0..PUBLIC_DOWNLOADS)
            .map(|_| public_turn().unwrap())
            .collect();
        let Err(busy) = public_turn() else {
            panic!("one download more than PUBLIC_DOWNLOADS got a turn");
        };
        assert_eq!(busy.code(), "busy");
        let resp = actix_web::ResponseError::error_response(&busy);
        assert_eq!(
            resp.status(),
            actix_web::http::StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(resp.headers().get("retry-after").unwrap(), "5");
        drop(turns);
        assert!(public_turn().is_ok(), "a turn given back is free again");
    }

    /// A client that takes every chunk, slowly, is cut at the deadline: the
    /// writer is dropped mid-way (its transaction with it) and the body ends with
    /// an error.
    #[actix_web::test]
    async fn a_download_past_its_deadline_ends_cut() {
        use futures_util::StreamExt;
        let body = stream_stalling_after(
            tracing::Span::none(),
            "n\r\n",
            None,
            Duration::from_secs(5),
            Some(Duration::from_millis(300)),
            |mut out| async move {
                loop {
                    out.buf().push_str(&"x".repeat(CHUNK_BYTES));
                    if !out.row_done().await {
                        return Ok(());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        );
        let items: Vec<_> = tokio::time::timeout(Duration::from_secs(5), body.collect())
            .await
            .expect("the body ends at the deadline");
        let (last, chunks) = items.split_last().unwrap();
        assert!(last.is_err(), "the body ends with an error");
        assert!(chunks.iter().all(|c| c.is_ok()));
        assert!((1..=8).contains(&chunks.len()), "{} chunks", chunks.len());
    }

    #[test]
    fn fields_are_quoted_only_when_they_must_be() {
        assert_eq!(field("alice"), "alice");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(field("two\nlines"), "\"two\nlines\"");
        assert_eq!(field("-1+2"), "\"'-1+2\"");
        assert_eq!(field("=SUM(A1)"), "\"'=SUM(A1)\"");
        assert_eq!(field(""), "");
    }
}
