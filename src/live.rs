//! Live views pushed to open pages with server-sent events.
//!
//! A sale page shows stock and status, a poll page its tallies; both change while
//! the page is open. Rather than every open page asking on a timer, each process
//! keeps one reader per sale (or poll) that has viewers: every `interval` it reads
//! the view once (the cached record and one Redis round trip) and, when it changed,
//! hands it to all of that sale's streams in this process through a
//! [`tokio::sync::watch`] channel. A thousand open pages of one sale cost one read
//! a second, not a thousand. The reader stops after the last viewer leaves.
//!
//! The stream: `GET /api/sales/{id}/events` and `GET /api/polls/{id}/events`, each
//! event a `data:` line with the same JSON as `GET /api/sales/{id}` (or
//! `/api/polls/{id}/results`), sent at once on connecting and then on every change,
//! with a comment line when nothing else was sent for five intervals (at least 1 s,
//! at most 15 s: see [`Feeds::keep_alive`]). The comment keeps proxies from closing
//! an idle stream, and it is how a page that left is noticed: the server learns
//! that a viewer is gone only when a write to it fails, and its reader stops once
//! no stream holds the topic. Pages fall back to polling where the stream fails
//! (`static/js/live.js`).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use actix_web::HttpResponse;
use actix_web::http::header;
use actix_web::web::Bytes;
use futures_util::{StreamExt, stream};
use tokio::sync::watch;

use crate::domain::{PollId, SaleId};
use crate::error::{AppError, ErrorCode};
use crate::metrics::Metrics;

/// How long a new stream waits for its first view before answering 503.
const FIRST_VIEW_WAIT: Duration = Duration::from_secs(5);

/// `Retry-After` of a stream refused as one too many for its client: the page
/// asks for the view every 2 s meanwhile (`static/js/live.js`).
const STREAM_RETRY_AFTER_S: u32 = 30;

/// One event of a stream, as the OpenAPI document describes it: `data` is the
/// view's JSON, the same as the route's plain `GET` answers. (Only described: the
/// stream is written as text, by `respond`.)
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct LiveEvent {
    /// The view, as JSON.
    data: String,
    /// Always `message` (the default event type).
    event: Option<String>,
}

/// What is watched.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Topic {
    Sale(SaleId),
    /// A poll's results as anyone may see them (hidden tallies never enter it).
    Poll(PollId),
    /// A poll's tallies, for the callers who see them whatever its state.
    PollTallies(PollId),
}

/// The latest reading of a topic.
#[derive(Clone, Debug, PartialEq)]
pub enum Reading {
    /// The view, as JSON.
    View(Bytes),
    /// There is no such sale or poll.
    Missing,
    /// Redis or Postgres did not answer; no view has been read yet.
    Unavailable,
}

/// The readers of this process, one per watched topic.
pub struct Feeds {
    topics: Mutex<HashMap<Topic, watch::Sender<Option<Reading>>>>,
    /// Streams open per client ([`client_of`]), each at most `max_per_client`.
    clients: Mutex<HashMap<IpAddr, u32>>,
    /// 0: no cap.
    max_per_client: u32,
    interval: Duration,
    metrics: Arc<Metrics>,
    /// True once the server shuts down: every stream ends (the pages reconnect to
    /// another instance, or to this one when it is back).
    closing: watch::Sender<bool>,
}

impl Feeds {
    pub fn new(interval: Duration, max_per_client: u32, metrics: Arc<Metrics>) -> Self {
        Feeds {
            topics: Mutex::new(HashMap::new()),
            clients: Mutex::new(HashMap::new()),
            max_per_client,
            interval,
            metrics,
            closing: watch::Sender::new(false),
        }
    }

    /// Ends every open stream now and any opened later: a graceful shutdown would
    /// otherwise wait its whole timeout for streams that never finish.
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// How long a stream stays silent before a comment line: five intervals, at
    /// least 1 s and at most 15 s.
    pub fn keep_alive(&self) -> Duration {
        (self.interval * 5).clamp(Duration::from_secs(1), Duration::from_secs(15))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Topic, watch::Sender<Option<Reading>>>> {
        self.topics.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The event stream of `topic` for the client at `client`, a route's whole
    /// answer (`what` names it in errors): takes one of the client's stream slots
    /// (429 `too_many_streams` when it holds them all), subscribes and answers with
    /// the stream (`respond`), which gives the slot back when it ends. `load` reads
    /// the view once, `Ok(None)` when there is no such thing; only the topic's
    /// reader runs it.
    pub async fn stream<F, Fut>(
        self: &Arc<Self>,
        client: IpAddr,
        topic: Topic,
        what: &str,
        load: F,
    ) -> Result<HttpResponse, AppError>
    where
        F: Fn() -> Fut + 'static,
        Fut: Future<Output = Result<Option<Bytes>, AppError>> + 'static,
    {
        let slot = self.take_slot(client)?;
        let rx = self.subscribe(topic, load);
        respond(self, rx, what, slot).await
    }

    /// One of the client's stream slots, given back when the slot drops. A stream
    /// is a connection held open for as long as the page stays: without a cap one
    /// client could hold enough of them to use up the process's file descriptors.
    fn take_slot(self: &Arc<Self>, client: IpAddr) -> Result<Slot, AppError> {
        let client = client_of(client);
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        let open = clients.entry(client).or_insert(0);
        if self.max_per_client > 0 && *open >= self.max_per_client {
            Metrics::inc(&self.metrics.live_refused);
            return Err(AppError::new(
                ErrorCode::TooManyStreams,
                format!(
                    "this address has {} live streams open, the most it may hold; close a page \
                     or follow this one by asking for it",
                    self.max_per_client
                ),
            )
            .with_header(header::RETRY_AFTER, STREAM_RETRY_AFTER_S.to_string()));
        }
        *open += 1;
        Ok(Slot {
            feeds: self.clone(),
            client,
        })
    }

    /// Streams open now from `client` (tests).
    pub fn open_streams(&self, client: IpAddr) -> u32 {
        let clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        clients.get(&client_of(client)).copied().unwrap_or(0)
    }

    /// A receiver of `topic`'s readings; starts its reader (on this worker's
    /// runtime) when nobody watched it yet.
    fn subscribe<F, Fut>(
        self: &Arc<Self>,
        topic: Topic,
        load: F,
    ) -> watch::Receiver<Option<Reading>>
    where
        F: Fn() -> Fut + 'static,
        Fut: Future<Output = Result<Option<Bytes>, AppError>> + 'static,
    {
        let mut topics = self.lock();
        if let Some(tx) = topics.get(&topic) {
            return tx.subscribe();
        }
        let (tx, rx) = watch::channel(None);
        topics.insert(topic, tx.clone());
        drop(topics);
        actix_web::rt::spawn(read_while_watched(self.clone(), topic, tx, load));
        rx
    }
}

/// The client a stream counts against: an IPv4 address, or an IPv6 address's /64
/// (a client gets a whole /64 and may pick any address in it).
fn client_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(bits))
        }
        v4 => v4,
    }
}

/// A stream's hold on one of its client's slots, given back on drop (the stream
/// ended, or the answer was an error).
pub struct Slot {
    feeds: Arc<Feeds>,
    client: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut clients = self
            .feeds
            .clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(open) = clients.get_mut(&self.client) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                clients.remove(&self.client);
            }
        }
    }
}

/// Reads `topic` every interval while anyone watches it; sends only changes. A
/// failed read keeps the last view (the page shows it, and the stream stays).
async fn read_while_watched<F, Fut>(
    feeds: Arc<Feeds>,
    topic: Topic,
    tx: watch::Sender<Option<Reading>>,
    load: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Option<Bytes>, AppError>>,
{
    loop {
        {
            // Under the map's lock: a viewer that subscribes now finds either this
            // reader (and keeps it going) or no entry (and starts a new one).
            let mut topics = feeds.lock();
            if tx.receiver_count() == 0 {
                topics.remove(&topic);
                return;
            }
        }
        Metrics::inc(&feeds.metrics.live_reads);
        let reading = match load().await {
            Ok(Some(json)) => Some(Reading::View(json)),
            Ok(None) => Some(Reading::Missing),
            Err(e) => {
                tracing::debug!(?topic, error = %e, "live view read failed");
                tx.borrow().is_none().then_some(Reading::Unavailable)
            }
        };
        if let Some(reading) = reading {
            tx.send_if_modified(|last| {
                let changed = last.as_ref() != Some(&reading);
                if changed {
                    *last = Some(reading);
                }
                changed
            });
        }
        tokio::time::sleep(feeds.interval).await;
    }
}

/// The event stream of one subscription: the first reading decides the answer
/// (404 for a missing topic, 503 when nothing could be read), then one event per
/// new view and a comment after each `keep_alive` of silence.
async fn respond(
    feeds: &Feeds,
    mut rx: watch::Receiver<Option<Reading>>,
    what: &str,
    slot: Slot,
) -> Result<HttpResponse, AppError> {
    let keep_alive = feeds.keep_alive();
    let closing = feeds.closing.subscribe();
    let first = tokio::time::timeout(FIRST_VIEW_WAIT, rx.wait_for(Option::is_some))
        .await
        .ok()
        .and_then(Result::ok)
        .and_then(|r| r.clone());
    let first = match first {
        Some(Reading::View(json)) => json,
        Some(Reading::Missing) => {
            return Err(AppError::not_found(format!("no {what} with this id")));
        }
        Some(Reading::Unavailable) | None => {
            return Err(AppError::new(
                ErrorCode::Unavailable,
                format!("the {what}'s live view cannot be read now; try again shortly"),
            ));
        }
    };
    rx.mark_unchanged();
    let opening = Bytes::from([b"retry: 3000\n\n".as_slice(), &event(&first)].concat());
    // (readings, shutdown, the opening still to send, the closing hint sent)
    let state = (rx, closing, Some(opening), false);
    let events = stream::unfold(
        state,
        move |(mut rx, mut closing, opening, ended)| async move {
            if let Some(opening) = opening {
                return Some((
                    Ok::<_, actix_web::Error>(opening),
                    (rx, closing, None, false),
                ));
            }
            if ended {
                return None;
            }
            loop {
                let changed = tokio::select! {
                    _ = closing.wait_for(|closed| *closed) => None,
                    changed = tokio::time::timeout(keep_alive, rx.changed()) => Some(changed),
                };
                // Shutting down: a last hint, then the end; the page reconnects.
                let Some(changed) = changed else {
                    return Some((Ok(closing_hint()), (rx, closing, None, true)));
                };
                match changed {
                    Err(_) => {
                        let comment = Bytes::from_static(b": keep-alive\n\n");
                        return Some((Ok(comment), (rx, closing, None, false)));
                    }
                    // The reader is gone: end the stream; the page reconnects.
                    Ok(Err(_)) => return None,
                    Ok(Ok(())) => {
                        let view = match &*rx.borrow_and_update() {
                            Some(Reading::View(json)) => Some(event(json)),
                            _ => None,
                        };
                        if let Some(view) = view {
                            return Some((Ok(view), (rx, closing, None, false)));
                        }
                    }
                }
            }
        },
    );
    // The slot goes with the stream: given back when the connection ends.
    let events = events.inspect(move |_| {
        let _ = &slot;
    });
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        // Tells nginx not to buffer the stream.
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(events))
}

/// The last lines of a stream the server ends as it stops: a comment, and the
/// time the page waits before it reconnects (to another server), spread over 1
/// to 3 s so that the pages of a stopping server do not all come back at once.
fn closing_hint() -> Bytes {
    let ms: u32 = rand::random_range(1000..=3000);
    Bytes::from(format!(": server stopping, reconnect\nretry: {ms}\n\n"))
}

/// A view as the JSON an event carries.
pub fn json<T: serde::Serialize>(view: &T) -> Result<Bytes, AppError> {
    serde_json::to_vec(view)
        .map(Bytes::from)
        .map_err(|e| AppError::Internal(e.into()))
}

/// One `data:` event. The JSON has no newline (serde_json's compact output).
fn event(json: &[u8]) -> Bytes {
    [b"data: ".as_slice(), json, b"\n\n"].concat().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_closing_hint_asks_for_a_reconnect_within_1_to_3_s() {
        for _ in 0..50 {
            let hint = closing_hint();
            let text = std::str::from_utf8(&hint).unwrap();
            let ms: u32 = text
                .strip_prefix(": server stopping, reconnect\nretry: ")
                .and_then(|r| r.strip_suffix("\n\n"))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{text:?}"));
            assert!((1000..=3000).contains(&ms), "{ms}");
        }
    }

    #[test]
    fn an_event_is_one_data_line() {
        assert_eq!(&event(br#"{"a":1}"#)[..], b"data: {\"a\":1}\n\n");
    }
}
