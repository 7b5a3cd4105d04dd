//! What templates show, computed in Rust so templates stay free of logic:
//! the header's account links, sales as cards, prices and times as text.

use actix_web::HttpRequest;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::auth::{self, AuthUser};
use crate::error::AppError;
use crate::sale::SaleView;

/// The account part of the page header.
pub struct Nav {
    pub user: Option<NavUser>,
}

pub struct NavUser {
    pub username: String,
    pub admin: bool,
}

impl Nav {
    pub fn anonymous() -> Self {
        Nav { user: None }
    }

    /// The caller and their name. One indexed query: fine for pages, which is why
    /// the buy path never calls this. A token whose user was deleted counts as
    /// signed out.
    pub async fn load(req: &HttpRequest, db: &PgPool) -> Result<(Nav, Option<AuthUser>), AppError> {
        let Some(user) = auth::optional_user(req) else {
            return Ok((Nav::anonymous(), None));
        };
        let row: Option<(String, bool)> =
            sqlx::query_as("SELECT username, is_admin FROM users WHERE id = $1")
                .bind(user.id.get())
                .fetch_optional(db)
                .await?;
        Ok(match row {
            Some((username, admin)) => (
                Nav {
                    user: Some(NavUser { username, admin }),
                },
                Some(user),
            ),
            None => (Nav::anonymous(), None),
        })
    }
}

/// An instant as the page shows it: machine-readable for `<time>` and for the
/// script (milliseconds), plus a UTC text that the script turns into local time.
pub struct Moment {
    pub iso: String,
    pub text: String,
    pub ms: i64,
}

impl From<DateTime<Utc>> for Moment {
    fn from(at: DateTime<Utc>) -> Self {
        Moment {
            iso: at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            text: at.format("%Y-%m-%d %H:%M UTC").to_string(),
            ms: at.timestamp_millis(),
        }
    }
}

/// A sale as pages show it.
pub struct SaleCard {
    pub id: i64,
    pub name: String,
    pub description: String,
    pub price: String,
    /// `upcoming`, `live`, `sold_out`, `ended` or `closed` (also a CSS class).
    pub status: &'static str,
    pub status_label: &'static str,
    pub stock_left: i64,
    pub stock_total: i64,
    pub sold: i64,
    pub starts_at: Moment,
    pub ends_at: Moment,
}

impl From<SaleView> for SaleCard {
    fn from(view: SaleView) -> Self {
        let sale = view.sale;
        SaleCard {
            id: sale.id,
            price: format_price(sale.price_cents),
            status: view.status,
            status_label: status_label(view.status),
            stock_left: view.stock_left.max(0),
            // Units left can exceed the record for a moment during a top-up.
            stock_total: sale.stock_total.max(view.stock_left),
            sold: view.sold,
            starts_at: sale.starts_at.into(),
            ends_at: sale.ends_at.into(),
            name: sale.name,
            description: sale.description,
        }
    }
}

/// Shoppers see first what they can buy now, then what opens soon, then the rest.
/// Sorting by this is stable, so the store's order holds within a group.
pub fn shop_rank(status: &str) -> u8 {
    match status {
        "live" => 0,
        "upcoming" => 1,
        "sold_out" => 2,
        "ended" => 3,
        _ => 4,
    }
}

pub fn status_label(status: &str) -> &'static str {
    match status {
        "upcoming" => "Upcoming",
        "live" => "Live",
        "sold_out" => "Sold out",
        "ended" => "Ended",
        "closed" => "Closed",
        _ => "Unknown",
    }
}

/// The shop's currency symbol. Prices are stored in cents of one currency.
const CURRENCY: &str = "$";

/// `49900` -> `$499.00`, `123456789` -> `$1,234,567.89`.
pub fn format_price(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    let cents = cents.unsigned_abs();
    let units = (cents / 100).to_string();
    let mut grouped = String::with_capacity(units.len() + units.len() / 3);
    for (i, digit) in units.chars().enumerate() {
        if i > 0 && (units.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    format!("{sign}{CURRENCY}{grouped}.{:02}", cents % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_group_thousands() {
        assert_eq!(format_price(0), "$0.00");
        assert_eq!(format_price(5), "$0.05");
        assert_eq!(format_price(49_900), "$499.00");
        assert_eq!(format_price(100_000), "$1,000.00");
        assert_eq!(format_price(123_456_789), "$1,234,567.89");
        assert_eq!(format_price(-150), "-$1.50");
    }

    #[test]
    fn buyable_sales_come_first() {
        let mut statuses = [
            "closed", "ended", "sold_out", "upcoming", "live", "upcoming",
        ];
        statuses.sort_by_key(|s| shop_rank(s));
        assert_eq!(
            statuses,
            [
                "live", "upcoming", "upcoming", "sold_out", "ended", "closed"
            ]
        );
    }

    #[test]
    fn moments_are_utc_text_and_millis() {
        let at = DateTime::parse_from_rfc3339("2030-01-02T03:04:05Z")
            .unwrap()
            .with_timezone(&Utc);
        let m = Moment::from(at);
        assert_eq!(m.iso, "2030-01-02T03:04:05Z");
        assert_eq!(m.text, "2030-01-02 03:04 UTC");
        assert_eq!(m.ms, at.timestamp_millis());
    }
}
