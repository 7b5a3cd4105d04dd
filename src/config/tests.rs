//! The configuration's tests: sources, overrides, checks.

use super::env::ENV;
use super::*;
use std::collections::HashMap;

#[test]
fn every_variable_is_read_once_under_its_name() {
    let mut seen = std::collections::HashSet::new();
    for (name, _) in ENV {
        assert!(seen.insert(*name), "{name} is in the table twice");
        assert!(
            name.starts_with("STAMPEDE_") || ["DATABASE_URL", "REDIS_URL"].contains(name),
            "{name}"
        );
    }
}

#[test]
fn env_overrides_defaults() {
    let env: HashMap<&str, &str> = HashMap::from([
        ("STAMPEDE_LISTEN", "127.0.0.1:0"),
        ("REDIS_URL", "redis://x/"),
        ("STAMPEDE_TRUSTED_PROXIES", "10.0.0.1, ::1"),
    ]);
    let mut c = Config::default();
    c.apply_env(|k| env.get(k).map(|v| v.to_string())).unwrap();
    assert_eq!(c.listen.port(), 0);
    assert_eq!(c.redis_url, "redis://x/");
    assert_eq!(c.trusted_proxies.len(), 2);
}

#[test]
fn a_cluster_is_a_comma_separated_list_of_redis_urls() {
    let mut c = Config {
        token_secret: "x".repeat(32),
        ..Config::default()
    };
    c.apply_env(|k| {
        (k == "STAMPEDE_REDIS_CLUSTER")
            .then(|| "redis://127.0.0.1:7001, redis://127.0.0.1:7002,".to_string())
    })
    .unwrap();
    assert_eq!(
        c.redis_cluster,
        ["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"]
    );
    c.validate().unwrap();
    c.redis_cluster = vec!["127.0.0.1:7001".into()];
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("STAMPEDE_REDIS_CLUSTER"), "{err}");
    let toml: Config = toml::from_str(r#"redis_cluster = ["redis://a:7001"]"#).unwrap();
    assert_eq!(toml.redis_cluster, ["redis://a:7001"]);
}

#[test]
fn batches_in_flight_default_to_two_and_to_four_with_replica_acks() {
    let mut c = Config {
        token_secret: "x".repeat(32),
        ..Config::default()
    };
    assert_eq!(c.batch_in_flight(), 2);
    c.replica_acks = 1;
    assert_eq!(c.batch_in_flight(), 4);
    // Set, it is what it says, acknowledgements or not.
    c.apply_env(|k| (k == "STAMPEDE_BATCH_IN_FLIGHT").then(|| "3".to_string()))
        .unwrap();
    assert_eq!(c.batch_in_flight(), 3);
    c.replica_acks = 0;
    assert_eq!(c.batch_in_flight(), 3);
    c.validate().unwrap();
    let toml: Config = toml::from_str("batch_in_flight = 1").unwrap();
    assert_eq!(toml.batch_in_flight(), 1);
    for bad in ["0", "65"] {
        c.apply_env(|k| (k == "STAMPEDE_BATCH_IN_FLIGHT").then(|| bad.to_string()))
            .unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("STAMPEDE_BATCH_IN_FLIGHT"), "{err}");
    }
}

#[test]
fn batch_max_is_one_to_1024() {
    let mut c = Config {
        token_secret: "x".repeat(32),
        ..Config::default()
    };
    for good in ["1", "64", "1024"] {
        c.apply_env(|k| (k == "STAMPEDE_BATCH_MAX").then(|| good.to_string()))
            .unwrap();
        c.validate().unwrap();
    }
    for bad in ["0", "1025"] {
        c.apply_env(|k| (k == "STAMPEDE_BATCH_MAX").then(|| bad.to_string()))
            .unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("STAMPEDE_BATCH_MAX"), "{err}");
    }
}

#[test]
fn bad_env_value_names_the_variable() {
    let mut c = Config::default();
    let err = c
        .apply_env(|k| (k == "STAMPEDE_LISTEN").then(|| "nope".to_string()))
        .unwrap_err();
    assert!(err.to_string().contains("STAMPEDE_LISTEN"));
}

#[test]
fn debug_never_prints_secrets() {
    let c = Config {
        token_secret: "supersecretsupersecretsupersecret".into(),
        database_url: "postgres://u:hunter2@h/db".into(),
        ..Config::default()
    };
    let shown = format!("{c:?}");
    assert!(!shown.contains("supersecret"));
    assert!(!shown.contains("hunter2"));
}

#[test]
fn limits_can_be_switched_off_from_the_environment() {
    let mut c = Config::default();
    assert!(c.limits.enabled);
    c.apply_env(|k| (k == "STAMPEDE_LIMITS").then(|| "off".to_string()))
        .unwrap();
    assert!(!c.limits.enabled);
    let err = c
        .apply_env(|k| (k == "STAMPEDE_LIMITS").then(|| "maybe".to_string()))
        .unwrap_err();
    assert!(err.to_string().contains("STAMPEDE_LIMITS"));
}

#[test]
fn limits_section_parses_and_replaces_the_default_policies() {
    let c: Config = toml::from_str(
        r#"
        trusted_proxies = ["10.0.0.1"]
        [limits]
        enabled = true
        [[limits.policies]]
        name = "buy-user"
        route = "buy"
        subject = "user"
        algorithm = "token_bucket"
        capacity = 3
        refill_per_sec = 1.5
        "#,
    )
    .unwrap();
    assert_eq!(c.limits.policies.len(), 1);
    assert_eq!(c.limits.timeout_ms, 1000, "unset fields keep their default");
    let c = Config {
        token_secret: "x".repeat(32),
        ..c
    };
    c.validate().unwrap();
    let bad: Config = toml::from_str(
        "[[limits.policies]]\nname = \"p\"\nroute = \"buy\"\nsubject = \"ip\"\nalgorithm = \"fixed_window\"\n",
    )
    .unwrap();
    let bad = Config {
        token_secret: "x".repeat(32),
        ..bad
    };
    assert!(
        bad.validate()
            .unwrap_err()
            .to_string()
            .contains("window_ms")
    );
    let err = toml::from_str::<Config>("[limits]\nenabeld = false\n").unwrap_err();
    assert!(err.to_string().contains("unknown field `enabeld`"), "{err}");
}

#[test]
fn durations_keep_their_units_in_files_and_variables() {
    let c: Config = toml::from_str(
        "sweep_ms = 0\nkeep_alive_secs = 7\ntoken_ttl_secs = 60\n\
         [settle]\nblock_ms = 250\nclaim_idle_ms = 5000\n",
    )
    .unwrap();
    assert_eq!(c.sweep, Duration::ZERO);
    assert_eq!(c.keep_alive, Duration::from_secs(7));
    assert_eq!(c.token_ttl, Duration::from_secs(60));
    assert_eq!(c.settle.block, Duration::from_millis(250));
    assert_eq!(c.settle.claim_idle, Duration::from_secs(5));
    assert_eq!(c.expire, Config::default().expire, "unset: the default");
    // A duration without its unit in the name is an unknown key, not a guess.
    for (file, key) in [
        ("sweep = 2000\n", "sweep"),
        ("[settle]\nblock = 1000\n", "block"),
    ] {
        let err = toml::from_str::<Config>(file).unwrap_err();
        assert!(
            err.to_string().contains(&format!("unknown field `{key}`")),
            "{err}"
        );
    }

    let env: HashMap<&str, &str> = HashMap::from([
        ("STAMPEDE_SWEEP_MS", "2500"),
        ("STAMPEDE_KEEP_ALIVE_SECS", " 9 "),
        ("STAMPEDE_TOKEN_TTL_SECS", "3600"),
        ("STAMPEDE_SETTLE_CLAIM_IDLE_MS", "1500"),
        ("STAMPEDE_SETTLE_WRITE_TIMEOUT_MS", "4000"),
    ]);
    let mut c = Config::default();
    c.apply_env(|k| env.get(k).map(|v| v.to_string())).unwrap();
    assert_eq!(c.sweep, Duration::from_millis(2500));
    assert_eq!(c.keep_alive, Duration::from_secs(9));
    assert_eq!(c.token_ttl, Duration::from_secs(3600));
    assert_eq!(c.settle.claim_idle, Duration::from_millis(1500));
    assert_eq!(c.settle.write_timeout, Duration::from_secs(4));
    let err = c
        .apply_env(|k| (k == "STAMPEDE_EXPIRE_MS").then(|| "1s".to_string()))
        .unwrap_err();
    assert!(err.to_string().contains("STAMPEDE_EXPIRE_MS"), "{err}");

    let shown = format!("{c:?}");
    for key in [
        "sweep_ms: 2500",
        "keep_alive_secs: 9",
        "token_ttl_secs: 3600",
        "claim_idle_ms: 1500",
        "write_timeout_ms: 4000",
        "block_ms: 1000",
    ] {
        assert!(shown.contains(key), "{key} in {shown}");
    }
}

#[test]
fn duration_bounds_are_checked_in_milliseconds() {
    let ok = Config {
        token_secret: "x".repeat(32),
        ..Config::default()
    };
    ok.validate().unwrap();
    let bad = [
        (
            Config {
                session_sync: Duration::ZERO,
                ..ok.clone()
            },
            "session_sync_ms",
        ),
        (
            Config {
                live_interval: Duration::from_millis(99),
                ..ok.clone()
            },
            "live_interval_ms",
        ),
        (
            Config {
                replica_ack_timeout: Duration::ZERO,
                replica_acks: 1,
                ..ok.clone()
            },
            "replica_ack_timeout_ms",
        ),
    ];
    for (c, field) in bad {
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
    let err = Config {
        replica_ack_timeout: Duration::from_millis(2000),
        replica_acks: 1,
        ..ok.clone()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(err.contains("must be 1 to 1999"), "{err}");
    // Without replica acknowledgements the WAIT's timeout is never used: a short
    // response timeout starts.
    Config {
        redis_response_timeout: Duration::from_millis(150),
        ..ok.clone()
    }
    .validate()
    .expect("a 150 ms response timeout without replica acks");
}

#[test]
fn short_secret_is_rejected() {
    let c = Config {
        token_secret: "short".into(),
        ..Config::default()
    };
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("token_secret"), "{err}");
}

#[test]
fn the_example_secrets_placeholders_are_refused() {
    let c = Config {
        token_secret: "CHANGE-ME-at-least-32-random-characters".into(),
        ..Config::default()
    };
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("token_secret") && err.contains("placeholder"),
        "{err}"
    );
    let c = Config {
        token_secret: "x".repeat(32),
        admin_password: Some("CHANGE-ME".into()),
        ..Config::default()
    };
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("admin_password"), "{err}");
    let c = Config {
        token_secret: "x".repeat(32),
        admin_password: Some("a-password-of-my-own".into()),
        ..Config::default()
    };
    c.validate().expect("a secret and a password of one's own");
}

#[test]
fn the_drain_period_is_read_in_ms_and_bounded_by_a_minute() {
    let mut c = Config {
        token_secret: "x".repeat(32),
        ..Config::default()
    };
    assert_eq!(c.drain, Duration::from_millis(5000));
    c.apply_env(|k| (k == "STAMPEDE_DRAIN_MS").then(|| "0".to_string()))
        .unwrap();
    assert_eq!(c.drain, Duration::ZERO);
    c.validate().unwrap();
    c.drain = Duration::from_millis(60_001);
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("STAMPEDE_DRAIN_MS"), "{err}");
}

#[test]
fn trusted_proxies_take_ranges_and_refuse_a_bad_one_by_name() {
    let mut c = Config::default();
    c.apply_env(|k| {
        (k == "STAMPEDE_TRUSTED_PROXIES").then(|| "127.0.0.1, 10.0.0.0/8 ,fd00::/8".to_string())
    })
    .unwrap();
    let shown: Vec<String> = c.trusted_proxies.iter().map(|n| n.to_string()).collect();
    assert_eq!(shown, ["127.0.0.1", "10.0.0.0/8", "fd00::/8"]);
    assert!(c.trusted_proxies[1].contains("10.200.3.4".parse().unwrap()));
    for bad in ["10.0.0.0/40", "10.0.0.1/8", "proxy.local", "10.0.0.0/8,"] {
        let got = Config::default()
            .apply_env(|k| (k == "STAMPEDE_TRUSTED_PROXIES").then(|| bad.to_string()))
            .map(|_| ());
        if bad.ends_with(',') {
            assert!(got.is_ok(), "a trailing comma is a blank, dropped: {bad}");
            continue;
        }
        let err = got.expect_err(bad).to_string();
        assert!(err.contains("STAMPEDE_TRUSTED_PROXIES"), "{bad}: {err}");
    }
    let c: Config = toml::from_str(r#"trusted_proxies = ["192.168.0.0/16"]"#).unwrap();
    assert_eq!(c.trusted_proxies[0].to_string(), "192.168.0.0/16");
    assert!(toml::from_str::<Config>(r#"trusted_proxies = ["192.168.0.1/16"]"#).is_err());
}
