//! Settling a poll's accepted votes (the [`Settle`] of polls, driven by
//! [`crate::settle`]): each entry of `{poll:N}:votes` becomes a row of `votes`, keyed
//! by poll, voter and the voter's `seq`.

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
        Some(vec![Accepted {
            id: None,
            owner: entry.get("poll_id")?,
            user: entry.get("user_id")?,
            value: entry.get("option_id")?,
            key: entry.get("key"),
            at: DateTime::from_timestamp_millis(entry.get("at_ms")?)?,
            vote: Some(detail(entry)?),
        }])
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

/// A vote entry's `seq`, `choices` and `count`, each absent when the default (1,
/// none, 1); `None` when one is there but malformed.
pub fn detail(entry: &StreamId) -> Option<VoteDetail> {
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

/// Inserts the votes (`Fresh`: a plain insert, failing on a vote already there;
/// `Tolerant`: `ON CONFLICT DO NOTHING`); returns the rows inserted.
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
            "INSERT INTO votes (poll_id, user_id, option_id, voted_at, seq, count, choices,
                               idempotency_key)
             SELECT p, u, o, t, s, c, ch::int8[], k FROM UNNEST($1::int8[], $2::int8[],
                 $3::int8[], $4::timestamptz[], $5::int4[], $6::int4[], $7::text[], $8::text[])
                 AS x(p, u, o, t, s, c, ch, k)"
        }
        Insert::Tolerant => {
            "INSERT INTO votes (poll_id, user_id, option_id, voted_at, seq, count, choices,
                               idempotency_key)
             SELECT p, u, o, t, s, c, ch::int8[], k FROM UNNEST($1::int8[], $2::int8[],
                 $3::int8[], $4::timestamptz[], $5::int4[], $6::int4[], $7::text[], $8::text[])
                 AS x(p, u, o, t, s, c, ch, k)
             ON CONFLICT DO NOTHING"
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
    Ok(Written {
        inserted,
        conflicting: Vec::new(),
    })
}
