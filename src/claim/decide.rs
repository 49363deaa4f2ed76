//! What `baton claim` decides, from what the cloud and the host show (pure: no I/O).
//!
//! ```text
//!  --fip (addresses) | fipTag ─► the_fip(): one Floating IP of the project ─► owned? (fipTag,
//!                                                                               adoptFips)
//!  --server | this host's addresses | its host name ─► this_server(): one server of the project
//!                         ▼
//!  decide(fip, me, servers): Assign | AlreadyHere | HeldElsewhere (never taken from a server
//!                                                                  that exists)
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use baton_cloud::model::{IpAddress, IpType, Server, ServerId};
use baton_core::FipTag;

/// Why `baton claim` cannot go on. Each names what it looked at and the setting to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "which Floating IP to claim? Set fipTag (--fip-tag, CHERRY_FIP_TAG, or the key fipTag of --cloud-config), the label the controller finds the control-plane Floating IP by, or name its address with --fip"
    )]
    NoFipNamed,
    #[error("--fip {wanted}: no Floating IP of the project has {}", addresses.join(" or "))]
    NoFipAt { wanted: String, addresses: Vec<String> },
    #[error("fipTag {tag}: no Floating IP of the project carries it (create one with this label)")]
    NoFipTagged { tag: String },
    #[error(
        "several Floating IPs carry fipTag {tag} ({}): the controller would keep only the first; label one, or name it with --fip",
        found.join(", ")
    )]
    SeveralTagged { tag: String, found: Vec<String> },
    #[error("--fip {wanted}: it names several Floating IPs of the project ({}): name one address", found.join(", "))]
    SeveralAt { wanted: String, found: Vec<String> },
    #[error(
        "Floating IP {address} ({id}, labels {labels}) is not this cluster's: {rule}; baton claim assigns only a Floating IP the controller will keep, and leaves every other one alone (another cluster's, or nobody's yet: label it with the fipTag, or add {address} to adoptFips)"
    )]
    NotOwned {
        address: IpAddr,
        id: String,
        labels: String,
        rule: String,
    },
    #[error("--server {wanted}: no server of the project has that id or name")]
    UnknownServer { wanted: String },
    #[error(
        "cannot tell which server this host is: none of its addresses ({local}) is a server's primary or private address in the project, and no server is named {hostname:?}; name it with --server ID|NAME"
    )]
    NoServer { local: String, hostname: String },
    #[error("several servers match this host ({}): name one with --server ID|NAME", found.join(", "))]
    SeveralServers { found: Vec<String> },
}

impl Refusal {
    /// A short, stable name for logs and JSON.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoFipNamed => "NoFipNamed",
            Self::NoFipAt { .. } | Self::NoFipTagged { .. } => "FloatingIPNotFound",
            Self::SeveralTagged { .. } | Self::SeveralAt { .. } => "SeveralFloatingIPs",
            Self::NotOwned { .. } => "FloatingIPNotOwned",
            Self::UnknownServer { .. } | Self::NoServer { .. } => "ServerNotFound",
            Self::SeveralServers { .. } => "SeveralServers",
        }
    }
}

/// How the Floating IP is named: by the addresses `--fip` gave (an address, or a name resolved
/// to addresses), or by `fipTag`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FipChoice<'a> {
    /// `--fip`: what the user wrote, and the addresses it stands for.
    At {
        wanted: &'a str,
        addresses: BTreeSet<IpAddr>,
    },
    /// `fipTag`.
    Tagged(&'a FipTag),
}

/// Who may call a Floating IP theirs before the cluster exists: the controller's rule
/// ([`crate::controller::trust::EndpointPolicy::owns`]) without the cluster's id, which only
/// Service FIPs baton creates carry.
#[derive(Debug, Clone, Copy)]
pub struct Ownership<'a> {
    pub fip_tag: Option<&'a FipTag>,
    pub adopted: &'a BTreeSet<IpAddr>,
}

impl Ownership<'_> {
    /// Whether `fip` is this cluster's: it carries the `fipTag`, or `adoptFips` names it.
    pub fn owns(&self, fip: &IpAddress) -> bool {
        crate::controller::trust::tagged_or_adopted(self.fip_tag, self.adopted, fip)
    }

    fn rule(&self) -> String {
        let tag = self.fip_tag.map_or_else(
            || "no fipTag is set".to_owned(),
            |t| format!("it does not carry the fipTag {t}"),
        );
        let adopted = if self.adopted.is_empty() {
            "adoptFips is empty".to_owned()
        } else {
            "adoptFips does not name it".to_owned()
        };
        format!("{tag} and {adopted}")
    }
}

/// `k=v,k2=v2` (or `none`).
pub fn labels(fip: &IpAddress) -> String {
    if fip.tags.is_empty() {
        return "none".to_owned();
    }
    fip.tags
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The Floating IP to claim, from the project's IPs, and only if it is this cluster's.
pub fn the_fip<'a>(
    ips: impl IntoIterator<Item = &'a IpAddress>,
    choice: Option<&FipChoice<'_>>,
    ownership: Ownership<'_>,
) -> Result<&'a IpAddress, Refusal> {
    let fips: Vec<&IpAddress> = ips
        .into_iter()
        .filter(|ip| ip.ip_type == IpType::FloatingIp)
        .collect();
    let show = |found: &[&IpAddress]| {
        found
            .iter()
            .map(|ip| format!("{} ({})", ip.address, ip.id))
            .collect()
    };
    let fip = match choice {
        None => return Err(Refusal::NoFipNamed),
        Some(FipChoice::At { wanted, addresses }) => {
            let found: Vec<&IpAddress> = fips
                .into_iter()
                .filter(|ip| addresses.contains(&ip.address))
                .collect();
            match found.as_slice() {
                [] => {
                    return Err(Refusal::NoFipAt {
                        wanted: (*wanted).to_owned(),
                        addresses: addresses.iter().map(ToString::to_string).collect(),
                    });
                }
                [one] => *one,
                _ => {
                    return Err(Refusal::SeveralAt {
                        wanted: (*wanted).to_owned(),
                        found: show(&found),
                    });
                }
            }
        }
        Some(FipChoice::Tagged(tag)) => {
            let found: Vec<&IpAddress> = fips
                .into_iter()
                .filter(|ip| tag.matches(ip.tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))))
                .collect();
            match found.as_slice() {
                [] => return Err(Refusal::NoFipTagged { tag: tag.to_string() }),
                [one] => *one,
                _ => {
                    return Err(Refusal::SeveralTagged {
                        tag: tag.to_string(),
                        found: show(&found),
                    });
                }
            }
        }
    };
    if !ownership.owns(fip) {
        return Err(Refusal::NotOwned {
            address: fip.address,
            id: fip.id.to_string(),
            labels: labels(fip),
            rule: ownership.rule(),
        });
    }
    Ok(fip)
}

/// The server this host is: the one `--server` names (its id or name); else the one whose
/// primary or private address is one of this host's; else the one named like this host (its
/// full host name, or the first label of it).
pub fn this_server<'a>(
    servers: &'a [Server],
    flag: Option<&str>,
    local: &BTreeSet<IpAddr>,
    hostname: &str,
) -> Result<&'a Server, Refusal> {
    let names = |found: &[&Server]| {
        found
            .iter()
            .map(|s| format!("{} ({})", s.hostname, s.id))
            .collect()
    };
    if let Some(wanted) = flag {
        let wanted = wanted.trim();
        let by_id = wanted.parse::<u64>().ok().map(ServerId);
        return servers
            .iter()
            .find(|s| Some(s.id) == by_id)
            .or_else(|| servers.iter().find(|s| s.hostname == wanted))
            .ok_or_else(|| Refusal::UnknownServer {
                wanted: wanted.to_owned(),
            });
    }
    let by_address: Vec<&Server> = servers
        .iter()
        .filter(|s| {
            s.ip_addresses.iter().any(|ip| {
                matches!(ip.ip_type, IpType::PrimaryIp | IpType::PrivateIp) && local.contains(&ip.address)
            })
        })
        .collect();
    match by_address.as_slice() {
        [one] => return Ok(one),
        [] => {}
        several => {
            return Err(Refusal::SeveralServers {
                found: names(several),
            });
        }
    }
    let short = hostname.split('.').next().unwrap_or(hostname);
    let by_name: Vec<&Server> = servers
        .iter()
        .filter(|s| !s.hostname.is_empty() && (s.hostname == hostname || s.hostname == short))
        .collect();
    match by_name.as_slice() {
        [one] => Ok(one),
        [] => Err(Refusal::NoServer {
            local: if local.is_empty() {
                "none".to_owned()
            } else {
                local
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            hostname: hostname.to_owned(),
        }),
        several => Err(Refusal::SeveralServers {
            found: names(several),
        }),
    }
}

/// What to do with the Floating IP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Assign it to this server: it is assigned to none, or to a server that no longer exists
    /// (`from`).
    Assign { from: Option<ServerId> },
    /// It is assigned to this server already: nothing to send.
    AlreadyHere,
    /// Another server of the project holds it (a control-plane node that claimed it first, or
    /// the controller's choice): left alone. `state` is that server's as the cloud says it.
    HeldElsewhere {
        holder: ServerId,
        name: String,
        state: String,
    },
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Assign { .. } => "assigned",
            Self::AlreadyHere => "already-here",
            Self::HeldElsewhere { .. } => "held-elsewhere",
        })
    }
}

/// Assign the FIP here only if no server of the project holds it: a claim never takes a
/// Floating IP from a server that exists, running or not (the controller moves it between
/// healthy API servers; a second control-plane node or a rerun must not pull it away from the
/// first one's API server).
pub fn decide(fip: &IpAddress, me: ServerId, servers: &[Server]) -> Decision {
    match fip.target() {
        None => Decision::Assign { from: None },
        Some(holder) if holder == me => Decision::AlreadyHere,
        Some(holder) => match servers.iter().find(|s| s.id == holder) {
            Some(s) => Decision::HeldElsewhere {
                holder,
                name: s.hostname.clone(),
                state: s.state.clone(),
            },
            None => Decision::Assign { from: Some(holder) },
        },
    }
}

/// The address this host's own packets for the FIP go to (the agent's output rule): the
/// server's primary IPv4 address if the host has it, else another of its IPv4 addresses the
/// host has; `None` for an IPv6 FIP or a server none of whose addresses is on the host.
pub fn own_address(fip: IpAddr, server: &Server, local: &BTreeSet<IpAddr>) -> Option<IpAddr> {
    if !fip.is_ipv4() {
        return None;
    }
    let mine = |kind: IpType| {
        server
            .ip_addresses
            .iter()
            .filter(move |ip| ip.ip_type == kind && ip.address.is_ipv4() && local.contains(&ip.address))
            .map(|ip| ip.address)
    };
    mine(IpType::PrimaryIp).chain(mine(IpType::PrivateIp)).next()
}
