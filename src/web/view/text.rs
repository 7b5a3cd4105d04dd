//! Times, prices, counts and shares as the pages write them.

use chrono::{DateTime, Utc};

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

/// An order id's short form: its last 8 hex digits, the order's own random
/// bytes (the first ones carry its sale's id and decision batch, which its
/// neighbours share; see `sale::order_id`). The page shows the whole id in a
/// title and copies it.
pub fn short_order_id(id: &str) -> &str {
    id.get(id.len().saturating_sub(8)..).unwrap_or(id)
}

/// "1d 02:03:04", "02:03:04" or "03:04", as the script's `formatDuration` writes
/// a time left (whole seconds, rounded up; never negative).
pub fn clock_text(ms: i64) -> String {
    let total = (ms.max(0) + 999) / 1000;
    let (days, h, m, s) = (
        total / 86_400,
        total % 86_400 / 3600,
        total % 3600 / 60,
        total % 60,
    );
    match days {
        0 if h == 0 => format!("{m:02}:{s:02}"),
        0 => format!("{h:02}:{m:02}:{s:02}"),
        _ => format!("{days}d {h:02}:{m:02}:{s:02}"),
    }
}

/// "1 minute", "15 minutes", "45 seconds", "2 hours", "1 min 30 s".
pub fn duration_text(seconds: i64) -> String {
    let plural = |n: i64, unit: &str| {
        if n == 1 {
            format!("1 {unit}")
        } else {
            format!("{n} {unit}s")
        }
    };
    match seconds {
        s if s >= 3600 && s % 3600 == 0 => plural(s / 3600, "hour"),
        s if s >= 60 && s % 60 == 0 => plural(s / 60, "minute"),
        s if s < 60 => plural(s, "second"),
        s => format!("{} min {} s", s / 60, s % 60),
    }
}

/// `votes` of `total` in whole percent, rounded half up like the script's
/// `Math.round`, so the first render and the live updates agree.
pub fn percent(votes: i64, total: i64) -> i64 {
    if total <= 0 {
        0
    } else {
        (votes.max(0) * 200 + total) / (2 * total)
    }
}

/// Whole percentages of `total` for each of `votes`, as `static/js/numbers.js`'s
/// `shares` gives them: when the votes add up to `total`, the percentages add up to
/// 100 (largest remainders: each share rounded down, then the points left go to the
/// largest fractions, the earlier option first on a tie), so three equal options
/// show 34, 33, 33 rather than 33 each; otherwise each is rounded by [`percent`].
pub fn shares(votes: &[i64], total: i64) -> Vec<i64> {
    let counted: i64 = votes.iter().map(|v| (*v).max(0)).sum();
    if total <= 0 || counted != total {
        return votes.iter().map(|&v| percent(v, total)).collect();
    }
    let mut out: Vec<i64> = votes.iter().map(|&v| v.max(0) * 100 / total).collect();
    let left = 100 - out.iter().sum::<i64>();
    let mut order: Vec<usize> = (0..votes.len()).collect();
    // Largest remainder first; a stable sort keeps the listed order on ties.
    order.sort_by_key(|&i| std::cmp::Reverse(votes[i].max(0) * 100 % total));
    for &i in order.iter().take(usize::try_from(left).unwrap_or(0)) {
        out[i] += 1;
    }
    out
}

/// "1 voter", "2 voters".
pub fn voters_text(voters: i64) -> String {
    if voters == 1 {
        "1 voter".to_string()
    } else {
        format!("{voters} voters")
    }
}

/// The shop's currency symbol. Prices are stored in cents of one currency.
const CURRENCY: &str = "$";

/// `49900` -> `$499.00`, `123456789` -> `$1,234,567.89`.
pub fn format_price(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    let cents = cents.unsigned_abs();
    format!(
        "{sign}{CURRENCY}{}.{:02}",
        group_unsigned(cents / 100),
        cents % 100
    )
}

/// `1234567` -> `1,234,567`, as the script's `groupDigits` writes it.
pub fn group_digits(n: i64) -> String {
    let sign = if n < 0 { "-" } else { "" };
    format!("{sign}{}", group_unsigned(n.unsigned_abs()))
}

fn group_unsigned(n: u64) -> String {
    let digits = n.to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_order_ids_are_the_orders_own_last_digits() {
        let id = "0000002a-0000-8abc-8def-0123456789ab";
        assert_eq!(short_order_id(id), "456789ab");
        assert_eq!(short_order_id("abc"), "abc");
    }

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
    fn counts_group_thousands() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1_000), "1,000");
        assert_eq!(group_digits(1_234_567), "1,234,567");
        assert_eq!(group_digits(-12_345), "-12,345");
    }

    #[test]
    fn percentages_round_half_up_and_survive_no_votes() {
        assert_eq!(percent(0, 0), 0);
        assert_eq!(percent(1, 3), 33);
        assert_eq!(percent(2, 3), 67);
        assert_eq!(percent(1, 8), 13); // 12.5 rounds up, as Math.round does
        assert_eq!(percent(5, 5), 100);
        assert_eq!(shares(&[1, 1, 1], 3), [34, 33, 33]);
        assert_eq!(shares(&[2, 2, 1, 2], 7), [29, 29, 14, 28]);
        assert_eq!(shares(&[1, 7], 8), [13, 87]);
        assert_eq!(shares(&[0, 0], 0), [0, 0]);
        // Votes that are not all of the total: each rounded on its own.
        assert_eq!(shares(&[1, 1], 3), [33, 33]);
    }

    #[test]
    fn clocks_count_whole_seconds_up() {
        assert_eq!(clock_text(-5), "00:00");
        assert_eq!(clock_text(1), "00:01");
        assert_eq!(clock_text(59_001), "01:00");
        assert_eq!(clock_text(3_600_000), "01:00:00");
        assert_eq!(clock_text(90_061_000), "1d 01:01:01");
    }

    #[test]
    fn payment_windows_read_in_whole_units() {
        assert_eq!(duration_text(1), "1 second");
        assert_eq!(duration_text(45), "45 seconds");
        assert_eq!(duration_text(60), "1 minute");
        assert_eq!(duration_text(900), "15 minutes");
        assert_eq!(duration_text(90), "1 min 30 s");
        assert_eq!(duration_text(3600), "1 hour");
        assert_eq!(duration_text(5400), "90 minutes");
        assert_eq!(duration_text(86_400), "24 hours");
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
