//! Argon2id password hashes (PHC strings, `$argon2id$v=19$m=19456,t=2,p=1$…`)
//! computed in memory this process keeps.
//!
//! One Argon2id hash at the shipped cost fills 19 MiB. Done the library's way
//! (`Argon2::hash_password`), every sign-in allocates those 19 MiB, faults every
//! page in and frees them, on whichever blocking-pool thread ran it: the server's
//! RSS jumped by about 20 MB and back with each sign-in, stayed up when the
//! allocator kept the block for a thread, and a storm of sign-ins (up to the
//! blocking pool's 512 threads) could ask for gigabytes at once. Here at most
//! [`HASHERS`] hashes run at a time, one per core, each in a block of memory taken
//! from a pool and put back: the memory for hashing is one block per core,
//! allocated once, and sign-ins beyond that wait their turn, for at most
//! [`TURN_WAIT`]: then 503 `busy` with `Retry-After`, so a storm of sign-ins is
//! told to come back instead of piling up behind the hashes.
//!
//! The hashes are the library's own (the same PHC string and verification), as
//! the tests check both ways.

use std::sync::{LazyLock, Mutex, PoisonError};

use argon2::password_hash::{Output, ParamsString, PasswordHash, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};

use crate::error::{AppError, ErrorCode};

/// Longest a sign-in, sign-up or password change waits for a hashing turn.
pub const TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How many hashes run at once: one per core.
pub static HASHERS: LazyLock<usize> = LazyLock::new(|| {
    std::thread::available_parallelism()
        .map(std::num::NonZeroUsize::get)
        .unwrap_or(2)
});

/// Memory blocks of 1 KiB a pooled buffer holds at most: the shipped cost's. A
/// stored hash of a higher cost (none is written here) is checked in memory of its
/// own, not kept.
const POOLED_BLOCKS: usize = Params::DEFAULT_M_COST as usize;

struct Pool {
    turns: tokio::sync::Semaphore,
    buffers: Mutex<Vec<Vec<Block>>>,
}

static POOL: LazyLock<Pool> = LazyLock::new(|| Pool {
    turns: tokio::sync::Semaphore::new(*HASHERS),
    buffers: Mutex::new(Vec::new()),
});

/// Runs `f` over at least `blocks` blocks of memory, on the blocking pool, once a
/// turn is free (at most [`HASHERS`] at a time; 503 `busy` after waiting `wait`).
/// Argon2 writes every block before it reads it, so a buffer needs no clearing
/// between hashes.
async fn with_memory<T: Send + 'static>(
    wait: std::time::Duration,
    blocks: usize,
    f: impl FnOnce(&mut [Block]) -> anyhow::Result<T> + Send + 'static,
) -> Result<T, AppError> {
    let Ok(turn) = tokio::time::timeout(wait, POOL.turns.acquire()).await else {
        return Err(AppError::new(
            ErrorCode::Busy,
            "too many sign-ins at once; try again in a moment",
        )
        .with_header(actix_web::http::header::RETRY_AFTER, "1"));
    };
    let turn = turn.expect("the semaphore is never closed");
    actix_web::web::block(move || {
        let _turn = turn;
        if blocks > POOLED_BLOCKS {
            return f(&mut vec![Block::default(); blocks]);
        }
        let taken = POOL
            .buffers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut buffer = taken.unwrap_or_default();
        if buffer.len() < blocks {
            buffer.resize(blocks, Block::default());
        }
        let out = f(&mut buffer);
        POOL.buffers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(buffer);
        out
    })
    .await
    .map_err(|e| AppError::Internal(anyhow::anyhow!("blocking pool: {e}")))?
    .map_err(AppError::Internal)
}

/// A new hash of `password` at the shipped cost, with a random 16-byte salt.
pub async fn hash(password: String) -> Result<String, AppError> {
    let params = Params::default();
    let blocks = params.block_count();
    with_memory(TURN_WAIT, blocks, move |memory| {
        let mut salt = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut salt);
        let argon2 = Argon2::new(Algorithm::Argon2id, Version::V0x13, params.clone());
        let mut out = [0u8; Params::DEFAULT_OUTPUT_LEN];
        argon2
            .hash_password_into_with_memory(password.as_bytes(), &salt, &mut out, memory)
            .map_err(|e| anyhow::anyhow!("argon2 hash failed: {e}"))?;
        let salt =
            SaltString::encode_b64(&salt).map_err(|e| anyhow::anyhow!("argon2 salt: {e}"))?;
        let phc = PasswordHash {
            algorithm: Algorithm::Argon2id.ident(),
            version: Some(Version::V0x13.into()),
            params: ParamsString::try_from(&params)
                .map_err(|e| anyhow::anyhow!("argon2 params: {e}"))?,
            salt: Some(salt.as_salt()),
            hash: Some(Output::new(&out).map_err(|e| anyhow::anyhow!("argon2 output: {e}"))?),
        };
        Ok(phc.to_string())
    })
    .await
}

/// Whether `stored` is a PHC string [`verify`] can check.
pub fn parses(stored: &str) -> bool {
    PasswordHash::new(stored)
        .and_then(|parsed| Params::try_from(&parsed))
        .is_ok()
}

/// Whether `password` matches the stored PHC string `stored` (any Argon2 variant,
/// version and cost it names; compared in constant time). A stored string that
/// does not parse is an error, not a mismatch.
pub async fn verify(stored: String, password: String) -> Result<bool, AppError> {
    verify_within(TURN_WAIT, stored, password).await
}

async fn verify_within(
    wait: std::time::Duration,
    stored: String,
    password: String,
) -> Result<bool, AppError> {
    let blocks = PasswordHash::new(&stored)
        .and_then(|parsed| Params::try_from(&parsed))
        .map_err(|e| AppError::Internal(anyhow::anyhow!("stored hash: {e}")))?
        .block_count();
    with_memory(wait, blocks, move |memory| {
        let parsed = PasswordHash::new(&stored).map_err(|e| anyhow::anyhow!("stored hash: {e}"))?;
        let algorithm = Algorithm::try_from(parsed.algorithm)
            .map_err(|e| anyhow::anyhow!("stored hash: {e}"))?;
        let version = match parsed.version {
            Some(v) => Version::try_from(v).map_err(|e| anyhow::anyhow!("stored hash: {e}"))?,
            None => Version::default(),
        };
        let params = Params::try_from(&parsed).map_err(|e| anyhow::anyhow!("stored hash: {e}"))?;
        let (Some(salt), Some(expected)) = (parsed.salt, parsed.hash) else {
            anyhow::bail!("stored hash: no salt or no hash");
        };
        let mut salt_buf = [0u8; 64];
        let salt = salt
            .decode_b64(&mut salt_buf)
            .map_err(|e| anyhow::anyhow!("stored hash: {e}"))?;
        let mut out = vec![0u8; expected.len()];
        Argon2::new(algorithm, version, params)
            .hash_password_into_with_memory(password.as_bytes(), salt, &mut out, memory)
            .map_err(|e| anyhow::anyhow!("argon2 hash failed: {e}"))?;
        let computed = Output::new(&out).map_err(|e| anyhow::anyhow!("argon2 output: {e}"))?;
        // `Output`'s equality is constant-time.
        Ok(computed == expected)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use argon2::password_hash::{PasswordHasher, PasswordVerifier};

    #[actix_web::test]
    async fn the_hashes_are_the_librarys_own_both_ways() {
        // Ours verifies with the library, and right or wrong, the library's with ours.
        let ours = hash("correct horse".into()).await.unwrap();
        assert!(
            ours.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "{ours}"
        );
        let parsed = PasswordHash::new(&ours).unwrap();
        assert!(
            Argon2::default()
                .verify_password(b"correct horse", &parsed)
                .is_ok()
        );
        assert!(
            Argon2::default()
                .verify_password(b"correct horsE", &parsed)
                .is_err()
        );

        let salt = SaltString::encode_b64(b"sixteen byte salt").unwrap();
        let theirs = Argon2::default()
            .hash_password(b"battery staple", &salt)
            .unwrap()
            .to_string();
        assert!(
            verify(theirs.clone(), "battery staple".into())
                .await
                .unwrap()
        );
        assert!(!verify(theirs, "battery stapler".into()).await.unwrap());
        assert!(verify(ours.clone(), "correct horse".into()).await.unwrap());
        assert!(!verify(ours, String::new()).await.unwrap());
    }

    #[actix_web::test]
    async fn another_cost_and_variant_verify_and_a_broken_string_is_an_error() {
        let params = Params::new(8 * 1024, 1, 1, Some(24)).unwrap();
        let salt = SaltString::encode_b64(b"another salt!!").unwrap();
        for algorithm in [Algorithm::Argon2i, Algorithm::Argon2id] {
            let stored = Argon2::new(algorithm, Version::V0x10, params.clone())
                .hash_password(b"pw", &salt)
                .unwrap()
                .to_string();
            assert!(
                verify(stored.clone(), "pw".into()).await.unwrap(),
                "{stored}"
            );
            assert!(!verify(stored, "pW".into()).await.unwrap());
        }
        // An error (500, the stored hash named), never a mismatch.
        for broken in ["$argon2id$v=19$m=19456", "not a hash"] {
            let err = verify(broken.into(), "pw".into()).await.unwrap_err();
            assert!(
                matches!(&err, AppError::Internal(e) if e.to_string().contains("stored hash")),
                "{broken}: {err:?}"
            );
        }
    }

    #[actix_web::test]
    async fn a_sign_in_that_gets_no_turn_in_time_is_told_busy() {
        let stored = hash("pw".into()).await.unwrap();
        let short = std::time::Duration::from_millis(50);
        let all = POOL.turns.acquire_many(*HASHERS as u32).await.unwrap();
        let refused = verify_within(short, stored.clone(), "pw".into())
            .await
            .unwrap_err();
        assert_eq!(refused.code(), "busy");
        drop(all);
        assert!(verify_within(short, stored, "pw".into()).await.unwrap());
    }

    #[actix_web::test]
    async fn many_at_once_share_one_buffer_per_core() {
        let all: Vec<_> = (0..8).map(|i| hash(format!("pw{i}"))).collect();
        let hashes = futures_util::future::join_all(all).await;
        for (i, h) in hashes.into_iter().enumerate() {
            assert!(verify(h.unwrap(), format!("pw{i}")).await.unwrap());
        }
        let pooled = POOL.buffers.lock().unwrap().len();
        assert!(
            pooled <= *HASHERS,
            "{pooled} buffers for {} turns",
            *HASHERS
        );
    }
}
