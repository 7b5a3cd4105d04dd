//! An admin's reveal of an `on_reveal` poll's results, once it is closed: stored
//! in Postgres (`polls.revealed_at`), so every instance and every restart sees it,
//! recorded in the poll's history, and the cached record invalidated at once.

use chrono::{DateTime, Utc};
use serde_json::json;

use super::cached::invalidate_record;
use super::lifecycle::locked;
use super::visibility::{ResultsVisibility, is_closed};
use crate::audit::{self, Action, Change, Subject};
use crate::cache::CachedReads;
use crate::domain::{PollId, UserId};
use crate::error::{AppError, ErrorCode};

/// Reveals the poll's results: 409 `not_revealable` when its setting is not
/// `on_reveal` or it is not closed yet (by the server's clock, as its status). A
/// poll already revealed stays as it is (no second record). Returns whether this
/// call revealed it.
pub async fn reveal<S: CachedReads + ?Sized>(
    state: &S,
    id: PollId,
    admin: UserId,
) -> Result<bool, AppError> {
    let mut tx = state.db().begin().await?;
    let before = locked(&mut tx, id).await?;
    let poll = &before.poll;
    let refuse = |message: String| Err(AppError::new(ErrorCode::NotRevealable, message));
    if poll.results != ResultsVisibility::OnReveal {
        return refuse(format!(
            "this poll's results are not kept for a reveal (its results setting is \"{}\")",
            poll.results.as_str()
        ));
    }
    if poll.revealed_at.is_some() {
        return Ok(false);
    }
    if !is_closed(poll, false, Utc::now()) {
        return refuse("this poll is still open: reveal its results once it has closed".into());
    }
    let at: DateTime<Utc> = sqlx::query_scalar(
        "UPDATE polls SET revealed_at = now(), updated_at = now() WHERE id = $1
         RETURNING revealed_at",
    )
    .bind(id.get())
    .fetch_one(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        Change {
            admin,
            action: Action::Reveal,
            subject: Subject::Poll(id),
            before: Some(json!({ "revealed_at": null })),
            after: Some(json!({ "revealed_at": at })),
        },
    )
    .await?;
    tx.commit().await?;
    invalidate_record(state, id).await?;
    Ok(true)
}
