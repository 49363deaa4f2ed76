use std::sync::{Arc, Mutex};

use super::{Shared, bind_pair};
use crate::answer::{Compiled, ZoneSettings};
use crate::model::RecordStore;

#[tokio::test]
async fn bind_pair_uses_one_free_port_for_udp_and_tcp() {
    let (udp, tcp) = bind_pair("127.0.0.1:0".parse().unwrap()).await.unwrap();
    assert_eq!(udp.local_addr().unwrap(), tcp.local_addr().unwrap());
}

#[test]
fn the_zone_is_compiled_once_per_generation() {
    let settings = ZoneSettings {
        origin: "c1.example.com".parse().unwrap(),
        ttl: 30,
        ns_name: "ns1.c1.example.com".parse().unwrap(),
        ns_addresses: vec![],
        serial_base: 1,
    };
    let store = RecordStore::new();
    let initial = Compiled::compile(&settings, &store.snapshot()).unwrap();
    let shared = Shared {
        settings,
        store: store.clone(),
        cache: Mutex::new(Arc::new(initial)),
    };
    let a = shared.current();
    assert!(Arc::ptr_eq(&a, &shared.current()), "no change, no recompilation");
    store.set_name(
        "api.c1.example.com".parse().unwrap(),
        [("192.0.2.1".parse().unwrap(), true)],
    );
    let b = shared.current();
    assert!(!Arc::ptr_eq(&a, &b));
    assert_eq!(b.generation, 1);
}
