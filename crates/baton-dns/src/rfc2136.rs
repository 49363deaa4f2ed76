//! Publishing the API names to the site's DNS server by RFC 2136 dynamic update, TSIG-signed.
//!
//! `push` reads the current A/AAAA RRsets of every name from the server, and if any differs
//! from the desired (served) addresses or TTL, sends ONE signed UPDATE that deletes and re-adds
//! exactly those RRsets (so the change is atomic on the server), then queries the server again
//! to verify. Re-running with the same records sends no update ([`PushOutcome::Unchanged`]).
//!
//! Errors are classified: a TSIG rejection (BADSIG, BADKEY, BADTIME, NOTAUTH, or a reply not
//! signed with our key) is [`DnsError::AuthFailed`], never a parse error.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hickory_proto::op::{Message, OpCode, Query, ResponseCode, UpdateMessage};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tracing::{debug, info};

use crate::model::Snapshot;
use crate::{DnsError, DnsName, TsigKey};

/// Where to push.
#[derive(Debug, Clone)]
pub struct PushTarget {
    /// The primary server accepting updates, e.g. `192.0.2.53:53`.
    pub server: SocketAddr,
    /// The zone to update (its SOA owner), e.g. `c1.example.com`.
    pub zone: DnsName,
    /// TTL of the records written.
    pub ttl: u32,
    /// Timeout of each exchange.
    pub timeout: Duration,
}

impl PushTarget {
    /// A target with TTL 30 s and a 3 s timeout.
    pub fn new(server: SocketAddr, zone: DnsName) -> Self {
        Self {
            server,
            zone,
            ttl: 30,
            timeout: Duration::from_secs(3),
        }
    }
}

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    /// The server had other records; they were replaced (and verified).
    Changed,
    /// The server already had exactly these records; nothing was sent.
    Unchanged,
}

/// RFC 2136 publisher for one server and zone.
#[derive(Debug, Clone)]
pub struct Rfc2136Publisher {
    target: PushTarget,
    key: TsigKey,
}

/// The desired or observed RRsets of one name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RrSets {
    v4: BTreeSet<IpAddr>,
    v6: BTreeSet<IpAddr>,
    /// TTLs seen (observed) or wanted (desired; empty when the name has no records).
    ttls: BTreeSet<u32>,
}

impl Rfc2136Publisher {
    /// A publisher for `target`, signing with `key`.
    pub fn new(target: PushTarget, key: TsigKey) -> Self {
        Self { target, key }
    }

    /// Makes the server's A/AAAA RRsets of every name in `records` equal the served addresses
    /// (healthy ones, or all if none is healthy), then verifies them.
    pub async fn push(&self, records: &Snapshot) -> Result<PushOutcome, DnsError> {
        let zone = &self.target.zone;
        let mut changes = Vec::new();
        for (name, recs) in records.names() {
            if !name.is_within(zone) {
                return Err(DnsError::Config(format!("name {name} is not inside zone {zone}")));
            }
            let desired = self.desired(recs.served());
            let current = self.lookup(name).await?;
            if current != desired {
                debug!(%name, ?current, ?desired, "RRsets differ");
                changes.push((name.clone(), desired));
            }
        }
        if changes.is_empty() {
            info!(zone = %zone, server = %self.target.server, "DNS records already up to date");
            return Ok(PushOutcome::Unchanged);
        }
        self.update(&changes).await?;
        for (name, desired) in &changes {
            let actual = self.lookup(name).await?;
            if actual.v4 != desired.v4 || actual.v6 != desired.v6 {
                return Err(DnsError::VerifyMismatch {
                    name: name.fqdn(),
                    expected: desired.v4.iter().chain(&desired.v6).copied().collect(),
                    actual: actual.v4.iter().chain(&actual.v6).copied().collect(),
                });
            }
        }
        info!(zone = %zone, server = %self.target.server, names = changes.len(), "DNS records replaced and verified");
        Ok(PushOutcome::Changed)
    }

    /// Checks that the server answers exactly the served addresses of every name.
    pub async fn verify(&self, records: &Snapshot) -> Result<(), DnsError> {
        for (name, recs) in records.names() {
            let desired = self.desired(recs.served());
            let actual = self.lookup(name).await?;
            if actual.v4 != desired.v4 || actual.v6 != desired.v6 {
                return Err(DnsError::VerifyMismatch {
                    name: name.fqdn(),
                    expected: desired.v4.iter().chain(&desired.v6).copied().collect(),
                    actual: actual.v4.iter().chain(&actual.v6).copied().collect(),
                });
            }
        }
        Ok(())
    }

    fn desired(&self, served: Vec<IpAddr>) -> RrSets {
        let ttls = if served.is_empty() {
            BTreeSet::new()
        } else {
            BTreeSet::from([self.target.ttl])
        };
        let (v4, v6) = served.into_iter().partition(IpAddr::is_ipv4);
        RrSets { v4, v6, ttls }
    }

    async fn lookup(&self, name: &DnsName) -> Result<RrSets, DnsError> {
        let mut sets = RrSets {
            v4: BTreeSet::new(),
            v6: BTreeSet::new(),
            ttls: BTreeSet::new(),
        };
        for qtype in [RecordType::A, RecordType::AAAA] {
            let step = format!("query {name} {qtype}");
            let owner = hickory_name(name)?;
            let mut query = Message::query();
            query.metadata.recursion_desired = false;
            query.add_query(Query::query(owner, qtype));
            let bytes = query.to_vec().map_err(|e| self.exchange_error(&step, &e))?;
            let response = self.exchange(&bytes, query.metadata.id, &step, true).await?;
            let response = Message::from_vec(&response).map_err(|e| self.exchange_error(&step, &e))?;
            match response.metadata.response_code {
                ResponseCode::NoError | ResponseCode::NXDomain => {}
                other => {
                    return Err(DnsError::Exchange {
                        server: self.target.server,
                        step,
                        reason: format!("server answered {other}"),
                    });
                }
            }
            for record in &response.answers {
                match &record.data {
                    RData::A(a) => {
                        sets.v4.insert(IpAddr::V4(a.0));
                        sets.ttls.insert(record.ttl);
                    }
                    RData::AAAA(a) => {
                        sets.v6.insert(IpAddr::V6(a.0));
                        sets.ttls.insert(record.ttl);
                    }
                    _ => {}
                }
            }
        }
        Ok(sets)
    }

    /// Sends one signed UPDATE replacing the A and AAAA RRsets of every name in `changes`.
    async fn update(&self, changes: &[(DnsName, RrSets)]) -> Result<(), DnsError> {
        let server = self.target.server;
        let step = "update".to_owned();
        let zone = hickory_name(&self.target.zone)?;
        let mut message = Message::query();
        message.metadata.op_code = OpCode::Update;
        message.metadata.recursion_desired = false;
        let mut zone_query = Query::new();
        zone_query
            .set_name(zone)
            .set_query_class(DNSClass::IN)
            .set_query_type(RecordType::SOA);
        message.add_zone(zone_query);
        for (name, desired) in changes {
            let owner = hickory_name(name)?;
            for rtype in [RecordType::A, RecordType::AAAA] {
                let mut delete = Record::update0(owner.clone(), 0, rtype);
                delete.dns_class = DNSClass::ANY;
                message.add_update(delete);
            }
            for ip in desired.v4.iter().chain(&desired.v6) {
                let data = match ip {
                    IpAddr::V4(v4) => RData::A(A(*v4)),
                    IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
                };
                message.add_update(Record::from_rdata(owner.clone(), self.target.ttl, data));
            }
        }
        let signer = self.key.signer().map_err(DnsError::Config)?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let (signature, verifier) = signer
            .sign_message(&message, now)
            .map_err(|e| DnsError::Internal(format!("TSIG signing: {e}")))?;
        message.set_signature(signature);
        let bytes = message.to_vec().map_err(|e| self.exchange_error(&step, &e))?;
        let reply = self.exchange(&bytes, message.metadata.id, &step, false).await?;

        let response = Message::from_vec(&reply).map_err(|e| self.exchange_error(&step, &e))?;
        if let Some(error) = response.signature.as_ref().and_then(|s| s.data.error) {
            return Err(DnsError::AuthFailed {
                server,
                reason: format!("the server answered TSIG error {error:?}"),
            });
        }
        if response.metadata.response_code == ResponseCode::NotAuth {
            return Err(DnsError::AuthFailed {
                server,
                reason: "the server answered NOTAUTH".into(),
            });
        }
        match verifier {
            Some(mut verifier) if response.signature.is_some() => {
                if let Err(e) = verifier.verify(&reply) {
                    return Err(DnsError::AuthFailed {
                        server,
                        reason: format!("the reply's TSIG signature does not verify with our key ({e})"),
                    });
                }
            }
            _ => {
                return Err(DnsError::AuthFailed {
                    server,
                    reason: format!(
                        "the reply ({}) is not TSIG-signed",
                        response.metadata.response_code
                    ),
                });
            }
        }
        match response.metadata.response_code {
            ResponseCode::NoError => Ok(()),
            other => Err(DnsError::UpdateRejected {
                server,
                zone: self.target.zone.fqdn(),
                rcode: other.to_string(),
            }),
        }
    }

    fn exchange_error(&self, step: &str, error: &dyn std::fmt::Display) -> DnsError {
        DnsError::Exchange {
            server: self.target.server,
            step: step.to_owned(),
            reason: error.to_string(),
        }
    }

    /// One request/response exchange: UDP (with TCP fallback on truncation) or TCP only.
    async fn exchange(&self, request: &[u8], id: u16, step: &str, udp: bool) -> Result<Vec<u8>, DnsError> {
        let timeout = self.target.timeout;
        if udp {
            let reply = tokio::time::timeout(timeout, self.udp_exchange(request, id))
                .await
                .map_err(|_| self.exchange_error(step, &"timed out"))?
                .map_err(|e| self.exchange_error(step, &e))?;
            // TC bit: retry over TCP.
            if reply.get(2).is_none_or(|flags| flags & 0x02 == 0) {
                return Ok(reply);
            }
        }
        tokio::time::timeout(timeout, self.tcp_exchange(request))
            .await
            .map_err(|_| self.exchange_error(step, &"timed out"))?
            .map_err(|e| self.exchange_error(step, &e))
    }

    async fn udp_exchange(&self, request: &[u8], id: u16) -> std::io::Result<Vec<u8>> {
        let server = self.target.server;
        let bind: SocketAddr = if server.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            ([0_u16; 8], 0).into()
        };
        let socket = UdpSocket::bind(bind).await?;
        socket.connect(server).await?;
        socket.send(request).await?;
        let mut buf = vec![0_u8; 65_535];
        loop {
            let len = socket.recv(&mut buf).await?;
            // Ignore stray datagrams that do not answer our ID.
            if len >= 12 && u16::from_be_bytes([buf[0], buf[1]]) == id && buf[2] & 0x80 != 0 {
                buf.truncate(len);
                return Ok(buf);
            }
        }
    }

    async fn tcp_exchange(&self, request: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect(self.target.server).await?;
        let len = u16::try_from(request.len()).map_err(|_| std::io::Error::other("request too large"))?;
        let mut framed = Vec::with_capacity(request.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(request);
        stream.write_all(&framed).await?;
        let reply_len = stream.read_u16().await?;
        let mut reply = vec![0_u8; usize::from(reply_len)];
        stream.read_exact(&mut reply).await?;
        if reply.len() < 12 || reply[2] & 0x80 == 0 {
            return Err(std::io::Error::other("not a DNS response"));
        }
        Ok(reply)
    }
}

fn hickory_name(name: &DnsName) -> Result<Name, DnsError> {
    Name::from_ascii(name.fqdn()).map_err(|e| DnsError::Internal(format!("name {name}: {e}")))
}
