//! Rate-limit bookkeeping stays out of Redis's AOF (`redis.set_repl` in
//! `lua/lib/limits.lua`): under `appendfsync always` a write in the AOF holds the
//! replies of its event-loop turn until an fsync, and a limit check is not a
//! decision. The purchases themselves stay durable. Caused here: a storm with both
//! shipped limit shapes counting every request (sized so that none is refused),
//! then `kill -9` of Redis. Afterwards every 202 is in Postgres once, nobody buys
//! twice, stock arithmetic is exact, and the limit windows are gone (they start
//! afresh), while the AOF never held a limit key.

use std::fs;

use crate::harness::{Options, Stack};
use crate::invariants::{AllowedLoss, assert_buyers_cannot_buy_again, assert_invariants};
use crate::storm::{Plan, purchases};

/// The shipped shapes (sliding log per user, sliding counter per address), with
/// limits this storm never reaches: every request is counted, none refused.
const POLICIES: &str = r#"
[[limits.policies]]
name = "buy-user"
route = "buy"
subject = "user"
algorithm = "sliding_log"
limit = 1000
window_ms = 60000

[[limits.policies]]
name = "buy-ip"
route = "buy"
subject = "ip"
algorithm = "sliding_counter"
limit = 1000000
window_ms = 60000
"#;

/// Every limit key of the stack's namespace.
async fn limit_keys(stack: &Stack) -> Vec<String> {
    let mut redis = stack.redis().await;
    redis::cmd("KEYS")
        .arg(format!("{}:*:rl:*", stack.env.namespace))
        .query_async(&mut redis)
        .await
        .expect("KEYS")
}

/// How many subjects the limit keys hold: a policy's bucket (a hash, see
/// `limits_cache` in lua/lib/limits.lua) one per field but its mark `#`; any other
/// key (a per-address key of an earlier version) one.
async fn limit_subjects(stack: &Stack, keys: &[String]) -> usize {
    let mut redis = stack.redis().await;
    let mut n = 0;
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(key)
            .query_async(&mut redis)
            .await
            .expect("TYPE");
        n += if kind == "hash" {
            let fields: usize = redis::cmd("HLEN")
                .arg(key)
                .query_async(&mut redis)
                .await
                .expect("HLEN");
            let mark: usize = redis::cmd("HEXISTS")
                .arg(key)
                .arg("#")
                .query_async(&mut redis)
                .await
                .expect("HEXISTS");
            fields - mark
        } else {
            1
        };
    }
    n
}

/// The AOF's files (base and increments) as one byte string.
fn aof_bytes(stack: &Stack) -> Vec<u8> {
    let incr = stack.redis.aof_incr_file();
    let dir = incr.parent().expect("appendonlydir");
    let mut all = Vec::new();
    for entry in fs::read_dir(dir).expect("read appendonlydir") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|x| x == "aof") {
            all.extend(fs::read(&path).expect("read an AOF file"));
        }
    }
    all
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread")]
async fn limit_windows_stay_out_of_the_aof_and_a_redis_kill_loses_no_202() {
    let mut stack = Stack::start(
        "limit-state",
        Options {
            limits: Some(POLICIES),
            ..Options::default()
        },
    )
    .await;
    let users = stack.create_users(400, false).await;
    let sales = stack.create_sales(&[100, 5_000]).await;
    // Each user buys from both sales and comes back to a share of them (409s).
    let storm = stack.storm(purchases(&users, &sales, 1, 0.3), Plan::at_rate(400.0));
    let records = storm.finish().await;
    assert!(
        records.iter().filter(|r| r.is_accepted()).count() >= 400,
        "the storm bought too little to test anything"
    );

    let counted = limit_keys(&stack).await;
    // Both policies' states are fields of their buckets (`...:rl:buy-ip:b<span>`
    // too: no key per address), in each sale's slot.
    for policy in ["buy-user", "buy-ip"] {
        for sale in &sales {
            let bucket = format!("{{sale:{sale}}}:rl:{policy}:b");
            assert!(
                counted.iter().any(|k| k.contains(&bucket)),
                "no bucket {bucket}* among {counted:?}"
            );
        }
    }
    assert!(
        counted
            .iter()
            .all(|k| k.contains(":rl:buy-user:b") || k.contains(":rl:buy-ip:b")),
        "a limit key that is not a bucket: {counted:?}"
    );
    let subjects = limit_subjects(&stack, &counted).await;
    assert!(
        subjects > users.len(),
        "every buyer's limits were counted in Redis: {subjects} subjects in {} limit keys \
         for {} users",
        counted.len(),
        users.len()
    );
    // No command on a limit key of this stack: every bucket's name, current,
    // previous or stale, starts with its policy's prefix in its sale's slot
    // (`<namespace>:{sale:N}:rl:`). (Not `:rl:` alone: the AOF holds the batch
    // decisions' function library, `FUNCTION LOAD` with its source, whose comments
    // name such keys.)
    let aof = aof_bytes(&stack);
    let prefixes: std::collections::BTreeSet<&str> = counted
        .iter()
        .map(|k| &k[..k.find(":rl:").expect("a limit key") + ":rl:".len()])
        .collect();
    for prefix in &prefixes {
        assert!(
            !contains(&aof, prefix.as_bytes()),
            "the AOF holds rate-limit state (a key starting {prefix})"
        );
    }
    assert!(
        contains(&aof, b"name=stampede_purchase_batch_"),
        "the AOF holds the purchase decisions' function library (the storm ran them as \
         functions)"
    );
    // The decisions are there: the buyers hash of the first sale, by name.
    let buyers_key = stack
        .keys
        .sale(stampede::domain::Id::new(sales[0]).unwrap())
        .buyers;
    assert!(
        contains(&aof, buyers_key.as_bytes()),
        "the AOF holds the purchases (no {buyers_key} in it)"
    );

    stack.redis.kill9();
    stack.start_redis().await;
    assert_eq!(
        limit_keys(&stack).await,
        Vec::<String>::new(),
        "after a restart from the AOF the limit windows start afresh"
    );
    // Every earlier buyer is still refused (409, never a second unit), after the
    // rebuild the restart triggers; then the full set of invariants.
    let mut all = records;
    all.extend(assert_buyers_cannot_buy_again(&stack, &sales).await);
    assert_invariants(&stack, &all, &sales, &[], AllowedLoss::None).await;
}
