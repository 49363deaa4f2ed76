//! The routed bed of the failover and health tests: lab nodes cp-0, cp-1, … (each its own network
//! namespace and API server, one shared etcd), `baton agent` on every node, the simulator on the
//! lab host routing the control-plane FIP to its holder as the cloud does (packets keep the FIP
//! as their destination; nothing splices), and `baton controller` replicas started inside the
//! nodes by [`Routed::replica`]. The test itself is the lab host, which is no node: what it sees
//! through the FIP crossed the cloud's route.
//!
//! `baton` is the binary's path (`env!("CARGO_BIN_EXE_baton")` in a test: this module is shared
//! with the examples, where that variable does not exist).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use baton_cloud::CherryClient;
use baton_cloud::model::IpAddress;
use baton_sim::{Faults, LogEntry, SimHandle, Topology};
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options};
use tokio::process::Child;
use tokio::time::Instant;

use super::leases::LeaseHistory;

/// The simulator's control-plane servers, by node: cp-0, cp-1, cp-2 (their hostnames).
pub const CP: [u64; 3] = [600_101, 600_102, 600_103];

/// A lab with `n` nodes, agents on them, a routing simulator and the user's control-plane FIP
/// (tagged `cluster=<tag>`), first routed to cp-0.
pub struct Routed {
    pub cp: ControlPlane,
    pub sim: SimHandle,
    /// The user's client of the cloud (it made the FIP).
    pub cloud: CherryClient,
    pub fip: IpAddress,
    /// Who held the controller's Lease when, through every API server.
    pub history: LeaseHistory,
    /// The replicas' and agents' logs (`<identity>.log`, `agent-<i>.log`).
    pub logs: tempfile::TempDir,
    baton: String,
    tag: String,
    /// The node each replica identity was started on.
    nodes_of: Mutex<BTreeMap<String, usize>>,
    _agents: Vec<Child>,
}

impl Routed {
    /// Starts the lab (`n` nodes), the simulator with `faults`, the FIP on cp-0, and an agent
    /// on every node.
    pub async fn start(baton: &str, n: u8, faults: Faults, tag: &str) -> Self {
        Self::start_on(None, baton, n, faults, tag).await
    }

    /// [`Routed::start`] on Hetzner Cloud (`Some(settings)`: the simulator's Hetzner dialect with
    /// those settings; the replicas get `BATON_CLOUD=hetzner` and `HCLOUD_*`) or Cherry (`None`).
    pub async fn start_on(
        hetzner: Option<baton_sim::HetznerSettings>,
        baton: &str,
        n: u8,
        faults: Faults,
        tag: &str,
    ) -> Self {
        let cp = ControlPlane::start(Options {
            nodes: true,
            ..Options::servers(n)
        })
        .await
        .unwrap();
        let sim = match hetzner {
            Some(settings) => super::routed_hetzner_sim(settings, faults).await,
            None => super::routed_sim(faults, Topology::default()).await,
        };
        let (cloud, fip) = super::control_plane_fip(&sim, ("cluster", tag), CP[0]).await;
        let history = LeaseHistory::record(
            (0..usize::from(n)).map(|i| cp.client(i).unwrap()).collect(),
            "baton-controller",
        );
        let logs = tempfile::tempdir().unwrap();
        let agents = (0..usize::from(n))
            .map(|i| super::node::agent(&cp, baton, i, &logs.path().join(format!("agent-{i}.log"))))
            .collect();
        Self {
            cp,
            sim,
            cloud,
            fip,
            history,
            logs,
            baton: baton.to_owned(),
            tag: tag.to_owned(),
            nodes_of: Mutex::new(BTreeMap::new()),
            _agents: agents,
        }
    }

    /// The FIP's API server address (port 6443).
    pub fn fip_addr(&self) -> SocketAddr {
        SocketAddr::new(self.fip.address, 6443)
    }

    /// Whether `/readyz` answers through the FIP from the lab host (over the cloud's route).
    pub async fn fip_answers(&self) -> bool {
        super::readyz(self.cp.ca_der(), self.fip_addr()).await
    }

    /// The node the FIP is routed to now (the simulator's truth, read without a request).
    pub fn holder(&self) -> Option<usize> {
        let id = self.sim.peek_ip(self.fip.id.as_str())?.target()?.0;
        CP.iter().position(|&c| c == id)
    }

    /// The first entry of the simulator's log after everything logged so far.
    pub fn next_seq(&self) -> u64 {
        self.sim.log(0).last().map_or(0, |e| e.seq + 1)
    }

    /// The FIP's successful retargets sent by controller replicas, from log sequence `from` on
    /// (a `PUT` of the IP on Cherry, an assign action on Hetzner).
    pub fn moves(&self, from: u64) -> Vec<LogEntry> {
        let (method, path) = match self.sim.cloud() {
            baton_cloud::CloudKind::Cherry => ("PUT", format!("/v1/ips/{}", self.fip.id.as_str())),
            baton_cloud::CloudKind::Hetzner => (
                "POST",
                format!("/v1/floating_ips/{}/actions/assign", self.fip.id.as_str()),
            ),
        };
        self.sim
            .log(from)
            .into_iter()
            .filter(|e| {
                e.method == method && e.path == path && e.status < 300 && e.user_agent.contains("controller/")
            })
            .collect()
    }

    /// A `baton controller` replica on node `i`, identity `cp-<i>`, knowing its Node `cp-<i>`
    /// (`NODE_NAME`, as the shipped manifests give it); not started until [`Replica::spawn`].
    pub fn replica(&self, i: usize) -> Replica<'_> {
        Replica {
            bed: self,
            node: i,
            identity: format!("cp-{i}"),
            knows_node: true,
            kubeconfig: None,
            token: ADMIN_TOKEN.to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            admin: "off".to_owned(),
        }
    }

    /// The node replica `identity` was started on.
    pub fn node_of(&self, identity: &str) -> Option<usize> {
        self.nodes_of.lock().unwrap().get(identity).copied()
    }

    /// The log of replica `identity`.
    pub fn log_path(&self, identity: &str) -> PathBuf {
        self.logs.path().join(format!("{identity}.log"))
    }

    /// The log of replica `identity` (empty if it has none).
    pub fn log(&self, identity: &str) -> String {
        std::fs::read_to_string(self.log_path(identity)).unwrap_or_default()
    }

    /// The last 150 lines of every replica's log, for a failure message.
    pub fn logs(&self) -> String {
        let ids: Vec<String> = self.nodes_of.lock().unwrap().keys().cloned().collect();
        ids.iter()
            .map(|id| format!("--- {id}:\n{}", tail(&self.log_path(id), 150)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits (30 s at most) until some replica leads; its identity.
    pub async fn leader(&self) -> String {
        super::wait_for("a leader", Duration::from_secs(30), || {
            let h = self.history.holder();
            async move { h.is_some() }
        })
        .await;
        self.history.holder().unwrap()
    }

    /// Waits (40 s at most) until a replica leads from a node that does not hold the FIP (after
    /// the hand-off, if the first leader was elected there) and has kept the Lease for
    /// `stable`; its identity.
    pub async fn leader_off_the_holder(&self, stable: Duration) -> String {
        let deadline = Instant::now() + Duration::from_secs(40);
        let mut since: Option<(String, Instant)> = None;
        loop {
            let now = self.history.holder().filter(|h| {
                let node = self.node_of(h);
                node.is_some() && node != self.holder()
            });
            match (&since, now) {
                (Some((h, t)), Some(n)) if *h == n => {
                    if t.elapsed() >= stable {
                        return n;
                    }
                }
                (_, now) => since = now.map(|n| (n, Instant::now())),
            }
            assert!(
                Instant::now() < deadline,
                "no replica kept the Lease off the FIP holder's node (cp-{:?}) for {stable:?}: {:?}\n{}",
                self.holder(),
                self.history.entries(),
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits (30 s at most) until the FIP is routed to a node other than `victim` and answers
    /// `/readyz` there, from the lab host.
    pub async fn wait_fip_answers_from_other_than(&self, victim: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.holder().is_some_and(|h| h != victim) && self.fip_answers().await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the FIP never answered from another node than cp-{victim}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Cloud writes of replicas that did not hold the Lease when they arrived (a write later
    /// than `lease_ms` after its sender's last renew counts as such: a follower may have taken
    /// over).
    pub fn nonleader_writes(&self, lease_ms: u64) -> Vec<LogEntry> {
        self.history.nonleader_writes(&self.sim.log(0), lease_ms)
    }
}

/// A replica to start: see [`Routed::replica`].
pub struct Replica<'a> {
    bed: &'a Routed,
    node: usize,
    identity: String,
    knows_node: bool,
    kubeconfig: Option<PathBuf>,
    token: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    admin: String,
}

impl Replica<'_> {
    /// Its identity in the Lease (a new pod's name), and the name of its log.
    pub fn identity(mut self, identity: &str) -> Self {
        identity.clone_into(&mut self.identity);
        self
    }

    /// Started without `NODE_NAME` (`--node-name`): it does not know its Node, so it never hands
    /// the Lease off and a move does not avoid its node (baton before the hand-off).
    pub fn without_node_name(mut self) -> Self {
        self.knows_node = false;
        self
    }

    /// Authenticates with `token` instead of the admin's.
    pub fn token(mut self, token: &str) -> Self {
        token.clone_into(&mut self.token);
        self
    }

    /// Uses `kubeconfig` instead of one for its own node's API server.
    pub fn kubeconfig(mut self, kubeconfig: &Path) -> Self {
        self.kubeconfig = Some(kubeconfig.to_owned());
        self
    }

    /// Extra command-line arguments.
    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> Self {
        self.args.extend(args.iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// An extra environment variable.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// `--admin-listen` (default `off`).
    pub fn admin_listen(mut self, addr: &str) -> Self {
        addr.clone_into(&mut self.admin);
        self
    }

    /// Starts it on its node, moving the FIP tagged for the bed with the simulator as its cloud;
    /// its log in `<identity>.log` (appended to, so a replica restarted under the same identity
    /// keeps its predecessor's lines).
    pub fn spawn(self) -> Child {
        let Self {
            bed,
            node,
            identity,
            knows_node,
            kubeconfig,
            token,
            args,
            env,
            admin,
        } = self;
        let kubeconfig = kubeconfig.unwrap_or_else(|| bed.cp.write_kubeconfig(node, &token).unwrap());
        let node_name = format!("cp-{node}");
        let mut argv: Vec<&str> = vec![
            "controller",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--identity",
            &identity,
            "--admin-listen",
            &admin,
        ];
        argv.extend(args.iter().map(String::as_str));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(bed.log_path(&identity))
            .unwrap();
        let mut cmd = bed.cp.node_command(&node_name, &bed.baton).unwrap();
        cmd.args(&argv)
            .env("BATON_LOG", "info,baton=debug")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        if knows_node {
            // As the manifests give it (the downward API's spec.nodeName).
            cmd.env("NODE_NAME", &node_name);
        } else {
            cmd.env_remove("NODE_NAME");
        }
        match bed.sim.cloud() {
            baton_cloud::CloudKind::Cherry => cmd
                .env("CHERRY_API_KEY", bed.sim.api_key())
                .env("CHERRY_PROJECT_ID", bed.sim.project_id().to_string())
                .env("CHERRY_BASE_URL", bed.sim.base_url().as_str()),
            baton_cloud::CloudKind::Hetzner => cmd
                .env("BATON_CLOUD", "hetzner")
                .env("HCLOUD_TOKEN", bed.sim.api_key())
                .env("HCLOUD_ENDPOINT", format!("{}v1", bed.sim.base_url())),
        };
        cmd.env("CHERRY_FIP_TAG", format!("cluster={}", bed.tag))
            .envs(env);
        bed.nodes_of.lock().unwrap().insert(identity, node);
        cmd.spawn().unwrap()
    }
}

/// The last `n` lines of the file at `path`.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs an nftables script in the lab host's network namespace (the hub: the cloud's router).
pub async fn hub_nft(script: &str) {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("nft (Debian package nftables)");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(script.as_bytes()).await.unwrap();
    drop(stdin);
    assert!(child.wait().await.unwrap().success(), "nft -f - failed: {script}");
}
