//! The kernel side, thin: a `NETLINK_NETFILTER` socket (nix's safe socket API, no `unsafe`
//! here), over which the messages `nft.rs` builds are sent and the answers read back.
//!
//! ```text
//!  replace(wanted, families) ─► one sendto: the whole batch ─► one ack per message
//!                                                              (an error names its step + errno)
//!  read() ─► per family: GETTABLE · per chain (prerouting, output): GETCHAIN · GETRULE dump
//!        ─► plan::Observed
//!  remove_all() ─► read(), then replace(∅, the families that have a table)
//!  local_addresses() ─► getifaddrs(3): this node's addresses (which FIPs it holds)
//! ```
//!
//! Calls block (a few system calls, microseconds; every receive times out after
//! [`RECEIVE_TIMEOUT`]): async code runs them through [`run`], on a blocking thread, each on a
//! socket of its own.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{
    self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, sockopt,
};
use nix::sys::time::TimeVal;

use super::nft::{self, Answer, ChainInfo, DecodeError, Family, Hook, RuleInfo, Step};
use super::plan::{Chain, Local, Observed, TableState, Wanted};

/// The longest wait for one answer of the kernel (it answers within the send call; this only
/// bounds a kernel that never does).
pub const RECEIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// A failure talking to nftables, naming the step.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("opening a netlink socket to nftables: {0}{hint}", hint = hint(None, *.0))]
    Open(Errno),
    #[error("nftables refused to {step}: {errno}{hint}", hint = hint(Some(step), *errno))]
    Refused { step: Step, errno: Errno },
    #[error("nftables: sending the request to {step}: {source}")]
    Send { step: Step, source: Errno },
    #[error("nftables: reading the kernel's answer to {step}: {}", receive_reason(*source))]
    Receive { step: Step, source: Errno },
    #[error("nftables: the kernel's answer to {step}: {source}")]
    Decode { step: Step, source: DecodeError },
    #[error("nftables: the netlink task failed: {0}")]
    Task(String),
    #[error("reading this node's addresses (getifaddrs): {0}")]
    Addresses(Errno),
}

impl KernelError {
    /// A short stable label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Open(_) => "open",
            Self::Refused { .. } => "refused",
            Self::Send { .. } | Self::Receive { .. } => "io",
            Self::Decode { .. } => "decode",
            Self::Task(_) => "task",
            Self::Addresses(_) => "addresses",
        }
    }
}

fn receive_reason(e: Errno) -> String {
    if e == Errno::EAGAIN {
        format!("no answer within {}s", RECEIVE_TIMEOUT.as_secs())
    } else {
        e.to_string()
    }
}

/// What an operator can do about an errno.
fn hint(step: Option<&Step>, e: Errno) -> &'static str {
    match (step, e) {
        (_, Errno::EPERM) => " (the agent needs CAP_NET_ADMIN in the node's network namespace)",
        (Some(Step::CreateChain(..)), Errno::ENOENT | Errno::EOPNOTSUPP) => {
            " (no nat chain type: is the kernel module nft_chain_nat available?)"
        }
        (Some(Step::AddRule(_)), Errno::ENOENT | Errno::EOPNOTSUPP) => {
            " (no redir expression: is the kernel module nft_redir available?)"
        }
        (Some(Step::AddLocalRule { .. }), Errno::ENOENT | Errno::EOPNOTSUPP) => {
            " (no nat expression: is the kernel module nft_nat available?)"
        }
        (_, Errno::EAFNOSUPPORT | Errno::EPROTONOSUPPORT) => {
            " (does this kernel have nf_tables for this address family?)"
        }
        _ => "",
    }
}

/// Runs `f` on a new socket, on a blocking thread.
pub async fn run<T, F>(f: F) -> Result<T, KernelError>
where
    T: Send + 'static,
    F: FnOnce(&mut Socket) -> Result<T, KernelError> + Send + 'static,
{
    tokio::task::spawn_blocking(move || f(&mut Socket::open()?))
        .await
        .unwrap_or_else(|e| Err(KernelError::Task(e.to_string())))
}

/// A netlink socket to nf_tables.
pub struct Socket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl Socket {
    /// Opens and binds the socket (the kernel picks the port id).
    pub fn open() -> Result<Self, KernelError> {
        let fd = socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .map_err(KernelError::Open)?;
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(KernelError::Open)?;
        let timeout = TimeVal::new(RECEIVE_TIMEOUT.as_secs().try_into().unwrap_or(5), 0);
        socket::setsockopt(&fd, sockopt::ReceiveTimeout, &timeout).map_err(KernelError::Open)?;
        Ok(Self {
            fd,
            seq: 1,
            buf: vec![0; 64 * 1024],
        })
    }

    fn send(&self, bytes: &[u8], step: &Step) -> Result<(), KernelError> {
        socket::sendto(
            self.fd.as_raw_fd(),
            bytes,
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )
        .map(drop)
        .map_err(|source| KernelError::Send {
            step: step.clone(),
            source,
        })
    }

    /// The answers in the next datagram from the kernel.
    fn receive(&mut self, step: &Step) -> Result<Vec<Answer>, KernelError> {
        let n = loop {
            match socket::recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty()) {
                Err(Errno::EINTR) => {}
                r => {
                    break r.map_err(|source| KernelError::Receive {
                        step: step.clone(),
                        source,
                    })?;
                }
            }
        };
        let decode = |source| KernelError::Decode {
            step: step.clone(),
            source,
        };
        nft::messages(&self.buf[..n])
            .map_err(decode)?
            .iter()
            .map(|m| nft::answer(m).map_err(decode))
            .collect()
    }

    /// Replaces the `baton` table of each of `families` so that it accepts exactly the FIPs of
    /// that family in `want` and delivers the held ones locally (no FIPs: the table is
    /// removed), in one transaction.
    pub fn replace(&mut self, want: &Wanted, families: &[Family]) -> Result<(), KernelError> {
        let batch = nft::replace_batch(&want.fips, &want.held, families, self.seq);
        self.seq = self
            .seq
            .wrapping_add(u32::try_from(batch.steps.len() + 2).unwrap_or(u32::MAX));
        self.send(&batch.bytes, &Step::Commit)?;
        let mut pending: BTreeSet<u32> = batch.steps.iter().map(|(s, _)| *s).collect();
        let mut failed: Option<(u32, i32)> = None;
        while !pending.is_empty() {
            for a in self.receive(&Step::Commit)? {
                match a {
                    Answer::Ack { seq } => {
                        pending.remove(&seq);
                    }
                    Answer::Error { seq, errno } => {
                        pending.remove(&seq);
                        // The first error is the cause; later ones (if any) follow from it.
                        failed.get_or_insert((seq, errno));
                        if seq == batch.begin_seq {
                            // The batch as a whole was refused (or its commit failed).
                            pending.clear();
                        }
                    }
                    _ => {}
                }
            }
        }
        match failed {
            None => Ok(()),
            Some((seq, errno)) => Err(KernelError::Refused {
                step: batch.step_of(seq),
                errno: Errno::from_raw(errno),
            }),
        }
    }

    /// One request; its answers up to the acknowledgement (or, for a dump, the end). A refusal
    /// is an error naming `step`.
    fn request(&mut self, bytes: &[u8], seq: u32, step: &Step) -> Result<Vec<Answer>, KernelError> {
        self.send(bytes, step)?;
        let mut out = Vec::new();
        loop {
            for a in self.receive(step)? {
                match a {
                    Answer::Ack { seq: s } | Answer::Done { seq: s, errno: 0 } if s == seq => return Ok(out),
                    Answer::Error { seq: s, errno } | Answer::Done { seq: s, errno } if s == seq => {
                        return Err(KernelError::Refused {
                            step: step.clone(),
                            errno: Errno::from_raw(errno),
                        });
                    }
                    Answer::Ack { .. } | Answer::Error { .. } | Answer::Done { .. } => {}
                    other => out.push(other),
                }
            }
        }
    }

    fn next_seq(&mut self) -> u32 {
        let s = self.seq;
        self.seq = self.seq.wrapping_add(1);
        s
    }

    /// The `baton` tables the kernel holds.
    pub fn read(&mut self) -> Result<Observed, KernelError> {
        let mut out = Observed::new();
        for family in Family::ALL {
            if let Some(state) = self.read_family(family)? {
                out.insert(family, state);
            }
        }
        Ok(out)
    }

    fn read_family(&mut self, family: Family) -> Result<Option<TableState>, KernelError> {
        let absent = |e: &KernelError| {
            matches!(e, KernelError::Refused { errno, .. }
                if matches!(*errno, Errno::ENOENT | Errno::EAFNOSUPPORT | Errno::EPROTONOSUPPORT))
        };
        let seq = self.next_seq();
        match self.request(&nft::get_table(family, seq), seq, &Step::ReadTable(family)) {
            Ok(_) => {}
            Err(e) if absent(&e) => return Ok(None),
            Err(e) => return Err(e),
        }
        let mut state = TableState::default();
        for hook in Hook::ALL {
            let seq = self.next_seq();
            match self.request(
                &nft::get_chain(family, hook, seq),
                seq,
                &Step::ReadChain(family, hook),
            ) {
                Ok(answers) => {
                    *state.chain_mut(hook) = answers
                        .into_iter()
                        .find_map(|a| match a {
                            Answer::Chain(c) => Some(chain_state(&c, hook)),
                            _ => None,
                        })
                        .unwrap_or_default();
                }
                Err(e) if absent(&e) => continue,
                Err(e) => return Err(e),
            }
            let seq = self.next_seq();
            for a in self.request(
                &nft::get_rules(family, hook, seq),
                seq,
                &Step::ReadRules(family, hook),
            )? {
                match (hook, a) {
                    (Hook::Prerouting, Answer::Rule(RuleInfo::Fip { ip, connections })) => {
                        state.fips.insert(ip, connections);
                    }
                    (Hook::Output, Answer::Rule(RuleInfo::Local { fip, to, connections })) => {
                        state.local.insert(fip, Local { to, connections });
                    }
                    (_, Answer::Rule(RuleInfo::Other(what))) => state.other.push(format!("{hook}: {what}")),
                    (_, Answer::Rule(rule)) => state.other.push(format!("{hook}: {rule:?}")),
                    _ => {}
                }
            }
        }
        Ok(Some(state))
    }

    /// Removes every `baton` table (uninstall); returns the families that had one.
    pub fn remove_all(&mut self) -> Result<Vec<Family>, KernelError> {
        let families: Vec<Family> = self.read()?.into_keys().collect();
        if !families.is_empty() {
            self.replace(&Wanted::default(), &families)?;
        }
        Ok(families)
    }
}

/// This node's addresses (every interface's), as getifaddrs(3) lists them.
pub fn local_addresses() -> Result<BTreeSet<IpAddr>, KernelError> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(KernelError::Addresses)?;
    Ok(addrs
        .filter_map(|a| a.address)
        .filter_map(|a| {
            a.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .collect())
}

fn chain_state(c: &ChainInfo, hook: Hook) -> Chain {
    if c.is_ours(hook) {
        return Chain::Ours;
    }
    let show = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    Chain::Different(format!(
        "type {} hook {} priority {}",
        show(c.kind.clone()),
        show(c.hook.map(|h| h.to_string())),
        show(c.priority.map(|p| p.to_string()))
    ))
}
