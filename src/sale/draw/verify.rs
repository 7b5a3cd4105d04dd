//! A draw checked from what the server publishes and nothing else: the seed
//! against the commitment the sale carried, the entries against their count, the
//! first winners against the stock, the entries digest against the entries
//! (recipe 2), and every published winner against the order recomputed from the
//! seed and the entries ([`super::order`]). No I/O: `stampede verify-draw`
//! fetches the three documents and prints these findings, and `stampede load`'s
//! draw rehearsal counts them among its invariants.

use anyhow::{Context, bail};
use serde_json::Value;

use super::order;

/// One check of a draw: whether it holds, and what was compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub ok: bool,
    pub what: String,
}

/// What was checked, in order, given the sale's view (`GET /api/sales/{id}`; its
/// `draw_commitment`, `stock_total`, `max_per_user`), the draw
/// (`GET /api/sales/{id}/draw`) and `entries.csv`. An error when a document is
/// not what the server publishes (a seed that is not 32 bytes of hex, a CSV
/// without its header).
pub fn check(sale: &Value, draw: &Value, csv: &[u8]) -> anyhow::Result<Vec<Finding>> {
    let entries = entry_ids(csv)?;
    let text = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    let seed = order::unhex(&text(draw, "seed")).filter(|s| s.len() == order::SEED_BYTES);
    let Some(seed) = seed else {
        bail!(
            "the published seed is not 32 bytes of hex: {}",
            draw["seed"]
        );
    };
    let mut found = Vec::new();
    let mut check = |ok: bool, what: String| found.push(Finding { ok, what });
    let commitment = order::commitment(&seed);
    check(
        commitment == text(sale, "draw_commitment") && commitment == text(draw, "commitment"),
        format!("SHA-256(seed) = {commitment}, the commitment the sale carried"),
    );
    let count = draw["entries"].as_i64().unwrap_or(-1);
    // Each entry once: a list that repeats one entry where another was left out
    // keeps the count.
    let mut seen = std::collections::HashSet::with_capacity(entries.len());
    let twice = entries.iter().find(|id| !seen.insert(**id));
    check(
        usize::try_from(count) == Ok(entries.len()) && twice.is_none(),
        match twice {
            None => format!(
                "{} entries in entries.csv, each once; the draw says {count}",
                entries.len()
            ),
            Some(id) => format!("entry {id} is listed twice in entries.csv"),
        },
    );
    // A draw published before recipes were: recipe 1.
    let number = draw.get("recipe").map_or(Some(1), Value::as_i64);
    let Some(recipe) = number.and_then(order::Recipe::of) else {
        bail!(
            "the draw's recipe {} is not one this version knows (1 or 2)",
            draw["recipe"]
        );
    };
    let digest = order::entries_digest(&entries);
    if recipe == order::Recipe::Entries {
        let ours = order::hex(&digest);
        check(
            ours == text(draw, "entries_digest"),
            format!("SHA-256 of the entry ids = {ours}, the draw's entries digest"),
        );
    }
    let key = order::order_key(recipe, &seed, &digest);
    let ordered: Vec<i64> = order::order_keyed(&key, &entries)
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    // The stock the draw divided (a later top-up, cancel or refund moves the
    // sale's); the sale's own for a draw published without it.
    let stock = draw["stock_at_draw"]
        .as_i64()
        .unwrap_or_else(|| sale["stock_total"].as_i64().unwrap_or(0));
    let per_user = sale["max_per_user"].as_i64().unwrap_or(1);
    let want = order::winners(stock, per_user, entries.len());
    let at_draw = draw["winners_at_draw"].as_i64().unwrap_or(-1);
    check(
        usize::try_from(at_draw) == Ok(want),
        format!("{at_draw} won at the draw; {stock} units at {per_user} a customer make {want}"),
    );
    let winners = draw["winners"].as_array().cloned().unwrap_or_default();
    let mismatch = winners.iter().enumerate().find(|(i, w)| {
        w["rank"].as_u64() != Some(*i as u64 + 1)
            || w["entry_id"].as_i64() != ordered.get(*i).copied()
    });
    check(
        mismatch.is_none() && winners.len() <= ordered.len(),
        match mismatch {
            None => format!(
                "the {} winners are the first of the seeded order",
                winners.len()
            ),
            Some((i, w)) => format!(
                "winner {} is entry {}; the seeded order has {:?} there",
                i + 1,
                w["entry_id"],
                ordered.get(i)
            ),
        },
    );
    Ok(found)
}

/// The entry ids of `entries.csv` (`entry_id,entered_at` after the header).
pub fn entry_ids(csv: &[u8]) -> anyhow::Result<Vec<i64>> {
    let text = std::str::from_utf8(csv).context("entries.csv is not UTF-8")?;
    let mut lines = text.lines();
    if lines.next() != Some("entry_id,entered_at") {
        bail!("entries.csv does not start with its header");
    }
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let id = l.split(',').next().unwrap_or_default();
            id.parse()
                .with_context(|| format!("not an entry id: {id:?}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_published_draw_checks_out_and_a_moved_winner_does_not() {
        let seed = [9u8; 32];
        let commitment = order::commitment(&seed);
        let sale = json!({"draw_commitment": commitment, "stock_total": 2, "max_per_user": 1});
        let ordered = order::order(&seed, &[11, 12, 13]);
        let winner = |i: usize| json!({"rank": i + 1, "entry_id": ordered[i]});
        let digest = order::hex(&order::entries_digest(&[11, 12, 13]));
        let mut draw = json!({
            "seed": order::hex(&seed), "commitment": commitment, "entries": 3,
            "recipe": 2, "entries_digest": digest,
            "winners_at_draw": 2, "winners": [winner(0), winner(1)],
        });
        let csv = b"entry_id,entered_at\n12,t\n11,t\n13,t\n";
        let found = check(&sale, &draw, csv).unwrap();
        assert_eq!(found.len(), 5);
        assert!(found.iter().all(|f| f.ok), "{found:?}");
        draw["winners"] = json!([winner(1), winner(0)]);
        let found = check(&sale, &draw, csv).unwrap();
        assert_eq!(found.iter().filter(|f| !f.ok).count(), 1, "{found:?}");
        assert!(check(&sale, &draw, b"id\n1\n").is_err());
        // One entry listed twice in place of another: the count holds, the check fails.
        draw["winners"] = json!([winner(0), winner(1)]);
        let twice = format!(
            "entry_id,entered_at\n{0},t\n{0},t\n{1},t\n",
            ordered[0], ordered[1]
        );
        let found = check(&sale, &draw, twice.as_bytes()).unwrap();
        assert!(!found[1].ok, "{found:?}");
        // An entry left out of the CSV: the digest says so.
        let short = format!("entry_id,entered_at\n{},t\n{},t\n", ordered[0], ordered[1]);
        let found = check(&sale, &draw, short.as_bytes()).unwrap();
        assert!(!found[2].ok, "{found:?}");
        draw["recipe"] = json!(3);
        assert!(check(&sale, &draw, csv).is_err());
    }

    #[test]
    fn a_draw_of_recipe_1_checks_out_by_the_seed_alone() {
        let seed = [8u8; 32];
        let commitment = order::commitment(&seed);
        let sale = json!({"draw_commitment": commitment, "stock_total": 1, "max_per_user": 1});
        let first = order::order_with(order::Recipe::Seed, &seed, &[11, 12, 13])[0];
        let mut draw = json!({
            "seed": order::hex(&seed), "commitment": commitment, "entries": 3,
            "recipe": 1, "winners_at_draw": 1, "winners": [{"rank": 1, "entry_id": first}],
        });
        let csv = b"entry_id,entered_at\n11,t\n12,t\n13,t\n";
        let found = check(&sale, &draw, csv).unwrap();
        assert_eq!(found.len(), 4);
        assert!(found.iter().all(|f| f.ok), "{found:?}");
        // Published before recipes were: the same.
        draw.as_object_mut().unwrap().remove("recipe");
        assert!(check(&sale, &draw, csv).unwrap().iter().all(|f| f.ok));
    }
}
