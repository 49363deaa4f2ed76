//! A workload LoadBalancer Service's Floating IP serves HTTP from a pod to a host outside the
//! cluster, through the real kube-proxy, in both ways the cloud delivers a FIP.
//!
//! One lab, one cluster: lab nodes cp-0 and cp-1 with kubelets (containerd, a pod network,
//! kube-proxy in iptables mode), the simulator routing targeted FIPs in the hub as Cherry
//! Servers does, and baton's shipped Deployment running as pods (with `loadbalancer:
//! metallb:///` in its cloud Secret). A Deployment of baton's image serves HTTP on the pod
//! network (`baton sim --listen 0.0.0.0:8080`, `GET /_sim/health` answers `ok`); the test
//! itself, in the hub, is the host outside the cluster.
//!
//! ```text
//!  hub (test) ── GET http://<fip>:80 ──► route: <fip>/32 via cp-0 (targeted)
//!                                              or ECMP via cp-0, cp-1 (learned by BGP)
//!            ──► node: kube-proxy DNATs <fip>:80 (the Service's ingress, VIP mode)
//!            ──► pod 10.244.n.x:8080 (on either node; the hub routes the pod network)
//! ```
//!
//! - **Targeted**: the operator's FIP (tagged for this cluster), routed to cp-0 by the cloud API, named by the Service
//!   (`spec.loadBalancerIP`). While the Service has no ingress (opted out) nothing answers,
//!   although the packets reach cp-0; once baton sets the ingress (bring-your-own routed FIP:
//!   VIP mode, no MetalLB pool) it answers through cp-0, and after a retarget through cp-1.
//! - **BGP**: baton reserves the FIP and writes MetalLB's objects; MetalLB's speaker runs on each
//!   node (a process in the node's namespaces, as its hostNetwork DaemonSet would) and peers
//!   with gobgpd in the hub on the region's route-server address; the routes gobgpd learns are
//!   installed into the hub's kernel (ECMP over both nodes).
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // a scenario reads best as one story

mod common;
mod metallb;

use std::net::IpAddr;
use std::time::Duration;

use baton::controller::bgp::Kind;
use baton_cloud::Cloud as _;
use baton_cloud::model::{CreateIpRequest, ServerId, Tags};
use baton_sim::{Faults, Topology};
use baton_testbed::control_plane::Proc;
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab, node};
use common::{ingress, namespace};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::process::Command;

/// The simulator's servers cp-0 and cp-1.
const CP: [u64; 2] = [600_101, 600_102];
/// Their public IPs (the lab nodes' addresses).
const NODE_IPS: [&str; 2] = ["198.51.100.11", "198.51.100.12"];
/// The region's first route server (`bgp.hosts[0]` of the simulator's topology), its ASN, and
/// the project's (the nodes') ASN.
const ROUTER: &str = "198.51.100.2";
const ROUTER_ASN: u32 = 16_125;
const NODE_ASN: u32 = 65_000;
const GOBGP_API: &str = "127.0.0.1:50051";
const MLB: &str = "metallb-system";
/// The nftables table counting, on a node, the packets arriving for port 80 of any FIP.
const COUNTER_TABLE: &str = "table ip baton_workload {
  counter fip80 {
  }
  chain pre {
    type filter hook prerouting priority raw;
    ip daddr 203.0.113.0/24 tcp dport 80 counter name fip80
  }
}
";

/// The packets for port 80 of a FIP that reached lab node `name` (its `fip80` counter).
async fn fip_packets(cp: &ControlPlane, name: &str) -> u64 {
    let out = cp
        .node_command(name, "nft")
        .unwrap()
        .args(["-j", "list", "counter", "ip", "baton_workload", "fip80"])
        .output()
        .await
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("nft on {name}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    json["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|o| o["counter"]["packets"].as_u64())
        .unwrap()
}

/// The hub's route for `fip` (`ip route show <fip>/32`).
async fn hub_route(fip: IpAddr) -> String {
    let out = Command::new("ip")
        .args(["route", "show", &format!("{fip}/32")])
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Whether the Service `apps/<name>` has a ready endpoint.
async fn has_ready_endpoint(client: &kube::Client, name: &str) -> bool {
    Api::<EndpointSlice>::namespaced(client.clone(), "apps")
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={name}")))
        .await
        .is_ok_and(|l| {
            l.items.iter().any(|s| {
                s.endpoints
                    .iter()
                    .any(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
            })
        })
}

/// Whether any IPAddressPool in MetalLB's namespace holds `ip`.
async fn in_a_pool(client: &kube::Client, ip: IpAddr) -> bool {
    let cidr = format!("{ip}/32");
    metallb::objects(client, MLB, Kind::IpAddressPool)
        .await
        .values()
        .any(|pool| {
            metallb::spec(pool)["addresses"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(&cidr)))
        })
}

#[test]
fn a_workload_fip_answers_through_kube_proxy_targeted_and_announced_by_bgp() {
    // MetalLB's speaker must be built (scripts/metallb-env) and baton's image too: fail before
    // starting anything if not.
    metallb::dir();
    let image = baton_testbed::baton_image().expect("baton's image (scripts/build-image)");
    lab::run(move || async move {
        baton_testbed::init_tracing();
        let started = tokio::time::Instant::now();
        let cp = ControlPlane::start(Options {
            kubelets: true,
            images: vec![image],
            ..Options::servers(2)
        })
        .await
        .expect("two lab nodes with kubelets");
        let admin = cp.client(0).unwrap();
        let logs = tempfile::tempdir().unwrap();
        eprintln!(
            "lab nodes {:?} Ready after {:.1}s",
            cp.node_names(),
            started.elapsed().as_secs_f64()
        );

        // The cloud: the simulator, routing a targeted FIP to its server in the hub.
        let sim = common::routed_sim(Faults::none(), Topology::default()).await;
        let cloud = common::unlimited_client(&sim);

        // The region's route server: gobgpd in the hub on bgp.hosts[0], passive, eBGP with
        // each node; what it learns is installed into the hub's kernel.
        node::add_lab_host(ROUTER.parse().unwrap()).await.unwrap();
        let conf = logs.path().join("gobgpd.toml");
        let neighbors: Vec<(&str, u32)> = NODE_IPS.iter().map(|ip| (*ip, NODE_ASN)).collect();
        std::fs::write(&conf, metallb::gobgpd_config(ROUTER, ROUTER_ASN, &neighbors)).unwrap();
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
        let _routes = metallb::RouteSync::start(GOBGP_API, "203.0.113.", node::BRIDGE);

        // MetalLB's CRDs; baton as the shipped Deployment, with the shipped RBAC (and
        // MetalLB's Role) and the cloud Secret naming the simulator and `metallb:///`.
        metallb::install_crds(&admin).await;
        namespace(&admin, MLB).await;
        namespace(&admin, "apps").await;
        common::apply_rbac_and_cloud_config(&admin, &sim, &json!({"loadbalancer": "metallb:///"})).await;
        common::apply_shipped_manifests(&admin, &["rbac-metallb.yaml", "deployment.yaml"]).await;

        // MetalLB's speaker on each node, against the node's own API server. Its Pod object
        // (read at start, the owner of its layer-2 status) exists; no kubelet runs it.
        let pods: Api<Pod> = Api::namespaced(admin.clone(), MLB);
        let mut speakers = Vec::new();
        for name in cp.node_names() {
            pods.create(
                &PostParams::default(),
                &metallb::unscheduled_speaker_pod(MLB, &name),
            )
            .await
            .unwrap();
            let kubeconfig = cp
                .write_kubeconfig(cp.apiserver_of_node(&name).unwrap(), ADMIN_TOKEN)
                .unwrap();
            let mut cmd = metallb::with_speaker_args(
                cp.node_command(&name, metallb::dir().join("bin/speaker"))
                    .unwrap(),
                &kubeconfig,
                MLB,
                &name,
                7472,
            );
            speakers.push(Proc::spawn(&format!("speaker-{name}"), logs.path(), &mut cmd).unwrap());
            cp.node_nft(&name, COUNTER_TABLE).await.unwrap();
        }
        let diag = || {
            use std::fmt::Write as _;
            let mut out = String::new();
            for (path, text) in common::pod_logs(&cp) {
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(25)..].join("\n");
                let _ = writeln!(out, "--- {} ---\n{tail}", path.display());
            }
            for s in &speakers {
                let _ = writeln!(out, "--- speaker ---\n{}", s.log_tail(15));
            }
            let _ = writeln!(out, "--- gobgpd ---\n{}", router.log_tail(15));
            out
        };

        // The workload, on the pod network.
        Api::<Deployment>::namespaced(admin.clone(), "apps")
            .create(&PostParams::default(), &common::web::deployment())
            .await
            .unwrap();
        let services: Api<Service> = Api::namespaced(admin.clone(), "apps");

        // ---- Targeted: the operator's FIP, routed to cp-0 by the cloud API. ----
        let byo = cloud
            .create_ip(CreateIpRequest {
                region: "LT-Siauliai".into(),
                // This cluster's (its operator's): a Service may ask only for its cluster's FIPs.
                tags: Tags::from([
                    ("owner".to_owned(), "apps-team".to_owned()),
                    ("cluster".to_owned(), common::cluster_uid(&admin).await),
                ]),
                ..CreateIpRequest::default()
            })
            .await
            .unwrap();
        cloud.retarget_ip(&byo.id, ServerId(CP[0])).await.unwrap();
        // The Service names it; opted out for now, so nobody sets its ingress.
        services
            .create(
                &PostParams::default(),
                &common::web::service(
                    "byo",
                    Some(byo.address),
                    None,
                    &json!({"cherryservers.com/loadbalancer-managed": "false"}),
                ),
            )
            .await
            .unwrap();
        common::within(
            Duration::from_secs(120),
            "a ready endpoint of apps/byo (baton initialised the nodes, the pods serve)",
            &diag,
            || async { has_ready_endpoint(&admin, "byo").await.then_some(()) },
        )
        .await;
        eprintln!("workload ready after {:.1}s", started.elapsed().as_secs_f64());
        let route = hub_route(byo.address).await;
        assert!(
            route.contains(&format!("via {}", NODE_IPS[0])),
            "the hub routes the targeted FIP to cp-0: {route:?}"
        );
        // Without an ingress nothing on cp-0 accepts the FIP, although its packets get there.
        let before = fip_packets(&cp, "cp-0").await;
        let refused = common::web::health(byo.address, Duration::from_secs(2)).await;
        assert!(
            refused.is_err(),
            "the FIP answered before the Service had an ingress: {refused:?}"
        );
        let reached = fip_packets(&cp, "cp-0").await;
        assert!(
            reached > before,
            "the packets reached cp-0 ({before} -> {reached})"
        );
        let svc = services.get("byo").await.unwrap();
        assert_eq!(ingress(&svc), None, "no ingress while opted out");

        // Opted in: baton sets the ingress (VIP mode), kube-proxy on cp-0 DNATs the FIP.
        let opt_in = json!({"metadata": {"annotations": {"cherryservers.com/loadbalancer-managed": null}}});
        services
            .patch("byo", &PatchParams::default(), &Patch::Merge(&opt_in))
            .await
            .unwrap();
        let shown = common::within(Duration::from_secs(60), "apps/byo's ingress", &diag, || async {
            let svc = services.get("byo").await.ok()?;
            let ing = svc.status?.load_balancer?.ingress?.into_iter().next()?;
            ing.ip.is_some().then_some(ing)
        })
        .await;
        assert_eq!(shown.ip, Some(byo.address.to_string()));
        // baton sets no ipMode; the API server fills in the default, VIP.
        assert_eq!(
            shown.ip_mode.as_deref().unwrap_or("VIP"),
            "VIP",
            "VIP mode: kube-proxy only accepts VIP ingresses"
        );
        let (cp0, cp1) = (fip_packets(&cp, "cp-0").await, fip_packets(&cp, "cp-1").await);
        let body = common::within(
            Duration::from_secs(60),
            "http://<byo>:80/_sim/health through cp-0",
            &diag,
            || async {
                common::web::health(byo.address, Duration::from_secs(2))
                    .await
                    .ok()
            },
        )
        .await;
        assert_eq!(body, "ok");
        assert!(fip_packets(&cp, "cp-0").await > cp0, "it went through cp-0");
        assert_eq!(fip_packets(&cp, "cp-1").await, cp1, "nothing went to cp-1");
        eprintln!(
            "targeted FIP {} answered through cp-0 after {:.1}s",
            byo.address,
            started.elapsed().as_secs_f64()
        );
        let events: Vec<Event> = Api::<Event>::namespaced(admin.clone(), "apps")
            .list(&ListParams::default().fields("involvedObject.name=byo"))
            .await
            .unwrap()
            .items;
        let said = events
            .iter()
            .find(|e| e.reason.as_deref() == Some("RoutedFloatingIP"))
            .unwrap_or_else(|| panic!("the RoutedFloatingIP Event on apps/byo: {events:?}"));
        eprintln!(
            "Event RoutedFloatingIP: {}",
            said.message.as_deref().unwrap_or_default()
        );
        assert!(
            !events
                .iter()
                .any(|e| e.reason.as_deref() == Some("ControlPlaneAddress")),
            "a routed workload FIP is not a control-plane address"
        );

        // The operator retargets it to cp-1: it answers through cp-1's kube-proxy.
        cloud.retarget_ip(&byo.id, ServerId(CP[1])).await.unwrap();
        let cp1 = fip_packets(&cp, "cp-1").await;
        common::within(
            Duration::from_secs(30),
            "http://<byo>:80/_sim/health through cp-1",
            &diag,
            || async {
                (common::web::health(byo.address, Duration::from_secs(2))
                    .await
                    .ok()?
                    == "ok")
                    .then_some(())
            },
        )
        .await;
        assert!(fip_packets(&cp, "cp-1").await > cp1, "it went through cp-1");

        // ---- BGP: baton's FIP, announced by MetalLB's speakers. ----
        services
            .create(
                &PostParams::default(),
                &common::web::service("web", None, None, &json!({})),
            )
            .await
            .unwrap();
        let fip: IpAddr = common::within(Duration::from_secs(60), "apps/web's ingress", &diag, || async {
            ingress(&services.get("web").await.ok()?)?.parse().ok()
        })
        .await;
        let prefix = format!("{fip}/32");
        let hops = common::within(
            Duration::from_secs(120),
            "gobgpd learning the FIP from both nodes",
            &diag,
            || async {
                let rib = metallb::router_rib(GOBGP_API).await;
                let hops = rib.get(&prefix)?;
                NODE_IPS
                    .iter()
                    .all(|ip| hops.iter().any(|h| h == ip))
                    .then(|| hops.clone())
            },
        )
        .await;
        eprintln!("gobgpd learned {prefix} via {hops:?}");
        // What gobgpd learned, in the hub's kernel (RouteSync turns every 300 ms).
        let route = common::within(
            Duration::from_secs(10),
            "the hub's route to the FIP over both nodes (ECMP)",
            &diag,
            || async {
                let route = hub_route(fip).await;
                NODE_IPS
                    .iter()
                    .all(|ip| route.contains(&format!("via {ip}")))
                    .then_some(route)
            },
        )
        .await;
        let body = common::within(
            Duration::from_secs(30),
            "http://<fip>:80/_sim/health over the BGP route",
            &diag,
            || async { common::web::health(fip, Duration::from_secs(2)).await.ok() },
        )
        .await;
        assert_eq!(body, "ok");
        eprintln!(
            "BGP FIP {fip} answered after {:.1}s; hub route {route:?}",
            started.elapsed().as_secs_f64()
        );
        assert!(in_a_pool(&admin, fip).await, "baton's FIP is in a MetalLB pool");

        // The routed FIP was never handed to MetalLB: no pool, never learned by the router.
        assert!(
            !in_a_pool(&admin, byo.address).await,
            "the routed FIP is in a MetalLB pool"
        );
        assert!(
            !metallb::router_rib(GOBGP_API)
                .await
                .contains_key(&format!("{}/32", byo.address)),
            "the routed FIP was announced by BGP"
        );

        // Deleting the Service never releases the operator's FIP, nor unroutes it.
        services.delete("byo", &DeleteParams::default()).await.unwrap();
        common::within(Duration::from_secs(30), "apps/byo gone", &diag, || async {
            services.get_opt("byo").await.ok()?.is_none().then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let kept = cloud.ip(&byo.id).await.expect("the operator's FIP still exists");
        assert_eq!(kept.target(), Some(ServerId(CP[1])), "still routed to cp-1");

        for s in speakers {
            s.terminate(Duration::from_secs(2)).await;
        }
        router.terminate(Duration::from_secs(2)).await;
    });
}
