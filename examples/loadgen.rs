//! A small closed-loop load generator for the buy endpoint (used by
//! `scripts/bench-limits`). It makes its own users straight in Postgres and mints
//! their tokens with the server's secret (no argon2 sign-ins), creates a live sale
//! with a large stock through the admin API, lets every user buy once (warm-up),
//! then keeps `--connections` requests in flight until `--seconds` pass or
//! `--requests` are done, and prints requests per second, latency percentiles and
//! the answers by status.
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
    /// sale with no stock) or `healthz` (a trivial route).
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
    /// Only prepare: write the request path, then one user token per line, to this
    /// file and exit, for an outside load generator (`wrk`, in scripts/bench-durability).
    #[arg(long)]
    prepare_only: Option<std::path::PathBuf>,
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

    let (path, tokens) = match args.target.as_str() {
        "buy" => {
            let (sale, tokens) = set_up_sale(&args, &client, stampede::domain::MAX_STOCK).await?;
            (format!("/api/sales/{sale}/purchase"), tokens)
        }
        // A sale with no stock: after the first answer the process's sold-out flag
        // answers without Redis (DESIGN.md: at least 80% of a trivial route).
        "soldout" => {
            let (sale, tokens) = set_up_sale(&args, &client, 0).await?;
            (format!("/api/sales/{sale}/purchase"), tokens)
        }
        "healthz" => ("/healthz".to_string(), vec![String::new()]),
        other => anyhow::bail!("unknown --target {other}"),
    };
    if let Some(file) = &args.prepare_only {
        let mut text = format!("{path}\n");
        for token in &tokens {
            text.push_str(token);
            text.push('\n');
        }
        std::fs::write(file, text)?;
        return Ok(());
    }
    let url = Arc::new(format!("{}{path}", args.url));
    let tokens = Arc::new(tokens);
    let post = args.target != "healthz";

    // Warm-up: open the connections, and let every user buy once, so the measured
    // requests all take the same path (auth, limits, the purchase script answering
    // "already bought") whether limits are on or off.
    let warm_up = if post { tokens.len() as u64 } else { 20_000 };
    let warmed = drive(
        &client,
        &url,
        &tokens,
        post,
        args.connections,
        Duration::from_secs(60),
        warm_up,
    )
    .await;
    let mut warm_statuses: BTreeMap<u16, u64> = BTreeMap::new();
    for (_, statuses) in warmed {
        for (code, n) in statuses {
            *warm_statuses.entry(code).or_default() += n;
        }
    }
    eprintln!("{}: warm-up answers {warm_statuses:?}", args.label);
    let started = Instant::now();
    let results = drive(
        &client,
        &url,
        &tokens,
        post,
        args.connections,
        Duration::from_secs(args.seconds),
        args.requests,
    )
    .await;
    let elapsed = started.elapsed().as_secs_f64();

    let mut latencies: Vec<u32> = Vec::new();
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    for (lat, st) in results {
        latencies.extend(lat);
        for (code, n) in st {
            *statuses.entry(code).or_default() += n;
        }
    }
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

async fn drive(
    client: &reqwest::Client,
    url: &Arc<String>,
    tokens: &Arc<Vec<String>>,
    post: bool,
    connections: usize,
    duration: Duration,
    max_requests: u64,
) -> Vec<Partial> {
    let deadline = Instant::now() + duration;
    let issued = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..connections)
        .map(|_| {
            let (client, url, tokens, issued) =
                (client.clone(), url.clone(), tokens.clone(), issued.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
                while Instant::now() < deadline {
                    let i = issued.fetch_add(1, Ordering::Relaxed);
                    if i >= max_requests {
                        break;
                    }
                    let req = if post {
                        let token = &tokens[i as usize % tokens.len()];
                        client.post(url.as_str()).bearer_auth(token)
                    } else {
                        client.get(url.as_str())
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

/// Users in one INSERT, tokens minted locally, one live sale with a large stock.
async fn set_up_sale(
    args: &Args,
    client: &reqwest::Client,
    stock: i64,
) -> anyhow::Result<(i64, Vec<String>)> {
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
        })
    };
    let admin = token(ids[0], true);
    let tokens = ids[1..].iter().map(|&id| token(id, false)).collect();
    let now = chrono::Utc::now();
    let resp = client
        .post(format!("{}/api/admin/sales", args.url))
        .bearer_auth(admin)
        .json(&serde_json::json!({
            "name": "load test",
            "price_cents": 100,
            "stock": stock,
            "starts_at": now - chrono::Duration::minutes(1),
            "ends_at": now + chrono::Duration::hours(1),
        }))
        .send()
        .await?;
    anyhow::ensure!(
        resp.status().is_success(),
        "creating the sale: {}",
        resp.text().await?
    );
    let sale: serde_json::Value = resp.json().await?;
    let sale = sale["id"]
        .as_i64()
        .ok_or_else(|| anyhow::anyhow!("no sale id"))?;
    Ok((sale, tokens))
}
