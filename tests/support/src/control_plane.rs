//! A real Kubernetes control plane: one etcd and N kube-apiservers, each on its own lab address.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use k8s_openapi::api::core::v1::{Namespace, Node as KubeNode};
use kube::Api;
use tokio::process::{Child, Command};

use crate::fault::{Fault, Firewall};
use crate::lab;
use crate::node::{self, Node, NodeImage};

/// The port every API server listens on.
pub const APISERVER_PORT: u16 = 6443;

/// The bearer token of the `system:masters` user every control plane has.
pub const ADMIN_TOKEN: &str = "baton-test-admin-token";

/// A user the API server authenticates by a static bearer token (`--token-auth-file`).
#[derive(Clone, Debug)]
pub struct TokenUser {
    pub token: String,
    pub name: String,
    pub groups: Vec<String>,
}

/// What to start.
// Independent switches of a test bed, each set by name in a struct literal: no state machine.
#[allow(clippy::struct_excessive_bools)]
#[derive(Clone, Debug)]
pub struct Options {
    /// One kube-apiserver per address, port 6443, advertising that address.
    pub servers: Vec<IpAddr>,
    /// Also run kube-controller-manager (namespace, GC, endpointslice, serviceaccount controllers).
    pub controller_manager: bool,
    /// Extra IP SANs / DNS names on the serving certificate (FIPs and the API names are
    /// already included: every 203.0.113.0/24 address, `api*.baton.test`).
    pub extra_sans: Vec<String>,
    /// Extra token-authenticated users (for least-privilege tests).
    pub users: Vec<TokenUser>,
    /// More addresses of the node whose API server is on the key (one of `servers`), beyond
    /// that address and its lab private twin (see [`ControlPlane::node_addresses`]); network
    /// faults of the node cover them too.
    pub node_addresses: BTreeMap<IpAddr, Vec<IpAddr>>,
    /// The API servers' `--etcd-prefix` (each control plane has its own etcd as well).
    pub etcd_prefix: String,
    /// Run every server except the bootstrap host (198.51.100.10) as a lab node
    /// ([`crate::node`]): its own network namespace on the lab bridge, where its API server and
    /// kube-proxy run; FIPs are routed, not local (the simulator's `route_fips(node::BRIDGE)`),
    /// so a node must accept a FIP's packets itself. Implied by `kubelets`.
    pub nodes: bool,
    /// Lab nodes ([`Options::nodes`]) that also run a kubelet with containerd + runc, a pod
    /// network (CNI bridge, one /24 of 10.244.0.0/16 per node, routed by the hub),
    /// kube-controller-manager and kube-scheduler. Nodes register themselves (cp-0 =
    /// 198.51.100.11, …) and are labelled control-plane.
    pub kubelets: bool,
    /// kube-proxy's mode on the lab nodes ([`ProxyMode::None`]: no kube-proxy).
    pub proxy_mode: ProxyMode,
    /// OCI image archives loaded into every node's runtime (with `kubelets`).
    pub images: Vec<NodeImage>,
    /// Every API server writes an audit log (level Metadata: who did what to which object, and
    /// the answer's code), read back by [`ControlPlane::audit_events`].
    pub audit: bool,
    /// Run the API servers with API Priority and Fairness on (off by default, as before), with
    /// small limits a test can saturate: [`APF_MAX_REQUESTS_INFLIGHT`] +
    /// [`APF_MAX_MUTATING_REQUESTS_INFLIGHT`] seats per API server, shared by the priority
    /// levels. The `system:masters` admin ([`ADMIN_TOKEN`]) is exempt from it;
    /// the users of [`crate::load`] are not.
    pub apf: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            servers: vec![lab::public_ip(11), lab::public_ip(12), lab::public_ip(13)],
            controller_manager: false,
            extra_sans: Vec::new(),
            users: Vec::new(),
            node_addresses: BTreeMap::new(),
            etcd_prefix: "/registry".to_owned(),
            nodes: false,
            kubelets: false,
            proxy_mode: ProxyMode::default(),
            images: Vec::new(),
            audit: false,
            apf: false,
        }
    }
}

/// How kube-proxy runs on the lab nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProxyMode {
    /// `--proxy-mode=iptables` (Debian's iptables, nf_tables backend): the default, as in most
    /// clusters.
    #[default]
    Iptables,
    /// `--proxy-mode=nftables`.
    Nftables,
    /// No kube-proxy (a cluster with a replacement, or none).
    None,
}

impl ProxyMode {
    fn flag(self) -> Option<&'static str> {
        match self {
            Self::Iptables => Some("iptables"),
            Self::Nftables => Some("nftables"),
            Self::None => None,
        }
    }
}

impl Options {
    /// `n` API servers on 198.51.100.11, .12, …
    pub fn servers(n: u8) -> Self {
        Self {
            servers: (0..n).map(|i| lab::public_ip(11 + i)).collect(),
            ..Self::default()
        }
    }

    /// Whether the servers run as lab nodes ([`Options::nodes`] or [`Options::kubelets`]).
    pub fn lab_nodes(&self) -> bool {
        self.nodes || self.kubelets
    }
}

/// `--max-requests-inflight` of an API server with [`Options::apf`]. With API Priority and
/// Fairness, this plus [`APF_MAX_MUTATING_REQUESTS_INFLIGHT`] is the server's total concurrency
/// limit (30 seats), divided among the priority levels by their shares: `workload-low` (where
/// ServiceAccounts' requests go) gets 13 seats, `global-default` 3, `leader-election` 2 (the
/// default is 600 in all). Small enough that [`crate::load::LoadGen`] fills them on two cores,
/// large enough for the lab's own kubelets and controllers.
pub const APF_MAX_REQUESTS_INFLIGHT: u32 = 20;
/// `--max-mutating-requests-inflight` of an API server with [`Options::apf`].
pub const APF_MAX_MUTATING_REQUESTS_INFLIGHT: u32 = 10;

/// The pod network of the lab nodes: node `n` (cp-n) has `10.244.n.0/24`.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

/// The pod CIDR of lab node number `n`.
pub fn pod_cidr(n: usize) -> String {
    format!("10.244.{n}.0/24")
}

/// A running control plane. Dropping it kills every process and removes its files.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    bin: PathBuf,
    etcd_url: String,
    ca_pem: String,
    ca_der: Vec<u8>,
    /// The cluster CA, to sign more serving certificates ([`ControlPlane::issue_serving_cert`]).
    ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    admin_cert: (String, String),
    etcd_prefix: String,
    audit: bool,
    etcd: Proc,
    /// Whether etcd is stopped ([`ControlPlane::pause_etcd`], [`ControlPlane::stall_etcd`]).
    etcd_stop: Arc<Mutex<EtcdStop>>,
    /// API Priority and Fairness on ([`Options::apf`]).
    apf: bool,
    apiservers: Vec<ApiServer>,
    kcm: Option<Proc>,
    firewall: Firewall,
    /// Lab nodes (with [`Options::nodes`] or [`Options::kubelets`]); dropped first.
    nodes: Vec<Node>,
    proxy_mode: ProxyMode,
    /// The lab nodes run kubelets (pods, the Node authorizer, ServiceAccount admission).
    kubelets: bool,
}

struct ApiServer {
    ip: IpAddr,
    /// The lab node this API server runs on (an index into `nodes`), if any.
    node: Option<usize>,
    /// Every address of its node: `ip` first.
    node_addrs: Vec<IpAddr>,
    proc: Option<Proc>,
    /// Stopped with SIGSTOP.
    hung: bool,
}

/// Whether etcd is stopped, and which stop or resume was the last.
#[derive(Debug, Default)]
struct EtcdStop {
    stopped: bool,
    /// Bumped by every stop and resume, so the timed resume of a stall ends only that stall
    /// (not a later pause, or a later and longer stall).
    generation: u64,
}

/// A serving certificate signed by the cluster CA ([`ControlPlane::issue_serving_cert`]).
#[derive(Clone)]
pub struct ServingCert {
    /// The certificate (PEM).
    pub cert_pem: String,
    /// Its private key (PKCS#8, PEM).
    pub key_pem: String,
    /// The certificate (DER).
    pub cert_der: Vec<u8>,
    /// Its private key (PKCS#8, DER).
    pub key_der: Vec<u8>,
}

impl std::fmt::Debug for ServingCert {
    /// Without the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert").finish_non_exhaustive()
    }
}

/// Every address of the node whose API server is on `ip`: `ip`, its private twin when `ip` is
/// a lab public IP (`198.51.100.x` → `192.0.2.x`, as the simulator topology pairs them), and
/// `extra`.
fn node_addrs(ip: IpAddr, extra: &BTreeMap<IpAddr, Vec<IpAddr>>) -> Vec<IpAddr> {
    let mut out = vec![ip];
    out.extend(lab::private_twin(ip));
    for a in extra.get(&ip).into_iter().flatten() {
        if !out.contains(a) {
            out.push(*a);
        }
    }
    out
}

/// The directory holding `bin/{etcd,kube-apiserver,kube-controller-manager}`.
///
/// `BATON_TESTENV_DIR` if set, else whatever `scripts/testenv` prints (it builds once and caches).
pub fn testenv_dir() -> anyhow::Result<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("BATON_TESTENV_DIR") {
            return Ok(PathBuf::from(dir));
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/testenv");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!("{} failed ({})", script.display(), out.status));
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

impl ControlPlane {
    /// Starts etcd and the API servers (in parallel) and waits until each answers `/readyz`
    /// and namespace `default` exists. Must be called inside a lab.
    pub async fn start(opts: Options) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("baton-cp-").tempdir()?;
        let bin = testenv_dir()?.join("bin");
        let mut opts = opts;
        let node_servers = plan_nodes(&mut opts);
        let pki = Pki::generate(&opts)?;
        pki.write(dir.path(), &opts)?;
        let nodes = create_nodes(&opts, &node_servers, dir.path()).await?;

        let (client_port, peer_port) = (free_port()?, free_port()?);
        // With lab nodes, etcd listens on the bridge too, where the nodes' API servers reach it.
        let etcd_host = if opts.lab_nodes() {
            node::LAB_HOST.to_string()
        } else {
            "127.0.0.1".to_owned()
        };
        let etcd_url = format!("http://{etcd_host}:{client_port}");
        let mut etcd = Proc::spawn(
            "etcd",
            dir.path(),
            Command::new(bin.join("etcd")).args([
                format!("--data-dir={}", dir.path().join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
                "--unsafe-no-fsync=true".into(),
                "--logger=zap".into(),
                "--log-level=warn".into(),
                "--quota-backend-bytes=2147483648".into(),
            ]),
        )?;
        wait_http_ok(
            &format!("{etcd_url}/health"),
            None,
            Duration::from_secs(30),
            &mut etcd,
        )
        .await?;

        let mut cp = Self {
            bin,
            etcd_url,
            ca_der: pki.ca_der,
            ca_pem: pki.ca_pem,
            ca: pki.ca,
            admin_cert: (pki.admin_pem, pki.admin_key),
            etcd_prefix: opts.etcd_prefix.clone(),
            audit: opts.audit,
            etcd,
            etcd_stop: Arc::default(),
            apf: opts.apf,
            apiservers: opts
                .servers
                .iter()
                .map(|&ip| ApiServer {
                    ip,
                    node: node_servers.iter().position(|(n, _)| *n == ip),
                    node_addrs: node_addrs(ip, &opts.node_addresses),
                    proc: None,
                    hung: false,
                })
                .collect(),
            kcm: None,
            firewall: Firewall::default(),
            nodes,
            proxy_mode: opts.proxy_mode,
            kubelets: opts.kubelets,
            dir,
        };
        for i in 0..cp.apiservers.len() {
            cp.spawn_apiserver(i)?;
        }
        for i in 0..cp.apiservers.len() {
            cp.wait_ready(i, Duration::from_secs(90)).await?;
        }
        let ns: Api<Namespace> = Api::all(cp.client(0)?);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while ns.get_opt("default").await?.is_none() {
            if tokio::time::Instant::now() > deadline {
                bail!("namespace default didn't appear within 30s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        cp.wait_for_kubernetes_endpoints().await?;
        if opts.apf {
            cp.wait_for_apf_config().await?;
        }
        if opts.controller_manager && !opts.kubelets {
            cp.kcm = Some(cp.spawn_controller_manager()?);
        }
        if opts.kubelets {
            cp.start_nodes(&opts.images).await?;
        } else if opts.nodes {
            cp.start_kube_proxies()?;
        }
        Ok(cp)
    }

    /// Waits until `default/kubernetes` lists every API server. Each adds its address by its
    /// own reconcile, which can come seconds after `/readyz` on a loaded machine; baton's
    /// candidates are those addresses, so a test that began earlier would start with one
    /// server fewer than it thinks (a failover test once saw its third server 10 s late).
    async fn wait_for_kubernetes_endpoints(&self) -> anyhow::Result<()> {
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        let slices: Api<EndpointSlice> = Api::namespaced(self.client(0)?, "default");
        let want: std::collections::BTreeSet<String> =
            self.apiservers.iter().map(|a| a.ip.to_string()).collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let listed: std::collections::BTreeSet<String> = slices
                .list(&kube::api::ListParams::default().labels("kubernetes.io/service-name=kubernetes"))
                .await?
                .items
                .into_iter()
                .flat_map(|s| s.endpoints)
                .flat_map(|e| e.addresses)
                .collect();
            if want.is_subset(&listed) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("default/kubernetes lists {listed:?} after 60s, not every API server {want:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the API server has created its suggested APF configuration (it does so
    /// after `/readyz` answers): a test that names a FlowSchema or priority level can rely on it.
    async fn wait_for_apf_config(&self) -> anyhow::Result<()> {
        use k8s_openapi::api::flowcontrol::v1::FlowSchema;
        let schemas: Api<FlowSchema> = Api::all(self.client(0)?);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let names: Vec<String> = schemas
                .list_metadata(&kube::api::ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|s| s.metadata.name)
                .collect();
            if [
                "catch-all",
                "global-default",
                "service-accounts",
                "system-leader-election",
            ]
            .iter()
            .all(|n| names.iter().any(|m| m == n))
            {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("the API servers' suggested FlowSchemas did not appear within 30 s (have {names:?})");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Starts kube-proxy on every lab node (in [`Options::proxy_mode`]), talking to the node's
    /// own API server.
    fn start_kube_proxies(&mut self) -> anyhow::Result<()> {
        let Some(mode) = self.proxy_mode.flag() else {
            return Ok(());
        };
        for i in 0..self.apiservers.len() {
            let Some(n) = self.apiservers[i].node else {
                continue;
            };
            let name = self.nodes[n].name.clone();
            let kc = self.write_kubeconfig_named(i, ADMIN_TOKEN, &format!("kube-proxy-{name}"))?;
            self.nodes[n].start_kube_proxy(&self.bin, &kc, mode)?;
            self.nodes[n].boot.proxy_kubeconfig = Some((kc, mode.to_owned()));
        }
        Ok(())
    }

    /// Starts each lab node's runtime, kubelet and controllers, waits until every Node is
    /// Ready, and labels them control-plane (a kubelet may not set `node-role.kubernetes.io/*`
    /// labels itself; kubeadm does the same after the node joins).
    async fn start_nodes(&mut self, images: &[NodeImage]) -> anyhow::Result<()> {
        let mut all = vec![NodeImage {
            archive: testenv_dir()?.join("images/pause-3.10.oci.tar"),
            repository: "docker.io/library/pause".into(),
        }];
        all.extend(images.iter().cloned());
        let bin = self.bin.clone();
        let ca = self.dir.path().join("ca.crt");
        for i in 0..self.apiservers.len() {
            let Some(n) = self.apiservers[i].node else {
                continue;
            };
            let name = self.nodes[n].name.clone();
            let kubelet_kc =
                self.write_kubeconfig_named(i, &node_token(&name), &format!("kubelet-{name}"))?;
            let admin_kc = self.write_kubeconfig_named(i, ADMIN_TOKEN, &format!("admin-{name}"))?;
            let node = &mut self.nodes[n];
            node.start_runtime(&all).await?;
            node.start_kubelet(&bin, &kubelet_kc, &ca)?;
            node.start_controllers(&bin, &admin_kc, self.dir.path())?;
            node.boot.kubelet_kubeconfig = Some(kubelet_kc);
            node.boot.controllers_kubeconfig = Some(admin_kc);
        }
        self.start_kube_proxies()?;
        let nodes: Api<KubeNode> = Api::all(self.client(self.first_node_apiserver())?);
        let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let mut ready = 0;
            for name in &names {
                if let Some(node) = nodes.get_opt(name).await? {
                    let is_ready = node
                        .status
                        .and_then(|s| s.conditions)
                        .into_iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    if is_ready {
                        ready += 1;
                    }
                }
            }
            if ready == names.len() {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "{ready} of {} lab nodes Ready within 120 s (logs in {})",
                    names.len(),
                    self.dir.path().display()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let label =
            serde_json::json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}});
        for name in &names {
            nodes
                .patch(
                    name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&label),
                )
                .await
                .with_context(|| format!("labelling Node {name} control-plane"))?;
        }
        Ok(())
    }

    /// The index of the first API server that runs on a lab node (else 0).
    fn first_node_apiserver(&self) -> usize {
        self.apiservers.iter().position(|a| a.node.is_some()).unwrap_or(0)
    }

    /// The lab node names (`cp-0`, …), in API server order; empty without lab nodes.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// `program` wrapped to run on lab node `name` (in its network and mount namespaces, as a
    /// host-network pod or a systemd unit of that node would).
    pub fn node_command(&self, name: &str, program: impl AsRef<Path>) -> anyhow::Result<Command> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.name == name)
            .with_context(|| format!("no lab node {name}"))?;
        anyhow::ensure!(!node.dead, "lab node {name} is powered off");
        Ok(node.command(program.as_ref()))
    }

    /// Loads the nftables ruleset `rules` (`nft -f` syntax) on lab node `name`.
    pub async fn node_nft(&self, name: &str, rules: &str) -> anyhow::Result<()> {
        use tokio::io::AsyncWriteExt as _;
        let mut child = self
            .node_command(name, "nft")?
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("running nft (Debian package nftables)")?;
        let mut stdin = child.stdin.take().context("nft stdin")?;
        stdin.write_all(rules.as_bytes()).await?;
        drop(stdin);
        let out = child.wait_with_output().await?;
        anyhow::ensure!(
            out.status.success(),
            "nft on {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    }

    /// The network namespace (`ip netns` name) of lab node `name`.
    pub fn node_netns(&self, name: &str) -> Option<String> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .map(|n| n.netns.clone())
    }

    /// The process ids of everything running on lab node `name` (its API server, kubelet,
    /// containerd, shims, the containers of its pods).
    pub fn node_processes(&self, name: &str) -> Vec<i32> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .map(Node::pids)
            .unwrap_or_default()
    }

    /// The index of the API server on lab node `name`.
    pub fn apiserver_of_node(&self, name: &str) -> Option<usize> {
        self.apiservers
            .iter()
            .position(|a| a.node.is_some_and(|n| self.nodes[n].name == name))
    }

    /// The indexes of lab node `name`'s API server and of the node.
    fn node_index(&self, name: &str) -> anyhow::Result<(usize, usize)> {
        let i = self
            .apiserver_of_node(name)
            .with_context(|| format!("no lab node {name}"))?;
        Ok((i, self.apiservers[i].node.context("lab node")?))
    }

    /// Powers lab node `name` off: its link goes down and every process on it (API server,
    /// kubelet, containerd, shims, the containers of its pods) is killed.
    pub async fn kill_node(&mut self, name: &str) -> anyhow::Result<()> {
        let (i, n) = self.node_index(name)?;
        self.nodes[n].kill().await?;
        if let Some(p) = self.apiservers[i].proc.take() {
            p.terminate(Duration::ZERO).await;
        }
        self.apiservers[i].hung = false;
        Ok(())
    }

    /// Powers lab node `name` on again after [`Self::kill_node`] (the two make a reboot): a
    /// fresh network stack and mount namespace, its disk kept (containerd's images and state,
    /// the kubelet's files, `/var/lib/baton`, `/etc/hosts`); then it boots as a kubeadm
    /// control-plane node does: its boot units first ([`Self::install_boot_unit`], systemd
    /// oneshots ordered before the kubelet), then its API server (a static pod there),
    /// containerd, the kubelet (with the kubeconfig it had: [`Self::point_kubelets_at`]),
    /// kube-controller-manager, kube-scheduler and kube-proxy. Returns once they are started;
    /// nothing is waited for.
    pub async fn power_on(&mut self, name: &str) -> anyhow::Result<()> {
        let (i, n) = self.node_index(name)?;
        self.nodes[n].power_on().await?;
        self.nodes[n].run_boot_units().await;
        self.spawn_apiserver(i)?;
        let (bin, ca) = (self.bin.clone(), self.dir.path().join("ca.crt"));
        let pki = self.dir.path().to_owned();
        let node = &mut self.nodes[n];
        if self.kubelets {
            node.start_runtime(&[]).await?;
            let kubelet = node
                .boot
                .kubelet_kubeconfig
                .clone()
                .context("the node's kubelet kubeconfig")?;
            node.start_kubelet(&bin, &kubelet, &ca)?;
            let controllers = node
                .boot
                .controllers_kubeconfig
                .clone()
                .context("the node's controllers' kubeconfig")?;
            node.start_controllers(&bin, &controllers, &pki)?;
        }
        if let Some((kc, mode)) = node.boot.proxy_kubeconfig.clone() {
            node.start_kube_proxy(&bin, &kc, &mode)?;
        }
        Ok(())
    }

    /// Reboots lab nodes `names` at once: every one powered off ([`Self::kill_node`]), then
    /// every one powered on ([`Self::power_on`]).
    pub async fn reboot(&mut self, names: &[&str]) -> anyhow::Result<()> {
        for name in names {
            self.kill_node(name).await?;
        }
        for name in names {
            self.power_on(name).await?;
        }
        Ok(())
    }

    /// Whether lab node `name` is powered off.
    pub fn is_powered_off(&self, name: &str) -> bool {
        self.nodes.iter().any(|n| n.name == name && n.dead)
    }

    /// Installs the systemd unit file `unit` on every lab node: at each boot ([`Self::power_on`])
    /// its `ExecStart=` runs inside the node before anything else, unless a path of its
    /// `ConditionPathExists=` is missing there.
    pub fn install_boot_unit(&mut self, unit: &Path) -> anyhow::Result<()> {
        let unit = crate::node::BootUnit::from_unit_file(unit)?;
        for node in &mut self.nodes {
            node.boot.units.push(unit.clone());
        }
        Ok(())
    }

    /// Adds `address name` to every lab node's `/etc/hosts` (the node's resolver: what a site's
    /// DNS would answer for the name).
    pub fn add_node_host(&self, name: &str, address: IpAddr) -> anyhow::Result<()> {
        use std::io::Write as _;
        for node in &self.nodes {
            // Appended in place: the file is bind-mounted over the node's /etc/hosts.
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(node.dir.join("etc-hosts"))?;
            writeln!(f, "{address} {name}")?;
        }
        Ok(())
    }

    /// Makes `server` every lab node's DNS server (`/etc/resolv.conf`: what a node's DHCP or
    /// installer would configure), e.g. `baton bootstrap`'s embedded DNS during a bootstrap.
    pub fn set_node_nameserver(&self, server: IpAddr) -> anyhow::Result<()> {
        use std::io::Write as _;
        for node in &self.nodes {
            // Rewritten in place: the file is bind-mounted over the node's /etc/resolv.conf.
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(node.dir.join("etc-resolv.conf"))?;
            writeln!(f, "nameserver {server}")?;
            writeln!(f, "options timeout:1 attempts:2")?;
        }
        Ok(())
    }

    /// Points every lab node's kubelet at `url` (e.g. `https://api.baton.test:6443`, the
    /// endpoint, as kubeadm's workers and OpenShift's nodes reach the API) and restarts it; the
    /// node keeps that kubeconfig across reboots.
    pub async fn point_kubelets_at(&mut self, url: &str) -> anyhow::Result<()> {
        let (bin, ca) = (self.bin.clone(), self.dir.path().join("ca.crt"));
        for n in 0..self.nodes.len() {
            let name = self.nodes[n].name.clone();
            let path = self.dir.path().join(format!("kubelet-{name}-endpoint"));
            std::fs::write(&path, kubeconfig(url, &self.ca_pem, &node_token(&name)))?;
            let node = &mut self.nodes[n];
            node.boot.kubelet_kubeconfig = Some(path.clone());
            if node.dead {
                continue;
            }
            node.stop("kubelet").await;
            node.start_kubelet(&bin, &path, &ca)?;
        }
        Ok(())
    }

    /// The API servers' addresses, in start order.
    pub fn addresses(&self) -> Vec<IpAddr> {
        self.apiservers.iter().map(|a| a.ip).collect()
    }

    /// `https://<ip>:6443` of API server `i`.
    pub fn url(&self, i: usize) -> String {
        format!(
            "https://{}",
            SocketAddr::new(self.apiservers[i].ip, APISERVER_PORT)
        )
    }

    /// The cluster CA (PEM) that signed every serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The cluster CA (DER).
    pub fn ca_der(&self) -> &[u8] {
        &self.ca_der
    }

    /// A client certificate and key (PEM) of the `system:masters` user `admin`, signed by the
    /// cluster CA: the API servers verify it (`--client-ca-file`).
    pub fn admin_client_cert(&self) -> (&str, &str) {
        (&self.admin_cert.0, &self.admin_cert.1)
    }

    /// The directory with the PKI files and logs (`ca.crt`, `tokens.csv`, `apiserver-<i>.log`, …).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// etcd's client address.
    fn etcd_addr(&self) -> anyhow::Result<SocketAddr> {
        let hostport = self.etcd_url.strip_prefix("http://").context("etcd URL")?;
        hostport
            .parse()
            .with_context(|| format!("etcd address {hostport}"))
    }

    /// A client of API server `i` as the `system:masters` admin.
    pub fn client(&self, i: usize) -> anyhow::Result<kube::Client> {
        self.client_as(i, ADMIN_TOKEN)
    }

    /// Registers Nodes cp-0…cp-(n-1) (the simulator's control-plane hostnames) the way kubelets
    /// started with `--cloud-provider=external` do: labelled control-plane, no provider ID, tainted
    /// `node.cloudprovider.kubernetes.io/uninitialized` until a cloud controller initialises
    /// them. A Node that exists already is left alone.
    pub async fn register_nodes(&self, n: usize) -> anyhow::Result<()> {
        let nodes: Api<KubeNode> = Api::all(self.client(0)?);
        for i in 0..n {
            let node: KubeNode = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("cp-{i}"),
                             "labels": {"node-role.kubernetes.io/control-plane": ""}},
                "spec": {"taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized",
                                     "value": "true", "effect": "NoSchedule"}]}
            }))?;
            match nodes.create(&kube::api::PostParams::default(), &node).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(anyhow!(e).context(format!("registering Node cp-{i}"))),
            }
        }
        Ok(())
    }

    /// A client of API server `i` authenticating with `token`.
    pub fn client_as(&self, i: usize, token: &str) -> anyhow::Result<kube::Client> {
        Ok(kube::Client::try_from(self.kube_config(i, token)?)?)
    }

    /// The `kube::Config` behind [`client_as`](Self::client_as).
    pub fn kube_config(&self, i: usize, token: &str) -> anyhow::Result<kube::Config> {
        self.kube_config_for(&self.url(i), token)
    }

    /// Writes a kubeconfig for API server `i` authenticating with `token`; returns its path.
    pub fn write_kubeconfig(&self, i: usize, token: &str) -> anyhow::Result<PathBuf> {
        self.write_kubeconfig_named(i, token, &format!("kubeconfig-{i}-{}", token.len()))
    }

    /// Writes a kubeconfig for the server at `url` (e.g. a [`SlowApi`](crate::SlowApi) in
    /// front of an API server), trusting the cluster CA and authenticating with `token`;
    /// returns its path.
    pub fn write_kubeconfig_for(&self, url: &str, token: &str) -> anyhow::Result<PathBuf> {
        let name: String = url
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let path = self.dir.path().join(format!("kubeconfig-{name}-{}", token.len()));
        std::fs::write(&path, kubeconfig(url, &self.ca_pem, token))?;
        Ok(path)
    }

    /// The `kube::Config` of a client of the server at `url` (trusting the cluster CA,
    /// authenticating with `token`).
    pub fn kube_config_for(&self, url: &str, token: &str) -> anyhow::Result<kube::Config> {
        let mut cfg = kube::Config::new(url.parse().with_context(|| format!("server URL {url}"))?);
        cfg.root_cert = Some(vec![self.ca_der.clone()]);
        cfg.auth_info.token = Some(token.to_owned().into());
        cfg.connect_timeout = Some(Duration::from_secs(5));
        cfg.read_timeout = Some(Duration::from_secs(30));
        Ok(cfg)
    }

    /// A serving certificate for `sans` (IP addresses or DNS names) signed by the cluster CA,
    /// so that every client of the control plane trusts it (for a server that stands in for an
    /// API server on another address, e.g. a [`SlowApi`](crate::SlowApi)).
    pub fn issue_serving_cert(&self, sans: &[String]) -> anyhow::Result<ServingCert> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(sans.to_vec())
            .with_context(|| format!("certificate names {sans:?}"))?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "baton-lab-server");
        let cert = params.signed_by(&key, &self.ca)?;
        Ok(ServingCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
            key_der: key.serialize_der(),
        })
    }

    /// The network namespace (a path under `/run/netns`) of API server `i`'s lab node, if it
    /// runs on one.
    pub(crate) fn apiserver_netns(&self, i: usize) -> Option<PathBuf> {
        let n = self.apiservers[i].node?;
        Some(Path::new("/run/netns").join(&self.nodes[n].netns))
    }

    /// Whether the API servers run with API Priority and Fairness ([`Options::apf`]).
    pub fn apf(&self) -> bool {
        self.apf
    }

    fn write_kubeconfig_named(&self, i: usize, token: &str, file: &str) -> anyhow::Result<PathBuf> {
        let path = self.dir.path().join(file);
        std::fs::write(&path, kubeconfig(&self.url(i), &self.ca_pem, token))?;
        Ok(path)
    }

    /// Stops API server `i` gracefully (SIGTERM) and waits for it to exit.
    pub async fn stop_apiserver(&mut self, i: usize) -> anyhow::Result<()> {
        self.unhang(i)?;
        if let Some(p) = self.apiservers[i].proc.take() {
            p.terminate(Duration::from_secs(30)).await;
        }
        Ok(())
    }

    /// Kills API server `i` (SIGKILL), as a crashed host would.
    pub async fn kill_apiserver(&mut self, i: usize) {
        if let Some(p) = self.apiservers[i].proc.take() {
            p.terminate(Duration::ZERO).await;
        }
        self.apiservers[i].hung = false;
    }

    /// Every address of node `i` (the node of API server `i`): its API server's address, that
    /// address's private twin when it is a lab public IP (`198.51.100.x` → `192.0.2.x`, as the
    /// simulator topology pairs them), and [`Options::node_addresses`] for it. Network faults
    /// cover all of them.
    pub fn node_addresses(&self, i: usize) -> Vec<IpAddr> {
        self.apiservers[i].node_addrs.clone()
    }

    /// Hangs API server `i` (SIGSTOP): its socket still completes TCP handshakes into the
    /// kernel's backlog, but nothing is read or answered. No-op if it is not running.
    ///
    /// Returns once the kernel reports the process stopped (a signal is delivered
    /// asynchronously; a Go server with many threads takes a moment to stop them all), so the
    /// fault is in place when the caller starts its clock.
    pub fn hang(&mut self, i: usize) -> anyhow::Result<()> {
        let Some(pid) = self.apiserver_pid(i) else {
            return Ok(());
        };
        signal(pid, nix::sys::signal::Signal::SIGSTOP)?;
        self.apiservers[i].hung = true;
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        anyhow::ensure!(
            wait_for_state(pid, |s| matches!(s, Some('T' | 't') | None), deadline),
            "API server {pid} did not stop within 2 s of SIGSTOP"
        );
        Ok(())
    }

    /// Resumes a hung API server `i` (SIGCONT). No-op if it is not hung.
    pub fn unhang(&mut self, i: usize) -> anyhow::Result<()> {
        if !self.apiservers[i].hung {
            return Ok(());
        }
        if let Some(pid) = self.apiserver_pid(i) {
            signal(pid, nix::sys::signal::Signal::SIGCONT)?;
        }
        self.apiservers[i].hung = false;
        Ok(())
    }

    /// Whether API server `i` is hung (stopped by [`hang`](Self::hang)).
    pub fn is_hung(&self, i: usize) -> bool {
        self.apiservers[i].hung
    }

    /// Stalls etcd for `d`, as a slow disk or a long fsync does: SIGSTOP now, SIGCONT after
    /// `d` (from a thread of its own, whatever the caller's runtime is doing). Returns once the
    /// kernel reports etcd stopped, so the stall starts when the caller's clock does. Every API
    /// server shares this etcd.
    ///
    /// A [`resume_etcd`](Self::resume_etcd), [`pause_etcd`](Self::pause_etcd) or another stall
    /// before `d` has passed supersedes this one (its timed resume then does nothing). A stopped
    /// etcd is resumed when the control plane drops, also on panic.
    pub fn stall_etcd(&self, d: Duration) -> anyhow::Result<()> {
        let generation = self.stop_etcd()?;
        let (stop, pid) = (Arc::clone(&self.etcd_stop), self.running_etcd_pid()?);
        std::thread::Builder::new()
            .name("etcd-stall".into())
            .spawn(move || {
                std::thread::sleep(d);
                let mut stop = lock(&stop);
                if stop.stopped && stop.generation == generation {
                    let _ = signal(pid, nix::sys::signal::Signal::SIGCONT);
                    stop.stopped = false;
                    stop.generation += 1;
                }
            })
            .context("starting the thread that ends the etcd stall")?;
        Ok(())
    }

    /// Stops etcd (SIGSTOP) until [`resume_etcd`](Self::resume_etcd); returns once it is
    /// stopped. Resumed when the control plane drops, also on panic.
    pub fn pause_etcd(&self) -> anyhow::Result<()> {
        self.stop_etcd().map(drop)
    }

    /// Resumes a stopped etcd (SIGCONT). No-op if it is not stopped.
    pub fn resume_etcd(&self) -> anyhow::Result<()> {
        let mut stop = lock(&self.etcd_stop);
        if stop.stopped {
            signal(self.running_etcd_pid()?, nix::sys::signal::Signal::SIGCONT)?;
            stop.stopped = false;
        }
        stop.generation += 1;
        Ok(())
    }

    /// Whether etcd is stopped ([`pause_etcd`](Self::pause_etcd), or a stall in progress).
    pub fn is_etcd_paused(&self) -> bool {
        lock(&self.etcd_stop).stopped
    }

    /// SIGSTOPs etcd and waits until it is stopped; returns the new stop generation.
    fn stop_etcd(&self) -> anyhow::Result<u64> {
        let pid = self.running_etcd_pid()?;
        let mut stop = lock(&self.etcd_stop);
        signal(pid, nix::sys::signal::Signal::SIGSTOP)?;
        stop.stopped = true;
        stop.generation += 1;
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        anyhow::ensure!(
            wait_for_state(pid, |s| matches!(s, Some('T' | 't') | None), deadline),
            "etcd ({pid}) did not stop within 2 s of SIGSTOP"
        );
        Ok(stop.generation)
    }

    /// etcd's process id, while it runs.
    pub fn etcd_pid(&self) -> Option<u32> {
        self.etcd.pid()
    }

    fn running_etcd_pid(&self) -> anyhow::Result<u32> {
        self.etcd_pid().context("etcd is not running")
    }

    /// Blackholes node `i`: every packet to or from any of its
    /// [`node_addresses`](Self::node_addresses) is dropped (nftables, in this lab's namespace),
    /// so connects to it time out; established connections stall. Undone by [`heal`](Self::heal).
    pub async fn blackhole(&mut self, i: usize) -> anyhow::Result<()> {
        if let Some(n) = self.apiservers[i].node {
            // A lab node's traffic crosses the bridge, not this namespace's input hook.
            return self.nodes[n].set_link(false).await;
        }
        let addrs = self.apiservers[i].node_addrs.clone();
        self.firewall.set_blackhole(i, &addrs, true).await
    }

    /// Partitions node `i`'s API server: TCP to and from port 6443 on the node's addresses is
    /// dropped, so nobody reaches it (connects time out), while the node's other ports and its
    /// outgoing traffic (e.g. its baton replica calling the cloud) still work. On a lab node,
    /// whose own processes reach its API server without crossing the network, the API server
    /// also loses etcd, so it serves nobody, the node's own clients included. Undone by
    /// [`heal`](Self::heal).
    pub async fn partition(&mut self, i: usize) -> anyhow::Result<()> {
        if let Some(n) = self.apiservers[i].node {
            let etcd = self.etcd_addr()?;
            return self.nodes[n].set_partition(Some((APISERVER_PORT, etcd))).await;
        }
        let addrs = self.apiservers[i].node_addrs.clone();
        self.firewall.set_partition(i, &addrs, Some(APISERVER_PORT)).await
    }

    /// Removes node `i`'s network faults ([`blackhole`](Self::blackhole),
    /// [`partition`](Self::partition)). Connections stalled by them resume.
    pub async fn heal(&mut self, i: usize) -> anyhow::Result<()> {
        if let Some(n) = self.apiservers[i].node {
            let node = &mut self.nodes[n];
            if !node.dead {
                if node.is_link_down() {
                    node.set_link(true).await?;
                }
                if node.is_partitioned() {
                    node.set_partition(None).await?;
                }
            }
            return Ok(());
        }
        self.firewall.heal(i).await
    }

    /// The faults node `i` is in now (`Kill` when its API server is not running).
    pub fn faults(&self, i: usize) -> Vec<Fault> {
        let mut out = Vec::new();
        if !self.is_running(i) {
            out.push(Fault::Kill);
        }
        if self.is_hung(i) {
            out.push(Fault::Hang);
        }
        out.extend(self.firewall.faults(i));
        if let Some(n) = self.apiservers[i].node {
            if self.nodes[n].is_link_down() {
                out.push(Fault::Blackhole);
            }
            if self.nodes[n].is_partitioned() {
                out.push(Fault::Partition);
            }
        }
        out
    }

    /// Puts node `i` in failure class `fault`: [`kill_apiserver`](Self::kill_apiserver),
    /// [`hang`](Self::hang), [`blackhole`](Self::blackhole) or [`partition`](Self::partition).
    pub async fn inject(&mut self, i: usize, fault: Fault) -> anyhow::Result<()> {
        match fault {
            Fault::Kill => {
                self.kill_apiserver(i).await;
                Ok(())
            }
            Fault::Hang => self.hang(i),
            Fault::Blackhole => self.blackhole(i).await,
            Fault::Partition => self.partition(i).await,
        }
    }

    /// Undoes [`inject`](Self::inject): restarts a killed API server (and waits for
    /// `/readyz`), resumes a hung one, removes network rules.
    pub async fn recover(&mut self, i: usize, fault: Fault) -> anyhow::Result<()> {
        match fault {
            Fault::Kill => self.start_apiserver(i).await,
            Fault::Hang => self.unhang(i),
            Fault::Blackhole | Fault::Partition => self.heal(i).await,
        }
    }

    /// (Re)starts API server `i` and waits for `/readyz`.
    pub async fn start_apiserver(&mut self, i: usize) -> anyhow::Result<()> {
        if self.apiservers[i].proc.is_none() {
            self.spawn_apiserver(i)?;
        }
        self.wait_ready(i, Duration::from_secs(90)).await
    }

    /// The process id of API server `i`, while it runs (for SIGSTOP/SIGCONT "hiccups").
    pub fn apiserver_pid(&self, i: usize) -> Option<u32> {
        self.apiservers[i].proc.as_ref().and_then(Proc::pid)
    }

    /// Whether API server `i` is running (started and not stopped).
    pub fn is_running(&self, i: usize) -> bool {
        self.apiservers[i].proc.is_some()
    }

    fn spawn_apiserver(&mut self, i: usize) -> anyhow::Result<()> {
        self.apiservers[i].hung = false;
        let d = self.dir.path();
        let ip = self.apiservers[i].ip;
        let p = |f: &str| d.join(f).display().to_string();
        let node = self.apiservers[i].node.map(|n| &self.nodes[n]);
        if node.is_some_and(|n| n.dead) {
            bail!("API server {i}'s node is powered off");
        }
        let mut cmd = match node {
            Some(n) => n.command(&self.bin.join("kube-apiserver")),
            None => Command::new(self.bin.join("kube-apiserver")),
        };
        let with_nodes = self.kubelets;
        cmd.args([
            format!("--etcd-servers={}", self.etcd_url),
            format!("--etcd-prefix={}", self.etcd_prefix),
            // On its own node every address of the node, as kubeadm's default (`0.0.0.0`);
            // beside the others, in the lab's own namespace, its address alone.
            format!(
                "--bind-address={}",
                if node.is_some() {
                    "0.0.0.0".to_owned()
                } else {
                    ip.to_string()
                }
            ),
            format!("--advertise-address={ip}"),
            format!("--secure-port={APISERVER_PORT}"),
            format!("--tls-cert-file={}", p("serving.crt")),
            format!("--tls-private-key-file={}", p("serving.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--token-auth-file={}", p("tokens.csv")),
            if with_nodes {
                "--authorization-mode=Node,RBAC"
            } else {
                "--authorization-mode=RBAC"
            }
            .into(),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-cluster-ip-range=10.0.0.0/16".into(), // room for the 1,000-Service benchmark
            "--allow-privileged=true".into(),
            // Without kubelets nothing runs pods, and no controller creates the default
            // ServiceAccounts; with them, pods get their service account token as in a cluster.
            if with_nodes {
                "--disable-admission-plugins="
            } else {
                "--disable-admission-plugins=ServiceAccount"
            }
            .into(),
        ]);
        if self.apf {
            cmd.args([
                "--enable-priority-and-fairness=true".to_owned(),
                format!("--max-requests-inflight={APF_MAX_REQUESTS_INFLIGHT}"),
                format!("--max-mutating-requests-inflight={APF_MAX_MUTATING_REQUESTS_INFLIGHT}"),
            ]);
        } else {
            cmd.arg("--enable-priority-and-fairness=false");
        }
        // BATON_TEST_APISERVER_PROFILING=1 serves /debug/pprof (for looking into a benchmark's
        // API server with `go tool pprof`); off otherwise, as before.
        let profiling = std::env::var("BATON_TEST_APISERVER_PROFILING").is_ok_and(|v| v == "1");
        cmd.args([
            format!("--profiling={profiling}"),
            // `kubectl logs` and friends reach a lab node's kubelet by its address (the lab has
            // no DNS for node names).
            "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname".into(),
            format!("--cert-dir={}", p(&format!("certs-{i}"))),
        ]);
        if self.audit {
            std::fs::write(
                d.join("audit-policy.yaml"),
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  - level: Metadata\n",
            )?;
            cmd.args([
                format!("--audit-policy-file={}", p("audit-policy.yaml")),
                format!("--audit-log-path={}", p(&format!("audit-{i}.log"))),
                "--audit-log-format=json".into(),
                "--audit-log-mode=blocking".into(),
            ]);
        }
        self.apiservers[i].proc = Some(Proc::spawn(&format!("apiserver-{i}"), d, &mut cmd)?);
        Ok(())
    }

    /// Every audit event the API servers logged so far (with [`Options::audit`]), in no
    /// particular order: JSON objects of `audit.k8s.io/v1` `Event`.
    pub fn audit_events(&self) -> anyhow::Result<Vec<serde_json::Value>> {
        let mut out = Vec::new();
        for i in 0..self.apiservers.len() {
            let path = self.dir.path().join(format!("audit-{i}.log"));
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                out.push(serde_json::from_str(line).with_context(|| format!("{}: {line}", path.display()))?);
            }
        }
        Ok(out)
    }

    async fn wait_ready(&mut self, i: usize, timeout: Duration) -> anyhow::Result<()> {
        let url = format!("{}/readyz", self.url(i));
        let proc = self.apiservers[i]
            .proc
            .as_mut()
            .ok_or_else(|| anyhow!("apiserver {i} is not running"))?;
        wait_http_ok(&url, Some(&self.ca_der), timeout, proc).await
    }

    fn spawn_controller_manager(&self) -> anyhow::Result<Proc> {
        let d = self.dir.path();
        let kubeconfig = self.write_kubeconfig(0, ADMIN_TOKEN)?;
        Proc::spawn(
            "controller-manager",
            d,
            Command::new(self.bin.join("kube-controller-manager")).args([
                format!("--kubeconfig={}", kubeconfig.display()),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                "--controllers=namespace,garbagecollector,endpointslice,serviceaccount,serviceaccount-token"
                    .into(),
                format!(
                    "--service-account-private-key-file={}",
                    d.join("sa.key").display()
                ),
                format!("--root-ca-file={}", d.join("ca.crt").display()),
                "--use-service-account-credentials=false".into(),
            ]),
        )
    }
}

impl Drop for ControlPlane {
    /// Resumes hung processes (so none is left stopped; the fields' drops then kill them),
    /// powers the lab nodes off (every process on them, their cgroups and namespaces) and
    /// removes the network faults.
    fn drop(&mut self) {
        for i in 0..self.apiservers.len() {
            let _ = self.unhang(i);
        }
        let _ = self.resume_etcd();
        self.nodes.clear();
        self.firewall.remove_blocking();
        // Kill the API servers, the controller manager and etcd now and wait (bounded) until
        // the kernel has finished them: a killed Go process on a loaded machine can take
        // seconds to exit, and whoever drops a control plane expects its processes gone.
        let procs = self
            .apiservers
            .iter_mut()
            .filter_map(|a| a.proc.as_mut())
            .chain(self.kcm.as_mut())
            .chain(std::iter::once(&mut self.etcd));
        let pids: Vec<u32> = procs
            .filter_map(|p| {
                let pid = p.pid();
                p.kill_now();
                pid
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        for pid in pids {
            wait_for_state(pid, |s| matches!(s, None | Some('Z' | 'X')), deadline);
        }
    }
}

/// The lab nodes of `opts` (with `kubelets`: every server but the bootstrap host, named as the
/// simulator names them), adding each kubelet's token user (for the Node authorizer).
fn plan_nodes(opts: &mut Options) -> Vec<(IpAddr, String)> {
    if !opts.lab_nodes() {
        return Vec::new();
    }
    let nodes: Vec<(IpAddr, String)> = opts
        .servers
        .iter()
        .filter(|ip| **ip != lab::public_ip(10))
        .map(|ip| (*ip, node_name(*ip)))
        .collect();
    for (_, name) in &nodes {
        opts.users.push(TokenUser {
            token: node_token(name),
            name: format!("system:node:{name}"),
            groups: vec!["system:nodes".into()],
        });
    }
    nodes
}

/// Bridges the lab and creates the nodes' namespaces (nothing runs in them yet).
async fn create_nodes(
    opts: &Options,
    node_servers: &[(IpAddr, String)],
    dir: &Path,
) -> anyhow::Result<Vec<Node>> {
    let mut nodes = Vec::new();
    if !opts.lab_nodes() {
        return Ok(nodes);
    }
    let hosts: Vec<IpAddr> = opts
        .servers
        .iter()
        .filter(|ip| !node_servers.iter().any(|(n, _)| n == *ip))
        .flat_map(|ip| node_addrs(*ip, &opts.node_addresses))
        .collect();
    node::sweep_stale();
    node::bridge(&hosts).await?;
    let lab_id = node::lab_id();
    for (n, (ip, name)) in node_servers.iter().enumerate() {
        let addrs = node_addrs(*ip, &opts.node_addresses);
        nodes.push(Node::create(&lab_id, name, &addrs, &pod_cidr(n), dir).await?);
    }
    Ok(nodes)
}

/// `cp-<n>` for the lab public IP `198.51.100.(11+n)`: the simulator's hostname for it.
fn node_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) if v4.octets()[..3] == [198, 51, 100] && v4.octets()[3] >= 11 => {
            format!("cp-{}", v4.octets()[3] - 11)
        }
        other => format!("node-{}", other.to_string().replace(['.', ':'], "-")),
    }
}

/// The bearer token of node `name`'s kubelet.
fn node_token(name: &str) -> String {
    format!("baton-lab-kubelet-{name}")
}

/// `R`, `S`, `T` (stopped), `Z`… of a process, from `/proc/<pid>/stat`; `None` once it is gone.
/// Polls `pid`'s state until `done` holds (true) or `deadline` passes (false).
fn wait_for_state(pid: u32, done: impl Fn(Option<char>) -> bool, deadline: std::time::Instant) -> bool {
    loop {
        if done(process_state(pid)) {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Locks `m`, also when a thread panicked holding it (the state is a flag and a counter).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) -> anyhow::Result<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid.cast_signed()), sig)
        .with_context(|| format!("kill -{sig} {pid}"))
}

/// A kubeconfig document for `server` with `ca_pem` and a bearer token.
pub fn kubeconfig(server: &str, ca_pem: &str, token: &str) -> String {
    use base64::Engine as _;
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {server}\n    \
         certificate-authority-data: {ca}\nusers:\n- name: user\n  user:\n    token: {token}\ncontexts:\n\
         - name: lab\n  context:\n    cluster: lab\n    user: user\ncurrent-context: lab\n",
        ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes())
    )
}

/// A child process that is killed when dropped (and, through `setpriv --pdeathsig`, when the
/// thread that started it ends). Its output goes to `<dir>/<name>.log`.
pub struct Proc {
    name: String,
    log: PathBuf,
    child: Child,
}

impl Proc {
    /// Spawns `cmd` wrapped in `setpriv --pdeathsig KILL`.
    pub fn spawn(name: &str, dir: &Path, cmd: &mut Command) -> anyhow::Result<Self> {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        let std_cmd = cmd.as_std();
        let mut wrapped = Command::new("setpriv");
        wrapped
            .arg("--pdeathsig=KILL")
            .arg("--")
            .arg(std_cmd.get_program())
            .args(std_cmd.get_args())
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true);
        for (k, v) in std_cmd.get_envs() {
            match v {
                Some(v) => wrapped.env(k, v),
                None => wrapped.env_remove(k),
            };
        }
        let child = wrapped.spawn().with_context(|| format!("spawning {name}"))?;
        Ok(Self {
            name: name.to_owned(),
            log,
            child,
        })
    }

    /// The name it was spawned under.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGTERM, then SIGKILL after `grace` (at once when zero); waits for exit.
    pub async fn terminate(mut self, grace: Duration) {
        if let Some(pid) = self.child.id() {
            let sig = if grace.is_zero() {
                nix::sys::signal::Signal::SIGKILL
            } else {
                nix::sys::signal::Signal::SIGTERM
            };
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid.cast_signed()), sig);
        }
        if tokio::time::timeout(grace.max(Duration::from_secs(1)), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }

    /// Sends SIGKILL without waiting (for `Drop`).
    pub(crate) fn kill_now(&mut self) {
        let _ = self.child.start_kill();
    }

    /// The last `n` lines of the process's log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

async fn wait_http_ok(
    url: &str,
    ca_der: Option<&[u8]>,
    timeout: Duration,
    proc: &mut Proc,
) -> anyhow::Result<()> {
    let client = crate::http_client(ca_der)?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Ok(resp) = client.get(url).timeout(Duration::from_secs(2)).send().await
            && resp.status().is_success()
        {
            return Ok(());
        }
        // A process that died will never answer: fail fast, with its log.
        let exited = proc.exited();
        if exited.is_some() || tokio::time::Instant::now() > deadline {
            bail!(
                "{url} not ready within {timeout:?} ({} exit: {exited:?}); log tail:\n{}",
                proc.name,
                proc.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

struct Pki {
    ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    ca_pem: String,
    ca_der: Vec<u8>,
    serving_pem: String,
    serving_key: String,
    sa_key: String,
    sa_pub: String,
    admin_pem: String,
    admin_key: String,
}

impl Pki {
    fn generate(opts: &Options) -> anyhow::Result<Self> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "baton-lab-ca");
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;

        let mut sans: Vec<String> = [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "localhost",
            "127.0.0.1",
            "10.0.0.1",
            "api.baton.test",
            "api-int.baton.test",
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        sans.extend(opts.servers.iter().map(ToString::to_string));
        // And each server's private twin: on a lab node the API server listens there too, and
        // a pod's `status.hostIP` is the Node's InternalIP once baton has initialised the Node
        // (docs/operations.md, "Which address that is": what the operator configures, kubeadm's
        // `apiServer.certSANs`).
        sans.extend(
            opts.servers
                .iter()
                .filter_map(|ip| lab::private_twin(*ip))
                .map(|ip| ip.to_string()),
        );
        sans.extend((1..=254).map(|n| lab::fip(n).to_string()));
        sans.extend(opts.extra_sans.iter().cloned());
        let serving_key = KeyPair::generate()?;
        let mut params = CertificateParams::new(sans)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        let serving = params.signed_by(&serving_key, &ca)?;
        let sa_key = KeyPair::generate()?;
        let admin_key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, "admin");
        params
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let admin = params.signed_by(&admin_key, &ca)?;
        Ok(Self {
            admin_pem: admin.pem(),
            admin_key: admin_key.serialize_pem(),
            ca_pem: ca.pem(),
            ca_der: ca.der().to_vec(),
            ca,
            serving_pem: serving.pem(),
            serving_key: serving_key.serialize_pem(),
            sa_key: sa_key.serialize_pem(),
            sa_pub: sa_key.public_key_pem(),
        })
    }

    fn write(&self, dir: &Path, opts: &Options) -> anyhow::Result<()> {
        std::fs::write(dir.join("ca.crt"), &self.ca_pem)?;
        std::fs::write(dir.join("serving.crt"), &self.serving_pem)?;
        std::fs::write(dir.join("serving.key"), &self.serving_key)?;
        std::fs::write(dir.join("sa.key"), &self.sa_key)?;
        std::fs::write(dir.join("sa.pub"), &self.sa_pub)?;
        let mut tokens = format!("{ADMIN_TOKEN},admin,admin-uid,\"system:masters\"\n");
        for u in opts.users.iter().chain(crate::load::all_users()) {
            let _ = writeln!(
                tokens,
                "{},{},{}-uid,\"{}\"",
                u.token,
                u.name,
                u.name,
                u.groups.join(",")
            );
        }
        std::fs::write(dir.join("tokens.csv"), tokens)?;
        Ok(())
    }
}
