//! Workload Service FIPs on Hetzner Cloud, which has no BGP: baton reserves a Floating IP for a
//! Service of `loadBalancerClass: baton.dev/floating-ip`, routes it to a healthy node by the
//! cloud's API (an assign action), and moves it when that node fails; kube-proxy on the node
//! forwards it to the pods (the ingress is VIP mode). A Service without a class is the cloud's own
//! controller's (a Hetzner Load Balancer) and is left alone.
//!
//! One lab: lab nodes cp-0 and cp-1 with kubelets (containerd, a pod network, kube-proxy with its
//! health check on the node's address, Kubernetes' default), the simulator speaking Hetzner's
//! API and routing assigned FIPs in the hub, and two `baton controller` replicas, one on each
//! node, in the node's namespaces as the Deployment runs them (the shipped manifests' way with the
//! `hcloud` Secret is the demo's: `scripts/demo --cloud hetzner`). The test stands in for
//! hcloud-cloud-controller-manager where baton leaves it the work: it initialises the Nodes
//! (provider ID `hcloud://<server id>`). The test itself, in the hub, is the host outside the
//! cluster.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // a scenario reads best as one story

mod common;

use std::net::IpAddr;
use std::time::Duration;

use baton_sim::{Faults, HetznerSettings};
use baton_testbed::{ControlPlane, Options, lab};
use common::{ingress, namespace};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// The binary under test.
const BATON: &str = env!("CARGO_BIN_EXE_baton");

/// The simulator's servers cp-0 and cp-1.
const CP: [u64; 2] = [600_101, 600_102];

/// The last lines of every pod's and replica's log, for a failure message.
fn diag(cp: &ControlPlane, logs: &std::path::Path) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let replicas = (0..2).map(|i| logs.join(format!("controller-{i}.log")));
    let pods = common::pod_logs(cp).into_iter().map(|(p, _)| p);
    for path in pods.chain(replicas) {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(25)..].join("\n");
        let _ = writeln!(out, "--- {} ---\n{tail}", path.display());
    }
    out
}

/// `baton controller` on lab node cp-`i` against the Hetzner simulator.
fn replica(
    cp: &ControlPlane,
    sim: &baton_sim::SimHandle,
    i: usize,
    logs: &std::path::Path,
) -> tokio::process::Child {
    let kubeconfig = cp.write_kubeconfig(i, baton_testbed::ADMIN_TOKEN).unwrap();
    let args = [
        "controller",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--identity",
        &format!("cp-{i}"),
        "--admin-listen",
        "off",
    ];
    common::node::command(cp, BATON, i, &args, &logs.join(format!("controller-{i}.log")))
        .env("NODE_NAME", format!("cp-{i}"))
        .env("BATON_CLOUD", "hetzner")
        .env("HCLOUD_TOKEN", sim.api_key())
        .env("HCLOUD_ENDPOINT", format!("{}v1", sim.base_url()))
        .env("BATON_FIP_RELEASE_GRACE_PERIOD", "0")
        .env("CHERRY_REGION_NAME", "fsn1")
        .spawn()
        .unwrap()
}

/// What hcloud-cloud-controller-manager does to a new Node: its provider ID, and the
/// `uninitialized` taint removed.
async fn initialise_as_the_hcloud_ccm(admin: &kube::Client, name: &str, server: u64) {
    let patch = json!({"spec": {"providerID": format!("hcloud://{server}"), "taints": []}});
    Api::<Node>::all(admin.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[test]
fn a_floating_ip_service_is_routed_to_a_healthy_node_and_moves_when_it_fails() {
    let image = baton_testbed::baton_image().expect("baton's image (scripts/build-image)");
    lab::run(move || async move {
        baton_testbed::init_tracing();
        let started = tokio::time::Instant::now();
        let mut cp = ControlPlane::start(Options {
            kubelets: true,
            images: vec![image],
            ..Options::servers(2)
        })
        .await
        .expect("two lab nodes with kubelets");
        let admin = cp.client(0).unwrap();
        for (name, server) in cp.node_names().iter().zip(CP) {
            initialise_as_the_hcloud_ccm(&admin, name, server).await;
        }
        let sim = common::routed_hetzner_sim(HetznerSettings::default(), Faults::none()).await;
        namespace(&admin, "apps").await;
        let logs = tempfile::tempdir().unwrap();
        let _replicas: Vec<_> = (0..2).map(|i| replica(&cp, &sim, i, logs.path())).collect();
        Api::<Deployment>::namespaced(admin.clone(), "apps")
            .create(&PostParams::default(), &common::web::deployment())
            .await
            .unwrap();
        let services: Api<Service> = Api::namespaced(admin.clone(), "apps");
        services
            .create(
                &PostParams::default(),
                &common::web::service("web", None, Some("baton.dev/floating-ip"), &json!({})),
            )
            .await
            .unwrap();
        services
            .create(
                &PostParams::default(),
                &common::web::service("hcloud-lb", None, None, &json!({})),
            )
            .await
            .unwrap();

        // baton's FIP: the Service's ingress, routed to a node, answering through kube-proxy.
        let fip: IpAddr = common::within(
            Duration::from_secs(120),
            "apps/web's ingress",
            &|| diag(&cp, logs.path()),
            || async { ingress(&services.get("web").await.ok()?)?.parse().ok() },
        )
        .await;
        let ip = sim
            .peek_ips()
            .into_iter()
            .find(|ip| ip.address == fip)
            .expect("the ingress is a Floating IP of the project");
        let holder = common::within(
            Duration::from_secs(30),
            "the FIP routed to a node",
            &|| diag(&cp, logs.path()),
            || async { sim.peek_ip(ip.id.as_str())?.target() },
        )
        .await;
        let body = common::within(
            Duration::from_secs(90),
            "http://<fip>:80/_sim/health",
            &|| diag(&cp, logs.path()),
            || async { common::web::health(fip, Duration::from_millis(500)).await.ok() },
        )
        .await;
        assert_eq!(body, "ok");
        eprintln!(
            "apps/web: FIP {fip} on server {} answered after {:.1}s",
            holder.0,
            started.elapsed().as_secs_f64()
        );
        // The classless Service is the cloud controller's: no FIP, no finalizer, no ingress.
        let left = services.get("hcloud-lb").await.unwrap();
        assert_eq!(ingress(&left), None);
        assert!(left.metadata.finalizers.unwrap_or_default().is_empty());
        let service_fips = sim.peek_ips().into_iter().filter(common::is_service_fip).count();
        assert_eq!(service_fips, 1, "one FIP, for apps/web only");

        // The holder's node is powered off: the FIP moves to the other node by one assign and
        // answers again.
        let victim = if holder.0 == CP[0] { "cp-0" } else { "cp-1" };
        let from = sim.log(0).last().map_or(0, |e| e.seq + 1);
        let t0 = tokio::time::Instant::now();
        cp.kill_node(victim).await.unwrap();
        common::within(
            Duration::from_secs(60),
            "the FIP answers from the other node",
            &|| diag(&cp, logs.path()),
            || async {
                let now = sim.peek_ip(ip.id.as_str())?.target()?;
                (now != holder && common::web::health(fip, Duration::from_millis(500)).await.ok()? == "ok")
                    .then_some(())
            },
        )
        .await;
        eprintln!(
            "apps/web: answered again {:?} after {victim} was powered off",
            t0.elapsed()
        );
        let assigns = sim
            .log(from)
            .iter()
            .filter(|e| e.route == "/v1/floating_ips/{id}/actions/assign" && e.status < 300)
            .count();
        assert_eq!(assigns, 1, "one assign for the failure");

        // Deleting the Service releases its FIP (grace period 0); through the surviving node's
        // API server.
        let survivor = usize::from(victim == "cp-0");
        let services: Api<Service> = Api::namespaced(cp.client(survivor).unwrap(), "apps");
        services.delete("web", &DeleteParams::default()).await.unwrap();
        common::within(
            Duration::from_secs(60),
            "apps/web's FIP released",
            &|| diag(&cp, logs.path()),
            || async { sim.peek_ip(ip.id.as_str()).is_none().then_some(()) },
        )
        .await;
        assert_eq!(sim.stats().with_status(429), 0);
    });
}
