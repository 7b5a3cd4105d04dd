//! Settling a poll's accepted votes (the [`Settle`] of polls, driven by
//! [`crate::settle`]): each entry of `{poll:N}:votes` becomes a row of `votes`.

use chrono::DateTime;
use futures_util::future::BoxFuture;
use redis::streams::StreamId;
use sqlx::PgPool;

use crate::domain::PollId;
use crate::keys::Keys;
use crate::settle::{Accepted, Insert, Settle, Stream, Written};

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
            key: None,
            at: DateTime::from_timestamp_millis(entry.get("at_ms")?)?,
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
    let sql = match insert {
        Insert::Fresh => {
            "INSERT INTO votes (poll_id, user_id, option_id, voted_at)
             SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::int8[], $4::timestamptz[])"
        }
        Insert::Tolerant => {
            "INSERT INTO votes (poll_id, user_id, option_id, voted_at)
             SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::int8[], $4::timestamptz[])
             ON CONFLICT DO NOTHING"
        }
    };
    let inserted = sqlx::query(sql)
        .bind(&polls)
        .bind(&users)
        .bind(&options)
        .bind(&times)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    Ok(Written {
        inserted,
        conflicting: Vec::new(),
    })
}
