//! The voter's pages: the list of polls and one poll with its live results, or
//! the words for results this caller may not see yet (no tally number is in the
//! page then). Votes go through the JSON API from `app.js`; results refresh from
//! the poll's event stream or `GET /api/polls/{id}/results`.

use actix_web::{HttpRequest, web};
use askama::Template;
use askama_web::WebTemplate;
use chrono::Utc;

use super::error::PageError;
use super::pages::{cursor_param, load_nav};
use super::view::{self, BallotView, MyBallot, Nav, OptionResult, PollCard, RunoffView};
use crate::domain::PollId;
use crate::error::AppError;
use crate::paging::{Limit, ListScope, Page};
use crate::state::AppState;
use crate::vote::cached::{add_runoff, cached_record};
use crate::vote::list::{self, PollCursor};
use crate::vote::store::{self, PollRecord, Results};
use crate::vote::visibility::{PollResults, Until, Viewer, decide};

#[derive(Template, WebTemplate)]
#[template(path = "polls.html")]
pub struct PollsPage {
    nav: Nav,
    polls: Vec<PollCard>,
    /// The next page of polls (`/polls?cursor=...`); none on the last.
    next_url: Option<String>,
    /// A page after the first: it offers the way back.
    later_page: bool,
}

/// Polls on one page of the polls page.
pub const POLLS_PAGE_POLLS: Limit = Limit::fixed(24);

/// One page of polls in the list order (open, upcoming, closed; see
/// `vote::list::list_page`).
pub async fn index(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<impl actix_web::Responder, PageError> {
    let (nav, user) = load_nav(&req, &state).await?;
    let cursor = cursor_param(&req);
    match page_of_cards(
        &state,
        cursor.as_deref(),
        POLLS_PAGE_POLLS,
        ListScope::Public,
        Viewer::from(user),
    )
    .await
    {
        Ok(page) => Ok(PollsPage {
            nav,
            polls: page.items,
            next_url: page.next.map(|next| format!("/polls?cursor={next}")),
            later_page: cursor.is_some(),
        }),
        Err(e) => Err(PageError::from_app(e, nav)),
    }
}

/// `limit` polls after `cursor` (a poll list's, else 400) with their live voter
/// counts, each card's note as `viewer` sees it (a voter of a poll that shows its
/// results after the vote is not told to vote): one query and one pipelined Redis
/// round trip.
pub(super) async fn page_of_cards(
    state: &AppState,
    cursor: Option<&str>,
    limit: Limit,
    scope: ListScope,
    viewer: Viewer,
) -> Result<Page<PollCard>, AppError> {
    let after = cursor.map(PollCursor::parse).transpose()?;
    let now = Utc::now();
    let page = list::page_with_voters(
        &state.db,
        &mut state.redis.clone(),
        &state.keys,
        after.as_ref(),
        limit,
        scope,
        viewer,
        |id| crate::vote::cached::PollReads::recovering(state, id),
    )
    .await?;
    Ok(page.map(|(poll, voters, voted)| PollCard::new(poll, voters, voted, now)))
}

#[derive(Template, WebTemplate)]
#[template(path = "poll.html")]
pub struct PollPage {
    nav: Nav,
    poll: PollCard,
    options: Vec<OptionResult>,
    /// What the percentages are of (at least the voters).
    total: i64,
    voters_text: String,
    /// The server's clock when rendering, so the countdown can correct for skew.
    server_now_ms: i64,
    signed_in: bool,
    /// The poll's ballot kind and settings, and the rule in words.
    ballot: BallotView,
    /// The caller's ballot as it counts now (nothing when signed out).
    mine: MyBallot,
    /// The caller's first choice (single: the option); 0 when they have not voted.
    voted_option: i64,
    /// single: the option voted for, in words.
    voted_label: Option<String>,
    signin_url: String,
    /// What the page says instead of the tallies, when this caller may not see
    /// them yet (`None`: the tallies show).
    hidden_text: Option<&'static str>,
    /// The `until` of hidden results (`vote`, `close`, `reveal`), empty when shown.
    hidden_until: &'static str,
    /// A closed ranked poll's count by rounds, when its results show.
    runoff: Option<RunoffView>,
}

pub async fn poll(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<impl actix_web::Responder, PageError> {
    let (nav, user) = load_nav(&req, &state).await?;
    let Ok(id) = PollId::parse(&path) else {
        return Err(PageError::not_found(
            nav,
            "Poll addresses end in a number, like /polls/1.",
        ));
    };
    let (record, results) = match load_poll(&state, id).await {
        Ok(Some(found)) => found,
        Ok(None) => return Err(PageError::not_found(nav, "There is no such poll.")),
        Err(e) => return Err(PageError::from_app(e, nav)),
    };
    // One HGET of the voters hash: the page knows without Postgres whether, and
    // how, the caller voted.
    let kind = record.poll.ballot;
    let mine = match user {
        Some(user) => {
            match store::voter_ballot(&mut state.redis.clone(), &state.keys, id, user.id).await {
                Ok(held) => MyBallot::from_held(kind, held.as_deref()),
                Err(e) => return Err(PageError::from_app(e.into(), nav)),
            }
        }
        None => MyBallot::default(),
    };
    let voted_option = mine
        .choices
        .first()
        .or(mine.spent.first().map(|(o, _)| o))
        .copied()
        .unwrap_or(0);
    let voted_label = record
        .options
        .iter()
        .find(|o| o.id == voted_option && kind == crate::vote::setting::BallotKind::Single)
        .map(|o| o.label.clone());
    let mut ballot = BallotView::new(record.poll.ballot_settings(), record.options.len());
    let now = Utc::now();
    let viewer = Viewer::from(user);
    let mut results = decide(&record.poll, results, viewer, mine.voted, now);
    // A closed ranked poll's count by rounds, shown without script as the API's
    // results carry it.
    if let Err(e) = add_runoff(state.get_ref(), &record, &mut results, now).await {
        return Err(PageError::from_app(e, nav));
    }
    let options: Vec<(i64, String)> = record
        .options
        .into_iter()
        .map(|o| (o.id, o.label))
        .collect();
    let runoff = match &results {
        PollResults::Shown(shown) => shown
            .runoff
            .as_ref()
            .map(|counted| RunoffView::new(counted, &options)),
        PollResults::Hidden(_) => None,
    };
    let (options, total) = view::option_results(options, &results);
    let poll = PollCard::new(record.poll, results.voters(), mine.voted, now);
    let closed = poll.status == crate::domain::PollStatus::Closed;
    if closed {
        ballot.closed(results.until().is_none());
    }
    Ok(PollPage {
        signed_in: nav.user.is_some(),
        nav,
        hidden_text: results.until().map(|u| view::hidden_words(u, closed)),
        hidden_until: results.until().map_or("", Until::as_str),
        poll,
        options,
        total,
        voters_text: view::voters_text(results.voters()),
        server_now_ms: now.timestamp_millis(),
        ballot,
        mine,
        voted_option,
        voted_label,
        signin_url: format!("/signin?next=%2Fpolls%2F{id}"),
        runoff,
    })
}

/// The record from Postgres and the live results from Redis. A poll that Redis
/// does not know (wiped) is rebuilt, and the page answers 503 `recovering`
/// meanwhile, as the API does.
async fn load_poll(
    state: &AppState,
    id: PollId,
) -> Result<Option<(PollRecord, Results)>, AppError> {
    let Some(record) = cached_record(state, id).await? else {
        return Ok(None);
    };
    match store::results(&mut state.redis.clone(), &state.keys, id).await? {
        Some(results) => Ok(Some((record, results))),
        None => Err(crate::vote::cached::missing_from_redis(state, id).await),
    }
}
