//! The control-plane endpoint's mirror Service (how cloud-provider-cherry routes the control-plane
//! FIP's traffic: a LoadBalancer Service that mirrors `default/kubernetes`).
//!
//! `kube-system/<prefix>-kubernetes-external` is a Service of type LoadBalancer without a selector
//! whose `loadBalancerIP` and `status.loadBalancer.ingress[0]` are the control-plane FIP (with
//! `ipMode: Proxy`, so a probe through the FIP really crosses the network instead of being
//! short-circuited by kube-proxy), whose ports come from `default/kubernetes`, and whose endpoints
//! mirror exactly those of `default/kubernetes` — selected by the owning Service's label, not by
//! namespace. MetalLB is told not to touch it (its `loadBalancerClass` is baton's
//! [`CONTROL_PLANE_CLASS`], so no implementation handles it; and the address-pool annotation);
//! baton's own load-balancer code skips it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, LoadBalancerIngress, LoadBalancerStatus,
    Service, ServicePort, ServiceSpec, ServiceStatus,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort as SlicePort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Resource as _, ResourceExt as _};

use super::FIELD_MANAGER;
use super::kit::{KubeCallError, timed};
pub use crate::names::{
    CCM_MIRROR_SERVICE, CONTROL_PLANE_CLASS, CONTROL_PLANE_ENDPOINT_ANNOTATION, METALLB_DISABLE_ANNOTATION,
    SERVICE_NAME_LABEL, with_class,
};
/// Who manages an EndpointSlice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// baton's value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "controller.baton.dev";
/// Tells kube-controller-manager's mirroring controller not to mirror our Endpoints again.
pub const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";

/// Errors of the mirror reconciler, each naming the step and object.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("reading default/kubernetes or the endpoint Service: {0}")]
    ReadSource(#[source] kube::Error),
    #[error("default/kubernetes has no port")]
    NoPort,
    #[error(transparent)]
    Apply(#[from] KubeCallError),
    #[error("deleting cloud-provider-cherry's leftover {kind} kube-system/{name}: {source}")]
    DeleteLeftover {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting stale EndpointSlice {name}: {source}")]
    DeleteStale {
        name: String,
        #[source]
        source: kube::Error,
    },
}

impl MirrorError {
    /// A stable category (the `baton_reconcile_errors` label): `kube`, `timeout` or
    /// `invalid_source` (default/kubernetes without a port).
    pub fn category(&self) -> &'static str {
        match self {
            Self::Apply(e) => e.category(),
            Self::NoPort => "invalid_source",
            Self::ReadSource(_) | Self::DeleteLeftover { .. } | Self::DeleteStale { .. } => "kube",
        }
    }
}

/// The mirror Service's name for `prefix`: `<prefix>-kubernetes-external` (in `kube-system`).
pub fn service_name(prefix: &str) -> String {
    format!("{prefix}-kubernetes-external")
}

/// What the mirror Service is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorSpec {
    /// The Service's namespace (`kube-system` for the mirror Service).
    pub namespace: String,
    /// The Service's name, `<prefix>-kubernetes-external`.
    pub name: String,
    /// Whether baton owns the Service's spec (the mirror Service) or only its status and
    /// endpoints (API Services created by `baton bootstrap`).
    pub manage_spec: bool,
    /// The control-plane FIP.
    pub fip: IpAddr,
    /// The port on the FIP; 0 = the API servers' own port (`apiServerPort`).
    pub fip_port: u16,
}

impl MirrorSpec {
    /// The spec for `prefix` (e.g. `baton` → `baton-kubernetes-external`).
    pub fn new(prefix: &str, fip: IpAddr, fip_port: u16) -> Self {
        Self {
            namespace: "kube-system".into(),
            name: service_name(prefix),
            manage_spec: true,
            fip,
            fip_port,
        }
    }

    /// The spec for an existing control-plane endpoint Service (status and endpoints only).
    pub fn existing(namespace: &str, name: &str, fip: IpAddr) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            manage_spec: false,
            fip,
            fip_port: 0,
        }
    }
}

fn labels(extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    [("app.kubernetes.io/managed-by", "baton")]
        .iter()
        .chain(extra)
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The API servers' port, from `default/kubernetes` `spec.ports[0].targetPort`.
pub fn api_server_port(kubernetes: &Service) -> Option<i32> {
    let port = kubernetes.spec.as_ref()?.ports.as_ref()?.first()?;
    match &port.target_port {
        Some(IntOrString::Int(p)) => Some(*p),
        _ => Some(port.port),
    }
}

/// The desired mirror Service (spec only; the status is applied separately); with `class`, its
/// `loadBalancerClass` is [`CONTROL_PLANE_CLASS`] (see [`with_class`]).
pub fn desired_service(spec: &MirrorSpec, kubernetes: &Service, class: bool) -> Result<Service, MirrorError> {
    let target = api_server_port(kubernetes).ok_or(MirrorError::NoPort)?;
    let port = if spec.fip_port == 0 {
        target
    } else {
        i32::from(spec.fip_port)
    };
    Ok(Service {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            namespace: Some(spec.namespace.clone()),
            labels: Some(labels(&[])),
            annotations: Some(
                [
                    METALLB_DISABLE_ANNOTATION,
                    (CONTROL_PLANE_ENDPOINT_ANNOTATION, "true"),
                ]
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            load_balancer_class: class.then(|| CONTROL_PLANE_CLASS.to_owned()),
            load_balancer_ip: Some(spec.fip.to_string()),
            ports: Some(vec![ServicePort {
                name: Some("https".into()),
                port,
                protocol: Some("TCP".into()),
                target_port: Some(IntOrString::Int(target)),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

/// The desired status: ingress = the FIP with `ipMode: Proxy`.
pub fn desired_status(spec: &MirrorSpec) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            namespace: Some(spec.namespace.clone()),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    ip: Some(spec.fip.to_string()),
                    ip_mode: Some("Proxy".into()),
                    ..LoadBalancerIngress::default()
                }]),
            }),
            ..ServiceStatus::default()
        }),
    }
}

/// The desired EndpointSlices: one per source slice of `default/kubernetes`, same address type,
/// endpoints (addresses + conditions) and ports, owned by the mirror Service.
pub fn desired_slices(
    spec: &MirrorSpec,
    owner: &OwnerReference,
    source: &[EndpointSlice],
) -> Vec<EndpointSlice> {
    let mut sorted: Vec<&EndpointSlice> = source.iter().collect();
    sorted.sort_by(|a, b| {
        a.address_type
            .cmp(&b.address_type)
            .then(a.name_any().cmp(&b.name_any()))
    });
    sorted
        .iter()
        .enumerate()
        .map(|(i, s)| EndpointSlice {
            metadata: ObjectMeta {
                name: Some(format!("{}-{}", spec.name, i)),
                namespace: Some(spec.namespace.clone()),
                labels: Some(labels(&[
                    (SERVICE_NAME_LABEL, &spec.name),
                    (MANAGED_BY_LABEL, MANAGED_BY),
                ])),
                owner_references: Some(vec![owner.clone()]),
                ..ObjectMeta::default()
            },
            address_type: s.address_type.clone(),
            endpoints: s
                .endpoints
                .iter()
                .map(|e| Endpoint {
                    addresses: e.addresses.clone(),
                    conditions: e.conditions.clone(),
                    ..Endpoint::default()
                })
                .collect(),
            ports: s.ports.as_ref().map(|ps| {
                ps.iter()
                    .map(|p| SlicePort {
                        name: p.name.clone(),
                        port: p.port,
                        protocol: p.protocol.clone(),
                        app_protocol: p.app_protocol.clone(),
                    })
                    .collect()
            }),
        })
        .collect()
}

/// The desired Endpoints (for older consumers): the subsets of `default/kubernetes`.
pub fn desired_endpoints(spec: &MirrorSpec, owner: &OwnerReference, source: Option<&Endpoints>) -> Endpoints {
    let subsets = source.and_then(|e| e.subsets.clone()).map(|subsets| {
        subsets
            .into_iter()
            .map(|s| EndpointSubset {
                addresses: s.addresses.map(|a| a.into_iter().map(strip_target).collect()),
                not_ready_addresses: s
                    .not_ready_addresses
                    .map(|a| a.into_iter().map(strip_target).collect()),
                ports: s.ports.map(|ps| {
                    ps.into_iter()
                        .map(|p| EndpointPort {
                            name: p.name,
                            port: p.port,
                            protocol: p.protocol,
                            app_protocol: p.app_protocol,
                        })
                        .collect()
                }),
            })
            .collect()
    });
    Endpoints {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            namespace: Some(spec.namespace.clone()),
            labels: Some(labels(&[(SKIP_MIRROR_LABEL, "true")])),
            owner_references: Some(vec![owner.clone()]),
            ..ObjectMeta::default()
        },
        subsets,
    }
}

fn strip_target(a: EndpointAddress) -> EndpointAddress {
    EndpointAddress {
        ip: a.ip,
        hostname: a.hostname,
        node_name: a.node_name,
        target_ref: None,
    }
}

/// Reads `default/kubernetes` and applies the mirror Service, its status, EndpointSlices and
/// Endpoints by server-side apply; deletes mirror slices that no longer have a source.
pub async fn reconcile(client: &kube::Client, spec: &MirrorSpec) -> Result<(), MirrorError> {
    let default_services: Api<Service> = Api::namespaced(client.clone(), "default");
    let default_slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let default_endpoints: Api<Endpoints> = Api::namespaced(client.clone(), "default");
    let kubernetes = default_services
        .get("kubernetes")
        .await
        .map_err(MirrorError::ReadSource)?;
    let source_slices = default_slices
        .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}=kubernetes")))
        .await
        .map_err(MirrorError::ReadSource)?
        .items;
    let source_endpoints = default_endpoints
        .get_opt("kubernetes")
        .await
        .map_err(MirrorError::ReadSource)?;

    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let services: Api<Service> = Api::namespaced(client.clone(), &spec.namespace);
    let step = |kind: &str, name: &str| format!("applying {kind} {}/{name}", spec.namespace);
    let applied = if spec.manage_spec {
        let existing = services
            .get_opt(&spec.name)
            .await
            .map_err(MirrorError::ReadSource)?;
        let svc = desired_service(spec, &kubernetes, with_class(existing.as_ref()))?;
        timed(
            step("Service", &spec.name),
            services.patch(&spec.name, &pp, &Patch::Apply(&svc)),
        )
        .await?
    } else {
        services.get(&spec.name).await.map_err(MirrorError::ReadSource)?
    };
    timed(
        step("Service status", &spec.name),
        services.patch_status(&spec.name, &pp, &Patch::Apply(&desired_status(spec))),
    )
    .await?;
    let owner = applied
        .controller_owner_ref(&())
        .expect("an applied Service has a name and uid");

    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &spec.namespace);
    let desired = desired_slices(spec, &owner, &source_slices);
    for s in &desired {
        let name = s.name_any();
        timed(
            step("EndpointSlice", &name),
            slices.patch(&name, &pp, &Patch::Apply(s)),
        )
        .await?;
    }
    let ours = slices
        .list(&ListParams::default().labels(&format!(
            "{SERVICE_NAME_LABEL}={},{MANAGED_BY_LABEL}={MANAGED_BY}",
            spec.name
        )))
        .await
        .map_err(MirrorError::ReadSource)?;
    for stale in ours
        .items
        .iter()
        .filter(|s| !desired.iter().any(|d| d.name_any() == s.name_any()))
    {
        let name = stale.name_any();
        match slices.delete(&name, &kube::api::DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => return Err(MirrorError::DeleteStale { name, source }),
        }
    }

    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), &spec.namespace);
    let eps = desired_endpoints(spec, &owner, source_endpoints.as_ref());
    timed(
        step("Endpoints", &spec.name),
        endpoints.patch(&spec.name, &pp, &Patch::Apply(&eps)),
    )
    .await?;
    tracing::debug!(service = %spec.name, slices = desired.len(), "mirror applied");
    Ok(())
}

/// Whether `svc` is cloud-provider-cherry's leftover mirror Service for the control-plane FIP
/// `fip`, replaced by baton's own mirror `own` (`kube-system/<prefix>-kubernetes-external`): the
/// CCM's name in `kube-system`, asking for (or showing) that FIP, and not baton's own — the
/// prefix `cloud-provider-cherry` makes the two names one, and then it is adopted in place.
pub fn is_ccm_leftover(svc: &Service, fip: IpAddr, own: &str) -> bool {
    if svc.namespace().as_deref() != Some("kube-system")
        || svc.name_any() != CCM_MIRROR_SERVICE
        || own == CCM_MIRROR_SERVICE
    {
        return false;
    }
    let asks = svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_ip.as_deref())
        .and_then(|ip| ip.trim().parse::<IpAddr>().ok())
        == Some(fip);
    let shows = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|ing| {
            ing.iter()
                .any(|i| i.ip.as_deref() == Some(fip.to_string().as_str()))
        });
    asks || shows
}

/// Deletes cloud-provider-cherry's leftover mirror Service of the control-plane FIP (with its
/// Endpoints and EndpointSlices) once baton's own mirror serves that FIP. The FIP is the cloud's:
/// deleting a Service that names it moves no address. Returns whether anything was deleted.
pub async fn remove_ccm_leftover(client: &kube::Client, spec: &MirrorSpec) -> Result<bool, MirrorError> {
    let services: Api<Service> = Api::namespaced(client.clone(), "kube-system");
    let Some(svc) = services
        .get_opt(CCM_MIRROR_SERVICE)
        .await
        .map_err(MirrorError::ReadSource)?
    else {
        return Ok(false);
    };
    if !is_ccm_leftover(&svc, spec.fip, &spec.name) {
        return Ok(false);
    }
    let gone = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 404);
    let dp = kube::api::DeleteParams::default();
    let delete_err = |kind: &'static str| {
        move |source| MirrorError::DeleteLeftover {
            kind,
            name: CCM_MIRROR_SERVICE.to_owned(),
            source,
        }
    };
    if let Err(e) = services.delete(CCM_MIRROR_SERVICE, &dp).await
        && !gone(&e)
    {
        return Err(delete_err("Service")(e));
    }
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), "kube-system");
    if let Err(e) = endpoints.delete(CCM_MIRROR_SERVICE, &dp).await
        && !gone(&e)
    {
        return Err(delete_err("Endpoints")(e));
    }
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "kube-system");
    let leftover_slices = slices
        .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={CCM_MIRROR_SERVICE}")))
        .await
        .map_err(MirrorError::ReadSource)?;
    for slice in leftover_slices.items {
        if let Err(e) = slices.delete(&slice.name_any(), &dp).await
            && !gone(&e)
        {
            return Err(delete_err("EndpointSlice")(e));
        }
    }
    tracing::info!(
        service = CCM_MIRROR_SERVICE,
        fip = %spec.fip,
        replaced_by = %spec.name,
        "removed cloud-provider-cherry's leftover mirror Service (the FIP stays where it is)"
    );
    Ok(true)
}

#[cfg(test)]
mod tests;
