//! Which Services are control-plane endpoints ([`discover`]: the `fipTag` FIP with the mirror
//! Service, and every admitted annotated Service), and the Warning Events of refused ones
//! ([`Refusals`]).

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use baton_cloud::model::{IpAddress, IpType, each_ip};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt as _;
use kube::runtime::events::EventType;

use super::EndpointRef;
use crate::controller::Context;
use crate::controller::mirror::{self, CONTROL_PLANE_ENDPOINT_ANNOTATION, MirrorSpec};
use crate::controller::trust::Refusal;

/// The Warning Events of refused control-plane endpoint Services ([`Refusal`]): one per
/// Service and refusal text, published by the leader beside the loop (never in its way).
#[derive(Default)]
pub(super) struct Refusals {
    /// `namespace/name` → the refusal reported for it.
    reported: BTreeMap<String, String>,
}

impl Refusals {
    /// Reports each new refusal (leader only; a follower forgets: the next leader reports
    /// afresh).
    pub(super) fn report(&mut self, ctx: &Context, refused: &[(Arc<Service>, Refusal)]) {
        if !ctx.leader.is_leader() {
            self.reported.clear();
            return;
        }
        let mut now = BTreeMap::new();
        for (svc, refusal) in refused {
            let (key, text) = (key_of(svc), refusal.to_string());
            if self.reported.get(&key) != Some(&text) {
                tracing::warn!(service = %key, reason = refusal.reason(), "{text}");
                let (ctx, svc, reason, note) = (ctx.clone(), Arc::clone(svc), refusal.reason(), text.clone());
                tokio::spawn(async move {
                    ctx.event(
                        &*svc,
                        EventType::Warning,
                        reason,
                        "AdmitControlPlaneEndpoint",
                        note,
                    )
                    .await;
                });
            }
            now.insert(key, text);
        }
        self.reported = now;
    }
}

fn key_of(svc: &Service) -> String {
    format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
}

/// The Services that can be control-plane endpoints: the mirror Service and every Service
/// annotated as one.
pub(super) fn endpoint_services(services: &[Arc<Service>], mirror_name: &str) -> Vec<Arc<Service>> {
    services
        .iter()
        .filter(|s| {
            // Read in place: this runs over every Service whenever one changes.
            (s.metadata.namespace.as_deref() == Some("kube-system")
                && s.metadata.name.as_deref() == Some(mirror_name))
                || s.annotations()
                    .get(CONTROL_PLANE_ENDPOINT_ANNOTATION)
                    .is_some_and(|v| v == "true")
        })
        .cloned()
        .collect()
}

pub(super) fn service_of(services: &[Arc<Service>], spec: &MirrorSpec) -> Option<Arc<Service>> {
    services
        .iter()
        .find(|s| {
            s.metadata.namespace.as_deref() == Some(spec.namespace.as_str())
                && s.metadata.name.as_deref() == Some(spec.name.as_str())
        })
        .cloned()
}

/// The control-plane endpoints: the `fipTag` FIP with the mirror Service, and every annotated
/// Service whose `loadBalancerIP` is a FIP of the project.
pub(super) fn discover<B: Borrow<IpAddress>>(
    ctx: &Context,
    services: &[Arc<Service>],
    ips: &[B],
    api_servers: &[SocketAddr],
) -> (Vec<EndpointRef>, Vec<(Arc<Service>, Refusal)>) {
    let api_port = api_servers.first().map_or(6443, SocketAddr::port);
    let policy = ctx.endpoints.current();
    let mut out = Vec::new();
    let mut refused = Vec::new();
    if let Some(tag) = &ctx.config.fip_tag {
        if let Some(fip) = each_ip(ips).find(|ip| {
            ip.ip_type == IpType::FloatingIp
                && tag.matches(ip.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        }) {
            {
                let fip_port = if ctx.config.api_server_port == 0 {
                    api_port
                } else {
                    ctx.config.api_server_port
                };
                out.push(EndpointRef {
                    fip: fip.clone(),
                    fip_port,
                    service: MirrorSpec::new(&ctx.config.prefix, fip.address, ctx.config.api_server_port),
                });
            }
        } else {
            tracing::warn!(%tag, "floating IP not found: create one with this tag");
        }
    }
    let mirror_name = mirror::service_name(&ctx.config.prefix);
    for svc in services {
        let annotated = svc
            .annotations()
            .get(CONTROL_PLANE_ENDPOINT_ANNOTATION)
            .is_some_and(|v| v == "true");
        let ns = svc.namespace().unwrap_or_default();
        // A Service being deleted is no endpoint any more: its FIP is unassigned, never moved
        // again ([`finalizer_plan`]).
        if !annotated
            || (ns == "kube-system" && svc.name_any() == mirror_name)
            || svc.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        let Some(spec) = svc.spec.as_ref() else { continue };
        let Some(lb_ip) = spec
            .load_balancer_ip
            .as_deref()
            .and_then(|v| v.parse::<IpAddr>().ok())
        else {
            tracing::debug!(service = %svc.name_any(), "control-plane endpoint without a loadBalancerIP");
            continue;
        };
        let fip = match policy.admit(&ns, lb_ip, each_ip(ips)) {
            Ok(fip) => fip,
            Err(refusal) => {
                refused.push((Arc::clone(svc), refusal));
                continue;
            }
        };
        let fip_port = spec
            .ports
            .as_ref()
            .and_then(|p| p.first())
            .and_then(|p| u16::try_from(p.port).ok())
            .unwrap_or(api_port);
        out.push(EndpointRef {
            fip: fip.clone(),
            fip_port,
            service: MirrorSpec::existing(&ns, &svc.name_any(), fip.address),
        });
    }
    (out, refused)
}
