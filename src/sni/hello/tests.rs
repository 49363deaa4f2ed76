use proptest::prelude::*;
use rstest::rstest;

use super::fixtures::{client_hello, records};
use super::*;

const LIMIT: usize = 16 * 1024;

fn complete(sni: Option<&str>) -> Hello {
    Hello::Complete {
        sni: sni.map(str::to_owned),
    }
}

#[rstest]
#[case::one_record(Some("api.t1.example.com"), 16_384)]
#[case::no_sni(None, 16_384)]
#[case::split_in_records_of_7(Some("api.t1.example.com"), 7)]
#[case::one_byte_records(Some("a.b"), 1)]
fn a_client_hello_gives_its_server_name(#[case] sni: Option<&str>, #[case] chunk: usize) {
    let bytes = records(&client_hello(sni), chunk);
    assert_eq!(parse(&bytes, LIMIT), Ok(complete(sni)));
}

#[test]
fn names_are_lower_cased_without_the_trailing_dot() {
    let bytes = records(&client_hello(Some("API.T1.Example.COM.")), 100);
    assert_eq!(parse(&bytes, LIMIT), Ok(complete(Some("api.t1.example.com"))));
}

#[test]
fn every_prefix_of_a_hello_is_incomplete_and_asks_for_more() {
    for chunk in [5, 64, 16_384] {
        let bytes = records(&client_hello(Some("api.t2.example.com")), chunk);
        for n in 0..bytes.len() {
            match parse(&bytes[..n], LIMIT) {
                Ok(Hello::Incomplete { need }) => assert!(need > n && need <= bytes.len(), "{n}: {need}"),
                other => panic!("prefix of {n} bytes (records of {chunk}): {other:?}"),
            }
        }
        assert_eq!(parse(&bytes, LIMIT), Ok(complete(Some("api.t2.example.com"))));
    }
}

#[test]
fn bytes_after_the_hello_are_left_alone() {
    let mut bytes = records(&client_hello(Some("x.example")), 16_384);
    bytes.extend_from_slice(&[20, 3, 3, 0, 1, 1, 23, 3, 3, 0, 5, 1, 2, 3]);
    assert_eq!(parse(&bytes, LIMIT), Ok(complete(Some("x.example"))));
}

#[rstest]
#[case::http(b"GET / HTTP/1.1\r\n\r\n".to_vec(), HelloError::NotHandshake(b'G'))]
#[case::ssl2(vec![22, 2, 0, 0, 10], HelloError::RecordVersion(2, 0))]
#[case::empty_record(vec![22, 3, 1, 0, 0], HelloError::RecordLength(0))]
#[case::huge_record(vec![22, 3, 1, 0x40, 1], HelloError::RecordLength(16_385))]
#[case::server_hello(vec![22, 3, 3, 0, 4, 2, 0, 0, 0], HelloError::NotClientHello(2))]
#[case::too_large(vec![22, 3, 3, 0, 4, 1, 0, 0x40, 1], HelloError::TooLarge { len: 16_385, limit: LIMIT })]
#[case::empty_body(vec![22, 3, 3, 0, 4, 1, 0, 0, 0], HelloError::Malformed("client version"))]
fn garbage_is_refused_with_a_reason(#[case] bytes: Vec<u8>, #[case] want: HelloError) {
    assert_eq!(parse(&bytes, LIMIT), Err(want));
}

#[test]
fn a_too_large_hello_is_refused_before_its_bytes_arrive() {
    // Header says 100 KB; only the first record header and 4 bytes are there.
    assert_eq!(
        parse(&[22, 3, 1, 0x40, 0, 1, 1, 0x86, 0xa0], LIMIT),
        Err(HelloError::TooLarge {
            len: 100_000,
            limit: LIMIT
        })
    );
}

#[rstest]
#[case::space(&b"bad name"[..])]
#[case::empty_label(&b"a..b"[..])]
#[case::nul(&b"a\0b"[..])]
#[case::only_dot(&b"."[..])]
fn bad_host_names_are_refused(#[case] name: &[u8]) {
    let mut msg = client_hello(Some("aaaaaaaa"));
    let at = msg.windows(8).position(|w| w == b"aaaaaaaa").unwrap();
    // Rebuild with the bad bytes in place of the name when the length matches; else via normalize.
    if name.len() == 8 {
        msg[at..at + 8].copy_from_slice(name);
        assert_eq!(parse(&records(&msg, 16_384), LIMIT), Err(HelloError::BadName));
    }
    assert_eq!(normalize_host(name), Err(HelloError::BadName));
}

#[test]
fn a_name_over_253_bytes_is_refused() {
    let long = ["a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(63)].join(".");
    assert_eq!(long.len(), 255);
    assert_eq!(normalize_host(long.as_bytes()), Err(HelloError::BadName));
    let bytes = records(&client_hello(Some(&long)), 16_384);
    assert_eq!(parse(&bytes, LIMIT), Err(HelloError::BadName));
}

/// Checks the invariants every input must keep: no panic, `need` beyond what was given and
/// within reach, a name that is safe to log.
fn check(bytes: &[u8]) {
    match parse(bytes, LIMIT) {
        Ok(Hello::Incomplete { need }) => {
            assert!(need > bytes.len(), "need {need} ≤ {} given", bytes.len());
            assert!(need <= bytes.len() + 5 + 16_384, "need {need} too far");
        }
        Ok(Hello::Complete { sni: Some(name) }) => {
            assert!(name.len() <= 253);
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
            );
        }
        Ok(Hello::Complete { sni: None }) | Err(_) => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    /// Random bytes, most of them behind a plausible record header so the parser gets deep.
    #[test]
    fn fuzz_random_bytes(body in proptest::collection::vec(any::<u8>(), 0..600), plausible in any::<bool>()) {
        let mut bytes = Vec::new();
        if plausible {
            bytes.extend_from_slice(&[22, 3, 1]);
            bytes.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
            if !body.is_empty() { bytes.push(1); }
        }
        bytes.extend_from_slice(&body);
        check(&bytes);
    }

    /// A real ClientHello with bytes flipped, then cut anywhere, then split into records.
    #[test]
    fn fuzz_mutated_hellos(
        name in "[a-z0-9]{1,20}(\\.[a-z0-9-]{1,20}){0,4}",
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cut in any::<usize>(),
        chunk in 1usize..300,
    ) {
        let mut msg = client_hello(Some(&name));
        let clean = records(&msg, chunk);
        prop_assert_eq!(parse(&clean, LIMIT), Ok(complete(Some(&name))));
        for (at, b) in &flips {
            let i = at % msg.len();
            msg[i] ^= b;
        }
        let mut bytes = records(&msg, chunk);
        check(&bytes);
        bytes.truncate(cut % (bytes.len() + 1));
        check(&bytes);
    }
}
