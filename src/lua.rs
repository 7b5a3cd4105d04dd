//! Lua scripts, assembled at build time: every script in `lua/` is compiled into the
//! binary with the shared prelude `lua/lib/run.lua` in front (the Redis run check
//! that fences state a restart or a wipe may have cut short). Each module owns the
//! Rust side of its scripts: their KEYS and ARGV order and the parsing of replies.

/// `lua_script!("purchase.lua")`: a lazily built [`redis::Script`] of
/// `lua/lib/run.lua` followed by `lua/purchase.lua`. `redis::Script` runs it with
/// EVALSHA and loads it again when Redis answers `NOSCRIPT` (after a restart).
macro_rules! lua_script {
    ($file:literal) => {
        std::sync::LazyLock::new(|| {
            redis::Script::new(concat!(
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/lib/run.lua")),
                "\n",
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
