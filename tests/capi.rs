//! Cluster API on Hetzner (CAPH) with baton: `installers/capi-hetzner/cluster-template.yaml`
//! rendered by the real clusterctl, then turned into a control-plane Machine's bootstrap data by
//! Cluster API's own controllers (core, the kubeadm control-plane provider and the kubeadm
//! bootstrap provider), all built from the Go module `sigs.k8s.io/cluster-api` by
//! `scripts/capi-env` (`BATON_CAPI_DIR`), against the lab's real kube-apiserver.
//!
//! CAPH itself is not served by the Go module proxy here: the test stands in for it with the
//! smallest CRDs of its kinds (`HetznerCluster`, `HCloudMachineTemplate`, `HCloudMachine`,
//! labelled for Cluster API's v1beta1 contract, as CAPH's are) and does the one thing CAPH would
//! do before the first Machine: report the `HetznerCluster` provisioned (`status.ready`) with the
//! user's `controlPlaneEndpoint` (CAPH does so with `controlPlaneLoadBalancer.enabled: false`).
//! No server is created: the bootstrap data is read, not run.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // a scenario reads best as one story

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use serde::Deserialize as _;
use serde_json::{Value, json};

const FIP: &str = "203.0.113.10";
const TOKEN: &str = "caph-test-token-0123456789";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Cluster API's binaries and CRDs: `BATON_CAPI_DIR`, else what `scripts/capi-env` built.
fn capi_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BATON_CAPI_DIR") {
        return PathBuf::from(dir);
    }
    let out = Command::new(root().join("scripts/capi-env"))
        .arg("--ready")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "Cluster API is not built: run scripts/capi-env (scripts/setup does), or set BATON_CAPI_DIR"
    );
    let out = Command::new(root().join("scripts/capi-env")).output().unwrap();
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// The variables an operator sets (docs/installers/caph.md lists them).
const VARIABLES: &[(&str, &str)] = &[
    ("CONTROL_PLANE_ENDPOINT_HOST", FIP),
    ("BATON_FIP_TAG", "cluster=prod-api"),
    ("BATON_BINARY_URL", "https://files.example.invalid/baton-0.1.0"),
    (
        "BATON_BINARY_SHA256",
        "5e0c0d5c8d1e9a3a1d38b2a2b9d25a3c5e0c0d5c8d1e9a3a1d38b2a2b9d25a3c",
    ),
    ("HCLOUD_REGION", "fsn1"),
    ("HCLOUD_SSH_KEY", "ops"),
    ("HCLOUD_IMAGE_NAME", "ubuntu-24.04-k8s"),
    ("HCLOUD_CONTROL_PLANE_MACHINE_TYPE", "cpx31"),
    ("HCLOUD_WORKER_MACHINE_TYPE", "cpx21"),
];

/// `clusterctl generate cluster prod --from <template>` as the guide runs it.
fn clusterctl(capi: &Path, home: &Path, extra: &[&str], vars: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(capi.join("bin/clusterctl"));
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .args(["generate", "cluster", "prod", "--from"])
        .arg(root().join("installers/capi-hetzner/cluster-template.yaml"))
        .args(["--target-namespace", "default"])
        .args(extra);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

#[test]
fn the_template_renders_with_clusterctl_and_names_every_variable_the_guide_lists() {
    let capi = capi_dir();
    let home = tempfile::tempdir().unwrap();
    let out = clusterctl(&capi, home.path(), &["--list-variables"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed = String::from_utf8(out.stdout).unwrap();
    let guide = std::fs::read_to_string(root().join("docs/installers/caph.md")).unwrap();
    for (name, _) in VARIABLES {
        assert!(
            listed.contains(name),
            "clusterctl does not list {name}:\n{listed}"
        );
        assert!(
            guide.contains(&format!("`{name}`")),
            "docs/installers/caph.md does not name {name}"
        );
    }

    // A variable left out is an error naming it, not a template with a hole.
    let out = clusterctl(
        &capi,
        home.path(),
        &["--kubernetes-version", "v1.35.4"],
        &VARIABLES[1..],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("CONTROL_PLANE_ENDPOINT_HOST"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = clusterctl(
        &capi,
        home.path(),
        &[
            "--kubernetes-version",
            "v1.35.4",
            "--control-plane-machine-count",
            "3",
            "--worker-machine-count",
            "2",
        ],
        VARIABLES,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let docs = yaml_docs(&String::from_utf8(out.stdout).unwrap());
    let hc = find(&docs, "HetznerCluster");
    assert_eq!(
        hc["spec"]["controlPlaneLoadBalancer"]["enabled"], false,
        "no Load Balancer"
    );
    assert_eq!(
        hc["spec"]["controlPlaneEndpoint"],
        json!({"host": FIP, "port": 6443})
    );
    assert_eq!(
        find(&docs, "Cluster")["spec"]["controlPlaneEndpoint"],
        json!({"host": FIP, "port": 6443})
    );
    let kcp = find(&docs, "KubeadmControlPlane");
    assert_eq!(kcp["spec"]["replicas"], 3);
    let pre: Vec<&str> = kcp["spec"]["kubeadmConfigSpec"]["preKubeadmCommands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let claim = pre
        .iter()
        .find(|c| c.contains("baton claim"))
        .expect("a claim step");
    assert!(claim.contains(&format!("--fip {FIP}")), "{claim}");
    assert!(
        claim.starts_with("if [ -f /run/kubeadm/kubeadm.yaml ]"),
        "{claim}"
    );
    let crs = find(&docs, "ClusterResourceSet");
    assert_eq!(
        crs["spec"]["clusterSelector"]["matchLabels"],
        find(&docs, "Cluster")["metadata"]["labels"]
    );
}

/// The smallest CRD of one of CAPH's kinds: any spec and status, Cluster API's v1beta1 contract.
fn stand_in_crd(kind: &str, plural: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{plural}.infrastructure.cluster.x-k8s.io"),
            "labels": {"cluster.x-k8s.io/v1beta1": "v1beta1", "cluster.x-k8s.io/provider": "infrastructure-hetzner"},
        },
        "spec": {
            "group": "infrastructure.cluster.x-k8s.io",
            "names": {"kind": kind, "listKind": format!("{kind}List"), "plural": plural, "singular": kind.to_lowercase()},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1beta1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            }],
        },
    })
}

/// A manager of Cluster API's on the lab host, talking to the lab's API server.
struct Manager {
    child: std::process::Child,
    log: PathBuf,
}

impl Manager {
    fn start(capi: &Path, bin: &str, kubeconfig: &Path, dir: &Path, port: u16) -> Self {
        let log = dir.join(format!("{bin}.log"));
        let child = Command::new(capi.join("bin").join(bin))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--webhook-port={port}"))
            .arg(format!("--webhook-cert-dir={}", dir.join("certs").display()))
            .arg(format!("--health-addr=127.0.0.1:{}", port + 100))
            .arg("--diagnostics-address=0")
            .arg("--leader-elect=false")
            .arg("--v=2")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Self { child, log }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn apply(client: &kube::Client, discovery: &kube::Discovery, doc: &Value, ns: Option<&str>) {
    let gvk = GroupVersionKind::try_from(&kube::api::TypeMeta {
        api_version: doc["apiVersion"].as_str().unwrap().to_owned(),
        kind: doc["kind"].as_str().unwrap().to_owned(),
    })
    .unwrap();
    let (ar, caps) = discovery
        .resolve_gvk(&gvk)
        .unwrap_or_else(|| panic!("{gvk:?} not served"));
    let api: Api<DynamicObject> = match (caps.scope, ns) {
        (kube::discovery::Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    };
    let name = doc["metadata"]["name"].as_str().unwrap();
    api.patch(name, &PatchParams::apply("capi-test").force(), &Patch::Apply(doc))
        .await
        .unwrap_or_else(|e| panic!("applying {} {name}: {e}", gvk.kind));
}

/// What the API server serves; `None` while a group it lists is not served yet (CRDs that
/// were just created).
async fn discovery(client: &kube::Client) -> Option<kube::Discovery> {
    kube::Discovery::new(client.clone()).run().await.ok()
}

#[test]
fn cluster_apis_controllers_turn_the_template_into_bootstrap_data_with_the_claim_step() {
    lab::run(|| async {
        let capi = capi_dir();
        let home = tempfile::tempdir().unwrap();
        let out = clusterctl(
            &capi,
            home.path(),
            &[
                "--kubernetes-version",
                "v1.35.4",
                "--control-plane-machine-count",
                "1",
                "--worker-machine-count",
                "0",
            ],
            VARIABLES,
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let rendered = yaml_docs(&String::from_utf8(out.stdout).unwrap());

        let cp = ControlPlane::start(Options::servers(1))
            .await
            .expect("control plane");
        let client = cp.client(0).unwrap();
        // Cluster API's CRDs, as clusterctl init would install them, and CAPH's stand-ins.
        let mut crds: Vec<Value> = Vec::new();
        let mut files: Vec<_> = std::fs::read_dir(capi.join("crds"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        for f in files {
            for mut crd in yaml_docs(&std::fs::read_to_string(f).unwrap()) {
                // The providers' contract labels, which their kustomization adds to the CRDs
                // (bootstrap/kubeadm and controlplane/kubeadm config/crd/kustomization.yaml).
                let group = crd["spec"]["group"].as_str().unwrap_or_default().to_owned();
                if group.starts_with("bootstrap.") || group.starts_with("controlplane.") {
                    crd["metadata"]["labels"] = json!({
                        "cluster.x-k8s.io/v1beta1": "v1beta1",
                        "cluster.x-k8s.io/v1beta2": "v1beta2",
                    });
                }
                crds.push(crd);
            }
        }
        crds.push(stand_in_crd("HetznerCluster", "hetznerclusters"));
        crds.push(stand_in_crd("HCloudMachineTemplate", "hcloudmachinetemplates"));
        crds.push(stand_in_crd("HCloudMachine", "hcloudmachines"));
        let d = discovery(&client).await.unwrap();
        for crd in &crds {
            apply(&client, &d, crd, None).await;
        }
        // Served once established.
        let d = common::eventually(Duration::from_secs(30), "the CRDs served", || async {
            let d = discovery(&client).await?;
            let served = [
                "infrastructure.cluster.x-k8s.io",
                "controlplane.cluster.x-k8s.io",
                "bootstrap.cluster.x-k8s.io",
            ]
            .iter()
            .all(|group| d.groups().any(|g| g.name() == *group));
            served.then_some(d)
        })
        .await;

        // CAPH's Secret in the management cluster: the project's token.
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "hetzner", "namespace": "default"},
            "stringData": {"hcloud": TOKEN},
        }))
        .unwrap();
        Api::<Secret>::namespaced(client.clone(), "default")
            .patch(
                "hetzner",
                &PatchParams::apply("capi-test"),
                &Patch::Apply(&secret),
            )
            .await
            .unwrap();

        // Cluster API's controllers (webhooks are not installed: their servers only need a
        // certificate to start).
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        std::fs::create_dir_all(&certs).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(certs.join("tls.crt"), cert.pem()).unwrap();
        std::fs::write(certs.join("tls.key"), key.serialize_pem()).unwrap();
        let kubeconfig = cp.write_kubeconfig(0, ADMIN_TOKEN).unwrap();
        let managers = [
            Manager::start(&capi, "capi-manager", &kubeconfig, dir.path(), 19443),
            Manager::start(&capi, "capi-kubeadm-bootstrap", &kubeconfig, dir.path(), 19444),
            Manager::start(
                &capi,
                "capi-kubeadm-control-plane",
                &kubeconfig,
                dir.path(),
                19445,
            ),
        ];
        let diag = || {
            managers
                .iter()
                .map(|m| format!("==> {} <==\n{}", m.log.display(), m.log_tail()))
                .collect::<Vec<_>>()
                .join("\n")
        };

        // The rendered cluster, as `kubectl apply -f prod.yaml` would create it.
        for doc in &rendered {
            apply(&client, &d, doc, Some("default")).await;
        }
        // CAPH's part: with the Load Balancer disabled it reports the HetznerCluster
        // provisioned, the user's endpoint kept.
        let hc_gvk = GroupVersionKind::gvk("infrastructure.cluster.x-k8s.io", "v1beta1", "HetznerCluster");
        let (hc_ar, _) = d.resolve_gvk(&hc_gvk).unwrap();
        let hcs: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &hc_ar);
        hcs.patch_status(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true}})),
        )
        .await
        .unwrap();

        // The first control-plane Machine's bootstrap data: a Secret named by its KubeadmConfig.
        let kc_gvk = GroupVersionKind::gvk("bootstrap.cluster.x-k8s.io", "v1beta2", "KubeadmConfig");
        let (kc_ar, _) = d.resolve_gvk(&kc_gvk).unwrap();
        let configs: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &kc_ar);
        let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
        let started = std::time::Instant::now();
        let data = common::within(
            Duration::from_secs(180),
            "the control-plane Machine's bootstrap data",
            &diag,
            || async {
                let list = configs.list(&ListParams::default()).await.ok()?;
                let name = list
                    .items
                    .iter()
                    .find_map(|c| c.data["status"]["dataSecretName"].as_str().map(str::to_owned))?;
                let secret = secrets.get_opt(&name).await.ok()??;
                let value = secret.data?.get("value")?.0.clone();
                Some(String::from_utf8(value).unwrap())
            },
        )
        .await;
        eprintln!(
            "bootstrap data of the first control-plane Machine after {:.1}s ({} bytes)",
            started.elapsed().as_secs_f64(),
            data.len()
        );

        // It is cloud-init: the files, then the claim step before `kubeadm init`.
        assert!(data.starts_with("## template: jinja\n#cloud-config"), "{data}");
        let cloud_config: Value = serde_yaml_ng::from_str(data.split_once('\n').unwrap().1).unwrap();
        let files = cloud_config["write_files"].as_array().unwrap();
        let file = |path: &str| {
            files
                .iter()
                .find(|f| f["path"] == path)
                .unwrap_or_else(|| panic!("no {path} in write_files: {cloud_config:#}"))
        };
        assert_eq!(
            file("/etc/baton/hcloud-token")["content"]
                .as_str()
                .unwrap()
                .trim(),
            TOKEN
        );
        assert_eq!(file("/etc/baton/hcloud-token")["permissions"], "0600");
        let settings: Value =
            serde_json::from_str(file("/etc/baton/cloud-sa.json")["content"].as_str().unwrap()).unwrap();
        assert_eq!(
            settings,
            json!({"cloud": "hetzner", "fipTag": "cluster=prod-api"})
        );
        file("/run/kubeadm/kubeadm.yaml"); // the init node: the claim step's guard holds
        let runcmd: Vec<String> = cloud_config["runcmd"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().map_or_else(|| c.to_string(), str::to_owned))
            .collect();
        let at = |needle: &str| {
            runcmd
                .iter()
                .position(|c| c.contains(needle))
                .unwrap_or_else(|| panic!("no {needle:?} in runcmd: {runcmd:#?}"))
        };
        let claim = at("baton claim");
        assert!(at("sha256sum -c") < claim, "the binary is checked before it runs");
        assert!(
            claim < at("kubeadm init"),
            "the FIP is claimed before kubeadm init: {runcmd:#?}"
        );
        assert!(
            runcmd[claim].contains(&format!("--fip {FIP}"))
                && runcmd[claim].contains("--cloud-config /etc/baton/cloud-sa.json"),
            "{}",
            runcmd[claim]
        );
        assert!(at("rm -f /etc/baton/hcloud-token") > at("kubeadm init"));
        // kubeadm is told the endpoint: the FIP, port 6443.
        let kubeadm = file("/run/kubeadm/kubeadm.yaml")["content"].as_str().unwrap();
        assert!(
            kubeadm.contains(&format!("controlPlaneEndpoint: {FIP}:6443")),
            "{kubeadm}"
        );
        drop(managers);
    });
}
