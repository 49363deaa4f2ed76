//! The side-effecting steps, each idempotent, and the pure decisions they rest on.
//!
//! - FIPs: found by tag or address, or reserved with tags that find them again
//!   ([`resolve_fip`]); the state file's record wins over a fresh search, so a FIP is never
//!   reserved twice.
//! - Kubernetes: the API Services ([`desired_service`]) and the handoff manifests are written by
//!   server-side apply under one field manager, so applying twice changes nothing and never
//!   creates a second object; readiness is a pure function of what the API returns
//!   ([`service_readiness`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use baton_cloud::Cloud;
use baton_cloud::model::{CreateIpRequest, IpAddress, IpType, Tags};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServicePort as K8sServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::discovery::Scope;
use kube::{Api, ResourceExt as _};
use serde::Serialize;
use tracing::debug;

use super::config::{BootstrapConfig, Endpoint, FipSource, ManifestObject, reserve_tags};
use super::error::BootstrapError;
use super::state::FipRecord;
use crate::names::{
    BOOTSTRAP_FIPS_KEY, BOOTSTRAP_NAMESPACES_KEY, BOOTSTRAP_RECORD, CONTROL_PLANE_CLASS,
    CONTROL_PLANE_ENDPOINT_ANNOTATION, FIELD_MANAGER, METALLB_DISABLE_ANNOTATION, SERVICE_NAME_LABEL,
    with_class,
};

/// Label on the API Services naming their endpoint.
pub const ENDPOINT_LABEL: &str = "baton.dev/endpoint";

// ---------------------------------------------------------------------------------------------
// Cloud

fn cloud_err(step: impl Into<String>) -> impl FnOnce(baton_cloud::CloudError) -> BootstrapError {
    let step = step.into();
    move |source| BootstrapError::Cloud { step, source }
}

/// Checks `region` against the cloud's regions (slug, name or id), naming `cloud.region`.
pub async fn check_region(
    cloud: &dyn Cloud,
    cfg: &BootstrapConfig,
    region: &str,
) -> Result<(), BootstrapError> {
    let regions = cloud.regions().await.map_err(cloud_err("listing regions"))?;
    if regions
        .iter()
        .any(|r| r.slug == region || r.name == region || r.id.to_string() == region)
    {
        return Ok(());
    }
    let known: Vec<&str> = regions.iter().map(|r| r.slug.as_str()).collect();
    Err(BootstrapError::Field {
        path: cfg.path.clone(),
        field: "cloud.region".into(),
        message: format!(
            "unknown region {region:?} (the project's cloud has: {})",
            known.join(", ")
        ),
    })
}

fn is_fip(ip: &IpAddress) -> bool {
    ip.ip_type == IpType::FloatingIp
}

fn record(ip: &IpAddress, reserved_by_baton: bool) -> FipRecord {
    FipRecord {
        id: ip.id.0.clone(),
        address: ip.address,
        reserved_by_baton,
    }
}

/// The first FIP matching `pred`: in the cached list, else in a fresh one (another process may
/// have just created it).
async fn find_fip(
    cloud: &dyn Cloud,
    pred: impl Fn(&IpAddress) -> bool,
) -> Result<Option<IpAddress>, BootstrapError> {
    let ips = cloud.ips().await.map_err(cloud_err("listing IP addresses"))?;
    if let Some(ip) = ips.iter().find(|ip| is_fip(ip) && pred(ip)) {
        return Ok(Some(IpAddress::clone(ip)));
    }
    cloud.invalidate_ips();
    let ips = cloud.ips().await.map_err(cloud_err("listing IP addresses"))?;
    Ok(ips
        .iter()
        .find(|ip| is_fip(ip) && pred(ip))
        .map(|ip| IpAddress::clone(ip)))
}

/// Finds the FIP an endpoint should use (or reserves it). `recorded` is what the state file
/// says an earlier run found; `index` names the endpoint in errors.
pub async fn resolve_fip(
    cloud: &dyn Cloud,
    cfg: &BootstrapConfig,
    index: usize,
    ep: &Endpoint,
    recorded: Option<&FipRecord>,
    region: Option<&str>,
) -> Result<FipRecord, BootstrapError> {
    let field = |f: &str| format!("endpoints[{index}].fip.{f}");
    if let Some(rec) = recorded {
        // An earlier run settled this endpoint's FIP: keep it, whatever its tags are now.
        let id = rec.id.clone();
        return match find_fip(cloud, |ip| ip.id.0 == id).await? {
            Some(ip) if ip.address == rec.address => Ok(record(&ip, rec.reserved_by_baton)),
            Some(ip) => Err(BootstrapError::CloudState(format!(
                "endpoint {}: FIP {} recorded in the state file now has address {} instead of {}",
                ep.name, rec.id, ip.address, rec.address
            ))),
            None => Err(BootstrapError::CloudState(format!(
                "endpoint {}: FIP {} ({}) recorded in the state file no longer exists in the project; \
                 baton does not reserve a replacement on its own (remove the state file to start over)",
                ep.name, rec.id, rec.address
            ))),
        };
    }

    match &ep.fip {
        FipSource::Tag(tag) => {
            let (k, v) = (tag.key().to_owned(), tag.value().to_owned());
            let found = find_fip(cloud, |ip| ip.tags.get(&k) == Some(&v)).await?;
            found
                .map(|ip| record(&ip, false))
                .ok_or_else(|| BootstrapError::Field {
                    path: cfg.path.clone(),
                    field: field("tag"),
                    message: format!("no Floating IP tagged {tag} in the project"),
                })
        }
        FipSource::Address(addr) => {
            let addr = *addr;
            let found = find_fip(cloud, |ip| ip.address == addr).await?;
            found
                .map(|ip| record(&ip, false))
                .ok_or_else(|| BootstrapError::Field {
                    path: cfg.path.clone(),
                    field: field("address"),
                    message: format!("{addr} is not a Floating IP of the project"),
                })
        }
        FipSource::Reserve => {
            let tags: Tags = reserve_tags(&cfg.cluster.infra_id, &ep.name);
            let region = region.ok_or_else(|| BootstrapError::Field {
                path: cfg.path.clone(),
                field: "cloud.region".into(),
                message: "required when an endpoint has fip.reserve: true".into(),
            })?;
            // `create_ip` looks the tags up first (and again after a failed create), so this
            // never reserves a second FIP for the endpoint.
            let ip = cloud
                .create_ip(CreateIpRequest {
                    region: region.to_owned(),
                    tags,
                    ..CreateIpRequest::default()
                })
                .await
                .map_err(cloud_err(format!("reserving the FIP of endpoint {}", ep.name)))?;
            Ok(record(&ip, true))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kubernetes

fn kube_err(step: impl Into<String>) -> impl FnOnce(kube::Error) -> BootstrapError {
    let step = step.into();
    move |source| BootstrapError::Kube { step, source }
}

/// One `/readyz` of the bootstrap API server through the kubeconfig's client.
pub async fn api_ready(client: &kube::Client) -> Result<(), String> {
    let req = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_secs(5), client.request_text(req)).await {
        Ok(Ok(body)) if body.trim() == "ok" => Ok(()),
        Ok(Ok(body)) => Err(format!("/readyz answered {:?}", body.trim())),
        Ok(Err(e)) => Err(error_chain(&e)),
        Err(_) => Err("/readyz did not answer within 5s".into()),
    }
}

/// An error with its sources, `a: b: c` (kube's errors hide the cause, e.g. "connection refused").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        src = s.source();
    }
    out
}

/// The API Service of an endpoint: type LoadBalancer, `loadBalancerIP` = the FIP, annotated as a
/// control-plane endpoint (the in-cluster manager routes its FIP and mirrors `default/kubernetes`
/// into it), no selector, MetalLB told to stay away.
/// With `class`, its `loadBalancerClass` is [`CONTROL_PLANE_CLASS`]: no load-balancer
/// implementation handles it ([`with_class`] decides, the field being immutable).
pub fn desired_service(ep: &Endpoint, fip: IpAddr, class: bool) -> Service {
    let annotations: BTreeMap<String, String> = [
        (CONTROL_PLANE_ENDPOINT_ANNOTATION, "true"),
        METALLB_DISABLE_ANNOTATION,
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let labels: BTreeMap<String, String> = [
        ("app.kubernetes.io/managed-by", "baton"),
        (ENDPOINT_LABEL, ep.name.as_str()),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    Service {
        metadata: ObjectMeta {
            name: Some(ep.service.name.clone()),
            namespace: Some(ep.service.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            load_balancer_class: class.then(|| CONTROL_PLANE_CLASS.to_owned()),
            load_balancer_ip: Some(fip.to_string()),
            ports: Some(
                ep.service
                    .ports
                    .iter()
                    .map(|p| K8sServicePort {
                        name: Some(p.name.clone()),
                        port: i32::from(p.port),
                        target_port: Some(IntOrString::Int(i32::from(p.target_port))),
                        protocol: Some("TCP".into()),
                        ..K8sServicePort::default()
                    })
                    .collect(),
            ),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

fn pp() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Creates the namespace if it does not exist (never takes over an existing one).
async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<(), BootstrapError> {
    let api: Api<Namespace> = Api::all(client.clone());
    if api
        .get_opt(name)
        .await
        .map_err(kube_err(format!("reading namespace {name}")))?
        .is_some()
    {
        return Ok(());
    }
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    api.patch(name, &pp(), &Patch::Apply(&ns))
        .await
        .map_err(kube_err(format!("creating namespace {name}")))?;
    Ok(())
}

/// Applies every endpoint's Service.
pub async fn apply_services(
    client: &kube::Client,
    eps: &[(Endpoint, FipRecord)],
) -> Result<(), BootstrapError> {
    // The record first: a controller the manifests start reads it at its start, to accept these
    // Services' namespaces and FIPs as the cluster's.
    ensure_namespace(client, "kube-system").await?;
    let record = bootstrap_record(eps);
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .patch(BOOTSTRAP_RECORD, &pp(), &Patch::Apply(&record))
        .await
        .map_err(kube_err(format!(
            "applying ConfigMap kube-system/{BOOTSTRAP_RECORD}"
        )))?;
    for (ep, fip) in eps {
        ensure_namespace(client, &ep.service.namespace).await?;
        let api: Api<Service> = Api::namespaced(client.clone(), &ep.service.namespace);
        let existing = api
            .get_opt(&ep.service.name)
            .await
            .map_err(kube_err(format!("reading Service {}", ep.service)))?;
        let svc = desired_service(ep, fip.address, with_class(existing.as_ref()));
        api.patch(&ep.service.name, &pp(), &Patch::Apply(&svc))
            .await
            .map_err(kube_err(format!("applying Service {}", ep.service)))?;
        debug!(service = %ep.service, fip = %fip.address, "API Service applied");
    }
    Ok(())
}

/// The record of the cluster's endpoints the in-cluster controller trusts
/// ([`BOOTSTRAP_RECORD`]): the API Services' namespaces and their FIPs, the ones this run
/// found by tag or address or reserved. Only cluster administrators write `kube-system`.
pub fn bootstrap_record(eps: &[(Endpoint, FipRecord)]) -> ConfigMap {
    let join = |items: BTreeSet<String>| items.into_iter().collect::<Vec<_>>().join(",");
    let namespaces = join(eps.iter().map(|(ep, _)| ep.service.namespace.clone()).collect());
    let fips = join(eps.iter().map(|(_, f)| f.address.to_string()).collect());
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(BOOTSTRAP_RECORD.to_owned()),
            namespace: Some("kube-system".to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "baton".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            (BOOTSTRAP_NAMESPACES_KEY.to_owned(), namespaces),
            (BOOTSTRAP_FIPS_KEY.to_owned(), fips),
        ])),
        ..ConfigMap::default()
    }
}

/// Applies the handoff manifests, in order, by server-side apply. A namespaced object without
/// a namespace goes to `default`. Kinds are looked up by discovery (a CRD applied earlier in
/// the list may take a moment to be served: lookups are retried for a few seconds).
pub async fn apply_manifests(
    client: &kube::Client,
    objects: &[ManifestObject],
) -> Result<(), BootstrapError> {
    for m in objects {
        let Some(types) = &m.object.types else { continue };
        let gvk = GroupVersionKind::try_from(types).map_err(|e| BootstrapError::Manifest {
            origin: m.origin.clone(),
            reason: e.to_string(),
        })?;
        let mut attempt = 0;
        let (ar, caps) = loop {
            match kube::discovery::pinned_kind(client, &gvk).await {
                Ok(found) => break found,
                Err(e) if attempt < 20 => {
                    debug!(origin = %m.origin, error = %e, "kind not served yet; retrying");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(source) => {
                    return Err(BootstrapError::Kube {
                        step: format!("finding kind {} of {}", types.kind, m.origin),
                        source,
                    });
                }
            }
        };
        let name = m.object.name_any();
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                let ns = m.object.namespace().unwrap_or_else(|| "default".into());
                Api::namespaced_with(client.clone(), &ns, &ar)
            }
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        api.patch(&name, &pp(), &Patch::Apply(&m.object))
            .await
            .map_err(kube_err(format!(
                "applying {} {name} from {}",
                types.kind, m.origin
            )))?;
        debug!(origin = %m.origin, kind = %types.kind, %name, "manifest object applied");
    }
    Ok(())
}

/// What an API Service still waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Readiness {
    /// The Service does not exist (yet).
    Missing,
    /// `status.loadBalancer.ingress` does not list the FIP yet.
    NoIngress,
    /// No EndpointSlice of the Service has a ready endpoint.
    NoReadyEndpoints,
    /// Ready in Kubernetes, but `/readyz` through the FIP does not answer yet.
    FipNotServing,
    /// Ready: ingress set, a ready endpoint, and the FIP serves.
    Ready,
}

impl Readiness {
    /// What it waits for, for people.
    pub fn waiting_for(&self) -> &'static str {
        match self {
            Self::Missing => "the Service to exist",
            Self::NoIngress => "status.loadBalancer.ingress (the in-cluster manager routes the FIP)",
            Self::NoReadyEndpoints => "a ready endpoint in its EndpointSlices",
            Self::FipNotServing => "/readyz through the FIP",
            Self::Ready => "nothing: Ready",
        }
    }
}

/// Readiness of a Service from what the API returned and the FIP's health.
pub fn service_readiness(
    svc: Option<&Service>,
    slices: &[EndpointSlice],
    fip: IpAddr,
    fip_up: bool,
) -> Readiness {
    let Some(svc) = svc else {
        return Readiness::Missing;
    };
    let fip = fip.to_string();
    let has_ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|ing| ing.iter().any(|i| i.ip.as_deref() == Some(fip.as_str())));
    if !has_ingress {
        return Readiness::NoIngress;
    }
    // A nil `ready` condition means "unknown", which consumers treat as ready (API docs).
    let ready_endpoint = slices
        .iter()
        .flat_map(|s| &s.endpoints)
        .any(|e| !e.addresses.is_empty() && e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true));
    if !ready_endpoint {
        return Readiness::NoReadyEndpoints;
    }
    if fip_up {
        Readiness::Ready
    } else {
        Readiness::FipNotServing
    }
}

/// Reads a Service and its EndpointSlices.
pub async fn observe_service(
    client: &kube::Client,
    ep: &Endpoint,
) -> Result<(Option<Service>, Vec<EndpointSlice>), kube::Error> {
    let ns = &ep.service.namespace;
    let svc = Api::<Service>::namespaced(client.clone(), ns)
        .get_opt(&ep.service.name)
        .await?;
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={}", ep.service.name)))
        .await?
        .items;
    Ok((svc, slices))
}

#[cfg(test)]
mod tests;
