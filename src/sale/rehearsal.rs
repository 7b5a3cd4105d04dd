//! Rehearsals: the sales `stampede load` makes (`sales.rehearsal`, fixed at
//! creation) and its users (`users.rehearsal`). They never show on a public page
//! or list (the list's SQL leaves them out, `GET /api/sales/{id}` and the sale page
//! answer 404 to all but admins), and [`cleanup`] removes them from both stores:
//! `stampede load --cleanup`, `POST /api/admin/rehearsals/cleanup`, the admin
//! page's button.
//!
//! The order keeps a server from rebuilding a sale being removed: the sales' rows
//! are locked first (`FOR UPDATE`: a rebuild, a stock change, a window change and
//! the expiry of its orders wait for them, then find no row and do nothing); their
//! Redis keys go next, so no purchase is decided meanwhile (a purchase finds no
//! meta hash: "not loaded", and the rebuild it starts waits on the row lock); the
//! rows go in the same transaction; after the commit the keys are removed again, in
//! case the settlement worker recreated an orders stream in between (it recreates
//! a stream only of a sale Postgres still lists, and one it recreated for a sale
//! removed meanwhile it removes again while empty, see `settle`).
//!
//! Removed users are recorded (`user_removals`, migrations/0015): settlement looks
//! up each order's and vote's user only while a removal is open, so an order or a
//! vote of a removed user that still arrives (its token lives on; one accepted
//! before the cleanup may not be settled yet) is not written (migrations/0027 for
//! votes).

use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;

use crate::domain::{Id, SaleId};
use crate::error::AppError;
use crate::keys::Keys;
use crate::redis_conn::Redis;

/// How long the tokens `stampede load` signs for its users and its admin live,
/// whatever the deployment's `token_ttl`: the cleanup ends a removed admin's
/// sessions for at least that long.
pub const LOAD_TOKEN_TTL: Duration = Duration::from_secs(6 * 3600);

/// How long after the last token of a removed user expires its removal stays open
/// (settlement looks up each order's user meanwhile): room for an order accepted
/// with such a token and not yet settled, a settlement lag no storm or outage of a
/// day reaches.
pub const REMOVAL_OPEN_AFTER_TOKENS: Duration = Duration::from_secs(24 * 3600);

/// The longest a removal stays open, whatever `token_ttl` says.
const REMOVAL_OPEN_AT_MOST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// What a cleanup removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Cleaned {
    /// Rehearsal sales removed (with their stock changes, payments and admin
    /// changes).
    pub sales: i64,
    /// Their orders.
    pub orders: i64,
    /// Rehearsal shoppers removed (with their ended-sessions rows): the load
    /// tool's own admin accounts are not among them, see `admins`.
    pub users: i64,
    /// The load tool's own admin accounts removed (one a run: `stampede load`
    /// makes one to call the admin API). Removed with the rest, since nobody can
    /// sign in as one (no password) and each run makes a new one; counted apart, so
    /// `users` says how many shoppers the rehearsals had.
    pub admins: i64,
    /// Rehearsal users (shoppers or the load tool's admins) kept because something
    /// that stays names them: an order of a real sale, a vote (`stampede load vote`
    /// votes in a real poll), a stock or admin change of a real sale or poll (the
    /// admin of a `load vote` run that made its poll). Normally 0 after storms.
    pub users_kept: i64,
}

/// Removes every rehearsal sale with its orders, payments, stock changes, admin
/// changes, waiting-room places and admissions and Redis keys, and every rehearsal user nothing else names (see the
/// module's note for the order). Never touches a sale or user that is not a
/// rehearsal one. Safe while nothing runs against those sales; an open one is
/// removed too (its buyers then get 404).
///
/// `token_ttl` is the deployment's (`Config::token_ttl`): a removed user's token
/// issued before the removal lives that long, and settlement guards against the
/// orders it could still buy until then and [`REMOVAL_OPEN_AFTER_TOKENS`] after.
pub async fn cleanup(
    db: &PgPool,
    redis: &mut Redis,
    keys: &Keys,
    token_ttl: Duration,
) -> Result<Cleaned, AppError> {
    let mut tx = db.begin().await?;
    // Thousands of users and orders: more than a request's statement timeout.
    sqlx::query("SET LOCAL statement_timeout = '120s'")
        .execute(&mut *tx)
        .await?;
    let ids: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM sales WHERE rehearsal ORDER BY id FOR UPDATE")
            .fetch_all(&mut *tx)
            .await?;
    let sales: Vec<SaleId> = ids.iter().filter_map(|&id| Id::new(id)).collect();
    remove_keys(redis, keys, &sales).await?;

    sqlx::query("DELETE FROM stock_changes WHERE sale_id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "DELETE FROM payments WHERE order_id IN (SELECT id FROM orders WHERE sale_id = ANY($1))",
    )
    .bind(&ids)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM admin_changes WHERE sale_id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    // A waiting room's line and admissions (no foreign key names the sale).
    sqlx::query("DELETE FROM queue_places WHERE sale_id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM queue_admissions WHERE sale_id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    // A draw's seed and entries.
    for table in [
        "DELETE FROM draw_entries WHERE sale_id = ANY($1)",
        "DELETE FROM draw_order WHERE sale_id = ANY($1)",
        "DELETE FROM sale_draws WHERE sale_id = ANY($1)",
    ] {
        sqlx::query(table).bind(&ids).execute(&mut *tx).await?;
    }
    let orders = sqlx::query("DELETE FROM orders WHERE sale_id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let removed = sqlx::query("DELETE FROM sales WHERE id = ANY($1) AND rehearsal")
        .bind(&ids)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    // Users: only rehearsal ones nothing that stays refers to (`signed_out_sessions`
    // goes with them: ON DELETE CASCADE).
    let removed_users: Vec<(i64, bool)> = sqlx::query_as(
        "DELETE FROM users u WHERE u.rehearsal
           AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.user_id = u.id OR o.cancelled_by = u.id)
           AND NOT EXISTS (SELECT 1 FROM votes v WHERE v.user_id = u.id)
           AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.user_id = u.id)
           AND NOT EXISTS (SELECT 1 FROM stock_changes c WHERE c.admin_id = u.id)
           AND NOT EXISTS (SELECT 1 FROM admin_changes a WHERE a.admin_id = u.id)
         RETURNING u.id, u.is_admin",
    )
    .fetch_all(&mut *tx)
    .await?;
    let removed_admins: Vec<i64> = removed_users
        .iter()
        .filter_map(|&(id, admin)| admin.then_some(id))
        .collect();
    let admins = removed_admins.len() as i64;
    let users = removed_users.len() as i64 - admins;
    end_removed_admins(&mut tx, redis, keys, &removed_admins, token_ttl).await?;
    if !removed_users.is_empty() {
        // Settlement looks up each order's user while this removal is open: see
        // migrations/0015_user_removals.sql and [`REMOVAL_OPEN_AFTER_TOKENS`].
        // (At most a century: a `token_ttl` past that is a setting's mistake, and
        // neither the sum nor Postgres's timestamp may overflow on it.)
        let open = token_ttl
            .saturating_add(REMOVAL_OPEN_AFTER_TOKENS)
            .min(REMOVAL_OPEN_AT_MOST);
        sqlx::query(
            "INSERT INTO user_removals (until, users)
             VALUES (now() + make_interval(secs => $1), $2)",
        )
        .bind(open.as_secs_f64())
        .bind(removed_users.len() as i64)
        .execute(&mut *tx)
        .await?;
    }
    let users_kept: i64 = sqlx::query_scalar("SELECT count(*) FROM users WHERE rehearsal")
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;

    remove_keys(redis, keys, &sales).await?;
    let _: () = redis::cmd("DEL")
        .arg(keys.sales_list())
        .query_async(redis)
        .await?;
    let cleaned = Cleaned {
        sales: removed as i64,
        orders: orders as i64,
        users,
        admins,
        users_kept,
    };
    tracing::info!(?cleaned, "rehearsals removed");
    Ok(cleaned)
}

/// Ends every session of the removed admin accounts: a token carries the admin
/// flag it was signed with (a `stampede load` run signs its admin one of six
/// hours), and would otherwise keep the admin API open after its account is gone.
/// Recorded in `ended_accounts` until such a token has expired (the expired rows go),
/// for the processes that load the record later, and announced to the running ones
/// before the removal commits: when Redis cannot take the announcement the removal
/// is rolled back, and a second cleanup does it all again.
async fn end_removed_admins(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    redis: &mut Redis,
    keys: &Keys,
    admins: &[i64],
    token_ttl: Duration,
) -> Result<(), AppError> {
    sqlx::query("DELETE FROM ended_accounts WHERE until < now()")
        .execute(&mut **tx)
        .await?;
    if admins.is_empty() {
        return Ok(());
    }
    // Its own sign-ins live token_ttl, the load tool's tokens LOAD_TOKEN_TTL.
    let lives = token_ttl.max(LOAD_TOKEN_TTL).min(REMOVAL_OPEN_AT_MOST);
    sqlx::query(
        "INSERT INTO ended_accounts (user_id, until)
         SELECT id, now() + make_interval(secs => $2) FROM unnest($1::bigint[]) AS id
         ON CONFLICT (user_id) DO UPDATE SET until = EXCLUDED.until",
    )
    .bind(admins)
    .bind(lives.as_secs_f64())
    .execute(&mut **tx)
    .await?;
    for &id in admins {
        if let Some(user) = Id::new(id) {
            crate::auth::session::announce_end_all(redis, keys, user, i64::MAX).await?;
        }
    }
    Ok(())
}

/// Every key of each sale's hash tag in this namespace: its state (meta, stock,
/// buyers, orders stream, pending, changes, units, sold, rebuild token, the waiting
/// room's line, state, admissions and joins stream), its
/// per-sale rate-limit keys and its cached record. Found with `SCAN` on the node of
/// its slot, plus the known names (so a key a scan could miss is removed anyway).
async fn remove_keys(redis: &mut Redis, keys: &Keys, sales: &[SaleId]) -> Result<(), AppError> {
    for &sale in sales {
        let k = keys.sale(sale);
        let pattern = format!("{}:*{{sale:{sale}}}*", glob_escape(keys.namespace()));
        let mut names = redis.keys_in_slot_of(&k.meta, &pattern).await?;
        names.extend([
            k.meta,
            k.stock,
            k.buyers,
            k.buyers_legacy,
            k.orders,
            k.orders_legacy,
            k.pending,
            k.changes,
            k.rebuild,
            k.units,
            k.sold,
            k.queue,
            k.queue_state,
            k.queue_open,
            k.queue_admitted,
            k.queue_joins,
            k.queue_admits,
            keys.sale_view(sale),
        ]);
        names.sort();
        names.dedup();
        // All in one slot: one DEL per chunk works on a cluster too.
        for chunk in names.chunks(500) {
            let _: () = redis::cmd("DEL").arg(chunk).query_async(redis).await?;
        }
    }
    Ok(())
}

/// `text` as a literal inside a `SCAN MATCH` pattern.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_escape_keeps_a_namespace_literal() {
        assert_eq!(glob_escape("stampede"), "stampede");
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
