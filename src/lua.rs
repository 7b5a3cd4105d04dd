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

use std::sync::atomic::{AtomicBool, Ordering};

use redis::aio::ConnectionLike;
use redis::{ErrorKind, FromRedisValue, RedisResult, ServerErrorKind, ToRedisArgs};

/// A Lua script run by its SHA1 (`EVALSHA`). Where Redis does not know it
/// (`NOSCRIPT`: after a restart, a failover to a replica, a `SCRIPT FLUSH`), the
/// call is sent again as `EVAL` with the whole body, which runs it and caches it
/// for the next `EVALSHA`: one extra round trip, and no window in which the script
/// can vanish again. (`redis::Script` loads it with `SCRIPT LOAD` and retries the
/// `EVALSHA` once; a flush between the two fails the call.) On a cluster both
/// route by their first key, so the body lands on the shard that runs it.
///
/// A script made by [`lua_function!`] (the batch decisions, run for every purchase
/// and vote) runs as a Redis function instead (`FCALL`), whose library is built
/// once per Redis process rather than at every call: see [`Function`].
pub struct Script {
    code: &'static str,
    hash: String,
    function: Option<Function>,
}

/// A script as a Redis function (Redis 7's `FUNCTION LOAD` and `FCALL`).
///
/// An `EVAL` script runs its whole body at each call, so the shared library
/// `lua/lib/*.lua` in front of it makes its closures and tables again every time
/// (about 70,000 instructions of Redis a call), and the run check reads `INFO`
/// every time (about 26,000). A function library runs its body once, when it is
/// loaded: the library's functions are made then, and a call runs only the
/// script's own body (here wrapped in a local function `main`, which reads
/// `KEYS` and `ARGV` from two locals the registered function sets first); the run
/// id read once stays in the library for the life of the process
/// (`lua/lib/run.lua`). A purchase call of 40 buyers costs Redis 5% fewer
/// instructions (callgrind, BENCHMARKS.md). KEYS, ARGV and the reply are the
/// script's, as with `EVALSHA`.
///
/// The library's and the function's names carry a hash of the library's text
/// (`stampede_purchase_batch_<16 hex>`), so two versions of Stampede during a
/// rolling upgrade each call their own function, never the other's; an old
/// version's library stays in Redis (a few hundred KB of its Lua memory) until an
/// operator deletes it (`FUNCTION DELETE`). Redis keeps functions in its RDB and
/// AOF and sends them to replicas. Where a node has not got it (a wiped or new
/// node, a `FUNCTION FLUSH`), `FCALL` answers "Function not found": the library is
/// loaded (`FUNCTION LOAD`; on a cluster redis-rs sends it to every primary) and
/// the call sent again. Where that fails (a primary of the cluster down, an ACL
/// that refuses `FUNCTION LOAD`), the call runs as `EVALSHA`/`EVAL` on the key's
/// node; a refusal that is not an outage (no permission, no such command) makes
/// this process send `EVALSHA` from then on.
struct Function {
    /// `FCALL`'s first argument.
    name: String,
    /// What `FUNCTION LOAD` loads.
    library: String,
    /// `FUNCTION LOAD` was refused for good (not an outage): `EVALSHA` from now on.
    refused: AtomicBool,
}

impl Function {
    /// Redis will not load or call functions for this process: `EVALSHA` from now on.
    fn refuse(&self, e: &redis::RedisError) {
        if !self.refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, function = %self.name,
                "Redis refuses functions: this script runs as EVALSHA from now on");
        }
    }

    /// `flags`: the function's flags for Redis (`no-writes` for a script that only
    /// reads, which Redis then runs when its memory is full, as it ran the script
    /// as `EVALSHA`), or "".
    fn new(library: &str, body: &str, stem: &str, flags: &str) -> Function {
        // `@` stands for the names, so the hash covers the wrapper too.
        let text = |name: &str| {
            let register = if flags.is_empty() {
                format!("redis.register_function('{name}', function(keys, args)\n")
            } else {
                format!(
                    "redis.register_function{{function_name = '{name}', \
                     flags = {{'{flags}'}}, callback = function(keys, args)\n"
                )
            };
            let close = if flags.is_empty() { "end)" } else { "end}" };
            format!(
                "#!lua name=stampede_{name}\n\
                 local KEYS, ARGV\n\
                 {library}\n\
                 local function main()\n\
                 {body}\n\
                 end\n\
                 {register}\
                 \x20 KEYS, ARGV = keys, args\n\
                 \x20 return main()\n\
                 {close}\n"
            )
        };
        let hash = redis::Script::new(&text("@")).get_hash().to_string();
        let name = format!("{stem}_{}", &hash[..16]);
        Function {
            library: text(&name),
            name,
            refused: AtomicBool::new(false),
        }
    }
}

impl Script {
    pub fn new(code: &'static str) -> Script {
        Script {
            code,
            hash: redis::Script::new(code).get_hash().to_string(),
            function: None,
        }
    }

    /// A script that runs as a Redis function: `library` and `body` are the two
    /// parts of `code` (see [`Function`]); `stem` names the function.
    pub fn new_function(
        code: &'static str,
        library: &'static str,
        body: &'static str,
        stem: &str,
        flags: &str,
    ) -> Script {
        Script {
            function: Some(Function::new(library, body, stem, flags)),
            ..Script::new(code)
        }
    }

    /// The script's SHA1, as `EVALSHA` names it.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// For a script run as a function: the name `FCALL` calls, and the library
    /// `FUNCTION LOAD` loads.
    pub fn function(&self) -> Option<(&str, &str)> {
        self.function
            .as_ref()
            .map(|f| (f.name.as_str(), f.library.as_str()))
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

/// `FCALL` of a function Redis has not got.
fn is_function_missing(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// A command this Redis will not run for us whatever its state: an ACL without it
/// (`NOPERM`), or a Redis without it.
fn is_command_refused(e: &redis::RedisError) -> bool {
    e.code() == Some("NOPERM") || e.detail().is_some_and(|d| d.starts_with("unknown command"))
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

    /// `FCALL` for a script run as a function (see [`Function`]); else, or where
    /// the function cannot be loaded, `EVALSHA`, and `EVAL` with the body where
    /// Redis answers `NOSCRIPT`.
    pub async fn invoke_async<T: FromRedisValue>(
        &self,
        con: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        if let Some(function) = &self.script.function
            && !function.refused.load(Ordering::Relaxed)
        {
            match self.command("FCALL", &function.name).query_async(con).await {
                Err(e) if is_function_missing(&e) => {
                    let loaded: RedisResult<redis::Value> = redis::cmd("FUNCTION")
                        .arg("LOAD")
                        .arg(&function.library)
                        .query_async(con)
                        .await;
                    match loaded {
                        Ok(_) => {}
                        // Loaded meanwhile by another call.
                        Err(e) if e.detail().is_some_and(|d| d.contains("already exists")) => {}
                        // A node of the cluster down, say: this call by its body.
                        Err(e) if crate::error::is_redis_unreachable(&e) => {
                            return self.invoke_eval(con).await;
                        }
                        Err(e) => {
                            function.refuse(&e);
                            return self.invoke_eval(con).await;
                        }
                    }
                    match self.command("FCALL", &function.name).query_async(con).await {
                        // Flushed again in between: this once by its body.
                        Err(e) if is_function_missing(&e) => {}
                        answer => return answer,
                    }
                }
                Err(e) if is_command_refused(&e) => function.refuse(&e),
                answer => return answer,
            }
        }
        self.invoke_eval(con).await
    }

    /// `EVALSHA`, and `EVAL` with the body where Redis answers `NOSCRIPT`.
    async fn invoke_eval<T: FromRedisValue>(
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

/// The shared library `lua/lib/*.lua`, as one text, in the order the scripts
/// read it.
macro_rules! lua_library {
    () => {
        concat!(
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
        )
    };
}
pub(crate) use lua_library;

/// `lua_script!("purchase_batch.lua")`: a lazily built [`Script`] of the library
/// `lua/lib/*.lua` followed by `lua/purchase_batch.lua`, run with EVALSHA (and
/// EVAL where Redis does not have it). The library only defines local functions,
/// so a script pays for what it calls.
macro_rules! lua_script {
    ($file:literal) => {
        std::sync::LazyLock::new(|| {
            $crate::lua::Script::new(concat!(
                $crate::lua::lua_library!(),
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file)),
            ))
        })
    };
}
pub(crate) use lua_script;

/// `lua_function!("purchase_batch.lua", "purchase_batch")`: [`lua_script!`]'s
/// script, run as a Redis function named after the second argument (see
/// [`Function`]); a third, `"no-writes"`, flags a script that only reads.
macro_rules! lua_function {
    ($file:literal, $stem:literal) => {
        $crate::lua::lua_function!($file, $stem, "")
    };
    ($file:literal, $stem:literal, $flags:literal) => {
        std::sync::LazyLock::new(|| {
            $crate::lua::Script::new_function(
                concat!(
                    $crate::lua::lua_library!(),
                    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file)),
                ),
                $crate::lua::lua_library!(),
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file)),
                $stem,
                $flags,
            )
        })
    };
}
pub(crate) use lua_function;

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
