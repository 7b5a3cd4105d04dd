//! The record of admin changes as a sale's or a poll's admin page lists it.

use crate::audit;
use crate::web::view::Moment;

/// Changes shown on the page, newest first (the API gives up to 500).
pub(super) const HISTORY_SHOWN: i64 = 100;

/// One admin change as the page lists it.
pub struct HistoryRow {
    pub at: Moment,
    pub admin: String,
    pub action: &'static str,
    /// "price_cents: 19900 → 12345", one per field changed.
    pub details: Vec<String>,
}

impl From<&audit::Entry> for HistoryRow {
    fn from(e: &audit::Entry) -> Self {
        HistoryRow {
            at: e.at.into(),
            admin: e
                .admin
                .clone()
                .unwrap_or_else(|| "a removed account".into()),
            action: match e.after.as_ref().and_then(|a| a.get("outcome")) {
                // A stock change Redis refused (too large, say) changed nothing.
                Some(outcome) if outcome == "refused" => "Stock change refused",
                _ => action_words(&e.action),
            },
            details: details(e),
        }
    }
}

/// What an action is called on the page.
pub(super) fn action_words(action: &str) -> &'static str {
    match audit::Action::parse(action) {
        Some(audit::Action::Create) => "Created",
        Some(audit::Action::Edit) => "Edited",
        Some(audit::Action::Stock) => "Stock changed",
        Some(audit::Action::Open) => "Opened",
        Some(audit::Action::Close) => "Closed",
        Some(audit::Action::Archive) => "Archived",
        Some(audit::Action::Unarchive) => "Unarchived",
        Some(audit::Action::Delete) => "Deleted",
        Some(audit::Action::Cancel) => "Order cancelled",
        Some(audit::Action::Refund) => "Order refunded",
        Some(audit::Action::Line) => "Line controls changed",
        Some(audit::Action::Reveal) => "Results revealed",
        None => "Changed",
    }
}

/// A JSON value in a line of the history: strings as they are, at most 80
/// characters.
fn short(value: &serde_json::Value) -> String {
    let text = match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "none".to_string(),
        other => other.to_string(),
    };
    if text.chars().count() > 80 {
        format!("{}…", text.chars().take(79).collect::<String>())
    } else {
        text
    }
}

/// The lines of one change: each field of `after` with its value before, when the
/// change names a few fields (a create or a delete shows none: the row is the sale).
pub(super) fn details(entry: &audit::Entry) -> Vec<String> {
    let (Some(after), before) = (entry.after.as_ref(), entry.before.as_ref()) else {
        return Vec::new();
    };
    let Some(fields) = after.as_object() else {
        return Vec::new();
    };
    if matches!(entry.action.as_str(), "create") {
        return Vec::new();
    }
    let mut lines: Vec<String> = fields
        .iter()
        // A stock change's bookkeeping: the row's headline says refused or not.
        .filter(|(name, value)| {
            name.as_str() != "change_id" && !(name.as_str() == "outcome" && *value != "pending")
        })
        .filter(|(name, value)| !(name.as_str() == "delta" && value.is_null()))
        .map(|(name, new)| match before.and_then(|b| b.get(name)) {
            Some(old) => format!("{name}: {} → {}", short(old), short(new)),
            None => format!("{name}: {}", short(new)),
        })
        .collect();
    if let Some(order) = entry.order_id {
        lines.insert(0, format!("order {order}"));
    }
    lines
}
