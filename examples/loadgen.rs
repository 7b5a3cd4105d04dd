//! A small closed-loop load generator for the buy and vote endpoints. It makes its
//! own users straight in Postgres and mints their tokens with the server's secret
//! (no argon2 sign-ins), creates a live sale with a large stock (or an open poll)
//! through the admin API, lets every user buy (or vote) once (warm-up), then keeps
//! `--connections` requests in flight until `--seconds` pass or `--requests` are
//! done, and prints requests per second, latency percentiles and the answers by
//! status.
//!
//! `scripts/bench` uses only its `--prepare-only` mode and measures with `wrk`.
//!
//! Loopback only: it refuses any other host.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use stampede::auth::token::{Claims, TokenKey};
use stampede::domain::Id;

#[derive(Parser)]
struct Args {
    /// Server base URL, e.g. http://127.0.0.1:18480 (loopback only).
    #[arg(long)]
    url: String,
    /// The server's token secret (STAMPEDE_TOKEN_SECRET).
    #[arg(long, env = "STAMPEDE_TOKEN_SECRET", hide_env_values = true)]
    secret: String,
    /// The server's database, where the users are made.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// What to drive: `buy` (POST the purchase), `soldout` (POST the purchase of a
    /// sale with no stock), `vote` (POST a vote in an open poll) or `healthz` (a
    /// trivial route).
    #[arg(long, default_value = "buy")]
    target: String,
    #[arg(long, default_value_t = 10_000)]
    users: usize,
    #[arg(long, default_value_t = 256)]
    connections: usize,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    #[arg(long, default_value_t = 1_000_000)]
    requests: u64,
    /// Label printed with the figures.
    #[arg(long, default_value = "run")]
    label: String,
    /// Only prepare: write the request path (and, after one space, the JSON body if
    /// the request has one), then one user token per line, to this file and exit, for
    /// an outside load generator (`wrk` with scripts/wrk/post_rotating.lua).
    #[arg(long)]
    prepare_only: Option<std::path::PathBuf>,
    /// With `--prepare-only`: first let every user make one request, and fail unless
    /// every answer is a success, so that every later request is a repeat.
    #[arg(long, requires = "prepare_only")]
    warm_up: bool,
}

/// What every request of a run sends: a POST with the next user's token (and the
/// body, if any), or a plain GET.
struct Plan {
    url: String,
    post: bool,
    body: Option<String>,
    tokens: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let host = args
        .url
        .strip_prefix("http://")
        .and_then(|r| r.split([':', '/']).next())
        .unwrap_or("");
    anyhow::ensure!(
        matches!(host, "127.0.0.1" | "localhost" | "[::1]"),
        "loadgen drives loopback servers only, not {:?}",
        args.url
    );
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.connections)
        .timeout(Duration::from_secs(10))
        .build()?;

    let (path, body, tokens) = match args.target.as_str() {
        "buy" => {
            let (sale, tokens) = set_up_sale(&args, &client, stampede::domain::MAX_STOCK).await?;
            (format!("/api/sales/{sale}/purchase"), None, tokens)
        }
        // A sale with no stock: after the first answer the process's sold-out flag
        // answers without Redis (DESIGN.md: at least 90% of a trivial route).
        "soldout" => {
            let (sale, tokens) = set_up_sale(&args, &client, 0).await?;
            (format!("/api/sales/{sale}/purchase"), None, tokens)
        }
        "vote" => {
            let (poll, option, tokens) = set_up_poll(&args, &client).await?;
            let body = serde_json::json!({ "option_id": option }).to_string();
            (format!("/api/polls/{poll}/votes"), Some(body), tokens)
        }
        "healthz" => ("/healthz".to_string(), None, vec![String::new()]),
        other => anyhow::bail!("unknown --target {other}"),
    };
    let post = args.target != "healthz";
    let plan = Arc::new(Plan {
        url: format!("{}{path}", args.url),
        post,
        body,
        tokens,
    });

    // Warm-up: open the connections, and let every user buy (or vote) once, so the
    // measured requests all take the same path (auth, limits, the script answering
    // "already bought") whether limits are on or off.
    if args.prepare_only.is_none() || args.warm_up {
        let warm_up = if post {
            plan.tokens.len() as u64
        } else {
            20_000
        };
        let warmed = drive(
            &client,
            &plan,
            args.connections,
            Duration::from_secs(60),
            warm_up,
        )
        .await;
        let warm_statuses = by_status(&warmed);
        eprintln!("{}: warm-up answers {warm_statuses:?}", args.label);
        let succeeded: u64 = warm_statuses.range(200..300).map(|(_, n)| n).sum();
        anyhow::ensure!(
            !args.warm_up || succeeded == warm_up,
            "warm-up: each of the {warm_up} users' first request must succeed, got {warm_statuses:?}"
        );
    }
    if let Some(file) = &args.prepare_only {
        let mut text = path;
        if let Some(body) = &plan.body {
            text.push(' ');
            text.push_str(body);
        }
        text.push('\n');
        for token in &plan.tokens {
            text.push_str(token);
            text.push('\n');
        }
        std::fs::write(file, text)?;
        return Ok(());
    }
    let started = Instant::now();
    let results = drive(
        &client,
        &plan,
        args.connections,
        Duration::from_secs(args.seconds),
        args.requests,
    )
    .await;
    let elapsed = started.elapsed().as_secs_f64();

    let statuses = by_status(&results);
    let mut latencies: Vec<u32> = results.into_iter().flat_map(|(lat, _)| lat).collect();
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |us| *us as f64 / 1000.0)
    };
    let n = latencies.len();
    println!(
        "{:<28} {:>9} req in {:>5.2} s = {:>8.0} req/s   p50 {:>6.2} ms   p99 {:>6.2} ms   statuses {:?}",
        args.label,
        n,
        elapsed,
        n as f64 / elapsed,
        pct(0.50),
        pct(0.99),
        statuses
    );
    Ok(())
}

type Partial = (Vec<u32>, BTreeMap<u16, u64>);

fn by_status(partials: &[Partial]) -> BTreeMap<u16, u64> {
    let mut total = BTreeMap::new();
    for (code, n) in partials.iter().flat_map(|(_, statuses)| statuses) {
        *total.entry(*code).or_default() += n;
    }
    total
}

async fn drive(
    client: &reqwest::Client,
    plan: &Arc<Plan>,
    connections: usize,
    duration: Duration,
    max_requests: u64,
) -> Vec<Partial> {
    let deadline = Instant::now() + duration;
    let issued = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..connections)
        .map(|_| {
            let (client, plan, issued) = (client.clone(), plan.clone(), issued.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
                while Instant::now() < deadline {
                    let i = issued.fetch_add(1, Ordering::Relaxed);
                    if i >= max_requests {
                        break;
                    }
                    let req = if plan.post {
                        let token = &plan.tokens[i as usize % plan.tokens.len()];
                        let req = client.post(&plan.url).bearer_auth(token);
                        match &plan.body {
                            Some(body) => req
                                .header("content-type", "application/json")
                                .body(body.clone()),
                            None => req,
                        }
                    } else {
                        client.get(&plan.url)
                    };
                    let t = Instant::now();
                    let code = match req.send().await {
                        Ok(resp) => {
                            let code = resp.status().as_u16();
                            let _ = resp.bytes().await;
                            code
                        }
                        Err(_) => 0,
                    };
                    lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    *statuses.entry(code).or_default() += 1;
                }
                (lat, statuses)
            })
        })
        .collect();
    let mut out = Vec::new();
    for w in workers {
        if let Ok(partial) = w.await {
            out.push(partial);
        }
    }
    out
}

/// Users in one INSERT and their tokens minted locally: an admin's token, then one
/// token per `--users`.
async fn make_users(args: &Args) -> anyhow::Result<(String, Vec<String>)> {
    let db = sqlx::PgPool::connect(&args.database_url).await?;
    let prefix = format!("load{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO users (username, password_hash, is_admin)
         SELECT $1 || '-' || g, 'not-a-real-hash', g = 0 FROM generate_series(0, $2) g
         ORDER BY g RETURNING id",
    )
    .bind(&prefix)
    .bind(args.users as i32)
    .fetch_all(&db)
    .await?;
    let key = TokenKey::new(args.secret.as_bytes());
    let expires_at = chrono::Utc::now().timestamp() + 3600;
    let token = |id: i64, admin: bool| {
        key.issue(Claims {
            user_id: Id::new(id).expect("serial ids are positive"),
            admin,
            expires_at,
            generation: 0,
            session: rand::random(),
        })
    };
    let admin = token(ids[0], true);
    let tokens = ids[1..].iter().map(|&id| token(id, false)).collect();
    Ok((admin, tokens))
}

/// POST an admin creation and return the created object's JSON.
async fn admin_create(
    args: &Args,
    client: &reqwest::Client,
    admin: &str,
    path: &str,
    body: serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let resp = client
        .post(format!("{}{path}", args.url))
        .bearer_auth(admin)
        .json(&body)
        .send()
        .await?;
    anyhow::ensure!(
        resp.status().is_success(),
        "POST {path}: {}",
        resp.text().await?
    );
    Ok(resp.json().await?)
}

/// The users and one live sale.
async fn set_up_sale(
    args: &Args,
    client: &reqwest::Client,
    stock: i64,
) -> anyhow::Result<(i64, Vec<String>)> {
    let (admin, tokens) = make_users(args).await?;
    let now = chrono::Utc::now();
    let sale = admin_create(
        args,
        client,
        &admin,
        "/api/admin/sales",
        serde_json::json!({
            "name": "load test",
            "price_cents": 100,
            "stock": stock,
            "starts_at": now - chrono::Duration::minutes(1),
            "ends_at": now + chrono::Duration::hours(1),
        }),
    )
    .await?;
    let sale = sale["id"]
        .as_i64()
        .ok_or_else(|| anyhow::anyhow!("no sale id"))?;
    Ok((sale, tokens))
}

/// The users and one open poll: its id and its first option's id.
async fn set_up_poll(
    args: &Args,
    client: &reqwest::Client,
) -> anyhow::Result<(i64, i64, Vec<String>)> {
    let (admin, tokens) = make_users(args).await?;
    let now = chrono::Utc::now();
    let poll = admin_create(
        args,
        client,
        &admin,
        "/api/admin/polls",
        serde_json::json!({
            "question": "load test",
            "options": ["yes", "no"],
            "opens_at": now - chrono::Duration::minutes(1),
            "closes_at": now + chrono::Duration::hours(1),
        }),
    )
    .await?;
    let id = poll["id"].as_i64();
    let option = poll["options"][0]["id"].as_i64();
    let (Some(id), Some(option)) = (id, option) else {
        anyhow::bail!("no poll or option id in {poll}");
    };
    Ok((id, option, tokens))
}
