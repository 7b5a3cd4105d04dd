//! Lua scripts, assembled at build time: every script in `lua/` is compiled into the
//! binary with the shared library `lua/lib/*.lua` in front, one source file per
//! piece: the Redis run check that fences state a restart or a wipe may have cut
//! short (`run.lua`), the clock (`clock.lua`), the four rate-limit algorithms
//! (`limit_*.lua`), the policy runner of the decision scripts (`limits.lua`) and
//! the reply layout of the batch scripts (`batch.lua`).
//! The limiter scripts and the purchase and vote scripts call the same functions,
//! never copies. Each module owns the Rust side of its scripts: their KEYS and ARGV
//! order and the parsing of their replies.

/// `lua_script!("purchase_batch.lua")`: a lazily built [`redis::Script`] of the
/// library `lua/lib/*.lua` followed by `lua/purchase_batch.lua`. `redis::Script`
/// runs it with EVALSHA and loads it again when Redis answers `NOSCRIPT` (after a
/// restart or a failover). The library only defines local functions, so a script
/// pays for what it calls.
macro_rules! lua_script {
    ($file:literal) => {
        std::sync::LazyLock::new(|| {
            redis::Script::new(concat!(
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
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/lib/batch.lua")),
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
