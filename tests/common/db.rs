//! Queries of one parameter (`$1`) against a test's own database, shared by the API
//! suite (`TestApp`) and the fault suite (`Stack`): the SQL stays in the test, the
//! binding and fetching are written once.

use std::collections::HashMap;

use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgPool, Postgres};

/// A value a query can take as its `$1`.
pub trait Param<'q>: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + Send {}
impl<'q, P: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + Send> Param<'q> for P {}

/// What one row of an answer reads into.
pub trait Row: for<'r> FromRow<'r, PgRow> + Send + Unpin {}
impl<T: for<'r> FromRow<'r, PgRow> + Send + Unpin> Row for T {}

/// A test's handle on its database.
#[allow(async_fn_in_trait)]
pub trait Db {
    fn pool(&self) -> &PgPool;

    /// Every row the query answers, as `T`.
    async fn rows<'q, T: Row>(&self, query: &'static str, param: impl Param<'q>) -> Vec<T> {
        let query = sqlx::query_as(query).bind(param);
        query.fetch_all(self.pool()).await.unwrap()
    }

    /// The one row the query answers (the first, if more), as `T`.
    async fn row<'q, T: Row>(&self, query: &'static str, param: impl Param<'q>) -> T {
        let query = sqlx::query_as(query).bind(param);
        query.fetch_one(self.pool()).await.unwrap()
    }

    /// The one value the query answers.
    async fn scalar<'q, T: Send + Unpin>(&self, query: &'static str, param: impl Param<'q>) -> T
    where
        (T,): Row,
    {
        self.row::<(T,)>(query, param).await.0
    }

    /// The one column of every row the query answers.
    async fn scalars<'q, T: Send + Unpin>(
        &self,
        query: &'static str,
        param: impl Param<'q>,
    ) -> Vec<T>
    where
        (T,): Row,
    {
        let rows = self.rows::<(T,)>(query, param).await;
        rows.into_iter().map(|(value,)| value).collect()
    }

    /// The units a sale ever offered (`sales.stock_total`).
    async fn stock_total(&self, sale: i64) -> i64 {
        let query = "SELECT stock_total FROM sales WHERE id = $1";
        self.scalar(query, sale).await
    }

    /// Inserts `n` users (admins if `admin`) in one statement, without argon2 (far
    /// too slow for thousands): their ids.
    async fn insert_users(&self, n: usize, admin: bool) -> Vec<i64> {
        let prefix = uuid::Uuid::new_v4().simple().to_string();
        sqlx::query_scalar(
            "INSERT INTO users (username, password_hash, is_admin)
             SELECT $1 || '-' || g, 'not-a-real-hash', $3 FROM generate_series(1, $2) g
             RETURNING id",
        )
        .bind(&prefix[..12])
        .bind(n as i32)
        .bind(admin)
        .fetch_all(self.pool())
        .await
        .expect("insert users")
    }

    /// A sale's orders in Postgres, counted by status.
    async fn orders_by_status(&self, sale: i64) -> HashMap<String, i64> {
        let query = "SELECT status, count(*) FROM orders WHERE sale_id = $1 GROUP BY status";
        let rows: Vec<(String, i64)> = self.rows(query, sale).await;
        rows.into_iter().collect()
    }
}
