//! RFC 2136 against a real BIND 9 (Debian package `bind9`): push, re-push (no change), replace,
//! wrong key. `named` runs as a child on 127.0.0.1:<free port> with a temp config dir and a
//! TSIG key made by `tsig-keygen`; it is killed when the test ends.

// Test helpers outside #[test] fns: a failed step is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use baton_core::Secret;
use baton_dns::{DnsError, PushOutcome, PushTarget, RecordStore, Rfc2136Publisher, TsigKey};
use common::{BOOTSTRAP, FIP, addresses, api, api_int, bootstrap_store, dig, ip, name, query, udp_client};
use hickory_proto::rr::RecordType;

struct Named {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Named {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn require(binary: &str, package: &str) -> String {
    for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        let path = Path::new(dir).join(binary);
        if path.exists() {
            return path.to_string_lossy().into_owned();
        }
    }
    panic!(
        "`{binary}` is not installed: install the Debian package `{package}` (listed in .ci/apt-packages)"
    );
}

fn free_port() -> u16 {
    loop {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = udp.local_addr().unwrap().port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

fn keygen(name: &str) -> String {
    let out = Command::new(require("tsig-keygen", "bind9-utils"))
        .args(["-a", "hmac-sha256", name])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tsig-keygen failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

async fn start_named(key_conf: &str) -> Named {
    let named = require("named", "bind9");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let port = free_port();
    std::fs::write(dir.path().join("key.conf"), key_conf).unwrap();
    std::fs::write(
        dir.path().join("c1.example.com.zone"),
        "$TTL 30\n\
         @ IN SOA ns1.c1.example.com. hostmaster.c1.example.com. 1 3600 600 86400 30\n\
         @ IN NS ns1.c1.example.com.\n\
         ns1 IN A 127.0.0.1\n\
         api IN A 198.51.100.77\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("named.conf"),
        format!(
            r#"options {{
    directory "{d}";
    pid-file "{d}/named.pid";
    session-keyfile "{d}/session.key";
    managed-keys-directory "{d}";
    listen-on port {port} {{ 127.0.0.1; }};
    listen-on-v6 {{ none; }};
    recursion no;
    dnssec-validation no;
    notify no;
}};
controls {{ }};
include "{d}/key.conf";
zone "c1.example.com" {{
    type primary;
    file "{d}/c1.example.com.zone";
    allow-update {{ key "baton-test"; }};
}};
"#
        ),
    )
    .unwrap();
    let mut cmd = Command::new(named);
    cmd.args(["-g", "-4", "-n", "1", "-c"])
        .arg(dir.path().join("named.conf"));
    // Unprivileged: when the test runs as root, named drops to the `bind` user.
    if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        Command::new("chown")
            .args(["-R", "bind:bind", &d])
            .status()
            .unwrap();
        cmd.args(["-u", "bind"]);
    }
    let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let named = Named {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        _dir: dir,
    };
    // Wait until it answers for the zone.
    for _ in 0..100 {
        let out = Command::new("dig")
            .args([
                "@127.0.0.1",
                "-p",
                &port.to_string(),
                "+time=1",
                "+tries=1",
                "+short",
            ])
            .args(["c1.example.com", "SOA"])
            .output();
        if out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("hostmaster")) {
            return named;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("named did not start serving c1.example.com on port {port}");
}

fn target(addr: SocketAddr) -> PushTarget {
    let mut t = PushTarget::new(addr, name("c1.example.com"));
    t.timeout = Duration::from_secs(2);
    t
}

async fn bind_answers(addr: SocketAddr, qname: &str) -> HashSet<IpAddr> {
    let mut client = udp_client(addr).await;
    addresses(&query(&mut client, qname, RecordType::A).await)
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_repush_replace_and_wrong_key_against_bind() {
    let key_conf = keygen("baton-test");
    let named = start_named(&key_conf).await;
    let key = TsigKey::parse(&key_conf).unwrap();
    let publisher = Rfc2136Publisher::new(target(named.addr), key.clone());

    // 1. Bootstrap records: replaces the pre-existing api A and creates api-int.
    let store = bootstrap_store();
    assert_eq!(
        publisher.push(&store.snapshot()).await.unwrap(),
        PushOutcome::Changed
    );
    let both = HashSet::from([ip(BOOTSTRAP), ip(FIP)]);
    assert_eq!(bind_answers(named.addr, "api.c1.example.com.").await, both);
    assert_eq!(bind_answers(named.addr, "api-int.c1.example.com.").await, both);
    let out = dig(named.addr, &["api.c1.example.com", "A", "+short"]).await;
    assert_eq!(
        out.lines().collect::<HashSet<_>>(),
        HashSet::from([BOOTSTRAP, FIP])
    );

    // 2. Idempotent: the same records again send nothing.
    assert_eq!(
        publisher.push(&store.snapshot()).await.unwrap(),
        PushOutcome::Unchanged
    );
    publisher.verify(&store.snapshot()).await.unwrap();

    // 3. Replace: the bootstrap host leaves.
    store.remove_address(&api(), ip(BOOTSTRAP));
    store.remove_address(&api_int(), ip(BOOTSTRAP));
    assert_eq!(
        publisher.push(&store.snapshot()).await.unwrap(),
        PushOutcome::Changed
    );
    assert_eq!(
        bind_answers(named.addr, "api.c1.example.com.").await,
        HashSet::from([ip(FIP)])
    );
    assert_eq!(
        bind_answers(named.addr, "api-int.c1.example.com.").await,
        HashSet::from([ip(FIP)])
    );

    // 4. Wrong secret under the right key name, and an unknown key name: authentication
    //    failures, and BIND's records stay as they were.
    let wrong_secret = TsigKey::new(
        "baton-test",
        "hmac-sha256",
        Secret::new("d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXkhIQ=="),
    )
    .unwrap();
    let unknown_name = TsigKey::new(
        "nobody",
        "hmac-sha256",
        Secret::new("d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXkhIQ=="),
    )
    .unwrap();
    let other = RecordStore::new();
    other.set_name(api(), [(ip("198.51.100.9"), true)]);
    for bad in [wrong_secret, unknown_name] {
        let err = Rfc2136Publisher::new(target(named.addr), bad)
            .push(&other.snapshot())
            .await
            .unwrap_err();
        assert!(
            matches!(err, DnsError::AuthFailed { .. }),
            "expected an auth failure, got {err:?}"
        );
        eprintln!("wrong key -> {err}");
        assert_eq!(err.category(), "auth");
        assert!(!err.to_string().contains("d3Jvbmc"), "no secret in errors");
    }
    assert_eq!(
        bind_answers(named.addr, "api.c1.example.com.").await,
        HashSet::from([ip(FIP)])
    );
}
