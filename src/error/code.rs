//! The API's error codes, each with its one HTTP status.

use actix_web::http::StatusCode;

/// Defines [`ErrorCode`]: each variant with its wire name and its one status.
macro_rules! error_codes {
    ($($(#[doc = $doc:literal])* $variant:ident = ($status:ident, $code:literal),)*) => {
        /// Every `error` code the API answers, each with its one HTTP status. The
        /// "Error codes" table of `docs/api.md` lists them all (a unit test checks it).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[doc = $doc])* $variant,)*
        }

        impl ErrorCode {
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The `error` field of the body.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }

            pub const fn status(self) -> StatusCode {
                match self {
                    $(ErrorCode::$variant => StatusCode::$status,)*
                }
            }
        }
    };
}

error_codes! {
    /// An id in the path or query that is not a positive integer (or an order id that is not a UUID).
    InvalidId = (BAD_REQUEST, "invalid_id"),
    /// A body that is not JSON, or could not be read.
    InvalidJson = (BAD_REQUEST, "invalid_json"),
    /// A path segment that cannot be read.
    InvalidPath = (BAD_REQUEST, "invalid_path"),
    /// A query string that cannot be read.
    InvalidQuery = (BAD_REQUEST, "invalid_query"),
    /// A paging limit out of range.
    InvalidLimit = (BAD_REQUEST, "invalid_limit"),
    /// A payment without an `Idempotency-Key` header, or a payment or cancel with a malformed one; a purchase's key out of its form (1 to 64 of `A-Z a-z 0-9 _ . : -`).
    InvalidIdempotencyKey = (BAD_REQUEST, "invalid_idempotency_key"),
    /// No session: sign in.
    Unauthorized = (UNAUTHORIZED, "unauthorized"),
    /// A session token this server did not issue.
    InvalidToken = (UNAUTHORIZED, "invalid_token"),
    /// A session token past its expiry.
    TokenExpired = (UNAUTHORIZED, "token_expired"),
    /// A session that was signed out or ended with all others.
    SessionEnded = (UNAUTHORIZED, "session_ended"),
    /// Sign-in with a wrong username or password.
    BadCredentials = (UNAUTHORIZED, "bad_credentials"),
    /// Signed in, but not allowed (admin routes).
    Forbidden = (FORBIDDEN, "forbidden"),
    /// A sale with a waiting room: a ticket or purchase without an admission (or after it expired).
    NotAdmitted = (FORBIDDEN, "not_admitted"),
    /// A `Proof-Of-Work` that does not hold: not solved to the difficulty, not issued here, expired, or for another user, sale or poll.
    ProofInvalid = (FORBIDDEN, "proof_invalid"),
    /// A `Proof-Of-Work` whose challenge was already used once (each counts once, on any server).
    ProofUsed = (FORBIDDEN, "proof_used"),
    /// An account made less than the sale's or poll's `min_account_age_s` before the opening; `allowed_at` says when it may act, if before the close.
    AccountTooNew = (FORBIDDEN, "account_too_new"),
    /// A draw sale: a ticket or purchase of someone who holds no running win of its draw.
    NotDrawn = (FORBIDDEN, "not_drawn"),
    /// A cookie session's unsafe request without the matching `X-CSRF-Token` header.
    CsrfFailed = (FORBIDDEN, "csrf_failed"),
    /// A password change whose current password is wrong.
    WrongPassword = (FORBIDDEN, "wrong_password"),
    /// No such sale, poll, order or page.
    NotFound = (NOT_FOUND, "not_found"),
    /// The body did not arrive in time.
    BodyTimeout = (REQUEST_TIMEOUT, "body_timeout"),
    /// One purchase per customer per sale.
    AlreadyBought = (CONFLICT, "already_bought"),
    /// One vote per person per poll (a poll without `allow_change`).
    AlreadyVoted = (CONFLICT, "already_voted"),
    /// A budget poll's voter has spent every vote.
    BudgetSpent = (CONFLICT, "budget_spent"),
    /// A sale before its opening (`Retry-After`).
    NotStarted = (CONFLICT, "not_started"),
    /// A poll before its opening.
    NotOpen = (CONFLICT, "not_open"),
    /// An admin action on a sale whose end time has passed.
    PastEnd = (CONFLICT, "past_end"),
    /// A waiting room's line before `queue_opens_at` (`Retry-After`).
    QueueNotOpen = (CONFLICT, "queue_not_open"),
    /// A waiting-room request on a sale that has no waiting room.
    NoWaitingRoom = (CONFLICT, "no_waiting_room"),
    /// A draw's entry before `entries_open_at` (`Retry-After`).
    EntriesNotOpen = (CONFLICT, "entries_not_open"),
    /// A draw request (entry, standing, publication) on a sale that is not a draw.
    NotADraw = (CONFLICT, "not_a_draw"),
    /// A draw's publication before the draw (`Retry-After`).
    DrawPending = (CONFLICT, "draw_pending"),
    /// A join of a waiting room's line that an admin closed to new joins.
    LineClosed = (CONFLICT, "line_closed"),
    /// Sign-up with a username in use.
    UsernameTaken = (CONFLICT, "username_taken"),
    /// A payment of an order that is already paid (under another key).
    AlreadyPaid = (CONFLICT, "already_paid"),
    /// A payment of an order of a sale with no payment step.
    NoPaymentNeeded = (CONFLICT, "no_payment_needed"),
    /// An edit of a field that is fixed once the sale has opened.
    SaleStarted = (CONFLICT, "sale_started"),
    /// An edit of a poll that has opened.
    PollStarted = (CONFLICT, "poll_started"),
    /// A reveal of a poll's results that is not kept for one (its `results` is not `on_reveal`) or not closed yet.
    NotRevealable = (CONFLICT, "not_revealable"),
    /// A delete of a sale that had an order (archive it instead).
    HasOrders = (CONFLICT, "has_orders"),
    /// A delete of a poll that had a vote (archive it instead).
    HasVotes = (CONFLICT, "has_votes"),
    /// A cancel of an order in a state that does not allow it (already cancelled, expired, or paid for a buyer).
    NotCancellable = (CONFLICT, "not_cancellable"),
    /// A purchase that would take the buyer past the sale's `max_per_user`.
    PerUserLimit = (CONFLICT, "per_user_limit"),
    /// A purchase of more units than are left (some are): nothing taken.
    NotEnoughLeft = (CONFLICT, "not_enough_left"),
    /// No units left.
    SoldOut = (GONE, "sold_out"),
    /// A sale past its end, or closed early.
    Ended = (GONE, "ended"),
    /// A poll past its closing time, or closed early.
    Closed = (GONE, "closed"),
    /// A payment after the order's deadline: it expired and its unit went back.
    PaymentExpired = (GONE, "payment_expired"),
    /// A draw's entry at or after `draw_at`.
    EntriesClosed = (GONE, "entries_closed"),
    /// A body over the size limit.
    PayloadTooLarge = (PAYLOAD_TOO_LARGE, "payload_too_large"),
    /// A body that is not `application/json`.
    UnsupportedMediaType = (UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
    /// JSON of the wrong shape: a missing, unknown or mistyped field.
    InvalidBody = (UNPROCESSABLE_ENTITY, "invalid_body"),
    /// A name, description or question out of bounds or with control characters.
    InvalidText = (UNPROCESSABLE_ENTITY, "invalid_text"),
    /// A poll's ballot settings out of their values; the message names the setting (`results`: `live`, `after_vote`, `after_close` or `on_reveal`).
    InvalidBallotSettings = (UNPROCESSABLE_ENTITY, "invalid_ballot_settings"),
    /// A price out of range.
    InvalidPrice = (UNPROCESSABLE_ENTITY, "invalid_price"),
    /// A stock out of range.
    InvalidStock = (UNPROCESSABLE_ENTITY, "invalid_stock"),
    /// A quantity out of range (1 to the sale's `max_per_user`), or a `max_per_user` out of 1 to 100.
    InvalidQuantity = (UNPROCESSABLE_ENTITY, "invalid_quantity"),
    /// A payment window out of range (0 to 86400 seconds).
    InvalidPaymentWindow = (UNPROCESSABLE_ENTITY, "invalid_payment_window"),
    /// An `Idempotency-Key` already used for the payment of another order, or a purchase's key first sent with another quantity.
    IdempotencyKeyReused = (UNPROCESSABLE_ENTITY, "idempotency_key_reused"),
    /// A stock change that would pass 10,000,000 units ever offered.
    StockTooLarge = (UNPROCESSABLE_ENTITY, "stock_too_large"),
    /// An end before the start, in the past, or too far away.
    InvalidWindow = (UNPROCESSABLE_ENTITY, "invalid_window"),
    /// A waiting room's settings: `queue_opens_at` missing or not before `starts_at`, or `admit_per_second` not 1 to 100,000.
    InvalidWaitingRoom = (UNPROCESSABLE_ENTITY, "invalid_waiting_room"),
    /// A draw's settings: `entries_open_at` or `draw_at` missing or out of order, `claim_window_s` not 60 to 86,400, draw fields on a first-come sale, or a draw with a waiting room.
    InvalidDraw = (UNPROCESSABLE_ENTITY, "invalid_draw"),
    /// A picture address that is neither `https://` nor a path on this site.
    InvalidImageUrl = (UNPROCESSABLE_ENTITY, "invalid_image_url"),
    /// A `proof_of_work` (0 to 24) or `min_account_age_s` (0 to 31,622,400) out of range; the message names it.
    InvalidFairness = (UNPROCESSABLE_ENTITY, "invalid_fairness"),
    /// A poll's options: too few, too many, or two that look the same.
    InvalidOptions = (UNPROCESSABLE_ENTITY, "invalid_options"),
    /// A vote for an option of another poll.
    UnknownOption = (UNPROCESSABLE_ENTITY, "unknown_option"),
    /// A ballot of the wrong shape for the poll's kind, with a repeated option, or too many.
    InvalidBallot = (UNPROCESSABLE_ENTITY, "invalid_ballot"),
    /// A budget vote of more than the voter has left, overall or for the option: nothing spent.
    OverBudget = (UNPROCESSABLE_ENTITY, "over_budget"),
    /// A username out of the allowed form.
    InvalidUsername = (UNPROCESSABLE_ENTITY, "invalid_username"),
    /// A password too short or too long.
    InvalidPassword = (UNPROCESSABLE_ENTITY, "invalid_password"),
    /// A purchase ticket not issued here, or for another user or sale.
    InvalidTicket = (UNPROCESSABLE_ENTITY, "invalid_ticket"),
    /// A purchase ticket past its 30 s.
    TicketExpired = (UNPROCESSABLE_ENTITY, "ticket_expired"),
    /// A request that a limit policy can never grant.
    RateLimitUnsatisfiable = (UNPROCESSABLE_ENTITY, "rate_limit_unsatisfiable"),
    /// A purchase without a ticket, on a sale that requires one.
    TicketRequired = (PRECONDITION_REQUIRED, "ticket_required"),
    /// A join, entry, ticket or vote without the `Proof-Of-Work` header its sale or poll asks for.
    ProofRequired = (PRECONDITION_REQUIRED, "proof_required"),
    /// A rate limit refused (`Retry-After`, `RateLimit`).
    RateLimited = (TOO_MANY_REQUESTS, "rate_limited"),
    /// An event stream past the most one client address may hold open (`Retry-After`).
    TooManyStreams = (TOO_MANY_REQUESTS, "too_many_streams"),
    /// A request head over the size limit.
    HeadersTooLarge = (REQUEST_HEADER_FIELDS_TOO_LARGE, "headers_too_large"),
    /// A bug: the cause is logged, never sent.
    Internal = (INTERNAL_SERVER_ERROR, "internal"),
    /// Redis did not answer in time, or is not ready (`Retry-After`).
    RedisUnavailable = (SERVICE_UNAVAILABLE, "redis_unavailable"),
    /// Postgres did not answer in time (`Retry-After`).
    DatabaseUnavailable = (SERVICE_UNAVAILABLE, "database_unavailable"),
    /// A backing service is not ready (`Retry-After`).
    Unavailable = (SERVICE_UNAVAILABLE, "unavailable"),
    /// A sale's or poll's Redis state is being rebuilt from Postgres (`Retry-After`).
    Recovering = (SERVICE_UNAVAILABLE, "recovering"),
    /// A payment of an order accepted moments ago and not yet in Postgres (`Retry-After`).
    OrderSettling = (SERVICE_UNAVAILABLE, "order_settling"),
    /// With `replica_acks`: no replica confirmed the decision in time (`Retry-After`).
    NotReplicated = (SERVICE_UNAVAILABLE, "not_replicated"),
    /// The rate limiter's Redis did not answer (`Retry-After`).
    RateLimiterUnavailable = (SERVICE_UNAVAILABLE, "rate_limiter_unavailable"),
    /// A cache rebuild is taking too long, or a password hash waited too long
    /// for its turn (`Retry-After`).
    Busy = (SERVICE_UNAVAILABLE, "busy"),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The "Error codes" table of `docs/api.md` is the list of codes, each with its
    /// status: nothing missing, nothing extra, no status that differs.
    #[test]
    fn the_api_docs_list_every_error_code_with_its_status() {
        let api_docs = include_str!("../../docs/api.md");
        let section = api_docs
            .split("\n## Error codes\n")
            .nth(1)
            .expect("docs/api.md has an Error codes section");
        let listed: std::collections::BTreeSet<(String, u16)> = section
            .lines()
            .skip_while(|l| !l.starts_with("|---"))
            .skip(1)
            .take_while(|l| l.starts_with("| `"))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (
                    cells[1].trim_matches('`').to_string(),
                    cells[2].parse().expect("a status number"),
                )
            })
            .collect();
        let defined: std::collections::BTreeSet<(String, u16)> = ErrorCode::ALL
            .iter()
            .map(|c| (c.as_str().to_string(), c.status().as_u16()))
            .collect();
        assert_eq!(listed, defined);
    }
}
