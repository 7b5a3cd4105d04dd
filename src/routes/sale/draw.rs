//! A draw sale's routes (see [`crate::sale::draw`]): the entry, the entrant's
//! standing (with a winner's ticket), and what the draw publishes.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::auth::AuthUser;
use crate::domain::SaleId;
use crate::error::{AppError, ErrorBody, ErrorCode};
use crate::gate::Subject;
use crate::limit::Route;
use crate::routes::auth::optional_user;
use crate::routes::fair;
use crate::sale::cached;
use crate::sale::draw::enter::{self, Entered, Standing};
use crate::sale::draw::publish::{self, Publication, Published};
use crate::sale::record::SaleRow;
use crate::state::{AppState, Worker};

/// An entry into a draw.
#[derive(Serialize, utoipa::ToSchema)]
struct EntryAnswer {
    /// The entry's id: what the draw hashes (see "Draw sales" in docs/api.md).
    entry_id: i64,
    entered_at: DateTime<Utc>,
    /// Always `entered` (the draw has not been made).
    state: &'static str,
}

/// The sale's record, or 404; 409 `not_a_draw` unless it is a draw sale.
pub(super) async fn draw_row(state: &AppState, sale: SaleId) -> Result<SaleRow, AppError> {
    match cached::sale_row(state, sale).await? {
        Some(row) if row.is_draw() => Ok(row),
        Some(_) => Err(not_a_draw()),
        None => Err(AppError::not_found(format!("no sale with id {sale}"))),
    }
}

fn not_a_draw() -> AppError {
    AppError::new(
        ErrorCode::NotADraw,
        "this sale is not a draw: buy it (POST /api/sales/{id}/purchase)",
    )
}

fn seconds(ms: i64) -> String {
    ((ms.max(0) + 999) / 1000).max(1).to_string()
}

fn not_open(in_ms: i64) -> AppError {
    AppError::new(
        ErrorCode::EntriesNotOpen,
        format!("entries to this draw open in {} s", seconds(in_ms)),
    )
    .with_header(header::RETRY_AFTER, seconds(in_ms))
}

fn closed() -> AppError {
    AppError::new(
        ErrorCode::EntriesClosed,
        "entries to this draw have closed: it is drawn (see GET /api/sales/{id}/entry/me)",
    )
}

/// Enters the signed-in user into the sale's draw, from `entries_open_at` until
/// `draw_at`: one entry per account; sent again, the same entry.
#[utoipa::path(post, path = "/api/sales/{id}/entry", tag = "sales", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "Entered (now or before: the same entry)", body = EntryAnswer),
    (status = 403, description = "`account_too_new` (the sale's `min_account_age_s`), `proof_invalid` or `proof_used` (its `proof_of_work`)", body = ErrorBody<'static>),
    (status = 428, description = "`proof_required`: the sale asks for a `Proof-Of-Work` header (see `GET /api/sales/{id}/challenge`)", body = ErrorBody<'static>),
    (status = 429, description = "`rate_limited`: an entry limit refused (by default, per network)", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"),
        ("RateLimit" = String), ("RateLimit-Policy" = String))),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 409, description = "`entries_not_open` (with `Retry-After`: seconds until entries open) or `not_a_draw`", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "With `entries_not_open`: seconds until entries open"))),
    (status = 410, description = "`entries_closed`: the draw's time has come", body = ErrorBody<'static>),
))]
pub(super) async fn enter(
    state: web::Data<AppState>,
    worker: web::Data<Worker>,
    user: AuthUser,
    path: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, AppError> {
    let sale = SaleId::parse(&path)?;
    // The sale's gates as this process read them (its cached record read at most
    // once a second during the entries), with the draw's window: refusals without
    // a query; the entry itself is checked again by Postgres's clock under the
    // draw's lock.
    let gates = fair::sale_gates(&state, sale).await?;
    let Some(entries_open_ms) = gates.entries_open_ms else {
        return Err(not_a_draw());
    };
    let now = Utc::now().timestamp_millis();
    if entries_open_ms > now {
        return Err(not_open(entries_open_ms - now));
    }
    if gates.opens_ms <= now {
        return Err(closed());
    }
    // Within the window: the sale's fair-opening gates (account age, proof of
    // work), then the entry route's limits (by default one per network, see
    // docs/rate-limits.md).
    let proof = fair::pass(&state, &req, &user, Subject::Sale(sale), gates, true).await?;
    let granted = state
        .limiter
        .check(Route::Entry, Some(user.id), &req)
        .await?;
    proof.spend(&state, &req).await?;
    match worker.entries.submit(sale, user.id).await? {
        Entered::Entry(entry) => Ok(granted.attach(
            HttpResponse::Ok()
                .insert_header((header::CACHE_CONTROL, "no-store"))
                .json(EntryAnswer {
                    entry_id: entry.entry_id,
                    entered_at: entry.entered_at,
                    state: "entered",
                }),
        )),
        Entered::NotOpen { in_ms } => Err(not_open(in_ms)),
        Entered::Closed => Err(closed()),
        Entered::NoDraw => Err(AppError::not_found(format!("no draw for sale {sale}"))),
    }
}

/// Where an entrant stands.
#[derive(Serialize, utoipa::ToSchema)]
struct EntryStanding {
    entry_id: i64,
    entered_at: DateTime<Utc>,
    /// `entered` (not drawn yet), `won` (buy with `ticket` before `claim_until`),
    /// `bought`, `claim_passed` (won, and the claim window ended unused, or the
    /// sale closed or ended first),
    /// `waitlisted` (a passed win may still come: `position` 1 is next) or
    /// `not_drawn` (no win can come any more).
    state: &'static str,
    /// The draw's time.
    draw_at: DateTime<Utc>,
    /// `won`: the purchase ticket (`{"ticket": "..."}` with the purchase), good
    /// until `claim_until`.
    #[serde(skip_serializing_if = "Option::is_none")]
    ticket: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    claim_until: Option<DateTime<Utc>>,
    /// `waitlisted`: entries before this one still to be offered a win, plus one.
    #[serde(skip_serializing_if = "Option::is_none")]
    position: Option<i64>,
}

/// The signed-in user's entry into the sale's draw and where it stands; a
/// winner's answer carries the purchase ticket.
#[utoipa::path(get, path = "/api/sales/{id}/entry/me", tag = "sales", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), security(("bearer" = [])), responses(
    (status = 200, description = "The entry and its state", body = EntryStanding),
    (status = 404, description = "`not_found`: no such sale, or no entry of this user", body = ErrorBody<'static>),
    (status = 409, description = "`not_a_draw`", body = ErrorBody<'static>),
))]
pub(super) async fn me(
    state: web::Data<AppState>,
    user: AuthUser,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let sale = SaleId::parse(&path)?;
    let row = draw_row(&state, sale).await?;
    let found = enter::standing(
        &state.db,
        &mut state.redis.clone(),
        &state.keys,
        &row,
        user.id,
    )
    .await?;
    let Some((entry, standing)) = found else {
        return Err(AppError::not_found("you have not entered this draw"));
    };
    let (ticket, claim_until, position) = match standing {
        Standing::Won { claim_until } => (
            Some(
                state
                    .tickets
                    .issue(sale, user.id, claim_until.timestamp_millis()),
            ),
            Some(claim_until),
            None,
        ),
        Standing::Waitlisted { position } => (None, None, Some(position)),
        _ => (None, None, None),
    };
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(EntryStanding {
            entry_id: entry.entry_id,
            entered_at: entry.entered_at,
            state: standing.as_str(),
            draw_at: row.starts_at,
            ticket,
            claim_until,
            position,
        }))
}

fn pending(in_ms: i64) -> AppError {
    AppError::new(
        ErrorCode::DrawPending,
        format!("this sale is drawn in {} s", seconds(in_ms)),
    )
    .with_header(header::RETRY_AFTER, seconds(in_ms))
}

/// The draw as published once made: the seed, its commitment, the number of
/// entries, every win so far in the seeded order. Anyone may check it
/// (`stampede verify-draw`; the arithmetic is in docs/api.md, "Draw sales").
#[utoipa::path(get, path = "/api/sales/{id}/draw", tag = "sales", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), responses(
    (status = 200, description = "The draw", body = Published),
    (status = 404, description = "`not_found`: no such sale (or a rehearsal, to anyone but an admin)", body = ErrorBody<'static>),
    (status = 409, description = "`draw_pending` (with `Retry-After`: seconds until the draw's time) or `not_a_draw`", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "With `draw_pending`: seconds until the draw"))),
))]
pub(super) async fn draw(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let sale = SaleId::parse(&path)?;
    let admin = optional_user(&req)?.is_some_and(|u| u.admin);
    Ok(HttpResponse::Ok().json(drawn(&state, sale, admin).await?))
}

/// The sale's published draw, or the refusal: 404 (no such sale, a rehearsal to
/// anyone but an admin, no draw), 409 `draw_pending` before the draw's time (from the cached record: no
/// query) or while it is being made.
async fn drawn(state: &AppState, sale: SaleId, admin: bool) -> Result<Published, AppError> {
    let row = draw_row(state, sale).await?;
    if row.rehearsal && !admin {
        return Err(AppError::not_found(format!("no sale with id {sale}")));
    }
    let early = (row.starts_at - Utc::now()).num_milliseconds();
    if early > 0 {
        return Err(pending(early));
    }
    publish::cached(state, sale, |not_drawn| match not_drawn {
        Publication::Pending { in_ms } => pending(in_ms),
        _ => AppError::not_found(format!("no draw for sale {sale}")),
    })
    .await
}

/// Every entry of the drawn sale, by id: `entry_id,entered_at` (RFC 3339 UTC,
/// milliseconds), streamed.
#[utoipa::path(get, path = "/api/sales/{id}/draw/entries.csv", tag = "sales", params(("id" = i64, Path, description = "The sale id, a positive integer", minimum = 1)), responses(
    (status = 200, description = "`text/csv`: `entry_id,entered_at`, one line per entry", content_type = "text/csv", body = String),
    (status = 404, description = "`not_found`: no such sale", body = ErrorBody<'static>),
    (status = 409, description = "`draw_pending` (with `Retry-After`) or `not_a_draw`", body = ErrorBody<'static>),
    (status = 503, description = "`busy`: this server is sending as many of these downloads as it sends at once", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds before trying again"))),
))]
pub(super) async fn entries_csv(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let sale = SaleId::parse(&path)?;
    let admin = optional_user(&req)?.is_some_and(|u| u.admin);
    // Anyone may download it: at most a few at once per process (each holds a
    // connection of the requests' pool while it runs), see `csv::PUBLIC_DOWNLOADS`;
    // the turn first, so a refused download asks nothing of Postgres.
    let turn = crate::csv::public_turn()?;
    drawn(&state, sale, admin).await?;
    Ok(crate::csv::attachment(
        &format!("sale-{sale}-entries.csv"),
        publish::entries_csv(state.db.clone(), sale, turn),
    ))
}
