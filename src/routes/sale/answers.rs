//! The refusals that the purchase, its ticket and the waiting room share, the
//! sold-out answer given from memory, and the answer to an order found nowhere.

use actix_web::HttpResponse;
use actix_web::http::header;

use crate::domain::SaleId;
use crate::error::{AppError, ErrorCode};
use crate::recover::Target;
use crate::sale::cached;
use crate::sale::queue::join::{Place, Unavailable};
use crate::sale::ticket::window::Window;
use crate::state::AppState;

const SOLD_OUT_BODY: &[u8] = br#"{"error":"sold_out","message":"sold out"}"#;

/// The answer of the process's sold-out flag: the hottest answer of a flash sale
/// (everyone after the last unit), so a fixed body with no error value, no
/// serializer and no allocation for it. [`sold_out`]'s answer, byte for byte (a
/// unit test compares them).
pub(super) fn sold_out_from_memory() -> HttpResponse {
    HttpResponse::Gone()
        .content_type(actix_web::http::header::ContentType::json())
        .body(SOLD_OUT_BODY)
}

/// 409 `not_started`, with `Retry-After` in whole seconds until the opening.
pub(super) fn not_started(starts_in_ms: i64) -> AppError {
    let secs = (starts_in_ms + 999) / 1000;
    AppError::new(
        ErrorCode::NotStarted,
        format!("this sale has not started; it opens in {secs} s"),
    )
    .with_header(header::RETRY_AFTER, secs.max(1).to_string())
}

pub(super) fn ended() -> AppError {
    AppError::new(ErrorCode::Ended, "this sale has ended")
}

pub(super) fn sold_out() -> AppError {
    AppError::new(ErrorCode::SoldOut, "sold out")
}

/// 403 `not_admitted`: a sale with a waiting room sells to admitted shoppers only.
pub(super) fn not_admitted(sale: SaleId) -> AppError {
    AppError::new(
        ErrorCode::NotAdmitted,
        format!(
            "this sale has a waiting room: join it (POST /api/sales/{sale}/queue) and buy once \
             GET /api/sales/{sale}/queue/me says you are admitted"
        ),
    )
}

/// 403 `not_drawn`: a draw sale sells to its winners only, while their claim runs.
pub(super) fn not_drawn(sale: SaleId) -> AppError {
    crate::sale::ticket::not_drawn(sale)
}

/// A purchase the script found without an admission: `not_drawn` for a draw
/// sale, else `not_admitted` (a refusal: the cached record, no query).
pub(super) async fn not_admitted_of(state: &AppState, sale: SaleId) -> AppError {
    match cached::sale_row(state, sale).await {
        Ok(Some(row)) if row.is_draw() => not_drawn(sale),
        _ => not_admitted(sale),
    }
}

/// Whether a purchase refused for want of an admission came from a draw's
/// winner whose win had not reached Redis yet, and is given there now (one
/// indexed read of Postgres, only for a ticketed purchase the script refused).
pub(super) async fn win_given_now(
    state: &AppState,
    sale: SaleId,
    user: crate::domain::UserId,
) -> Result<bool, AppError> {
    if !matches!(cached::sale_row(state, sale).await, Ok(Some(row)) if row.is_draw()) {
        return Ok(false);
    }
    let mut redis = state.redis.clone();
    crate::sale::draw::pass::admit_one(&state.db, &mut redis, &state.keys, sale, user.get()).await
}

/// Redis has no state for this sale: 404 when Postgres has none either (the cached
/// answer, so unknown ids cost no query each), else the sale was lost (wiped):
/// rebuild it and answer 503 meanwhile.
pub(super) async fn missing_from_redis(state: &AppState, sale: SaleId) -> AppError {
    match cached::sale_row(state, sale).await {
        Ok(Some(_)) => state.recovery.recovering(Target::Sale(sale)),
        Ok(None) => AppError::not_found(format!("no sale with id {sale}")),
        Err(e) => e,
    }
}

pub(super) async fn unavailable(state: &AppState, sale: SaleId, why: Unavailable) -> AppError {
    match why {
        Unavailable::NotLoaded => missing_from_redis(state, sale).await,
        Unavailable::Recovering => state.recovery.recovering(Target::Sale(sale)),
        Unavailable::NoWaitingRoom => no_waiting_room(sale),
    }
}

pub(super) fn no_waiting_room(sale: SaleId) -> AppError {
    AppError::new(
        ErrorCode::NoWaitingRoom,
        format!("sale {sale} has no waiting room: buy it directly"),
    )
}

/// The waiting room's answer when it is no standing: its line not open yet (409
/// `queue_not_open` with `Retry-After`), the sale ended or sold out, or its state
/// unavailable.
pub(super) async fn line_refusal(state: &AppState, sale: SaleId, place: Place) -> AppError {
    match place {
        Place::NotOpenYet { opens_in_ms } => {
            let secs = (opens_in_ms + 999) / 1000;
            AppError::new(
                ErrorCode::QueueNotOpen,
                format!("this sale's waiting room opens in {secs} s"),
            )
            .with_header(header::RETRY_AFTER, secs.max(1).to_string())
        }
        Place::Ended => ended(),
        Place::SoldOut => sold_out(),
        Place::JoinsClosed => AppError::new(
            ErrorCode::LineClosed,
            format!("the line of sale {sale} is closed to new joins"),
        ),
        Place::Unavailable(why) => unavailable(state, sale, why).await,
        Place::Standing { .. } => AppError::Internal(anyhow::anyhow!(
            "a standing in the waiting room taken for a refusal"
        )),
    }
}

/// A sale not open by the Redis clock: 409 `not_started` with `Retry-After`, 410
/// `ended`, or the sale's state missing or being rebuilt.
pub(super) async fn window_refusal(state: &AppState, sale: SaleId, window: Window) -> AppError {
    match window {
        Window::NotStarted { starts_in_ms } => not_started(starts_in_ms),
        Window::Ended => ended(),
        Window::NotLoaded => missing_from_redis(state, sale).await,
        Window::Recovering => state.recovery.recovering(Target::Sale(sale)),
        Window::Open { .. } => {
            AppError::Internal(anyhow::anyhow!("an open sale's window taken for a refusal"))
        }
    }
}

/// An order neither in Postgres nor in its sale's pending hash: 404, unless that
/// sale's Redis state is not loaded or not trusted (wiped, or restarted without its
/// last writes). Then the order may be one a server keeps until the sale's rebuild
/// writes it into Postgres, and a final 404 would tell its buyer, who holds its
/// 202, that it does not exist: 503 `recovering` (the rebuild starts).
///
/// `seer`: whose orders the caller may see (`None`: anyone's, an admin).
pub(super) async fn missing_order(
    state: &AppState,
    order: &uuid::Uuid,
    seer: Option<i64>,
) -> AppError {
    let not_found = || AppError::not_found("no such order");
    let Some(sale) = crate::sale::order_id::sale_of_order(order) else {
        return not_found();
    };
    let target = Target::Sale(sale);
    let untrusted = async {
        if crate::sale::record::fetch_sale(&state.db, sale)
            .await?
            .is_none()
        {
            return Ok::<_, AppError>(false);
        }
        let checks = state.recovery.check_many(&[target]).await?;
        Ok(!matches!(
            checks.first(),
            Some(crate::recover::StateCheck::Trusted)
        ))
    };
    match untrusted.await {
        Ok(true) => state.recovery.recovering(target),
        // Trusted now, but the caller read Postgres before: a rebuild that ended in
        // between wrote the order there (its kept copy) before it trusted the
        // state. Read once more, after the check: still missing is missing; found,
        // a retry shows it.
        Ok(false) => match crate::sale::orders::find(&state.db, *order).await {
            Ok(Some(row)) if seer.is_none_or(|u| u == row.user_id) => {
                state.recovery.recovering(target)
            }
            Ok(_) => not_found(),
            Err(e) => e.into(),
        },
        Err(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::ResponseError;
    use actix_web::body::to_bytes;

    #[actix_web::test]
    async fn the_sold_out_flag_answers_what_the_script_answers() {
        let from_script = sold_out().error_response();
        let from_memory = sold_out_from_memory();
        assert_eq!(from_memory.status(), from_script.status());
        assert_eq!(
            from_memory.headers().get(header::CONTENT_TYPE),
            from_script.headers().get(header::CONTENT_TYPE)
        );
        assert_eq!(
            to_bytes(from_memory.into_body()).await.unwrap(),
            to_bytes(from_script.into_body()).await.unwrap()
        );
    }
}
