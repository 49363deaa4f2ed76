//! Fencing at the write, over real HTTP against the simulator: a fenced handle sends no write
//! after its deadline, first try or retry, and reads are never fenced.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a failure is a test failure

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use baton_cloud::model::{CreateIpRequest, IpAddress, IpId, ServerId};
use baton_cloud::tags::service_fip_tags;
use baton_cloud::{CherryClient, Cloud, CloudError, Fence, InFlight, Lead, Op, Priority};
use baton_sim::{Faults, LogEntry, RouteFaults, SimHandle};
use tokio::sync::watch;
use tokio::time::Instant;

/// The local simulator's arrival times are relative to its start, which happened before this
/// instant: `started + at_ms` is a late bound of when a request arrived (plus 1 ms rounding).
struct Sim {
    handle: SimHandle,
    started_by: Instant,
}

impl Sim {
    async fn start(faults: Faults) -> Self {
        let handle = common::sim(faults).await;
        Self {
            handle,
            started_by: Instant::now(),
        }
    }

    /// Arrival (late bound) of a logged request.
    fn arrived(&self, e: &LogEntry) -> Instant {
        self.started_by + Duration::from_millis(e.at_ms + 1)
    }

    /// The API writes the simulator received.
    fn writes(&self) -> Vec<LogEntry> {
        self.handle
            .log(0)
            .into_iter()
            .filter(|e| e.path.starts_with("/v1/") && e.method != "GET")
            .collect()
    }
}

/// Localhost transit from "sent" to "arrived" (the simulator shares the test's two runtime
/// threads): a send that starts right before the deadline may be logged a little after it. A
/// retry that slept through the deadline would arrive up to a Retry-After (1 s) later.
const TRANSIT: Duration = Duration::from_millis(50);

fn fip_request(name: &str) -> CreateIpRequest {
    CreateIpRequest {
        region: "LT-Siauliai".into(),
        tags: service_fip_tags("default", name, "cluster-uid-1"),
        ..Default::default()
    }
}

fn fence(deadline: Option<Instant>) -> Arc<dyn Fence> {
    Arc::new(deadline)
}

/// A FIP made by an unfenced client of its own (its own rate gate).
async fn make_fip(sim: &Sim, name: &str) -> IpAddress {
    common::client(&sim.handle, None)
        .create_ip(fip_request(name))
        .await
        .unwrap()
}

/// A simulator allowing one request per second, then answering 429 with `Retry-After: 3`; a
/// FIP whose creation took this second's token; a client that honours a `Retry-After` up to 8 s
/// (backoff cap 2 s).
async fn retry_after_3s() -> (Sim, IpAddress, CherryClient) {
    let sim = Sim::start(Faults {
        rate_limit: Some(1.0),
        retry_after_secs: Some(3),
        ..Faults::none()
    })
    .await;
    let fip = make_fip(&sim, "api").await;
    let mut cfg = common::config(&sim.handle, None);
    cfg.backoff_cap = Duration::from_secs(2);
    (sim, fip, CherryClient::new(cfg).unwrap())
}

fn assert_fenced_untouched(err: &CloudError, op: Op) {
    assert!(err.is_fenced(), "{op}: {err}");
    assert_eq!(err.op(), Some(op));
    assert_eq!(err.category(), "fenced");
    assert!(!err.is_retryable());
    assert!(!err.outcome_unknown(), "{op}: nothing was sent");
    assert!(
        err.to_string()
            .contains("not sent: this replica's leadership ended (fenced)"),
        "{err}"
    );
}

#[tokio::test]
async fn a_write_whose_deadline_passed_sends_nothing() {
    let sim = Sim::start(Faults::none()).await;
    let fip = make_fip(&sim, "api").await;
    let before = sim.handle.stats().writes;
    let client = common::client(&sim.handle, Some(50.0));
    for deadline in [None, Some(Instant::now())] {
        for priority in [Priority::Urgent, Priority::Normal] {
            let c = client.with_priority(priority).fenced(fence(deadline));
            let cp = ServerId(600_101);
            assert_fenced_untouched(&c.retarget_ip(&fip.id, cp).await.unwrap_err(), Op::RetargetIp);
            assert_fenced_untouched(&c.unassign_ip(&fip.id).await.unwrap_err(), Op::UnassignIp);
            assert_fenced_untouched(&c.delete_ip(&fip.id).await.unwrap_err(), Op::DeleteIp);
            assert_fenced_untouched(&c.create_ip(fip_request("new")).await.unwrap_err(), Op::CreateIp);
            assert_fenced_untouched(&c.enable_project_bgp().await.unwrap_err(), Op::EnableProjectBgp);
            assert_fenced_untouched(
                &c.update_server_bgp(cp, true).await.unwrap_err(),
                Op::UpdateServerBgp,
            );
        }
    }
    assert_eq!(
        sim.handle.stats().writes,
        before,
        "a fenced write reached the API"
    );
    assert!(
        sim.writes().iter().all(|e| e.method == "POST"),
        "only the setup's create"
    );
    // The FIP is as it was, and no second one exists.
    let truth = common::client(&sim.handle, None).ips().await.unwrap();
    assert_eq!(truth.iter().filter(|i| i.has_tags(&fip.tags)).count(), 1);
    assert!(!truth.iter().any(|i| i.has_tags(&fip_request("new").tags)));
}

#[tokio::test]
async fn an_urgent_write_gives_up_rather_than_wait_out_retry_after_past_its_lease() {
    let (sim, fip, client) = retry_after_3s().await;

    let start = Instant::now();
    let deadline = start + Duration::from_millis(1500);
    let urgent = client
        .with_priority(Priority::Urgent)
        .fenced(fence(Some(deadline)));
    let err = urgent.retarget_ip(&fip.id, ServerId(600_101)).await.unwrap_err();
    let gave_up = Instant::now();
    assert!(err.is_fenced(), "{err}");
    assert!(
        gave_up < deadline,
        "gave up {:?} after the start, not at once",
        gave_up - start
    );
    let CloudError::Fenced {
        after: Some(last), ..
    } = &err
    else {
        panic!("the 429 is not named: {err:?}");
    };
    assert_eq!(last.status(), Some(429));
    assert!(err.to_string().contains("API error 429"), "{err}");
    assert!(!err.outcome_unknown(), "a 429 is a refusal");

    // A client that waited would retry 3 s after the 429: nothing comes.
    tokio::time::sleep_until(start + Duration::from_millis(3500)).await;
    let writes: Vec<_> = sim.writes().into_iter().filter(|e| e.method == "PUT").collect();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].status, 429);
    for e in &writes {
        assert!(
            sim.arrived(e) <= deadline,
            "a write arrived after the deadline: {e:?}"
        );
    }
    assert_eq!(sim.handle.peek_ip(&fip.id.0).unwrap().target(), None);
}

/// Publishes "leader until now + 300 ms" every 100 ms until `stop` fires; returns the last
/// deadline published (and drops the sender: receivers keep that value).
fn renewing_lease(
    stop: tokio::sync::oneshot::Receiver<()>,
) -> (watch::Receiver<Option<Lead>>, tokio::task::JoinHandle<Instant>) {
    let first = Instant::now() + Duration::from_millis(300);
    let (tx, rx) = watch::channel(Some(Lead {
        term: 1,
        until: first,
    }));
    let task = tokio::spawn(async move {
        let mut last = first;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => return last,
                _ = tick.tick() => {
                    last = Instant::now() + Duration::from_millis(300);
                    tx.send_replace(Some(Lead { term: 1, until: last }));
                }
            }
        }
    });
    (rx, task)
}

/// Moves `id` back and forth `times` times (`None`: until an error); returns the moves made
/// and the error that ended it.
async fn move_fip(c: CherryClient, id: IpId, times: Option<u32>) -> (u32, Option<CloudError>) {
    let mut done = 0u32;
    while times.is_none_or(|n| done < n) {
        let server = ServerId(600_101 + u64::from(done % 3));
        match c.retarget_ip(&id, server).await {
            Ok(ip) => {
                assert_eq!(ip.target(), Some(server));
                done += 1;
            }
            Err(e) => return (done, Some(e)),
        }
    }
    (done, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn normal_writes_ride_out_a_429_storm_while_the_lease_is_renewed_and_stop_with_it() {
    const WRITERS: usize = 6;
    let sim = Sim::start(Faults::none()).await;
    let mut fips = Vec::new();
    for i in 0..WRITERS {
        fips.push(make_fip(&sim, &format!("svc-{i}")).await.id);
    }
    // Four requests per second per address, Retry-After: 1 (longer than the 300 ms the lease
    // is ahead); the client does not limit itself, so its writers storm the API.
    sim.handle
        .set_faults(Faults {
            rate_limit: Some(4.0),
            retry_after_secs: Some(1),
            ..Faults::none()
        })
        .unwrap();
    let mut cfg = common::config(&sim.handle, None);
    cfg.backoff_cap = Duration::from_secs(1);
    cfg.max_retries = 30;
    let client = CherryClient::new(cfg).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let (lease, renewer) = renewing_lease(stopped);
    let fenced = client.fenced(Arc::new(lease));

    // 1. While the lease is renewed, every write gets through, sleeping past deadlines that
    //    renewals then extend.
    let mut writers = Vec::new();
    for id in &fips {
        writers.push(tokio::spawn(move_fip(fenced.clone(), id.clone(), Some(2))));
    }
    for w in writers {
        let (done, err) = w.await.unwrap();
        assert_eq!(done, 2, "ended with {err:?}");
    }
    // Six at once against a burst of four: at least two were refused and waited out a
    // Retry-After (1 s) longer than the lease was ahead (300 ms) at the time.
    let limited = sim.handle.stats().rate_limited;
    assert!(limited >= 2, "no 429 storm: {limited} 429s");

    // 2. Writers go on until the renewals stop: each is then fenced, and no write arrives
    //    after the last deadline published.
    let mut writers = Vec::new();
    for id in &fips {
        writers.push(tokio::spawn(move_fip(fenced.clone(), id.clone(), None)));
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    stop.send(()).unwrap();
    let last_deadline = renewer.await.unwrap();
    for w in writers {
        let (_, err) = w.await.unwrap();
        let err = err.unwrap();
        assert!(err.is_fenced(), "ended with {err}, not fenced");
    }
    let ended = Instant::now();
    assert!(ended >= last_deadline, "fenced before the lease ended");
    for e in sim.writes() {
        assert!(
            sim.arrived(&e) <= last_deadline + TRANSIT,
            "a write arrived {:?} after the last deadline: {e:?}",
            sim.arrived(&e) - last_deadline
        );
    }
    // And nothing trickles in later (a retry that slept through the deadline).
    let seen = sim.writes().len();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        sim.writes().len(),
        seen,
        "a write arrived after its writer was fenced"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_queued_behind_the_rate_gate_gives_up_at_its_deadline() {
    let sim = Sim::start(Faults::none()).await;
    let fip = make_fip(&sim, "api").await;
    // One grant per second: three reads take t=0, 1 s and 2 s.
    let client = common::client(&sim.handle, Some(1.0));
    let start = Instant::now();
    let mut reads = Vec::new();
    for _ in 0..3 {
        let c = client.clone();
        reads.push(tokio::spawn(async move {
            c.server(ServerId(600_101)).await.unwrap();
            Instant::now()
        }));
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await; // the reads are queued first
    let deadline = start + Duration::from_millis(1500);
    let err = client
        .fenced(fence(Some(deadline)))
        .retarget_ip(&fip.id, ServerId(600_101))
        .await
        .unwrap_err();
    let gave_up = Instant::now();
    assert_fenced_untouched(&err, Op::RetargetIp);
    assert!(
        gave_up >= deadline && gave_up < deadline + Duration::from_millis(500),
        "gave up {:?} after the start",
        gave_up - start
    );
    let mut done = Vec::new();
    for r in reads {
        done.push(r.await.unwrap() - start);
    }
    // The abandoned place did not hold the queue up, and the write never left.
    assert!(done.iter().all(|d| *d < Duration::from_millis(2500)), "{done:?}");
    let after_reads = Instant::now();
    client.server(ServerId(600_102)).await.unwrap();
    assert!(
        Instant::now() - after_reads < Duration::from_millis(1100),
        "the gate kept a slot for the fenced write"
    );
    assert_eq!(sim.handle.stats().route("PUT /v1/ips/{id}"), 0);
    assert_eq!(sim.handle.peek_ip(&fip.id.0).unwrap().target(), None);
}

#[tokio::test]
async fn reads_through_a_fenced_handle_work_without_leadership() {
    let sim = Sim::start(Faults::none()).await;
    let fip = make_fip(&sim, "api").await;
    let follower = common::client(&sim.handle, None)
        .with_priority(Priority::Urgent)
        .fenced(fence(None));
    follower.project().await.unwrap();
    follower.server(ServerId(600_101)).await.unwrap();
    assert!(!follower.servers().await.unwrap().is_empty());
    assert!(follower.ips().await.unwrap().iter().any(|i| i.id == fip.id));
    assert_eq!(follower.ip(&fip.id).await.unwrap().id, fip.id);
    assert!(!follower.regions().await.unwrap().is_empty());
    let found = follower.find_ip_by_tags(&fip.tags).await.unwrap().unwrap();
    assert_eq!(found.id, fip.id);
    // Creating what exists is a look-up: nothing is written, so nothing is fenced.
    assert_eq!(follower.create_ip(fip_request("api")).await.unwrap().id, fip.id);
    assert_eq!(sim.handle.stats().writes, 1, "only the setup's create");
}

/// A create whose POST fails with 503 (taking effect or not, `lost`), by an urgent handle whose
/// lease ends before the retry: it gives up without a second POST, and the next leader's
/// create finds or makes exactly one FIP.
async fn fenced_create_after_an_unknown_outcome(lost: bool) {
    let sim = Sim::start(Faults::none()).await;
    let mut cfg = common::config(&sim.handle, None);
    cfg.backoff_base = Duration::from_secs(1); // the retry would wait 0.5..1 s
    cfg.backoff_cap = Duration::from_secs(2);
    let client = CherryClient::new(cfg).unwrap();
    client.ips().await.unwrap(); // the look-up before the POST reads this cached list
    sim.handle
        .set_faults(Faults {
            error_rate: 1.0,
            error_statuses: vec![503],
            lost_response_ratio: if lost { 1.0 } else { 0.0 },
            non_json_ratio: 0.0,
            ..Faults::none()
        })
        .unwrap();
    let deadline = Instant::now() + Duration::from_millis(300);
    let old_leader = client
        .with_priority(Priority::Urgent)
        .fenced(fence(Some(deadline)));
    let err = old_leader.create_ip(fip_request("api")).await.unwrap_err();
    assert!(err.is_fenced(), "{err}");
    assert!(err.outcome_unknown(), "the 503'd POST may have created it: {err}");
    assert!(Instant::now() < deadline, "gave up at once");
    assert_eq!(sim.handle.stats().route("POST /v1/projects/{id}/ips"), 1);

    sim.handle.set_faults(Faults::none()).unwrap();
    let new_leader = client.fenced(fence(Some(Instant::now() + Duration::from_secs(30))));
    let fip = new_leader.create_ip(fip_request("api")).await.unwrap();
    let posts = sim.handle.stats().route("POST /v1/projects/{id}/ips");
    assert_eq!(
        posts,
        if lost { 1 } else { 2 },
        "found by its tags, or created once"
    );
    let truth = common::client(&sim.handle, None).ips().await.unwrap();
    assert_eq!(
        truth.iter().filter(|i| i.has_tags(&fip.tags)).count(),
        1,
        "a duplicate"
    );
    let old_post = &sim.writes()[0];
    assert_eq!(old_post.status, 503);
    assert!(sim.arrived(old_post) <= deadline, "{old_post:?}");
}

#[tokio::test]
async fn a_fenced_create_whose_post_took_effect_leaves_no_duplicate() {
    fenced_create_after_an_unknown_outcome(true).await;
}

#[tokio::test]
async fn a_fenced_create_whose_post_failed_creates_once_later() {
    fenced_create_after_an_unknown_outcome(false).await;
}

/// A lease whose term the test ends or changes: published on a watch channel, as the
/// controller's lease task does.
fn term_lease(term: u64, ahead: Duration) -> (watch::Sender<Option<Lead>>, Arc<dyn Fence>) {
    let (tx, rx) = watch::channel(Some(Lead {
        term,
        until: Instant::now() + ahead,
    }));
    (tx, Arc::new(rx))
}

/// A Normal write sleeping out a `Retry-After` (3 s) when its term ends (`next: None`) or
/// changes (`next: Some(2)`, lost and won again at once): it is dropped at that moment, nothing
/// of it reaches the API afterwards, and its error is Fenced naming the 429.
async fn a_write_held_past_its_term_is_not_sent(next: Option<u64>) {
    let (sim, fip, client) = retry_after_3s().await;
    // A term renewed well ahead: the write would wait out the Retry-After and go.
    let (lease, fence) = term_lease(1, Duration::from_secs(30));
    let writer = tokio::spawn({
        let c = client.fenced(fence);
        let id = fip.id.clone();
        async move { c.retarget_ip(&id, ServerId(600_101)).await }
    });
    // The first PUT is refused with 429 and the writer sleeps its Retry-After.
    let refused = async {
        while sim.handle.stats().route("PUT /v1/ips/{id}") == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), refused)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let changed_at = Instant::now();
    lease.send_replace(next.map(|term| Lead {
        term,
        until: Instant::now() + Duration::from_secs(30),
    }));
    let err = writer.await.unwrap().unwrap_err();
    let dropped_at = Instant::now();
    assert!(err.is_fenced(), "{err}");
    let CloudError::Fenced {
        after: Some(last), ..
    } = &err
    else {
        panic!("the 429 is not named: {err:?}");
    };
    assert_eq!(last.status(), Some(429));
    assert!(
        dropped_at - changed_at < Duration::from_millis(500),
        "dropped {:?} after the term changed, not at once",
        dropped_at - changed_at
    );
    // Past the Retry-After and more: nothing of it came.
    tokio::time::sleep_until(changed_at + Duration::from_secs(4)).await;
    let puts: Vec<_> = sim.writes().into_iter().filter(|e| e.method == "PUT").collect();
    assert_eq!(puts.len(), 1, "{puts:?}");
    assert_eq!(puts[0].status, 429);
    assert!(sim.arrived(&puts[0]) <= changed_at, "{puts:?}");
    assert_eq!(sim.handle.peek_ip(&fip.id.0).unwrap().target(), None);
}

#[tokio::test]
async fn a_write_in_retry_after_is_dropped_when_its_term_ends() {
    a_write_held_past_its_term_is_not_sent(None).await;
}

#[tokio::test]
async fn a_write_in_retry_after_is_dropped_when_a_new_term_begins() {
    a_write_held_past_its_term_is_not_sent(Some(2)).await;
}

#[tokio::test]
async fn a_write_that_began_in_one_term_is_not_sent_in_the_next() {
    let sim = Sim::start(Faults::none()).await;
    let fip = make_fip(&sim, "api").await;
    // One grant per second: a read takes the slot, the write waits in the gate.
    let client = common::client(&sim.handle, Some(1.0));
    client.server(ServerId(600_101)).await.unwrap();
    let (lease, fence) = term_lease(1, Duration::from_secs(30));
    let writer = tokio::spawn({
        let c = client.fenced(fence);
        let id = fip.id.clone();
        async move { c.retarget_ip(&id, ServerId(600_101)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Lost and won again while the write waits for its grant.
    lease.send_replace(Some(Lead {
        term: 2,
        until: Instant::now() + Duration::from_secs(30),
    }));
    let err = writer.await.unwrap().unwrap_err();
    assert_fenced_untouched(&err, Op::RetargetIp);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(sim.handle.stats().route("PUT /v1/ips/{id}"), 0);
}

#[tokio::test]
async fn a_retarget_answered_after_the_lease_deadline_succeeds_and_is_sent_once() {
    let sim = Sim::start(Faults::none()).await;
    let fip = make_fip(&sim, "api").await;
    // The cloud takes 800 ms; it applies the write halfway.
    sim.handle
        .set_faults(Faults {
            latency_ms: 800.into(),
            processing_ratio: 0.5,
            ..Faults::none()
        })
        .unwrap();
    let client = common::client(&sim.handle, None);
    let start = Instant::now();
    // 300 ms of lease left when the failover write leaves: less than the cloud takes.
    let deadline = start + Duration::from_millis(300);
    let urgent = client
        .with_priority(Priority::Urgent)
        .fenced(fence(Some(deadline)));
    let moved = urgent.retarget_ip(&fip.id, ServerId(600_102)).await.unwrap();
    assert!(Instant::now() >= deadline, "answered before the deadline?");
    assert_eq!(moved.target(), Some(ServerId(600_102)));
    let puts: Vec<_> = sim.writes().into_iter().filter(|e| e.method == "PUT").collect();
    assert_eq!(puts.len(), 1, "sent once: {puts:?}");
    assert_eq!(puts[0].status, 200);
    assert!(
        sim.arrived(&puts[0]) <= deadline,
        "sent after the deadline: {puts:?}"
    );
    assert_eq!(
        sim.handle.peek_ip(&fip.id.0).unwrap().target(),
        Some(ServerId(600_102))
    );
}

/// Faults on `PUT`/`DELETE /v1/ips/{id}` only: every answer is lost (503) after the write took
/// effect, or (`late`) answered after the client's request timeout (2 s).
fn lost_answers(late: bool) -> Faults {
    let lost = RouteFaults {
        latency_ms: late.then(|| 2500.into()),
        error_rate: (!late).then_some(1.0),
        lost_response_ratio: Some(1.0),
    };
    Faults {
        error_statuses: vec![503],
        non_json_ratio: 0.0,
        routes: BTreeMap::from([(PUT_IP.to_owned(), lost.clone()), (DELETE_IP.to_owned(), lost)]),
        ..Faults::none()
    }
}

const PUT_IP: &str = "PUT /v1/ips/{id}";
const DELETE_IP: &str = "DELETE /v1/ips/{id}";
const GET_IP: &str = "GET /v1/ips/{id}";

/// A retarget, an unassign and a delete whose answers are lost (or come too late) after they
/// took effect: each is read back and succeeds with that read; none is sent twice.
async fn writes_of_unknown_outcome_are_read_back(late: bool) {
    let sim = Sim::start(Faults::none()).await;
    let fip = make_fip(&sim, "api").await;
    sim.handle.set_faults(lost_answers(late)).unwrap();
    let (_lease, lease) = term_lease(1, Duration::from_secs(60));
    let client = common::client(&sim.handle, None)
        .with_priority(Priority::Urgent)
        .fenced(lease);

    let moved = client.retarget_ip(&fip.id, ServerId(600_103)).await.unwrap();
    assert_eq!(moved.target(), Some(ServerId(600_103)), "the read's answer");
    let stats = sim.handle.stats();
    assert_eq!(stats.route(PUT_IP), 1, "one PUT: the read showed it done");
    assert_eq!(stats.route(GET_IP), 1, "read back once");
    assert_eq!(
        client.cached_ip(&fip.id).await.unwrap().unwrap().target(),
        Some(ServerId(600_103)),
        "the store holds the read"
    );

    let unassigned = client.unassign_ip(&fip.id).await.unwrap();
    assert_eq!(unassigned.target(), None);
    assert_eq!(sim.handle.stats().route(PUT_IP), 2, "one PUT each");

    client.delete_ip(&fip.id).await.unwrap();
    let stats = sim.handle.stats();
    assert_eq!(stats.route(DELETE_IP), 1, "one DELETE: the read found it gone");
    assert!(sim.handle.peek_ip(&fip.id.0).is_none());
    assert!(client.cached_ip(&fip.id).await.unwrap().is_none());
}

#[tokio::test]
async fn writes_whose_answers_are_lost_are_read_back_not_sent_again() {
    writes_of_unknown_outcome_are_read_back(false).await;
}

#[tokio::test]
async fn writes_answered_after_the_timeout_are_read_back_not_sent_again() {
    writes_of_unknown_outcome_are_read_back(true).await;
}

#[tokio::test]
async fn a_write_whose_lost_attempt_did_not_take_effect_is_sent_again_after_the_read() {
    let sim = Sim::start(Faults::none()).await;
    let fip = make_fip(&sim, "api").await;
    // The first PUT fails with 503 before acting (a refusal the client cannot tell from a lost
    // answer); the second gets through.
    sim.handle
        .set_faults(Faults {
            error_rate: 1.0,
            error_statuses: vec![503],
            error_routes: vec![PUT_IP.to_owned()],
            lost_response_ratio: 0.0,
            non_json_ratio: 0.0,
            ..Faults::none()
        })
        .unwrap();
    let (_lease, lease) = term_lease(1, Duration::from_secs(60));
    let mut cfg = common::config(&sim.handle, None);
    // The faults are lifted between the read and the second PUT (0.25..0.5 s later).
    cfg.backoff_base = Duration::from_millis(500);
    cfg.backoff_cap = Duration::from_secs(1);
    let client = CherryClient::new(cfg).unwrap().fenced(lease);
    let writer = tokio::spawn({
        let c = client.clone();
        let id = fip.id.clone();
        async move { c.retarget_ip(&id, ServerId(600_101)).await }
    });
    // The read comes before the second PUT.
    let read_first = async {
        while sim.handle.stats().route(GET_IP) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read_first)
        .await
        .unwrap();
    sim.handle.set_faults(Faults::none()).unwrap();
    let moved = writer.await.unwrap().unwrap();
    assert_eq!(moved.target(), Some(ServerId(600_101)));
    let log: Vec<_> = sim
        .handle
        .log(0)
        .into_iter()
        .filter(|e| e.path.starts_with("/v1/ips/"))
        .map(|e| (e.method, e.status))
        .collect();
    assert!(log.len() >= 3, "{log:?}");
    assert_eq!(
        log[..3],
        [
            ("PUT".to_owned(), 503),
            ("GET".to_owned(), 200),
            ("PUT".to_owned(), 200)
        ],
        "read back before sending again: {log:?}"
    );
}

#[tokio::test]
async fn in_flight_counts_a_slow_write_until_its_answer() {
    let sim = Sim::start(Faults::none()).await;
    let fip = make_fip(&sim, "api").await;
    sim.handle
        .set_faults(Faults {
            routes: BTreeMap::from([(
                PUT_IP.to_owned(),
                RouteFaults {
                    latency_ms: Some(700.into()),
                    ..RouteFaults::default()
                },
            )]),
            ..Faults::none()
        })
        .unwrap();
    let in_flight = InFlight::default();
    let (lease, fence) = term_lease(1, Duration::from_secs(60));
    let client = common::client(&sim.handle, None)
        .fenced(fence)
        .counting(in_flight.clone());
    // Reads are not counted.
    client.ip(&fip.id).await.unwrap();
    assert_eq!(in_flight.count(), 0);
    let start = Instant::now();
    let writer = tokio::spawn({
        let c = client.clone();
        let id = fip.id.clone();
        async move { c.retarget_ip(&id, ServerId(600_101)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(in_flight.count(), 1, "on its way");
    // The term ends meanwhile (a graceful release): the write is still counted until answered.
    lease.send_replace(None);
    assert!(
        !in_flight.settled(Duration::from_millis(100)).await,
        "settled before the answer"
    );
    assert!(in_flight.settled(Duration::from_secs(5)).await);
    let answered = Instant::now();
    assert!(
        answered - start >= Duration::from_millis(700),
        "settled after {:?}, before the answer",
        answered - start
    );
    writer.await.unwrap().unwrap();
    // A write fenced before it left was never counted.
    let err = client.retarget_ip(&fip.id, ServerId(600_102)).await.unwrap_err();
    assert!(err.is_fenced(), "{err}");
    assert_eq!(in_flight.count(), 0);
    assert_eq!(sim.handle.stats().route(PUT_IP), 1);
}

#[tokio::test]
async fn a_create_answered_after_the_lease_deadline_makes_one_fip() {
    let sim = Sim::start(Faults::none()).await;
    let client = common::client(&sim.handle, None);
    client.ips().await.unwrap(); // the look-up before the POST reads this list
    sim.handle
        .set_faults(Faults {
            latency_ms: 800.into(),
            processing_ratio: 0.5,
            ..Faults::none()
        })
        .unwrap();
    let deadline = Instant::now() + Duration::from_millis(300);
    let fip = client
        .fenced(fence(Some(deadline)))
        .create_ip(fip_request("api"))
        .await
        .unwrap();
    assert!(Instant::now() >= deadline, "answered before the deadline?");
    let stats = sim.handle.stats();
    assert_eq!(stats.route("POST /v1/projects/{id}/ips"), 1, "created once");
    assert_eq!(stats.duplicate_fips, 0);
    let posts: Vec<_> = sim.writes();
    assert!(
        sim.arrived(&posts[0]) <= deadline,
        "sent after the deadline: {posts:?}"
    );
    // The next create finds it: the answer went into the store.
    let again = client
        .fenced(fence(Some(Instant::now() + Duration::from_secs(30))))
        .create_ip(fip_request("api"))
        .await
        .unwrap();
    assert_eq!(again.id, fip.id);
    assert_eq!(sim.handle.stats().route("POST /v1/projects/{id}/ips"), 1);
}
