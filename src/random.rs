//! Random tokens: lock tokens, CSRF tokens, consumer-name suffixes. A leaf, so the
//! lock, settlement and recovery code need not import `auth` to get one.

/// `bytes` random bytes from the thread's CSPRNG, as lower-case hex.
pub fn token_hex(bytes: usize) -> String {
    use rand::RngCore;
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    buf.iter().map(|b| format!("{b:02x}")).collect()
}
