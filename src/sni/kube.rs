//! Tenants from Kubernetes: a Service annotated `baton.dev/sni-hosts: "api.t1.example.com,…"`
//! is a tenant; the ready addresses of its EndpointSlices are its backends. Watched, and the
//! route table rebuilt on every change, so a new tenant, a moved API server or a new host name
//! takes effect without a restart and without touching established connections.
//!
//! ```text
//!  watch Services ─────┐ (kube-runtime reflectors, own watches: the controller's shared ones
//!  watch EndpointSlices┘  live in controller/watches.rs, which this router does not run)
//!        │ any change (debounced 50 ms)
//!        ▼
//!  plan: tenants(services, slices) ─► RouteSpec + problems (pure, unit-tested)
//!        ▼
//!  Sources::set_services ─► flags + file + Services merged ─► RouteTable published (watch)
//!  new problems ─► log + Warning Event on the Service (SniHostConflict, SniHostInvalid, SniNoPort)
//! ```
//!
//! The backend port is the EndpointSlice port with the name of the Service's port named
//! `https` (else its first port), as kube-proxy pairs them. A host claimed by two Services
//! goes to the older one (then the lower namespace/name); the other is reported. Routes from
//! flags and the routes file win over Services.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use crate::events::{Event, EventType, Recorder, Reporter};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Resource as _, ResourceExt as _};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::hello::normalize_host;
use super::routes::RouteSpec;

/// The annotation naming a tenant Service's host names (comma-separated).
pub const SNI_HOSTS: &str = "baton.dev/sni-hosts";
/// The label linking an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Something wrong with a tenant Service, reported (logged) and left out of the routes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("Service {service}: annotation {SNI_HOSTS} value {value:?} is not a host name")]
    BadHost { service: String, value: String },
    #[error("Service {service}: host {host} is already routed by {owner}; ignored here")]
    Conflict {
        service: String,
        host: String,
        owner: String,
    },
    #[error("Service {service}: no port")]
    NoPort { service: String },
}

impl Problem {
    /// The Service it is about (`namespace/name`) and the Event reason.
    pub fn service_and_reason(&self) -> (&str, &'static str) {
        match self {
            Self::BadHost { service, .. } => (service, "SniHostInvalid"),
            Self::Conflict { service, .. } => (service, "SniHostConflict"),
            Self::NoPort { service } => (service, "SniNoPort"),
        }
    }
}

/// One tenant as read from a Service and its EndpointSlices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// `namespace/name`.
    pub service: String,
    pub hosts: Vec<String>,
    /// Ready endpoints, sorted.
    pub backends: Vec<SocketAddr>,
}

/// The tenants among `services` (those with the annotation) and their ready backends, with
/// host conflicts resolved (older Service wins) and problems listed.
pub fn tenants(services: &[Arc<Service>], slices: &[Arc<EndpointSlice>]) -> (Vec<Tenant>, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut annotated: Vec<&Arc<Service>> = services
        .iter()
        .filter(|s| s.annotations().contains_key(SNI_HOSTS))
        .collect();
    // Older first; ties by namespace/name, so the same input always gives the same winner.
    annotated.sort_by_key(|s| {
        (
            s.metadata.creation_timestamp.as_ref().map(|t| t.0),
            s.namespace().unwrap_or_default(),
            s.name_any(),
        )
    });
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    let mut out = Vec::new();
    for svc in annotated {
        let ns = svc.namespace().unwrap_or_default();
        let key = format!("{ns}/{}", svc.name_any());
        let mut hosts = Vec::new();
        for raw in svc.annotations()[SNI_HOSTS]
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
        {
            let Ok(host) = normalize_host(raw.as_bytes()) else {
                problems.push(Problem::BadHost {
                    service: key.clone(),
                    value: raw.to_owned(),
                });
                continue;
            };
            if let Some(o) = owner.get(&host) {
                problems.push(Problem::Conflict {
                    service: key.clone(),
                    host,
                    owner: o.clone(),
                });
                continue;
            }
            owner.insert(host.clone(), key.clone());
            hosts.push(host);
        }
        if hosts.is_empty() {
            continue;
        }
        let Some(port_name) = service_port_name(svc) else {
            problems.push(Problem::NoPort { service: key });
            continue;
        };
        let mut backends: Vec<SocketAddr> = slices
            .iter()
            .filter(|sl| {
                sl.namespace().as_deref() == Some(ns.as_str())
                    && sl.labels().get(SERVICE_NAME_LABEL) == Some(&svc.name_any())
            })
            .flat_map(|sl| ready_addresses(sl, &port_name))
            .collect();
        backends.sort();
        backends.dedup();
        out.push(Tenant {
            service: key,
            hosts,
            backends,
        });
    }
    (out, problems)
}

/// The name of the Service port whose endpoints are the backends: `https`, else the first.
fn service_port_name(svc: &Service) -> Option<String> {
    let ports = svc.spec.as_ref()?.ports.as_ref()?;
    let port = ports
        .iter()
        .find(|p| p.name.as_deref() == Some("https"))
        .or_else(|| ports.first())?;
    Some(port.name.clone().unwrap_or_default())
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
        ..RouteSpec::default()
    }
}

/// Watches Services and EndpointSlices (in `namespace`, or all) and calls `publish` with the
/// tenants after every change, until `shutdown`.
pub async fn watch_tenants(
    client: kube::Client,
    namespace: Option<String>,
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
    let (svc_api, slice_api): (Api<Service>, Api<EndpointSlice>) = match &namespace {
        Some(ns) => (Api::namespaced(client.clone(), ns), Api::namespaced(client, ns)),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    let (services, svc_writer) = reflector::store();
    let (slices, slice_writer) = reflector::store();
    let (changed_tx, mut changed) = tokio::sync::watch::channel(());
    let svc_changed = changed_tx.clone();
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
        let mut last: Option<(Vec<Tenant>, Vec<Problem>)> = None;
        while changed.changed().await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await; // let a burst settle
            changed.borrow_and_update();
            let now = plan(&services, &slices);
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
        () = svc_stream => {}
        () = slice_stream => {}
        () = rebuild => {}
    }
}

/// A Warning Event on the Service a problem is about; failures are logged, never fatal.
async fn event(recorder: &Recorder, services: &Store<Service>, problem: &Problem) {
    let (key, reason) = problem.service_and_reason();
    let Some((ns, name)) = key.split_once('/') else {
        return;
    };
    let Some(svc) = services.get(&ObjectRef::new(name).within(ns)) else {
        return;
    };
    let ev = Event {
        type_: EventType::Warning,
        reason: reason.to_owned(),
        note: Some(problem.to_string()),
        action: "Route".to_owned(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&ev, &svc.object_ref(&())).await {
        warn!(%error, reason, "publishing an Event failed");
    }
}

fn plan(services: &Store<Service>, slices: &Store<EndpointSlice>) -> (Vec<Tenant>, Vec<Problem>) {
    tenants(&services.state(), &slices.state())
}

fn note(error: Option<&watcher::Error>, kind: &str, changed: &tokio::sync::watch::Sender<()>) {
    match error {
        Some(error) => warn!(%error, kind, "watch failed; retrying"),
        None => changed.send_replace(()),
    }
}

#[cfg(test)]
mod tests;
