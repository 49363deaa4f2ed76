//! Trust boundaries (DESIGN.md, "Reliability and security rules"): no Service moves, unassigns or
//! makes the nodes accept a Floating IP that is not this cluster's, and control-plane endpoints
//! come only from namespaces an operator allowed.
//!
//! Two lab nodes, each with its own API server, a real `baton controller` and `baton agent`
//! (what ships on a node), the simulator routing FIPs as the cloud does. The cluster's own
//! endpoint (the `fipTag` FIP) works as before; then Services in a tenant's namespace and in
//! `kube-system` name another cluster's FIP (tagged for it, routed to a server of it), an
//! untagged FIP of the project, and an address that is no FIP (the `kubernetes` ClusterIP), with
//! and without a forged `baton.dev/fip-holder-address`. None of them gets a PUT, POST or DELETE
//! in the simulator's log, a rule in any node's nftables, an ingress or a finalizer; each gets a
//! Warning Event naming why; deleting them changes nothing in the cloud.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // in tests a panic is the failure report

mod common;

/// The binary under test.
const BATON: &str = env!("CARGO_BIN_EXE_baton");

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use baton_sim::{Faults, SimHandle, Topology};
use baton_testbed::control_plane::ProxyMode;
use baton_testbed::{ControlPlane, Options, lab};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Service};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use tokio::process::Child;

/// The simulator's control-plane servers (cp-0, cp-1) and a worker no node of this lab is.
const CP: [u64; 2] = [600_101, 600_102];
const FOREIGN_SERVER: u64 = 600_111;

/// `nft list table ip baton` (and `ip6`) on node `name`, as text ("" without the tables).
async fn nft_text(cp: &ControlPlane, name: &str) -> String {
    let mut text = String::new();
    for family in ["ip", "ip6"] {
        let out = cp
            .node_command(name, "nft")
            .unwrap()
            .args(["list", "table", family, "baton"])
            .output()
            .await
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    text
}

/// The Warning Events on Service `ns/name`: their reasons and notes.
async fn warnings(client: &kube::Client, ns: &str, name: &str) -> Vec<(String, String)> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some("Service")
                && e.involved_object.name.as_deref() == Some(name)
                && e.type_.as_deref() == Some("Warning")
        })
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

async fn create(client: &kube::Client, ns: &str, name: &str, lb_ip: &str, holder: Option<&str>) {
    let mut annotations = json!({"baton.dev/control-plane-endpoint": "true"});
    if let Some(h) = holder {
        annotations["baton.dev/fip-holder-address"] = json!(h);
        annotations["baton.dev/fip-holder"] = json!("cp-1");
    }
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "loadBalancerIP": lb_ip,
                 "ports": [{"port": 6443, "protocol": "TCP"}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
}

/// Every cloud write (PUT, POST, DELETE) in the simulator's log since `since` that names one of
/// `ids` in its path, or creates a FIP (POST …/ips).
fn writes_for(sim: &SimHandle, since: u64, ids: &[String]) -> Vec<String> {
    sim.log(since)
        .into_iter()
        .filter(|e| matches!(e.method.as_str(), "PUT" | "POST" | "DELETE"))
        .filter(|e| ids.iter().any(|id| e.path.contains(id.as_str())) || e.path.ends_with("/ips"))
        .map(|e| format!("{} {} ({})", e.method, e.path, e.status))
        .collect()
}

#[test]
fn no_service_moves_or_accepts_a_fip_that_is_not_this_clusters() {
    lab::run(|| async {
        let cp = ControlPlane::start(Options {
            nodes: true,
            proxy_mode: ProxyMode::None,
            ..Options::servers(2)
        })
        .await
        .unwrap();
        // An untagged FIP of the project (an operator's reservation, a workload's), routed to a
        // server that is not this cluster's.
        let mut topology = Topology::default();
        topology.floating_ips.push(baton_sim::TopoFip {
            id: Some("untagged-fip".into()),
            address: Some("203.0.113.77".parse().unwrap()),
            region: "LT-Siauliai".into(),
            tags: baton_cloud::model::Tags::new(),
            targeted_to: Some(FOREIGN_SERVER),
        });
        let sim = common::routed_sim(Faults::none(), topology).await;
        // This cluster's endpoint: the fipTag FIP, routed to cp-0.
        let (_cloud, own) = common::control_plane_fip(&sim, ("cluster", "trust"), CP[0]).await;
        let untagged = sim.peek_ip("untagged-fip").expect("the untagged FIP");
        // Another cluster's control-plane FIP, routed to one of its servers.
        let (_, theirs) =
            common::control_plane_fip(&sim, ("cluster", "another-cluster-uid"), FOREIGN_SERVER).await;

        let ca = cp.ca_der().to_vec();
        let logs = tempfile::tempdir().unwrap();
        let _controllers: Vec<Child> = (0..2)
            .map(|i| common::node::controller(&cp, BATON, &sim, i, "cluster=trust", logs.path()))
            .collect();
        let _agents: Vec<Child> = (0..2)
            .map(|i| common::node::agent(&cp, BATON, i, &logs.path().join(format!("agent-{i}.log"))))
            .collect();
        let admin = cp.client(0).unwrap();

        // The cluster's own endpoint behaves as before.
        let own_addr = SocketAddr::new(own.address, 6443);
        common::wait_for("the own FIP answers /readyz", Duration::from_secs(90), || {
            common::readyz(&ca, own_addr)
        })
        .await;

        let cluster_ip = Api::<Service>::namespaced(admin.clone(), "default")
            .get("kubernetes")
            .await
            .unwrap()
            .spec
            .unwrap()
            .cluster_ip
            .unwrap();
        Api::<Namespace>::all(admin.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "tenant"}})).unwrap(),
            )
            .await
            .unwrap();
        let since = sim.log(0).last().map_or(0, |e| e.seq + 1);
        let node_addr = cp.addresses()[1].to_string();
        let forged = [
            ("theirs", theirs.address.to_string(), None),
            ("untagged", untagged.address.to_string(), None),
            ("cluster-ip", cluster_ip.clone(), None),
            ("cluster-ip-held", cluster_ip.clone(), Some(node_addr.as_str())),
        ];
        for ns in ["tenant", "kube-system"] {
            for (name, ip, holder) in &forged {
                create(&admin, ns, name, ip, *holder).await;
            }
        }

        // Many passes of the controllers' loops later (one every 250 ms): nothing was sent to the
        // cloud for them, no node accepts them, no Service got an ingress or a finalizer, and the
        // agents' table names only the cluster's own FIP.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let ids = [theirs.id.0.clone(), untagged.id.0.clone()];
        // No write for them, and both still routed where they were.
        let untouched = || {
            assert_eq!(writes_for(&sim, since, &ids), Vec::<String>::new());
            for id in &ids {
                let target = sim.peek_ip(id).unwrap().target().map(|s| s.0);
                assert_eq!(target, Some(FOREIGN_SERVER), "{id} was moved");
            }
        };
        untouched();
        for name in cp.node_names() {
            let text = nft_text(&cp, &name).await;
            assert!(
                text.contains(&own.address.to_string()),
                "{name}: the own FIP is accepted:\n{text}"
            );
            for bad in [
                theirs.address.to_string(),
                untagged.address.to_string(),
                cluster_ip.clone(),
            ] {
                assert!(!text.contains(&bad), "{name} has a rule for {bad}:\n{text}");
            }
        }
        for ns in ["tenant", "kube-system"] {
            for (name, _, _) in &forged {
                let svc = Api::<Service>::namespaced(admin.clone(), ns)
                    .get(name)
                    .await
                    .unwrap();
                let ingress = svc
                    .status
                    .and_then(|s| s.load_balancer?.ingress)
                    .unwrap_or_default();
                assert!(ingress.is_empty(), "{ns}/{name} got an ingress: {ingress:?}");
                assert!(
                    svc.metadata.finalizers.unwrap_or_default().is_empty(),
                    "{ns}/{name} got a finalizer"
                );
            }
        }
        let table = Api::<ConfigMap>::namespaced(admin.clone(), "kube-system")
            .get("baton-control-plane-fips")
            .await
            .unwrap();
        let text = table
            .data
            .unwrap_or_default()
            .remove("fips.json")
            .unwrap_or_default();
        let rows: serde_json::Value = serde_json::from_str(&text).unwrap();
        let addresses: Vec<&str> = rows["fips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["address"].as_str().unwrap())
            .collect();
        assert_eq!(addresses, vec![own.address.to_string()], "the FIP table: {text}");

        // Each gets a Warning Event naming the address and the rule.
        let want = |ns: &str, name: &str| -> &'static str {
            match (ns, name) {
                ("tenant", _) => "ControlPlaneNamespaceNotAllowed",
                (_, "theirs" | "untagged") => "FloatingIPNotOwned",
                _ => "NotAFloatingIP",
            }
        };
        for ns in ["tenant", "kube-system"] {
            for (name, ip, _) in &forged {
                let reason = want(ns, name);
                common::wait_for(
                    &format!("a {reason} Warning on {ns}/{name}"),
                    Duration::from_secs(30),
                    || async {
                        warnings(&admin, ns, name)
                            .await
                            .iter()
                            .any(|(r, note)| r == reason && note.contains(ip.as_str()))
                    },
                )
                .await;
            }
        }
        untouched();
        // Deleting them changes nothing in the cloud.
        for ns in ["tenant", "kube-system"] {
            for (name, _, _) in &forged {
                Api::<Service>::namespaced(admin.clone(), ns)
                    .delete(name, &DeleteParams::default())
                    .await
                    .unwrap();
            }
        }
        common::wait_for("the Services gone", Duration::from_secs(10), || async {
            let mut left = BTreeMap::new();
            for ns in ["tenant", "kube-system"] {
                for (name, _, _) in &forged {
                    if Api::<Service>::namespaced(admin.clone(), ns)
                        .get_opt(name)
                        .await
                        .unwrap()
                        .is_some()
                    {
                        left.insert(ns, *name);
                    }
                }
            }
            left.is_empty()
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        untouched();
        // And the cluster's own endpoint still serves.
        assert!(
            common::readyz(&ca, own_addr).await,
            "the own FIP stopped answering"
        );
    });
}
