use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::IpCache;
use crate::model::{IpAddress, IpId, IpType, Tags};

fn ip(id: &str) -> IpAddress {
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
        tags: Tags::new(),
        ddos_scrubbing: false,
        href: String::new(),
        vlan_id: None,
    }
}

#[tokio::test(start_paused = true)]
async fn concurrent_reads_share_one_fetch() {
    let cache = Arc::new(IpCache::new(Duration::from_secs(60)));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..20 {
        let (cache, calls) = (cache.clone(), calls.clone());
        handles.push(tokio::spawn(async move {
            cache
                .get(|| async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, Infallible>(vec![ip("a")])
                })
                .await
                .unwrap()
                .len()
        }));
    }
    for h in handles {
        assert_eq!(h.await.unwrap(), 1);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn writes_patch_and_invalidate() {
    let cache = IpCache::new(Duration::from_secs(60));
    let calls = AtomicUsize::new(0);
    let fetch = || async {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Infallible>(vec![ip("a")])
    };
    assert_eq!(cache.get(fetch).await.unwrap().len(), 1);
    cache.upsert(&ip("b"));
    let got = cache.get(fetch).await.unwrap();
    assert_eq!(got.len(), 2, "patched in place");
    cache.remove(&IpId::from("a"));
    assert_eq!(cache.get(fetch).await.unwrap().len(), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    cache.invalidate();
    cache.get(fetch).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    tokio::time::advance(Duration::from_secs(61)).await;
    cache.get(fetch).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3, "ttl expired");
}

#[tokio::test(start_paused = true)]
async fn a_fetch_racing_a_write_is_not_cached() {
    let cache = Arc::new(IpCache::new(Duration::from_secs(60)));
    let slow = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get(|| async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, Infallible>(vec![ip("old")])
                })
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    cache.upsert(&ip("new")); // lands while the fetch is under way
    assert_eq!(slow.await.unwrap().len(), 1);
    let calls = AtomicUsize::new(0);
    cache
        .get(|| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Infallible>(vec![ip("old"), ip("new")])
        })
        .await
        .unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the racing result was not cached"
    );
}
