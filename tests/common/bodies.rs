//! Request bodies of the admin's sales and polls, shared by the API suite
//! (`TestApp`) and the fault suite (`Stack`): the defaults each suite gives, the
//! overrides a test asks for on top, and the ids of a created poll.

#![allow(dead_code)]

use serde_json::{Value, json};

/// `base` with every field of `overrides` (an object) set over it.
pub fn merged(mut base: Value, overrides: &Value) -> Value {
    for (k, v) in overrides.as_object().expect("overrides are an object") {
        base[k] = v.clone();
    }
    base
}

/// A sale of `stock` units named `name` at `price_cents`, open since
/// `opened_s_ago` seconds for an hour from now, without tickets, with
/// `overrides` over those fields.
pub fn sale_body(
    name: &str,
    price_cents: i64,
    stock: i64,
    opened_s_ago: i64,
    overrides: &Value,
) -> Value {
    let now = chrono::Utc::now();
    let sale = json!({
        "name": name,
        "price_cents": price_cents,
        "stock": stock,
        "starts_at": now - chrono::Duration::seconds(opened_s_ago),
        "ends_at": now + chrono::Duration::seconds(3600),
        "requires_ticket": false,
    });
    merged(sale, overrides)
}

/// A poll asking `question` with `options`, open from `window.0` to `window.1`
/// seconds from now, with `overrides` over those fields.
pub fn poll_body(question: &str, options: &[&str], window: (i64, i64), overrides: &Value) -> Value {
    let now = chrono::Utc::now();
    let poll = json!({
        "question": question,
        "options": options,
        "opens_at": now + chrono::Duration::seconds(window.0),
        "closes_at": now + chrono::Duration::seconds(window.1),
    });
    merged(poll, overrides)
}

/// A poll's id and its option ids in order, from its JSON.
pub fn poll_ids(poll: &Value) -> (i64, Vec<i64>) {
    let ids = poll["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_i64().unwrap())
        .collect();
    (poll["id"].as_i64().unwrap(), ids)
}
