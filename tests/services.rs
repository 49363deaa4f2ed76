//! The Service FIP controller against a real API server (+ kube-controller-manager) and the
//! simulator: create → ingress; delete → FIP released, then the Service goes; bring-your-own IP
//! (a FIP of this cluster) gets its ingress (as the Cherry CCM sets it) and nothing else, an
//! address that is not this cluster's a Warning Event and nothing at all; opt-out, control-plane
//! endpoints and other types untouched; a lost record is found again by tags; region errors surface as Events while other Services proceed;
//! nothing irreversible on one signal: a garbled IP annotation keeps the FIP, and a FIP whose
//! Service is deleted (or changes type) is held for the grace period, kept by a Service back
//! within it, released after it or at once when the Service asks.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // scenario tests read top to bottom

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton::controller::Context;
use baton::controller::service::{
    self, FINALIZER, FIP_ADDRESS_ANNOTATION, FIP_ID_ANNOTATION, GRACE_ANNOTATION, METALLB_IPS_ANNOTATION,
};
use baton::controller::watches::Watches;
use baton_cloud::tags::service_fip_tags;
use baton_sim::{Faults, Topology};
use baton_testbed::lab;
use common::{eventually, ingress, lb_service, namespace, service_fips};
use k8s_openapi::api::core::v1::{Event, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(60);

/// Starts the Service controller on `ctx`; it stops when the sender drops or sends.
fn start(ctx: Arc<Context>) -> watch::Sender<bool> {
    let (tx, rx) = watch::channel(false);
    let stop = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let mut watches = Watches::new(&ctx.client);
    tokio::spawn(service::run_services(ctx, &mut watches, stop(rx.clone())));
    tokio::spawn(watches.run(stop(rx)));
    tx
}

async fn get(api: &Api<Service>, name: &str) -> Option<Service> {
    api.get_opt(name).await.unwrap()
}

async fn wait_ingress(api: &Api<Service>, name: &str) -> Service {
    eventually(WAIT, &format!("ingress of {name}"), || async {
        get(api, name).await.filter(|s| ingress(s).is_some())
    })
    .await
}

async fn events_for(client: &kube::Client, ns: &str, name: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .unwrap()
        .items
}

async fn wait_event(client: &kube::Client, ns: &str, name: &str, reason: &str) -> Event {
    eventually(WAIT, &format!("Event {reason} on {ns}/{name}"), || async {
        events_for(client, ns, name)
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason))
    })
    .await
}

#[test]
fn service_fip_lifecycle() {
    lab::run(|| async {
        baton_testbed::init_tracing();
        let (_cp, client) = common::control_plane_with_controllers().await;
        // FIPs an operator reserved for this cluster's Services (tagged cluster=<uid>).
        let uid = common::cluster_uid(&client).await;
        let topology = Topology {
            floating_ips: ["203.0.113.200", "203.0.113.201", "203.0.113.202"]
                .iter()
                .map(|a| common::reserved_fip(a, &[("cluster", uid.as_str())]))
                .collect(),
            ..Topology::default()
        };
        let sim = common::sim(Faults::none(), topology).await;
        let env = common::env_for(&sim, &[("CHERRY_REGION_NAME", "LT-Siauliai")]);
        let ctx = common::context(client.clone(), &env).await;
        let cluster = ctx.cluster_id.clone();
        namespace(&client, "apps").await;
        let api: Api<Service> = Api::namespaced(client.clone(), "apps");
        let pp = PostParams::default();

        // Bring-your-own IP (spec and annotation), this cluster's FIPs; an address outside the
        // project; untouched: opt-out, ClusterIP, control-plane.
        let mut byo = lb_service("apps", "byo", &[]);
        byo.spec.as_mut().unwrap().load_balancer_ip = Some("203.0.113.200".into());
        api.create(&pp, &byo).await.unwrap();
        api.create(
            &pp,
            &lb_service("apps", "byo-ann", &[(METALLB_IPS_ANNOTATION, "203.0.113.201")]),
        )
        .await
        .unwrap();
        let mut outside = lb_service("apps", "outside", &[]);
        outside.spec.as_mut().unwrap().load_balancer_ip = Some("192.0.2.200".into());
        api.create(&pp, &outside).await.unwrap();
        api.create(
            &pp,
            &lb_service(
                "apps",
                "opted-out",
                &[("cherryservers.com/loadbalancer-managed", "false")],
            ),
        )
        .await
        .unwrap();
        let mut cluster_ip = lb_service("apps", "plain", &[]);
        cluster_ip.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        api.create(&pp, &cluster_ip).await.unwrap();
        let mut cp_endpoint = lb_service("apps", "api", &[("baton.dev/control-plane-endpoint", "true")]);
        cp_endpoint.spec.as_mut().unwrap().load_balancer_ip = Some("203.0.113.250".into());
        api.create(&pp, &cp_endpoint).await.unwrap();
        let mut cp_endpoint_no_ip =
            lb_service("apps", "api-int", &[("baton.dev/control-plane-endpoint", "true")]);
        cp_endpoint_no_ip.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 6443;
        api.create(&pp, &cp_endpoint_no_ip).await.unwrap();

        // Managed.
        api.create(&pp, &lb_service("apps", "web", &[])).await.unwrap();
        let stop = start(ctx.clone());

        let web = wait_ingress(&api, "web").await;
        let address = ingress(&web).unwrap();
        assert!(web.finalizers().iter().any(|f| f == FINALIZER));
        let annotations = web.annotations();
        assert_eq!(annotations[METALLB_IPS_ANNOTATION], address);
        assert_eq!(annotations[FIP_ADDRESS_ANNOTATION], address);
        let fips = service_fips(&sim).await;
        assert_eq!(fips.len(), 1, "one FIP: {fips:?}");
        assert_eq!(fips[0].address.to_string(), address);
        assert_eq!(annotations[FIP_ID_ANNOTATION], fips[0].id.to_string());
        assert_eq!(fips[0].tags, service_fip_tags("apps", "web", &cluster));
        assert_eq!(fips[0].region.as_ref().unwrap().slug, "LT-Siauliai");
        assert!(fips[0].target().is_none(), "a Service FIP is never targeted");
        wait_event(&client, "apps", "web", "FloatingIPReserved").await;

        // Bring-your-own IP: no FIP, no finalizer, no record; the ingress shows the address,
        // as the Cherry CCM sets it.
        for (name, want) in [("byo", "203.0.113.200"), ("byo-ann", "203.0.113.201")] {
            let s = wait_ingress(&api, name).await;
            assert_eq!(ingress(&s).as_deref(), Some(want), "{name}");
            assert!(
                s.finalizers().is_empty(),
                "{name} has finalizers {:?}",
                s.finalizers()
            );
            assert!(
                !s.annotations().contains_key(FIP_ID_ANNOTATION),
                "{name} was annotated"
            );
        }

        // An address that is not this cluster's: a Warning Event naming the field, the address
        // and the rule, and nothing else.
        let refused = wait_event(&client, "apps", "outside", "AddressNotInProject").await;
        assert_eq!(refused.type_.as_deref(), Some("Warning"));
        let text = refused.message.unwrap();
        assert!(text.contains("spec.loadBalancerIP 192.0.2.200"), "{text}");

        // The untouched ones are as they were, a moment after the managed one converged.
        tokio::time::sleep(Duration::from_secs(2)).await;
        for name in ["opted-out", "plain", "api", "api-int", "outside"] {
            let s = get(&api, name).await.unwrap();
            assert!(
                s.finalizers().is_empty(),
                "{name} has finalizers {:?}",
                s.finalizers()
            );
            assert!(
                !s.annotations().contains_key(FIP_ID_ANNOTATION),
                "{name} was annotated"
            );
            assert!(ingress(&s).is_none(), "{name} got an ingress");
        }
        assert_eq!(service_fips(&sim).await.len(), 1, "no FIP for untouched Services");

        // Economy: one write (the POST) for one Service.
        let stats = sim.stats();
        assert_eq!(stats.writes, 1, "{stats:?}");
        assert_eq!(stats.route("POST /v1/projects/{id}/ips"), 1);

        // The record is lost (annotations removed): the FIP is found again by its tags.
        let wipe = serde_json::json!({"metadata": {"annotations": {
            FIP_ID_ANNOTATION: null, FIP_ADDRESS_ANNOTATION: null, METALLB_IPS_ANNOTATION: null,
        }}});
        api.patch("web", &PatchParams::default(), &Patch::Merge(&wipe))
            .await
            .unwrap();
        let restored = eventually(WAIT, "the record restored", || async {
            get(&api, "web")
                .await
                .filter(|s| s.annotations().get(FIP_ID_ANNOTATION) == Some(&fips[0].id.to_string()))
        })
        .await;
        assert_eq!(restored.annotations()[METALLB_IPS_ANNOTATION], address);
        // ... also by a controller that starts afresh (empty cache).
        stop.send(true).unwrap();
        api.patch("web", &PatchParams::default(), &Patch::Merge(&wipe))
            .await
            .unwrap();
        let ctx2 = common::context(client.clone(), &env).await;
        let stop = start(ctx2);
        eventually(WAIT, "the record restored after a restart", || async {
            get(&api, "web")
                .await
                .filter(|s| s.annotations().get(FIP_ID_ANNOTATION) == Some(&fips[0].id.to_string()))
        })
        .await;
        assert_eq!(
            sim.stats().route("POST /v1/projects/{id}/ips"),
            1,
            "never created twice"
        );

        // Switching to an address that is not this cluster's takes nothing away: a Warning, and
        // the Service keeps its FIP.
        api.create(&pp, &lb_service("apps", "switch", &[])).await.unwrap();
        let own = ingress(&wait_ingress(&api, "switch").await).unwrap();
        assert_eq!(service_fips(&sim).await.len(), 2);
        let to_foreign =
            serde_json::json!({"metadata": {"annotations": {METALLB_IPS_ANNOTATION: "192.0.2.77"}}});
        api.patch("switch", &PatchParams::default(), &Patch::Merge(&to_foreign))
            .await
            .unwrap();
        let kept = wait_event(&client, "apps", "switch", "AddressNotInProject").await;
        assert!(
            kept.message
                .unwrap()
                .contains(&format!("keeps its Floating IP {own}")),
            "the Event says the FIP is kept"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(service_fips(&sim).await.len(), 2, "nothing released");
        assert_eq!(ingress(&get(&api, "switch").await.unwrap()), Some(own));

        // Switching to bring-your-own (this cluster's FIP) releases baton's FIP.
        let to_byo =
            serde_json::json!({"metadata": {"annotations": {METALLB_IPS_ANNOTATION: "203.0.113.202"}}});
        api.patch("switch", &PatchParams::default(), &Patch::Merge(&to_byo))
            .await
            .unwrap();
        eventually(
            WAIT,
            "the FIP of a Service switched to its own IP released",
            || async { (service_fips(&sim).await.len() == 1).then_some(()) },
        )
        .await;
        let switched = eventually(WAIT, "record dropped", || async {
            get(&api, "switch")
                .await
                .filter(|s| !s.annotations().contains_key(FIP_ID_ANNOTATION))
        })
        .await;
        assert_eq!(switched.annotations()[METALLB_IPS_ANNOTATION], "203.0.113.202");
        eventually(WAIT, "the ingress shows the Service's own IP", || async {
            get(&api, "switch")
                .await
                .filter(|s| ingress(s).as_deref() == Some("203.0.113.202"))
        })
        .await;

        // A Service that stops being a LoadBalancer gives its FIP back and loses the finalizer.
        api.create(&pp, &lb_service("apps", "shrink", &[])).await.unwrap();
        wait_ingress(&api, "shrink").await;
        assert_eq!(service_fips(&sim).await.len(), 2);
        let to_cluster_ip = serde_json::json!({"spec": {"type": "ClusterIP"}});
        api.patch("shrink", &PatchParams::default(), &Patch::Merge(&to_cluster_ip))
            .await
            .unwrap();
        eventually(WAIT, "the FIP of a Service turned ClusterIP released", || async {
            let s = get(&api, "shrink").await?;
            (service_fips(&sim).await.len() == 1 && s.finalizers().is_empty()).then_some(())
        })
        .await;

        // Delete: the FIP is released before the Service goes.
        api.delete("web", &DeleteParams::default()).await.unwrap();
        eventually(WAIT, "web gone", || async {
            get(&api, "web").await.is_none().then_some(())
        })
        .await;
        assert!(
            service_fips(&sim).await.is_empty(),
            "the FIP went with the Service"
        );
        assert_eq!(sim.stats().route("DELETE /v1/ips/{id}"), 3);
        stop.send(true).unwrap();
    });
}

#[test]
fn region_errors_are_events_and_others_proceed() {
    lab::run(|| async {
        baton_testbed::init_tracing();
        let (_cp, client) = common::control_plane_with_controllers().await;
        let sim = common::sim(Faults::none(), Topology::default()).await;
        // No global region: the annotation decides.
        let env = common::env_for(&sim, &[]);
        let ctx = common::context(client.clone(), &env).await;
        namespace(&client, "apps").await;
        let api: Api<Service> = Api::namespaced(client.clone(), "apps");
        let pp = PostParams::default();
        let region = "cherryservers.com/fip-region";
        api.create(&pp, &lb_service("apps", "no-region", &[]))
            .await
            .unwrap();
        api.create(&pp, &lb_service("apps", "atlantis", &[(region, "Atlantis")]))
            .await
            .unwrap();
        api.create(
            &pp,
            &lb_service("apps", "bad-ip", &[(METALLB_IPS_ANNOTATION, "300.1.2.3")]),
        )
        .await
        .unwrap();
        api.create(&pp, &lb_service("apps", "good", &[(region, "LT-Siauliai")]))
            .await
            .unwrap();
        let _stop = start(ctx);

        wait_ingress(&api, "good").await;
        let missing = wait_event(&client, "apps", "no-region", "NoRegion").await;
        assert_eq!(missing.type_.as_deref(), Some("Warning"));
        assert!(
            missing.message.as_deref().unwrap().contains(region),
            "{missing:?}"
        );
        let unknown = wait_event(&client, "apps", "atlantis", "FloatingIPRejected").await;
        let text = unknown.message.unwrap();
        assert!(text.contains(region) && text.contains("Atlantis"), "{text}");
        let bad = wait_event(&client, "apps", "bad-ip", "InvalidAnnotation").await;
        let text = bad.message.unwrap();
        assert!(
            text.contains(METALLB_IPS_ANNOTATION) && text.contains("300.1.2.3"),
            "{text}"
        );
        assert_eq!(
            service_fips(&sim).await.len(),
            1,
            "only the good Service has a FIP"
        );
        assert!(get(&api, "bad-ip").await.unwrap().finalizers().is_empty());

        // Fixing the annotation lets it proceed; deleting a Service that never got a FIP works.
        let fix = serde_json::json!({"metadata": {"annotations": {region: "LT-Siauliai"}}});
        api.patch("atlantis", &PatchParams::default(), &Patch::Merge(&fix))
            .await
            .unwrap();
        wait_ingress(&api, "atlantis").await;
        api.delete("no-region", &DeleteParams::default()).await.unwrap();
        eventually(WAIT, "no-region gone", || async {
            get(&api, "no-region").await.is_none().then_some(())
        })
        .await;
        assert_eq!(service_fips(&sim).await.len(), 2);
    });
}

/// Nothing irreversible on one signal, with the default grace period (10 minutes): a garbled IP
/// annotation is a Warning Event and the FIP stays; a Service deleted and re-created, or turned
/// ClusterIP and back, within the grace period keeps the same FIP (no new reservation); a Service
/// annotated `baton.dev/fip-release-grace-period: "0"` gives it back at once, and a short grace
/// period of its own ends in a release.
#[test]
fn a_typo_or_a_quick_recreate_never_loses_the_fip() {
    lab::run(|| async {
        baton_testbed::init_tracing();
        let (_cp, client) = common::control_plane_with_controllers().await;
        let sim = common::sim(Faults::none(), Topology::default()).await;
        let env = common::env_for(
            &sim,
            &[
                ("CHERRY_REGION_NAME", "LT-Siauliai"),
                ("BATON_FIP_RELEASE_GRACE_PERIOD", "10m"),
            ],
        );
        let ctx = common::context(client.clone(), &env).await;
        namespace(&client, "apps").await;
        let api: Api<Service> = Api::namespaced(client.clone(), "apps");
        let pp = PostParams::default();
        api.create(&pp, &lb_service("apps", "web", &[])).await.unwrap();
        let _stop = start(ctx);
        let address = ingress(&wait_ingress(&api, "web").await).unwrap();
        let creates = || sim.stats().route("POST /v1/projects/{id}/ips");
        let fip_addresses = || async {
            service_fips(&sim)
                .await
                .iter()
                .map(|f| f.address.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(creates(), 1);

        // A typo in the IP annotation: a Warning Event naming it; the FIP and the ingress stay.
        let typo = format!("{address}x");
        let garble = serde_json::json!({"metadata": {"annotations": {METALLB_IPS_ANNOTATION: typo}}});
        api.patch("web", &PatchParams::default(), &Patch::Merge(&garble))
            .await
            .unwrap();
        let warning = wait_event(&client, "apps", "web", "InvalidAnnotation").await;
        assert_eq!(warning.type_.as_deref(), Some("Warning"));
        let text = warning.message.unwrap();
        assert!(
            text.contains(METALLB_IPS_ANNOTATION) && text.contains(&typo),
            "{text}"
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(fip_addresses().await, vec![address.clone()], "the FIP is kept");
        let web = get(&api, "web").await.unwrap();
        assert_eq!(ingress(&web).as_deref(), Some(address.as_str()));
        assert!(web.finalizers().iter().any(|f| f == FINALIZER));
        assert_eq!(sim.stats().route("DELETE /v1/ips/{id}"), 0);
        // Fixed: as before.
        let fix = serde_json::json!({"metadata": {"annotations": {METALLB_IPS_ANNOTATION: address}}});
        api.patch("web", &PatchParams::default(), &Patch::Merge(&fix))
            .await
            .unwrap();

        // Deleted: the Service goes at once (the finalizer does not wait out the grace period),
        // the FIP stays reserved, and an Event says until when.
        api.delete("web", &DeleteParams::default()).await.unwrap();
        eventually(WAIT, "web gone", || async {
            get(&api, "web").await.is_none().then_some(())
        })
        .await;
        let held = wait_event(&client, "apps", "web", "FloatingIPHeld").await;
        assert!(held.message.unwrap().contains(GRACE_ANNOTATION));
        assert_eq!(fip_addresses().await, vec![address.clone()], "held, not released");
        // Re-created within the grace period: the same address, no new reservation.
        api.create(&pp, &lb_service("apps", "web", &[])).await.unwrap();
        let back = wait_ingress(&api, "web").await;
        assert_eq!(ingress(&back).as_deref(), Some(address.as_str()), "the same FIP");
        assert_eq!(creates(), 1, "no new FIP was reserved");

        // Turned ClusterIP and back: the same.
        let to_cluster_ip = serde_json::json!({"spec": {"type": "ClusterIP"}});
        api.patch("web", &PatchParams::default(), &Patch::Merge(&to_cluster_ip))
            .await
            .unwrap();
        eventually(
            WAIT,
            "the finalizer removed from the ClusterIP Service",
            || async {
                get(&api, "web")
                    .await
                    .filter(|s| s.finalizers().is_empty())
                    .map(|_| ())
            },
        )
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(fip_addresses().await, vec![address.clone()], "held, not released");
        let to_lb = serde_json::json!({"spec": {"type": "LoadBalancer"}});
        api.patch("web", &PatchParams::default(), &Patch::Merge(&to_lb))
            .await
            .unwrap();
        eventually(WAIT, "the same FIP back on the LoadBalancer", || async {
            get(&api, "web")
                .await
                .filter(|s| ingress(s).as_deref() == Some(address.as_str()) && !s.finalizers().is_empty())
        })
        .await;
        assert_eq!(creates(), 1);
        assert_eq!(
            sim.stats().route("DELETE /v1/ips/{id}"),
            0,
            "nothing released so far"
        );

        // Asked explicitly: released at once, before the Service goes.
        let now = serde_json::json!({"metadata": {"annotations": {GRACE_ANNOTATION: "0"}}});
        api.patch("web", &PatchParams::default(), &Patch::Merge(&now))
            .await
            .unwrap();
        api.delete("web", &DeleteParams::default()).await.unwrap();
        eventually(WAIT, "web gone", || async {
            get(&api, "web").await.is_none().then_some(())
        })
        .await;
        assert!(fip_addresses().await.is_empty(), "released with the Service");
        wait_event(&client, "apps", "web", "FloatingIPReleased").await;

        // A short grace period of its own: held, then released when it ends.
        api.create(&pp, &lb_service("apps", "brief", &[(GRACE_ANNOTATION, "3s")]))
            .await
            .unwrap();
        wait_ingress(&api, "brief").await;
        api.delete("brief", &DeleteParams::default()).await.unwrap();
        eventually(WAIT, "brief gone", || async {
            get(&api, "brief").await.is_none().then_some(())
        })
        .await;
        let gone = tokio::time::Instant::now();
        assert_eq!(fip_addresses().await.len(), 1, "held for its 3 s");
        eventually(WAIT, "brief's FIP released after its grace period", || async {
            fip_addresses().await.is_empty().then_some(())
        })
        .await;
        assert!(
            gone.elapsed() >= Duration::from_secs(2),
            "released {:?} after the Service went",
            gone.elapsed()
        );
    });
}
