//! Purchase tickets: what a sale that requires one wants with each purchase, so a
//! bot that fires before the opening gets nothing.
//!
//! `POST /api/sales/{id}/ticket` answers only once the sale is open by the Redis
//! clock (a read: no database or Redis write issues a ticket), with a ticket signed
//! by the server and bound to the user and the sale, valid [`TICKET_TTL_MS`]. The
//! purchase carries it (`{"ticket": "..."}`) and the process checks it with one
//! HMAC, like the session token. A ticket is `<payload>.<mac>`, both base64url: the
//! payload is `t1:<sale id>:<user id>:<expiry, unix ms>`, the MAC HMAC-SHA256 under
//! a key derived from the token secret for tickets only, so a ticket is never a
//! session token nor the other way round.
//!
//! Whether a sale requires a ticket may be edited until the sale opens and never
//! changes afterwards, so each process remembers it once it has read it of an
//! opened sale ([`TicketRules`]): a purchase without a ticket costs a map lookup,
//! not a read. Before the opening it is read (through the cache, which an edit
//! clears) every time.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use hmac::Mac;

use crate::auth::token::{self, HmacSha256, TokenError};
use crate::cache::CachedReads;
use crate::domain::{Id, SaleId, UserId};
use crate::error::{AppError, ErrorCode};

pub mod grant;
pub mod window;

/// How long a ticket stays good: long enough for a person's click to reach the
/// purchase (the page asks for one right before it buys), short enough that
/// tickets are not collected ahead and handed out.
pub const TICKET_TTL_MS: i64 = 30_000;

/// Why a ticket was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    #[error("the ticket is malformed")]
    Malformed,
    #[error("the ticket's signature is wrong")]
    BadSignature,
    #[error("the ticket is for another sale")]
    OtherSale,
    #[error("the ticket is for another user")]
    OtherUser,
    #[error("the ticket has expired")]
    Expired,
}

/// Signs and checks tickets.
#[derive(Clone)]
pub struct TicketKey {
    mac: HmacSha256,
}

impl TicketKey {
    /// The ticket key derived from the server's token secret.
    pub fn new(secret: &[u8]) -> Self {
        let mut derive = HmacSha256::new_from_slice(secret).expect("HMAC accepts any key length");
        derive.update(b"stampede purchase ticket v1");
        let key = derive.finalize().into_bytes();
        TicketKey {
            mac: HmacSha256::new_from_slice(&key).expect("HMAC accepts any key length"),
        }
    }

    pub fn issue(&self, sale: SaleId, user: UserId, expires_at_ms: i64) -> String {
        token::sign(&self.mac, &format!("t1:{sale}:{user}:{expires_at_ms}"))
    }

    /// Checks that `ticket` was issued by this server for `sale` and `user` and is
    /// still good at `now_ms`.
    pub fn verify(
        &self,
        ticket: &str,
        sale: SaleId,
        user: UserId,
        now_ms: i64,
    ) -> Result<(), TicketError> {
        let payload = token::open(&self.mac, ticket, 256).map_err(|e| match e {
            TokenError::BadSignature => TicketError::BadSignature,
            TokenError::Malformed | TokenError::Expired => TicketError::Malformed,
        })?;
        let text = std::str::from_utf8(&payload).map_err(|_| TicketError::Malformed)?;
        let Some(["t1", for_sale, for_user, expires]) = token::fields(text) else {
            return Err(TicketError::Malformed);
        };
        fn id<T>(s: &str) -> Result<Id<T>, TicketError> {
            s.parse()
                .ok()
                .and_then(Id::new)
                .ok_or(TicketError::Malformed)
        }
        let (for_sale, for_user): (SaleId, UserId) = (id(for_sale)?, id(for_user)?);
        let expires: i64 = expires.parse().map_err(|_| TicketError::Malformed)?;
        if for_sale != sale {
            return Err(TicketError::OtherSale);
        }
        if for_user != user {
            return Err(TicketError::OtherUser);
        }
        if expires <= now_ms {
            return Err(TicketError::Expired);
        }
        Ok(())
    }
}

/// Which sales require a ticket, as far as this process has read them. The setting
/// never changes after a sale is created, so an entry is never stale. At most
/// [`TICKET_RULES_MAX`] sales are remembered: past that the memory starts over
/// (a forgotten sale's setting is read again from its cached record), so a
/// process that lives through years of sales holds a bounded map.
#[derive(Default)]
pub struct TicketRules {
    known: ArcSwap<HashMap<SaleId, Rule>>,
}

/// What a sale wants with a purchase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Nothing: anyone signed in may buy.
    None,
    /// A purchase ticket.
    Ticket,
    /// An admission from its waiting room (whose ticket the purchase carries).
    Admission,
    /// A running win of its draw (whose ticket `GET /api/sales/{id}/entry/me` gives).
    Draw,
}

impl Rule {
    pub fn of(requires_ticket: bool, waiting_room: bool) -> Rule {
        match (requires_ticket, waiting_room) {
            (_, true) => Rule::Admission,
            (true, false) => Rule::Ticket,
            (false, false) => Rule::None,
        }
    }

    /// What `row` wants with a purchase.
    pub fn of_row(row: &crate::sale::record::SaleRow) -> Rule {
        if row.is_draw() {
            Rule::Draw
        } else {
            Rule::of(row.requires_ticket, row.waiting_room)
        }
    }
}

/// Most sales [`TicketRules`] remembers at once (about 16 bytes each).
pub const TICKET_RULES_MAX: usize = 4096;

impl TicketRules {
    /// `Some(rule)` once this process has read the sale.
    pub fn get(&self, sale: SaleId) -> Option<Rule> {
        self.known.load().get(&sale).copied()
    }

    /// Remembers a sale's setting (once per sale and process: the map is copied).
    pub fn remember(&self, sale: SaleId, rule: Rule) {
        if self.get(sale) == Some(rule) {
            return;
        }
        self.known.rcu(|known| {
            let mut known = if known.len() >= TICKET_RULES_MAX {
                HashMap::new()
            } else {
                HashMap::clone(known)
            };
            known.insert(sale, rule);
            Arc::new(known)
        });
    }
}

/// A purchase's ticket: when it carries one, it must be good for this user and sale
/// (one HMAC); without one, the sale must not require it (read once per sale and
/// process, see [`TicketRules`]). A refused purchase consumes nothing: no
/// limit counts it and the sale's state is not touched.
pub async fn check_purchase<S: CachedReads + ?Sized>(
    reads: &S,
    key: &TicketKey,
    rules: &TicketRules,
    sale: SaleId,
    user: UserId,
    ticket: Option<&str>,
) -> Result<(), AppError> {
    if let Some(ticket) = ticket {
        return key
            .verify(ticket, sale, user, chrono::Utc::now().timestamp_millis())
            .map_err(ticket_refused);
    }
    let rule = match rules.get(sale) {
        Some(rule) => rule,
        None => match super::cached::sale_row(reads, sale).await? {
            Some(row) => {
                let rule = Rule::of_row(&row);
                if row.starts_at <= chrono::Utc::now() {
                    rules.remember(sale, rule);
                }
                rule
            }
            None => return Err(AppError::not_found(format!("no sale with id {sale}"))),
        },
    };
    if rule == Rule::Admission {
        return Err(AppError::new(
            ErrorCode::NotAdmitted,
            format!(
                "this sale has a waiting room: join it (POST /api/sales/{sale}/queue) and buy with \
                 the ticket GET /api/sales/{sale}/queue/me gives once you are admitted"
            ),
        ));
    }
    if rule == Rule::Draw {
        return Err(not_drawn(sale));
    }
    if rule == Rule::Ticket {
        return Err(AppError::new(
            ErrorCode::TicketRequired,
            format!(
                "this sale needs a purchase ticket: POST /api/sales/{sale}/ticket once it is open, \
                 then send {{\"ticket\": \"...\"}} with the purchase"
            ),
        ));
    }
    Ok(())
}

/// 403 `not_drawn`: a draw sale sells only to its winners, with the ticket their
/// standing gives, while their claim runs.
pub fn not_drawn(sale: SaleId) -> AppError {
    AppError::new(
        ErrorCode::NotDrawn,
        format!(
            "this sale is a draw: only its winners buy, with the ticket GET /api/sales/{sale}/entry/me gives them until their claim window ends"
        ),
    )
}

fn ticket_refused(e: TicketError) -> AppError {
    match e {
        TicketError::Expired => AppError::new(
            ErrorCode::TicketExpired,
            "the purchase ticket has expired: get a new one",
        ),
        TicketError::Malformed | TicketError::BadSignature => {
            AppError::new(ErrorCode::InvalidTicket, "the purchase ticket is not valid")
        }
        TicketError::OtherSale => AppError::new(
            ErrorCode::InvalidTicket,
            "the purchase ticket is for another sale",
        ),
        TicketError::OtherUser => AppError::new(
            ErrorCode::InvalidTicket,
            "the purchase ticket is for another user",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id<T>(n: i64) -> Id<T> {
        Id::new(n).unwrap()
    }

    #[test]
    fn a_ticket_is_good_for_its_sale_and_user_until_it_expires() {
        let key = TicketKey::new(b"0123456789abcdef0123456789abcdef");
        let t = key.issue(id(7), id(42), 2_000);
        assert_eq!(key.verify(&t, id(7), id(42), 1_999), Ok(()));
        assert_eq!(
            key.verify(&t, id(7), id(42), 2_000),
            Err(TicketError::Expired)
        );
        assert_eq!(
            key.verify(&t, id(8), id(42), 1_000),
            Err(TicketError::OtherSale)
        );
        assert_eq!(
            key.verify(&t, id(7), id(43), 1_000),
            Err(TicketError::OtherUser)
        );
    }

    #[test]
    fn forged_foreign_and_garbage_tickets_are_refused() {
        let key = TicketKey::new(b"0123456789abcdef0123456789abcdef");
        let other = TicketKey::new(b"another-secret-another-secret-xx");
        assert_eq!(
            key.verify(&other.issue(id(7), id(42), 2_000), id(7), id(42), 1_000),
            Err(TicketError::BadSignature)
        );
        // The user changed, the signature kept.
        let t = key.issue(id(7), id(42), 2_000);
        let (_, sig) = t.split_once('.').unwrap();
        use base64::Engine;
        let forged = format!(
            "{}.{sig}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("t1:7:43:2000")
        );
        assert_eq!(
            key.verify(&forged, id(7), id(43), 1_000),
            Err(TicketError::BadSignature)
        );
        // Not of the shape (or too long): malformed; of the shape but with no MAC:
        // a bad signature.
        for (junk, refusal) in [
            ("", TicketError::Malformed),
            (".", TicketError::BadSignature),
            ("abc", TicketError::Malformed),
            ("a.b.c", TicketError::Malformed),
            ("!!!.???", TicketError::Malformed),
            (&"x".repeat(300), TicketError::Malformed),
        ] {
            assert_eq!(
                key.verify(junk, id(7), id(42), 1_000),
                Err(refusal),
                "{junk:?}"
            );
        }
    }

    #[test]
    fn a_session_token_is_not_a_ticket() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let session = crate::auth::token::TokenKey::new(secret).issue(crate::auth::token::Claims {
            user_id: id(42),
            admin: false,
            expires_at: 9_999_999_999,
            generation: 0,
            session: 1,
            account_created: None,
        });
        assert_eq!(
            TicketKey::new(secret).verify(&session, id(7), id(42), 1_000),
            Err(TicketError::BadSignature)
        );
    }

    #[test]
    fn rules_remember_each_sale() {
        let rules = TicketRules::default();
        assert_eq!(rules.get(id(1)), None);
        rules.remember(id(1), Rule::Ticket);
        rules.remember(id(2), Rule::None);
        rules.remember(id(3), Rule::Admission);
        assert_eq!(
            (rules.get(id(1)), rules.get(id(2)), rules.get(id(3))),
            (Some(Rule::Ticket), Some(Rule::None), Some(Rule::Admission))
        );
    }

    #[test]
    fn rules_hold_a_bounded_number_of_sales() {
        let rules = TicketRules::default();
        for n in 1..=(3 * TICKET_RULES_MAX as i64) {
            let rule = Rule::of(n % 2 == 0, false);
            rules.remember(id(n), rule);
            assert_eq!(rules.get(id(n)), Some(rule));
        }
        assert!(rules.known.load().len() <= TICKET_RULES_MAX);
    }
}
