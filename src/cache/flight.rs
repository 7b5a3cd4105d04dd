//! This process's rebuilds in flight: the first caller for a key leads, the others
//! wait for its result; and the counters of what the cache served.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use actix_web::http::header;
use serde::Serialize;
use tokio::sync::watch;

use crate::error::{AppError, ErrorCode};

/// Per-process state of the cache: rebuilds in flight and counters.
#[derive(Default)]
pub(super) struct Flights {
    // A std mutex: held for one map operation, never across an await.
    flights: Mutex<HashMap<String, (u64, FlightRx)>>,
    next_flight: AtomicU64,
    pub(super) hits: AtomicU64,
    pub(super) loads: AtomicU64,
    pub(super) shared: AtomicU64,
    pub(super) waited: AtomicU64,
    pub(super) fallbacks: AtomicU64,
}

/// Counters since start, for tests and `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Served straight from Redis.
    pub hits: u64,
    /// Loader runs, i.e. Postgres queries for views (includes `fallbacks`).
    pub loads: u64,
    /// Served by another caller's rebuild in this process.
    pub shared: u64,
    /// Found the view stored by another rebuild after missing it at first.
    pub waited: u64,
    /// Gave up waiting for the lock holder and loaded without storing.
    pub fallbacks: u64,
}

/// What a flight's leader hands its followers: the JSON it served, or its error.
pub(super) type Outcome = Result<Arc<str>, SharedError>;

impl Flights {
    pub(super) fn stats(&self) -> CacheStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CacheStats {
            hits: get(&self.hits),
            loads: get(&self.loads),
            shared: get(&self.shared),
            waited: get(&self.waited),
            fallbacks: get(&self.fallbacks),
        }
    }

    pub(super) fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn flights(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, FlightRx)>> {
        self.flights.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn join(&self, key: &str) -> Join<'_> {
        let mut flights = self.flights();
        if let Some((_, rx)) = flights.get(key) {
            return Join::Follow(rx.clone());
        }
        let id = self.next_flight.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(None);
        flights.insert(key.to_string(), (id, rx));
        Join::Lead(Flight {
            cache: self,
            key: key.to_string(),
            id,
            tx,
        })
    }

    /// Later callers start new rebuilds instead of joining ones that may have read
    /// Postgres before a change.
    pub(super) fn forget(&self, keys: &[String]) {
        let mut flights = self.flights();
        for key in keys {
            flights.remove(key);
        }
    }
}

pub(super) type FlightRx = watch::Receiver<Option<Outcome>>;

pub(super) enum Join<'a> {
    Lead(Flight<'a>),
    Follow(FlightRx),
}

/// The leader's side of a flight. Dropping it (finished, failed or cancelled) takes
/// it out of the map; followers of a cancelled leader see the channel close and retry.
pub(super) struct Flight<'a> {
    cache: &'a Flights,
    key: String,
    id: u64,
    tx: watch::Sender<Option<Outcome>>,
}

impl Flight<'_> {
    pub(super) fn finish(self, outcome: Outcome) {
        self.tx.send_replace(Some(outcome));
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let mut flights = self.cache.flights();
        // Only our own entry: `invalidate` may have replaced it with a newer flight.
        if flights.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            flights.remove(&self.key);
        }
    }
}

/// An error handed to followers: the same status, code and client message as the
/// leader's (whose response logs the cause).
#[derive(Clone, Debug)]
pub(super) struct SharedError {
    code: ErrorCode,
    message: std::borrow::Cow<'static, str>,
    headers: Vec<(header::HeaderName, String)>,
}

impl From<&AppError> for SharedError {
    fn from(e: &AppError) -> Self {
        let headers = match e {
            AppError::Client { headers, .. } => headers.clone(),
            _ => Vec::new(),
        };
        SharedError {
            code: e.error_code(),
            message: e.public_message(),
            headers,
        }
    }
}

impl From<SharedError> for AppError {
    fn from(e: SharedError) -> Self {
        AppError::Client {
            code: e.code,
            message: e.message,
            headers: e.headers,
            fields: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn followers_get_the_leaders_client_error() {
        let shared = SharedError::from(&AppError::not_found("no sale with id 9"));
        let e: AppError = shared.into();
        assert_eq!(e.error_code(), ErrorCode::NotFound);
        assert_eq!(e.code(), "not_found");
    }

    #[test]
    fn followers_never_see_internal_details() {
        let shared = SharedError::from(&AppError::Internal(anyhow::anyhow!("secret")));
        let e: AppError = shared.into();
        assert_eq!(e.error_code(), ErrorCode::Internal);
        assert!(!e.to_string().contains("secret"));
    }

    #[tokio::test]
    async fn a_flight_has_one_leader_until_it_ends() {
        let cache = Flights::default();
        let Join::Lead(flight) = cache.join("k") else {
            panic!("first caller leads")
        };
        let Join::Follow(mut rx) = cache.join("k") else {
            panic!("second caller follows")
        };
        flight.finish(Ok(Arc::from("1")));
        let got = rx.wait_for(Option::is_some).await.unwrap().clone();
        assert!(matches!(got, Some(Ok(json)) if &*json == "1"));
        assert!(
            matches!(cache.join("k"), Join::Lead(_)),
            "a finished flight is gone"
        );
    }

    #[tokio::test]
    async fn followers_of_a_cancelled_leader_are_woken() {
        let cache = Flights::default();
        let lead = cache.join("k");
        let Join::Follow(mut rx) = cache.join("k") else {
            panic!("second caller follows")
        };
        drop(lead);
        // Woken by the leader's sender going away (`RecvError` has no other kind).
        assert!(rx.wait_for(Option::is_some).await.is_err());
    }

    #[test]
    fn forget_lets_the_next_caller_lead_and_the_old_leader_keeps_its_hands_off() {
        let cache = Flights::default();
        let old = cache.join("k");
        cache.forget(&["k".to_string()]);
        let new = cache.join("k");
        assert!(matches!(new, Join::Lead(_)));
        drop(old); // must not remove the new flight
        assert!(matches!(cache.join("k"), Join::Follow(_)));
        drop(new);
    }
}
