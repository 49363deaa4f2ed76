//! baton's Event recorder (`src/events.rs`) against a real kube-apiserver: a repeated Event is
//! one `events.k8s.io/v1` Event whose series counts the repeats and keeps the first note, and
//! anything that differs in the key (reason, related object) is an Event of its own.
// in tests a panic is the failure report
#![allow(clippy::unwrap_used, clippy::expect_used)]

use baton::events::{Event, EventType, Recorder, Reporter};
use baton_testbed::{ControlPlane, Options, lab};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::Api;
use kube::api::ListParams;

fn service(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some("default".into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    }
}

fn moved(note: &str, related: Option<ObjectReference>) -> Event {
    Event {
        type_: EventType::Normal,
        reason: "FloatingIPMoved".into(),
        note: Some(note.into()),
        action: "Retarget".into(),
        secondary: related,
    }
}

#[test]
fn a_repeated_event_is_one_series_that_keeps_its_first_note() {
    lab::run(|| async {
        let cp = ControlPlane::start(Options::servers(1)).await.unwrap();
        let client = cp.client(0).unwrap();
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "baton".into(),
                instance: Some("test-0".into()),
            },
        );
        let web = service("web");
        for note in ["first move", "second move", "third move"] {
            recorder.publish(&moved(note, None), &web).await.unwrap();
        }
        // Another related object is another series; so is another object.
        let node = ObjectReference {
            kind: Some("Node".into()),
            name: Some("cp-1".into()),
            ..ObjectReference::default()
        };
        recorder
            .publish(&moved("to cp-1", Some(node)), &web)
            .await
            .unwrap();
        recorder
            .publish(&moved("db moved", None), &service("db"))
            .await
            .unwrap();

        let events = Api::<K8sEvent>::namespaced(client, "default")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let on = |name: &str| -> Vec<&K8sEvent> {
            events
                .iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
                .collect()
        };
        let web_events = on("web");
        assert_eq!(web_events.len(), 2, "{web_events:#?}");
        let series = web_events
            .iter()
            .find(|e| e.related.is_none())
            .expect("the repeated Event");
        assert_eq!(series.note.as_deref(), Some("first move"));
        assert_eq!(series.series.as_ref().map(|s| s.count), Some(3));
        assert_eq!(series.reporting_controller.as_deref(), Some("baton"));
        assert_eq!(series.reporting_instance.as_deref(), Some("test-0"));
        let related = web_events.iter().find(|e| e.related.is_some()).unwrap();
        assert_eq!(related.note.as_deref(), Some("to cp-1"));
        assert!(related.series.is_none(), "published once");
        assert_eq!(on("db").len(), 1);
    });
}
