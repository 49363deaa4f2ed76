use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{IpStore, reads};
use crate::model::{IpAddress, IpId, IpType, Tags};
use crate::term::Leadership;

const RESYNC: Duration = Duration::from_secs(60);
const LAG: Duration = Duration::from_secs(2);

fn ip(id: &str, service: &str) -> IpAddress {
    IpAddress {
        id: IpId::from(id),
        address: "203.0.113.1".parse().unwrap(),
        address_family: 4,
        cidr: "203.0.113.1/32".into(),
        gateway: None,
        ip_type: IpType::FloatingIp,
        region: None,
        routed_to: None,
        assigned_to: None,
        targeted_to: None,
        project: None,
        ptr_record: None,
        a_record: None,
        tags: Tags::from([
            ("usage".to_owned(), "u".to_owned()),
            ("service".to_owned(), service.to_owned()),
        ]),
        ddos_scrubbing: false,
        href: String::new(),
        vlan_id: None,
    }
}

fn tags(service: &str) -> Tags {
    Tags::from([("service".to_owned(), service.to_owned())])
}

/// The API's list, as a test sets it; counts list calls.
#[derive(Default)]
struct Api {
    list: Mutex<Vec<IpAddress>>,
    calls: AtomicUsize,
}

impl Api {
    fn set(&self, ips: Vec<IpAddress>) {
        *self.list.lock().unwrap() = ips;
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    async fn fetch(&self) -> Result<Vec<IpAddress>, Infallible> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let list = self.list.lock().unwrap().clone();
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(list)
    }
}

async fn ids(store: &IpStore, api: &Api, lead: Option<&dyn Leadership>) -> Vec<String> {
    store
        .read(lead, || api.fetch(), reads::list)
        .await
        .unwrap()
        .iter()
        .map(|ip| ip.id.to_string())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn concurrent_reads_share_one_list_call() {
    let store = Arc::new(IpStore::new(RESYNC, LAG));
    let api = Arc::new(Api::default());
    api.set(vec![ip("a", "s1")]);
    let mut handles = Vec::new();
    for _ in 0..20 {
        let (store, api) = (Arc::clone(&store), Arc::clone(&api));
        handles.push(tokio::spawn(async move {
            store.read(None, || api.fetch(), reads::list).await.unwrap().len()
        }));
    }
    for h in handles {
        assert_eq!(h.await.unwrap(), 1);
    }
    assert_eq!(api.calls(), 1);
    assert_eq!(store.fetches(), 1);
}

/// After a create of unknown outcome the store needs a list fetched after the list's lag; the
/// readers of that window (every Service's reconcile, the endpoint loop) wait for it and share
/// one list call, instead of each fetching a list too early to serve the requirement.
#[tokio::test(start_paused = true)]
async fn readers_of_a_list_required_from_a_later_moment_share_one_call_at_that_moment() {
    let store = Arc::new(IpStore::new(RESYNC, LAG));
    let api = Arc::new(Api::default());
    api.set(vec![ip("a", "s1")]);
    ids(&store, &api, None).await;
    assert_eq!(api.calls(), 1);

    let from = Instant::now() + LAG;
    store.require_since(from);
    api.set(vec![ip("a", "s1"), ip("b", "s2")]);
    let mut handles = Vec::new();
    for i in 0..10 {
        let (store, api) = (Arc::clone(&store), Arc::clone(&api));
        handles.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150 * i)).await;
            let seen = ids(&store, &api, None).await;
            (Instant::now(), seen)
        }));
    }
    for h in handles {
        let (at, seen) = h.await.unwrap();
        assert!(at >= from, "answered before the list could show the write");
        assert_eq!(seen, ["a", "b"]);
    }
    assert_eq!(api.calls(), 2, "one list call for the ten readers");
}

#[tokio::test(start_paused = true)]
async fn writes_are_applied_in_place_and_never_cause_a_list_call() {
    let store = IpStore::new(RESYNC, LAG);
    let api = Api::default();
    api.set(vec![ip("a", "s1"), ip("b", "s2")]);
    assert_eq!(ids(&store, &api, None).await, ["a", "b"]);
    for i in 0..100 {
        store.upsert(&ip(&format!("n{i}"), &format!("new{i}")));
    }
    store.remove(&IpId::from("a"));
    let mut changed = ip("b", "s2");
    changed.ptr_record = Some("b.example.".into());
    store.upsert(&changed);
    let list = store.read(None, || api.fetch(), reads::list).await.unwrap();
    assert_eq!(list.len(), 101);
    assert_eq!(list[0].id.as_str(), "b", "list order kept");
    assert_eq!(list[0].ptr_record.as_deref(), Some("b.example."));
    let found = store
        .read(None, || api.fetch(), reads::tagged(&tags("new42")))
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id.as_str(), "n42");
    let gone = store
        .read(None, || api.fetch(), reads::get(&IpId::from("a")))
        .await
        .unwrap();
    assert!(gone.is_none());
    assert_eq!(api.calls(), 1, "no list call for any write");

    // The periodic resync replaces the list with the API's (the writes above are older than
    // the list's lag, so the API's list is the truth).
    tokio::time::advance(RESYNC).await;
    assert_eq!(ids(&store, &api, None).await, ["a", "b"]);
    assert_eq!(api.calls(), 2);
}

fn ip_at(id: &str, address: &str) -> IpAddress {
    let mut ip = ip(id, id);
    ip.address = address.parse().unwrap();
    ip
}

#[tokio::test(start_paused = true)]
async fn the_address_index_follows_writes_and_a_replaced_list() {
    let store = IpStore::new(RESYNC, LAG);
    let api = Api::default();
    api.set(vec![ip_at("a", "203.0.113.1"), ip_at("b", "203.0.113.2")]);
    let at = |addresses: &[&str]| -> std::collections::BTreeSet<std::net::IpAddr> {
        addresses.iter().map(|a| a.parse().unwrap()).collect()
    };
    let read_at = |addresses| {
        let (store, api) = (&store, &api);
        async move {
            store
                .read(None, || api.fetch(), reads::at(&addresses))
                .await
                .unwrap()
                .iter()
                .map(|ip| ip.id.to_string())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(read_at(at(&["203.0.113.2", "198.51.100.9"])).await, ["b"]);
    // A write moves an IP's entry: a new address, one removed, one added.
    store.upsert(&ip_at("b", "203.0.113.3"));
    store.remove(&IpId::from("a"));
    store.upsert(&ip_at("c", "203.0.113.1"));
    assert!(read_at(at(&["203.0.113.2"])).await.is_empty());
    assert_eq!(
        read_at(at(&["203.0.113.1", "203.0.113.3"])).await,
        ["b", "c"],
        "list order"
    );
    // The periodic resync replaces the index with the API's list.
    tokio::time::advance(RESYNC).await;
    assert_eq!(
        read_at(at(&["203.0.113.1", "203.0.113.2", "203.0.113.3"])).await,
        ["a", "b"]
    );
    assert_eq!(api.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_list_that_lags_or_overlaps_a_write_keeps_the_write() {
    let store = Arc::new(IpStore::new(RESYNC, LAG));
    let api = Arc::new(Api::default());
    api.set(vec![ip("old", "s0")]);
    ids(&store, &api, None).await;
    store.upsert(&ip("mine", "s1"));
    store.remove(&IpId::from("old"));
    // A resync right after: the API's list does not show either write yet.
    store.require_since(Instant::now());
    assert_eq!(ids(&store, &api, None).await, ["mine"], "both writes kept");
    // A write landing while a list call is under way.
    store.require_since(Instant::now());
    let reading = {
        let (store, api) = (Arc::clone(&store), Arc::clone(&api));
        tokio::spawn(async move { ids(&store, &api, None).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.upsert(&ip("during", "s2"));
    assert_eq!(reading.await.unwrap(), ["mine", "during"]);
    assert_eq!(api.calls(), 3, "the overlapping call was used, not repeated");
    // Past the lag, the API's list is the truth: what it does not show is gone.
    tokio::time::advance(LAG + Duration::from_millis(500)).await;
    store.require_since(Instant::now());
    assert_eq!(ids(&store, &api, None).await, ["old"]);
}

/// A test's leadership: the term it holds, and the other holder's stop.
#[derive(Debug, Default)]
struct Lead(Mutex<(Option<u64>, Option<Instant>)>);

impl Lead {
    fn set(&self, term: Option<u64>, holder_stopped: Option<Instant>) {
        *self.0.lock().unwrap() = (term, holder_stopped);
    }
}

impl Leadership for Lead {
    fn term(&self) -> Option<u64> {
        self.0.lock().unwrap().0
    }

    fn holder_stopped(&self) -> Option<Instant> {
        self.0.lock().unwrap().1
    }
}

#[tokio::test(start_paused = true)]
async fn a_new_term_replaces_the_list_before_the_new_leader_reads_it() {
    let store = IpStore::new(RESYNC, LAG);
    let api = Api::default();
    let lead = Lead::default();
    api.set(vec![ip("a", "s1")]);
    assert_eq!(ids(&store, &api, Some(&lead)).await, ["a"], "a follower reads");
    // The other leader creates a FIP; this replica wins the Lease.
    api.set(vec![ip("a", "s1"), ip("theirs", "s2")]);
    tokio::time::advance(Duration::from_secs(5)).await;
    lead.set(Some(1), None);
    assert_eq!(ids(&store, &api, Some(&lead)).await, ["a", "theirs"]);
    assert_eq!(api.calls(), 2, "replaced at the first read of the term");
    // Renewed (in time or late, writes paused meanwhile): the same term, no list call.
    for _ in 0..5 {
        tokio::time::advance(Duration::from_secs(2)).await;
        ids(&store, &api, Some(&lead)).await;
    }
    assert_eq!(api.calls(), 2);
    // Lost and won again, however quickly: a new term (another replica may have written).
    lead.set(None, None);
    ids(&store, &api, Some(&lead)).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    lead.set(Some(2), None);
    ids(&store, &api, Some(&lead)).await;
    assert_eq!(api.calls(), 3, "a lost term and a new one");
    // A new number unseen in between (the loss fell between two looks) is a new term too.
    tokio::time::advance(Duration::from_secs(2)).await;
    lead.set(Some(3), None);
    ids(&store, &api, Some(&lead)).await;
    assert_eq!(api.calls(), 4, "term 3 is not term 2");
}

#[tokio::test(start_paused = true)]
async fn a_list_read_after_the_previous_holder_stopped_serves_the_new_term() {
    let store = IpStore::new(RESYNC, LAG);
    let api = Api::default();
    let lead = Lead::default();
    api.set(vec![ip("a", "s1")]);
    // Following: the holder stopped renewing; the read ahead of the takeover comes after its
    // stop.
    let stopped = Instant::now() + Duration::from_secs(1);
    lead.set(None, Some(stopped));
    ids(&store, &api, Some(&lead)).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    store.require_since(Instant::now());
    ids(&store, &api, Some(&lead)).await;
    assert_eq!(api.calls(), 2);
    // Won: that list is as good as one read now; the gate no longer shows the old holder.
    tokio::time::advance(Duration::from_secs(1)).await;
    lead.set(Some(1), None);
    ids(&store, &api, Some(&lead)).await;
    assert_eq!(api.calls(), 2, "no list call on the failover path");

    // A list read before the holder stopped does not serve a term.
    lead.set(None, None);
    ids(&store, &api, Some(&lead)).await;
    lead.set(None, Some(Instant::now() + Duration::from_secs(1)));
    tokio::time::advance(Duration::from_secs(2)).await;
    lead.set(Some(2), Some(Instant::now() - Duration::from_secs(1)));
    ids(&store, &api, Some(&lead)).await;
    assert_eq!(api.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn renewals_seen_between_reads_keep_the_term() {
    let store = IpStore::new(RESYNC, LAG);
    let api = Api::default();
    let lead = Lead::default();
    lead.set(Some(1), None);
    ids(&store, &api, Some(&lead)).await;
    // Renewed every 200 ms (some renewals late: writes paused, then resumed), read only every
    // 2 s: the term keeps its number, so neither the watcher's looks nor the reads see a new one.
    for _ in 0..10 {
        tokio::time::advance(Duration::from_millis(200)).await;
        store.observe(&lead);
    }
    ids(&store, &api, Some(&lead)).await;
    assert_eq!(api.calls(), 1, "no new term, no list call");
}
