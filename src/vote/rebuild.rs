//! Rebuilding a poll's Redis state from Postgres (the [`Restore`] of polls, driven
//! by [`crate::recover`]): each voter's ballot from the voters hash Redis still
//! has, the unsettled entries of the stream and the `votes` table (the highest
//! `seq` wins: a replaced ballot stays replaced, a budget stays spent); tallies
//! counted from that union.

use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;

use futures_util::future::BoxFuture;
use sqlx::PgPool;

use super::setting::BallotKind;
use super::store::PollRow;
use crate::domain::PollId;
use crate::error::AppError;
use crate::keys::Keys;
use crate::lua::lua_script;
use crate::restore::{
    CHUNK, Listed, Rebuilt, Restore, Stores, each_entry, fence, interrupted, scan_all,
};
use crate::settle::ensure_group;

static RESTORE_POLL: LazyLock<crate::lua::Script> = lua_script!("restore_poll.lua");

/// The polls, as the recovery driver sees them.
pub struct Polls {
    /// `purchase_key_ttl`: the Idempotency-Keys of votes accepted less than this
    /// long ago are restored.
    pub key_ttl: std::time::Duration,
}

impl Restore for Polls {
    type Id = PollId;

    fn state_keys(&self, keys: &Keys, id: PollId) -> (String, String) {
        let k = keys.poll(id);
        (k.meta, k.options)
    }

    fn list<'a>(
        &'a self,
        db: &'a PgPool,
        days: Option<i32>,
    ) -> BoxFuture<'a, Result<Vec<Listed<PollId>>, AppError>> {
        Box::pin(async move {
            let rows: Vec<(PollId, i32, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
                "SELECT id, CASE WHEN closed OR closes_at <= now() THEN 2
                         WHEN opens_at > now() THEN 1 ELSE 0 END, closes_at
         FROM polls
         WHERE $1::int IS NULL OR closes_at > now() - make_interval(days => $1)",
            )
            .bind(days)
            .fetch_all(db)
            .await?;
            Ok(rows.into_iter().map(Listed::from).collect())
        })
    }

    fn rebuild<'a>(
        &'a self,
        stores: Stores<'a>,
        id: PollId,
    ) -> BoxFuture<'a, Result<Option<Rebuilt>, AppError>> {
        Box::pin(rebuild_poll(stores, id, self.key_ttl))
    }
}

/// A row of `votes`: user, seq, option, choices, count, key, when.
type SettledVote = (
    i64,
    i32,
    i64,
    Option<Vec<i64>>,
    i32,
    Option<String>,
    chrono::DateTime<chrono::Utc>,
);

/// One accepted request of a voter, from the stream or the `votes` table.
#[derive(Clone, Debug)]
struct Cast {
    option: i64,
    choices: Option<Vec<i64>>,
    count: i64,
    /// Its Idempotency-Key, when it had one and was accepted within the keys' TTL.
    key: Option<String>,
}

/// The answers `lua/vote_batch.lua` remembers for a voter's keyed requests
/// (`<user>:<key>` -> `<ballot as sent>|0:0:<seq>:<replaced>:<remaining>:<option
/// remaining>`), from their accepted requests in order; the first choice's count
/// at the time (the answer's value, which no answer shows) is 0.
fn key_answers(
    kind: BallotKind,
    settings: &super::setting::BallotSettings,
    user: i64,
    casts: &BTreeMap<i32, Cast>,
    out: &mut Vec<(String, String)>,
) {
    let budget = i64::from(settings.votes_per_user.unwrap_or(0));
    let cap = i64::from(settings.max_per_option.unwrap_or(0));
    let mut spent: HashMap<i64, i64> = HashMap::new();
    let mut total = 0;
    for (&seq, cast) in casts {
        *spent.entry(cast.option).or_default() += cast.count;
        total += cast.count;
        let Some(key) = &cast.key else { continue };
        let list = |prefix: char| {
            let ids: Vec<String> = cast
                .choices
                .as_deref()
                .unwrap_or(&[cast.option])
                .iter()
                .map(i64::to_string)
                .collect();
            format!("{prefix}{}", ids.join(","))
        };
        let (sent, replaced, left, option_left) = match kind {
            BallotKind::Budget => {
                let left = budget - total;
                let option_left = (cap - spent[&cast.option]).min(left);
                (
                    format!("{}*{}", cast.option, cast.count),
                    0,
                    left,
                    option_left,
                )
            }
            BallotKind::Single => (cast.option.to_string(), i32::from(seq > 1), 0, 0),
            BallotKind::Multi => (list('m'), i32::from(seq > 1), 0, 0),
            BallotKind::Ranked => (list('r'), i32::from(seq > 1), 0, 0),
        };
        out.push((
            format!("{user}:{key}"),
            format!("{sent}|0:0:{seq}:{replaced}:{left}:{option_left}"),
        ));
    }
}

/// A voter's ballot as the voters hash holds it (see `lua/vote_batch.lua`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub seq: i32,
    /// single, multi, ranked: the choices in order; budget: (option, votes) pairs.
    pub choices: Vec<i64>,
    pub spent: Vec<(i64, i64)>,
}

impl Held {
    /// Parses a voters hash value of a poll of `kind`; `None` when malformed.
    pub fn parse(kind: BallotKind, value: &str) -> Option<Held> {
        let (seq, ballot) = match value.split_once('|') {
            Some((seq, ballot)) => (seq.parse().ok().filter(|s| *s >= 1)?, ballot),
            None => (1, value),
        };
        let mut held = Held {
            seq,
            choices: Vec::new(),
            spent: Vec::new(),
        };
        if kind == BallotKind::Budget {
            for part in ballot.split(',') {
                let (o, c) = part.split_once(':')?;
                held.spent.push((o.parse().ok()?, c.parse().ok()?));
            }
        } else {
            held.choices = super::settlement::parse_choices(ballot)?;
        }
        Some(held)
    }

    /// The voters hash value: a first single ballot as its option alone.
    pub fn value(&self, kind: BallotKind) -> String {
        let ballot = if kind == BallotKind::Budget {
            let parts: Vec<String> = self.spent.iter().map(|(o, c)| format!("{o}:{c}")).collect();
            parts.join(",")
        } else {
            let parts: Vec<String> = self.choices.iter().map(i64::to_string).collect();
            parts.join(",")
        };
        if self.seq == 1 && kind == BallotKind::Single {
            ballot
        } else {
            format!("{}|{ballot}", self.seq)
        }
    }

    /// What the ballot adds to each option's tally: single and multi each choice,
    /// ranked the first preference, budget the votes.
    pub fn counts(&self, kind: BallotKind, into: &mut HashMap<i64, i64>) {
        match kind {
            BallotKind::Budget => {
                for (o, c) in &self.spent {
                    *into.entry(*o).or_default() += c;
                }
            }
            BallotKind::Ranked => {
                if let Some(first) = self.choices.first() {
                    *into.entry(*first).or_default() += 1;
                }
            }
            BallotKind::Single | BallotKind::Multi => {
                for o in &self.choices {
                    *into.entry(*o).or_default() += 1;
                }
            }
        }
    }
}

/// A voter's ballot from their accepted requests (`casts` by seq): the last one
/// (single, multi, ranked), or every vote summed per option, in the order first
/// spent (budget).
fn from_casts(kind: BallotKind, casts: &BTreeMap<i32, Cast>) -> Option<Held> {
    let (&seq, last) = casts.last_key_value()?;
    let mut held = Held {
        seq,
        choices: Vec::new(),
        spent: Vec::new(),
    };
    if kind == BallotKind::Budget {
        for cast in casts.values() {
            match held.spent.iter_mut().find(|(o, _)| *o == cast.option) {
                Some((_, c)) => *c += cast.count,
                None => held.spent.push((cast.option, cast.count)),
            }
        }
    } else {
        held.choices = last.choices.clone().unwrap_or_else(|| vec![last.option]);
    }
    Some(held)
}

async fn rebuild_poll(
    stores: Stores<'_>,
    id: PollId,
    key_ttl: std::time::Duration,
) -> Result<Option<Rebuilt>, AppError> {
    let keys_since =
        chrono::Utc::now() - chrono::Duration::from_std(key_ttl).unwrap_or(chrono::Duration::MAX);
    let mut redis = stores.redis.clone();
    let k = stores.keys.poll(id);
    // Every live server writes the votes of this poll it accepted and settlement
    // has not committed (Redis may have lost them), before the reads below (as a
    // sale's rebuild does: see `sale/rebuild`). Only a poll open now, or closed
    // within the time a vote is kept, can have one kept.
    let keep_s = crate::settle::kept::MAX_AGE.as_secs_f64();
    let may_keep: Option<bool> = sqlx::query_scalar(
        "SELECT opens_at <= now() + interval '1 minute'
                AND closes_at > now() - make_interval(secs => $2)
         FROM polls WHERE id = $1",
    )
    .bind(id.get())
    .bind(keep_s)
    .fetch_optional(stores.db)
    .await?;
    if may_keep == Some(true) {
        let waited = crate::roster::barrier(stores.db, crate::roster::Kind::Poll, id.get()).await?;
        if waited.missed > 0 {
            tracing::warn!(poll = %id, ?waited, "a live server did not answer the rebuild's flush request");
        }
    }
    let mut tx = stores.db.begin().await?;
    let Some(poll) = sqlx::query_as::<_, PollRow>(concat!(
        "SELECT ",
        poll_columns!(),
        " FROM polls WHERE id = $1 FOR UPDATE"
    ))
    .bind(id.get())
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Ok(None);
    };
    let kind = poll.ballot;
    let options: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM poll_options WHERE poll_id = $1 ORDER BY position")
            .bind(id.get())
            .fetch_all(&mut *tx)
            .await?;
    let token = fence(&mut redis, &k.meta, &k.rebuild).await?;

    // What Redis still knows of each voter, then every accepted request of the
    // stream and the record: the ballot of the highest seq wins (a budget's from
    // all of its requests, unless Redis knew as much).
    let mut known: HashMap<i64, Held> = HashMap::new();
    for (user, value) in scan_all::<(i64, String)>(&mut redis, "HSCAN", &k.voters).await? {
        if let Some(held) = Held::parse(kind, &value) {
            known.insert(user, held);
        }
    }
    let mut casts: HashMap<i64, BTreeMap<i32, Cast>> = HashMap::new();
    let mut unsettled = 0;
    each_entry(&mut redis, &k.votes, |entry| {
        let (Some(votes), Some(at)) = (
            super::settlement::votes_of(entry),
            entry
                .get::<i64>("at_ms")
                .and_then(chrono::DateTime::from_timestamp_millis),
        ) else {
            return;
        };
        for v in votes {
            unsettled += 1;
            casts.entry(v.user).or_default().insert(
                v.detail.seq,
                Cast {
                    option: v.option,
                    choices: v.detail.choices,
                    count: i64::from(v.detail.count),
                    key: v.key.filter(|_| at > keys_since),
                },
            );
        }
    })
    .await?;
    let settled: Vec<SettledVote> = sqlx::query_as(
        "SELECT user_id, seq, option_id, choices, count, idempotency_key, voted_at
         FROM votes WHERE poll_id = $1",
    )
    .bind(id.get())
    .fetch_all(&mut *tx)
    .await?;
    for (user, seq, option, choices, count, key, at) in &settled {
        casts.entry(*user).or_default().insert(
            *seq,
            Cast {
                option: *option,
                choices: choices.clone(),
                count: i64::from(*count),
                key: key.clone().filter(|_| *at > keys_since),
            },
        );
    }
    let mut answers = Vec::new();
    for (user, by_seq) in &casts {
        key_answers(kind, &poll.ballot_settings(), *user, by_seq, &mut answers);
    }
    restore_keys(&mut redis, &k, &answers, key_ttl).await?;
    for (user, by_seq) in &casts {
        let Some(held) = from_casts(kind, by_seq) else {
            continue;
        };
        if known.get(user).is_none_or(|k| k.seq < held.seq) {
            known.insert(*user, held);
        }
    }
    let pairs: Vec<(i64, String)> = known.iter().map(|(u, h)| (*u, h.value(kind))).collect();
    for chunk in pairs.chunks(CHUNK) {
        let _: i64 = redis::cmd("HSET")
            .arg(&k.voters)
            .arg(chunk)
            .query_async(&mut redis)
            .await?;
    }
    let mut counts: HashMap<i64, i64> = HashMap::new();
    for held in known.values() {
        held.counts(kind, &mut counts);
    }
    let mut restore = RESTORE_POLL.prepare_invoke();
    restore
        .key(&k.meta)
        .key(&k.options)
        .key(&k.tally)
        .key(&k.rebuild)
        .arg(&token)
        .arg(poll.opens_at.timestamp_millis())
        .arg(poll.closes_at.timestamp_millis())
        .arg(u8::from(poll.closed))
        .arg(options.len());
    for option in &options {
        restore.arg(option);
    }
    for option in &options {
        restore.arg(counts.get(option).copied().unwrap_or(0));
    }
    restore.arg(poll.ballot_settings().redis_field());
    let written: i64 = restore.invoke_async(&mut redis).await?;
    if written == crate::restore::TOKEN_GONE {
        tracing::warn!(poll = %id, "Redis lost the rebuild token (wiped or restarted again)");
        return Err(interrupted());
    }
    ensure_group(&mut redis, &k.votes).await?;
    tx.commit().await?;
    Ok(Some(Rebuilt {
        settled: settled.len(),
        unsettled,
        total: known.len(),
        stock_left: None,
    }))
}

/// Writes the keyed answers into the poll's keys hash before the poll is stamped
/// trusted (what the hash still holds stays), and resets its expiry.
async fn restore_keys(
    redis: &mut crate::redis_conn::Redis,
    k: &crate::keys::PollKeys,
    answers: &[(String, String)],
    key_ttl: std::time::Duration,
) -> Result<(), AppError> {
    if answers.is_empty() {
        return Ok(());
    }
    for chunk in answers.chunks(CHUNK) {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(&k.keys);
        for (field, answer) in chunk {
            cmd.arg(field).arg(answer);
        }
        let _: i64 = cmd.query_async(&mut *redis).await?;
    }
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(&k.keys)
        .arg(u64::try_from(key_ttl.as_millis()).unwrap_or(u64::MAX))
        .query_async(&mut *redis)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_ballot_reads_back_as_written_for_every_kind() {
        for (kind, value) in [
            (BallotKind::Single, "7"),
            (BallotKind::Single, "2|9"),
            (BallotKind::Multi, "1|7,9,12"),
            (BallotKind::Ranked, "3|12,7"),
            (BallotKind::Budget, "4|7:3,9:5"),
        ] {
            let held = Held::parse(kind, value).unwrap();
            assert_eq!(held.value(kind), value, "{kind:?}");
        }
        assert_eq!(Held::parse(BallotKind::Budget, "2|7"), None);
        assert_eq!(Held::parse(BallotKind::Multi, "0|7"), None);
    }

    #[test]
    fn a_budget_sums_its_requests_and_a_replaced_ballot_counts_as_its_last() {
        let cast = |option, choices: Option<Vec<i64>>, count| Cast {
            option,
            choices,
            count,
            key: None,
        };
        let casts: BTreeMap<i32, Cast> = [
            (1, cast(7, None, 3)),
            (2, cast(9, None, 2)),
            (3, cast(7, None, 1)),
        ]
        .into();
        let held = from_casts(BallotKind::Budget, &casts).unwrap();
        assert_eq!((held.seq, held.spent), (3, vec![(7, 4), (9, 2)]));
        let casts: BTreeMap<i32, Cast> = [
            (1, cast(7, Some(vec![7, 9]), 1)),
            (2, cast(12, Some(vec![12, 7]), 1)),
        ]
        .into();
        let held = from_casts(BallotKind::Ranked, &casts).unwrap();
        assert_eq!((held.seq, held.choices.clone()), (2, vec![12, 7]));
        let mut counts = HashMap::new();
        held.counts(BallotKind::Ranked, &mut counts);
        assert_eq!(counts, HashMap::from([(12, 1)]));
    }
}
