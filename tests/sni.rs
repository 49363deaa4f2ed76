//! `baton sni serve` in the lab in front of three tenant clusters: three real control planes,
//! each with its own etcd (and etcd prefix), its own CA, serving certificate and client
//! certificate. Real HTTPS clients reach each tenant's API through the one router address with
//! the tenant's host name as SNI and authenticate with the tenant's client certificate, which
//! only that tenant's API server accepts (TLS is never terminated on the way).
//!
//! The failover tests put the router where it ships: on a hosting cluster's control-plane lab
//! nodes, behind that cluster's control-plane FIP, which the simulator routes to its holder as
//! the cloud does (`baton agent` on each node accepts it; nothing is spliced).
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report

mod common;

/// The binary under test.
const BATON: &str = env!("CARGO_BIN_EXE_baton");

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_testbed::{ControlPlane, Options, lab};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::PostParams;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// The shared address every tenant's API name resolves to (a lab FIP).
fn router_addr() -> SocketAddr {
    SocketAddr::new(lab::fip(100), 443)
}
/// The PROXY protocol listener (in-cluster clients that send no SNI).
fn proxy_addr() -> SocketAddr {
    SocketAddr::new(lab::fip(101), 443)
}
/// Each test has its own network namespace, so a fixed port is free.
const ADMIN: &str = "127.0.0.1:9591";
/// The router's DNS server for the tenants' names: port 53, so that a stub resolver (kubectl's,
/// through its own /etc/resolv.conf) can ask it.
const DNS: &str = "127.0.0.1:53";

/// `dig +short NAME A` against the router's DNS server (dig is installed by scripts/setup).
async fn dig(name: &str) -> String {
    let (ip, port) = DNS.split_once(':').unwrap();
    let out = Command::new("dig")
        .args([
            &format!("@{ip}"),
            "-p",
            port,
            "+short",
            "+time=2",
            "+tries=1",
            name,
            "A",
        ])
        .output()
        .await
        .expect("dig (Debian's bind9-dnsutils, installed by scripts/setup)");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

struct Tenant {
    name: &'static str,
    cp: ControlPlane,
}

impl Tenant {
    fn host(&self) -> String {
        format!("api.{}.baton.test", self.name)
    }

    /// `HOST=ADDR,…` for the router: every API server of the tenant.
    fn route(&self) -> String {
        let addrs: Vec<String> = self
            .cp
            .addresses()
            .iter()
            .map(|ip| SocketAddr::new(*ip, baton_testbed::APISERVER_PORT).to_string())
            .collect();
        format!("{}={}", self.host(), addrs.join(","))
    }
}

async fn tenant(name: &'static str, servers: &[u8]) -> Tenant {
    let cp = ControlPlane::start(Options {
        servers: servers.iter().map(|n| lab::public_ip(*n)).collect(),
        extra_sans: vec![
            format!("api.{name}.baton.test"),
            format!("api-alt.{name}.baton.test"),
        ],
        etcd_prefix: format!("/{name}"),
        ..Options::default()
    })
    .await
    .unwrap();
    // A namespace only this tenant has, to tell the clusters apart through the router.
    let ns: Api<Namespace> = Api::all(cp.client(0).unwrap());
    let marker: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("tenant-{name}")}
    }))
    .unwrap();
    ns.create(&PostParams::default(), &marker).await.unwrap();
    Tenant { name, cp }
}

/// An HTTPS client that trusts `ca` (the tenant's CA), presents `cert`, and resolves `host`
/// to the router: the request's SNI is `host`, as a client of `https://host` sends it.
fn client_via_router(host: &str, ca_der: &[u8], cert: (&str, &str)) -> reqwest::Client {
    client_via(host, ca_der, cert, router_addr())
}

/// [`client_via_router`] with the name resolved to `to`.
fn client_via(host: &str, ca_der: &[u8], cert: (&str, &str), to: SocketAddr) -> reqwest::Client {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(ca_der.to_vec()))
        .unwrap();
    let chain = rustls_pemfile::certs(&mut cert.0.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls_pemfile::private_key(&mut cert.1.as_bytes())
        .unwrap()
        .unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .resolve(host, to)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// `GET https://<host>/api/v1/namespaces` through the router: the status and the names.
async fn namespaces(client: &reqwest::Client, host: &str) -> anyhow::Result<(u16, Vec<String>)> {
    let r = client
        .get(format!("https://{host}/api/v1/namespaces"))
        .timeout(Duration::from_secs(10))
        .send()
        .await?;
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await?;
    let names = body["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    Ok((status, names))
}

fn router(routes_file: Option<&Path>, log: &Path, flags: &[String]) -> Child {
    let log = std::fs::File::create(log).unwrap();
    let file: Vec<&str> = routes_file
        .map(|f| vec!["--routes-file", f.to_str().unwrap()])
        .unwrap_or_default();
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["sni", "serve", "--listen", &router_addr().to_string()])
        .args(["--proxy-listen", &proxy_addr().to_string()])
        .args(flags)
        .args(file)
        .args([
            "--reload-interval-ms",
            "100",
            "--admin-listen",
            ADMIN,
            "--drain-s",
            "2",
        ])
        .env("BATON_LOG", "info,baton=debug")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn wait_listening(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "router not listening on {addr}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Replaces the routes file in one step (the router never reads half a file).
fn write_routes(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn metrics() -> String {
    baton_testbed::http_client(None)
        .unwrap()
        .get(format!("http://{ADMIN}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Names of the namespaces ADDED on a watch stream, in order, shared with the reader task.
type Seen = Arc<Mutex<Vec<String>>>;

/// Streams `GET /api/v1/namespaces?watch=1` from `rv`; records ADDED names until the stream
/// ends. The task's end is the sign that the connection dropped.
async fn watch(client: reqwest::Client, host: String, rv: String, seen: Seen) -> String {
    let url = format!("https://{host}/api/v1/namespaces?watch=1&resourceVersion={rv}&timeoutSeconds=300");
    let mut r = match client.get(url).send().await {
        Ok(r) => r,
        Err(e) => return format!("watch request failed: {e}"),
    };
    let mut pending = Vec::new();
    loop {
        match r.chunk().await {
            Ok(Some(bytes)) => {
                pending.extend_from_slice(&bytes);
                while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    let ev: serde_json::Value = serde_json::from_slice(&line).unwrap_or_default();
                    if ev["type"] == "ADDED"
                        && let Some(name) = ev["object"]["metadata"]["name"].as_str()
                    {
                        seen.lock().unwrap().push(name.to_owned());
                    }
                }
            }
            Ok(None) => return "watch stream ended".into(),
            Err(e) => return format!("watch stream failed: {e}"),
        }
    }
}

async fn create_ns(cp: &ControlPlane, name: &str) {
    let ns: Api<Namespace> = Api::all(cp.client(0).unwrap());
    let obj: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    ns.create(&PostParams::default(), &obj).await.unwrap();
}

async fn wait_seen(seen: &Seen, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !seen.lock().unwrap().iter().any(|n| n == name) {
        assert!(Instant::now() < deadline, "watch never showed {name}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The real kubectl (built by scripts/testenv from k8s.io/kubernetes) with a kubeconfig whose
/// server is `https://<tenant host>:443`, as a tenant's users have it: kubectl resolves the name
/// through baton's DNS (its own mount namespace, where /etc/resolv.conf names only the router's
/// DNS server), connects to the address it got, and lists the tenant's namespaces, with the
/// tenant's CA and client certificate. Returns kubectl's output (`namespace/<name>` lines).
async fn kubectl_namespaces(t: &Tenant, dir: &Path) -> String {
    use base64::Engine as _;
    let kubectl = baton_testbed::control_plane::testenv_dir()
        .unwrap()
        .join("bin/kubectl");
    assert!(
        kubectl.is_file(),
        "{} is missing: scripts/testenv builds it",
        kubectl.display()
    );
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let (cert, key) = t.cp.admin_client_cert();
    let cfg = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {n}\n  cluster:\n    server: https://{host}:{port}\n    \
         certificate-authority-data: {ca}\nusers:\n- name: admin\n  user:\n    \
         client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: {n}\n  context:\n    \
         cluster: {n}\n    user: admin\ncurrent-context: {n}\n",
        n = t.name,
        host = t.host(),
        port = router_addr().port(),
        ca = b64(t.cp.ca_pem()),
        cert = b64(cert),
        key = b64(key),
    );
    let path = dir.join(format!("kubeconfig-{}", t.name));
    std::fs::write(&path, cfg).unwrap();
    let (dns_ip, _) = DNS.split_once(':').unwrap();
    let resolv = dir.join("resolv.conf");
    std::fs::write(
        &resolv,
        format!("nameserver {dns_ip}\noptions timeout:2 attempts:1\n"),
    )
    .unwrap();
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n").unwrap();
    // unshare(1): a private mount namespace for kubectl alone, with the lab's resolver config
    // bound over the host's (the test's network namespace is inherited).
    let script = format!(
        "mount --bind {resolv} /etc/resolv.conf && mount --bind {hosts} /etc/hosts && \
         exec {kubectl} --kubeconfig {cfg} get namespaces -o name",
        resolv = resolv.display(),
        hosts = hosts.display(),
        kubectl = kubectl.display(),
        cfg = path.display(),
    );
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .output(),
    )
    .await
    .expect("kubectl timed out")
    .unwrap();
    assert!(
        out.status.success(),
        "kubectl (server https://{}) through baton's DNS and the router failed: {}",
        t.host(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// curl with `--haproxy-protocol` (PROXY v1) to the PROXY listener by IP.
async fn curl_via_proxy_protocol(t: &Tenant, dir: &Path) -> String {
    let (cert, key) = t.cp.admin_client_cert();
    let file = |name: &str, text: &str| {
        let p = dir.join(format!("{}-{name}", t.name));
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let (ca, cert, key) = (
        file("ca.crt", t.cp.ca_pem()),
        file("admin.crt", cert),
        file("admin.key", key),
    );
    let out = Command::new("curl")
        .args([
            "--silent",
            "--show-error",
            "--fail",
            "--max-time",
            "20",
            "--haproxy-protocol",
        ])
        .args(["--cacert", &ca, "--cert", &cert, "--key", &key])
        .arg(format!("https://{}/api/v1/namespaces", proxy_addr()))
        .output()
        .await
        .expect("curl");
    assert!(
        out.status.success(),
        "curl through the PROXY listener failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Lists namespaces through the router: `t`'s marker is there, no other tenant's is.
async fn only_its_own_namespaces(t: &Tenant, c: &reqwest::Client) {
    let (status, names) = namespaces(c, &t.host()).await.unwrap();
    assert_eq!(status, 200, "{}", t.name);
    assert!(
        names.contains(&format!("tenant-{}", t.name)),
        "{}: {names:?}",
        t.name
    );
    for other in ["t1", "t2", "t3"].iter().filter(|o| **o != t.name) {
        assert!(
            !names.contains(&format!("tenant-{other}")),
            "{} sees {other}",
            t.name
        );
    }
}

/// The router's counters after the three-tenant run.
async fn check_metrics() {
    let text = metrics().await;
    assert!(
        metric(&text, "baton_sni_connections_total{host=\"api.t1.baton.test\"}") >= 2.0,
        "{text}"
    );
    assert!(
        metric(&text, "baton_sni_connections_total{host=\"api.t3.baton.test\"}") >= 1.0,
        "{text}"
    );
    assert!(
        metric(&text, "baton_sni_rejected_total{reason=\"unknown_sni\"}") >= 2.0,
        "{text}"
    );
    assert!(
        metric(&text, "baton_sni_reloads_total{reason=\"applied\"}") >= 2.0,
        "{text}"
    );
    assert!(text.lines().any(|l| l == "baton_sni_hosts 3"), "{text}");
}

#[test]
fn three_tenants_behind_one_address_with_their_own_client_certificates() {
    lab::run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let (t1, t2, t3) = tokio::join!(tenant("t1", &[21, 22]), tenant("t2", &[23]), tenant("t3", &[24]));
        let routes = dir.path().join("routes");
        // t1 from a flag, t2 from the file; t3 comes later, while a watch streams from t1.
        write_routes(&routes, &format!("# tenants\n{}\n", t2.route()));
        let log = dir.path().join("router.log");
        let flags = [
            "--route".into(),
            t1.route(),
            "--proxy-route".into(),
            format!("{}=api.t2.baton.test", proxy_addr().ip()),
            "--dns-listen".into(),
            DNS.into(),
            "--dns-zone".into(),
            "baton.test".into(),
            "--dns-address".into(),
            router_addr().ip().to_string(),
        ];
        let mut child = router(Some(&routes), &log, &flags);
        wait_listening(router_addr()).await;

        // Each tenant answers through the router, with its own CA and client certificate.
        let clients: Vec<reqwest::Client> = [&t1, &t2, &t3]
            .iter()
            .map(|t| client_via_router(&t.host(), t.cp.ca_der(), t.cp.admin_client_cert()))
            .collect();
        for (t, c) in [(&t1, &clients[0]), (&t2, &clients[1])] {
            only_its_own_namespaces(t, c).await;
        }
        // t1's name with t2's client certificate: t1's API server does not accept it.
        let wrong = client_via_router(&t1.host(), t1.cp.ca_der(), t2.cp.admin_client_cert());
        let (status, _) = namespaces(&wrong, &t1.host()).await.unwrap();
        assert!(status == 401 || status == 403, "t2's certificate on t1: {status}");
        // A name no route has (t3 before it is added, and a stranger) gets nothing.
        assert!(namespaces(&clients[2], &t3.host()).await.is_err());
        let stranger = client_via_router("api.nobody.baton.test", t1.cp.ca_der(), t1.cp.admin_client_cert());
        assert!(namespaces(&stranger, "api.nobody.baton.test").await.is_err());

        // Each routed name is in DNS, pointing at the router; t3 is not yet.
        assert_eq!(dig(&t1.host()).await, router_addr().ip().to_string());
        assert_eq!(dig(&t2.host()).await, router_addr().ip().to_string());
        assert_eq!(dig(&t3.host()).await, "");

        // A watch streams from t1 while t3 is added to the routes file.
        let rv = {
            let r = clients[0]
                .get(format!("https://{}/api/v1/namespaces?limit=1", t1.host()))
                .send()
                .await
                .unwrap();
            let v: serde_json::Value = r.json().await.unwrap();
            v["metadata"]["resourceVersion"].as_str().unwrap().to_owned()
        };
        let seen = Seen::default();
        let streaming = tokio::spawn(watch(clients[0].clone(), t1.host(), rv, Arc::clone(&seen)));
        create_ns(&t1.cp, "before-reload").await;
        wait_seen(&seen, "before-reload").await;
        write_routes(&routes, &format!("# tenants\n{}\n{}\n", t2.route(), t3.route()));
        let deadline = Instant::now() + Duration::from_secs(20);
        let names = loop {
            if let Ok((200, names)) = namespaces(&clients[2], &t3.host()).await {
                break names;
            }
            assert!(Instant::now() < deadline, "t3 never became reachable");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(names.contains(&"tenant-t3".to_owned()), "{names:?}");
        assert_eq!(
            dig(&t3.host()).await,
            router_addr().ip().to_string(),
            "t3 published with its route"
        );
        create_ns(&t1.cp, "after-reload").await;
        wait_seen(&seen, "after-reload").await;
        assert!(
            !streaming.is_finished(),
            "the watch dropped: {}",
            streaming.await.unwrap()
        );

        // kubectl with each tenant's kubeconfig (server https://api.<tenant>.baton.test:443,
        // resolved through baton's DNS): each lists its own namespaces, no other tenant's.
        for t in [&t1, &t2, &t3] {
            let out = kubectl_namespaces(t, dir.path()).await;
            for other in [&t1, &t2, &t3] {
                let listed = out.contains(&format!("namespace/tenant-{}\n", other.name));
                assert_eq!(listed, other.name == t.name, "kubectl for {}: {out}", t.name);
            }
        }

        // curl to the PROXY listener's address with no SNI (an IP URL) and a PROXY v1 header:
        // routed by the original destination to t2, whose API server checks the certificate.
        let out = curl_via_proxy_protocol(&t2, dir.path()).await;
        assert!(out.contains("\"tenant-t2\""), "{out}");
        assert!(!out.contains("\"tenant-t1\""), "{out}");

        check_metrics().await;

        // SIGTERM: stops accepting, lets the watch drain for --drain-s, exits 0.
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("router did not stop")
            .unwrap();
        assert!(
            status.success(),
            "{status}: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        streaming.abort();
    });
}

/// A tenant Service in `cp`'s namespace `default` (selectorless, port `https`) naming `hosts`,
/// and its EndpointSlice listing `backends` (port 6443), as a hosting platform's operator would
/// create them.
async fn tenant_service(cp: &ControlPlane, name: &str, hosts: &str, backends: &[std::net::IpAddr]) {
    tenant_service_in(cp, "default", name, hosts, backends).await;
}

/// [`tenant_service`] in namespace `ns`.
async fn tenant_service_in(
    cp: &ControlPlane,
    ns: &str,
    name: &str,
    hosts: &str,
    backends: &[std::net::IpAddr],
) {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let client = cp.client(0).unwrap();
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns,
                     "annotations": {"baton.dev/sni-hosts": hosts}},
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 6443}]}
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let endpoints: Vec<_> = backends
        .iter()
        .map(|ip| serde_json::json!({"addresses": [ip.to_string()], "conditions": {"ready": true}}))
        .collect();
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{name}-1"), "namespace": ns,
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
        "endpoints": endpoints,
    }))
    .unwrap();
    Api::<EndpointSlice>::namespaced(client, ns)
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();
}

/// A namespace in `cp`; `domains`: labelled `baton.dev/sni-tenants=true` (allowed to have
/// tenants) with these domains in `baton.dev/sni-domains`.
async fn tenant_namespace(cp: &ControlPlane, name: &str, domains: Option<&str>) {
    let mut meta = serde_json::json!({"name": name});
    if let Some(d) = domains {
        meta["labels"] = serde_json::json!({"baton.dev/sni-tenants": "true"});
        meta["annotations"] = serde_json::json!({"baton.dev/sni-domains": d});
    }
    let obj: Namespace = serde_json::from_value(serde_json::json!({ "metadata": meta })).unwrap();
    Api::<Namespace>::all(cp.client(0).unwrap())
        .create(&PostParams::default(), &obj)
        .await
        .unwrap();
}

/// Waits until namespace `ns` of `cp` has a Warning Event `reason` on Service `service`;
/// returns its note.
async fn wait_event(cp: &ControlPlane, ns: &str, service: &str, reason: &str) -> String {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(cp.client(0).unwrap(), ns);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = events.list(&kube::api::ListParams::default()).await.unwrap();
        if let Some(e) = list.items.iter().find(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(service)
        }) {
            return e.note.clone().unwrap_or_default();
        }
        assert!(Instant::now() < deadline, "no {reason} Event on {ns}/{service}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The Events the router (reporting controller `baton-sni`) gave in namespace `ns` of `cp`
/// about Service `service`, as `reason: note`. Others are left out: the API server's own
/// ClusterIP repair loop may warn `ClusterIPNotAllocated` about any Service just created,
/// when its informer has not seen the IPAddress yet.
async fn router_events_on(cp: &ControlPlane, ns: &str, service: &str) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(cp.client(0).unwrap(), ns);
    let list = events.list(&kube::api::ListParams::default()).await.unwrap();
    list.items
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(service))
        .filter(|e| e.reporting_controller.as_deref() == Some("baton-sni"))
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.as_deref().unwrap_or_default(),
                e.note.as_deref().unwrap_or_default()
            )
        })
        .collect()
}

/// Polls until `host` answers through the router with `host`'s tenant's namespaces.
async fn wait_routed(client: &reqwest::Client, host: &str, marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok((200, names)) = namespaces(client, host).await {
            assert!(names.contains(&marker.to_owned()), "{host}: {names:?}");
            return;
        }
        assert!(Instant::now() < deadline, "{host} never became reachable");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn tenants_from_annotated_services_are_routed_and_reloaded_live() {
    lab::run(|| async {
        let dir = tempfile::tempdir().unwrap();
        // t1 is also the hosting cluster: the tenant Services live in it.
        let (t1, t2) = tokio::join!(tenant("t1", &[21, 22]), tenant("t2", &[23]));
        let kubeconfig = t1.cp.write_kubeconfig(0, baton_testbed::ADMIN_TOKEN).unwrap();
        let log = dir.path().join("router.log");
        let flags = [
            "--services".into(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--tenant-namespace".into(),
            "default=baton.test".into(),
            "--backend-cidr".into(),
            lab::PUBLIC_RANGE.into(),
        ];
        let _child = router(None, &log, &flags);
        wait_listening(router_addr()).await;

        let c2 = client_via_router(&t2.host(), t2.cp.ca_der(), t2.cp.admin_client_cert());
        assert!(
            namespaces(&c2, &t2.host()).await.is_err(),
            "routed before any Service"
        );
        tenant_service(&t1.cp, "t2-api", &t2.host(), &t2.cp.addresses()).await;
        wait_routed(&c2, &t2.host(), "tenant-t2").await;

        // A watch streams from t2 while a second tenant Service (t1's own API) appears and
        // t2's Service gains a host name.
        let seen = Seen::default();
        let streaming = tokio::spawn(watch(c2.clone(), t2.host(), "0".into(), Arc::clone(&seen)));
        wait_seen(&seen, "tenant-t2").await;
        tenant_service(&t1.cp, "t1-api", &t1.host(), &t1.cp.addresses()).await;
        let c1 = client_via_router(&t1.host(), t1.cp.ca_der(), t1.cp.admin_client_cert());
        wait_routed(&c1, &t1.host(), "tenant-t1").await;
        let services: Api<k8s_openapi::api::core::v1::Service> =
            Api::namespaced(t1.cp.client(0).unwrap(), "default");
        let alt = format!("api-alt.{}.baton.test", t2.name);
        let patch = serde_json::json!({"metadata": {"annotations": {
            "baton.dev/sni-hosts": format!("{},{alt}", t2.host())}}});
        services
            .patch(
                "t2-api",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
        let c2_alt = client_via_router(&alt, t2.cp.ca_der(), t2.cp.admin_client_cert());
        wait_routed(&c2_alt, &alt, "tenant-t2").await;
        create_ns(&t2.cp, "after-reloads").await;
        wait_seen(&seen, "after-reloads").await;
        assert!(
            !streaming.is_finished(),
            "the watch dropped: {}",
            streaming.await.unwrap()
        );

        // A newer Service claiming t2's name does not take it; both Services get a Warning
        // Event naming the other.
        tenant_service(&t1.cp, "t2-dup", &t2.host(), &t1.cp.addresses()).await;
        let refused = wait_event(&t1.cp, "default", "t2-dup", "SniHostConflict").await;
        assert!(refused.contains("already routed by default/t2-api"), "{refused}");
        let kept = wait_event(&t1.cp, "default", "t2-api", "SniHostConflict").await;
        assert!(kept.contains("default/t2-dup also claims"), "{kept}");
        let fresh = client_via_router(&t2.host(), t2.cp.ca_der(), t2.cp.admin_client_cert());
        only_its_own_namespaces(&t2, &fresh).await;

        // Deleting the Service removes the route for new connections (a fresh client each
        // time: c1's pooled connection stays spliced, as established connections do).
        services
            .delete("t1-api", &kube::api::DeleteParams::default())
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let fresh = client_via_router(&t1.host(), t1.cp.ca_der(), t1.cp.admin_client_cert());
            if namespaces(&fresh, &t1.host()).await.is_err() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "t1 still routed after its Service went"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        streaming.abort();
    });
}

/// The hosting cluster's control-plane servers: lab nodes cp-0..2 (198.51.100.11-13).
const HOSTING_CP: [u64; 3] = [600_101, 600_102, 600_103];

/// The SNI router on lab node cp-`i`, listening on the node's `0.0.0.0:443` (as the shipped
/// DaemonSet's host-network pod does) and routing `routes`; no admin server.
fn node_router(cp: &ControlPlane, i: usize, routes: &[String], log: &Path) -> Child {
    let mut args = vec!["sni", "serve", "--listen", "0.0.0.0:443"];
    for r in routes {
        args.extend(["--route", r.as_str()]);
    }
    common::node::command(cp, BATON, i, &args, log).spawn().unwrap()
}

/// `baton controller` of the hosting cluster (API server `apiserver`), moving the FIP tagged
/// `cluster=lab-cp` between its control-plane nodes, unchanged from how it runs for one cluster,
/// and probing the SNI router on every one of them (`sniRouterPort` 443). It runs on the lab
/// host, which is no node: its probes through the FIP cross the cloud's route.
fn hosting_controller(cp: &ControlPlane, sim: &baton_sim::SimHandle, apiserver: usize, log: &Path) -> Child {
    let kubeconfig = cp
        .write_kubeconfig(apiserver, baton_testbed::ADMIN_TOKEN)
        .unwrap();
    let log = std::fs::File::create(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .arg("controller")
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(["--identity", "replica-a", "--admin-listen", "off"])
        .env("CHERRY_API_KEY", "sim-token")
        .env("CHERRY_PROJECT_ID", "123456")
        .env("CHERRY_FIP_TAG", "cluster=lab-cp")
        .env("CHERRY_BASE_URL", sim.base_url().as_str())
        .env("BATON_API_RATE_LIMIT", "4")
        .env("BATON_SNI_ROUTER_PORT", "443")
        .env("BATON_LOG", "info,baton=debug")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Both tenants answer through `to` (fresh clients: no pooled connection).
async fn tenants_answer(a: &Tenant, b: &Tenant, to: SocketAddr) -> bool {
    for t in [a, b] {
        let c = client_via(&t.host(), t.cp.ca_der(), t.cp.admin_client_cert(), to);
        match namespaces(&c, &t.host()).await {
            Ok((200, names)) if names.contains(&format!("tenant-{}", t.name)) => {}
            _ => return false,
        }
    }
    true
}

/// The hosting node (index into [`HOSTING_CP`]) the cloud routes `fip` to: the simulator's
/// own state, read without an API call.
fn holder_of(sim: &baton_sim::SimHandle, fip: &baton_cloud::model::IpAddress) -> Option<usize> {
    let id = sim.peek_ip(fip.id.as_str())?.target()?.0;
    HOSTING_CP.iter().position(|&c| c == id)
}

/// The lab hub's route for `fip` (`ip route show <fip>/32`): the cloud's router.
async fn hub_route(fip: std::net::IpAddr) -> String {
    let out = Command::new("ip")
        .args(["route", "show", &format!("{fip}/32")])
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// After a failure at `t0` on the FIP's holder `from`: how long until the cloud routed the FIP
/// to another node (polled every 10 ms), and until both tenants answered through the shared
/// address again (tried from the move on, each try bounded to 2 s). Returns the new holder too.
async fn failover(
    sim: &baton_sim::SimHandle,
    fip: &baton_cloud::model::IpAddress,
    from: usize,
    (t1, t2): (&Tenant, &Tenant),
    t0: Instant,
) -> (usize, Duration, Duration) {
    let shared = SocketAddr::new(fip.address, 443);
    let to = loop {
        if let Some(h) = holder_of(sim, fip).filter(|h| *h != from) {
            break h;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the FIP did not leave cp-{from} within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let moved = t0.elapsed();
    loop {
        let answered = tokio::time::timeout(Duration::from_secs(2), tenants_answer(t1, t2, shared)).await;
        if matches!(answered, Ok(true)) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "both tenants did not answer through the FIP on cp-{to} within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (to, moved, t0.elapsed())
}

/// The shared FIP on the path real nodes have: the hosting cluster's three control-plane
/// servers are lab nodes, the cloud *routes* the FIP to its holder (packets keep the FIP as
/// their destination; the simulator splices nothing), and each node runs what ships there:
/// `baton agent` (the node accepts the FIP) and the SNI router on its `0.0.0.0:443`. The
/// controller probes the routers (`sniRouterPort`); the tenants' API servers and the clients
/// are on the lab host, which is no node. One lab for two failures in turn:
/// - the holder is powered off (API server, router, agent, link): both tenants answer again
///   through the FIP, from another node;
/// - then only the router on the new holder is killed (its API server answers on): the FIP
///   moves (`RouterDown`) to the node whose API server and router both serve.
#[test]
fn the_shared_fip_leaves_a_dead_holder_and_a_holder_whose_router_was_killed() {
    lab::run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path();
        let mut hosting = ControlPlane::start(Options {
            nodes: true,
            ..Options::servers(3)
        })
        .await
        .expect("the hosting control plane on lab nodes");
        // The tenants' API servers on hosts that are no node, reachable from the nodes.
        for n in [21, 23] {
            baton_testbed::node::add_lab_host(lab::public_ip(n))
                .await
                .unwrap();
        }
        let (t1, t2) = tokio::join!(tenant("t1", &[21]), tenant("t2", &[23]));
        let sim = common::routed_sim(baton_sim::Faults::none(), baton_sim::Topology::default()).await;
        let (_cloud, fip) = common::control_plane_fip(&sim, ("cluster", "lab-cp"), HOSTING_CP[0]).await;
        let tenant_routes = [t1.route(), t2.route()];
        let _agents: Vec<Child> = (0..3)
            .map(|i| common::node::agent(&hosting, BATON, i, &logs.join(format!("agent-{i}.log"))))
            .collect();
        let mut routers: Vec<Child> = (0..3)
            .map(|i| node_router(&hosting, i, &tenant_routes, &logs.join(format!("router-{i}.log"))))
            .collect();
        let controller_log = logs.join("controller.log");
        let _controller = hosting_controller(&hosting, &sim, 1, &controller_log);
        let shared = SocketAddr::new(fip.address, 443);
        common::wait_for(
            "both tenants through the shared FIP",
            Duration::from_secs(60),
            || tenants_answer(&t1, &t2, shared),
        )
        .await;
        // Let the controller see every router Up before the failures; nothing moved meanwhile.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            holder_of(&sim, &fip),
            Some(0),
            "the FIP moved with nothing failed"
        );
        let addrs = hosting.addresses();
        let route = hub_route(fip.address).await;
        assert!(
            route.contains(&format!("via {}", addrs[0])),
            "the FIP is routed to cp-0, not spliced: {route:?}"
        );

        // The holder is powered off: its API server, router and agent die, its link goes down.
        let t0 = Instant::now();
        hosting.kill_node("cp-0").await.unwrap();
        let (h, moved, answered) = failover(&sim, &fip, 0, (&t1, &t2), t0).await;
        eprintln!(
            "holder cp-0 powered off: FIP moved to cp-{h} after {} ms, tenants answered through it after {} ms",
            moved.as_millis(),
            answered.as_millis()
        );
        let route = hub_route(fip.address).await;
        assert!(route.contains(&format!("via {}", addrs[h])), "{route:?}");

        // Only the new holder's router dies; its API server answers on.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(holder_of(&sim, &fip), Some(h), "the FIP moved again by itself");
        let seen = std::fs::read_to_string(&controller_log).unwrap().len();
        let t0 = Instant::now();
        routers[h].kill().await.unwrap();
        let (r, moved, answered) = failover(&sim, &fip, h, (&t1, &t2), t0).await;
        eprintln!(
            "router on the holder cp-{h} killed: FIP moved to cp-{r} after {} ms, tenants answered through it after {} ms",
            moved.as_millis(),
            answered.as_millis()
        );
        assert_ne!(r, 0, "moved to the powered-off node");
        let log = std::fs::read_to_string(&controller_log).unwrap();
        assert!(
            log[seen..].contains("RouterDown"),
            "moved because of the router: {}",
            &log[seen..]
        );
        let route = hub_route(fip.address).await;
        assert!(route.contains(&format!("via {}", addrs[r])), "{route:?}");
    });
}

#[test]
fn a_hung_api_server_is_skipped_once_its_health_check_fails() {
    lab::run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let mut t1 = tenant("t1", &[21, 22]).await;
        let ca = dir.path().join("t1-ca.crt");
        std::fs::write(&ca, t1.cp.ca_pem()).unwrap();
        let flags = [
            "--route".into(),
            t1.route(),
            "--health-ca".into(),
            format!("{}={}", t1.host(), ca.display()),
        ];
        let _child = router(None, &dir.path().join("router.log"), &flags);
        wait_listening(router_addr()).await;
        // API server 0 accepts TCP and never answers (SIGSTOP): a connect succeeds, so only an
        // active check can tell. After fall (3) probes it is skipped.
        t1.cp.hang(0).unwrap();
        tokio::time::sleep(Duration::from_secs(6)).await;
        for _ in 0..8 {
            let fresh = client_via_router(&t1.host(), t1.cp.ca_der(), t1.cp.admin_client_cert());
            let (status, _) = namespaces(&fresh, &t1.host())
                .await
                .expect("a request went to the hung API server");
            assert_eq!(status, 200);
        }
        let text = metrics().await;
        let hung = SocketAddr::new(t1.cp.addresses()[0], baton_testbed::APISERVER_PORT);
        assert!(
            text.contains(&format!(
                "baton_sni_backend_up{{host=\"api.t1.baton.test\",backend=\"{hung}\"}} 0"
            )),
            "{text}"
        );
        t1.cp.unhang(0).unwrap();
    });
}

#[test]
fn bad_flags_exit_2_naming_the_flag_and_the_value() {
    for (args, want) in [
        (
            vec!["--listen", "127.0.0.1:0", "--route", "api.t1.example.com=nowhere"],
            "--route \"api.t1.example.com=nowhere\": \"nowhere\" is not IP:PORT",
        ),
        (
            vec![
                "--listen",
                "127.0.0.1:0",
                "--route",
                "api.t1.example.com:0=127.0.0.1:1",
            ],
            "--route \"api.t1.example.com:0=127.0.0.1:1\": \"0\" is not a port (1-65535)",
        ),
        (
            vec![
                "--listen",
                "127.0.0.1:0",
                "--route",
                "a.example:8132=127.0.0.1:1",
                "--route",
                "a.example:8132=127.0.0.1:2",
            ],
            "--route \"a.example:8132=127.0.0.1:2\": host a.example is routed twice on port 8132",
        ),
        (
            vec!["--listen", "127.0.0.1:0", "--proxy-route", "10.0.0.1"],
            "--proxy-route \"10.0.0.1\": expected DSTADDR=HOST",
        ),
        (
            vec![
                "--listen",
                "127.0.0.1:0",
                "--health-ca",
                "api.t1.example.com=/nonexistent/ca.crt",
            ],
            "--health-ca api.t1.example.com=/nonexistent/ca.crt:",
        ),
        (vec!["--route", "a.example=127.0.0.1:1"], "--listen"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(["sni", "serve"])
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}

/// The shipped router (`manifests/sni-router.yaml`, the image of `scripts/build-image`) as a
/// DaemonSet on real lab nodes (kubelets, containerd), beside the shipped controller Deployment:
/// the router pods watch the tenant Service with their own service account and the shipped
/// RBAC, a tenant's client reaches its API server through the hosting cluster's control-plane
/// FIP on port 443 with its own certificate; the node holding the FIP is powered off, the
/// controller pods move the FIP, and the router on the new holder serves the tenant. The
/// router's admin endpoints are secured as the controller's are.
#[test]
fn the_shipped_router_daemonset_serves_a_tenant_through_the_control_plane_fip() {
    use baton_cloud::Cloud as _;
    use k8s_openapi::api::apps::v1::DaemonSet;
    const CP: [u64; 3] = [600_101, 600_102, 600_103];
    lab::run(|| async {
        let mut hosting = ControlPlane::start(Options {
            kubelets: true,
            images: vec![baton_testbed::baton_image().expect("baton's image (scripts/build-image)")],
            ..Options::servers(3)
        })
        .await
        .expect("control plane with lab nodes");
        // The tenant's API server on a host that is no node, reachable from the nodes.
        baton_testbed::node::add_lab_host(lab::public_ip(21))
            .await
            .unwrap();
        let t1 = tenant("t1", &[21]).await;
        // The FIP is routed to its holder (packets keep the FIP as their destination); the
        // agent DaemonSet makes every control-plane node accept it, the router listens on 443.
        let sim = common::routed_sim(baton_sim::Faults::none(), baton_sim::Topology::default()).await;
        let (cloud, fip) = common::control_plane_fip(&sim, ("cluster", "pods-cp"), CP[0]).await;

        let admin = hosting.client(0).unwrap();
        common::apply_rbac_and_cloud_secret(&admin, &sim, "cluster=pods-cp").await;
        common::apply_shipped_manifests(&admin, &["agent.yaml", "deployment.yaml"]).await;
        // The shipped router with the one value an operator must give: its backends' network.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/sni-router.yaml");
        let shipped = std::fs::read_to_string(&path).unwrap();
        let unset = "- name: BATON_SNI_BACKEND_CIDR\n              value: \"\"";
        assert!(
            shipped.contains(unset),
            "manifests/sni-router.yaml leaves BATON_SNI_BACKEND_CIDR empty"
        );
        let set = shipped.replace(
            unset,
            &format!(
                "- name: BATON_SNI_BACKEND_CIDR\n              value: \"{}\"",
                lab::PUBLIC_RANGE
            ),
        );
        let objects = baton::bootstrap::config::parse_manifests(&path, &set).unwrap();
        baton::bootstrap::steps::apply_manifests(&admin, &objects)
            .await
            .unwrap();
        // The tenant lives in a namespace the operator labelled, under its domain.
        tenant_namespace(&hosting, "tenants", Some("baton.test")).await;
        tenant_service_in(&hosting, "tenants", "t1", &t1.host(), &t1.cp.addresses()).await;

        let shared = SocketAddr::new(fip.address, 443);
        let started = Instant::now();
        common::wait_for("t1 through the shared FIP", Duration::from_secs(180), || async {
            let c = client_via(&t1.host(), t1.cp.ca_der(), t1.cp.admin_client_cert(), shared);
            matches!(namespaces(&c, &t1.host()).await, Ok((200, n)) if n.contains(&"tenant-t1".to_owned()))
        })
        .await;
        common::wait_for(
            "a router pod Ready on every node",
            Duration::from_secs(120),
            || {
                let api = Api::<DaemonSet>::namespaced(admin.clone(), "kube-system");
                async move {
                    api.get_opt("baton-sni")
                        .await
                        .ok()
                        .flatten()
                        .and_then(|d| d.status)
                        .is_some_and(|s| s.number_ready == 3)
                }
            },
        )
        .await;
        eprintln!(
            "router pods Ready on 3 nodes, t1 through the FIP, {:.1}s after the manifests",
            started.elapsed().as_secs_f64()
        );
        // Secured by default, seen from a lab host: the router's plain admin port (its metrics
        // name every tenant) on each node's loopback only; its metrics over HTTPS for
        // Prometheus's service account alone.
        let prometheus = common::metrics_scraper(&admin, "default", "prometheus", true).await;
        let nosy = common::metrics_scraper(&admin, "default", "nosy", false).await;
        for ip in hosting.addresses() {
            common::assert_admin_endpoints_secured(ip, (9591, 9593), (&prometheus, &nosy), "baton_sni_hosts")
                .await;
        }

        // The node holding the FIP is powered off.
        let holder = cloud.ip(&fip.id).await.unwrap().target().unwrap().0;
        let dead = CP.iter().position(|id| *id == holder).unwrap();
        let t0 = Instant::now();
        hosting.kill_node(&format!("cp-{dead}")).await.unwrap();
        common::wait_for("t1 through the FIP on another node", Duration::from_secs(60), || async {
            let moved = cloud
                .ip(&fip.id)
                .await
                .ok()
                .and_then(|ip| ip.target())
                .is_some_and(|t| t.0 != holder);
            let c = client_via(&t1.host(), t1.cp.ca_der(), t1.cp.admin_client_cert(), shared);
            moved && matches!(namespaces(&c, &t1.host()).await, Ok((200, n)) if n.contains(&"tenant-t1".to_owned()))
        })
        .await;
        eprintln!(
            "t1 answered through the FIP again {:.2}s after cp-{dead} was powered off",
            t0.elapsed().as_secs_f64()
        );
        // Every router pod ran with its own service account and the shipped RBAC.
        common::assert_pod_logs_clean(&hosting, "SNI router serving", 3, sim.api_key());
    });
}

/// Tenants only where the operator allows them: a Service in a namespace nobody allowed is
/// ignored (even the oldest claim of a name), a claim outside the namespace's domains is refused
/// with an Event, and an EndpointSlice address outside `--backend-cidr` is never dialled.
#[test]
fn tenants_come_only_from_allowed_namespaces_domains_and_networks() {
    lab::run(|| async {
        let dir = tempfile::tempdir().unwrap();
        // t1 is the hosting cluster (the Services live there); t2's API server is the backend.
        let (t1, t2) = tokio::join!(tenant("t1", &[21]), tenant("t2", &[23]));
        // A listener on an address outside the allowed network, counting connections.
        let outside = SocketAddr::new(lab::private_ip(50), baton_testbed::APISERVER_PORT);
        let dialled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let listener = tokio::net::TcpListener::bind(outside).await.unwrap();
        let counter = Arc::clone(&dialled);
        let recording = tokio::spawn(async move {
            while let Ok((_s, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let kubeconfig = t1.cp.write_kubeconfig(0, baton_testbed::ADMIN_TOKEN).unwrap();
        let flags = [
            "--services".into(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--backend-cidr".into(),
            lab::PUBLIC_RANGE.into(),
        ];
        let _child = router(None, &dir.path().join("router.log"), &flags);
        wait_listening(router_addr()).await;

        // First (so the oldest claims): a namespace nobody allowed, and one allowed for
        // another domain, both claiming t2's name.
        tenant_namespace(&t1.cp, "rogue", None).await;
        tenant_service_in(&t1.cp, "rogue", "grab", &t2.host(), &t1.cp.addresses()).await;
        tenant_namespace(&t1.cp, "tenant-a", Some("a.baton.test")).await;
        tenant_service_in(&t1.cp, "tenant-a", "grab", &t2.host(), &t1.cp.addresses()).await;
        let note = wait_event(&t1.cp, "tenant-a", "grab", "SniHostNotAllowed").await;
        assert!(
            note.contains("not in its namespace's domains (a.baton.test)"),
            "{note}"
        );
        let c2 = client_via_router(&t2.host(), t2.cp.ca_der(), t2.cp.admin_client_cert());
        assert!(
            namespaces(&c2, &t2.host()).await.is_err(),
            "neither claim is routed (else t1's API server would answer t2's name)"
        );

        // Then t2's own namespace: its Service lists an address outside the allowed network
        // beside t2's API server.
        tenant_namespace(&t1.cp, "tenant-t2", Some("t2.baton.test")).await;
        let mut backends = t2.cp.addresses();
        backends.insert(0, outside.ip());
        tenant_service_in(&t1.cp, "tenant-t2", "api", &t2.host(), &backends).await;
        wait_routed(&c2, &t2.host(), "tenant-t2").await;
        let note = wait_event(&t1.cp, "tenant-t2", "api", "SniBackendNotAllowed").await;
        assert!(note.contains(&outside.ip().to_string()), "{note}");
        for _ in 0..10 {
            let fresh = client_via_router(&t2.host(), t2.cp.ca_der(), t2.cp.admin_client_cert());
            only_its_own_namespaces(&t2, &fresh).await;
        }
        assert_eq!(
            dialled.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "the address outside --backend-cidr was never dialled"
        );
        let told = router_events_on(&t1.cp, "rogue", "grab").await;
        assert!(
            told.is_empty(),
            "a Service of a namespace not allowed is ignored, not even told: {told:?}"
        );
        let text = metrics().await;
        assert!(
            text.lines().any(|l| l == "baton_sni_hosts 1"),
            "only t2's own Service is routed: {text}"
        );
        recording.abort();
    });
}
