//! Benchmark: how long the settlement worker takes to move a backlog of accepted
//! orders from Redis into Postgres. DESIGN.md asks for 100,000 orders in under 10 s.
//!
//! Run with `scripts/bench settle` (or set DATABASE_URL and REDIS_URL yourself):
//!   cargo run --release --example settle_backlog -- [orders] [batch size]
//! It works in its own database (`stampede_bench_settle`, dropped afterwards) and its
//! own Redis namespace, and only talks to the servers named by those URLs.

use std::time::Instant;

use chrono::{Duration, Utc};
use futures_util::StreamExt;
use sqlx::{Connection, PgConnection};
use stampede::config::{Config, SettleConfig};
use stampede::domain::Id;
use stampede::keys::Keys;
use stampede::sale::buy::PurchaseOutcome;
use stampede::sale::buy::{BuyRequest, PurchaseBatch};
use stampede::sale::store::{self, NewSale};
use stampede::settle::Settler;

const DB: &str = "stampede_bench_settle";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let orders: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(100_000);
    let batch: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(2000);
    let maintenance_url = std::env::var("DATABASE_URL")?;
    let redis_url = std::env::var("REDIS_URL")?;

    let mut admin = PgConnection::connect(&maintenance_url).await?;
    sqlx::query(concat!(
        "DROP DATABASE IF EXISTS ",
        "stampede_bench_settle",
        " WITH (FORCE)"
    ))
    .execute(&mut admin)
    .await?;
    sqlx::query(concat!("CREATE DATABASE ", "stampede_bench_settle"))
        .execute(&mut admin)
        .await?;
    let slash = maintenance_url.rfind('/').expect("url with a database");
    let config = Config {
        database_url: format!("{}/{DB}", &maintenance_url[..slash]),
        redis_url,
        redis_namespace: format!("bench{}", std::process::id()),
        ..Config::default()
    };
    let db = stampede::startup::connect_db(&config).await?;
    stampede::startup::migrate(&db).await?;
    let mut redis = stampede::startup::connect_redis(&config).await?;
    let keys = Keys::new(&config.redis_namespace);

    println!("setting up: {orders} users and a sale of {orders} units");
    let user_ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO users (username, password_hash)
         SELECT 'bench-' || g, 'x' FROM generate_series(1, $1) g RETURNING id",
    )
    .bind(orders as i32)
    .fetch_all(&db)
    .await?;
    let now = Utc::now();
    let sale = store::create_sale(
        &db,
        &mut redis,
        &keys,
        NewSale {
            name: "bench".into(),
            description: String::new(),
            price_cents: 1,
            stock: orders as i64,
            starts_at: now - Duration::minutes(1),
            ends_at: now + Duration::hours(1),
            image_url: None,
            requires_ticket: false,
            payment_window_s: 0,
            rebuy_after_expiry: false,
            max_per_user: 1,
            rehearsal: false,
            waiting_room: None,
            proof_of_work: 0,
            min_account_age_s: 0,
            draw: None,
        },
        None,
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let sale_id = sale.id;

    // Fill the stream through the real purchase script, in batches of 64 buyers,
    // 8 batches in flight at a time.
    let started = Instant::now();
    let chunks: Vec<Vec<i64>> = user_ids.chunks(64).map(<[i64]>::to_vec).collect();
    let accepted: usize = futures_util::stream::iter(chunks)
        .map(|chunk| {
            let mut redis = redis.clone();
            let keys = keys.clone();
            async move {
                let buyers: Vec<BuyRequest> = chunk
                    .iter()
                    .map(|&uid| BuyRequest {
                        user: Id::new(uid).expect("positive"),
                        quantity: 1,
                        ip: None,
                        key: None,
                    })
                    .collect();
                let batch = PurchaseBatch {
                    keys: &keys,
                    sale: sale_id,
                    policies: &[],
                    now_ms: None,
                    key_ttl: std::time::Duration::from_secs(86_400),
                };
                batch.run(&mut redis, &buyers).await.map(|replies| {
                    replies
                        .iter()
                        .filter(|r| matches!(r.outcome, PurchaseOutcome::Accepted { .. }))
                        .count()
                })
            }
        })
        .buffer_unordered(8)
        .map(|r| r.unwrap_or(0))
        .fold(0, |sum, n| std::future::ready(sum + n))
        .await;
    let fill = started.elapsed();
    println!(
        "accepted {accepted} purchases through lua/purchase_batch.lua in {:.2} s ({:.0}/s, batches of 64, one connection)",
        fill.as_secs_f64(),
        accepted as f64 / fill.as_secs_f64()
    );

    let mut settler = Settler::connect(
        db.clone(),
        &stampede::redis_conn::Target::from_config(&config),
        keys.clone(),
        SettleConfig {
            batch_size: batch,
            ..SettleConfig::default()
        },
        stampede::startup::settlers(),
    )
    .await?;
    let started = Instant::now();
    let inserted = settler.drain().await?;
    let took = started.elapsed();
    let in_db: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&db)
        .await?;
    println!(
        "settled {inserted} orders (batch {batch}) in {:.2} s: {:.0} orders/s; orders in Postgres: {in_db}",
        took.as_secs_f64(),
        inserted as f64 / took.as_secs_f64()
    );
    if in_db as usize != accepted {
        anyhow::bail!("expected {accepted} orders in Postgres, found {in_db}");
    }

    // Clean up: the namespace's keys and the database.
    let pattern = format!("{}:*", config.redis_namespace);
    let bench_keys: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(&mut redis)
        .await?;
    if !bench_keys.is_empty() {
        let _: () = redis::cmd("UNLINK")
            .arg(&bench_keys)
            .query_async(&mut redis)
            .await?;
    }
    db.close().await;
    sqlx::query(concat!(
        "DROP DATABASE IF EXISTS ",
        "stampede_bench_settle",
        " WITH (FORCE)"
    ))
    .execute(&mut admin)
    .await?;
    let _ = keys;
    Ok(())
}
