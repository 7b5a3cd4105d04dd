//! Who changed what: every admin change (create, edit, stock, open, close, archive,
//! unarchive, delete, cancel, refund, line, reveal) is recorded in `admin_changes`, in the same
//! transaction as the change itself (migrations/0009_lifecycle.sql), with what the
//! subject looked like before and after. A change that rolls back leaves no record;
//! a record never describes a change that did not commit.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::{PollId, SaleId, UserId};
use crate::error::AppError;

/// What an admin did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Create,
    Edit,
    Stock,
    Open,
    Close,
    Archive,
    Unarchive,
    Delete,
    Cancel,
    Refund,
    /// A waiting room's line paused, resumed, closed to joins or reopened.
    Line,
    /// An `on_reveal` poll's results made public.
    Reveal,
}

impl Action {
    pub const ALL: [Action; 12] = [
        Action::Create,
        Action::Edit,
        Action::Stock,
        Action::Open,
        Action::Close,
        Action::Archive,
        Action::Unarchive,
        Action::Delete,
        Action::Cancel,
        Action::Refund,
        Action::Line,
        Action::Reveal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Edit => "edit",
            Action::Stock => "stock",
            Action::Open => "open",
            Action::Close => "close",
            Action::Archive => "archive",
            Action::Unarchive => "unarchive",
            Action::Delete => "delete",
            Action::Cancel => "cancel",
            Action::Refund => "refund",
            Action::Line => "line",
            Action::Reveal => "reveal",
        }
    }

    pub fn parse(text: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == text)
    }
}

/// What a change was made to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    Sale(SaleId),
    Poll(PollId),
    /// An order of a sale: the history is the sale's.
    Order(SaleId, Uuid),
}

/// One change to record: `before` and `after` are what the subject looked like
/// (the fields the change touched, or the whole row; `None` for a create's before
/// and a delete's after).
pub struct Change {
    pub admin: UserId,
    pub action: Action,
    pub subject: Subject,
    pub before: Option<serde_json::Value>,
    pub after: Option<serde_json::Value>,
}

/// Records `change` inside the caller's transaction.
pub async fn record(tx: &mut PgConnection, change: Change) -> Result<(), AppError> {
    let (sale, poll, order) = match change.subject {
        Subject::Sale(s) => (Some(s.get()), None, None),
        Subject::Poll(p) => (None, Some(p.get()), None),
        Subject::Order(s, o) => (Some(s.get()), None, Some(o)),
    };
    sqlx::query(
        "INSERT INTO admin_changes (admin_id, action, sale_id, poll_id, order_id, before, after)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(change.admin.get())
    .bind(change.action.as_str())
    .bind(sale)
    .bind(poll)
    .bind(order)
    .bind(change.before)
    .bind(change.after)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// One recorded change, as `GET /api/admin/sales/{id}/history` shows it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Entry {
    pub id: i64,
    /// The admin's account id (null once that account is gone).
    pub admin_id: Option<i64>,
    /// The admin's username.
    pub admin: Option<String>,
    pub at: DateTime<Utc>,
    /// create, edit, stock, open, close, archive, unarchive, delete, cancel or refund.
    pub action: String,
    /// The order, for a cancel or a refund.
    pub order_id: Option<Uuid>,
    /// The fields before the change; null for a create (and a stock change).
    #[schema(value_type = Option<Object>)]
    pub before: Option<serde_json::Value>,
    /// The fields after the change; null for a delete. A stock change's also
    /// carry how Redis decided it: `outcome` (`pending`, `applied` or `refused`:
    /// a refused one changed nothing) and `delta` (the units it moved).
    #[schema(value_type = Option<Object>)]
    pub after: Option<serde_json::Value>,
}

/// A sale's or poll's changes, newest first, at most `limit`.
pub async fn history(
    db: &sqlx::PgPool,
    subject: Subject,
    limit: i64,
) -> Result<Vec<Entry>, AppError> {
    let (sale, poll) = match subject {
        Subject::Sale(s) | Subject::Order(s, _) => (Some(s.get()), None),
        Subject::Poll(p) => (None, Some(p.get())),
    };
    Ok(sqlx::query_as(
        "SELECT c.id, c.admin_id, u.username AS admin, c.at, c.action, c.order_id, c.before,
                CASE WHEN sc.id IS NULL THEN c.after
                     ELSE c.after || jsonb_build_object('outcome', sc.status, 'delta', sc.delta)
                END AS after
         FROM admin_changes c LEFT JOIN users u ON u.id = c.admin_id
           LEFT JOIN stock_changes sc ON c.action = 'stock'
             AND sc.id = (c.after->>'change_id')::int8
         WHERE ($1::int8 IS NOT NULL AND c.sale_id = $1) OR ($2::int8 IS NOT NULL AND c.poll_id = $2)
         ORDER BY c.id DESC LIMIT $3",
    )
    .bind(sale)
    .bind(poll)
    .bind(limit)
    .fetch_all(db)
    .await?)
}
