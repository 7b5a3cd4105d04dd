//! Sale records read through the Redis cache ([`crate::cache`]). Only the Postgres
//! record ([`SaleRow`]) is cached; units left and sold are read from Redis on every
//! request and merged by [`numbers::views`], so a cached view never shows old stock.
//!
//! Anything that changes a `sales` row calls [`invalidate`] after its commit.
//! Pages and the API read sales through [`load_page`], [`load_view`] and [`find_view`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::list;
use super::list::SaleCursor;
use super::numbers;
use super::record;
use super::record::SaleRow;
use crate::cache::CachedReads;
use crate::domain::SaleId;
use crate::error::AppError;
use crate::paging::{self, Limit, ListScope, Page};

/// How long a cached sale record lives (see [`crate::cache::RECORD_TTL`]).
pub const VIEW_TTL: Duration = crate::cache::RECORD_TTL;

/// One sale's record; `None` (cached too) when there is no such sale.
pub async fn sale_row<S: CachedReads + ?Sized>(
    state: &S,
    id: SaleId,
) -> Result<Option<SaleRow>, AppError> {
    let db = state.db();
    state
        .cache()
        .get_or_rebuild(&state.keys().sale_view(id), VIEW_TTL, || async move {
            Ok(record::fetch_sale(db, id).await?)
        })
        .await
}

/// How long the cached first page lives. Its order depends on the clock (a sale
/// that opens moves up), so it lives shorter than a record: a sale's place lags its
/// opening or end by this at most; its status and numbers never lag (read live).
pub const FIRST_PAGE_TTL: Duration = Duration::from_secs(5);

/// Sales the cached first page holds: a first page of at most this many (the
/// API's default, and the pages' sizes) is served from it.
pub const FIRST_PAGE_CACHED: Limit = Limit::DEFAULT;

/// The first page of the list order (see [`list::list_page`]) as taken at `at`,
/// as cached: [`FIRST_PAGE_CACHED`] sales and one more, if there is one.
#[derive(Serialize, Deserialize)]
struct FirstPage {
    at: DateTime<Utc>,
    rows: Vec<SaleRow>,
}

/// The first page's records through the cache (one Postgres query per
/// [`FIRST_PAGE_TTL`] across instances); its moment and the rows, one more than
/// [`FIRST_PAGE_CACHED`] when a second page exists.
async fn first_page_rows<S: CachedReads + ?Sized>(
    state: &S,
) -> Result<(DateTime<Utc>, Vec<SaleRow>), AppError> {
    let db = state.db();
    let page: FirstPage = state
        .cache()
        .get_or_rebuild(&state.keys().sales_list(), FIRST_PAGE_TTL, || async move {
            let at = paging::list_moment();
            let rows = list::list_page(
                db,
                at,
                None,
                FIRST_PAGE_CACHED.with_one_more(),
                ListScope::Public,
            )
            .await?;
            Ok(FirstPage { at, rows })
        })
        .await?;
    Ok((page.at, page.rows))
}

/// The records of one page of the public list (no archived sale, no rehearsal):
/// the first page of up to [`FIRST_PAGE_CACHED`] through the cache (the hot one:
/// every home page and API client starts there), the others from Postgres. The
/// admin's lists are [`admin_page`].
pub async fn page_rows<S: CachedReads + ?Sized>(
    state: &S,
    after: Option<&SaleCursor>,
    limit: Limit,
) -> Result<Page<SaleRow>, AppError> {
    let (at, rows) = match after {
        None if limit.get() <= FIRST_PAGE_CACHED.get() => {
            let (at, mut rows) = first_page_rows(state).await?;
            rows.truncate(limit.as_usize() + 1);
            (at, rows)
        }
        None => {
            let at = paging::list_moment();
            (
                at,
                list::list_page(
                    state.db(),
                    at,
                    None,
                    limit.with_one_more(),
                    ListScope::Public,
                )
                .await?,
            )
        }
        Some(cursor) => (
            cursor.at,
            list::list_page(
                state.db(),
                cursor.at,
                Some(cursor),
                limit.with_one_more(),
                ListScope::Public,
            )
            .await?,
        ),
    };
    Ok(Page::from_rows(rows, limit, |last| {
        SaleCursor::after(last, at).encode()
    }))
}

/// One page of the admin's list of `scope`, from Postgres (never cached: the
/// admin sees a change at once), with live numbers.
pub async fn admin_page<S: CachedReads + ?Sized>(
    state: &S,
    after: Option<&SaleCursor>,
    limit: Limit,
    scope: ListScope,
) -> Result<Page<record::SaleView>, AppError> {
    let at = after.map_or_else(paging::list_moment, |c| c.at);
    let rows = list::list_page(state.db(), at, after, limit.with_one_more(), scope).await?;
    let page = Page::from_rows(rows, limit, |last| SaleCursor::after(last, at).encode());
    let mut items = numbers::views(&mut state.redis().clone(), state.keys(), page.items).await?;
    finished_draws(state, &mut items).await;
    Ok(Page {
        items,
        next: page.next,
    })
}

/// Drops the cached record of `id` and the cached first page of the list.
pub async fn invalidate<S: CachedReads + ?Sized>(state: &S, id: SaleId) -> Result<(), AppError> {
    let keys = state.keys();
    state
        .cache()
        .invalidate(&[keys.sale_view(id), keys.sales_list()])
        .await
}

/// One page of the sale list (the API's, the pages'): records as [`page_rows`]
/// reads them, live numbers; the cursor of the next page.
pub async fn load_page<S: CachedReads + ?Sized>(
    state: &S,
    after: Option<&SaleCursor>,
    limit: Limit,
) -> Result<Page<record::SaleView>, AppError> {
    let page = page_rows(state, after, limit).await?;
    let mut items = numbers::views(&mut state.redis().clone(), state.keys(), page.items).await?;
    finished_draws(state, &mut items).await;
    Ok(Page {
        items,
        next: page.next,
    })
}

/// One sale as the public may see it: 404 for a rehearsal unless `admin` (the
/// purchase, its ticket and the events read the record without this check, so a
/// rehearsal still sells to the load tool).
pub async fn load_public_view<S: CachedReads + ?Sized>(
    state: &S,
    id: SaleId,
    admin: bool,
) -> Result<record::SaleView, AppError> {
    match find_view(state, id).await? {
        Some(view) if admin || !view.sale.rehearsal => Ok(view),
        _ => Err(AppError::not_found(format!("no sale with id {id}"))),
    }
}

/// One sale: its cached record, live numbers; 404 when there is no such sale.
pub async fn load_view<S: CachedReads + ?Sized>(
    state: &S,
    id: SaleId,
) -> Result<record::SaleView, AppError> {
    find_view(state, id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no sale with id {id}")))
}

/// One sale: its cached record, live numbers; `None` when there is no such sale.
pub async fn find_view<S: CachedReads + ?Sized>(
    state: &S,
    id: SaleId,
) -> Result<Option<record::SaleView>, AppError> {
    let Some(row) = sale_row(state, id).await? else {
        return Ok(None);
    };
    let mut views = numbers::views(&mut state.redis().clone(), state.keys(), vec![row]).await?;
    finished_draws(state, &mut views).await;
    Ok(views.pop())
}

/// Marks the views of live draw sales whose draw finished (`draw_finished_at`:
/// their units left are for no one), from the cached moment (a second old at
/// most): one pipelined read for all of them, and a load only for a moment not
/// cached; nothing for the other sales, whose status says already whether they
/// sell. Best effort: a read that fails leaves the views as they are.
async fn finished_draws<S: CachedReads + ?Sized>(state: &S, views: &mut [record::SaleView]) {
    let now = Utc::now();
    let live: Vec<usize> = (0..views.len())
        .filter(|&i| {
            let v = &views[i];
            v.sale.is_draw()
                && v.sale.starts_at <= now
                && v.status == crate::domain::SaleStatus::Live
        })
        .collect();
    if live.is_empty() {
        return;
    }
    let keys: Vec<String> = live
        .iter()
        .map(|&i| state.keys().draw_finished(views[i].sale.id))
        .collect();
    let cached = match state
        .cache()
        .peek_many::<Option<DateTime<Utc>>>(&keys)
        .await
    {
        Ok(cached) => cached,
        Err(e) => {
            tracing::debug!(error = %e, "draws' finish not read for their views");
            return;
        }
    };
    for (&i, cached) in live.iter().zip(cached) {
        let id = views[i].sale.id;
        let at = match cached {
            Some(at) => at,
            None => match crate::sale::draw::publish::finished_at(state, id).await {
                Ok(at) => at,
                Err(e) => {
                    tracing::debug!(sale = %id, error = %e, "a draw's finish was not read for its view");
                    continue;
                }
            },
        };
        views[i].draw_finished_at = at;
    }
}
