//! docs/migration.md, followed in the lab: a cluster that ran cloud-provider-cherry switches to
//! baton installed by the chart.
//!
//! The CCM's objects are made as the CCM makes them (reference/cherry-api.md §5–6): the
//! control-plane FIP (its `fipTag`, routed to a control-plane server), the mirror Service
//! `kube-system/cloud-provider-cherry-kubernetes-external` (field manager
//! `cloud-provider-cherry-auto`, status `ipMode: Proxy`, Endpoints copied from
//! `default/kubernetes`), Service FIPs with its three tags and `metallb.io/loadBalancerIPs`,
//! a bring-your-own-IP Service, the MetalLB objects labelled `cloud-provider=equinix-metal` (a
//! pool for the control-plane FIP among them: CPEM #258), its Secret `cherry-cloud-config` and
//! its Deployment. Then the runbook: delete the CCM's Deployment, `helm install` baton reusing the
//! CCM's Secret, the chart's pods start (run as processes with the pod's args, env, Secret and
//! token: this test's lab has no kubelets; see `common::pod`).
//!
//! On the path real nodes have: cp-0..2 are lab nodes (each its own network namespace and API
//! server), the simulator routes the control-plane FIP to its holder as the cloud does, and the
//! nodes accept it as the CCM's README has them do, the FIP on each node's loopback, until baton
//! is installed: then `baton agent` runs on every node as the chart's DaemonSet would (its own
//! ServiceAccount), and the controller's pods run in cp-0's and cp-1's namespaces. MetalLB's
//! speaker runs on cp-0, gobgpd in the lab host.
//!
//! While it switches, a client on the lab host polls the control-plane FIP's `/readyz` through
//! the cloud's route, and another checks every workload address stays in a MetalLB pool named by
//! an advertisement (what MetalLB announces) with its Service's ingress unchanged, and a real BGP
//! router (gobgpd on the region's route server address) peered with MetalLB's speaker for cp-0 is
//! read every 200 ms: every workload route stays in its RIB throughout. Failures counted: 0
//! expected. Once baton has taken over, the loopback addresses go and the FIP keeps answering,
//! accepted by the agent's rule on cp-0. Before the switch the router also has the control-plane
//! FIP (the CCM's pool for its mirror: CPEM #258); after, never.
//!
//! After: everything adopted (Service FIPs by their tags, MetalLB objects by their labels), the
//! CCM's leftovers baton replaces removed (its mirror despite the service controller's cleanup
//! finalizer the CCM left on every LoadBalancer Service), no FIP created, deleted or moved,
//! nothing a user reserved touched. Then the guards: a Service of another name asking for the control-plane
//! FIP is never handed to MetalLB, and deleting a control-plane endpoint Service unassigns its
//! FIP and keeps the reservation; and deleting a Service the CCM served releases its FIP and
//! finishes (the CCM's finalizer removed after baton's cleanup).
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // a runbook reads top to bottom

mod common;
mod metallb;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use baton::controller::bgp::Kind;
use baton_cloud::Cloud as _;
use baton_cloud::model::{CreateIpRequest, ServerId, Tags};
use baton_cloud::tags::service_fip_tags;
use baton_sim::{Faults, Topology};
use baton_testbed::control_plane::Proc;
use baton_testbed::{ControlPlane, Options, TokenUser, lab};
use common::{eventually, ingress, namespace};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Endpoints, Event, Namespace, Node, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};
use tokio::process::Child;

const SA_TOKEN: &str = "baton-sa-token";
const MLB: &str = "metallb-system";
const CCM_MIRROR: &str = "cloud-provider-cherry-kubernetes-external";
const CCM_MANAGER: &str = "cloud-provider-cherry-auto";
const CCM_FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
const CP: [u64; 3] = [600_101, 600_102, 600_103];
const WAIT: Duration = Duration::from_secs(90);
/// The region's first route server (`bgp.hosts[0]` of the simulator's topology) and cp-0's
/// public IP (server 600101).
const ROUTER: &str = "198.51.100.2";
const NODE_IP: &str = "198.51.100.11";
/// The lab nodes, in API server order (cp-`i` is API server `i`).
const NODES: [&str; 3] = ["cp-0", "cp-1", "cp-2"];
const GOBGP_API: &str = "127.0.0.1:50051";

/// The reasons of baton's Events (events.k8s.io: reporting controller `baton`) on `kind`/`name`
/// in `ns`.
async fn baton_events(client: &kube::Client, ns: &str, kind: &str, name: &str) -> Vec<String> {
    use k8s_openapi::api::events::v1::Event as NewEvent;
    Api::<NewEvent>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reporting_controller.as_deref() == Some("baton")
                && e.regarding
                    .as_ref()
                    .is_some_and(|r| r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name))
        })
        .filter_map(|e| e.reason)
        .collect()
}

/// Waits until baton has recorded an Event with `reason` on `kind`/`name` in `ns`.
async fn wait_event(client: &kube::Client, ns: &str, kind: &str, name: &str, reason: &str) {
    eventually(WAIT, &format!("Event {reason} on {kind} {ns}/{name}"), || async {
        baton_events(client, ns, kind, name)
            .await
            .iter()
            .any(|r| r == reason)
            .then_some(())
    })
    .await;
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

/// A MetalLB object as the CCM writes it: labelled `cloud-provider=equinix-metal` (+ `extra`).
async fn ccm_object(client: &kube::Client, kind: Kind, name: &str, extra: &[(String, String)], spec: Value) {
    let mut labels = BTreeMap::from([("cloud-provider".to_owned(), "equinix-metal".to_owned())]);
    labels.extend(extra.iter().cloned());
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), MLB, &baton::controller::bgp::api_resource(kind));
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("metallb.io/{}", kind.version()),
        "kind": kind.kind(),
        "metadata": {"name": name, "namespace": MLB, "labels": labels},
        "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
}

/// A Service the CCM served: type LoadBalancer, status ingress `ip` (written by the CCM).
async fn ccm_service(
    client: &kube::Client,
    ns: &str,
    name: &str,
    annotations: &[(&str, &str)],
    lb_ip: Option<&str>,
    ip: &str,
) {
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    let mut svc = common::lb_service(ns, name, annotations);
    svc.spec.as_mut().unwrap().load_balancer_ip = lb_ip.map(str::to_owned);
    // Kubernetes' service controller (run by the CCM) puts its cleanup finalizer on every
    // LoadBalancer Service it handles.
    svc.metadata.finalizers = Some(vec![CCM_FINALIZER.to_owned()]);
    api.create(&PostParams::default(), &svc).await.unwrap();
    let status = json!({"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// Whether `ip/32` is in a pool that an advertisement names (what MetalLB would announce).
async fn announced(client: &kube::Client, ip: &str) -> bool {
    let pools = metallb::objects(client, MLB, Kind::IpAddressPool).await;
    let advs = metallb::objects(client, MLB, Kind::BgpAdvertisement).await;
    let cidr = format!("{ip}/32");
    pools.iter().any(|(name, pool)| {
        let spec = metallb::spec(pool);
        let has = spec["addresses"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(&cidr)));
        has && advs.values().any(|adv| {
            metallb::spec(adv)["ipAddressPools"]
                .as_array()
                .is_some_and(|p| p.iter().any(|x| x.as_str() == Some(name)))
        })
    })
}

/// `ip ARGS` on lab node `node`; fails the test unless it succeeds.
async fn node_ip(cp: &ControlPlane, node: &str, args: &[&str]) {
    let status = cp
        .node_command(node, "ip")
        .unwrap()
        .args(args)
        .status()
        .await
        .unwrap();
    assert!(status.success(), "ip {args:?} on {node}");
}

/// The packets counted by the agent's rule for `fip` on lab node `node` (`nft list table ip
/// baton`): connections to the FIP that the node accepted through the agent; `None` without
/// that rule.
async fn agent_rule_packets(cp: &ControlPlane, node: &str, fip: &str) -> Option<u64> {
    let out = cp
        .node_command(node, "nft")
        .unwrap()
        .args(["list", "table", "ip", "baton"])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains(&format!("ip daddr {fip} ")) && l.contains("redirect"))
        .and_then(|l| {
            l.split("counter packets ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
}

#[test]
fn a_cluster_that_ran_cloud_provider_cherry_switches_to_baton_without_moving_an_address() {
    let helm = common::helm::Helm::new();
    lab::run(|| async move {
        baton_testbed::init_tracing();
        let cp = ControlPlane::start(Options {
            users: vec![baton_user()],
            nodes: true,
            ..Options::servers(3)
        })
        .await
        .unwrap();
        let admin = cp.client(0).unwrap();
        let kubeconfig = cp.write_kubeconfig(0, baton_testbed::ADMIN_TOKEN).unwrap();
        let kc = kubeconfig.to_str().unwrap().to_owned();
        metallb::install_crds(&admin).await;
        namespace(&admin, MLB).await;
        namespace(&admin, "apps").await;
        let sim = common::routed_sim(Faults::none(), Topology::default()).await;
        // The Nodes as kubelets and the CCM left them: host name and region labels, provider ID.
        for (i, id) in CP.iter().enumerate() {
            let node: Node = serde_json::from_value(json!({
                "metadata": {"name": format!("cp-{i}"), "labels": {
                    "kubernetes.io/hostname": format!("cp-{i}"),
                    "node-role.kubernetes.io/control-plane": "",
                    "topology.kubernetes.io/region": "LT-Siauliai"}},
                "spec": {"providerID": format!("cherryservers://{id}")},
            }))
            .unwrap();
            Api::<Node>::all(admin.clone())
                .create(&PostParams::default(), &node)
                .await
                .unwrap();
        }
        // A real BGP router on the region's first route server (a host on the lab's bridge),
        // and MetalLB's speaker on cp-0 peering with it from cp-0's public IP (an address of
        // its interface, as MetalLB checks).
        baton_testbed::node::add_lab_host(ROUTER.parse().unwrap())
            .await
            .unwrap();
        let bgp_dir = tempfile::tempdir().unwrap();
        let conf = bgp_dir.path().join("gobgpd.toml");
        std::fs::write(
            &conf,
            metallb::gobgpd_config(ROUTER, 16_125, &[(NODE_IP, 65_000)]),
        )
        .unwrap();
        let router = Proc::spawn(
            "gobgpd",
            bgp_dir.path(),
            tokio::process::Command::new("gobgpd").arg("-f").arg(&conf).args([
                "-p",
                "--pprof-disable",
                "--api-hosts",
                GOBGP_API,
            ]),
        )
        .unwrap();
        let cluster = Api::<Namespace>::all(admin.clone())
            .get("kube-system")
            .await
            .unwrap()
            .uid()
            .unwrap();
        let cloud = common::unlimited_client(&sim);

        // ---- The cluster as cloud-provider-cherry left it. ----
        // Its control-plane FIP (fipTag cluster=my-cp), routed to cp-0.
        let (_, cp_fip) = common::control_plane_fip(&sim, ("cluster", "my-cp"), CP[0]).await;
        let control_ip = cp_fip.address.to_string();
        // The nodes accept it the way the CCM's README says: the FIP on each node's loopback.
        for node in NODES {
            node_ip(
                &cp,
                node,
                &["addr", "add", &format!("{control_ip}/32"), "dev", "lo"],
            )
            .await;
        }
        // Its mirror Service, Endpoints copied from default/kubernetes, by server-side apply.
        let ccm_pp = PatchParams::apply(CCM_MANAGER).force();
        let kube_system: Api<Service> = Api::namespaced(admin.clone(), "kube-system");
        let mirror = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": CCM_MIRROR, "namespace": "kube-system", "annotations": {
                "metallb.universe.tf/address-pool": "disabled-metallb-do-not-use-any-address-pool"}},
            "spec": {"type": "LoadBalancer", "loadBalancerIP": control_ip,
                     "ports": [{"name": "https", "port": 6443, "protocol": "TCP", "targetPort": 6443}]},
        });
        kube_system
            .patch(CCM_MIRROR, &ccm_pp, &Patch::Apply(&mirror))
            .await
            .unwrap();
        let finalizer = json!({"metadata": {"finalizers": [CCM_FINALIZER]}});
        kube_system
            .patch(CCM_MIRROR, &PatchParams::default(), &Patch::Merge(&finalizer))
            .await
            .unwrap();
        let status = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": CCM_MIRROR, "namespace": "kube-system"},
            "status": {"loadBalancer": {"ingress": [{"ip": control_ip, "ipMode": "Proxy"}]}}});
        kube_system
            .patch_status(CCM_MIRROR, &ccm_pp, &Patch::Apply(&status))
            .await
            .unwrap();
        let source = eventually(WAIT, "default/kubernetes Endpoints", || async {
            Api::<Endpoints>::namespaced(admin.clone(), "default")
                .get_opt("kubernetes")
                .await
                .unwrap()
                .filter(|e| e.subsets.as_ref().is_some_and(|s| !s.is_empty()))
        })
        .await;
        let eps = json!({"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": CCM_MIRROR, "namespace": "kube-system"},
            "subsets": source.subsets});
        Api::<Endpoints>::namespaced(admin.clone(), "kube-system")
            .patch(CCM_MIRROR, &ccm_pp, &Patch::Apply(&eps))
            .await
            .unwrap();
        // Service FIPs it reserved (its three tags) and the Services showing them.
        let mut workloads = Vec::new();
        for name in ["web", "db"] {
            let fip = cloud
                .create_ip(CreateIpRequest {
                    region: "LT-Siauliai".into(),
                    tags: service_fip_tags("apps", name, &cluster),
                    ..Default::default()
                })
                .await
                .unwrap();
            let ip = fip.address.to_string();
            ccm_service(
                &admin,
                "apps",
                name,
                &[("metallb.io/loadBalancerIPs", &ip)],
                None,
                &ip,
            )
            .await;
            workloads.push((name, ip, fip.id.to_string()));
        }
        // A user's own FIP on a bring-your-own-IP Service, and one reserved for later.
        let user_fip = |owner: &str| CreateIpRequest {
            region: "LT-Siauliai".into(),
            tags: Tags::from([("owner".to_owned(), owner.to_owned())]),
            ..Default::default()
        };
        let own = cloud.create_ip(user_fip("me")).await.unwrap();
        let own_ip = own.address.to_string();
        ccm_service(&admin, "apps", "own", &[], Some(&own_ip), &own_ip).await;
        let spare = cloud.create_ip(user_fip("spare")).await.unwrap();
        // Its MetalLB objects: a pool per Service (the mirror's too, CPEM #258), its
        // advertisement, native peers per node and route server with never-matching selectors.
        let mut pools = Vec::new();
        for (ns, name, ip) in [
            ("apps", "web", workloads[0].1.as_str()),
            ("apps", "db", workloads[1].1.as_str()),
            ("apps", "own", own_ip.as_str()),
            ("kube-system", CCM_MIRROR, control_ip.as_str()),
        ] {
            let pool = format!("{ns}.{name}");
            ccm_object(
                &admin,
                Kind::IpAddressPool,
                &pool,
                &[(format!("service-{name}"), format!("namespace-{ns}"))],
                json!({"addresses": [format!("{ip}/32")], "autoAssign": false, "avoidBuggyIPs": false}),
            )
            .await;
            pools.push(pool);
        }
        ccm_object(
            &admin,
            Kind::BgpAdvertisement,
            "equinix-metal-bgp-adv",
            &[],
            json!({"ipAddressPools": pools}),
        )
        .await;
        for (i, id) in CP.iter().enumerate() {
            let src = lab::public_ip(11 + u8::try_from(i).unwrap()).to_string();
            for (j, peer) in ["198.51.100.2", "198.51.100.3"].iter().enumerate() {
                ccm_object(
                    &admin,
                    Kind::BgpPeer,
                    &format!("cp-{i}-{j}"),
                    &[],
                    json!({"myASN": 65000, "peerASN": 16125, "peerAddress": peer, "sourceAddress": src,
                           "peerPort": 179, "holdTime": "30s", "password": "",
                           "nodeSelectors": [
                               {"matchLabels": {"kubernetes.io/hostname": format!("cp-{i}")}},
                               {"matchLabels": {"nomatch.cherryservers.com/service-namespace": "apps",
                                                "nomatch.cherryservers.com/service-name": "web"}}]}),
                )
                .await;
            }
            let _ = id;
        }
        // A user's own pool: never touched.
        metallb::create(
            &admin,
            MLB,
            Kind::IpAddressPool,
            "user-pool",
            json!({"addresses": ["192.0.2.128/25"]}),
        )
        .await;
        // One ready endpoint per workload Service (MetalLB announces a Service only then), and
        // the speaker on cp-0, announcing what the CCM configured.
        for name in ["web", "db", "own"] {
            let slice: EndpointSlice = serde_json::from_value(json!({
                "metadata": {"name": format!("{name}-1"), "namespace": "apps",
                             "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["192.0.2.50"], "nodeName": "cp-0",
                               "conditions": {"ready": true, "serving": true, "terminating": false}}],
                "ports": [{"name": "", "port": 80, "protocol": "TCP"}],
            }))
            .unwrap();
            Api::<EndpointSlice>::namespaced(admin.clone(), "apps")
                .create(&PostParams::default(), &slice)
                .await
                .unwrap();
        }
        // The mirror's EndpointSlice, as kube-controller-manager mirrors the CCM's Endpoints: with
        // the CCM's pool for the control-plane FIP, MetalLB announces that FIP (CPEM #258).
        let mirror_slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": format!("{CCM_MIRROR}-abcde"), "namespace": "kube-system",
                         "labels": {"kubernetes.io/service-name": CCM_MIRROR,
                                    "endpointslice.kubernetes.io/managed-by": "endpointslicemirroring-controller.k8s.io"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["198.51.100.11"], "conditions": {"ready": true}}],
            "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
        }))
        .unwrap();
        Api::<EndpointSlice>::namespaced(admin.clone(), "kube-system")
            .create(&PostParams::default(), &mirror_slice)
            .await
            .unwrap();
        Api::<Pod>::namespaced(admin.clone(), MLB)
            .create(&PostParams::default(), &metallb::speaker_pod(MLB, "cp-0"))
            .await
            .unwrap();
        let speaker = Proc::spawn(
            "speaker",
            bgp_dir.path(),
            &mut metallb::with_speaker_args(
                cp.node_command("cp-0", metallb::dir().join("bin/speaker"))
                    .unwrap(),
                &kubeconfig,
                MLB,
                "cp-0",
                7472,
            ),
        )
        .unwrap();
        let prefixes: Vec<String> = [workloads[0].1.as_str(), workloads[1].1.as_str(), own_ip.as_str()]
            .iter()
            .map(|ip| format!("{ip}/32"))
            .collect();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let rib = metallb::router_rib(GOBGP_API).await;
            if prefixes
                .iter()
                .all(|p| rib.get(p).is_some_and(|h| h.iter().any(|h| h == NODE_IP)))
                && rib.contains_key(&format!("{control_ip}/32"))
            {
                eprintln!(
                    "before the switch the router has {:?} (the control-plane FIP among them: CPEM #258)",
                    rib.keys()
                );
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the router did not learn {prefixes:?} from the CCM's configuration; RIB {rib:?}\n--- speaker ---\n{}\n--- gobgpd ---\n{}",
                speaker.log_tail(40),
                router.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }

        // The CCM's Secret and Deployment (the lab runs no kubelet: the Deployment only exists).
        let cloud_sa = json!({"apiKey": sim.api_key(), "projectID": sim.project_id(),
            "loadbalancer": "metallb:///metallb-system/", "region": "LT-Siauliai", "fipTag": "cluster=my-cp"});
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "cherry-cloud-config", "namespace": "kube-system"},
            "stringData": {"cloud-sa.json": cloud_sa.to_string()},
        }))
        .unwrap();
        Api::<Secret>::namespaced(admin.clone(), "kube-system")
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let ccm: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "cloud-provider-cherry", "namespace": "kube-system"},
            "spec": {"selector": {"matchLabels": {"app": "cloud-provider-cherry"}},
                     "template": {"metadata": {"labels": {"app": "cloud-provider-cherry"}},
                                  "spec": {"hostNetwork": true, "containers": [{"name": "cloud-provider-cherry",
                                     "image": "ghcr.io/cherryservers/cloud-provider-cherry:latest",
                                     "args": ["--cloud-provider=cherryservers", "--cloud-config=/etc/cloud-sa/cloud-sa.json"]}]}}},
        }))
        .unwrap();
        let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "kube-system");
        deployments.create(&PostParams::default(), &ccm).await.unwrap();
        let before: BTreeSet<String> = common::cloud_ips(&sim)
            .await
            .iter()
            .filter(|ip| ip.ip_type == baton_cloud::model::IpType::FloatingIp)
            .map(|ip| format!("{} {}", ip.id, ip.address))
            .collect();
        assert_eq!(before.len(), 5, "{before:?}");

        // ---- Before you start (docs/migration.md): baton's status, with the CCM's configuration,
        // lists the Services whose address baton would refuse. The user's own FIP is untagged:
        // it is printed as the adoptFips value that keeps it. ----
        let sa_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(sa_file.path(), cloud_sa.to_string()).unwrap();
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_baton"))
            .args([
                "status",
                "--kubeconfig",
                &kc,
                "--output",
                "json",
                "--cloud-config",
            ])
            .arg(sa_file.path())
            .env_clear()
            .env("CHERRY_BASE_URL", sim.base_url().to_string())
            .output()
            .await
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("baton status: {e}: {}", String::from_utf8_lossy(&out.stderr)));
        let refused = report["refusedAddresses"].as_array().unwrap();
        assert_eq!(
            refused
                .iter()
                .map(|r| (
                    r["service"].as_str().unwrap(),
                    r["address"].as_str().unwrap(),
                    r["untagged"].as_bool().unwrap()
                ))
                .collect::<Vec<_>>(),
            vec![("apps/own", own_ip.as_str(), true)],
            "{report}"
        );
        sim.reset_stats();

        // ---- Traffic during the switch. ----
        let stop = Arc::new(AtomicBool::new(false));
        let (cp_ok, cp_failed, lb_checks, lb_failed) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        let fip_addr = SocketAddr::new(cp_fip.address, 6443);
        let ca = cp.ca_der().to_vec();
        // Each failure with its time and cause, against the steps' times (`mark`): a failure
        // says which step it belongs to.
        let t0 = std::time::Instant::now();
        let mark = move |what: &str| eprintln!("{:6.1} s  {what}", t0.elapsed().as_secs_f64());
        let cp_failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let cp_poller = tokio::spawn({
            let (stop, ok, failed) = (stop.clone(), cp_ok.clone(), cp_failed.clone());
            let failures = cp_failures.clone();
            async move {
                while !stop.load(Ordering::SeqCst) {
                    match common::readyz_why(&ca, fip_addr).await {
                        Ok(()) => {
                            ok.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(why) => {
                            failed.fetch_add(1, Ordering::SeqCst);
                            let at = t0.elapsed().as_secs_f64();
                            failures.lock().unwrap().push(format!("{at:.1} s: {why}"));
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
        let mut lb_targets: Vec<(String, String)> = workloads
            .iter()
            .map(|(n, ip, _)| ((*n).to_owned(), ip.clone()))
            .collect();
        lb_targets.push(("own".into(), own_ip.clone()));
        let lb_poller = tokio::spawn({
            let (stop, checks, failed, client) =
                (stop.clone(), lb_checks.clone(), lb_failed.clone(), admin.clone());
            let targets = lb_targets.clone();
            async move {
                let api: Api<Service> = Api::namespaced(client.clone(), "apps");
                let mut failures = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    for (name, ip) in &targets {
                        let shown = api.get(name).await.ok().and_then(|s| ingress(&s));
                        let ok = shown.as_deref() == Some(ip.as_str()) && announced(&client, ip).await;
                        checks.fetch_add(1, Ordering::SeqCst);
                        if !ok {
                            failed.fetch_add(1, Ordering::SeqCst);
                            failures.push(format!(
                                "{name}: ingress {shown:?}, announced: {}",
                                announced(&client, ip).await
                            ));
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                failures
            }
        });
        // The router's view: every workload prefix, every 200 ms.
        let rib_poller = tokio::spawn({
            let (stop, prefixes) = (stop.clone(), prefixes.clone());
            async move {
                let (mut samples, mut missing) = (0u64, Vec::new());
                while !stop.load(Ordering::SeqCst) {
                    let rib = metallb::router_rib(GOBGP_API).await;
                    samples += 1;
                    for p in &prefixes {
                        if !rib.get(p).is_some_and(|h| h.iter().any(|h| h == NODE_IP)) {
                            missing.push(format!("{p} at sample {samples}"));
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                (samples, missing)
            }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;

        // ---- The runbook (docs/migration.md). ----
        // 1. Stop the CCM.
        mark("1. stopping the CCM");
        deployments
            .delete("cloud-provider-cherry", &DeleteParams::default())
            .await
            .unwrap();
        mark("2. helm install");
        // 2. Install baton with the CCM's Secret, adopting the FIP "Before you start" named. The
        // lab's only addition: the simulator's URL.
        let values = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            values.path(),
            format!(
                "configSecret:\n  create: false\n  name: cherry-cloud-config\nmetallb:\n  rbac: true\nenv:\n  - {{name: CHERRY_BASE_URL, value: \"{}\"}}\n  - {{name: BATON_ADOPT_FIPS, value: \"{own_ip}\"}}\n",
                sim.base_url()
            ),
        )
        .unwrap();
        let notes = helm.ok(&[
            "install",
            "baton",
            "charts/baton",
            "--namespace",
            "kube-system",
            "--kubeconfig",
            &kc,
            "--values",
            values.path().to_str().unwrap(),
        ]);
        assert!(notes.contains("STATUS: deployed"), "{notes}");
        mark("3. starting the replicas and agents");
        // 3. Its pods start on two control-plane nodes, each in its node's namespaces talking to
        // its own API server, its Node name as the downward API gives it; the agent DaemonSet's
        // on every node, with a token of its own ServiceAccount.
        let baton = Path::new(env!("CARGO_BIN_EXE_baton"));
        assert!(
            Api::<DaemonSet>::namespaced(admin.clone(), "kube-system")
                .get_opt("baton-agent")
                .await
                .unwrap()
                .is_some(),
            "the chart installs the agent"
        );
        let agent_token = common::service_account_token(&admin, "kube-system", "baton-agent").await;
        let pod_dir = tempfile::tempdir().unwrap();
        let _agents: Vec<Child> = NODES
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let kubeconfig = cp.write_kubeconfig(i, &agent_token).unwrap();
                cp.node_command(node, baton)
                    .unwrap()
                    .args(["agent", "--kubeconfig", kubeconfig.to_str().unwrap()])
                    .env("BATON_LOG", "info,baton=debug")
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(pod_dir.path().join(format!("agent-{node}.log"))).unwrap())
                    .kill_on_drop(true)
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut pods = Vec::new();
        for (i, node) in NODES.iter().take(2).enumerate() {
            let sa_kubeconfig = cp.write_kubeconfig(i, SA_TOKEN).unwrap();
            pods.push(
                common::pod::start(
                    &common::node::on_node(&cp, node, baton, pod_dir.path()),
                    &admin,
                    "kube-system",
                    "baton",
                    &format!("baton-{node}"),
                    &sa_kubeconfig,
                    &[("NODE_NAME", node)],
                )
                .await,
            );
        }
        let logs = |pods: &[common::pod::Pod]| {
            pods.iter()
                .map(|p| format!("--- {}\n{}", p.name, p.log_tail(40)))
                .collect::<Vec<_>>()
                .join("\n")
        };

        // ---- Everything adopted. ----
        mark("waiting for everything adopted");
        let mirror = eventually(WAIT, "baton's mirror Service shows the FIP", || async {
            kube_system
                .get_opt("baton-kubernetes-external")
                .await
                .unwrap()
                .filter(|s| ingress(s).as_deref() == Some(control_ip.as_str()))
        })
        .await;
        let ing = &mirror
            .status
            .clone()
            .unwrap()
            .load_balancer
            .unwrap()
            .ingress
            .unwrap()[0];
        assert_eq!(ing.ip_mode.as_deref(), Some("Proxy"));
        assert_eq!(
            mirror.spec.as_ref().unwrap().load_balancer_class.as_deref(),
            Some("baton.dev/control-plane"),
            "no load balancer implementation handles it"
        );
        eventually(WAIT, "the CCM's mirror Service removed", || async {
            kube_system
                .get_opt(CCM_MIRROR)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
        // Said where an operator looks: on baton's mirror, naming the removed Service.
        wait_event(
            &admin,
            "kube-system",
            "Service",
            "baton-kubernetes-external",
            "LeftoverRemoved",
        )
        .await;
        assert!(
            Api::<Endpoints>::namespaced(admin.clone(), "kube-system")
                .get_opt(CCM_MIRROR)
                .await
                .unwrap()
                .is_none(),
            "the CCM's mirror Endpoints removed"
        );
        let apps: Api<Service> = Api::namespaced(admin.clone(), "apps");
        for (name, ip, id) in &workloads {
            let svc = eventually(WAIT, &format!("{name} adopted"), || async {
                apps.get_opt(name).await.unwrap().filter(|s| {
                    s.annotations().get("baton.dev/fip-id") == Some(id)
                        && s.finalizers().iter().any(|f| f == "baton.dev/service-fip")
                })
            })
            .await;
            assert_eq!(ingress(&svc).as_deref(), Some(ip.as_str()));
            assert_eq!(svc.annotations()["metallb.io/loadBalancerIPs"], *ip);
            wait_event(&admin, "apps", "Service", name, "FloatingIPAdopted").await;
        }
        let adv = eventually(
            WAIT,
            "baton's advertisement of the three pools, the CCM's gone",
            || async {
                let advs = metallb::objects(&admin, MLB, Kind::BgpAdvertisement).await;
                let ours = advs.get("baton-bgp-adv")?;
                (!advs.contains_key("equinix-metal-bgp-adv")).then(|| metallb::spec(ours))
            },
        )
        .await;
        assert_eq!(
            adv["ipAddressPools"],
            json!(["apps.db", "apps.own", "apps.web"]),
            "{}",
            logs(&pods)
        );
        let pools = metallb::objects(&admin, MLB, Kind::IpAddressPool).await;
        let names: Vec<&str> = pools.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["apps.db", "apps.own", "apps.web", "user-pool"],
            "the control-plane FIP's pool is gone"
        );
        for name in ["apps.db", "apps.own", "apps.web"] {
            assert_eq!(
                pools[name]
                    .labels()
                    .get("app.kubernetes.io/managed-by")
                    .map(String::as_str),
                Some("baton")
            );
        }
        assert!(
            pools["user-pool"].labels().is_empty(),
            "the user's pool is untouched"
        );
        // The CCM's peers mean what baton wants (their extra selectors match no node): taken
        // over by label, their specs untouched, so MetalLB keeps its BGP sessions.
        let peers = eventually(WAIT, "the peers taken over", || async {
            let peers = metallb::objects(&admin, MLB, Kind::BgpPeer).await;
            peers
                .values()
                .all(|p| p.labels().get("app.kubernetes.io/managed-by").map(String::as_str) == Some("baton"))
                .then_some(peers)
        })
        .await;
        assert_eq!(peers.len(), 6, "{:?}", peers.keys());
        for name in peers.keys() {
            wait_event(&admin, MLB, "BGPPeer", name, "Adopted").await;
        }
        wait_event(
            &admin,
            MLB,
            "BGPAdvertisement",
            "equinix-metal-bgp-adv",
            "Deleted",
        )
        .await;
        for (name, p) in &peers {
            assert_eq!(
                metallb::spec(p)["nodeSelectors"].as_array().map(Vec::len),
                Some(2),
                "{name}'s spec was rewritten"
            );
        }
        // The control-plane FIP is no longer announced by MetalLB.
        let cp_prefix = format!("{control_ip}/32");
        eventually(WAIT, "the control-plane FIP withdrawn from BGP", || async {
            (!metallb::router_rib(GOBGP_API).await.contains_key(&cp_prefix)).then_some(())
        })
        .await;
        // The agents accept the FIP now: the loopback addresses go (a node's own probe of the
        // FIP must cross the cloud's route again, docs/controller.md), and the FIP keeps
        // answering through cp-0's agent rule.
        let accepted = eventually(WAIT, "the agent's rule for the FIP on cp-0", || {
            agent_rule_packets(&cp, "cp-0", &control_ip)
        })
        .await;
        mark("5. removing the FIP from the nodes' loopback");
        for node in NODES {
            node_ip(
                &cp,
                node,
                &["addr", "del", &format!("{control_ip}/32"), "dev", "lo"],
            )
            .await;
        }
        mark("5. removed");
        // Converged: a few more seconds of traffic, then the counts.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let accepted_after = agent_rule_packets(&cp, "cp-0", &control_ip).await.unwrap();
        assert!(
            accepted_after > accepted,
            "the FIP's connections go through cp-0's agent rule ({accepted} then {accepted_after} packets)"
        );
        stop.store(true, Ordering::SeqCst);
        cp_poller.await.unwrap();
        let lb_failures = lb_poller.await.unwrap();
        let (rib_samples, rib_missing) = rib_poller.await.unwrap();
        eprintln!(
            "the router's RIB: {rib_samples} samples, {} prefixes missing",
            rib_missing.len()
        );
        assert!(rib_samples >= 10, "the RIB poller ran ({rib_samples})");
        assert!(
            rib_missing.is_empty(),
            "a workload route was withdrawn during the switch: {rib_missing:?}\n--- speaker ---\n{}",
            speaker.log_tail(60)
        );
        let (ok, failed) = (cp_ok.load(Ordering::SeqCst), cp_failed.load(Ordering::SeqCst));
        eprintln!(
            "traffic during the switch: control-plane FIP {ok} ok / {failed} failed; workload Services {} checks / {} failed",
            lb_checks.load(Ordering::SeqCst),
            lb_failed.load(Ordering::SeqCst)
        );
        assert!(ok >= 20, "the poller ran ({ok})");
        assert_eq!(
            failed,
            0,
            "the control-plane FIP stopped answering during the switch: {:?}",
            cp_failures.lock().unwrap()
        );
        assert!(lb_checks.load(Ordering::SeqCst) >= 30);
        assert!(
            lb_failures.is_empty(),
            "a workload address was not announced or shown: {lb_failures:?}"
        );

        // Nothing leaked, nothing moved, nothing a user reserved touched.
        let after: BTreeSet<String> = common::cloud_ips(&sim)
            .await
            .iter()
            .filter(|ip| ip.ip_type == baton_cloud::model::IpType::FloatingIp)
            .map(|ip| format!("{} {}", ip.id, ip.address))
            .collect();
        assert_eq!(after, before, "the same FIPs, none created or deleted");
        let sim_stats = sim.stats();
        for route in [
            "POST /v1/projects/{id}/ips",
            "DELETE /v1/ips/{id}",
            "PUT /v1/ips/{id}",
        ] {
            assert_eq!(sim_stats.route(route), 0, "{route}: {sim_stats:?}");
        }
        let holder_now = cloud.ip(&cp_fip.id).await.unwrap();
        assert_eq!(
            holder_now.target(),
            Some(ServerId(CP[0])),
            "the control-plane FIP did not move"
        );
        assert!(cloud.ip(&spare.id).await.unwrap().target().is_none());

        // ---- Guards. ----
        // A Service of another name asking for the control-plane FIP is never handed to MetalLB.
        ccm_service(
            &admin,
            "apps",
            "sneaky",
            &[("metallb.io/loadBalancerIPs", &control_ip)],
            None,
            "192.0.2.250",
        )
        .await;
        eventually(WAIT, "the ControlPlaneAddress Event on apps/sneaky", || async {
            Api::<Event>::namespaced(admin.clone(), "apps")
                .list(&ListParams::default().fields("involvedObject.name=sneaky"))
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("ControlPlaneAddress"))
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            !announced(&admin, &control_ip).await,
            "the control-plane FIP is in a MetalLB pool"
        );
        let sneaky = apps.get("sneaky").await.unwrap();
        assert!(
            sneaky.finalizers().iter().all(|f| f != "baton.dev/service-fip"),
            "no FIP of baton's to guard"
        );
        assert_eq!(
            ingress(&sneaky).as_deref(),
            Some("192.0.2.250"),
            "baton did not write its ingress"
        );

        // Deleting a control-plane endpoint Service unassigns its FIP and keeps the reservation.
        // The endpoint is in an allowed namespace (kube-system, the default), and its FIP is this
        // cluster's (tagged with the cluster's id, as the installer reserved it for this cluster).
        let mut installer_fip = user_fip("installer");
        installer_fip.tags.insert("cluster".to_owned(), cluster.clone());
        let api_fip = cloud.create_ip(installer_fip).await.unwrap();
        cloud.retarget_ip(&api_fip.id, ServerId(CP[1])).await.unwrap();
        let system_ns: Api<Service> = Api::namespaced(admin.clone(), "kube-system");
        let mut api_svc = common::lb_service(
            "kube-system",
            "api",
            &[("baton.dev/control-plane-endpoint", "true")],
        );
        {
            let spec = api_svc.spec.as_mut().unwrap();
            spec.load_balancer_ip = Some(api_fip.address.to_string());
            spec.ports.as_mut().unwrap()[0].port = 6443;
            spec.ports.as_mut().unwrap()[0].target_port = None;
        }
        system_ns.create(&PostParams::default(), &api_svc).await.unwrap();
        eventually(
            WAIT,
            "the endpoint finalizer and ingress on kube-system/api",
            || async {
                system_ns.get_opt("api").await.unwrap().filter(|s| {
                    s.finalizers().iter().any(|f| f == "baton.dev/control-plane-fip")
                        && ingress(s).as_deref() == Some(api_fip.address.to_string().as_str())
                })
            },
        )
        .await;
        // Through the cloud's route to cp-1, accepted there by its agent once the leader's FIP
        // table names the FIP (its write follows the Service's admission by a moment).
        common::wait_for(
            "the API through kube-system/api's FIP",
            Duration::from_secs(10),
            || common::readyz(cp.ca_der(), SocketAddr::new(api_fip.address, 6443)),
        )
        .await;
        system_ns.delete("api", &DeleteParams::default()).await.unwrap();
        eventually(WAIT, "kube-system/api gone", || async {
            system_ns.get_opt("api").await.unwrap().is_none().then_some(())
        })
        .await;
        let kept = cloud.ip(&api_fip.id).await.unwrap();
        assert!(kept.target().is_none(), "its FIP is unassigned: {kept:?}");
        wait_event(&admin, "kube-system", "Service", "api", "FloatingIPUnassigned").await;
        assert_eq!(sim.stats().route("DELETE /v1/ips/{id}"), 0, "and never deleted");
        assert_eq!(
            holder_now.target(),
            cloud.ip(&cp_fip.id).await.unwrap().target(),
            "the fipTag FIP stays"
        );

        assert!(
            !metallb::router_rib(GOBGP_API).await.contains_key(&cp_prefix),
            "the control-plane FIP is announced again"
        );

        // A Service the CCM served is deleted: its FIP is released as the CCM's cleanup would
        // have, and the CCM's finalizer goes with baton's, so the deletion finishes.
        let (_, _, db_fip) = &workloads[1];
        // At once, not after the grace period baton holds a FIP for by default: asked for on the
        // Service (baton.dev/fip-release-grace-period, docs/services.md).
        let at_once =
            serde_json::json!({"metadata": {"annotations": {"baton.dev/fip-release-grace-period": "0"}}});
        apps.patch(
            "db",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&at_once),
        )
        .await
        .unwrap();
        apps.delete("db", &DeleteParams::default()).await.unwrap();
        eventually(WAIT, "apps/db gone", || async {
            apps.get_opt("db").await.unwrap().is_none().then_some(())
        })
        .await;
        let left: Vec<String> = common::cloud_ips(&sim)
            .await
            .iter()
            .map(|ip| ip.id.to_string())
            .collect();
        assert!(!left.contains(db_fip), "its FIP released");
        wait_event(&admin, "apps", "Service", "db", "FloatingIPReleased").await;
        wait_event(&admin, "apps", "Service", "db", "LeftoverRemoved").await;
        assert_eq!(sim.stats().route("DELETE /v1/ips/{id}"), 1, "that one only");
        assert!(left.contains(&spare.id.to_string()) && left.contains(&api_fip.id.to_string()));

        for pod in &mut pods {
            assert!(pod.running(), "{} exited:\n{}", pod.name, pod.log_tail(40));
        }
        for pod in pods {
            pod.stop().await;
        }
        speaker.terminate(Duration::from_secs(2)).await;
        router.terminate(Duration::from_secs(2)).await;
    });
}
