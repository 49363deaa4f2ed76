//! Who could lead next: the replicas that show they are alive, and the leader's request to hand
//! the Lease to one of them.
//!
//! ```text
//!  follower: every PEER_BEAT ──► its entry {node, beat} in the Lease's PEERS_ANNOTATION
//!            (an update of the Lease it may already update; no other object, no wider RBAC)
//!  leader:   watches the Lease ──► Roster: when it last saw each entry change, on its own clock
//!            endpoint loop ──► Succession::hand_off(peer) ──► lease task ends the term, waits
//!            for writes on their way, writes holderIdentity = peer
//! ```
//!
//! A follower counts as alive while the leader has seen its beat *change* within
//! [`PEER_ALIVE`]: an entry merely present (left by a replica that has since died) proves
//! nothing, so a new leader knows nobody alive until one beat has come in. Entries that stop
//! changing for [`PEER_FORGET`] are dropped by the leader in its next renew.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

/// The Lease annotation in which followers show they are alive: JSON, identity → entry.
pub const PEERS_ANNOTATION: &str = "baton.dev/peers";

/// How often a follower renews its entry.
pub const PEER_BEAT: Duration = Duration::from_secs(3);

/// A follower counts as alive this long after its beat was last seen to change (two beats and
/// a half: one lost write does not make it dead).
pub const PEER_ALIVE: Duration = Duration::from_millis(7_500);

/// An entry that has not changed for this long is dropped from the Lease.
pub const PEER_FORGET: Duration = Duration::from_secs(60);

/// One follower's entry in [`PEERS_ANNOTATION`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerEntry {
    /// The Node the replica runs on (`spec.nodeName`).
    pub node: String,
    /// Its wall clock in ms when it wrote the entry: only compared for change (the leader
    /// judges age on its own clock, so skew does not matter).
    pub beat: u64,
}

/// The entries of `lease` (none when the annotation is missing or garbled).
pub fn entries(lease: &Lease) -> BTreeMap<String, PeerEntry> {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PEERS_ANNOTATION))
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// Writes `peers` into `lease`'s annotation (removes it when empty).
pub fn set_entries(lease: &mut Lease, peers: &BTreeMap<String, PeerEntry>) {
    let annotations = lease.metadata.annotations.get_or_insert_with(Default::default);
    if peers.is_empty() {
        annotations.remove(PEERS_ANNOTATION);
    } else if let Ok(text) = serde_json::to_string(peers) {
        annotations.insert(PEERS_ANNOTATION.to_owned(), text);
    }
}

/// A follower the leader may hand the Lease to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its identity in the Lease (the pod name).
    pub identity: String,
    /// Its Node.
    pub node: String,
}

/// What this replica saw of the others' entries, on its own clock, and whether its last
/// hand-off took.
#[derive(Debug, Default)]
pub struct Roster {
    seen: BTreeMap<String, Seen>,
    /// The replica this one last handed the Lease to, the renew time of that write, and
    /// whether the replica has written the Lease itself since (it took the Lease).
    handed: Option<(String, Option<MicroTime>, bool)>,
}

#[derive(Debug)]
struct Seen {
    entry: PeerEntry,
    /// When this entry (this beat) was first seen.
    at: Instant,
    /// Whether a change of the beat has been seen at all (a first sight proves nothing).
    changed: bool,
}

impl Roster {
    /// Takes in the entries of a version of the Lease seen at `now`; `me` is left out.
    pub fn observe(&mut self, entries: BTreeMap<String, PeerEntry>, me: &str, now: Instant) {
        self.seen.retain(|id, _| entries.contains_key(id));
        for (id, entry) in entries {
            if id == me {
                continue;
            }
            match self.seen.get_mut(&id) {
                Some(s) if s.entry == entry => {}
                Some(s) => {
                    *s = Seen {
                        entry,
                        at: now,
                        changed: true,
                    };
                }
                None => {
                    self.seen.insert(
                        id,
                        Seen {
                            entry,
                            at: now,
                            changed: false,
                        },
                    );
                }
            }
        }
    }

    /// Records a hand-off to `to`, written with renew time `renew`.
    pub fn handed(&mut self, to: String, renew: Option<MicroTime>) {
        self.handed = Some((to, renew, false));
    }

    /// Takes in the holder and renew time of a version of the Lease: a version by the replica
    /// last handed to, other than the hand-off's own write, means the hand-off took.
    pub fn holder_wrote(&mut self, holder: Option<&str>, renew: Option<&MicroTime>) {
        if let Some((to, handed_renew, took)) = &mut self.handed
            && holder == Some(to.as_str())
            && renew != handed_renew.as_ref()
        {
            *took = true;
        }
    }

    /// Whether the last hand-off took (`false` also when there was none).
    pub fn handoff_took(&self) -> bool {
        self.handed.as_ref().is_some_and(|(_, _, took)| *took)
    }

    /// The followers seen alive at `now`, by identity.
    pub fn live(&self, now: Instant) -> Vec<Peer> {
        self.seen
            .iter()
            .filter(|(_, s)| s.changed && now.saturating_duration_since(s.at) < PEER_ALIVE)
            .map(|(id, s)| Peer {
                identity: id.clone(),
                node: s.entry.node.clone(),
            })
            .collect()
    }

    /// Whether the entry of `identity` has not changed for [`PEER_FORGET`]. An entry not seen
    /// yet is kept: the leader may hold a version (read after a conflict) that its watch has
    /// not delivered yet, with a beat written a moment ago.
    pub fn forgotten(&self, identity: &str, now: Instant) -> bool {
        self.seen
            .get(identity)
            .is_some_and(|s| now.saturating_duration_since(s.at) >= PEER_FORGET)
    }
}

/// The leader's side of succession, shared between the lease task and the controllers: the
/// roster, this replica's Node, and the hand-off request.
#[derive(Clone, Debug)]
pub struct Succession {
    node: Option<String>,
    roster: Arc<Mutex<Roster>>,
    request: Arc<watch::Sender<Option<HandOff>>>,
}

/// A request to hand the Lease of term `term` to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandOff {
    pub term: u64,
    pub to: Peer,
}

impl Default for Succession {
    fn default() -> Self {
        Self::new(None)
    }
}

impl Succession {
    /// For a replica on `node` (`None`: unknown; it then never hands off, nor is handed to).
    pub fn new(node: Option<String>) -> Self {
        Self {
            node,
            roster: Arc::default(),
            request: Arc::new(watch::channel(None).0),
        }
    }

    /// The Node this replica runs on.
    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// Whether this replica's last hand-off took: the replica it handed to wrote the Lease
    /// itself afterwards (a hand-off that did not take is one to back off from).
    pub fn handoff_took(&self) -> bool {
        self.lock().handoff_took()
    }

    /// The followers seen alive now.
    pub fn peers(&self) -> Vec<Peer> {
        self.lock().live(Instant::now())
    }

    /// Asks the lease task to hand the Lease of `term` to `to` (ignored unless this replica
    /// still holds that term).
    pub fn hand_off(&self, term: u64, to: Peer) {
        self.request.send_replace(Some(HandOff { term, to }));
    }

    /// The requests, for the lease task.
    pub(super) fn requests(&self) -> watch::Receiver<Option<HandOff>> {
        self.request.subscribe()
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Roster> {
        self.roster
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(node: &str, beat: u64) -> PeerEntry {
        PeerEntry {
            node: node.into(),
            beat,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_is_alive_only_after_its_beat_changes_and_until_it_stops() {
        let mut roster = Roster::default();
        let t0 = Instant::now();
        roster.observe(
            [("b".into(), entry("n2", 1)), ("a".into(), entry("n1", 1))].into(),
            "a",
            t0,
        );
        assert!(
            roster.live(t0).is_empty(),
            "an entry merely present may be a dead replica's"
        );
        roster.observe([("b".into(), entry("n2", 2))].into(), "a", t0 + PEER_BEAT);
        assert_eq!(
            roster.live(t0 + PEER_BEAT),
            vec![Peer {
                identity: "b".into(),
                node: "n2".into()
            }]
        );
        // The same beat seen again (another write to the Lease) does not renew it.
        roster.observe([("b".into(), entry("n2", 2))].into(), "a", t0 + PEER_BEAT * 2);
        assert_eq!(
            roster
                .live(t0 + PEER_BEAT + PEER_ALIVE - Duration::from_millis(1))
                .len(),
            1
        );
        assert!(
            roster.live(t0 + PEER_BEAT + PEER_ALIVE).is_empty(),
            "stopped beating: not alive"
        );
        assert!(!roster.forgotten("b", t0 + PEER_BEAT + PEER_ALIVE));
        assert!(roster.forgotten("b", t0 + PEER_BEAT + PEER_FORGET));
        assert!(
            !roster.forgotten("new", t0),
            "an entry not seen yet may be a beat the watch has not delivered"
        );
    }

    #[test]
    fn a_hand_off_took_once_its_new_holder_wrote_the_lease_itself() {
        let mut roster = Roster::default();
        assert!(!roster.handoff_took());
        let t = |s: &str| Some(MicroTime(s.parse().unwrap()));
        roster.handed("b".into(), t("2026-11-29T05:00:00Z"));
        roster.holder_wrote(Some("b"), t("2026-11-29T05:00:00Z").as_ref());
        assert!(
            !roster.handoff_took(),
            "the hand-off's own write, seen by the watch"
        );
        roster.holder_wrote(Some("c"), t("2026-11-29T05:00:01Z").as_ref());
        assert!(!roster.handoff_took(), "another replica took it after a lapse");
        roster.holder_wrote(Some("b"), t("2026-11-29T05:00:00.2Z").as_ref());
        assert!(roster.handoff_took(), "b renewed: it leads");
    }

    #[test]
    fn a_garbled_annotation_is_no_entries_and_entries_round_trip() {
        let mut lease = Lease::default();
        assert!(entries(&lease).is_empty());
        lease.metadata.annotations = Some([(PEERS_ANNOTATION.to_owned(), "{not json".to_owned())].into());
        assert!(entries(&lease).is_empty());
        let peers: BTreeMap<_, _> = [("b".to_owned(), entry("n2", 7))].into();
        set_entries(&mut lease, &peers);
        assert_eq!(entries(&lease), peers);
        set_entries(&mut lease, &BTreeMap::new());
        assert!(
            lease
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| !a.contains_key(PEERS_ANNOTATION))
        );
    }
}
