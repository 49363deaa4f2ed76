//! A zero-allocation recogniser for the common query shape, used by the UDP hot path.
//!
//! It accepts only: QR=0, OPCODE=QUERY, TC=0, one question with an uncompressed name and class
//! IN, no answer/authority records, and at most one additional record that is a well-formed
//! EDNS(0) OPT RR at the root; the packet must end exactly there. Everything else returns
//! `None` and takes hickory's full parser (`answer::Compiled::respond_slow`).

/// The parts of a simple query the fast path needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SimpleQuery {
    /// Length of the question name in wire format (including the root label), at offset 12.
    name_len: usize,
    pub(crate) qtype: u16,
    /// The client's EDNS UDP payload size, if it sent an OPT RR.
    pub(crate) edns_payload: Option<u16>,
    rd: bool,
    cd: bool,
}

const HEADER: usize = 12;

fn u16_at(packet: &[u8], at: usize) -> Option<u16> {
    let bytes = packet.get(at..at + 2)?;
    Some(u16::from_be_bytes([bytes[0], bytes[1]]))
}

impl SimpleQuery {
    pub(crate) fn parse(packet: &[u8]) -> Option<Self> {
        let flags = u16_at(packet, 2)?;
        // QR=0, OPCODE=0, TC=0 (AA, RD, RA, Z, AD, CD, RCODE ignored as servers do).
        if flags & 0xfa00 != 0 {
            return None;
        }
        let (qd, an, ns, ar) = (
            u16_at(packet, 4)?,
            u16_at(packet, 6)?,
            u16_at(packet, 8)?,
            u16_at(packet, 10)?,
        );
        if qd != 1 || an != 0 || ns != 0 || ar > 1 {
            return None;
        }
        let mut at = HEADER;
        loop {
            let len = usize::from(*packet.get(at)?);
            if len == 0 {
                at += 1;
                break;
            }
            if len > 63 {
                return None; // compression pointer or reserved label type
            }
            at += 1 + len;
            if at - HEADER > 254 {
                return None;
            }
        }
        let name_len = at - HEADER;
        let qtype = u16_at(packet, at)?;
        if u16_at(packet, at + 2)? != 1 {
            return None;
        }
        at += 4;
        let mut edns_payload = None;
        if ar == 1 {
            // Root owner, TYPE=OPT, CLASS=payload, TTL=ext-rcode|version|DO|Z, RDLENGTH, RDATA.
            if *packet.get(at)? != 0 || u16_at(packet, at + 1)? != 41 {
                return None;
            }
            let payload = u16_at(packet, at + 3)?;
            let (ext_rcode, version) = (*packet.get(at + 5)?, *packet.get(at + 6)?);
            if ext_rcode != 0 || version != 0 {
                return None;
            }
            let rdlen = usize::from(u16_at(packet, at + 9)?);
            at += 11 + rdlen;
            edns_payload = Some(payload);
        }
        if at != packet.len() {
            return None;
        }
        Some(Self {
            name_len,
            qtype,
            edns_payload,
            rd: flags & 0x0100 != 0,
            cd: flags & 0x0010 != 0,
        })
    }

    /// Writes the question name of `packet` (the one `parse` accepted), lower-cased, into `buf`
    /// and returns it in wire format.
    pub(crate) fn lowercase_name<'b>(&self, packet: &[u8], buf: &'b mut [u8; 255]) -> Option<&'b [u8]> {
        let name = packet.get(HEADER..HEADER + self.name_len)?;
        let dst = buf.get_mut(..self.name_len)?;
        for (d, s) in dst.iter_mut().zip(name) {
            *d = s.to_ascii_lowercase();
        }
        Some(dst)
    }

    /// Patches a template response (built for ID 0, RD=0, CD=0 and the lower-case name) into
    /// the answer to `query`: its ID, RD and CD bits, and the question name's spelling.
    pub(crate) fn patch(&self, out: &mut [u8], query: &[u8]) {
        if out.len() < HEADER + self.name_len || query.len() < HEADER + self.name_len {
            return;
        }
        out[0] = query[0];
        out[1] = query[1];
        if self.rd {
            out[2] |= 0x01;
        }
        if self.cd {
            out[3] |= 0x10;
        }
        out[HEADER..HEADER + self.name_len].copy_from_slice(&query[HEADER..HEADER + self.name_len]);
    }
}

#[cfg(test)]
mod tests;
