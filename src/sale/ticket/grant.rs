//! Which ticket a shopper gets (`POST /api/sales/{id}/ticket`): only once the sale
//! is open by the Redis clock, and for a sale with a waiting room, only with an
//! admission, whose ticket lasts as long as the admission. The routes answer what
//! this decides.

use redis::aio::ConnectionLike;

use super::TicketKey;
use super::window::{TicketWindow, Window};
use crate::cache::CachedReads;
use crate::domain::{SaleId, UserId};
use crate::error::AppError;
use crate::keys::Keys;
use crate::sale::queue::join::{self, Place, QueueState, Standing};

/// What asking for a ticket came to.
#[derive(Debug)]
pub enum Grant {
    /// A ticket, good until `expires_ms` (Redis clock): [`super::TICKET_TTL_MS`]
    /// from now, or the admission's end for a sale with a waiting room.
    Issued { ticket: String, expires_ms: i64 },
    /// The sale is not open: not started, ended, or not (or not yet again) in Redis.
    Window(Window),
    /// The waiting room answered no standing: its line not open yet, the sale
    /// ended or sold out, or its state unavailable.
    Line(Place),
    /// Waiting in the line, and no unit is left for those waiting.
    SoldOut,
    /// The sale has a waiting room and the shopper holds no running admission.
    NotAdmitted,
    /// A draw sale: its winners' tickets come with their standing
    /// (`GET /api/sales/{id}/entry/me`), never from here.
    NotDrawn,
}

/// The ticket of an admitted shopper, good as long as the admission, with its end
/// (Redis clock, ms); `None` for any other standing.
pub fn of_admission(
    key: &TicketKey,
    sale: SaleId,
    user: UserId,
    standing: &Standing,
) -> Option<(String, i64)> {
    match (standing.state, standing.expires_ms) {
        (QueueState::Admitted, Some(end)) => Some((key.issue(sale, user, end), end)),
        _ => None,
    }
}

/// Decides the ticket `user` gets for `sale`: the window by the Redis clock
/// (`lua/ticket_window.lua`), then, for a sale with a waiting room, the shopper's
/// standing (`lua/queue_place.lua`, reading only). Issuing writes nothing.
pub async fn grant<S: CachedReads + ?Sized, C: ConnectionLike>(
    reads: &S,
    redis: &mut C,
    keys: &Keys,
    key: &TicketKey,
    sale: SaleId,
    user: UserId,
) -> Result<Grant, AppError> {
    let window = TicketWindow {
        keys,
        sale,
        now_ms: None,
    }
    .run(redis)
    .await?;
    let Window::Open { now_ms } = window else {
        return Ok(Grant::Window(window));
    };
    let Some(row) = crate::sale::cached::sale_row(reads, sale).await? else {
        return Err(AppError::not_found(format!("no sale with id {sale}")));
    };
    if row.is_draw() {
        return Ok(Grant::NotDrawn);
    }
    if !row.waiting_room {
        let expires_ms = now_ms + super::TICKET_TTL_MS;
        return Ok(Grant::Issued {
            ticket: key.issue(sale, user, expires_ms),
            expires_ms,
        });
    }
    let standing = match join::place(redis, keys, sale, user, false, None).await? {
        Place::Standing { standing, .. } => standing,
        other => return Ok(Grant::Line(other)),
    };
    Ok(match of_admission(key, sale, user, &standing) {
        Some((ticket, expires_ms)) => Grant::Issued { ticket, expires_ms },
        None if standing.state == QueueState::SoldOut => Grant::SoldOut,
        None => Grant::NotAdmitted,
    })
}
