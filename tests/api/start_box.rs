//! The box `scripts/run` prints before it serves (`scripts/start-box`): it says
//! whether the rate limits are on, however they were turned off.

use std::process::Command;

/// The box as `scripts/start-box` prints it with `env` set (and nothing else that
/// turns the limits off).
fn start_box(env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new("bash");
    cmd.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/start-box"))
        .args(["http://127.0.0.1:8080", "somewhere"])
        .env_remove("STAMPEDE_LIMITS")
        .env_remove("STAMPEDE_CONFIG")
        .env("STAMPEDE_DEMO_PASSWORD", "demo-pw")
        .env("STAMPEDE_ADMIN_USERNAME", "admin")
        .env("STAMPEDE_ADMIN_PASSWORD", "admin-pw");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("bash runs scripts/start-box");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn limits_line(text: &str) -> &str {
    text.lines()
        .find(|l| l.contains("Rate limits"))
        .unwrap_or_else(|| panic!("no rate limits line in\n{text}"))
}

#[test]
fn the_start_box_says_when_the_rate_limits_are_off() {
    let shown = start_box(&[]);
    assert!(shown.contains("open http://127.0.0.1:8080"), "{shown}");
    assert!(shown.contains("alice / demo-pw"), "{shown}");
    assert!(shown.contains("admin / admin-pw"), "{shown}");
    assert!(limits_line(&shown).contains("Rate limits  on"), "{shown}");

    for off in ["off", "OFF", "false", "0"] {
        let shown = start_box(&[("STAMPEDE_LIMITS", off)]);
        assert!(
            limits_line(&shown).contains("Rate limits  OFF"),
            "{off}: {shown}"
        );
    }

    // Turned off in the config file; the environment still wins, as in the server.
    let toml = std::env::temp_dir().join(format!("start-box-{}.toml", uuid::Uuid::new_v4()));
    std::fs::write(&toml, "[limits]\nenabled = false  # a load test\n").unwrap();
    let file = toml.to_str().unwrap();
    let shown = start_box(&[("STAMPEDE_CONFIG", file)]);
    assert!(limits_line(&shown).contains("OFF"), "{shown}");
    let shown = start_box(&[("STAMPEDE_CONFIG", file), ("STAMPEDE_LIMITS", "on")]);
    assert!(limits_line(&shown).contains("Rate limits  on"), "{shown}");
    // `enabled = false` of another table is not the limits'.
    std::fs::write(
        &toml,
        "[limits]\ntimeout_ms = 5\n[other]\nenabled = false\n",
    )
    .unwrap();
    let shown = start_box(&[("STAMPEDE_CONFIG", file)]);
    assert!(limits_line(&shown).contains("Rate limits  on"), "{shown}");
    std::fs::remove_file(&toml).unwrap();
}
