//! An admin's edit (before the opening), archive and delete of a poll (issue 25),
//! as [`crate::sale::lifecycle`] does them for sales: the poll's row lock first
//! (a rebuild takes the same lock), Redis under that lock and before the commit,
//! and a record in `admin_changes` in the same transaction.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use serde_json::json;

use super::cached::invalidate_record;
use super::setting::BallotFields;
use super::store::{self, OptionRow, PollRecord};
use super::visibility::ResultsVisibility;
use crate::audit::{self, Action, Change, Subject};
use crate::cache::CachedReads;
use crate::domain::{PollId, UserId};
use crate::error::{AppError, ErrorCode};
use crate::lua::{lua_script, unexpected_reply};

static EDIT_POLL: LazyLock<crate::lua::Script> = lua_script!("edit_poll.lua");
static DELETE_POLL: LazyLock<crate::lua::Script> = lua_script!("delete_poll.lua");

crate::lua::reply_codes! {
    /// What `lua/edit_poll.lua` answers, as its header lists them.
    pub enum EditCode in "edit_poll.lua", checked_by edit_codes_are_the_scripts {
        Written = 1, "written";
        HasVotes = 0, "the poll has a vote";
        NotLoaded = -1, "not loaded";
    }
}

crate::lua::reply_codes! {
    /// What `lua/delete_poll.lua` answers, as its header lists them.
    pub enum DeleteCode in "delete_poll.lua", checked_by delete_codes_are_the_scripts {
        Removed = 1, "removed";
        HasVotes = 0, "the poll has a vote";
    }
}

/// An edit, each field already checked on its own (`None`: not sent). New options
/// replace the old ones (new ids).
#[derive(Default, Debug)]
pub struct PollEdit {
    pub question: Option<String>,
    pub options: Option<Vec<String>>,
    pub opens_at: Option<DateTime<Utc>>,
    pub closes_at: Option<DateTime<Utc>>,
    pub results: Option<ResultsVisibility>,
    /// The ballot fields as sent, checked here against the poll's settings and
    /// options after the edit.
    pub ballot: BallotFields,
    /// `proof_of_work` and `min_account_age_s`, checked (`None`: not sent).
    pub fairness: crate::gate::Fairness,
}

/// A poll's window as a new or edited poll may have it (422 `invalid_window`).
pub fn check_window(opens_at: DateTime<Utc>, closes_at: DateTime<Utc>) -> Result<(), AppError> {
    let refuse = |message: &str| Err(AppError::new(ErrorCode::InvalidWindow, message.to_string()));
    if closes_at <= opens_at {
        return refuse("closes_at must be after opens_at");
    }
    if closes_at <= Utc::now() {
        return refuse("closes_at is in the past");
    }
    if closes_at - opens_at > chrono::Duration::days(366) {
        return refuse("a poll may stay open at most 366 days");
    }
    Ok(())
}

/// The poll's record with its row locked (`FOR UPDATE`) in `tx`; 404 when none.
pub(super) async fn locked(
    tx: &mut sqlx::PgConnection,
    id: PollId,
) -> Result<PollRecord, AppError> {
    let poll = sqlx::query_as::<_, store::PollRow>(concat!(
        "SELECT ",
        poll_columns!(),
        " FROM polls WHERE id = $1 FOR UPDATE"
    ))
    .bind(id.get())
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| AppError::not_found(format!("no poll with id {id}")))?;
    let options = sqlx::query_as::<_, OptionRow>(
        "SELECT id, label, position FROM poll_options WHERE poll_id = $1 ORDER BY position",
    )
    .bind(id.get())
    .fetch_all(&mut *tx)
    .await?;
    Ok(PollRecord { poll, options })
}

/// Edits a poll that has not opened (409 `poll_started` once it has). Returns
/// whether Redis held the poll (when not, the caller has it rebuilt).
pub async fn edit<S: CachedReads + ?Sized>(
    state: &S,
    id: PollId,
    edit: PollEdit,
    admin: UserId,
) -> Result<bool, AppError> {
    let mut tx = state.db().begin().await?;
    let before = locked(&mut tx, id).await?;
    let old = &before.poll;
    // Opened (or closed before it opened): no edit, even one that changes
    // nothing or would be refused for its values (docs/api.md).
    if old.closed {
        return Err(AppError::new(
            ErrorCode::PollStarted,
            "this poll is closed: it can no longer change (archive it instead)",
        ));
    }
    if old.opens_at <= Utc::now() {
        return Err(AppError::new(
            ErrorCode::PollStarted,
            "this poll has opened: it can no longer change (close or archive it instead)",
        ));
    }
    let labels: Vec<String> = before.options.iter().map(|o| o.label.clone()).collect();
    let question = edit.question.unwrap_or_else(|| old.question.clone());
    let opens_at = edit.opens_at.unwrap_or(old.opens_at);
    let closes_at = edit.closes_at.unwrap_or(old.closes_at);
    let options = edit.options.unwrap_or_else(|| labels.clone());
    let results = edit.results.unwrap_or(old.results);
    let ballot = edit.ballot.settle(old.ballot_settings(), options.len())?;
    let proof_of_work = edit.fairness.proof_of_work.unwrap_or(old.proof_of_work);
    let min_account_age_s = edit
        .fairness
        .min_account_age_s
        .unwrap_or(old.min_account_age_s);
    if question == old.question
        && proof_of_work == old.proof_of_work
        && min_account_age_s == old.min_account_age_s
        && opens_at == old.opens_at
        && closes_at == old.closes_at
        && options == labels
        && results == old.results
        && ballot == old.ballot_settings()
    {
        return Ok(true);
    }
    check_window(opens_at, closes_at)?;
    sqlx::query(
        "UPDATE polls SET question = $2, opens_at = $3, closes_at = $4, results = $5,
                          ballot = $6, max_choices = $7, votes_per_user = $8,
                          max_per_option = $9, allow_change = $10, proof_of_work = $11,
                          min_account_age_s = $12, updated_at = now()
         WHERE id = $1",
    )
    .bind(id.get())
    .bind(&question)
    .bind(opens_at)
    .bind(closes_at)
    .bind(results.as_str())
    .bind(ballot.kind.as_str())
    .bind(ballot.max_choices)
    .bind(ballot.votes_per_user)
    .bind(ballot.max_per_option)
    .bind(ballot.allow_change)
    .bind(proof_of_work)
    .bind(min_account_age_s)
    .execute(&mut *tx)
    .await?;
    let mut option_ids: Vec<i64> = before.options.iter().map(|o| o.id).collect();
    if options != labels {
        sqlx::query("DELETE FROM poll_options WHERE poll_id = $1")
            .bind(id.get())
            .execute(&mut *tx)
            .await?;
        let positions: Vec<i32> = (1..=options.len() as i32).collect();
        option_ids = sqlx::query_scalar(
            "INSERT INTO poll_options (poll_id, label, position)
             SELECT $1, label, position FROM UNNEST($2::text[], $3::int4[]) AS t(label, position)
             RETURNING id",
        )
        .bind(id.get())
        .bind(&options)
        .bind(&positions)
        .fetch_all(&mut *tx)
        .await?;
    }
    audit::record(
        &mut tx,
        Change {
            admin,
            action: Action::Edit,
            subject: Subject::Poll(id),
            before: Some(json!({
                "question": old.question, "options": labels,
                "opens_at": old.opens_at, "closes_at": old.closes_at,
                "results": old.results,
                "ballot": old.ballot, "max_choices": old.max_choices,
                "votes_per_user": old.votes_per_user, "max_per_option": old.max_per_option,
                "allow_change": old.allow_change,
                "proof_of_work": old.proof_of_work,
                "min_account_age_s": old.min_account_age_s,
            })),
            after: Some(json!({
                "question": question, "options": options,
                "opens_at": opens_at, "closes_at": closes_at,
                "results": results,
                "ballot": ballot.kind, "max_choices": ballot.max_choices,
                "votes_per_user": ballot.votes_per_user, "max_per_option": ballot.max_per_option,
                "allow_change": ballot.allow_change,
                "proof_of_work": proof_of_work,
                "min_account_age_s": min_account_age_s,
            })),
        },
    )
    .await?;
    let k = state.keys().poll(id);
    let mut invocation = EDIT_POLL.prepare_invoke();
    invocation
        .key(&k.meta)
        .key(&k.options)
        .key(&k.voters)
        .arg(opens_at.timestamp_millis())
        .arg(closes_at.timestamp_millis())
        .arg(ballot.redis_field());
    for option in &option_ids {
        invocation.arg(*option);
    }
    let written: i64 = invocation.invoke_async(&mut state.redis().clone()).await?;
    let in_redis = match EditCode::of(written) {
        Some(EditCode::Written) => true,
        Some(EditCode::NotLoaded) => false,
        Some(EditCode::HasVotes) => {
            return Err(AppError::new(
                ErrorCode::PollStarted,
                "this poll has opened and has votes: it can no longer change",
            ));
        }
        None => return Err(unexpected_reply("edit_poll.lua", written)),
    };
    tx.commit().await?;
    invalidate_record(state, id).await?;
    Ok(in_redis)
}

/// Archives the poll (off the public lists) or brings it back.
pub async fn set_archived<S: CachedReads + ?Sized>(
    state: &S,
    id: PollId,
    archived: bool,
    admin: UserId,
) -> Result<(), AppError> {
    let mut tx = state.db().begin().await?;
    let before = locked(&mut tx, id).await?;
    if before.poll.archived_at.is_some() == archived {
        return Ok(());
    }
    let at: Option<DateTime<Utc>> = sqlx::query_scalar(
        "UPDATE polls SET archived_at = CASE WHEN $2 THEN now() END, updated_at = now()
         WHERE id = $1 RETURNING archived_at",
    )
    .bind(id.get())
    .bind(archived)
    .fetch_one(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        Change {
            admin,
            action: if archived {
                Action::Archive
            } else {
                Action::Unarchive
            },
            subject: Subject::Poll(id),
            before: Some(json!({ "archived_at": before.poll.archived_at })),
            after: Some(json!({ "archived_at": at })),
        },
    )
    .await?;
    tx.commit().await?;
    invalidate_record(state, id).await
}

/// Deletes a poll that never had a vote, from both stores: 409 `has_votes` once
/// it has one (settled, or accepted in Redis and not settled yet).
pub async fn delete<S: CachedReads + ?Sized>(
    state: &S,
    id: PollId,
    admin: UserId,
) -> Result<(), AppError> {
    let mut tx = state.db().begin().await?;
    let before = locked(&mut tx, id).await?;
    let refused = || {
        AppError::new(
            ErrorCode::HasVotes,
            "this poll has votes, so it stays on record: archive it to hide it",
        )
    };
    let has_votes: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM votes WHERE poll_id = $1)")
            .bind(id.get())
            .fetch_one(&mut *tx)
            .await?;
    if has_votes {
        return Err(refused());
    }
    sqlx::query("DELETE FROM poll_options WHERE poll_id = $1")
        .bind(id.get())
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM polls WHERE id = $1")
        .bind(id.get())
        .execute(&mut *tx)
        .await?;
    audit::record(
        &mut tx,
        Change {
            admin,
            action: Action::Delete,
            subject: Subject::Poll(id),
            before: Some(serde_json::to_value(&before).map_err(|e| AppError::Internal(e.into()))?),
            after: None,
        },
    )
    .await?;
    let k = state.keys().poll(id);
    let removed: i64 = DELETE_POLL
        .key(&k.meta)
        .key(&k.options)
        .key(&k.voters)
        .key(&k.tally)
        .key(&k.votes)
        .key(&k.rebuild)
        .key(&k.keys)
        .invoke_async(&mut state.redis().clone())
        .await?;
    match DeleteCode::of(removed) {
        Some(DeleteCode::Removed) => {}
        Some(DeleteCode::HasVotes) => return Err(refused()),
        None => return Err(unexpected_reply("delete_poll.lua", removed)),
    }
    tx.commit().await?;
    invalidate_record(state, id).await
}
