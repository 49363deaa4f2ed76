//! Leader election on a `coordination.k8s.io` Lease.
//!
//! One replica holds the Lease and renews it every `renew_interval`; the others watch it and take
//! over when it has not changed for `duration` (measured on their own clock, as client-go does, so
//! clock skew between nodes does not matter). The holder publishes "valid until
//! `last successful renew + renew_deadline`" on a watch channel; [`LeaderGate`] reads it right
//! before every cloud write, so a holder that cannot reach any API server stops writing before
//! anyone else can take over (`renew_deadline < duration`). On shutdown the holder releases the
//! Lease so a follower takes over at once.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::LeaderGate;

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (pod name).
    pub identity: String,
    /// How long a Lease stays valid without renewal.
    pub duration: Duration,
    /// How often the holder renews (and followers look).
    pub renew_interval: Duration,
    /// The holder stops acting this long after its last successful renew.
    pub renew_deadline: Duration,
}

impl LeaseConfig {
    /// Defaults for `identity`: 4 s lease, renewed every 1 s, 3 s renew deadline.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration: Duration::from_secs(4),
            renew_interval: Duration::from_secs(1),
            renew_deadline: Duration::from_secs(3),
        }
    }
}

/// Starts the election; returns the gate reflecting this replica's leadership and the task.
pub fn spawn(
    client: kube::Client,
    cfg: LeaseConfig,
    shutdown: CancellationToken,
) -> (LeaderGate, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(None);
    let task = tokio::spawn(run(client, cfg, tx, shutdown));
    (LeaderGate::new(rx), task)
}

/// What a follower last saw of the Lease, and when (on its own clock).
#[derive(Debug, PartialEq)]
struct Observed {
    holder: Option<String>,
    renew: Option<MicroTime>,
    at: Instant,
}

async fn run(
    client: kube::Client,
    cfg: LeaseConfig,
    tx: watch::Sender<Option<Instant>>,
    shutdown: CancellationToken,
) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut observed: Option<Observed> = None;
    let mut tick = tokio::time::interval(cfg.renew_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        let attempt = Instant::now();
        match tokio::time::timeout(
            cfg.renew_interval.max(Duration::from_secs(1)),
            try_acquire_or_renew(&api, &cfg, &mut observed),
        )
        .await
        {
            Ok(Ok(true)) => {
                let until = attempt + cfg.renew_deadline;
                tx.send_if_modified(|v| {
                    let was_leading = v.is_some_and(|t| t > attempt);
                    if !was_leading {
                        tracing::info!(identity = %cfg.identity, lease = %cfg.name, "became leader");
                    }
                    *v = Some(until);
                    !was_leading
                });
            }
            Ok(Ok(false)) => {
                tx.send_if_modified(|v| {
                    let changed = v.is_some();
                    if changed {
                        tracing::warn!(identity = %cfg.identity, "lost the lease");
                    }
                    *v = None;
                    changed
                });
            }
            Ok(Err(error)) => tracing::warn!(%error, lease = %cfg.name, "lease update failed"),
            Err(_) => tracing::warn!(lease = %cfg.name, "lease update timed out"),
        }
    }
    // Graceful stop: hand the lease over at once.
    if tx.borrow().is_some_and(|t| t > Instant::now()) {
        tx.send_replace(None);
        if let Ok(Some(mut lease)) = api.get_opt(&cfg.name).await
            && let Some(spec) = lease.spec.as_mut()
            && spec.holder_identity.as_deref() == Some(&cfg.identity)
        {
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            let _ = api.replace(&cfg.name, &PostParams::default(), &lease).await;
            tracing::info!(identity = %cfg.identity, "released the lease");
        }
    }
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// One round: returns whether this replica holds the lease afterwards.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    observed: &mut Option<Observed>,
) -> Result<bool, kube::Error> {
    let pp = PostParams::default();
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.name.clone()),
                namespace: Some(cfg.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(secs(cfg.duration)),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&pp, &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    if holder.as_deref() == Some(cfg.identity.as_str()) {
        spec.renew_time = Some(now());
        spec.lease_duration_seconds = Some(secs(cfg.duration));
        return replace(api, cfg, &lease).await;
    }
    // A follower: has the record changed since we last looked?
    let current = (holder.clone(), spec.renew_time.clone());
    let unchanged_since = match observed {
        Some(o) if (o.holder.clone(), o.renew.clone()) == current => o.at,
        _ => {
            *observed = Some(Observed {
                holder: current.0,
                renew: current.1,
                at: Instant::now(),
            });
            Instant::now()
        }
    };
    let their_duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(cfg.duration, Duration::from_secs);
    if holder.is_some() && unchanged_since.elapsed() < their_duration {
        return Ok(false);
    }
    spec.holder_identity = Some(cfg.identity.clone());
    spec.lease_duration_seconds = Some(secs(cfg.duration));
    spec.acquire_time = Some(now());
    spec.renew_time = Some(now());
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    let won = replace(api, cfg, &lease).await?;
    if won {
        *observed = None;
    }
    Ok(won)
}

/// Replaces the lease under optimistic concurrency (its resourceVersion); a conflict means
/// someone else wrote first.
async fn replace(api: &Api<Lease>, cfg: &LeaseConfig, lease: &Lease) -> Result<bool, kube::Error> {
    match api.replace(&cfg.name, &PostParams::default(), lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}
