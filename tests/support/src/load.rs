//! A load generator that keeps an API server busy with workload-like requests from other users,
//! for tests of API Priority and Fairness ([`Options::apf`](crate::Options::apf)).
//!
//! ```text
//!  LoadGen::start(&cp, i, Load { work, users, workers, webhook_delay })
//!    ├─ namespace baton-load: a Role + RoleBinding for the load users, one object per worker
//!    ├─ [webhook_delay > 0] a slow admission webhook (HTTPS on 192.0.2.1, cluster CA), called
//!    │    by the API server for every write in baton-load: each write holds its APF seat that
//!    │    long, as behind a slow webhook in a real cluster, without burning the lab's CPU
//!    └─ `workers` tasks, closed loop, as user k = worker mod users.len() (one APF flow each):
//!         GET its object, PUT it back changed, repeat ─────────────▶ API server i
//! ```
//!
//! Where the requests land under APF is decided by the API server's own FlowSchemas, by who
//! sends them and what they touch:
//! - [`workload_users`] (ServiceAccounts of `baton-load`) → `service-accounts` → priority level
//!   `workload-low`, where a cluster's workloads are;
//! - [`kube_system_users`] (ServiceAccounts of `kube-system`) updating [`Work::Leases`] →
//!   `system-leader-election` → priority level `leader-election` (with kube-controller-manager's
//!   and kube-scheduler's), where a kube-system controller's (baton's) Lease traffic goes; their
//!   other requests go to `kube-system-service-accounts` → `workload-high`, as one flow per
//!   namespace. (Kubernetes 1.35 has no `workload-leader-election` FlowSchema any more.)
//!
//! The `system:masters` admin is exempt from APF: a test that shows queueing runs its measured
//! client as another user too. Every user here is in every control plane's token file, so
//! nothing has to be planned before [`ControlPlane::start`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::{Response, StatusCode};
use serde_json::json;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::control_plane::{ADMIN_TOKEN, ControlPlane, TokenUser};
use crate::tls_server::{self, Body};

/// The namespace of the load's objects and of the [`workload_users`].
pub const NAMESPACE: &str = "baton-load";

/// How many users of each kind every control plane knows.
pub const USERS: usize = 16;

/// The label naming the generator an object belongs to (its slow webhook selects it).
const LABEL: &str = "baton.dev/load";

/// Generators started so far in this process: the next one's id.
static NEXT_ID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// `USERS` ServiceAccount users of namespace [`NAMESPACE`] (`workload-0`…): their requests go to
/// priority level `workload-low` under APF.
pub fn workload_users() -> &'static [TokenUser] {
    static USERS_: OnceLock<Vec<TokenUser>> = OnceLock::new();
    USERS_.get_or_init(|| service_accounts(NAMESPACE, "workload"))
}

/// `USERS` ServiceAccount users of `kube-system` (`load-0`…): their Lease gets and updates go
/// to priority level `leader-election` under APF, with every kube-system controller's.
pub fn kube_system_users() -> &'static [TokenUser] {
    static USERS_: OnceLock<Vec<TokenUser>> = OnceLock::new();
    USERS_.get_or_init(|| service_accounts("kube-system", "load"))
}

/// Every load user (for the token file).
pub(crate) fn all_users<'a>() -> impl Iterator<Item = &'a TokenUser> {
    workload_users().iter().chain(kube_system_users())
}

/// Users authenticated as ServiceAccount `<prefix>-<k>` of `ns` would be (user name and groups;
/// a static token instead of a signed one).
fn service_accounts(ns: &str, prefix: &str) -> Vec<TokenUser> {
    (0..USERS)
        .map(|k| TokenUser {
            token: format!("baton-lab-{ns}-{prefix}-{k}"),
            name: format!("system:serviceaccount:{ns}:{prefix}-{k}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
            ],
        })
        .collect()
}

/// baton's ServiceAccount as its pods authenticate (the user name and groups of a projected
/// token; `token` is a static one, which the control plane must know).
pub fn baton_user(token: &str) -> TokenUser {
    TokenUser {
        token: token.to_owned(),
        name: "system:serviceaccount:kube-system:baton".into(),
        groups: vec![
            "system:serviceaccounts".into(),
            "system:serviceaccounts:kube-system".into(),
        ],
    }
}

/// One renewal of the leader Lease `kube-system/baton-controller` through API server 0 with
/// bearer `token` (GET, then PUT with a new `renewTime`, as baton's lease task renews): how long
/// it took, and the UID of the FlowSchema the API server matched the PUT with.
pub async fn renew_lease(
    cp: &ControlPlane,
    http: &reqwest::Client,
    token: &str,
) -> anyhow::Result<(Duration, String)> {
    let url = format!(
        "{}/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/baton-controller",
        cp.url(0)
    );
    let t = Instant::now();
    let mut lease: serde_json::Value = http
        .get(&url)
        .bearer_auth(token)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    lease["spec"]["renewTime"] = serde_json::to_value(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now()),
    )?;
    let resp = http
        .put(&url)
        .bearer_auth(token)
        .json(&lease)
        .send()
        .await?
        .error_for_status()?;
    let schema = resp
        .headers()
        .get("X-Kubernetes-PF-FlowSchema-UID")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    Ok((t.elapsed(), schema))
}

/// `n` [`renew_lease`]s 100 ms apart (baton renews every 200 ms): their durations, and the
/// FlowSchema UID of the last.
pub async fn lease_renewals(
    cp: &ControlPlane,
    http: &reqwest::Client,
    token: &str,
    n: usize,
) -> anyhow::Result<(Vec<Duration>, String)> {
    let mut took = Vec::with_capacity(n);
    let mut schema = String::new();
    for _ in 0..n {
        let (d, s) = renew_lease(cp, http, token).await?;
        took.push(d);
        schema = s;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((took, schema))
}

/// What the load's writes change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// A ConfigMap per worker in [`NAMESPACE`] (1 KiB of data).
    ConfigMaps,
    /// A Lease per worker in [`NAMESPACE`], renewed as a controller renews its leader lease
    /// (`GET`, then `PUT` with a new `renewTime`: the verbs FlowSchema
    /// `system-leader-election` matches).
    Leases,
}

/// A load.
#[derive(Clone, Debug)]
pub struct Load {
    /// What the writes change.
    pub work: Work,
    /// The users sending it, one APF flow each (the workers take turns).
    pub users: Vec<TokenUser>,
    /// Requests in flight at once: each worker sends its next request when the last is
    /// answered.
    pub workers: usize,
    /// How long the slow admission webhook holds each write (zero: no webhook).
    pub webhook_delay: Duration,
}

impl Default for Load {
    /// 32 workers updating ConfigMaps as the 16 [`workload_users`], each write held 200 ms by
    /// the webhook.
    fn default() -> Self {
        Self {
            work: Work::ConfigMaps,
            users: workload_users().to_vec(),
            workers: 32,
            webhook_delay: Duration::from_millis(200),
        }
    }
}

/// What the load got from the API server so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadStats {
    /// Requests answered (`GET`s and `PUT`s).
    pub requests: u64,
    /// Of those, `2xx`.
    pub ok: u64,
    /// `429 Too Many Requests`: APF rejected them (its queues were full, or they waited too
    /// long).
    pub throttled: u64,
    /// Any other answer, or none.
    pub errors: u64,
    /// The latency of every successful write, in the order they were answered.
    pub write_latencies: Vec<Duration>,
}

impl LoadStats {
    /// The `q` quantile of the successful writes' latencies (zero when there were none).
    pub fn write_quantile(&self, q: f64) -> Duration {
        quantile(&self.write_latencies, q)
    }
}

/// The `q` quantile (0..=1) of `samples` (nearest rank; zero when empty).
pub fn quantile(samples: &[Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut v = samples.to_vec();
    v.sort_unstable();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// A running load. Dropping it stops the workers and the webhook (the webhook's configuration
/// stays, with `failurePolicy: Ignore`; [`LoadGen::stop`] removes it).
pub struct LoadGen {
    id: u32,
    stats: Arc<Mutex<LoadStats>>,
    workers: JoinSet<()>,
    webhook: Option<tokio::task::JoinHandle<()>>,
    admin: kube::Client,
}

impl LoadGen {
    /// Prepares namespace [`NAMESPACE`] (RBAC for `load.users`, one object per worker, the
    /// webhook) through API server `i` as the admin, then starts the workers against API
    /// server `i`.
    pub async fn start(cp: &ControlPlane, i: usize, load: Load) -> anyhow::Result<Self> {
        if load.users.is_empty() || load.workers == 0 {
            bail!(
                "a load needs users and workers (users: {}, workers: {})",
                load.users.len(),
                load.workers
            );
        }
        let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let admin = cp.client(i)?;
        prepare(&admin, id, &load).await?;
        let webhook = if load.webhook_delay.is_zero() {
            None
        } else {
            Some(start_webhook(cp, &admin, id, load.webhook_delay).await?)
        };
        let stats = Arc::new(Mutex::new(LoadStats::default()));
        let mut workers = JoinSet::new();
        let base = cp.url(i);
        let http: Vec<reqwest::Client> = load
            .users
            .iter()
            .map(|_| crate::http_client(Some(cp.ca_der())))
            .collect::<anyhow::Result<_>>()?;
        for w in 0..load.workers {
            let k = w % load.users.len();
            let worker = Worker {
                http: http[k].clone(),
                token: load.users[k].token.clone(),
                url: object_url(&base, load.work, &object_name(id, w)),
                work: load.work,
                stats: Arc::clone(&stats),
            };
            workers.spawn(worker.run());
        }
        Ok(Self {
            id,
            stats,
            workers,
            webhook,
            admin,
        })
    }

    /// What the load got so far.
    pub fn stats(&self) -> LoadStats {
        lock(&self.stats).clone()
    }

    /// Forgets what the load got so far (e.g. after a warm-up).
    pub fn reset_stats(&self) {
        *lock(&self.stats) = LoadStats::default();
    }

    /// Stops the workers and the webhook, removes the webhook's configuration, and returns
    /// what the load got.
    pub async fn stop(mut self) -> anyhow::Result<LoadStats> {
        self.workers.shutdown().await;
        if let Some(w) = self.webhook.take() {
            let api: kube::Api<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration> =
                kube::Api::all(self.admin.clone());
            match api
                .delete(&webhook_name(self.id), &kube::api::DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e).context("deleting the slow webhook's configuration"),
            }
            w.abort();
        }
        Ok(self.stats())
    }
}

impl Drop for LoadGen {
    fn drop(&mut self) {
        self.workers.abort_all();
        if let Some(w) = &self.webhook {
            w.abort();
        }
    }
}

/// The object of worker `w` of generator `id`.
fn object_name(id: u32, w: usize) -> String {
    format!("load-{id}-{w}")
}

/// The ValidatingWebhookConfiguration of generator `id`'s slow webhook.
fn webhook_name(id: u32) -> String {
    format!("baton-load-slow-{id}")
}

/// The URL of the object `name`.
fn object_url(base: &str, work: Work, name: &str) -> String {
    match work {
        Work::ConfigMaps => format!("{base}/api/v1/namespaces/{NAMESPACE}/configmaps/{name}"),
        Work::Leases => {
            format!("{base}/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{name}")
        }
    }
}

/// The namespace, the load users' rights in it, and each worker's object.
async fn prepare(admin: &kube::Client, id: u32, load: &Load) -> anyhow::Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::{Api, Patch, PatchParams};

    let ssa = PatchParams::apply("baton-load").force();
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    namespaces
        .patch(NAMESPACE, &ssa, &Patch::Apply(&ns))
        .await
        .context("creating namespace baton-load")?;
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "baton-load", "namespace": NAMESPACE},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "update"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "update"]}
        ]
    }))?;
    Api::<Role>::namespaced(admin.clone(), NAMESPACE)
        .patch("baton-load", &ssa, &Patch::Apply(&role))
        .await
        .context("creating Role baton-load")?;
    let subjects: Vec<serde_json::Value> = all_users()
        .map(|u| json!({"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": u.name}))
        .chain(
            load.users
                .iter()
                .map(|u| json!({"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": u.name})),
        )
        .collect();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "baton-load", "namespace": NAMESPACE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "baton-load"},
        "subjects": dedup(subjects)
    }))?;
    Api::<RoleBinding>::namespaced(admin.clone(), NAMESPACE)
        .patch("baton-load", &ssa, &Patch::Apply(&binding))
        .await
        .context("creating RoleBinding baton-load")?;
    let data = "x".repeat(1024);
    for w in 0..load.workers {
        let name = object_name(id, w);
        let labels = json!({LABEL: id.to_string()});
        match load.work {
            Work::ConfigMaps => {
                let cm: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
                    "data": {"payload": data, "n": "0"}
                }))?;
                Api::<ConfigMap>::namespaced(admin.clone(), NAMESPACE)
                    .patch(&name, &ssa, &Patch::Apply(&cm))
                    .await
                    .with_context(|| format!("creating ConfigMap {name}"))?;
            }
            Work::Leases => {
                let lease: Lease = serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
                    "spec": {"holderIdentity": name, "leaseDurationSeconds": 15}
                }))?;
                Api::<Lease>::namespaced(admin.clone(), NAMESPACE)
                    .patch(&name, &ssa, &Patch::Apply(&lease))
                    .await
                    .with_context(|| format!("creating Lease {name}"))?;
            }
        }
    }
    Ok(())
}

fn dedup(mut v: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    let mut seen = std::collections::BTreeSet::new();
    v.retain(|s| seen.insert(s.to_string()));
    v
}

/// One closed-loop worker.
struct Worker {
    http: reqwest::Client,
    token: String,
    url: String,
    work: Work,
    stats: Arc<Mutex<LoadStats>>,
}

impl Worker {
    async fn run(self) {
        let mut n: u64 = 0;
        loop {
            n += 1;
            let Some(mut obj) = self.get().await else {
                // Rejected or failed: try again soon, as a client's backoff would.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            match self.work {
                Work::ConfigMaps => obj["data"]["n"] = json!(n.to_string()),
                Work::Leases => {
                    obj["spec"]["renewTime"] = micro_time_now();
                }
            }
            if !self.put(&obj).await {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    async fn get(&self) -> Option<serde_json::Value> {
        let resp = self
            .http
            .get(&self.url)
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(70))
            .send()
            .await;
        let status = resp.as_ref().ok().map(reqwest::Response::status);
        let body = match resp {
            Ok(r) if r.status().is_success() => r.json::<serde_json::Value>().await.ok(),
            _ => None,
        };
        self.count(status, body.is_some(), None);
        body
    }

    async fn put(&self, obj: &serde_json::Value) -> bool {
        let start = Instant::now();
        let resp = self
            .http
            .put(&self.url)
            .bearer_auth(&self.token)
            .json(obj)
            .timeout(Duration::from_secs(70))
            .send()
            .await;
        let status = resp.as_ref().ok().map(reqwest::Response::status);
        let ok = status.is_some_and(|s| s.is_success());
        self.count(status, ok, ok.then(|| start.elapsed()));
        ok
    }

    fn count(&self, status: Option<reqwest::StatusCode>, ok: bool, write: Option<Duration>) {
        let mut s = lock(&self.stats);
        s.requests += 1;
        if ok {
            s.ok += 1;
        } else if status == Some(reqwest::StatusCode::TOO_MANY_REQUESTS) {
            s.throttled += 1;
        } else {
            s.errors += 1;
        }
        if let Some(d) = write {
            s.write_latencies.push(d);
        }
    }
}

/// Now as a Kubernetes `MicroTime` (as a client serializes it).
fn micro_time_now() -> serde_json::Value {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ))
    .unwrap_or(serde_json::Value::Null)
}

/// Starts the slow webhook on the lab host (192.0.2.1, reachable from every API server, on a
/// lab node too) and registers it for writes of generator `id`'s ConfigMaps and Leases (by
/// label), so that generators with different delays can run side by side.
async fn start_webhook(
    cp: &ControlPlane,
    admin: &kube::Client,
    id: u32,
    delay: Duration,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use base64::Engine as _;
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use kube::api::{Api, Patch, PatchParams};

    let host = crate::node::LAB_HOST;
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(host, 0))
        .await
        .with_context(|| format!("binding the slow webhook on {host}"))?;
    let addr = listener.local_addr()?;
    let acceptor = tls_server::acceptor(cp.issue_serving_cert(&[host.to_string()])?)?;
    let task = tokio::spawn(tls_server::serve(listener, acceptor, move |req| {
        admit_slowly(req, delay)
    }));
    let config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": webhook_name(id)},
        "webhooks": [{
            "name": "slow.baton-load.baton.test",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Ignore",
            "timeoutSeconds": 30,
            "clientConfig": {
                "url": format!("https://{addr}/admit"),
                "caBundle": base64::engine::general_purpose::STANDARD.encode(cp.ca_pem()),
            },
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
            "objectSelector": {"matchLabels": {LABEL: id.to_string()}},
            "rules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                 "resources": ["configmaps"], "scope": "Namespaced"},
                {"apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"],
                 "operations": ["CREATE", "UPDATE"], "resources": ["leases"], "scope": "Namespaced"}
            ]
        }]
    }))?;
    Api::<ValidatingWebhookConfiguration>::all(admin.clone())
        .patch(
            &webhook_name(id),
            &PatchParams::apply("baton-load").force(),
            &Patch::Apply(&config),
        )
        .await
        .context("registering the slow webhook")?;
    // The API server reads webhook configurations from an informer: wait until a write is
    // held (its latency shows the webhook was called).
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    let probe_name = format!("webhook-probe-{id}");
    let deadline = Instant::now() + Duration::from_secs(30);
    for attempt in 0.. {
        // A change each time: the API server calls the webhook for every create and update.
        let probe: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": probe_name, "namespace": NAMESPACE, "labels": {LABEL: id.to_string()}},
            "data": {"n": attempt.to_string()}
        }))?;
        let start = Instant::now();
        api.patch(
            &probe_name,
            &PatchParams::apply("baton-load").force(),
            &Patch::Apply(&probe),
        )
        .await
        .context("probing the slow webhook")?;
        if start.elapsed() >= delay {
            break;
        }
        if Instant::now() > deadline {
            bail!("the API server did not call the slow webhook within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(task)
}

/// Allows the AdmissionReview in `req` after `delay`.
async fn admit_slowly(req: hyper::Request<hyper::body::Incoming>, delay: Duration) -> Response<Body> {
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return tls_server::text(StatusCode::BAD_REQUEST, &format!("reading: {e}")),
    };
    let Ok(review) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return tls_server::text(StatusCode::BAD_REQUEST, "not an AdmissionReview");
    };
    tokio::time::sleep(delay).await;
    let answer = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], "allowed": true}
    });
    let mut resp = Response::new(tls_server::full(Bytes::from(answer.to_string())));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// The API server's APF gauge or counter `metric` (e.g.
/// `apiserver_flowcontrol_current_inqueue_requests`) summed per priority level, from API
/// server `i`'s `/metrics`.
pub async fn flowcontrol_metric(
    cp: &ControlPlane,
    i: usize,
    metric: &str,
) -> anyhow::Result<BTreeMap<String, f64>> {
    let text = crate::http_client(Some(cp.ca_der()))?
        .get(format!("{}/metrics", cp.url(i)))
        .bearer_auth(ADMIN_TOKEN)
        .timeout(Duration::from_secs(10))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    Ok(sum_by_priority_level(&text, metric))
}

/// Sums the samples of `metric` in Prometheus text `text` by their `priority_level` label.
fn sum_by_priority_level(text: &str, metric: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        let Some(labels_end) = rest.strip_prefix('{').and_then(|r| r.find('}')) else {
            continue;
        };
        let labels = &rest[1..=labels_end];
        let Some(value) = rest[labels_end + 2..].split_whitespace().next() else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let level = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix("priority_level=\""))
            .map(|v| v.trim_end_matches('"').to_owned());
        if let Some(level) = level {
            *out.entry(level).or_insert(0.0) += value;
        }
    }
    out
}

fn lock(m: &Mutex<LoadStats>) -> std::sync::MutexGuard<'_, LoadStats> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
