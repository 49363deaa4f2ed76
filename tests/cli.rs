//! The `baton` binary as a user runs it.

use std::process::Command;

use clap::CommandFactory as _;

fn baton() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_baton"));
    // A clean environment: only what the test sets counts.
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    cmd
}

#[test]
fn cli_definition_is_valid() {
    baton::cli::Cli::command().debug_assert();
}

#[test]
fn help_lists_every_subcommand() {
    let out = baton().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for sub in ["bootstrap", "controller", "dns", "sim", "config", "version"] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(sub)),
            "`baton --help` does not list {sub}:\n{help}"
        );
    }
}

#[test]
fn config_show_reports_sources_and_never_the_api_key() {
    let secret = "cli-secret-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cloud-sa.json");
    std::fs::write(
        &file,
        format!(r#"{{"apiKey":"{secret}","projectID":"42","fipTag":"cp=file"}}"#),
    )
    .unwrap();
    let out = baton()
        .args(["config", "show", "--cloud-config"])
        .arg(&file)
        .args(["--region", "LT-Siauliai"])
        .env("CHERRY_FIP_TAG", "cp=env")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stdout.contains(secret) && !stderr.contains(secret),
        "{stdout}{stderr}"
    );
    let line = |key: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(line("apiKey ").contains("<redacted>"), "{stdout}");
    assert!(
        line("projectID").contains("42") && line("projectID").contains("file"),
        "{stdout}"
    );
    assert!(line("region").contains("flag --region"), "{stdout}");
    assert!(
        line("fipTag").contains("cp=env") && line("fipTag").contains("env CHERRY_FIP_TAG"),
        "{stdout}"
    );
    assert!(line("apiServerPort").contains("default"), "{stdout}");
}

#[test]
fn invalid_configuration_exits_2_naming_the_key() {
    let out = baton()
        .args(["config", "show"])
        .env("CHERRY_LOAD_BALANCER", "haproxy://")
        .env("CHERRY_API_KEY", "do-not-print-me")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("loadbalancer") && stderr.contains("CHERRY_LOAD_BALANCER"),
        "{stderr}"
    );
    assert!(stderr.contains("haproxy://"), "{stderr}");
    assert!(!stderr.contains("do-not-print-me"), "{stderr}");
}

#[test]
fn unbuilt_subcommands_refuse_to_run() {
    for sub in ["bootstrap", "controller"] {
        let out = baton().arg(sub).output().unwrap();
        assert_eq!(out.status.code(), Some(3), "baton {sub}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("not built yet"));
    }
}

#[test]
fn version_prints_the_package_version() {
    let out = baton().arg("version").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
}
