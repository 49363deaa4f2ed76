//! The `baton` binary as a user runs it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report

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
    for sub in [
        "bootstrap",
        "controller",
        "dns",
        "sni",
        "agent",
        "sim",
        "config",
        "version",
    ] {
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
fn bootstrap_without_a_config_file_is_a_usage_error() {
    let out = baton().arg("bootstrap").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--config"));
}

#[test]
fn agent_with_a_bad_fip_exits_2_naming_the_flag_and_value() {
    for (args, want) in [
        (
            &["agent", "--no-kube", "--fip", "127.0.0.1"][..],
            "--fip 127.0.0.1: cannot be a Floating IP (loopback)",
        ),
        (&["agent", "--no-kube"][..], "--no-kube"),
        (&["agent", "--fip", "api.example.com"][..], "api.example.com"),
    ] {
        let out = baton().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}

#[test]
fn controller_without_credentials_exits_2_naming_the_setting() {
    let out = baton()
        .args(["controller", "--admin-listen", "off"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("apiKey") && stderr.contains("CHERRY_API_KEY"),
        "{stderr}"
    );
}

/// `--api-key` would show the key to every local user (`ps`): every subcommand that reads the
/// cloud settings refuses it with exit 2, naming the variable and the file key to use instead,
/// and never echoes the key.
#[test]
fn the_api_key_flag_is_refused_naming_where_to_put_it() {
    const KEY: &str = "cli-test-api-key-4f1d";
    for args in [
        &["controller", "--admin-listen", "off", "--api-key", KEY][..],
        &["status", "--api-key", KEY],
        &["config", "show", "--api-key", KEY],
    ] {
        let out = baton().args(args).env_remove("CHERRY_API_KEY").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        for part in ["--api-key", "CHERRY_API_KEY", "apiKey", "--cloud-config"] {
            assert!(stderr.contains(part), "{args:?}: {part:?} in {stderr}");
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            !stderr.contains(KEY) && !stdout.contains(KEY),
            "{args:?}: the key echoed"
        );
    }
    let help = baton().args(["controller", "--help"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&help.stdout).contains("--api-key"),
        "a refused flag is not offered"
    );
}

#[test]
fn version_prints_the_package_version() {
    let out = baton().arg("version").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Stops a server child with SIGTERM and returns its exit code.
fn terminate(mut child: std::process::Child) -> Option<i32> {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    child.wait().unwrap().code()
}

fn retry<T>(mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..100 {
        if let Some(v) = f() {
            return v;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("gave up after 10s")
}

#[test]
fn dns_serve_answers_dig_and_stops_cleanly_on_sigterm() {
    let port = free_port();
    let child = baton()
        .args([
            "dns",
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--zone",
            "baton.test",
        ])
        .args(["--a", "api=198.51.100.10,203.0.113.5"])
        .spawn()
        .unwrap();
    let answers = retry(|| {
        let out = Command::new("dig")
            .args([
                "+short",
                "+time=1",
                "+tries=1",
                "-p",
                &port.to_string(),
                "@127.0.0.1",
                "api.baton.test",
                "A",
            ])
            .output()
            .expect("dig (bind9-dnsutils) is installed by scripts/setup");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (text.lines().count() == 2).then_some(text)
    });
    assert!(
        answers.contains("198.51.100.10") && answers.contains("203.0.113.5"),
        "{answers}"
    );
    assert_eq!(terminate(child), Some(0));
}

#[test]
fn dns_serve_rejects_a_bad_address_naming_the_flag() {
    let out = baton()
        .args([
            "dns",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--zone",
            "baton.test",
            "--a",
            "api=192.0.2.300",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--a") && stderr.contains("192.0.2.300"),
        "{stderr}"
    );
}

#[test]
fn sim_serves_the_default_project_and_requires_the_token() {
    let port = free_port();
    let child = baton()
        .args(["sim", "--listen", &format!("127.0.0.1:{port}")])
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/v1/projects/123456");
    let status = |token: &str| {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
            .arg(format!("Authorization: Bearer {token}"))
            .arg(&url)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    retry(|| (status("sim-token") == "200").then_some(()));
    assert_eq!(status("wrong-token"), "401");
    assert_eq!(terminate(child), Some(0));
}

/// Runs `baton sim` with stderr to a pipe until it has logged that it listens, stops it, and
/// returns everything it wrote to stderr.
fn sim_stderr(extra: &[&str]) -> String {
    use std::io::Read as _;
    let port = free_port();
    let mut child = baton()
        .args(["sim", "--listen", &format!("127.0.0.1:{port}")])
        .args(extra)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    retry(|| std::net::TcpStream::connect(("127.0.0.1", port)).ok());
    let mut stderr = child.stderr.take().unwrap();
    assert_eq!(terminate(child), Some(0));
    let mut text = String::new();
    stderr.read_to_string(&mut text).unwrap();
    text
}

/// A supervisor may stop a server the moment its port answers: that is a clean stop (exit 0),
/// never a death by the signal's default action. 30 starts, each stopped as soon as a connect
/// succeeds (tried every millisecond): before the handlers were installed ahead of the bind,
/// about 4 in 10 died by the signal.
#[test]
fn a_sigterm_as_soon_as_the_port_accepts_stops_the_server_cleanly() {
    for attempt in 0..30 {
        let port = free_port();
        let child = baton()
            .args(["sim", "--listen", &format!("127.0.0.1:{port}")])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "never listened"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(terminate(child), Some(0), "start {attempt}: not a clean stop");
    }
}

#[test]
fn logs_to_a_pipe_or_file_carry_no_colour_codes() {
    // a pipe: what journald, a pod's log and `2>file | …` see
    let piped = sim_stderr(&[]);
    assert!(piped.contains("simulator listening"), "{piped}");
    assert!(!piped.contains("\x1b["), "ANSI codes in piped logs: {piped:?}");

    // a file
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("baton.log");
    let port = free_port();
    let child = baton()
        .args(["sim", "--listen", &format!("127.0.0.1:{port}")])
        .stderr(std::fs::File::create(&path).unwrap())
        .spawn()
        .unwrap();
    retry(|| std::net::TcpStream::connect(("127.0.0.1", port)).ok());
    assert_eq!(terminate(child), Some(0));
    let logged = std::fs::read_to_string(&path).unwrap();
    assert!(logged.contains("signal received"), "{logged}");
    assert!(
        !logged.contains("\x1b["),
        "ANSI codes in the log file: {logged:?}"
    );

    // the detection, not the absence of colour support, is what keeps them out
    let forced = sim_stderr(&["--log-color", "always"]);
    assert!(forced.contains("\x1b["), "{forced:?}");
    let json = sim_stderr(&["--log-format", "json", "--log-color", "always"]);
    assert!(!json.contains("\x1b["), "{json:?}");
    for line in json.lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap();
    }
}
