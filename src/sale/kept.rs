//! A sale's accepted orders kept until settled (see [`crate::settle::kept`]): an
//! order is found in Postgres by its id.

use std::collections::HashSet;

use chrono::Utc;
use futures_util::future::BoxFuture;
use sqlx::PgPool;
use uuid::Uuid;

use super::settlement::Orders;
use crate::domain::SaleId;
use crate::roster::Kind;
use crate::settle::Accepted;
use crate::settle::kept::{Kept, KeptRows};

/// Every server's kept orders.
pub type KeptOrders = Kept<Orders>;

impl KeptRows for Orders {
    const KIND: Kind = Kind::Sale;

    fn settled<'a>(
        &'a self,
        db: &'a PgPool,
        probes: &'a [&'a Accepted],
    ) -> BoxFuture<'a, Result<HashSet<usize>, sqlx::Error>> {
        Box::pin(async move {
            let ids: Vec<Option<Uuid>> = probes.iter().map(|r| r.id).collect();
            let found: Vec<i64> = sqlx::query_scalar(
                "SELECT i - 1 FROM unnest($1::uuid[]) WITH ORDINALITY AS x(id, i)
                 WHERE EXISTS (SELECT 1 FROM orders o WHERE o.id = x.id)",
            )
            .bind(&ids)
            .fetch_all(db)
            .await?;
            Ok(found.into_iter().map(|i| i as usize).collect())
        })
    }
}

/// The rows a purchase batch of `sale` accepted, to keep (`(order, user, units,
/// key)`; not a replayed acceptance: its first answer kept it).
pub fn accepted<'k>(
    sale: SaleId,
    orders: impl Iterator<Item = (Uuid, i64, u32, Option<&'k str>)>,
) -> Vec<Accepted> {
    let at = Utc::now();
    orders
        .map(|(order, user, units, key)| Accepted {
            id: Some(order),
            owner: sale.get(),
            user,
            value: i64::from(units),
            at,
            key: key.map(str::to_string),
            vote: None,
        })
        .collect()
}
