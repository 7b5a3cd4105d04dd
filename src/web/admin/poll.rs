//! A poll's admin page (`/admin/polls/{id}`): live and settled tallies (whatever
//! the poll's `results` setting), when they become public and the reveal button,
//! the edit form and the record of admin changes.

use actix_web::{Either, HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;
use chrono::Utc;

use super::admin_nav;
use super::history::{HISTORY_SHOWN, HistoryRow};
use crate::domain::{PollId, PollStatus};
use crate::state::AppState;
use crate::vote::store::PollRow;
use crate::vote::visibility::{ResultsVisibility, Viewer};
use crate::web::error::PageError;
use crate::web::view::{
    BallotForm, Moment, Nav, PollCard, ResultsChoice, option_results, results_choices,
    results_words,
};

#[derive(Template, WebTemplate)]
#[template(path = "admin_poll.html")]
pub struct PollTalliesPage {
    nav: Nav,
    poll: PollCard,
    options: Vec<TallyRow>,
    live_voters: i64,
    settled_voters: i64,
    /// Not open yet: the edit form is offered.
    editable: bool,
    /// Options one per line, for the edit form.
    options_text: String,
    archived_at: Option<Moment>,
    /// Someone voted: delete is not offered.
    has_votes: bool,
    history: Vec<HistoryRow>,
    /// The `results` setting in words.
    results_setting: &'static str,
    /// The edit form's choices of the setting.
    results_choices: Vec<ResultsChoice>,
    /// The edit form's ballot settings, as the poll has them.
    ballot_form: BallotForm,
    /// When voters and visitors see the tallies.
    public_when: String,
    /// An `on_reveal` poll, closed and not revealed: the reveal button is offered.
    revealable: bool,
}

/// When the tallies become public, as of now.
fn public_when(poll: &PollRow, closed: bool) -> String {
    match (poll.results, poll.revealed_at) {
        (ResultsVisibility::Live, _) => "Public now: everyone sees the results live.".into(),
        (ResultsVisibility::AfterVote, _) => {
            "Only voters see the results, each once they have voted; others never do.".into()
        }
        (ResultsVisibility::AfterClose, _) if closed => "Public now: the poll is closed.".into(),
        (ResultsVisibility::AfterClose, _) => {
            "Hidden until the poll closes; then everyone sees them.".into()
        }
        (ResultsVisibility::OnReveal, Some(at)) => {
            format!(
                "Public since you revealed them ({}).",
                Moment::from(at).text
            )
        }
        (ResultsVisibility::OnReveal, None) if closed => {
            "Hidden until you reveal them: the poll is closed, so you can now.".into()
        }
        (ResultsVisibility::OnReveal, None) => {
            "Hidden until you reveal them; you can once the poll has closed.".into()
        }
    }
}

pub struct TallyRow {
    /// The option's id: the page script finds its row by it.
    pub id: i64,
    pub label: String,
    pub live: i64,
    pub settled: i64,
    pub percent: i64,
}

impl TallyRow {
    /// Votes counted in Redis that the settlement worker has not written yet.
    pub fn unsettled(&self) -> i64 {
        (self.live - self.settled).max(0)
    }
}

/// A poll's tallies for the admin: live (Redis) and settled (Postgres) per option.
pub async fn poll_tallies(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<Either<PollTalliesPage, HttpResponse>, PageError> {
    let nav = match admin_nav(&req, &state, "/admin").await? {
        Ok(nav) => nav,
        Err(redirect) => return Ok(Either::Right(redirect)),
    };
    let Ok(id) = PollId::parse(&path) else {
        return Err(PageError::not_found(
            nav,
            "Poll addresses end in a number, like /admin/polls/1.",
        ));
    };
    let view = match crate::vote::load_view(&state, id, Viewer::Admin).await {
        Ok(view) => view,
        Err(e) => return Err(PageError::from_app(e, nav)),
    };
    let (settled, settled_voters) =
        match crate::vote::store::settled_tallies_and_voters(&state.db, id).await {
            Ok(counts) => counts,
            Err(e) => return Err(PageError::from_app(e.into(), nav)),
        };
    let options: Vec<(i64, String)> = view
        .record
        .options
        .iter()
        .map(|o| (o.id, o.label.clone()))
        .collect();
    let settled_of = |option: i64| {
        settled
            .iter()
            .find(|(id, _)| *id == option)
            .map_or(0, |(_, n)| *n)
    };
    let options_text = options
        .iter()
        .map(|(_, label)| label.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let history = match crate::audit::history(
        &state.db,
        crate::audit::Subject::Poll(id),
        HISTORY_SHOWN,
    )
    .await
    {
        Ok(rows) => rows,
        Err(e) => return Err(PageError::from_app(e, nav)),
    };
    let (results, _) = option_results(options, &view.results);
    let rows = results
        .into_iter()
        .map(|r| TallyRow {
            id: r.id,
            settled: settled_of(r.id),
            label: r.label,
            live: r.votes,
            percent: r.percent,
        })
        .collect();
    let poll = &view.record.poll;
    let now = Utc::now();
    let closed = view.status == PollStatus::Closed;
    Ok(Either::Left(PollTalliesPage {
        nav,
        editable: poll.opens_at > now && !poll.closed,
        options_text,
        archived_at: poll.archived_at.map(Moment::from),
        has_votes: view.results.voters() > 0 || settled_voters > 0,
        history: history.iter().map(Into::into).collect(),
        live_voters: view.results.voters(),
        settled_voters,
        results_setting: results_words(poll.results),
        results_choices: results_choices(),
        ballot_form: BallotForm::new("edit", poll.ballot_settings()),
        public_when: public_when(poll, closed),
        revealable: poll.results == ResultsVisibility::OnReveal
            && closed
            && poll.revealed_at.is_none(),
        poll: PollCard::new(view.record.poll, view.results.voters(), false, now),
        options: rows,
    }))
}
