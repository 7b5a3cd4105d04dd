//! The third phase's own checks: the waiting room's invariants, through what
//! Postgres holds of the line once the admitter copied it.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use stampede::rehearse::{OrdersAdmitted, Store};

use crate::args::LoadArgs;
use crate::checks::{Check, recorder};

/// What Postgres holds of the line once copied: places in line order, and the
/// admissions (user, admitted_at) in the order given.
pub struct Copied {
    places: Vec<i64>,
    admissions: Vec<(i64, DateTime<Utc>)>,
}

/// Waits (at most `--settle-timeout`) until Postgres holds every place and every
/// admission Redis gave (the admitter copies them a few hundred ms behind).
pub async fn wait_copied(
    args: &LoadArgs,
    store: &Store,
    sale: i64,
    places: i64,
    admitted: i64,
) -> anyhow::Result<Copied> {
    let deadline = Instant::now() + Duration::from_secs(args.settle_timeout);
    loop {
        let (p, a) = store.queue_counts(sale).await?;
        if (p >= places && a >= admitted) || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(Copied {
        places: store.queue_places(sale).await?,
        admissions: store.queue_admissions(sale).await?,
    })
}

/// Admissions given, and seconds from the opening to the last one.
pub async fn admissions_span(
    store: &Store,
    sale: i64,
    opens_at: DateTime<Utc>,
) -> anyhow::Result<(i64, f64)> {
    let (count, last) = store.last_admission(sale).await?;
    let seconds = last
        .map(|t| (t - opens_at).num_microseconds().unwrap_or(0) as f64 / 1e6)
        .unwrap_or(0.0);
    Ok((count, seconds))
}

/// The waiting room's invariants, through Postgres.
#[allow(clippy::too_many_arguments)]
pub async fn queue_checks(
    store: &Store,
    sale: i64,
    opens_at: DateTime<Utc>,
    rate: u32,
    pg: &Copied,
    admitted_in_redis: i64,
    seen_twice: usize,
    purchases: u64,
    (stock_total, stock_left): (i64, i64),
    checks: &mut Vec<Check>,
) -> anyhow::Result<()> {
    let mut check = recorder(checks);
    let OrdersAdmitted {
        orders,
        units,
        not_admitted,
    } = store.orders_admitted(sale).await?;
    check(
        "every order's buyer was admitted",
        not_admitted == 0,
        format!("{orders} orders in Postgres, {not_admitted} of a user never admitted"),
    );

    let given = pg.admissions.len() as i64;
    let mut users: Vec<i64> = pg.admissions.iter().map(|(u, _)| *u).collect();
    users.sort_unstable();
    users.dedup();
    check(
        "nobody admitted twice",
        users.len() as i64 == given && given == admitted_in_redis && seen_twice == 0,
        format!(
            "{given} admissions in Postgres for {} users; Redis counts {admitted_in_redis} given; {seen_twice} users saw two different admissions",
            users.len()
        ),
    );

    let admitted: Vec<i64> = pg.admissions.iter().map(|(u, _)| *u).collect();
    let prefix = &pg.places[..admitted.len().min(pg.places.len())];
    let first_off = admitted
        .iter()
        .zip(prefix)
        .position(|(a, p)| a != p)
        .or((admitted.len() > prefix.len()).then_some(prefix.len()));
    check(
        "admissions follow the line order",
        first_off.is_none(),
        match first_off {
            None => format!(
                "the {} admitted are the first {} of the {} places, in order",
                admitted.len(),
                admitted.len(),
                pg.places.len()
            ),
            Some(i) => format!(
                "admission #{} went to user {} where the line's place #{} is user {:?} ({} places)",
                i + 1,
                admitted[i],
                i + 1,
                pg.places.get(i),
                pg.places.len()
            ),
        },
    );

    // By each moment an admission was written down, at most `rate` a second from the
    // opening (plus one second's worth: the admitter's step and the write).
    let rate = f64::from(rate);
    let (mut worst, mut early) = (None::<(usize, f64, f64)>, 0usize);
    for (i, (_, at)) in pg.admissions.iter().enumerate() {
        // Once per moment: at its last admission, all given by then are counted.
        if pg.admissions.get(i + 1).is_some_and(|(_, next)| next == at) {
            continue;
        }
        let count = i + 1;
        let since = (*at - opens_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
        if since < 0.0 {
            early += 1;
        }
        let allowed = rate * since.max(0.0) + rate;
        let slack = allowed - count as f64;
        if worst.is_none_or(|(_, _, s)| slack < s) {
            worst = Some((count, since, slack));
        }
    }
    check(
        "admissions never ahead of the pace",
        early == 0 && worst.is_none_or(|(_, _, slack)| slack >= 0.0),
        match worst {
            None => "no admission given".to_string(),
            Some((count, since, slack)) => format!(
                "{early} admissions before the opening; the nearest to the pace: {count} admitted by +{since:.2} s, {:.0} allowed ({rate:.0}/s from the opening, plus one second's)",
                count as f64 + slack
            ),
        },
    );

    let sold = stock_total - stock_left;
    check(
        "orders = units sold",
        units == sold && purchases as i64 == sold,
        format!(
            "{units} units in {orders} orders in Postgres, {sold} units sold (stock {stock_total}, {stock_left} left), {purchases} purchases accepted"
        ),
    );
    Ok(())
}
