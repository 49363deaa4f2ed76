//! docs/install.md, followed in the lab: both install guides, with each guide's
//! `bootstrap.yaml` and shell commands taken from the document as written (`helm template`,
//! `baton bootstrap`, guide B's `cp` / `kubectl config set-cluster`, and the shipped systemd
//! unit's `ExecStart` for its `systemctl enable`), run with only the lab's file paths, the DNS
//! TTL and the simulator's URL changed; real kube-apiservers stand in for the installer's
//! control plane and for `kubeadm init`/`join`, and the Deployment the handoff applied runs as
//! two processes (`common::pod`; the Deployment on real kubelets is `tests/pods.rs`'s and
//! `tests/bootstrap.rs`'s).
//!
//! On the path real nodes have: the control-plane servers are lab nodes (each its own network
//! namespace and API server; guide A's bootstrap host is the lab host, no node), the simulator
//! routes each FIP to its holder as the cloud does, and on every node `baton agent` runs as the
//! handoff's DaemonSet would (its ServiceAccount, the rendered RBAC) and the controller's pods
//! run in their nodes' namespaces. The clients that check the FIP are on the lab host.
//!
//! - A. a separate bootstrap host: `complete`, DNS ends with the FIPs only, every FIP routed to a
//!   control-plane Node, the API answers through the FIP after the bootstrap host is stopped.
//! - B. the kubeadm way: cp-0 is the bootstrap host; after `complete` its address has left DNS
//!   but it stays a candidate: `baton status` lists it, and with the other API servers stopped
//!   the FIP is routed to it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // a guide reads top to bottom

mod common;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use baton_cloud::Cloud as _;
use baton_cloud::model::{CreateIpRequest, IpAddress, IpType, ServerId, Tags};
use baton_sim::{Faults, SimHandle, Topology};
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, TokenUser, lab};
use common::eventually;
use hickory_net::client::{Client, ClientHandle as _};
use hickory_net::runtime::TokioRuntimeProvider;
use hickory_net::udp::UdpClientStream;
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

const SA_TOKEN: &str = "baton-sa-token";
const CP: [u64; 3] = [600_101, 600_102, 600_103];
const NAME: &str = "api.prod.example.com.";
const WAIT: Duration = Duration::from_secs(120);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn baton_user() -> TokenUser {
    TokenUser {
        token: SA_TOKEN.into(),
        name: "system:serviceaccount:kube-system:baton".into(),
        groups: vec![
            "system:serviceaccounts".into(),
            "system:serviceaccounts:kube-system".into(),
        ],
    }
}

/// The fenced yaml block of docs/install.md whose first line contains `marker`, unindented.
fn guide_block(marker: &str) -> String {
    let text = std::fs::read_to_string(root().join("docs/install.md")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("docs/install.md has no block {marker:?}"));
    let indent = lines[start].len() - lines[start].trim_start().len();
    let mut out = String::new();
    for line in &lines[start..] {
        if line.trim_start().starts_with("```") {
            break;
        }
        out.push_str(line.get(indent..).unwrap_or(""));
        out.push('\n');
    }
    out
}

/// The lab's differences from a real host, applied to a guide's `bootstrap.yaml`.
fn for_the_lab(config: &str, cp: &ControlPlane, kubeconfig: &Path, state_dir: &Path) -> String {
    let replaced = config
        .replace("/etc/baton/bootstrap.kubeconfig", kubeconfig.to_str().unwrap())
        .replace(
            "/etc/kubernetes/pki/ca.crt",
            cp.dir().join("ca.crt").to_str().unwrap(),
        )
        .replace("/var/lib/baton/", &format!("{}/", state_dir.display()))
        .replace("ttl: 30", "ttl: 2");
    assert_ne!(replaced, config);
    replaced
}

/// The commands of the first `sh` block of docs/install.md after the line containing `after`, as
/// a user would type them: continuation lines joined, comments and blank lines dropped.
fn guide_commands(after: &str) -> Vec<String> {
    let text = std::fs::read_to_string(root().join("docs/install.md")).unwrap();
    let mut lines = text.lines().skip_while(|l| !l.contains(after));
    assert!(lines.next().is_some(), "docs/install.md has no {after:?}");
    let mut out = Vec::new();
    let mut command = String::new();
    for line in lines.skip_while(|l| l.trim() != "```sh").skip(1) {
        let line = line.trim();
        if line.starts_with("```") {
            break;
        }
        // A comment, whole-line or after the command (`cmd   # why`).
        let line = line.split_once(" #").map_or(line, |(cmd, _)| cmd).trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(start) = line.strip_suffix('\\') {
            command.push_str(start.trim_end());
            command.push(' ');
        } else {
            command.push_str(line);
            out.push(std::mem::take(&mut command));
        }
    }
    assert!(!out.is_empty(), "no commands after {after:?}");
    out
}

/// A guide's command with the host's paths in the lab's `dir` and the API key filled in.
fn on_the_lab_host(command: &str, dir: &Path, api_key: &str) -> String {
    let dir = dir.display();
    command
        .replace("CHERRY_API_KEY=…", &format!("CHERRY_API_KEY={api_key}"))
        .replace("/etc/baton/", &format!("{dir}/"))
        .replace("/etc/kubernetes/", &format!("{dir}/kubernetes/"))
        .replace("/var/lib/baton/", &format!("{dir}/"))
        .replace("/run/baton/", &format!("{dir}/"))
        .replace(
            "${CREDENTIALS_DIRECTORY}/kubeconfig",
            &format!("{dir}/bootstrap.kubeconfig"),
        )
        .replace("/usr/local/bin/baton", "baton")
}

/// `PATH` with this build's `baton` and the test env's `kubectl` first.
fn guide_path(dir: &Path) -> std::ffi::OsString {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let link = bin.join("baton");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_baton"), &link).unwrap();
    }
    let kubectl = baton_testbed::control_plane::testenv_dir().unwrap().join("bin");
    let mut path = bin.into_os_string();
    path.push(":");
    path.push(kubectl);
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    path
}

/// Runs one of the guide's shell commands (`bash -e`) on the "host" `dir`, with the simulator's
/// URL in the environment (as `/etc/baton/bootstrap.env` gives it); `exec`, so the child is
/// the command itself. `node`: the host is that lab node (its network and mount namespaces),
/// else the lab host.
fn guide_shell(
    command: &str,
    dir: &Path,
    sim: &SimHandle,
    log: &Path,
    node: Option<(&ControlPlane, &str)>,
) -> Command {
    let mut cmd = match node {
        Some((cp, name)) => cp.node_command(name, "bash").unwrap(),
        None => Command::new("bash"),
    };
    cmd.args(["-euo", "pipefail", "-c"])
        .arg(format!("exec {}", on_the_lab_host(command, dir, sim.api_key())))
        .current_dir(root())
        .env_clear()
        .env("PATH", guide_path(dir))
        .env("HOME", dir)
        .env("CHERRY_API_KEY", sim.api_key())
        .env("CHERRY_BASE_URL", sim.base_url().as_str())
        .env("BATON_LOG", "info,baton=debug,hickory_server=warn,kube=warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true);
    cmd
}

/// Runs a guide's command to its end (on `node`, as [`guide_shell`]); fails the test with its
/// output unless it exits 0.
async fn guide_run(
    command: &str,
    dir: &Path,
    sim: &SimHandle,
    log: &str,
    node: Option<(&ControlPlane, &str)>,
) -> String {
    let log = dir.join(log);
    let out = guide_shell(command, dir, sim, &log, node).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{command}: {}\n{stdout}\n{}",
        out.status,
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    stdout
}

/// The common step: the guide's `helm template` block, run as written (the API key exported,
/// `/etc/baton/baton.yaml` written and made 0600).
async fn render_manifests(dir: &Path, sim: &SimHandle) {
    assert_eq!(sim.project_id(), 123_456, "the guide's project ID");
    let helm = common::helm::Helm::new();
    let script = guide_commands("## Common step").join("\n");
    assert!(script.contains("helm template"), "{script}");
    let log = dir.join("helm.log");
    let mut cmd = Command::new("bash");
    cmd.args([
        "-euo",
        "pipefail",
        "-c",
        &on_the_lab_host(&script, dir, sim.api_key()),
    ])
    .current_dir(root())
    .env_clear()
    .envs(helm.env())
    .env("HOME", dir)
    .stderr(std::fs::File::create(&log).unwrap());
    let out = cmd.output().await.unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let rendered = std::fs::read_to_string(dir.join("baton.yaml")).unwrap();
    assert!(rendered.contains("kind: Deployment"), "{rendered}");
    assert!(!rendered.contains('…'), "the API key placeholder is filled in");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.join("baton.yaml")).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the guide's chmod 600");
}

/// The one command of `commands` that starts with `prefix` and contains `with`.
fn pick<'a>(commands: &'a [String], prefix: &str, with: &str) -> &'a str {
    let found: Vec<&String> = commands
        .iter()
        .filter(|c| c.starts_with(prefix) && c.contains(with))
        .collect();
    assert_eq!(found.len(), 1, "{prefix}…{with} in {commands:#?}");
    found[0]
}

/// The `ExecStart` of the shipped systemd unit, continuation lines joined.
fn unit_exec_start() -> String {
    let text = std::fs::read_to_string(root().join("systemd/baton-bootstrap.service")).unwrap();
    let mut lines = text.lines().skip_while(|l| !l.starts_with("ExecStart="));
    let mut command = lines.next().unwrap()["ExecStart=".len()..].to_owned();
    while let Some(start) = command.strip_suffix('\\') {
        command = format!("{} {}", start.trim_end(), lines.next().unwrap().trim());
    }
    command
}

/// Reads the bootstrap's JSON events until `until` matches one (or the process ends).
async fn read_events(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    until: impl Fn(&serde_json::Value) -> bool,
) -> Vec<serde_json::Value> {
    let mut events = Vec::new();
    let read = async {
        while let Ok(Some(line)) = lines.next_line().await {
            let v: serde_json::Value =
                serde_json::from_str(&line).unwrap_or(serde_json::json!({"raw": line}));
            let done = until(&v);
            events.push(v);
            if done {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(240), read)
        .await
        .expect("baton bootstrap did not get there in time");
    events
}

fn is_summary(v: &serde_json::Value) -> bool {
    v["event"] == "summary"
}

/// The handoff's Deployment run as pods on lab nodes `nodes` (each in its node's namespaces,
/// talking to its node's API server with the ServiceAccount's token, its Node name from the
/// downward API's `spec.nodeName`), and the handoff's agent DaemonSet as `baton agent` on every
/// lab node, with a token of its own ServiceAccount: both once the handoff has applied them.
async fn start_pods(
    cp: &ControlPlane,
    sim: &SimHandle,
    nodes: &[&str],
    dir: &Path,
) -> (Vec<common::pod::Pod>, Vec<Child>) {
    let admin = cp.client(0).unwrap();
    eventually(WAIT, "the handoff's Deployment and agent DaemonSet", || async {
        let deployment = Api::<Deployment>::namespaced(admin.clone(), "kube-system")
            .get_opt("baton")
            .await
            .ok()
            .flatten();
        let daemonset = Api::<DaemonSet>::namespaced(admin.clone(), "kube-system")
            .get_opt("baton-agent")
            .await
            .ok()
            .flatten();
        deployment.zip(daemonset)
    })
    .await;
    let baton = Path::new(env!("CARGO_BIN_EXE_baton"));
    let agent_token = common::service_account_token(&admin, "kube-system", "baton-agent").await;
    let agents = cp
        .node_names()
        .iter()
        .map(|name| {
            let i = cp.apiserver_of_node(name).unwrap();
            let kubeconfig = cp.write_kubeconfig(i, &agent_token).unwrap();
            cp.node_command(name, baton)
                .unwrap()
                .args(["agent", "--kubeconfig", kubeconfig.to_str().unwrap()])
                .env("BATON_LOG", "info,baton=debug")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join(format!("agent-{name}.log"))).unwrap())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect();
    let mut pods = Vec::new();
    for &name in nodes {
        let i = cp.apiserver_of_node(name).unwrap();
        let kubeconfig = cp.write_kubeconfig(i, SA_TOKEN).unwrap();
        pods.push(
            common::pod::start(
                &common::node::on_node(cp, name, baton, dir),
                &cp.client(i).unwrap(),
                "kube-system",
                "baton",
                &format!("baton-{name}"),
                &kubeconfig,
                &[
                    ("CHERRY_BASE_URL", sim.base_url().as_str()),
                    // What the downward API's spec.nodeName gives the container.
                    ("NODE_NAME", name),
                ],
            )
            .await,
        );
    }
    (pods, agents)
}

fn dns_client(addr: SocketAddr) -> Client<TokioRuntimeProvider> {
    let stream = UdpClientStream::builder(addr, TokioRuntimeProvider::default())
        .with_timeout(Some(Duration::from_millis(200)))
        .build();
    let (client, bg) = Client::<TokioRuntimeProvider>::from_sender(stream);
    tokio::spawn(bg);
    client
}

async fn resolve(client: &mut Client<TokioRuntimeProvider>, name: &str) -> Option<BTreeSet<IpAddr>> {
    let resp = client
        .query(Name::from_ascii(name).unwrap(), DNSClass::IN, RecordType::A)
        .await
        .ok()?;
    Some(
        resp.answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                _ => None,
            })
            .collect(),
    )
}

/// Every distinct DNS answer for `NAME` at `addr`, in order, until cancelled.
fn watch_dns(addr: SocketAddr, stop: CancellationToken) -> tokio::task::JoinHandle<Vec<BTreeSet<IpAddr>>> {
    tokio::spawn(async move {
        let mut client = dns_client(addr);
        let mut seen: Vec<BTreeSet<IpAddr>> = Vec::new();
        while !stop.is_cancelled() {
            if let Some(a) = resolve(&mut client, NAME).await
                && !a.is_empty()
                && seen.last() != Some(&a)
            {
                seen.push(a);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen
    })
}

async fn floating_ips(sim: &SimHandle) -> Vec<IpAddress> {
    common::cloud_ips(sim)
        .await
        .into_iter()
        .filter(|i| i.ip_type == IpType::FloatingIp)
        .collect()
}

/// API servers on `servers` (198.51.100.`n`), every one but the bootstrap host (.10) a lab node.
fn lab_options(servers: &[u8]) -> Options {
    Options {
        servers: servers.iter().map(|n| lab::public_ip(*n)).collect(),
        extra_sans: vec!["api.prod.example.com".into(), "api-int.prod.example.com".into()],
        users: vec![baton_user()],
        nodes: true,
        ..Options::default()
    }
}

#[test]
fn guide_a_with_a_separate_bootstrap_host() {
    lab::run(|| async {
        baton_testbed::init_tracing();
        // The installer's bootstrap control plane (198.51.100.10) and the control-plane
        // nodes joining it (.11-.13; kubelets register their Nodes).
        let mut cp = ControlPlane::start(lab_options(&[10, 11, 12, 13])).await.unwrap();
        cp.register_nodes(CP.len()).await.unwrap();
        let sim = common::routed_sim(Faults::none(), Topology::default()).await;
        // Step 1: the installer reserved the api FIP, tagged, not routed.
        let api_fip = common::unlimited_client(&sim)
            .create_ip(CreateIpRequest {
                region: "LT-Siauliai".into(),
                tags: Tags::from([("cluster".to_owned(), "prod-api".to_owned())]),
                ..Default::default()
            })
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        render_manifests(dir.path(), &sim).await;
        // Step 2: the guide's config; the bootstrap control plane's admin kubeconfig.
        let kubeconfig = dir.path().join("bootstrap.kubeconfig");
        std::fs::copy(cp.write_kubeconfig(0, ADMIN_TOKEN).unwrap(), &kubeconfig).unwrap();
        let config = dir.path().join("bootstrap.yaml");
        let text = guide_block("/etc/baton/bootstrap.yaml — A.");
        std::fs::write(&config, for_the_lab(&text, &cp, &kubeconfig, dir.path())).unwrap();
        // Step 3: the guide's commands: check, then run.
        let step3 = guide_commands("3. **Check it**");
        guide_run(
            pick(&step3, "baton bootstrap", "--check-config"),
            dir.path(),
            &sim,
            "check.log",
            None,
        )
        .await;
        let stop_dns = CancellationToken::new();
        let dns = watch_dns("192.0.2.10:53".parse().unwrap(), stop_dns.clone());
        let mut child = guide_shell(
            pick(&step3, "baton bootstrap", "--exit-when-complete"),
            dir.path(),
            &sim,
            &dir.path().join("bootstrap.log"),
            None,
        )
        .spawn()
        .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let events = tokio::spawn(async move { read_events(&mut lines, is_summary).await });
        // The controller's pods start on cp-0 and cp-1 as they join, the agent on every node.
        let (pods, _agents) = start_pods(&cp, &sim, &["cp-0", "cp-1"], dir.path()).await;
        let events = events.await.unwrap();
        let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .expect("exits after complete")
            .unwrap();
        stop_dns.cancel();
        let seen = dns.await.unwrap();
        let log = std::fs::read_to_string(dir.path().join("bootstrap.log")).unwrap();
        assert_eq!(status.code(), Some(0), "events: {events:#?}\n{log}");
        assert_eq!(events.last().unwrap()["result"], "complete", "{events:#?}");

        // DNS: the bootstrap host first, the FIPs only at the end.
        let fips: BTreeSet<IpAddr> = floating_ips(&sim).await.iter().map(|f| f.address).collect();
        assert_eq!(
            fips.len(),
            2,
            "api (the installer's) and api-int (reserved): {fips:?}"
        );
        assert!(fips.contains(&api_fip.address));
        let bootstrap_ip = lab::public_ip(10);
        eprintln!("{NAME} answered, in order: {seen:?}");
        assert!(seen.first().unwrap().contains(&bootstrap_ip), "{seen:?}");
        let last = seen.last().unwrap();
        assert!(!last.contains(&bootstrap_ip), "{seen:?}");
        assert_eq!(last, &BTreeSet::from([api_fip.address]), "{seen:?}");
        // Every FIP routed to a control-plane Node, never to the bootstrap host.
        for fip in floating_ips(&sim).await {
            let target = fip.target().map(|t| t.0);
            assert!(
                target.is_some_and(|t| CP.contains(&t)),
                "{} targets {target:?}",
                fip.address
            );
        }
        // The API Services: control-plane endpoints no load-balancer implementation handles.
        let api_svc =
            Api::<k8s_openapi::api::core::v1::Service>::namespaced(cp.client(1).unwrap(), "kube-system")
                .get("api")
                .await
                .unwrap();
        assert_eq!(
            api_svc.spec.unwrap().load_balancer_class.as_deref(),
            Some("baton.dev/control-plane")
        );
        // Step 4: tear the bootstrap host down; the API answers through the FIP.
        cp.stop_apiserver(0).await.unwrap();
        let fip_addr = SocketAddr::new(api_fip.address, 6443);
        let mut ok = false;
        for _ in 0..50 {
            if common::readyz(cp.ca_der(), fip_addr).await {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ok, "/readyz through the FIP after the bootstrap host went");
        for pod in pods {
            pod.stop().await;
        }
    });
}

#[test]
fn guide_b_the_kubeadm_way_keeps_the_first_node_as_a_candidate() {
    lab::run(|| async {
        baton_testbed::init_tracing();
        // kubeadm init on cp-0 (198.51.100.11), cp-1 and cp-2 join; kubelets register Nodes.
        let mut cp = ControlPlane::start(lab_options(&[11, 12, 13])).await.unwrap();
        cp.register_nodes(CP.len()).await.unwrap();
        let admin = cp.client(0).unwrap();
        let sim = Arc::new(common::routed_sim(Faults::none(), Topology::default()).await);
        let dir = tempfile::tempdir().unwrap();
        render_manifests(dir.path(), &sim).await;
        // Step 1: the guide's config.
        let kubeconfig = dir.path().join("bootstrap.kubeconfig");
        let config = dir.path().join("bootstrap.yaml");
        let text = guide_block("/etc/baton/bootstrap.yaml — B.");
        std::fs::write(&config, for_the_lab(&text, &cp, &kubeconfig, dir.path())).unwrap();
        // Step 2. `kubeadm init phase kubeconfig admin` wrote admin.conf: cluster `kubernetes`
        // at the control-plane endpoint (the name baton is about to publish). The guide's own
        // commands copy it and point baton's copy at cp-0's API server (the real kubectl), check
        // the config, and start the unit; a real API server stands in for `kubeadm init`/`join`.
        std::fs::create_dir_all(dir.path().join("kubernetes")).unwrap();
        let admin_conf = baton_testbed::control_plane::kubeconfig(
            "https://api.prod.example.com:6443",
            cp.ca_pem(),
            ADMIN_TOKEN,
        )
        .replace("- name: lab\n  cluster:", "- name: kubernetes\n  cluster:")
        .replace("cluster: lab\n", "cluster: kubernetes\n");
        assert!(admin_conf.contains("- name: kubernetes\n") && admin_conf.contains("cluster: kubernetes\n"));
        std::fs::write(dir.path().join("kubernetes/admin.conf"), admin_conf).unwrap();
        let step2 = guide_commands("2. **Certificates and the admin kubeconfig first");
        // Every command on cp-0, the first control-plane node.
        let cp0 = Some((&cp, "cp-0"));
        guide_run(pick(&step2, "cp ", "admin.conf"), dir.path(), &sim, "cp.log", cp0).await;
        guide_run(
            pick(&step2, "kubectl ", "set-cluster"),
            dir.path(),
            &sim,
            "kubectl.log",
            cp0,
        )
        .await;
        let copy = std::fs::read_to_string(&kubeconfig).unwrap();
        assert!(copy.contains("server: https://198.51.100.11:6443"), "{copy}");
        guide_run(
            pick(&step2, "baton bootstrap", "--check-config"),
            dir.path(),
            &sim,
            "check.log",
            cp0,
        )
        .await;
        // `systemctl enable --now baton-bootstrap`: the shipped unit's ExecStart on cp-0, its
        // paths in the test's directory (the credential is the copy above). It keeps serving DNS
        // after completion.
        pick(&step2, "systemctl enable", "baton-bootstrap");
        let mut child = guide_shell(
            &unit_exec_start(),
            dir.path(),
            &sim,
            &dir.path().join("bootstrap.log"),
            cp0,
        )
        .spawn()
        .unwrap();
        let (pods, _agents) = start_pods(&cp, &sim, &["cp-0", "cp-1"], dir.path()).await;
        let status_file = dir.path().join("bootstrap-status.json");
        let status = eventually(
            Duration::from_secs(240),
            "the unit's status file says complete",
            || async {
                let text = std::fs::read_to_string(&status_file).ok()?;
                let v: serde_json::Value = serde_json::from_str(&text).ok()?;
                (v["result"] == "complete").then_some(v)
            },
        )
        .await;
        let log = std::fs::read_to_string(dir.path().join("bootstrap.log")).unwrap();
        assert!(
            child.try_wait().unwrap().is_none(),
            "still serving DNS: {status:#}\n{log}"
        );

        // cp-0's address has left DNS: the FIP only.
        let fips = floating_ips(&sim).await;
        assert_eq!(fips.len(), 1, "{fips:?}");
        let fip = fips[0].clone();
        let answer = eventually(WAIT, "DNS answers the FIP only", || async {
            let mut client = dns_client("192.0.2.11:53".parse().unwrap());
            resolve(&mut client, NAME)
                .await
                .filter(|a| a == &BTreeSet::from([fip.address]))
        })
        .await;
        assert!(!answer.contains(&lab::public_ip(11)));
        // `baton status` lists cp-0 among the FIP's candidates.
        let out = Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(["status", "--output", "json", "--kubeconfig"])
            .arg(cp.write_kubeconfig(1, ADMIN_TOKEN).unwrap())
            .env("CHERRY_API_KEY", sim.api_key())
            .env("CHERRY_PROJECT_ID", sim.project_id().to_string())
            .env("CHERRY_BASE_URL", sim.base_url().as_str())
            .output()
            .await
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let candidates = report["endpoints"][0]["candidates"].to_string();
        assert!(
            candidates.contains("\"cp-0\"") && candidates.contains("198.51.100.11"),
            "{report:#}"
        );

        // cp-0 stays a candidate. Move the FIP away from it (cordon), then take the other API
        // servers down: the FIP comes back to cp-0 and the API answers through it. They are
        // killed: a graceful stop of a node's API server lasts until the testbed's 30 s grace
        // runs out, as it keeps serving the watch of the node's agent after it stopped
        // listening; either way a new connection is refused at once.
        let cloud = common::unlimited_client(&sim);
        let nodes: Api<Node> = Api::all(admin.clone());
        let cordon = |on: bool| serde_json::json!({"spec": {"unschedulable": on}});
        nodes
            .patch("cp-0", &PatchParams::default(), &Patch::Merge(&cordon(true)))
            .await
            .unwrap();
        eventually(WAIT, "the FIP away from the cordoned cp-0", || async {
            let t = cloud.ip(&fip.id).await.ok()?.target()?;
            (t != ServerId(CP[0])).then_some(t)
        })
        .await;
        nodes
            .patch("cp-0", &PatchParams::default(), &Patch::Merge(&cordon(false)))
            .await
            .unwrap();
        cp.kill_apiserver(1).await;
        cp.kill_apiserver(2).await;
        eventually(WAIT, "the FIP routed to cp-0", || async {
            (cloud.ip(&fip.id).await.ok()?.target()? == ServerId(CP[0])).then_some(())
        })
        .await;
        let fip_addr = SocketAddr::new(fip.address, 6443);
        eventually(WAIT, "/readyz through the FIP on cp-0", || async {
            common::readyz(cp.ca_der(), fip_addr).await.then_some(())
        })
        .await;
        for pod in pods {
            pod.stop().await;
        }
        drop(child);
    });
}
