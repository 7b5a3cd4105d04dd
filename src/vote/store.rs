//! The Rust side of the poll scripts and the poll tables.

use std::collections::HashMap;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;
use serde::Serialize;
use sqlx::PgPool;

use super::setting::{BallotKind, BallotSettings, ResultsVisibility};
use crate::domain::{Id, PollId, UserId};
use crate::error::AppError;
use crate::keys::Keys;
use crate::lua::lua_script;
use crate::settle::ensure_group;

static NEW_POLL: LazyLock<crate::lua::Script> = lua_script!("new_poll.lua");

#[derive(Clone, Debug, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct PollRow {
    pub id: i64,
    pub question: String,
    pub opens_at: DateTime<Utc>,
    pub closes_at: DateTime<Utc>,
    pub closed: bool,
    /// When an admin closed the poll (none: not closed, or closed before this was
    /// kept). Before `closes_at`: closed early. (Default: records cached before it
    /// existed.)
    #[serde(default)]
    pub closed_at: Option<DateTime<Utc>>,
    /// When an admin archived the poll: off the public lists, still reachable by
    /// link. (Default: records cached before archiving existed.)
    #[serde(default)]
    pub archived_at: Option<DateTime<Utc>>,
    /// Who sees the tallies when (the `results` setting of a create or an edit;
    /// named apart from the view's `results`, the tallies themselves).
    #[serde(rename = "results_visibility")]
    pub results: ResultsVisibility,
    /// When an admin revealed the results of an `on_reveal` poll.
    pub revealed_at: Option<DateTime<Utc>>,
    /// What a voter sends: `single`, `multi`, `budget` or `ranked`. (Defaults:
    /// records cached before ballot kinds existed.)
    #[serde(default)]
    pub ballot: BallotKind,
    /// `multi` and `ranked`: most options on one ballot.
    #[serde(default)]
    pub max_choices: Option<i32>,
    /// `budget`: votes each voter may spend.
    #[serde(default)]
    pub votes_per_user: Option<i32>,
    /// `budget`: most votes of one voter on one option.
    #[serde(default)]
    pub max_per_option: Option<i32>,
    /// A later ballot replaces the voter's earlier one until the close.
    #[serde(default)]
    pub allow_change: bool,
    /// Leading zero bits of the proof of work asked with each vote (see
    /// [`crate::gate`]); 0: none. (Defaults: records cached before it existed.)
    #[serde(default)]
    pub proof_of_work: i16,
    /// Least age of an account that may vote, seconds before the opening (see
    /// [`crate::gate::age`]); 0: any.
    #[serde(default)]
    pub min_account_age_s: i32,
}

impl PollRow {
    /// The poll's ballot settings.
    pub fn ballot_settings(&self) -> BallotSettings {
        BallotSettings {
            kind: self.ballot,
            max_choices: self.max_choices,
            votes_per_user: self.votes_per_user,
            max_per_option: self.max_per_option,
            allow_change: self.allow_change,
        }
    }
}

#[derive(Clone, Debug, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct OptionRow {
    pub id: i64,
    pub label: String,
    pub position: i32,
}

/// A poll's record: question, window and options (what a cache may hold).
#[derive(Clone, Debug, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct PollRecord {
    #[serde(flatten)]
    pub poll: PollRow,
    pub options: Vec<OptionRow>,
}

/// What names the contents of a poll's voters hash, the same on every server: the
/// meta hash's `rebuilt` (the token of the rebuild that made the poll's state,
/// none for a poll never rebuilt) and `changes` (the batches that wrote a ballot
/// since; see `lua/vote_batch.lua`), and the number of voters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    pub rebuilt: Option<String>,
    pub changes: i64,
    pub voters: i64,
}

/// Live results, from Redis only.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Results {
    pub poll_id: i64,
    /// Closed: as Redis holds it, an admin's early close; as a caller gets it
    /// ([`super::visibility::decide`]), also a poll past its `closes_at` by the
    /// server's clock.
    pub closed: bool,
    /// Always `false` here: hidden results are a `HiddenResults`.
    pub hidden: bool,
    pub voters: i64,
    /// Option id -> votes, every option present (0 when none). A ranked poll
    /// counts first preferences.
    pub tallies: Vec<Tally>,
    /// A closed `ranked` poll: the instant-runoff result (rounds, eliminations,
    /// winner).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runoff: Option<super::runoff::Runoff>,
    /// What names the ballots these results were read with (not shown): the
    /// runoff is counted again when it moves.
    #[serde(skip)]
    pub stamp: Stamp,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Tally {
    pub option_id: i64,
    pub votes: i64,
}

pub fn status(poll: &PollRow, now: DateTime<Utc>) -> crate::domain::PollStatus {
    crate::domain::PollStatus::of(poll.closed, now, poll.opens_at, poll.closes_at)
}

pub struct NewPoll {
    pub question: String,
    pub options: Vec<String>,
    pub opens_at: DateTime<Utc>,
    pub closes_at: DateTime<Utc>,
    pub results: ResultsVisibility,
    pub ballot: BallotSettings,
    /// `proof_of_work` and `min_account_age_s` (not sent: 0, off).
    pub fairness: crate::gate::Fairness,
}

/// Inserts poll and options and loads them into Redis in one transaction: if Redis
/// refuses, nothing is written.
pub async fn create_poll<C: ConnectionLike>(
    db: &PgPool,
    redis: &mut C,
    keys: &Keys,
    new: NewPoll,
    admin: Option<UserId>,
) -> Result<PollRecord, AppError> {
    let mut tx = db.begin().await?;
    let poll = sqlx::query_as::<_, PollRow>(concat!(
        "INSERT INTO polls (question, opens_at, closes_at, results, ballot, max_choices,
                            votes_per_user, max_per_option, allow_change, proof_of_work,
                            min_account_age_s)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         RETURNING ",
        poll_columns!()
    ))
    .bind(&new.question)
    .bind(new.opens_at)
    .bind(new.closes_at)
    .bind(new.results.as_str())
    .bind(new.ballot.kind.as_str())
    .bind(new.ballot.max_choices)
    .bind(new.ballot.votes_per_user)
    .bind(new.ballot.max_per_option)
    .bind(new.ballot.allow_change)
    .bind(new.fairness.proof_of_work.unwrap_or(0))
    .bind(new.fairness.min_account_age_s.unwrap_or(0))
    .fetch_one(&mut *tx)
    .await?;
    let positions: Vec<i32> = (1..=new.options.len() as i32).collect();
    let options = sqlx::query_as::<_, OptionRow>(
        "INSERT INTO poll_options (poll_id, label, position)
         SELECT $1, label, position FROM UNNEST($2::text[], $3::int4[]) AS t(label, position)
         RETURNING id, label, position",
    )
    .bind(poll.id)
    .bind(&new.options)
    .bind(&positions)
    .fetch_all(&mut *tx)
    .await?;
    let record = PollRecord { poll, options };
    let id = poll_id(record.poll.id)?;
    if let Some(admin) = admin {
        let after = serde_json::to_value(&record).map_err(|e| AppError::Internal(e.into()))?;
        crate::audit::record(
            &mut tx,
            crate::audit::Change {
                admin,
                action: crate::audit::Action::Create,
                subject: crate::audit::Subject::Poll(id),
                before: None,
                after: Some(after),
            },
        )
        .await?;
    }
    let k = keys.poll(id);
    let mut inv = NEW_POLL.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.options)
        .arg(record.poll.opens_at.timestamp_millis())
        .arg(record.poll.closes_at.timestamp_millis())
        .arg(u8::from(record.poll.closed))
        .arg(record.poll.ballot_settings().redis_field());
    for option in &record.options {
        inv.arg(option.id);
    }
    let _: i64 = inv.invoke_async(redis).await?;
    ensure_group(redis, &k.votes).await?;
    tx.commit().await?;
    Ok(record)
}

pub(crate) fn poll_id(raw: i64) -> Result<PollId, AppError> {
    Id::new(raw).ok_or_else(|| AppError::Internal(anyhow::anyhow!("poll id {raw} not positive")))
}

pub async fn fetch_record(db: &PgPool, id: PollId) -> Result<Option<PollRecord>, sqlx::Error> {
    let Some(poll) = sqlx::query_as::<_, PollRow>(concat!(
        "SELECT ",
        poll_columns!(),
        " FROM polls WHERE id = $1"
    ))
    .bind(id.get())
    .fetch_optional(db)
    .await?
    else {
        return Ok(None);
    };
    let options = sqlx::query_as::<_, OptionRow>(
        "SELECT id, label, position FROM poll_options WHERE poll_id = $1 ORDER BY position",
    )
    .bind(id.get())
    .fetch_all(db)
    .await?;
    Ok(Some(PollRecord { poll, options }))
}

/// Whether a poll asking `question` is still open (the demo seed creates one once).
pub async fn open_asking(db: &PgPool, question: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM polls WHERE question = $1 AND closes_at > now())",
    )
    .bind(question)
    .fetch_one(db)
    .await
}

/// The polls open now or closed in the last ten minutes: those
/// [`watched_backlogs`] reads.
pub async fn watched_poll_ids(db: &PgPool) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM polls WHERE opens_at <= now() AND closes_at > now() - interval '10 minutes'",
    )
    .fetch_all(db)
    .await
}

/// These polls, each with its votes stream's entries and those settlement read
/// and has not acknowledged (see [`crate::redis_conn::stream_backlog`]), as a
/// scrape of `/metrics` reads them. Best effort: none of a poll whose stream Redis
/// cannot read.
pub async fn watched_backlogs<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    ids: &[i64],
) -> Vec<(i64, (u64, u64))> {
    let mut backlogs = Vec::with_capacity(ids.len());
    for &id in ids {
        let Some(poll) = Id::new(id) else {
            continue;
        };
        let stream = keys.poll(poll).votes;
        let backlog =
            crate::redis_conn::stream_backlog(redis, &stream, crate::settle::SETTLE_GROUP).await;
        if let Some(backlog) = backlog {
            backlogs.push((id, backlog));
        }
    }
    backlogs
}

/// The select of [`settled_tallies`], with `$extra` (more columns) after its two.
macro_rules! settled_tallies_sql {
    ($extra:literal) => {
        concat!(
            "SELECT o.id, COALESCE(sum(x.n), 0)::int8",
            $extra,
            " FROM poll_options o
             LEFT JOIN (
                 SELECT unnest(CASE WHEN p.ballot = 'multi' THEN v.choices
                                    ELSE ARRAY[v.option_id] END) AS option_id,
                        CASE WHEN p.ballot = 'budget' THEN v.count ELSE 1 END AS n
                 FROM votes v JOIN polls p ON p.id = v.poll_id
                 WHERE v.poll_id = $1
                   AND (p.ballot = 'budget' OR NOT EXISTS (
                       SELECT 1 FROM votes w
                       WHERE w.poll_id = v.poll_id AND w.user_id = v.user_id AND w.seq > v.seq))
             ) x ON x.option_id = o.id
             WHERE o.poll_id = $1 GROUP BY o.id ORDER BY o.id"
        )
    };
}

/// Votes in Postgres per option of the poll, `(option id, votes)` in option order
/// (options nobody voted for with 0), counted as Redis counts them: each voter's
/// last ballot (single and multi: each choice; ranked: the first preference), or
/// every budget vote.
pub async fn settled_tallies(db: &PgPool, id: PollId) -> Result<Vec<(i64, i64)>, sqlx::Error> {
    sqlx::query_as(settled_tallies_sql!(""))
        .bind(id.get())
        .fetch_all(db)
        .await
}

/// [`settled_tallies`] and [`settled_voters`] in one statement, so from one
/// snapshot. Read one after the other, a settlement batch committed between the
/// two showed every voter settled with only some of their votes (the admin's poll
/// page: 3 voters settled, 1 of an option's 2 votes).
pub async fn settled_tallies_and_voters(
    db: &PgPool,
    id: PollId,
) -> Result<(Vec<(i64, i64)>, i64), sqlx::Error> {
    let rows: Vec<(i64, i64, i64)> = sqlx::query_as(settled_tallies_sql!(
        ", (SELECT count(DISTINCT user_id) FROM votes WHERE poll_id = $1)::int8"
    ))
    .bind(id.get())
    .fetch_all(db)
    .await?;
    let Some(&(_, _, voters)) = rows.first() else {
        // A poll without options (none is made so): no tallies to disagree with.
        return Ok((Vec::new(), settled_voters(db, id).await?));
    };
    Ok((rows.into_iter().map(|(o, n, _)| (o, n)).collect(), voters))
}

/// How many voters have a vote in Postgres (settled): each counted once, however
/// many options they picked, votes they gave (a budget) or times they changed their
/// ballot.
pub async fn settled_voters(db: &PgPool, id: PollId) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(DISTINCT user_id) FROM votes WHERE poll_id = $1")
        .bind(id.get())
        .fetch_one(db)
        .await
}

/// The meta hash's `closed`, `rebuilt` and `changes` (see [`Stamp`]).
pub(super) type RawMeta = (Option<String>, Option<String>, Option<i64>);

/// What [`results_reads`] answer: the meta hash's fields, the options, the tally
/// hash and the voters.
pub(super) type RawResults = (RawMeta, Vec<i64>, HashMap<i64, i64>, i64);

/// The four reads of a poll's results, added to `pipe`.
pub(super) fn results_reads(pipe: &mut redis::Pipeline, keys: &Keys, poll: PollId) {
    let k = keys.poll(poll);
    pipe.cmd("HMGET")
        .arg(&k.meta)
        .arg(&["closed", "rebuilt", "changes"])
        .smembers(&k.options)
        .hgetall(&k.tally)
        .hlen(&k.voters);
}

/// The results from [`results_reads`]' answers; `None` when Redis does not know
/// the poll (every loaded poll has the meta field `closed`).
pub(super) fn parse_results(poll: PollId, raw: RawResults) -> Option<Results> {
    let ((closed, rebuilt, changes), mut options, tally, voters) = raw;
    let closed = closed?;
    options.sort_unstable();
    Some(Results {
        poll_id: poll.get(),
        closed: closed == "1",
        hidden: false,
        voters,
        runoff: None,
        stamp: Stamp {
            rebuilt,
            changes: changes.unwrap_or(0),
            voters,
        },
        tallies: options
            .into_iter()
            .map(|option_id| Tally {
                option_id,
                votes: tally.get(&option_id).copied().unwrap_or(0),
            })
            .collect(),
    })
}

/// Tallies and voter count in one pipelined round trip; no Postgres.
pub async fn results<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    poll: PollId,
) -> Result<Option<Results>, AppError> {
    let mut pipe = redis::pipe();
    results_reads(&mut pipe, keys, poll);
    let raw: RawResults = pipe.query_async(redis).await?;
    Ok(parse_results(poll, raw))
}

/// `user`'s ballot in `poll` as the voters hash holds it (`<option>` or
/// `<seq>|<ballot>`, see `lua/vote_batch.lua`; parse with `rebuild::Held`), if
/// any: one `HGET`, no Postgres.
pub async fn voter_ballot<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    poll: PollId,
    user: UserId,
) -> Result<Option<String>, redis::RedisError> {
    redis::cmd("HGET")
        .arg(keys.poll(poll).voters)
        .arg(user.get())
        .query_async(redis)
        .await
}

/// The option `user` voted for in `poll` (the first choice of a list, the first
/// option given of a budget), if any: one `HGET`, no Postgres.
pub async fn voted_option<C: ConnectionLike>(
    redis: &mut C,
    keys: &Keys,
    poll: PollId,
    user: UserId,
) -> Result<Option<i64>, redis::RedisError> {
    let held = voter_ballot(redis, keys, poll, user).await?;
    Ok(held.map(|v| first_choice(&v)))
}

/// The first option of a voters hash value (`7`, `2|7,9`, `3|7:2,9:1`; see
/// `lua/vote_batch.lua`); 0 when it names none.
pub fn first_choice(held: &str) -> i64 {
    let ballot = held.split_once('|').map_or(held, |(_, b)| b);
    ballot
        .split([',', ':'])
        .next()
        .and_then(|id| id.parse().ok())
        .unwrap_or(0)
}

/// Closes the poll: Postgres first, then Redis when it holds the poll. In this
/// order a rebuild running meanwhile cannot undo the close: it reads the row after
/// it committed, or its restore comes before this update. Returns the record and
/// whether Redis held the poll (when not, it needs a rebuild).
pub async fn close(
    db: &PgPool,
    redis: &crate::redis_conn::Redis,
    keys: &Keys,
    id: PollId,
    admin: UserId,
) -> Result<Option<(PollRecord, bool)>, AppError> {
    let mut tx = db.begin().await?;
    let was: Option<bool> = sqlx::query_scalar("SELECT closed FROM polls WHERE id = $1 FOR UPDATE")
        .bind(id.get())
        .fetch_optional(&mut *tx)
        .await?;
    let Some(was) = was else {
        return Ok(None);
    };
    sqlx::query("UPDATE polls SET closed = TRUE, closed_at = coalesce(closed_at, now()), updated_at = now() WHERE id = $1")
        .bind(id.get())
        .execute(&mut *tx)
        .await?;
    crate::audit::record(
        &mut tx,
        crate::audit::Change {
            admin,
            action: crate::audit::Action::Close,
            subject: crate::audit::Subject::Poll(id),
            before: Some(serde_json::json!({ "closed": was })),
            after: Some(serde_json::json!({ "closed": true })),
        },
    )
    .await?;
    tx.commit().await?;
    let meta = keys.poll(id).meta;
    let written = match crate::restore::update_meta(&mut redis.clone(), &meta, &[("closed", 1)])
        .await
    {
        Ok(written) => written,
        Err(e) => {
            // Committed: Redis must follow, or the poll takes votes after its close.
            let db = db.clone();
            crate::restore::resync_meta(redis.clone(), meta, format!("poll {id}"), move || {
                let db = db.clone();
                async move {
                    let closed: bool = sqlx::query_scalar("SELECT closed FROM polls WHERE id = $1")
                        .bind(id.get())
                        .fetch_one(&db)
                        .await?;
                    Ok(vec![("closed", i64::from(closed))])
                }
            });
            return Err(e);
        }
    };
    if written && !was {
        stamp_close(db, redis, &meta, id).await;
    }
    Ok(fetch_record(db, id).await?.map(|r| (r, written)))
}

static CLOCK_AT: LazyLock<crate::lua::Script> = crate::lua::lua_script!("clock_at.lua");

/// `closed_at` as the moment Redis took the close, by the Redis clock that stamps
/// the votes (`lua/clock_at.lua`, on the poll's node), where it is later than the
/// transaction's `now()`: votes accepted between the commit and Redis's write of
/// the close were stamped after a `closed_at` taken at the transaction's start.
/// A failure keeps the transaction's time (logged).
async fn stamp_close(db: &PgPool, redis: &crate::redis_conn::Redis, meta: &str, id: PollId) {
    let at = match CLOCK_AT
        .key(meta)
        .invoke_async::<i64>(&mut redis.clone())
        .await
    {
        Ok(ms) => DateTime::<Utc>::from_timestamp_millis(ms),
        Err(e) => {
            tracing::warn!(poll = %id, error = %e, "the close keeps its transaction's time");
            None
        }
    };
    let Some(at) = at else { return };
    if let Err(e) =
        sqlx::query("UPDATE polls SET closed_at = greatest(closed_at, $2) WHERE id = $1 AND closed")
            .bind(id.get())
            .bind(at)
            .execute(db)
            .await
    {
        tracing::warn!(poll = %id, error = %e, "the close keeps its transaction's time");
    }
}

#[cfg(test)]
mod tests {
    use super::first_choice;

    #[test]
    fn the_first_choice_of_every_kind_of_held_ballot() {
        assert_eq!(first_choice("7"), 7);
        assert_eq!(first_choice("2|9"), 9);
        assert_eq!(first_choice("1|4,5,6"), 4);
        assert_eq!(first_choice("3|8:2,4:1"), 8);
        assert_eq!(first_choice("1|"), 0);
    }
}
