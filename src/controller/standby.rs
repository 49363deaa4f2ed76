//! `baton controller --standby`: a replica on every control-plane node (the DaemonSet
//! `baton-standby`) that stays out of the way while the Deployment's replicas lead, and runs the
//! whole controller when nobody leads. It is what keeps a cold start from depending on where
//! the Deployment's pods were: after a power loss the kubelet restarts only the pods bound to its
//! own node, so a node that comes back alone (or with the nodes that had no baton pod) still runs
//! a controller, without waiting for the pod eviction (300 s, and none at all while most nodes
//! are down: the node lifecycle controller stops evicting in a small cluster's disruption).
//!
//! ```text
//!  dormant ── reads the leader Lease (local API server) every 500 ms; /health, /ready: "standby"
//!     │        no probes, no cloud calls, no watches
//!     │ the Lease has not changed for --standby-after-ms (its holder stopped renewing), or
//!     │ there is none: nobody leads
//!     ▼
//!  active ── the whole controller (run_until): it contends for the Lease like any replica;
//!     │       one Lease, so still one writer, fenced at every write
//!     │ a follower for --standby-rest-after-ms while another replica leads
//!     ▼
//!  dormant again (in the same process: no restart, no crash-loop back-off)
//! ```

use std::time::Duration;

use clap::Args;
use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, info, warn};

use super::run::{ControllerArgs, ControllerError};

/// Flags of the standby mode.
#[derive(Debug, Clone, Args)]
pub struct StandbyArgs {
    /// Stay dormant while another replica leads; run the controller once the leader Lease has
    /// not been renewed for `--standby-after-ms` (the cold-start replica of the DaemonSet
    /// `baton-standby`).
    #[arg(long, env = "BATON_STANDBY")]
    pub standby: bool,

    /// How long the leader Lease must stay unrenewed (or absent) before a standby replica runs
    /// the controller, in milliseconds.
    #[arg(
        long,
        env = "BATON_STANDBY_AFTER_MS",
        default_value_t = 3_000,
        value_name = "MS"
    )]
    pub standby_after_ms: u64,

    /// How long an active standby replica stays a follower while another replica leads before
    /// it goes dormant again, in milliseconds.
    #[arg(
        long,
        env = "BATON_STANDBY_REST_AFTER_MS",
        default_value_t = 60_000,
        value_name = "MS"
    )]
    pub standby_rest_after_ms: u64,
}

/// The shortest `--standby-after-ms`: a Lease renewed every 200 ms by default must be seen
/// unchanged for several renewals.
const MIN_AFTER_MS: u64 = 1_000;

/// Whether nobody leads, from the leader Lease's versions as this replica reads them: on its own
/// clock, the version has not changed for the wait; or the Lease itself says it expired longer
/// than the wait ago (a standby replica that starts after a power loss finds the Lease of
/// before it: no need to watch it age again). Either only wakes a standby replica, which then
/// contends for the Lease by the Lease's own rules: a clock that is wrong costs an extra
/// candidate, never a second writer.
#[derive(Debug, Default)]
pub struct Leaderless {
    /// The version last read (`None`: no Lease, or no holder) and when it was first read.
    seen: Option<(Option<String>, Instant)>,
}

impl Leaderless {
    /// Records one read at `now` of the Lease's `version` (`None`: no Lease, or nobody holds
    /// it) and how long ago, by the wall clock, its record expired (`expired_for`: renewTime +
    /// leaseDurationSeconds before now; `None` when not expired or not known); true when the
    /// version has stayed the same for `after`, or the record expired `after` ago or longer.
    pub fn observe(
        &mut self,
        version: Option<String>,
        expired_for: Option<Duration>,
        now: Instant,
        after: Duration,
    ) -> bool {
        let long_expired = version.is_some() && expired_for.is_some_and(|e| e >= after);
        match &self.seen {
            Some((v, since)) if *v == version => long_expired || now.duration_since(*since) >= after,
            _ => {
                self.seen = Some((version, now));
                long_expired
            }
        }
    }
}

/// How long ago, by this node's wall clock, the Lease's record expired (renewTime plus
/// leaseDurationSeconds); `None` while it has not, or without those fields.
fn expired_for(lease: Option<&Lease>, now: std::time::SystemTime) -> Option<Duration> {
    let spec = lease?.spec.as_ref()?;
    let renewed = std::time::SystemTime::from(spec.renew_time.as_ref()?.0);
    let duration = Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).ok()?);
    now.duration_since(renewed + duration).ok()
}

/// The Lease's version as far as leadership goes: its resourceVersion while it has a holder.
fn version(lease: Option<&Lease>) -> Option<String> {
    let lease = lease?;
    let holder = lease.spec.as_ref()?.holder_identity.as_deref()?;
    if holder.is_empty() {
        return None;
    }
    lease.metadata.resource_version.clone()
}

/// Runs `baton controller --standby` until `shutdown`.
pub async fn run(args: ControllerArgs, shutdown: CancellationToken) -> Result<(), ControllerError> {
    let s = args.standby.clone();
    if s.standby_after_ms < MIN_AFTER_MS {
        return Err(ControllerError::Flag {
            flag: "standby-after-ms",
            reason: format!("{}: must be at least {MIN_AFTER_MS}", s.standby_after_ms),
        });
    }
    let after = Duration::from_millis(s.standby_after_ms);
    let rest = Duration::from_millis(s.standby_rest_after_ms);
    loop {
        if !dormant(&args, after, &shutdown).await? {
            return Ok(());
        }
        let round = shutdown.child_token();
        super::run::run_until_with(args.clone(), round, Some(rest)).await?;
        if shutdown.is_cancelled() {
            return Ok(());
        }
        info!("standby: another replica leads; dormant again");
    }
}

/// Waits, serving `/health` and `/ready` as a standby, until nobody leads (true) or `shutdown`
/// (false).
async fn dormant(
    args: &ControllerArgs,
    after: Duration,
    shutdown: &CancellationToken,
) -> Result<bool, ControllerError> {
    let config = crate::config::Config::resolve(&args.config, &crate::config::ProcessEnv)?;
    let kube_cfg = crate::kube::config::load(args.cluster.kubeconfig.as_deref())
        .await
        .map_err(|e| ControllerError::KubeConfig(e.to_string()))?;
    let reach = crate::kube::client::ApiReachability::new();
    let clients = crate::kube::client::clients(&kube_cfg, &args.cluster.api_servers, &reach)
        .map_err(|e| ControllerError::KubeConfig(e.to_string()))?;
    let name = format!("{}-controller", config.prefix);
    let leases: kube::Api<Lease> = kube::Api::namespaced(clients.client(), &args.cluster.lease_namespace);
    let admin_stop = shutdown.child_token();
    let admin = serve_dormant(&args.admin_listen, &admin_stop).await?;
    info!(
        lease = %format!("{}/{name}", args.cluster.lease_namespace),
        after_ms = after.as_millis(),
        "standby: dormant while another replica leads"
    );
    let mut leaderless = Leaderless::default();
    let mut failing = false;
    let woke = loop {
        tokio::select! {
            () = shutdown.cancelled() => break false,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        match leases.get_opt(&name).await {
            Ok(lease) => {
                failing = false;
                let expired = expired_for(lease.as_ref(), std::time::SystemTime::now());
                if leaderless.observe(version(lease.as_ref()), expired, Instant::now(), after) {
                    let holder = lease
                        .and_then(|l| l.spec)
                        .and_then(|s| s.holder_identity)
                        .unwrap_or_default();
                    info!(
                        last_holder = %if holder.is_empty() { "-" } else { &holder },
                        "standby: nobody has renewed the leader Lease for {after:?}; running the controller"
                    );
                    break true;
                }
            }
            Err(error) => {
                if !failing {
                    warn!(%error, "standby: reading the leader Lease failed; retrying");
                }
                failing = true;
            }
        }
    };
    admin_stop.cancel();
    if let Some(task) = admin {
        let _ = task.await;
    }
    Ok(woke)
}

/// The dormant replica's admin server: `/health` and `/ready` answer 200 `standby` (the kubelet
/// keeps it running and Ready), `/leader` answers `standby`.
async fn serve_dormant(
    listen: &str,
    stop: &CancellationToken,
) -> Result<Option<tokio::task::JoinHandle<()>>, ControllerError> {
    use axum::routing::get;
    let addr = crate::admin::parse_listen(listen).map_err(|reason| ControllerError::Flag {
        flag: "admin-listen",
        reason,
    })?;
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = crate::admin::bind_plain(addr).await?;
    let app = axum::Router::new()
        .route("/health", get(|| async { "standby" }))
        .route("/ready", get(|| async { "standby" }))
        .route("/leader", get(|| async { "standby" }));
    Ok(Some(tokio::spawn(
        crate::admin::serve_plain(listener, app, stop.clone()).instrument(tracing::info_span!("admin")),
    )))
}

/// Ends a standby replica's round (cancels `round`) once it has been a follower for `rest`
/// while another replica held the Lease.
pub(super) async fn rest_when_led_elsewhere(
    mut gate: super::LeaderGate,
    rest: Duration,
    round: CancellationToken,
) {
    let mut since: Option<tokio::time::Instant> = None;
    loop {
        let led_elsewhere = gate.in_term().is_none() && gate.handover().is_some();
        since = match (led_elsewhere, since) {
            (false, _) => None,
            (true, None) => Some(tokio::time::Instant::now()),
            (true, Some(t)) if t.elapsed() >= rest => {
                tracing::info!(after = ?rest, "another replica leads: this standby replica goes dormant");
                round.cancel();
                return;
            }
            (true, t) => t,
        };
        tokio::select! {
            () = round.cancelled() => return,
            () = gate.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests;
