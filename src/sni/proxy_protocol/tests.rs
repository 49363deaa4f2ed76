use rstest::rstest;

use super::*;

#[allow(clippy::unnecessary_wraps)] // compared with `Option` fields
fn addr(s: &str) -> Option<SocketAddr> {
    Some(s.parse().unwrap())
}

#[test]
fn v1_tcp4_gives_both_addresses() {
    let line = b"PROXY TCP4 192.0.2.1 203.0.113.5 51000 443\r\n\x16\x03\x01";
    assert_eq!(
        parse(line, 512),
        Ok(Proxied::Complete(Header {
            len: line.len() - 3,
            source: addr("192.0.2.1:51000"),
            destination: addr("203.0.113.5:443"),
            tenant: None,
        }))
    );
}

#[test]
fn v1_tcp6_and_unknown() {
    let line = b"PROXY TCP6 2001:db8::1 2001:db8::2 1 443\r\n";
    let Ok(Proxied::Complete(h)) = parse(line, 512) else {
        panic!()
    };
    assert_eq!(h.destination, addr("[2001:db8::2]:443"));
    let Ok(Proxied::Complete(h)) = parse(b"PROXY UNKNOWN\r\n", 512) else {
        panic!()
    };
    assert_eq!((h.len, h.destination), (15, None));
}

fn v2(cmd: u8, fam: u8, addrs: &[u8], tlvs: &[u8]) -> Vec<u8> {
    let mut b = V2_SIGNATURE.to_vec();
    b.push(0x20 | cmd);
    b.push(fam);
    b.extend_from_slice(&u16::try_from(addrs.len() + tlvs.len()).unwrap().to_be_bytes());
    b.extend_from_slice(addrs);
    b.extend_from_slice(tlvs);
    b
}

#[test]
fn v2_tcp4_with_tlvs_gives_both_addresses() {
    let bytes = v2(
        1,
        0x11,
        &[192, 0, 2, 1, 203, 0, 113, 5, 0xc7, 0x38, 1, 0xbb],
        &[4, 0, 1, 0],
    );
    assert_eq!(
        parse(&bytes, 512),
        Ok(Proxied::Complete(Header {
            len: bytes.len(),
            source: addr("192.0.2.1:51000"),
            destination: addr("203.0.113.5:443"),
            tenant: None,
        }))
    );
}

#[test]
fn v2_tcp6_and_local() {
    let mut a = vec![0u8; 36];
    a[15] = 1;
    a[31] = 2;
    a[34] = 1;
    a[35] = 0xbb;
    let Ok(Proxied::Complete(h)) = parse(&v2(1, 0x21, &a, &[]), 512) else {
        panic!()
    };
    assert_eq!(h.destination, addr("[::2]:443"));
    let Ok(Proxied::Complete(h)) = parse(&v2(0, 0, &[], &[]), 512) else {
        panic!()
    };
    assert_eq!((h.len, h.destination), (16, None));
}

#[test]
fn every_prefix_is_incomplete() {
    let v1 = b"PROXY TCP4 192.0.2.1 203.0.113.5 51000 443\r\n".to_vec();
    let v2 = v2(1, 0x11, &[192, 0, 2, 1, 203, 0, 113, 5, 0xc7, 0x38, 1, 0xbb], &[]);
    for bytes in [v1, v2] {
        for n in 0..bytes.len() {
            assert!(
                matches!(parse(&bytes[..n], 512), Ok(Proxied::Incomplete { need }) if need > n),
                "{n}"
            );
        }
    }
}

#[rstest]
#[case::tls(&[22, 3, 1, 0, 10][..], ProxyError::NoSignature)]
#[case::v1_no_crlf(&[b"PROXY TCP4 ".as_slice(), &[b'1'; 100]].concat()[..], ProxyError::V1Line)]
#[case::v1_udp(&b"PROXY UDP4 1.2.3.4 1.2.3.4 1 2\r\n"[..], ProxyError::V1("protocol is not TCP4, TCP6 or UNKNOWN"))]
#[case::v1_bad_ip(&b"PROXY TCP4 1.2.3 1.2.3.4 1 2\r\n"[..], ProxyError::V1("bad address"))]
#[case::v1_bad_port(&b"PROXY TCP4 1.2.3.4 1.2.3.4 1 99999\r\n"[..], ProxyError::V1("bad port"))]
#[case::v1_fields(&b"PROXY TCP4 1.2.3.4\r\n"[..], ProxyError::V1("expected 4 fields after the protocol"))]
fn garbage_is_refused(#[case] bytes: &[u8], #[case] want: ProxyError) {
    assert_eq!(parse(bytes, 512), Err(want));
}

#[test]
fn v2_bounds_and_versions() {
    let mut big = v2(1, 0x11, &[0; 12], &[0; 600]);
    assert_eq!(
        parse(&big, 512),
        Err(ProxyError::TooLarge { len: 628, limit: 512 })
    );
    big[12] = 0x11;
    assert_eq!(parse(&big, 1024), Err(ProxyError::V2("version is not 2")));
    assert_eq!(
        parse(&v2(1, 0x11, &[0; 4], &[]), 512),
        Err(ProxyError::V2("IPv4 addresses truncated"))
    );
    assert_eq!(
        parse(&v2(5, 0x11, &[0; 12], &[]), 512),
        Err(ProxyError::V2("command is not LOCAL or PROXY"))
    );
}

#[test]
fn fuzz_random_headers_never_panic() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(14);
    let seeds = [
        b"PROXY TCP4 192.0.2.1 203.0.113.5 51000 443\r\n".to_vec(),
        v2(
            1,
            0x11,
            &[192, 0, 2, 1, 203, 0, 113, 5, 0xc7, 0x38, 1, 0xbb],
            &[1, 0, 0],
        ),
    ];
    for i in 0..20_000 {
        let mut b = seeds[i % 2].clone();
        for _ in 0..rng.random_range(0..4) {
            let at = rng.random_range(0..b.len());
            b[at] = rng.random();
        }
        b.truncate(rng.random_range(0..=b.len()));
        match parse(&b, 512) {
            Ok(Proxied::Incomplete { need }) => assert!(need > b.len()),
            Ok(Proxied::Complete(h)) => assert!(h.len <= b.len()),
            Err(_) => {}
        }
    }
}

#[test]
fn v2_tenant_tlv_names_the_tenant_and_other_tlvs_are_skipped() {
    let addrs = [10, 244, 0, 5, 10, 96, 0, 1, 0x9c, 0x40, 1, 0xbb];
    let name = b"API.T1.example.com";
    let mut tlvs = vec![4, 0, 2, 0, 0]; // NOOP, 2 bytes
    tlvs.extend_from_slice(&[0xE0, 0, u8::try_from(name.len()).unwrap()]);
    tlvs.extend_from_slice(name);
    let bytes = v2(1, 0x11, &addrs, &tlvs);
    let Ok(Proxied::Complete(h)) = parse_with(&bytes, 512, Some(0xE0)) else {
        panic!()
    };
    assert_eq!(h.tenant.as_deref(), Some("api.t1.example.com"));
    assert_eq!(h.destination, addr("10.96.0.1:443"));
    // Another type configured: no tenant; none configured: none read.
    let Ok(Proxied::Complete(h)) = parse_with(&bytes, 512, Some(0xE1)) else {
        panic!()
    };
    assert_eq!(h.tenant, None);
    let Ok(Proxied::Complete(h)) = parse(&bytes, 512) else {
        panic!()
    };
    assert_eq!(h.tenant, None);
    // With the UNSPEC family (no addresses) the TLVs start at once.
    let Ok(Proxied::Complete(h)) = parse_with(&v2(1, 0x00, &[], &tlvs), 512, Some(0xE0)) else {
        panic!()
    };
    assert_eq!(
        (h.destination, h.tenant.as_deref()),
        (None, Some("api.t1.example.com"))
    );
}

#[rstest]
#[case(&[0xE0, 0, 9, b'a'], "TLV value truncated")]
#[case(&[0xE0, 0], "TLV header truncated")]
#[case(&[0xE0, 0, 3, b'a', b' ', b'b'], "tenant TLV is not a host name")]
fn v2_bad_tenant_tlvs_are_refused(#[case] tlvs: &[u8], #[case] why: &'static str) {
    let bytes = v2(1, 0x11, &[0; 12], tlvs);
    assert_eq!(parse_with(&bytes, 512, Some(0xE0)), Err(ProxyError::V2(why)));
}
