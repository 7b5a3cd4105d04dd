//! Sale records read through the Redis cache ([`crate::cache`]). Only the Postgres
//! record ([`SaleRow`]) is cached; units left and sold are read from Redis on every
//! request and merged by [`store::views`], so a cached view never shows old stock.
//!
//! Anything that changes a `sales` row calls [`invalidate`] after its commit.
//! Pages and the API read sales through [`load_list`], [`load_view`] and [`find_view`].

use std::time::Duration;

use super::store::{self, SaleRow};
use crate::cache::CachedReads;
use crate::domain::SaleId;
use crate::error::AppError;

/// How long a cached sale record lives (see [`crate::cache::RECORD_TTL`]).
pub const VIEW_TTL: Duration = crate::cache::RECORD_TTL;

/// Most sales the public list returns.
pub const LIST_LIMIT: i64 = 200;

/// One sale's record; `None` (cached too) when there is no such sale.
pub async fn sale_row<S: CachedReads + ?Sized>(
    state: &S,
    id: SaleId,
) -> Result<Option<SaleRow>, AppError> {
    let db = state.db();
    state
        .cache()
        .get_or_rebuild(&state.keys().sale_view(id), VIEW_TTL, || async move {
            Ok(store::fetch_sale(db, id).await?)
        })
        .await
}

/// The records of the public list (newest first, at most [`LIST_LIMIT`]).
pub async fn list_rows<S: CachedReads + ?Sized>(state: &S) -> Result<Vec<SaleRow>, AppError> {
    let db = state.db();
    state
        .cache()
        .get_or_rebuild(&state.keys().sales_list(), VIEW_TTL, || async move {
            Ok(store::list_sales(db, LIST_LIMIT).await?)
        })
        .await
}

/// Drops the cached record of `id` and the cached list.
pub async fn invalidate<S: CachedReads + ?Sized>(state: &S, id: SaleId) -> Result<(), AppError> {
    let keys = state.keys();
    state
        .cache()
        .invalidate(&[keys.sale_view(id), keys.sales_list()])
        .await
}

/// The public sale list: cached records, live numbers.
pub async fn load_list<S: CachedReads + ?Sized>(
    state: &S,
) -> Result<Vec<store::SaleView>, AppError> {
    let rows = list_rows(state).await?;
    store::views(&mut state.redis().clone(), state.keys(), rows).await
}

/// One sale: its cached record, live numbers; 404 when there is no such sale.
pub async fn load_view<S: CachedReads + ?Sized>(
    state: &S,
    id: SaleId,
) -> Result<store::SaleView, AppError> {
    find_view(state, id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no sale with id {id}")))
}

/// One sale: its cached record, live numbers; `None` when there is no such sale.
pub async fn find_view<S: CachedReads + ?Sized>(
    state: &S,
    id: SaleId,
) -> Result<Option<store::SaleView>, AppError> {
    let Some(row) = sale_row(state, id).await? else {
        return Ok(None);
    };
    let mut views = store::views(&mut state.redis().clone(), state.keys(), vec![row]).await?;
    Ok(views.pop())
}
