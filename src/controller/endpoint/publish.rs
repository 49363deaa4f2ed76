//! What the nodes and the other replicas are told: the endpoint Services' holder annotations
//! and the record of the last move ([`Step::keep_holder`]), their status and mirrored endpoints
//! ([`Step::keep_status`]), and the FIP table the node agents read ([`FipTablePublisher`]).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use baton_cloud::model::{IpAddress, IpType, Server};
use futures::FutureExt as _;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::ResourceExt as _;
use kube::runtime::events::EventType;
use tokio::time::Instant;

use super::candidates::node_of;
use super::discover::service_of;
use super::step::Step;
use super::{EndpointOptions, EndpointRef, EndpointState};
use crate::controller::Context;
use crate::controller::context::object_ref;
use crate::controller::mirror;
use crate::names::{
    CCM_MIRROR_SERVICE, FIP_HOLDER_ADDRESS_ANNOTATION, FIP_HOLDER_ANNOTATION, FIP_LAST_MOVE_ANNOTATION,
    FIP_TABLE_KEY, FipEntry, FipTable,
};

/// Who the cloud routes a FIP to, as the endpoint Service's annotations tell the nodes
/// ([`FIP_HOLDER_ANNOTATION`], [`FIP_HOLDER_ADDRESS_ANNOTATION`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Holder {
    /// The Node's name, else the server's hostname.
    name: String,
    /// The server's primary address.
    address: IpAddr,
}

impl Holder {
    /// The holder of `fip`, if it is routed to a server this loop knows.
    fn of(fip: &IpAddress, servers: &[Server], nodes: &[Arc<Node>]) -> Option<Self> {
        let id = fip.target()?;
        let server = servers.iter().find(|s| s.id == id)?;
        let address = server.first_ipv4(&IpType::PrimaryIp)?;
        let name = node_of(nodes, server).map_or_else(|| server.hostname.clone(), |n| n.name_any());
        Some(Self { name, address })
    }

    /// What `svc`'s annotations say now.
    fn annotated(svc: &Service) -> Option<Self> {
        let a = svc.metadata.annotations.as_ref()?;
        Some(Self {
            name: a.get(FIP_HOLDER_ANNOTATION)?.clone(),
            address: a.get(FIP_HOLDER_ADDRESS_ANNOTATION)?.parse().ok()?,
        })
    }
}

impl Step<'_> {
    /// Tells the nodes who holds the FIP: the endpoint Service's holder annotations, written
    /// when they differ from the cloud's `targeted_to` (after a move, on a new term, after an
    /// edit); and tells the other replicas of the last move and its hold-down
    /// ([`FIP_LAST_MOVE_ANNOTATION`]) when this replica knows a later one than the Service says.
    /// Leader only; the write runs beside the decision loop, never in its way (a failed one is
    /// made again 5 s later).
    pub(super) fn keep_holder(&self, ep: &EndpointRef, state: &mut EndpointState) {
        let ctx = self.ctx;
        if let Some((_, task)) = &state.holder_write {
            if !task.is_finished() {
                return;
            }
            if let Some((holder, task)) = state.holder_write.take()
                && !task.now_or_never().and_then(Result::ok).unwrap_or(false)
            {
                tracing::debug!(fip = %ep.fip.address, holder = %holder.name, "writing the FIP holder annotations failed");
                state.holder_retry_at = Some(Instant::now() + Duration::from_secs(5));
            }
        }
        if !ctx.leader.is_leader() || state.holder_retry_at.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let Some(svc) = service_of(self.services, &ep.service) else {
            return;
        };
        let want = Holder::of(&ep.fip, self.servers, self.nodes);
        // The record of the last move, when this replica knows a later one than the Service
        // says (its own move; or the Service's is garbled).
        let record = state
            .hold
            .record_text()
            .filter(|r| {
                svc.annotations()
                    .get(FIP_LAST_MOVE_ANNOTATION)
                    .map(String::as_str)
                    != Some(*r)
            })
            .map(str::to_owned);
        if Holder::annotated(&svc) == want && record.is_none() {
            return;
        }
        let mut annotations = serde_json::json!({
            FIP_HOLDER_ANNOTATION: want.as_ref().map(|h| h.name.clone()),
            FIP_HOLDER_ADDRESS_ANNOTATION: want.as_ref().map(|h| h.address.to_string()),
        });
        if let Some(record) = record {
            annotations[FIP_LAST_MOVE_ANNOTATION] = record.into();
        }
        let patch = serde_json::json!({"metadata": {"annotations": annotations}});
        let api: kube::Api<Service> = kube::Api::namespaced(ctx.client.clone(), &ep.service.namespace);
        let name = ep.service.name.clone();
        let fip = ep.fip.address;
        let task = tokio::spawn(async move {
            let pp = kube::api::PatchParams {
                field_manager: Some(crate::controller::FIELD_MANAGER.to_owned()),
                ..kube::api::PatchParams::default()
            };
            match crate::controller::kit::timed(
                format!("annotating the FIP holder on Service {name}"),
                api.patch(&name, &pp, &kube::api::Patch::Merge(&patch)),
            )
            .await
            {
                Ok(_) => true,
                Err(error) => {
                    tracing::warn!(%error, %fip, "writing the FIP holder annotations failed");
                    false
                }
            }
        });
        state.holder_retry_at = None;
        state.holder_write = Some((
            want.unwrap_or(Holder {
                name: String::new(),
                address: IpAddr::from([0, 0, 0, 0]),
            }),
            task,
        ));
    }

    /// Status (ingress, ipMode Proxy) and mirrored endpoints, when their inputs change (and
    /// every 30 s, to repair edits). Leader only.
    pub(super) async fn keep_status(&self, ep: &EndpointRef, state: &mut EndpointState) {
        let ctx = self.ctx;
        let inputs = (
            ep.service.clone(),
            self.api_servers.iter().copied().collect::<BTreeSet<_>>(),
        );
        let outdated = state.last_applied.as_ref() != Some(&inputs)
            || state
                .last_applied_at
                .is_none_or(|t| t.elapsed() > Duration::from_secs(30));
        let backing_off = state.retry_at.is_some_and(|t| Instant::now() < t);
        if outdated && !backing_off && ctx.leader.is_leader() {
            let changed = state.last_applied.as_ref() != Some(&inputs);
            let reference = object_ref("v1", "Service", Some(&ep.service.namespace), &ep.service.name);
            match mirror::reconcile(&ctx.client, &ep.service).await {
                Ok(()) => {
                    ctx.metrics.reconciled("endpoints");
                    if changed {
                        let servers: Vec<String> = inputs.1.iter().map(ToString::to_string).collect();
                        ctx.event_on(
                            &reference,
                            None,
                            EventType::Normal,
                            "EndpointsUpdated",
                            "UpdateEndpoints",
                            format!("ingress {}, endpoints {}", ep.fip.address, servers.join(", ")),
                        )
                        .await;
                    }
                    state.last_applied = Some(inputs);
                    state.last_applied_at = Some(Instant::now());
                    state.retry_at = None;
                    // Looked for each time the mirror is re-applied (every 30 s at most): a
                    // cloud-provider-cherry still running during a switch may recreate it.
                    if ep.service.manage_spec {
                        match mirror::remove_ccm_leftover(&ctx.client, &ep.service).await {
                            Ok(false) => {}
                            Ok(true) => {
                                let removed =
                                    object_ref("v1", "Service", Some("kube-system"), CCM_MIRROR_SERVICE);
                                ctx.event_on(
                                    &reference,
                                    Some(removed),
                                    EventType::Normal,
                                    "LeftoverRemoved",
                                    "RemoveLeftover",
                                    format!(
                                        "removed cloud-provider-cherry's mirror Service kube-system/{CCM_MIRROR_SERVICE} \
                                         of {}; this Service replaces it, the FIP stays where it is",
                                        ep.fip.address
                                    ),
                                )
                                .await;
                            }
                            Err(error) => {
                                tracing::warn!(%error, "removing cloud-provider-cherry's leftover mirror Service failed");
                            }
                        }
                    }
                }
                Err(error) => {
                    ctx.metrics.reconcile_failed("endpoints", error.category());
                    if state.retry_at.is_none() {
                        ctx.event_on(
                            &reference,
                            None,
                            EventType::Warning,
                            "EndpointsUpdateFailed",
                            "UpdateEndpoints",
                            error.to_string(),
                        )
                        .await;
                    }
                    state.retry_at = Some(Instant::now() + Duration::from_secs(5));
                    tracing::warn!(%error, service = %ep.service.name, "updating the endpoint Service failed");
                }
            }
        }
    }
}

/// The table the node agents read: every admitted endpoint's FIP, with the primary address of
/// the server the cloud routes it to (when that server is known).
pub(super) fn fip_table_of(endpoints: &[EndpointRef], servers: &[Server], nodes: &[Arc<Node>]) -> FipTable {
    let rows: BTreeSet<FipEntry> = endpoints
        .iter()
        .map(|ep| FipEntry {
            address: ep.fip.address,
            holder: Holder::of(&ep.fip, servers, nodes).map(|h| h.address),
        })
        .collect();
    FipTable {
        fips: rows.into_iter().collect(),
    }
}

/// Writes the FIP table ConfigMap ([`crate::names::fip_table_name`]) when it changes, on a new
/// term, after a failed write (5 s later) and every [`Self::REPAIR`] (an edit is undone).
/// Leader only; the write runs beside the decision loop, one at a time.
#[derive(Default)]
pub(super) struct FipTablePublisher {
    /// The table last written, and when.
    written: Option<(FipTable, Instant)>,
    running: Option<(FipTable, tokio::task::JoinHandle<bool>)>,
    retry_at: Option<Instant>,
}

impl FipTablePublisher {
    const REPAIR: Duration = Duration::from_secs(60);

    pub(super) fn publish(&mut self, ctx: &Context, opts: &EndpointOptions, table: FipTable) {
        if let Some((_, task)) = &self.running {
            if !task.is_finished() {
                return;
            }
            if let Some((sent, task)) = self.running.take() {
                if task.now_or_never().and_then(Result::ok).unwrap_or(false) {
                    self.written = Some((sent, Instant::now()));
                } else {
                    self.retry_at = Some(Instant::now() + Duration::from_secs(5));
                }
            }
        }
        if !ctx.leader.is_leader() {
            // The next term writes afresh: another leader may have written since.
            self.written = None;
            return;
        }
        if self.retry_at.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let current = self
            .written
            .as_ref()
            .is_some_and(|(t, at)| *t == table && at.elapsed() < Self::REPAIR);
        if current {
            return;
        }
        self.retry_at = None;
        let name = crate::names::fip_table_name(&ctx.config.prefix);
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(ctx.client.clone(), &opts.fip_table_namespace);
        let text = match serde_json::to_string(&table) {
            Ok(t) => t,
            Err(error) => {
                tracing::error!(%error, "encoding the FIP table failed");
                return;
            }
        };
        let body = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": opts.fip_table_namespace,
                "labels": {"app.kubernetes.io/managed-by": "baton"},
            },
            "data": {FIP_TABLE_KEY: text},
        });
        let fips = table.fips.len();
        let task = tokio::spawn(async move {
            let pp = kube::api::PatchParams::apply(crate::controller::FIELD_MANAGER).force();
            match crate::controller::kit::timed(
                format!("writing the FIP table ConfigMap {name}"),
                api.patch(&name, &pp, &kube::api::Patch::Apply(&body)),
            )
            .await
            {
                Ok(_) => {
                    tracing::debug!(fips, "FIP table written");
                    true
                }
                Err(error) => {
                    tracing::warn!(%error, "writing the FIP table for the node agents failed; again in 5 s");
                    false
                }
            }
        });
        self.running = Some((table, task));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use crate::controller::endpoint::fixtures::fip_at;

    #[test]
    fn the_holder_is_the_node_of_the_targeted_server_else_its_hostname() {
        let server: Server = serde_json::from_value(serde_json::json!({
            "id": 600_102, "hostname": "cp-1",
            "ip_addresses": [
                {"id": "p", "address": "192.0.2.12", "type": "private-ip"},
                {"id": "q", "address": "198.51.100.12", "type": "primary-ip"},
            ],
        }))
        .unwrap();
        let fip = fip_at("203.0.113.5", Some(600_102), &[]);
        let want = Holder {
            name: "cp-1".into(),
            address: "198.51.100.12".parse().unwrap(),
        };
        // No Node yet: the server's hostname.
        assert_eq!(
            Holder::of(&fip, std::slice::from_ref(&server), &[]),
            Some(want.clone())
        );
        // A Node with the server's provider ID, whatever its name.
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "node-b"}, "spec": {"providerID": "cherryservers://600102"},
        }))
        .unwrap();
        assert_eq!(
            Holder::of(&fip, std::slice::from_ref(&server), &[Arc::new(node)]).map(|h| h.name),
            Some("node-b".to_owned())
        );
        // Unassigned, or routed to a server this loop does not know: no holder.
        assert_eq!(
            Holder::of(
                &fip_at("203.0.113.5", None, &[]),
                std::slice::from_ref(&server),
                &[]
            ),
            None
        );
        assert_eq!(
            Holder::of(
                &fip_at("203.0.113.5", Some(9), &[]),
                std::slice::from_ref(&server),
                &[]
            ),
            None
        );
        // What a Service's annotations say, and garbage in them.
        let mut svc = Service::default();
        assert_eq!(Holder::annotated(&svc), None);
        svc.metadata.annotations = Some(BTreeMap::from([
            (FIP_HOLDER_ANNOTATION.to_owned(), "cp-1".to_owned()),
            (
                FIP_HOLDER_ADDRESS_ANNOTATION.to_owned(),
                "198.51.100.12".to_owned(),
            ),
        ]));
        assert_eq!(Holder::annotated(&svc), Some(want));
        svc.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(FIP_HOLDER_ADDRESS_ANNOTATION.to_owned(), "not-an-ip".to_owned());
        assert_eq!(Holder::annotated(&svc), None, "rewritten when garbled");
    }
}
