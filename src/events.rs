//! Publishes Kubernetes Events (`events.k8s.io/v1`), folding repeats into a series the way
//! kube's `Recorder` and client-go do: an Event with the same object, type, reason, action and
//! related object as one published in the last 6 minutes is not created again; the first one's
//! `series` (count, last observed time) is patched instead, and its note is kept.
//!
//! Unlike kube's `Recorder`, which keeps a copy of every Event of the last 6 minutes (and the
//! capacity of its map for good: after a burst of a few thousand Events — one per Service at
//! 1,000 Services — several MiB stay resident), this keeps a hash of the key, the Event's name
//! and namespace and its count, and gives the memory back once the burst has expired.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
pub use kube::runtime::events::{Event, EventType, Reporter};

/// How long an Event stays the head of its series (kube's and client-go's value).
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// How often expired series are dropped (each publish would otherwise scan them all).
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// The head of a series: the Event created first, and how often it happened since.
#[derive(Debug)]
struct Head {
    namespace: String,
    name: String,
    count: i32,
    last_seen: Instant,
}

#[derive(Debug)]
struct Series {
    heads: HashMap<u64, Head>,
    swept: Instant,
}

impl Series {
    /// Drops series not seen within the TTL, and the map's spare capacity with them.
    fn sweep(&mut self, now: Instant) {
        if now.duration_since(self.swept) < SWEEP_EVERY {
            return;
        }
        self.swept = now;
        self.heads
            .retain(|_, head| now.duration_since(head.last_seen) < SERIES_TTL);
        if self.heads.capacity() > 64 && self.heads.len() < self.heads.capacity() / 4 {
            self.heads.shrink_to(self.heads.len() * 2);
        }
    }
}

/// Publishes Events for one reporting controller.
pub struct Recorder {
    client: kube::Client,
    reporter: Reporter,
    series: Mutex<Series>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("reporter", &self.reporter)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            series: Mutex::new(Series {
                heads: HashMap::new(),
                swept: Instant::now(),
            }),
        }
    }

    /// Creates the Event on the object `regarding` names (in its namespace, `default` for a
    /// cluster-scoped one), or counts it into the series of the same Event published within
    /// the TTL.
    pub async fn publish(&self, ev: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let key = series_key(ev, regarding);
        let now = Instant::now();
        let repeat = {
            let mut series = self.lock();
            series.sweep(now);
            series
                .heads
                .get(&key)
                .filter(|head| now.duration_since(head.last_seen) < SERIES_TTL)
                .map(|head| (head.namespace.clone(), head.name.clone(), head.count + 1))
        };
        let stamp = Timestamp::now();
        let head = if let Some((namespace, name, count)) = repeat {
            let patch = K8sEvent {
                series: Some(EventSeries {
                    count,
                    last_observed_time: MicroTime(stamp),
                }),
                ..K8sEvent::default()
            };
            let patched = Api::<K8sEvent>::namespaced(self.client.clone(), &namespace)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            if let Err(error) = patched {
                // Gone (deleted, expired) or refused: the next one starts a new series.
                self.lock().heads.remove(&key);
                return Err(error);
            }
            Head {
                namespace,
                name,
                count,
                last_seen: now,
            }
        } else {
            let event = self.new_event(ev, regarding, stamp);
            let namespace = event.metadata.namespace.clone().unwrap_or_default();
            let name = event.metadata.name.clone().unwrap_or_default();
            Api::<K8sEvent>::namespaced(self.client.clone(), &namespace)
                .create(&PostParams::default(), &event)
                .await?;
            Head {
                namespace,
                name,
                count: 1,
                last_seen: now,
            }
        };
        self.lock().heads.insert(key, head);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Series> {
        self.series
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn new_event(&self, ev: &Event, regarding: &ObjectReference, now: Timestamp) -> K8sEvent {
        let controller = &self.reporter.controller;
        K8sEvent {
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: ev.secondary.clone(),
            note: ev.note.clone(),
            metadata: ObjectMeta {
                namespace: Some(
                    regarding
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".to_owned()),
                ),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some(
                match ev.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            ..K8sEvent::default()
        }
    }
}

/// What makes two Events one series: the object, type, reason, action and related object.
fn series_key(ev: &Event, regarding: &ObjectReference) -> u64 {
    let mut h = DefaultHasher::new();
    matches!(ev.type_, EventType::Warning).hash(&mut h);
    ev.reason.hash(&mut h);
    ev.action.hash(&mut h);
    hash_ref(regarding, &mut h);
    match &ev.secondary {
        Some(related) => {
            1u8.hash(&mut h);
            hash_ref(related, &mut h);
        }
        None => 0u8.hash(&mut h),
    }
    h.finish()
}

fn hash_ref(r: &ObjectReference, h: &mut DefaultHasher) {
    for field in [
        &r.api_version,
        &r.kind,
        &r.namespace,
        &r.name,
        &r.uid,
        &r.field_path,
        &r.resource_version,
    ] {
        field.hash(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some("default".into()),
            name: Some(name.into()),
            ..ObjectReference::default()
        }
    }

    fn event(reason: &str, related: Option<ObjectReference>) -> Event {
        Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some("a note that is not part of the key".into()),
            action: "Act".into(),
            secondary: related,
        }
    }

    #[test]
    fn the_same_event_on_the_same_object_is_one_series_and_anything_else_is_another() {
        let a = series_key(&event("Moved", None), &reference("a"));
        let mut other_note = event("Moved", None);
        other_note.note = Some("different".into());
        assert_eq!(a, series_key(&other_note, &reference("a")));
        assert_ne!(a, series_key(&event("Moved", None), &reference("b")));
        assert_ne!(a, series_key(&event("Kept", None), &reference("a")));
        assert_ne!(
            a,
            series_key(&event("Moved", Some(reference("node-1"))), &reference("a"))
        );
        let mut warning = event("Moved", None);
        warning.type_ = EventType::Warning;
        assert_ne!(a, series_key(&warning, &reference("a")));
    }

    #[test]
    fn expired_series_are_dropped_and_their_memory_given_back() {
        let start = Instant::now();
        let mut series = Series {
            heads: HashMap::new(),
            swept: start,
        };
        for i in 0..5_000u64 {
            series.heads.insert(
                i,
                Head {
                    namespace: "default".into(),
                    name: format!("svc-{i}.1"),
                    count: 1,
                    last_seen: start,
                },
            );
        }
        let big = series.heads.capacity();
        // Within the sweep interval nothing is scanned.
        series.sweep(start + Duration::from_secs(1));
        assert_eq!(series.heads.len(), 5_000);
        series.heads.get_mut(&7).unwrap().last_seen = start + SERIES_TTL;
        series.sweep(start + SERIES_TTL + Duration::from_secs(1));
        assert_eq!(
            series.heads.len(),
            1,
            "only the series seen within the TTL is kept"
        );
        assert!(series.heads.contains_key(&7));
        assert!(
            series.heads.capacity() < big / 100,
            "capacity {} after the sweep (was {big})",
            series.heads.capacity()
        );
    }
}
