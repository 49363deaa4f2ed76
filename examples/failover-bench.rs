//! Failover benchmark (run through `scripts/bench/failover`), one failure class at a time.
//!
//! In a lab with nodes: three control-plane lab nodes cp-0..2 (each its own network namespace on
//! the lab bridge, with a real API server on one shared etcd and a real kube-proxy), the
//! simulator with added API latency routing the FIP to its holder as the cloud does (the packets
//! keep the FIP as their destination), on every node `baton agent` (the node accepts the
//! control-plane FIPs), and two `baton controller` replicas (the binary in `BATON_BIN`), as the
//! shipped Deployment has: each on its own node, with `--node-name` that node (the downward
//! API's `spec.nodeName`), talking only to its node's API server (hostNetwork,
//! `KUBERNETES_SERVICE_HOST` = its host). They start on cp-0 (where the FIP starts) and cp-1;
//! cp-2 has none until the benchmark moves one there. The clients that measure run on the lab
//! host, which is no node. Each run fails one node in the chosen class and measures from that
//! moment until `https://<FIP>:6443/readyz` answers from another node; then it heals the node and
//! lets the replicas see it healthy again.
//!
//! **Placement.** Nothing forces the leader anywhere any more: the placement is what the
//! replicas make of it. A leader on the FIP holder's node hands the Lease to a live follower on
//! another node once things are quiet, and a FIP that moves prefers a node without the leader,
//! so before each run the benchmark only waits (at most 30 s) until the Lease holder's node is
//! not the FIP holder's. `leader-node`, `partition` and `colocated` first put the leader on the
//! FIP holder's node (the follower moves there if no replica runs on it, as a rescheduled pod
//! would: SIGTERM, then a new replica with a new identity `cp-<node>-<generation>`; then the
//! leader, if elsewhere, is restarted gracefully and the replica on the holder's node takes the
//! Lease) and let the hand-off move it off again.
//!
//! Classes (the node that fails is the *victim*):
//! - `kill`: the FIP holder's API server is SIGKILLed (connections refused);
//! - `hang`: the holder's API server is SIGSTOPped (TCP accepted by the kernel, nothing answers);
//! - `blackhole`: every packet to and from the holder's addresses is dropped;
//! - `dead-node`: blackhole, and the holder's baton replica (if one runs there) is killed;
//! - `leader-node`: the same, on a node whose replica held the Lease until the hand-off moved it
//!   off (CPEM #304/#319: with natural placement the hand-off has happened);
//! - `partition`: the holder's API server is unreachable for everyone (TCP to it is dropped, and
//!   so are etcd's answers to it, so its own replica cannot use it either), its replica (the
//!   leader until the hand-off) still reaches the cloud — it must not write as a leader;
//! - `busy`: `kill` while the simulator enforces 4 requests/s and LoadBalancer Services are
//!   created (and deleted 40 behind) at 4/s, so the controller's Service work always has more
//!   queued cloud calls than the limit lets through;
//! - `leader-only`: the leader's node dies (blackhole, its replica killed) while it does not
//!   hold the FIP. Nothing may move: for 8 s from the failure (a new leader within the lease
//!   duration, then settling) the FIP's retargets (0 expected, each a false move), the HTTP/2
//!   client's longest gap, and the Lease's transitions and lapse are counted; then the node is
//!   healed and its replica restarted. No recovery to time: a `windows=` line.
//! - `colocated`: the leader and the FIP holder start together on one node (the arrangement
//!   above), and the hand-off is timed: `handoff_*_ms` from the colocated replica's acquisition
//!   to the hand-off's write (the first Lease version naming the new holder),
//!   `handoff_leaderless_max_ms` from that write to the new holder's own first write; FIP PUTs
//!   from the arrangement until 3 s after the hand-off are false moves. A `windows=` line. The
//!   only follower is the replica just restarted on the old leader's node, so `handoff_*_ms`
//!   includes its becoming a live follower (its beats, every 3 s, seen to change) as well as
//!   the quiet the leader waits for, as after a rolling update.
//!
//! Grey classes (`--class grey`: a dependency turns slow, nothing or one API server fails):
//! - `etcd-stall`: etcd (shared by every API server) is stopped for each length of
//!   `--stalls-ms` (0.7, 1.5 and 3 s), `--runs` times each, 6 s apart; no node fails. One line
//!   per stall length.
//! - `slow-api`: every replica talks to its API server through a proxy that holds each write
//!   (log-normal, p50 150 ms, p99 600 ms; reads pass at once): first 30 s with nothing failing,
//!   then the `kill` runs.
//! - `slow-cloud`: `kill` with the cloud answering at p50 300 ms / p99 2 s, each write taking
//!   effect halfway through its latency, whether the client still waits or not.
//! - `rolling-update`: at the failure (`kill`), the replicas are replaced one by one as a
//!   Deployment's rolling update does (on each node that runs one, a new pod with a new name
//!   first, then the old one gets SIGTERM), while LoadBalancer Services are created and deleted
//!   at 4/s.
//!
//! The victim is the node holding the FIP, except in `leader-only` (the leader's node; natural
//! placement makes it another) and `colocated` (nothing fails). Every cloud write a replica
//! sends is attributed by its User-Agent (`controller/<identity>`) and checked against the Lease
//! history: `nonleader_writes` counts writes that arrived when their sender did not hold the
//! Lease. A client that keeps one HTTP/2 connection open through the FIP and sends a request
//! every 100 ms reports its longest gap.
//!
//! Every class also reports, over its failure windows (from each failure until the node is
//! healed and settled; for `slow-api` also the quiet 30 s; for `leader-only` the 8 s; for
//! `colocated` from the acquisition until 3 s after the hand-off):
//! - `lease_transitions`: acquisitions of the Lease by another replica, a hand-off included (the
//!   graceful restarts and hand-offs that arrange the placement are outside the windows);
//! - `leaderless_ms`: the longest stretch in which the Lease, as written, had lapsed: from a
//!   version's renew time plus the lease duration (or from a release) until the next version's
//!   renew or acquire time. A renewal that is late but lands is dated by its sending, as the
//!   replicas date it, so it is leaderless time only if it was sent after the lease lapsed. A
//!   hand-off is written within the old holder's lease and dated afresh, so it is no lapse
//!   (its own gap is `colocated`'s `handoff_leaderless_max_ms`);
//! - `duplicate_writes`: retarget PUTs beyond one per failure (sent, whatever their answer), plus
//!   the simulator's count of FIPs that ever carried the same tags as another (a second create
//!   for one Service).
//!
//! **Clouds.** `--cloud cherry` (the default) is the above: a retarget is Cherry's
//! `PUT /v1/ips/{id}`, routed when the simulator receives it. `--cloud hetzner` runs the same
//! classes on the simulator's Hetzner Cloud dialect, the replicas with `BATON_CLOUD=hetzner`,
//! `HCLOUD_TOKEN` and `HCLOUD_ENDPOINT`: a retarget is an assign action
//! (`POST /v1/floating_ips/{id}/actions/assign`) that runs `--action-ms` (a latency spec, 500 ms
//! by default), and the FIP is routed to its new node only when the action has succeeded, so
//! "after the call" includes the action's run. `retargets` counts the successful assign
//! requests sent by replicas; every line ends with `unassigns=<n>` (unassign actions of the FIP
//! sent by replicas over the class; a move must be one assign) and
//! `cloud=hetzner action_ms=<spec>`. `busy`'s rate limit is Hetzner's own bucket (3,600 requests
//! refilled at 1/s, one per token, which every replica shares) instead of Cherry's 4/s, and the
//! Services `busy` and `rolling-update` create carry `spec.loadBalancerClass:
//! baton.dev/floating-ip`, the class baton serves on Hetzner.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// a benchmark harness: a panic is the report
// Plot arithmetic on small counts (runs, pixels): the casts cannot lose anything that matters.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    clippy::cast_possible_wrap,
    clippy::many_single_char_names,
    clippy::too_many_lines
)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::controller::lease::LeaseConfig;
use baton_cloud::model::IpAddress;
use baton_cloud::{CherryClient, CloudKind};
use baton_sim::{Faults, HetznerSettings, SimHandle, Topology};
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, Profile, SlowApi, lab};
use common::leases::{LeaseHistory, LeaseVersion};
use tokio::process::Child;
use tokio::time::Instant;

const CP: [u64; 3] = [600_101, 600_102, 600_103];
const FAILURES: [&str; 9] = [
    "kill",
    "hang",
    "blackhole",
    "dead-node",
    "leader-node",
    "partition",
    "busy",
    "leader-only",
    "colocated",
];
/// The nodes that run a controller replica at the start (the shipped Deployment's 2 replicas).
const START_REPLICAS: usize = 2;
/// How long the replicas get to make the natural placement (or a hand-off) happen.
const PLACEMENT_WAIT: Duration = Duration::from_secs(30);
/// `leader-only`: the failure lasts this long (a new leader within the lease duration, then
/// settling) before the node is healed.
const LEADER_ONLY_WINDOW: Duration = Duration::from_secs(8);
/// The `spec.loadBalancerClass` of the Services baton serves on Hetzner Cloud.
const HETZNER_SERVICE_CLASS: &str = "baton.dev/floating-ip";
const GREY: [&str; 4] = ["etcd-stall", "slow-api", "slow-cloud", "rolling-update"];

/// Lease timings given to every replica (`--lease D,DEADLINE,INTERVAL` in ms), instead of the
/// shipped defaults.
#[derive(Clone, Copy, Debug)]
struct Lease {
    /// Milliseconds, each.
    duration: u64,
    deadline: u64,
    interval: u64,
}

impl std::str::FromStr for Lease {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let n: Vec<u64> = s
            .split(',')
            .map(|p| p.trim().parse::<u64>().map_err(|e| format!("--lease {s}: {e}")))
            .collect::<Result<_, _>>()?;
        let [duration, deadline, interval] = n[..] else {
            return Err(format!("--lease {s}: DURATION_MS,DEADLINE_MS,INTERVAL_MS"));
        };
        Ok(Self {
            duration,
            deadline,
            interval,
        })
    }
}

#[derive(Clone)]
struct Args {
    classes: Vec<String>,
    runs: usize,
    /// The cloud API's latency: `N` ms, or `P50,P99` (a log-normal draw per request, as
    /// `baton sim --latency-ms` takes it; the simulator applies each write when it receives it,
    /// whether the client still waits or not).
    latency: baton_sim::Latency,
    svg_dir: Option<String>,
    bin: String,
    /// Draw the plots again from a log of an earlier run (its per-run lines), run nothing.
    replot: Option<String>,
    lease: Option<Lease>,
    /// `etcd-stall`: the stall lengths.
    stalls_ms: Vec<u64>,
    /// The cloud the simulator speaks and the replicas drive (`--cloud`).
    cloud: CloudKind,
    /// Hetzner: how long an assign (or unassign) action runs before it ends (`--action-ms`, a
    /// latency spec as `--latency-ms`); the lab's route changes when it has succeeded.
    action_ms: baton_sim::Latency,
}

impl Args {
    /// The replicas' lease duration in ms (`--lease`, else the shipped default): a write later
    /// than this after its sender's last renew could come after a takeover.
    fn lease_ms(&self) -> u64 {
        self.lease.map_or_else(
            || u64::try_from(LeaseConfig::new("", "", "").duration.as_millis()).unwrap(),
            |l| l.duration,
        )
    }
}

fn args() -> Args {
    let mut a = Args {
        classes: vec!["kill".into()],
        runs: 30,
        latency: 100.into(),
        svg_dir: None,
        bin: std::env::var("BATON_BIN").unwrap_or_else(|_| "target/release/baton".into()),
        replot: None,
        lease: None,
        stalls_ms: vec![700, 1500, 3000],
        cloud: CloudKind::Cherry,
        action_ms: 500.into(),
    };
    let mut action_ms_given = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().expect("flag value");
        match flag.as_str() {
            "--class" => {
                let c = value();
                a.classes = if c == "all" {
                    FAILURES.iter().map(|s| (*s).to_owned()).collect()
                } else if c == "grey" {
                    GREY.iter().map(|s| (*s).to_owned()).collect()
                } else {
                    assert!(
                        FAILURES.contains(&c.as_str()) || GREY.contains(&c.as_str()),
                        "unknown class {c}; one of {FAILURES:?}, {GREY:?}, all or grey"
                    );
                    vec![c]
                };
            }
            "--runs" => a.runs = value().parse().expect("--runs N"),
            "--latency-ms" => a.latency = value().parse().expect("--latency-ms N or P50,P99"),
            "--svg-dir" => a.svg_dir = Some(value()),
            "--bin" => a.bin = value(),
            "--replot" => a.replot = Some(value()),
            "--lease" => a.lease = Some(value().parse().unwrap_or_else(|e: String| panic!("{e}"))),
            "--cloud" => a.cloud = value().parse().unwrap_or_else(|e| panic!("--cloud: {e}")),
            "--action-ms" => {
                a.action_ms = value().parse().expect("--action-ms N or P50,P99");
                action_ms_given = true;
            }
            "--stalls-ms" => {
                a.stalls_ms = value()
                    .split(',')
                    .map(|v| v.parse().expect("--stalls-ms MS,MS,.."))
                    .collect();
            }
            other => panic!(
                "unknown flag {other}; flags: --class CLASS|all|grey --runs N --cloud cherry|hetzner --action-ms N|P50,P99 (hetzner) --latency-ms N|P50,P99 --lease D,DEADLINE,INTERVAL (ms) --stalls-ms MS,.. --svg-dir DIR --bin PATH --replot LOG"
            ),
        }
    }
    assert!(
        !action_ms_given || a.cloud == CloudKind::Hetzner,
        "--action-ms is Hetzner's assign action time: it needs --cloud hetzner"
    );
    if a.replot.is_some() {
        return a;
    }
    // The replicas start inside the nodes' namespaces (nsenter), where a relative path would
    // not resolve.
    a.bin = std::fs::canonicalize(&a.bin)
        .unwrap_or_else(|e| panic!("{}: {e}", a.bin))
        .display()
        .to_string();
    a
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// The runs' failure → answer times: p50, p99 and the longest.
fn p50_p99_max(runs: &[Run]) -> (f64, f64, f64) {
    let mut sorted: Vec<f64> = runs.iter().map(|r| r.total_ms).collect();
    sorted.sort_by(f64::total_cmp);
    (
        percentile(&sorted, 50.0),
        percentile(&sorted, 99.0),
        sorted.last().copied().unwrap_or_default(),
    )
}

/// One failure and its recovery.
#[derive(Debug, Clone, Default)]
struct Run {
    /// Failure → FIP answers from another node.
    total_ms: f64,
    /// Failure → the retarget arrived at the cloud (detection, Lease takeover, decision, queue).
    to_call_ms: f64,
    /// The retarget call at the cloud.
    call_ms: f64,
    /// Longest gap between two answers of the HTTP/2 client around this failure.
    client_gap_ms: f64,
    retargets: usize,
}

#[derive(Debug, Default)]
struct Report {
    /// What follows `class=<class>` on the result line (`etcd-stall`: the stall length).
    label: String,
    runs: Vec<Run>,
    /// Failures with no failover to time (`etcd-stall`).
    windows: usize,
    false_moves: usize,
    retargets: usize,
    nonleader_writes: usize,
    lease_transitions: usize,
    leaderless_ms: u64,
    duplicate_writes: usize,
    client_gap_ms: f64,
    extra: String,
    /// Hetzner: unassign actions of the FIP sent by replicas (0 expected).
    unassigns: usize,
}

impl Report {
    /// Adds what the Lease history shows between `from_ms` and `to_ms` (wall clock).
    fn lease_window(&mut self, history: &LeaseHistory, from_ms: u64, to_ms: u64, lease_ms: u64) {
        let (transitions, leaderless) = lease_window(&history.entries(), from_ms, to_ms, lease_ms);
        self.lease_transitions += transitions;
        self.leaderless_ms = self.leaderless_ms.max(leaderless);
    }
}

/// Over `(from_ms, to_ms]` of a Lease history (renew or acquire time, holder; empty = released):
/// how many times another replica acquired it, and the longest time it had lapsed.
fn lease_window(entries: &[(u64, String)], from_ms: u64, to_ms: u64, lease_ms: u64) -> (usize, u64) {
    // A release keeps the holder's last renew time: it comes after that renew.
    let mut entries = entries.to_vec();
    entries.sort_by_key(|(t, h)| (*t, h.is_empty()));
    let entries = &entries[..];
    let mut prev = entries.iter().rev().find(|(t, _)| *t <= from_ms);
    let (mut transitions, mut longest) = (0, 0);
    let lapse = |(t, h): &(u64, String)| if h.is_empty() { *t } else { t + lease_ms };
    for e in entries.iter().filter(|(t, _)| *t > from_ms && *t <= to_ms) {
        if let Some(p) = prev {
            longest = longest.max(e.0.saturating_sub(lapse(p).max(from_ms)));
            if !e.1.is_empty() && !p.1.is_empty() && e.1 != p.1 {
                transitions += 1;
            }
            // A release and a new holder: an acquisition by another replica too.
            if !e.1.is_empty() && p.1.is_empty() {
                let before = entries.iter().rev().find(|(t, h)| *t <= p.0 && !h.is_empty());
                if before.is_some_and(|b| b.1 != e.1) {
                    transitions += 1;
                }
            }
        }
        prev = Some(e);
    }
    if let Some(p) = prev {
        longest = longest.max(to_ms.saturating_sub(lapse(p).max(from_ms)));
    }
    (transitions, longest)
}

fn main() {
    let a = args();
    if let Some(log) = &a.replot {
        replot(log, a.svg_dir.as_deref().unwrap_or("."));
        return;
    }
    for class in a.classes.clone() {
        let a2 = a.clone();
        let c = class.clone();
        let reports = lab::run(move || async move {
            if c == "etcd-stall" {
                etcd_stalls(a2).await
            } else {
                vec![run_class(c, a2).await]
            }
        });
        for report in reports {
            print_report(&class, &report, &a);
        }
    }
}

fn print_report(class: &str, report: &Report, a: &Args) {
    let svg_dir = a.svg_dir.as_deref();
    let grey = format!(
        "lease_transitions={} leaderless_ms={} duplicate_writes={}",
        report.lease_transitions, report.leaderless_ms, report.duplicate_writes
    );
    // At the very end, and only on Hetzner: a Cherry line reads as it always did.
    let cloud = match a.cloud {
        CloudKind::Cherry => String::new(),
        CloudKind::Hetzner => format!(
            " unassigns={} cloud=hetzner action_ms={}",
            report.unassigns, a.action_ms
        ),
    };
    let gap = report
        .runs
        .iter()
        .map(|r| r.client_gap_ms)
        .fold(report.client_gap_ms, f64::max);
    if report.runs.is_empty() {
        println!(
            "failover class={class}{} windows={} false_moves={} retargets={} nonleader_writes={} client_gap_max_ms={gap:.0} {grey}{}{cloud}",
            report.label,
            report.windows,
            report.false_moves,
            report.retargets,
            report.nonleader_writes,
            report.extra
        );
        return;
    }
    {
        let (p50, p99, max) = p50_p99_max(&report.runs);
        let mean = |f: fn(&Run) -> f64| report.runs.iter().map(f).sum::<f64>() / report.runs.len() as f64;
        for (i, r) in report.runs.iter().enumerate() {
            eprintln!(
                "{class} run {:2}: {:6.0} ms (to call {:4.0}, call {:4.0}, after {:4.0}; client gap {:5.0}; retargets {})",
                i + 1,
                r.total_ms,
                r.to_call_ms,
                r.call_ms,
                r.total_ms - r.to_call_ms - r.call_ms,
                r.client_gap_ms,
                r.retargets
            );
        }
        eprintln!(
            "{class}: mean to call {:.0} ms, call {:.0} ms, after the call {:.0} ms; longest client gap {gap:.0} ms",
            mean(|r| r.to_call_ms),
            mean(|r| r.call_ms),
            mean(|r| r.total_ms - r.to_call_ms - r.call_ms)
        );
        if let Some(dir) = svg_dir {
            let path = format!("{dir}/failover-{class}.svg");
            std::fs::write(&path, svg(class, &report.runs, p50, p99)).unwrap();
            eprintln!("wrote {path}");
        }
        println!(
            "failover class={class}{} p50_ms={p50:.0} p99_ms={p99:.0} max_ms={max:.0} runs={} false_moves={} retargets={} nonleader_writes={} client_gap_max_ms={gap:.0} {grey}{}{cloud}",
            report.label,
            report.runs.len(),
            report.false_moves,
            report.retargets,
            report.nonleader_writes,
            report.extra
        );
    }
}

/// The request that retargets `fip` in the simulator's dialect: Cherry's `PUT /v1/ips/{id}`,
/// Hetzner's assign action `POST /v1/floating_ips/{id}/actions/assign`.
fn retarget_request(sim: &SimHandle, fip: &IpAddress) -> (&'static str, String) {
    match sim.cloud() {
        CloudKind::Cherry => ("PUT", format!("/v1/ips/{}", fip.id.as_str())),
        CloudKind::Hetzner => (
            "POST",
            format!("/v1/floating_ips/{}/actions/assign", fip.id.as_str()),
        ),
    }
}

/// Successful retargets of `fip` (PUTs on Cherry, assign actions on Hetzner) sent by a
/// controller replica, from log sequence `from` on.
fn retargets(sim: &SimHandle, fip: &IpAddress, from: u64) -> Vec<baton_sim::LogEntry> {
    let (method, path) = retarget_request(sim, fip);
    sim.log(from)
        .into_iter()
        .filter(|e| {
            e.method == method && e.path == path && e.status < 300 && e.user_agent.contains("controller/")
        })
        .collect()
}

/// Hetzner: every unassign action of `fip` a controller replica sent, whatever its answer (a
/// move is one assign; an unassign would take the FIP off every node first).
fn unassign_count(sim: &SimHandle, fip: &IpAddress) -> usize {
    let path = format!("/v1/floating_ips/{}/actions/unassign", fip.id.as_str());
    sim.log(0)
        .iter()
        .filter(|e| e.method == "POST" && e.path == path && e.user_agent.contains("controller/"))
        .count()
}

fn next_seq(sim: &SimHandle) -> u64 {
    sim.log(0).last().map_or(0, |e| e.seq + 1)
}

fn holder_of(sim: &SimHandle, fip: &IpAddress) -> Option<usize> {
    let id = sim.peek_ip(fip.id.as_str())?.target()?.0;
    CP.iter().position(|&c| c == id)
}

/// The lab, the simulator, the agents and the replicas of one class, with the FIP answering and
/// a leader elected.
struct Bed {
    cp: ControlPlane,
    sim: SimHandle,
    fip: IpAddress,
    fleet: Fleet,
    /// By node: the replica running there, if any (two of the three nodes have one).
    replicas: Vec<Option<Child>>,
    /// The last generation given to a new replica's identity (`cp-<node>-<generation>`).
    generation: usize,
    history: LeaseHistory,
    probe: reqwest::Client,
    fresh: reqwest::Client,
    url: String,
    client: H2Client,
    _agents: Vec<Child>,
    _cloud: CherryClient,
    _slow: Vec<SlowApi>,
}

impl Bed {
    async fn start(class: &str, a: &Args) -> Self {
        let cp = ControlPlane::start(Options {
            nodes: true,
            ..Options::servers(3)
        })
        .await
        .unwrap();
        let faults = match class {
            // Cherry's documented limit, 4 requests/s per address (429 beyond). Hetzner's is the
            // per-token bucket (3,600, refilled at 1/s), which its dialect always enforces.
            "busy" if a.cloud == CloudKind::Cherry => Faults {
                latency_ms: a.latency.clone(),
                rate_limit: Some(4.0),
                ..Faults::none()
            },
            "slow-cloud" => Faults {
                latency_ms: "300,2000".parse().unwrap(),
                processing_ratio: 0.5,
                ..Faults::none()
            },
            _ => Faults {
                latency_ms: a.latency.clone(),
                ..Faults::none()
            },
        };
        let sim = match a.cloud {
            CloudKind::Cherry => common::routed_sim(faults, Topology::default()).await,
            CloudKind::Hetzner => {
                let settings = HetznerSettings {
                    action_ms: a.action_ms.clone(),
                    ..HetznerSettings::default()
                };
                common::routed_hetzner_sim(settings, faults).await
            }
        };
        if a.cloud == CloudKind::Hetzner && matches!(class, "busy" | "rolling-update") {
            // baton routes each Service FIP to a Ready Node whose kube-proxy is healthy: without
            // Nodes the churn's FIPs would be created and never routed.
            ready_nodes(&cp).await;
        }
        let agents: Vec<Child> = (0..3).map(|i| start_agent(&cp, &a.bin, i)).collect();
        let (cloud, fip) = common::control_plane_fip(&sim, ("cluster", "bench-cp"), CP[0]).await;
        let history = LeaseHistory::record(
            (0..3).map(|i| cp.client(i).unwrap()).collect(),
            "baton-controller",
        );
        let mut slow = Vec::new();
        let mut urls = vec![None, None, None];
        if class == "slow-api" {
            for (i, url) in urls.iter_mut().enumerate() {
                let profile = Profile::writes(Duration::from_millis(150), Duration::from_millis(600))
                    .unwrap()
                    .with_seed(i as u64 + 1);
                let s = SlowApi::start(&cp, i, profile).await.unwrap();
                *url = Some(s.url());
                slow.push(s);
            }
        }
        let fleet = Fleet {
            bin: a.bin.clone(),
            class: class.to_owned(),
            lease: a.lease,
            urls,
        };
        let replicas: Vec<Option<Child>> = (0..3)
            .map(|i| (i < START_REPLICAS).then(|| fleet.start(&cp, &sim, i, &format!("cp-{i}"))))
            .collect();

        let ca = cp.ca_der().to_vec();
        let probe = baton_testbed::http_client(Some(&ca)).unwrap();
        // Recovery is what a new client sees: a new connection through the FIP for every probe
        // (no pooled connection left over from before the failure).
        let fresh = fresh_client(&ca);
        let fip_addr = SocketAddr::new(fip.address, 6443);
        let url = format!("https://{fip_addr}/readyz");
        common::wait_for("the FIP answers", Duration::from_secs(60), || {
            answers(&probe, &url)
        })
        .await;
        common::wait_for("a leader", Duration::from_secs(30), || {
            let h = history.holder();
            async move { h.is_some() }
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let client = H2Client::start(&ca, &url);
        Self {
            cp,
            sim,
            fip,
            fleet,
            replicas,
            generation: 0,
            history,
            probe,
            fresh,
            url,
            client,
            _agents: agents,
            _cloud: cloud,
            _slow: slow,
        }
    }

    /// A new generation for the identities of replicas started from now on.
    fn next_generation(&mut self) -> usize {
        self.generation += 1;
        self.generation
    }

    /// Starts a replica on node `i` with a new identity (a new pod, as a Deployment makes one).
    fn start_replica(&mut self, i: usize) {
        assert!(self.replicas[i].is_none(), "a replica runs on cp-{i} already");
        let identity = format!("cp-{i}-{}", self.next_generation());
        self.replicas[i] = Some(self.fleet.start(&self.cp, &self.sim, i, &identity));
    }

    /// Counts what the whole class did: writes by replicas that did not hold the Lease, FIPs
    /// created twice; stops the replicas.
    async fn finish(mut self, report: &mut Report, lease_ms: u64, dup_before: u64) {
        let log = self.sim.log(0);
        let bad = self.history.nonleader_writes(&log, lease_ms);
        for w in &bad {
            eprintln!(
                "non-leader write: {} {} from {:?} at {}",
                w.method, w.path, w.user_agent, w.unix_ms
            );
        }
        report.nonleader_writes = bad.len();
        report.unassigns = unassign_count(&self.sim, &self.fip);
        let dup = usize::try_from(self.sim.stats().duplicate_fips.saturating_sub(dup_before)).unwrap();
        report.duplicate_writes += dup;
        self.client.stop();
        for r in self.replicas.iter_mut().flatten() {
            let _ = r.kill().await;
        }
    }
}

/// How the replicas are started: the binary, lease timings, and per node the API server URL
/// (a slow proxy's) when it is not the node's own.
struct Fleet {
    bin: String,
    class: String,
    lease: Option<Lease>,
    urls: Vec<Option<String>>,
}

impl Fleet {
    /// `baton controller` replica `identity` on node cp-i (`--node-name cp-i`), talking only to
    /// API server i.
    fn start(&self, cp: &ControlPlane, sim: &SimHandle, i: usize, identity: &str) -> Child {
        let churn = matches!(self.class.as_str(), "busy" | "rolling-update");
        let kubeconfig = match &self.urls[i] {
            Some(url) => cp.write_kubeconfig_for(url, ADMIN_TOKEN).unwrap(),
            None => cp.write_kubeconfig(i, ADMIN_TOKEN).unwrap(),
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(logs_dir().join(format!("{}-cp-{i}.log", self.class)))
            .unwrap();
        let mut controller = cp.node_command(&format!("cp-{i}"), &self.bin).unwrap();
        if churn {
            match sim.cloud() {
                // A FIP for every LoadBalancer Service, handed to kube-vip (an annotation).
                CloudKind::Cherry => controller
                    .env("CHERRY_REGION_NAME", "LT-Siauliai")
                    .env("CHERRY_LOAD_BALANCER", "kube-vip://"),
                // A FIP for every Service of baton's class, in the lab's location, routed by
                // baton to a healthy node (Hetzner has no BGP: no load balancer is configured).
                CloudKind::Hetzner => controller.env("CHERRY_REGION_NAME", "fsn1"),
            };
        }
        match sim.cloud() {
            CloudKind::Cherry => controller
                .env("CHERRY_API_KEY", "sim-token")
                .env("CHERRY_PROJECT_ID", "123456")
                .env("CHERRY_BASE_URL", sim.base_url().as_str()),
            CloudKind::Hetzner => controller
                .env("BATON_CLOUD", "hetzner")
                .env("HCLOUD_TOKEN", sim.api_key())
                .env("HCLOUD_ENDPOINT", format!("{}v1", sim.base_url())),
        };
        if let Some(l) = self.lease {
            controller
                .env("BATON_LEASE_DURATION", format!("{}ms", l.duration))
                .env("BATON_LEASE_RENEW_DEADLINE", format!("{}ms", l.deadline))
                .env("BATON_LEASE_RENEW_INTERVAL", format!("{}ms", l.interval));
        }
        controller
            .env("BATON_LOG", "info,baton=debug")
            .arg("controller")
            .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
            .args(["--identity", identity, "--admin-listen", "off"])
            .args(["--node-name", &format!("cp-{i}")])
            .env("CHERRY_FIP_TAG", "cluster=bench-cp")
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin))
    }
}

/// `etcd-stall`: one report per stall length; nothing fails, nothing may move.
async fn etcd_stalls(a: Args) -> Vec<Report> {
    let bed = Bed::start("etcd-stall", &a).await;
    let dup_before = bed.sim.stats().duplicate_fips;
    let mut reports = Vec::new();
    for &stall in &a.stalls_ms {
        let mut report = Report {
            label: format!(" stall_ms={stall}"),
            ..Report::default()
        };
        for run in 0..a.runs {
            let seq0 = next_seq(&bed.sim);
            let (t0, from_ms) = (Instant::now(), common::unix_ms());
            bed.cp.stall_etcd(Duration::from_millis(stall)).unwrap();
            tokio::time::sleep(Duration::from_millis(stall) + Duration::from_secs(6)).await;
            let moves = put_count(&bed.sim, &bed.fip, seq0);
            let (transitions, leaderless) =
                lease_window(&bed.history.entries(), from_ms, common::unix_ms(), a.lease_ms());
            let gap = bed.client.longest_gap(t0, Instant::now()).as_secs_f64() * 1000.0;
            eprintln!(
                "etcd-stall {stall} ms, stall {}: lease transitions {transitions}, leaderless {leaderless} ms, retargets sent {moves}, client gap {gap:.0} ms",
                run + 1
            );
            report.windows += 1;
            report.lease_transitions += transitions;
            report.leaderless_ms = report.leaderless_ms.max(leaderless);
            report.false_moves += moves;
            report.retargets += moves;
            report.duplicate_writes += moves.saturating_sub(1);
            report.client_gap_ms = report.client_gap_ms.max(gap);
        }
        reports.push(report);
    }
    let mut total = Report::default();
    bed.finish(&mut total, a.lease_ms(), dup_before).await;
    if let Some(last) = reports.last_mut() {
        // Counted over the whole class.
        last.nonleader_writes = total.nonleader_writes;
        last.unassigns = total.unassigns;
        last.duplicate_writes += total.duplicate_writes;
    }
    reports
}

/// Every retarget of `fip` (a PUT on Cherry, an assign on Hetzner) a controller replica sent
/// from log sequence `from` on, whatever its answer.
fn put_count(sim: &SimHandle, fip: &IpAddress, from: u64) -> usize {
    let (method, path) = retarget_request(sim, fip);
    sim.log(from)
        .iter()
        .filter(|e| e.method == method && e.path == path && e.user_agent.contains("controller/"))
        .count()
}

async fn run_class(class: String, a: Args) -> Report {
    let churning = matches!(class.as_str(), "busy" | "rolling-update");
    let mut bed = Bed::start(&class, &a).await;
    let lease_ms = a.lease_ms();
    let dup_before = bed.sim.stats().duplicate_fips;
    let created = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let churn = churning.then(|| {
        tokio::spawn(churn_services(
            (0..3).map(|i| bed.cp.client(i).unwrap()).collect(),
            Arc::clone(&created),
            // On Hetzner baton serves the Services of its own class only.
            (a.cloud == CloudKind::Hetzner).then_some(HETZNER_SERVICE_CLASS),
        ))
    });
    if churning {
        // Let the queue fill before the first failure.
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    let stats_before = bed.sim.stats();
    let log_from = next_seq(&bed.sim);
    let created_before = created.load(std::sync::atomic::Ordering::Relaxed);

    let mut report = Report::default();
    if class == "slow-api" {
        // Nothing fails for 30 s: the slow writes alone must not cost the Lease or move the FIP.
        // The window opens once the placement holds: the hand-off that arranges it (the leader
        // starts on the holder's node) is outside every window.
        natural_placement(&bed, "slow-api (before the quiet 30 s)").await;
        let (seq, from_ms) = (next_seq(&bed.sim), common::unix_ms());
        tokio::time::sleep(Duration::from_secs(30)).await;
        report.lease_window(&bed.history, from_ms, common::unix_ms(), lease_ms);
        let moves = put_count(&bed.sim, &bed.fip, seq);
        report.false_moves += moves;
        report.retargets += moves;
        eprintln!(
            "slow-api quiet 30 s: lease transitions {}, leaderless {} ms, retargets sent {moves}",
            report.lease_transitions, report.leaderless_ms
        );
    }
    let mut times = LeaseTimes::default();
    for run in 0..a.runs {
        match class.as_str() {
            "leader-only" => {
                leader_only(&mut bed, &mut report, &mut times, lease_ms, run).await;
                continue;
            }
            "colocated" => {
                colocated(&mut bed, &mut report, &mut times, lease_ms, run).await;
                continue;
            }
            "leader-node" | "partition" => {
                // With natural placement the hand-off has happened: the leader was on the FIP
                // holder's node and has left it.
                let holder = holder_of(&bed.sim, &bed.fip).expect("the FIP is routed");
                colocate(&mut bed, holder).await;
                natural_placement(&bed, &class).await;
            }
            _ => {
                natural_placement(&bed, &class).await;
            }
        }
        let victim = holder_of(&bed.sim, &bed.fip).expect("the FIP is routed");
        // dead-node and leader-node: whether a replica ran on the victim (restarted at the heal).
        let mut killed = false;
        let seq0 = next_seq(&bed.sim);
        let t0 = Instant::now();
        let t0_unix = common::unix_ms();
        let total = match class.as_str() {
            "kill" | "busy" | "slow-api" | "slow-cloud" => {
                bed.cp.kill_apiserver(victim).await;
                recover(&bed.fresh, &bed.url, &bed.sim, &bed.fip, victim, t0).await
            }
            "rolling-update" => {
                bed.cp.kill_apiserver(victim).await;
                let generation = bed.next_generation();
                let Bed {
                    cp,
                    sim,
                    fleet,
                    replicas,
                    fresh,
                    url,
                    fip,
                    ..
                } = &mut bed;
                let (total, ()) = tokio::join!(
                    recover(fresh, url, sim, fip, victim, t0),
                    roll(cp, sim, fleet, replicas, generation)
                );
                total
            }
            "hang" => {
                bed.cp.hang(victim).unwrap();
                recover(&bed.fresh, &bed.url, &bed.sim, &bed.fip, victim, t0).await
            }
            "blackhole" => {
                bed.cp.blackhole(victim).await.unwrap();
                recover(&bed.fresh, &bed.url, &bed.sim, &bed.fip, victim, t0).await
            }
            "partition" => {
                bed.cp.partition(victim).await.unwrap();
                recover(&bed.fresh, &bed.url, &bed.sim, &bed.fip, victim, t0).await
            }
            "dead-node" | "leader-node" => {
                bed.cp.blackhole(victim).await.unwrap();
                if let Some(mut r) = bed.replicas[victim].take() {
                    r.kill().await.unwrap();
                    killed = true;
                }
                recover(&bed.fresh, &bed.url, &bed.sim, &bed.fip, victim, t0).await
            }
            _ => unreachable!(),
        };
        let total_ms = total.as_secs_f64() * 1000.0;
        // Heal, and let every replica see the node healthy again before the next run.
        match class.as_str() {
            "kill" | "busy" | "slow-api" | "slow-cloud" | "rolling-update" => {
                bed.cp.start_apiserver(victim).await.unwrap();
            }
            "hang" => bed.cp.unhang(victim).unwrap(),
            "blackhole" | "partition" => bed.cp.heal(victim).await.unwrap(),
            "dead-node" | "leader-node" => {
                bed.cp.heal(victim).await.unwrap();
                if killed {
                    bed.start_replica(victim);
                }
            }
            _ => unreachable!(),
        }
        settle(&bed, victim).await;
        let moves = retargets(&bed.sim, &bed.fip, seq0);
        let sent = put_count(&bed.sim, &bed.fip, seq0);
        let first = moves.first().expect("a replica moved the FIP");
        report.lease_window(&bed.history, t0_unix, common::unix_ms(), lease_ms);
        let result = Run {
            total_ms,
            to_call_ms: first.unix_ms.saturating_sub(t0_unix) as f64,
            call_ms: first.duration_ms as f64,
            client_gap_ms: bed
                .client
                .longest_gap(t0, t0 + total + Duration::from_secs(2))
                .as_secs_f64()
                * 1000.0,
            retargets: moves.len(),
        };
        eprintln!(
            "{class} run {}: {:.0} ms, victim cp-{victim}, {} retarget(s), {sent} {} sent",
            run + 1,
            total_ms,
            moves.len(),
            match bed.sim.cloud() {
                CloudKind::Cherry => "PUT(s)",
                CloudKind::Hetzner => "assign(s)",
            }
        );
        report.retargets += moves.len();
        report.false_moves += moves.len().saturating_sub(1);
        report.duplicate_writes += sent.saturating_sub(1);
        report.runs.push(result);
    }
    report.extra = times.extra(&class);
    // A quiet period: nothing fails, nothing may move.
    let seq = next_seq(&bed.sim);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let quiet = retargets(&bed.sim, &bed.fip, seq).len();
    report.false_moves += quiet;
    report.retargets += quiet;
    if let Some(churn) = churn {
        churn.abort();
        let stats = bed.sim.stats();
        let fips_created = bed
            .sim
            .log(log_from)
            .iter()
            .filter(|e| {
                let create = match bed.sim.cloud() {
                    CloudKind::Cherry => e.path.ends_with("/ips"),
                    CloudKind::Hetzner => e.path == "/v1/floating_ips",
                };
                e.method == "POST" && create && e.status < 300
            })
            .count();
        report.extra = format!(
            " services_created={} service_fips_created={fips_created} cloud_requests={} got_429={}",
            created.load(std::sync::atomic::Ordering::Relaxed) - created_before,
            stats.requests.saturating_sub(stats_before.requests),
            stats.rate_limited.saturating_sub(stats_before.rate_limited)
        );
        if bed.sim.cloud() == CloudKind::Hetzner {
            // baton routes each Service FIP to a healthy node: assign actions of its own,
            // through the same client and bucket as the control-plane FIP's.
            let (_, cp_assign) = retarget_request(&bed.sim, &bed.fip);
            let service_assigns = bed
                .sim
                .log(log_from)
                .iter()
                .filter(|e| {
                    e.method == "POST"
                        && e.route == "/v1/floating_ips/{id}/actions/assign"
                        && e.path != cp_assign
                        && e.status < 300
                        && e.user_agent.contains("controller/")
                })
                .count();
            let _ = write!(report.extra, " service_fip_assigns={service_assigns}");
        }
    }
    bed.finish(&mut report, lease_ms, dup_before).await;
    report
}

/// Waits (at most [`PLACEMENT_WAIT`]) until the natural placement holds: the Lease's holder runs
/// on another node than the FIP's holder. Nothing forces it: a leader on the holder's node hands
/// the Lease to a live follower elsewhere by itself once things are quiet, and a FIP that moves
/// prefers a node without the leader. The FIP itself is never moved behind the replicas' back:
/// they would act on a holder they have not read yet. Returns (the leader's node, the FIP
/// holder's).
async fn natural_placement(bed: &Bed, what: &str) -> (usize, usize) {
    let started = Instant::now();
    loop {
        let leader = bed.history.holder();
        let holder = holder_of(&bed.sim, &bed.fip);
        match (leader.as_deref().and_then(node_of), holder) {
            (Some(l), Some(h)) if l != h && renewed_by_its_holder(&bed.history) => return (l, h),
            (l, h) => assert!(
                started.elapsed() < PLACEMENT_WAIT,
                "{what}: the leader did not leave the FIP holder's node within {} s (Lease holder {leader:?} on node {l:?}, FIP on node {h:?}): no hand-off to a live follower on another node",
                PLACEMENT_WAIT.as_secs()
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the Lease's last version is a renew by its holder: not a hand-off's write naming a
/// follower that has not taken the Lease yet (that write's renewTime is set before its
/// acquireTime), nor the taking write itself. A failure is injected only once the new leader
/// leads: a failure in the few hundred ms of a hand-off is the hand-off's cost, timed by
/// `colocated`, not the failure class's.
fn renewed_by_its_holder(history: &LeaseHistory) -> bool {
    // `versions()` is in write order.
    history.versions().last().is_some_and(|v| {
        !v.holder.is_empty() && matches!((v.acquire_ms, v.renew_ms), (Some(a), Some(r)) if r > a)
    })
}

/// Puts the leader on `holder`, the FIP holder's node, as it is before a hand-off. If no replica
/// runs there, the follower moves there (SIGTERM, then a new replica with a new identity, as a
/// rescheduled pod); then, if the leader runs elsewhere, it is restarted gracefully: it releases
/// the Lease, the replica on `holder` takes it, and a new replica starts on the leader's node.
/// Returns the wall-clock ms of that acquisition, or `None` when the leader was on `holder`
/// already.
async fn colocate(bed: &mut Bed, holder: usize) -> Option<u64> {
    let history = bed.history.clone();
    common::wait_for("a leader", Duration::from_secs(10), || {
        let leader = leader_of(&history);
        async move { leader.is_some() }
    })
    .await;
    let leader = leader_of(&history).expect("a leader");
    if bed.replicas[holder].is_none() {
        let follower = (0..bed.replicas.len())
            .find(|&i| i != leader && bed.replicas[i].is_some())
            .expect("a follower replica to move");
        stop_gracefully(&mut bed.replicas, follower).await;
        bed.start_replica(holder);
    }
    if leader == holder {
        return None;
    }
    let from_ms = common::unix_ms();
    stop_gracefully(&mut bed.replicas, leader).await;
    common::wait_for(
        "the replica on the FIP holder's node to take the Lease",
        Duration::from_secs(15),
        || {
            let on = leader_of(&history);
            async move { on == Some(holder) }
        },
    )
    .await;
    bed.start_replica(leader);
    let acquired = history
        .versions()
        .into_iter()
        .find(|v| v.acquire_ms.is_some_and(|t| t >= from_ms) && node_of(&v.holder) == Some(holder))
        .and_then(|v| v.acquire_ms);
    Some(acquired.expect("the Lease version of the acquisition on the FIP holder's node"))
}

/// A hand-off as the Lease's versions show it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HandoffSeen {
    /// The identity the Lease was handed to.
    to: String,
    /// The renew time of the first version naming it (written by the old leader).
    written_ms: u64,
    /// The renew time of its own first write (the next version naming it with a later renew
    /// time; a follower's beat in between keeps the renew time).
    own_ms: Option<u64>,
    /// The version naming it came after a release or after the old holder's lease had lapsed:
    /// a takeover, not a hand-off.
    takeover: bool,
}

/// The first move of the Lease off `node` after the term that began (acquireTime) at
/// `acquired_ms` on it.
fn handoff_after(
    versions: &[LeaseVersion],
    node: usize,
    acquired_ms: u64,
    lease_ms: u64,
) -> Option<HandoffSeen> {
    let start = versions
        .iter()
        .position(|v| v.acquire_ms == Some(acquired_ms) && node_of(&v.holder) == Some(node))?;
    let rest = &versions[start..];
    let i = rest
        .iter()
        .position(|v| !v.holder.is_empty() && node_of(&v.holder) != Some(node))?;
    let to = &rest[i];
    let written_ms = to.renew_ms?;
    let last_renew = rest[..i].iter().filter_map(|v| v.renew_ms).max()?;
    let released = rest[..i].iter().any(|v| v.holder.is_empty());
    let own_ms = rest[i + 1..]
        .iter()
        .take_while(|v| v.holder == to.holder)
        .find_map(|v| v.renew_ms.filter(|&t| t > written_ms));
    Some(HandoffSeen {
        to: to.holder.clone(),
        written_ms,
        own_ms,
        takeover: released || written_ms > last_renew + lease_ms,
    })
}

/// `colocated` and `leader-only`: what the Lease did, per window, beyond the report's counts.
#[derive(Debug, Default)]
struct LeaseTimes {
    /// `colocated`: the colocated replica's acquisition → the hand-off's write.
    handoff_ms: Vec<u64>,
    /// `colocated`: the hand-off's write → the new holder's own first write.
    handoff_leaderless_ms: Vec<u64>,
    /// `colocated`: moves off the holder's node that were takeovers, not hand-offs.
    takeovers: usize,
    /// `leader-only`: the failure → a new holder's acquisition.
    takeover_ms: Vec<u64>,
}

impl LeaseTimes {
    /// The class's fields on its result line.
    fn extra(&self, class: &str) -> String {
        let max = |v: &[u64]| v.iter().copied().max().unwrap_or_default();
        match class {
            "colocated" => {
                let mut sorted: Vec<f64> = self.handoff_ms.iter().map(|&t| t as f64).collect();
                sorted.sort_by(f64::total_cmp);
                let p50 = if sorted.is_empty() {
                    0.0
                } else {
                    percentile(&sorted, 50.0)
                };
                format!(
                    " handoff_p50_ms={p50:.0} handoff_max_ms={} handoff_leaderless_max_ms={} handoff_takeovers={}",
                    max(&self.handoff_ms),
                    max(&self.handoff_leaderless_ms),
                    self.takeovers
                )
            }
            "leader-only" => format!(" takeover_max_ms={}", max(&self.takeover_ms)),
            _ => String::new(),
        }
    }
}

/// After a heal: waits until node `victim` answers directly, and 3 s more for every replica to
/// see it healthy again.
async fn settle(bed: &Bed, victim: usize) {
    let direct = format!(
        "https://{}/readyz",
        SocketAddr::new(bed.cp.addresses()[victim], 6443)
    );
    common::wait_for("the healed node answers", Duration::from_secs(60), || {
        answers(&bed.probe, &direct)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
}

/// `leader-only`, one window: the leader's node dies (blackhole, its replica killed) while the
/// FIP is on another node. Nothing may move; a follower takes the Lease within its duration.
async fn leader_only(bed: &mut Bed, report: &mut Report, times: &mut LeaseTimes, lease_ms: u64, run: usize) {
    let (victim, holder) = natural_placement(bed, "leader-only").await;
    let seq0 = next_seq(&bed.sim);
    let (t0, t0_unix) = (Instant::now(), common::unix_ms());
    bed.cp.blackhole(victim).await.unwrap();
    if let Some(mut r) = bed.replicas[victim].take() {
        r.kill().await.unwrap();
    }
    tokio::time::sleep_until(t0 + LEADER_ONLY_WINDOW).await;
    let end_ms = common::unix_ms();
    let gap = bed.client.longest_gap(t0, Instant::now()).as_secs_f64() * 1000.0;
    let (transitions, leaderless) = lease_window(&bed.history.entries(), t0_unix, end_ms, lease_ms);
    let takeover = bed
        .history
        .versions()
        .iter()
        .filter(|v| !v.holder.is_empty() && node_of(&v.holder) != Some(victim))
        .find_map(|v| v.acquire_ms.filter(|&t| t > t0_unix))
        .map(|t| t - t0_unix);
    bed.cp.heal(victim).await.unwrap();
    bed.start_replica(victim);
    settle(bed, victim).await;
    // Every PUT until the node is healed and settled: the FIP's holder never failed.
    let moves = put_count(&bed.sim, &bed.fip, seq0);
    eprintln!(
        "leader-only window {}: victim cp-{victim} (the leader), FIP on cp-{holder}, new leader after {} ms, lease transitions {transitions}, leaderless {leaderless} ms, retargets sent {moves}, client gap {gap:.0} ms",
        run + 1,
        takeover.map_or_else(|| "no".to_owned(), |t| t.to_string())
    );
    times.takeover_ms.extend(takeover);
    report.windows += 1;
    report.lease_transitions += transitions;
    report.leaderless_ms = report.leaderless_ms.max(leaderless);
    report.false_moves += moves;
    report.retargets += moves;
    report.client_gap_ms = report.client_gap_ms.max(gap);
}

/// `colocated`, one window: the leader is put on the FIP holder's node ([`colocate`]) and the
/// hand-off that moves it off is timed from the Lease's versions. Nothing may move the FIP.
async fn colocated(bed: &mut Bed, report: &mut Report, times: &mut LeaseTimes, lease_ms: u64, run: usize) {
    natural_placement(bed, "colocated").await;
    let holder = holder_of(&bed.sim, &bed.fip).expect("the FIP is routed");
    let seq0 = next_seq(&bed.sim);
    let t0 = Instant::now();
    // Natural placement first: the leader is elsewhere, so the replica on the holder's node
    // takes the Lease afresh.
    let acquired_ms = colocate(bed, holder)
        .await
        .expect("the leader was on another node than the FIP holder's");
    let (leader, _) = natural_placement(bed, "colocated (the hand-off)").await;
    let history = bed.history.clone();
    common::wait_for(
        "the new holder's own first write after the hand-off",
        Duration::from_secs(10),
        || {
            let seen = handoff_after(&history.versions(), holder, acquired_ms, lease_ms);
            async move { seen.is_some_and(|s| s.own_ms.is_some()) }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let end_ms = common::unix_ms();
    let seen =
        handoff_after(&history.versions(), holder, acquired_ms, lease_ms).expect("the hand-off's versions");
    let handoff = seen.written_ms.saturating_sub(acquired_ms);
    let leaderless = seen
        .own_ms
        .unwrap_or(seen.written_ms)
        .saturating_sub(seen.written_ms);
    let moves = put_count(&bed.sim, &bed.fip, seq0);
    let gap = bed.client.longest_gap(t0, Instant::now()).as_secs_f64() * 1000.0;
    let (transitions, lapse) = lease_window(&history.entries(), acquired_ms, end_ms, lease_ms);
    eprintln!(
        "colocated window {}: FIP on cp-{holder}, {} to {} (cp-{leader}) after {handoff} ms, leaderless {leaderless} ms; lease transitions {transitions}, lapsed {lapse} ms, retargets sent {moves}, client gap {gap:.0} ms",
        run + 1,
        if seen.takeover {
            "taken over (no hand-off)"
        } else {
            "handed"
        },
        seen.to
    );
    times.handoff_ms.push(handoff);
    times.handoff_leaderless_ms.push(leaderless);
    times.takeovers += usize::from(seen.takeover);
    report.windows += 1;
    report.lease_transitions += transitions;
    report.leaderless_ms = report.leaderless_ms.max(lapse);
    report.false_moves += moves;
    report.retargets += moves;
    report.client_gap_ms = report.client_gap_ms.max(gap);
}

/// A Deployment's rolling update (maxSurge 1, maxUnavailable 0): on each node that runs a
/// replica in turn a new replica with a new name starts, and 1.5 s later the old one gets
/// SIGTERM and is waited for.
async fn roll(
    cp: &ControlPlane,
    sim: &SimHandle,
    fleet: &Fleet,
    replicas: &mut [Option<Child>],
    generation: usize,
) {
    for i in 0..replicas.len() {
        if replicas[i].is_none() {
            continue;
        }
        let new = fleet.start(cp, sim, i, &format!("cp-{i}-{generation}"));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        stop_gracefully(replicas, i).await;
        replicas[i] = Some(new);
    }
}

/// The node of the replica holding the Lease, if one holds it.
fn leader_of(history: &LeaseHistory) -> Option<usize> {
    node_of(&history.holder()?)
}

/// The node of a replica's identity (`cp-<node>` or `cp-<node>-<generation>`).
fn node_of(identity: &str) -> Option<usize> {
    identity
        .strip_prefix("cp-")?
        .split('-')
        .next()?
        .parse::<usize>()
        .ok()
}

/// SIGTERM to replica `i`: it releases the Lease and exits.
async fn stop_gracefully(replicas: &mut [Option<Child>], i: usize) {
    if let Some(mut r) = replicas[i].take() {
        if let Some(pid) = r.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if tokio::time::timeout(Duration::from_secs(10), r.wait())
            .await
            .is_err()
        {
            let _ = r.kill().await;
        }
    }
}

/// Waits until the FIP answers `/readyz` from a node other than `victim`; returns the time
/// since `t0`. Probes start every 20 ms on fresh connections, overlapping, so a probe stuck on
/// the failed node does not hide the recovery.
async fn recover(
    probe: &reqwest::Client,
    url: &str,
    sim: &SimHandle,
    fip: &IpAddress,
    victim: usize,
    t0: Instant,
) -> Duration {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                assert!(t0.elapsed() < Duration::from_secs(30), "no recovery within 30 s (victim cp-{victim})");
                let (probe, url, tx) = (probe.clone(), url.to_owned(), tx.clone());
                tokio::spawn(async move {
                    if answers(&probe, &url).await {
                        let _ = tx.send(t0.elapsed());
                    }
                });
            }
            Some(at) = rx.recv() => {
                if holder_of(sim, fip).is_some_and(|h| h != victim) {
                    return at;
                }
            }
        }
    }
}

async fn answers(probe: &reqwest::Client, url: &str) -> bool {
    matches!(
        probe.get(url).timeout(Duration::from_millis(300)).send().await,
        Ok(r) if r.status().is_success()
    )
}

/// Where the replicas' logs go: `$BATON_BENCH_LOGS`, or a directory per process under the
/// temporary directory (kept after the run, for a look at a slow or failed failover).
fn logs_dir() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::var_os("BATON_BENCH_LOGS").map_or_else(
            || std::env::temp_dir().join(format!("baton-failover-bench-{}", std::process::id())),
            std::path::PathBuf::from,
        );
        std::fs::create_dir_all(&dir).unwrap();
        eprintln!("replica logs: {}", dir.display());
        dir
    })
    .clone()
}

/// Hetzner, the churning classes: Nodes cp-0..2 as hcloud-cloud-controller-manager leaves them
/// (provider ID `hcloud://<server id>`, the node's address as InternalIP), Ready. The lab's nodes
/// run no kubelet, so the status is written once and nothing changes it; whether a node serves
/// Service traffic is its kube-proxy's `/healthz`, which baton's Service FIP routing probes.
async fn ready_nodes(cp: &ControlPlane) {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let nodes: Api<Node> = Api::all(cp.client(0).unwrap());
    for (i, server) in CP.iter().enumerate() {
        let name = format!("cp-{i}");
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"node-role.kubernetes.io/control-plane": ""}},
            "spec": {"providerID": format!("hcloud://{server}")}
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        let status = serde_json::json!({"status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "addresses": [{"type": "InternalIP", "address": cp.addresses()[i].to_string()},
                          {"type": "Hostname", "address": name}]
        }});
        nodes
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }
}

/// `baton agent` on node cp-i (the shipped DaemonSet's job): watches the control-plane endpoint
/// Services through the node's API server and makes the node accept their FIPs.
fn start_agent(cp: &ControlPlane, bin: &str, i: usize) -> Child {
    let kubeconfig = cp.write_kubeconfig(i, ADMIN_TOKEN).unwrap();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(logs_dir().join(format!("agent-cp-{i}.log")))
        .unwrap();
    cp.node_command(&format!("cp-{i}"), bin)
        .unwrap()
        .arg("agent")
        .args([
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--health-listen",
            "off",
        ])
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {bin} agent: {e}"))
}

/// A client that opens a new connection for every request.
fn fresh_client(ca: &[u8]) -> reqwest::Client {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(ca.to_vec()))
        .unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .pool_max_idle_per_host(0)
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap()
}

/// A client like kubectl's: one HTTP/2 connection kept open through the FIP, a request every
/// 100 ms (1 s timeout); records when answers arrive.
struct H2Client {
    answers: Arc<Mutex<Vec<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl H2Client {
    fn start(ca: &[u8], url: &str) -> Self {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from(ca.to_vec()))
            .unwrap();
        let mut tls =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        tls.alpn_protocols = vec![b"h2".to_vec()];
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .http2_prior_knowledge()
            .connect_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let answers = Arc::new(Mutex::new(Vec::new()));
        let (url, log) = (url.to_owned(), Arc::clone(&answers));
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let (client, url, log) = (client.clone(), url.clone(), Arc::clone(&log));
                tokio::spawn(async move {
                    if matches!(client.get(&url).timeout(Duration::from_secs(1)).send().await, Ok(r) if r.status().is_success())
                    {
                        log.lock().unwrap().push(Instant::now());
                    }
                });
            }
        });
        Self { answers, task }
    }

    /// The longest time without an answer between `from` and `to`.
    fn longest_gap(&self, from: Instant, to: Instant) -> Duration {
        let mut times: Vec<Instant> = self.answers.lock().unwrap().clone();
        times.sort();
        let last_before = times.iter().rev().find(|t| **t <= from).copied().unwrap_or(from);
        let mut prev = last_before;
        let mut gap = Duration::ZERO;
        for t in times.into_iter().filter(|t| *t > from && *t <= to) {
            gap = gap.max(t - prev);
            prev = t;
        }
        gap.max(to.saturating_duration_since(prev).min(Duration::ZERO))
    }

    fn stop(self) {
        self.task.abort();
    }
}

/// Creates a LoadBalancer Service every 250 ms (of `spec.loadBalancerClass` `class`, if given)
/// and deletes the one 40 before it, through whichever API server answers (one of them is always
/// failing).
async fn churn_services(
    clients: Vec<kube::Client>,
    created: Arc<std::sync::atomic::AtomicU64>,
    class: Option<&str>,
) {
    use k8s_openapi::api::core::v1::{Namespace, Service};
    use kube::api::{Api, DeleteParams, PostParams};
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": "busy"}})).unwrap();
    for c in &clients {
        if Api::<Namespace>::all(c.clone())
            .create(&PostParams::default(), &ns)
            .await
            .is_ok()
        {
            break;
        }
    }
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    for i in 0u64.. {
        tick.tick().await;
        let mut spec = serde_json::json!({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
                                          "ports": [{"port": 80, "protocol": "TCP"}]});
        if let Some(class) = class {
            spec["loadBalancerClass"] = class.into();
        }
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("churn-{i}")},
            "spec": spec
        }))
        .unwrap();
        for c in &clients {
            let api: Api<Service> = Api::namespaced(c.clone(), "busy");
            let done =
                tokio::time::timeout(Duration::from_secs(2), api.create(&PostParams::default(), &svc)).await;
            if matches!(done, Ok(Ok(_))) {
                created.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Some(old) = i.checked_sub(40) {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(2),
                        api.delete(&format!("churn-{old}"), &DeleteParams::default()),
                    )
                    .await;
                }
                break;
            }
        }
    }
}

/// `--replot LOG`: the plots of every class in a log of an earlier run, from its per-run lines
/// (`kill run  1:    532 ms (to call  510, call  105, after  -83; client gap ...`).
fn replot(log: &str, dir: &str) {
    let text = std::fs::read_to_string(log).unwrap_or_else(|e| panic!("{log}: {e}"));
    let mut classes: Vec<(String, Vec<Run>)> = Vec::new();
    for line in text.lines() {
        let Some((class, rest)) = line.split_once(" run ") else {
            continue;
        };
        if !FAILURES.contains(&class) && !GREY.contains(&class) {
            continue;
        }
        let num = |key: &str| -> Option<f64> {
            let after = rest.split_once(key)?.1.trim_start();
            let end = after
                .find(|c: char| c != '-' && !c.is_ascii_digit())
                .unwrap_or(after.len());
            after[..end].parse().ok()
        };
        let (Some(total_ms), Some(to_call_ms), Some(call_ms), Some(client_gap_ms)) = (
            rest.split_once(':')
                .and_then(|(_, r)| r.trim_start().split(' ').next()?.parse().ok()),
            num("to call"),
            num(", call"),
            num("client gap"),
        ) else {
            continue;
        };
        let run = Run {
            total_ms,
            to_call_ms,
            call_ms,
            client_gap_ms,
            retargets: 0,
        };
        match classes.iter_mut().find(|(c, _)| c == class) {
            Some((_, runs)) => runs.push(run),
            None => classes.push((class.to_owned(), vec![run])),
        }
    }
    assert!(!classes.is_empty(), "{log}: no per-run lines");
    for (class, runs) in &classes {
        let (p50, p99, _) = p50_p99_max(runs);
        let path = format!("{dir}/failover-{class}.svg");
        std::fs::write(&path, svg(class, runs, p50, p99)).unwrap();
        eprintln!("wrote {path} ({} runs)", runs.len());
    }
}

/// One horizontal bar per run: until the retarget reached the cloud (detection, takeover,
/// decision), then until the FIP answered from another node (the cloud routes the FIP when it
/// receives the retarget, which can be before its answer comes back); a thin line under the bar
/// spans the retarget call, from its arrival to its answer.
fn svg(class: &str, runs: &[Run], p50: f64, p99: f64) -> String {
    let (w, left, right, top, row) = (720.0, 60.0, 20.0, 40.0, 12.0);
    let h = top + row * runs.len() as f64 + 50.0;
    let max = runs.iter().map(|r| r.total_ms).fold(1600.0_f64, f64::max) * 1.05;
    let plot_w = w - left - right;
    let x = |ms: f64| left + plot_w * ms / max;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{}" y="18" text-anchor="middle" font-size="13">failover, class {class}: failure → FIP answers from another node (ms)</text>"#,
        w / 2.0
    );
    for (i, r) in runs.iter().enumerate() {
        let y = top + row * i as f64;
        let mut at = 0.0;
        for (len, color) in [
            (r.to_call_ms, "#4a7ebb"),
            ((r.total_ms - r.to_call_ms).max(0.0), "#67c23a"),
        ] {
            let _ = write!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}"/>"#,
                x(at),
                y + 1.0,
                (x(at + len) - x(at)).max(0.0),
                row - 4.0
            );
            at += len;
        }
        let _ = write!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="2" fill="#e6a23c"/>"##,
            x(r.to_call_ms),
            y + row - 3.0,
            (x(r.to_call_ms + r.call_ms) - x(r.to_call_ms)).max(0.0)
        );
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            left - 4.0,
            y + row - 2.0,
            i + 1
        );
    }
    let bottom = top + row * runs.len() as f64;
    // p50 to the left of its line, p99 to the right: they are often close.
    for (label, v, color, anchor, dx) in [
        ("p50", p50, "#2a9d3a", "end", -3.0),
        ("p99", p99, "#c0392b", "start", 3.0),
        ("target", 1500.0, "#888", "middle", 0.0),
    ] {
        let _ = write!(
            s,
            r#"<line x1="{:.1}" x2="{:.1}" y1="{top}" y2="{bottom:.1}" stroke="{color}" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" fill="{color}" text-anchor="{anchor}">{label} {v:.0}</text>"#,
            x(v),
            x(v),
            x(v) + dx,
            top - 4.0
        );
    }
    let mut tick = 0.0;
    while tick <= max {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{tick:.0}</text>"#,
            x(tick),
            bottom + 14.0
        );
        tick += 250.0;
    }
    let _ = write!(
        s,
        r##"<rect x="{left}" y="{:.1}" width="10" height="10" fill="#4a7ebb"/><text x="{}" y="{:.1}">failure → retarget reaches the cloud (detection, Lease takeover, decision)</text>"##,
        bottom + 22.0,
        left + 14.0,
        bottom + 31.0
    );
    let _ = write!(
        s,
        r##"<rect x="{left}" y="{:.1}" width="10" height="10" fill="#e6a23c"/><text x="{}" y="{:.1}">retarget call, arrival → answer</text><rect x="{}" y="{:.1}" width="10" height="10" fill="#67c23a"/><text x="{}" y="{:.1}">retarget at the cloud → the FIP answers (route change, new connection)</text></svg>"##,
        bottom + 36.0,
        left + 14.0,
        bottom + 45.0,
        left + 200.0,
        bottom + 36.0,
        left + 214.0,
        bottom + 45.0
    );
    s
}
