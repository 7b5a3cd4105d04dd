//! An admin's controls of a waiting room's line (issue 50): pause admissions and
//! resume them, close the line to new joins and reopen it.
//!
//! Postgres keeps them (`queue_lines`); Redis holds them where the scripts read
//! them, the meta hash's `q_paused` and `q_closed`: `lua/queue_admit.lua` lets
//! nobody in while paused (admissions running still end: a pass still frees its
//! room for when the line resumes), `lua/queue_place.lua` refuses a new join while
//! closed (those in line keep their places). A change takes the sale's row lock and
//! writes Redis under it, before the commit, as an edit does (`lua/update_meta.lua`:
//! only where Redis holds the sale), and is recorded in the sale's history. A
//! sale's rebuild writes the controls back from Postgres ([`write_back`]), so they
//! hold on every server, and across restarts and wipes.

use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};

use super::numbers::{self, QueueNumbers};
use crate::audit::{self, Action, Change, Subject};
use crate::domain::{SaleId, UserId};
use crate::error::{AppError, ErrorCode};
use crate::keys::SaleKeys;
use crate::sale::admin::{REBUILD_WAIT, SaleAdmin};

/// What an admin does to a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LineAction {
    /// Let nobody in until resumed.
    Pause,
    Resume,
    /// Refuse new joins (409 `line_closed`); those in line keep their places.
    Close,
    Reopen,
}

/// A line's controls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct LineControls {
    pub paused: bool,
    pub joins_closed: bool,
}

impl LineControls {
    fn after(self, action: LineAction) -> LineControls {
        match action {
            LineAction::Pause => LineControls {
                paused: true,
                ..self
            },
            LineAction::Resume => LineControls {
                paused: false,
                ..self
            },
            LineAction::Close => LineControls {
                joins_closed: true,
                ..self
            },
            LineAction::Reopen => LineControls {
                joins_closed: false,
                ..self
            },
        }
    }

    fn meta_fields(self) -> [(&'static str, i64); 2] {
        [
            ("q_paused", i64::from(self.paused)),
            ("q_closed", i64::from(self.joins_closed)),
        ]
    }
}

/// The controls Postgres holds for the sale's line (none: neither).
pub async fn read(tx: &mut sqlx::PgConnection, sale: SaleId) -> Result<LineControls, AppError> {
    let row: Option<LineControls> =
        sqlx::query_as("SELECT paused, joins_closed FROM queue_lines WHERE sale_id = $1")
            .bind(sale.get())
            .fetch_optional(&mut *tx)
            .await?;
    Ok(row.unwrap_or_default())
}

/// Writes the controls Postgres holds into the sale's meta hash: the rebuild's
/// step, under the sale's row lock, while the state is not trusted. After a wipe
/// this makes the hash, which the rebuild's end fills (until then it has no
/// window, so the scripts still answer "not loaded").
pub async fn write_back<C: ConnectionLike>(
    tx: &mut sqlx::PgConnection,
    redis: &mut C,
    k: &SaleKeys,
    sale: SaleId,
) -> Result<(), AppError> {
    let controls = read(tx, sale).await?;
    let _: i64 = redis::cmd("HSET")
        .arg(&k.meta)
        .arg(&controls.meta_fields())
        .query_async(redis)
        .await?;
    Ok(())
}

/// The line's numbers after an admin's change, and the units left.
#[derive(Clone, Copy, Debug, Serialize, utoipa::ToSchema)]
pub struct LineState {
    #[schema(value_type = i64)]
    pub sale_id: SaleId,
    /// Units not yet sold: the line's places ahead set against them.
    pub units_left: i64,
    /// The line's numbers, with `paused` and `joins_closed`, as the sale's view
    /// carries them.
    pub line: QueueNumbers,
}

/// Applies `action` to the line of sale `id` (see the module's doc): 404 without
/// such a sale, 409 `no_waiting_room` without a line. The same action twice is one
/// change, recorded once.
pub async fn control<S: SaleAdmin + ?Sized>(
    state: &S,
    id: SaleId,
    action: LineAction,
    admin: UserId,
) -> Result<LineState, AppError> {
    let mut tx = state.db().begin().await?;
    let room: Option<bool> =
        sqlx::query_scalar("SELECT waiting_room FROM sales WHERE id = $1 FOR UPDATE")
            .bind(id.get())
            .fetch_optional(&mut *tx)
            .await?;
    match room {
        None => return Err(AppError::not_found(format!("no sale with id {id}"))),
        Some(false) => {
            return Err(AppError::new(
                ErrorCode::NoWaitingRoom,
                format!("sale {id} has no waiting room: it has no line to control"),
            ));
        }
        Some(true) => {}
    }
    let before = read(&mut tx, id).await?;
    let after = before.after(action);
    if after != before {
        sqlx::query(
            "INSERT INTO queue_lines (sale_id, paused, joins_closed) VALUES ($1, $2, $3)
             ON CONFLICT (sale_id) DO UPDATE
             SET paused = $2, joins_closed = $3, updated_at = now()",
        )
        .bind(id.get())
        .bind(after.paused)
        .bind(after.joins_closed)
        .execute(&mut *tx)
        .await?;
        let as_json = |c: LineControls| serde_json::to_value(c).ok();
        audit::record(
            &mut tx,
            Change {
                admin,
                action: Action::Line,
                subject: Subject::Sale(id),
                before: as_json(before),
                after: as_json(after),
            },
        )
        .await?;
    }
    let k = state.keys().sale(id);
    let mut redis = state.redis().clone();
    let in_redis = crate::restore::update_meta(&mut redis, &k.meta, &after.meta_fields()).await?;
    tx.commit().await?;
    if !in_redis {
        state.rebuild_sale(id, REBUILD_WAIT).await?;
    }
    let line = numbers::numbers(&mut redis, state.keys(), id).await?;
    let left: Option<i64> = redis::cmd("GET")
        .arg(&k.stock)
        .query_async(&mut redis)
        .await?;
    Ok(LineState {
        sale_id: id,
        units_left: left.unwrap_or(0).max(0),
        line,
    })
}
