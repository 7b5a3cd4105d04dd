//! Input types that validate when parsed. A value of one of these types is known
//! good, so handlers and Redis key builders never see raw user text.

mod id;
mod status;

pub use id::{Entity, Id, Poll, PollId, Sale, SaleId, User, UserId};
pub use status::{PollStatus, SaleStatus};

use std::fmt;

use crate::error::{AppError, ErrorCode};

/// A purchase's or a vote's `Idempotency-Key`: 1 to [`PurchaseKey::MAX`] characters of
/// `[A-Za-z0-9_.:-]` (a UUID, or random hex, fits), compared exactly. Held inline
/// (`Copy`, no allocation): it rides in the batch with its buyer, and only a key so
/// parsed reaches a Redis key or argument.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PurchaseKey {
    len: u8,
    bytes: [u8; PurchaseKey::MAX],
}

impl PurchaseKey {
    /// Most characters in a key.
    pub const MAX: usize = 64;

    pub fn parse(raw: &[u8]) -> Result<Self, AppError> {
        let ok = (1..=Self::MAX).contains(&raw.len())
            && raw
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b':' | b'-'));
        if !ok {
            return Err(AppError::new(
                ErrorCode::InvalidIdempotencyKey,
                "the Idempotency-Key header must be 1 to 64 characters of \
                 letters, digits, '_', '.', ':' or '-' (a UUID will do)",
            ));
        }
        let mut bytes = [0; Self::MAX];
        bytes[..raw.len()].copy_from_slice(raw);
        Ok(PurchaseKey {
            len: raw.len() as u8,
            bytes,
        })
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII was let in.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl std::fmt::Debug for PurchaseKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PurchaseKey({:?})", self.as_str())
    }
}

/// 3 to 32 characters from `[A-Za-z0-9_.-]`, compared case-insensitively (stored lower-case).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Username(String);

impl Username {
    pub fn parse(raw: &str) -> Result<Self, AppError> {
        let name = raw.trim();
        let ok_len = (3..=32).contains(&name.len());
        let ok_chars = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !ok_len || !ok_chars {
            return Err(AppError::new(
                ErrorCode::InvalidUsername,
                "username must be 3 to 32 characters of letters, digits, '_', '.' or '-'",
            ));
        }
        Ok(Username(name.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A password as typed. 8 to 128 characters; never logged (`Debug` hides it).
pub struct Password(String);

impl Password {
    pub fn parse(raw: String) -> Result<Self, AppError> {
        reject_nul("password", &raw)?;
        let chars = raw.chars().count();
        if !(8..=128).contains(&chars) {
            return Err(AppError::new(
                ErrorCode::InvalidPassword,
                "password must be 8 to 128 characters",
            ));
        }
        Ok(Password(raw))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(<redacted>)")
    }
}

/// Upper bound on stock of one sale and on one top-up: large enough for any real
/// flash sale, small enough that a typo like 1e12 is refused.
pub const MAX_STOCK: i64 = 10_000_000;
/// Longest sale window accepted, and the furthest a waiting room's line or a
/// draw's entries may open before it; anything longer is almost surely a typo.
pub const MAX_SALE_DAYS: i64 = 366;
/// Upper bound on a price in cents (one million currency units).
pub const MAX_PRICE_CENTS: i64 = 100_000_000;

pub fn parse_stock(field: &'static str, value: i64) -> Result<i64, AppError> {
    if !(0..=MAX_STOCK).contains(&value) {
        return Err(AppError::new(
            ErrorCode::InvalidStock,
            format!("{field} must be between 0 and {MAX_STOCK}"),
        ));
    }
    Ok(value)
}

/// Most units a sale may let one customer buy.
pub const MAX_PER_USER: i32 = 100;

pub fn parse_max_per_user(value: i64) -> Result<i32, AppError> {
    match i32::try_from(value) {
        Ok(n) if (1..=MAX_PER_USER).contains(&n) => Ok(n),
        _ => Err(AppError::new(
            ErrorCode::InvalidQuantity,
            format!("max_per_user must be between 1 and {MAX_PER_USER}"),
        )),
    }
}

/// Longest payment window: a day.
pub const MAX_PAYMENT_WINDOW_S: i64 = 86_400;

pub fn parse_payment_window(value: i64) -> Result<i32, AppError> {
    match i32::try_from(value) {
        Ok(s) if (0..=MAX_PAYMENT_WINDOW_S).contains(&value) => Ok(s),
        _ => Err(AppError::new(
            ErrorCode::InvalidPaymentWindow,
            format!(
                "payment_window_s must be between 0 (no payment step) and {MAX_PAYMENT_WINDOW_S} seconds"
            ),
        )),
    }
}

pub fn parse_price(value: i64) -> Result<i64, AppError> {
    if !(0..=MAX_PRICE_CENTS).contains(&value) {
        return Err(AppError::new(
            ErrorCode::InvalidPrice,
            format!("price_cents must be between 0 and {MAX_PRICE_CENTS}"),
        ));
    }
    Ok(value)
}

/// Refuses a NUL character, which Postgres cannot store in a text column (it would
/// fail the insert with a 500); the message names the field.
pub fn reject_nul(field: &str, raw: &str) -> Result<(), AppError> {
    if raw.contains('\0') {
        return Err(AppError::new(
            ErrorCode::InvalidText,
            format!("{field} must not contain a NUL character (\\u0000)"),
        ));
    }
    Ok(())
}

/// Trimmed, non-empty, at most `max` characters, no NUL.
pub fn parse_text(
    field: &'static str,
    raw: &str,
    max: usize,
    allow_empty: bool,
) -> Result<String, AppError> {
    reject_nul(field, raw)?;
    let text = raw.trim();
    if (!allow_empty && text.is_empty()) || text.chars().count() > max {
        return Err(AppError::new(
            ErrorCode::InvalidText,
            format!(
                "{field} must be {} to {max} characters",
                if allow_empty { 0 } else { 1 }
            ),
        ));
    }
    Ok(text.to_string())
}

/// [`parse_text`] of a one-line field (a sale's name, a poll's question, an
/// option's label): no line break or other control character either. The admin
/// forms list options one per line, so a label with a line break in it would come
/// back as two.
///
/// Nor a character that reorders the text after it (the bidirectional overrides
/// and isolates, U+202A to U+202E and U+2066 to U+2069: a label that shows other
/// than it reads), and at least one character that shows: a text of only
/// invisible ones (a zero-width space) looks empty.
pub fn parse_line(field: &'static str, raw: &str, max: usize) -> Result<String, AppError> {
    let text = parse_text(field, raw, max, false)?;
    if text
        .chars()
        .any(|c| c.is_control() || is_direction_override(c) || matches!(c, '\u{2028}' | '\u{2029}'))
    {
        return Err(AppError::new(
            ErrorCode::InvalidText,
            format!(
                "{field} must be one line, without control characters or text-direction overrides"
            ),
        ));
    }
    if visible_key(&text).is_empty() {
        return Err(AppError::new(
            ErrorCode::InvalidText,
            format!("{field} must have a character that shows"),
        ));
    }
    Ok(text)
}

fn is_direction_override(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Characters that take no room or show as blank (Unicode's default-ignorable
/// ones: zero-width spaces and joiners, word joiners, the soft hyphen, the
/// byte-order mark, variation selectors, tags, the Hangul fillers, ...).
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'
            | '\u{1160}'
            | '\u{17B4}'
            | '\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

/// A text as a reader tells it from another: in one Unicode form (NFKC: an é
/// typed as one character or as e and an accent, a full-width A and an A, are
/// one), without the characters that show nothing, its runs of white space one
/// space, trimmed, lower case. Two option labels with the same key look the same
/// ("B" and "B" with a zero-width space).
pub fn visible_key(text: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    text.nfkc()
        .filter(|&c| !is_invisible(c))
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Longest picture address accepted.
pub const MAX_IMAGE_URL: usize = 2048;

/// A sale's picture: `None` for none (blank), else an `https://` address with a
/// host, or a path on this site (`/static/...`, never `//host`). Printable ASCII
/// only, without quotes, angle brackets, backslashes or spaces: the address goes
/// into an `src` attribute (escaped as well) and nothing in it can leave it.
pub fn parse_image_url(raw: Option<&str>) -> Result<Option<String>, AppError> {
    let Some(text) = raw.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let invalid = || {
        AppError::new(
            ErrorCode::InvalidImageUrl,
            format!(
                "image_url must be an https:// address or a path on this site starting with /, \
                 at most {MAX_IMAGE_URL} characters, without spaces or quotes"
            ),
        )
    };
    if text.len() > MAX_IMAGE_URL
        || !text
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b"\"'<>\\`".contains(&b))
    {
        return Err(invalid());
    }
    let ok = if let Some(rest) = text.strip_prefix("https://") {
        let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
        !host.is_empty() && !host.contains('@')
    } else {
        text.starts_with('/') && !text.starts_with("//")
    };
    if ok {
        Ok(Some(text.to_string()))
    } else {
        Err(invalid())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The code a refusal carries; panics when the input was accepted.
    fn refused<T>(result: Result<T, AppError>) -> ErrorCode {
        match result {
            Ok(_) => panic!("accepted"),
            Err(e) => e.error_code(),
        }
    }

    #[test]
    fn a_line_has_no_direction_override_and_something_that_shows() {
        for ok in [
            "Phone",
            "B",
            "هاتف",
            "Family \u{1F468}\u{200D}\u{1F469}",
            "a\u{200E}b",
        ] {
            assert!(parse_line("name", ok, 50).is_ok(), "{ok:?}");
        }
        for bad in [
            "abc\u{202E}fed",
            "x\u{2066}y",
            "\u{200B}",
            "\u{200B}\u{2060}\u{FEFF}",
        ] {
            assert_eq!(
                refused(parse_line("name", bad, 50)),
                ErrorCode::InvalidText,
                "{bad:?}"
            );
        }
        assert_eq!(visible_key(" B\u{200B} "), "b");
        assert_eq!(visible_key("b\u{2060}"), visible_key("B"));
        assert_eq!(visible_key("New   York"), visible_key("new york"));
        assert_ne!(visible_key("B1"), visible_key("B"));
        assert_eq!(visible_key("Caf\u{00E9}"), visible_key("Cafe\u{0301}"));
        assert_eq!(visible_key("B\u{FE0F}"), visible_key("B"));
        for blank in ["\u{3164}", "\u{FE0F}"] {
            assert_eq!(
                refused(parse_line("name", blank, 50)),
                ErrorCode::InvalidText,
                "{blank:?}"
            );
        }
        assert_eq!(
            refused(parse_line("name", "a\u{2028}b", 50)),
            ErrorCode::InvalidText
        );
    }

    #[test]
    fn purchase_keys_are_parsed_text_only() {
        for ok in [
            "a",
            "550e8400-e29b-41d4-a716-446655440000",
            "x_y.z:1",
            &"k".repeat(64),
        ] {
            assert_eq!(PurchaseKey::parse(ok.as_bytes()).unwrap().as_str(), ok);
        }
        for bad in ["", " a", "a b", "{sale:1}", "ä", "a*", &"k".repeat(65)] {
            assert_eq!(
                refused(PurchaseKey::parse(bad.as_bytes())),
                ErrorCode::InvalidIdempotencyKey,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn image_urls_are_https_or_paths_on_this_site() {
        for good in [
            "https://cdn.example.com/p/phone.jpg",
            "https://example.com",
            "/static/products/phone.svg",
            "  /static/a.png?v=2  ",
        ] {
            assert!(parse_image_url(Some(good)).unwrap().is_some(), "{good}");
        }
        assert_eq!(parse_image_url(None).unwrap(), None);
        assert_eq!(parse_image_url(Some("   ")).unwrap(), None);
        for bad in [
            "http://example.com/a.jpg",
            "//evil.example/a.jpg",
            "javascript:alert(1)",
            "data:image/png;base64,AAAA",
            "https://",
            "https:///a.jpg",
            "https://user@evil.example/a.jpg",
            "/a b.jpg",
            "/a\"onerror=\"x.jpg",
            "/a'.jpg",
            "/<x>.jpg",
            "/a\\b.jpg",
            "/caf\u{e9}.jpg",
            "phone.jpg",
        ] {
            assert_eq!(
                refused(parse_image_url(Some(bad))),
                ErrorCode::InvalidImageUrl,
                "{bad}"
            );
        }
        let long = format!("/{}", "a".repeat(MAX_IMAGE_URL));
        assert_eq!(
            refused(parse_image_url(Some(&long))),
            ErrorCode::InvalidImageUrl
        );
    }

    #[test]
    fn ids_are_positive_decimal_only() {
        assert_eq!(SaleId::parse("42").unwrap().get(), 42);
        for bad in [
            "0",
            "-1",
            "+1",
            " 1",
            "1a",
            "",
            "{1}",
            "99999999999999999999",
            "1.0",
        ] {
            assert_eq!(
                refused(SaleId::parse(bad)),
                ErrorCode::InvalidId,
                "{bad:?} must be refused"
            );
        }
    }

    #[test]
    fn usernames_are_normalised_and_bounded() {
        assert_eq!(Username::parse(" Alice ").unwrap().as_str(), "alice");
        for bad in ["ab", "a b c", "x{y}z", &"a".repeat(33), "émile"] {
            assert_eq!(
                refused(Username::parse(bad)),
                ErrorCode::InvalidUsername,
                "{bad:?} must be refused"
            );
        }
    }

    #[test]
    fn passwords_are_bounded_and_hidden() {
        assert_eq!(
            refused(Password::parse("short".into())),
            ErrorCode::InvalidPassword
        );
        assert_eq!(
            refused(Password::parse("x".repeat(129))),
            ErrorCode::InvalidPassword
        );
        let p = Password::parse("correct horse".into()).unwrap();
        assert!(!format!("{p:?}").contains("horse"));
    }

    #[test]
    fn nul_is_refused_in_text_and_passwords() {
        for raw in ["Tea\nCoffee", "Tea\rCoffee", "a\tb", "a\u{7f}b"] {
            assert!(parse_line("option", raw, 100).is_err(), "{raw:?}");
        }
        assert_eq!(
            parse_line("option", "  Café au lait ", 100).unwrap(),
            "Café au lait"
        );
        let err = parse_text("name", "a\0b", 100, false).unwrap_err();
        assert_eq!(err.code(), "invalid_text");
        assert!(err.to_string().contains("name"), "{err}");
        assert_eq!(
            refused(parse_text("name", "\0", 100, true)),
            ErrorCode::InvalidText
        );
        assert_eq!(
            refused(Password::parse("password\0".into())),
            ErrorCode::InvalidText
        );
        // Outside the username's characters: refused as a username.
        assert_eq!(
            refused(Username::parse("ali\0ce")),
            ErrorCode::InvalidUsername
        );
    }

    #[test]
    fn stock_and_price_bounds() {
        assert_eq!(refused(parse_stock("stock", -1)), ErrorCode::InvalidStock);
        assert_eq!(
            refused(parse_stock("stock", MAX_STOCK + 1)),
            ErrorCode::InvalidStock
        );
        assert_eq!(parse_stock("stock", 100).unwrap(), 100);
        assert_eq!(refused(parse_price(-5)), ErrorCode::InvalidPrice);
    }
}
