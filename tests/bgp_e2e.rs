//! End to end over real BGP: `baton controller` (the binary) writes MetalLB's objects into a
//! real API server; MetalLB's speaker, built from its Go module by `scripts/metallb-env`, runs as
//! a process against that API server as node `worker-0`; it peers with a real BGP router from
//! Debian's packages (gobgpd) listening on the region's route-server address inside the lab; the
//! router learns the Service's Floating IP as a /32 with the node's public IP as next hop.
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

/// One ready endpoint for `apps/web` (MetalLB announces a Cluster-policy Service only when an
/// endpoint is ready; no kubelet runs here).
fn endpoint_slice() -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some("web-1".into()),
            namespace: Some("apps".into()),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/service-name".to_owned(),
                "web".to_owned(),
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
        let conf = logs.path().join("gobgpd.toml");
        std::fs::write(
            &conf,
            metallb::gobgpd_config(ROUTER, ROUTER_ASN, &[(NODE_IP, NODE_ASN)]),
        )
        .unwrap();
        let router = Proc::spawn(
            "gobgpd",
            logs.path(),
            Command::new("gobgpd").arg("-f").arg(&conf).args([
                "-p",
                "--pprof-disable",
                "--api-hosts",
                GOBGP_API,
            ]),
        )
        .unwrap();

        // baton: the simulator's server 600111 is node worker-0.
        let sim = common::sim(Faults::none(), Topology::default()).await;
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
        for (k, v) in common::env_for(
            &sim,
            &[
                ("CHERRY_REGION_NAME", "LT-Siauliai"),
                (
                    "CHERRY_LOAD_BALANCER",
                    "metallb:///metallb-system/?bgp-peer-mode=native",
                ),
            ],
        ) {
            cmd.env(k, v);
        }
        let baton = Proc::spawn("baton", logs.path(), &mut cmd).unwrap();

        // MetalLB's speaker for worker-0, against the test API server (memberlist off: no
        // --ml-labels), metrics on loopback. It reads its own Pod at start (the owner of its
        // layer-2 status objects): the Pod object exists, as under a DaemonSet; nothing runs it.
        Api::<Pod>::namespaced(admin.clone(), "metallb-system")
            .create(&pp, &metallb::speaker_pod("metallb-system", "worker-0"))
            .await
            .unwrap();
        let speaker = Proc::spawn(
            "speaker",
            logs.path(),
            &mut metallb::speaker_command(&kubeconfig, "metallb-system", "worker-0", 7472),
        )
        .unwrap();

        // A Service with one ready endpoint.
        let services: Api<Service> = Api::namespaced(admin.clone(), "apps");
        services
            .create(&pp, &lb_service("apps", "web", &[]))
            .await
            .unwrap();
        Api::<EndpointSlice>::namespaced(admin.clone(), "apps")
            .create(&pp, &endpoint_slice())
            .await
            .unwrap();
        let fip = eventually(Duration::from_secs(60), "web's ingress", || async {
            services.get("web").await.ok().as_ref().and_then(ingress)
        })
        .await;

        // The router learns <fip>/32 with next hop = the node's public IP.
        let prefix = format!("{fip}/32");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let rib = metallb::router_rib(GOBGP_API).await;
            if rib
                .get(&prefix)
                .is_some_and(|hops| hops.iter().any(|h| h == NODE_IP))
            {
                println!("gobgpd learned {prefix} via {:?}", rib[&prefix]);
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the router did not learn {prefix} via {NODE_IP}; RIB {rib:?}\n--- baton ---\n{}\n--- speaker ---\n{}\n--- gobgpd ---\n{}\n--- apiserver ---\n{}",
                baton.log_tail(30),
                speaker.log_tail(40),
                router.log_tail(20),
                tail(&cp.dir().join("apiserver-0.log"), 20),
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }

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
                speaker.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        baton.terminate(Duration::from_secs(5)).await;
        speaker.terminate(Duration::from_secs(2)).await;
        router.terminate(Duration::from_secs(2)).await;
    });
}
