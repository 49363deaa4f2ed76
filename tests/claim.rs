//! `baton claim` as Cluster API's `preKubeadmCommands` (or an operator before `kubeadm init`)
//! runs it: the real binary on lab nodes (their own network namespaces and addresses, real
//! kube-apiservers on 198.51.100.11 and .12), the simulator routing each assigned Floating IP to
//! its server as the cloud does.
//!
//! On Hetzner Cloud's API: the FIP is assigned once, to the server this host is (found by its
//! own addresses), and its API server answers through the FIP from the lab host, from the other
//! node, and from the holder itself (before any baton controller or agent runs: what `kubeadm
//! init` and `join` need); a rerun sends nothing; a second control-plane node running the same
//! step leaves it where it is; another cluster's FIP is refused with a clear error and nothing
//! sent; killed while its assign action runs, a rerun finishes the job without a second FIP or a
//! move elsewhere. On Cherry Servers' API the same step, then the controller and the agent take
//! over and keep the FIP where claim put it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // a scenario reads best as one story

mod common;

use std::net::{IpAddr, SocketAddr};
use std::process::Output;
use std::time::Duration;

use baton_cloud::Cloud as _;
use baton_cloud::model::{CreateIpRequest, IpAddress, ServerId, Tags};
use baton_sim::{Faults, HetznerSettings, Latency, SimHandle, Topology};
use baton_testbed::{ControlPlane, Options, lab};
use serde_json::Value;

const CP0: u64 = 600_101;
const CP1: u64 = 600_102;

fn baton() -> &'static str {
    env!("CARGO_BIN_EXE_baton")
}

/// `baton claim ARGS --output json` on lab node `node`, with the cloud settings of `env` (and no
/// other environment but PATH).
async fn claim(cp: &ControlPlane, node: &str, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = cp.node_command(node, baton()).unwrap();
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .arg("claim")
        .args(args)
        .args(["--output", "json"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.kill_on_drop(true).output().await.unwrap();
    let mut seen = OUTPUTS.lock().unwrap();
    seen.extend_from_slice(&out.stdout);
    seen.extend_from_slice(&out.stderr);
    out
}

/// Everything every `baton claim` of this binary printed (the token must be in none of it).
static OUTPUTS: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "baton claim failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "claim's output is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The cloud's writes in the simulator's log since `seq` (anything but GET).
fn writes(sim: &SimHandle, seq: u64) -> Vec<String> {
    sim.log(seq)
        .into_iter()
        .filter(|e| e.method != "GET")
        .map(|e| format!("{} {} -> {}", e.method, e.path, e.status))
        .collect()
}

fn next_seq(sim: &SimHandle) -> u64 {
    sim.log(0).last().map_or(0, |e| e.seq + 1)
}

/// A Floating IP labelled `key=value`, assigned to `server` (or to none).
async fn fip(sim: &SimHandle, tag: (&str, &str), server: Option<u64>) -> IpAddress {
    let cloud = common::unlimited_client(sim);
    let ip = cloud
        .create_ip(CreateIpRequest {
            region: match sim.cloud() {
                baton_cloud::CloudKind::Cherry => "LT-Siauliai".into(),
                baton_cloud::CloudKind::Hetzner => "fsn1".into(),
            },
            tags: Tags::from([(tag.0.to_owned(), tag.1.to_owned())]),
            ..CreateIpRequest::default()
        })
        .await
        .unwrap();
    if let Some(s) = server {
        cloud.retarget_ip(&ip.id, ServerId(s)).await.unwrap();
    }
    ip
}

async fn target(sim: &SimHandle, ip: &IpAddress) -> Option<u64> {
    common::unlimited_client(sim)
        .ip(&ip.id)
        .await
        .unwrap()
        .target()
        .map(|s| s.0)
}

/// `nft -j list table ip baton` on `node`: (FIPs of prerouting, FIP → address of output).
async fn node_table(cp: &ControlPlane, node: &str) -> (Vec<IpAddr>, Vec<(IpAddr, IpAddr)>) {
    let out = cp
        .node_command(node, "nft")
        .unwrap()
        .args(["-j", "list", "table", "ip", "baton"])
        .output()
        .await
        .unwrap();
    if !out.status.success() {
        return (Vec::new(), Vec::new());
    }
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut pre = Vec::new();
    let mut output = Vec::new();
    for item in v["nftables"].as_array().unwrap() {
        let Some(rule) = item.get("rule") else { continue };
        let exprs = rule["expr"].as_array().unwrap();
        let daddr = exprs
            .iter()
            .find_map(|e| e["match"]["right"].as_str())
            .map(|a| a.parse::<IpAddr>().unwrap());
        let Some(daddr) = daddr else { continue };
        match rule["chain"].as_str() {
            Some("prerouting") => pre.push(daddr),
            Some("output") => {
                let to = exprs
                    .iter()
                    .find_map(|e| e["dnat"]["addr"].as_str())
                    .map(|a| a.parse::<IpAddr>().unwrap())
                    .unwrap();
                output.push((daddr, to));
            }
            _ => {}
        }
    }
    (pre, output)
}

/// `/readyz` of `https://<fip>:6443` from lab node `node` itself (its own connection, by curl
/// in its network namespace): what the node's kubelet and kubeadm do with the endpoint.
async fn readyz_from_node(cp: &ControlPlane, node: &str, fip: IpAddr) -> Result<(), String> {
    let out = cp
        .node_command(node, "curl")
        .unwrap()
        .args(["-sk", "--max-time", "2", &format!("https://{fip}:6443/readyz")])
        .output()
        .await
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && body.trim() == "ok" {
        Ok(())
    } else {
        Err(format!("curl exit {:?}: {}", out.status.code(), body.trim()))
    }
}

/// The endpoint answers through the FIP from the lab host (a client outside), from `other` (a
/// joining node: its packets cross the cloud's route) and from `holder` (its own packets).
async fn answers_everywhere(cp: &ControlPlane, fip: IpAddr, holder: &str, other: &str) {
    let addr = SocketAddr::new(fip, 6443);
    common::wait_for(
        "/readyz through the FIP from the lab host",
        Duration::from_secs(20),
        || common::readyz(cp.ca_der(), addr),
    )
    .await;
    for node in [other, holder] {
        let mut last = Err(String::new());
        for _ in 0..20 {
            last = readyz_from_node(cp, node, fip).await;
            if last.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(last.is_ok(), "/readyz through {fip} from {node}: {last:?}");
    }
}

fn hetzner_env(sim: &SimHandle) -> Vec<(&'static str, String)> {
    vec![
        ("BATON_CLOUD", "hetzner".to_owned()),
        ("HCLOUD_TOKEN", sim.api_key().to_owned()),
        ("HCLOUD_ENDPOINT", sim.base_url().to_string()),
        ("CHERRY_FIP_TAG", "cluster=prod-api".to_owned()),
        ("BATON_LOG", "info,baton=debug".to_owned()),
    ]
}

fn borrowed<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

#[test]
fn claim_on_hetzner_assigns_the_fip_once_to_this_server_and_never_takes_it_back() {
    lab::run(|| async {
        let cp = ControlPlane::start(Options {
            nodes: true,
            ..Options::servers(2)
        })
        .await
        .expect("two lab nodes with API servers");
        let sim = common::routed_hetzner_sim(
            HetznerSettings {
                action_ms: Latency::Fixed(300),
                ..HetznerSettings::default()
            },
            Faults::none(),
        )
        .await;
        let ours = fip(&sim, ("cluster", "prod-api"), None).await;
        let theirs = fip(&sim, ("cluster", "other-api"), Some(CP1)).await;
        let env = hetzner_env(&sim);
        let env = borrowed(&env);
        let fip_addr = SocketAddr::new(ours.address, 6443);
        assert!(
            !common::readyz(cp.ca_der(), fip_addr).await,
            "nothing answers through an unassigned FIP"
        );

        // The first control-plane server, before its API server is in use: by the FIP's
        // address (the controlPlaneEndpoint), the server found by the node's own address.
        let seq = next_seq(&sim);
        let t0 = std::time::Instant::now();
        let out = claim(&cp, "cp-0", &env, &["--fip", &ours.address.to_string()]).await;
        let first = json_of(&out);
        eprintln!("claim on cp-0 took {:.2}s: {first}", t0.elapsed().as_secs_f64());
        assert_eq!(first["result"], "assigned", "{first}");
        assert_eq!(first["server"], "cp-0");
        assert_eq!(first["serverId"], CP0);
        assert_eq!(first["ownTrafficTo"], "198.51.100.11");
        assert_eq!(target(&sim, &ours).await, Some(CP0));
        let sent = writes(&sim, seq);
        assert_eq!(
            sent,
            vec![format!("POST /v1/floating_ips/{}/actions/assign -> 201", ours.id)],
            "one assign action, nothing else written"
        );
        let (pre, output) = node_table(&cp, "cp-0").await;
        assert_eq!(pre, vec![ours.address]);
        assert_eq!(output, vec![(ours.address, "198.51.100.11".parse().unwrap())]);
        answers_everywhere(&cp, ours.address, "cp-0", "cp-1").await;

        // Rerun (cloud-init again, an operator): nothing written, the same answer.
        let seq = next_seq(&sim);
        let again = json_of(&claim(&cp, "cp-0", &env, &["--fip", &ours.address.to_string()]).await);
        assert_eq!(again["result"], "already-here", "{again}");
        assert_eq!(writes(&sim, seq), Vec::<String>::new(), "a rerun sends nothing");
        assert_eq!(node_table(&cp, "cp-0").await.0, vec![ours.address]);

        // A second control-plane node running the same step (found by fipTag this time): the
        // FIP stays on cp-0's API server; cp-1 accepts it for a later failover, and its own
        // packets still cross the cloud's route.
        let seq = next_seq(&sim);
        let second = json_of(&claim(&cp, "cp-1", &env, &[]).await);
        assert_eq!(second["result"], "held-elsewhere", "{second}");
        assert_eq!(second["holder"], CP0);
        assert!(second.get("ownTrafficTo").is_none(), "{second}");
        assert_eq!(writes(&sim, seq), Vec::<String>::new());
        assert_eq!(target(&sim, &ours).await, Some(CP0));
        assert_eq!(node_table(&cp, "cp-1").await, (vec![ours.address], Vec::new()));
        answers_everywhere(&cp, ours.address, "cp-0", "cp-1").await;

        // Another cluster's FIP: refused, naming it and the rule; nothing sent, nothing changed.
        let seq = next_seq(&sim);
        let out = claim(&cp, "cp-0", &env, &["--fip", &theirs.address.to_string()]).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "bad input: exit 2; {stderr}");
        for part in [
            theirs.address.to_string(),
            format!("({},", theirs.id),
            "cluster=other-api".to_owned(),
            "fipTag cluster=prod-api".to_owned(),
            "adoptFips".to_owned(),
        ] {
            assert!(stderr.contains(&part), "{part:?} not in: {stderr}");
        }
        assert_eq!(writes(&sim, seq), Vec::<String>::new());
        assert_eq!(target(&sim, &theirs).await, Some(CP1));
        assert_eq!(
            node_table(&cp, "cp-0").await.0,
            vec![ours.address],
            "cp-0's table as it was"
        );

        // Bad input names the field: a FIP that is not the project's, a server that is not.
        let out = claim(&cp, "cp-0", &env, &["--fip", "203.0.113.250"]).await;
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("--fip 203.0.113.250"));
        let out = claim(&cp, "cp-0", &env, &["--server", "cp-9"]).await;
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("--server cp-9"));
        let out = claim(&cp, "cp-0", &env, &["--hcloud-token", "x"]).await;
        assert_eq!(out.status.code(), Some(2), "the token is never a flag");

        // Killed while its assign action runs (a reboot during cloud-init), then run again: the
        // FIP ends on this server, no FIP created, never sent anywhere else, no unassign.
        let spare = fip(&sim, ("cluster", "spare-api"), None).await;
        let mut slow = sim.hetzner_settings().unwrap();
        slow.action_ms = Latency::Fixed(2_000);
        sim.set_hetzner_settings(slow).unwrap();
        let fips_before = common::cloud_ips(&sim).await.len();
        let seq = next_seq(&sim);
        let mut killed = cp.node_command("cp-1", baton()).unwrap();
        killed
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .args(["claim", "--fip", &spare.address.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        for (k, v) in &env {
            killed.env(k, v);
        }
        killed.env("CHERRY_FIP_TAG", "cluster=spare-api");
        let mut child = killed.spawn().unwrap();
        common::wait_for("the assign action sent", Duration::from_secs(20), || async {
            writes(&sim, seq).iter().any(|w| w.contains("/actions/assign"))
        })
        .await;
        child.start_kill().unwrap();
        let status = child.wait().await.unwrap();
        assert!(!status.success(), "killed mid-way");
        let spare_env: Vec<(&str, &str)> = env
            .iter()
            .map(|(k, v)| {
                if *k == "CHERRY_FIP_TAG" {
                    (*k, "cluster=spare-api")
                } else {
                    (*k, *v)
                }
            })
            .collect();
        let rerun = json_of(&claim(&cp, "cp-1", &spare_env, &["--fip", &spare.address.to_string()]).await);
        eprintln!("rerun after the kill: {rerun}");
        // The first run's action ends while the rerun waits (the API answers 423 `locked` to
        // its assign meanwhile): the rerun finds the FIP here and sends no second one.
        assert_eq!(rerun["result"], "already-here", "{rerun}");
        assert_eq!(target(&sim, &spare).await, Some(CP1));
        let sent = writes(&sim, seq);
        let assign = format!("POST /v1/floating_ips/{}/actions/assign", spare.id);
        assert!(
            sent.iter().all(|w| w.starts_with(&assign)),
            "only assigns of that FIP: {sent:?}"
        );
        assert_eq!(
            sent.iter().filter(|w| w.ends_with("-> 201")).count(),
            1,
            "one assign accepted, the killed run's: {sent:?}"
        );
        assert_eq!(common::cloud_ips(&sim).await.len(), fips_before, "no FIP created");
        assert_eq!(
            common::cloud_ips(&sim)
                .await
                .iter()
                .filter(|ip| ip.target() == Some(ServerId(CP1)))
                .count(),
            2,
            "cp-1 holds the spare FIP and the other cluster's, as before"
        );

        // The token is in no output of any run above (their logs at debug level included).
        let seen = String::from_utf8_lossy(&OUTPUTS.lock().unwrap()).into_owned();
        assert!(seen.contains("claiming"), "the runs' logs were read");
        assert!(!seen.contains(sim.api_key()), "the token was printed");
    });
}

#[test]
fn claim_on_cherry_then_the_controller_and_agent_keep_the_fip_where_it_is() {
    lab::run(|| async {
        let cp = ControlPlane::start(Options {
            nodes: true,
            ..Options::servers(2)
        })
        .await
        .expect("two lab nodes with API servers");
        let sim = common::routed_sim(Faults::none(), Topology::default()).await;
        let ours = fip(&sim, ("cluster", "prod-api"), None).await;
        let env = [
            ("CHERRY_API_KEY", sim.api_key().to_owned()),
            ("CHERRY_PROJECT_ID", sim.project_id().to_string()),
            ("CHERRY_BASE_URL", sim.base_url().to_string()),
            ("CHERRY_FIP_TAG", "cluster=prod-api".to_owned()),
        ];
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let seq = next_seq(&sim);
        // By the server's name this time, as an operator may give it.
        let first = json_of(&claim(&cp, "cp-0", &env, &["--server", "cp-0"]).await);
        assert_eq!(first["result"], "assigned", "{first}");
        assert_eq!(
            writes(&sim, seq),
            vec![format!("PUT /v1/ips/{} -> 200", ours.id)],
            "one retarget"
        );
        answers_everywhere(&cp, ours.address, "cp-0", "cp-1").await;

        // The cluster takes over: the controller (fipTag) and the agent on both nodes. The FIP
        // stays on its healthy holder, nobody writes to the cloud, and it keeps answering
        // from everywhere (the agents adopt claim's rules, the holder's own traffic included).
        let logs = tempfile::tempdir().unwrap();
        let seq = next_seq(&sim);
        let mut procs = Vec::new();
        for i in 0..2 {
            procs.push(common::node::controller(
                &cp,
                baton(),
                &sim,
                i,
                "cluster=prod-api",
                logs.path(),
            ));
            procs.push(common::node::agent(
                &cp,
                baton(),
                i,
                &logs.path().join(format!("agent-{i}.log")),
            ));
        }
        let client = cp.client(0).unwrap();
        common::wait_for("the mirror Service's ingress", Duration::from_secs(60), || {
            common::mirror_has_ingress(&client)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(target(&sim, &ours).await, Some(CP0), "kept where claim put it");
        let moved: Vec<String> = writes(&sim, seq)
            .into_iter()
            .filter(|w| w.contains("/v1/ips/"))
            .collect();
        assert!(moved.is_empty(), "no move of a healthy holder: {moved:?}");
        answers_everywhere(&cp, ours.address, "cp-0", "cp-1").await;
        assert_eq!(
            node_table(&cp, "cp-0").await.1,
            vec![(ours.address, "198.51.100.11".parse().unwrap())],
            "the agent keeps the holder's own rule"
        );
        for mut p in procs {
            let _ = p.start_kill();
            let _ = p.wait().await;
        }
    });
}
