//! The TLS ClientHello, read just far enough to find the server name (SNI). Pure: bytes in,
//! a decision out; no I/O, no allocation unless the ClientHello spans several TLS records.
//!
//! ```text
//!  bytes read so far ──► records (type 22, version 3.x, ≤ 16 KiB each) ──► handshake bytes
//!                        └─ fewer bytes than a record/header says: Incomplete (read more)
//!  handshake bytes  ──► type 1 (ClientHello), 24-bit length ──► body: version, random,
//!                       session id, cipher suites, compression, extensions ──► server_name (0)
//! ```
//!
//! Every length is checked against what is there before it is used, so no input can make the
//! parser read out of bounds, loop or allocate more than the bytes it was given. A ClientHello
//! may be split across TCP segments (the caller reads more on `Incomplete`) and across several
//! handshake records (RFC 8446 §5.1 allows fragmenting a handshake message); both are handled.

use std::borrow::Cow;

/// A TLS record header: type, version (2), length (2).
const RECORD_HEADER: usize = 5;
/// Content type of handshake records.
const HANDSHAKE: u8 = 22;
/// The largest plaintext record body allowed (RFC 8446 §5.1: 2^14).
const MAX_RECORD: usize = 1 << 14;
/// Handshake type of a ClientHello.
const CLIENT_HELLO: u8 = 1;
/// Extension type of server_name (RFC 6066 §3).
const SERVER_NAME: u16 = 0;
/// `host_name` entry of the server_name list.
const HOST_NAME: u8 = 0;
/// The longest DNS name (RFC 1035, without the trailing dot).
const MAX_NAME: usize = 253;

/// What the bytes read so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// The ClientHello is not complete yet; at least this many bytes in all are needed.
    Incomplete { need: usize },
    /// A complete ClientHello; `sni` is its host name (lower case, no trailing dot), if any.
    Complete { sni: Option<String> },
}

/// Why the bytes are not the start of a TLS connection we can route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    #[error("not a TLS handshake record (content type {0})")]
    NotHandshake(u8),
    #[error("unsupported record version {0}.{1}")]
    RecordVersion(u8, u8),
    #[error("record length {0} is 0 or over 16384")]
    RecordLength(usize),
    #[error("first handshake message has type {0}, not ClientHello (1)")]
    NotClientHello(u8),
    #[error("ClientHello of {len} bytes is over the limit of {limit}")]
    TooLarge { len: usize, limit: usize },
    #[error("malformed ClientHello: {0}")]
    Malformed(&'static str),
    #[error("server name is not a valid host name")]
    BadName,
}

impl HelloError {
    /// A short, stable label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Self::NotHandshake(_) | Self::RecordVersion(_, _) | Self::RecordLength(_) => "not_tls",
            Self::NotClientHello(_) | Self::Malformed(_) => "malformed",
            Self::TooLarge { .. } => "too_large",
            Self::BadName => "bad_name",
        }
    }
}

/// Parses the ClientHello at the start of `buf`. `limit` bounds the ClientHello's handshake
/// length (the caller bounds how many bytes it reads; this rejects early what cannot fit).
pub fn parse(buf: &[u8], limit: usize) -> Result<Hello, HelloError> {
    let handshake = match handshake_bytes(buf, limit)? {
        Ok(h) => h,
        Err(need) => return Ok(Hello::Incomplete { need }),
    };
    let sni = client_hello_sni(&handshake)?;
    Ok(Hello::Complete { sni })
}

/// The ClientHello handshake message (header included) gathered from as many records as it
/// takes, or `Err(need)`: the total number of bytes needed before it can go on.
fn handshake_bytes(buf: &[u8], limit: usize) -> Result<Result<Cow<'_, [u8]>, usize>, HelloError> {
    let mut at = 0;
    let mut joined: Option<Vec<u8>> = None;
    let mut first: &[u8] = &[];
    loop {
        let Some(header) = buf.get(at..at + RECORD_HEADER) else {
            return Ok(Err(at + RECORD_HEADER));
        };
        if header[0] != HANDSHAKE {
            return Err(HelloError::NotHandshake(header[0]));
        }
        // TLS 1.0 to 1.3 all carry 3.x here (1.3 uses 3.1 or 3.3 for compatibility).
        if header[1] != 3 || header[2] > 4 {
            return Err(HelloError::RecordVersion(header[1], header[2]));
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > MAX_RECORD {
            return Err(HelloError::RecordLength(len));
        }
        let body_at = at + RECORD_HEADER;
        let Some(body) = buf.get(body_at..body_at + len) else {
            // Before waiting for the rest, reject a handshake we already know is too large.
            let so_far = buf.get(body_at..).unwrap_or_default();
            message_len(joined.as_deref().unwrap_or(first), so_far, limit)?;
            return Ok(Err(body_at + len));
        };
        at = body_at + len;
        // The common case, one record holding the whole message, is parsed in place.
        match &mut joined {
            None if first.is_empty() => first = body,
            None => {
                let mut v = Vec::with_capacity(first.len() + body.len());
                v.extend_from_slice(first);
                v.extend_from_slice(body);
                joined = Some(v);
            }
            Some(v) => v.extend_from_slice(body),
        }
        let have: &[u8] = joined.as_deref().unwrap_or(first);
        if let Some(total) = message_len(have, &[], limit)?
            && have.len() >= total
        {
            return Ok(Ok(match joined {
                Some(mut v) => {
                    v.truncate(total);
                    Cow::Owned(v)
                }
                None => Cow::Borrowed(&first[..total]),
            }));
        }
    }
}

/// Checks the handshake header in `have` followed by `more` as far as it is there; returns
/// the message's total length (header included) once its 4 bytes are known.
fn message_len(have: &[u8], more: &[u8], limit: usize) -> Result<Option<usize>, HelloError> {
    let mut header = [0u8; 4];
    for (i, b) in have.iter().chain(more).take(4).enumerate() {
        header[i] = *b;
    }
    if have.is_empty() && more.is_empty() {
        return Ok(None);
    }
    if header[0] != CLIENT_HELLO {
        return Err(HelloError::NotClientHello(header[0]));
    }
    if have.len() + more.len() < 4 {
        return Ok(None);
    }
    let len = usize::from(header[1]) << 16 | usize::from(header[2]) << 8 | usize::from(header[3]);
    if len > limit {
        return Err(HelloError::TooLarge { len, limit });
    }
    Ok(Some(4 + len))
}

/// A cursor over a byte slice: every read checks the length first.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], HelloError> {
        if self.0.len() < n {
            return Err(HelloError::Malformed(what));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, HelloError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, HelloError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a one-byte length.
    fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = self.u8(what)?;
        self.take(usize::from(n), what)
    }

    /// A vector with a two-byte length.
    fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = self.u16(what)?;
        self.take(usize::from(n), what)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The SNI host name of a complete ClientHello message (4-byte header included).
fn client_hello_sni(msg: &[u8]) -> Result<Option<String>, HelloError> {
    let mut r = Reader(msg.get(4..).ok_or(HelloError::Malformed("handshake header"))?);
    r.take(2, "client version")?;
    r.take(32, "random")?;
    let session_id = r.vec8("session id")?;
    if session_id.len() > 32 {
        return Err(HelloError::Malformed("session id over 32 bytes"));
    }
    let suites = r.vec16("cipher suites")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(HelloError::Malformed("cipher suites"));
    }
    if r.vec8("compression methods")?.is_empty() {
        return Err(HelloError::Malformed("compression methods"));
    }
    if r.is_empty() {
        return Ok(None); // a ClientHello without extensions (SSL 3 style): no SNI
    }
    let mut exts = Reader(r.vec16("extensions")?);
    if !r.is_empty() {
        return Err(HelloError::Malformed("bytes after the extensions"));
    }
    let mut sni = None;
    let mut seen_sni = false;
    while !exts.is_empty() {
        let kind = exts.u16("extension type")?;
        let data = exts.vec16("extension data")?;
        if kind == SERVER_NAME {
            if seen_sni {
                return Err(HelloError::Malformed("two server_name extensions"));
            }
            seen_sni = true;
            sni = server_name(data)?;
        }
    }
    Ok(sni)
}

/// The host name in a server_name extension's data (RFC 6066 §3).
fn server_name(data: &[u8]) -> Result<Option<String>, HelloError> {
    let mut outer = Reader(data);
    let mut list = Reader(outer.vec16("server name list")?);
    if !outer.is_empty() {
        return Err(HelloError::Malformed("bytes after the server name list"));
    }
    let mut host = None;
    while !list.is_empty() {
        let kind = list.u8("server name type")?;
        let name = list.vec16("server name")?;
        if kind == HOST_NAME {
            if host.is_some() {
                return Err(HelloError::Malformed("two host names"));
            }
            host = Some(normalize_host(name)?);
        }
    }
    Ok(host)
}

/// Lower case, no trailing dot; letters, digits, `-`, `_` and `.` only, at most 253 bytes,
/// labels of 1 to 63 bytes. The result is safe to log and to use as a metric label.
pub fn normalize_host(name: &[u8]) -> Result<String, HelloError> {
    let name = name.strip_suffix(b".").unwrap_or(name);
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(HelloError::BadName);
    }
    for label in name.split(|b| *b == b'.') {
        if label.is_empty() || label.len() > 63 {
            return Err(HelloError::BadName);
        }
    }
    if !name
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(HelloError::BadName);
    }
    Ok(String::from_utf8_lossy(name).to_ascii_lowercase())
}

/// A minimal ClientHello handshake message (header included) naming `sni` (no server_name
/// extension if `None`): what the router's own health check sends (`baton controller`), and
/// what the tests build theirs from.
pub fn client_hello(sni: Option<&str>) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&[3, 3]);
    body.extend_from_slice(&[7; 32]);
    body.push(32);
    body.extend_from_slice(&[9; 32]);
    body.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]);
    body.extend_from_slice(&[1, 0]);
    let mut exts = Vec::new();
    // supported_versions, to look like a TLS 1.3 hello.
    exts.extend_from_slice(&[0, 43, 0, 3, 2, 3, 4]);
    if let Some(name) = sni {
        let name = name.as_bytes();
        let mut list = vec![0];
        list.extend_from_slice(&len16(name.len()));
        list.extend_from_slice(name);
        exts.extend_from_slice(&[0, 0]);
        exts.extend_from_slice(&len16(list.len() + 2));
        exts.extend_from_slice(&len16(list.len()));
        exts.extend_from_slice(&list);
    }
    body.extend_from_slice(&len16(exts.len()));
    body.extend_from_slice(&exts);
    let len = u32::try_from(body.len()).unwrap_or(0).to_be_bytes();
    let mut msg = vec![CLIENT_HELLO, len[1], len[2], len[3]];
    msg.extend_from_slice(&body);
    msg
}

/// `msg` in one handshake record (it must fit: at most 16 KiB).
pub fn record(msg: &[u8]) -> Vec<u8> {
    let mut out = vec![HANDSHAKE, 3, 1];
    out.extend_from_slice(&len16(msg.len()));
    out.extend_from_slice(msg);
    out
}

fn len16(n: usize) -> [u8; 2] {
    u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes()
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! ClientHellos split into records, for tests.

    pub(crate) use super::client_hello;

    /// `msg` wrapped in handshake records of at most `chunk` bytes each.
    pub(crate) fn records(msg: &[u8], chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for part in msg.chunks(chunk) {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&u16::try_from(part.len()).unwrap().to_be_bytes());
            out.extend_from_slice(part);
        }
        out
    }
}

#[cfg(test)]
mod tests;
