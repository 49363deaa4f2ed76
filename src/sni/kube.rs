//! Tenants from Kubernetes: a Service annotated `baton.dev/sni-hosts: "api.t1.example.com,…"`
//! in a namespace the operator allowed is a tenant; the ready addresses of its EndpointSlices
//! are its backends. Watched, and the route table rebuilt on every change, so a new tenant, a
//! moved API server or a new host name takes effect without a restart and without touching
//! established connections.
//!
//! ```text
//!  watch Namespaces ───┐ (kube-runtime reflectors, own watches: the controller's shared ones
//!  watch Services ─────┤  live in controller/watches.rs, which this router does not run)
//!  watch EndpointSlices┘
//!        │ any change (debounced 50 ms)
//!        ▼
//!  plan: tenants(services, slices, namespaces, policy) ─► RouteSpec + problems (pure, tested)
//!        ▼
//!  Sources::set_services ─► flags + file + Services merged ─► RouteTable published (watch)
//!  new problems ─► log + Warning Event on the Service(s) (SniHostNotAllowed, SniHostConflict
//!                  on both, SniBackendNotAllowed, SniHostInvalid, SniNoPort)
//! ```
//!
//! Who may be a tenant ([`Policy`], safe by default): only Services in a namespace allowed by
//! `--tenant-namespace NS=DOMAIN,…` or carrying the label `--tenant-namespace-label`
//! (`baton.dev/sni-tenants=true`; its domains in the annotation `baton.dev/sni-domains`) —
//! labels and annotations of a Namespace are the cluster operator's, not the tenant's; a
//! Service elsewhere is ignored. A host name must be one of its namespace's domains or under
//! one. A backend must be in a `--backend-cidr` network (none given: none allowed) and never
//! loopback, link-local, multicast, unspecified or an address of this node (the router runs on
//! the host network: it would reach the node's own kubelet, etcd, API server).
//!
//! The default backends are the EndpointSlice port with the name of the Service's port named
//! `https` (else its first port), as kube-proxy pairs them; every other Service port P gives
//! the tenant's backends for connections to the router's port P (konnectivity on 8132 beside
//! the API server). A host claimed by two Services goes to the older one (then the lower
//! namespace/name), and both get an Event. Routes from flags and the routes file win over
//! Services.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use crate::events::{Event, EventType, Recorder, Reporter};
use futures::StreamExt as _;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Resource as _, ResourceExt as _};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::hello::normalize_host;
use super::routes::{RouteError, RouteSpec};

/// The annotation naming a tenant Service's host names (comma-separated).
pub const SNI_HOSTS: &str = "baton.dev/sni-hosts";
/// The Namespace annotation naming the domains its tenant Services may claim (comma-separated).
pub const SNI_DOMAINS: &str = "baton.dev/sni-domains";
/// The label linking an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Who may be a tenant: which namespaces, which host names, which backends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Namespaces allowed by flag, with their domains.
    pub namespaces: BTreeMap<String, Vec<String>>,
    /// The label (`key`, `value`) that allows a namespace; its domains are in [`SNI_DOMAINS`].
    pub label: Option<(String, String)>,
    /// Networks backends must be in.
    pub backend_cidrs: Vec<IpNet>,
    /// This node's own addresses (never dialled).
    pub local: BTreeSet<IpAddr>,
}

impl Policy {
    /// The policy from the flags; the error names the flag and the value.
    pub fn from_flags(
        tenant_namespace: &[String],
        label: &str,
        cidrs: &[String],
    ) -> Result<Self, RouteError> {
        let mut namespaces = BTreeMap::new();
        for spec in tenant_namespace {
            let bad = |why: String| RouteError {
                field: "--tenant-namespace",
                value: spec.clone(),
                why,
            };
            let (ns, domains) = spec
                .split_once('=')
                .ok_or_else(|| bad("expected NS=DOMAIN[,DOMAIN…]".into()))?;
            let ns = ns.trim();
            if !baton_core::names::is_dns1123_label(ns) {
                return Err(bad(format!("{ns:?} is not a namespace name")));
            }
            let domains = parse_domains(domains).map_err(bad)?;
            if namespaces.insert(ns.to_owned(), domains).is_some() {
                return Err(bad(format!("namespace {ns} is given twice")));
            }
        }
        let label = match label.trim() {
            "" => None,
            l => {
                let (k, v) = l.split_once('=').ok_or_else(|| RouteError {
                    field: "--tenant-namespace-label",
                    value: l.to_owned(),
                    why: "expected KEY=VALUE, or \"\" for none".into(),
                })?;
                Some((k.trim().to_owned(), v.trim().to_owned()))
            }
        };
        let backend_cidrs = cidrs
            .iter()
            .filter(|c| !c.trim().is_empty())
            .map(|c| {
                c.trim()
                    .parse::<IpNet>()
                    .map(|n| n.trunc())
                    .map_err(|_| RouteError {
                        field: "--backend-cidr",
                        value: c.clone(),
                        why: "not a CIDR (e.g. 10.244.0.0/16)".into(),
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            namespaces,
            label,
            backend_cidrs,
            local: BTreeSet::new(),
        })
    }

    /// Whether no namespace can ever be allowed.
    pub fn allows_nothing(&self) -> bool {
        self.namespaces.is_empty() && self.label.is_none()
    }

    /// The domains namespace `ns` may claim host names in; `None`: not a tenant namespace.
    fn domains(&self, ns: &str, namespaces: &BTreeMap<String, Arc<Namespace>>) -> Option<Vec<String>> {
        let mut out = self.namespaces.get(ns).cloned();
        if let (Some((key, value)), Some(obj)) = (&self.label, namespaces.get(ns))
            && obj.labels().get(key) == Some(value)
        {
            let annotated = obj
                .annotations()
                .get(SNI_DOMAINS)
                .and_then(|d| parse_domains(d).ok())
                .unwrap_or_default();
            out.get_or_insert_with(Vec::new).extend(annotated);
        }
        out
    }

    /// Why `ip` may not be dialled, if it may not.
    pub fn refuses(&self, ip: IpAddr) -> Option<&'static str> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 @ IpAddr::V4(_) => v4,
        };
        let special = match ip {
            IpAddr::V4(v4) => {
                v4.is_loopback()
                    || v4.is_link_local()
                    || v4.is_multicast()
                    || v4.is_unspecified()
                    || v4.is_broadcast()
            }
            IpAddr::V6(v6) => {
                v6.is_loopback() || v6.is_unicast_link_local() || v6.is_multicast() || v6.is_unspecified()
            }
        };
        if special {
            Some("a loopback, link-local, multicast or unspecified address")
        } else if self.local.contains(&ip) {
            Some("an address of this node")
        } else if !self.backend_cidrs.iter().any(|n| n.contains(&ip)) {
            Some("outside the allowed networks (--backend-cidr)")
        } else {
            None
        }
    }
}

/// `DOMAIN[,DOMAIN…]`, normalized host names.
fn parse_domains(text: &str) -> Result<Vec<String>, String> {
    let domains = text
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| normalize_host(d.as_bytes()).map_err(|_| format!("{d:?} is not a domain name")))
        .collect::<Result<Vec<_>, _>>()?;
    if domains.is_empty() {
        return Err("no domain".into());
    }
    Ok(domains)
}

/// Whether `host` is `domain` or a name under it.
pub fn in_domain(host: &str, domain: &str) -> bool {
    host == domain || host.strip_suffix(domain).is_some_and(|rest| rest.ends_with('.'))
}

/// Something wrong with a tenant Service, reported (logged, Events) and left out of the routes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("Service {service}: annotation {SNI_HOSTS} value {value:?} is not a host name")]
    BadHost { service: String, value: String },
    #[error("Service {service}: host {host} is not in its namespace's domains ({domains}); refused")]
    HostNotAllowed {
        service: String,
        host: String,
        domains: String,
    },
    #[error("Service {service}: host {host} is already routed by {owner}; refused here")]
    Conflict {
        service: String,
        host: String,
        owner: String,
    },
    #[error("Service {service}: backend {backend} is {why}; never dialled")]
    BackendNotAllowed {
        service: String,
        backend: IpAddr,
        why: &'static str,
    },
    #[error("Service {service}: no port")]
    NoPort { service: String },
}

impl Problem {
    /// The Events it gives: (`namespace/name` of the Service, reason, note, `namespace/name`
    /// of the other Service involved).
    pub fn events(&self) -> Vec<(&str, &'static str, String, Option<&str>)> {
        match self {
            Self::BadHost { service, .. } => vec![(service, "SniHostInvalid", self.to_string(), None)],
            Self::HostNotAllowed { service, .. } => {
                vec![(service, "SniHostNotAllowed", self.to_string(), None)]
            }
            Self::Conflict { service, host, owner } => vec![
                (service, "SniHostConflict", self.to_string(), Some(owner)),
                (
                    owner,
                    "SniHostConflict",
                    format!("Service {service} also claims host {host}; refused there, it stays routed here"),
                    Some(service),
                ),
            ],
            Self::BackendNotAllowed { service, .. } => {
                vec![(service, "SniBackendNotAllowed", self.to_string(), None)]
            }
            Self::NoPort { service } => vec![(service, "SniNoPort", self.to_string(), None)],
        }
    }
}

/// One tenant as read from a Service and its EndpointSlices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// `namespace/name`.
    pub service: String,
    pub hosts: Vec<String>,
    /// Ready endpoints of the default port, sorted.
    pub backends: Vec<SocketAddr>,
    /// Ready endpoints of every other Service port, by its number.
    pub ports: Vec<(u16, Vec<SocketAddr>)>,
}

/// The tenants among `services` (annotated, in allowed namespaces, host names in their
/// domains) and their ready, allowed backends, with host conflicts resolved (older Service
/// wins) and problems listed.
pub fn tenants(
    services: &[Arc<Service>],
    slices: &[Arc<EndpointSlice>],
    namespaces: &[Arc<Namespace>],
    policy: &Policy,
) -> (Vec<Tenant>, Vec<Problem>) {
    let namespaces: BTreeMap<String, Arc<Namespace>> =
        namespaces.iter().map(|n| (n.name_any(), Arc::clone(n))).collect();
    let mut problems = Vec::new();
    let mut annotated: Vec<(&Arc<Service>, Vec<String>)> = services
        .iter()
        .filter(|s| s.annotations().contains_key(SNI_HOSTS))
        .filter_map(|s| {
            let domains = policy.domains(&s.namespace().unwrap_or_default(), &namespaces);
            if domains.is_none() {
                debug!(service = %s.name_any(), namespace = ?s.namespace(), "tenant Service in a namespace not allowed: ignored");
            }
            Some((s, domains?))
        })
        .collect();
    // Older first; ties by namespace/name, so the same input always gives the same winner.
    annotated.sort_by_key(|(s, _)| {
        (
            s.metadata.creation_timestamp.as_ref().map(|t| t.0),
            s.namespace().unwrap_or_default(),
            s.name_any(),
        )
    });
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    let mut out = Vec::new();
    for (svc, domains) in annotated {
        let ns = svc.namespace().unwrap_or_default();
        let key = format!("{ns}/{}", svc.name_any());
        let hosts = claim_hosts(svc, &key, &domains, &mut owner, &mut problems);
        if hosts.is_empty() {
            continue;
        }
        let Some((default_name, others)) = service_ports(svc) else {
            problems.push(Problem::NoPort { service: key });
            continue;
        };
        let own: Vec<&Arc<EndpointSlice>> = slices
            .iter()
            .filter(|sl| {
                sl.namespace().as_deref() == Some(ns.as_str())
                    && sl.labels().get(SERVICE_NAME_LABEL) == Some(&svc.name_any())
            })
            .collect();
        let mut refused = BTreeSet::new();
        let mut allowed = |name: &str| {
            let mut addrs: Vec<SocketAddr> = own
                .iter()
                .flat_map(|sl| ready_addresses(sl, name))
                .filter(|a| match policy.refuses(a.ip()) {
                    Some(why) => {
                        refused.insert((a.ip(), why));
                        false
                    }
                    None => true,
                })
                .collect();
            addrs.sort();
            addrs.dedup();
            addrs
        };
        let backends = allowed(&default_name);
        let ports = others.iter().map(|(port, name)| (*port, allowed(name))).collect();
        for (backend, why) in refused {
            problems.push(Problem::BackendNotAllowed {
                service: key.clone(),
                backend,
                why,
            });
        }
        out.push(Tenant {
            service: key,
            hosts,
            backends,
            ports,
        });
    }
    (out, problems)
}

/// The host names `svc` (`key`) may have: valid, in `domains`, not claimed by an older Service
/// (`owner`: host → its Service); the others are reported.
fn claim_hosts(
    svc: &Service,
    key: &str,
    domains: &[String],
    owner: &mut BTreeMap<String, String>,
    problems: &mut Vec<Problem>,
) -> Vec<String> {
    let mut hosts = Vec::new();
    for raw in svc.annotations()[SNI_HOSTS]
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
    {
        let Ok(host) = normalize_host(raw.as_bytes()) else {
            problems.push(Problem::BadHost {
                service: key.to_owned(),
                value: raw.to_owned(),
            });
            continue;
        };
        if !domains.iter().any(|d| in_domain(&host, d)) {
            problems.push(Problem::HostNotAllowed {
                service: key.to_owned(),
                host,
                domains: domains.join(","),
            });
            continue;
        }
        if let Some(o) = owner.get(&host) {
            problems.push(Problem::Conflict {
                service: key.to_owned(),
                host,
                owner: o.clone(),
            });
            continue;
        }
        owner.insert(host.clone(), key.to_owned());
        hosts.push(host);
    }
    hosts
}

/// The name of the Service port whose endpoints are the default backends (`https`, else the
/// first), and every other port's number and name.
fn service_ports(svc: &Service) -> Option<(String, Vec<(u16, String)>)> {
    let ports = svc.spec.as_ref()?.ports.as_ref()?;
    let default = ports
        .iter()
        .find(|p| p.name.as_deref() == Some("https"))
        .or_else(|| ports.first())?;
    let name = |p: &k8s_openapi::api::core::v1::ServicePort| p.name.clone().unwrap_or_default();
    let others = ports
        .iter()
        .filter(|p| !std::ptr::eq(*p, default))
        .filter_map(|p| Some((u16::try_from(p.port).ok()?, name(p))))
        .collect();
    Some((name(default), others))
}

/// The ready addresses of a slice with the port named `port_name`.
fn ready_addresses(slice: &EndpointSlice, port_name: &str) -> Vec<SocketAddr> {
    if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        return Vec::new();
    }
    let Some(port) = slice
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref().unwrap_or_default() == port_name)
        .and_then(|p| p.port)
        .and_then(|p| u16::try_from(p).ok())
    else {
        return Vec::new();
    };
    slice
        .endpoints
        .iter()
        // A missing condition means ready (the API's own reading).
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .flat_map(|e| e.addresses.iter())
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, port))
        .collect()
}

/// The route spec of the tenants (tenants without a ready backend are routed to nothing:
/// their connections are closed and counted as `no_backend`).
pub fn spec(tenants: &[Tenant]) -> RouteSpec {
    RouteSpec {
        tenants: tenants
            .iter()
            .map(|t| (t.hosts.clone(), t.backends.clone()))
            .collect(),
        ports: tenants
            .iter()
            .flat_map(|t| {
                t.ports
                    .iter()
                    .map(|(port, addrs)| (t.hosts.clone(), *port, addrs.clone()))
            })
            .collect(),
        ..RouteSpec::default()
    }
}

/// The addresses of this node's interfaces (the router runs on the host network), never
/// dialled as a tenant's backend. Empty if they cannot be read (logged).
pub fn local_addresses() -> BTreeSet<IpAddr> {
    match nix::ifaddrs::getifaddrs() {
        Ok(addrs) => addrs
            .filter_map(|ifa| {
                let a = ifa.address?;
                a.as_sockaddr_in()
                    .map(|v4| IpAddr::V4(v4.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
            })
            .collect(),
        Err(error) => {
            warn!(%error, "reading this node's addresses failed");
            BTreeSet::new()
        }
    }
}

/// Watches Namespaces, Services and EndpointSlices (Services and slices in `namespace`, or
/// all) and calls `publish` with the tenants `policy` allows after every change, until
/// `shutdown`.
pub async fn watch_tenants(
    client: kube::Client,
    namespace: Option<String>,
    policy: Policy,
    publish: impl Fn(Vec<Tenant>) + Send + 'static,
    shutdown: CancellationToken,
) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "baton-sni".into(),
            instance: std::env::var("HOSTNAME").ok(),
        },
    );
    let ns_config = match &namespace {
        Some(ns) => watcher::Config::default().fields(&format!("metadata.name={ns}")),
        None => watcher::Config::default(),
    };
    let ns_api: Api<Namespace> = Api::all(client.clone());
    let (svc_api, slice_api): (Api<Service>, Api<EndpointSlice>) = match &namespace {
        Some(ns) => (Api::namespaced(client.clone(), ns), Api::namespaced(client, ns)),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    let (namespaces, ns_writer) = reflector::store();
    let (services, svc_writer) = reflector::store();
    let (slices, slice_writer) = reflector::store();
    let (changed_tx, mut changed) = tokio::sync::watch::channel(());
    let (ns_changed, svc_changed) = (changed_tx.clone(), changed_tx.clone());
    let ns_stream = watcher(ns_api, ns_config)
        .default_backoff()
        .reflect(ns_writer)
        .for_each(move |ev| {
            note(ev.as_ref().err(), "Namespaces", &ns_changed);
            std::future::ready(())
        });
    let svc_stream = watcher(svc_api, watcher::Config::default())
        .default_backoff()
        .reflect(svc_writer)
        .for_each(move |ev| {
            note(ev.as_ref().err(), "Services", &svc_changed);
            std::future::ready(())
        });
    let slice_stream = watcher(slice_api, watcher::Config::default().labels(SERVICE_NAME_LABEL))
        .default_backoff()
        .reflect(slice_writer)
        .for_each(move |ev| {
            note(ev.as_ref().err(), "EndpointSlices", &changed_tx);
            std::future::ready(())
        });
    let rebuild = async move {
        let mut policy = policy;
        let mut last: Option<(Vec<Tenant>, Vec<Problem>)> = None;
        while changed.changed().await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await; // let a burst settle
            changed.borrow_and_update();
            policy.local = local_addresses();
            let now = tenants(&services.state(), &slices.state(), &namespaces.state(), &policy);
            if last.as_ref() == Some(&now) {
                continue;
            }
            for p in &now.1 {
                if !last.as_ref().is_some_and(|(_, old)| old.contains(p)) {
                    warn!(problem = %p, "tenant Service");
                    event(&recorder, &services, p).await;
                }
            }
            info!(tenants = now.0.len(), "tenants from Services changed");
            publish(now.0.clone());
            last = Some(now);
        }
    };
    tokio::select! {
        () = shutdown.cancelled() => {}
        () = ns_stream => {}
        () = svc_stream => {}
        () = slice_stream => {}
        () = rebuild => {}
    }
}

/// A Warning Event on each Service a problem is about; failures are logged, never fatal.
async fn event(recorder: &Recorder, services: &Store<Service>, problem: &Problem) {
    let find = |key: &str| {
        let (ns, name) = key.split_once('/')?;
        services.get(&ObjectRef::new(name).within(ns))
    };
    for (key, reason, note, other) in problem.events() {
        let Some(svc) = find(key) else {
            continue;
        };
        // The other Service as the related object: one series per pair, not one per reason.
        let secondary = other.and_then(find).map(|o| o.object_ref(&()));
        let ev = Event {
            type_: EventType::Warning,
            reason: reason.to_owned(),
            note: Some(note),
            action: "Route".to_owned(),
            secondary,
        };
        if let Err(error) = recorder.publish(&ev, &svc.object_ref(&())).await {
            warn!(%error, reason, "publishing an Event failed");
        }
    }
}

fn note(error: Option<&watcher::Error>, kind: &str, changed: &tokio::sync::watch::Sender<()>) {
    match error {
        Some(error) => warn!(%error, kind, "watch failed; retrying"),
        None => changed.send_replace(()),
    }
}

#[cfg(test)]
mod tests;
