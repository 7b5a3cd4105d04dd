//! The fair-opening gates ([`crate::gate`]) as the routes ask them: a sale's or
//! poll's gates as this process knows them ([`sale_gates`], [`poll_gates`]), and
//! [`pass`], which the join, the ticket, the purchase, the vote (and a draw's
//! entry) call before they act. The challenges to solve are `challenge.rs`.

use actix_web::HttpRequest;
use chrono::Utc;

use super::extract::redis_of;
use crate::auth::AuthUser;
use crate::domain::{PollId, SaleId};
use crate::error::{AppError, ErrorCode};
use crate::gate::proof::{self, ProofError};
use crate::gate::{Gates, Subject, age};
use crate::state::AppState;

/// The header a proof comes in.
pub const PROOF_HEADER: &str = "proof-of-work";

/// Now, in unix ms: the clock the gates and the challenges are read by.
pub(super) fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// A sale's gates: from this process's memory, else its cached record (404 when
/// there is no such sale).
pub(crate) async fn sale_gates(state: &AppState, sale: SaleId) -> Result<Gates, AppError> {
    let now = now_ms();
    if let Some(gates) = state.gates.sales.get(sale, now) {
        return Ok(gates);
    }
    let row = crate::sale::cached::sale_row(state, sale)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no sale with id {sale}")))?;
    let gates = Gates::new(
        row.proof_of_work,
        row.min_account_age_s,
        row.starts_at,
        row.waiting_room,
        row.entries_open_at.filter(|_| row.is_draw()),
    );
    state.gates.sales.remember(sale, gates, now);
    Ok(gates)
}

/// A poll's gates, the same way.
pub(crate) async fn poll_gates(state: &AppState, poll: PollId) -> Result<Gates, AppError> {
    let now = now_ms();
    if let Some(gates) = state.gates.polls.get(poll, now) {
        return Ok(gates);
    }
    let record = crate::vote::cached::cached_record(state, poll)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no poll with id {poll}")))?;
    let p = &record.poll;
    let gates = Gates::new(
        p.proof_of_work,
        p.min_account_age_s,
        p.opens_at,
        false,
        None,
    );
    state.gates.polls.remember(poll, gates, now);
    Ok(gates)
}

/// Whether the caller may take this step: the account's age (403
/// `account_too_new`), then, when `with_proof`, the `Proof-Of-Work` header (428
/// `proof_required`, 403 `proof_invalid`), checked without I/O. The proof is used
/// up (403 `proof_used`) by [`Unspent::spend`], which the route calls once its
/// limits let the request through. Nothing to do, and nothing read, when the sale
/// or poll asks for neither.
pub(crate) async fn pass(
    state: &AppState,
    req: &HttpRequest,
    user: &AuthUser,
    subject: Subject,
    gates: Gates,
    with_proof: bool,
) -> Result<Unspent, AppError> {
    if gates.none() {
        return Ok(Unspent(None));
    }
    let now = now_ms();
    if gates.min_account_age_s > 0 {
        let created = state
            .gates
            .ages
            .created(&state.db, user.id, user.created_at)
            .await?;
        if let Err(allowed_s) = age::check(&gates, created, now) {
            return Err(age::too_new(allowed_s, closes_ms(state, subject).await?));
        }
    }
    if with_proof && gates.proof_of_work > 0 {
        let Some(sent) = req.headers().get(PROOF_HEADER) else {
            return Err(proof_required(subject));
        };
        let solved = state
            .gates
            .challenges
            .verify(sent.as_bytes(), subject, user.id, gates.proof_of_work, now)
            .map_err(proof_invalid)?;
        return Ok(Unspent(Some((subject, solved))));
    }
    Ok(Unspent(None))
}

/// A proof of work [`pass`] found good and has not used up yet: the route spends
/// it once its limits have let the request through, so a limit's refusal does not
/// cost the client its proof. Nothing to spend without one.
#[must_use = "a checked proof must be spent (`Unspent::spend`) before the request acts"]
pub(crate) struct Unspent(Option<(Subject, proof::Solved)>);

impl Unspent {
    /// Uses the proof up (one `SET NX`, across servers): 403 `proof_used` when it
    /// was used already.
    pub(crate) async fn spend(self, state: &AppState, req: &HttpRequest) -> Result<(), AppError> {
        self.spend_returnable(state, req).await.map(drop)
    }

    /// [`Unspent::spend`], keeping what it takes to give the proof back.
    async fn spend_returnable(
        self,
        state: &AppState,
        req: &HttpRequest,
    ) -> Result<Spent, AppError> {
        let Some((subject, solved)) = self.0 else {
            return Ok(Spent(None));
        };
        let mut redis = redis_of(req, state);
        if !proof::claim(&mut redis, &state.keys, subject, &solved, now_ms()).await? {
            return Err(AppError::new(
                ErrorCode::ProofUsed,
                "this challenge was used already: get a new one",
            ));
        }
        Ok(Spent(Some((subject, solved))))
    }
}

/// A proof of work a vote used up before its batch decided (a vote's limits are
/// decided inside the batch, after the proof): [`Spent::give_back`] when a limit
/// refused the vote, or when Redis decided nothing (the poll not loaded or being
/// rebuilt), so that a limit's refusal does not cost the voter their proof, as on
/// the join, ticket and entry routes.
pub(crate) struct Spent(Option<(Subject, proof::Solved)>);

impl Spent {
    /// Makes the proof good again (its used key deleted). Best effort: a failure
    /// leaves it used, as it was before this existed, and is logged.
    pub(crate) async fn give_back(self, state: &AppState, req: &HttpRequest) {
        let Some((subject, solved)) = self.0 else {
            return;
        };
        let mut redis = redis_of(req, state);
        if let Err(e) = proof::release(&mut redis, &state.keys, subject, &solved).await {
            tracing::warn!(error = %e, "a refused vote's proof of work stays used: Redis did not take it back");
        }
    }
}

/// [`pass`] for a vote: the poll's gates (a map lookup once it is open, nothing
/// more when it has none), the proof included.
pub(crate) async fn pass_vote(
    state: &AppState,
    req: &HttpRequest,
    user: &AuthUser,
    poll: PollId,
) -> Result<Spent, AppError> {
    let gates = poll_gates(state, poll).await?;
    // (A vote's limits are decided in its batch, after this: the proof is spent
    // here, and given back if a limit refuses the vote, see `Spent`.)
    pass(state, req, user, Subject::Poll(poll), gates, true)
        .await?
        .spend_returnable(state, req)
        .await
}

/// When the sale or poll closes (unix ms), read fresh for a refusal's
/// `allowed_at` (an open sale's end may move later).
async fn closes_ms(state: &AppState, subject: Subject) -> Result<i64, AppError> {
    let closes = match subject {
        // A draw's entries close at the draw (its `starts_at`): a moment after it
        // would name a time its entry route refuses.
        Subject::Sale(id) => crate::sale::cached::sale_row(state, id).await?.map(|row| {
            match (row.closed, row.is_draw()) {
                (true, _) => None,
                (false, true) => Some(row.starts_at.min(row.ends_at)),
                (false, false) => Some(row.ends_at),
            }
        }),
        Subject::Poll(id) => crate::vote::cached::cached_record(state, id)
            .await?
            .map(|r| {
                if r.poll.closed {
                    None
                } else {
                    Some(r.poll.closes_at)
                }
            }),
    };
    Ok(closes
        .flatten()
        .map_or(i64::MIN, |at| at.timestamp_millis()))
}

fn challenge_path(subject: Subject) -> String {
    match subject {
        Subject::Sale(id) => format!("/api/sales/{id}/challenge"),
        Subject::Poll(id) => format!("/api/polls/{id}/challenge"),
    }
}

fn proof_required(subject: Subject) -> AppError {
    AppError::new(
        ErrorCode::ProofRequired,
        format!(
            "this needs a proof of work: GET {} and send Proof-Of-Work: <challenge>:<nonce>",
            challenge_path(subject)
        ),
    )
}

fn proof_invalid(e: ProofError) -> AppError {
    AppError::new(
        ErrorCode::ProofInvalid,
        format!("the proof of work does not hold: {e}"),
    )
}
