//! Lab nodes: control-plane servers that behave like nodes, each with its own network namespace
//! on the lab bridge, its API server and kube-proxy, and (with kubelets) a real container runtime
//! (containerd + runc), a pod network and a real kubelet.
//!
//! ```text
//!  lab namespace (the hub, the test's)            node namespace cp-0 (one per node)
//!  ┌───────────────────────────────────────┐      ┌────────────────────────────────────────┐
//!  │ bridge baton0 198.51.100.1 192.0.2.1  │─veth─│ eth0 198.51.100.11/24 192.0.2.11/24    │
//!  │   + hosts that are no node            │      │ kube-apiserver :6443, kube-proxy,      │
//!  │     (the bootstrap host .10)          │      │ [kubelet, containerd (+ shims, pods),  │
//!  │ etcd 192.0.2.1, the simulator         │      │  kube-controller-manager, scheduler,   │
//!  │ routes, as the cloud's router:        │      │  cni0 10.244.0.1/24 for pods]          │
//!  │   203.0.113.x/32 via <FIP's holder>   │      │ default route → 198.51.100.1           │
//!  │   10.244.n.0/24 via <node n>          │      └────────────────────────────────────────┘
//!  │ ip_forward=1, no ICMP redirects       │
//!  └───────────────────────────────────────┘
//! ```
//!
//! The FIP range is not local in the hub: the simulator routes each targeted FIP to its
//! holder (`SimBuilder::route_fips(BRIDGE)`), and packets reach the node with the FIP as their
//! destination, as Cherry Servers delivers them. Nothing on a node accepts them unless
//! something there does (baton's node agent). The hub forwards (a node's own traffic to a FIP
//! goes out through it and back) and sends no ICMP redirects: a node told "reach the FIP's
//! holder directly" would keep going there after the route moved, which no cloud router does.
//!
//! Each node also has a mount namespace of its own (slave of the host's), held by a `sleep`
//! process, in which `/run/containerd` and `/var/log/containers` are private tmpfs: the kubelet's
//! volume mounts, containerd's rootfs mounts, shim sockets and runc state all vanish with the
//! node's processes. Pods run in the cgroup tree `/baton-lab/<lab>/<node>` (the kubelet's
//! `cgroupRoot`), so two kubelets never see each other's pods.
//!
//! Killing a node ([`Node::kill`]) takes its link down and SIGKILLs every process in its network
//! namespace (API server, kubelet, containerd, shims, containers): a powered-off machine.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::process::Command;

use crate::control_plane::Proc;

/// The lab bridge joining the nodes, the lab's own hosts and the simulator.
pub const BRIDGE: &str = "baton0";
/// The lab host's address on the bridge (public range): the nodes' default gateway.
pub const GATEWAY: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 1));
/// The lab host's address on the bridge (private range): etcd and the simulator listen here,
/// so the nodes reach them.
pub const LAB_HOST: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));

/// An OCI image archive to load into every node's runtime (no registry in the lab).
#[derive(Clone, Debug)]
pub struct NodeImage {
    /// The archive (an OCI layout in a tar, as `scripts/build-image` writes).
    pub archive: PathBuf,
    /// The repository its tag is imported under, e.g. `docker.io/library/baton`
    /// (`baton:0.1.0` in a pod spec resolves to it).
    pub repository: String,
}

impl NodeImage {
    /// Parses `ARCHIVE=REPOSITORY`, or `ARCHIVE` alone (repository `docker.io/library/baton`).
    pub fn parse(s: &str) -> Self {
        match s.split_once('=') {
            Some((a, r)) => Self {
                archive: a.into(),
                repository: r.to_owned(),
            },
            None => Self {
                archive: s.into(),
                repository: "docker.io/library/baton".to_owned(),
            },
        }
    }
}

/// baton's image: `BATON_IMAGE` (an archive `scripts/build-image` wrote) if set, else the
/// archive `scripts/build-image` builds now (once per test process; it builds the static
/// binary first, minutes when cold).
pub fn baton_image() -> anyhow::Result<NodeImage> {
    static IMAGE: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let archive = IMAGE
        .get_or_init(|| {
            if let Some(a) = std::env::var_os("BATON_IMAGE") {
                return Ok(PathBuf::from(a));
            }
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/build-image");
            let out = std::process::Command::new("bash")
                .arg(&script)
                .stderr(Stdio::inherit())
                .output()
                .map_err(|e| format!("running {}: {e}", script.display()))?;
            if !out.status.success() {
                return Err(format!("{} failed ({})", script.display(), out.status));
            }
            // The last two lines: the archive (relative to the repository) and the digest.
            let text = String::from_utf8_lossy(&out.stdout);
            let lines: Vec<&str> = text.lines().collect();
            let archive = lines
                .len()
                .checked_sub(2)
                .map(|i| lines[i])
                .ok_or_else(|| format!("{} printed no archive: {text}", script.display()))?;
            Ok(Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(archive))
        })
        .clone()
        .map_err(|e| anyhow::anyhow!(e))?;
    anyhow::ensure!(archive.is_file(), "no image archive at {}", archive.display());
    Ok(NodeImage {
        archive,
        repository: "docker.io/library/baton".into(),
    })
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A unique id for one control plane's nodes (netns and cgroup names).
pub(crate) fn lab_id() -> String {
    format!("{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed))
}

/// Powers off what a lab of a process that no longer exists left behind (a test binary killed
/// with SIGKILL cannot clean up: its kubelets and containerds die by `--pdeathsig`, but shims
/// and containers, reparented, would live on): every `baton-<pid>-…` network namespace and
/// `/baton-lab/<pid>-…` cgroup whose pid is gone.
pub(crate) fn sweep_stale() {
    let dead = |id: &str| {
        id.split('-')
            .next()
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    let names = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for name in names.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(rest) = name.strip_prefix("baton-") else {
            continue;
        };
        if !dead(rest) {
            continue;
        }
        let (lab, node) = rest.rsplit_once("-cp-").map_or((rest, ""), |(l, n)| (l, n));
        let stale = Node::stale(name, &format!("/baton-lab/{lab}/cp-{node}"));
        drop(stale);
    }
}

/// Turns the current lab namespace into the hub of a bridged lab: the public, private and FIP
/// ranges stop being local (the nodes own their addresses; FIPs are routed to their holders),
/// the hub forwards without ICMP redirects, and the bridge gets the gateway addresses and
/// `hosts` (addresses of servers that are no node, e.g. the bootstrap host).
pub(crate) async fn bridge(hosts: &[IpAddr]) -> anyhow::Result<()> {
    for range in [
        crate::lab::PUBLIC_RANGE,
        crate::lab::PRIVATE_RANGE,
        crate::lab::FIP_RANGE,
    ] {
        // Absent already on a second control plane in the same lab: ignore.
        let _ = ip(&["route", "del", "local", range, "dev", "lo", "table", "local"]).await;
    }
    if ip(&["link", "show", BRIDGE]).await.is_err() {
        ip(&["link", "add", BRIDGE, "type", "bridge"]).await?;
    }
    ip(&["link", "set", BRIDGE, "up"]).await?;
    for (key, value) in [
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv4.conf.all.send_redirects", "0"),
        ("net.ipv4.conf.default.send_redirects", "0"),
        ("net.ipv4.conf.baton0.send_redirects", "0"),
    ] {
        sysctl(key, value).await?;
    }
    let mut addrs = vec![format!("{GATEWAY}/24"), format!("{LAB_HOST}/24")];
    addrs.extend(hosts.iter().map(|h| format!("{h}/32")));
    for a in addrs {
        ip(&["addr", "replace", &a, "dev", BRIDGE]).await?;
    }
    Ok(())
}

/// Makes `ip` one more host of a lab with nodes that is no node (an address on the bridge,
/// reachable from every node): where a second control plane without kubelets, started after
/// the one with nodes, puts its API server.
pub async fn add_lab_host(ip: IpAddr) -> anyhow::Result<()> {
    bridge(&[ip]).await
}

/// One lab node.
pub(crate) struct Node {
    /// `cp-<n>`: the simulator's hostname of the server with this address.
    pub(crate) name: String,
    pub(crate) addrs: Vec<IpAddr>,
    pub(crate) netns: String,
    veth: String,
    pub(crate) dir: PathBuf,
    cgroup: String,
    holder: Option<Proc>,
    holder_pid: u32,
    procs: Vec<Proc>,
    link_down: bool,
    partitioned: bool,
    pub(crate) dead: bool,
    /// The node's pod network (its CNI bridge's subnet).
    pod_cidr: String,
    /// What runs when it boots (again).
    pub(crate) boot: NodeBoot,
}

/// What a lab node runs when it boots: its services' configuration, kept on its disk.
#[derive(Debug, Default)]
pub(crate) struct NodeBoot {
    /// The kubelet's kubeconfig (its API server: the node's own, or the endpoint).
    pub(crate) kubelet_kubeconfig: Option<PathBuf>,
    /// kube-controller-manager's and kube-scheduler's (the node's own API server).
    pub(crate) controllers_kubeconfig: Option<PathBuf>,
    /// kube-proxy's (the node's own API server), when it runs.
    pub(crate) proxy_kubeconfig: Option<(PathBuf, String)>,
    /// systemd oneshot units run before anything else: (unit name, its `ExecStart` argv, the
    /// paths of its `ConditionPathExists=`).
    pub(crate) units: Vec<BootUnit>,
}

/// A systemd oneshot unit as the lab runs it at a node's boot, before the kubelet.
#[derive(Clone, Debug)]
pub struct BootUnit {
    pub name: String,
    pub exec_start: Vec<String>,
    pub condition_path_exists: Vec<String>,
}

impl BootUnit {
    /// Reads a unit file's `ExecStart=` (one line, `\` continuations joined; split on
    /// whitespace) and `ConditionPathExists=` lines.
    pub fn from_unit_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let joined = text.replace("\\\n", " ");
        let mut exec_start = None;
        let mut conditions = Vec::new();
        for line in joined.lines().map(str::trim) {
            if let Some(v) = line.strip_prefix("ExecStart=") {
                exec_start = Some(v.split_whitespace().map(str::to_owned).collect::<Vec<_>>());
            } else if let Some(v) = line.strip_prefix("ConditionPathExists=") {
                conditions.push(v.to_owned());
            }
        }
        Ok(Self {
            name: path
                .file_name()
                .map_or_else(|| "unit".into(), |n| n.to_string_lossy().into_owned()),
            exec_start: exec_start.with_context(|| format!("{} has no ExecStart=", path.display()))?,
            condition_path_exists: conditions,
        })
    }
}

/// The cgroup v1 controllers the kubelet needs under its `cgroupRoot` (plus the named
/// `systemd` hierarchy, which runc joins too).
const CGROUP_CONTROLLERS: [&str; 9] = [
    "cpu", "cpuacct", "cpuset", "memory", "pids", "systemd", "freezer", "devices", "blkio",
];

impl Node {
    /// Creates node `name` with addresses `addrs` (the public one first) in `dir`: its network
    /// namespace, the veth to the bridge, its mount namespace. Nothing runs in it yet.
    /// `pod_cidr` is the node's share of the pod network; the hub routes it to the node.
    pub(crate) async fn create(
        lab: &str,
        name: &str,
        addrs: &[IpAddr],
        pod_cidr: &str,
        dir: &Path,
    ) -> anyhow::Result<Self> {
        let netns = format!("baton-{lab}-{name}");
        let veth = format!("v{name}");
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir)?;
        let mut node = Self {
            name: name.to_owned(),
            addrs: addrs.to_vec(),
            veth,
            dir,
            cgroup: format!("/baton-lab/{lab}/{name}"),
            holder: None,
            holder_pid: 0,
            procs: Vec::new(),
            link_down: false,
            partitioned: false,
            dead: false,
            pod_cidr: pod_cidr.to_owned(),
            netns,
            boot: NodeBoot::default(),
        };
        // The node's disk: what survives a reboot ([`Self::power_on`]). baton's agent keeps
        // its node file in /var/lib/baton (a hostPath), the resolver reads /etc/hosts.
        std::fs::create_dir_all(node.dir.join("var-lib-baton"))?;
        let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_else(|_| "127.0.0.1 localhost\n".into());
        std::fs::write(node.dir.join("etc-hosts"), hosts)?;
        let resolver = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        std::fs::write(node.dir.join("etc-resolv.conf"), resolver)?;
        node.boot_network().await?;
        Ok(node)
    }

    /// What a machine's boot sets up before any service runs: a fresh network stack (a new
    /// network namespace: no nftables rules, no conntrack entries, no routes but those of its
    /// configured addresses and default route, no links but `lo` and `eth0`), a fresh mount
    /// namespace (tmpfs `/run/containerd`, `/var/log/containers`, `/run/baton`; the node's disk
    /// at `/var/lib/baton`, `/etc/hosts` and `/etc/resolv.conf`) and empty cgroups.
    async fn boot_network(&mut self) -> anyhow::Result<()> {
        let ns = self.netns.clone();
        let veth = self.veth.clone();
        // A veth of the node's last boot whose namespace lingers: gone with its pair.
        let _ = ip(&["link", "del", &veth]).await;
        ip(&["netns", "add", &ns]).await?;
        ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])
        .await?;
        ip(&["link", "set", &veth, "master", BRIDGE, "up"]).await?;
        ip(&["-n", &ns, "link", "set", "lo", "up"]).await?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"]).await?;
        for a in &self.addrs {
            ip(&["-n", &ns, "addr", "add", &format!("{a}/24"), "dev", "eth0"]).await?;
        }
        ip(&["-n", &ns, "route", "add", "default", "via", &GATEWAY.to_string()]).await?;
        // A node forwards (kubeadm's preflight requires it): kube-proxy's DNAT of a Service
        // address to a pod on another node is forwarded. A new namespace starts without it, and
        // the CNI bridge plugin turns it on only once a pod runs on the node.
        ip(&["netns", "exec", &ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"]).await?;
        // The hub routes the node's pods, as a cloud's router does a node's routed subnet.
        ip(&[
            "route",
            "replace",
            &self.pod_cidr,
            "via",
            &self.addrs[0].to_string(),
            "dev",
            BRIDGE,
        ])
        .await?;
        // The holder: keeps the node's mount namespace (slave of the host's, so host mounts
        // show, node mounts stay inside) with private /run/containerd, /var/log/containers and
        // /run/baton (tmpfs: gone at a reboot), and the node's own /var/lib/baton and /etc/hosts.
        std::fs::create_dir_all("/var/log/containers").ok();
        std::fs::create_dir_all("/var/lib/baton").ok();
        std::fs::create_dir_all("/run/baton").ok();
        let script = format!(
            "mkdir -p /run/containerd && mount -t tmpfs tmpfs /run/containerd && \
             mount -t tmpfs tmpfs /var/log/containers && mount -t tmpfs tmpfs /run/baton && \
             mount --bind {disk} /var/lib/baton && mount --bind {hosts} /etc/hosts && \
             mount --bind {resolver} /etc/resolv.conf && exec sleep infinity",
            disk = self.dir.join("var-lib-baton").display(),
            hosts = self.dir.join("etc-hosts").display(),
            resolver = self.dir.join("etc-resolv.conf").display(),
        );
        let holder = Proc::spawn(
            &format!("{}-holder", self.name),
            &self.dir,
            Command::new("nsenter").args([
                &format!("--net=/run/netns/{ns}"),
                "--",
                "unshare",
                "--mount",
                "--propagation",
                "slave",
                "--",
                "sh",
                "-c",
                &script,
            ]),
        )?;
        self.holder_pid = holder.pid().context("node holder pid")?;
        self.holder = Some(holder);
        // Wait until the holder has its mounts (its command is `sleep` then).
        for _ in 0..100 {
            let comm = std::fs::read_to_string(format!("/proc/{}/comm", self.holder_pid)).unwrap_or_default();
            if comm.trim() == "sleep" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.make_cgroups()?;
        self.link_down = false;
        self.partitioned = false;
        self.dead = false;
        Ok(())
    }

    /// Powers a powered-off node on again ([`Self::kill`] first): a fresh network stack and
    /// mount namespace, empty cgroups ([`Self::boot_network`]); the disk (`dir`: containerd's
    /// images and state, the kubelet's files, `/var/lib/baton`) is kept. Nothing runs yet.
    pub(crate) async fn power_on(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.dead, "lab node {} is running", self.name);
        let _ = ip(&["netns", "del", &self.netns]).await;
        self.remove_cgroups();
        self.boot_network().await
    }

    /// A handle on a node left behind by a dead process, for `Drop` to clean it up.
    fn stale(netns: &str, cgroup: &str) -> Self {
        Self {
            name: netns.to_owned(),
            addrs: Vec::new(),
            netns: netns.to_owned(),
            veth: String::new(),
            dir: PathBuf::new(),
            cgroup: cgroup.to_owned(),
            holder: None,
            holder_pid: 0,
            procs: Vec::new(),
            link_down: false,
            partitioned: false,
            dead: true,
            pod_cidr: String::new(),
            boot: NodeBoot::default(),
        }
    }

    /// `cmd` wrapped to run inside this node (its network and mount namespaces).
    pub(crate) fn command(&self, program: &Path) -> Command {
        let mut c = Command::new("nsenter");
        c.args(["-t", &self.holder_pid.to_string(), "-m", "-n", "--"])
            .arg(program);
        c
    }

    /// Spawns a long-running process in the node; it is killed with the node.
    pub(crate) fn spawn(&mut self, name: &str, cmd: &mut Command) -> anyhow::Result<()> {
        let p = Proc::spawn(&format!("{}-{name}", self.name), &self.dir, cmd)?;
        self.procs.push(p);
        Ok(())
    }

    fn make_cgroups(&self) -> anyhow::Result<()> {
        for c in CGROUP_CONTROLLERS {
            let base = Path::new("/sys/fs/cgroup").join(c);
            if !base.exists() {
                continue;
            }
            let path = base.join(self.cgroup.trim_start_matches('/'));
            std::fs::create_dir_all(&path).with_context(|| format!("creating cgroup {}", path.display()))?;
            if c == "cpuset" {
                // A new cpuset has no cpus/mems: copy them down from the root.
                let mut dir = base.clone();
                for part in self.cgroup.trim_start_matches('/').split('/') {
                    dir = dir.join(part);
                    for f in ["cpuset.cpus", "cpuset.mems"] {
                        let v = std::fs::read_to_string(base.join(f))?;
                        if std::fs::read_to_string(dir.join(f))
                            .unwrap_or_default()
                            .trim()
                            .is_empty()
                        {
                            std::fs::write(dir.join(f), v.trim())?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Starts containerd in the node and loads `images` into its `k8s.io` namespace.
    pub(crate) async fn start_runtime(&mut self, images: &[NodeImage]) -> anyhow::Result<()> {
        let d = self.dir.clone();
        let sock = d.join("containerd.sock");
        std::fs::create_dir_all(d.join("cni"))?;
        // The pod network: a bridge with the node's /24 (the hub routes it here); host-local
        // keeps its leases in the node's directory, not in the host's /var/lib/cni.
        let cni = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": "lab-pods",
            "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
                 "hairpinMode": true,
                 "ipam": {"type": "host-local", "dataDir": d.join("cni-ipam"),
                          "ranges": [[{"subnet": self.pod_cidr}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        });
        std::fs::write(
            d.join("cni/10-lab-pods.conflist"),
            serde_json::to_vec_pretty(&cni)?,
        )?;
        let config = format!(
            r#"version = 2
root = "{root}"
state = "/run/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{sock}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/library/pause:3.10"
  # The lab runs without CAP_SYS_RESOURCE: a container's oom_score_adj cannot go below ours.
  restrict_oom_score_adj = true
  # Pods' network namespaces under the state directory (the node's private /run/containerd),
  # not in the host's /run/netns: they go with the node.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
            root = d.join("containerd").display(),
            sock = sock.display(),
            opt = d.join("containerd-opt").display(),
            cni = d.join("cni").display(),
        );
        std::fs::write(d.join("containerd.toml"), config)?;
        let mut cmd = self.command(Path::new("containerd"));
        cmd.arg("--config").arg(d.join("containerd.toml"));
        self.spawn("containerd", &mut cmd)?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while ctr(&sock, &["version"]).await.is_err() {
            if tokio::time::Instant::now() > deadline {
                bail!("containerd of {} did not answer within 30 s", self.name);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for img in images {
            ctr(
                &sock,
                &[
                    "images",
                    "import",
                    "--base-name",
                    &img.repository,
                    &img.archive.display().to_string(),
                ],
            )
            .await
            .with_context(|| format!("loading {} into {}", img.archive.display(), self.name))?;
        }
        Ok(())
    }

    /// Starts the kubelet, talking to `kubeconfig` (the node's own API server).
    pub(crate) fn start_kubelet(&mut self, bin: &Path, kubeconfig: &Path, ca: &Path) -> anyhow::Result<()> {
        let d = self.dir.clone();
        let ip = self.addrs[0];
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# These machines run cgroup v1 (hybrid); Kubernetes 1.35 refuses it unless told (KEP-5573).
failCgroupV1: false
containerRuntimeEndpoint: unix://{sock}
cgroupDriver: cgroupfs
cgroupRoot: {cgroup}
address: {ip}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
failSwapOn: false
resolvConf: ""
podLogsDir: {logs}
# The lab shares one disk with everything else on the machine: never evict, never collect the
# loaded images (there is no registry to pull them from again).
evictionHard: {{memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 2s
syncFrequency: 5s
"#,
            sock = d.join("containerd.sock").display(),
            cgroup = self.cgroup,
            ca = ca.display(),
            logs = d.join("pod-logs").display(),
        );
        std::fs::write(d.join("kubelet.yaml"), config)?;
        let mut cmd = self.command(&bin.join("kubelet"));
        cmd.arg(format!("--config={}", d.join("kubelet.yaml").display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--root-dir={}", d.join("kubelet").display()))
            .arg(format!("--cert-dir={}", d.join("kubelet-pki").display()))
            .arg(format!("--hostname-override={}", self.name))
            .arg(format!("--node-ip={ip}"))
            .arg("--cloud-provider=external")
            .arg("--v=1");
        self.spawn("kubelet", &mut cmd)
    }

    /// Starts kube-controller-manager and kube-scheduler on the node (as a kubeadm
    /// control-plane node runs them), both with leader election on their Leases.
    pub(crate) fn start_controllers(
        &mut self,
        bin: &Path,
        kubeconfig: &Path,
        pki: &Path,
    ) -> anyhow::Result<()> {
        let election = [
            "--leader-elect=true",
            "--leader-elect-lease-duration=6s",
            "--leader-elect-renew-deadline=4s",
            "--leader-elect-retry-period=1s",
        ];
        let mut kcm = self.command(&bin.join("kube-controller-manager"));
        kcm.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(election)
            .arg("--secure-port=0")
            .arg(
                "--controllers=namespace-controller,garbage-collector-controller,endpointslice-controller,\
                 endpoints-controller,serviceaccount-controller,serviceaccount-token-controller,\
                 root-ca-certificate-publisher-controller,deployment-controller,replicaset-controller,\
                 daemonset-controller,node-lifecycle-controller",
            )
            .arg(format!(
                "--service-account-private-key-file={}",
                pki.join("sa.key").display()
            ))
            .arg(format!("--root-ca-file={}", pki.join("ca.crt").display()))
            .arg("--use-service-account-credentials=false")
            .arg("--concurrent-deployment-syncs=2");
        self.spawn("kube-controller-manager", &mut kcm)?;
        let mut sched = self.command(&bin.join("kube-scheduler"));
        sched
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--authentication-kubeconfig={}", kubeconfig.display()))
            .arg(format!("--authorization-kubeconfig={}", kubeconfig.display()))
            .args(election)
            .arg("--secure-port=0");
        self.spawn("kube-scheduler", &mut sched)
    }

    /// Starts kube-proxy in `mode` (`iptables`, `nftables`), talking to `kubeconfig` (the node's
    /// own API server); its health and metrics listen on the node's loopback.
    pub(crate) fn start_kube_proxy(
        &mut self,
        bin: &Path,
        kubeconfig: &Path,
        mode: &str,
    ) -> anyhow::Result<()> {
        let d = self.dir.clone();
        let config = format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
mode: {mode}
hostnameOverride: {name}
bindAddress: {ip}
# Kubernetes' default: load balancers check a node's kube-proxy here (baton on Hetzner does).
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
clusterCIDR: {cluster}
detectLocalMode: ClusterCIDR
# Leave the node's conntrack sysctls alone (the lab shares one kernel).
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
",
            kubeconfig = kubeconfig.display(),
            name = self.name,
            ip = self.addrs[0],
            cluster = crate::control_plane::CLUSTER_CIDR,
        );
        std::fs::write(d.join("kube-proxy.yaml"), config)?;
        let mut cmd = self.command(&bin.join("kube-proxy"));
        cmd.arg(format!("--config={}", d.join("kube-proxy.yaml").display()))
            .arg("--v=1");
        self.spawn("kube-proxy", &mut cmd)
    }

    /// Stops the node's process `name` (as [`Self::spawn`] named it), SIGTERM then SIGKILL.
    pub(crate) async fn stop(&mut self, name: &str) {
        let full = format!("{}-{name}", self.name);
        let mut kept = Vec::new();
        for p in self.procs.drain(..) {
            if p.name() == full {
                p.terminate(Duration::from_secs(5)).await;
            } else {
                kept.push(p);
            }
        }
        self.procs = kept;
    }

    /// Runs the node's boot units in order, as systemd runs oneshot units before the kubelet:
    /// one whose `ConditionPathExists=` path is missing on the node is skipped; one that fails
    /// is logged and the boot goes on. Output in `<dir>/<unit>.log`.
    pub(crate) async fn run_boot_units(&self) {
        for unit in &self.boot.units {
            let mut missing = None;
            for path in &unit.condition_path_exists {
                let there = self
                    .command(Path::new("test"))
                    .args(["-e", path])
                    .status()
                    .await
                    .is_ok_and(|s| s.success());
                if !there {
                    missing = Some(path.clone());
                    break;
                }
            }
            let log = self.dir.join(format!("{}.log", unit.name));
            if let Some(path) = missing {
                let _ = std::fs::write(&log, format!("skipped: ConditionPathExists={path} is missing\n"));
                continue;
            }
            let Some((program, args)) = unit.exec_start.split_first() else {
                continue;
            };
            let out = tokio::time::timeout(
                Duration::from_secs(30),
                self.command(Path::new(program))
                    .args(args)
                    .kill_on_drop(true)
                    .output(),
            )
            .await;
            let text = match out {
                Ok(Ok(o)) => format!(
                    "exit {}\n{}{}",
                    o.status,
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                ),
                Ok(Err(e)) => format!("not started: {e}\n"),
                Err(_) => "timed out after 30 s\n".into(),
            };
            // The log of this boot only.
            let _ = std::fs::write(&log, text);
        }
    }

    /// Takes the node's link down (`false`) or up: every packet to or from it is lost.
    pub(crate) async fn set_link(&mut self, up: bool) -> anyhow::Result<()> {
        ip(&["link", "set", &self.veth, if up { "up" } else { "down" }]).await?;
        self.link_down = !up;
        Ok(())
    }

    /// Partitions the node (`Some`), or removes the partition: TCP to `port` (its API server)
    /// arriving over the node's network is dropped, and so are etcd's answers (`etcd`, the
    /// shared etcd's address) — the node's API server is cut off from the cluster, for everyone,
    /// its own clients included, while the node's other ports and its traffic to anything else
    /// (the cloud) still work. Drops are in the input hook: lost on the wire, not refused.
    pub(crate) async fn set_partition(&mut self, port: Option<(u16, SocketAddr)>) -> anyhow::Result<()> {
        let mut script = "table inet baton_lab {}\ndelete table inet baton_lab\n".to_owned();
        if let Some((port, etcd)) = port {
            let family = if etcd.is_ipv4() { "ip" } else { "ip6" };
            let _ = write!(
                script,
                "table inet baton_lab {{\n  chain input {{\n    type filter hook input priority -10; policy accept;\n    \
                 iifname \"eth0\" tcp dport {port} drop comment \"partition\"\n    \
                 iifname \"eth0\" {family} saddr {} tcp sport {} drop comment \"partition: etcd\"\n  }}\n}}\n",
                etcd.ip(),
                etcd.port()
            );
        }
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.netns))
            .args(["--", "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("running nft in the node")?;
        {
            use tokio::io::AsyncWriteExt as _;
            let mut stdin = child.stdin.take().context("nft stdin")?;
            stdin.write_all(script.as_bytes()).await?;
        }
        let out = child.wait_with_output().await?;
        if !out.status.success() {
            bail!(
                "nft in {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        self.partitioned = port.is_some();
        Ok(())
    }

    /// Whether the node's link is down.
    pub(crate) fn is_link_down(&self) -> bool {
        self.link_down
    }

    /// Whether the node's API server port is cut off.
    pub(crate) fn is_partitioned(&self) -> bool {
        self.partitioned
    }

    /// The pids of every process of the node: in its network namespace, and in its cgroup tree
    /// (the containers of pods on the pod network have a network namespace of their own).
    pub(crate) fn pids(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = std::process::Command::new("ip")
            .args(["netns", "pids", &self.netns])
            .stderr(Stdio::null())
            .output()
            .map(|out| {
                String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        // cgroup v1 (these machines): the pids hierarchy; v2: the unified one.
        let mut dirs = Vec::new();
        for hierarchy in ["pids", "unified", ""] {
            let root = Path::new("/sys/fs/cgroup").join(hierarchy);
            collect_dirs(&root.join(self.cgroup.trim_start_matches('/')), &mut dirs);
        }
        for d in dirs {
            let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
            pids.extend(procs.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Powers the node off: the link goes down and every process in it (API server, kubelet,
    /// containerd, shims, containers) gets SIGKILL. Returns once they are gone.
    pub(crate) async fn kill(&mut self) -> anyhow::Result<()> {
        self.set_link(false).await?;
        self.kill_all();
        for p in self.procs.drain(..) {
            p.terminate(Duration::ZERO).await;
        }
        if let Some(h) = self.holder.take() {
            h.terminate(Duration::ZERO).await;
        }
        self.dead = true;
        Ok(())
    }

    /// SIGKILLs every process in the node (repeatedly, until none is left or 5 s passed).
    fn kill_all(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let pids: Vec<i32> = self.pids().into_iter().filter(|p| !is_zombie(*p)).collect();
            if pids.is_empty() || std::time::Instant::now() > deadline {
                return;
            }
            for p in pids {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn remove_cgroups(&self) {
        // Every hierarchy, not only those created here: runc also makes the pods' cgroups in
        // the unified (v2) one of a hybrid host.
        let hierarchies: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        for base in hierarchies {
            let root = base.join(self.cgroup.trim_start_matches('/'));
            // Depth first: a cgroup directory is removed with rmdir once it has no children.
            let mut dirs = Vec::new();
            collect_dirs(&root, &mut dirs);
            for d in dirs.iter().rev() {
                let _ = std::fs::remove_dir(d);
            }
            // The lab's and the shared parent, when empty.
            if let Some(lab) = root.parent() {
                let _ = std::fs::remove_dir(lab);
                if let Some(top) = lab.parent() {
                    let _ = std::fs::remove_dir(top);
                }
            }
        }
    }
}

impl Drop for Node {
    /// Kills everything in the node, removes its cgroups and its network namespace.
    fn drop(&mut self) {
        self.kill_all();
        for p in &mut self.procs {
            p.kill_now();
        }
        if let Some(h) = &mut self.holder {
            h.kill_now();
        }
        // Give the kernel a moment to reap what was killed before removing its cgroups.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while self.pids().iter().any(|p| !is_zombie(*p)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.remove_cgroups();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.netns])
            .stderr(Stdio::null())
            .status();
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    out.push(dir.to_owned());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('Z')))
        .unwrap_or(true)
}

async fn sysctl(key: &str, value: &str) -> anyhow::Result<()> {
    let out = Command::new("sysctl")
        .arg("-qw")
        .arg(format!("{key}={value}"))
        .output()
        .await
        .context("running sysctl")?;
    if !out.status.success() {
        bail!(
            "sysctl {key}={value}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

async fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .await
        .context("running `ip` (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

async fn ctr(sock: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("ctr")
        .arg("--address")
        .arg(sock)
        .args(["--namespace", "k8s.io"])
        .args(args)
        .output()
        .await
        .context("running `ctr` (Debian package containerd)")?;
    if !out.status.success() {
        bail!(
            "ctr {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
