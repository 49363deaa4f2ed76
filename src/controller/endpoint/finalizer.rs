//! The finalizer of the control-plane endpoint Services ([`ENDPOINT_FINALIZER`]): added to live
//! ones, and on deletion their FIP unassigned (never deleted) before it is removed.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use baton_cloud::model::{IpAddress, IpList, each_ip};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt as _;
use kube::runtime::events::EventType;

use crate::controller::Context;
use crate::controller::mirror::CONTROL_PLANE_ENDPOINT_ANNOTATION;
use crate::controller::trust::EndpointPolicy;

/// The finalizer that keeps an annotated control-plane endpoint Service until its FIP is
/// unassigned (DESIGN.md: deleting the Service stops routing the FIP, never deletes it).
pub const ENDPOINT_FINALIZER: &str = "baton.dev/control-plane-fip";

/// A finalizer write for a control-plane endpoint Service.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FinalizerStep {
    /// Add the finalizer (a live endpoint whose `loadBalancerIP` is a FIP of the project).
    Add {
        namespace: String,
        name: String,
        version: String,
    },
    /// The Service is being deleted: unassign its FIP (`Some(id)`: still routed, no other
    /// endpoint uses it, not the `fipTag` FIP), then remove the finalizer.
    Release {
        namespace: String,
        name: String,
        version: String,
        unassign: Option<Box<IpAddress>>,
    },
}

pub(super) fn lb_ip(svc: &Service) -> Option<IpAddr> {
    svc.spec
        .as_ref()?
        .load_balancer_ip
        .as_deref()
        .and_then(|v| v.trim().parse().ok())
}

/// The finalizer writes for the control-plane endpoint Services (annotated, not the mirror):
/// add it to live ones whose `loadBalancerIP` is a FIP of the project; on deletion unassign the
/// FIP unless it is the `fipTag` FIP or another live endpoint Service (the mirror included) uses
/// it. The FIP itself is never deleted: it belongs to whoever reserved it.
fn finalizer_plan<B: Borrow<IpAddress>>(
    services: &[Arc<Service>],
    ips: &[B],
    policy: &EndpointPolicy,
    mirror_name: &str,
) -> Vec<FinalizerStep> {
    let is_mirror =
        |s: &Service| s.namespace().as_deref() == Some("kube-system") && s.name_any() == mirror_name;
    let annotated = |s: &Service| {
        s.annotations()
            .get(CONTROL_PLANE_ENDPOINT_ANNOTATION)
            .is_some_and(|v| v == "true")
    };
    // Only an endpoint the policy admits (an allowed namespace, this cluster's FIP) gets the
    // finalizer, and only such a one's FIP is unassigned when it goes: a refused Service never
    // causes a cloud call, also when it carries the finalizer from an earlier version.
    let admitted = |s: &Service| {
        let ns = s.metadata.namespace.as_deref().unwrap_or_default();
        lb_ip(s).and_then(|ip| policy.admit(ns, ip, each_ip(ips)).ok())
    };
    let mut out = Vec::new();
    for svc in services {
        let has = svc.finalizers().iter().any(|f| f == ENDPOINT_FINALIZER);
        let deleting = svc.metadata.deletion_timestamp.is_some();
        let namespace = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        let version = svc.resource_version().unwrap_or_default();
        if is_mirror(svc) || (!annotated(svc) && !has) {
            continue;
        }
        if !deleting {
            if !has && admitted(svc).is_some() {
                out.push(FinalizerStep::Add {
                    namespace,
                    name,
                    version,
                });
            }
            continue;
        }
        if !has {
            continue;
        }
        let unassign = admitted(svc).filter(|fip| {
            let tagged = policy
                .fip_tag
                .as_ref()
                .is_some_and(|t| t.matches(fip.tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))));
            let shared = services.iter().any(|o| {
                !Arc::ptr_eq(o, svc)
                    && o.metadata.deletion_timestamp.is_none()
                    && (annotated(o) || is_mirror(o))
                    && lb_ip(o) == Some(fip.address)
            });
            fip.target().is_some() && !tagged && !shared
        });
        out.push(FinalizerStep::Release {
            namespace,
            name,
            version,
            unassign: unassign.cloned().map(Box::new),
        });
    }
    out
}

/// Carries out [`finalizer_plan`] (leader only). Failures are logged and tried again on a later
/// iteration; the FIP is unassigned before the finalizer goes, so a crash in between repeats a
/// harmless unassign.
/// The finalizer passes over the endpoint Services, run aside of the decision loop (one at a
/// time): their cloud and API calls never hold up a failover decision.
#[derive(Default)]
pub(super) struct Finalizer {
    /// The resourceVersion each finalizer write was last made for (no repeat before the watch
    /// shows its result).
    done: Arc<tokio::sync::Mutex<BTreeMap<String, String>>>,
    running: Option<tokio::task::JoinHandle<()>>,
}

impl Finalizer {
    /// Starts a pass on this view unless one is still running.
    pub(super) fn start(
        &mut self,
        ctx: &Context,
        services: &[Arc<Service>],
        ips: &IpList,
        mirror_name: &str,
    ) {
        if self.running.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let (ctx, services, ips) = (ctx.clone(), services.to_vec(), Arc::clone(ips));
        let (mirror_name, done) = (mirror_name.to_owned(), Arc::clone(&self.done));
        self.running = Some(tokio::spawn(async move {
            finalize(&ctx, &services, &ips, &mirror_name, &mut *done.lock().await).await;
        }));
    }
}

async fn finalize(
    ctx: &Context,
    services: &[Arc<Service>],
    ips: &[Arc<IpAddress>],
    mirror_name: &str,
    done: &mut BTreeMap<String, String>,
) {
    let plan = finalizer_plan(services, ips, &ctx.endpoints.current(), mirror_name);
    done.retain(|key, _| {
        plan.iter().any(|step| match step {
            FinalizerStep::Add { namespace, name, .. } | FinalizerStep::Release { namespace, name, .. } => {
                *key == format!("{namespace}/{name}")
            }
        })
    });
    for step in plan {
        let (FinalizerStep::Add {
            namespace,
            name,
            version,
        }
        | FinalizerStep::Release {
            namespace,
            name,
            version,
            ..
        }) = &step;
        let key = format!("{namespace}/{name}");
        if done.get(&key) == Some(version) || !ctx.leader.is_leader() {
            continue;
        }
        let api: kube::Api<Service> = kube::Api::namespaced(ctx.client.clone(), namespace);
        let Some(svc) = services
            .iter()
            .find(|s| s.namespace().as_deref() == Some(namespace.as_str()) && s.name_any() == *name)
        else {
            continue;
        };
        let mut finalizers: Vec<String> = svc.finalizers().to_vec();
        if let FinalizerStep::Release {
            unassign: Some(fip), ..
        } = &step
        {
            match ctx.cloud.unassign_ip(&fip.id).await {
                Ok(_) => {
                    tracing::info!(service = %key, fip = %fip.address, "control-plane endpoint Service deleted: its Floating IP is unassigned (kept reserved)");
                    ctx.event(
                        &**svc,
                        EventType::Normal,
                        "FloatingIPUnassigned",
                        "ReleaseControlPlaneEndpoint",
                        format!(
                            "the Service is being deleted: Floating IP {} ({}) no longer routed to a server; the reservation is kept",
                            fip.address, fip.id
                        ),
                    )
                    .await;
                }
                Err(e) if e.is_not_found() => {}
                Err(error) => {
                    tracing::warn!(%error, service = %key, fip = %fip.address, "unassigning the Floating IP of a deleted control-plane endpoint failed");
                    continue;
                }
            }
        }
        match &step {
            FinalizerStep::Add { .. } => finalizers.push(ENDPOINT_FINALIZER.to_owned()),
            FinalizerStep::Release { .. } => finalizers.retain(|f| f != ENDPOINT_FINALIZER),
        }
        // resourceVersion makes the patch conditional on the list it was computed from.
        let patch = serde_json::json!({"metadata": {"finalizers": finalizers, "resourceVersion": version}});
        let pp = kube::api::PatchParams::default();
        match crate::controller::kit::timed(
            format!("updating the finalizers of Service {key}"),
            api.patch(name, &pp, &kube::api::Patch::Merge(&patch)),
        )
        .await
        {
            Ok(_) => {
                done.insert(key, version.clone());
            }
            Err(error) => {
                tracing::debug!(%error, service = %key, "finalizer write failed; tried again later");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::endpoint::fixtures::{CLUSTER, endpoint_svc, fip_at, policy};

    fn unassigned(plan: &[FinalizerStep]) -> Vec<(String, Option<String>)> {
        plan.iter()
            .filter_map(|s| match s {
                FinalizerStep::Release { name, unassign, .. } => {
                    Some((name.clone(), unassign.as_ref().map(|f| f.address.to_string())))
                }
                FinalizerStep::Add { .. } => None,
            })
            .collect()
    }

    #[test]
    fn a_deleted_control_plane_endpoint_unassigns_its_fip_and_never_anothers() {
        let ours = [("cluster", CLUSTER)];
        let ips = vec![
            fip_at("203.0.113.1", Some(1), &ours),
            fip_at("203.0.113.2", Some(1), &ours),
            fip_at("203.0.113.3", Some(1), &[("cluster", "my-cp")]),
            fip_at("203.0.113.4", None, &ours),
            // Another cluster's, and an untagged one: never this cluster's to unassign.
            fip_at("203.0.113.5", Some(9), &[("cluster", "uid-other")]),
            fip_at("203.0.113.6", Some(9), &[]),
        ];
        let services = vec![
            // Live, no finalizer yet, its IP a FIP of the project: gets one.
            endpoint_svc("default", "api", "203.0.113.1", false, false, true),
            // Live, IP not a FIP of the project: none.
            endpoint_svc("default", "elsewhere", "192.0.2.9", false, false, true),
            // Deleted: its FIP is unassigned.
            endpoint_svc("default", "gone", "203.0.113.2", true, true, true),
            // Deleted, but api still uses 203.0.113.1: kept routed.
            endpoint_svc("default", "api-int", "203.0.113.1", true, true, true),
            // Deleted, the fipTag FIP: kept routed (the mirror serves it).
            endpoint_svc("default", "tagged", "203.0.113.3", true, true, true),
            // Deleted, its FIP already unassigned: only the finalizer goes.
            endpoint_svc("default", "idle", "203.0.113.4", true, true, true),
            // The mirror Service never gets the finalizer.
            endpoint_svc(
                "kube-system",
                "baton-kubernetes-external",
                "203.0.113.3",
                false,
                false,
                true,
            ),
            // Deleted without baton's finalizer: nothing to do.
            endpoint_svc("default", "foreign", "203.0.113.2", false, true, true),
            // Live, naming another cluster's FIP, an untagged one, or in a namespace that may not
            // hold endpoints: no finalizer.
            endpoint_svc("default", "theirs", "203.0.113.5", false, false, true),
            endpoint_svc("default", "untagged", "203.0.113.6", false, false, true),
            endpoint_svc("tenant", "api", "203.0.113.1", false, false, true),
            // Deleted with the finalizer (given by an earlier version), naming another cluster's
            // FIP or in a tenant's namespace: the finalizer goes, the FIP is not unassigned.
            endpoint_svc("default", "theirs-gone", "203.0.113.5", true, true, true),
            endpoint_svc("tenant", "gone", "203.0.113.2", true, true, true),
        ];
        let plan = finalizer_plan(
            &services,
            &ips,
            &policy(Some("cluster=my-cp")),
            "baton-kubernetes-external",
        );
        assert_eq!(
            plan.iter()
                .filter(|s| matches!(s, FinalizerStep::Add { .. }))
                .count(),
            1
        );
        assert!(plan.contains(&FinalizerStep::Add {
            namespace: "default".into(),
            name: "api".into(),
            version: "7".into()
        }));
        assert_eq!(
            unassigned(&plan),
            vec![
                ("gone".into(), Some("203.0.113.2".into())),
                ("api-int".into(), None),
                ("tagged".into(), None),
                ("idle".into(), None),
                ("theirs-gone".into(), None),
                ("gone".into(), None),
            ]
        );
        // Without the fipTag, the tagged FIP is no FIP of this cluster's: not unassigned.
        let plan = finalizer_plan(&services, &ips, &policy(None), "baton-kubernetes-external");
        assert!(unassigned(&plan).contains(&("tagged".into(), None)));
    }
}
