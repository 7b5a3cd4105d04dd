//! An earlier version's buyers set, folded into the buyers hash.
//!
//! Until 2026-12-04 a sale kept who bought in a set (`{sale:N}:buyers`) and, beside
//! it, the order that made each buyer one in a hash (`{sale:N}:held`, sales of one
//! per customer only). The hash alone now says both ([`crate::keys::SaleKeys::buyers`]),
//! so a purchase grows and looks up one table per buyer, not two. A Redis that an
//! earlier version wrote still has the sets: at startup, before the first sweep,
//! each sale's set is moved into its hash ([`fold_all`]), a buyer whose order the
//! hash does not know with the value '' (their `already_bought` then reads the
//! order from Postgres, as before); a rebuild folds the set first too ([`fold`]).
//! While servers of the earlier version still run (a rolling upgrade), they may
//! write a set again: the next start or rebuild folds it. Until then a buyer only
//! such a server added, on a sale of more than one per customer, is capped by
//! their units as always, but the waiting room and draws do not see them as a buyer.

use crate::domain::{Id, SaleId};
use crate::error::AppError;
use crate::keys::{Keys, SaleKeys};

static FOLD_BUYERS: std::sync::LazyLock<crate::lua::Script> =
    crate::lua::lua_script!("fold_buyers.lua");

/// Buyers moved per call of `lua/fold_buyers.lua`: Redis is held for about a
/// millisecond a call, however large the set.
const FOLD_CHUNK: usize = 1_000;

/// Sales whose set is looked for per round trip.
const EXISTS_CHUNK: usize = 500;

/// Moves the sale's earlier buyers set into its buyers hash; returns how many
/// buyers it moved (0: there was none).
pub async fn fold<C: redis::aio::ConnectionLike>(
    redis: &mut C,
    k: &SaleKeys,
) -> Result<u64, AppError> {
    let mut moved = 0u64;
    loop {
        let n: u64 = FOLD_BUYERS
            .key(&k.buyers_legacy)
            .key(&k.buyers)
            .arg(FOLD_CHUNK)
            .invoke_async(redis)
            .await?;
        if n == 0 {
            return Ok(moved);
        }
        moved += n;
    }
}

/// [`fold`] for every sale in Postgres that has an earlier buyers set in Redis
/// (one `EXISTS` a sale, pipelined): (sales folded, buyers moved).
pub async fn fold_all<C: redis::aio::ConnectionLike>(
    db: &sqlx::PgPool,
    redis: &mut C,
    keys: &Keys,
) -> Result<(u64, u64), AppError> {
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM sales ORDER BY id")
        .fetch_all(db)
        .await?;
    let sales: Vec<SaleId> = ids.into_iter().filter_map(Id::new).collect();
    let (mut folded, mut moved) = (0, 0);
    for chunk in sales.chunks(EXISTS_CHUNK) {
        let mut pipe = redis::pipe();
        for &sale in chunk {
            pipe.exists(keys.sale(sale).buyers_legacy);
        }
        let present: Vec<bool> = pipe.query_async(redis).await?;
        for (&sale, _) in chunk.iter().zip(present).filter(|(_, p)| *p) {
            moved += fold(redis, &keys.sale(sale)).await?;
            folded += 1;
        }
    }
    Ok((folded, moved))
}
