//! The official Hetzner Cloud Go client against the simulator's Hetzner dialect: "where the
//! simulator and the client disagree, the client wins".
//!
//! ```text
//!  this test ─► Sim (CloudKind::Hetzner, 127.0.0.1:0, actions of 200 ms, worker-1's assigns fail)
//!      │                ▲ HTTP /v1
//!      └─ runs ─► tools/hcloud-fidelity (hcloud-go v2.52.0; HCLOUD_ENDPOINT, HCLOUD_TOKEN)
//!                 prints "ok <check>" / "FAIL <check>: <why>", exits 1 on any failure
//! ```
//!
//! The program is built by `scripts/hcloud-fidelity-env` (`scripts/setup` runs it) into the
//! testenv cache, and `scripts/test` exports its path as `BATON_HCLOUD_FIDELITY`; what it checks
//! is listed in `docs/testing.md` ("hcloud-go against the simulator").
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use baton_sim::{CloudKind, HetznerSettings, Latency, Sim};

/// A server of the default topology whose assign actions the simulator ends in `error`: the
/// program's failed-action check uses it (and no other check does: they use the first two).
const FAIL_SERVER: &str = "worker-1";

/// The program's path: `BATON_HCLOUD_FIDELITY`, which `scripts/test` exports. Unset, the test
/// fails with the command that builds it (it never passes without running the client).
fn fidelity_bin() -> PathBuf {
    let Some(path) = std::env::var_os("BATON_HCLOUD_FIDELITY").map(PathBuf::from) else {
        panic!(
            "BATON_HCLOUD_FIDELITY is not set: build the hcloud-go program with \
             `export BATON_HCLOUD_FIDELITY=$(scripts/hcloud-fidelity-env)` (scripts/test does)"
        );
    };
    assert!(
        path.is_file(),
        "BATON_HCLOUD_FIDELITY={} is not a file: run scripts/hcloud-fidelity-env (scripts/setup does)",
        path.display()
    );
    path
}

#[tokio::test]
async fn hcloud_go_accepts_what_the_hetzner_simulator_says() {
    let bin = fidelity_bin();
    let sim = Sim::builder()
        .cloud(CloudKind::Hetzner)
        .hetzner(HetznerSettings {
            // Long enough that a second assign meets a running action, short enough for a quick
            // run (the program polls every 50 ms).
            action_ms: Latency::Fixed(200),
            action_fail_servers: vec![FAIL_SERVER.to_owned()],
            ..HetznerSettings::default()
        })
        .bind("127.0.0.1:0".parse().unwrap())
        .await
        .expect("simulator");
    let settings = sim.hetzner_settings().expect("the simulator speaks Hetzner");
    let endpoint = sim.base_url().join("v1").unwrap();
    // A clean environment: no proxy variables or HCLOUD_* of the caller's reach the client.
    let run = tokio::process::Command::new(&bin)
        .env_clear()
        .env("HCLOUD_ENDPOINT", endpoint.as_str())
        .env("HCLOUD_TOKEN", sim.api_key())
        .env("HCLOUD_FIDELITY_RATE_LIMIT", settings.bucket.to_string())
        .env("HCLOUD_FIDELITY_FAIL_SERVER", FAIL_SERVER)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run).await;
    // Stopped before any assertion; a panic above drops it as well.
    sim.shutdown().await;
    let out = out
        .unwrap_or_else(|_| panic!("{} ran for 5 minutes", bin.display()))
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{} ({}) failed: {}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        bin.display(),
        endpoint,
        out.status
    );
    // Every check ran: none was skipped for a setting this test did not give.
    assert!(
        !stdout.lines().any(|l| l.starts_with("skip ")),
        "a check was skipped:\n{stdout}"
    );
    assert!(
        stdout.lines().any(|l| l == "ok action-error") && stdout.lines().any(|l| l == "ok cleanup"),
        "the program's output lacks checks:\n{stdout}"
    );
}
