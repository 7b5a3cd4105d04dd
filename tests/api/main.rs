//! One integration-test binary (one link) with a module per capability. Every test
//! starts the real server on port 0 against real Redis and Postgres, in its own
//! database and its own Redis key namespace.

mod account_age;
mod admin_console;
mod admin_pages;
mod auth;
mod bad_input;
mod ballots;
mod batch;
#[path = "../common/bodies.rs"]
mod bodies;
mod cache;
mod cancel;
mod client_limits;
#[path = "../common/db.rs"]
mod db;
mod draw_admin;
mod draw_end;
mod draws;
mod health;
mod held;
mod helpers;
mod idempotency;
mod kept;
mod lifecycle;
mod limit;
mod limit_batch;
mod live;
mod load;
mod lock;
mod openapi;
mod pages;
mod paging;
mod payment;
mod poll_export;
mod poll_pages;
mod poll_results;
mod proof_of_work;
mod purchase;
mod quantity;
mod recover;
mod rehearsal;
mod runoff;
mod sale_numbers;
mod sessions;
mod settle;
mod shutdown;
mod start_box;
mod subnet_limit;
mod tickets;
mod upgrade;
mod vote;
mod waiting_room;
mod what_sold;
