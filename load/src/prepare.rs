//! What a load run needs before the first request: users made in bulk in Postgres
//! (`stampede::rehearse`) with tokens minted from the server's secret (never an
//! argon2 sign-in per user), and a sale or poll made through the admin API.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use stampede::auth::token::{Claims, TokenKey};
use stampede::domain::Id;
use stampede::rehearse::Store;

use crate::client::{Conn, Request, Target};

/// The run's users: an admin (for the admin API) and `tokens.len()` shoppers.
pub struct Users {
    pub admin: String,
    pub ids: Vec<i64>,
    pub tokens: Vec<String>,
}

/// `n` shoppers and one admin, made in bulk by the server's library
/// ([`Store::make_users`]: rehearsal users, which cannot sign in), with tokens
/// minted from the server's secret that last `ttl_secs`.
pub async fn make_users(
    store: &Store,
    secret: &str,
    n: usize,
    ttl_secs: i64,
) -> anyhow::Result<Users> {
    let made = store.make_users(n).await?;
    let key = TokenKey::new(secret.as_bytes());
    let expires_at = Utc::now().timestamp() + ttl_secs;
    let token = |id: i64, admin: bool| -> anyhow::Result<String> {
        Ok(key.issue(Claims {
            user_id: Id::new(id).ok_or_else(|| anyhow::anyhow!("user id {id}"))?,
            admin,
            expires_at,
            generation: 0,
            session: rand::random(),
            account_created: None,
        }))
    };
    let admin = token(made.admin, true)?;
    let tokens = made
        .shoppers
        .iter()
        .map(|&id| token(id, false))
        .collect::<anyhow::Result<_>>()?;
    Ok(Users {
        admin,
        ids: made.shoppers,
        tokens,
    })
}

/// A JSON call of the admin API (or any API call) on a connection of its own (the
/// server closes idle keep-alive connections, and making 20,000 users takes longer
/// than that): the answer's JSON, or an error that says what the server answered.
pub async fn call(
    target: &Target,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&Value>,
) -> anyhow::Result<Value> {
    let body = body.map(|b| b.to_string());
    let mut conn = Conn::new(target.clone(), std::time::Duration::from_secs(15));
    let resp = conn
        .send(&Request {
            method,
            path,
            token: Some(token),
            forwarded_for: None,
            idempotency_key: None,
            body: body.as_deref().map(str::as_bytes),
        })
        .await?;
    anyhow::ensure!(
        (200..300).contains(&resp.status),
        "{method} {path}: {} {}",
        resp.status,
        String::from_utf8_lossy(&resp.body)
    );
    Ok(serde_json::from_slice(&resp.body)?)
}

/// A sale's waiting room as the run makes it: its line opens at `opens_at` and
/// admits `admit_per_second` from the sale's opening.
#[derive(Clone, Copy, Debug)]
pub struct WaitingRoom {
    pub opens_at: DateTime<Utc>,
    pub admit_per_second: u32,
}

/// A new rehearsal sale with `stock` units, open from `starts_at` for an hour: never
/// on a public page or list, removed by `stampede load --cleanup`. With a waiting
/// room it sells only to shoppers admitted from its line (and so requires tickets:
/// an admission is one).
pub async fn create_sale(
    target: &Target,
    admin: &str,
    stock: i64,
    starts_at: DateTime<Utc>,
    requires_ticket: bool,
    waiting_room: Option<WaitingRoom>,
) -> anyhow::Result<i64> {
    let mut body = json!({
            "name": format!("Load test {}", Utc::now().format("%H:%M:%S")),
            "description": "Made by stampede load.",
            "price_cents": 100,
            "stock": stock,
            "starts_at": starts_at,
            "ends_at": starts_at + chrono::Duration::hours(1),
            // Without --tickets the rehearsal measures the decision alone: a ticket
            // is one more request per buyer (and one HMAC per purchase).
            "requires_ticket": requires_ticket,
            "rehearsal": true,
    });
    if let Some(room) = waiting_room {
        body["waiting_room"] = json!(true);
        body["queue_opens_at"] = json!(room.opens_at);
        body["admit_per_second"] = json!(room.admit_per_second);
    }
    let sale = call(target, "POST", "/api/admin/sales", admin, Some(&body)).await?;
    sale["id"]
        .as_i64()
        .ok_or_else(|| anyhow::anyhow!("no sale id in {sale}"))
}

/// A new poll, open now for an hour, with `options` options and the ballot
/// `settings` (`{}`: a single-choice poll): its id and its options' ids.
pub async fn create_poll(
    target: &Target,
    admin: &str,
    options: usize,
    settings: &Value,
) -> anyhow::Result<(i64, Vec<i64>)> {
    let now = Utc::now();
    let names = ["this one", "that one", "a third", "a fourth"];
    let mut body = json!({
        "question": "Load test: which one?",
        "options": names[..options.clamp(2, names.len())],
        "opens_at": now - chrono::Duration::seconds(5),
        "closes_at": now + chrono::Duration::hours(1),
    });
    if let (Some(body), Some(settings)) = (body.as_object_mut(), settings.as_object()) {
        body.extend(settings.clone());
    }
    let poll = call(target, "POST", "/api/admin/polls", admin, Some(&body)).await?;
    let id = poll["id"]
        .as_i64()
        .ok_or_else(|| anyhow::anyhow!("no poll id in {poll}"))?;
    let options = poll["options"]
        .as_array()
        .map(|o| o.iter().filter_map(|o| o["id"].as_i64()).collect())
        .unwrap_or_default();
    Ok((id, options))
}
