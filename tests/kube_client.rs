//! The controller's Kubernetes client (src/kube/client.rs) against two real API servers, the
//! first behind a proxy that loses answers: the request reaches the API server, its answer
//! never comes back, and the client fails over after its 3 s limit. A create of a named object
//! (an Event) is looked up on the next API server and not sent again: one Event, and the caller
//! is told it was made. A create with a generated name is not sent again at all: one object.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use baton::events::{Event, EventType, Recorder, Reporter};
use baton::kube::client::{ApiReachability, REQUEST_TIMEOUT, client};
use baton_testbed::{ADMIN_TOKEN, APISERVER_PORT, ControlPlane, Options, lab};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ObjectReference};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::Api;
use kube::api::{ListParams, PostParams};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// A TCP proxy to `upstream` that forwards both ways until [`Lossy::lose`], then passes what
/// clients send but drops every answer.
struct Lossy {
    addr: SocketAddr,
    losing: Arc<AtomicBool>,
}

impl Lossy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let losing = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&losing);
        tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let flag = Arc::clone(&flag);
                tokio::spawn(async move {
                    let Ok(up) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (mut down_r, mut down_w) = down.into_split();
                    let (mut up_r, mut up_w) = up.into_split();
                    tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut down_r, &mut up_w).await;
                    });
                    let mut buf = vec![0u8; 16 * 1024];
                    while let Ok(n) = up_r.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        if !flag.load(Ordering::SeqCst) && down_w.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Self { addr, losing }
    }

    fn losing(&self, lose: bool) {
        self.losing.store(lose, Ordering::SeqCst);
    }
}

#[test]
fn a_create_whose_answer_is_lost_is_looked_up_not_sent_again() {
    lab::run(|| async {
        baton_testbed::init_tracing();
        let cp = ControlPlane::start(Options::servers(2)).await.unwrap();
        let proxy = Lossy::start(SocketAddr::new(cp.addresses()[0], APISERVER_PORT)).await;
        // The serving certificate names 127.0.0.1: the proxy's address verifies.
        let cfg = cp.kube_config(0, ADMIN_TOKEN).unwrap();
        let urls = vec![format!("https://{}", proxy.addr), cp.url(1)];
        let failover = client(&cfg, &urls, &ApiReachability::new()).unwrap();
        // A connection to the first API server, through the proxy, kept for the next requests.
        Api::<Namespace>::all(failover.clone())
            .get("default")
            .await
            .unwrap();
        proxy.losing(true);

        let recorder = Recorder::new(
            failover.clone(),
            Reporter {
                controller: "baton".into(),
                instance: None,
            },
        );
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some("default".into()),
            name: Some("web".into()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Normal,
            reason: "AnswerLost".into(),
            note: Some("created once".into()),
            action: "Test".into(),
            secondary: None,
        };
        let started = Instant::now();
        recorder
            .publish(&event, &regarding)
            .await
            .expect("the create that was made counts as made");
        assert!(
            started.elapsed() >= REQUEST_TIMEOUT,
            "the answer was lost on the kept connection (took {:?})",
            started.elapsed()
        );
        let admin = cp.client(1).unwrap();
        let events: Vec<K8sEvent> = Api::<K8sEvent>::namespaced(admin.clone(), "default")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("AnswerLost"))
            .collect();
        assert_eq!(events.len(), 1, "one Event: {events:#?}");

        // A generated name: a second create would make a second object, so there is none. (A
        // new client: the first one now starts at the second API server.)
        proxy.losing(false);
        let failover = client(&cfg, &urls, &ApiReachability::new()).unwrap();
        Api::<Namespace>::all(failover.clone())
            .get("default")
            .await
            .unwrap();
        proxy.losing(true);
        let generated: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"generateName": "lost-", "namespace": "default"},
            "data": {"k": "v"},
        }))
        .unwrap();
        let result = Api::<ConfigMap>::namespaced(failover, "default")
            .create(&PostParams::default(), &generated)
            .await;
        assert!(result.is_err(), "not sent again, the caller is told: {result:?}");
        let made = Api::<ConfigMap>::namespaced(admin, "default")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with("lost-")))
            .count();
        assert_eq!(
            made, 1,
            "the create reached the first API server once and nowhere else"
        );
    });
}
