//! The Helm chart (`charts/baton`) with real Helm, built from its Go module by
//! `scripts/helm-env` (scripts/setup runs it): `helm lint`; what `helm template` renders equals
//! the kustomize manifests (`manifests/`: RBAC, Deployment, Secret format, the agent's and the
//! SNI router's objects), so neither drifts;
//! the rendered objects pass a server-side dry-run on a real API server; and `helm install`,
//! `upgrade`, `rollback` and `uninstall` against the lab's API server.
// In tests a panic is the failure report; each lab story reads best as one sequence.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::path::Path;

use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::Discovery;
use serde::Deserialize as _;
use serde_json::{Value, json};

use common::helm::Helm;

const API_KEY: &str = "chart-test-api-key-0123456789";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Helm as the chart tests run it: every call fails if the API key is printed.
struct ChartHelm(Helm);

impl ChartHelm {
    fn new() -> Self {
        Self(Helm::new())
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        self.0.run(args)
    }

    fn ok(&self, args: &[&str]) -> String {
        self.0.ok_keeping(args, Some(API_KEY))
    }

    /// `helm template baton charts/baton -n kube-system <args>` as objects.
    fn template(&self, args: &[&str]) -> Vec<Value> {
        let mut all = vec!["template", "baton", "charts/baton", "--namespace", "kube-system"];
        all.extend_from_slice(args);
        yaml_docs(&self.ok(&all))
    }
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn manifest(file: &str) -> Vec<Value> {
    yaml_docs(&std::fs::read_to_string(root().join("manifests").join(file)).unwrap())
}

/// `kind/namespace/name`.
fn key(v: &Value) -> String {
    format!(
        "{}/{}/{}",
        v["kind"].as_str().unwrap_or_default(),
        v["metadata"]["namespace"].as_str().unwrap_or_default(),
        v["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// The object without what Helm adds for its own bookkeeping (labels) and without comments'
/// absence of meaning: everything else must be equal.
fn without_labels(mut v: Value) -> Value {
    if let Some(meta) = v["metadata"].as_object_mut() {
        meta.remove("labels");
    }
    v
}

/// `v` with every container's image replaced: the manifests name a local build, the chart the
/// release's tag.
fn without_image(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(cs) = v["spec"]["template"]["spec"]["containers"].as_array_mut() {
        for c in cs {
            c["image"] = json!("<image>");
        }
    }
    v
}

/// The chart's objects and the shipped ones are the same objects (kind, namespace, name) with
/// the same content, Helm's labels aside and `normalise`d.
fn assert_same_objects<'a>(
    chart: impl Iterator<Item = &'a Value>,
    shipped: impl IntoIterator<Item = Value>,
    what: &str,
    normalise: impl Fn(&Value) -> Value,
) {
    let mut ours: Vec<(String, Value)> = chart.map(|d| (key(d), without_labels(normalise(d)))).collect();
    let mut theirs: Vec<(String, Value)> = shipped
        .into_iter()
        .map(|d| (key(&d), without_labels(normalise(&d))))
        .collect();
    ours.sort_by(|a, b| a.0.cmp(&b.0));
    theirs.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        ours.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        theirs.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        "the same objects in charts/baton and {what}"
    );
    for ((k, chart), (_, man)) in ours.iter().zip(&theirs) {
        assert_eq!(chart, man, "{k} differs between charts/baton and {what}");
    }
}

fn find_named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

#[test]
fn chart_lints_and_renders_what_the_manifests_say() {
    let helm = ChartHelm::new();
    let set = [
        "--set",
        &format!("config.apiKey={API_KEY}"),
        "--set",
        "config.projectID=123456",
    ];
    let mut lint = vec!["lint", "--strict", "charts/baton"];
    lint.extend_from_slice(&set);
    helm.ok(&lint);

    // RBAC: the same objects and rules as manifests/rbac.yaml (+ rbac-metallb.yaml and
    // rbac-node-lifecycle.yaml on demand).
    let mut args = set.to_vec();
    args.extend_from_slice(&[
        "--set",
        "metallb.rbac=true",
        "--set",
        "nodeLifecycle.deleteNodes=true",
    ]);
    let rendered = helm.template(&args);
    let rbac_kinds = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    // The agent's own RBAC is compared with manifests/agent.yaml (below).
    let agents: Vec<String> = manifest("agent.yaml").iter().map(key).collect();
    assert_same_objects(
        rendered
            .iter()
            .filter(|d| rbac_kinds.contains(&d["kind"].as_str().unwrap_or_default()))
            .filter(|d| !agents.contains(&key(d))),
        manifest("rbac.yaml")
            .into_iter()
            .chain(manifest("rbac-metallb.yaml"))
            .chain(manifest("rbac-node-lifecycle.yaml")),
        "manifests/rbac*.yaml",
        Value::clone,
    );
    // By default no delete on Nodes (they are not baton's); endpoints are granted per namespace.
    let plain = helm.template(&set);
    assert!(
        !plain
            .iter()
            .any(|d| d["metadata"]["name"] == "baton-node-lifecycle"),
        "Node deletion is an opt-in"
    );
    // APF: the same FlowSchema and PriorityLevelConfiguration as manifests/apf.yaml, on by
    // default, none with apf.enabled=false.
    let apf_kinds = ["FlowSchema", "PriorityLevelConfiguration"];
    let is_apf = |d: &&Value| apf_kinds.contains(&d["kind"].as_str().unwrap_or_default());
    assert_same_objects(
        plain.iter().filter(is_apf),
        manifest("apf.yaml"),
        "manifests/apf.yaml",
        Value::clone,
    );
    let mut args = set.to_vec();
    args.extend_from_slice(&["--set", "apf.enabled=false"]);
    assert!(
        !helm.template(&args).iter().any(|d| is_apf(&d)),
        "apf.enabled=false still renders an APF object"
    );
    let mut args = set.to_vec();
    args.extend_from_slice(&["--set", "rbac.endpointNamespaces={openshift-kube-apiserver}"]);
    let bindings: Vec<String> = helm
        .template(&args)
        .iter()
        .filter(|d| d["kind"] == "RoleBinding" && d["metadata"]["name"] == "baton-endpoints")
        .map(|d| d["metadata"]["namespace"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(bindings, ["kube-system", "openshift-kube-apiserver"]);

    // The Deployment: the pod spec equals manifests/deployment.yaml at the default values (the
    // image aside: the manifests name a local build, the chart the release's tag).
    let rendered = helm.template(&set);
    let chart_dep = find(&rendered, "Deployment");
    let man = manifest("deployment.yaml");
    let man_dep = find(&man, "Deployment");
    assert_eq!(key(chart_dep), key(man_dep));
    assert_eq!(chart_dep["spec"]["replicas"], man_dep["spec"]["replicas"]);
    assert_eq!(chart_dep["spec"]["selector"], man_dep["spec"]["selector"]);
    assert_eq!(
        normalised(&chart_dep["spec"]["template"]["spec"]),
        normalised(&man_dep["spec"]["template"]["spec"]),
        "the pod spec differs between charts/baton and manifests/deployment.yaml"
    );
    assert_eq!(
        chart_dep["spec"]["template"]["metadata"]["labels"],
        man_dep["spec"]["template"]["metadata"]["labels"]
    );

    // The Secret: cloud-provider-cherry's format (name, key cloud-sa.json, the CCM's keys).
    let secret = find(&rendered, "Secret");
    let man_secret = manifest("secret.yaml");
    assert_eq!(key(secret), key(&man_secret[0]));
    let cloud_sa: Value =
        serde_json::from_str(secret["stringData"]["cloud-sa.json"].as_str().unwrap()).unwrap();
    assert_eq!(cloud_sa, json!({"apiKey": API_KEY, "projectID": 123_456}));
    let man_sa: Value =
        serde_json::from_str(man_secret[0]["stringData"]["cloud-sa.json"].as_str().unwrap()).unwrap();
    for k in cloud_sa.as_object().unwrap().keys() {
        assert!(
            man_sa.get(k).is_some(),
            "{k} is not a key of manifests/secret.yaml"
        );
    }
}

#[test]
fn the_sni_router_renders_what_manifests_sni_router_says_and_only_when_enabled() {
    let helm = ChartHelm::new();
    let set = [
        "--set",
        &format!("config.apiKey={API_KEY}"),
        "--set",
        "config.projectID=123456",
    ];
    let off = helm.template(&set);
    assert!(
        !off.iter().any(|d| d["metadata"]["name"] == "baton-sni"),
        "the router is off by default"
    );
    let mut args = set.to_vec();
    args.extend_from_slice(&["--set", "sniRouter.enabled=true"]);
    let on = helm.template(&args);
    let shipped = manifest("sni-router.yaml");
    let keys: Vec<String> = shipped.iter().map(key).collect();
    assert_same_objects(
        on.iter().filter(|d| keys.contains(&key(d))),
        shipped,
        "manifests/sni-router.yaml",
        without_image,
    );
    // The controller probes the routers (their port) only when they are enabled.
    let router_port = |docs: &[Value]| {
        find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "BATON_SNI_ROUTER_PORT")
            .map(|e| e["value"].clone())
    };
    assert_eq!(router_port(&off), None);
    assert_eq!(router_port(&on), Some(json!("443")));
    // A namespace, extra flags, backend networks and tenant namespaces reach the router.
    args.extend_from_slice(&[
        "--set",
        "sniRouter.namespace=tenants",
        "--set",
        "sniRouter.extraArgs={--threads,2}",
        "--set",
        "sniRouter.backendCIDRs={10.244.0.0/16,10.245.0.0/16}",
        "--set",
        "sniRouter.tenantNamespaces={t1=t1.example.com}",
    ]);
    let custom = helm.template(&args);
    let ds = find_named(&custom, "DaemonSet", "baton-sni");
    let env = &ds["spec"]["template"]["spec"]["containers"][0]["env"];
    let value = |name: &str| {
        env.as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
    };
    assert_eq!(
        value("BATON_SNI_BACKEND_CIDR"),
        Some(json!("10.244.0.0/16,10.245.0.0/16"))
    );
    assert_eq!(
        value("BATON_SNI_TENANT_NAMESPACE"),
        Some(json!("t1=t1.example.com"))
    );
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["args"],
        json!([
            "sni",
            "serve",
            "--services",
            "--namespace",
            "tenants",
            "--threads",
            "2"
        ])
    );
}

#[test]
fn the_agent_renders_what_manifests_agent_says_and_only_when_enabled() {
    let helm = ChartHelm::new();
    let set = [
        "--set",
        &format!("config.apiKey={API_KEY}"),
        "--set",
        "config.projectID=123456",
    ];
    // On by default: a control-plane node drops the FIPs' packets without it.
    let on = helm.template(&set);
    let shipped = manifest("agent.yaml");
    let keys: Vec<String> = shipped.iter().map(key).collect();
    assert_same_objects(
        on.iter().filter(|d| keys.contains(&key(d))),
        shipped,
        "manifests/agent.yaml",
        without_image,
    );
    let mut args = set.to_vec();
    args.extend_from_slice(&["--set", "agent.enabled=false"]);
    let off = helm.template(&args);
    assert!(
        !off.iter().any(|d| keys.contains(&key(d))),
        "agent.enabled=false renders none of the agent's objects"
    );

    // Static FIPs, another health port, the prefix and extra flags reach the pod.
    let mut args = set.to_vec();
    args.extend_from_slice(&[
        "--set",
        "agent.fips={203.0.113.5,203.0.113.6}",
        "--set",
        "agent.healthPort=9600",
        "--set",
        "prefix=edge",
        "--set",
        "agent.extraArgs={--recheck-interval-ms,2000}",
    ]);
    let custom = helm.template(&args);
    let c = &find_named(&custom, "DaemonSet", "baton-agent")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["args"], json!(["agent", "--recheck-interval-ms", "2000"]));
    let env = &c["env"];
    for want in [
        json!({"name": "BATON_PREFIX", "value": "edge"}),
        json!({"name": "BATON_AGENT_FIP", "value": "203.0.113.5,203.0.113.6"}),
        json!({"name": "BATON_AGENT_HEALTH_LISTEN", "value": "127.0.0.1:9600"}),
    ] {
        assert!(env.as_array().unwrap().contains(&want), "{want} not in {env}");
    }
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], 9600);
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], 9600);
}

/// The node selection of every baton pod: nodes labelled `node-role.kubernetes.io/control-plane`,
/// whatever the value.
fn control_plane_terms() -> Value {
    json!([{"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}])
}

/// Whether a pod spec's node selection (`nodeSelector` and the required node affinity) admits
/// a node with `labels`, as the scheduler decides it for the operators used here.
fn admits(pod: &Value, labels: &[(&str, &str)]) -> bool {
    let value = |k: &str| labels.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
    let selector_ok = pod["nodeSelector"]
        .as_object()
        .is_none_or(|m| m.iter().all(|(k, v)| value(k) == v.as_str()));
    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    let affinity_ok = terms.as_array().is_none_or(|terms| {
        terms.iter().any(|t| {
            t["matchExpressions"].as_array().unwrap().iter().all(|e| {
                let key = e["key"].as_str().unwrap();
                match e["operator"].as_str().unwrap() {
                    "Exists" => value(key).is_some(),
                    "DoesNotExist" => value(key).is_none(),
                    "In" => {
                        value(key).is_some_and(|v| e["values"].as_array().unwrap().iter().any(|x| x == v))
                    }
                    op => panic!("operator {op} not modelled here"),
                }
            })
        })
    });
    selector_ok && affinity_ok
}

#[test]
fn every_pod_runs_on_control_plane_nodes_whatever_the_labels_value_and_that_can_be_replaced() {
    let helm = ChartHelm::new();
    let set = [
        "--set",
        &format!("config.apiKey={API_KEY}"),
        "--set",
        "config.projectID=123456",
        "--set",
        "sniRouter.enabled=true",
    ];
    let chart = helm.template(&set);
    let workloads = [
        ("Deployment", "baton", "deployment.yaml"),
        ("DaemonSet", "baton-agent", "agent.yaml"),
        ("DaemonSet", "baton-sni", "sni-router.yaml"),
        ("DaemonSet", "baton-standby", "standby.yaml"),
    ];
    let kubeadm = [("node-role.kubernetes.io/control-plane", "")];
    let k3s = [
        ("node-role.kubernetes.io/control-plane", "true"),
        ("node-role.kubernetes.io/master", "true"),
        ("node-role.kubernetes.io/etcd", "true"),
    ];
    let worker = [("kubernetes.io/os", "linux")];
    for (kind, name, file) in workloads {
        let shipped = manifest(file);
        for (origin, pod) in [
            (
                "charts/baton",
                &find_named(&chart, kind, name)["spec"]["template"]["spec"],
            ),
            (
                file,
                &find_named(&shipped, kind, name)["spec"]["template"]["spec"],
            ),
        ] {
            assert!(
                admits(pod, &kubeadm),
                "{origin} {kind} {name}: kubeadm's and Talos's label"
            );
            assert!(
                admits(pod, &k3s),
                "{origin} {kind} {name}: k3s's and RKE2's labels"
            );
            assert!(!admits(pod, &worker), "{origin} {kind} {name}: a worker");
        }
    }

    // Control-plane nodes labelled otherwise: the chart's nodeAffinity replaces the term for
    // every pod.
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(
        &values,
        "nodeAffinity:\n  requiredDuringSchedulingIgnoredDuringExecution:\n    nodeSelectorTerms:\n      \
         - matchExpressions:\n          - {key: node-role.kubernetes.io/master, operator: Exists}\n",
    )
    .unwrap();
    let mut args = set.to_vec();
    args.extend_from_slice(&["--values", values.to_str().unwrap()]);
    let custom = helm.template(&args);
    let old = [("node-role.kubernetes.io/master", "")];
    for (kind, name, _) in workloads {
        let pod = &find_named(&custom, kind, name)["spec"]["template"]["spec"];
        assert!(admits(pod, &old), "{kind} {name}");
        assert!(!admits(pod, &kubeadm), "{kind} {name}: the replaced term is gone");
    }
    // `affinity` replaces the controller's whole affinity (as before); the DaemonSets keep theirs.
    let mut args = set.to_vec();
    let own = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "role", "operator": "In", "values": ["cp"]}]}]}}});
    let own_arg = format!("affinity={own}");
    args.extend_from_slice(&["--set-json", &own_arg]);
    let replaced = helm.template(&args);
    let dep = &find_named(&replaced, "Deployment", "baton")["spec"]["template"]["spec"];
    assert_eq!(dep["affinity"], own);
    assert!(admits(dep, &[("role", "cp")]) && !admits(dep, &k3s));
    assert!(admits(
        &find_named(&replaced, "DaemonSet", "baton-agent")["spec"]["template"]["spec"],
        &k3s
    ));
}

/// A pod spec without what differs by design between the chart and the manifests: the image (the
/// manifests name a local build, the chart the release's tag) and its pull policy.
fn normalised(pod: &Value) -> Value {
    let mut pod = pod.clone();
    for c in pod["containers"].as_array_mut().unwrap() {
        let c = c.as_object_mut().unwrap();
        c.remove("imagePullPolicy");
        c.insert("image".into(), json!("<image>"));
    }
    pod
}

/// The standby DaemonSet (the cold-start replicas) renders what manifests/standby.yaml says: the
/// same pod spec at the default values (the image aside), the Deployment's ServiceAccount and
/// Secret, its own ports; `standby.enabled=false` renders none.
#[test]
fn the_standby_replicas_render_what_manifests_standby_says_and_only_when_enabled() {
    let helm = ChartHelm::new();
    let set = [
        "--set",
        &format!("config.apiKey={API_KEY}"),
        "--set",
        "config.projectID=123456",
    ];
    let rendered = helm.template(&set);
    let chart = find_named(&rendered, "DaemonSet", "baton-standby");
    let shipped = manifest("standby.yaml");
    let man = find_named(&shipped, "DaemonSet", "baton-standby");
    assert_eq!(
        normalised(&chart["spec"]["template"]["spec"]),
        normalised(&man["spec"]["template"]["spec"]),
        "the pod spec differs between charts/baton and manifests/standby.yaml"
    );
    assert_eq!(chart["spec"]["selector"], man["spec"]["selector"]);
    let pod = &chart["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "baton");
    assert_eq!(
        pod["containers"][0]["args"],
        json!([
            "controller",
            "--standby",
            "--cloud-config",
            "/etc/cloud-sa/cloud-sa.json"
        ])
    );
    // Beside the Deployment's pod on the same host network: other ports than 9590/9592.
    let dep = &find(&rendered, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    assert_ne!(pod["containers"][0]["livenessProbe"], dep["livenessProbe"]);
    assert_ne!(pod["containers"][0]["ports"], dep["ports"]);
    let mut args = set.to_vec();
    args.extend_from_slice(&["--set", "standby.enabled=false"]);
    assert!(
        !helm
            .template(&args)
            .iter()
            .any(|d| d["metadata"]["name"] == "baton-standby"),
        "standby.enabled=false renders no standby DaemonSet"
    );
}

#[test]
fn values_of_cloud_provider_cherry_and_batons_own() {
    let helm = ChartHelm::new();
    // A cloud-provider-cherry values file, as its users have it.
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("ccm-values.yaml");
    std::fs::write(
        &values,
        format!(
            "config:\n  apiKey: {API_KEY}\n  projectID: 123456\n  region: LT-Siauliai\n  \
             loadbalancer: metallb:///metallb-system/\n  fipTag: cluster=my-cp\n  apiServerPort: 6443\n  \
             bgpNodeSelector: kubernetes.io/os=linux\nimage:\n  repository: registry.example/baton\n  tag: v9\n\
             resources:\n  limits: {{memory: 256Mi}}\nnodeSelector: {{role: cp}}\ntolerations: []\n\
             podSecurityContext: {{fsGroup: 2000}}\nenv:\n  - {{name: EXTRA, value: x}}\n\
             envFrom:\n  - configMapRef: {{name: extra}}\n\
             serviceAllocation:\n  namespaces: [apps, web]\n  namespaceSelector:\n    \
             matchLabels: {{team: web}}\n    matchExpressions:\n      \
             - {{key: tier, operator: In, values: [front, edge]}}\n      - {{key: legacy, operator: DoesNotExist}}\n"
        ),
    )
    .unwrap();
    let docs = helm.template(&[
        "--values",
        values.to_str().unwrap(),
        "--set",
        "replicas=3",
        "--set",
        "lease.duration=2s",
        "--set",
        "healthCheck.fall=5",
        "--set",
        "prefix=edge",
        "--set",
        "metrics.serviceMonitor.enabled=true",
    ]);
    let secret = find(&docs, "Secret");
    let cloud_sa: Value =
        serde_json::from_str(secret["stringData"]["cloud-sa.json"].as_str().unwrap()).unwrap();
    assert_eq!(
        cloud_sa,
        json!({"apiKey": API_KEY, "projectID": 123_456, "region": "LT-Siauliai",
               "loadbalancer": "metallb:///metallb-system/", "fipTag": "cluster=my-cp",
               "apiServerPort": 6443, "bgpNodeSelector": "kubernetes.io/os=linux"})
    );
    let dep = find(&docs, "Deployment");
    let pod = &dep["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(dep["spec"]["replicas"], 3);
    assert_eq!(c["image"], "registry.example/baton:v9");
    // Helm merges maps with the defaults: the requests stay, the limit is the user's.
    assert_eq!(
        c["resources"],
        json!({"limits": {"memory": "256Mi"}, "requests": {"cpu": "20m", "memory": "32Mi"}})
    );
    assert_eq!(
        pod["nodeSelector"],
        json!({"role": "cp"}),
        "the CCM's nodeSelector, besides the control-plane node affinity"
    );
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        control_plane_terms()
    );
    assert!(pod.get("tolerations").is_none());
    assert_eq!(pod["securityContext"], json!({"fsGroup": 2000}));
    assert_eq!(c["envFrom"], json!([{"configMapRef": {"name": "extra"}}]));
    let env: Vec<(String, String)> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?.to_owned(), e["value"].as_str()?.to_owned())))
        .collect();
    for want in [
        ("EXTRA", "x"),
        ("BATON_LEASE_DURATION", "2s"),
        ("BATON_HEALTH_CHECK_FALL", "5"),
        ("BATON_PREFIX", "edge"),
        // MetalLB's serviceAllocation shape, into the settings' string forms.
        ("BATON_SERVICE_ALLOCATION_NAMESPACES", "apps,web"),
        (
            "BATON_SERVICE_ALLOCATION_NAMESPACE_SELECTOR",
            "team=web,tier in (front,edge),!legacy",
        ),
    ] {
        assert!(
            env.contains(&(want.0.to_owned(), want.1.to_owned())),
            "{want:?} not in {env:?}"
        );
    }
    // the Lease Role follows the prefix; metrics Service and ServiceMonitor are rendered
    let role = docs
        .iter()
        .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == "baton-leader")
        .unwrap();
    assert_eq!(role["rules"][1]["resourceNames"], json!(["edge-controller"]));
    // Prometheus scrapes the authenticated HTTPS port with its token, never the loopback one.
    assert_eq!(
        find(&docs, "Service")["spec"]["ports"][0],
        json!({"name": "metrics", "port": 9592, "targetPort": "metrics", "protocol": "TCP"})
    );
    let endpoint = &find(&docs, "ServiceMonitor")["spec"]["endpoints"][0];
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(
        endpoint["bearerTokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    let probe = &c["livenessProbe"]["httpGet"];
    assert_eq!(probe["host"], "127.0.0.1", "probes on the loopback: {probe}");

    // A selector the chart cannot render fails naming the key: a typo never opens what it was
    // to restrict.
    for (bad, says) in [
        (
            "serviceAllocation.namespaceSelector.matchlabels.team=web",
            "unknown key \"matchlabels\"",
        ),
        (
            "serviceAllocation.namespaceSelector.matchExpressions[0].operator=Gt",
            "operator \"Gt\"",
        ),
    ] {
        let out = helm.run(&[
            "template",
            "baton",
            "charts/baton",
            "--set",
            &format!("config.apiKey={API_KEY}"),
            "--set",
            bad,
            "--set",
            "serviceAllocation.namespaceSelector.matchExpressions[0].key=k",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && err.contains("serviceAllocation.namespaceSelector")
                && err.contains(says),
            "{bad}: {err}"
        );
    }

    // Bad input: a clear error naming the value to set; an existing Secret needs no key.
    let out = helm.run(&["template", "baton", "charts/baton"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("config.apiKey is required"));
    let docs = helm.template(&[
        "--set",
        "configSecret.create=false",
        "--set",
        "configSecret.name=ccm-secret",
    ]);
    assert!(docs.iter().all(|d| d["kind"] != "Secret"));
    assert_eq!(
        find(&docs, "Deployment")["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"],
        "ccm-secret"
    );
}

/// Applies every object with a server-side dry-run: the API server validates and defaults it,
/// stores nothing.
async fn dry_run(client: &kube::Client, docs: &[Value]) {
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    for doc in docs {
        let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
        let types = obj.types.clone().unwrap();
        let (group, version) = types
            .api_version
            .split_once('/')
            .unwrap_or(("", types.api_version.as_str()));
        let gvk = GroupVersionKind::gvk(group, version, &types.kind);
        let (ar, caps) = discovery
            .resolve_gvk(&gvk)
            .unwrap_or_else(|| panic!("the API server does not serve {gvk:?}"));
        let api: Api<DynamicObject> = if caps.scope == kube::discovery::Scope::Namespaced {
            Api::namespaced_with(client.clone(), obj.metadata.namespace.as_deref().unwrap(), &ar)
        } else {
            Api::all_with(client.clone(), &ar)
        };
        api.patch(
            &obj.metadata.name.clone().unwrap(),
            &PatchParams::apply("baton-chart-test").dry_run(),
            &Patch::Apply(&obj),
        )
        .await
        .unwrap_or_else(|e| panic!("server-side dry-run of {}: {e}", key(doc)));
    }
}

#[test]
fn chart_installs_upgrades_rolls_back_and_uninstalls_on_a_real_api_server() {
    let helm = ChartHelm::new();
    lab::run(|| async move {
        let cp = ControlPlane::start(Options::servers(1)).await.unwrap();
        let client = cp.client(0).unwrap();
        let kubeconfig = cp.write_kubeconfig(0, ADMIN_TOKEN).unwrap();
        let kc = kubeconfig.to_str().unwrap();
        let set = [
            "--set",
            &format!("config.apiKey={API_KEY}"),
            "--set",
            "config.projectID=123456",
        ];

        // helm template | server-side dry-run (with the metrics Service and MetalLB's Role)
        let ns = k8s_openapi::api::core::v1::Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some("metallb-system".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .create(&kube::api::PostParams::default(), &ns)
            .await
            .unwrap();
        let mut args = set.to_vec();
        args.extend_from_slice(&[
            "--set",
            "metrics.service.enabled=true",
            "--set",
            "metallb.rbac=true",
        ]);
        dry_run(&client, &helm.template(&args)).await;
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), "kube-system");
        assert!(
            deployments.get_opt("baton").await.unwrap().is_none(),
            "a dry-run stores nothing"
        );

        // install
        let mut install = vec![
            "install",
            "baton",
            "charts/baton",
            "--namespace",
            "kube-system",
            "--kubeconfig",
            kc,
        ];
        install.extend_from_slice(&set);
        let notes = helm.ok(&install);
        assert!(notes.contains("STATUS: deployed"), "{notes}");
        let dep = deployments.get("baton").await.unwrap();
        assert_eq!(dep.spec.unwrap().replicas, Some(2));
        let secret = Api::<Secret>::namespaced(client.clone(), "kube-system")
            .get("cherry-cloud-config")
            .await
            .unwrap();
        let cloud_sa = secret.data.unwrap()["cloud-sa.json"].0.clone();
        let cloud_sa: Value = serde_json::from_slice(&cloud_sa).unwrap();
        assert_eq!(cloud_sa["projectID"], 123_456);
        assert!(
            Api::<ClusterRole>::all(client.clone())
                .get_opt("baton-endpoints")
                .await
                .unwrap()
                .is_some()
        );

        // upgrade
        helm.ok(&[
            "upgrade",
            "baton",
            "charts/baton",
            "--namespace",
            "kube-system",
            "--kubeconfig",
            kc,
            "--reuse-values",
            "--set",
            "replicas=3",
        ]);
        assert_eq!(
            deployments.get("baton").await.unwrap().spec.unwrap().replicas,
            Some(3)
        );

        // rollback to the first revision
        helm.ok(&[
            "rollback",
            "baton",
            "1",
            "--namespace",
            "kube-system",
            "--kubeconfig",
            kc,
        ]);
        assert_eq!(
            deployments.get("baton").await.unwrap().spec.unwrap().replicas,
            Some(2)
        );
        let history = helm.ok(&[
            "history",
            "baton",
            "--namespace",
            "kube-system",
            "--kubeconfig",
            kc,
            "-o",
            "json",
        ]);
        let history: Value = serde_json::from_str(&history).unwrap();
        assert_eq!(history.as_array().unwrap().len(), 3, "{history:#}");

        // uninstall: every object goes
        helm.ok(&[
            "uninstall",
            "baton",
            "--namespace",
            "kube-system",
            "--kubeconfig",
            kc,
            "--wait",
        ]);
        assert!(deployments.get_opt("baton").await.unwrap().is_none());
        assert!(
            Api::<ClusterRole>::all(client.clone())
                .get_opt("baton")
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            Api::<Secret>::namespaced(client.clone(), "kube-system")
                .get_opt("cherry-cloud-config")
                .await
                .unwrap()
                .is_none()
        );
    });
}

/// Metric names (`baton_…`) used in `text`, without the `_total` / `_bucket` / `_sum` /
/// `_count` suffixes of the exposition format.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("baton_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase() || bytes[end] == b'_' || bytes[end].is_ascii_digit())
        {
            end += 1;
        }
        let mut name = &text[start..end];
        for suffix in ["_total", "_bucket", "_sum", "_count"] {
            name = name.strip_suffix(suffix).unwrap_or(name);
        }
        names.insert(name.to_owned());
        i = end;
    }
    names
}

#[test]
fn alerts_and_dashboard_use_only_metrics_baton_exports() {
    let helm = ChartHelm::new();
    let docs = helm.template(&[
        "--set",
        &format!("config.apiKey={API_KEY}"),
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "grafanaDashboard.enabled=true",
    ]);
    let rule = find(&docs, "PrometheusRule");
    let alerts: Vec<&str> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    for want in [
        "BatonControlPlaneFipDown",
        "BatonNoController",
        "BatonCloudErrors",
        "BatonReconcileErrors",
        "BatonNoLeader",
        "BatonLeaderlessTooLong",
        "BatonServicesPending",
    ] {
        assert!(alerts.contains(&want), "{want} missing: {alerts:?}");
    }
    let dashboard = find(&docs, "ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value = serde_json::from_str(dashboard["data"]["baton.json"].as_str().unwrap()).unwrap();
    assert!(!json["panels"].as_array().unwrap().is_empty());

    // Every family with one sample each (an empty family is not exported at all).
    let metrics = baton::controller::metrics::Metrics::default();
    metrics.failover("holder_unhealthy", std::time::Duration::from_millis(800));
    metrics.failover_error();
    metrics.stuck("no_healthy_candidate");
    metrics.failover_fenced();
    metrics.failover_held();
    metrics.cloud_stale(false);
    metrics.set_api_reachable(true);
    metrics.reconciled("service");
    metrics.reconcile_failed("service", "no_region");
    metrics.set_task_up("services", true);
    baton::probe::ProbeObserver::observe(
        &metrics,
        "198.51.100.11:6443".parse().unwrap(),
        true,
        std::time::Duration::from_millis(3),
    );
    baton::kube::client::ApiObserver::request_failed(&metrics, "timeout");
    baton_cloud::CallObserver::attempt(
        &metrics,
        baton_cloud::Op::ListIps,
        baton_cloud::Op::ListIps.route(),
        baton_cloud::Priority::Normal,
        baton_cloud::Attempt::Status(200),
        std::time::Duration::ZERO,
    );
    metrics.set_queue_depth("services", 0);
    metrics.set_leaderless(std::time::Duration::ZERO);
    metrics.set_loop_age("endpoints", std::time::Duration::ZERO);
    let exported = metrics.encode();
    let mut used = metric_names(&serde_json::to_string(&rule["spec"]).unwrap());
    used.extend(metric_names(&json.to_string()));
    assert!(used.len() >= 8, "{used:?}");
    for name in used {
        assert!(
            exported.contains(&format!("# TYPE {name} ")),
            "{name} is used by the chart's alerts or dashboard but not exported:\n{exported}"
        );
    }
}
