//! The configured first admin and the demo data of `scripts/run`. Both are
//! idempotent: running them again changes nothing but passwords.

use chrono::{Duration, Utc};
use sqlx::PgPool;

use crate::auth;
use crate::config::Config;
use crate::domain::{Password, Username};
use crate::keys::Keys;
use crate::sale::record;
use crate::sale::store::{self, NewSale};

/// Creates the admin named in the configuration when no account has that name.
/// An existing admin's password is left alone; an existing shopper's account of
/// that name is not made an admin (whoever signed up under the name would hold
/// the admin's rights with their own password): logged, and left to
/// `stampede create-admin`.
pub async fn bootstrap_admin(db: &PgPool, config: &Config) -> anyhow::Result<()> {
    let (Some(name), Some(password)) = (&config.admin_username, &config.admin_password) else {
        return Ok(());
    };
    let username = Username::parse(name).map_err(|e| anyhow::anyhow!("admin_username: {e}"))?;
    let admin = auth::is_admin_named(db, &username).await?;
    if admin == Some(false) {
        tracing::error!(
            admin = username.as_str(),
            "STAMPEDE_ADMIN_USERNAME names a shopper's account: not made an admin. Name \
             another admin, or make this one with `stampede create-admin` if it is yours"
        );
    } else if admin.is_none() {
        let password = Password::parse(password.clone())
            .map_err(|e| anyhow::anyhow!("admin_password: {e}"))?;
        auth::upsert_user(db, &username, password, true)
            .await
            .map_err(|e| anyhow::Error::from(e).context("creating the configured admin"))?;
        tracing::info!(admin = username.as_str(), "created the configured admin");
    }
    Ok(())
}

pub const DEMO_SALE: &str = "Stampede Phone X (demo)";
pub const DEMO_POLL: &str = "Which colour should the next Stampede Phone come in? (demo)";
pub const DEMO_UPCOMING_SALE: &str = "Stampede Earbuds (demo)";

/// Demo users `alice` and `bob`, the admin `admin`, a live sale, an upcoming one and
/// an open poll. Idempotent: what exists (by name, not yet ended) is kept.
pub async fn seed_demo(
    db: &PgPool,
    redis: &mut crate::redis_conn::Redis,
    keys: &Keys,
    config: &Config,
) -> anyhow::Result<()> {
    demo_users(db, config).await?;
    let now = Utc::now();
    let demo_sales = [
        DemoSale {
            name: DEMO_SALE,
            description: "100 phones, one per customer. Sign in, press Buy, then pay within \
                          ten minutes on My orders, or the phone goes back on sale.",
            price_cents: 49_900,
            stock: 100,
            starts_at: now - Duration::minutes(1),
            image: "/static/products/phone.svg",
            max_per_user: 1,
        },
        DemoSale {
            name: DEMO_UPCOMING_SALE,
            description: "Opens ten minutes after the demo starts: watch the countdown. \
                          Up to two per customer.",
            price_cents: 5_900,
            stock: 50,
            starts_at: now + Duration::minutes(10),
            image: "/static/products/earbuds.svg",
            max_per_user: 2,
        },
    ];
    for sale in demo_sales {
        demo_sale(db, redis, keys, sale, now + Duration::days(7)).await?;
    }
    demo_poll(db, redis, keys, now).await
}

/// `alice` and `bob` with the demo password, and the configured admin.
async fn demo_users(db: &PgPool, config: &Config) -> anyhow::Result<()> {
    let demo_password = config
        .demo_password
        .clone()
        .ok_or_else(|| anyhow::anyhow!("set STAMPEDE_DEMO_PASSWORD (scripts/run does)"))?;
    for name in ["alice", "bob"] {
        let username = Username::parse(name).expect("valid demo name");
        let password = Password::parse(demo_password.clone())
            .map_err(|e| anyhow::anyhow!("STAMPEDE_DEMO_PASSWORD: {e}"))?;
        auth::upsert_user(db, &username, password, false)
            .await
            .map_err(|e| anyhow::Error::from(e).context("demo user"))?;
    }
    if let Some(admin_password) = &config.admin_password {
        let username = Username::parse(config.admin_username.as_deref().unwrap_or("admin"))
            .map_err(|e| anyhow::anyhow!("admin_username: {e}"))?;
        let password = Password::parse(admin_password.clone())
            .map_err(|e| anyhow::anyhow!("STAMPEDE_ADMIN_PASSWORD: {e}"))?;
        auth::upsert_user(db, &username, password, true)
            .await
            .map_err(|e| anyhow::Error::from(e).context("admin user"))?;
    }
    Ok(())
}

struct DemoSale {
    name: &'static str,
    description: &'static str,
    price_cents: i64,
    stock: i64,
    starts_at: chrono::DateTime<Utc>,
    image: &'static str,
    max_per_user: i32,
}

/// Creates the demo sale unless one of that name has not ended yet.
async fn demo_sale(
    db: &PgPool,
    redis: &mut crate::redis_conn::Redis,
    keys: &Keys,
    demo: DemoSale,
    ends_at: chrono::DateTime<Utc>,
) -> anyhow::Result<()> {
    if record::unended_named(db, demo.name).await? {
        return Ok(());
    }
    let new = NewSale {
        name: demo.name.into(),
        description: demo.description.into(),
        price_cents: demo.price_cents,
        stock: demo.stock,
        starts_at: demo.starts_at,
        ends_at,
        image_url: Some(demo.image.into()),
        // The demo shows the page getting its ticket at the opening.
        requires_ticket: true,
        // And the order waiting for its payment, with its countdown.
        payment_window_s: 600,
        rebuy_after_expiry: false,
        max_per_user: demo.max_per_user,
        rehearsal: false,
        waiting_room: None,
        proof_of_work: 0,
        min_account_age_s: 0,
        draw: None,
    };
    let sale = store::create_sale(db, redis, keys, new, None)
        .await
        .map_err(|e| anyhow::Error::from(e).context("demo sale"))?;
    {
        let id = sale.id;
        // A server may be running: let it see the new sale now, not after the TTL.
        crate::cache::invalidate_keys(redis, &[keys.sale_view(id), keys.sales_list()]).await?;
    }
    tracing::info!(sale = %sale.id, name = demo.name, "created demo sale");
    Ok(())
}

/// Creates the demo poll unless one with its question is still open.
async fn demo_poll(
    db: &PgPool,
    redis: &mut crate::redis_conn::Redis,
    keys: &Keys,
    now: chrono::DateTime<Utc>,
) -> anyhow::Result<()> {
    if crate::vote::store::open_asking(db, DEMO_POLL).await? {
        return Ok(());
    }
    let record = crate::vote::store::create_poll(
        db,
        redis,
        keys,
        crate::vote::store::NewPoll {
            question: DEMO_POLL.into(),
            options: ["Midnight", "Glacier", "Coral", "Forest"]
                .map(String::from)
                .to_vec(),
            opens_at: now - Duration::minutes(1),
            closes_at: now + Duration::days(7),
            results: Default::default(),
            ballot: Default::default(),
            fairness: Default::default(),
        },
        None,
    )
    .await
    .map_err(|e| anyhow::Error::from(e).context("demo poll"))?;
    if let Some(id) = crate::domain::Id::new(record.poll.id) {
        crate::cache::invalidate_keys(redis, &[keys.poll_view(id)]).await?;
    }
    tracing::info!(poll = record.poll.id, "created demo poll");
    Ok(())
}
