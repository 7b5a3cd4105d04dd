//! Every accepted vote of a poll as CSV (`GET /api/admin/polls/{id}/votes.csv`,
//! issue 51): one row per row of `votes` (a vote request; a budget voter's
//! requests are rows of their own), with its receipt, its voter, its options and
//! whether a later ballot of the same voter replaced it. Streamed from one
//! Postgres query (see [`crate::csv`]), never all in memory.

use std::collections::HashMap;

use actix_web::web::Bytes;
use chrono::{DateTime, Utc};
use futures_util::{Stream, TryStreamExt};
use sqlx::PgPool;

use super::receipt::receipt_keyed;
use super::setting::BallotKind;
use super::store::PollRecord;
use crate::auth::token::HmacSha256;
use crate::csv::{self, CsvOut, push_field, time};
use crate::domain::{Id, PollId};
use crate::error::AppError;

/// The CSV's header row.
pub const CSV_HEADER: &str = "receipt,voter_id,voter_name,ballot,option_id,option_label,\
choices,choice_labels,count,voted_at,settled_at,replaced\r\n";

/// Joins the options of one ballot in the `choices` and `choice_labels` columns.
const CHOICE_SEPARATOR: &str = ";";

#[derive(sqlx::FromRow)]
struct CsvVote {
    user_id: i64,
    seq: i32,
    username: String,
    option_id: i64,
    choices: Option<Vec<i64>>,
    count: i32,
    voted_at: DateTime<Utc>,
    settled_at: DateTime<Utc>,
    replaced: bool,
}

/// What every row of one poll's CSV shares: the poll, its ballot kind, its
/// options' labels and the HMAC its receipts are made with (keyed with the
/// server's token secret).
struct PollSheet {
    poll: PollId,
    ballot: BallotKind,
    labels: HashMap<i64, String>,
    mac: HmacSha256,
}

/// Every settled vote of the poll, by (`voted_at`, voter, seq), as CSV lines after
/// [`CSV_HEADER`]; receipts made with `mac` (keyed with the server's token
/// secret, as [`receipt_keyed`] wants it). One query on one connection of `db`,
/// read as the client takes the chunks; a client that leaves ends it.
pub fn votes_csv(
    db: PgPool,
    record: PollRecord,
    mac: HmacSha256,
) -> Result<impl Stream<Item = Result<Bytes, AppError>> + 'static, AppError> {
    let poll = super::store::poll_id(record.poll.id)?;
    let sheet = PollSheet {
        poll,
        ballot: record.poll.ballot,
        labels: record
            .options
            .into_iter()
            .map(|o| (o.id, o.label))
            .collect(),
        mac,
    };
    let span = tracing::warn_span!("votes_csv", poll = %poll);
    Ok(csv::stream(span, CSV_HEADER, None, move |out| {
        write_csv(db, sheet, out)
    }))
}

async fn write_csv(db: PgPool, sheet: PollSheet, mut out: CsvOut) -> Result<(), AppError> {
    let mut tx = csv::download_transaction(&db).await?;
    {
        // A budget poll counts every row; in the others a voter's row with a
        // higher seq replaced this one (a probe of the primary key per row).
        let mut rows = sqlx::query_as::<_, CsvVote>(
            "SELECT v.user_id, v.seq, u.username, v.option_id, v.choices, v.count,
                    v.voted_at, v.settled_at,
                    ($2 AND EXISTS (SELECT 1 FROM votes w WHERE w.poll_id = v.poll_id
                                    AND w.user_id = v.user_id AND w.seq > v.seq)) AS replaced
             FROM votes v JOIN users u ON u.id = v.user_id
             WHERE v.poll_id = $1 ORDER BY v.voted_at, v.user_id, v.seq",
        )
        .bind(sheet.poll.get())
        .bind(sheet.ballot != BallotKind::Budget)
        .fetch(&mut *tx);
        while let Some(vote) = rows.try_next().await? {
            sheet.push_row(out.buf(), &vote)?;
            if !out.row_done().await {
                // The client left.
                return Ok(());
            }
        }
    }
    tx.commit().await?;
    out.finish().await;
    Ok(())
}

impl PollSheet {
    fn label(&self, option: i64) -> &str {
        self.labels.get(&option).map_or("", String::as_str)
    }

    fn push_row(&self, buf: &mut String, v: &CsvVote) -> Result<(), AppError> {
        use std::fmt::Write;
        let user = Id::new(v.user_id).ok_or_else(|| {
            AppError::Internal(anyhow::anyhow!("user id {} not positive", v.user_id))
        })?;
        // A single or budget vote has one option; a multi or ranked ballot lists
        // them all, the first being `option_id`.
        let choices = match &v.choices {
            Some(list) if self.ballot.lists() && !list.is_empty() => list.as_slice(),
            _ => std::slice::from_ref(&v.option_id),
        };
        let ids: Vec<String> = choices.iter().map(i64::to_string).collect();
        let labels: Vec<&str> = choices.iter().map(|&o| self.label(o)).collect();
        let _ = write!(
            buf,
            "{},{},",
            receipt_keyed(&self.mac, self.poll, user, v.seq),
            v.user_id
        );
        push_field(buf, &v.username);
        let _ = write!(buf, ",{},{},", self.ballot.as_str(), v.option_id);
        push_field(buf, self.label(v.option_id));
        let _ = write!(buf, ",{},", ids.join(CHOICE_SEPARATOR));
        push_field(buf, &labels.join(CHOICE_SEPARATOR));
        let _ = write!(
            buf,
            ",{},{},{},{}\r\n",
            v.count,
            time(Some(v.voted_at)),
            time(Some(v.settled_at)),
            v.replaced
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vote::receipt::receipt;
    use hmac::Mac;

    fn sheet(ballot: BallotKind) -> PollSheet {
        PollSheet {
            poll: PollId::new(5).unwrap(),
            ballot,
            labels: HashMap::from([
                (1, "Tea".to_string()),
                (2, "=cmd".to_string()),
                (3, "Milk, hot".to_string()),
            ]),
            mac: HmacSha256::new_from_slice(b"secret").unwrap(),
        }
    }

    fn vote(option_id: i64, choices: Option<Vec<i64>>, count: i32, replaced: bool) -> CsvVote {
        let at = DateTime::parse_from_rfc3339("2030-01-02T03:04:05.678Z")
            .unwrap()
            .with_timezone(&Utc);
        CsvVote {
            user_id: 9,
            seq: 2,
            username: "ann".into(),
            option_id,
            choices,
            count,
            voted_at: at,
            settled_at: at,
            replaced,
        }
    }

    fn row(sheet: &PollSheet, v: &CsvVote) -> String {
        let mut buf = String::new();
        sheet.push_row(&mut buf, v).unwrap();
        buf
    }

    #[test]
    fn a_ranked_row_lists_every_choice_in_order_with_its_labels_escaped() {
        let s = sheet(BallotKind::Ranked);
        let line = row(&s, &vote(3, Some(vec![3, 1, 2]), 1, true));
        let id = receipt(b"secret", s.poll, Id::new(9).unwrap(), 2);
        assert_eq!(
            line,
            format!(
                "{id},9,ann,ranked,3,\"Milk, hot\",3;1;2,\"Milk, hot;Tea;=cmd\",1,\
                 2030-01-02T03:04:05.678Z,2030-01-02T03:04:05.678Z,true\r\n"
            )
        );
        assert_eq!(
            line.matches(',').count(),
            CSV_HEADER.matches(',').count() + 2
        );
    }

    #[test]
    fn a_budget_row_is_its_one_option_and_count_and_formulas_are_defused() {
        let s = sheet(BallotKind::Budget);
        let line = row(&s, &vote(2, None, 4, false));
        assert!(
            line.contains(",budget,2,\"'=cmd\",2,\"'=cmd\",4,"),
            "{line}"
        );
        assert!(line.ends_with(",false\r\n"));
    }
}
