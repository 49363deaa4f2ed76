//! Shared by the Service / node controller tests and the Service benchmark: a simulator, a
//! configuration pointing at it, Services, and waits.
#![allow(dead_code, unreachable_pub)] // each test binary uses a subset

pub mod coldstart;
pub mod helm;
pub mod leases;
pub mod node;
pub mod pod;
pub mod routed;
pub mod web;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use baton::config::{Config, ConfigArgs};
use baton::controller::Context;
use baton_cloud::model::{IpAddress, IpType};
use baton_cloud::{CherryClient, Cloud as _};
use baton_sim::{Faults, Sim, SimHandle, Topology};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;

/// The configuration environment for a controller talking to `sim`. FIPs no longer wanted are
/// released at once (`BATON_FIP_RELEASE_GRACE_PERIOD=0`, as the benchmarks run): the tests of the
/// grace period set their own.
pub fn env_for(sim: &SimHandle, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = [
        ("CHERRY_API_KEY", sim.api_key().to_owned()),
        ("CHERRY_PROJECT_ID", sim.project_id().to_string()),
        ("CHERRY_BASE_URL", sim.base_url().to_string()),
        ("CHERRY_LOAD_BALANCER", "metallb:///".to_owned()),
        ("BATON_API_RATE_LIMIT", "0".to_owned()),
        ("BATON_FIP_RELEASE_GRACE_PERIOD", "0".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for (k, v) in extra {
        env.insert((*k).to_owned(), (*v).to_owned());
    }
    env
}

/// `topology` with the simulator splicing TCP on a targeted FIP's port 6443 to its holder: the
/// explicit opt-in of tests whose lab has no nodes (one network namespace, every address local),
/// where no node could accept a routed FIP. Tests with lab nodes route FIPs instead
/// ([`baton_sim::SimBuilder::route_fips`]).
pub fn spliced(topology: Topology) -> Topology {
    Topology {
        forward_ports: vec![6443],
        ..topology
    }
}

/// A simulator for a lab with nodes: on the lab host's bridge address (where the nodes reach
/// it), routing every targeted FIP to its holder as the cloud does.
pub async fn routed_sim(faults: Faults, topology: Topology) -> SimHandle {
    Sim::builder()
        .topology(topology)
        .faults(faults)
        .route_fips(baton_testbed::node::BRIDGE)
        .bind(std::net::SocketAddr::new(baton_testbed::node::LAB_HOST, 0))
        .await
        .expect("simulator")
}

/// [`routed_sim`] speaking Hetzner Cloud's API with `settings`.
pub async fn routed_hetzner_sim(settings: baton_sim::HetznerSettings, faults: Faults) -> SimHandle {
    Sim::builder()
        .cloud(baton_cloud::CloudKind::Hetzner)
        .hetzner(settings)
        .faults(faults)
        .route_fips(baton_testbed::node::BRIDGE)
        .bind(std::net::SocketAddr::new(baton_testbed::node::LAB_HOST, 0))
        .await
        .expect("simulator")
}

/// A simulator on loopback.
pub async fn sim(faults: Faults, topology: Topology) -> SimHandle {
    Sim::builder()
        .topology(topology)
        .faults(faults)
        .bind("127.0.0.1:0".parse().unwrap())
        .await
        .expect("simulator")
}

/// A controller context for `client` and `env`.
pub async fn context(client: kube::Client, env: &BTreeMap<String, String>) -> Arc<Context> {
    let config = Config::resolve(&ConfigArgs::default(), env).expect("config");
    let cloud = CherryClient::new(config.cloud_client_config().unwrap()).unwrap();
    Arc::new(
        Context::unelected(client, Arc::new(cloud), Arc::new(config))
            .await
            .expect("context"),
    )
}

/// A client with no cache shared with the controller: the simulator's truth.
pub async fn cloud_ips(sim: &SimHandle) -> Vec<IpAddress> {
    baton_cloud::model::each_ip(&unlimited_client(sim).ips().await.unwrap())
        .cloned()
        .collect()
}

/// The FIPs baton made for Services (usage tag).
pub async fn service_fips(sim: &SimHandle) -> Vec<IpAddress> {
    cloud_ips(sim).await.into_iter().filter(is_service_fip).collect()
}

/// Whether `ip` is a FIP baton made for a Service (its usage tag).
pub fn is_service_fip(ip: &IpAddress) -> bool {
    ip.ip_type == IpType::FloatingIp
        && ip.tags.get("usage").map(String::as_str) == Some("cloud-provider-cherry-auto")
}

/// The UID of namespace `kube-system`: the `cluster` tag of this cluster's FIPs.
pub async fn cluster_uid(client: &kube::Client) -> String {
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .expect("namespace kube-system")
        .metadata
        .uid
        .expect("its uid")
}

/// A FIP reserved in the project before the test, at `address` (in the simulator's FIP range),
/// carrying `tags`, not routed: with `cluster=<kube-system UID>` this cluster's, one an operator
/// reserved for its Services to ask for.
pub fn reserved_fip(address: &str, tags: &[(&str, &str)]) -> baton_sim::TopoFip {
    baton_sim::TopoFip {
        address: Some(address.parse().expect("an IPv4 address")),
        region: "LT-Siauliai".into(),
        tags: tags
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..baton_sim::TopoFip::default()
    }
}

/// The Warning Events on Service `ns/name`: their reasons and notes.
pub async fn service_warnings(client: &kube::Client, ns: &str, name: &str) -> Vec<(String, String)> {
    Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default())
        .await
        .expect("Events")
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some("Service")
                && e.involved_object.name.as_deref() == Some(name)
                && e.type_.as_deref() == Some("Warning")
        })
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

/// A Service of type LoadBalancer.
pub fn lb_service(ns: &str, name: &str, annotations: &[(&str, &str)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            annotations: (!annotations.is_empty()).then(|| {
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            }),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                port: 80,
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// Creates a namespace.
pub async fn namespace(client: &kube::Client, name: &str) {
    let ns = k8s_openapi::api::core::v1::Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Default::default()
    };
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
}

/// The first ingress IP of a Service.
pub fn ingress(svc: &Service) -> Option<String> {
    svc.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .ip
        .clone()
}

/// Polls `check` every 200 ms until it returns `Some`, or panics after `timeout` with `what`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll(timeout, Duration::from_millis(200), what, &String::new, check).await
}

/// Polls `check` every 100 ms until it gives a value; fails after `timeout` with `what` and
/// `diag()` (the logs that say why).
pub async fn within<T, F, Fut>(timeout: Duration, what: &str, diag: &dyn Fn() -> String, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll(timeout, Duration::from_millis(100), what, diag, check).await
}

async fn poll<T, F, Fut>(
    timeout: Duration,
    every: Duration,
    what: &str,
    diag: &dyn Fn() -> String,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out ({timeout:?}) waiting for {what}\n{}",
            diag()
        );
        tokio::time::sleep(every).await;
    }
}

/// What the handoff applies before the Deployment: the shipped `manifests/rbac.yaml` and the
/// cloud Secret of `manifests/secret.yaml` (`cherry-cloud-config`) filled in for `sim`, with
/// `fip_tag` naming the control-plane FIP and no client rate limit.
pub async fn apply_rbac_and_cloud_secret(client: &kube::Client, sim: &SimHandle, fip_tag: &str) {
    apply_rbac_and_cloud_config(client, sim, &serde_json::json!({"fipTag": fip_tag})).await;
}

/// [`apply_rbac_and_cloud_secret`] with the keys of `extra` (an object) in `cloud-sa.json`
/// instead of `fipTag` (e.g. `{"loadbalancer": "metallb:///"}`).
///
/// On a Hetzner simulator: `cloud: hetzner` and the endpoint in `cloud-sa.json`, the token in
/// hcloud-cloud-controller-manager's Secret `hcloud` (key `token`), as docs/hetzner.md installs it.
pub async fn apply_rbac_and_cloud_config(client: &kube::Client, sim: &SimHandle, extra: &serde_json::Value) {
    use k8s_openapi::api::core::v1::Secret;
    let mut cloud_sa = match sim.cloud() {
        baton_cloud::CloudKind::Cherry => serde_json::json!({
            "apiKey": sim.api_key(),
            "projectID": sim.project_id(),
            "region": "LT-Siauliai",
            "base-url": sim.base_url().as_str(),
            "apiRateLimit": 0,
        }),
        baton_cloud::CloudKind::Hetzner => {
            let hcloud: Secret = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "hcloud", "namespace": "kube-system"},
                "stringData": {"token": sim.api_key()},
            }))
            .unwrap();
            Api::<Secret>::namespaced(client.clone(), "kube-system")
                .create(&PostParams::default(), &hcloud)
                .await
                .unwrap();
            serde_json::json!({
                "cloud": "hetzner",
                "hcloudEndpoint": format!("{}v1", sim.base_url()),
                "region": "fsn1",
            })
        }
    };
    for (k, v) in extra.as_object().into_iter().flatten() {
        cloud_sa[k] = v.clone();
    }
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cherry-cloud-config", "namespace": "kube-system"},
        "stringData": {"cloud-sa.json": cloud_sa.to_string()},
    }))
    .unwrap();
    apply_shipped_manifests(client, &["rbac.yaml"]).await;
    Api::<Secret>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

/// Applies `manifests/<file>` for each of `files` (every document, in order) the way the
/// bootstrap's handoff applies manifests: `baton::bootstrap::steps::apply_manifests`.
pub async fn apply_shipped_manifests(client: &kube::Client, files: &[&str]) {
    for file in files {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("manifests")
            .join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let objects = baton::bootstrap::config::parse_manifests(&path, &text).unwrap();
        baton::bootstrap::steps::apply_manifests(client, &objects)
            .await
            .unwrap_or_else(|e| panic!("applying {}: {e}", path.display()));
    }
}

/// A client of `sim` without a rate limit (the test's view of the cloud), in the simulator's
/// dialect.
pub fn unlimited_client(sim: &SimHandle) -> CherryClient {
    let mut cfg = match sim.cloud() {
        baton_cloud::CloudKind::Cherry => {
            baton_cloud::ClientConfig::new(baton_core::Secret::new(sim.api_key()), sim.project_id())
        }
        baton_cloud::CloudKind::Hetzner => {
            baton_cloud::ClientConfig::hetzner(baton_core::Secret::new(sim.api_key()))
        }
    }
    .with_base_url(sim.base_url());
    cfg.requests_per_second = None;
    cfg.action_poll = std::time::Duration::from_millis(20);
    CherryClient::new(cfg).unwrap()
}

/// The user's reserved control-plane FIP: created in LT-Siauliai, tagged `key=value` (the
/// `fipTag`), routed to `server`. Returns it with the client that made it.
pub async fn control_plane_fip(sim: &SimHandle, tag: (&str, &str), server: u64) -> (CherryClient, IpAddress) {
    let cloud = unlimited_client(sim);
    let fip = cloud
        .create_ip(baton_cloud::model::CreateIpRequest {
            region: match sim.cloud() {
                baton_cloud::CloudKind::Cherry => "LT-Siauliai".into(),
                baton_cloud::CloudKind::Hetzner => "fsn1".into(),
            },
            tags: baton_cloud::model::Tags::from([(tag.0.to_owned(), tag.1.to_owned())]),
            ..Default::default()
        })
        .await
        .unwrap();
    cloud
        .retarget_ip(&fip.id, baton_cloud::model::ServerId(server))
        .await
        .unwrap();
    (cloud, fip)
}

/// One API server plus kube-controller-manager (namespace, GC, EndpointSlice controllers), in
/// the current lab, and an admin client of it.
pub async fn control_plane_with_controllers() -> (baton_testbed::ControlPlane, kube::Client) {
    let cp = baton_testbed::ControlPlane::start(baton_testbed::Options {
        controller_manager: true,
        ..baton_testbed::Options::servers(1)
    })
    .await
    .unwrap();
    let client = cp.client(0).unwrap();
    (cp, client)
}

/// Waits until `f` holds, looking every 50 ms; fails naming `what` after `timeout`.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `https://<addr>/readyz` answers 2xx within 500 ms (certificate verified against `ca`).
/// Whether baton's mirror Service `kube-system/baton-kubernetes-external` shows an ingress.
pub async fn mirror_has_ingress(client: &kube::Client) -> bool {
    Api::<Service>::namespaced(client.clone(), "kube-system")
        .get_opt("baton-kubernetes-external")
        .await
        .ok()
        .flatten()
        .and_then(|s| s.status?.load_balancer?.ingress)
        .is_some_and(|i| !i.is_empty())
}

/// `GET https://<addr>/readyz` on a new connection (500 ms at most) answered 2xx.
pub async fn readyz(ca: &[u8], addr: std::net::SocketAddr) -> bool {
    readyz_why(ca, addr).await.is_ok()
}

/// [`readyz`], saying why not: the status, or the error and its causes, and after how long.
pub async fn readyz_why(ca: &[u8], addr: std::net::SocketAddr) -> Result<(), String> {
    let client = baton_testbed::http_client(Some(ca)).map_err(|e| e.to_string())?;
    let started = std::time::Instant::now();
    let answer = client
        .get(format!("https://{addr}/readyz"))
        .timeout(Duration::from_millis(500))
        .send()
        .await;
    let ms = started.elapsed().as_millis();
    match answer {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("status {} after {ms} ms", r.status())),
        Err(e) => {
            let mut why = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                why = format!("{why}: {cause}");
                source = cause.source();
            }
            Err(format!("{why} after {ms} ms"))
        }
    }
}

/// Wall-clock milliseconds since the Unix epoch (the simulator's `unix_ms`, a Lease's times).
pub fn unix_ms() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Registers Nodes cp-0, cp-1, … with the provider IDs of the simulator's servers `ids` (then
/// only Nodes are failover candidates).
pub async fn register_cp_nodes(client: &kube::Client, ids: &[u64]) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for (i, id) in ids.iter().enumerate() {
        let node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("cp-{i}"), "labels": {"node-role.kubernetes.io/control-plane": ""}},
            "spec": {"providerID": format!("cherryservers://{id}")}
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
}

/// The sum of the samples of metric `name` (every label set) in a Prometheus text exposition;
/// `None` when it has no sample. `name` may carry labels (`baton_x_total{a="b"}`) to pick one
/// series.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| {
            l.starts_with(name)
                && (name.ends_with('}') || matches!(l.as_bytes().get(name.len()), Some(b'{' | b' ')))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Every container log of the lab nodes' pods (`<node>/pod-logs/**.log`), each headed by its path.
pub fn pod_logs(cp: &baton_testbed::ControlPlane) -> Vec<(std::path::PathBuf, String)> {
    fn walk(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, String)>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "log") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                out.push((p, text));
            }
        }
    }
    let mut out = Vec::new();
    for n in cp.node_names() {
        walk(&cp.dir().join(&n).join("pod-logs"), &mut out);
    }
    out
}

/// The baton pods' logs (at least `pods` of them with `start_line`, e.g. the controller's
/// "baton controller starting") show the shipped RBAC is enough for their real service account
/// (no `forbidden`), carry no `secret`, and are plain text (no ANSI colour: a pod's log is not
/// a terminal).
pub fn assert_pod_logs_clean(cp: &baton_testbed::ControlPlane, start_line: &str, pods: usize, secret: &str) {
    use std::fmt::Write as _;
    let logs: Vec<(std::path::PathBuf, String)> = pod_logs(cp)
        .into_iter()
        .filter(|(_, text)| text.contains(start_line))
        .collect();
    let mut all = String::new();
    for (p, text) in &logs {
        let _ = writeln!(all, "==> {} <==\n{text}", p.display());
    }
    assert!(
        logs.len() >= pods,
        "{} container logs with {start_line:?}, expected {pods}:\n{all}",
        logs.len()
    );
    assert!(!all.contains(secret), "the API key leaked into the pods' logs");
    assert!(
        !all.to_lowercase().contains("forbidden"),
        "the shipped RBAC is not enough for the pods' service account:\n{all}"
    );
    assert!(!all.contains('\u{1b}'), "ANSI escapes in a pod's log:\n{all}");
}

/// A token of ServiceAccount `namespace/name`, issued by the API server (TokenRequest, as the
/// kubelet gets a pod's projected token).
pub async fn service_account_token(admin: &kube::Client, namespace: &str, name: &str) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token for {namespace}/{name}: {e}"))
        .status
        .unwrap()
        .token
}

/// A ServiceAccount `namespace/name`, bound to the shipped ClusterRole `baton-metrics-reader`
/// when `reader` (Prometheus's, as docs/operations.md says to bind it); its token.
pub async fn metrics_scraper(admin: &kube::Client, namespace: &str, name: &str, reader: bool) -> String {
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": namespace}}))
            .unwrap();
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    if reader {
        let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("{name}-baton-metrics")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "baton-metrics-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        }))
        .unwrap();
        Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin.clone())
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
    }
    service_account_token(admin, namespace, name).await
}

/// `curl -sk` (baton's metrics certificate is self-signed) of `url` with an optional bearer
/// token, from this lab host: `Err(exit code)` when no HTTP answer came (7: refused), else the
/// status and the body.
pub async fn curl(url: &str, token: Option<&str>) -> Result<(u16, String), i32> {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-sk", "--max-time", "5", "-w", "\n%{http_code}"]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = cmd.arg(url).output().await.unwrap();
    if !out.status.success() {
        return Err(out.status.code().unwrap_or(-1));
    }
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    Ok((code.trim().parse().unwrap_or(0), body.to_owned()))
}

/// From this lab host, the admin endpoints of a host-network pod on `node`: the plain port
/// (`plain`, loopback only) refuses the connection; the authenticated HTTPS port (`secure`)
/// answers 401 without a token, 403 for `denied`'s token, and its metrics for `allowed`'s
/// (Prometheus's) token, which must contain `metric`.
pub async fn assert_admin_endpoints_secured(
    node: std::net::IpAddr,
    (plain, secure): (u16, u16),
    (allowed, denied): (&str, &str),
    metric: &str,
) {
    let open = curl(&format!("http://{node}:{plain}/metrics"), None).await;
    assert_eq!(
        open,
        Err(7),
        "http://{node}:{plain}/metrics from a lab host must be refused"
    );
    let url = format!("https://{node}:{secure}/metrics");
    let (code, _) = curl(&url, None).await.unwrap();
    assert_eq!(code, 401, "{url} without a token");
    let (code, _) = curl(&url, Some(denied)).await.unwrap();
    assert_eq!(
        code, 403,
        "{url} for a service account not bound to baton-metrics-reader"
    );
    let (code, body) = curl(&url, Some(allowed)).await.unwrap();
    assert_eq!(code, 200, "{url} for Prometheus's service account: {body}");
    assert!(body.contains(metric), "{url}: no {metric} in\n{body}");
}

/// `secret` is nowhere in the process table (every process's command line, as `ps` shows it
/// to any local user) nor in any Event's note or message, in any namespace.
pub async fn assert_secret_not_in_process_table_or_events(client: &kube::Client, secret: &str) {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            assert!(
                !cmdline.contains(secret),
                "the API key is on a command line ({}): {cmdline}",
                entry.path().display()
            );
        }
    }
    let events = Api::<k8s_openapi::api::events::v1::Event>::all(client.clone())
        .list(&kube::api::ListParams::default())
        .await
        .unwrap();
    assert!(!events.items.is_empty(), "a full run publishes Events");
    for e in &events.items {
        let text = serde_json::to_string(e).unwrap();
        assert!(!text.contains(secret), "the API key in an Event: {text}");
    }
}
