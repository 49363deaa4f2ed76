//! End to end over real BGP: `baton controller` (the binary) writes MetalLB's objects into a
//! real API server; MetalLB's speaker, built from its Go module by `scripts/metallb-env`, runs as
//! a process against that API server as node `worker-0`; it peers with a real BGP router from
//! Debian's packages (gobgpd) listening on the region's route-server address inside the lab; the
//! router learns the Service's Floating IP as a /32 with the node's public IP as next hop.
//!
//! The same set-up checks the trust rule for the addresses Services ask for (docs/operations.md,
//! "Threat model"): another cluster's Floating IP of the same project, an untagged one, an address
//! outside the project, and this cluster's from a namespace that may not ask are never announced
//! (the router's RIB never learns them), get no ingress and no cloud write, only a Warning Event;
//! an address a Service was given before the rule is withdrawn; this cluster's from an allowed
//! namespace is announced.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // a scenario test reads top to bottom

mod common;
mod metallb;

use std::collections::BTreeMap;
use std::time::Duration;

use baton_sim::{Faults, Topology};
use baton_testbed::control_plane::Proc;
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab};
use common::{eventually, ingress, lb_service, namespace};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use tokio::process::Command;

/// The region's first route server in the simulator's topology (`bgp.hosts[0]`), its ASN, the
/// project's ASN, and worker-0's public IP (server 600111).
const ROUTER: &str = "198.51.100.2";
const ROUTER_ASN: u32 = 16_125;
const NODE_ASN: u32 = 65_000;
const NODE_IP: &str = "198.51.100.21";
const GOBGP_API: &str = "127.0.0.1:50051";

fn node(name: &str, server: u64) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_owned(), name.to_owned()),
                (
                    "topology.kubernetes.io/region".to_owned(),
                    "LT-Siauliai".to_owned(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("cherryservers://{server}")),
            ..NodeSpec::default()
        }),
        status: None,
    }
}

/// One ready endpoint for Service `ns/service` (MetalLB announces a Cluster-policy Service only
/// when an endpoint is ready; no kubelet runs here).
fn endpoint_slice(ns: &str, service: &str) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(format!("{service}-1")),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/service-name".to_owned(),
                service.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".into(),
        endpoints: vec![Endpoint {
            addresses: vec!["192.0.2.50".into()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            node_name: Some("worker-0".into()),
            ..Endpoint::default()
        }],
        ports: Some(vec![EndpointPort {
            port: Some(80),
            protocol: Some("TCP".into()),
            name: Some(String::new()),
            ..EndpointPort::default()
        }]),
    }
}

fn tail(path: &std::path::Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The BGP side of the lab: gobgpd on the route server's address, the node worker-0 (server
/// 600111), and MetalLB's speaker for it; `baton controller` (the binary) with `extra` settings.
struct Bgp {
    router: Proc,
    speaker: Proc,
    baton: Proc,
}

impl Bgp {
    /// Starts the router, the Node, `baton controller` against `sim` and the speaker, in this
    /// order (the speaker last: it reads baton's BGPPeers).
    async fn start(
        cp: &ControlPlane,
        admin: &kube::Client,
        sim: &baton_sim::SimHandle,
        logs: &std::path::Path,
        extra: &[(&str, &str)],
    ) -> Self {
        // On a real server the public IP is an interface address, and MetalLB's native BGP
        // checks that its sourceAddress is one ("address … doesn't exist on this host"); the
        // lab's ranges are only local routes, so give lo the node's and the router's addresses.
        for address in [NODE_IP, ROUTER] {
            let status = std::process::Command::new("ip")
                .args(["addr", "add", &format!("{address}/32"), "dev", "lo"])
                .status()
                .unwrap();
            assert!(status.success(), "ip addr add {address}/32 dev lo");
        }

        // The router: gobgpd on the route server's address, passive, eBGP with the node's ASN.
        let conf = logs.join("gobgpd.toml");
        std::fs::write(
            &conf,
            metallb::gobgpd_config(ROUTER, ROUTER_ASN, &[(NODE_IP, NODE_ASN)]),
        )
        .unwrap();
        let router = Proc::spawn(
            "gobgpd",
            logs,
            Command::new("gobgpd").arg("-f").arg(&conf).args([
                "-p",
                "--pprof-disable",
                "--api-hosts",
                GOBGP_API,
            ]),
        )
        .unwrap();

        // baton: the simulator's server 600111 is node worker-0.
        let pp = PostParams::default();
        Api::<Node>::all(admin.clone())
            .create(&pp, &node("worker-0", 600_111))
            .await
            .unwrap();
        // `baton controller` itself (the binary: Service FIPs, BGP, MetalLB objects).
        let kubeconfig = cp.write_kubeconfig(0, ADMIN_TOKEN).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_baton"));
        cmd.arg("controller")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--identity", "e2e", "--admin-listen", "off"])
            .env("BATON_LOG", "info,baton=debug");
        let mut settings = vec![
            ("CHERRY_REGION_NAME", "LT-Siauliai"),
            (
                "CHERRY_LOAD_BALANCER",
                "metallb:///metallb-system/?bgp-peer-mode=native",
            ),
        ];
        settings.extend_from_slice(extra);
        for (k, v) in common::env_for(sim, &settings) {
            cmd.env(k, v);
        }
        let baton = Proc::spawn("baton", logs, &mut cmd).unwrap();

        // MetalLB's speaker for worker-0, against the test API server (memberlist off: no
        // --ml-labels), metrics on loopback. It reads its own Pod at start (the owner of its
        // layer-2 status objects): the Pod object exists, as under a DaemonSet; nothing runs it.
        Api::<Pod>::namespaced(admin.clone(), "metallb-system")
            .create(&pp, &metallb::speaker_pod("metallb-system", "worker-0"))
            .await
            .unwrap();
        let speaker = Proc::spawn(
            "speaker",
            logs,
            &mut metallb::speaker_command(&kubeconfig, "metallb-system", "worker-0", 7472),
        )
        .unwrap();
        Self {
            router,
            speaker,
            baton,
        }
    }

    /// Waits until the router learns `prefix` with the node as next hop.
    async fn learned(&self, cp: &ControlPlane, prefix: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let rib = metallb::router_rib(GOBGP_API).await;
            if rib
                .get(prefix)
                .is_some_and(|hops| hops.iter().any(|h| h == NODE_IP))
            {
                println!("gobgpd learned {prefix} via {:?}", rib[prefix]);
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the router did not learn {prefix} via {NODE_IP}; RIB {rib:?}\n--- baton ---\n{}\n--- speaker ---\n{}\n--- gobgpd ---\n{}\n--- apiserver ---\n{}",
                self.baton.log_tail(30),
                self.speaker.log_tail(40),
                self.router.log_tail(20),
                tail(&cp.dir().join("apiserver-0.log"), 20),
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn stop(self) {
        self.baton.terminate(Duration::from_secs(5)).await;
        self.speaker.terminate(Duration::from_secs(2)).await;
        self.router.terminate(Duration::from_secs(2)).await;
    }
}

#[test]
fn metallb_speaker_announces_the_service_fip_to_a_real_router() {
    // The speaker must be built (scripts/metallb-env): fail before starting anything if not.
    metallb::dir();
    lab::run(move || async move {
        baton_testbed::init_tracing();
        let cp = ControlPlane::start(Options::servers(1)).await.unwrap();
        let admin = cp.client(0).unwrap();
        metallb::install_crds(&admin).await;
        namespace(&admin, "metallb-system").await;
        namespace(&admin, "apps").await;
        let logs = tempfile::tempdir().unwrap();
        let sim = common::sim(Faults::none(), Topology::default()).await;
        let bgp = Bgp::start(&cp, &admin, &sim, logs.path(), &[]).await;
        let pp = PostParams::default();

        // A Service with one ready endpoint.
        let services: Api<Service> = Api::namespaced(admin.clone(), "apps");
        services
            .create(&pp, &lb_service("apps", "web", &[]))
            .await
            .unwrap();
        Api::<EndpointSlice>::namespaced(admin.clone(), "apps")
            .create(&pp, &endpoint_slice("apps", "web"))
            .await
            .unwrap();
        let fip = eventually(Duration::from_secs(60), "web's ingress", || async {
            services.get("web").await.ok().as_ref().and_then(ingress)
        })
        .await;

        // The router learns <fip>/32 with next hop = the node's public IP.
        let prefix = format!("{fip}/32");
        bgp.learned(&cp, &prefix).await;

        // The Service goes: the route is withdrawn.
        services
            .delete("web", &kube::api::DeleteParams::default())
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while metallb::router_rib(GOBGP_API).await.contains_key(&prefix) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{prefix} was not withdrawn\n--- speaker ---\n{}",
                bgp.speaker.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        bgp.stop().await;
    });
}

/// Another cluster's `kube-system` uid: its Service FIPs carry it.
const OTHER_CLUSTER: &str = "5a0c4b8e-2f61-4d2b-9c1e-7d3a9b6f0e42";
/// The project's FIPs (the simulator's range): this cluster's (tagged by its operator), another
/// cluster's Service FIP (unrouted: announced by that cluster), an untagged one; and an address
/// outside the project.
const OURS: &str = "203.0.113.40";
const THEIRS: &str = "203.0.113.41";
const UNTAGGED: &str = "203.0.113.42";
const OUTSIDE: &str = "198.18.7.7";

/// A LoadBalancer Service in `ns` asking for `address` in `spec.loadBalancerIP`, or in MetalLB's
/// annotation.
fn asking(ns: &str, name: &str, address: &str, in_annotation: bool) -> Service {
    if in_annotation {
        lb_service(ns, name, &[("metallb.io/loadBalancerIPs", address)])
    } else {
        let mut svc = lb_service(ns, name, &[]);
        svc.spec.as_mut().unwrap().load_balancer_ip = Some(address.to_owned());
        svc
    }
}

/// Issue 45's acceptance, with real MetalLB (its speaker, BGP mode) and a real router: Services
/// asking for another cluster's unrouted FIP, an untagged FIP, an address outside the project,
/// and (from a namespace that may not ask) this cluster's FIP get no ingress and no announcement
/// (the router's RIB), no MetalLB pool and no cloud write, and a Warning Event naming the address
/// and the rule; one whose ingress showed another cluster's FIP before the rule (as a baton
/// without it set it) loses it; an allowed namespace asking for this cluster's FIP is announced.
#[test]
fn a_service_brings_only_an_address_its_cluster_owns_and_its_namespace_may_use() {
    metallb::dir();
    lab::run(move || async move {
        baton_testbed::init_tracing();
        let cp = ControlPlane::start(Options::servers(1)).await.unwrap();
        let admin = cp.client(0).unwrap();
        metallb::install_crds(&admin).await;
        for ns in ["metallb-system", "apps", "tenant"] {
            namespace(&admin, ns).await;
        }
        let logs = tempfile::tempdir().unwrap();
        let uid = common::cluster_uid(&admin).await;
        let theirs_service = baton_cloud::tags::service_tag("apps", "web");
        let topology = Topology {
            floating_ips: vec![
                common::reserved_fip(OURS, &[("cluster", uid.as_str())]),
                common::reserved_fip(
                    THEIRS,
                    &[
                        ("usage", "cloud-provider-cherry-auto"),
                        ("service", theirs_service.as_str()),
                        ("cluster", OTHER_CLUSTER),
                    ],
                ),
                common::reserved_fip(UNTAGGED, &[]),
            ],
            ..Topology::default()
        };
        let sim = common::sim(Faults::none(), topology).await;
        let ids: Vec<String> = sim
            .peek_ips()
            .into_iter()
            .filter(|ip| [THEIRS, UNTAGGED].contains(&ip.address.to_string().as_str()))
            .map(|ip| ip.id.to_string())
            .collect();
        assert_eq!(ids.len(), 2);
        let pp = PostParams::default();

        // Before the rule: a Service whose ingress shows another cluster's FIP, written by baton's
        // field manager (what a baton without the rule did for any address a Service named).
        let apps: Api<Service> = Api::namespaced(admin.clone(), "apps");
        apps.create(&pp, &asking("apps", "legacy", THEIRS, false))
            .await
            .unwrap();
        let status = serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "legacy", "namespace": "apps"},
            "status": {"loadBalancer": {"ingress": [{"ip": THEIRS}]}},
        });
        apps.patch_status(
            "legacy",
            &kube::api::PatchParams::apply("baton").force(),
            &kube::api::Patch::Apply(&status),
        )
        .await
        .unwrap();

        // Only `apps` may ask for addresses.
        let bgp = Bgp::start(
            &cp,
            &admin,
            &sim,
            logs.path(),
            &[("BATON_SERVICE_ALLOCATION_NAMESPACES", "apps")],
        )
        .await;
        let since = sim.log(0).last().map_or(0, |e| e.seq + 1);

        // The refused, each with a ready endpoint (so the speaker would announce it if it could).
        let refused = [
            ("apps", "theirs", THEIRS, "FloatingIPNotOwned"),
            ("apps", "untagged", UNTAGGED, "FloatingIPNotOwned"),
            ("apps", "outside", OUTSIDE, "AddressNotInProject"),
            ("tenant", "ours", OURS, "AddressNamespaceNotAllowed"),
            ("apps", "legacy", THEIRS, "FloatingIPNotOwned"),
        ];
        for (i, (ns, name, address, _)) in refused.iter().enumerate() {
            if *name != "legacy" {
                Api::<Service>::namespaced(admin.clone(), ns)
                    .create(&pp, &asking(ns, name, address, i % 2 == 1))
                    .await
                    .unwrap();
            }
            Api::<EndpointSlice>::namespaced(admin.clone(), ns)
                .create(&pp, &endpoint_slice(ns, name))
                .await
                .unwrap();
        }
        // Then the allowed one: this cluster's FIP from `apps`.
        apps.create(&pp, &asking("apps", "web", OURS, true))
            .await
            .unwrap();
        Api::<EndpointSlice>::namespaced(admin.clone(), "apps")
            .create(&pp, &endpoint_slice("apps", "web"))
            .await
            .unwrap();
        let shown = eventually(Duration::from_secs(60), "apps/web's ingress", || async {
            apps.get("web").await.ok().as_ref().and_then(ingress)
        })
        .await;
        assert_eq!(shown, OURS);
        bgp.learned(&cp, &format!("{OURS}/32")).await;

        // Each refused one: a Warning Event naming the address and the rule.
        for (ns, name, address, reason) in refused {
            let note = eventually(
                Duration::from_secs(30),
                &format!("a {reason} Warning on {ns}/{name}"),
                || async {
                    common::service_warnings(&admin, ns, name)
                        .await
                        .into_iter()
                        .find(|(r, note)| r == reason && note.contains(address))
                        .map(|(_, note)| note)
                },
            )
            .await;
            if name == "legacy" {
                assert!(note.contains("withdrawn"), "{note}");
            }
        }
        // Several seconds on (passes of the BGP controller and the speaker): none was ever
        // announced, none has an ingress or a pool, nothing was written to the cloud for them.
        let denied: Vec<String> = [THEIRS, UNTAGGED, OUTSIDE]
            .iter()
            .map(|a| format!("{a}/32"))
            .collect();
        for _ in 0..10 {
            let rib = metallb::router_rib(GOBGP_API).await;
            for prefix in &denied {
                assert!(
                    !rib.contains_key(prefix),
                    "the router learned {prefix}: {rib:?}\n--- baton ---\n{}",
                    bgp.baton.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        for (ns, name, _, _) in refused {
            let svc = Api::<Service>::namespaced(admin.clone(), ns)
                .get(name)
                .await
                .unwrap();
            assert_eq!(ingress(&svc), None, "{ns}/{name} has an ingress");
            assert!(
                svc.metadata.finalizers.unwrap_or_default().is_empty(),
                "{ns}/{name} got a finalizer"
            );
        }
        let pools = metallb::objects(
            &admin,
            "metallb-system",
            baton::controller::bgp::Kind::IpAddressPool,
        )
        .await;
        let pooled: Vec<String> = pools
            .values()
            .flat_map(|p| {
                metallb::spec(p)["addresses"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect();
        assert_eq!(pooled, vec![format!("{OURS}/32")], "MetalLB's pools");
        let writes: Vec<String> = sim
            .log(since)
            .into_iter()
            .filter(|e| matches!(e.method.as_str(), "PUT" | "POST" | "DELETE" | "PATCH"))
            .filter(|e| ids.iter().any(|id| e.path.contains(id.as_str())) || e.path.ends_with("/ips"))
            .map(|e| format!("{} {} ({})", e.method, e.path, e.status))
            .collect();
        assert_eq!(
            writes,
            Vec::<String>::new(),
            "cloud writes for the refused addresses"
        );
        bgp.stop().await;
    });
}
