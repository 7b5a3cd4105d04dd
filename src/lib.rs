//! Stampede: a flash-sale (seckill) and voting backend.
//!
//! # Layout
//! - [`startup`]: builds the server (`Application::build` binds and returns the port)
//!   and runs it with graceful shutdown.
//! - [`config`]: defaults, TOML file, environment overrides.
//! - [`state`]: the one `AppState`, which holds a handle of every capability; none of
//!   them imports it (the module picture is in ARCHITECTURE.md, checked by a test).
//! - `routes`: the JSON API's handlers (sales, polls, accounts, health), which take
//!   the state, and `routes!`, the table that registers and lists them.
//! - [`conn`]: what one client can hold: header size and body time limits.
//! - [`csv`]: CSV downloads streamed from one query, fields safe for spreadsheets.
//! - [`error`]: the one error type, rendered as `{"error": code, "message": text}`.
//! - [`domain`]: input types that validate when parsed (ids, usernames, amounts).
//! - [`keys`]: Redis key naming with namespace and hash tags.
//! - [`paging`]: paged lists: the `limit` a client may ask for, opaque cursors.
//! - [`metrics`]: counters and histograms, served at `/metrics` by [`observe`].
//! - [`observe`]: the request-timing middleware and the `/metrics` handlers.
//! - [`random`]: random hex tokens.
//! - [`lock`]: a Redis lock (`SET NX PX` + token; owner-only release and extend; watchdog).
//! - [`cache`]: views cached in Redis, rebuilt by one caller across all instances.
//! - [`auth`]: accounts, argon2 passwords, signed session tokens, CSRF.
//! - [`limit`]: rate limits in Redis Lua (fixed window, sliding log, sliding
//!   counter, token bucket), their policies and HTTP headers.
//! - [`gate`]: fair openings: a proof of work and a least account age before the
//!   first step into a sale or poll.
//! - [`sale`]: sales, the atomic purchase script, stock changes, tickets, order ids.
//! - [`vote`]: polls, the atomic vote script, live tallies.
//! - [`batch`]: decisions in per-sale (per-poll) batches, one script call each.
//! - [`lua`]: how the Lua scripts of `lua/` are assembled (shared prelude + script).
//! - [`recover`]: rebuilding a sale's or poll's Redis state from Postgres after a
//!   wipe or a restart that may have lost writes; 503 `recovering` meanwhile. The
//!   driver: each feature's rebuild is its [`restore::Restore`].
//! - [`settle`]: the worker that moves accepted orders and votes from Redis streams
//!   to Postgres.
//! - [`openapi`]: `GET /api/openapi.json`, generated from the handlers with utoipa.
//! - [`web`]: browser pages (askama templates) and static files.
//! - [`seed`]: the first admin and demo data.
//! - [`rehearse`]: what the load client asks of the stores (its users in bulk, the
//!   settled orders, votes and waiting-room rows its checks read, the cleanup).
//!
//! Two binaries use it: `main.rs` (`stampede`: serve, migrate, settle, ...) and
//! `stampede-load` (the load client, a package of its own in `load/`, which
//! `stampede load` runs: a client over the public types here and [`rehearse`]).

pub mod audit;
pub mod auth;
pub mod batch;
pub mod cache;
pub mod config;
pub mod conn;
pub mod csv;
pub mod domain;
pub mod error;
pub mod gate;
pub mod keys;
#[cfg(test)]
mod layers;
pub mod limit;
pub mod live;
pub mod lock;
pub mod lua;
pub mod metrics;
pub mod observe;
pub mod openapi;
pub mod paging;
pub mod random;
pub mod recover;
pub mod redis_conn;
pub mod rehearse;
pub mod restore;
pub mod roster;
mod routes;
pub mod sale;
pub mod seed;
pub mod settle;
pub mod startup;
pub mod state;
pub mod telemetry;
pub mod vote;
pub mod web;
