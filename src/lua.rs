//! Lua scripts, assembled at build time: every script in `lua/` is compiled into the
//! binary with the shared library `lua/lib/*.lua` in front, one source file per
//! piece: the Redis run check that fences state a restart or a wipe may have cut
//! short, and the arrays a batch makes at their size (`run.lua`), the clock
//! (`clock.lua`), the four rate-limit algorithms (`limit_*.lua`), the policy runner
//! of the decision scripts (`limits.lua`, and `limits_batch.lua`, which takes a
//! batch's limits a policy at a time while nobody is refused) and the reply layout
//! of the batch scripts (`batch.lua`).
//! The limiter scripts and the purchase and vote scripts call the same functions,
//! never copies. Each module owns the Rust side of its scripts: their KEYS and ARGV
//! order and the parsing of their replies.

use redis::aio::ConnectionLike;
use redis::{ErrorKind, FromRedisValue, RedisResult, ServerErrorKind, ToRedisArgs};

/// A Lua script run by its SHA1 (`EVALSHA`). Where Redis does not know it
/// (`NOSCRIPT`: after a restart, a failover to a replica, a `SCRIPT FLUSH`), the
/// call is sent again as `EVAL` with the whole body, which runs it and caches it
/// for the next `EVALSHA`: one extra round trip, and no window in which the script
/// can vanish again. (`redis::Script` loads it with `SCRIPT LOAD` and retries the
/// `EVALSHA` once; a flush between the two fails the call.) On a cluster both
/// route by their first key, so the body lands on the shard that runs it.
pub struct Script {
    code: &'static str,
    hash: String,
}

impl Script {
    pub fn new(code: &'static str) -> Script {
        Script {
            code,
            hash: redis::Script::new(code).get_hash().to_string(),
        }
    }

    /// The script's SHA1, as `EVALSHA` names it.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    pub fn prepare_invoke(&self) -> Invocation<'_> {
        Invocation {
            script: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    pub fn key<T: ToRedisArgs>(&self, key: T) -> Invocation<'_> {
        let mut inv = self.prepare_invoke();
        inv.key(key);
        inv
    }

    pub fn arg<T: ToRedisArgs>(&self, arg: T) -> Invocation<'_> {
        let mut inv = self.prepare_invoke();
        inv.arg(arg);
        inv
    }
}

/// One call of a [`Script`]: its KEYS and ARGV, in order.
pub struct Invocation<'a> {
    script: &'a Script,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Invocation<'_> {
    pub fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    pub fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    fn command(&self, name: &str, script: &str) -> redis::Cmd {
        let mut cmd = redis::cmd(name);
        cmd.arg(script)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }

    /// `EVALSHA`, and `EVAL` with the body where Redis answers `NOSCRIPT`.
    pub async fn invoke_async<T: FromRedisValue>(
        &self,
        con: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        match self
            .command("EVALSHA", &self.script.hash)
            .query_async(con)
            .await
        {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.command("EVAL", self.script.code)
                    .query_async(con)
                    .await
            }
            answer => answer,
        }
    }
}

/// `lua_script!("purchase_batch.lua")`: a lazily built [`Script`] of the library
/// `lua/lib/*.lua` followed by `lua/purchase_batch.lua`, run with EVALSHA (and
/// EVAL where Redis does not have it). The library only defines local functions,
/// so a script pays for what it calls.
macro_rules! lua_script {
    ($file:literal) => {
        std::sync::LazyLock::new(|| {
            $crate::lua::Script::new(concat!(
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/lib/run.lua")),
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/lib/clock.lua")),
                include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/lua/lib/limit_fixed_window.lua"
                )),
                include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/lua/lib/limit_sliding_log.lua"
                )),
                include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/lua/lib/limit_sliding_counter.lua"
                )),
                include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/lua/lib/limit_token_bucket.lua"
                )),
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/lib/limits.lua")),
                include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/lua/lib/limits_batch.lua"
                )),
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/lib/batch.lua")),
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/lib/keys.lua")),
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/lib/units.lua")),
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file)),
            ))
        })
    };
}
pub(crate) use lua_script;

/// The answer of a script that Rust does not know: a bug or a script from another
/// version, never to be read as any particular outcome.
pub fn unexpected_reply(script: &str, reply: impl std::fmt::Debug) -> crate::error::AppError {
    crate::error::AppError::Internal(anyhow::anyhow!("{script}: unexpected reply {reply:?}"))
}

/// One enum per script for the codes its reply carries, each with the words its
/// script's header gives it: `of` reads a code (an unknown one is `None`, never
/// some refusal), `LISTED` is the list the generated test (named after
/// `checked_by`) compares with the script's header ([`codes_in_header`]), so a
/// code added on one side only fails `cargo test`. A code may be a constant
/// shared by several scripts (`crate::batch::REPLAYED`), never a second literal.
#[macro_export]
macro_rules! reply_codes {
    ($(#[$meta:meta])* pub enum $name:ident in $script:literal, checked_by $test:ident {
        $($variant:ident = $code:expr, $words:literal;)*
    }) => {
        $crate::lua::reply_codes! {
            $(#[$meta])* pub enum $name in $script under "", checked_by $test {
                $($variant = $code, $words;)*
            }
        }
    };
    ($(#[$meta:meta])* pub enum $name:ident in $script:literal under $heading:literal, checked_by $test:ident {
        $($variant:ident = $code:expr, $words:literal;)*
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(i64)]
        pub enum $name {
            $($variant = $code,)*
        }

        impl $name {
            /// The script, as `lua/` names it.
            pub const SCRIPT: &str = $script;

            /// Every code with the words the script's header gives it.
            pub const LISTED: &[($name, i64, &str)] = &[$(($name::$variant, $code, $words),)*];

            /// The code the script answered; `None` for one it never answers.
            pub fn of(code: i64) -> Option<$name> {
                $(if code == $code {
                    return Some($name::$variant);
                })*
                None
            }
        }

        #[cfg(test)]
        #[test]
        fn $test() {
            let script = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $script));
            let listed: Vec<(i64, String)> = $name::LISTED
                .iter()
                .map(|(_, code, words)| (*code, words.to_string()))
                .collect();
            let heading = Some($heading).filter(|h: &&str| !h.is_empty());
            assert_eq!($crate::lua::codes_in_header(script, heading), listed, "{}", $script);
            for (variant, code, _) in $name::LISTED {
                assert_eq!($name::of(*code), Some(*variant));
                assert_eq!(*variant as i64, *code);
            }
            assert_eq!($name::of(i64::MIN), None);
        }
    };
}
pub use reply_codes;

/// The reply codes a script's header lists: the comment lines that start with a
/// code after `--   `, read as `<code> <words> [(note)]` runs; with `heading`, the
/// first such block after the line that holds it (a second list of one script). For the test that
/// keeps each script's header and its Rust enum the same list.
pub fn codes_in_header(script: &str, heading: Option<&str>) -> Vec<(i64, String)> {
    let mut lines = script.lines();
    if let Some(heading) = heading {
        lines.by_ref().find(|l| l.contains(heading));
    }
    let block: Vec<&str> = lines
        .skip_while(|l| {
            !l.strip_prefix("--   ")
                .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        })
        .take_while(|l| l.starts_with("--   "))
        .map(|l| l.trim_start_matches('-'))
        .collect();
    let text = block.join("   ");
    let mut out: Vec<(i64, String)> = Vec::new();
    let mut depth = 0usize;
    for token in text.split_whitespace() {
        let code = token.parse::<i64>().ok().filter(|_| depth == 0);
        match code {
            Some(code) => out.push((code, String::new())),
            None => {
                if depth == 0
                    && !token.starts_with('(')
                    && let Some((_, words)) = out.last_mut()
                {
                    if !words.is_empty() {
                        words.push(' ');
                    }
                    words.push_str(token);
                }
                depth += token.matches('(').count();
                depth = depth.saturating_sub(token.matches(')').count());
            }
        }
    }
    out
}
