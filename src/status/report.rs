//! What `baton status` reports: plain data, the verdict (healthy / degraded / down) decided from
//! it by a pure function, and the one-screen text form. No I/O here.

use std::fmt::Write as _;

use serde::Serialize;

use crate::exit;

/// The whole report (`--output json` prints it as is).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// `healthy`, `degraded` or `down`.
    pub verdict: Verdict,
    /// The exit code that goes with the verdict.
    pub exit_code: u8,
    /// Every problem found, most serious first; empty when healthy.
    pub problems: Vec<Problem>,
    /// The leader Lease.
    pub leader: Option<LeaderStatus>,
    /// Each control-plane endpoint.
    pub endpoints: Vec<EndpointStatus>,
    /// LoadBalancer Services baton manages that have no address yet (or failed to get one).
    pub pending_services: Vec<PendingService>,
    /// Services asking for an address the rules refuse (not this cluster's, or their namespace
    /// may not ask): baton does not use it.
    pub refused_addresses: Vec<RefusedAddress>,
    /// BGP / load-balancer state.
    pub bgp: BgpStatus,
    /// Nodes still carrying the uninitialized taint.
    pub uninitialized_nodes: Vec<String>,
    /// What would bring the endpoint back after every control-plane node lost power (None: baton
    /// does not run as pods here, e.g. the controller runs elsewhere).
    pub cold_start: Option<ColdStartStatus>,
    /// The controllers' admin endpoints that were asked.
    pub controllers: Vec<ControllerStatus>,
    /// Whether the cloud API could be read.
    pub cloud: SourceStatus,
    /// Whether the Kubernetes API could be read.
    pub kubernetes: SourceStatus,
}

/// The overall state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Everything answers and nothing waits.
    #[default]
    Healthy,
    /// The endpoints serve, but something needs attention (no leader, an unhealthy candidate,
    /// a Service without a FIP, a node not initialised, the cloud unreadable).
    Degraded,
    /// A control-plane endpoint does not serve (its FIP is missing, not routed, or its holder
    /// fails its health check), or Kubernetes cannot be read at all.
    Down,
}

impl Verdict {
    /// The exit code of `baton status` for this verdict (docs/operations.md).
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Healthy => exit::OK,
            Self::Degraded => exit::status::DEGRADED,
            Self::Down => exit::status::DOWN,
        }
    }
}

/// One problem and how serious it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// `degraded` or `down`.
    pub severity: Verdict,
    /// What is wrong, in a sentence.
    pub message: String,
}

/// Whether a source (Kubernetes, the cloud) could be read.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceStatus {
    /// It answered.
    pub reachable: bool,
    /// Why not (never carries a secret).
    pub error: Option<String>,
    /// Not asked (e.g. no cloud credentials configured).
    pub skipped: bool,
}

/// The leader Lease `<namespace>/<prefix>-controller`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderStatus {
    /// `namespace/name`.
    pub lease: String,
    /// `spec.holderIdentity` (None: nobody holds it).
    pub holder: Option<String>,
    /// `spec.renewTime` (RFC 3339).
    pub renewed: Option<String>,
    /// Seconds since the last renewal.
    pub age_seconds: Option<i64>,
    /// `spec.leaseDurationSeconds`.
    pub duration_seconds: Option<i32>,
    /// The Lease exists and was renewed within its duration.
    pub valid: bool,
    /// Seconds without a leader: since the holder's record expired, or since the Lease was
    /// released (0 while valid; None when not known).
    pub leaderless_seconds: Option<i64>,
}

/// Past this long without a leader, `baton status` names the condition "no leader for longer
/// than 60s" (the chart's alert `BatonLeaderlessTooLong` fires at the same mark).
pub const LEADERLESS_LIMIT_SECONDS: i64 = 60;

/// A control-plane endpoint.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointStatus {
    /// `namespace/name` of its Service (None: the FIP is tagged but the Service does not exist).
    pub service: Option<String>,
    /// The FIP address.
    pub fip: Option<String>,
    /// The FIP's id in the cloud.
    pub fip_id: Option<String>,
    /// The server the cloud routes the FIP to (`targeted_to`).
    pub holder: Option<ServerRef>,
    /// `/readyz` through the FIP itself.
    pub fip_ready: Option<bool>,
    /// Why `/readyz` through the FIP failed.
    pub fip_error: Option<String>,
    /// Every candidate API server (the addresses of `default/kubernetes`).
    pub candidates: Vec<CandidateStatus>,
    /// The latest `FloatingIPMoved` Event of the Service.
    pub last_move: Option<MoveStatus>,
}

/// A server, as the cloud names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerRef {
    /// Numeric id.
    pub id: u64,
    /// Hostname.
    pub hostname: String,
}

/// One candidate API server and its `/readyz` answer.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CandidateStatus {
    /// `IP:port`.
    pub address: String,
    /// The server with this primary IP, if the cloud knows it.
    pub server: Option<ServerRef>,
    /// Whether `/readyz` answered 2xx.
    pub ready: bool,
    /// Why not.
    pub error: Option<String>,
    /// The FIP is routed to this candidate's server.
    pub holder: bool,
}

/// A FIP move, from its Event.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MoveStatus {
    /// When (RFC 3339).
    pub time: Option<String>,
    /// The Event's message: from where to where, and why.
    pub message: String,
    /// How many moves the Event counts. baton's event recorder folds repeated Events of the same
    /// reason on one Service into a series that keeps the *first* message, so with a count above
    /// 1 the message may describe an earlier move; the holder above is the cloud's truth.
    pub count: Option<i32>,
}

/// A Service waiting for, or failing to get, a FIP.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingService {
    /// `namespace/name`.
    pub service: String,
    /// Seconds since it was created.
    pub age_seconds: Option<i64>,
    /// Why it has no address: the latest Warning Event (`Reason: message`), or a description.
    pub reason: String,
}

/// A Service asking for an address the rules refuse (docs/operations.md, "Threat model").
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RefusedAddress {
    /// `namespace/name`.
    pub service: String,
    /// The address it asks for.
    pub address: String,
    /// The rule (the reason of the Warning Event the controller publishes).
    pub reason: String,
    /// The field, the address and the rule in a sentence.
    pub message: String,
    /// The Service's own FIP, which it keeps (its request takes nothing away).
    pub keeps: Option<String>,
    /// Whether its ingress still shows the refused address (set before: the controller
    /// withdraws it).
    pub shown: bool,
    /// A Floating IP of the project carrying no `cluster` tag: if it is this cluster's (an
    /// operator's reservation), `adoptFips` makes it so.
    pub untagged: bool,
}

impl RefusedAddress {
    /// The problem it is, in a sentence.
    fn problem(&self) -> String {
        let keeps = self
            .keeps
            .as_ref()
            .map_or_else(String::new, |k| format!(" (it keeps its Floating IP {k})"));
        let shown = if self.shown {
            " (its ingress still shows it: the controller withdraws it)"
        } else {
            ""
        };
        format!(
            "Service {} asks for {}, which is refused{keeps}{shown}: {}: {}",
            self.service, self.address, self.reason, self.message
        )
    }
}

/// The "Addresses refused" section (none when nothing is refused), with the `adoptFips` value
/// that would adopt the untagged FIPs among them.
fn render_refused(out: &mut String, refused: &[RefusedAddress]) {
    if refused.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nAddresses refused");
    for a in refused {
        let keeps = a
            .keeps
            .as_ref()
            .map_or_else(String::new, |k| format!(", keeps {k}"));
        let _ = writeln!(out, "  {} asks for {}: {}{keeps}", a.service, a.address, a.reason);
    }
    let mut untagged: Vec<&str> = refused
        .iter()
        .filter(|a| a.untagged)
        .map(|a| a.address.as_str())
        .collect();
    untagged.sort_unstable();
    untagged.dedup();
    if !untagged.is_empty() {
        let _ = writeln!(
            out,
            "  untagged FIPs of the project among them, if they are this cluster's: adoptFips={}",
            untagged.join(",")
        );
    }
}

/// BGP and the load-balancer implementation.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BgpStatus {
    /// `loadbalancer` (None: Service FIPs are off).
    pub load_balancer: Option<String>,
    /// The BGP node selector (None: every node).
    pub node_selector: Option<String>,
    /// Nodes the selector picks.
    pub nodes_selected: usize,
    /// Selected nodes that carry the BGP peer annotations.
    pub nodes_annotated: usize,
    /// Selected nodes without them.
    pub nodes_missing: Vec<String>,
}

/// Cold start (docs/operations.md, "Cold start"): per control-plane node, what runs there and
/// would run again at its boot without any other node.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ColdStartStatus {
    /// The agents' node-file directory (`BATON_AGENT_STATE_DIR`; None: no node file is kept,
    /// so nothing accepts the FIPs at boot before the kubelet reaches an API server).
    pub node_file_dir: Option<String>,
    /// Each control-plane node.
    pub nodes: Vec<ColdStartNode>,
}

/// One control-plane node, for a cold start.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ColdStartNode {
    pub name: String,
    /// The Node is Ready.
    pub ready: bool,
    /// Its agent pod is Ready.
    pub agent: bool,
    /// Its standby controller pod (`baton controller --standby`) is Ready.
    pub standby: bool,
    /// The Deployment's replicas bound to it (pod names).
    pub replicas: Vec<String>,
}

/// A controller replica's admin endpoint.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerStatus {
    /// The base URL asked.
    pub url: String,
    /// `/leader`: `leader` or `follower`.
    pub role: Option<String>,
    /// `/health`: whether it answered 200.
    pub healthy: Option<bool>,
    /// `/health`'s text when unhealthy, or why the endpoint could not be read.
    pub error: Option<String>,
}

impl Report {
    /// Records a problem.
    pub fn problem(&mut self, severity: Verdict, message: impl Into<String>) {
        self.problems.push(Problem {
            severity,
            message: message.into(),
        });
    }

    /// Derives the problems from the facts collected, then the verdict and exit code.
    pub fn assess(&mut self) {
        let mut found = Vec::new();
        let mut add = |severity: Verdict, message: String| found.push(Problem { severity, message });
        if !self.kubernetes.reachable {
            add(
                Verdict::Down,
                format!(
                    "the Kubernetes API cannot be read: {}",
                    self.kubernetes.error.as_deref().unwrap_or("unknown error")
                ),
            );
        }
        if !self.cloud.reachable && !self.cloud.skipped {
            add(
                Verdict::Degraded,
                format!(
                    "the cloud API cannot be read: {}",
                    self.cloud.error.as_deref().unwrap_or("unknown error")
                ),
            );
        }
        match &self.leader {
            Some(l) if l.valid => {}
            Some(l) => {
                let condition = match l.leaderless_seconds {
                    Some(n) if n > LEADERLESS_LIMIT_SECONDS => {
                        format!("no leader for {n}s, longer than {LEADERLESS_LIMIT_SECONDS}s: ")
                    }
                    _ => String::new(),
                };
                add(
                    Verdict::Degraded,
                    format!(
                        "{condition}no controller holds the Lease {} (holder {}, renewed {}): nothing moves a failed FIP",
                        l.lease,
                        l.holder.as_deref().unwrap_or("none"),
                        l.renewed.as_deref().unwrap_or("never")
                    ),
                );
            }
            None if self.kubernetes.reachable => add(
                Verdict::Degraded,
                "no leader Lease: is baton controller running?".to_owned(),
            ),
            None => {}
        }
        for ep in &self.endpoints {
            assess_endpoint(ep, self.cloud.reachable, &mut add);
        }
        for svc in &self.pending_services {
            add(
                Verdict::Degraded,
                format!("Service {} has no FIP: {}", svc.service, svc.reason),
            );
        }
        for r in &self.refused_addresses {
            add(Verdict::Degraded, r.problem());
        }
        if !self.bgp.nodes_missing.is_empty() {
            add(
                Verdict::Degraded,
                format!(
                    "nodes without BGP peer annotations: {}",
                    self.bgp.nodes_missing.join(", ")
                ),
            );
        }
        if !self.uninitialized_nodes.is_empty() {
            add(
                Verdict::Degraded,
                format!("nodes not initialised: {}", self.uninitialized_nodes.join(", ")),
            );
        }
        if let Some(c) = &self.cold_start {
            for (severity, message) in cold_start_problems(c) {
                add(severity, message);
            }
        }
        for c in &self.controllers {
            if c.healthy != Some(true) {
                add(
                    Verdict::Degraded,
                    format!(
                        "controller {} is not healthy: {}",
                        c.url,
                        c.error.as_deref().unwrap_or("no answer")
                    ),
                );
            }
        }
        self.problems.extend(found);
        self.problems.sort_by_key(|p| std::cmp::Reverse(p.severity));
        self.verdict = self
            .problems
            .iter()
            .map(|p| p.severity)
            .max()
            .unwrap_or(Verdict::Healthy);
        self.exit_code = self.verdict.exit_code();
    }
}

fn assess_endpoint(ep: &EndpointStatus, cloud_read: bool, add: &mut impl FnMut(Verdict, String)) {
    let name = ep
        .service
        .clone()
        .or_else(|| ep.fip.clone())
        .unwrap_or_else(|| "?".to_owned());
    if ep.service.is_none() {
        add(
            Verdict::Degraded,
            format!(
                "control-plane FIP {} has no Service yet",
                ep.fip.as_deref().unwrap_or("?")
            ),
        );
    }
    if cloud_read {
        if ep.fip_id.is_none() {
            add(
                Verdict::Down,
                format!(
                    "endpoint {name}: FIP {} is not in the project",
                    ep.fip.as_deref().unwrap_or("?")
                ),
            );
            return;
        }
        let Some(holder) = &ep.holder else {
            add(
                Verdict::Down,
                format!("endpoint {name}: the FIP is not routed to any server"),
            );
            return;
        };
        let holder_candidate = ep.candidates.iter().find(|c| c.holder);
        match holder_candidate {
            Some(c) if !c.ready => add(
                Verdict::Down,
                format!(
                    "endpoint {name}: the holder {} fails its health check: {}",
                    holder.hostname,
                    c.error.as_deref().unwrap_or("not ready")
                ),
            ),
            None if !ep.candidates.is_empty() => add(
                Verdict::Down,
                format!(
                    "endpoint {name}: the holder {} is not a control-plane API server",
                    holder.hostname
                ),
            ),
            _ => {}
        }
    }
    if ep.fip_ready == Some(false) {
        add(
            Verdict::Down,
            format!(
                "endpoint {name}: /readyz through the FIP fails: {}",
                ep.fip_error.as_deref().unwrap_or("no answer")
            ),
        );
    }
    let unhealthy: Vec<String> = ep
        .candidates
        .iter()
        .filter(|c| !c.ready && !c.holder)
        .map(|c| {
            c.server
                .as_ref()
                .map_or_else(|| c.address.clone(), |s| s.hostname.clone())
        })
        .collect();
    if !unhealthy.is_empty() {
        add(
            Verdict::Degraded,
            format!(
                "endpoint {name}: candidates failing /readyz: {}",
                unhealthy.join(", ")
            ),
        );
    }
}

/// The one-screen text form.
pub fn render_text(r: &Report) -> String {
    let mut out = String::new();
    let verdict = match r.verdict {
        Verdict::Healthy => "HEALTHY",
        Verdict::Degraded => "DEGRADED",
        Verdict::Down => "DOWN",
    };
    let _ = writeln!(out, "baton status: {verdict} (exit {})", r.exit_code);
    for p in &r.problems {
        let mark = if p.severity == Verdict::Down {
            "DOWN"
        } else {
            "warn"
        };
        let _ = writeln!(out, "  [{mark}] {}", p.message);
    }

    let _ = writeln!(out, "\nLeader");
    match &r.leader {
        Some(l) => {
            let age = l
                .age_seconds
                .map_or_else(String::new, |a| format!(", renewed {a}s ago"));
            let state = match (l.valid, l.leaderless_seconds) {
                (true, _) => String::new(),
                (false, Some(n)) => format!(" (EXPIRED, no leader for {n}s)"),
                (false, None) => " (EXPIRED)".to_owned(),
            };
            let _ = writeln!(
                out,
                "  {}: {}{age}{state}",
                l.lease,
                l.holder.as_deref().unwrap_or("<none>")
            );
        }
        None => {
            let _ = writeln!(out, "  <no Lease>");
        }
    }

    render_endpoints(&mut out, &r.endpoints);

    let _ = writeln!(out, "\nServices without a FIP");
    if r.pending_services.is_empty() {
        let _ = writeln!(out, "  <none>");
    }
    for s in &r.pending_services {
        let age = s.age_seconds.map_or_else(String::new, |a| format!(" ({a}s)"));
        let _ = writeln!(out, "  {}{age}: {}", s.service, s.reason);
    }

    render_refused(&mut out, &r.refused_addresses);

    let _ = writeln!(out, "\nBGP / load balancer");
    let _ = writeln!(
        out,
        "  loadbalancer: {}  node selector: {}",
        r.bgp.load_balancer.as_deref().unwrap_or("<off>"),
        r.bgp.node_selector.as_deref().unwrap_or("<all nodes>")
    );
    if r.bgp.load_balancer.is_some() {
        let _ = writeln!(
            out,
            "  BGP annotations on {}/{} selected nodes",
            r.bgp.nodes_annotated, r.bgp.nodes_selected
        );
    }

    let _ = writeln!(out, "\nNodes not initialised");
    if r.uninitialized_nodes.is_empty() {
        let _ = writeln!(out, "  <none>");
    } else {
        let _ = writeln!(out, "  {}", r.uninitialized_nodes.join(", "));
    }

    if let Some(c) = &r.cold_start {
        render_cold_start(&mut out, c);
    }

    if !r.controllers.is_empty() {
        let _ = writeln!(out, "\nControllers");
        for c in &r.controllers {
            let health = match c.healthy {
                Some(true) => "healthy".to_owned(),
                _ => format!("UNHEALTHY: {}", c.error.as_deref().unwrap_or("no answer")),
            };
            let _ = writeln!(out, "  {}  {}  {health}", c.url, c.role.as_deref().unwrap_or("?"));
        }
    }
    let source = |s: &SourceStatus| {
        if s.skipped {
            "skipped".to_owned()
        } else if s.reachable {
            "ok".to_owned()
        } else {
            format!("UNREACHABLE: {}", s.error.as_deref().unwrap_or("?"))
        }
    };
    let _ = writeln!(
        out,
        "\nSources: kubernetes {}, cloud {}",
        source(&r.kubernetes),
        source(&r.cloud)
    );
    out
}

/// What stands in the way of a cold start without a person (pure).
pub fn cold_start_problems(c: &ColdStartStatus) -> Vec<(Verdict, String)> {
    let mut out = Vec::new();
    if c.node_file_dir.is_none() {
        out.push((
            Verdict::Degraded,
            "the agents keep no node file (BATON_AGENT_STATE_DIR): after every control-plane node loses power, nothing accepts the FIPs until a kubelet reaches an API server, and kubelets that use the endpoint never do (docs/operations.md, \"Cold start\")".to_owned(),
        ));
    }
    let without_standby: Vec<&str> = c
        .nodes
        .iter()
        .filter(|n| n.ready && !n.standby)
        .map(|n| n.name.as_str())
        .collect();
    if !without_standby.is_empty() {
        out.push((
            Verdict::Degraded,
            format!(
                "no standby controller Ready on {}: a node that comes back alone after a power loss runs no controller unless a Deployment replica is bound to it (manifests/standby.yaml)",
                without_standby.join(", ")
            ),
        ));
    }
    let without_agent: Vec<&str> = c
        .nodes
        .iter()
        .filter(|n| n.ready && !n.agent)
        .map(|n| n.name.as_str())
        .collect();
    if !without_agent.is_empty() {
        out.push((
            Verdict::Degraded,
            format!(
                "no agent Ready on {}: it neither accepts the FIPs nor keeps its node file up to date",
                without_agent.join(", ")
            ),
        ));
    }
    for n in c.nodes.iter().filter(|n| !n.ready) {
        for pod in &n.replicas {
            out.push((
                Verdict::Degraded,
                format!(
                    "controller replica {pod} is bound to {}, which is not Ready: it runs again only when the node returns or the pod is evicted (the standby replicas cover meanwhile)",
                    n.name
                ),
            ));
        }
    }
    out
}

/// The cold-start section of the text form.
fn render_cold_start(out: &mut String, c: &ColdStartStatus) {
    let _ = writeln!(out, "\nCold start (every control-plane node loses power)");
    let _ = writeln!(
        out,
        "  node file: {}",
        c.node_file_dir.as_deref().map_or_else(
            || "NOT KEPT".to_owned(),
            |d| format!("{d}/agent/fips.json (restored by baton-agent-boot.service)")
        )
    );
    for n in &c.nodes {
        let yes = |b: bool| if b { "yes" } else { "NO" };
        let _ = writeln!(
            out,
            "  {}  {}  agent {}  standby {}  replicas {}",
            n.name,
            if n.ready { "Ready" } else { "NOT READY" },
            yes(n.agent),
            yes(n.standby),
            if n.replicas.is_empty() {
                "-".to_owned()
            } else {
                n.replicas.join(",")
            }
        );
    }
}

/// The endpoints section of the text form.
fn render_endpoints(out: &mut String, endpoints: &[EndpointStatus]) {
    let _ = writeln!(out, "\nControl-plane endpoints");
    if endpoints.is_empty() {
        let _ = writeln!(out, "  <none>");
    }
    for ep in endpoints {
        let holder = ep.holder.as_ref().map_or_else(
            || "<not routed>".to_owned(),
            |h| format!("{} ({})", h.hostname, h.id),
        );
        let through = match ep.fip_ready {
            Some(true) => "ready",
            Some(false) => "NOT READY",
            None => "not probed",
        };
        let _ = writeln!(
            out,
            "  {}  FIP {}  holder {holder}  via FIP: {through}",
            ep.service.as_deref().unwrap_or("<no Service>"),
            ep.fip.as_deref().unwrap_or("?")
        );
        for c in &ep.candidates {
            let name = c
                .server
                .as_ref()
                .map_or_else(|| "?".to_owned(), |s| s.hostname.clone());
            let mark = if c.holder { "*" } else { " " };
            let health = if c.ready {
                "ready".to_owned()
            } else {
                format!("FAILING: {}", c.error.as_deref().unwrap_or("not ready"))
            };
            let _ = writeln!(out, "   {mark} {:<22} {name:<12} {health}", c.address);
        }
        match &ep.last_move {
            Some(m) => {
                let series = match m.count {
                    Some(n) if n > 1 => format!(" ({n} moves; the text is the first one's)"),
                    _ => String::new(),
                };
                let _ = writeln!(
                    out,
                    "    last move: {} {}{series}",
                    m.time.as_deref().unwrap_or("?"),
                    m.message
                );
            }
            None => {
                let _ = writeln!(out, "    last move: none recorded");
            }
        }
    }
}
