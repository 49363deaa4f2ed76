//! The shipped RBAC, against a real API server that writes an audit log:
//!
//! - `kubectl auth can-i --list` (the real kubectl, from scripts/testenv) for baton's service
//!   accounts shows no `delete` outside the objects baton creates (or took over by name), and
//!   none at all on Nodes unless the opt-in `rbac-node-lifecycle.yaml` is applied;
//! - `baton controller` (two replicas) and `baton sni serve` run as those service accounts
//!   through every code path that needs a permission (mirror, CCM leftover, Service FIP and its
//!   release, node initialisation and deletion, BGP and MetalLB objects, the Lease and a
//!   takeover, Events and their series, the authenticated metrics endpoints), and every verb of
//!   every rule bound to them must appear in the audit log as used and allowed: a rule no code
//!   path needs fails the test, and so does any denial;
//! - the metrics endpoints refuse a scrape without a token (401) or with a token not allowed to
//!   get /metrics (403), and let Prometheus's service account in (bound to the shipped
//!   ClusterRole baton-metrics-reader).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // test code

mod common;
mod metallb;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use baton_sim::{Faults, Topology};
use baton_testbed::{ControlPlane, Options, lab};
use common::{eventually, ingress, lb_service, namespace};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, Service, ServiceAccount};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

const WAIT: Duration = Duration::from_secs(90);
const FIP_TAG: &str = "cluster=rbac-cp";
const CONTROLLER_METRICS: &str = "127.0.0.1:19592";
const SNI_METRICS: &str = "127.0.0.1:19593";
/// cloud-provider-cherry's mirror Service, replaced by baton's.
const CCM_MIRROR: &str = "cloud-provider-cherry-kubernetes-external";

fn manifest(file: &str) -> Vec<Value> {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests").join(file)).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// A token of `namespace/name` from the API server (TokenRequest, as a pod's projected token).
async fn sa_token(admin: &kube::Client, namespace: &str, name: &str) -> String {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token for {namespace}/{name}: {e}"))
        .status
        .unwrap()
        .token
}

async fn apply(admin: &kube::Client, doc: Value) {
    let objects = baton::bootstrap::config::parse_manifests(
        Path::new("test.yaml"),
        &serde_yaml_ng::to_string(&doc).unwrap(),
    )
    .unwrap();
    baton::bootstrap::steps::apply_manifests(admin, &objects)
        .await
        .unwrap();
}

/// The rows of `kubectl auth can-i --list` for `token` in `ns`: (resource, resource names,
/// verbs); non-resource URL rows are left out.
fn can_i_list(cp: &ControlPlane, token: &str, ns: &str) -> Vec<(String, Vec<String>, Vec<String>)> {
    let kubectl = baton_testbed::control_plane::testenv_dir()
        .unwrap()
        .join("bin/kubectl");
    let kubeconfig = cp.write_kubeconfig(0, token).unwrap();
    let out = std::process::Command::new(kubectl)
        .args([
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "auth",
            "can-i",
            "--list",
            "--namespace",
            ns,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut rows = Vec::new();
    for line in text.lines().skip(1) {
        let Some((resource, rest)) = line.trim().split_once(char::is_whitespace) else {
            continue;
        };
        // Three bracketed lists: non-resource URLs, resource names, verbs.
        let lists: Vec<Vec<String>> = rest
            .split(']')
            .filter_map(|part| part.split_once('['))
            .map(|(_, inner)| inner.split_whitespace().map(str::to_owned).collect())
            .collect();
        if lists.len() == 3 && !resource.is_empty() {
            rows.push((resource.to_owned(), lists[1].clone(), lists[2].clone()));
        }
    }
    assert!(!rows.is_empty(), "no rows in:\n{text}");
    rows
}

/// `(resource, names)` the row allows deleting (`*` counts).
fn deletes(rows: &[(String, Vec<String>, Vec<String>)]) -> BTreeSet<(String, Vec<String>)> {
    rows.iter()
        .filter(|(_, _, verbs)| {
            verbs
                .iter()
                .any(|v| v == "delete" || v == "*" || v == "deletecollection")
        })
        .map(|(r, names, _)| (r.clone(), names.clone()))
        .collect()
}

fn row(resource: &str, names: &[&str]) -> (String, Vec<String>) {
    (
        resource.to_owned(),
        names.iter().map(|n| (*n).to_owned()).collect(),
    )
}

/// `curl -sk` (the certificate is self-signed) of `url`: (status, body).
async fn scrape(url: &str, token: Option<&str>) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "--max-time", "5", "-w", "\n%{http_code}"]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = cmd.arg(url).output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn baton(args: &[&str], env: &BTreeMap<String, String>, log: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(args)
        .envs(env)
        .env("BATON_LOG", "info,baton=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The audit log's record of what a code path did: (user, verb, API group, resource[/sub],
/// namespace, name, status code).
#[derive(Debug, Clone)]
struct Used {
    user: String,
    verb: String,
    group: String,
    resource: String,
    namespace: String,
    name: String,
    code: i64,
}

fn used(cp: &ControlPlane) -> Vec<Used> {
    cp.audit_events()
        .unwrap()
        .into_iter()
        // A watch is logged when it starts (ResponseStarted) and again when it ends.
        .filter_map(|e| {
            let o = e.get("objectRef")?;
            let sub = o["subresource"]
                .as_str()
                .map(|s| format!("/{s}"))
                .unwrap_or_default();
            Some(Used {
                user: e["user"]["username"].as_str()?.to_owned(),
                verb: e["verb"].as_str()?.to_owned(),
                group: o["apiGroup"].as_str().unwrap_or_default().to_owned(),
                resource: format!("{}{sub}", o["resource"].as_str()?),
                namespace: o["namespace"].as_str().unwrap_or_default().to_owned(),
                name: o["name"].as_str().unwrap_or_default().to_owned(),
                code: e["responseStatus"]["code"].as_i64().unwrap_or(0),
            })
        })
        .collect()
}

/// Every (role, group, resource, verb) of the shipped rules bound to `users` that no audit
/// record shows used: the role's namespace (a RoleBinding's) must match, and its resourceNames
/// the object's name (list and watch name their object by a field selector). A create is also
/// used by a server-side apply that made the object (a patch answered 201).
fn unused_rules(docs: &[Value], users: &BTreeMap<&str, &str>, log: &[Used]) -> Vec<String> {
    let mut unused = Vec::new();
    for binding in docs
        .iter()
        .filter(|d| d["kind"] == "RoleBinding" || d["kind"] == "ClusterRoleBinding")
    {
        for subject in binding["subjects"].as_array().into_iter().flatten() {
            let Some(user) = users.get(subject["name"].as_str().unwrap_or_default()) else {
                continue;
            };
            let role_ref = &binding["roleRef"];
            let role = docs
                .iter()
                .find(|d| {
                    d["kind"] == role_ref["kind"]
                        && d["metadata"]["name"] == role_ref["name"]
                        && (d["kind"] == "ClusterRole"
                            || d["metadata"]["namespace"] == binding["metadata"]["namespace"])
                })
                .unwrap_or_else(|| panic!("{binding} names a role the manifests do not ship"));
            let scope = binding["metadata"]["namespace"].as_str();
            for rule in role["rules"].as_array().unwrap() {
                let strings = |k: &str| -> Vec<String> {
                    rule[k]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                };
                assert!(
                    strings("nonResourceURLs").is_empty(),
                    "no non-resource rule is bound to baton: {rule}"
                );
                let names = strings("resourceNames");
                for group in strings("apiGroups") {
                    for resource in strings("resources") {
                        for verb in strings("verbs") {
                            let hit = log.iter().any(|u| {
                                u.user == *user
                                    && u.code != 403
                                    && (u.verb == verb
                                        || (verb == "create" && u.verb == "patch" && u.code == 201))
                                    && u.group == group
                                    && u.resource == resource
                                    && scope.is_none_or(|ns| u.namespace == ns)
                                    && (names.is_empty()
                                        || names.contains(&u.name)
                                        || matches!(u.verb.as_str(), "list" | "watch"))
                            });
                            if !hit {
                                unused.push(format!(
                                    "{} {}: {verb} {group}/{resource}{}{}",
                                    role["kind"].as_str().unwrap(),
                                    role["metadata"]["name"].as_str().unwrap(),
                                    if names.is_empty() {
                                        String::new()
                                    } else {
                                        format!(" {names:?}")
                                    },
                                    scope.map(|ns| format!(" in {ns}")).unwrap_or_default()
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    unused
}

#[test]
fn the_shipped_rbac_allows_no_stray_delete_and_every_verb_is_used() {
    lab::run(|| async {
        baton_testbed::init_tracing();
        let cp = ControlPlane::start(Options {
            audit: true,
            ..Options::servers(1)
        })
        .await
        .unwrap();
        let admin = cp.client(0).unwrap();
        metallb::install_crds(&admin).await;
        for ns in ["metallb-system", "apps", "tenants"] {
            namespace(&admin, ns).await;
        }
        common::apply_shipped_manifests(
            &admin,
            &["rbac.yaml", "rbac-metallb.yaml", "sni-router.yaml", "agent.yaml"],
        )
        .await;
        let baton_token = sa_token(&admin, "kube-system", "baton").await;
        let sni_token = sa_token(&admin, "kube-system", "baton-sni").await;
        let agent_token = sa_token(&admin, "kube-system", "baton-agent").await;

        // ---- The default install: no delete outside what baton creates, none on Nodes. ----
        let baton_deletes: BTreeMap<&str, BTreeSet<(String, Vec<String>)>> = [
            (
                "kube-system",
                BTreeSet::from([
                    // baton's own mirror slices (and the CCM leftover mirror's, which it replaces)
                    row("endpointslices.discovery.k8s.io", &[]),
                    row("services", &[CCM_MIRROR]),
                    row("endpoints", &[CCM_MIRROR]),
                ]),
            ),
            (
                "metallb-system",
                BTreeSet::from([
                    row("bgpadvertisements.metallb.io", &[]),
                    row("bgppeers.metallb.io", &[]),
                    row("ipaddresspools.metallb.io", &[]),
                ]),
            ),
            ("default", BTreeSet::new()),
            ("apps", BTreeSet::new()),
        ]
        .into_iter()
        .collect();
        for (ns, want) in &baton_deletes {
            let rows = can_i_list(&cp, &baton_token, ns);
            assert_eq!(&deletes(&rows), want, "baton may delete in {ns}: {rows:#?}");
            assert!(
                !rows.iter().any(|(r, _, _)| r == "*.*" || r == "*"),
                "a wildcard in {ns}: {rows:#?}"
            );
            let sni = can_i_list(&cp, &sni_token, ns);
            assert!(deletes(&sni).is_empty(), "baton-sni may delete in {ns}: {sni:#?}");
            let agent = can_i_list(&cp, &agent_token, ns);
            assert!(
                deletes(&agent).is_empty(),
                "baton-agent may delete in {ns}: {agent:#?}"
            );
        }

        // ---- The opt-in: deleting Nodes. ----
        common::apply_shipped_manifests(&admin, &["rbac-node-lifecycle.yaml"]).await;
        let rows = can_i_list(&cp, &baton_token, "default");
        assert_eq!(deletes(&rows), BTreeSet::from([row("nodes", &[])]), "{rows:#?}");

        // Prometheus's service account, bound to the shipped reader role; and one that is not.
        for name in ["prometheus", "nosy"] {
            apply(
                &admin,
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": "apps"}}),
            )
            .await;
        }
        apply(
            &admin,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": "prometheus-baton-metrics"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "baton-metrics-reader"},
                   "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "apps"}]}),
        )
        .await;
        let prometheus = sa_token(&admin, "apps", "prometheus").await;
        let nosy = sa_token(&admin, "apps", "nosy").await;

        // ---- The world the code paths act on. ----
        let sim = common::sim(Faults::none(), Topology::default()).await;
        let (_cloud, fip) = common::control_plane_fip(&sim, ("cluster", "rbac-cp"), 600_101).await;
        // cloud-provider-cherry's leftover mirror of that FIP, with its Endpoints and slice.
        apply(
            &admin,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": CCM_MIRROR, "namespace": "kube-system"},
                   "spec": {"type": "LoadBalancer", "loadBalancerIP": fip.address.to_string(), "ports": [{"port": 6443}]}}),
        )
        .await;
        apply(
            &admin,
            json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": CCM_MIRROR, "namespace": "kube-system"},
                   "subsets": [{"addresses": [{"ip": "198.51.100.11"}], "ports": [{"port": 6443}]}]}),
        )
        .await;
        // A mirror slice of baton's whose source is gone: baton deletes it.
        apply(
            &admin,
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                   "metadata": {"name": "baton-kubernetes-external-stale", "namespace": "kube-system",
                                "labels": {"kubernetes.io/service-name": "baton-kubernetes-external",
                                           "endpointslice.kubernetes.io/managed-by": "controller.baton.dev"}},
                   "addressType": "IPv4", "endpoints": [], "ports": []}),
        )
        .await;
        // Nodes: cp-0 to initialise (found by host name), cp-1 initialised, ghost's server gone.
        let nodes: Api<Node> = Api::all(admin.clone());
        for (name, provider, taint) in [
            ("cp-0", None, true),
            ("cp-1", Some("cherryservers://600102"), false),
            ("ghost", Some("cherryservers://999999"), false),
        ] {
            let taints = if taint {
                json!([{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}])
            } else {
                json!([])
            };
            apply(
                &admin,
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                       "spec": {"providerID": provider, "taints": taints}}),
            )
            .await;
        }
        let apps: Api<Service> = Api::namespaced(admin.clone(), "apps");
        let pp = PostParams::default();
        apps.create(&pp, &lb_service("apps", "web", &[])).await.unwrap();

        // ---- Two controller replicas and the SNI router, as baton's service accounts. ----
        let logs = tempfile::tempdir().unwrap();
        let kubeconfig = cp.write_kubeconfig(0, &baton_token).unwrap();
        let mut env = common::env_for(
            &sim,
            &[
                ("CHERRY_FIP_TAG", FIP_TAG),
                ("CHERRY_REGION_NAME", "LT-Siauliai"),
                (
                    "CHERRY_LOAD_BALANCER",
                    "metallb:///metallb-system/?bgp-peer-mode=native",
                ),
                // Which namespaces may ask for an address, by their labels: the Namespace
                // watch (every namespace carries this label).
                (
                    "BATON_SERVICE_ALLOCATION_NAMESPACE_SELECTOR",
                    "kubernetes.io/metadata.name",
                ),
            ],
        );
        env.insert("KUBECONFIG".into(), kubeconfig.display().to_string());
        let mut replica_a = baton(
            &[
                "controller",
                "--identity",
                "replica-a",
                "--admin-listen",
                "off",
                "--metrics-listen",
                CONTROLLER_METRICS,
            ],
            &env,
            &logs.path().join("a.log"),
        );
        let lease_held = || async {
            Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(admin.clone(), "kube-system")
                .get_opt("baton-controller")
                .await
                .unwrap()
                .and_then(|l| l.spec?.holder_identity)
        };
        eventually(WAIT, "replica-a leads", || async {
            (lease_held().await.as_deref() == Some("replica-a")).then_some(())
        })
        .await;
        let _replica_b = baton(
            &["controller", "--identity", "replica-b", "--admin-listen", "off"],
            &env,
            &logs.path().join("b.log"),
        );
        let sni_kubeconfig = cp.write_kubeconfig(0, &sni_token).unwrap();
        let _sni = baton(
            &[
                "sni",
                "serve",
                "--services",
                // The tenants' namespace, allowed by the operator (else their Services are
                // ignored and no Event is written).
                "--tenant-namespace",
                "tenants=baton.test",
                "--listen",
                "127.0.0.1:18443",
                "--kubeconfig",
                sni_kubeconfig.to_str().unwrap(),
                "--metrics-listen",
                SNI_METRICS,
            ],
            &BTreeMap::new(),
            &logs.path().join("sni.log"),
        );
        // The node agent with its own service account (its nftables table lands in this lab's
        // namespace, which is private to the test).
        let agent_kubeconfig = cp.write_kubeconfig(0, &agent_token).unwrap();
        let _agent = baton(
            &[
                "agent",
                "--kubeconfig",
                agent_kubeconfig.to_str().unwrap(),
                "--health-listen",
                "off",
            ],
            &BTreeMap::new(),
            &logs.path().join("agent.log"),
        );

        // The mirror Service and its endpoints; the CCM leftover and the stale slice go.
        let kube_system: Api<Service> = Api::namespaced(admin.clone(), "kube-system");
        eventually(WAIT, "baton's mirror shows the FIP", || async {
            kube_system
                .get_opt("baton-kubernetes-external")
                .await
                .unwrap()
                .filter(|s| ingress(s).is_some())
        })
        .await;
        eventually(WAIT, "the CCM leftover and the stale slice deleted", || async {
            let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
                Api::namespaced(admin.clone(), "kube-system");
            (kube_system.get_opt(CCM_MIRROR).await.unwrap().is_none()
                && slices
                    .get_opt("baton-kubernetes-external-stale")
                    .await
                    .unwrap()
                    .is_none())
            .then_some(())
        })
        .await;
        // The Service FIP, its MetalLB pool; node initialisation and BGP peers.
        eventually(WAIT, "web's ingress", || async {
            apps.get_opt("web").await.unwrap().and_then(|s| ingress(&s))
        })
        .await;
        eventually(WAIT, "web's pool", || async {
            metallb::objects(
                &admin,
                "metallb-system",
                baton::controller::bgp::Kind::IpAddressPool,
            )
            .await
            .contains_key("apps.web")
            .then_some(())
        })
        .await;
        // A Node goes: its BGP peers go.
        let peers = || async {
            metallb::objects(&admin, "metallb-system", baton::controller::bgp::Kind::BgpPeer)
                .await
                .keys()
                .cloned()
                .collect::<Vec<String>>()
        };
        eventually(WAIT, "cp-1's BGP peers", || async {
            peers().await.iter().any(|p| p.starts_with("cp-1-")).then_some(())
        })
        .await;
        nodes.delete("cp-1", &DeleteParams::default()).await.unwrap();
        eventually(WAIT, "cp-1's BGP peers deleted", || async {
            (!peers().await.iter().any(|p| p.starts_with("cp-1-"))).then_some(())
        })
        .await;
        eventually(WAIT, "cp-0 initialised", || async {
            nodes
                .get_opt("cp-0")
                .await
                .unwrap()
                .filter(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_ref()).is_some())
        })
        .await;
        // The SNI router's tenants: three Services claiming one host, the oldest wins (an Event
        // on both Services of each conflict); the winner goes, and the newest conflicts with the
        // next one; it stops claiming the host and claims it again: the same Event on the same
        // pair, counted into its series (a patch).
        let tenants: Api<Service> = Api::namespaced(admin.clone(), "tenants");
        for name in ["a-first", "b-second", "c-third"] {
            // A tenant's API servers: a ClusterIP Service (no FIP of its own).
            let mut svc = lb_service("tenants", name, &[("baton.dev/sni-hosts", "api.t1.baton.test")]);
            svc.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
            tenants.create(&pp, &svc).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        tenants.delete("a-first", &DeleteParams::default()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        for hosts in [Value::Null, json!("api.t1.baton.test")] {
            let claim = json!({"metadata": {"annotations": {"baton.dev/sni-hosts": hosts}}});
            tenants
                .patch("c-third", &PatchParams::default(), &Patch::Merge(&claim))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_secs(2)).await;
        }

        // ---- The authenticated metrics endpoints. ----
        for base in [CONTROLLER_METRICS, SNI_METRICS] {
            let url = format!("https://{base}/metrics");
            let (code, _) = scrape(&url, None).await;
            assert_eq!(code, 401, "{url} without a token");
            let (code, _) = scrape(&url, Some("not-a-token")).await;
            assert_eq!(code, 401, "{url} with a token the API server does not know");
            let (code, _) = scrape(&url, Some(&nosy)).await;
            assert_eq!(code, 403, "{url} for a service account without the reader role");
            let (code, body) = scrape(&url, Some(&prometheus)).await;
            assert_eq!(code, 200, "{url} for Prometheus: {body}");
            assert!(body.contains("# TYPE"), "{url}: {body}");
        }

        // ---- Release at once (asked), the pool goes; the leader dies, the follower takes over. ----
        let at_once = json!({"metadata": {"annotations": {"baton.dev/fip-release-grace-period": "0"}}});
        apps.patch("web", &PatchParams::default(), &Patch::Merge(&at_once))
            .await
            .unwrap();
        apps.delete("web", &DeleteParams::default()).await.unwrap();
        eventually(WAIT, "web gone, its pool and the advertisement too", || async {
            use baton::controller::bgp::Kind;
            (apps.get_opt("web").await.unwrap().is_none()
                && !metallb::objects(&admin, "metallb-system", Kind::IpAddressPool)
                    .await
                    .contains_key("apps.web")
                && metallb::objects(&admin, "metallb-system", Kind::BgpAdvertisement)
                    .await
                    .is_empty())
            .then_some(())
        })
        .await;
        replica_a.start_kill().unwrap();
        let _ = replica_a.wait().await;
        eventually(WAIT, "replica-b leads", || async {
            (lease_held().await.as_deref() == Some("replica-b")).then_some(())
        })
        .await;
        // ghost's server is gone: deleted once reads across a minute agree.
        eventually(3 * WAIT, "ghost deleted", || async {
            nodes.get_opt("ghost").await.unwrap().is_none().then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;

        // ---- Every verb bound to baton's service accounts was used, none denied. ----
        let log = used(&cp);
        let users = BTreeMap::from([
            ("baton", "system:serviceaccount:kube-system:baton"),
            ("baton-sni", "system:serviceaccount:kube-system:baton-sni"),
            ("baton-agent", "system:serviceaccount:kube-system:baton-agent"),
        ]);
        let denied: Vec<&Used> = log
            .iter()
            .filter(|u| users.values().any(|n| *n == u.user) && u.code == 403)
            .collect();
        assert!(
            denied.is_empty(),
            "requests of baton's service accounts denied: {denied:#?}"
        );
        let docs: Vec<Value> = [
            "rbac.yaml",
            "rbac-metallb.yaml",
            "rbac-node-lifecycle.yaml",
            "sni-router.yaml",
            "agent.yaml",
        ]
        .iter()
        .flat_map(|f| manifest(f))
        .collect();
        let unused = unused_rules(&docs, &users, &log);
        let logs_text: String = ["a.log", "b.log", "sni.log", "agent.log"]
            .iter()
            .map(|f| std::fs::read_to_string(logs.path().join(f)).unwrap_or_default())
            .collect();
        assert!(
            unused.is_empty(),
            "shipped rules no code path used (remove them, or exercise them here):\n{}\n\nlogs:\n{logs_text}",
            unused.join("\n")
        );
        let names: BTreeSet<String> = nodes
            .list(&kube::api::ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        assert_eq!(names, BTreeSet::from(["cp-0".to_owned()]));
    });
}
