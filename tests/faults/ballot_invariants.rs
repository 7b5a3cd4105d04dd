//! The invariants of the fault scenarios over polls of ballot kinds (issue 51:
//! single, multi, budget, ranked, with or without `allow_change`), whose votes are
//! `Op::Ballot`s, one row of `votes` per accepted request (seq 1, 2, ...), each
//! with its receipt: [`assert_ballot_invariants`] (every 202 in Postgres once and
//! as asked, both stores, `settled_tallies`, `GET results`, my-ballot and
//! `votes.csv` agreeing), and the probes run after it (keys replay their first
//! 202, spent budgets stay spent, second ballots are refused, a closed ranked
//! poll's runoff). Built on the shared checks of `invariants.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::Value;
use uuid::Uuid;

use crate::harness::Stack;
use crate::invariants::{
    Allowed, AllowedLoss, Report, check_every_answer, describe, fail_lost_or_misnamed, fail_on,
    final_answers, first_ten, panic_on_failures, redis_backlog, redis_poll, send_as_users,
    settled_tallies, token_for, users_differing, wait_quiet,
};
use crate::storm::{Op, Record};

/// One row of `votes`: a voter's `seq`-th accepted request.
#[derive(Clone, Debug)]
struct VoteRow {
    seq: i32,
    /// The option (single, budget), or the first choice (multi, ranked).
    option: i64,
    /// Every option of a multi or ranked ballot, in the order sent; empty (NULL)
    /// for single and budget.
    choices: Vec<i64>,
    count: i32,
}

impl VoteRow {
    /// The ballot the row holds, as [`asked`] reads a body: its options (the
    /// choices, or the one option) and its count.
    fn ballot(&self) -> Asked {
        let choices = match self.choices.is_empty() {
            true => vec![self.option],
            false => self.choices.clone(),
        };
        Asked {
            choices,
            count: self.count.into(),
        }
    }

    /// What is wrong with the row's shape for a poll of `kind`, if anything: a
    /// multi or ranked row lists its choices (distinct, at most `max_choices`),
    /// the first being `option_id`; a single or budget row has none.
    fn misshapen(&self, kind: Kind, max_choices: usize) -> Option<String> {
        let lists = matches!(kind, Kind::Multi | Kind::Ranked);
        let distinct = self.choices.iter().collect::<HashSet<_>>().len() == self.choices.len();
        let fits = match lists {
            true => {
                self.choices.first() == Some(&self.option)
                    && distinct
                    && self.choices.len() <= max_choices
            }
            false => self.choices.is_empty(),
        };
        (!fits || (kind != Kind::Budget && self.count != 1)).then(|| {
            format!(
                "seq {} option_id {} choices {:?} count {}",
                self.seq, self.option, self.choices, self.count
            )
        })
    }
}

/// A poll's ballot kind (`polls.ballot`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Single,
    Multi,
    Budget,
    Ranked,
}

impl Kind {
    fn parse(kind: &str) -> Option<Kind> {
        Some(match kind {
            "single" => Kind::Single,
            "multi" => Kind::Multi,
            "budget" => Kind::Budget,
            "ranked" => Kind::Ranked,
            _ => return None,
        })
    }

    /// A ballot's options as they count: a multi ballot's are a set (sorted
    /// here), a ranking's and a single option in their order.
    fn counted(self, mut choices: Vec<i64>) -> Vec<i64> {
        if self == Kind::Multi {
            choices.sort_unstable();
        }
        choices
    }
}

/// A poll's ballot kind and budget, as Postgres holds them.
#[derive(Clone, Copy, Debug)]
struct Budget {
    votes_per_user: i64,
    max_per_option: i64,
}

/// The rows of `votes` of `poll`, per voter, in seq order.
async fn pg_ballots(stack: &Stack, poll: i64) -> Option<BTreeMap<i64, Vec<VoteRow>>> {
    type Row = (i64, i32, i64, Option<Vec<i64>>, i32);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT user_id, seq, option_id, choices, count FROM votes WHERE poll_id = $1
         ORDER BY user_id, seq",
    )
    .bind(poll)
    .fetch_all(&stack.db)
    .await
    .ok()?;
    let mut by_user: BTreeMap<i64, Vec<VoteRow>> = BTreeMap::new();
    for (user, seq, option, choices, count) in rows {
        by_user.entry(user).or_default().push(VoteRow {
            seq,
            option,
            choices: choices.unwrap_or_default(),
            count,
        });
    }
    Some(by_user)
}

/// The receipt of `user`'s `seq`-th accepted ballot of `poll`, as the servers
/// derive it (src/vote/receipt.rs).
pub fn receipt_of(stack: &Stack, poll: i64, user: i64, seq: i32) -> Uuid {
    use stampede::domain::Id;
    stampede::vote::receipt::receipt(
        stack.env.secret.as_bytes(),
        Id::new(poll).unwrap(),
        Id::new(user).unwrap(),
        seq,
    )
}

/// Receipt -> (user, seq) of every row of `votes` of `poll`.
fn receipts_of(
    stack: &Stack,
    poll: i64,
    rows: &BTreeMap<i64, Vec<VoteRow>>,
) -> HashMap<Uuid, (i64, i32)> {
    rows.iter()
        .flat_map(|(&u, rs)| rs.iter().map(move |r| (u, r.seq)))
        .map(|(u, seq)| (receipt_of(stack, poll, u, seq), (u, seq)))
        .collect()
}

/// What a ballot asks for: its options in the order sent (the one option of a
/// single or budget vote) and its count (1 but in a budget vote).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Asked {
    choices: Vec<i64>,
    count: i64,
}

/// The ballot a body asked for: `{"option_id", "count"}` (count 1 when absent),
/// `{"option_ids": [..]}` or `{"ranking": [..]}`.
fn asked(op: &Op) -> Option<Asked> {
    let Op::Ballot { body, .. } = op else {
        return None;
    };
    let v: Value = serde_json::from_str(body).ok()?;
    let choices = match v.get("option_ids").or(v.get("ranking")) {
        Some(ids) => ids
            .as_array()?
            .iter()
            .map(Value::as_i64)
            .collect::<Option<_>>()?,
        None => vec![v["option_id"].as_i64()?],
    };
    let count = v["count"].as_i64().unwrap_or(1);
    Some(Asked { choices, count })
}

/// Whether `row` holds the ballot `asked` on a poll of `kind`: the same count
/// and options (a multi ballot's as a set, a ranking in its order).
fn holds(kind: Kind, row: &VoteRow, asked: Option<&Asked>) -> bool {
    let (got, asked) = (row.ballot(), asked.cloned());
    asked.is_some_and(|a| {
        a.count == got.count && kind.counted(a.choices) == kind.counted(got.choices)
    })
}

/// [`wait_settled`](crate::invariants::wait_settled) for ballots: until every
/// 202's receipt is in Postgres and the polls' streams are empty (or empty for
/// 3 s with something still missing, or 60 s passed).
async fn wait_ballots_settled(stack: &Stack, records: &[Record], polls: &[i64]) -> Duration {
    let waited = wait_quiet(async || {
        let mut all_in = true;
        for &poll in polls {
            let Some(rows) = pg_ballots(stack, poll).await else {
                all_in = false;
                continue;
            };
            let held = receipts_of(stack, poll, &rows);
            all_in &= records
                .iter()
                .filter(|r| r.is_accepted() && r.ballot().is_some_and(|(p, _)| p == poll))
                .all(|r| r.receipt().is_some_and(|id| held.contains_key(&id)));
        }
        (all_in, redis_backlog(stack, &[], polls).await)
    })
    .await;
    waited.unwrap_or_else(|(waited, backlog)| {
        println!("ballots not settled after 60 s (Redis backlog {backlog:?})");
        waited
    })
}

/// [`assert_invariants`](crate::invariants::assert_invariants) for polls of
/// ballot kinds (`Op::Ballot` records): waits for settlement, then checks answers
/// (documented, no 5xx but 503), unanswered
/// requests, and per poll [`check_ballot_poll`]: polls of every ballot kind
/// (single, multi, budget, ranked), with or without `allow_change`.
pub async fn assert_ballot_invariants(
    stack: &Stack,
    records: &[Record],
    polls: &[i64],
    allowed: impl Into<Allowed>,
) -> Report {
    let settled_in = wait_ballots_settled(stack, records, polls).await;
    let (loss, mut failures, mut report) = check_every_answer(records, settled_in, allowed.into());
    for &poll in polls {
        check_ballot_poll(stack, records, poll, loss, &mut failures, &mut report).await;
    }
    let (r, p) = (records.len(), polls.len());
    panic_on_failures(
        &report,
        &failures,
        &format!("ballot invariants: {r} records, {p} polls"),
    );
    report
}

/// A poll's ballot settings, as Postgres holds them.
#[derive(Clone, Copy, Debug)]
struct Settings {
    kind: Kind,
    budget: Option<Budget>,
    /// Most options of a multi or ranked ballot (every option when not set).
    max_choices: usize,
    allow_change: bool,
}

async fn poll_settings(stack: &Stack, poll: i64) -> Settings {
    type Row = (String, Option<i32>, Option<i32>, Option<i32>, bool, i64);
    let (kind, max_choices, vpu, mpo, allow_change, options): Row = sqlx::query_as(
        "SELECT ballot, max_choices, votes_per_user, max_per_option, allow_change,
                (SELECT count(*) FROM poll_options o WHERE o.poll_id = p.id)
         FROM polls p WHERE id = $1",
    )
    .bind(poll)
    .fetch_one(&stack.db)
    .await
    .expect("read the poll's ballot settings");
    let kind = Kind::parse(&kind)
        .unwrap_or_else(|| panic!("poll {poll}: the check does not know ballot {kind}"));
    let budget = (kind == Kind::Budget).then(|| Budget {
        votes_per_user: vpu.expect("a budget poll has votes_per_user").into(),
        max_per_option: mpo.or(vpu).unwrap().into(),
    });
    let max_choices = match (kind, max_choices) {
        (Kind::Multi | Kind::Ranked, Some(m)) => m as usize,
        (Kind::Multi | Kind::Ranked, None) => options as usize,
        _ => 1,
    };
    Settings {
        kind,
        budget,
        max_choices,
        allow_change,
    }
}

/// A voter's ballot as it counts now: votes per option (budget), or the options
/// of their last ballot (as [`Kind::counted`] compares them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Held {
    Votes(BTreeMap<i64, i64>),
    Choices(Vec<i64>),
}

impl Held {
    /// What it adds to the tally of a poll of `kind`: every budget vote, each
    /// option of a single or multi ballot once, a ranking's first preference.
    fn tally(&self, kind: Kind) -> Vec<(i64, i64)> {
        match self {
            Held::Votes(per) => per.iter().map(|(&o, &n)| (o, n)).collect(),
            Held::Choices(c) if kind == Kind::Ranked => c.iter().take(1).map(|&o| (o, 1)).collect(),
            Held::Choices(c) => c.iter().map(|&o| (o, 1)).collect(),
        }
    }

    /// A ballot the poll's settings allow: 1 to `max_choices` distinct options
    /// (one for a single ballot); a budget within its totals.
    fn fits(&self, s: &Settings) -> bool {
        match (self, s.budget) {
            (Held::Votes(per), Some(b)) => {
                per.values().sum::<i64>() <= b.votes_per_user
                    && per.values().all(|&n| n <= b.max_per_option)
            }
            (Held::Choices(c), None) => {
                (1..=s.max_choices).contains(&c.len())
                    && c.iter().collect::<HashSet<_>>().len() == c.len()
            }
            _ => false,
        }
    }
}

/// One poll of a ballot kind, after settlement:
///
/// 1. every voter's rows have seqs 1..n (unique by the key, contiguous here),
///    each of the poll's kind's shape ([`VoteRow::misshapen`]);
/// 2. every 202's receipt names a row of its voter holding what it asked for
///    (unless `loss` allows losing it; the options of a ranking in their order,
///    of a multi ballot as a set); one key's 202s name one row at most; a voter
///    has no more rows than keys sent, and no more rows nobody was told of than
///    keys with an ambiguous attempt (no answer, 503); one ballot each where no
///    change is allowed ([`check_one_ballot_each`]);
/// 3. the Redis voters hash equals what Postgres says counts now (budget: votes
///    per option, at most `votes_per_user` in all and `max_per_option` each;
///    single, multi, ranked: the highest seq's options, 1 to `max_choices`
///    distinct, so each voter's one ballot), and the Redis tally equals the tally
///    counted here from those (single and multi: each option chosen; ranked: the
///    first preference; budget: the votes), `store::settled_tallies` and what
///    `GET results` publishes ([`check_published`]);
/// 4. `GET my-ballot` of a sample of voters lists their rows' receipts, settled,
///    all but the last replaced (none in a budget poll), and the last one's
///    choices; the admin's CSV lists every row ([`check_export`]).
async fn check_ballot_poll(
    stack: &Stack,
    records: &[Record],
    poll: i64,
    loss: AllowedLoss,
    failures: &mut Vec<String>,
    report: &mut Report,
) {
    let s = poll_settings(stack, poll).await;
    let kind = s.kind;
    let rows = pg_ballots(stack, poll).await.expect("read votes");
    let mine: Vec<&Record> = records
        .iter()
        .filter(|r| r.ballot().is_some_and(|(p, _)| p == poll))
        .collect();

    // 1. Seqs 1..n per voter, rows of the poll's shape.
    let gaps: Vec<String> = rows
        .iter()
        .filter(|(_, rs)| rs.iter().enumerate().any(|(i, r)| r.seq != i as i32 + 1))
        .map(|(u, rs)| {
            format!(
                "user {u}: {:?}",
                rs.iter().map(|r| r.seq).collect::<Vec<_>>()
            )
        })
        .take(10)
        .collect();
    fail_on(failures, &gaps, |g| {
        format!("poll {poll}: seqs not 1..n: {}", g.join("; "))
    });
    let misshapen: Vec<String> = rows
        .iter()
        .flat_map(|(u, rs)| {
            rs.iter().filter_map(move |r| {
                Some(format!("user {u}: {}", r.misshapen(kind, s.max_choices)?))
            })
        })
        .take(10)
        .collect();
    fail_on(failures, &misshapen, |m| {
        let most = s.max_choices;
        format!(
            "poll {poll} ({kind:?}, at most {most} choices): rows not of its ballot's shape: {}",
            m.join("; ")
        )
    });

    // 2. Every 202 in Postgres once, as asked.
    let held = receipts_of(stack, poll, &rows);
    let row = |u: i64, seq: i32| &rows[&u][seq as usize - 1];
    let mut unexpected = Vec::new();
    let mut wrong = Vec::new();
    let mut per_key: HashMap<(i64, &str), HashSet<Uuid>> = HashMap::new();
    for r in mine.iter().filter(|r| r.is_accepted()) {
        let (_, key) = r.ballot().unwrap();
        let Some(receipt) = r.receipt() else {
            wrong.push(format!(
                "user {} key {key}: a 202 without a receipt",
                r.user
            ));
            continue;
        };
        match held.get(&receipt) {
            Some(&(u, seq)) => {
                let got = row(u, seq);
                let named = u == r.user && holds(kind, got, asked(&r.op).as_ref());
                if !named && loss.allows(r) {
                    // Redis lost this unsettled vote, and the voter's next vote got
                    // its seq, so its receipt (docs/api.md, "Ballots"): lost.
                    report.lost.push((*r).clone());
                    continue;
                }
                if !named {
                    wrong.push(format!(
                        "user {} key {key} asked {:?}, its receipt names user {u} seq {seq}: {:?}",
                        r.user,
                        asked(&r.op),
                        got.ballot()
                    ));
                }
                per_key.entry((r.user, key)).or_default().insert(receipt);
            }
            None if loss.allows(r) => report.lost.push((*r).clone()),
            None => unexpected.push((*r).clone()),
        }
    }
    let what = ("ballot(s) (202)", "does not name what was asked");
    fail_lost_or_misnamed(failures, poll, what, &unexpected, &wrong);
    let spent_twice: Vec<String> = per_key
        .iter()
        .filter(|(_, ids)| ids.len() > 1)
        .map(|((u, key), ids)| {
            let mut seqs: Vec<i32> = ids.iter().map(|id| held[id].1).collect();
            seqs.sort_unstable();
            format!("user {u} key {key}: seqs {seqs:?}")
        })
        .take(10)
        .collect();
    fail_on(failures, &spent_twice, |s| {
        format!(
            "poll {poll}: one Idempotency-Key accepted more than once (202s with different receipts, each in Postgres): {}",
            s.join("; ")
        )
    });
    let told: HashSet<Uuid> = mine.iter().filter_map(|r| r.receipt()).collect();
    let mut keys: HashMap<i64, HashSet<&str>> = HashMap::new();
    let mut ambiguous: HashMap<i64, HashSet<&str>> = HashMap::new();
    for r in &mine {
        let (_, key) = r.ballot().unwrap();
        keys.entry(r.user).or_default().insert(key);
        if r.status().is_none_or(|s| s == 503) {
            ambiguous.entry(r.user).or_default().insert(key);
        }
    }
    let mut extra = Vec::new();
    for (&u, rs) in &rows {
        let sent = keys.get(&u).map_or(0, HashSet::len);
        let unknown = rs
            .iter()
            .filter(|r| !told.contains(&receipt_of(stack, poll, u, r.seq)))
            .count();
        let unsure = ambiguous.get(&u).map_or(0, HashSet::len);
        if rs.len() > sent || unknown > unsure {
            extra.push(format!(
                "user {u}: {} rows for {sent} keys sent, {unknown} nobody was told of ({unsure} keys with an ambiguous attempt)",
                rs.len()
            ));
        }
    }
    fail_on(failures, &extra, |e| {
        let e = first_ten(e);
        format!("poll {poll}: rows in Postgres that no request accounts for: {e}")
    });
    let accepted_keys = per_key.keys().copied();
    check_one_ballot_each(poll, &s, &mine, &rows, accepted_keys, loss, failures);

    // 3. What counts now, in both stores.
    let (voters, redis_tally) = redis_poll(stack, poll).await;
    // Per voter: (seq, ballot) as Postgres counts them now.
    let pg_now: BTreeMap<i64, (i32, Held)> = rows
        .iter()
        .map(|(&u, rs)| {
            let last = rs.last().expect("a voter has rows");
            let now = match s.budget {
                Some(_) => {
                    let mut per_option = BTreeMap::new();
                    for r in rs {
                        *per_option.entry(r.option).or_default() += i64::from(r.count);
                    }
                    Held::Votes(per_option)
                }
                None => Held::Choices(kind.counted(last.ballot().choices)),
            };
            (u, (last.seq, now))
        })
        .collect();
    let mut redis_now: BTreeMap<i64, (i32, Held)> = BTreeMap::new();
    for (&u, held) in &voters {
        match parse_held(held, kind) {
            Some(now) => {
                redis_now.insert(u, now);
            }
            None => failures.push(format!("poll {poll}: user {u}: Redis holds {held:?}")),
        }
    }
    for (store, now) in [("Postgres", &pg_now), ("Redis", &redis_now)] {
        let unfit: Vec<String> = now
            .iter()
            .filter(|(_, (_, held))| !held.fits(&s))
            .map(|(u, (_, held))| format!("user {u}: {held:?}"))
            .take(10)
            .collect();
        fail_on(failures, &unfit, |o| {
            format!(
                "poll {poll}: {store} holds ballots its settings refuse ({s:?}): {}",
                o.join("; ")
            )
        });
    }
    if redis_now != pg_now {
        let differ = users_differing(&pg_now, &redis_now);
        failures.push(format!(
            "poll {poll}: Redis voters ({}) and Postgres ballots ({}) differ: {}",
            redis_now.len(),
            pg_now.len(),
            first_ten(&differ)
        ));
    }
    let mut counted: BTreeMap<i64, i64> = BTreeMap::new();
    for (_, held) in pg_now.values() {
        for (o, n) in held.tally(kind) {
            *counted.entry(o).or_default() += n;
        }
    }
    let settled = settled_tallies(stack, poll).await;
    println!(
        "poll {poll} ({kind:?}): {} voters, {} rows in Postgres, tally counted from the rows {counted:?}, Redis {redis_tally:?}, settled_tallies {settled:?}",
        rows.len(),
        rows.values().map(Vec::len).sum::<usize>()
    );
    if redis_tally != counted || settled != counted {
        failures.push(format!(
            "poll {poll}: tallies differ: counted from Postgres's ballots {counted:?}, Redis {redis_tally:?}, settled_tallies {settled:?}"
        ));
    }
    check_published(stack, poll, &counted, rows.len(), failures).await;

    // 4. What a voter reads of their own ballot, and the admin of every vote.
    check_my_ballots(stack, poll, &s, &rows, &pg_now, failures).await;
    check_export(stack, poll, kind, &rows, failures).await;
}

/// `GET my-ballot` of the first 30 voters of `rows`: their rows' receipts, in
/// order, settled, all but the last `replaced` (none in a budget poll: every
/// vote counts), and (but in a budget poll) the `choices` of the ballot that
/// counts in Postgres (`pg_now`).
async fn check_my_ballots(
    stack: &Stack,
    poll: i64,
    s: &Settings,
    rows: &BTreeMap<i64, Vec<VoteRow>>,
    pg_now: &BTreeMap<i64, (i32, Held)>,
    failures: &mut Vec<String>,
) {
    let mut misread = Vec::new();
    for (&u, rs) in rows.iter().take(30) {
        let Some(mine) = my_ballot(stack, poll, u).await else {
            misread.push(format!("user {u}: my-ballot did not answer 200"));
            continue;
        };
        let listed: Vec<(Option<Uuid>, Option<bool>)> = mine["receipts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| {
                        let receipt = r["receipt"].as_str().and_then(|s| Uuid::parse_str(s).ok());
                        (receipt, r["replaced"].as_bool())
                    })
                    .collect()
            })
            .unwrap_or_default();
        let expected: Vec<(Option<Uuid>, Option<bool>)> = rs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let replaced = s.kind != Kind::Budget && i + 1 < rs.len();
                (Some(receipt_of(stack, poll, u, r.seq)), Some(replaced))
            })
            .collect();
        let choices = mine["choices"]
            .as_array()
            .and_then(|c| c.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
            .map(|c| Held::Choices(s.kind.counted(c)));
        let chosen = s.budget.is_some() || choices.as_ref() == Some(&pg_now[&u].1);
        if listed != expected || mine["settled"] != Value::Bool(true) || !chosen {
            misread.push(format!(
                "user {u}: my-ballot lists (receipt, replaced) {listed:?}, choices {} (settled {}), Postgres's rows give {expected:?}, {:?}",
                mine["choices"], mine["settled"], pg_now[&u].1
            ));
        }
    }
    fail_on(failures, &misread, |m| {
        let (n, m) = (m.len(), first_ten(m));
        format!("poll {poll}: {n} voter(s) read another ballot than Postgres holds: {m}")
    });
}

/// Where the poll allows no change (single, multi, ranked without
/// `allow_change`): a voter has one row at most, and one key at most was
/// answered 202 and is in Postgres (`accepted`: (voter, key)), so a second,
/// different ballot was refused and never counted; a voter refused 409
/// `already_voted` holds a ballot in Postgres (unless `loss` allows losing
/// one). Where it allows a change, nobody is refused `already_voted`. Budget
/// polls: neither.
fn check_one_ballot_each<'a>(
    poll: i64,
    s: &Settings,
    mine: &[&Record],
    rows: &BTreeMap<i64, Vec<VoteRow>>,
    accepted: impl Iterator<Item = (i64, &'a str)>,
    loss: AllowedLoss,
    failures: &mut Vec<String>,
) {
    if s.kind == Kind::Budget {
        return;
    }
    let refused: Vec<Record> = mine
        .iter()
        .filter(|r| r.code() == Some("already_voted"))
        .map(|&r| r.clone())
        .collect();
    if s.allow_change {
        fail_on(failures, &refused, |r| {
            let (n, r) = (r.len(), describe(r));
            format!(
                "poll {poll} allows a change, yet {n} ballot(s) were refused already_voted: {r}"
            )
        });
        return;
    }
    let twice: Vec<String> = rows
        .iter()
        .filter(|(_, rs)| rs.len() > 1)
        .map(|(u, rs)| {
            format!(
                "user {u}: {:?}",
                rs.iter().map(VoteRow::ballot).collect::<Vec<_>>()
            )
        })
        .take(10)
        .collect();
    fail_on(failures, &twice, |t| {
        format!(
            "poll {poll} allows no change, yet voters have several ballots in Postgres: {}",
            t.join("; ")
        )
    });
    let mut keys: BTreeMap<i64, Vec<&str>> = BTreeMap::new();
    for (u, key) in accepted {
        keys.entry(u).or_default().push(key);
    }
    let both: Vec<String> = keys
        .iter()
        .filter(|(_, k)| k.len() > 1)
        .map(|(u, k)| format!("user {u}: keys {k:?}"))
        .take(10)
        .collect();
    fail_on(failures, &both, |b| {
        format!(
            "poll {poll} allows no change, yet a voter's different ballots were each accepted: {}",
            b.join("; ")
        )
    });
    if matches!(loss, AllowedLoss::None) {
        let ungrounded: Vec<Record> = refused
            .into_iter()
            .filter(|r| !rows.contains_key(&r.user))
            .collect();
        fail_on(failures, &ungrounded, |r| {
            let (n, r) = (r.len(), describe(r));
            format!(
                "poll {poll}: {n} ballot(s) refused already_voted from voters with no ballot in Postgres: {r}"
            )
        });
    }
}

/// What `GET /api/polls/{poll}/results` publishes (every poll of these scenarios
/// shows its results live): the tallies `counted` (options without a vote, at
/// 0 there, left out), `voters` voters, shown, and no `runoff` while the poll is
/// open (a ranked poll's tallies are its first preferences).
async fn check_published(
    stack: &Stack,
    poll: i64,
    counted: &BTreeMap<i64, i64>,
    voters: usize,
    failures: &mut Vec<String>,
) {
    let Some(results) = get_ok(stack, &format!("/api/polls/{poll}/results"), None).await else {
        failures.push(format!("poll {poll}: GET results did not answer 200"));
        return;
    };
    let tallies: Option<BTreeMap<i64, i64>> = results["tallies"].as_array().and_then(|ts| {
        ts.iter()
            .map(|t| Some((t["option_id"].as_i64()?, t["votes"].as_i64()?)))
            .filter(|t| t.is_none_or(|(_, n)| n != 0))
            .collect()
    });
    let open = results["closed"] == Value::Bool(false);
    if results["hidden"] != Value::Bool(false)
        || tallies.as_ref() != Some(counted)
        || results["voters"].as_u64() != Some(voters as u64)
        || (open && results.get("runoff").is_some())
    {
        failures.push(format!(
            "poll {poll}: GET results publishes {results}, Postgres's ballots count {counted:?} from {voters} voters"
        ));
    }
}

/// The admin's CSV of every vote of the poll (`votes.csv`): each row of Postgres
/// once, by its receipt, with its voter, kind, `option_id`, choices in the order
/// sent (a single or budget vote's one option), count, and `replaced` on every
/// row but each voter's last (on none in a budget poll): one ballot that counts
/// per voter.
async fn check_export(
    stack: &Stack,
    poll: i64,
    kind: Kind,
    rows: &BTreeMap<i64, Vec<VoteRow>>,
    failures: &mut Vec<String>,
) {
    let resp = stack
        .http
        .get(format!(
            "{}/api/admin/polls/{poll}/votes.csv",
            stack.live_base()
        ))
        .bearer_auth(&stack.admin.token)
        .send()
        .await;
    let csv = match resp {
        Ok(r) if r.status() == reqwest::StatusCode::OK => r.text().await.unwrap_or_default(),
        other => {
            failures.push(format!("poll {poll}: votes.csv: {other:?}"));
            return;
        }
    };
    // receipt -> voter, kind, option_id, choices, count, replaced: the labels and
    // times left out (no field here needs quoting: labels and names are plain).
    type Line = [String; 6];
    let mut listed: HashMap<String, Line> = HashMap::new();
    let mut lines = 0;
    for line in csv.split("\r\n").skip(1).filter(|l| !l.is_empty()) {
        lines += 1;
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 12 {
            let n = f.len();
            failures.push(format!("poll {poll}: votes.csv line of {n} fields: {line}"));
            return;
        }
        listed.insert(
            f[0].to_string(),
            [1, 3, 4, 6, 8, 11].map(|i| f[i].to_string()),
        );
    }
    let ballot = format!("{kind:?}").to_lowercase();
    let mut expected: HashMap<String, Line> = HashMap::new();
    for (&u, rs) in rows {
        for (i, r) in rs.iter().enumerate() {
            let choices: Vec<String> = r.ballot().choices.iter().map(i64::to_string).collect();
            let replaced = kind != Kind::Budget && i + 1 < rs.len();
            let line = [
                u.to_string(),
                ballot.clone(),
                r.option.to_string(),
                choices.join(";"),
                r.count.to_string(),
                replaced.to_string(),
            ];
            expected.insert(receipt_of(stack, poll, u, r.seq).to_string(), line);
        }
    }
    if lines != expected.len() || listed != expected {
        let differ: Vec<String> = expected
            .iter()
            .filter(|(id, line)| listed.get(*id) != Some(line))
            .map(|(id, line)| format!("{id}: Postgres {line:?}, CSV {:?}", listed.get(id)))
            .collect();
        failures.push(format!(
            "poll {poll}: votes.csv lists {lines} rows, Postgres has {}: {}",
            expected.len(),
            first_ten(&differ)
        ));
    }
}

/// A voters-hash value: `<option>` (a first single ballot) or `<seq>|<ballot>`,
/// the ballot `<option>,...` (single, multi, ranked: the options in the order
/// sent) or `<option>:<count>,...` (budget). Returns (seq, ballot) for a poll of
/// `kind`.
pub(crate) fn parse_held(held: &str, kind: Kind) -> Option<(i32, Held)> {
    let (seq, ballot) = match held.split_once('|') {
        Some((s, b)) => (s.parse().ok()?, b),
        None => (1, held),
    };
    if kind != Kind::Budget {
        let choices = ballot
            .split(',')
            .map(|o| o.parse().ok())
            .collect::<Option<Vec<i64>>>()?;
        return Some((seq, Held::Choices(kind.counted(choices))));
    }
    let mut per_option = BTreeMap::new();
    for piece in ballot.split(',') {
        let (o, n) = piece.split_once(':')?;
        *per_option.entry(o.parse().ok()?).or_default() += n.parse::<i64>().ok()?;
    }
    Some((seq, Held::Votes(per_option)))
}

/// `GET path` (as the bearer of `token`, if any), retried for a while on
/// anything but 200; its JSON.
async fn get_ok(stack: &Stack, path: &str, token: Option<&str>) -> Option<Value> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut req = stack.http.get(format!("{}{path}", stack.live_base()));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        if let Ok(resp) = req.send().await
            && resp.status() == reqwest::StatusCode::OK
        {
            return resp.json().await.ok();
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// `GET /api/polls/{poll}/my-ballot` as `user`, retried for a while on anything
/// but 200.
async fn my_ballot(stack: &Stack, poll: i64, user: i64) -> Option<Value> {
    let token = token_for(stack, user);
    get_ok(stack, &format!("/api/polls/{poll}/my-ballot"), Some(&token)).await
}

/// "A spent budget stays spent", tested directly: every voter of budget poll
/// `poll` whose rows in Postgres spend all of `votes_per_user` asks for one vote
/// more, under a new key. Each must end at 409 `budget_spent`. Returns the
/// records (for a final [`assert_ballot_invariants`]).
pub async fn assert_spent_budgets_stay_spent(stack: &Stack, poll: i64) -> Vec<Record> {
    let spent: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT v.user_id, min(v.option_id) FROM votes v JOIN polls p ON p.id = v.poll_id
         WHERE v.poll_id = $1 GROUP BY v.user_id, p.votes_per_user
         HAVING sum(v.count) = p.votes_per_user",
    )
    .bind(poll)
    .fetch_all(&stack.db)
    .await
    .expect("read the voters who spent their budget");
    let one_more = |&(user, option): &(i64, i64)| {
        let body = serde_json::json!({ "option_id": option, "count": 1 });
        let key = format!("again-{user}").into();
        (
            user,
            Op::Ballot {
                poll,
                body: body.to_string().into(),
                key,
            },
        )
    };
    let what = format!(
        "{} voters who spent their budget asked for one more",
        spent.len()
    );
    let again = send_as_users(stack, &what, spent.iter().map(one_more)).await;
    let spent_again: Vec<String> = final_answers(&again)
        .iter()
        .filter(|r| r.code() != Some("budget_spent"))
        .take(10)
        .map(|r| format!("user {}: {}", r.user, r.label()))
        .collect();
    assert!(
        !spent.is_empty(),
        "poll {poll}: no voter had spent the whole budget; the probe proves nothing"
    );
    assert!(
        spent_again.is_empty(),
        "poll {poll}: voters who spent their whole budget were not refused with 409 budget_spent: {}",
        spent_again.join("; ")
    );
    again
}

/// "Without `allow_change` a second ballot is refused", tested directly: every
/// voter of `poll` (a single, multi or ranked poll without changes) whose ballot
/// Postgres holds sends another one, of an option they did not choose, under a
/// new key. Each must end at 409 `already_voted`. Returns the records (for a
/// final [`assert_ballot_invariants`], which finds nothing written).
pub async fn assert_second_ballots_refused(stack: &Stack, poll: i64) -> Vec<Record> {
    let s = poll_settings(stack, poll).await;
    assert!(
        s.kind != Kind::Budget && !s.allow_change,
        "poll {poll} takes a second ballot ({s:?}): the probe proves nothing"
    );
    let options: Vec<i64> = sqlx::query_scalar("SELECT id FROM poll_options WHERE poll_id = $1")
        .bind(poll)
        .fetch_all(&stack.db)
        .await
        .expect("read the poll's options");
    let rows = pg_ballots(stack, poll).await.expect("read votes");
    let another = |(&user, rs): (&i64, &Vec<VoteRow>)| {
        let chosen = rs[0].ballot().choices;
        let other = *options.iter().find(|o| !chosen.contains(o)).unwrap();
        let body = match s.kind {
            Kind::Multi => serde_json::json!({ "option_ids": [other] }),
            Kind::Ranked => serde_json::json!({ "ranking": [other] }),
            _ => serde_json::json!({ "option_id": other }),
        };
        let key = format!("another-{user}").into();
        let body = body.to_string().into();
        (user, Op::Ballot { poll, body, key })
    };
    let what = format!("{} voters of poll {poll} sent another ballot", rows.len());
    let again = send_as_users(stack, &what, rows.iter().map(another)).await;
    let counted: Vec<String> = final_answers(&again)
        .iter()
        .filter(|r| r.code() != Some("already_voted"))
        .take(10)
        .map(|r| format!("user {}: {}", r.user, r.label()))
        .collect();
    assert!(
        !rows.is_empty(),
        "poll {poll}: no voter holds a ballot; the probe proves nothing"
    );
    assert!(
        counted.is_empty(),
        "poll {poll} allows no change, yet voters' second ballots were not refused with 409 already_voted: {}",
        counted.join("; ")
    );
    again
}

/// Closes ranked `poll` (an admin's close) and checks the `runoff` its results
/// then publish: the instant runoff (`vote::runoff::instant_runoff`, over the
/// options in their order) of the ballots that count in Postgres, each voter's
/// last ranking, its first round the first preferences counted here.
pub async fn assert_closed_runoff_counts_postgres_ballots(stack: &Stack, poll: i64) {
    let closed = stack
        .http
        .post(format!(
            "{}/api/admin/polls/{poll}/close",
            stack.live_base()
        ))
        .bearer_auth(&stack.admin.token)
        .send()
        .await
        .expect("close the poll");
    assert_eq!(
        closed.status(),
        reqwest::StatusCode::OK,
        "close poll {poll}"
    );
    let options: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM poll_options WHERE poll_id = $1 ORDER BY position")
            .bind(poll)
            .fetch_all(&stack.db)
            .await
            .expect("read the poll's options");
    let rows = pg_ballots(stack, poll).await.expect("read votes");
    let rankings: Vec<Vec<i64>> = rows
        .values()
        .map(|rs| rs.last().unwrap().ballot().choices)
        .collect();
    let runoff =
        stampede::vote::runoff::instant_runoff(&options, rankings.iter().map(Vec::as_slice));
    let expected = serde_json::to_value(&runoff).unwrap();
    let results = get_ok(stack, &format!("/api/polls/{poll}/results"), None).await;
    let published = results.as_ref().map(|r| &r["runoff"]);
    println!(
        "poll {poll} closed: {} ballots, winner {}, {} rounds",
        expected["ballots"],
        expected["winner"],
        expected["rounds"].as_array().map_or(0, Vec::len)
    );
    assert_eq!(
        published,
        Some(&expected),
        "poll {poll}: the closed poll's results publish another runoff than Postgres's ballots give ({} voters)",
        rankings.len()
    );
    // Its first round, counted here: each ballot for its first preference.
    let mut first: BTreeMap<i64, i64> = BTreeMap::new();
    for ranking in &rankings {
        *first.entry(ranking[0]).or_default() += 1;
    }
    let round_one: Option<BTreeMap<i64, i64>> = published
        .and_then(|r| r["rounds"][0]["tallies"].as_array())
        .map(|ts| {
            ts.iter()
                .filter_map(|t| Some((t["option_id"].as_i64()?, t["votes"].as_i64()?)))
                .filter(|&(_, n)| n != 0)
                .collect()
        });
    assert_eq!(
        round_one,
        Some(first),
        "poll {poll}: the runoff's first round is not the first preferences of Postgres's ballots"
    );
}

/// "A vote retried with the same `Idempotency-Key` is the same vote", tested
/// directly after the fault: every key of `poll` whose 202 is in Postgres is
/// sent again, same body. Each must answer 202 with the same receipt, replayed.
/// Returns the records.
pub async fn assert_keys_replay(stack: &Stack, records: &[Record], poll: i64) -> Vec<Record> {
    let rows = pg_ballots(stack, poll).await.expect("read votes");
    let held = receipts_of(stack, poll, &rows);
    let mut first: HashMap<(i64, Op), Uuid> = HashMap::new();
    for r in records.iter().filter(|r| r.is_accepted()) {
        if r.ballot().is_some_and(|(p, _)| p == poll)
            && let Some(id) = r.receipt().filter(|id| held.contains_key(id))
        {
            first.entry((r.user, r.op.clone())).or_insert(id);
        }
    }
    let what = format!("poll {poll}: {} accepted keys sent again", first.len());
    let again = send_as_users(stack, &what, first.keys().cloned()).await;
    let not_replayed: Vec<String> = final_answers(&again)
        .iter()
        .filter(|r| {
            let was = first[&(r.user, r.op.clone())];
            !(r.is_accepted() && r.is_replayed() && r.receipt() == Some(was))
        })
        .take(10)
        .map(|r| {
            let (_, key) = r.ballot().unwrap();
            let was = held[&first[&(r.user, r.op.clone())]];
            format!(
                "user {} key {key} (first: seq {}): {} replayed {} receipt {:?}",
                r.user,
                was.1,
                r.label(),
                r.is_replayed(),
                r.receipt().and_then(|id| held.get(&id))
            )
        })
        .collect();
    assert!(
        not_replayed.is_empty(),
        "poll {poll}: keys sent again after the fault were not answered their first 202: {}",
        not_replayed.join("; ")
    );
    again
}
