use hickory_proto::op::{Edns, Message, Query};
use hickory_proto::rr::{Name, RecordType};

use super::SimpleQuery;

fn query(name: &str, qtype: RecordType, edns: bool) -> Vec<u8> {
    let mut m = Message::query();
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    if edns {
        m.set_edns(Edns::new());
    }
    m.to_vec().unwrap()
}

#[test]
fn recognises_plain_and_edns_queries() {
    let q = SimpleQuery::parse(&query("Api.C1.example.com.", RecordType::A, false)).unwrap();
    assert_eq!(q.qtype, 1);
    assert_eq!(q.edns_payload, None);
    let packet = query("Api.C1.example.com.", RecordType::AAAA, true);
    let q = SimpleQuery::parse(&packet).unwrap();
    assert_eq!(q.qtype, 28);
    assert_eq!(q.edns_payload, Some(512));
    let mut buf = [0; 255];
    assert_eq!(
        q.lowercase_name(&packet, &mut buf).unwrap(),
        b"\x03api\x02c1\x07example\x03com\x00"
    );
}

#[test]
fn rejects_anything_unusual() {
    let good = query("api.c1.example.com.", RecordType::A, false);
    // Truncated, trailing garbage, response bit, opcode, two questions.
    assert!(SimpleQuery::parse(&good[..good.len() - 1]).is_none());
    let mut trailing = good.clone();
    trailing.push(0);
    assert!(SimpleQuery::parse(&trailing).is_none());
    let mut response = good.clone();
    response[2] |= 0x80;
    assert!(SimpleQuery::parse(&response).is_none());
    let mut update = good.clone();
    update[2] |= 5 << 3;
    assert!(SimpleQuery::parse(&update).is_none());
    let mut two = good;
    two[5] = 2;
    assert!(SimpleQuery::parse(&two).is_none());
    assert!(SimpleQuery::parse(&[]).is_none());
}
