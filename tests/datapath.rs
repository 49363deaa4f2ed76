//! The control-plane FIP on the path real nodes have: the cloud *routes* the FIP to its holder
//! (packets keep the FIP as their destination), every node runs a real kube-proxy, and nothing
//! splices connections. Three lab nodes (each its own network namespace, API server and
//! kube-proxy), the simulator routing the FIP in the lab's hub, and on every node what ships
//! there: a `baton controller` replica talking to its own node's API server and `baton agent`.
//! The client is the lab host, which is no node.
//!
//! Before the agents run, the controllers route the FIP but nothing on the holder accepts it:
//! `/readyz` through the FIP does not answer — what every baton before the agent did on a real
//! node, since kube-proxy ignores the mirror's `ipMode: Proxy` ingress. Once the agents run it
//! answers, from the lab host and from every node (a node's own packets to the FIP leave it and
//! come back through the cloud's routing), and again after the holder's API server dies.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

/// The binary under test.
const BATON: &str = env!("CARGO_BIN_EXE_baton");

use std::net::SocketAddr;
use std::time::Duration;

use baton_sim::{Faults, SimHandle, Topology};
use baton_testbed::control_plane::ProxyMode;
use baton_testbed::{ControlPlane, Options, lab};
use tokio::process::Child;

const CP: [u64; 3] = [600_101, 600_102, 600_103];

/// `/readyz` through the FIP, from lab node `name` (curl in the node's namespaces).
async fn readyz_from_node(cp: &ControlPlane, name: &str, fip: SocketAddr) -> bool {
    let out = cp
        .node_command(name, "curl")
        .unwrap()
        .args(["-s", "-m", "1", "--cacert"])
        .arg(cp.dir().join("ca.crt"))
        .args([
            "--resolve",
            &format!("kubernetes.default.svc:{}:{}", fip.port(), fip.ip()),
        ])
        .arg(format!("https://kubernetes.default.svc:{}/readyz", fip.port()))
        .output()
        .await
        .unwrap();
    out.stdout == b"ok"
}

/// The mirror Service's holder annotations (`baton.dev/fip-holder`, `…-address`).
async fn holder_annotations(client: &kube::Client) -> Option<(String, String)> {
    let svc = kube::Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), "kube-system")
        .get_opt("baton-kubernetes-external")
        .await
        .ok()??;
    let a = svc.metadata.annotations?;
    Some((
        a.get("baton.dev/fip-holder")?.clone(),
        a.get("baton.dev/fip-holder-address")?.clone(),
    ))
}

/// The holder address the FIP table (what the agents read) names for `fip`.
async fn table_holder(client: &kube::Client, fip: std::net::IpAddr) -> Option<String> {
    let cm = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "kube-system")
        .get_opt("baton-control-plane-fips")
        .await
        .ok()??;
    let table: serde_json::Value = serde_json::from_str(cm.data?.get("fips.json")?).ok()?;
    table["fips"]
        .as_array()?
        .iter()
        .find(|r| r["address"] == fip.to_string())?["holder"]
        .as_str()
        .map(str::to_owned)
}

fn holder(sim: &SimHandle, fip: &baton_cloud::model::IpAddress) -> Option<usize> {
    let id = sim.peek_ip(fip.id.as_str())?.target()?.0;
    CP.iter().position(|&c| c == id)
}

/// The window in which the new holder's own packets for the FIP are not delivered yet
/// (docs/agent.md, "The holder's own traffic"): when, after `t0`, the cloud routed the FIP away
/// from `victim`, and when the FIP table the agents read named the new holder (its agent then
/// needs a few ms more: tests/agent.rs). Polled every 5 ms, through an API server that is not
/// the victim's.
async fn move_then_naming(
    cp: &ControlPlane,
    sim: &SimHandle,
    fip: &baton_cloud::model::IpAddress,
    victim: usize,
    t0: tokio::time::Instant,
) -> (Duration, Duration) {
    let survivor = cp.client(usize::from(victim == 0)).unwrap();
    let mut moved = None;
    while t0.elapsed() < Duration::from_secs(30) {
        let now = holder(sim, fip).filter(|h| *h != victim);
        if moved.is_none() && now.is_some() {
            moved = Some(t0.elapsed());
        }
        if let Some(h) = now
            && table_holder(&survivor, fip.address).await == Some(cp.addresses()[h].to_string())
        {
            return (moved.unwrap_or_default(), t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the FIP was not moved and its new holder named within 30 s (moved: {moved:?})");
}

fn control_plane_fip_answers_on_the_routed_path(mode: ProxyMode, nodes: u8) {
    lab::run(move || async move {
        let mut cp = ControlPlane::start(Options {
            nodes: true,
            proxy_mode: mode,
            ..Options::servers(nodes)
        })
        .await
        .unwrap();
        let sim = common::routed_sim(Faults::none(), Topology::default()).await;
        let (_cloud, fip) = common::control_plane_fip(&sim, ("cluster", "datapath"), CP[0]).await;
        let fip_addr = SocketAddr::new(fip.address, 6443);
        let ca = cp.ca_der().to_vec();
        let logs = tempfile::tempdir().unwrap();
        let n = usize::from(nodes);
        let _controllers: Vec<Child> = (0..n)
            .map(|i| common::node::controller(&cp, BATON, &sim, i, "cluster=datapath", logs.path()))
            .collect();
        let client = cp.client(0).unwrap();
        common::wait_for("the mirror Service's ingress", Duration::from_secs(60), || {
            common::mirror_has_ingress(&client)
        })
        .await;

        // Routed, mirrored, kube-proxy running on every node: and yet nothing answers.
        for _ in 0..10 {
            assert!(
                !common::readyz(&ca, fip_addr).await,
                "{mode:?}: the FIP answered with no agent on the nodes (is it spliced or local?)"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        let _agents: Vec<Child> = (0..n)
            .map(|i| common::node::agent(&cp, BATON, i, &logs.path().join(format!("agent-{i}.log"))))
            .collect();
        common::wait_for(
            "the FIP answers /readyz from the lab host",
            Duration::from_secs(60),
            || common::readyz(&ca, fip_addr),
        )
        .await;
        // The mirror Service tells the nodes who holds the FIP (the agent delivers the holder's
        // own packets for it locally).
        let holder_now = holder(&sim, &fip).expect("routed");
        common::wait_for("the holder annotations", Duration::from_secs(10), || async {
            holder_annotations(&client).await
                == Some((format!("cp-{holder_now}"), cp.addresses()[holder_now].to_string()))
        })
        .await;
        common::wait_for("the FIP table's holder", Duration::from_secs(10), || async {
            table_holder(&client, fip.address).await == Some(cp.addresses()[holder_now].to_string())
        })
        .await;
        // From every node too: a node's own packets to the FIP leave it and come back routed;
        // the holder's own are delivered on the holder.
        for name in cp.node_names() {
            common::wait_for(
                &format!("the FIP answers from {name}"),
                Duration::from_secs(10),
                || readyz_from_node(&cp, &name, fip_addr),
            )
            .await;
        }

        // The holder's API server dies: the FIP answers again, from another node.
        let victim = holder(&sim, &fip).expect("the FIP is routed");
        let t0 = tokio::time::Instant::now();
        cp.kill_apiserver(victim).await;
        let (moved, named) = move_then_naming(&cp, &sim, &fip, victim, t0).await;
        eprintln!(
            "{mode:?}: the cloud routed the FIP away {} ms after cp-{victim}'s API server died; \
             the FIP table named the new holder {} ms after that",
            moved.as_millis(),
            named.saturating_sub(moved).as_millis()
        );
        common::wait_for(
            "the FIP answers from another node",
            Duration::from_secs(30),
            || async {
                holder(&sim, &fip).is_some_and(|h| h != victim) && common::readyz(&ca, fip_addr).await
            },
        )
        .await;
        let new_holder = holder(&sim, &fip).unwrap();
        eprintln!(
            "{mode:?}: the FIP answered from cp-{new_holder} {:.2} s after cp-{victim}'s API server died",
            t0.elapsed().as_secs_f64()
        );
        // The annotations follow the move (written through a surviving API server).
        let survivor = cp.client(new_holder).unwrap();
        common::wait_for(
            "the holder annotations after the move",
            Duration::from_secs(10),
            || async {
                holder_annotations(&survivor).await
                    == Some((format!("cp-{new_holder}"), cp.addresses()[new_holder].to_string()))
            },
        )
        .await;
        let holder_name = format!("cp-{new_holder}");
        common::wait_for(
            "the new holder reaches its own FIP",
            Duration::from_secs(10),
            || readyz_from_node(&cp, &holder_name, fip_addr),
        )
        .await;
    });
}

#[test]
fn control_plane_fip_answers_on_the_routed_path_with_kube_proxy_iptables() {
    control_plane_fip_answers_on_the_routed_path(ProxyMode::Iptables, 3);
}

#[test]
fn control_plane_fip_answers_on_the_routed_path_with_kube_proxy_nftables() {
    control_plane_fip_answers_on_the_routed_path(ProxyMode::Nftables, 2);
}

#[test]
fn control_plane_fip_answers_on_the_routed_path_without_kube_proxy() {
    control_plane_fip_answers_on_the_routed_path(ProxyMode::None, 2);
}
