//! The report: the connections' HDR histograms merged, throughput, latency
//! percentiles, every answer by kind and the checks, printed as text or JSON
//! (`room.rs`: the waiting room's part; `ballot.rs`, `draw.rs`: a ballot run's and a
//! draw's).

pub mod ballot;
pub mod draw;
pub mod room;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use hdrhistogram::Histogram;
use serde::Serialize;

use self::ballot::{BallotReport, print_ballot};
use self::draw::{DrawReport, print_draw};
use self::room::{WaitingRoomReport, print_waiting_room};
use crate::aim::Aim;
use crate::args::{LoadArgs, Mode};
use crate::checks::Check;
use crate::fire::{Seen, UserSeen};
use crate::latency::{Latency, histogram};
use crate::progress::Progress;

#[derive(Serialize)]
pub struct Report {
    mode: Mode,
    url: String,
    sale: Option<i64>,
    poll: Option<i64>,
    users: usize,
    concurrency: usize,
    requests: u64,
    seconds: f64,
    requests_per_second: f64,
    /// Storm: the opening (--opens-in or --opens-at); the requests were released a
    /// moment after it.
    opens_at: Option<DateTime<Utc>>,
    /// When the first answer came.
    first_answer_at: Option<DateTime<Utc>>,
    latency: Latency,
    answers: BTreeMap<String, u64>,
    /// `storm --waiting-room`: the line's figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting_room: Option<WaitingRoomReport>,
    /// `vote --ballot`: the kind's figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    ballot: Option<BallotReport>,
    /// `storm --draw`: the draw's figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    draw: Option<DrawReport>,
    checks: Vec<Check>,
    pub ok: bool,
}

/// What all the connections saw, merged.
pub struct Merged {
    latency: Histogram<u64>,
    pub per_user: HashMap<usize, UserSeen>,
    first_answer_at: Option<DateTime<Utc>>,
}

impl Merged {
    pub fn of(seen: Vec<Seen>) -> Merged {
        let mut merged = Merged {
            latency: histogram(),
            per_user: HashMap::new(),
            first_answer_at: None,
        };
        for s in seen {
            merged.latency.add(&s.latency_us).expect("same bounds");
            merged.first_answer_at = match (merged.first_answer_at, s.first_answer) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            for (user, u) in s.users {
                let e = merged.per_user.entry(user).or_default();
                e.accepted.extend(u.accepted);
                e.ambiguous |= u.ambiguous;
                e.already |= u.already;
                e.decided |= u.decided;
                for (key, k) in u.keys {
                    let m = e.keys.entry(key).or_default();
                    m.unresolved = k.unresolved;
                    for order in k.orders {
                        if !m.orders.contains(&order) {
                            m.orders.push(order);
                        }
                    }
                }
            }
        }
        merged
    }
}

impl Report {
    pub fn new(
        args: &LoadArgs,
        aim: &Aim,
        needs_users: bool,
        elapsed: Duration,
        merged: &Merged,
        progress: &Progress,
        checks: Vec<Check>,
    ) -> Report {
        let latency = &merged.latency;
        let requests = latency.len();
        Report {
            mode: args.mode(),
            url: args.url.clone(),
            sale: aim.sale,
            poll: aim.poll,
            users: if needs_users { args.users } else { 0 },
            concurrency: args.concurrency,
            requests,
            seconds: elapsed.as_secs_f64(),
            requests_per_second: requests as f64 / elapsed.as_secs_f64().max(1e-9),
            opens_at: aim.opens_at,
            first_answer_at: merged.first_answer_at,
            latency: Latency::of(latency),
            answers: progress
                .counts()
                .iter()
                .map(|(k, n)| (k.label(), *n))
                .collect(),
            waiting_room: None,
            ballot: None,
            draw: None,
            ok: checks.iter().all(|c| c.ok),
            checks,
        }
    }

    /// The report of a run that fires on its own, with its part: `storm
    /// --waiting-room` (every request of the run, its answers by phase: `join 200
    /// waiting`, `queue/me 200 admitted`, `purchase 202`, ...) or `vote --ballot`.
    pub fn with_part(
        args: &LoadArgs,
        aim: &Aim,
        elapsed: Duration,
        latency: &Histogram<u64>,
        answers: BTreeMap<String, u64>,
        checks: Vec<Check>,
        part: Part,
    ) -> Report {
        let (waiting_room, ballot, draw) = match part {
            Part::WaitingRoom(w) => (Some(w), None, None),
            Part::Ballot(b) => (None, Some(b), None),
            Part::Draw(d) => (None, None, Some(d)),
        };
        Report {
            mode: args.mode(),
            url: args.url.clone(),
            sale: aim.sale,
            poll: aim.poll,
            users: args.users,
            concurrency: args.concurrency,
            requests: latency.len(),
            seconds: elapsed.as_secs_f64(),
            requests_per_second: latency.len() as f64 / elapsed.as_secs_f64().max(1e-9),
            opens_at: aim.opens_at,
            first_answer_at: None,
            latency: Latency::of(latency),
            answers,
            waiting_room,
            ballot,
            draw,
            ok: checks.iter().all(|c| c.ok),
            checks,
        }
    }
}

/// The part of a report only one kind of run has.
pub enum Part {
    WaitingRoom(WaitingRoomReport),
    Ballot(BallotReport),
    Draw(DrawReport),
}

pub fn print_text(r: &Report) {
    println!(
        "{} against {}{}: {} requests in {:.2} s = {:.0} req/s ({} connections)",
        match r.mode {
            Mode::Storm => "storm",
            Mode::Repeat => "repeat",
            Mode::Soldout => "soldout",
            Mode::Vote => "vote",
            Mode::Healthz => "healthz",
        },
        r.url,
        match (r.sale, r.poll) {
            (Some(s), _) => format!(", sale {s}"),
            (_, Some(p)) => format!(", poll {p}"),
            _ => String::new(),
        },
        r.requests,
        r.seconds,
        r.requests_per_second,
        r.concurrency
    );
    if let (Some(opens), Some(first)) = (r.opens_at, r.first_answer_at) {
        println!(
            "opened at {}, first answer at {}",
            opens.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            first.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        );
    }
    let l = &r.latency;
    println!(
        "latency: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
        l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms
    );
    println!("answers:");
    for (kind, n) in &r.answers {
        println!("  {n:>9}  {kind}");
    }
    if let Some(w) = &r.waiting_room {
        print_waiting_room(w);
    }
    if let Some(b) = &r.ballot {
        print_ballot(b);
    }
    if let Some(d) = &r.draw {
        print_draw(d);
    }
    let limited = r.answers.get("429 rate_limited").copied().unwrap_or(0);
    if limited * 2 > r.requests {
        println!(
            "note: most answers were 429. The per-address limits count every simulated \
             user as this one machine: start the server with STAMPEDE_LIMITS=off, or with \
             STAMPEDE_TRUSTED_PROXIES=127.0.0.1 and pass --forwarded-for (an address per user)."
        );
    }
    if !r.checks.is_empty() {
        println!("invariants:");
        for c in &r.checks {
            println!(
                "  {}  {}: {}",
                if c.ok { "ok    " } else { "BROKEN" },
                c.invariant,
                c.detail
            );
        }
    }
}
