//! `baton agent` on the path a Floating IP's packets really take: routed, with the FIP as their
//! destination, as Cherry Servers delivers them.
//!
//! ```text
//!  lab namespace = the cloud's router                node a (netns)            node b (netns)
//!  ┌─────────────────────────────────────────┐      ┌──────────────────────┐  ┌──────────────────────┐
//!  │ bridge br0 198.51.100.1/24, forwarding  │─veth─│ eth0 198.51.100.11   │  │ eth0 198.51.100.12   │
//!  │ route 203.0.113.5/32 via .11 (or .12)   │─veth─┼──────────────────────┼──┤ default via .1       │
//!  │ no local 198.51.100/24, 203.0.113/24    │      │ TCP server 0.0.0.0:  │  │ TCP server 0.0.0.0:  │
//!  │ the test's clients (not a node)         │      │   7443 "node-a"      │  │   7443 "node-b"      │
//!  └─────────────────────────────────────────┘      │ baton agent --fip    │  │ baton agent --fip    │
//!                                                   └──────────────────────┘  └──────────────────────┘
//! ```
//!
//! The real binary programs the real kernel (nftables in each node's namespace); the clients
//! and servers are real sockets, each on a thread inside its namespace. A second test runs the
//! agent on the testbed's lab nodes, each with its own API server, and moves the holder in the
//! FIP table the controller writes: the holder's own connections to its FIP are delivered on
//! the holder. Another runs the agent against a real API server with the shipped RBAC: it
//! follows the FIP table, and no Service, whatever its annotations, changes a rule.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // in tests a panic is the failure report

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_testbed::control_plane::{Proc, ProxyMode, kubeconfig};
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

const PORT: u16 = 7443;
/// How long a connection attempt may take before it counts as not answered.
const CONNECT: Duration = Duration::from_millis(1500);

fn baton() -> &'static str {
    env!("CARGO_BIN_EXE_baton")
}

fn fip() -> IpAddr {
    lab::fip(5)
}

/// Runs `ip ARGS` (or `nsenter --net=NS ip ARGS`), failing the test when it fails.
async fn run(netns: Option<&str>, program: &str, args: &[&str]) -> String {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={ns}")).arg("--").arg(program);
            c
        }
        None => Command::new(program),
    };
    let out = cmd.args(args).output().await.unwrap();
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The lab namespace as the cloud's router: the public and FIP ranges are not local here any
/// more (they are the nodes' and the cloud's), a bridge joins the nodes, and it forwards.
async fn router() {
    for range in [lab::PUBLIC_RANGE, lab::FIP_RANGE] {
        // Absent if the lab stops making them local: fine either way.
        let _ = Command::new("ip")
            .args(["route", "del", "local", range, "dev", "lo", "table", "local"])
            .output()
            .await;
    }
    run(None, "ip", &["link", "add", "br0", "type", "bridge"]).await;
    run(None, "ip", &["link", "set", "br0", "up"]).await;
    run(None, "ip", &["addr", "add", "198.51.100.1/24", "dev", "br0"]).await;
    // A router that forwards, and sends no ICMP redirect when a packet leaves on the bridge it
    // came in on (a node's packet for a FIP routed to another node).
    sysctl("net/ipv4/ip_forward", "1");
    for conf in ["all", "default", "br0"] {
        sysctl(&format!("net/ipv4/conf/{conf}/send_redirects"), "0");
    }
}

/// Sets `/proc/sys/<key>` of the calling thread's network namespace.
fn sysctl(key: &str, value: &str) {
    std::fs::write(format!("/proc/sys/{key}"), value)
        .unwrap_or_else(|e| panic!("/proc/sys/{key} = {value}: {e}"));
}

/// Routes the FIP to `node` (the cloud's `targeted_to`), destination kept.
async fn route_fip_to(node: &NodeNs) {
    let dst = format!("{}/32", fip());
    run(
        None,
        "ip",
        &["route", "replace", &dst, "via", &node.ip.to_string()],
    )
    .await;
}

/// A node: a network namespace held by a `sleep`, a veth on the router's bridge, its address,
/// a default route to the router, no forwarding.
struct NodeNs {
    name: &'static str,
    ip: IpAddr,
    netns: String,
    _holder: Proc,
}

impl NodeNs {
    async fn create(dir: &Path, name: &'static str, n: u8) -> Self {
        let holder = Proc::spawn(
            &format!("{name}-holder"),
            dir,
            Command::new("unshare").args(["--net", "--", "sleep", "infinity"]),
        )
        .unwrap();
        let pid = holder.pid().unwrap();
        common::wait_for("the node's namespace", Duration::from_secs(5), || async move {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
        })
        .await;
        let netns = format!("/proc/{pid}/ns/net");
        let veth = format!("v{name}");
        run(
            None,
            "ip",
            &[
                "link",
                "add",
                &veth,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &pid.to_string(),
            ],
        )
        .await;
        run(None, "ip", &["link", "set", &veth, "master", "br0", "up"]).await;
        let ip = lab::public_ip(n);
        let ns = Some(netns.as_str());
        run(ns, "ip", &["link", "set", "lo", "up"]).await;
        run(ns, "ip", &["link", "set", "eth0", "up"]).await;
        run(ns, "ip", &["addr", "add", &format!("{ip}/24"), "dev", "eth0"]).await;
        run(ns, "ip", &["route", "add", "default", "via", "198.51.100.1"]).await;
        // A node, not a router: what is not addressed to it is dropped.
        in_netns(&netns, || async { sysctl("net/ipv4/ip_forward", "0") })
            .await
            .unwrap();
        Self {
            name,
            ip,
            netns,
            _holder: holder,
        }
    }

    /// `baton agent ARGS` in this node.
    fn agent(&self, dir: &Path, args: &[&str]) -> Proc {
        Proc::spawn(
            &format!("agent-{}", self.name),
            dir,
            Command::new("nsenter")
                .arg(format!("--net={}", self.netns))
                .args(["--", baton(), "agent"])
                .args(args)
                .env("RUST_LOG", "info"),
        )
        .unwrap()
    }

    /// The FIPs of `table ip baton` as `nft -j` reads it in this node; `None` without the table.
    async fn nft_fips(&self) -> Option<BTreeSet<String>> {
        nft_fips(Some(&self.netns)).await
    }

    /// The packets counted by the rules of `table ip baton` (NAT chains see the first packet of
    /// each connection: the connections redirected).
    async fn nft_connections(&self) -> u64 {
        let out = run(Some(&self.netns), "nft", &["-j", "list", "table", "ip", "baton"]).await;
        let v: Value = serde_json::from_str(&out).unwrap();
        v["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|item| item["rule"]["expr"].as_array())
            .flatten()
            .filter_map(|e| e["counter"]["packets"].as_u64())
            .sum()
    }
}

/// `table ip baton` as `nft -j` lists it, in `netns` (else here); `None` without the table.
async fn nft_table(netns: Option<&str>) -> Option<Value> {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={ns}")).args(["--", "nft"]);
            c
        }
        None => Command::new("nft"),
    };
    let out = cmd
        .args(["-j", "list", "table", "ip", "baton"])
        .output()
        .await
        .unwrap();
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

/// The destination addresses of the `daddr … redirect` rules of `table ip baton`.
async fn nft_fips(netns: Option<&str>) -> Option<BTreeSet<String>> {
    let v = nft_table(netns).await?;
    let mut fips = BTreeSet::new();
    for item in v["nftables"].as_array().unwrap() {
        let Some(exprs) = item["rule"]["expr"].as_array() else {
            continue;
        };
        if item["rule"]["chain"] != "prerouting" {
            continue;
        }
        assert!(
            exprs.iter().any(|e| e.get("redirect").is_some()),
            "a rule that does not redirect: {item}"
        );
        for e in exprs {
            if e["match"]["left"]["payload"]["field"] == "daddr" {
                fips.insert(e["match"]["right"].as_str().unwrap().to_owned());
            }
        }
    }
    Some(fips)
}

/// The rules of `table ip baton`'s chain `output` in `netns`: FIP → the address its packets
/// are sent to (`dnat to`); `None` without the table.
async fn nft_held(netns: &str) -> Option<BTreeMap<String, String>> {
    let v = nft_table(Some(netns)).await?;
    let mut held = BTreeMap::new();
    for item in v["nftables"].as_array().unwrap() {
        let rule = &item["rule"];
        let (Some(exprs), "output") = (
            rule["expr"].as_array(),
            rule["chain"].as_str().unwrap_or_default(),
        ) else {
            continue;
        };
        let fip = exprs
            .iter()
            .find(|e| e["match"]["left"]["payload"]["field"] == "daddr")
            .and_then(|e| e["match"]["right"].as_str());
        let to = exprs.iter().find_map(|e| e["dnat"]["addr"].as_str());
        let (Some(fip), Some(to)) = (fip, to) else {
            panic!("an output rule that is not a FIP's dnat: {item}");
        };
        held.insert(fip.to_owned(), to.to_owned());
    }
    Some(held)
}

/// Runs `f` on a thread of its own inside the network namespace `netns` (a current-thread
/// runtime there); its result comes back through a channel.
fn in_netns<T, F, Fut>(netns: &str, f: F) -> tokio::sync::oneshot::Receiver<T>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let path = netns.to_owned();
    std::thread::spawn(move || {
        let ns = std::fs::File::open(&path).unwrap();
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _ = tx.send(rt.block_on(f()));
    });
    rx
}

/// A TCP server on `0.0.0.0:PORT` in a node: greets each client with the node's name, then
/// echoes; records who connected and to which local address.
struct NodeServer {
    seen: Arc<Mutex<Vec<(SocketAddr, SocketAddr)>>>,
    stop: CancellationToken,
}

impl NodeServer {
    /// The server of node `name`, in the network namespace `netns`.
    async fn start(name: &str, netns: &str) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let (name, record, token) = (name.to_owned(), Arc::clone(&seen), stop.clone());
        let _done = in_netns(netns, move || async move {
            let listener = tokio::net::TcpListener::bind(("0.0.0.0", PORT)).await.unwrap();
            let _ = ready_tx.send(());
            loop {
                let (mut s, peer) = tokio::select! {
                    () = token.cancelled() => return,
                    r = listener.accept() => r.unwrap(),
                };
                record.lock().unwrap().push((peer, s.local_addr().unwrap()));
                let name = name.clone();
                tokio::spawn(async move {
                    let _ = s.write_all(format!("node-{name}\n").as_bytes()).await;
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        ready.await.unwrap();
        Self { seen, stop }
    }

    fn seen(&self) -> Vec<(SocketAddr, SocketAddr)> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for NodeServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Connects to `FIP:PORT` and reads the greeting: which node answered; an error when no node
/// answered within [`CONNECT`]. The open stream is returned too.
async fn who_answers() -> std::io::Result<(String, BufReader<TcpStream>)> {
    let addr = SocketAddr::new(fip(), PORT);
    let stream = tokio::time::timeout(CONNECT, TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))??;
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    tokio::time::timeout(CONNECT, stream.read_line(&mut line))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no greeting"))??;
    Ok((line.trim().to_owned(), stream))
}

/// [`who_answers`] from inside the node of network namespace `netns` (its own traffic, not
/// the cloud's).
async fn who_answers_from(netns: &str) -> std::io::Result<String> {
    in_netns(netns, || async { who_answers().await.map(|(name, _)| name) })
        .await
        .unwrap()
}

/// From inside `netns`, a new connection to the FIP every 10 ms (each on a socket of its own,
/// given 300 ms) until one is answered by `want`: how long after `since` that connection was
/// started; `None` if none was within `limit`. A connection started before the node's rules
/// changed keeps its conntrack entry (its retransmitted SYNs follow it), so only connections
/// started afterwards can be answered differently: the first one that is dates the change.
async fn answered_by_after(
    netns: &str,
    want: String,
    since: std::time::Instant,
    limit: Duration,
) -> Option<Duration> {
    in_netns(netns, move || async move {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if since.elapsed() > limit {
                        return None;
                    }
                    let (tx, started) = (tx.clone(), std::time::Instant::now());
                    tokio::spawn(async move {
                        if let Ok(Ok((name, _))) = tokio::time::timeout(Duration::from_millis(300), who_answers()).await {
                            let _ = tx.send((started, name));
                        }
                    });
                }
                Some((started, name)) = rx.recv() => {
                    if name == want {
                        return Some(started.saturating_duration_since(since));
                    }
                }
            }
        }
    })
    .await
    .unwrap()
}

async fn healthy(addr: SocketAddr) -> bool {
    answers_ok(addr, "/health").await
}

/// `/ready` of the agent whose health server is on `addr`: healthy, and the FIP table listed (an
/// agent watching the API is healthy with no rules before its first list; docs/agent.md).
async fn ready(addr: SocketAddr) -> bool {
    answers_ok(addr, "/ready").await
}

async fn answers_ok(addr: SocketAddr, path: &str) -> bool {
    let client = baton_testbed::http_client(None).unwrap();
    client
        .get(format!("http://{addr}{path}"))
        .timeout(Duration::from_millis(500))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

#[test]
fn a_routed_fip_reaches_the_node_it_is_routed_to_only_through_the_agent() {
    lab::run(|| async {
        let dir = tempfile::tempdir().unwrap();
        router().await;
        let a = NodeNs::create(dir.path(), "a", 11).await;
        let b = NodeNs::create(dir.path(), "b", 12).await;
        let server_a = NodeServer::start(a.name, &a.netns).await;
        let server_b = NodeServer::start(b.name, &b.netns).await;
        route_fip_to(&a).await;

        // Without the agent the node drops what the cloud routes to it: the FIP is not one of
        // its addresses (and a node does not forward).
        let before = who_answers().await;
        assert!(
            before.is_err(),
            "answered without the agent: {:?}",
            before.map(|r| r.0)
        );
        assert!(server_a.seen().is_empty());

        // Every control-plane node runs the agent with every control-plane FIP.
        let fip = fip().to_string();
        let health_a = SocketAddr::new(a.ip, 9594);
        let health_b = SocketAddr::new(b.ip, 9594);
        let mut agent_a = Some(a.agent(
            dir.path(),
            &[
                "--no-kube",
                "--fip",
                &fip,
                "--health-listen",
                &health_a.to_string(),
            ],
        ));
        let agent_b = b.agent(
            dir.path(),
            &[
                "--no-kube",
                "--fip",
                &fip,
                "--health-listen",
                &health_b.to_string(),
            ],
        );
        common::wait_for("agent a healthy", Duration::from_secs(10), || healthy(health_a)).await;
        common::wait_for("agent b healthy", Duration::from_secs(10), || healthy(health_b)).await;
        let want = BTreeSet::from([fip.clone()]);
        assert_eq!(a.nft_fips().await, Some(want.clone()));
        assert_eq!(b.nft_fips().await, Some(want.clone()));

        // A host that is no node reaches the server on the node the FIP is routed to; the
        // server sees the client's own address, and its own primary address as the
        // destination (the redirect), ports kept.
        let (name, mut open) = who_answers().await.expect("the FIP answers with the agent");
        assert_eq!(name, "node-a");
        let seen = server_a.seen();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].0.ip(), lab::public_ip(1), "the client's address is kept");
        assert_eq!(
            seen[0].1,
            SocketAddr::new(a.ip, PORT),
            "redirected to the node's address"
        );
        assert!(server_b.seen().is_empty(), "the FIP is not routed to b");
        open.get_mut().write_all(b"ping\n").await.unwrap();
        let mut echo = String::new();
        open.read_line(&mut echo).await.unwrap();
        assert_eq!(echo, "ping\n");

        // A node's own connection to the FIP leaves the node: b, which accepts the FIP too and
        // has its own server on the port, reaches a's (what keeps a probe of the FIP honest).
        assert_eq!(who_answers_from(&b.netns).await.unwrap(), "node-a");
        assert!(server_b.seen().is_empty(), "b short-circuited its own connection");
        // With --no-kube nothing tells a that it holds the FIP: its own connection to its FIP
        // goes out too, and the router sends it back, but a does not accept it: it carries a's
        // own address as source (a martian without accept_local), and conntrack already knows
        // its tuple from the way out, so the NAT chain never sees it (the rule's counter stays).
        // With Services, the holder annotations fix this (the next test; docs/agent.md, "The
        // holder's own traffic").
        let redirected = a.nft_connections().await;
        let own = who_answers_from(&a.netns).await;
        assert!(
            own.is_err(),
            "the holder reached its own FIP with --no-kube: {own:?}"
        );
        assert_eq!(a.nft_connections().await, redirected);
        assert_eq!(
            nft_held(&a.netns).await,
            Some(BTreeMap::new()),
            "no output rule without holders"
        );

        // The cloud moves the FIP to b: new connections land there at once, with nothing to
        // do on b (its rule is already in place); the connection open to a is reset by b,
        // which knows nothing of it.
        route_fip_to(&b).await;
        let (name, _) = who_answers().await.expect("the FIP answers after the move");
        assert_eq!(name, "node-b");
        assert_eq!(
            who_answers_from(&a.netns).await.unwrap(),
            "node-b",
            "a's own traffic leaves a"
        );
        let _ = open.get_mut().write_all(b"after the move\n").await;
        let mut line = String::new();
        let reset = tokio::time::timeout(Duration::from_secs(5), open.read_line(&mut line))
            .await
            .expect("the old connection neither answered nor broke within 5 s");
        match reset {
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
            Ok(n) => panic!("the old connection went on: {n} bytes {line:?}"),
        }
        drop(open);

        // The agent leaves its rules in place when it stops (a restart must not drop traffic).
        agent_b.terminate(Duration::from_secs(5)).await;
        assert_eq!(b.nft_fips().await, Some(want.clone()));
        assert_eq!(who_answers().await.unwrap().0, "node-b");

        // Something flushes a's ruleset: the agent puts its table back.
        run(Some(&a.netns), "nft", &["flush", "ruleset"]).await;
        assert_eq!(a.nft_fips().await, None);
        common::wait_for("a's table restored", Duration::from_secs(15), || async {
            a.nft_fips().await.as_ref() == Some(&want)
        })
        .await;
        agent_a.take().unwrap().terminate(Duration::from_secs(5)).await;

        // Uninstall: --cleanup removes the table, and b stops answering for the FIP.
        let out = Command::new("nsenter")
            .arg(format!("--net={}", b.netns))
            .args(["--", baton(), "agent", "--cleanup"])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(b.nft_fips().await, None);
        assert!(who_answers().await.is_err(), "b still answers for the FIP");
        // Again: nothing to remove is no error.
        let out = Command::new("nsenter")
            .arg(format!("--net={}", b.netns))
            .args(["--", baton(), "agent", "--cleanup"])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    });
}

/// Service `default/api` names `holder` (node name, address) as its FIP's holder, as the
/// controller's leader writes it after the cloud routed the FIP there; `None` removes both
/// annotations.
async fn name_holder(client: &kube::Client, holder: Option<(&str, IpAddr)>) {
    let fip = fip().to_string();
    write_table(
        client,
        &[(fip.as_str(), holder.map(|(_, a)| a.to_string()).as_deref())],
    )
    .await;
}

/// Writes the FIP table (`kube-system/baton-control-plane-fips`) with these rows (FIP, holder),
/// as the controller's leader does: the test plays the controller.
async fn write_table(client: &kube::Client, rows: &[(&str, Option<&str>)]) {
    let rows: Vec<Value> = rows
        .iter()
        .map(|(a, h)| match h {
            Some(h) => json!({"address": a, "holder": h}),
            None => json!({"address": a}),
        })
        .collect();
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "baton-control-plane-fips", "namespace": "kube-system"},
        "data": {"fips.json": json!({"fips": rows}).to_string()},
    });
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .patch(
            "baton-control-plane-fips",
            &PatchParams::apply("baton").force(),
            &Patch::Apply(&cm),
        )
        .await
        .unwrap();
}

/// `baton_agent_<name>` of the agent whose health server is on `addr`.
async fn agent_metric(addr: SocketAddr, name: &str) -> Option<f64> {
    let client = baton_testbed::http_client(None).unwrap();
    let text = client
        .get(format!("http://{addr}/metrics"))
        .timeout(Duration::from_millis(500))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    common::metric_sum(&text, &format!("baton_agent_{name}"))
}

/// The holder's own traffic to its FIP (docs/agent.md, "The holder's own traffic"), on the
/// testbed's lab nodes: two nodes, each its own network namespace with its API server and
/// `baton agent` watching it (the DaemonSet's job), a TCP server on `0.0.0.0:7443` greeting
/// with the node's name. The test plays the cloud (the FIP's route in the hub) and the
/// controller's leader (the holder annotations on the endpoint Service).
#[test]
fn the_holder_delivers_its_own_packets_for_its_fip_to_itself() {
    lab::run(|| async {
        let cp = ControlPlane::start(Options {
            nodes: true,
            proxy_mode: ProxyMode::None,
            ..Options::servers(2)
        })
        .await
        .unwrap();
        let admin = cp.client(0).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let fip_s = fip().to_string();
        name_holder(&admin, None).await;
        let names = ["cp-0", "cp-1"];
        let ip = [cp.addresses()[0], cp.addresses()[1]];
        let netns = names.map(|n| format!("/run/netns/{}", cp.node_netns(n).unwrap()));
        let servers = [
            NodeServer::start(names[0], &netns[0]).await,
            NodeServer::start(names[1], &netns[1]).await,
        ];
        let health = ip.map(|a| SocketAddr::new(a, 9592));
        let mut agents = Vec::new();
        for i in 0..2 {
            let kubeconfig = cp.write_kubeconfig(i, ADMIN_TOKEN).unwrap();
            let mut cmd = cp.node_command(names[i], baton()).unwrap();
            cmd.arg("agent")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args([
                    "--health-listen",
                    &health[i].to_string(),
                    "--recheck-interval-ms",
                    "500",
                ])
                .env("RUST_LOG", "info");
            agents.push(Proc::spawn(&format!("agent-{}", names[i]), dir.path(), &mut cmd).unwrap());
        }
        let route = |to: IpAddr| async move {
            run(
                None,
                "ip",
                &[
                    "route",
                    "replace",
                    &format!("{}/32", fip()),
                    "via",
                    &to.to_string(),
                ],
            )
            .await;
        };
        route(ip[0]).await;
        let want = BTreeSet::from([fip_s.clone()]);
        for i in 0..2 {
            common::wait_for(
                &format!("{}'s agent ready", names[i]),
                Duration::from_secs(30),
                || ready(health[i]),
            )
            .await;
            assert_eq!(nft_fips(Some(&netns[i])).await, Some(want.clone()));
        }
        let held = |fip: &str, to: IpAddr| Some(BTreeMap::from([(fip.to_owned(), to.to_string())]));
        let none = Some(BTreeMap::new());

        // The cloud routes the FIP to cp-0; the FIP table names no holder yet. The lab host reaches
        // cp-0; cp-1's own connection leaves and reaches cp-0; cp-0's own comes back to it and
        // is dropped (what every node did before the holder was named).
        assert_eq!(who_answers().await.unwrap().0, "node-cp-0");
        assert_eq!(who_answers_from(&netns[1]).await.unwrap(), "node-cp-0");
        assert!(
            who_answers_from(&netns[0]).await.is_err(),
            "cp-0 reached its own FIP unnamed"
        );
        assert_eq!(nft_held(&netns[0]).await, none);

        // The leader names cp-0: cp-0 now delivers its own connections to the FIP to itself,
        // from its own address to its own address (the server sees no FIP), and the reply
        // comes from the FIP (the client's connection works).
        let t = std::time::Instant::now();
        name_holder(&admin, Some((names[0], ip[0]))).await;
        let write_took = t.elapsed();
        let after = answered_by_after(&netns[0], "node-cp-0".into(), t, Duration::from_secs(10))
            .await
            .expect("cp-0 reaches its own FIP once named its holder");
        eprintln!(
            "cp-0's own connection to its FIP answered {} ms after the table write started (the write took {} ms)",
            after.as_millis(),
            write_took.as_millis()
        );
        let (peer, local) = *servers[0].seen().last().unwrap();
        assert_eq!((peer.ip(), local), (ip[0], SocketAddr::new(ip[0], PORT)));
        assert_eq!(nft_held(&netns[0]).await, held(&fip_s, ip[0]));
        assert_eq!(nft_held(&netns[1]).await, none, "cp-1 does not hold the FIP");
        // A non-holder's own connection still leaves and crosses the cloud's route.
        let before = servers[1].seen().len();
        assert_eq!(who_answers_from(&netns[1]).await.unwrap(), "node-cp-0");
        assert_eq!(servers[0].seen().last().unwrap().0.ip(), ip[1]);
        assert_eq!(
            servers[1].seen().len(),
            before,
            "cp-1 short-circuited its own connection"
        );
        assert_eq!(who_answers().await.unwrap().0, "node-cp-0");
        common::wait_for("the metrics", Duration::from_secs(5), || async {
            agent_metric(health[0], "held_fips").await == Some(1.0)
                && agent_metric(health[1], "held_fips").await == Some(0.0)
                && agent_metric(health[0], "own_connections_total").await >= Some(1.0)
        })
        .await;

        // A failover: the cloud routes the FIP to cp-1 first; until the leader's annotation
        // reaches the nodes, cp-1's own connections come back to it and are dropped, and cp-0's
        // still go to cp-0's own server.
        route(ip[1]).await;
        assert_eq!(who_answers().await.unwrap().0, "node-cp-1");
        assert_eq!(who_answers_from(&netns[0]).await.unwrap(), "node-cp-0");
        assert!(
            who_answers_from(&netns[1]).await.is_err(),
            "cp-1 reached its FIP before it was named"
        );
        let t = std::time::Instant::now();
        name_holder(&admin, Some((names[1], ip[1]))).await;
        let (new_holder, old_holder) = tokio::join!(
            answered_by_after(&netns[1], "node-cp-1".into(), t, Duration::from_secs(10)),
            answered_by_after(&netns[0], "node-cp-1".into(), t, Duration::from_secs(10)),
        );
        eprintln!(
            "after the move, {} ms from the table write: cp-1's own connection to the FIP answered by cp-1; \
             {} ms: cp-0's own answered by cp-1 (through the cloud's route)",
            new_holder
                .expect("the new holder reaches its own FIP")
                .as_millis(),
            old_holder
                .expect("the old holder's own traffic follows the FIP")
                .as_millis()
        );
        assert_eq!(nft_held(&netns[1]).await, held(&fip_s, ip[1]));
        assert_eq!(nft_held(&netns[0]).await, none);

        // Someone flushes the holder's output chain: its own connections fail again until the
        // agent puts the rule back (every --recheck-interval-ms, here 500 ms).
        run(
            Some(&netns[1]),
            "nft",
            &["flush", "chain", "ip", "baton", "output"],
        )
        .await;
        assert_eq!(nft_held(&netns[1]).await, none);
        common::wait_for("cp-1's output rule restored", Duration::from_secs(10), || async {
            nft_held(&netns[1]).await == held(&fip_s, ip[1])
        })
        .await;
        assert_eq!(who_answers_from(&netns[1]).await.unwrap(), "node-cp-1");
        assert!(agent_metric(health[1], "repairs_total").await >= Some(1.0));

        // No holder named (the FIP is not routed to a known server): no node delivers its own
        // packets for the FIP locally.
        name_holder(&admin, None).await;
        for ns in &netns {
            common::wait_for("no output rule", Duration::from_secs(10), || async {
                nft_held(ns).await == none
            })
            .await;
        }
        for agent in agents {
            agent.terminate(Duration::from_secs(5)).await;
        }
        let logs = std::fs::read_to_string(dir.path().join("agent-cp-1.log")).unwrap();
        assert!(logs.contains("now_held=203.0.113.5"), "{logs}");
    });
}

/// A Service of the test's making: `ns/name`, type LoadBalancer, with these extras.
async fn create_service(client: &kube::Client, ns: &str, name: &str, extra: Value) {
    let mut spec = json!({"type": "LoadBalancer", "ports": [{"port": 6443, "protocol": "TCP"}]});
    let mut metadata = json!({"name": name, "namespace": ns});
    if let Some(a) = extra.get("annotations") {
        metadata["annotations"] = a.clone();
    }
    for (k, v) in extra.get("spec").and_then(Value::as_object).into_iter().flatten() {
        spec[k] = v.clone();
    }
    let svc: Service = serde_json::from_value(json!({"metadata": metadata, "spec": spec})).unwrap();
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
}

async fn set_ingress(client: &kube::Client, ns: &str, name: &str, ip: &str) {
    Api::<Service>::namespaced(client.clone(), ns)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}})),
        )
        .await
        .unwrap();
}

async fn table_is(want: &[&str]) {
    let want: BTreeSet<String> = want.iter().map(|s| (*s).to_owned()).collect();
    let mut last = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let now = nft_fips(None).await;
        if now.as_ref() == Some(&want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "table ip baton: want {want:?}, have {now:?} (before: {last:?})"
        );
        last = now;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET http://127.0.0.1:9594/<path>`'s status.
async fn status_of(path: &str) -> Option<u16> {
    let client = baton_testbed::http_client(None).unwrap();
    client
        .get(format!("http://127.0.0.1:9594/{path}"))
        .timeout(Duration::from_millis(500))
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

/// Runs the agent in the lab namespace (the API server's) with the shipped ServiceAccount's
/// token.
fn agent_with_kube(dir: &Path, kubeconfig: &Path) -> Proc {
    Proc::spawn(
        "agent",
        dir,
        Command::new(baton())
            .args(["agent", "--kubeconfig"])
            .arg(kubeconfig)
            .args(["--fip", "203.0.113.9", "--recheck-interval-ms", "500"])
            .env("RUST_LOG", "info"),
    )
    .unwrap()
}

#[test]
fn the_agent_follows_the_fip_table_and_no_service_with_the_shipped_rbac() {
    lab::run(|| async {
        let mut cp = ControlPlane::start(Options::servers(1)).await.unwrap();
        let admin = cp.client(0).unwrap();
        common::apply_shipped_manifests(&admin, &["agent.yaml"]).await;
        let request = TokenRequest {
            spec: TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..TokenRequestSpec::default()
            },
            ..TokenRequest::default()
        };
        let token = Api::<ServiceAccount>::namespaced(admin.clone(), "kube-system")
            .create_token_request("baton-agent", &PostParams::default(), &request)
            .await
            .expect("a token for kube-system/baton-agent")
            .status
            .unwrap()
            .token;
        let dir = tempfile::tempdir().unwrap();
        let kc: PathBuf = dir.path().join("kubeconfig");
        std::fs::write(&kc, kubeconfig(&cp.url(0), cp.ca_pem(), &token)).unwrap();

        let mut agent = agent_with_kube(dir.path(), &kc);
        // Before any table: the static FIP only.
        table_is(&["203.0.113.9"]).await;
        common::wait_for("the agent ready", Duration::from_secs(10), || async {
            status_of("ready").await == Some(200)
        })
        .await;

        // Services a tenant (or anyone) writes, with every baton annotation, in any namespace:
        // an annotated endpoint naming a FIP and a forged holder, the mirror's name with an
        // ingress, one of baton's control-plane class. None reaches the node.
        create_service(
            &admin,
            "default",
            "api",
            json!({"annotations": {"baton.dev/control-plane-endpoint": "true",
                                   "baton.dev/fip-holder-address": "198.51.100.11"},
                   "spec": {"loadBalancerIP": "203.0.113.20"}}),
        )
        .await;
        set_ingress(&admin, "default", "api", "203.0.113.20").await;
        create_service(&admin, "kube-system", "baton-kubernetes-external", json!({})).await;
        set_ingress(&admin, "kube-system", "baton-kubernetes-external", "203.0.113.21").await;
        create_service(
            &admin,
            "default",
            "api-int",
            json!({"spec": {"loadBalancerClass": "baton.dev/control-plane", "loadBalancerIP": "10.96.0.1"}}),
        )
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        table_is(&["203.0.113.9"]).await;

        // The controller's table: its FIPs are accepted; a change of it is followed.
        write_table(
            &admin,
            &[("203.0.113.20", None), ("203.0.113.21", Some("198.51.100.11"))],
        )
        .await;
        table_is(&["203.0.113.20", "203.0.113.21", "203.0.113.9"]).await;
        write_table(
            &admin,
            &[
                ("203.0.113.22", None),
                ("203.0.113.21", None),
                ("203.0.113.23", None),
            ],
        )
        .await;
        table_is(&["203.0.113.21", "203.0.113.22", "203.0.113.23", "203.0.113.9"]).await;
        assert_eq!(status_of("health").await, Some(200));

        // The agent stops: its rules stay. It starts again while the API server is down: it
        // keeps what the kernel holds (healthy, not ready) instead of dropping it.
        agent.terminate(Duration::from_secs(5)).await;
        let first_run = std::fs::read_to_string(dir.path().join("agent.log")).unwrap();
        no_denials(&first_run);
        table_is(&["203.0.113.21", "203.0.113.22", "203.0.113.23", "203.0.113.9"]).await;
        cp.stop_apiserver(0).await.unwrap();
        agent = agent_with_kube(dir.path(), &kc);
        common::wait_for("the restarted agent healthy", Duration::from_secs(10), || async {
            status_of("health").await == Some(200)
        })
        .await;
        assert_eq!(status_of("ready").await, Some(503), "ready without an API server");
        tokio::time::sleep(Duration::from_secs(2)).await;
        table_is(&["203.0.113.21", "203.0.113.22", "203.0.113.23", "203.0.113.9"]).await;

        // The API server is back; the table loses rows and their FIPs go with them. A garbled
        // write drops nothing.
        cp.start_apiserver(0).await.unwrap();
        let admin = cp.client(0).unwrap();
        write_table(&admin, &[("203.0.113.21", None), ("203.0.113.23", None)]).await;
        table_is(&["203.0.113.21", "203.0.113.23", "203.0.113.9"]).await;
        Api::<ConfigMap>::namespaced(admin.clone(), "kube-system")
            .patch(
                "baton-control-plane-fips",
                &PatchParams::apply("baton").force(),
                &Patch::Apply(json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "baton-control-plane-fips", "namespace": "kube-system"},
                    "data": {"fips.json": "not json"},
                })),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        table_is(&["203.0.113.21", "203.0.113.23", "203.0.113.9"]).await;
        write_table(&admin, &[]).await;
        table_is(&["203.0.113.9"]).await;
        common::wait_for("the agent ready again", Duration::from_secs(30), || async {
            status_of("ready").await == Some(200)
        })
        .await;

        agent.terminate(Duration::from_secs(5)).await;
        // A restarting API server answers 403 until its RBAC caches are filled: judge the
        // second run from its listing on.
        let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap();
        let second_run = &log[first_run.len()..];
        let listed = second_run
            .find("FIP table listed")
            .expect("the second run listed");
        no_denials(&second_run[listed..]);
        assert!(second_run.contains("FIP acceptance updated"), "{second_run}");
    });
}

/// The agent with the shipped RBAC is never denied (kube-apiserver's denials all say
/// "forbidden").
fn no_denials(log: &str) {
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the agent hit RBAC denials:\n{log}"
    );
    assert!(log.contains("FIP acceptance updated"), "{log}");
}

/// The shipped DaemonSet (`manifests/agent.yaml`, the image of `scripts/build-image`) on real lab
/// nodes (kubelets, containerd): a pod on every control-plane node, with the shipped security
/// context (uid 0, only `NET_ADMIN`, read-only root) and RBAC, watching through its own node's
/// API server, puts a control-plane endpoint Service's FIP into its node's nftables, and follows
/// a change of it.
#[test]
fn the_shipped_daemonset_accepts_the_fip_on_every_control_plane_node() {
    use k8s_openapi::api::apps::v1::DaemonSet;
    lab::run(|| async {
        let cp = ControlPlane::start(Options {
            kubelets: true,
            images: vec![baton_testbed::baton_image().expect("baton's image (scripts/build-image)")],
            ..Options::servers(3)
        })
        .await
        .expect("control plane with lab nodes");
        let admin = cp.client(0).unwrap();
        common::apply_shipped_manifests(&admin, &["agent.yaml"]).await;
        write_table(&admin, &[("203.0.113.40", None)]).await;
        let nodes: Vec<String> = cp
            .node_names()
            .iter()
            .map(|n| format!("/run/netns/{}", cp.node_netns(n).unwrap()))
            .collect();
        assert_eq!(nodes.len(), 3);
        let every_node_has = |fip: &'static str| {
            let nodes = nodes.clone();
            move || {
                let nodes = nodes.clone();
                async move {
                    for ns in &nodes {
                        if nft_fips(Some(ns)).await != Some(BTreeSet::from([fip.to_owned()])) {
                            return false;
                        }
                    }
                    true
                }
            }
        };
        common::wait_for(
            "203.0.113.40 accepted on every node",
            Duration::from_secs(180),
            every_node_has("203.0.113.40"),
        )
        .await;
        common::wait_for(
            "an agent pod Ready on every node",
            Duration::from_secs(60),
            || {
                let api = Api::<DaemonSet>::namespaced(admin.clone(), "kube-system");
                async move {
                    api.get_opt("baton-agent")
                        .await
                        .ok()
                        .flatten()
                        .and_then(|d| d.status)
                        .is_some_and(|s| s.number_ready == 3)
                }
            },
        )
        .await;

        write_table(&admin, &[("203.0.113.41", None)]).await;
        common::wait_for(
            "the new FIP on every node",
            Duration::from_secs(30),
            every_node_has("203.0.113.41"),
        )
        .await;
        // Every pod ran with its own service account and the shipped RBAC (the agent holds no
        // secret: the third argument only has to be absent).
        common::assert_pod_logs_clean(&cp, "baton agent starting", 3, "no-secret-in-the-agent");
    });
}
