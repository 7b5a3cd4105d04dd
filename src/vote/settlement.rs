//! Settling a poll's accepted votes (the [`Settle`] of polls, driven by
//! [`crate::settle`]): each vote of an entry of `{poll:N}:votes` (a batch's) becomes
//! a row of `votes`, keyed by poll, voter and the voter's `seq`.

use chrono::DateTime;
use futures_util::future::BoxFuture;
use redis::streams::StreamId;
use sqlx::PgPool;

use crate::domain::PollId;
use crate::keys::Keys;
use crate::settle::{Accepted, Insert, Settle, Stream, VoteDetail, Written};

/// The polls, as the settlement worker sees them.
pub struct Votes;

/// A poll's stream of accepted votes.
pub fn stream(keys: &Keys, poll: PollId) -> Stream {
    Stream::new(keys.poll(poll).votes, None)
}

impl Settle for Votes {
    fn streams<'a>(
        &'a self,
        db: &'a PgPool,
        keys: &'a Keys,
        days: i32,
    ) -> BoxFuture<'a, Result<Vec<Stream>, sqlx::Error>> {
        Box::pin(async move {
            let polls: Vec<PollId> = sqlx::query_scalar(
                "SELECT id FROM polls WHERE closes_at > now() - make_interval(days => $1) ORDER BY id",
            )
            .bind(days)
            .fetch_all(db)
            .await?;
            Ok(polls.into_iter().map(|id| stream(keys, id)).collect())
        })
    }

    fn parse(&self, entry: &StreamId) -> Option<Vec<Accepted>> {
        let poll = entry.get("poll_id")?;
        let at = DateTime::from_timestamp_millis(entry.get("at_ms")?)?;
        let votes = votes_of(entry)?;
        Some(
            votes
                .into_iter()
                .map(|v| Accepted {
                    id: None,
                    owner: poll,
                    user: v.user,
                    value: v.option,
                    key: v.key,
                    at,
                    vote: Some(v.detail),
                })
                .collect(),
        )
    }

    fn write<'a>(
        &'a self,
        tx: &'a mut sqlx::PgConnection,
        rows: &'a [Accepted],
        insert: Insert,
    ) -> BoxFuture<'a, Result<Written, sqlx::Error>> {
        Box::pin(insert_votes(tx, rows, insert))
    }
}

/// One accepted vote request as the votes stream carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamVote {
    pub user: i64,
    /// The option (single, budget) or the first choice (multi, ranked).
    pub option: i64,
    pub detail: VoteDetail,
    /// The request's Idempotency-Key.
    pub key: Option<String>,
}

/// Every vote of a stream entry: a batch's `votes` records
/// (`<user>/<option>/<seq>/<count>/<choices>/<key>`, separated by spaces; see
/// `lua/vote_batch.lua`), or an earlier version's entry of one vote (`user_id`,
/// `option_id`, and `seq`, `choices`, `count`, `key` when not the defaults).
/// `None` when malformed.
pub fn votes_of(entry: &StreamId) -> Option<Vec<StreamVote>> {
    match entry.map.get("votes") {
        Some(_) => entry
            .get::<String>("votes")?
            .split(' ')
            .map(parse_record)
            .collect(),
        None => Some(vec![StreamVote {
            user: entry.get("user_id")?,
            option: entry.get("option_id")?,
            detail: detail(entry)?,
            key: entry.get("key"),
        }]),
    }
}

/// One record of a batch entry's `votes`; `None` when malformed.
pub fn parse_record(record: &str) -> Option<StreamVote> {
    let mut parts = record.split('/');
    let mut next = || parts.next();
    let user = next()?.parse().ok().filter(|u| *u > 0)?;
    let option = next()?.parse().ok().filter(|o| *o > 0)?;
    let seq = next()?.parse().ok().filter(|s| *s >= 1)?;
    let count = next()?.parse().ok().filter(|c| *c >= 1)?;
    let choices = match next()? {
        "" => None,
        text => Some(parse_choices(text)?),
    };
    let key = match next()? {
        "" => None,
        key => Some(key.to_owned()),
    };
    if next().is_some() {
        return None;
    }
    Some(StreamVote {
        user,
        option,
        detail: VoteDetail {
            seq,
            choices,
            count,
        },
        key,
    })
}

/// An earlier version's vote entry's `seq`, `choices` and `count`, each absent
/// when the default (1, none, 1); `None` when one is there but malformed.
fn detail(entry: &StreamId) -> Option<VoteDetail> {
    let seq = match entry.map.get("seq") {
        None => 1,
        Some(_) => entry.get::<i32>("seq").filter(|s| *s >= 1)?,
    };
    let count = match entry.map.get("count") {
        None => 1,
        Some(_) => entry.get::<i32>("count").filter(|c| *c >= 1)?,
    };
    let choices = match entry.map.get("choices") {
        None => None,
        Some(_) => Some(parse_choices(&entry.get::<String>("choices")?)?),
    };
    Some(VoteDetail {
        seq,
        choices,
        count,
    })
}

/// `7,9,12` -> [7, 9, 12]; `None` when any is not a positive id.
pub fn parse_choices(text: &str) -> Option<Vec<i64>> {
    text.split(',')
        .map(|id| id.parse::<i64>().ok().filter(|id| *id > 0))
        .collect()
}

/// The insert of a batch of votes. In place of a foreign key to `users`
/// (migrations/0027, as orders do since 0012 and 0015): the vote of a user that is
/// gone is not written. Users are removed only by the rehearsal cleanup, which
/// records it: a vote's user is looked up only while a removal is open. The first
/// test is evaluated once per statement, and when it holds no user is looked up.
macro_rules! insert_votes_sql {
    () => {
        "INSERT INTO votes (poll_id, user_id, option_id, voted_at, seq, count, choices,
                           idempotency_key)
         SELECT p, u, o, t, s, c, ch::int8[], k FROM UNNEST($1::int8[], $2::int8[],
             $3::int8[], $4::timestamptz[], $5::int4[], $6::int4[], $7::text[], $8::text[])
             AS x(p, u, o, t, s, c, ch, k)
         WHERE NOT EXISTS (SELECT 1 FROM user_removals r WHERE r.until > now())
            OR EXISTS (SELECT 1 FROM users w WHERE w.id = x.u)"
    };
}

/// Inserts the votes (`Fresh`: a plain insert, failing on a vote already there;
/// `Tolerant`: `ON CONFLICT DO NOTHING`); returns the rows inserted (a vote of a
/// removed user is not written, see [`insert_votes_sql`]).
async fn insert_votes(
    tx: &mut sqlx::PgConnection,
    rows: &[Accepted],
    insert: Insert,
) -> Result<Written, sqlx::Error> {
    let polls: Vec<i64> = rows.iter().map(|r| r.owner).collect();
    let users: Vec<i64> = rows.iter().map(|r| r.user).collect();
    let options: Vec<i64> = rows.iter().map(|r| r.value).collect();
    let times: Vec<DateTime<chrono::Utc>> = rows.iter().map(|r| r.at).collect();
    let detail = |r: &Accepted| {
        r.vote.clone().unwrap_or(VoteDetail {
            seq: 1,
            choices: None,
            count: 1,
        })
    };
    let details: Vec<VoteDetail> = rows.iter().map(detail).collect();
    let seqs: Vec<i32> = details.iter().map(|d| d.seq).collect();
    let counts: Vec<i32> = details.iter().map(|d| d.count).collect();
    // Postgres has no array of arrays of different lengths: each ballot's choices
    // as text (`{7,9,12}`), cast back per row; NULL for a single or budget vote.
    let choices: Vec<Option<String>> = details
        .iter()
        .map(|d| {
            d.choices.as_ref().map(|c| {
                let ids: Vec<String> = c.iter().map(i64::to_string).collect();
                format!("{{{}}}", ids.join(","))
            })
        })
        .collect();
    let keys: Vec<Option<&str>> = rows.iter().map(|r| r.key.as_deref()).collect();
    let sql = match insert {
        Insert::Fresh => {
            insert_votes_sql!()
        }
        Insert::Tolerant => {
            concat!(insert_votes_sql!(), " ON CONFLICT DO NOTHING")
        }
    };
    let inserted = sqlx::query(sql)
        .bind(&polls)
        .bind(&users)
        .bind(&options)
        .bind(&times)
        .bind(&seqs)
        .bind(&counts)
        .bind(&choices)
        .bind(&keys)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let mut conflicting = Vec::new();
    if matches!(insert, Insert::Tolerant) && (inserted as usize) < rows.len() {
        // Skipped rows are redeliveries (the same ballot is there) or conflicts:
        // another ballot under the same (poll, voter, seq), which Redis counted and
        // Postgres will not hold (counted and logged by the worker).
        let found: Vec<(i64, i64, i32)> = sqlx::query_as(
            "SELECT x.p, x.u, x.s
             FROM UNNEST($1::int8[], $2::int8[], $3::int4[], $4::int8[], $5::int4[], $6::text[])
                 AS x(p, u, s, o, c, ch)
             JOIN votes v ON v.poll_id = x.p AND v.user_id = x.u AND v.seq = x.s
             WHERE v.option_id <> x.o OR v.count <> x.c
                OR v.choices IS DISTINCT FROM x.ch::int8[]",
        )
        .bind(&polls)
        .bind(&users)
        .bind(&seqs)
        .bind(&options)
        .bind(&counts)
        .bind(&choices)
        .fetch_all(&mut *tx)
        .await?;
        conflicting = found
            .iter()
            .map(|(poll, user, seq)| format!("vote of poll {poll}, user {user}, seq {seq}"))
            .collect();
    }
    Ok(Written {
        inserted,
        conflicting,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_gives_each_field_and_defaults_stay_empty() {
        let v = parse_record("42/7/1/1//").unwrap();
        assert_eq!((v.user, v.option, v.key), (42, 7, None));
        assert_eq!(
            (v.detail.seq, v.detail.count, v.detail.choices),
            (1, 1, None)
        );
        let v = parse_record("42/9/3/1/9,7,12/k-1:a.b").unwrap();
        assert_eq!(v.detail.choices, Some(vec![9, 7, 12]));
        assert_eq!((v.detail.seq, v.key.as_deref()), (3, Some("k-1:a.b")));
        let v = parse_record("5/2/4/3//").unwrap();
        assert_eq!(v.detail.count, 3);
    }

    #[test]
    fn a_malformed_record_is_refused() {
        for bad in [
            "",
            "42",
            "42/7/1/1/",
            "0/7/1/1//",
            "42/7/0/1//",
            "42/7/1/0//",
            "42/x/1/1//",
            "42/7/1/1/7,,9/",
            "42/7/1/1///extra",
        ] {
            assert_eq!(parse_record(bad), None, "{bad:?}");
        }
    }
}
