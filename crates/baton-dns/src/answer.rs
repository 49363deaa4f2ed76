//! From a [`Snapshot`] to DNS answers: the only module (with `server`) that speaks hickory.
//!
//! A snapshot is *compiled* once per change into a [`Compiled`] zone: hickory records per name,
//! the SOA/NS, and — for the hot path — the complete encoded UDP response for every
//! (name, A|AAAA, EDNS or not, rotation) combination. [`Compiled::answer`] is the reference
//! implementation that builds a response [`Message`] from a request; the templates are produced
//! by that same function, and [`Compiled::respond_udp`] only copies a template and patches the
//! request's ID, RD/CD flags and question spelling into it. Anything the fast path does not
//! recognise takes the reference path, so both agree by construction (and a property test
//! checks it).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use hickory_proto::op::{Edns, Message, MessageType, Metadata, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, NS, SOA};
use hickory_proto::rr::{DNSClass, LowerName, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::BinEncodable;

use crate::model::Snapshot;
use crate::{DnsError, DnsName};

/// The UDP payload size we advertise in EDNS answers (the DNS Flag Day 2020 value).
pub(crate) const EDNS_PAYLOAD: u16 = 1232;
/// The largest UDP answer for a client without EDNS.
const PLAIN_UDP_LIMIT: usize = 512;

/// Static, per-server zone settings (everything but the addresses).
#[derive(Debug, Clone)]
pub(crate) struct ZoneSettings {
    pub(crate) origin: DnsName,
    pub(crate) ttl: u32,
    /// Target of the apex NS record and SOA MNAME.
    pub(crate) ns_name: DnsName,
    /// Glue for `ns_name`, used when the store has no addresses of its own for it.
    pub(crate) ns_addresses: Vec<IpAddr>,
    /// Added to the snapshot generation to form the SOA serial.
    pub(crate) serial_base: u32,
}

fn to_name(name: &DnsName) -> Result<Name, DnsError> {
    Name::from_ascii(name.fqdn()).map_err(|e| DnsError::Internal(format!("name {name}: {e}")))
}

/// One name of the compiled zone.
#[derive(Debug)]
struct Entry {
    a: Vec<Record>,
    aaaa: Vec<Record>,
    rotation_a: AtomicUsize,
    rotation_aaaa: AtomicUsize,
}

/// What a question resolves to, before rendering.
#[derive(Debug, Clone, Copy)]
enum Resolution<'a> {
    Refused,
    FormErr,
    NotImp,
    BadVers,
    NxDomain,
    NoData,
    Soa,
    Ns,
    /// An A (`v6 == false`) or AAAA RRset, rotated.
    Addresses {
        entry: &'a Entry,
        v6: bool,
    },
    /// RFC 8482 minimal ANY answer: one RRset, unrotated.
    Any {
        entry: &'a Entry,
    },
}

/// Precomputed UDP responses of one (name, type): `[edns][rotation]`.
#[derive(Debug, Default)]
struct Templates {
    by_edns: [Vec<Vec<u8>>; 2],
}

/// Lower-case wire-format name → (entry key, A templates, AAAA templates).
type FastIndex = HashMap<Box<[u8]>, (LowerName, Templates, Templates)>;

/// A compiled zone: answers for one snapshot generation.
#[derive(Debug)]
pub(crate) struct Compiled {
    pub(crate) generation: u64,
    origin: LowerName,
    soa: Record,
    ns: Record,
    ns_target: LowerName,
    entries: HashMap<LowerName, Entry>,
    fast: FastIndex,
}

impl Compiled {
    /// Compiles `snapshot` for the zone described by `settings`. Names outside the zone are
    /// ignored (the CLI and the bootstrap phase reject them earlier).
    pub(crate) fn compile(settings: &ZoneSettings, snapshot: &Snapshot) -> Result<Self, DnsError> {
        let origin = to_name(&settings.origin)?;
        let ns_target = to_name(&settings.ns_name)?;
        let hostmaster = to_name(&DnsName::relative_to("hostmaster", &settings.origin)?)?;
        let ttl = settings.ttl;
        #[allow(clippy::cast_possible_truncation)] // the serial wraps by design (RFC 1982)
        let serial = settings.serial_base.wrapping_add(snapshot.generation as u32);
        let soa = Record::from_rdata(
            origin.clone(),
            ttl,
            RData::SOA(SOA::new(
                ns_target.clone(),
                hostmaster,
                serial,
                3600,
                600,
                86400,
                ttl,
            )),
        );
        let ns = Record::from_rdata(origin.clone(), ttl, RData::NS(NS(ns_target.clone())));

        let mut entries = HashMap::new();
        let add = |entries: &mut HashMap<LowerName, Entry>,
                   name: &DnsName,
                   ips: &[IpAddr]|
         -> Result<(), DnsError> {
            let owner = to_name(name)?;
            let mut entry = Entry {
                a: Vec::new(),
                aaaa: Vec::new(),
                rotation_a: AtomicUsize::new(0),
                rotation_aaaa: AtomicUsize::new(0),
            };
            for ip in ips {
                match ip {
                    IpAddr::V4(v4) => entry
                        .a
                        .push(Record::from_rdata(owner.clone(), ttl, RData::A(A(*v4)))),
                    IpAddr::V6(v6) => {
                        entry
                            .aaaa
                            .push(Record::from_rdata(owner.clone(), ttl, RData::AAAA(AAAA(*v6))));
                    }
                }
            }
            entries.insert(LowerName::new(&owner), entry);
            Ok(())
        };
        for (name, records) in snapshot.names() {
            if name.is_within(&settings.origin) {
                add(&mut entries, name, &records.served())?;
            }
        }
        let ns_key = LowerName::new(&ns_target);
        if settings.ns_name.is_within(&settings.origin) && !entries.contains_key(&ns_key) {
            add(&mut entries, &settings.ns_name, &settings.ns_addresses)?;
        }
        let origin_key = LowerName::new(&origin);
        if !entries.contains_key(&origin_key) {
            add(&mut entries, &settings.origin, &[])?;
        }

        let mut compiled = Self {
            generation: snapshot.generation,
            origin: origin_key,
            soa,
            ns,
            ns_target: ns_key,
            entries,
            fast: HashMap::new(),
        };
        compiled.fast = compiled.build_templates()?;
        Ok(compiled)
    }

    fn build_templates(&self) -> Result<FastIndex, DnsError> {
        let mut fast = HashMap::new();
        for (key, entry) in &self.entries {
            let name = Name::from(key);
            let wire = name
                .to_bytes()
                .map_err(|e| DnsError::Internal(format!("encoding {name}: {e}")))?
                .into_boxed_slice();
            let a = self.templates_for(&name, entry, false)?;
            let aaaa = self.templates_for(&name, entry, true)?;
            fast.insert(wire, (key.clone(), a, aaaa));
        }
        Ok(fast)
    }

    fn templates_for(&self, name: &Name, entry: &Entry, v6: bool) -> Result<Templates, DnsError> {
        let records = if v6 { &entry.aaaa } else { &entry.a };
        let qtype = if v6 { RecordType::AAAA } else { RecordType::A };
        let mut templates = Templates::default();
        for (edns, slot) in templates.by_edns.iter_mut().enumerate() {
            let mut request = Message::new(0, MessageType::Query, OpCode::Query);
            request.add_query(Query::query(name.clone(), qtype));
            if edns == 1 {
                let mut e = Edns::new();
                e.set_max_payload(EDNS_PAYLOAD);
                request.set_edns(e);
            }
            for rotation in 0..records.len().max(1) {
                let response = self.render(&request, Resolution::Addresses { entry, v6 }, rotation);
                slot.push(encode(&response)?);
            }
        }
        Ok(templates)
    }

    fn resolve(&self, request: &Message) -> Resolution<'_> {
        if request.edns.as_ref().is_some_and(|e| e.version() > 0) {
            return Resolution::BadVers;
        }
        match request.metadata.op_code {
            OpCode::Query => {}
            // An authoritative-only server that publishes what baton computes: no dynamic updates.
            OpCode::Update => return Resolution::Refused,
            _ => return Resolution::NotImp,
        }
        let [query] = request.queries.as_slice() else {
            return Resolution::FormErr;
        };
        if !matches!(query.query_class(), DNSClass::IN | DNSClass::ANY) {
            return Resolution::Refused;
        }
        let qname = LowerName::new(query.name());
        if !self.origin.zone_of(&qname) {
            return Resolution::Refused;
        }
        let qtype = query.query_type();
        if matches!(qtype, RecordType::AXFR | RecordType::IXFR) {
            return Resolution::Refused;
        }
        let Some(entry) = self.entries.get(&qname) else {
            // An empty non-terminal (a name with names below it) exists: NODATA, not NXDOMAIN.
            let exists = self.entries.keys().any(|k| k != &qname && qname.zone_of(k));
            return if exists {
                Resolution::NoData
            } else {
                Resolution::NxDomain
            };
        };
        let apex = qname == self.origin;
        match qtype {
            RecordType::A if !entry.a.is_empty() => Resolution::Addresses { entry, v6: false },
            RecordType::AAAA if !entry.aaaa.is_empty() => Resolution::Addresses { entry, v6: true },
            RecordType::NS if apex => Resolution::Ns,
            RecordType::ANY if !entry.a.is_empty() || !entry.aaaa.is_empty() => Resolution::Any { entry },
            RecordType::SOA | RecordType::ANY if apex => Resolution::Soa,
            _ => Resolution::NoData,
        }
    }

    /// The reference answer to `request`, consuming one step of rotation when it answers an
    /// address RRset. `None`: no answer at all (the message is a response, never answered).
    pub(crate) fn answer(&self, request: &Message) -> Option<Message> {
        if request.metadata.message_type == MessageType::Response {
            return None;
        }
        let resolution = self.resolve(request);
        let rotation = match resolution {
            Resolution::Addresses { entry, v6: false } => entry.rotation_a.fetch_add(1, Ordering::Relaxed),
            Resolution::Addresses { entry, v6: true } => entry.rotation_aaaa.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        Some(self.render(request, resolution, rotation))
    }

    fn render(&self, request: &Message, resolution: Resolution<'_>, rotation: usize) -> Message {
        let mut metadata = Metadata::new(
            request.metadata.id,
            MessageType::Response,
            request.metadata.op_code,
        );
        metadata.recursion_desired = request.metadata.recursion_desired;
        metadata.checking_disabled = request.metadata.checking_disabled;
        metadata.recursion_available = false;
        let mut response = Message::new(
            request.metadata.id,
            MessageType::Response,
            request.metadata.op_code,
        );
        if request.edns.is_some() {
            let mut edns = Edns::new();
            edns.set_max_payload(EDNS_PAYLOAD);
            response.set_edns(edns);
        }
        if !matches!(resolution, Resolution::FormErr) {
            response.add_queries(request.queries.iter().cloned());
        }
        let (code, authoritative) = match resolution {
            Resolution::Refused => (ResponseCode::Refused, false),
            Resolution::FormErr => (ResponseCode::FormErr, false),
            Resolution::NotImp => (ResponseCode::NotImp, false),
            Resolution::BadVers => (ResponseCode::BADVERS, false),
            Resolution::NxDomain => {
                response.add_authority(self.soa.clone());
                (ResponseCode::NXDomain, true)
            }
            Resolution::NoData => {
                response.add_authority(self.soa.clone());
                (ResponseCode::NoError, true)
            }
            Resolution::Soa => {
                response.add_answer(self.soa.clone());
                (ResponseCode::NoError, true)
            }
            Resolution::Ns => {
                response.add_answer(self.ns.clone());
                if let Some(glue) = self.entries.get(&self.ns_target) {
                    response.add_additionals(glue.a.iter().chain(&glue.aaaa).cloned());
                }
                (ResponseCode::NoError, true)
            }
            Resolution::Addresses { entry, v6 } => {
                let set = if v6 { &entry.aaaa } else { &entry.a };
                let start = rotation % set.len().max(1);
                response.add_answers(set[start..].iter().chain(&set[..start]).cloned());
                (ResponseCode::NoError, true)
            }
            Resolution::Any { entry } => {
                let set = if entry.a.is_empty() { &entry.aaaa } else { &entry.a };
                response.add_answers(set.iter().cloned());
                (ResponseCode::NoError, true)
            }
        };
        metadata.response_code = code;
        metadata.authoritative = authoritative;
        response.metadata = metadata;
        response
    }

    /// Answers one UDP datagram into `out`. Returns `false` when nothing must be sent (too short
    /// to carry a header, or a response). Never panics on any input.
    pub(crate) fn respond_udp(&self, packet: &[u8], out: &mut Vec<u8>) -> bool {
        out.clear();
        if let Some(fast) = crate::wire::SimpleQuery::parse(packet)
            && let Some(template) = self.fast_template(&fast, packet)
        {
            out.extend_from_slice(template);
            fast.patch(out, packet);
            return true;
        }
        self.respond_slow(packet, out, true)
    }

    fn fast_template(&self, query: &crate::wire::SimpleQuery, packet: &[u8]) -> Option<&[u8]> {
        let mut lower = [0_u8; 255];
        let name = query.lowercase_name(packet, &mut lower)?;
        let (key, a, aaaa) = self.fast.get(name)?;
        let entry = self.entries.get(key)?;
        let (templates, counter) = match query.qtype {
            1 if !entry.a.is_empty() => (a, &entry.rotation_a),
            28 if !entry.aaaa.is_empty() => (aaaa, &entry.rotation_aaaa),
            _ => return None,
        };
        let variants = &templates.by_edns[usize::from(query.edns_payload.is_some())];
        let limit = query
            .edns_payload
            .map_or(PLAIN_UDP_LIMIT, |p| usize::from(p.clamp(512, EDNS_PAYLOAD)));
        // Peek at the length first so an oversized RRset takes the slow (truncating) path
        // without consuming a rotation step twice.
        if variants.first().is_none_or(|t| t.len() > limit) {
            return None;
        }
        let index = counter.fetch_add(1, Ordering::Relaxed) % variants.len();
        variants.get(index).map(Vec::as_slice)
    }

    /// The reference path over raw bytes: parse with hickory, answer, encode (truncating for UDP).
    pub(crate) fn respond_slow(&self, packet: &[u8], out: &mut Vec<u8>, udp: bool) -> bool {
        out.clear();
        let (response, payload) = match Message::from_vec(packet) {
            Ok(request) => {
                let Some(response) = self.answer(&request) else {
                    return false;
                };
                let payload = request.edns.as_ref().map_or(PLAIN_UDP_LIMIT, |e| {
                    usize::from(e.max_payload().clamp(512, EDNS_PAYLOAD))
                });
                (response, payload)
            }
            Err(_) => match formerr_for(packet) {
                Some(response) => (response, PLAIN_UDP_LIMIT),
                None => return false,
            },
        };
        let limit = if udp { payload } else { usize::from(u16::MAX) };
        let Ok(mut bytes) = encode(&response) else {
            return false;
        };
        if bytes.len() > limit {
            let Ok(truncated) = encode(&response.truncate()) else {
                return false;
            };
            bytes = truncated;
        }
        out.extend_from_slice(&bytes);
        true
    }
}

/// FORMERR for a packet whose header is readable but whose body is not; nothing for a packet
/// shorter than a header or one that claims to be a response.
fn formerr_for(packet: &[u8]) -> Option<Message> {
    let header: &[u8; 12] = packet.get(..12)?.try_into().ok()?;
    if header[2] & 0x80 != 0 {
        return None;
    }
    let id = u16::from_be_bytes([header[0], header[1]]);
    let op_code = OpCode::from_u8((header[2] >> 3) & 0x0f);
    let mut response = Message::error_msg(id, op_code, ResponseCode::FormErr);
    response.metadata.recursion_desired = header[2] & 0x01 != 0;
    Some(response)
}

fn encode(message: &Message) -> Result<Vec<u8>, DnsError> {
    message
        .to_vec()
        .map_err(|e| DnsError::Internal(format!("encoding a response: {e}")))
}

#[cfg(test)]
mod tests;
