//! Memory and time of 64 password checks at once, the way the server checked them
//! before (the argon2 library's `verify_password` on actix's blocking pool, each
//! hash allocating its own 19 MiB) or as it checks them now
//! (`stampede::auth::password::verify`: one hash per core at a time, in memory
//! kept per core). Run one way per process, so its peak RSS is its own:
//!
//! ```text
//! cargo build --release --example password_memory
//! /usr/bin/time -v target/release/examples/password_memory library 2>&1 | grep -E 'at once|Maximum resident'
//! /usr/bin/time -v target/release/examples/password_memory pooled 2>&1 | grep -E 'at once|Maximum resident'
//! ```
//!
//! Needs no Redis or Postgres. Prints the time of each of three bursts.

use std::time::Instant;

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};

#[actix_web::main]
async fn main() {
    let way = std::env::args().nth(1).unwrap_or_default();
    if way != "library" && way != "pooled" {
        eprintln!("usage: password_memory library|pooled");
        std::process::exit(2);
    }
    let salt = SaltString::encode_b64(b"sixteen byte salt").expect("a valid salt");
    let stored = Argon2::default()
        .hash_password(b"pw", &salt)
        .expect("a hash")
        .to_string();
    for _ in 0..3 {
        let started = Instant::now();
        let checks: Vec<_> = (0..64)
            .map(|_| {
                let stored = stored.clone();
                let library = way == "library";
                async move {
                    if library {
                        actix_web::web::block(move || {
                            let parsed = PasswordHash::new(&stored).expect("a valid hash");
                            Argon2::default().verify_password(b"pw", &parsed).is_ok()
                        })
                        .await
                        .expect("the blocking pool")
                    } else {
                        stampede::auth::password::verify(stored, "pw".into())
                            .await
                            .expect("a check")
                    }
                }
            })
            .collect();
        let ok = futures_util::future::join_all(checks).await;
        assert!(ok.iter().all(|&ok| ok));
        println!(
            "{way}: 64 at once in {:.2} s",
            started.elapsed().as_secs_f64()
        );
    }
}
