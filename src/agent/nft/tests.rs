use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use rstest::rstest;

use super::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn set(ips: &[&str]) -> BTreeSet<IpAddr> {
    ips.iter().map(|s| ip(s)).collect()
}

fn held(pairs: &[(&str, &str)]) -> BTreeMap<IpAddr, IpAddr> {
    pairs.iter().map(|(f, t)| (ip(f), ip(t))).collect()
}

fn none() -> BTreeMap<IpAddr, IpAddr> {
    BTreeMap::new()
}

/// The batch `nft` 1.0.6 sends for
/// `table ip baton { chain prerouting { type nat hook prerouting priority -100; policy accept;
/// ip daddr 203.0.113.5 counter redirect } }` (strace -e write=3, on x86_64): begin, NEWTABLE,
/// NEWCHAIN, NEWRULE, end.
const NFT_BATCH: &str = "\
    140000001000010000000000000000000000000a28000000000a01000100000000000000020000000a0001006261746f \
    6e000000080002000000000054000000030a01040200000000000000020000000a0001006261746f6e0000000f000300 \
    707265726f7574696e670000080007006e617400080005000000000114000480080001000000000008000200ffffff9c \
    bc000000060a010c0300000000000000020000000a0001006261746f6e0000000f000200707265726f7574696e670000 \
    8c000480340001800c0001007061796c6f61640024000280080001000000000108000200000000010800030000000010 \
    08000400000000042c00018008000100636d700020000280080001000000000108000200000000000c00038008000100 \
    cb007105140001800c000100636f756e7465720004000280140001800a00010072656469720000000400028014000000 \
    1100010004000000000000000000000a";

/// The batch `nft` 1.0.6 sends for
/// `table ip baton { chain output { type nat hook output priority -100; policy accept;
/// ip daddr 203.0.113.5 counter dnat to 198.51.100.11 } }` (strace -e write=all): begin,
/// NEWTABLE, NEWCHAIN, NEWRULE (payload, cmp, counter, immediate, nat), end.
const NFT_OUTPUT_BATCH: &str = "\
    140000001000010000000000000000000000000a28000000000a01000100000000000000020000000a0001006261746f \
    6e000000080002000000000050000000030a01040200000000000000020000000a0001006261746f6e0000000b000300 \
    6f75747075740000080007006e617400080005000000000114000480080001000000000308000200ffffff9cf8000000 \
    060a010c0300000000000000020000000a0001006261746f6e0000000b0002006f75747075740000cc00048034000180 \
    0c0001007061796c6f616400240002800800010000000001080002000000000108000300000000100800040000000004 \
    2c00018008000100636d700020000280080001000000000108000200000000000c00038008000100cb00710514000180 \
    0c000100636f756e74657200040002802c0001800e000100696d6d656469617465000000180002800800010000000001 \
    0c00028008000100c633640b28000180080001006e6174001c0002800800010000000001080002000000000208000300 \
    00000001140000001100010004000000000000000000000a";

/// The kernel's (6.18) answer to `nft list chain ip baton output`'s GETCHAIN.
const KERNEL_OUTPUT_CHAIN: &str = "\
    6c000000030a000000000000755e0000020000030a0001006261746f6e0000000b0003006f757470757400000c000200 \
    000000000000000114000400080001000000000308000200ffffff9c0800050000000001080007006e61740008000a00 \
    000000010800060000000002";

/// The kernel's answer to the GETRULE dump of that chain holding `dnat to 198.51.100.11` for
/// 203.0.113.5 and 203.0.113.6 (two NEWRULE messages in one datagram). The kernel adds what
/// `nft` did not send: `addr_max` (the same register) and the flag `NF_NAT_RANGE_MAP_IPS`.
const KERNEL_LOCAL_RULES: &str = "\
    2c010000060a020800000000755e0000020000030a0001006261746f6e0000000b0002006f757470757400000c000300 \
    0000000000000002f4000400340001000c0001007061796c6f6164002400020008000100000000010800020000000001 \
    080003000000001008000400000000042c00010008000100636d70002000020008000100000000010800020000000000 \
    0c00030008000100cb0071052c0001000c000100636f756e746572001c0002000c00010000000000000000000c000200 \
    00000000000000002c0001000e000100696d6d6564696174650000001800020008000100000000010c00020008000100 \
    c633640b38000100080001006e6174002c00020008000100000000010800020000000002080003000000000108000400 \
    00000001080007000000000138010000060a020800000000755e0000020000030a0001006261746f6e0000000b000200 \
    6f757470757400000c00030000000000000000030c0006000000000000000002f4000400340001000c0001007061796c \
    6f6164002400020008000100000000010800020000000001080003000000001008000400000000042c00010008000100 \
    636d700020000200080001000000000108000200000000000c00030008000100cb0071062c0001000c000100636f756e \
    746572001c0002000c00010000000000000000000c00020000000000000000002c0001000e000100696d6d6564696174 \
    650000001800020008000100000000010c00020008000100c633640b38000100080001006e6174002c00020008000100 \
    000000010800020000000002080003000000000108000400000000010800070000000001";

/// The kernel's (6.18) answer to `nft list chain ip baton prerouting`'s GETCHAIN.
const KERNEL_CHAIN: &str = "\
    70000000030a000000000000661d0000020000020a0001006261746f6e0000000f000300707265726f7574696e670000 \
    0c000200000000000000000114000400080001000000000008000200ffffff9c0800050000000001080007006e617400 \
    08000a00000000010800060000000002";

/// The kernel's answer to the GETRULE dump of that chain holding two rules, 203.0.113.5 and
/// 203.0.113.6 (two NEWRULE messages in one datagram; the DONE came in the next).
const KERNEL_RULES: &str = "\
    e0000000060a020800000000661d0000020000020a0001006261746f6e0000000f000200707265726f7574696e670000 \
    0c0003000000000000000002a4000400340001000c0001007061796c6f61640024000200080001000000000108000200 \
    00000001080003000000001008000400000000042c00010008000100636d700020000200080001000000000108000200 \
    000000000c00030008000100cb0071052c0001000c000100636f756e746572001c0002000c0001000000000000000000 \
    0c0002000000000000000000140001000a000100726564697200000004000200ec000000060a020800000000661d0000 \
    020000020a0001006261746f6e0000000f000200707265726f7574696e6700000c00030000000000000000030c000600 \
    0000000000000002a4000400340001000c0001007061796c6f6164002400020008000100000000010800020000000001 \
    080003000000001008000400000000042c00010008000100636d70002000020008000100000000010800020000000000 \
    0c00030008000100cb0071062c0001000c000100636f756e746572001c0002000c00010000000000000000000c000200 \
    0000000000000000140001000a000100726564697200000004000200";

/// The kernel's acknowledgement of that GETCHAIN (seq 0, portid 0x1d66).
const KERNEL_ACK: &str = "\
    240000000200000100000000661d00000000000030000000040a05000000000000000000";

#[test]
fn the_captures_are_what_they_say() {
    assert_eq!(hex(NFT_BATCH).len(), 352);
    assert_eq!(hex(KERNEL_CHAIN).len(), 112);
    assert_eq!(hex(KERNEL_RULES).len(), 460);
    assert_eq!(hex(KERNEL_ACK).len(), 36);
    assert_eq!(hex(NFT_OUTPUT_BATCH).len(), 408);
    assert_eq!(hex(KERNEL_OUTPUT_CHAIN).len(), 108);
    assert_eq!(hex(KERNEL_LOCAL_RULES).len(), 612);
}

#[cfg(target_endian = "little")]
#[test]
fn the_batch_carries_the_same_table_chain_and_rule_as_nft_sends() {
    let nft_bytes = hex(NFT_BATCH);
    let nft = messages(&nft_bytes).unwrap();
    assert_eq!(nft.len(), 5);
    let ours = replace_batch(&set(&["203.0.113.5"]), &none(), &[Family::V4], 100);
    let msgs = messages(&ours.bytes).unwrap();
    // begin, add table, delete table, create table, chain, rule, chain output (empty), end
    assert_eq!(msgs.len(), 8);
    let [begin, _add, delete, create, chain, rule, _output, end] = msgs.as_slice() else {
        unreachable!()
    };
    for (mine, theirs) in [
        (begin, &nft[0]),
        (create, &nft[1]),
        (chain, &nft[2]),
        (rule, &nft[3]),
        (end, &nft[4]),
    ] {
        assert_eq!(mine.ty, theirs.ty);
        assert_eq!(mine.body, theirs.body, "message type {:#x}", mine.ty);
        // nft asks for no acknowledgement and adds tables without NLM_F_CREATE; the rest equal.
        assert_eq!(
            mine.flags & !(NLM_F_ACK | NLM_F_CREATE),
            theirs.flags & !NLM_F_CREATE
        );
    }
    for m in &msgs[1..7] {
        assert_ne!(m.flags & NLM_F_ACK, 0, "every change is acknowledged");
    }
    assert_eq!(delete.ty, 0x0a02);
    assert_eq!(delete.body, hex("02000000 0a0001006261746f6e000000"));
    // Sequence numbers count up from 100 and name the steps.
    let seqs: Vec<u32> = msgs.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (100..108).collect::<Vec<_>>());
    assert_eq!(ours.begin_seq, 100);
    assert_eq!(ours.step_of(101), Step::AddTable(Family::V4));
    assert_eq!(ours.step_of(102), Step::DeleteTable(Family::V4));
    assert_eq!(ours.step_of(104), Step::CreateChain(Family::V4, Hook::Prerouting));
    assert_eq!(ours.step_of(105), Step::AddRule(ip("203.0.113.5")));
    assert_eq!(ours.step_of(106), Step::CreateChain(Family::V4, Hook::Output));
    assert_eq!(ours.step_of(100), Step::Commit);
}

#[cfg(target_endian = "little")]
#[test]
fn the_output_chain_and_its_rule_are_what_nft_sends() {
    let nft_bytes = hex(NFT_OUTPUT_BATCH);
    let nft = messages(&nft_bytes).unwrap();
    assert_eq!(nft.len(), 5);
    let ours = replace_batch(
        &set(&["203.0.113.5"]),
        &held(&[("203.0.113.5", "198.51.100.11")]),
        &[Family::V4],
        1,
    );
    let msgs = messages(&ours.bytes).unwrap();
    // begin, add, delete, create, chain prerouting, rule, chain output, its rule, end
    assert_eq!(msgs.len(), 9);
    for (mine, theirs) in [(&msgs[6], &nft[2]), (&msgs[7], &nft[3])] {
        assert_eq!(mine.ty, theirs.ty);
        assert_eq!(mine.body, theirs.body, "message type {:#x}", mine.ty);
        assert_eq!(mine.flags & !NLM_F_ACK, theirs.flags);
    }
    assert_eq!(
        ours.step_of(8),
        Step::AddLocalRule {
            fip: ip("203.0.113.5"),
            to: ip("198.51.100.11")
        }
    );
}

#[test]
fn every_message_length_matches_its_bytes() {
    let batch = replace_batch(
        &set(&["203.0.113.5", "203.0.113.6", "2001:db8::5"]),
        &held(&[("203.0.113.6", "198.51.100.11"), ("2001:db8::5", "2001:db8::11")]),
        &Family::ALL,
        1,
    );
    let msgs = messages(&batch.bytes).unwrap();
    // begin · (add, delete, create, chain, 2 rules, chain, 1 rule)
    //       · (add, delete, create, chain, 1 rule, chain, 1 rule) · end
    assert_eq!(msgs.len(), 1 + 8 + 7 + 1);
    let total: usize = msgs.iter().map(|m| 16 + m.body.len()).sum();
    assert_eq!(
        total,
        batch.bytes.len(),
        "messages are 4-aligned and back to back"
    );
    assert_eq!(
        batch.steps.len(),
        msgs.len() - 2,
        "all but begin and end are acknowledged"
    );
}

#[rstest]
#[case::v4_only("203.0.113.5", &[Family::V4], 8)]
#[case::v6_family_touched_but_empty("203.0.113.5", &[Family::V4, Family::V6], 10)]
#[case::nothing_wanted("", &[Family::V4, Family::V6], 6)]
#[case::nothing_touched("203.0.113.5", &[], 2)]
fn a_family_with_no_fips_is_only_removed(
    #[case] fips: &str,
    #[case] families: &[Family],
    #[case] count: usize,
) {
    let fips = set(&fips.split(',').filter(|s| !s.is_empty()).collect::<Vec<_>>());
    // A held FIP of a family with no FIPs gets no table either.
    let batch = replace_batch(&fips, &held(&[("2001:db8::5", "2001:db8::11")]), families, 0);
    assert_eq!(messages(&batch.bytes).unwrap().len(), count);
    for (_, step) in &batch.steps {
        if let Step::CreateTable(f) | Step::CreateChain(f, _) = step {
            assert!(fips.iter().any(|ip| Family::of(*ip) == *f), "{step}");
        }
        assert!(!matches!(step, Step::AddLocalRule { .. }), "{step}");
    }
}

#[test]
fn a_held_fip_whose_address_is_of_the_other_family_gets_no_rule() {
    let batch = replace_batch(
        &set(&["2001:db8::5"]),
        &held(&[("2001:db8::5", "198.51.100.11")]),
        &[Family::V6],
        0,
    );
    assert!(
        batch
            .steps
            .iter()
            .all(|(_, s)| !matches!(s, Step::AddLocalRule { .. })),
        "{:?}",
        batch.steps
    );
}

#[rstest]
#[case::v4("203.0.113.5")]
#[case::v4_other("198.51.100.200")]
#[case::v6("2001:db8::5")]
#[case::v6_full("2001:db8:ffff:1:2:3:4:5")]
fn a_rule_decodes_back_to_its_fip(#[case] addr: &str) {
    let to = if ip(addr).is_ipv4() {
        "198.51.100.11"
    } else {
        "2001:db8::11"
    };
    let batch = replace_batch(&set(&[addr]), &held(&[(addr, to)]), &[Family::of(ip(addr))], 0);
    let msgs = messages(&batch.bytes).unwrap();
    let rules: Vec<Answer> = msgs
        .iter()
        .filter(|m| m.ty == 0x0a06)
        .map(|m| answer(m).unwrap())
        .collect();
    assert_eq!(
        rules,
        vec![
            Answer::Rule(RuleInfo::Fip {
                ip: ip(addr),
                connections: 0
            }),
            Answer::Rule(RuleInfo::Local {
                fip: ip(addr),
                to: ip(to),
                connections: 0
            }),
        ]
    );
    let chains: Vec<ChainInfo> = msgs
        .iter()
        .filter(|m| m.ty == 0x0a03)
        .map(|m| match answer(m).unwrap() {
            Answer::Chain(info) => info,
            other => panic!("not a chain: {other:?}"),
        })
        .collect();
    assert_eq!(chains.len(), 2);
    assert!(chains[0].is_ours(Hook::Prerouting), "{:?}", chains[0]);
    assert!(chains[1].is_ours(Hook::Output), "{:?}", chains[1]);
    assert!(!chains[0].is_ours(Hook::Output) && !chains[1].is_ours(Hook::Prerouting));
}

#[cfg(target_endian = "little")]
#[test]
fn the_kernels_answers_decode() {
    let bytes = hex(KERNEL_CHAIN);
    let msgs = messages(&bytes).unwrap();
    let Answer::Chain(chain) = answer(&msgs[0]).unwrap() else {
        panic!("not a chain")
    };
    assert_eq!(
        chain,
        ChainInfo {
            hook: Some(0),
            priority: Some(-100),
            kind: Some("nat".into()),
            policy: Some(1)
        }
    );
    assert!(chain.is_ours(Hook::Prerouting));

    // The first rule's counter as the kernel reports it after 7 connections (packets = 7).
    let mut bytes = hex(KERNEL_RULES);
    let packets = bytes
        .windows(8)
        .position(|w| w == [0x0c, 0, 2, 0, 0, 0, 0, 0])
        .unwrap();
    bytes[packets + 11] = 7;
    let msgs = messages(&bytes).unwrap();
    let rules: Vec<Answer> = msgs.iter().map(|m| answer(m).unwrap()).collect();
    assert_eq!(
        rules,
        vec![
            Answer::Rule(RuleInfo::Fip {
                ip: ip("203.0.113.5"),
                connections: 7
            }),
            Answer::Rule(RuleInfo::Fip {
                ip: ip("203.0.113.6"),
                connections: 0
            }),
        ]
    );

    let bytes = hex(KERNEL_ACK);
    assert_eq!(
        answer(&messages(&bytes).unwrap()[0]).unwrap(),
        Answer::Ack { seq: 0 }
    );
    let done = hex("140000000300020000000000661d000000000000");
    assert_eq!(
        answer(&messages(&done).unwrap()[0]).unwrap(),
        Answer::Done { seq: 0, errno: 0 }
    );
}

#[cfg(target_endian = "little")]
#[test]
fn the_kernels_answers_for_the_output_chain_decode() {
    let bytes = hex(KERNEL_OUTPUT_CHAIN);
    let Answer::Chain(chain) = answer(&messages(&bytes).unwrap()[0]).unwrap() else {
        panic!("not a chain")
    };
    assert_eq!(
        chain,
        ChainInfo {
            hook: Some(3),
            priority: Some(-100),
            kind: Some("nat".into()),
            policy: Some(1)
        }
    );
    assert!(chain.is_ours(Hook::Output));

    // The second rule's counter after 4 of the node's own connections (packets = 4).
    let mut bytes = hex(KERNEL_LOCAL_RULES);
    let packets = bytes
        .windows(8)
        .enumerate()
        .filter(|(_, w)| *w == [0x0c, 0, 2, 0, 0, 0, 0, 0])
        .map(|(i, _)| i)
        .nth(1)
        .unwrap();
    bytes[packets + 11] = 4;
    let rules: Vec<Answer> = messages(&bytes)
        .unwrap()
        .iter()
        .map(|m| answer(m).unwrap())
        .collect();
    assert_eq!(
        rules,
        vec![
            Answer::Rule(RuleInfo::Local {
                fip: ip("203.0.113.5"),
                to: ip("198.51.100.11"),
                connections: 0
            }),
            Answer::Rule(RuleInfo::Local {
                fip: ip("203.0.113.6"),
                to: ip("198.51.100.11"),
                connections: 4
            }),
        ]
    );
}

/// A rule in the output chain's shape with the `nat` expression's attributes `nat`.
fn dnat_rule(nat: impl FnOnce(&mut Writer)) -> Vec<u8> {
    let mut w = Writer::default();
    w.fip_rule(0, ip("203.0.113.5"), Hook::Output, |w| {
        w.expr("immediate", |w| {
            w.attr_u32(NFTA_IMMEDIATE_DREG, NFT_REG_1);
            w.nested(NFTA_IMMEDIATE_DATA, |w| {
                w.attr(NFTA_DATA_VALUE, &[198, 51, 100, 11]);
            });
        });
        w.expr("nat", nat);
    });
    w.buf
}

#[rstest]
#[case::snat(|w: &mut Writer| {
    w.attr_u32(NFTA_NAT_TYPE, 0);
    w.attr_u32(NFTA_NAT_FAMILY, 2);
    w.attr_u32(NFTA_NAT_REG_ADDR_MIN, NFT_REG_1);
})]
#[case::another_family(|w: &mut Writer| {
    w.attr_u32(NFTA_NAT_TYPE, NFT_NAT_DNAT);
    w.attr_u32(NFTA_NAT_FAMILY, 10);
    w.attr_u32(NFTA_NAT_REG_ADDR_MIN, NFT_REG_1);
})]
#[case::another_register(|w: &mut Writer| {
    w.attr_u32(NFTA_NAT_TYPE, NFT_NAT_DNAT);
    w.attr_u32(NFTA_NAT_FAMILY, 2);
    w.attr_u32(NFTA_NAT_REG_ADDR_MIN, 2);
})]
#[case::a_port_too(|w: &mut Writer| {
    w.attr_u32(NFTA_NAT_TYPE, NFT_NAT_DNAT);
    w.attr_u32(NFTA_NAT_FAMILY, 2);
    w.attr_u32(NFTA_NAT_REG_ADDR_MIN, NFT_REG_1);
    w.attr_u32(NFTA_NAT_REG_PROTO_MIN, 2);
})]
#[case::other_flags(|w: &mut Writer| {
    w.attr_u32(NFTA_NAT_TYPE, NFT_NAT_DNAT);
    w.attr_u32(NFTA_NAT_FAMILY, 2);
    w.attr_u32(NFTA_NAT_REG_ADDR_MIN, NFT_REG_1);
    w.attr_u32(NFTA_NAT_FLAGS, 0x10);
})]
fn a_nat_rule_that_is_not_batons_is_not_taken_for_one(#[case] nat: fn(&mut Writer)) {
    let bytes = dnat_rule(nat);
    let got = answer(&messages(&bytes).unwrap()[0]).unwrap();
    assert_eq!(
        got,
        Answer::Rule(RuleInfo::Other(
            "a rule of expressions [payload, cmp, counter, immediate, nat]".into()
        ))
    );
    // The same rule as baton writes it is baton's.
    let ours = dnat_rule(|w| {
        w.attr_u32(NFTA_NAT_TYPE, NFT_NAT_DNAT);
        w.attr_u32(NFTA_NAT_FAMILY, 2);
        w.attr_u32(NFTA_NAT_REG_ADDR_MIN, NFT_REG_1);
    });
    assert!(matches!(
        answer(&messages(&ours).unwrap()[0]).unwrap(),
        Answer::Rule(RuleInfo::Local { .. })
    ));
}

#[test]
fn an_error_names_its_errno_and_sequence_number() {
    // NLMSG_ERROR for seq 42: error -2 (ENOENT), then the request's header.
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&36u32.to_ne_bytes());
    bytes.extend_from_slice(&2u16.to_ne_bytes());
    bytes.extend_from_slice(&0x100u16.to_ne_bytes());
    bytes.extend_from_slice(&42u32.to_ne_bytes());
    bytes.extend_from_slice(&0u32.to_ne_bytes());
    bytes.extend_from_slice(&(-2i32).to_ne_bytes());
    bytes.extend_from_slice(&get_chain(Family::V4, Hook::Prerouting, 42)[..16]);
    assert_eq!(
        answer(&messages(&bytes).unwrap()[0]).unwrap(),
        Answer::Error { seq: 42, errno: 2 }
    );
}

#[test]
fn a_rule_that_is_not_batons_is_described_not_taken_for_a_fip() {
    // `ip daddr 203.0.113.5 accept`-like: payload, cmp, immediate.
    let mut w = Writer::default();
    w.message(nft_type(NFT_MSG_NEWRULE), 0, 0, Family::V4, |w| {
        w.attr_str(NFTA_RULE_TABLE, TABLE);
        w.attr_str(NFTA_RULE_CHAIN, "prerouting");
        w.nested(NFTA_RULE_EXPRESSIONS, |w| {
            w.expr("payload", |w| {
                w.attr_u32(NFTA_PAYLOAD_DREG, NFT_REG_1);
                w.attr_u32(NFTA_PAYLOAD_BASE, NFT_PAYLOAD_NETWORK_HEADER);
                w.attr_u32(NFTA_PAYLOAD_OFFSET, 16);
                w.attr_u32(NFTA_PAYLOAD_LEN, 4);
            });
            w.expr("cmp", |w| {
                w.attr_u32(NFTA_CMP_SREG, NFT_REG_1);
                w.attr_u32(NFTA_CMP_OP, NFT_CMP_EQ);
                w.nested(NFTA_CMP_DATA, |w| w.attr(NFTA_DATA_VALUE, &[203, 0, 113, 5]));
            });
            w.expr("immediate", |_| {});
        });
    });
    let msgs = messages(&w.buf).unwrap();
    assert_eq!(
        answer(&msgs[0]).unwrap(),
        Answer::Rule(RuleInfo::Other(
            "a rule of expressions [payload, cmp, immediate]".into()
        ))
    );
    // Our rule with a source-address match instead (offset 12) is not ours either.
    let mut w = Writer::default();
    w.message(nft_type(NFT_MSG_NEWRULE), 0, 0, Family::V4, |w| {
        w.nested(NFTA_RULE_EXPRESSIONS, |w| {
            w.expr("payload", |w| {
                w.attr_u32(NFTA_PAYLOAD_DREG, NFT_REG_1);
                w.attr_u32(NFTA_PAYLOAD_BASE, NFT_PAYLOAD_NETWORK_HEADER);
                w.attr_u32(NFTA_PAYLOAD_OFFSET, 12);
                w.attr_u32(NFTA_PAYLOAD_LEN, 4);
            });
            w.expr("cmp", |w| {
                w.attr_u32(NFTA_CMP_SREG, NFT_REG_1);
                w.attr_u32(NFTA_CMP_OP, NFT_CMP_EQ);
                w.nested(NFTA_CMP_DATA, |w| w.attr(NFTA_DATA_VALUE, &[203, 0, 113, 5]));
            });
            w.expr("counter", |_| {});
            w.expr("redir", |_| {});
        });
    });
    assert!(matches!(
        answer(&messages(&w.buf).unwrap()[0]).unwrap(),
        Answer::Rule(RuleInfo::Other(_))
    ));
}

#[rstest]
#[case::truncated_header(&[0x10, 0, 0, 0, 2, 0])]
#[case::length_past_the_end(&[0xff, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])]
#[case::length_below_the_header(&[4, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])]
fn malformed_answers_are_errors_not_panics(#[case] bytes: &[u8]) {
    // A trailing fragment shorter than a header is ignored; a bad length is an error.
    match messages(bytes) {
        Ok(m) => assert!(m.is_empty()),
        Err(e) => assert!(e.to_string().contains("length")),
    }
}

#[test]
fn arbitrary_bytes_never_panic_the_decoder() {
    use proptest::prelude::*;
    proptest!(|(bytes in proptest::collection::vec(any::<u8>(), 0..600))| {
        if let Ok(msgs) = messages(&bytes) {
            for m in &msgs {
                let _ = answer(m);
            }
        }
    });
}

#[test]
fn steps_read_like_the_nft_commands() {
    assert_eq!(
        Step::AddRule(ip("203.0.113.5")).to_string(),
        "add rule ip baton prerouting ip daddr 203.0.113.5 counter redirect"
    );
    assert_eq!(
        Step::CreateChain(Family::V6, Hook::Prerouting).to_string(),
        "add chain ip6 baton prerouting (type nat hook prerouting priority -100)"
    );
    assert_eq!(
        Step::CreateChain(Family::V4, Hook::Output).to_string(),
        "add chain ip baton output (type nat hook output priority -100)"
    );
    assert_eq!(
        Step::AddLocalRule {
            fip: ip("203.0.113.5"),
            to: ip("198.51.100.11")
        }
        .to_string(),
        "add rule ip baton output ip daddr 203.0.113.5 counter dnat to 198.51.100.11"
    );
    assert_eq!(
        Step::ReadRules(Family::V4, Hook::Output).to_string(),
        "read the rules of ip baton output"
    );
    assert_eq!(Step::DeleteTable(Family::V4).to_string(), "delete table ip baton");
}
