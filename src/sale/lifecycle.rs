//! The days around a sale: an admin's edit and archive (issue 25), and the
//! row lock they and the delete (`delete.rs`) take first. Each
//! takes the sale's row lock first, so a rebuild of the sale (which takes the same
//! lock) sees all of the change or none of it, and records itself in
//! `admin_changes` in the same transaction ([`crate::audit`]).
//!
//! What may change when:
//! - before the opening, every field of [`SaleEdit`];
//! - once the sale has opened (its start has passed), only the words
//!   (`name`, `description`), the picture and a later `ends_at`: anything else is
//!   409 `sale_started`. A field sent with the value it already has is no change.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

use super::admin::{REBUILD_WAIT, SaleAdmin};
use super::cached;
use super::record::{SaleRow, SaleView, sale_columns};
use super::store;
use crate::audit::{self, Action, Change, Subject};
use crate::domain::{SaleId, UserId};
use crate::error::{AppError, ErrorCode};
use crate::lua::{lua_script, unexpected_reply};

static EDIT_SALE: LazyLock<crate::lua::Script> = lua_script!("edit_sale.lua");

crate::lua::reply_codes! {
    /// What `lua/edit_sale.lua` answers, as its header lists them.
    pub enum EditCode in "edit_sale.lua", checked_by edit_codes_are_the_scripts {
        Written = 1, "written";
        HasBuyers = 0, "the sale has buyers";
        NotLoaded = -1, "not loaded";
    }
}

pub use crate::domain::MAX_SALE_DAYS;

/// A sale's window as a new or edited sale may have it: the end after the start,
/// in the future, at most [`MAX_SALE_DAYS`] later (422 `invalid_window`).
pub fn check_window(starts_at: DateTime<Utc>, ends_at: DateTime<Utc>) -> Result<(), AppError> {
    let refuse = |message: String| Err(AppError::new(ErrorCode::InvalidWindow, message));
    if ends_at <= starts_at {
        return refuse("ends_at must be after starts_at".into());
    }
    if ends_at - starts_at > chrono::Duration::days(MAX_SALE_DAYS) {
        return refuse(format!("a sale may last at most {MAX_SALE_DAYS} days"));
    }
    if ends_at <= Utc::now() {
        return refuse("ends_at is in the past".into());
    }
    Ok(())
}

/// An edit, each field already checked on its own (`None`: not sent). The picture
/// is `Some(None)` to remove it.
#[derive(Default, Debug)]
pub struct SaleEdit {
    pub name: Option<String>,
    pub description: Option<String>,
    pub price_cents: Option<i64>,
    pub image_url: Option<Option<String>>,
    pub starts_at: Option<DateTime<Utc>>,
    pub ends_at: Option<DateTime<Utc>>,
    pub requires_ticket: Option<bool>,
    pub payment_window_s: Option<i32>,
    pub rebuy_after_expiry: Option<bool>,
    pub max_per_user: Option<i32>,
    pub waiting_room: Option<bool>,
    pub queue_opens_at: Option<DateTime<Utc>>,
    pub admit_per_second: Option<i32>,
    pub proof_of_work: Option<i16>,
    pub min_account_age_s: Option<i32>,
    /// A draw's (see [`super::draw`]): `draw_at` moves `starts_at`.
    pub draw_at: Option<DateTime<Utc>>,
    pub entries_open_at: Option<DateTime<Utc>>,
    pub claim_window_s: Option<i32>,
}

/// The fields an edit may still change once the sale has opened (`ends_at` only
/// later).
const AFTER_OPENING: [&str; 4] = ["name", "description", "image_url", "ends_at"];

impl SaleEdit {
    /// The row with the edit applied, and the fields that really change (each
    /// with its value before and after).
    fn apply(&self, row: &SaleRow) -> (SaleRow, Vec<(&'static str, Value, Value)>) {
        let mut new = row.clone();
        let mut changed = Vec::new();
        macro_rules! field {
            ($name:ident) => {
                field!($name, self.$name.clone())
            };
            ($name:ident, $value:expr) => {
                if let Some(value) = $value {
                    if value != row.$name {
                        changed.push((stringify!($name), json!(row.$name), json!(value)));
                        new.$name = value;
                    }
                }
            };
        }
        field!(name);
        field!(description);
        field!(price_cents);
        field!(image_url);
        field!(starts_at);
        field!(ends_at);
        field!(requires_ticket);
        field!(payment_window_s);
        field!(rebuy_after_expiry);
        field!(max_per_user);
        field!(waiting_room);
        field!(queue_opens_at, self.queue_opens_at.map(Some));
        field!(admit_per_second, self.admit_per_second.map(Some));
        field!(proof_of_work);
        field!(min_account_age_s);
        field!(entries_open_at, self.entries_open_at.map(Some));
        field!(claim_window_s, self.claim_window_s.map(Some));
        (new, changed)
    }
}

/// The sale's row under its lock (`FOR UPDATE`), in `tx`; 404 when there is none.
pub(super) async fn locked(tx: &mut sqlx::PgConnection, id: SaleId) -> Result<SaleRow, AppError> {
    sqlx::query_as::<_, SaleRow>(concat!(
        "SELECT ",
        sale_columns!(),
        " FROM sales WHERE id = $1 FOR UPDATE"
    ))
    .bind(id.get())
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| AppError::not_found(format!("no sale with id {id}")))
}

fn as_object(fields: impl IntoIterator<Item = (&'static str, Value)>) -> Value {
    Value::Object(
        fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<Map<_, _>>(),
    )
}

/// Applies an admin's edit (see the module's rules) and answers the sale as it is
/// now. Nothing changes when any part is refused.
pub async fn edit<S: SaleAdmin + ?Sized>(
    state: &S,
    id: SaleId,
    edit: SaleEdit,
    admin: UserId,
) -> Result<SaleView, AppError> {
    let mut edit = edit;
    let mut tx = state.db().begin().await?;
    let row = locked(&mut tx, id).await?;
    draw_fields(&row, &mut edit)?;
    let (new, mut changed) = edit.apply(&row);
    if changed.is_empty() {
        drop(tx);
        return cached::load_view(state, id).await;
    }
    // A draw's settings are fixed once its entries open.
    let opened = row.terms_fixed_at() <= Utc::now();
    if opened {
        if let Some((field, ..)) = changed.iter().find(|(f, ..)| !AFTER_OPENING.contains(f)) {
            return Err(AppError::new(
                ErrorCode::SaleStarted,
                format!(
                    "this sale has opened: {field} is fixed now (only name, description, \
                     image_url and a later ends_at may change)"
                ),
            ));
        }
        if new.ends_at < row.ends_at {
            return Err(AppError::new(
                ErrorCode::SaleStarted,
                "this sale has opened: its end may only move later (close it to end it now)",
            ));
        }
    }
    if new.starts_at != row.starts_at || new.ends_at != row.ends_at {
        check_window(new.starts_at, new.ends_at)?;
    }
    let mut new = new;
    if new.is_draw() {
        crate::sale::draw::DrawSettings::check(
            new.entries_open_at,
            new.starts_at,
            new.claim_window_s.map(i64::from),
        )?;
    }
    if new.waiting_room {
        crate::sale::queue::room::WaitingRoom::check(
            new.queue_opens_at,
            new.admit_per_second.map(i64::from),
            new.starts_at,
        )?;
        if edit.requires_ticket == Some(false) {
            return Err(AppError::new(
                ErrorCode::InvalidWaitingRoom,
                "a sale with a waiting room requires a ticket (an admission is one)",
            ));
        }
        if !new.requires_ticket {
            changed.push(("requires_ticket", json!(false), json!(true)));
            new.requires_ticket = true;
        }
    } else if edit.waiting_room == Some(false) {
        new.queue_opens_at = None;
        new.admit_per_second = None;
    }
    crate::gate::check_sale_proof(new.proof_of_work, new.requires_ticket, new.waiting_room)?;
    sqlx::query(
        "UPDATE sales SET name = $2, description = $3, price_cents = $4, image_url = $5,
                starts_at = $6, ends_at = $7, requires_ticket = $8, payment_window_s = $9,
                rebuy_after_expiry = $10, max_per_user = $11, waiting_room = $12,
                queue_opens_at = $13, admit_per_second = $14, proof_of_work = $15,
                min_account_age_s = $16, entries_open_at = $17, claim_window_s = $18,
                updated_at = now()
         WHERE id = $1",
    )
    .bind(id.get())
    .bind(&new.name)
    .bind(&new.description)
    .bind(new.price_cents)
    .bind(&new.image_url)
    .bind(new.starts_at)
    .bind(new.ends_at)
    .bind(new.requires_ticket)
    .bind(new.payment_window_s)
    .bind(new.rebuy_after_expiry)
    .bind(new.max_per_user)
    .bind(new.waiting_room)
    .bind(new.queue_opens_at)
    .bind(new.admit_per_second)
    .bind(new.proof_of_work)
    .bind(new.min_account_age_s)
    .bind(new.entries_open_at)
    .bind(new.claim_window_s)
    .execute(&mut *tx)
    .await?;
    let before = as_object(changed.iter().map(|(f, b, _)| (*f, b.clone())));
    let after = as_object(changed.iter().map(|(f, _, a)| (*f, a.clone())));
    audit::record(
        &mut tx,
        Change {
            admin,
            action: Action::Edit,
            subject: Subject::Sale(id),
            before: Some(before),
            after: Some(after),
        },
    )
    .await?;
    // Redis before the commit, under the row lock: a refusal there (buyers already)
    // rolls the edit back, and a rebuild waiting for the lock reads the new row.
    let in_redis = put_in_redis(state, &row, &new, opened).await?;
    tx.commit().await?;
    cached::invalidate(state, id).await?;
    if !in_redis {
        state.rebuild_sale(id, REBUILD_WAIT).await?;
    }
    cached::load_view(state, id).await
}

/// An edit's draw fields against the sale: 422 `invalid_draw` for them on a
/// first-come sale, for a waiting room on a draw, or for a `starts_at` other than
/// `draw_at`; `draw_at` becomes the `starts_at` to apply.
fn draw_fields(row: &SaleRow, edit: &mut SaleEdit) -> Result<(), AppError> {
    let invalid = |m: &'static str| Err(AppError::new(ErrorCode::InvalidDraw, m));
    let draw_field =
        edit.draw_at.is_some() || edit.entries_open_at.is_some() || edit.claim_window_s.is_some();
    if !row.is_draw() {
        return if draw_field {
            invalid("entries_open_at, draw_at and claim_window_s go with a draw sale")
        } else {
            Ok(())
        };
    }
    if edit.waiting_room == Some(true) {
        return invalid("a draw sale cannot also have a waiting room");
    }
    match (edit.starts_at, edit.draw_at) {
        (Some(s), Some(d)) if s != d => invalid(
            "for a draw sale starts_at is the draw: send draw_at (or the same time in both)",
        ),
        (_, Some(d)) => {
            edit.starts_at = Some(d);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Writes what Redis holds of the edit (the window, the per-customer cap); false
/// when Redis does not hold the sale (the caller rebuilds it after the commit).
async fn put_in_redis<S: SaleAdmin + ?Sized>(
    state: &S,
    row: &SaleRow,
    new: &SaleRow,
    opened: bool,
) -> Result<bool, AppError> {
    let same_window = new.starts_at == row.starts_at && new.ends_at == row.ends_at;
    let same_room = crate::sale::queue::room::rate_in_meta(new)
        == crate::sale::queue::room::rate_in_meta(row)
        && crate::sale::queue::room::opens_ms_in_meta(new)
            == crate::sale::queue::room::opens_ms_in_meta(row);
    if same_window && new.max_per_user == row.max_per_user && same_room {
        return Ok(true);
    }
    let mut redis = state.redis().clone();
    if opened {
        // Only a later end: the window of an open sale, as open and close write it.
        return store::update_window(&mut redis, state.keys(), new).await;
    }
    let k = state.keys().sale(row.id);
    let written: i64 = EDIT_SALE
        .key(&k.meta)
        .key(&k.buyers)
        .key(&k.sold)
        .arg(new.starts_at.timestamp_millis())
        .arg(new.ends_at.timestamp_millis())
        .arg(new.max_per_user)
        .arg(crate::sale::queue::room::rate_in_meta(new))
        .arg(crate::sale::queue::room::opens_ms_in_meta(new))
        .invoke_async(&mut redis)
        .await?;
    match EditCode::of(written) {
        Some(EditCode::Written) => Ok(true),
        Some(EditCode::NotLoaded) => Ok(false),
        Some(EditCode::HasBuyers) => Err(AppError::new(
            ErrorCode::SaleStarted,
            "this sale has opened and sold meanwhile: only name, description, image_url \
             and a later ends_at may change",
        )),
        None => Err(unexpected_reply("edit_sale.lua", written)),
    }
}

/// Archives the sale (off the public lists and the home page) or brings it back;
/// the sale as it is now. Archiving an archived sale changes nothing.
pub async fn set_archived<S: SaleAdmin + ?Sized>(
    state: &S,
    id: SaleId,
    archived: bool,
    admin: UserId,
) -> Result<SaleView, AppError> {
    let mut tx = state.db().begin().await?;
    let row = locked(&mut tx, id).await?;
    if row.archived_at.is_some() != archived {
        let at: Option<DateTime<Utc>> = sqlx::query_scalar(
            "UPDATE sales SET archived_at = CASE WHEN $2 THEN now() END, updated_at = now()
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
                subject: Subject::Sale(id),
                before: Some(json!({ "archived_at": row.archived_at })),
                after: Some(json!({ "archived_at": at })),
            },
        )
        .await?;
        tx.commit().await?;
        cached::invalidate(state, id).await?;
    }
    cached::load_view(state, id).await
}
