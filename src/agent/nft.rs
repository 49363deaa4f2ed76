//! nftables over netlink, pure: the messages that replace baton's tables in one transaction,
//! the requests that read them back, and the decoding of the kernel's answers. No I/O here:
//! `netlink.rs` sends what this builds and hands back what the kernel answered.
//!
//! ```text
//!  FIPs, held FIPs ─► replace_batch ─► BATCH_BEGIN
//!                           per family touched:  NEWTABLE baton   (creates it if absent)
//!                                                DELTABLE baton   (so the next one starts empty)
//!                                                if it has FIPs:  NEWTABLE baton
//!                                                                 NEWCHAIN prerouting (nat, hook
//!                                                                          prerouting, prio -100)
//!                                                                 NEWRULE  daddr FIP counter redirect
//!                                                                          … one per FIP
//!                                                                 NEWCHAIN output (nat, hook output,
//!                                                                          prio -100)
//!                                                                 NEWRULE  daddr FIP counter dnat to ADDR
//!                                                                          … one per FIP held here
//!                           BATCH_END      ─► the kernel commits all of it, or none of it
//!  get_table / get_chain / get_rules ─► the kernel's NEWTABLE / NEWCHAIN / NEWRULE answers
//!                                    ─► answer(): Chain, Rule (its FIP, target and counter), Ack, Error
//! ```
//!
//! Every message of a batch asks for an acknowledgement and carries its own sequence number, so
//! an error names the step that failed ([`Step`]). Layouts follow the kernel's uapi
//! (`linux/netlink.h`, `linux/netfilter/nfnetlink.h`, `linux/netfilter/nf_tables.h`); the unit
//! tests compare them with the bytes `nft` 1.0.6 sends and kernel 6.18 answers.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

/// The table baton owns in each family (`ip baton`, `ip6 baton`).
pub const TABLE: &str = "baton";
/// Its chains' priority: dstnat, where kube-proxy's and every other destination NAT runs.
pub const PRIORITY: i32 = -100;

// linux/netlink.h
const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_HDRLEN: usize = 4;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

// linux/netfilter/nfnetlink.h
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFGENMSG_LEN: usize = 4;

// linux/netfilter/nf_tables.h
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_GETRULE: u16 = 7;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_COUNTER_PACKETS: u16 = 2;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_NAT_TYPE: u16 = 1;
const NFTA_NAT_FAMILY: u16 = 2;
const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
const NFTA_NAT_REG_ADDR_MAX: u16 = 4;
const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
const NFTA_NAT_REG_PROTO_MAX: u16 = 6;
const NFTA_NAT_FLAGS: u16 = 7;

const NF_INET_PRE_ROUTING: u32 = 0;
const NF_INET_LOCAL_OUT: u32 = 3;
const NF_ACCEPT: u32 = 1;
const NFT_REG_1: u32 = 1;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_CMP_EQ: u32 = 0;
const NFT_NAT_DNAT: u32 = 1;
// linux/netfilter/nf_nat.h
const NF_NAT_RANGE_MAP_IPS: u32 = 1;

/// An address family baton keeps a table in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// `ip baton`.
    V4,
    /// `ip6 baton`.
    V6,
}

impl Family {
    /// Both, IPv4 first.
    pub const ALL: [Self; 2] = [Self::V4, Self::V6];

    /// The family of an address.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }

    /// The `nfgen_family` (`NFPROTO_IPV4`, `NFPROTO_IPV6`).
    fn nfproto(self) -> u8 {
        match self {
            Self::V4 => 2,
            Self::V6 => 10,
        }
    }

    /// Where the destination address is in the network header, and its length.
    fn daddr(self) -> (u32, u32) {
        match self {
            Self::V4 => (16, 4),
            Self::V6 => (24, 16),
        }
    }

    /// The name `nft` gives the family.
    pub fn name(self) -> &'static str {
        match self {
            Self::V4 => "ip",
            Self::V6 => "ip6",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// baton's chains in each table, one per hook (type nat, priority -100, policy accept).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Hook {
    /// `prerouting`: packets from the network addressed to a FIP, `redirect`ed to the node.
    Prerouting,
    /// `output`: the node's own packets to a FIP the node holds, `dnat`ed to its own address
    /// (the cloud's router would send them back to it, and it drops its own source address).
    Output,
}

impl Hook {
    /// Both, in the order the batch creates them.
    pub const ALL: [Self; 2] = [Self::Prerouting, Self::Output];

    /// The chain's name (the hook's, as `nft` calls it).
    pub fn name(self) -> &'static str {
        match self {
            Self::Prerouting => "prerouting",
            Self::Output => "output",
        }
    }

    /// `NF_INET_PRE_ROUTING`, `NF_INET_LOCAL_OUT`.
    fn number(self) -> u32 {
        match self {
            Self::Prerouting => NF_INET_PRE_ROUTING,
            Self::Output => NF_INET_LOCAL_OUT,
        }
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one netlink message asks the kernel to do: the step an error names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The transaction as a whole (its begin/end messages and the commit).
    Commit,
    /// Creates the table if it is absent (so that deleting it cannot fail).
    AddTable(Family),
    DeleteTable(Family),
    CreateTable(Family),
    CreateChain(Family, Hook),
    /// The FIP's `redirect` in prerouting.
    AddRule(IpAddr),
    /// The held FIP's `dnat to` the node's address in output.
    AddLocalRule {
        fip: IpAddr,
        to: IpAddr,
    },
    ReadTable(Family),
    ReadChain(Family, Hook),
    ReadRules(Family, Hook),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Commit => f.write_str("commit the transaction"),
            Self::AddTable(fam) => write!(f, "add table {fam} {TABLE}"),
            Self::DeleteTable(fam) => write!(f, "delete table {fam} {TABLE}"),
            Self::CreateTable(fam) => write!(f, "create table {fam} {TABLE}"),
            Self::CreateChain(fam, hook) => write!(
                f,
                "add chain {fam} {TABLE} {hook} (type nat hook {hook} priority {PRIORITY})"
            ),
            Self::AddRule(ip) => write!(
                f,
                "add rule {fam} {TABLE} {hook} {fam} daddr {ip} counter redirect",
                fam = Family::of(*ip),
                hook = Hook::Prerouting,
            ),
            Self::AddLocalRule { fip, to } => write!(
                f,
                "add rule {fam} {TABLE} {hook} {fam} daddr {fip} counter dnat to {to}",
                fam = Family::of(*fip),
                hook = Hook::Output,
            ),
            Self::ReadTable(fam) => write!(f, "read table {fam} {TABLE}"),
            Self::ReadChain(fam, hook) => write!(f, "read chain {fam} {TABLE} {hook}"),
            Self::ReadRules(fam, hook) => write!(f, "read the rules of {fam} {TABLE} {hook}"),
        }
    }
}

/// A transaction: the bytes to send in one `sendto`, and the step of each acknowledged message.
#[derive(Clone, Debug)]
pub struct Batch {
    pub bytes: Vec<u8>,
    /// Sequence number → step, for every message the kernel acknowledges.
    pub steps: Vec<(u32, Step)>,
    /// The sequence number of the begin message (a malformed batch is answered on it).
    pub begin_seq: u32,
}

impl Batch {
    /// The step a sequence number belongs to ([`Step::Commit`] for the begin and end messages,
    /// and for a commit that failed).
    pub fn step_of(&self, seq: u32) -> Step {
        self.steps
            .iter()
            .find(|(s, _)| *s == seq)
            .map_or(Step::Commit, |(_, step)| step.clone())
    }
}

/// The transaction that leaves, for each of `families`, exactly `fips`' and `held`'s rules of
/// that family: the table is created (if absent) and deleted, then, when the family has FIPs,
/// created again with the chain `prerouting` and one `redirect` rule per FIP, and the chain
/// `output` (always, so that the table has one shape) and one `dnat` rule per held FIP (FIP →
/// the node's address it goes to; an entry whose two addresses are not of one family is
/// skipped: no rule can hold it). A family not in `families` is not touched. Sequence numbers
/// start at `seq`.
pub fn replace_batch(
    fips: &BTreeSet<IpAddr>,
    held: &BTreeMap<IpAddr, IpAddr>,
    families: &[Family],
    seq: u32,
) -> Batch {
    let mut w = Writer::default();
    let mut steps = Vec::new();
    let mut next = seq;
    let mut take = || {
        let s = next;
        next = next.wrapping_add(1);
        s
    };
    let begin_seq = take();
    w.batch_marker(NFNL_MSG_BATCH_BEGIN, begin_seq);
    for &family in families {
        let s = take();
        w.table(NFT_MSG_NEWTABLE, NLM_F_CREATE, s, family);
        steps.push((s, Step::AddTable(family)));
        let s = take();
        w.table(NFT_MSG_DELTABLE, 0, s, family);
        steps.push((s, Step::DeleteTable(family)));
        let own: Vec<IpAddr> = fips
            .iter()
            .copied()
            .filter(|ip| Family::of(*ip) == family)
            .collect();
        if own.is_empty() {
            continue;
        }
        let s = take();
        w.table(NFT_MSG_NEWTABLE, NLM_F_CREATE, s, family);
        steps.push((s, Step::CreateTable(family)));
        let s = take();
        w.chain(s, family, Hook::Prerouting);
        steps.push((s, Step::CreateChain(family, Hook::Prerouting)));
        for ip in own {
            let s = take();
            w.rule(s, ip);
            steps.push((s, Step::AddRule(ip)));
        }
        let s = take();
        w.chain(s, family, Hook::Output);
        steps.push((s, Step::CreateChain(family, Hook::Output)));
        for (&fip, &to) in held
            .iter()
            .filter(|(fip, to)| Family::of(**fip) == family && Family::of(**to) == family)
        {
            let s = take();
            w.local_rule(s, fip, to);
            steps.push((s, Step::AddLocalRule { fip, to }));
        }
    }
    let end = take();
    w.batch_marker(NFNL_MSG_BATCH_END, end);
    Batch {
        bytes: w.buf,
        steps,
        begin_seq,
    }
}

/// `GETTABLE ip|ip6 baton`: answered by the table and an acknowledgement, or by ENOENT.
pub fn get_table(family: Family, seq: u32) -> Vec<u8> {
    let mut w = Writer::default();
    w.message(
        nft_type(NFT_MSG_GETTABLE),
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        family,
        |w| {
            w.attr_str(NFTA_TABLE_NAME, TABLE);
        },
    );
    w.buf
}

/// `GETCHAIN ip|ip6 baton <hook>`: answered by the chain and an acknowledgement, or ENOENT.
pub fn get_chain(family: Family, hook: Hook, seq: u32) -> Vec<u8> {
    let mut w = Writer::default();
    w.message(
        nft_type(NFT_MSG_GETCHAIN),
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        family,
        |w| {
            w.attr_str(NFTA_CHAIN_TABLE, TABLE);
            w.attr_str(NFTA_CHAIN_NAME, hook.name());
        },
    );
    w.buf
}

/// A dump of the rules of `ip|ip6 baton <hook>`: one NEWRULE each, then DONE.
pub fn get_rules(family: Family, hook: Hook, seq: u32) -> Vec<u8> {
    let mut w = Writer::default();
    w.message(
        nft_type(NFT_MSG_GETRULE),
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        family,
        |w| {
            w.attr_str(NFTA_RULE_TABLE, TABLE);
            w.attr_str(NFTA_RULE_CHAIN, hook.name());
        },
    );
    w.buf
}

fn nft_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | msg
}

/// Builds netlink messages in a buffer.
#[derive(Default)]
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// One message: `nlmsghdr`, `nfgenmsg` (version 0, resource id 0), then `body`'s attributes.
    fn message(&mut self, ty: u16, flags: u16, seq: u32, family: Family, body: impl FnOnce(&mut Self)) {
        self.raw_message(ty, flags, seq, family.nfproto(), 0, body);
    }

    fn raw_message(
        &mut self,
        ty: u16,
        flags: u16,
        seq: u32,
        nfproto: u8,
        res_id: u16,
        body: impl FnOnce(&mut Self),
    ) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; 4]); // nlmsg_len, set below
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: the kernel
        self.buf.push(nfproto);
        self.buf.push(0); // NFNETLINK_V0
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        body(self);
        let len = u32::try_from(self.buf.len() - start).unwrap_or(u32::MAX);
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// `NFNL_MSG_BATCH_BEGIN` / `_END`: family unspecified, resource id the nftables subsystem.
    fn batch_marker(&mut self, ty: u16, seq: u32) {
        self.raw_message(ty, NLM_F_REQUEST, seq, 0, NFNL_SUBSYS_NFTABLES, |_| {});
    }

    fn table(&mut self, msg: u16, extra_flags: u16, seq: u32, family: Family) {
        let flags = NLM_F_REQUEST | NLM_F_ACK | extra_flags;
        self.message(nft_type(msg), flags, seq, family, |w| {
            w.attr_str(NFTA_TABLE_NAME, TABLE);
            if msg == NFT_MSG_NEWTABLE {
                w.attr_u32(NFTA_TABLE_FLAGS, 0);
            }
        });
    }

    fn chain(&mut self, seq: u32, family: Family, hook: Hook) {
        let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE;
        self.message(nft_type(NFT_MSG_NEWCHAIN), flags, seq, family, |w| {
            w.attr_str(NFTA_CHAIN_TABLE, TABLE);
            w.attr_str(NFTA_CHAIN_NAME, hook.name());
            w.attr_str(NFTA_CHAIN_TYPE, "nat");
            w.attr_u32(NFTA_CHAIN_POLICY, NF_ACCEPT);
            w.nested(NFTA_CHAIN_HOOK, |w| {
                w.attr_u32(NFTA_HOOK_HOOKNUM, hook.number());
                w.attr_u32(NFTA_HOOK_PRIORITY, PRIORITY.cast_unsigned());
            });
        });
    }

    /// `<family> daddr <ip> counter redirect` in prerouting: payload load of the destination
    /// address into register 1, compare equal, count, redirect (to the primary address of the
    /// interface the packet came in on, ports kept).
    fn rule(&mut self, seq: u32, ip: IpAddr) {
        self.fip_rule(seq, ip, Hook::Prerouting, |w| w.expr("redir", |_| {}));
    }

    /// `<family> daddr <fip> counter dnat to <to>` in output: the same match and counter, then
    /// `to` loaded into register 1 and a destination NAT to the address in it (ports kept).
    fn local_rule(&mut self, seq: u32, fip: IpAddr, to: IpAddr) {
        let family = Family::of(fip);
        self.fip_rule(seq, fip, Hook::Output, |w| {
            w.expr("immediate", |w| {
                w.attr_u32(NFTA_IMMEDIATE_DREG, NFT_REG_1);
                w.nested(NFTA_IMMEDIATE_DATA, |w| w.attr(NFTA_DATA_VALUE, &octets(to)));
            });
            w.expr("nat", |w| {
                w.attr_u32(NFTA_NAT_TYPE, NFT_NAT_DNAT);
                w.attr_u32(NFTA_NAT_FAMILY, u32::from(family.nfproto()));
                w.attr_u32(NFTA_NAT_REG_ADDR_MIN, NFT_REG_1);
            });
        });
    }

    /// A rule in `hook`'s chain: `daddr <ip>` (payload, cmp), `counter`, then `action`'s
    /// expressions.
    fn fip_rule(&mut self, seq: u32, ip: IpAddr, hook: Hook, action: impl FnOnce(&mut Self)) {
        let family = Family::of(ip);
        let (offset, len) = family.daddr();
        let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_APPEND;
        self.message(nft_type(NFT_MSG_NEWRULE), flags, seq, family, |w| {
            w.attr_str(NFTA_RULE_TABLE, TABLE);
            w.attr_str(NFTA_RULE_CHAIN, hook.name());
            w.nested(NFTA_RULE_EXPRESSIONS, |w| {
                w.expr("payload", |w| {
                    w.attr_u32(NFTA_PAYLOAD_DREG, NFT_REG_1);
                    w.attr_u32(NFTA_PAYLOAD_BASE, NFT_PAYLOAD_NETWORK_HEADER);
                    w.attr_u32(NFTA_PAYLOAD_OFFSET, offset);
                    w.attr_u32(NFTA_PAYLOAD_LEN, len);
                });
                w.expr("cmp", |w| {
                    w.attr_u32(NFTA_CMP_SREG, NFT_REG_1);
                    w.attr_u32(NFTA_CMP_OP, NFT_CMP_EQ);
                    w.nested(NFTA_CMP_DATA, |w| w.attr(NFTA_DATA_VALUE, &octets(ip)));
                });
                w.expr("counter", |_| {});
                action(w);
            });
        });
    }

    fn expr(&mut self, name: &str, data: impl FnOnce(&mut Self)) {
        self.nested(NFTA_LIST_ELEM, |w| {
            w.attr_str(NFTA_EXPR_NAME, name);
            w.nested(NFTA_EXPR_DATA, data);
        });
    }

    fn attr(&mut self, ty: u16, data: &[u8]) {
        let len = u16::try_from(NLA_HDRLEN + data.len()).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn attr_str(&mut self, ty: u16, s: &str) {
        let mut data = s.as_bytes().to_vec();
        data.push(0);
        self.attr(ty, &data);
    }

    fn attr_u32(&mut self, ty: u16, v: u32) {
        self.attr(ty, &v.to_be_bytes());
    }

    fn nested(&mut self, ty: u16, body: impl FnOnce(&mut Self)) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; 2]);
        self.buf.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        body(self);
        let len = u16::try_from(self.buf.len() - start).unwrap_or(u16::MAX);
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }
}

/// An answer that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed netlink answer: {0}")]
pub struct DecodeError(pub &'static str);

/// One netlink message of an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message<'a> {
    pub ty: u16,
    pub flags: u16,
    pub seq: u32,
    /// Everything after the `nlmsghdr`.
    pub body: &'a [u8],
}

/// The messages in one datagram from the kernel.
pub fn messages(mut buf: &[u8]) -> Result<Vec<Message<'_>>, DecodeError> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32_ne(&buf[0..4]) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return Err(DecodeError("message length out of bounds"));
        }
        out.push(Message {
            ty: u16::from_ne_bytes([buf[4], buf[5]]),
            flags: u16::from_ne_bytes([buf[6], buf[7]]),
            seq: u32_ne(&buf[8..12]),
            body: &buf[NLMSG_HDRLEN..len],
        });
        buf = &buf[align4(len).min(buf.len())..];
    }
    Ok(out)
}

/// What a message of the kernel says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The request with this sequence number succeeded.
    Ack { seq: u32 },
    /// It failed with this errno (positive).
    Error { seq: u32, errno: i32 },
    /// The end of a dump; `errno` is 0 unless the dump failed.
    Done { seq: u32, errno: i32 },
    /// A table (the answer to `get_table`).
    Table,
    /// A chain (the answer to `get_chain`).
    Chain(ChainInfo),
    /// A rule (one answer of the `get_rules` dump).
    Rule(RuleInfo),
    /// Something else (e.g. a message of another subsystem); ignored.
    Other { ty: u16 },
}

/// A chain as the kernel describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChainInfo {
    pub hook: Option<u32>,
    pub priority: Option<i32>,
    pub kind: Option<String>,
    pub policy: Option<u32>,
}

impl ChainInfo {
    /// Whether it is the chain baton creates for `hook`: type nat, that hook, priority -100,
    /// policy accept.
    pub fn is_ours(&self, hook: Hook) -> bool {
        self.hook == Some(hook.number())
            && self.priority == Some(PRIORITY)
            && self.kind.as_deref() == Some("nat")
            && self.policy.is_none_or(|p| p == NF_ACCEPT)
    }
}

/// A rule as the kernel describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleInfo {
    /// One of baton's prerouting rules: `daddr <ip> counter redirect`, and the counter's
    /// packets (NAT chains see only the first packet of each connection: the connections
    /// redirected).
    Fip { ip: IpAddr, connections: u64 },
    /// One of baton's output rules: `daddr <fip> counter dnat to <to>`, and its counter (the
    /// node's own connections to the FIP delivered to `to`).
    Local {
        fip: IpAddr,
        to: IpAddr,
        connections: u64,
    },
    /// Any other rule, described.
    Other(String),
}

/// Decodes one message of the kernel.
pub fn answer(msg: &Message<'_>) -> Result<Answer, DecodeError> {
    match msg.ty {
        NLMSG_ERROR => {
            let code = msg
                .body
                .get(0..4)
                .map(i32_ne)
                .ok_or(DecodeError("short error message"))?;
            Ok(if code == 0 {
                Answer::Ack { seq: msg.seq }
            } else {
                Answer::Error {
                    seq: msg.seq,
                    errno: code.saturating_neg(),
                }
            })
        }
        NLMSG_DONE => Ok(Answer::Done {
            seq: msg.seq,
            errno: msg.body.get(0..4).map_or(0, |b| i32_ne(b).saturating_neg()),
        }),
        ty if ty == nft_type(NFT_MSG_NEWTABLE) => Ok(Answer::Table),
        ty if ty == nft_type(NFT_MSG_NEWCHAIN) => Ok(Answer::Chain(chain_info(&nft_attrs(msg.body)?)?)),
        ty if ty == nft_type(NFT_MSG_NEWRULE) => {
            let family = match msg.body.first() {
                Some(2) => Family::V4,
                Some(10) => Family::V6,
                _ => return Ok(Answer::Rule(RuleInfo::Other("rule of another family".into()))),
            };
            Ok(Answer::Rule(rule_info(family, &nft_attrs(msg.body)?)?))
        }
        ty => Ok(Answer::Other { ty }),
    }
}

/// The attributes after the `nfgenmsg` of an nf_tables message.
fn nft_attrs(body: &[u8]) -> Result<Vec<(u16, &[u8])>, DecodeError> {
    attrs(body.get(NFGENMSG_LEN..).ok_or(DecodeError("no nfgenmsg"))?)
}

/// Attributes: (type without the nested / byte-order flags, payload).
fn attrs(mut data: &[u8]) -> Result<Vec<(u16, &[u8])>, DecodeError> {
    let mut out = Vec::new();
    while data.len() >= NLA_HDRLEN {
        let len = usize::from(u16::from_ne_bytes([data[0], data[1]]));
        let ty = u16::from_ne_bytes([data[2], data[3]]) & NLA_TYPE_MASK;
        if len < NLA_HDRLEN || len > data.len() {
            return Err(DecodeError("attribute length out of bounds"));
        }
        out.push((ty, &data[NLA_HDRLEN..len]));
        data = &data[align4(len).min(data.len())..];
    }
    Ok(out)
}

fn find<'a>(attrs: &[(u16, &'a [u8])], ty: u16) -> Option<&'a [u8]> {
    attrs.iter().find(|(t, _)| *t == ty).map(|(_, v)| *v)
}

fn be_u32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.try_into().ok()?))
}

fn be_u64(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.try_into().ok()?))
}

fn string(v: &[u8]) -> String {
    String::from_utf8_lossy(v.split(|b| *b == 0).next().unwrap_or_default()).into_owned()
}

fn chain_info(attrs: &[(u16, &[u8])]) -> Result<ChainInfo, DecodeError> {
    let mut info = ChainInfo {
        kind: find(attrs, NFTA_CHAIN_TYPE).map(string),
        policy: find(attrs, NFTA_CHAIN_POLICY).and_then(be_u32),
        ..ChainInfo::default()
    };
    if let Some(hook) = find(attrs, NFTA_CHAIN_HOOK) {
        let hook = self::attrs(hook)?;
        info.hook = find(&hook, NFTA_HOOK_HOOKNUM).and_then(be_u32);
        info.priority = find(&hook, NFTA_HOOK_PRIORITY)
            .and_then(be_u32)
            .map(u32::cast_signed);
    }
    Ok(info)
}

/// One expression: its name and its attributes.
type Expr<'a> = (String, Vec<(u16, &'a [u8])>);

fn rule_info(family: Family, attrs: &[(u16, &[u8])]) -> Result<RuleInfo, DecodeError> {
    let Some(list) = find(attrs, NFTA_RULE_EXPRESSIONS) else {
        return Ok(RuleInfo::Other("a rule without expressions".into()));
    };
    let mut exprs: Vec<Expr<'_>> = Vec::new();
    for (ty, elem) in self::attrs(list)? {
        if ty != NFTA_LIST_ELEM {
            continue;
        }
        let elem = self::attrs(elem)?;
        let name = find(&elem, NFTA_EXPR_NAME).map(string).unwrap_or_default();
        let data = find(&elem, NFTA_EXPR_DATA).map_or(Ok(Vec::new()), self::attrs)?;
        exprs.push((name, data));
    }
    Ok(fip_rule(family, &exprs).unwrap_or_else(|| {
        let names: Vec<&str> = exprs.iter().map(|(n, _)| n.as_str()).collect();
        RuleInfo::Other(format!("a rule of expressions [{}]", names.join(", ")))
    }))
}

/// `payload (daddr) · cmp eq <ip> · counter`, then `redir` with no port (a prerouting rule of
/// baton's) or `immediate <to> · nat dnat` to that address alone (an output rule of baton's).
fn fip_rule(family: Family, exprs: &[Expr<'_>]) -> Option<RuleInfo> {
    let [(load, payload), (compare, cmp), (count, counter), action @ ..] = exprs else {
        return None;
    };
    if (load.as_str(), compare.as_str(), count.as_str()) != ("payload", "cmp", "counter") {
        return None;
    }
    let (offset, len) = family.daddr();
    let reg = num(payload, NFTA_PAYLOAD_DREG)?;
    let loads_daddr = num(payload, NFTA_PAYLOAD_BASE) == Some(NFT_PAYLOAD_NETWORK_HEADER)
        && num(payload, NFTA_PAYLOAD_OFFSET) == Some(offset)
        && num(payload, NFTA_PAYLOAD_LEN) == Some(len);
    let compares = num(cmp, NFTA_CMP_SREG) == Some(reg) && num(cmp, NFTA_CMP_OP) == Some(NFT_CMP_EQ);
    if !loads_daddr || !compares {
        return None;
    }
    let ip = address(family, find(cmp, NFTA_CMP_DATA)?)?;
    let connections = find(counter, NFTA_COUNTER_PACKETS).and_then(be_u64).unwrap_or(0);
    match action {
        [(redirect, redir)] if redirect == "redir" && redir.is_empty() => {
            Some(RuleInfo::Fip { ip, connections })
        }
        [(load, immediate), (translate, nat)] if load == "immediate" && translate == "nat" => {
            let to = dnat_target(family, immediate, nat)?;
            Some(RuleInfo::Local {
                fip: ip,
                to,
                connections,
            })
        }
        _ => None,
    }
}

/// The address of `immediate <to> · nat dnat <family> addr reg` (ports kept, no other flag
/// than the one the kernel adds for an address range): where the rule sends the packet.
fn dnat_target(family: Family, immediate: &[(u16, &[u8])], nat: &[(u16, &[u8])]) -> Option<IpAddr> {
    let reg = num(immediate, NFTA_IMMEDIATE_DREG)?;
    let to = address(family, find(immediate, NFTA_IMMEDIATE_DATA)?)?;
    let dnat = num(nat, NFTA_NAT_TYPE) == Some(NFT_NAT_DNAT)
        && num(nat, NFTA_NAT_FAMILY) == Some(u32::from(family.nfproto()))
        && num(nat, NFTA_NAT_REG_ADDR_MIN) == Some(reg)
        && num(nat, NFTA_NAT_REG_ADDR_MAX).is_none_or(|r| r == reg)
        && num(nat, NFTA_NAT_FLAGS).is_none_or(|f| f == NF_NAT_RANGE_MAP_IPS)
        && find(nat, NFTA_NAT_REG_PROTO_MIN).is_none()
        && find(nat, NFTA_NAT_REG_PROTO_MAX).is_none();
    dnat.then_some(to)
}

/// A `u32` attribute.
fn num(attrs: &[(u16, &[u8])], ty: u16) -> Option<u32> {
    find(attrs, ty).and_then(be_u32)
}

/// The address in a nested `NFTA_DATA_VALUE` of `family`'s length.
fn address(family: Family, data: &[u8]) -> Option<IpAddr> {
    let data = self::attrs(data).ok()?;
    let value = find(&data, NFTA_DATA_VALUE)?;
    Some(match family {
        Family::V4 => IpAddr::from(<[u8; 4]>::try_from(value).ok()?),
        Family::V6 => IpAddr::from(<[u8; 16]>::try_from(value).ok()?),
    })
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn u32_ne(b: &[u8]) -> u32 {
    u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

fn i32_ne(b: &[u8]) -> i32 {
    i32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests;
