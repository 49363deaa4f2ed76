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
//!
//! And on Hetzner Cloud's routing path (no BGP: baton assigns its Service FIPs to a healthy node),
//! workload Services of `loadBalancerClass: baton.dev/floating-ip` asking for another cluster's
//! Floating IP, an unlabelled one, an address outside the project, or (from a namespace that may
//! not ask) this cluster's get no ingress, no assign action and no other write, only a Warning
//! Event; this cluster's from an allowed namespace gets its ingress, and a Service asking for none
//! its own FIP, assigned to the node.
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

/// Another cluster's `kube-system` uid (its Service FIPs' `cluster` label).
const OTHER_CLUSTER: &str = "5a0c4b8e-2f61-4d2b-9c1e-7d3a9b6f0e42";

/// kube-proxy's health check as the test stands in for it on `addr` (the routing loop probes
/// every candidate node's InternalIP:10256): `GET /healthz` answers 200.
async fn kube_proxy_health(addr: SocketAddr) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let body = r#"{"lastUpdated": "","currentTime": ""}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
}

#[test]
fn on_hetzner_a_service_gets_no_route_to_an_address_that_is_not_its_clusters() {
    const OURS: &str = "203.0.113.50";
    const THEIRS: &str = "203.0.113.51";
    const UNLABELLED: &str = "203.0.113.52";
    const OUTSIDE: &str = "198.18.7.8";
    const NODE_SERVER: u64 = 700_100;
    const NODE_PRIVATE: &str = "192.0.2.150";
    lab::run(|| async {
        let cp = ControlPlane::start(Options::servers(1)).await.unwrap();
        let admin = cp.client(0).unwrap();
        for ns in ["apps", "tenant"] {
            common::namespace(&admin, ns).await;
        }
        let uid = common::cluster_uid(&admin).await;
        let theirs_service =
            baton_cloud::tags::service_tag_on(baton_cloud::CloudKind::Hetzner, "apps", "web");
        let mut topology = Topology::default();
        topology.servers.push(baton_sim::TopoServer {
            id: NODE_SERVER,
            hostname: "node-0".into(),
            primary_ip: "198.51.100.150".parse().unwrap(),
            private_ip: Some(NODE_PRIVATE.parse().unwrap()),
            ..baton_sim::TopoServer::default()
        });
        topology.floating_ips = vec![
            common::reserved_fip(OURS, &[("cluster", uid.as_str())]),
            common::reserved_fip(
                THEIRS,
                &[
                    ("usage", "cloud-provider-cherry-auto"),
                    ("service", theirs_service.as_str()),
                    ("cluster", OTHER_CLUSTER),
                ],
            ),
            common::reserved_fip(UNLABELLED, &[]),
        ];
        let sim = baton_sim::Sim::builder()
            .cloud(baton_cloud::CloudKind::Hetzner)
            .topology(topology)
            .faults(Faults::none())
            .bind("127.0.0.1:0".parse().unwrap())
            .await
            .expect("simulator");
        let ids: Vec<String> = sim
            .peek_ips()
            .into_iter()
            .filter(|ip| [OURS, THEIRS, UNLABELLED].contains(&ip.address.to_string().as_str()))
            .map(|ip| ip.id.to_string())
            .collect();
        assert_eq!(ids.len(), 3, "{:?}", sim.peek_ips());

        // One node, as hcloud-cloud-controller-manager and a Ready kubelet leave it, whose
        // kube-proxy answers its health check.
        kube_proxy_health(SocketAddr::new(NODE_PRIVATE.parse().unwrap(), 10256)).await;
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
            "metadata": {"name": "node-0", "labels": {"kubernetes.io/hostname": "node-0"}},
            "spec": {"providerID": format!("hcloud://{NODE_SERVER}")},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        let status = json!({"status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "trust",
                            "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "addresses": [{"type": "InternalIP", "address": NODE_PRIVATE}],
        }});
        nodes
            .patch_status(
                "node-0",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&status),
            )
            .await
            .unwrap();

        // `baton controller` on Hetzner; only `apps` may ask for addresses.
        let kubeconfig = cp.write_kubeconfig(0, baton_testbed::ADMIN_TOKEN).unwrap();
        let logs = tempfile::tempdir().unwrap();
        let endpoint = format!("{}v1", sim.base_url());
        let mut cmd = tokio::process::Command::new(BATON);
        cmd.arg("controller")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--identity", "hetzner-trust", "--admin-listen", "off"])
            .env_clear()
            .envs([
                ("BATON_CLOUD", "hetzner"),
                ("HCLOUD_TOKEN", sim.api_key()),
                ("HCLOUD_ENDPOINT", endpoint.as_str()),
                ("CHERRY_REGION_NAME", "fsn1"),
                ("BATON_FIP_RELEASE_GRACE_PERIOD", "0"),
                ("BATON_SERVICE_ALLOCATION_NAMESPACES", "apps"),
                ("BATON_LOG", "info,baton=debug"),
            ]);
        let baton = baton_testbed::control_plane::Proc::spawn("controller", logs.path(), &mut cmd).unwrap();

        let fip_service = |ns: &str, name: &str, address: Option<&str>, in_annotation: bool| -> Service {
            let mut annotations = serde_json::Map::new();
            let mut spec = json!({"type": "LoadBalancer", "loadBalancerClass": "baton.dev/floating-ip",
                                  "ports": [{"port": 80, "protocol": "TCP"}]});
            match (address, in_annotation) {
                (Some(a), true) => {
                    annotations.insert("baton.dev/floating-ips".into(), json!(a));
                }
                (Some(a), false) => spec["loadBalancerIP"] = json!(a),
                (None, _) => {}
            }
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": ns, "annotations": annotations},
                "spec": spec,
            }))
            .unwrap()
        };
        let refused = [
            ("apps", "theirs", THEIRS, false, "FloatingIPNotOwned"),
            ("apps", "unlabelled", UNLABELLED, true, "FloatingIPNotOwned"),
            ("apps", "outside", OUTSIDE, false, "AddressNotInProject"),
            ("tenant", "ours", OURS, true, "AddressNamespaceNotAllowed"),
        ];
        let pp = PostParams::default();
        for (ns, name, address, in_annotation, _) in refused {
            Api::<Service>::namespaced(admin.clone(), ns)
                .create(&pp, &fip_service(ns, name, Some(address), in_annotation))
                .await
                .unwrap();
        }
        let apps: Api<Service> = Api::namespaced(admin.clone(), "apps");
        apps.create(&pp, &fip_service("apps", "byo", Some(OURS), false))
            .await
            .unwrap();
        apps.create(&pp, &fip_service("apps", "web", None, false))
            .await
            .unwrap();

        let diag = || baton.log_tail(40);
        // The allowed ones: this cluster's FIP shown; a FIP of its own, assigned to the node.
        let byo = common::within(Duration::from_secs(60), "apps/byo's ingress", &diag, || async {
            common::ingress(&apps.get("byo").await.ok()?)
        })
        .await;
        assert_eq!(byo, OURS);
        let web: std::net::IpAddr =
            common::within(Duration::from_secs(60), "apps/web's ingress", &diag, || async {
                common::ingress(&apps.get("web").await.ok()?)?.parse().ok()
            })
            .await;
        let own = sim.peek_ips().into_iter().find(|ip| ip.address == web).unwrap();
        common::within(
            Duration::from_secs(60),
            "apps/web's FIP assigned to node-0",
            &diag,
            || async { (sim.peek_ip(own.id.as_str())?.target()?.0 == NODE_SERVER).then_some(()) },
        )
        .await;

        // Each refused one: a Warning Event naming the address and the rule; no ingress.
        for (ns, name, address, _, reason) in refused {
            common::within(
                Duration::from_secs(30),
                &format!("a {reason} Warning on {ns}/{name}"),
                &diag,
                || async {
                    common::service_warnings(&admin, ns, name)
                        .await
                        .iter()
                        .any(|(r, note)| r == reason && note.contains(address))
                        .then_some(())
                },
            )
            .await;
        }
        // Many passes of the routing loop later (one every 250 ms): no ingress, no assign, no
        // write at all for the project's FIPs the Services asked for, and one FIP created (web's).
        tokio::time::sleep(Duration::from_secs(3)).await;
        for (ns, name, _, _, _) in refused {
            let svc = Api::<Service>::namespaced(admin.clone(), ns)
                .get(name)
                .await
                .unwrap();
            assert_eq!(common::ingress(&svc), None, "{ns}/{name} has an ingress");
        }
        let writes: Vec<String> = sim
            .log(0)
            .into_iter()
            .filter(|e| matches!(e.method.as_str(), "PUT" | "POST" | "DELETE"))
            .filter(|e| {
                ids.iter().any(|id| {
                    e.path.contains(&format!("/floating_ips/{id}/"))
                        || e.path.ends_with(&format!("/floating_ips/{id}"))
                })
            })
            .map(|e| format!("{} {} ({})", e.method, e.path, e.status))
            .collect();
        assert_eq!(
            writes,
            Vec::<String>::new(),
            "writes for the FIPs the Services asked for"
        );
        for ip in sim
            .peek_ips()
            .iter()
            .filter(|ip| ids.contains(&ip.id.to_string()))
        {
            assert_eq!(ip.target(), None, "{} was assigned", ip.address);
        }
        let creates = sim
            .log(0)
            .iter()
            .filter(|e| e.method == "POST" && e.path.ends_with("/floating_ips"))
            .count();
        assert_eq!(creates, 1, "one FIP created: apps/web's");
        baton.terminate(Duration::from_secs(5)).await;
    });
}
