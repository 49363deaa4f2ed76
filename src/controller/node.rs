//! Node initialisation and lifecycle, as a cloud controller manager's node controllers do it
//! (from the Cherry Servers server object: plan, region, IP addresses, state; as the Cherry CCM's
//! `instances.go` does).
//!
//! ```text
//!  watch Nodes ──► reconcile(node)
//!    tainted node.cloudprovider.kubernetes.io/uninitialized:
//!       server by provider ID (cherryservers://<id> or <id>) ── else by hostname = node name
//!       status.addresses  (Hostname, ExternalIP = primary-ip, InternalIP = private-ip; --node-ip first)
//!       providerID, labels instance-type (plan.slug) + region (region.slug), taint removed
//!    initialised, not Ready:
//!       server 404 ──► the project's server list read too (Sighting: Gone | Present | Unreadable)
//!                      ──► GoneReads: 3 Gone in a row across ≥ 60 s ──► Event, Node deleted
//!                          (never while the project cannot be read; `delete` is opt-in RBAC)
//!       server inactive ──► Event + taint node.cloudprovider.kubernetes.io/shutdown (removed when active)
//!    initialised, Ready: no cloud call (a Ready Node's server exists)
//! ```
//!
//! The decisions (addresses, labels, taints, lifecycle) are pure functions tested in `tests.rs`.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_cloud::CloudError;
use baton_cloud::model::{Server, ServerId};
use baton_core::ProviderId;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt as _};
use serde_json::json;
use tracing::{debug, info, instrument, warn};

use super::Context;
use super::health::Heartbeat;
use super::kit::{self, KubeCallError, NotLeader, Queue, ReconcileError, Retries};
use super::watches::{Cache, StreamErrors, Trigger, Watches};

mod plan;

pub use plan::*;

/// Errors of the node controller, each naming the Node and the failed step.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// No server for this Node (yet).
    #[error("Node {node}: no server with {what}")]
    ServerNotFound { node: String, what: String },
    /// kubelet's `--node-ip` is not one of the server's addresses.
    #[error("Node {node}: {source}")]
    NodeIp {
        node: String,
        #[source]
        source: NodeIpError,
    },
    /// The server has no IPv4 address.
    #[error("Node {node}: server {server} has no IPv4 address")]
    NoAddress { node: String, server: u64 },
    /// A cloud call failed.
    #[error("Node {node}: {step}: {source}")]
    Cloud {
        node: String,
        step: &'static str,
        #[source]
        source: Box<CloudError>,
    },
    /// A Kubernetes call failed or timed out.
    #[error("Node {node}: {source}")]
    Kube {
        node: String,
        #[source]
        source: KubeCallError,
    },
    /// Not the leader.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
}

impl NodeError {
    /// A stable category (metric label, Event reason source).
    pub fn category(&self) -> &'static str {
        match self {
            Self::ServerNotFound { .. } => "server_not_found",
            Self::NodeIp { .. } => "node_ip",
            Self::NoAddress { .. } => "no_address",
            Self::Cloud { source, .. } => source.category(),
            Self::Kube { source, .. } => source.category(),
            Self::NotLeader(_) => "not_leader",
        }
    }
}

/// The node controller's context.
pub struct NodeContext {
    /// What every reconciler shares.
    pub base: Arc<Context>,
    retries: Retries,
    /// Nodes waiting for a reconcile (`baton_queue_depth`).
    queue: Queue,
    /// Every Node (the shared watch): whose servers tell this project from another.
    store: Cache<Node>,
    /// Per Node, the reads agreeing its server is gone.
    gone: Mutex<HashMap<String, GoneReads>>,
    /// Each reconcile is a unit of work of loop `nodes` (`/health`).
    heartbeat: Heartbeat,
}

impl std::fmt::Debug for NodeContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeContext")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl NodeContext {
    /// Wraps the shared context.
    pub fn new(base: Arc<Context>, store: Cache<Node>) -> Self {
        Self {
            queue: Queue::new("nodes", Arc::clone(&base.metrics)),
            heartbeat: base.heartbeats.workers("nodes"),
            base,
            retries: Retries::new("nodes"),
            store,
            gone: Mutex::new(HashMap::new()),
        }
    }

    fn gone(&self) -> std::sync::MutexGuard<'_, HashMap<String, GoneReads>> {
        self.gone
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The servers of every Node but `name` (by provider ID).
    fn other_servers(&self, name: &str) -> BTreeSet<u64> {
        self.store
            .state()
            .iter()
            .map(|n| facts_of(n))
            .filter(|f| f.name != name)
            .filter_map(|f| match server_ref(&f) {
                Ok(ServerRef::Id(id)) => Some(id.server_id()),
                _ => None,
            })
            .collect()
    }
}

/// Reads the facts off a Node.
pub fn facts_of(node: &Node) -> NodeFacts {
    let spec = node.spec.as_ref();
    NodeFacts {
        name: node.name_any(),
        provider_id: spec.and_then(|s| s.provider_id.clone()),
        taints: spec
            .and_then(|s| s.taints.as_ref())
            .map(|ts| ts.iter().map(|t| t.key.clone()).collect())
            .unwrap_or_default(),
        ready: node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        provided_node_ip: node.annotations().get(PROVIDED_NODE_IP_ANNOTATION).cloned(),
        labels: node.labels().clone(),
    }
}

/// The node controller on the shared Node watch, running until `shutdown` resolves (subscribes
/// at once; the watch runs once [`Watches::run`] does).
pub fn run_nodes(
    ctx: Arc<Context>,
    watches: &mut Watches,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let store = watches.nodes();
    let trigger = watches.subscribe_nodes();
    run(ctx, store, trigger, shutdown)
}

async fn run(
    ctx: Arc<Context>,
    store: Cache<Node>,
    trigger: Trigger<Node>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let node_ctx = Arc::new(NodeContext::new(ctx.clone(), store.clone()));
    let errors = Arc::new(StreamErrors::new("node controller"));
    let queued = Arc::clone(&node_ctx);
    let trigger = trigger.inspect(move |node| queued.queue.add(node.name_any()));
    let (queued, all) = (Arc::clone(&node_ctx), store.clone());
    let elected = ctx.leader.elected().inspect(move |()| {
        for node in all.state() {
            queued.queue.add(node.name_any());
        }
    });
    Controller::for_shared_stream(trigger, store.store())
        .with_config(controller::Config::default().concurrency(8))
        // Followers do nothing; a new leader initialises every Node at once.
        .reconcile_all_on(elected)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, node_ctx)
        .for_each(|result| {
            let errors = Arc::clone(&errors);
            let metrics = Arc::clone(&ctx.metrics);
            async move {
                match result {
                    Ok((obj, _)) => {
                        metrics.reconciled("nodes");
                        debug!(node = %obj.name, "reconciled");
                    }
                    Err(controller::Error::ReconcilerFailed(error, obj)) => {
                        debug!(node = %obj.name, category = error.category(), "reconcile failed");
                    }
                    Err(error) => errors.warn(&error),
                }
            }
        })
        .await;
}

/// Retries ([`Retries::policy`]): a 429 waits its `Retry-After`; other failures back off
/// exponentially per Node.
#[allow(clippy::needless_pass_by_value)] // the signature kube-runtime's Controller::run calls
pub fn error_policy(node: Arc<Node>, error: &NodeError, ctx: Arc<NodeContext>) -> Action {
    let action = ctx.retries.policy(&node.name_any(), error, &ctx.base.metrics);
    if action != Action::await_change() {
        ctx.queue.add(node.name_any());
    }
    action
}

impl ReconcileError for NodeError {
    fn category(&self) -> &'static str {
        Self::category(self)
    }

    /// Also a cloud write the fence stopped: the term ended before it could be sent.
    fn is_not_leader(&self) -> bool {
        match self {
            Self::NotLeader(_) => true,
            Self::Cloud { source, .. } => source.is_fenced(),
            _ => false,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Cloud { source, .. } => source.retry_after(),
            _ => None,
        }
    }
}

/// Reconciles one Node: initialisation while it carries the uninitialized taint, lifecycle after.
#[instrument(skip(node, ctx), fields(node = %node.name_any()))]
pub async fn reconcile(node: Arc<Node>, ctx: Arc<NodeContext>) -> Result<Action, NodeError> {
    ctx.queue.started(&node.name_any());
    let _working = ctx.heartbeat.work();
    // Only the leader reads the cloud and writes Nodes; it reconciles every Node when it wins.
    // A term whose writes pause for a late renewal goes on (its writes wait for the fence).
    if ctx.base.leader.in_term().is_none() {
        return Ok(Action::await_change());
    }
    let facts = facts_of(&node);
    let server_ref = match server_ref(&facts) {
        Ok(r) => r,
        Err(e) => {
            // Another provider's Node (or a malformed ID): not ours.
            debug!(error = %e, "not a Cherry Servers Node");
            return Ok(Action::await_change());
        }
    };
    let result = if facts.uninitialized() {
        initialise(&node, &ctx, &facts, &server_ref).await
    } else {
        match server_ref {
            ServerRef::Id(id) => check_lifecycle(&node, &ctx, &facts, id).await,
            // Initialised by someone else without a provider ID: nothing to check against.
            ServerRef::Hostname(_) => Ok(Action::await_change()),
        }
    };
    if result.is_ok() {
        ctx.retries.succeeded(&facts.name);
    }
    result
}

/// A Kubernetes call for Node `node` within the write time limit.
async fn timed<T>(
    node: &str,
    step: &'static str,
    f: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, NodeError> {
    kit::timed(step, f).await.map_err(|source| NodeError::Kube {
        node: node.to_owned(),
        source,
    })
}

/// The server by id (`None` on 404), or by hostname in the project's servers.
async fn find_server(
    ctx: &NodeContext,
    node: &str,
    server_ref: &ServerRef,
) -> Result<Option<Server>, NodeError> {
    let cloud_err = |step| {
        move |source| NodeError::Cloud {
            node: node.to_owned(),
            step,
            source: Box::new(source),
        }
    };
    match server_ref {
        ServerRef::Id(id) => match ctx.base.cloud.server(ServerId(id.server_id())).await {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(cloud_err("reading the server")(e)),
        },
        ServerRef::Hostname(name) => {
            let servers = ctx
                .base
                .cloud
                .servers()
                .await
                .map_err(cloud_err("listing servers"))?;
            let Some(found) = servers.into_iter().find(|s| &s.hostname == name) else {
                return Ok(None);
            };
            if found.ip_addresses.is_empty() {
                // A list may leave out the addresses; read the server itself.
                return ctx
                    .base
                    .cloud
                    .server(found.id)
                    .await
                    .map(Some)
                    .map_err(cloud_err("reading the server"));
            }
            Ok(Some(found))
        }
    }
}

async fn initialise(
    node: &Node,
    ctx: &NodeContext,
    facts: &NodeFacts,
    server_ref: &ServerRef,
) -> Result<Action, NodeError> {
    let name = facts.name.as_str();
    let Some(server) = find_server(ctx, name, server_ref).await? else {
        let what = match server_ref {
            ServerRef::Id(id) => format!("provider ID {id}"),
            ServerRef::Hostname(h) => format!("hostname {h}"),
        };
        let err = NodeError::ServerNotFound {
            node: name.to_owned(),
            what,
        };
        ctx.base
            .event(
                node,
                EventType::Warning,
                "ServerNotFound",
                "InitializeNode",
                err.to_string(),
            )
            .await;
        return Err(err);
    };
    let server = ServerFacts::of(&server);
    if server.public.is_empty() && server.private.is_empty() {
        return Err(NodeError::NoAddress {
            node: name.to_owned(),
            server: server.id,
        });
    }
    let mut addresses = cloud_addresses(name, &server);
    if let Some(provided) = facts.provided_node_ip.as_deref() {
        addresses = match honour_node_ip(provided, addresses) {
            Ok(a) => a,
            Err(source) => {
                let err = NodeError::NodeIp {
                    node: name.to_owned(),
                    source,
                };
                ctx.base
                    .event(
                        node,
                        EventType::Warning,
                        "NodeIPNotFound",
                        "InitializeNode",
                        err.to_string(),
                    )
                    .await;
                return Err(err);
            }
        };
    }
    let api: Api<Node> = Api::all(ctx.base.client.clone());
    ctx.base.leader.ensure("initialising the Node")?;
    // Addresses first: once the taint is gone, the Node is taken as initialised.
    let status = json!({"status": {"addresses": addresses}});
    let updated = timed(
        name,
        "setting the Node's addresses",
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)),
    )
    .await?;
    // The taints and resourceVersion of the Node as the status write left it.
    let taints: Vec<Taint> = updated
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != UNINITIALIZED_TAINT)
        .collect();
    let provider_id = match ctx.base.config.cloud {
        baton_cloud::CloudKind::Cherry => ProviderId::from(server.id),
        baton_cloud::CloudKind::Hetzner => ProviderId::hcloud(server.id),
    }
    .to_string();
    // resourceVersion: the taint list is replaced whole, so only on the version it was read from.
    let patch = json!({
        "metadata": {"labels": cloud_labels(&server), "resourceVersion": updated.resource_version()},
        "spec": {"providerID": provider_id, "taints": taints},
    });
    timed(
        name,
        "initialising the Node",
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await?;
    info!(server = server.id, %provider_id, "Node initialised");
    ctx.base
        .event(
            node,
            EventType::Normal,
            "NodeInitialized",
            "InitializeNode",
            format!(
                "initialised from server {} ({}, {})",
                server.id,
                server.plan.as_deref().unwrap_or("no plan"),
                server.region.as_deref().unwrap_or("no region")
            ),
        )
        .await;
    Ok(Action::requeue(RESYNC))
}

async fn check_lifecycle(
    node: &Node,
    ctx: &NodeContext,
    facts: &NodeFacts,
    id: ProviderId,
) -> Result<Action, NodeError> {
    let name = facts.name.as_str();
    // A Ready Node's server exists and runs: no cloud call, unless a shut-down taint may go.
    if facts.ready && !facts.shutdown_tainted() {
        return Ok(Action::requeue(RESYNC));
    }
    let server = find_server(ctx, name, &ServerRef::Id(id))
        .await?
        .map(|s| ServerFacts::of(&s));
    let api: Api<Node> = Api::all(ctx.base.client.clone());
    if server.is_some() {
        ctx.gone().remove(name);
    }
    match lifecycle(facts, server.as_ref()) {
        Lifecycle::Keep => {}
        Lifecycle::Delete => return confirm_and_delete(node, ctx, name, id).await,
        Lifecycle::MarkShutdown => {
            ctx.base
                .event(
                    node,
                    EventType::Warning,
                    "ServerShutdown",
                    "CheckNode",
                    format!("server {} is shut down (state inactive)", id.server_id()),
                )
                .await;
            ctx.base.leader.ensure("tainting the Node")?;
            let mut taints = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            taints.push(Taint {
                key: SHUTDOWN_TAINT.to_owned(),
                effect: "NoSchedule".to_owned(),
                ..Taint::default()
            });
            set_taints(&api, node, name, &taints).await?;
        }
        Lifecycle::ClearShutdown => {
            ctx.base.leader.ensure("untainting the Node")?;
            let taints: Vec<Taint> = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default()
                .into_iter()
                .filter(|t| t.key != SHUTDOWN_TAINT)
                .collect();
            set_taints(&api, node, name, &taints).await?;
            info!(
                server = id.server_id(),
                "server runs again; shut-down taint removed"
            );
        }
    }
    Ok(Action::requeue(if facts.ready {
        RESYNC
    } else {
        NOT_READY_RECHECK
    }))
}

/// The server of Node `name` answered 404: deleted only once [`GoneReads`] agrees (several reads
/// across a minute, each also finding it missing from a project list that can be read).
async fn confirm_and_delete(
    node: &Node,
    ctx: &NodeContext,
    name: &str,
    id: ProviderId,
) -> Result<Action, NodeError> {
    let server = id.server_id();
    let listed = match ctx.base.cloud.servers().await {
        Ok(servers) => Some(servers.iter().map(|s| s.id.0).collect::<Vec<u64>>()),
        Err(error) => {
            warn!(%error, server, "the project's server list cannot be read: the Node is not deleted");
            None
        }
    };
    let seen = sighting(listed.as_deref(), server, &ctx.other_servers(name));
    let verdict = ctx
        .gone()
        .entry(name.to_owned())
        .or_default()
        .observe(seen, tokio::time::Instant::now());
    let reads = match verdict {
        GoneVerdict::Delete => {
            ctx.gone().remove(name);
            return delete_node(node, ctx, name, server).await;
        }
        GoneVerdict::Wait { reads } => reads,
    };
    let (reason, message) = match seen {
        Sighting::Gone => (
            "ServerNotFound",
            format!(
                "server {server} not found, also not in the project's server list (read {reads} of {GONE_READS}): the Node is deleted once {GONE_READS} reads across at least {}s agree",
                GONE_SPAN.as_secs()
            ),
        ),
        Sighting::Present => {
            info!(
                server,
                "the server's look-up answered 404 but the project lists it: not gone"
            );
            return Ok(Action::requeue(NOT_READY_RECHECK));
        }
        Sighting::Unreadable => (
            "NodeDeletionHeld",
            format!(
                "server {server} not found, but the project cannot be read (its server list failed or shows none of this cluster's servers): the Node is not deleted"
            ),
        ),
    };
    ctx.base
        .event(node, EventType::Warning, reason, "CheckNode", message)
        .await;
    Ok(Action::requeue(GONE_RECHECK))
}

/// Deletes Node `name`, whose server is gone (confirmed). Without the opt-in permission
/// (manifests/rbac-node-lifecycle.yaml) the denial is a Warning Event, not a retry storm.
async fn delete_node(node: &Node, ctx: &NodeContext, name: &str, server: u64) -> Result<Action, NodeError> {
    let message = format!(
        "server {server} no longer exists ({GONE_READS} reads across at least {}s agree); deleting the Node",
        GONE_SPAN.as_secs()
    );
    ctx.base
        .event(node, EventType::Warning, "DeletingNode", "DeleteNode", message)
        .await;
    ctx.base.leader.ensure("deleting the Node")?;
    let api: Api<Node> = Api::all(ctx.base.client.clone());
    match timed(
        name,
        "deleting the Node",
        api.delete(name, &DeleteParams::default()),
    )
    .await
    {
        Ok(_) => info!(server, "Node deleted: its server is gone"),
        Err(NodeError::Kube { source, .. }) if source.status() == Some(404) => {}
        Err(NodeError::Kube { source, .. }) if source.status() == Some(403) => {
            warn!(
                server,
                "baton may not delete Nodes (the opt-in RBAC of manifests/rbac-node-lifecycle.yaml is not applied)"
            );
            ctx.base
                .event(
                    node,
                    EventType::Warning,
                    "NodeDeletionForbidden",
                    "DeleteNode",
                    format!(
                        "server {server} no longer exists, but baton may not delete Nodes: delete it (kubectl delete node {name}), or grant baton manifests/rbac-node-lifecycle.yaml (chart: nodeLifecycle.deleteNodes=true)"
                    ),
                )
                .await;
            return Ok(Action::requeue(NOT_READY_RECHECK));
        }
        Err(e) => return Err(e),
    }
    Ok(Action::await_change())
}

async fn set_taints(api: &Api<Node>, node: &Node, name: &str, taints: &[Taint]) -> Result<(), NodeError> {
    let patch = json!({
        "metadata": {"resourceVersion": node.resource_version()},
        "spec": {"taints": taints},
    });
    timed(
        name,
        "updating the Node's taints",
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests;
