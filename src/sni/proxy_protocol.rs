//! The PROXY protocol header (HAProxy's `proxy-protocol.txt`, versions 1 and 2), read to learn
//! the connection's original destination. Pure: bytes in, a header or "read more" out.
//!
//! ```text
//!  v1: "PROXY TCP4 <src> <dst> <sport> <dport>\r\n"   (text, at most 107 bytes)
//!      "PROXY UNKNOWN …\r\n"                           (no addresses)
//!  v2: \r\n\r\n\0\r\nQUIT\n, ver|cmd, fam|proto, len(2), addresses, TLVs
//!      LOCAL command or UNSPEC family                   (no addresses)
//!      TLV of the configured tenant type (`--proxy-tenant-tlv`, 0xE0 by default, in the
//!      range the spec leaves to applications): the tenant's host name, as HyperShift's and
//!      Azure Private Link's proxies carry a cluster or link id for clients that send no SNI
//! ```
//!
//! The header is stripped: the bytes after it (the client's TLS stream) go to the backend.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The v2 signature.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// The longest v1 line, CRLF included.
const V1_MAX: usize = 107;

/// What the bytes read so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proxied {
    /// Not complete yet; at least this many bytes in all are needed.
    Incomplete { need: usize },
    /// A complete header of `len` bytes.
    Complete(Header),
}

/// A parsed header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Bytes the header takes at the start of the stream.
    pub len: usize,
    /// The client's address, if the header carries one.
    pub source: Option<SocketAddr>,
    /// The address the client connected to, if the header carries one.
    pub destination: Option<SocketAddr>,
    /// The tenant's host name from the tenant TLV (v2 only), lower case.
    pub tenant: Option<String>,
}

/// Why the bytes are not a PROXY header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    #[error("no PROXY protocol signature")]
    NoSignature,
    #[error("PROXY v1 line over 107 bytes or without CRLF")]
    V1Line,
    #[error("PROXY v1 line: {0}")]
    V1(&'static str),
    #[error("PROXY v2 header: {0}")]
    V2(&'static str),
    #[error("PROXY v2 header of {len} bytes is over the limit of {limit}")]
    TooLarge { len: usize, limit: usize },
}

/// Parses the PROXY header at the start of `buf`; `limit` bounds a v2 header's length.
pub fn parse(buf: &[u8], limit: usize) -> Result<Proxied, ProxyError> {
    parse_with(buf, limit, None)
}

/// [`parse`], also reading the tenant's host name from v2 TLVs of type `tenant_tlv`.
pub fn parse_with(buf: &[u8], limit: usize, tenant_tlv: Option<u8>) -> Result<Proxied, ProxyError> {
    // Decide the version from as many signature bytes as are there.
    let v1 = b"PROXY ";
    let n = buf.len().min(V2_SIGNATURE.len());
    if buf[..n] == V2_SIGNATURE[..n] {
        return if n < V2_SIGNATURE.len() {
            Ok(Proxied::Incomplete { need: 16 })
        } else {
            parse_v2(buf, limit, tenant_tlv)
        };
    }
    let n = buf.len().min(v1.len());
    if buf[..n] == v1[..n] {
        return if n < v1.len() {
            Ok(Proxied::Incomplete { need: v1.len() })
        } else {
            parse_v1(buf)
        };
    }
    Err(ProxyError::NoSignature)
}

fn parse_v1(buf: &[u8]) -> Result<Proxied, ProxyError> {
    let window = &buf[..buf.len().min(V1_MAX)];
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        return if buf.len() >= V1_MAX {
            Err(ProxyError::V1Line)
        } else {
            Ok(Proxied::Incomplete { need: buf.len() + 1 })
        };
    };
    let line = std::str::from_utf8(&window[..end]).map_err(|_| ProxyError::V1("not ASCII"))?;
    let mut parts = line.split(' ');
    parts.next(); // "PROXY"
    let len = end + 2;
    match parts.next() {
        Some("UNKNOWN") => {
            return Ok(Proxied::Complete(Header {
                len,
                source: None,
                destination: None,
                tenant: None,
            }));
        }
        Some("TCP4" | "TCP6") => {}
        _ => return Err(ProxyError::V1("protocol is not TCP4, TCP6 or UNKNOWN")),
    }
    let fields: Vec<&str> = parts.collect();
    let [src, dst, sport, dport] = fields[..] else {
        return Err(ProxyError::V1("expected 4 fields after the protocol"));
    };
    let ip = |s: &str| s.parse::<IpAddr>().map_err(|_| ProxyError::V1("bad address"));
    let port = |s: &str| s.parse::<u16>().map_err(|_| ProxyError::V1("bad port"));
    Ok(Proxied::Complete(Header {
        len,
        source: Some(SocketAddr::new(ip(src)?, port(sport)?)),
        destination: Some(SocketAddr::new(ip(dst)?, port(dport)?)),
        tenant: None,
    }))
}

fn parse_v2(buf: &[u8], limit: usize, tenant_tlv: Option<u8>) -> Result<Proxied, ProxyError> {
    let Some(fixed) = buf.get(12..16) else {
        return Ok(Proxied::Incomplete { need: 16 });
    };
    let (ver_cmd, fam, len) = (
        fixed[0],
        fixed[1],
        usize::from(u16::from_be_bytes([fixed[2], fixed[3]])),
    );
    if ver_cmd >> 4 != 2 {
        return Err(ProxyError::V2("version is not 2"));
    }
    let total = 16 + len;
    if total > limit {
        return Err(ProxyError::TooLarge { len: total, limit });
    }
    let Some(body) = buf.get(16..total) else {
        return Ok(Proxied::Incomplete { need: total });
    };
    match ver_cmd & 0x0f {
        0 => {
            // LOCAL: a health check from the proxy itself
            return Ok(Proxied::Complete(Header {
                len: total,
                source: None,
                destination: None,
                tenant: None,
            }));
        }
        1 => {}
        _ => return Err(ProxyError::V2("command is not LOCAL or PROXY")),
    }
    // The address block's length by family; TLVs follow it.
    let addr_len = match fam >> 4 {
        1 => 12,
        2 => 36,
        3 => 216,
        _ => 0,
    };
    let tenant = match tenant_tlv {
        Some(t) => tenant_from_tlvs(body.get(addr_len..).unwrap_or_default(), t)?,
        None => None,
    };
    let header = |source, destination| {
        Ok(Proxied::Complete(Header {
            len: total,
            source,
            destination,
            tenant: tenant.clone(),
        }))
    };
    match fam {
        // TCP over IPv4: src(4) dst(4) sport(2) dport(2)
        0x11 => {
            let a = body.get(..12).ok_or(ProxyError::V2("IPv4 addresses truncated"))?;
            let ip = |o: usize| IpAddr::V4(Ipv4Addr::new(a[o], a[o + 1], a[o + 2], a[o + 3]));
            let port = |o: usize| u16::from_be_bytes([a[o], a[o + 1]]);
            header(
                Some(SocketAddr::new(ip(0), port(8))),
                Some(SocketAddr::new(ip(4), port(10))),
            )
        }
        // TCP over IPv6: src(16) dst(16) sport(2) dport(2)
        0x21 => {
            let a = body.get(..36).ok_or(ProxyError::V2("IPv6 addresses truncated"))?;
            let ip = |o: usize| {
                let mut b = [0u8; 16];
                b.copy_from_slice(&a[o..o + 16]);
                IpAddr::V6(Ipv6Addr::from(b))
            };
            let port = |o: usize| u16::from_be_bytes([a[o], a[o + 1]]);
            header(
                Some(SocketAddr::new(ip(0), port(32))),
                Some(SocketAddr::new(ip(16), port(34))),
            )
        }
        // UNSPEC (or UDP / unix sockets, which carry no TCP destination): no addresses.
        _ => header(None, None),
    }
}

/// The value of the TLV of type `wanted` in `tlvs`, as a host name.
fn tenant_from_tlvs(mut tlvs: &[u8], wanted: u8) -> Result<Option<String>, ProxyError> {
    while !tlvs.is_empty() {
        let [kind, hi, lo, rest @ ..] = tlvs else {
            return Err(ProxyError::V2("TLV header truncated"));
        };
        let len = usize::from(u16::from_be_bytes([*hi, *lo]));
        let value = rest.get(..len).ok_or(ProxyError::V2("TLV value truncated"))?;
        if *kind == wanted {
            return super::hello::normalize_host(value)
                .map(Some)
                .map_err(|_| ProxyError::V2("tenant TLV is not a host name"));
        }
        tlvs = &rest[len..];
    }
    Ok(None)
}

#[cfg(test)]
mod tests;
