//! An earlier version's buyers set, folded into the buyers hash, and the marker
//! that keeps servers of that version from deciding against it.
//!
//! Until 2026-12-04 a sale kept who bought in a set (`{sale:N}:buyers`) and, beside
//! it, the order that made each buyer one in a hash (`{sale:N}:held`, sales of one
//! per customer only). The hash alone now says both ([`crate::keys::SaleKeys::buyers`]),
//! so a purchase grows and looks up one table per buyer, not two. A Redis that an
//! earlier version wrote still has the sets: at startup, before the first sweep,
//! each sale's set is moved into its hash ([`fold_all`]), a buyer whose order the
//! hash does not know with the value '' (their `already_bought` then reads the
//! order from Postgres, as before); a rebuild folds the set first too ([`fold`]).
//!
//! Where the set was, every sale Redis holds then keeps [`MARKER`], a string
//! (written by the fold, by `lua/new_sale.lua` and by the rebuild): a server of the
//! earlier version that still runs would otherwise find an empty set and sell a
//! second unit to a buyer only the hash knows. On the marker its commands fail
//! (`WRONGTYPE`, a 500 from that server) for the sale: it refuses rather than
//! decides wrong. Roll all servers over before a sale opens (docs/operations.md).

use crate::domain::{Id, SaleId};
use crate::error::AppError;
use crate::keys::{Keys, SaleKeys};

static FOLD_BUYERS: std::sync::LazyLock<crate::lua::Script> =
    crate::lua::lua_script!("fold_buyers.lua");

/// What `{sale:N}:buyers` holds once its set is folded (or on a sale made since).
pub const MARKER: &str = "folded into {sale:N}:held";

/// Buyers moved per call of `lua/fold_buyers.lua`: Redis is held for about a
/// millisecond a call, however large the set.
const FOLD_CHUNK: usize = 1_000;

/// Sales whose key is looked at per round trip.
const TYPE_CHUNK: usize = 500;

/// Moves the sale's earlier buyers set into its buyers hash and leaves the marker
/// (on a sale Redis holds); returns how many buyers it moved (0: there was none).
pub async fn fold<C: redis::aio::ConnectionLike>(
    redis: &mut C,
    k: &SaleKeys,
) -> Result<u64, AppError> {
    let mut moved = 0u64;
    loop {
        let n: u64 = FOLD_BUYERS
            .key(&k.buyers_legacy)
            .key(&k.buyers)
            .key(&k.meta)
            .arg(FOLD_CHUNK)
            .arg(MARKER)
            .invoke_async(redis)
            .await?;
        if n == 0 {
            return Ok(moved);
        }
        moved += n;
    }
}

/// [`fold`] for every sale in Postgres with a set to fold, or held by Redis
/// without the marker yet (one `TYPE` and one `EXISTS` a sale, pipelined; a sale
/// Redis does not hold costs no script): (sales with a set folded, buyers moved).
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
    for chunk in sales.chunks(TYPE_CHUNK) {
        let mut pipe = redis::pipe();
        for &sale in chunk {
            let k = keys.sale(sale);
            pipe.cmd("TYPE").arg(&k.buyers_legacy).exists(&k.meta);
        }
        let kinds: Vec<(String, bool)> = pipe.query_async(redis).await?;
        for (&sale, (kind, held)) in chunk.iter().zip(kinds) {
            if !(kind == "set" || (kind == "none" && held)) {
                continue;
            }
            let n = fold(redis, &keys.sale(sale)).await?;
            if kind == "set" {
                folded += 1;
                moved += n;
            }
        }
    }
    Ok((folded, moved))
}
