//! The API names in DNS during bootstrap: which addresses, with which health, published how.
//!
//! ```text
//!  endpoints (name, bootstrap address, FIP) ─┐
//!  health (HealthMap, from health.rs) ───────┼─ dns_records (pure) ─▶ RecordStore ─┬─ embedded server
//!  dropped (the bootstrap address left) ─────┘                                     └─ RFC 2136 push loop
//! ```
//!
//! Each name carries the bootstrap address (until it is dropped) and the FIP, each flagged
//! healthy only while it answers `/readyz`; the record model serves the healthy ones (or all,
//! when none is healthy). Until the bootstrap address is dropped, the FIP is carried only while
//! it answers: before the first checks (or when nothing answers) the name carries the bootstrap
//! address alone, never a FIP that does not route yet. `Published` tells the run loop when a snapshot is really out: at
//! once for the embedded server, after a verified push for RFC 2136.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use baton_dns::{
    DnsError, DnsName, DnsServer, DnsServerHandle, PushTarget, RecordStore, Rfc2136Publisher, ServerConfig,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, info_span, warn};

use super::config::{Dns, DnsMode};
use super::health::{HealthMap, is_up};

/// The addresses of one API name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameAddrs {
    pub name: DnsName,
    pub bootstrap: IpAddr,
    pub fip: IpAddr,
}

/// The records each name should carry: `(name, [(address, healthy)])`, bootstrap address first.
pub fn dns_records(
    names: &[NameAddrs],
    bootstrap_dropped: bool,
    health: &HealthMap,
) -> Vec<(DnsName, Vec<(IpAddr, bool)>)> {
    names
        .iter()
        .map(|n| {
            let mut addrs = Vec::with_capacity(2);
            let fip_up = is_up(health, n.fip);
            if !bootstrap_dropped {
                addrs.push((n.bootstrap, is_up(health, n.bootstrap)));
            }
            if fip_up || bootstrap_dropped {
                addrs.push((n.fip, fip_up));
            }
            (n.name.clone(), addrs)
        })
        .collect()
}

/// Writes the desired records into `store`; returns whether anything changed.
pub fn sync_once(
    store: &RecordStore,
    names: &[NameAddrs],
    bootstrap_dropped: bool,
    health: &HealthMap,
) -> bool {
    let mut changed = false;
    for (name, addrs) in dns_records(names, bootstrap_dropped, health) {
        changed |= store.set_name(name, addrs);
    }
    changed
}

/// Keeps `store` in step with the health checks and the dropped flag until `token` is cancelled.
pub fn spawn_sync(
    store: RecordStore,
    names: Vec<NameAddrs>,
    mut health: watch::Receiver<HealthMap>,
    mut dropped: watch::Receiver<bool>,
    token: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(
        async move {
            loop {
                let h = health.borrow_and_update().clone();
                let d = *dropped.borrow_and_update();
                if sync_once(&store, &names, d, &h) {
                    let snap = store.snapshot();
                    for (name, recs) in snap.names() {
                        debug!(%name, served = ?recs.served(), generation = snap.generation, "DNS records changed");
                    }
                }
                tokio::select! {
                    () = token.cancelled() => return,
                    r = health.changed() => if r.is_err() { return },
                    r = dropped.changed() => if r.is_err() { return },
                }
            }
        }
        .instrument(info_span!("dns-sync")),
    )
}

/// The running DNS side: the embedded server or the push loop.
#[derive(Debug)]
pub struct Publisher {
    published: watch::Receiver<u64>,
    last_error: watch::Receiver<Option<String>>,
    server: Option<DnsServerHandle>,
    task: Option<JoinHandle<()>>,
    mode: &'static str,
}

impl Publisher {
    /// Starts publishing `store` as `dns` says.
    pub async fn start(dns: &Dns, store: RecordStore, token: &CancellationToken) -> Result<Self, DnsError> {
        let (err_tx, last_error) = watch::channel(None);
        match &dns.mode {
            DnsMode::Embedded { listen } => {
                let mut config = ServerConfig::new(dns.zone.clone(), listen.clone());
                config.ttl = dns.ttl;
                config.udp_workers = 1;
                let server = DnsServer::start(config, store.clone(), token).await?;
                let (tx, published) = watch::channel(store.snapshot().generation);
                let task = mirror_generation(store, tx, token.clone());
                drop(err_tx);
                Ok(Self {
                    published,
                    last_error,
                    server: Some(server),
                    task: Some(task),
                    mode: "embedded",
                })
            }
            DnsMode::Rfc2136 { server, key } => {
                let mut target = PushTarget::new(*server, dns.zone.clone());
                target.ttl = dns.ttl;
                let updater = Rfc2136Publisher::new(target, key.clone());
                // The first push must work: a wrong key or server is better reported now.
                let first = store.snapshot();
                updater.push(&first).await?;
                let (pushed_tx, published) = watch::channel(first.generation);
                let task = tokio::spawn(
                    push_loop(updater, store, pushed_tx, err_tx, token.clone())
                        .instrument(info_span!("dns-push")),
                );
                Ok(Self {
                    published,
                    last_error,
                    server: None,
                    task: Some(task),
                    mode: "rfc2136",
                })
            }
            DnsMode::None => {
                let (tx, published) = watch::channel(store.snapshot().generation);
                let task = mirror_generation(store, tx, token.clone());
                drop(err_tx);
                Ok(Self {
                    published,
                    last_error,
                    server: None,
                    task: Some(task),
                    mode: "none",
                })
            }
        }
    }

    /// `embedded`, `rfc2136` or `none`.
    pub fn mode(&self) -> &'static str {
        self.mode
    }

    /// Where the embedded server listens (UDP).
    pub fn listen_addrs(&self) -> Vec<std::net::SocketAddr> {
        self.server
            .as_ref()
            .map(|s| s.udp_addrs().to_vec())
            .unwrap_or_default()
    }

    /// The last push error, if the last push failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.borrow().clone()
    }

    /// Waits until the snapshot of `generation` (or a later one) is out.
    pub async fn wait_published(&self, generation: u64) {
        let mut rx = self.published.clone();
        let _ = rx.wait_for(|g| *g >= generation).await;
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

fn mirror_generation(store: RecordStore, tx: watch::Sender<u64>, token: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut rx = store.subscribe();
        loop {
            let g = rx.borrow_and_update().generation;
            tx.send_replace(g);
            tokio::select! {
                () = token.cancelled() => return,
                r = rx.changed() => if r.is_err() { return },
            }
        }
    })
}

/// Pushes every new snapshot; retries failed pushes with backoff (1 s doubling to 10 s).
async fn push_loop(
    publisher: Rfc2136Publisher,
    store: RecordStore,
    tx: watch::Sender<u64>,
    err_tx: watch::Sender<Option<String>>,
    token: CancellationToken,
) {
    let mut rx = store.subscribe();
    let mut backoff = Duration::from_secs(1);
    loop {
        let snap: Arc<baton_dns::Snapshot> = rx.borrow_and_update().clone();
        if snap.generation > *tx.borrow() {
            match publisher.push(&snap).await {
                Ok(outcome) => {
                    info!(?outcome, generation = snap.generation, "DNS records pushed");
                    tx.send_replace(snap.generation);
                    err_tx.send_replace(None);
                    backoff = Duration::from_secs(1);
                }
                Err(error) => {
                    warn!(%error, retry_in = ?backoff, "DNS push failed; retrying");
                    err_tx.send_replace(Some(error.to_string()));
                    tokio::select! {
                        () = token.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            }
        }
        tokio::select! {
            () = token.cancelled() => return,
            r = rx.changed() => if r.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_core::health::Health;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn names() -> Vec<NameAddrs> {
        vec![NameAddrs {
            name: "api.c1.example.com".parse().unwrap(),
            bootstrap: ip("198.51.100.10"),
            fip: ip("203.0.113.1"),
        }]
    }

    #[test]
    fn the_bootstrap_sequence_as_the_records_see_it() {
        let n = names();
        let (b, f) = (ip("198.51.100.10"), ip("203.0.113.1"));
        // Nothing probed yet: the bootstrap address alone (a FIP that may not route yet is
        // never handed out).
        let mut h = HealthMap::new();
        assert_eq!(dns_records(&n, false, &h)[0].1, vec![(b, false)]);
        // The bootstrap API server answers, the FIP does not route yet: the bootstrap alone.
        h.insert(b, Health::Up);
        h.insert(f, Health::Down);
        assert_eq!(dns_records(&n, false, &h)[0].1, vec![(b, true)]);
        // The FIP routes to a healthy API server: both healthy.
        h.insert(f, Health::Up);
        assert_eq!(dns_records(&n, false, &h)[0].1, vec![(b, true), (f, true)]);
        // Dropped: only the FIP is left, whatever the bootstrap host's health.
        assert_eq!(dns_records(&n, true, &h)[0].1, vec![(f, true)]);
        // The FIP stops answering before the drop: it leaves the records.
        h.insert(f, Health::Down);
        assert_eq!(dns_records(&n, false, &h)[0].1, vec![(b, true)]);
        h.insert(f, Health::Up);
        // The bootstrap API server stops before the drop: it leaves the served set.
        h.insert(b, Health::Down);
        let store = RecordStore::new();
        sync_once(&store, &n, false, &h);
        let snap = store.snapshot();
        assert_eq!(snap.get(&n[0].name).unwrap().served(), vec![f]);
    }

    #[test]
    fn unknown_health_is_not_healthy() {
        let n = names();
        let mut h = HealthMap::new();
        h.insert(n[0].fip, Health::Unknown);
        assert!(dns_records(&n, true, &h)[0].1.iter().all(|(_, ok)| !ok));
    }
}
