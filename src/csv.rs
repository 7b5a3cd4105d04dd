//! CSV downloads streamed from one Postgres query (a sale's orders, a poll's
//! votes): rows gathered into chunks and handed to the client through a small
//! bounded channel as it takes them, never the whole file in memory, and fields
//! written as RFC 4180 wants them, safe to open in a spreadsheet.

use std::future::Future;

use actix_web::web::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use futures_util::Stream;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::error::AppError;

/// Bytes gathered before a chunk is handed to the client.
const CHUNK_BYTES: usize = 32 * 1024;
/// Chunks in flight between the query and the client: what a slow client makes
/// the server hold is about this times [`CHUNK_BYTES`].
const CHUNKS_AHEAD: usize = 4;

/// Where a download's rows go: the chunk being filled, and the channel to the
/// client.
pub struct CsvOut {
    buf: String,
    out: mpsc::Sender<Result<Bytes, AppError>>,
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
        self.out.send(Ok(chunk)).await.is_ok()
    }

    /// Hands the last chunk to the client.
    pub async fn finish(self) {
        if !self.buf.is_empty() {
            let _ = self.out.send(Ok(Bytes::from(self.buf))).await;
        }
    }
}

/// A CSV download: `header`, then what `write` pushes into its [`CsvOut`], which
/// it runs on a task of its own (in `span`) as the client takes the chunks. An
/// error of `write` is logged and ends the body with it (the client sees a cut
/// download, never a complete-looking one).
pub fn stream<F, Fut>(
    span: tracing::Span,
    header: &'static str,
    write: F,
) -> impl Stream<Item = Result<Bytes, AppError>> + 'static
where
    F: FnOnce(CsvOut) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), AppError>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<Bytes, AppError>>(CHUNKS_AHEAD);
    let mut buf = String::with_capacity(CHUNK_BYTES + 512);
    buf.push_str(header);
    let out = CsvOut {
        buf,
        out: tx.clone(),
    };
    actix_web::rt::spawn(
        async move {
            if let Err(e) = write(out).await {
                tracing::warn!(error = ?e, "CSV download cut short");
                let _ = tx.send(Err(e)).await;
            }
        }
        .instrument(span),
    );
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
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
