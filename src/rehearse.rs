//! What the load client (`stampede-load`, `load/`) asks of the stores, and the only
//! way it reaches them: it rehearses a sale through the HTTP API, but makes its
//! users in bulk (no argon2 sign-in per user) and checks the invariants against the
//! record, Postgres, once settled. Each function is one statement (or, for
//! [`cleanup`], the admin API's cleanup) and answers in plain types: ids as `i64`,
//! order ids as `Uuid`, moments as `DateTime<Utc>`. The client holds no SQL, no
//! table name and no connection of its own; the server never calls these.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{ConnectOptions, PgPool};
use uuid::Uuid;

use crate::config::Config;
use crate::keys::Keys;
pub use crate::sale::rehearsal::Cleaned;

/// The load client's connection to Postgres: a small pool of its own (two
/// connections), quiet, since making 20,000 users in one `INSERT` is meant to take
/// a while and sqlx would warn about a slow statement.
#[derive(Clone)]
pub struct Store {
    db: PgPool,
}

/// The users [`Store::make_users`] made: the admin (for the admin API) and the
/// shoppers, in order.
pub struct Users {
    pub admin: i64,
    pub shoppers: Vec<i64>,
}

/// One row of `votes`: one accepted vote request (`seq` 1, 2, ... per voter).
pub struct BallotRow {
    pub user_id: i64,
    pub seq: i32,
    /// The option (single, budget) or first choice (multi, ranked).
    pub option_id: i64,
    /// multi and ranked: every option, in the order sent.
    pub choices: Option<Vec<i64>>,
    /// budget: the votes it spent (1 for the other kinds).
    pub count: i32,
}

/// The receipt of `user`'s `seq`-th accepted vote request in `poll`, as the server
/// derives it (`vote::receipt`) from the same `token_secret`.
pub fn vote_receipt(secret: &[u8], poll: i64, user: i64, seq: i32) -> anyhow::Result<Uuid> {
    let poll = crate::domain::PollId::new(poll).ok_or_else(|| anyhow::anyhow!("poll id {poll}"))?;
    let user = crate::domain::UserId::new(user).ok_or_else(|| anyhow::anyhow!("user id {user}"))?;
    Ok(crate::vote::receipt::receipt(secret, poll, user, seq))
}

/// A draw sale's record in Postgres (`stampede load storm --draw`).
#[derive(Debug, sqlx::FromRow)]
pub struct DrawRecord {
    /// Whether the draw was made (`drawn_at` set).
    pub drawn: bool,
    /// The entries the draw counted, the rows of its seeded order (and how many
    /// distinct entries they name), and the entries Postgres holds.
    pub counted: Option<i32>,
    pub order_rows: i64,
    pub order_entries: i64,
    pub entry_rows: i64,
}

/// A sale's orders in Postgres against its waiting room's admissions.
pub struct OrdersAdmitted {
    pub orders: i64,
    /// Units in those orders.
    pub units: i64,
    /// Orders of a user with no admission to the sale.
    pub not_admitted: i64,
}

/// A `votes` row as read: user, seq, option, choices, count.
type VoteRow = (i64, i32, i64, Option<Vec<i64>>, i32);

impl Store {
    /// Connects to the configured database (`DATABASE_URL`); an error names the
    /// URL with its password hidden.
    pub async fn connect(config: &Config) -> anyhow::Result<Store> {
        let options: sqlx::postgres::PgConnectOptions = config
            .database_url
            .parse::<sqlx::postgres::PgConnectOptions>()?
            .disable_statement_logging();
        let db = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot connect to Postgres at {}: {e}",
                    crate::config::redact_url(&config.database_url)
                )
            })?;
        Ok(Store { db })
    }

    /// `n` shoppers and one admin in one `INSERT`, named `load<random>-<n>`. They
    /// cannot sign in (no password): the client mints their tokens. They are
    /// rehearsal users (`users.rehearsal`), which [`cleanup`] removes.
    pub async fn make_users(&self, n: usize) -> anyhow::Result<Users> {
        let prefix = format!("load{}", &Uuid::new_v4().simple().to_string()[..10]);
        let mut ids: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO users (username, password_hash, is_admin, rehearsal)
             SELECT $1 || '-' || g, 'no password: made by stampede load', g = 0, TRUE
             FROM generate_series(0, $2) g ORDER BY g RETURNING id",
        )
        .bind(&prefix)
        .bind(n as i32)
        .fetch_all(&self.db)
        .await?;
        anyhow::ensure!(!ids.is_empty(), "no users made");
        let admin = ids.remove(0);
        Ok(Users {
            admin,
            shoppers: ids,
        })
    }

    /// How many accepted vote requests `users` have in `poll` (settled ones:
    /// Postgres's).
    pub async fn votes_of(&self, poll: i64, users: &[i64]) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM votes WHERE poll_id = $1 AND user_id = ANY($2)",
        )
        .bind(poll)
        .bind(users)
        .fetch_one(&self.db)
        .await?)
    }

    /// Every settled vote request of `users` in `poll`, by voter and `seq`.
    pub async fn ballot_rows(&self, poll: i64, users: &[i64]) -> anyhow::Result<Vec<BallotRow>> {
        let rows: Vec<VoteRow> = sqlx::query_as(
            "SELECT user_id, seq, option_id, choices, count FROM votes
             WHERE poll_id = $1 AND user_id = ANY($2) ORDER BY user_id, seq",
        )
        .bind(poll)
        .bind(users)
        .fetch_all(&self.db)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(user_id, seq, option_id, choices, count)| BallotRow {
                user_id,
                seq,
                option_id,
                choices,
                count,
            })
            .collect())
    }

    /// The ids of every settled order of `sale`.
    pub async fn order_ids(&self, sale: i64) -> anyhow::Result<Vec<Uuid>> {
        Ok(
            sqlx::query_scalar("SELECT id FROM orders WHERE sale_id = $1")
                .bind(sale)
                .fetch_all(&self.db)
                .await?,
        )
    }

    /// Units the settled orders of `sale` hold: every order's quantity but those of
    /// orders expired, cancelled or refunded (their units went back to units left).
    pub async fn units_held(&self, sale: i64) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT COALESCE(sum(quantity), 0)::int8 FROM orders
             WHERE sale_id = $1 AND status NOT IN ('expired', 'cancelled', 'refunded')",
        )
        .bind(sale)
        .fetch_one(&self.db)
        .await?)
    }

    /// Units each of `users` holds in settled orders of `sale` (user id -> units;
    /// a user without an order is absent).
    pub async fn units_by_user(
        &self,
        sale: i64,
        users: &[i64],
    ) -> anyhow::Result<HashMap<i64, i64>> {
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT user_id, SUM(quantity)::int8 FROM orders WHERE sale_id = $1 AND user_id = ANY($2)
             GROUP BY user_id",
        )
        .bind(sale)
        .bind(users)
        .fetch_all(&self.db)
        .await?;
        Ok(rows.into_iter().collect())
    }

    /// How many places and how many admissions of `sale`'s waiting room Postgres
    /// holds (the admitter copies them from Redis a few hundred ms behind).
    pub async fn queue_counts(&self, sale: i64) -> anyhow::Result<(i64, i64)> {
        Ok(sqlx::query_as(
            "SELECT (SELECT count(*) FROM queue_places WHERE sale_id = $1),
                    (SELECT count(*) FROM queue_admissions WHERE sale_id = $1)",
        )
        .bind(sale)
        .fetch_one(&self.db)
        .await?)
    }

    /// The user ids of `sale`'s waiting room in line order (by place).
    pub async fn queue_places(&self, sale: i64) -> anyhow::Result<Vec<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT user_id FROM queue_places WHERE sale_id = $1 ORDER BY place, user_id",
        )
        .bind(sale)
        .fetch_all(&self.db)
        .await?)
    }

    /// `sale`'s admissions (user id, when admitted) in the order given: by
    /// `admitted_at` (one admitter step's admissions share it), then by place; an
    /// admission without a place last.
    pub async fn queue_admissions(&self, sale: i64) -> anyhow::Result<Vec<(i64, DateTime<Utc>)>> {
        Ok(sqlx::query_as(
            "SELECT a.user_id, a.admitted_at FROM queue_admissions a
               LEFT JOIN queue_places p ON p.sale_id = a.sale_id AND p.user_id = a.user_id
             WHERE a.sale_id = $1 ORDER BY a.admitted_at, p.place NULLS LAST, a.user_id",
        )
        .bind(sale)
        .fetch_all(&self.db)
        .await?)
    }

    /// How many admissions `sale`'s waiting room gave, and when the last one was.
    pub async fn last_admission(&self, sale: i64) -> anyhow::Result<(i64, Option<DateTime<Utc>>)> {
        Ok(sqlx::query_as(
            "SELECT count(*), max(admitted_at) FROM queue_admissions WHERE sale_id = $1",
        )
        .bind(sale)
        .fetch_one(&self.db)
        .await?)
    }

    /// `sale`'s draw as Postgres holds it (`None`: not a draw sale).
    pub async fn draw_record(&self, sale: i64) -> anyhow::Result<Option<DrawRecord>> {
        Ok(sqlx::query_as(
            "SELECT d.drawn_at IS NOT NULL AS drawn, d.entries AS counted,
                    (SELECT count(*) FROM draw_order WHERE sale_id = $1) AS order_rows,
                    (SELECT count(DISTINCT entry_id) FROM draw_order WHERE sale_id = $1)
                        AS order_entries,
                    (SELECT count(*) FROM draw_entries WHERE sale_id = $1) AS entry_rows
             FROM sale_draws d WHERE d.sale_id = $1",
        )
        .bind(sale)
        .fetch_optional(&self.db)
        .await?)
    }

    /// The buyers of `sale`'s settled orders, with their units.
    pub async fn buyers(&self, sale: i64) -> anyhow::Result<Vec<(i64, i64)>> {
        Ok(sqlx::query_as(
            "SELECT user_id, SUM(quantity)::int8 FROM orders WHERE sale_id = $1 GROUP BY user_id",
        )
        .bind(sale)
        .fetch_all(&self.db)
        .await?)
    }

    /// `sale`'s settled orders and units, and how many of them belong to a user
    /// its waiting room never admitted.
    pub async fn orders_admitted(&self, sale: i64) -> anyhow::Result<OrdersAdmitted> {
        let (orders, units, not_admitted) = sqlx::query_as(
            "SELECT count(*), COALESCE(SUM(quantity), 0)::int8,
                    count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM queue_admissions a
                                                       WHERE a.sale_id = o.sale_id AND a.user_id = o.user_id))
             FROM orders o WHERE o.sale_id = $1",
        )
        .bind(sale)
        .fetch_one(&self.db)
        .await?;
        Ok(OrdersAdmitted {
            orders,
            units,
            not_admitted,
        })
    }
}

/// `stampede load --cleanup`: every rehearsal sale and user out of Postgres and
/// Redis, as the admin API's cleanup does (`sale::rehearsal::cleanup`), over
/// connections made from `config` as the other commands make theirs; what it
/// removed.
pub async fn cleanup(config: &Config) -> anyhow::Result<Cleaned> {
    let db = crate::startup::connect_db(config).await?;
    let mut redis = crate::startup::connect_redis(config).await?;
    let keys = Keys::new(&config.redis_namespace);
    crate::sale::rehearsal::cleanup(&db, &mut redis, &keys, config.token_ttl)
        .await
        .map_err(|e| anyhow::anyhow!("{e:?}"))
}
