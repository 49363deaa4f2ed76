//! `baton claim`: on the first control-plane server, before `kubeadm init` (or any installer's
//! first API server) starts, assign the cluster's control-plane Floating IP to this server and
//! make this node accept it — the step Cluster API's `preKubeadmCommands` run, when no load
//! balancer fronts the API and nothing else routes the endpoint yet.
//!
//! ```text
//!  settings (flag > env > cloud-sa.json > default: cloud, token/key, fipTag, adoptFips)
//!  --fip ADDRESS|NAME ── resolved ──┐
//!  the cloud (same client as the controller): Floating IPs, servers
//!        ▼                          ▼
//!  decide.rs (pure): which FIP (this cluster's only), which server this host is, what to do
//!        ▼
//!  Assign: one assign (Cherry: PUT targeted_to; Hetzner: one assign action, followed to its end)
//!  then this node accepts the FIP: the agent's nftables table (prerouting redirect; the output
//!  rule for this host's own packets while it holds the FIP), merged with what the table holds
//! ```
//!
//! Idempotent, and safe to kill at any instant: it creates nothing in the cloud, its one write
//! is read back before it is sent again, a rerun finds the FIP assigned here and sends nothing.
//! A FIP that another existing server holds is never taken (a second control-plane node, a
//! rerun elsewhere: the controller moves the FIP from then on).

pub mod decide;

use std::collections::BTreeSet;
use std::net::IpAddr;

use baton_cloud::Cloud as _;
use clap::{Args, ValueEnum};
use serde::Serialize;
use tracing::{info, warn};

use crate::agent::netlink;
use crate::agent::plan::{self, Plan, Wanted};
use crate::config::{Config, ConfigArgs, ConfigError, Env};

use self::decide::{Decision, FipChoice, Ownership, Refusal};

/// How long a claim waits for an action that already runs on the Floating IP (Hetzner answers
/// 423 `locked` meanwhile; an assign action ends within seconds).
const LOCKED_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Flags of `baton claim` (plus every configuration setting, as `baton controller` takes them:
/// `cloud`, the token or API key, `fipTag`, `adoptFips`, …).
#[derive(Debug, Args)]
pub struct ClaimArgs {
    #[command(flatten)]
    pub config: ConfigArgs,

    /// The Floating IP to claim: its address, or a DNS name resolving to it (the cluster's
    /// `controlPlaneEndpoint`). Unset: the one Floating IP carrying `fipTag`. Either way it must
    /// be this cluster's (its `fipTag`, or named in `adoptFips`).
    #[arg(long, env = "BATON_CLAIM_FIP", value_name = "ADDRESS|NAME")]
    pub fip: Option<String>,

    /// This server, by its id or name in the cloud. Unset: the server one of whose primary or
    /// private addresses is on this host, else the one named like this host.
    #[arg(long, env = "BATON_CLAIM_SERVER", value_name = "ID|NAME")]
    pub server: Option<String>,

    /// Leave this node's nftables alone: only assign the Floating IP (something else makes the
    /// node accept it).
    #[arg(long, env = "BATON_CLAIM_NO_ACCEPT")]
    pub no_accept: bool,

    /// Output format of the result.
    #[arg(long, value_enum, default_value_t = ClaimOutput::Text)]
    pub output: ClaimOutput,
}

/// Output formats of `baton claim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClaimOutput {
    /// One line per step.
    Text,
    /// The result as one JSON document.
    Json,
}

/// Why `baton claim` failed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("--fip {name}: {reason}")]
    Resolve { name: String, reason: String },
    #[error("{step}: {source}")]
    Cloud {
        step: String,
        #[source]
        source: baton_cloud::CloudError,
    },
    #[error("making this node accept {fip}: {source}")]
    Kernel {
        fip: IpAddr,
        #[source]
        source: crate::agent::PutError,
    },
}

impl ClaimError {
    /// Whether the error is bad input (exit code 2): a setting, a flag, a FIP that is not this
    /// cluster's, a server that cannot be told; otherwise a runtime failure (exit code 1).
    pub fn is_config(&self) -> bool {
        matches!(self, Self::Config(_) | Self::Refused(_) | Self::Resolve { .. })
    }
}

/// The result, as `--output json` prints it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Claimed {
    pub fip: IpAddr,
    pub fip_id: String,
    pub server: String,
    pub server_id: u64,
    /// `assigned`, `already-here` or `held-elsewhere`.
    pub result: String,
    /// The server holding the FIP when it is not this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<u64>,
    /// The server the FIP was taken from because it no longer exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub taken_from_gone_server: Option<u64>,
    /// Whether this node accepts the FIP (`false` with `--no-accept`).
    pub accepted: bool,
    /// The address this node's own packets for the FIP are delivered to, while it holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub own_traffic_to: Option<IpAddr>,
}

/// Runs `baton claim` and prints the result.
pub async fn run(args: ClaimArgs, env: &dyn Env) -> Result<(), ClaimError> {
    let output = args.output;
    let claimed = claim(&args, env).await?;
    match output {
        ClaimOutput::Json => println!(
            "{}",
            serde_json::to_string(&claimed).unwrap_or_else(|_| "{}".to_owned())
        ),
        ClaimOutput::Text => println!("{}", describe(&claimed)),
    }
    Ok(())
}

fn describe(c: &Claimed) -> String {
    let what = match c.result.as_str() {
        "assigned" => match c.taken_from_gone_server {
            Some(gone) => format!(
                "assigned to this server {} ({}); server {gone}, which held it, no longer exists",
                c.server, c.server_id
            ),
            None => format!("assigned to this server {} ({})", c.server, c.server_id),
        },
        "already-here" => format!(
            "already assigned to this server {} ({}): nothing sent",
            c.server, c.server_id
        ),
        _ => format!(
            "held by server {}: left alone (a claim never takes a Floating IP from another server; the controller moves it)",
            c.holder.map_or_else(|| "?".to_owned(), |h| h.to_string())
        ),
    };
    let node = if !c.accepted {
        "this node's nftables left alone (--no-accept)".to_owned()
    } else if let Some(to) = c.own_traffic_to {
        format!("this node accepts it, and delivers its own packets for it to {to}")
    } else {
        "this node accepts it".to_owned()
    };
    format!("claim: Floating IP {} ({}) {what}; {node}", c.fip, c.fip_id)
}

/// Does the work of `baton claim` and returns what happened.
pub async fn claim(args: &ClaimArgs, env: &dyn Env) -> Result<Claimed, ClaimError> {
    let config = Config::resolve(&args.config, env)?;
    let client_config = config.cloud_client_config()?;
    let resolved = match args.fip.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        Some(name) => Some((name, resolve(name).await?)),
        None => None,
    };
    let choice = match (&resolved, config.fip_tag.as_ref()) {
        (Some((wanted, addresses)), _) => Some(FipChoice::At {
            wanted,
            addresses: addresses.clone(),
        }),
        (None, Some(tag)) => Some(FipChoice::Tagged(tag)),
        (None, None) => None,
    };
    let ownership = Ownership {
        fip_tag: config.fip_tag.as_ref(),
        adopted: &config.adopt_fips,
    };
    let cloud = baton_cloud::CloudClient::new(client_config).map_err(|source| ClaimError::Cloud {
        step: "building the cloud client".into(),
        source,
    })?;
    let cloud_err = |step: &str| {
        let step = step.to_owned();
        move |source| ClaimError::Cloud { step, source }
    };
    let ips = cloud.ips().await.map_err(cloud_err("listing the Floating IPs"))?;
    let fip = decide::the_fip(baton_cloud::model::each_ip(&ips), choice.as_ref(), ownership)?.clone();
    let servers = cloud.servers().await.map_err(cloud_err("listing the servers"))?;
    let local = local_addresses();
    let hostname = hostname();
    let me = decide::this_server(&servers, args.server.as_deref(), &local, &hostname)?.clone();
    info!(fip = %fip.address, fip_id = %fip.id, server = %me.hostname, server_id = %me.id, "claiming");

    let (current, decision) = settle(&cloud, &fip, &me, &servers).await?;
    let mut holder = None;
    let mut gone = None;
    match &decision {
        Decision::Assign { from } => {
            gone = from.map(|s| s.0);
            info!(fip = %current.address, server = %me.hostname, "assigned");
        }
        Decision::AlreadyHere => info!(fip = %current.address, "already assigned to this server"),
        Decision::HeldElsewhere {
            holder: h,
            name,
            state,
        } => {
            holder = Some(h.0);
            if state == "active" {
                info!(fip = %current.address, holder = %name, holder_id = %h, "held by another server; left alone");
            } else {
                warn!(
                    fip = %current.address, holder = %name, holder_id = %h, %state,
                    "held by another server that is not running: it answers for nobody, and claim never takes a Floating IP from a server that exists; unassign it in the cloud (e.g. `hcloud floating-ip unassign {}`) and run claim again",
                    current.id
                );
            }
        }
    }
    let holds = matches!(decision, Decision::Assign { .. } | Decision::AlreadyHere);
    let own = if holds {
        decide::own_address(current.address, &me, &local)
    } else {
        None
    };
    if holds && own.is_none() && current.address.is_ipv4() {
        warn!(fip = %current.address, server = %me.hostname, "none of this server's IPv4 addresses is on this host: this host's own connections to the Floating IP will not reach it");
    }
    if !args.no_accept {
        accept(current.address, own).await?;
    }
    Ok(Claimed {
        fip: current.address,
        fip_id: current.id.to_string(),
        server: me.hostname.clone(),
        server_id: me.id.0,
        result: decision.to_string(),
        holder,
        taken_from_gone_server: gone,
        accepted: !args.no_accept,
        own_traffic_to: own,
    })
}

/// Decides on a fresh read of the FIP (the list may be older than its last move) and assigns it
/// here if that is the decision; decides again after an action that was already running on the
/// FIP (an earlier claim killed after it sent its assign) has ended, so that a rerun never sends a
/// second assign on top of the first. Returns the FIP as decided on, and the decision.
async fn settle(
    cloud: &baton_cloud::CloudClient,
    fip: &baton_cloud::model::IpAddress,
    me: &baton_cloud::model::Server,
    servers: &[baton_cloud::model::Server],
) -> Result<(baton_cloud::model::IpAddress, Decision), ClaimError> {
    let waits_until = tokio::time::Instant::now() + LOCKED_WAIT;
    loop {
        let current = cloud.ip(&fip.id).await.map_err(|source| ClaimError::Cloud {
            step: format!("reading Floating IP {} ({})", fip.address, fip.id),
            source,
        })?;
        let decision = decide::decide(&current, me.id, servers);
        if !matches!(decision, Decision::Assign { .. }) {
            return Ok((current, decision));
        }
        match cloud.retarget_ip(&current.id, me.id).await {
            Ok(_) => return Ok((current, decision)),
            Err(e) if e.category() == "locked" && tokio::time::Instant::now() < waits_until => {
                info!(fip = %current.address, "another action runs on the Floating IP (an earlier claim stopped mid-way?): deciding again once it has ended");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(source) => {
                return Err(ClaimError::Cloud {
                    step: format!(
                        "assigning Floating IP {} ({}) to server {} ({})",
                        current.address, current.id, me.hostname, me.id
                    ),
                    source,
                });
            }
        }
    }
}

/// `--fip`: an address as it is, a name by the system's resolver.
async fn resolve(name: &str) -> Result<BTreeSet<IpAddr>, ClaimError> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(BTreeSet::from([ip]));
    }
    if !baton_core::names::is_dns1123_subdomain(name) {
        return Err(ClaimError::Resolve {
            name: name.to_owned(),
            reason: "neither an IP address nor a DNS name".into(),
        });
    }
    let found = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tokio::net::lookup_host((name, 0)),
    )
    .await
    .map_err(|_| ClaimError::Resolve {
        name: name.to_owned(),
        reason: "no answer from the resolver within 10s".into(),
    })?
    .map_err(|e| ClaimError::Resolve {
        name: name.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(found.map(|a| a.ip()).collect())
}

/// This host's addresses (none if they cannot be read: the host name and `--server` remain).
fn local_addresses() -> BTreeSet<IpAddr> {
    netlink::local_addresses().unwrap_or_else(|error| {
        warn!(%error, "cannot read this host's addresses");
        BTreeSet::new()
    })
}

/// This host's name, as the kernel has it.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Makes this node accept `fip` as the agent does, keeping every FIP its table holds: a
/// `redirect` in prerouting, and, with `own`, a `dnat` of this host's own packets for the FIP to
/// that address in output. One transaction; nothing when the table holds it already.
async fn accept(fip: IpAddr, own: Option<IpAddr>) -> Result<(), ClaimError> {
    let kernel = |source: crate::agent::PutError| ClaimError::Kernel { fip, source };
    let observed = netlink::run(netlink::Socket::read)
        .await
        .map_err(|e| kernel(e.into()))?;
    let mut want: Wanted = plan::accepted(&observed);
    want.fips.insert(fip);
    match own {
        Some(to) => {
            want.held.insert(fip, to);
        }
        None => {
            // Not held here (any more): its own packets must cross the cloud's route.
            want.held.remove(&fip);
        }
    }
    let Plan::Replace { families, .. } = plan::plan(&want, &observed) else {
        info!(%fip, "this node accepts the Floating IP already");
        return Ok(());
    };
    crate::agent::put(&want, families).await.map_err(kernel)?;
    info!(%fip, own_traffic_to = ?own, "this node accepts the Floating IP (nftables table baton)");
    Ok(())
}

#[cfg(test)]
mod tests;
