//! The installers' differences that reach baton's pods (docs/installers.md).
//!
//! - k3s and RKE2 label control-plane nodes `node-role.kubernetes.io/control-plane: "true"` (and
//!   `master`, `etcd`: "true"), kubeadm and Talos `""`: lab nodes with real kubelets (containerd +
//!   runc), relabelled the k3s/RKE2 way, get the shipped Deployment's and DaemonSet's pods
//!   Running and Ready (baton's image from `scripts/build-image`, the Hetzner simulator as the
//!   cloud); a Deployment that selects the label's value `""`, as baton's manifests did before,
//!   stays Pending there.
//! - The k3s/RKE2 `HelmChart` of `installers/k3s/` carries values the chart renders as the
//!   guide says (real Helm; k3s's helm-controller itself is not run here).
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // a scenario reads best as one story

mod common;

use std::path::Path;
use std::time::Duration;

use baton_sim::{Faults, HetznerSettings};
use baton_testbed::{ControlPlane, Options, lab};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde::Deserialize as _;
use serde_json::{Value, json};

const CP: [u64; 2] = [600_101, 600_102];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// (name, node, ready) of the pods labelled `app.kubernetes.io/name=<app>` in kube-system.
async fn pods(client: &kube::Client, app: &str) -> Vec<(String, String, bool)> {
    let Ok(list) = Api::<Pod>::namespaced(client.clone(), "kube-system")
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={app}")))
        .await
    else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .map(|p| {
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            (
                p.metadata.name.unwrap_or_default(),
                p.spec.and_then(|s| s.node_name).unwrap_or_default(),
                ready,
            )
        })
        .collect()
}

#[test]
fn k3s_and_rke2_control_plane_labels_get_batons_pods_running() {
    lab::run(|| async {
        let started = tokio::time::Instant::now();
        let cp = ControlPlane::start(Options {
            kubelets: true,
            images: vec![baton_testbed::baton_image().expect("baton's image (scripts/build-image)")],
            ..Options::servers(2)
        })
        .await
        .expect("control plane with lab nodes");
        eprintln!(
            "lab nodes {:?} Ready in {:.1}s",
            cp.node_names(),
            started.elapsed().as_secs_f64()
        );
        let admin = cp.client(0).unwrap();

        // Label the nodes as k3s and RKE2 servers are labelled.
        let nodes: Api<Node> = Api::all(admin.clone());
        let k3s = json!({"metadata": {"labels": {
            "node-role.kubernetes.io/control-plane": "true",
            "node-role.kubernetes.io/master": "true",
            "node-role.kubernetes.io/etcd": "true",
        }}});
        for name in cp.node_names() {
            nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&k3s))
                .await
                .unwrap();
        }
        for name in cp.node_names() {
            let labels = nodes.get(&name).await.unwrap().metadata.labels.unwrap();
            assert_eq!(
                labels
                    .get("node-role.kubernetes.io/control-plane")
                    .map(String::as_str),
                Some("true")
            );
        }

        // baton on Hetzner Cloud, as the k3s/RKE2 guide installs it: the token in the Secret
        // hcloud, the settings in cherry-cloud-config, the shipped manifests.
        let sim = common::routed_hetzner_sim(HetznerSettings::default(), Faults::none()).await;
        let (_cloud, _fip) = common::control_plane_fip(&sim, ("cluster", "k3s-api"), CP[0]).await;
        common::apply_rbac_and_cloud_config(&admin, &sim, &json!({"fipTag": "cluster=k3s-api"})).await;
        let applied = tokio::time::Instant::now();
        common::apply_shipped_manifests(&admin, &["agent.yaml", "deployment.yaml"]).await;

        // The selector of baton's manifests before: `control-plane: ""`, which no k3s node has.
        let mut old: Deployment = serde_json::from_value(
            serde_yaml_ng::Deserializer::from_str(
                &std::fs::read_to_string(root().join("manifests/deployment.yaml")).unwrap(),
            )
            .map(|d| Value::deserialize(d).unwrap())
            .find(|d| d["kind"] == "Deployment")
            .unwrap(),
        )
        .unwrap();
        old.metadata.name = Some("baton-value-selector".into());
        let spec = old.spec.as_mut().unwrap();
        let labels = std::collections::BTreeMap::from([(
            "app.kubernetes.io/name".to_owned(),
            "baton-value-selector".to_owned(),
        )]);
        spec.selector.match_labels = Some(labels.clone());
        spec.replicas = Some(1);
        let pod = spec.template.spec.as_mut().unwrap();
        spec.template.metadata.as_mut().unwrap().labels = Some(labels);
        pod.affinity = None;
        pod.node_selector = Some(std::collections::BTreeMap::from([(
            "node-role.kubernetes.io/control-plane".to_owned(),
            String::new(),
        )]));
        Api::<Deployment>::namespaced(admin.clone(), "kube-system")
            .create(&PostParams::default(), &old)
            .await
            .unwrap();

        let diag = || {
            common::pod_logs(&cp)
                .into_iter()
                .map(|(p, text)| format!("==> {} <==\n{text}", p.display()))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let controllers = common::within(
            Duration::from_secs(180),
            "two baton pods Ready",
            &diag,
            || async {
                let p = pods(&admin, "baton").await;
                (p.iter().filter(|(_, _, ready)| *ready).count() == 2).then_some(p)
            },
        )
        .await;
        eprintln!(
            "baton pods Ready {:.1}s after the manifests were applied: {controllers:?}",
            applied.elapsed().as_secs_f64()
        );
        let mut on: Vec<&str> = controllers.iter().map(|(_, n, _)| n.as_str()).collect();
        on.sort_unstable();
        assert_eq!(on, ["cp-0", "cp-1"], "one replica per control-plane node");
        let agents = common::within(
            Duration::from_secs(60),
            "an agent pod Ready on each node",
            &diag,
            || async {
                let p = pods(&admin, "baton-agent").await;
                (p.iter().filter(|(_, _, ready)| *ready).count() == 2).then_some(p)
            },
        )
        .await;
        eprintln!("agent pods Ready: {agents:?}");

        // The old selector's pod: not scheduled, because no node matches it.
        let pending = pods(&admin, "baton-value-selector").await;
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert!(
            pending[0].1.is_empty() && !pending[0].2,
            "the value selector schedules nowhere on k3s nodes: {pending:?}"
        );
        let reason = Api::<Pod>::namespaced(admin.clone(), "kube-system")
            .get(&pending[0].0)
            .await
            .unwrap()
            .status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled")
            .map(|c| {
                (
                    c.status,
                    c.reason.unwrap_or_default(),
                    c.message.unwrap_or_default(),
                )
            });
        eprintln!("the value selector's pod: {reason:?}");
        assert!(
            reason.as_ref().is_some_and(|(s, r, m)| s == "False"
                && r == "Unschedulable"
                && m.contains("node affinity/selector")),
            "{reason:?}"
        );
        common::assert_pod_logs_clean(&cp, "baton controller starting", 2, sim.api_key());
    });
}

#[test]
fn the_k3s_helmchart_values_render_the_chart_as_the_guide_says() {
    let text = std::fs::read_to_string(root().join("installers/k3s/baton-helmchart.yaml")).unwrap();
    let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect();
    let chart = docs
        .iter()
        .find(|d| d["kind"] == "HelmChart")
        .expect("a HelmChart");
    assert_eq!(chart["apiVersion"], "helm.cattle.io/v1");
    assert_eq!(chart["metadata"]["namespace"], "kube-system");
    assert_eq!(chart["spec"]["targetNamespace"], "kube-system");
    let values = chart["spec"]["valuesContent"].as_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).unwrap();

    let helm = common::helm::Helm::new();
    helm.ok(&[
        "lint",
        "--strict",
        "charts/baton",
        "--values",
        file.to_str().unwrap(),
    ]);
    let rendered: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&helm.ok(&[
        "template",
        "baton",
        "charts/baton",
        "--namespace",
        "kube-system",
        "--values",
        file.to_str().unwrap(),
    ]))
    .map(|d| Value::deserialize(d).unwrap())
    .filter(|v| !v.is_null())
    .collect();
    let find = |kind: &str, name: &str| {
        rendered
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    // Every control-plane node, whatever the label's value (k3s's "true").
    let term = json!([{"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}]);
    for (kind, name) in [("Deployment", "baton"), ("DaemonSet", "baton-agent")] {
        let pod = &find(kind, name)["spec"]["template"]["spec"];
        assert_eq!(
            pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
            term,
            "{kind} {name}"
        );
        assert!(pod.get("nodeSelector").is_none(), "{kind} {name}: {pod}");
    }
    // Hetzner Cloud: the token from the Secret hcloud, no API key rendered anywhere.
    let env = find("Deployment", "baton")["spec"]["template"]["spec"]["containers"][0]["env"].clone();
    assert!(
        env.as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "HCLOUD_TOKEN" && e["valueFrom"]["secretKeyRef"]["name"] == "hcloud"),
        "{env}"
    );
    assert!(
        env.as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "BATON_CLOUD" && e["value"] == "hetzner"),
        "{env}"
    );
    let secret = find("Secret", "cherry-cloud-config");
    let cloud_sa: Value =
        serde_json::from_str(secret["stringData"]["cloud-sa.json"].as_str().unwrap()).unwrap();
    assert_eq!(cloud_sa["fipTag"], "cluster=prod-api", "{cloud_sa}");
    assert!(cloud_sa.get("apiKey").is_none(), "{cloud_sa}");
}
