//! The shipped Deployment as real pods: lab nodes cp-0..2 with real kubelets (containerd +
//! runc), kube-controller-manager and kube-scheduler (`Options::kubelets`), baton's image from
//! `scripts/build-image` loaded into each node's runtime, the Cherry Servers simulator on the
//! lab host's bridge address.
//!
//! The node running the leader pod holds the control-plane FIP; it is powered off (link down,
//! every process on it killed): the other pod takes the Lease over and moves the FIP.
//!
//! Secured by default: from the lab host, a pod's plain admin port (9590, the probes' loopback)
//! refuses the connection; its metrics port (9592, HTTPS) answers 401 without a token, 403 to a
//! service account without the reader role, and Prometheus's service account gets the metrics.
//! The API key is in no command line, pod log or Event of the run.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // a scenario reads best as one story

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use baton_cloud::Cloud as _;
use baton_cloud::model::ServerId;
use baton_sim::{Faults, Topology};
use baton_testbed::{ControlPlane, Options, lab};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

/// The simulator's server ids of cp-0, cp-1, cp-2.
const CP: [u64; 3] = [600_101, 600_102, 600_103];

fn server_of(node: &str) -> u64 {
    CP[node.trim_start_matches("cp-").parse::<usize>().unwrap()]
}

/// (pod, node) of the baton pods that are Running and Ready.
async fn ready_pods(client: &kube::Client) -> Vec<(String, String)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let Ok(list) = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=baton"))
        .await
    else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .map(|p| {
            (
                p.metadata.name.unwrap_or_default(),
                p.spec.and_then(|s| s.node_name).unwrap_or_default(),
            )
        })
        .collect()
}

async fn lease_holder(client: &kube::Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), "kube-system")
        .get_opt("baton-controller")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[test]
fn the_other_pod_moves_the_fip_when_the_leader_pods_node_dies() {
    lab::run(|| async {
        let started = tokio::time::Instant::now();
        let mut cp = ControlPlane::start(Options {
            kubelets: true,
            images: vec![baton_testbed::baton_image().expect("baton's image (scripts/build-image)")],
            ..Options::servers(3)
        })
        .await
        .expect("control plane with lab nodes");
        eprintln!(
            "lab nodes {:?} Ready in {:.1}s",
            cp.node_names(),
            started.elapsed().as_secs_f64()
        );
        let sim = common::routed_sim(Faults::none(), Topology::default()).await;
        let (cloud, fip) = common::control_plane_fip(&sim, ("cluster", "pods-cp"), CP[0]).await;
        let fip_addr = SocketAddr::new(fip.address, 6443);

        // What the handoff applies: the shipped RBAC and Deployment, and the cloud Secret.
        let admin = cp.client(0).unwrap();
        common::apply_rbac_and_cloud_secret(&admin, &sim, "cluster=pods-cp").await;
        let applied = tokio::time::Instant::now();
        common::apply_shipped_manifests(&admin, &["agent.yaml", "deployment.yaml"]).await;

        let ready_by = tokio::time::Instant::now() + Duration::from_secs(120);
        let pods = loop {
            let p = ready_pods(&admin).await;
            if p.len() == 2 {
                break p;
            }
            if tokio::time::Instant::now() > ready_by {
                let mut logs = String::new();
                for (p, text) in common::pod_logs(&cp) {
                    let _ = std::fmt::Write::write_fmt(
                        &mut logs,
                        format_args!("==> {} <==\n{text}\n", p.display()),
                    );
                }
                panic!("two baton pods not Ready in 120 s (Ready: {p:?}); pod logs:\n{logs}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        eprintln!(
            "baton pods Ready {:.1}s after the Deployment was applied: {pods:?}",
            applied.elapsed().as_secs_f64()
        );
        let leader = common::eventually(Duration::from_secs(30), "a pod holding the Lease", || async {
            lease_holder(&admin)
                .await
                .filter(|h| pods.iter().any(|(p, _)| p == h))
        })
        .await;
        let leader_node = pods.iter().find(|(p, _)| *p == leader).unwrap().1.clone();
        let (other, other_node) = pods.iter().find(|(p, _)| *p != leader).unwrap().clone();
        eprintln!("leader {leader} on {leader_node}; standby {other} on {other_node}");

        // Secured by default, seen from the lab host: the probes' port on each node's loopback
        // only; metrics over HTTPS for Prometheus's service account alone.
        let prometheus = common::metrics_scraper(&admin, "default", "prometheus", true).await;
        let nosy = common::metrics_scraper(&admin, "default", "nosy", false).await;
        for (_, node) in &pods {
            let ip = cp.addresses()[cp.apiserver_of_node(node).unwrap()];
            common::assert_admin_endpoints_secured(ip, (9590, 9592), (&prometheus, &nosy), "baton_leader")
                .await;
        }

        // The FIP on the leader's node (the operator routes it there; the controller keeps a
        // healthy holder), answering through the FIP.
        cloud
            .retarget_ip(&fip.id, ServerId(server_of(&leader_node)))
            .await
            .unwrap();
        common::wait_for("/readyz through the FIP", Duration::from_secs(30), || {
            common::readyz(cp.ca_der(), fip_addr)
        })
        .await;
        let seq = sim.log(0).last().map_or(0, |e| e.seq + 1);
        // A move the controller did not make is kept: the holder answers, and the leader (on
        // that node) reaches it through the FIP once its agent learns the new holder.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            cloud.ip(&fip.id).await.unwrap().target(),
            Some(ServerId(server_of(&leader_node))),
            "the controller kept the FIP on the healthy node it was moved to"
        );
        assert!(
            !sim.log(seq)
                .iter()
                .any(|e| e.method == "PUT" && e.path.starts_with("/v1/ips/")),
            "no retarget of a healthy holder"
        );

        // Power the leader's node off.
        let t0 = tokio::time::Instant::now();
        cp.kill_node(&leader_node).await.unwrap();
        let survivor = cp.apiserver_of_node(&other_node).unwrap();
        let client = cp.client(survivor).unwrap();
        let target = common::eventually(
            Duration::from_secs(60),
            "the FIP routed away from the dead node, answering",
            || async {
                let ip = cloud.ip(&fip.id).await.ok()?;
                let t = ip.target()?.0;
                (t != server_of(&leader_node) && common::readyz(cp.ca_der(), fip_addr).await).then_some(t)
            },
        )
        .await;
        let failover_s = t0.elapsed().as_secs_f64();
        let holder = lease_holder(&client).await;
        eprintln!(
            "FIP moved to server {target} and answers {failover_s:.2}s after {leader_node} died; Lease held by {holder:?}"
        );
        assert_eq!(holder.as_deref(), Some(other.as_str()), "the other pod took over");
        // The move was written by the other pod (its identity is in every cloud request's
        // User-Agent), never by the dead leader.
        let moves: Vec<_> = sim
            .log(seq)
            .into_iter()
            .filter(|e| e.method == "PUT" && e.path.starts_with("/v1/ips/") && e.status < 300)
            .collect();
        assert!(!moves.is_empty(), "a retarget after the node died");
        for m in &moves {
            assert!(
                m.user_agent.contains(&other),
                "the move came from {other}: {}",
                m.user_agent
            );
        }
        assert!(
            CP.contains(&target) && target != server_of(&leader_node),
            "moved to a live control-plane node: {target}"
        );
        // Both pods ran with their real service account and the shipped RBAC: each started,
        // nothing was forbidden, no secret and no colour codes in their logs (the dead node's
        // log files stay on its disk).
        common::assert_pod_logs_clean(&cp, "baton controller starting", 2, sim.api_key());
        common::assert_secret_not_in_process_table_or_events(&client, sim.api_key()).await;
    });
}

/// Reads `blobs/sha256/<digest>` of an unpacked OCI layout as JSON.
fn blob_json(layout: &std::path::Path, digest: &str) -> serde_json::Value {
    let hex = digest.strip_prefix("sha256:").unwrap();
    serde_json::from_slice(&std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap()).unwrap()
}

/// The image the pods run, read as a registry or containerd reads it: one layer holding the
/// static binary and the passwd/group naming the non-root user, `USER 65532:65532`, the binary
/// as entrypoint, the OCI labels with the version and the source revision.
#[test]
fn the_image_is_from_scratch_non_root_and_labelled() {
    let image = baton_testbed::baton_image().expect("baton's image (scripts/build-image)");
    let layout = tempfile::tempdir().unwrap();
    let untar = std::process::Command::new("tar")
        .arg("-xf")
        .arg(&image.archive)
        .arg("-C")
        .arg(layout.path())
        .status()
        .unwrap();
    assert!(untar.success());
    let index = serde_json::from_slice::<serde_json::Value>(
        &std::fs::read(layout.path().join("index.json")).unwrap(),
    )
    .unwrap();
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "{index:#}");
    let manifest = blob_json(layout.path(), manifests[0]["digest"].as_str().unwrap());
    let config = blob_json(layout.path(), manifest["config"]["digest"].as_str().unwrap());
    assert_eq!(config["config"]["User"], "65532:65532", "{config:#}");
    assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/baton"]));
    let labels = &config["config"]["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    let revision = labels["org.opencontainers.image.revision"].as_str().unwrap();
    assert!(
        revision.trim_end_matches("-dirty").len() == 40
            && revision
                .trim_end_matches("-dirty")
                .bytes()
                .all(|b| b.is_ascii_hexdigit()),
        "the source revision: {revision}"
    );
    // From scratch: one layer, three files.
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest:#}");
    let hex = layers[0]["digest"]
        .as_str()
        .unwrap()
        .strip_prefix("sha256:")
        .unwrap();
    let list = std::process::Command::new("tar")
        .arg("-tvzf")
        .arg(layout.path().join("blobs/sha256").join(hex))
        .output()
        .unwrap();
    let listing = String::from_utf8(list.stdout).unwrap();
    let files: Vec<&str> = listing
        .lines()
        .filter(|l| !l.starts_with('d'))
        .map(|l| l.split_whitespace().last().unwrap())
        .collect();
    assert_eq!(files, ["baton", "etc/group", "etc/passwd"], "{listing}");
    assert!(
        listing
            .lines()
            .all(|l| l.split_whitespace().nth(1) == Some("0/0")),
        "root-owned: {listing}"
    );
}
