//! What a run fires at (the sale or poll, made now or given, and a storm's
//! opening) and what every connection sends of it.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::args::{LoadArgs, Mode};
use crate::ballots::kind;
use crate::client::Target;
use crate::fire::Plan;
use crate::prepare;

/// What the run fires at: the sale or poll (made now, or given), its route and
/// body, and for a storm the opening and the moment the requests are released.
pub struct Aim {
    pub sale: Option<i64>,
    pub poll: Option<i64>,
    pub path: String,
    pub body: Option<Vec<u8>>,
    /// A poll's options (vote).
    pub options: Vec<i64>,
    pub opens_at: Option<DateTime<Utc>>,
    pub release_at: Option<Instant>,
}

pub async fn aim(args: &LoadArgs, target: &Target, admin: &str) -> anyhow::Result<Aim> {
    let aim = |path: String| Aim {
        sale: None,
        poll: None,
        path,
        body: None,
        options: Vec::new(),
        opens_at: None,
        release_at: None,
    };
    match args.mode() {
        Mode::Healthz => Ok(aim("/healthz".to_string())),
        Mode::Vote => {
            let (poll, options) = match args.poll {
                Some(poll) => {
                    let view =
                        prepare::call(target, "GET", &format!("/api/polls/{poll}"), admin, None)
                            .await?;
                    let options: Vec<i64> = view["options"]
                        .as_array()
                        .map(|o| o.iter().filter_map(|o| o["id"].as_i64()).collect())
                        .unwrap_or_default();
                    anyhow::ensure!(!options.is_empty(), "poll {poll} has no options");
                    (poll, options)
                }
                None => {
                    let n = if args.ballot.is_some() {
                        kind::OPTIONS
                    } else {
                        2
                    };
                    prepare::create_poll(target, admin, n, &kind::settings(args)).await?
                }
            };
            let body = kind::repeated_body(args, &options).to_string();
            Ok(Aim {
                poll: Some(poll),
                body: Some(body.into_bytes()),
                options,
                ..aim(format!("/api/polls/{poll}/votes"))
            })
        }
        Mode::Storm | Mode::Repeat | Mode::Soldout => {
            // A storm opens at --opens-at, or --opens-in seconds from now (a sale it
            // makes; a given sale only with --opens-at); the others buy at once.
            let opens_at = match (args.mode(), args.sale) {
                (Mode::Storm, None) => Some(args.opens_at.unwrap_or_else(|| {
                    Utc::now() + chrono::Duration::seconds(args.opens_in.max(1) as i64)
                })),
                (_, Some(_)) => args.opens_at,
                _ => None,
            };
            let sale = match args.sale {
                Some(sale) => sale,
                None => {
                    let stock = if args.mode() == Mode::Soldout {
                        0
                    } else {
                        args.stock
                    };
                    let opens =
                        opens_at.unwrap_or_else(|| Utc::now() - chrono::Duration::seconds(5));
                    // --waiting-room: the line opens now, the sale at the opening.
                    let room = args.waiting_room.then(|| prepare::WaitingRoom {
                        opens_at: Utc::now() - chrono::Duration::seconds(5),
                        admit_per_second: args.admit_per_second,
                    });
                    prepare::create_sale(target, admin, stock, opens, args.tickets, room).await?
                }
            };
            // --waiting-room --prepare-only: the request an outside generator sends
            // is the join.
            let path = match args.waiting_room {
                true => format!("/api/sales/{sale}/queue"),
                false => format!("/api/sales/{sale}/purchase"),
            };
            Ok(Aim {
                sale: Some(sale),
                opens_at,
                release_at: opens_at.map(release_instant).transpose()?,
                ..aim(path)
            })
        }
    }
}

/// What every connection sends: the route, body, tokens, forwarded addresses and
/// the ticket route. Refuses a given sale that requires tickets without --tickets.
pub async fn plan(
    args: &LoadArgs,
    target: &Target,
    admin: &str,
    aim: &Aim,
    tokens: Vec<String>,
) -> anyhow::Result<Plan> {
    let addresses = if args.forwarded_for {
        (0..tokens.len())
            .map(|i| format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255))
            .collect()
    } else {
        Vec::new()
    };
    let ticket_path = match (aim.sale, args.tickets) {
        (Some(sale), true) => Some(format!("/api/sales/{sale}/ticket")),
        (None, true) => anyhow::bail!("--tickets is for the buy modes (storm, repeat, soldout)"),
        _ => None,
    };
    if let (Some(sale), false) = (args.sale, args.tickets) {
        let view = prepare::call(target, "GET", &format!("/api/sales/{sale}"), admin, None).await?;
        anyhow::ensure!(
            view["requires_ticket"] != Value::Bool(true),
            "sale {sale} requires purchase tickets: add --tickets (each purchase then asks for its \
             ticket first, as the sale page does)"
        );
    }
    Ok(Plan {
        mode: args.mode(),
        path: aim.path.clone(),
        body: aim.body.clone(),
        tokens,
        addresses,
        ticket_path,
        keys: aim.sale.is_some() && !args.no_keys && !args.waiting_room,
    })
}

/// When to release the requests for a sale opening at `at`: a moment after it (the
/// server decides by its Redis clock, and a request a moment early is only sent
/// again), as an [`Instant`]. An error when that moment has passed.
fn release_instant(at: DateTime<Utc>) -> anyhow::Result<Instant> {
    let wait = (at - Utc::now()).to_std().map_err(|_| {
        anyhow::anyhow!(
            "the opening {} has passed: give a later --opens-at",
            at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        )
    })?;
    Ok(Instant::now() + wait + Duration::from_millis(20))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_opening_past_is_refused() {
        let err = release_instant(Utc::now() - chrono::Duration::seconds(1)).unwrap_err();
        assert!(err.to_string().contains("has passed"), "{err}");
    }
}
