//! The KEYS/ARGV layout the batch scripts share (`lua/lib/batch.lua`): one key
//! per limit policy, then each item's arguments ([`Call`]), and the reply's rows
//! ([`rows`]), each a code, a value and the policies' numbers.

use std::net::IpAddr;

use redis::aio::ConnectionLike;
use uuid::Uuid;

use crate::domain::UserId;
use crate::error::AppError;
use crate::limit::{Decision, Policy, Subject, Verdict};
use crate::lua::unexpected_reply;

/// One request of a batch script call: who asks, from where (when a policy counts
/// per address), and its second argument. Its limit keys are built by
/// [`Call::run`], one per policy, in order.
pub struct Item {
    pub user: UserId,
    pub ip: Option<IpAddr>,
    pub arg: ItemArg,
}

/// An item's second argument: the order id a purchase gets if accepted, with the
/// units it asks for and its idempotency key (sent as `<id>`, `<id>:<quantity>`
/// when more than one, `<id>:<quantity>:<key>` with a key, where `<id>` is the
/// hyphenated order id from its 15th character: its first 14 are its sale's, which
/// `lua/purchase_batch.lua` makes once a call), or the option a vote is for (a
/// single ballot without a key), or a vote's ballot as `lua/vote_batch.lua` reads
/// it.
#[derive(Clone, Debug)]
pub enum ItemArg {
    Order(Uuid, u32, Option<crate::domain::PurchaseKey>),
    Option(i64),
    Text(String),
}

/// The characters of a hyphenated order id that carry its sale (bytes 0 to 5, see
/// `crate::sale::order_id`): a purchase item's argument leaves them out.
pub const ORDER_PREFIX_LEN: usize = 14;

impl redis::ToRedisArgs for ItemArg {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        match self {
            ItemArg::Order(id, quantity, key) => {
                let mut buf = Uuid::encode_buffer();
                let id = &id.hyphenated().encode_lower(&mut buf)[ORDER_PREFIX_LEN..];
                if let Some(key) = key {
                    out.write_arg_fmt(format_args!("{id}:{quantity}:{}", key.as_str()));
                } else if *quantity > 1 {
                    out.write_arg_fmt(format_args!("{id}:{quantity}"));
                } else {
                    out.write_arg(id.as_bytes());
                }
            }
            ItemArg::Option(n) => n.write_redis_args(out),
            ItemArg::Text(text) => out.write_arg(text.as_bytes()),
        }
    }
}

/// What a batch script answered for one item: its code, value, and each policy's
/// decision (empty unless the answer reports them: see [`rows`]), and the stored
/// answer a replay carries.
pub struct Row {
    pub code: i64,
    pub value: i64,
    pub limits: Vec<Decision>,
    pub text: Option<String>,
}

/// A call of a batch decision script, in the layout `lua/lib/batch.lua` reads:
/// KEYS = the script's state keys, one key per policy (its buckets are named after
/// it), then each item's keys of the per-address policies (each names the item's
/// field in its policy's buckets; the script reads no such key); ARGV =
/// id, number of policies, now override, the script's own number, five per policy
/// (the fifth: `u` per user, `k` a key per item), then two per item (user id, then
/// [`ItemArg`]).
pub struct Call<'a> {
    pub script: &'a crate::lua::Script,
    /// The script's file name, for errors.
    pub name: &'a str,
    /// The script's own keys; the items' limit keys follow them.
    pub state_keys: &'a [&'a str],
    pub id: i64,
    pub policies: &'a [Policy],
    /// A policy's limit key for a subject (`Keys::sale_rate_limit` of the sale, or
    /// the poll's); called once per policy: with `b` for the name a per-user
    /// policy's buckets start with, with an empty subject for a per-address
    /// policy's prefix.
    pub limit_key: &'a (dyn Fn(&str, &str) -> String + Sync),
    /// Tests only: decide at this Redis time instead of the Redis clock.
    pub now_ms: Option<i64>,
    /// The script's own number (ARGV[4]): for the purchase, how long the keys hash
    /// lives after its last write, in ms; 0 for the vote.
    pub extra: u64,
}

impl Call<'_> {
    /// Runs the script for `items`; checks the reply's shape (see [`rows`]).
    pub async fn run<C: ConnectionLike>(
        &self,
        redis: &mut C,
        items: &[Item],
    ) -> Result<Vec<Row>, AppError> {
        let mut inv = self.script.prepare_invoke();
        for key in self.state_keys.iter().copied() {
            inv.key(key);
        }
        let prefixes: Vec<String> = self
            .policies
            .iter()
            .map(|p| match p.subject {
                Subject::User => (self.limit_key)(&p.name, BUCKETS),
                Subject::Ip | Subject::Subnet => (self.limit_key)(&p.name, ""),
            })
            .collect();
        for prefix in &prefixes {
            inv.key(prefix.as_str());
        }
        self.address_keys(&mut inv, items, &prefixes)?;
        inv.arg(self.id)
            .arg(self.policies.len())
            .arg(self.now_ms.map(|n| n.to_string()).unwrap_or_default())
            .arg(self.extra);
        for policy in self.policies {
            let (code, a, b, c) = policy.algorithm.lua_args();
            let subject = match policy.subject {
                Subject::User => "u",
                Subject::Ip | Subject::Subnet => "k",
            };
            inv.arg(code).arg(a).arg(b).arg(c).arg(subject);
        }
        for item in items {
            inv.arg(item.user.get()).arg(&item.arg);
        }
        // On a cluster a `MOVED` answer is sent again below this call (see
        // `redis_conn::MOVED_RETRIES`); no other error is.
        let flat: Vec<redis::Value> = inv.invoke_async(redis).await?;
        let reset_per_item: Vec<bool> = self
            .policies
            .iter()
            .map(|p| p.algorithm.reset_per_item())
            .collect();
        rows(self.name, &flat, &reset_per_item, items.len())
    }

    /// Adds each item's keys of the per-address policies, in the policies' order:
    /// the policy's prefix, then the address (the script keeps the address as the
    /// field of the policy's buckets; a per-user policy's fields are the user ids
    /// the items carry).
    fn address_keys(
        &self,
        inv: &mut crate::lua::Invocation<'_>,
        items: &[Item],
        prefixes: &[String],
    ) -> Result<(), AppError> {
        // A batch's keys are built in one buffer, with no formatting machinery: a
        // hot sale's batch holds up to a few hundred of them.
        let mut key = String::new();
        let mut last_ip: Option<(IpAddr, String)> = None;
        let mut last_net: Option<(IpAddr, String)> = None;
        for item in items {
            for (policy, prefix) in self.policies.iter().zip(prefixes) {
                let (last, subject): (_, fn(IpAddr) -> String) = match policy.subject {
                    Subject::User => continue,
                    Subject::Ip => (&mut last_ip, crate::limit::client::ip_subject),
                    Subject::Subnet => (&mut last_net, crate::limit::client::subnet_subject),
                };
                let Some(ip) = item.ip else {
                    return Err(AppError::Internal(anyhow::anyhow!(
                        "policy {} counts per address, but no address was given",
                        policy.name
                    )));
                };
                key.clear();
                key.push_str(prefix);
                // Requests of a batch mostly come from few addresses.
                match last {
                    Some((seen, text)) if *seen == ip => key.push_str(text),
                    _ => {
                        let text = subject(ip);
                        key.push_str(&text);
                        *last = Some((ip, text));
                    }
                }
                inv.key(key.as_str());
            }
        }
        Ok(())
    }
}

/// What the name of a policy's buckets starts with, after the policy's prefix
/// (`ns:{sale:42}:rl:buy-user:b`, `ns:{sale:42}:rl:buy-ip:b`; the bucket's number
/// follows, see `limits_cache` in `lua/lib/limits.lua`). A per-user policy's key in
/// the call is this base; a per-address policy's is its prefix, to which the script
/// adds `b` itself (a test holds the two together). No address is `b` and digits,
/// so a bucket never meets an earlier version's per-address key
/// (`...:buy-ip:203.0.113.9`); those and the per-user keys (`...:buy-user:u7`) are
/// not read, and expire within their time to live.
pub const BUCKETS: &str = "b";

/// The answer that always carries a string after its code and value: a replay
/// (`REPLY_REPLAYED` in `lua/lib/batch.lua`), with the answer stored under its key.
/// (Other answers may carry one too: a vote's receipt numbers.)
pub const REPLAYED: i64 = 11;

/// Splits a batch script's flat reply into one row per item, and the policies'
/// resets at its end (`batch_reply` in `lua/lib/batch.lua`). Per item: code and
/// value; then, rate limited and never satisfiable (7, 8), four numbers per policy
/// (verdict, remaining, ms until allowed, ms until reset); accepted (0), per policy
/// its remaining, and its ms until reset only for a policy whose reset is per item
/// (`reset_per_item`, one per policy: the token bucket); every other answer
/// (already bought, sold out, ...) none; then one string after a [`REPLAYED`], and
/// optionally after any other answer. After the rows, one number per policy: the ms
/// until reset of every request the policy took in this call (an accepted item's
/// reset, unless its policy's is per item). Anything but exactly `items` rows and
/// those numbers, or a string anywhere else, is an error.
fn rows(
    script: &str,
    flat: &[redis::Value],
    reset_per_item: &[bool],
    items: usize,
) -> Result<Vec<Row>, AppError> {
    let wrong = || unexpected_reply(script, format!("{} values for {items} items", flat.len()));
    let int = |v: &redis::Value| match v {
        redis::Value::Int(n) => Ok(*n),
        _ => Err(wrong()),
    };
    let policies = reset_per_item.len();
    let (body, resets) = flat
        .split_at_checked(flat.len().checked_sub(policies).ok_or_else(wrong)?)
        .ok_or_else(wrong)?;
    let resets = resets.iter().map(int).collect::<Result<Vec<_>, _>>()?;
    let accepted_numbers = policies + reset_per_item.iter().filter(|&&p| p).count();
    let mut out = Vec::with_capacity(items);
    let mut numbers = Vec::with_capacity(4 * policies);
    let mut rest = body;
    while let [code, value, tail @ ..] = rest {
        let (code, value) = (int(code)?, int(value)?);
        let each = match code {
            7 | 8 => 4 * policies,
            0 => accepted_numbers,
            _ => 0,
        };
        let (mine, tail) = tail.split_at_checked(each).ok_or_else(wrong)?;
        numbers.clear();
        for v in mine {
            numbers.push(int(v)?);
        }
        let limits = match code {
            7 | 8 => numbers
                .chunks(4)
                .map(|n| decision(script, n))
                .collect::<Result<_, _>>()?,
            0 => {
                let mut n = numbers.iter().copied();
                let mut limits = Vec::with_capacity(policies);
                for (p, &per_item) in reset_per_item.iter().enumerate() {
                    let remaining = n.next().ok_or_else(wrong)?;
                    let reset = if per_item {
                        n.next().ok_or_else(wrong)?
                    } else {
                        resets[p]
                    };
                    limits.push(decision(script, &[1, remaining, 0, reset])?);
                }
                limits
            }
            _ => Vec::new(),
        };
        let (text, tail) = match tail {
            [redis::Value::BulkString(s), tail @ ..] => {
                (Some(String::from_utf8_lossy(s).into_owned()), tail)
            }
            _ if code == REPLAYED => return Err(wrong()),
            _ => (None, tail),
        };
        out.push(Row {
            code,
            value,
            limits,
            text,
        });
        rest = tail;
    }
    if !rest.is_empty() || out.len() != items {
        return Err(wrong());
    }
    Ok(out)
}

/// One policy's answer: allowed (1, 0, or -1 never), remaining, ms until allowed,
/// ms until reset. Any other verdict is an error, never read as a refusal.
fn decision(script: &str, four: &[i64]) -> Result<Decision, AppError> {
    Ok(Decision {
        verdict: match four[0] {
            1 => Verdict::Allowed,
            0 => Verdict::Denied,
            -1 => Verdict::Never,
            other => return Err(unexpected_reply(script, ("verdict", other))),
        },
        remaining: four[1].max(0) as u64,
        retry_after_ms: four[2].max(0) as u64,
        reset_ms: four[3].max(0) as u64,
        now_ms: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_per_address_policy_s_buckets_are_named_as_a_per_user_policy_s() {
        let limits = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/lib/limits.lua"));
        assert!(
            limits.contains(&format!("base = key .. '{BUCKETS}'")),
            "lua/lib/limits.lua adds BUCKETS to a per-address policy's prefix"
        );
    }

    #[test]
    fn rows_carry_policy_numbers_only_where_the_answer_reports_them() {
        // Two policies, resets per batch: accepted (remaining of both), already
        // bought (none), limited (all four of both), then the two resets.
        let ints =
            |n: &[i64]| -> Vec<redis::Value> { n.iter().map(|&n| redis::Value::Int(n)).collect() };
        let batch = [false, false];
        let flat = ints(&[
            0, 9, 4, 99, 1, 0, 7, 500, 0, 0, 500, 900, 1, 98, 0, 10, 10, 20,
        ]);
        let parsed = rows("t.lua", &flat, &batch, 3).unwrap();
        assert_eq!(
            parsed
                .iter()
                .map(|r| (r.code, r.value, r.limits.len()))
                .collect::<Vec<_>>(),
            [(0, 9, 2), (1, 0, 0), (7, 500, 2)]
        );
        assert_eq!(parsed[2].limits[0].verdict, Verdict::Denied);
        assert_eq!(parsed[2].limits[0].retry_after_ms, 500);
        assert_eq!(parsed[2].limits[0].reset_ms, 900);
        let numbers = |d: &[Decision]| -> Vec<_> {
            d.iter()
                .map(|d| (d.verdict, d.remaining, d.retry_after_ms, d.reset_ms))
                .collect()
        };
        assert_eq!(
            numbers(&parsed[0].limits),
            [(Verdict::Allowed, 4, 0, 10), (Verdict::Allowed, 99, 0, 20)]
        );
        // A policy whose reset is per item (a token bucket, the second): an
        // accepted item carries it after its remaining; the batch's is 0.
        let parsed = rows(
            "t.lua",
            &ints(&[0, 9, 4, 99, 1234, 10, 0]),
            &[false, true],
            1,
        )
        .unwrap();
        assert_eq!(
            numbers(&parsed[0].limits),
            [
                (Verdict::Allowed, 4, 0, 10),
                (Verdict::Allowed, 99, 0, 1234)
            ]
        );
        // Too few or too many numbers, or rows, are an error (500, the script's
        // reply named), never a guess.
        let unexpected = |r: Result<Vec<Row>, AppError>| matches!(r, Err(AppError::Internal(e)) if e.to_string().contains("t.lua: unexpected reply"));
        assert!(unexpected(rows(
            "t.lua",
            &flat[..flat.len() - 1],
            &batch,
            3
        )));
        assert!(unexpected(rows("t.lua", &flat, &batch, 2)));
        assert!(unexpected(rows(
            "t.lua",
            &ints(&[1, 0, 5, 0, 0]),
            &batch,
            1
        )));
        assert!(unexpected(rows("t.lua", &ints(&[0, 9, 4, 99]), &batch, 1)));
        assert!(unexpected(rows("t.lua", &ints(&[5]), &batch, 0)));
        // An unknown verdict is an error too.
        assert!(unexpected(rows(
            "t.lua",
            &ints(&[7, 1, 3, 0, 0, 0, 0]),
            &[false],
            1
        )));
        // A replay carries its stored answer; any row may carry one string after
        // its numbers (a vote's receipt numbers), never two.
        let mut replay = ints(&[REPLAYED, 0]);
        replay.push(redis::Value::BulkString(b"1:0:5:x".to_vec()));
        replay.extend(ints(&[1, 0, 0, 0]));
        let parsed = rows("t.lua", &replay, &batch, 2).unwrap();
        assert_eq!(parsed[0].text.as_deref(), Some("1:0:5:x"));
        assert_eq!(parsed[1].text, None);
        assert!(unexpected(rows(
            "t.lua",
            &ints(&[REPLAYED, 0, 0, 0]),
            &batch,
            1
        )));
        let mut texted = ints(&[1, 0]);
        texted.push(redis::Value::BulkString(b"x".to_vec()));
        assert_eq!(
            rows("t.lua", &texted, &[], 1).unwrap()[0].text.as_deref(),
            Some("x")
        );
        texted.push(redis::Value::BulkString(b"y".to_vec()));
        assert!(unexpected(rows("t.lua", &texted, &[], 1)));
        // The resets are numbers.
        let mut stringly = ints(&[1, 0]);
        stringly.push(redis::Value::BulkString(b"10".to_vec()));
        assert!(unexpected(rows("t.lua", &stringly, &[false], 1)));
    }
}
