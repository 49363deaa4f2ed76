//! Cold start, shared by `tests/cold_start.rs` (each scenario must end with the endpoint back, no
//! person involved) and `examples/cold-start-bench.rs` (the same scenarios, timed, many times).
//!
//! The lab: three control-plane lab nodes cp-0..2 with real kubelets (containerd + runc), baton
//! deployed as the demo's handoff deploys it (the shipped RBAC, cloud Secret, agent DaemonSet,
//! Deployment and standby DaemonSet on baton's image), the control-plane FIP of `fipTag` routed
//! by the simulator to its holder, `systemd/baton-agent-boot.service` installed on every node,
//! and every kubelet reaching the API through the endpoint name `api.baton.test` (each node's
//! `/etc/hosts` names the FIP for it, as a site's DNS would), as kubeadm's workers (and its
//! control-plane nodes before 1.33) and OpenShift's nodes do.
//!
//! A scenario powers nodes off (link down, every process killed) and on again (a new network
//! stack: no nftables rule, no route but the configured ones; the disk kept) and measures, from
//! the moment the first returning API server answers `/readyz` on its node:
//! - `endpoint_s`: until `https://<FIP>:6443/readyz` answers from the lab host (across the
//!   cloud's route, as any client sees it);
//! - `pods_s`: until every baton pod bound to a returning node runs again (a container started
//!   after the power-on, Ready) and the leader Lease is held and renewed by one of them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use baton_cloud::model::{IpAddress, ServerId};
use baton_cloud::{CherryClient, Cloud as _};
use baton_sim::{Faults, SimHandle, Topology};
use baton_testbed::{ControlPlane, NodeImage, Options};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use tokio::time::Instant;

/// The simulator's server ids of cp-0, cp-1, cp-2.
pub const CP: [u64; 3] = [600_101, 600_102, 600_103];
/// The name the kubelets reach the API by.
pub const ENDPOINT_NAME: &str = "api.baton.test";
/// The longest a scenario may take to come back (a person would be called after this).
pub const SCENARIO_LIMIT: Duration = Duration::from_secs(240);

/// Which nodes come back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// All three rebooted at once.
    All,
    /// All down; the FIP's holder never returns, the other two start.
    HolderLost,
    /// All down; only one node that does not hold the FIP returns (one without a Deployment
    /// replica when there is such a node: the standby replica must serve).
    OneLeft,
}

impl Scenario {
    pub const ALL: [Self; 3] = [Self::All, Self::HolderLost, Self::OneLeft];

    pub fn name(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::HolderLost => "holder-lost",
            Self::OneLeft => "one-left",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|x| x.name() == s)
    }
}

/// What one scenario measured.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub scenario: Scenario,
    /// The nodes powered on again.
    pub returned: Vec<String>,
    /// The FIP's holder before the power loss, and once it answered again.
    pub holder_before: String,
    pub holder_after: String,
    /// Seconds from the last power-on to the first API server answering on its node.
    pub first_api_s: f64,
    pub endpoint_s: f64,
    pub pods_s: f64,
    /// Who held the Lease once the pods ran.
    pub lease_holder: String,
    /// Whether that is a standby replica (`baton-standby-…`).
    pub led_by_standby: bool,
    /// Successful retargets of the FIP during the scenario.
    pub retargets: usize,
    /// The returning nodes whose boot unit restored the FIP rules.
    pub restored: Vec<String>,
}

/// The lab of the cold-start scenarios, deployed and steady.
pub struct Lab {
    pub cp: ControlPlane,
    pub sim: SimHandle,
    pub cloud: CherryClient,
    pub fip: IpAddress,
    /// `systemd/baton-agent-boot.service` is installed on the nodes (a checkout that has it).
    pub boot_unit: bool,
}

/// The boot unit's file in this checkout.
fn boot_unit_file() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/baton-agent-boot.service")
}

/// The shipped manifests the handoff applies (the standby DaemonSet where the checkout has it).
fn shipped() -> Vec<&'static str> {
    let mut files = vec!["agent.yaml", "deployment.yaml"];
    if std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("manifests/standby.yaml")
        .exists()
    {
        files.push("standby.yaml");
    }
    files
}

fn server_of(node: &str) -> u64 {
    CP[node.trim_start_matches("cp-").parse::<usize>().expect("cp-N")]
}

fn node_of(server: u64) -> String {
    let i = CP
        .iter()
        .position(|s| *s == server)
        .expect("a control-plane server");
    format!("cp-{i}")
}

impl Lab {
    /// Starts the lab, deploys baton as the demo's handoff does, installs the boot unit, and
    /// points every kubelet at the endpoint; returns once everything is steady.
    pub async fn start(image: NodeImage) -> Self {
        let started = Instant::now();
        let mut cp = ControlPlane::start(Options {
            kubelets: true,
            images: vec![image],
            ..Options::servers(3)
        })
        .await
        .expect("control plane with lab nodes");
        eprintln!(
            "coldstart: lab nodes Ready in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        let sim = super::routed_sim(Faults::none(), Topology::default()).await;
        let (cloud, fip) = super::control_plane_fip(&sim, ("cluster", "coldstart"), CP[0]).await;
        let admin = cp.client(0).expect("client");
        super::apply_rbac_and_cloud_secret(&admin, &sim, "cluster=coldstart").await;
        super::apply_shipped_manifests(&admin, &shipped()).await;
        let boot_unit = boot_unit_file().exists();
        if boot_unit {
            cp.install_boot_unit(&boot_unit_file()).expect("the boot unit");
        }
        let mut lab = Self {
            cp,
            sim,
            cloud,
            fip,
            boot_unit,
        };
        lab.steady(&["cp-0", "cp-1", "cp-2"], None).await;
        // Every kubelet through the endpoint's name, which the nodes' resolver gives as the FIP.
        lab.cp
            .add_node_host(ENDPOINT_NAME, lab.fip.address)
            .expect("hosts");
        lab.cp
            .point_kubelets_at(&format!("https://{ENDPOINT_NAME}:6443"))
            .await
            .expect("kubelets through the endpoint");
        let switched = Instant::now();
        lab.steady(&["cp-0", "cp-1", "cp-2"], Some(switched)).await;
        eprintln!(
            "coldstart: baton deployed, kubelets through https://{ENDPOINT_NAME}:6443 ({}), steady after {:.1}s",
            lab.fip.address,
            started.elapsed().as_secs_f64()
        );
        lab
    }

    /// The FIP and port of the endpoint.
    pub fn fip_addr(&self) -> SocketAddr {
        SocketAddr::new(self.fip.address, 6443)
    }

    /// The node the cloud routes the FIP to.
    pub async fn holder(&self) -> Option<String> {
        let ip = self.cloud.ip(&self.fip.id).await.ok()?;
        ip.target().map(|t| node_of(t.0))
    }

    /// A client of a running node's own API server.
    fn client(&self) -> kube::Client {
        let i = self
            .cp
            .node_names()
            .iter()
            .filter(|n| !self.cp.is_powered_off(n))
            .find_map(|n| self.cp.apiserver_of_node(n))
            .unwrap_or(0);
        self.cp.client(i).expect("client")
    }

    /// The address of node `name`'s API server.
    fn address(&self, name: &str) -> IpAddr {
        self.cp.addresses()[self.cp.apiserver_of_node(name).expect("node")]
    }

    /// Waits until `nodes` run and the rest is what a user sees when all is well: each Node
    /// Ready (its kubelet heard from after `since`, when given), the FIP answering from a node
    /// of `nodes`, the baton pods of `nodes` Ready, the Lease renewed by one of them, and each
    /// node's file naming the FIP.
    pub async fn steady(&self, nodes: &[&str], since: Option<Instant>) {
        let since_wall = since.map(|s| std::time::SystemTime::now() - s.elapsed());
        let ca = self.cp.ca_der().to_vec();
        let what = format!(
            "{nodes:?} steady (Nodes Ready, FIP answering, baton pods Ready, Lease renewed, node files)"
        );
        let diag = || self.diagnostics();
        super::within(SCENARIO_LIMIT, &what, &diag, || async {
            let client = self.client();
            let node_api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
            for n in nodes {
                let node = node_api.get_opt(n).await.ok()??;
                let ready = node
                    .status?
                    .conditions?
                    .into_iter()
                    .find(|c| c.type_ == "Ready")?;
                if ready.status != "True" {
                    return None;
                }
                if let Some(t) = since_wall {
                    let beat = ready.last_heartbeat_time?.0;
                    if std::time::SystemTime::from(beat) < t {
                        return None;
                    }
                }
                if self.boot_unit {
                    let file = std::fs::read_to_string(self.node_file(n)).ok()?;
                    if !file.contains(&self.fip.address.to_string()) {
                        return None;
                    }
                    // The boot phase is over: no boot delivery stands.
                    if self.boot_deliveries_recorded(n).await {
                        return None;
                    }
                }
            }
            let holder = self.holder().await?;
            if !nodes.contains(&holder.as_str()) || !super::readyz(&ca, self.fip_addr()).await {
                return None;
            }
            // Pods are not restarted by a kubelet's restart: Ready is enough here.
            let ok = pods_running(&client, nodes, None).await?;
            lease_renewed_by(&client, &ok).await?;
            Some(())
        })
        .await;
    }

    /// Whether node `name` still records boot deliveries (`/run/baton/boot.json`).
    async fn boot_deliveries_recorded(&self, name: &str) -> bool {
        let Ok(mut test) = self.cp.node_command(name, "test") else {
            return false;
        };
        test.args(["-e", "/run/baton/boot.json"])
            .status()
            .await
            .is_ok_and(|s| s.success())
    }

    /// Whether node `name`'s boot unit restored the FIP rules at its last boot (its log says so).
    pub fn restored_at_boot(&self, name: &str) -> bool {
        std::fs::read_to_string(self.cp.dir().join(name).join("baton-agent-boot.service.log"))
            .is_ok_and(|log| log.contains("FIP acceptance restored at boot"))
    }

    /// Node `name`'s file, on its disk.
    pub fn node_file(&self, name: &str) -> std::path::PathBuf {
        self.cp.dir().join(name).join("var-lib-baton/agent/fips.json")
    }

    /// The nodes that come back in `scenario`. For [`Scenario::OneLeft`] a node that holds
    /// neither the FIP nor a Deployment replica, so that only its standby replica can serve:
    /// when both nodes without the FIP have a replica, the operator first routes the FIP to one
    /// of them (the controller keeps a healthy holder it did not choose).
    async fn returning(&mut self, scenario: Scenario) -> Vec<String> {
        let names = self.cp.node_names();
        let (_, mut deployment_nodes) = baton_pods(&self.client()).await;
        let mut holder = self.holder().await.expect("a FIP holder");
        if scenario == Scenario::OneLeft
            && !names
                .iter()
                .any(|n| *n != holder && !deployment_nodes.contains(n))
            && let Some(to) = deployment_nodes.iter().find(|n| **n != holder).cloned()
        {
            route_to(&self.cloud, &self.fip, &to).await;
            let all: Vec<&str> = names.iter().map(String::as_str).collect();
            self.steady(&all, None).await;
            deployment_nodes = baton_pods(&self.client()).await.1;
            holder = self.holder().await.expect("a FIP holder");
        }
        let others: Vec<String> = names.iter().filter(|n| **n != holder).cloned().collect();
        match scenario {
            Scenario::All => names,
            Scenario::HolderLost => others,
            Scenario::OneLeft => vec![
                others
                    .iter()
                    .find(|n| !deployment_nodes.contains(*n))
                    .unwrap_or(&others[0])
                    .clone(),
            ],
        }
    }

    /// Runs `scenario` and measures it (see the module's doc), then powers every node on again
    /// and waits until all is steady.
    pub async fn run(&mut self, scenario: Scenario) -> Outcome {
        let names = self.cp.node_names();
        let returned = self.returning(scenario).await;
        let holder_before = self.holder().await.expect("a FIP holder before the power loss");
        let seq = self.sim.log(0).last().map_or(0, |e| e.seq + 1);
        for n in &names {
            self.cp.kill_node(n).await.expect("power off");
        }
        // A power loss lasts longer than the Lease's 1.7 s; the nodes come back together.
        tokio::time::sleep(Duration::from_secs(2)).await;
        for n in &returned {
            self.cp.power_on(n).await.expect("power on");
        }
        let on = Instant::now();
        let on_wall = std::time::SystemTime::now();
        let ca = self.cp.ca_der().to_vec();
        let fip = self.fip_addr();
        let apis: Vec<SocketAddr> = returned
            .iter()
            .map(|n| SocketAddr::new(self.address(n), 6443))
            .collect();
        let diag = || self.diagnostics();
        let first_api = super::within(
            SCENARIO_LIMIT,
            "an API server answering /readyz on its node",
            &diag,
            || async {
                for a in &apis {
                    if super::readyz(&ca, *a).await {
                        return Some(Instant::now());
                    }
                }
                None
            },
        )
        .await;
        let what = format!(
            "{}: https://{fip}/readyz answering from the lab host",
            scenario.name()
        );
        let endpoint = super::within(SCENARIO_LIMIT, &what, &diag, || async {
            super::readyz(&ca, fip).await.then(Instant::now)
        })
        .await;
        let returned_refs: Vec<&str> = returned.iter().map(String::as_str).collect();
        let what = format!(
            "{}: the baton pods of {returned:?} running again and the Lease renewed by one of them",
            scenario.name()
        );
        let (pods, lease_holder) = super::within(SCENARIO_LIMIT, &what, &diag, || async {
            let client = self.client();
            let ok = pods_running(&client, &returned_refs, Some(on_wall)).await?;
            let holder = lease_renewed_by(&client, &ok).await?;
            Some((Instant::now(), holder))
        })
        .await;
        let holder_after = self.holder().await.unwrap_or_default();
        let retargets = self
            .sim
            .log(seq)
            .iter()
            .filter(|e| e.method == "PUT" && e.path.starts_with("/v1/ips/") && e.status < 300)
            .count();
        let restored: Vec<String> = returned
            .iter()
            .filter(|n| self.restored_at_boot(n))
            .cloned()
            .collect();
        let outcome = Outcome {
            restored,
            scenario,
            returned: returned.clone(),
            holder_before,
            holder_after,
            first_api_s: first_api.duration_since(on).as_secs_f64(),
            endpoint_s: endpoint.saturating_duration_since(first_api).as_secs_f64(),
            pods_s: pods.saturating_duration_since(first_api).as_secs_f64(),
            led_by_standby: lease_holder.starts_with("baton-standby-"),
            lease_holder,
            retargets,
        };
        // Back to three nodes for what comes next.
        for n in &names {
            if self.cp.is_powered_off(n) {
                self.cp.power_on(n).await.expect("power on");
            }
        }
        let all: Vec<&str> = names.iter().map(String::as_str).collect();
        self.steady(&all, Some(Instant::now())).await;
        outcome
    }

    /// What the lab shows when a wait times out: each node's boot unit log, its nftables, the
    /// tails of the baton pods' logs and of the kubelets'.
    pub fn diagnostics(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        for n in self.cp.node_names() {
            let dir = self.cp.dir().join(&n);
            let unit = std::fs::read_to_string(dir.join("baton-agent-boot.service.log")).unwrap_or_default();
            let _ = writeln!(
                out,
                "==> {n} (powered off: {}) boot unit:\n{unit}",
                self.cp.is_powered_off(&n)
            );
            let file = std::fs::read_to_string(dir.join("var-lib-baton/agent/fips.json")).unwrap_or_default();
            let _ = writeln!(out, "node file: {file}");
            let kubelet = std::fs::read_to_string(dir.join(format!("{n}-kubelet.log"))).unwrap_or_default();
            let tail: Vec<&str> = kubelet.lines().rev().take(15).collect();
            let _ = writeln!(out, "kubelet (last lines, newest first):\n{}", tail.join("\n"));
        }
        for (path, text) in super::pod_logs(&self.cp) {
            if !path.to_string_lossy().contains("baton") {
                continue;
            }
            let tail: Vec<&str> = text.lines().rev().take(12).collect();
            let _ = writeln!(out, "==> {} (newest first)\n{}", path.display(), tail.join("\n"));
        }
        out
    }
}

/// The baton pods (agent, Deployment, standby: `app.kubernetes.io/name` baton*) and the nodes
/// the Deployment's pods are bound to.
async fn baton_pods(client: &kube::Client) -> (Vec<Pod>, BTreeSet<String>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let list = pods
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let ours: Vec<Pod> = list
        .into_iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/name"))
                .is_some_and(|n| n.starts_with("baton"))
        })
        .collect();
    let deployment = ours
        .iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/name"))
                .map(String::as_str)
                == Some("baton")
        })
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    (ours, deployment)
}

/// The names of the baton pods bound to `nodes` when every one of them is Ready with its
/// container started after `since` (when given): the kubelet of that node ran it again.
async fn pods_running(
    client: &kube::Client,
    nodes: &[&str],
    since: Option<std::time::SystemTime>,
) -> Option<BTreeSet<String>> {
    let (pods, _) = baton_pods(client).await;
    let mut names = BTreeSet::new();
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for p in pods {
        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        if !nodes.contains(&node.as_str()) || p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let status = p.status.as_ref()?;
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let started = status
            .container_statuses
            .iter()
            .flatten()
            .filter_map(|c| c.state.as_ref()?.running.as_ref()?.started_at.clone())
            .map(|t| std::time::SystemTime::from(t.0))
            .min()?;
        if !ready || since.is_some_and(|s| started < s) {
            return None;
        }
        *per_node.entry(node).or_default() += 1;
        names.insert(p.metadata.name.clone()?);
    }
    // At least the agent and (where the checkout ships it) the standby replica on each node.
    let each = shipped().len() - 1;
    nodes
        .iter()
        .all(|n| per_node.get(*n).copied().unwrap_or(0) >= each)
        .then_some(names)
}

/// The Lease's holder when it is one of `pods` and renews: seen again with a newer renewTime
/// within 2 s.
async fn lease_renewed_by(client: &kube::Client, pods: &BTreeSet<String>) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let first = leases.get_opt("baton-controller").await.ok()??.spec?;
    let holder = first.holder_identity.clone()?;
    if !pods.contains(&holder) {
        return None;
    }
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = leases.get_opt("baton-controller").await.ok()??.spec?;
        if now.holder_identity.as_deref() == Some(holder.as_str()) && now.renew_time != first.renew_time {
            return Some(holder);
        }
    }
    None
}

/// `scenario endpoint_s=… pods_s=…` for logs.
impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "scenario={} returned={} holder={}→{} first_api_s={:.2} endpoint_s={:.2} pods_s={:.2} lease={}{} retargets={} restored_at_boot={}",
            self.scenario.name(),
            self.returned.join(","),
            self.holder_before,
            self.holder_after,
            self.first_api_s,
            self.endpoint_s,
            self.pods_s,
            self.lease_holder,
            if self.led_by_standby { " (standby)" } else { "" },
            self.retargets,
            self.restored.join(",")
        )
    }
}

/// Retargets the FIP to `node` (the operator's move, before a run).
pub async fn route_to(cloud: &CherryClient, fip: &IpAddress, node: &str) {
    cloud
        .retarget_ip(&fip.id, ServerId(server_of(node)))
        .await
        .expect("retarget");
}
