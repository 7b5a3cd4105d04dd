//! A poll's accepted votes kept until settled (see [`crate::settle::kept`]): a
//! vote is found in Postgres by its poll, voter and `seq` (the key of `votes`).

use std::collections::HashSet;

use futures_util::future::BoxFuture;
use sqlx::PgPool;

use super::settlement::Votes;
use crate::roster::Kind;
use crate::settle::Accepted;
use crate::settle::kept::{Kept, KeptRows};

/// Every server's kept votes.
pub type KeptVotes = Kept<Votes>;

impl KeptRows for Votes {
    const KIND: Kind = Kind::Poll;

    fn settled<'a>(
        &'a self,
        db: &'a PgPool,
        probes: &'a [&'a Accepted],
    ) -> BoxFuture<'a, Result<HashSet<usize>, sqlx::Error>> {
        Box::pin(async move {
            let polls: Vec<i64> = probes.iter().map(|r| r.owner).collect();
            let users: Vec<i64> = probes.iter().map(|r| r.user).collect();
            let seqs: Vec<i32> = probes
                .iter()
                .map(|r| r.vote.as_ref().map_or(1, |v| v.seq))
                .collect();
            let found: Vec<i64> = sqlx::query_scalar(
                "SELECT i - 1 FROM unnest($1::int8[], $2::int8[], $3::int4[])
                     WITH ORDINALITY AS x(p, u, s, i)
                 WHERE EXISTS (SELECT 1 FROM votes v
                               WHERE v.poll_id = x.p AND v.user_id = x.u AND v.seq = x.s)",
            )
            .bind(&polls)
            .bind(&users)
            .bind(&seqs)
            .fetch_all(db)
            .await?;
            Ok(found.into_iter().map(|i| i as usize).collect())
        })
    }
}
