//! The vote (`POST /api/polls/{id}/votes`, every ballot kind, with an optional
//! `Idempotency-Key`): the body checked into a ballot (`vote::ballot`), the poll's
//! gates passed, the batch's decision answered. The voter's own ballot is `mine.rs`.

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;
use uuid::Uuid;

use crate::auth::AuthUser;
use crate::domain::{PollId, PurchaseKey};
use crate::error::{AppError, ErrorBody, ErrorCode};
use crate::limit::Route;
use crate::metrics::Metrics;
use crate::recover::Target;
use crate::state::AppState;
use crate::vote::ballot::{VoteBody, invalid_for, unknown_option};
use crate::vote::cached::missing_from_redis;
use crate::vote::cast::{Ballot, VoteOutcome, VoteReply, VoteRequest};
use crate::vote::receipt::receipt_keyed;

#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct VoteAccepted {
    /// Always `accepted`.
    status: &'static str,
    #[schema(value_type = i64)]
    poll_id: PollId,
    /// The option (single, budget), or the first choice (multi, ranked).
    option_id: i64,
    /// multi: the options chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    option_ids: Option<Vec<i64>>,
    /// ranked: the ranking, most preferred first.
    #[serde(skip_serializing_if = "Option::is_none")]
    ranking: Option<Vec<i64>>,
    /// budget: the votes this request spent.
    #[serde(skip_serializing_if = "Option::is_none")]
    count: Option<u32>,
    /// This vote's receipt (see `GET /api/polls/{id}/my-ballot`).
    receipt: Uuid,
    /// This ballot replaced the voter's earlier one (`allow_change`).
    replaced: bool,
    /// budget: votes the voter has left.
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining: Option<i64>,
    /// budget: votes the voter may still give this option.
    #[serde(skip_serializing_if = "Option::is_none")]
    option_remaining: Option<i64>,
}

/// A budget refusal: the error body with the numbers left (`budget_spent`,
/// `over_budget`).
#[derive(Serialize)]
pub(super) struct BudgetRefusal {
    /// `budget_spent` or `over_budget`.
    error: &'static str,
    message: String,
    remaining: i64,
    option_remaining: i64,
}

/// A vote: one ballot per voter (a `single`, `multi` or `ranked` poll; with
/// `allow_change` a later ballot replaces it), or a `budget` poll's votes spent
/// over as many requests as the voter likes. All or nothing.
#[utoipa::path(post, path = "/api/polls/{id}/votes", tag = "polls", params(
    ("id" = i64, Path, description = "The poll id, a positive integer", minimum = 1),
    ("Idempotency-Key" = Option<String>, Header, description = "Optional: 1 to 64 of `[A-Za-z0-9_.:-]`; a retry with the same key and body answers the first answer (with `Idempotent-Replayed: true`), never counts twice"),
), request_body = VoteBody, security(("bearer" = [])), responses(
    (status = 202, description = "Accepted", body = VoteAccepted, headers(
        ("RateLimit" = String), ("RateLimit-Policy" = String),
        ("Idempotent-Replayed" = String, description = "`true` when this is the first answer to the key, again"))),
    (status = 400, description = "`invalid_idempotency_key`", body = ErrorBody<'static>),
    (status = 403, description = "`account_too_new` (the poll's `min_account_age_s`; `allowed_at` when the account may before the close), `proof_invalid` or `proof_used` (the poll's `proof_of_work`)", body = ErrorBody<'static>),
    (status = 404, description = "`not_found`: no such poll", body = ErrorBody<'static>),
    (status = 428, description = "`proof_required`: the poll asks for a `Proof-Of-Work` header with each vote (see `GET /api/polls/{id}/challenge`)", body = ErrorBody<'static>),
    (status = 409, description = "`already_voted` (one ballot per voter, no `allow_change`), `budget_spent` (the body also carries `remaining` and `option_remaining`), or `not_open` (with `Retry-After`: seconds until it opens)", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "With `not_open`: seconds until the poll opens"))),
    (status = 410, description = "`closed`", body = ErrorBody<'static>),
    (status = 422, description = "`invalid_ballot` (the wrong shape for the poll's kind, a repeated option, too many), `unknown_option` (an option of another poll, or none), `over_budget` (more than is left overall or for the option; the body also carries `remaining` and `option_remaining`), `idempotency_key_reused` (the key was first sent with another ballot), `rate_limit_unsatisfiable`, `invalid_body`", body = ErrorBody<'static>),
    (status = 429, description = "`rate_limited`: a vote limit refused", body = ErrorBody<'static>, headers(
        ("Retry-After" = u32, description = "Seconds until a retry may pass"),
        ("RateLimit" = String), ("RateLimit-Policy" = String))),
))]
pub(super) async fn vote(
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, AppError> {
    // Borrowed and read by hand, not extracted (as the purchase; see
    // `state_and_worker`, and `web::Json` reserves 8 KiB per request). The answers
    // are the extractors': the caller first, then the body.
    let (state, worker) = crate::routes::extract::state_and_worker(&req)?;
    let user = AuthUser::of(&req)?;
    let body: VoteBody = crate::conn::json_body(
        &req,
        payload,
        state.config.max_body_bytes,
        state.config.body_timeout,
    )
    .await?;
    let poll = PollId::parse(req.match_info().get("id").unwrap_or_default())?;
    let key = req
        .headers()
        .get("idempotency-key")
        .map(|v| PurchaseKey::parse(v.as_bytes()))
        .transpose()?;
    let ballot = body.ballot()?;
    let proof = crate::routes::fair::pass_vote(state, &req, &user, poll).await?;
    // Per-user and per-IP limits against vote stuffing, checked inside the vote
    // script: a refused vote is recorded by no policy and changes no tally.
    let ip = state
        .limiter
        .limits()
        .counts_ip(Route::Vote)
        .then(|| state.limiter.client_ip(&req));
    let reply = worker
        .votes
        .submit(
            poll,
            VoteRequest {
                user: user.id,
                ballot: ballot.clone(),
                key,
                ip,
            },
        )
        .await;
    // A limit refused it, or Redis said it decided nothing (the poll not loaded
    // or being rebuilt: a 503 whose retry may send the same proof). Not after a
    // batch that got no answer: the vote may have counted (a reply cut off), and
    // Redis is likely out of reach for the give-back too.
    let give_back = matches!(
        &reply,
        Ok(r) if matches!(
            r.outcome,
            VoteOutcome::RateLimited { .. }
                | VoteOutcome::RateLimitUnsatisfiable
                | VoteOutcome::NotLoaded
                | VoteOutcome::Recovering
        )
    );
    if give_back {
        proof.give_back(state, &req).await;
    }
    let reply = reply?;
    Metrics::inc(match reply.outcome {
        VoteOutcome::Accepted { .. } if !reply.replayed => &state.metrics.vote_accepted,
        _ => &state.metrics.vote_refused,
    });
    let replayed = reply.replayed;
    let answer = vote_answer(state, poll, user.id, ballot, reply).await;
    if !replayed {
        return answer;
    }
    match answer {
        Ok(mut response) => {
            response.headers_mut().insert(
                header::HeaderName::from_static("idempotent-replayed"),
                header::HeaderValue::from_static("true"),
            );
            Ok(response)
        }
        Err(e) => Err(e.with_header(
            header::HeaderName::from_static("idempotent-replayed"),
            "true",
        )),
    }
}

/// The answer to a vote the batch decided: 202, or the refusal.
async fn vote_answer(
    state: &AppState,
    poll: PollId,
    user: crate::domain::UserId,
    ballot: Ballot,
    reply: VoteReply,
) -> Result<HttpResponse, AppError> {
    let outcome = reply.outcome;
    // The RateLimit headers of a 202, or the 429 (422) of a refusal by a limit;
    // other refusals carry no RateLimit headers (as in the purchase).
    let judged = || {
        let policies = state.limiter.limits().for_route(Route::Vote);
        let decided: Vec<_> = policies.iter().zip(reply.limits.iter().copied()).collect();
        state.limiter.judge(&decided)
    };
    let budget = |status: StatusCode, error: &'static str, message: String, left: (i64, i64)| {
        HttpResponse::build(status).json(BudgetRefusal {
            error,
            message,
            remaining: left.0,
            option_remaining: left.1,
        })
    };
    match outcome {
        VoteOutcome::Accepted {
            seq,
            replaced,
            remaining,
            option_remaining,
            ..
        } => {
            let is_budget = matches!(ballot, Ballot::Budget { .. });
            let body = VoteAccepted {
                status: "accepted",
                poll_id: poll,
                option_id: ballot.first(),
                receipt: receipt_keyed(state.tokens.mac(), poll, user, seq),
                replaced,
                remaining: is_budget.then_some(remaining),
                option_remaining: is_budget.then_some(option_remaining),
                count: match &ballot {
                    Ballot::Budget { count, .. } => Some(*count),
                    _ => None,
                },
                option_ids: match &ballot {
                    Ballot::Multi(ids) => Some(ids.clone()),
                    _ => None,
                },
                ranking: match ballot {
                    Ballot::Ranked(ids) => Some(ids),
                    _ => None,
                },
            };
            Ok(judged()?.attach(HttpResponse::Accepted().json(body)))
        }
        VoteOutcome::AlreadyVoted => Err(AppError::new(
            ErrorCode::AlreadyVoted,
            "you already voted in this poll (one ballot per person)",
        )),
        VoteOutcome::BudgetSpent { option_remaining } => Ok(budget(
            StatusCode::CONFLICT,
            "budget_spent",
            "you have spent every vote this poll gives you".into(),
            (0, option_remaining),
        )),
        VoteOutcome::OverBudget {
            remaining,
            option_remaining,
        } => Ok(budget(
            StatusCode::UNPROCESSABLE_ENTITY,
            "over_budget",
            format!(
                "more votes than you have left: {remaining} in all, {option_remaining} for this option; nothing was spent"
            ),
            (remaining, option_remaining),
        )),
        VoteOutcome::InvalidBallot => Err(invalid_for(state, poll).await),
        VoteOutcome::KeyReused => Err(AppError::new(
            ErrorCode::IdempotencyKeyReused,
            "this Idempotency-Key was first sent with another ballot; use a new key for a new vote",
        )),
        VoteOutcome::UnknownOption => Err(unknown_option()),
        VoteOutcome::NotOpen { opens_in_ms } => {
            let secs = (opens_in_ms + 999) / 1000;
            Err(AppError::new(
                ErrorCode::NotOpen,
                format!("this poll is not open yet; it opens in {secs} s"),
            )
            .with_header(header::RETRY_AFTER, secs.max(1).to_string()))
        }
        VoteOutcome::Closed => Err(AppError::new(ErrorCode::Closed, "this poll is closed")),
        VoteOutcome::NotLoaded => Err(missing_from_redis(state, poll).await),
        VoteOutcome::Recovering => Err(state.recovery.recovering(Target::Poll(poll))),
        VoteOutcome::RateLimited { .. } | VoteOutcome::RateLimitUnsatisfiable => {
            let _no_policy_refused = judged()?;
            Err(AppError::Internal(anyhow::anyhow!(
                "a rate-limited vote came back with no refusing policy"
            )))
        }
    }
}
