//! Failing a lab node in each failure class, and healing it.
//!
//! A lab node `i` is the API server a [`ControlPlane`](crate::ControlPlane) runs on
//! `servers[i]`, plus every other address the node has ([`ControlPlane::node_addresses`]:
//! `servers[i]`, its private twin `192.0.2.x` when `servers[i]` is the lab public IP
//! `198.51.100.x` — the simulator topology's pairing — and [`Options::node_addresses`]).
//!
//! | class | inject | heal | what a client sees |
//! |---|---|---|---|
//! | [`Fault::Kill`] | SIGKILL the API server | restart it | connection refused |
//! | [`Fault::Hang`] | SIGSTOP the API server | SIGCONT | TCP connects (kernel backlog), nothing answers |
//! | [`Fault::Blackhole`] | nftables drops every packet to/from the node's addresses | remove the rules | connects time out |
//! | [`Fault::Partition`] | nftables drops TCP to/from the API server port on those addresses | remove the rules | the API server times out; other ports on the node still work |
//!
//! The network faults live in the nftables table `inet baton_lab` of the lab's network
//! namespace; each lab has its own namespace, so the rules are private to one test. All lab
//! traffic goes over `lo`, so every packet, whoever sends it, passes the `input` hook on its way
//! to the receiving socket: the rules match `ip saddr`/`ip daddr` there, in both directions.
//! They are not in the `output` hook on purpose: a packet dropped there fails the sender's
//! syscall (`sendto` answers EPERM), which no real blackhole does; dropped at input it is simply
//! lost, as on the wire. The whole table is
//! replaced atomically on every change (`nft -f -`) and deleted when the control plane drops.
//!
//! [`Options::node_addresses`]: crate::Options::node_addresses

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::process::Stdio;

use anyhow::{Context as _, bail};

/// The nftables table (family `inet`) holding the lab's network faults.
pub const NFT_TABLE: &str = "baton_lab";

/// A failure class a lab node can be put in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// The API server is killed (SIGKILL): connections are refused. Healed by restarting it.
    Kill,
    /// The API server is stopped (SIGSTOP): TCP connects still succeed (the kernel's backlog)
    /// but nothing is answered. Healed by SIGCONT.
    Hang,
    /// Every packet to or from the node's addresses is dropped (not rejected), including the
    /// simulator's FIP forwarding to the node.
    Blackhole,
    /// TCP to and from the API server's port on the node's addresses is dropped; everything else
    /// on the node (e.g. its baton replica talking to the cloud) still works.
    Partition,
}

impl Fault {
    /// Every class, in the order of the failover benchmark.
    pub const ALL: [Self; 4] = [Self::Kill, Self::Hang, Self::Blackhole, Self::Partition];

    /// Whether the fault is made with nftables rules (else with a signal).
    pub fn is_network(self) -> bool {
        matches!(self, Self::Blackhole | Self::Partition)
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Kill => "kill",
            Self::Hang => "hang",
            Self::Blackhole => "blackhole",
            Self::Partition => "partition",
        })
    }
}

/// The network faults of one control plane, as nftables rules.
#[derive(Debug, Default)]
pub(crate) struct Firewall {
    /// Node index → (its addresses, blackholed, partitioned).
    nodes: BTreeMap<usize, NodeRules>,
    /// Whether the table exists (so drop knows to delete it).
    installed: bool,
}

#[derive(Debug, Clone)]
struct NodeRules {
    addrs: Vec<IpAddr>,
    blackhole: bool,
    /// The API server port to cut, when partitioned.
    partition_port: Option<u16>,
}

impl Firewall {
    /// Blackholes (`on`) or un-blackholes node `i` with addresses `addrs`.
    pub(crate) async fn set_blackhole(&mut self, i: usize, addrs: &[IpAddr], on: bool) -> anyhow::Result<()> {
        self.node(i, addrs).blackhole = on;
        self.load().await
    }

    /// Partitions (`Some(port)`) or un-partitions node `i`'s API server port.
    pub(crate) async fn set_partition(
        &mut self,
        i: usize,
        addrs: &[IpAddr],
        port: Option<u16>,
    ) -> anyhow::Result<()> {
        self.node(i, addrs).partition_port = port;
        self.load().await
    }

    /// Removes every network fault of node `i`.
    pub(crate) async fn heal(&mut self, i: usize) -> anyhow::Result<()> {
        if self.nodes.remove(&i).is_some() {
            self.load().await?;
        }
        Ok(())
    }

    /// The network faults node `i` is in now.
    pub(crate) fn faults(&self, i: usize) -> Vec<Fault> {
        let Some(n) = self.nodes.get(&i) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if n.blackhole {
            out.push(Fault::Blackhole);
        }
        if n.partition_port.is_some() {
            out.push(Fault::Partition);
        }
        out
    }

    /// Deletes the table, synchronously (for `Drop`). Errors are ignored: the namespace, and
    /// the rules with it, go away with the lab anyway.
    pub(crate) fn remove_blocking(&mut self) {
        if !self.installed {
            return;
        }
        self.nodes.clear();
        let status = std::process::Command::new("nft")
            .args(["delete", "table", "inet", NFT_TABLE])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if status.is_ok_and(|s| s.success()) {
            self.installed = false;
        }
    }

    fn node(&mut self, i: usize, addrs: &[IpAddr]) -> &mut NodeRules {
        let n = self.nodes.entry(i).or_insert_with(|| NodeRules {
            addrs: Vec::new(),
            blackhole: false,
            partition_port: None,
        });
        n.addrs = addrs.to_vec();
        n
    }

    /// Replaces the table with the current rules (atomically: one `nft -f` transaction).
    async fn load(&mut self) -> anyhow::Result<()> {
        self.nodes
            .retain(|_, n| n.blackhole || n.partition_port.is_some());
        let script = self.render();
        run_nft(&script).await?;
        self.installed = !self.nodes.is_empty();
        Ok(())
    }

    /// The `nft -f` script: create-or-keep, delete, then (when there is any fault) the table.
    pub(crate) fn render(&self) -> String {
        let mut s = format!("table inet {NFT_TABLE} {{}}\ndelete table inet {NFT_TABLE}\n");
        if self.nodes.is_empty() {
            return s;
        }
        let mut rules = String::new();
        for (i, n) in &self.nodes {
            for (family, set) in families(&n.addrs) {
                if n.blackhole {
                    let _ = writeln!(
                        rules,
                        "    {family} saddr {set} drop comment \"node {i} blackhole\""
                    );
                    let _ = writeln!(
                        rules,
                        "    {family} daddr {set} drop comment \"node {i} blackhole\""
                    );
                }
                if let Some(port) = n.partition_port {
                    let _ = writeln!(
                        rules,
                        "    {family} daddr {set} tcp dport {port} drop comment \"node {i} partition\""
                    );
                    let _ = writeln!(
                        rules,
                        "    {family} saddr {set} tcp sport {port} drop comment \"node {i} partition\""
                    );
                }
            }
        }
        // Only the input hook: on `lo` every lab packet passes it, and a drop there looks like
        // loss on the wire. A drop in the output hook would instead fail the sender's syscall
        // (`sendto` → EPERM), which no real blackhole does.
        let _ = write!(
            s,
            "table inet {NFT_TABLE} {{\n  chain input {{\n    type filter hook input priority -10; policy accept;\n{rules}  }}\n"
        );
        s.push_str("}\n");
        s
    }
}

/// `[("ip", "{ 198.51.100.11, 192.0.2.11 }"), ("ip6", "{ … }")]` for the families present.
fn families(addrs: &[IpAddr]) -> Vec<(&'static str, String)> {
    let set = |v: Vec<String>| format!("{{ {} }}", v.join(", "));
    let v4: Vec<String> = addrs
        .iter()
        .filter(|a| a.is_ipv4())
        .map(ToString::to_string)
        .collect();
    let v6: Vec<String> = addrs
        .iter()
        .filter(|a| a.is_ipv6())
        .map(ToString::to_string)
        .collect();
    let mut out = Vec::new();
    if !v4.is_empty() {
        out.push(("ip", set(v4)));
    }
    if !v6.is_empty() {
        out.push(("ip6", set(v6)));
    }
    out
}

async fn run_nft(script: &str) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("running `nft` (Debian package nftables)")?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes()).await?;
    }
    let out = child.wait_with_output().await?;
    if !out.status.success() {
        bail!(
            "nft -f failed ({}): {}\nscript:\n{script}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab;

    #[test]
    fn rules_cover_every_address_of_the_node() {
        let mut fw = Firewall::default();
        let addrs = [lab::public_ip(11), lab::private_ip(11)];
        fw.node(0, &addrs).blackhole = true;
        fw.node(2, &[lab::public_ip(13)]).partition_port = Some(6443);
        let s = fw.render();
        assert!(s.starts_with("table inet baton_lab {}\ndelete table inet baton_lab\n"));
        assert_eq!(
            s.matches("ip saddr { 198.51.100.11, 192.0.2.11 } drop").count(),
            1,
            "{s}"
        );
        assert_eq!(
            s.matches("ip daddr { 198.51.100.11, 192.0.2.11 } drop").count(),
            1,
            "{s}"
        );
        assert_eq!(
            s.matches("ip daddr { 198.51.100.13 } tcp dport 6443 drop")
                .count(),
            1,
            "{s}"
        );
        assert_eq!(
            s.matches("ip saddr { 198.51.100.13 } tcp sport 6443 drop")
                .count(),
            1,
            "{s}"
        );
        assert!(s.contains("hook input"));
        assert_eq!(fw.faults(0), [Fault::Blackhole]);
        assert_eq!(fw.faults(2), [Fault::Partition]);
        assert!(fw.faults(1).is_empty());
        assert!(
            Firewall::default()
                .render()
                .ends_with("delete table inet baton_lab\n")
        );
    }
}
