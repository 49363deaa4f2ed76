//! `sni-load`: the clients of `scripts/bench/sni`'s attack phase, as an attacker and a user
//! would run them against a TLS proxy on loopback (or lab addresses). One mode per process (each
//! has its own open-files limit); every mode runs for `--duration` seconds, then prints one line
//! of `key=value` results on stdout.
//!
//! ```text
//! sni-load hold      --target ADDR --sources IP+N --count C [--one-byte]   C connections that send
//!                    a 5-byte TLS record header claiming 16,379 bytes (or one byte) and stop;
//!                    one closed by the target is opened again a second later
//! sni-load slowloris --target ADDR --sources IP+N --count C --every-ms MS  C connections that
//!                    send a ClientHello one byte every MS; reopened when closed
//! sni-load flood     --target ADDR --sources IP+N --rate R                 R new connections a
//!                    second, each sending 64 random bytes
//! sni-load legit     --target ADDR --direct ADDR --sni NAME --every-ms MS  a user: every MS a new
//!                    TLS connection (handshake, GET /, the whole answer) through the target and
//!                    one straight to the backend; p50/p99 of both, errors
//! ```
//!
//! `IP+N` is N consecutive source addresses from IP (e.g. `127.1.0.1+64`): attackers come from
//! many addresses, the user from another one (the kernel's choice, 127.0.0.1 on loopback).

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpSocket;

/// The arguments, `--key value` pairs after the mode.
struct Args {
    mode: String,
    pairs: Vec<(String, String)>,
}

impl Args {
    fn parse() -> anyhow::Result<Self> {
        let mut it = std::env::args().skip(1);
        let mode = it.next().context("usage: sni-load MODE --key value …")?;
        let mut pairs = Vec::new();
        while let Some(k) = it.next() {
            let Some(k) = k.strip_prefix("--") else {
                bail!("expected --key, got {k:?}");
            };
            if k == "one-byte" {
                pairs.push((k.to_owned(), "true".to_owned()));
                continue;
            }
            let v = it.next().with_context(|| format!("--{k} needs a value"))?;
            pairs.push((k.to_owned(), v));
        }
        Ok(Self { mode, pairs })
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn req<T: std::str::FromStr>(&self, key: &str) -> anyhow::Result<T>
    where
        T::Err: std::fmt::Display,
    {
        let v = self.get(key).with_context(|| format!("--{key} is required"))?;
        v.parse().map_err(|e| anyhow::anyhow!("--{key} {v:?}: {e}"))
    }

    fn or<T: std::str::FromStr>(&self, key: &str, default: T) -> anyhow::Result<T>
    where
        T::Err: std::fmt::Display,
    {
        match self.get(key) {
            Some(_) => self.req(key),
            None => Ok(default),
        }
    }

    /// `IP+N`: N consecutive IPv4 addresses.
    fn sources(&self) -> anyhow::Result<Vec<IpAddr>> {
        let spec = self.get("sources").unwrap_or("127.0.0.1+1");
        let (ip, n) = spec.split_once('+').unwrap_or((spec, "1"));
        let ip: Ipv4Addr = ip.parse().with_context(|| format!("--sources {spec:?}"))?;
        let n: u32 = n.parse().with_context(|| format!("--sources {spec:?}"))?;
        Ok((0..n)
            .map(|i| IpAddr::V4(Ipv4Addr::from(u32::from(ip) + i)))
            .collect())
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let line = match args.mode.as_str() {
        "hold" => rt.block_on(hold(&args, false))?,
        "slowloris" => rt.block_on(hold(&args, true))?,
        "flood" => rt.block_on(flood(&args))?,
        "legit" => legit(&args)?,
        other => bail!("unknown mode {other:?}: hold, slowloris, flood, legit"),
    };
    println!("{line}");
    Ok(())
}

/// A TLS ClientHello record naming `sni` (what slowloris trickles).
fn client_hello(sni: &str) -> Vec<u8> {
    let name = sni.as_bytes();
    let n = |v: usize| u16::try_from(v).unwrap_or(u16::MAX).to_be_bytes();
    let mut ext = vec![0, 0];
    ext.extend_from_slice(&n(name.len() + 5));
    ext.extend_from_slice(&n(name.len() + 3));
    ext.push(0);
    ext.extend_from_slice(&n(name.len()));
    ext.extend_from_slice(name);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&n(ext.len()));
    body.extend_from_slice(&ext);
    let len = u32::try_from(body.len()).unwrap_or(0).to_be_bytes();
    let mut msg = vec![1, len[1], len[2], len[3]];
    msg.extend_from_slice(&body);
    let mut rec = vec![22, 3, 1];
    rec.extend_from_slice(&n(msg.len()));
    rec.extend_from_slice(&msg);
    rec
}

async fn connect(src: IpAddr, target: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(src, 0))?;
    socket.connect(target).await
}

/// How long a `hold` or `slowloris` connection closed by the target waits before the next.
const REOPEN: Duration = Duration::from_secs(1);

/// `hold` and `slowloris`: keep `count` connections open that never complete a ClientHello.
async fn hold(args: &Args, slow: bool) -> anyhow::Result<String> {
    let target: SocketAddr = args.req("target")?;
    let count: usize = args.req("count")?;
    let duration = Duration::from_secs(args.req("duration")?);
    let every = Duration::from_millis(args.or("every-ms", 1000)?);
    let payload: Arc<[u8]> = if slow {
        client_hello("localhost").into()
    } else if args.get("one-byte").is_some() {
        vec![22u8].into()
    } else {
        // A handshake record header claiming 16,379 bytes that never come.
        vec![22u8, 3, 1, 0x3f, 0xfb].into()
    };
    let sources = args.sources()?;
    let deadline = tokio::time::Instant::now() + duration;
    let (opened, closed, failed) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut tasks = Vec::new();
    for i in 0..count {
        let src = sources[i % sources.len()];
        let (payload, opened, closed, failed) = (
            Arc::clone(&payload),
            Arc::clone(&opened),
            Arc::clone(&closed),
            Arc::clone(&failed),
        );
        tasks.push(tokio::spawn(async move {
            // Spread the opening over the first second.
            tokio::time::sleep(Duration::from_micros(1_000_000 * i as u64 / count.max(1) as u64)).await;
            while tokio::time::Instant::now() < deadline {
                let stream = match connect(src, target).await {
                    Ok(s) => Some(s),
                    // Accepted and reset at once (a per-source cap): closed by the target like
                    // any other, not a connect failure.
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                opened.fetch_add(1, Ordering::Relaxed);
                let alive = async {
                    let Some(mut s) = stream else {
                        return Ok(());
                    };
                    if slow {
                        for b in payload.iter() {
                            s.write_all(&[*b]).await?;
                            tokio::time::sleep(every).await;
                        }
                    } else {
                        s.write_all(&payload).await?;
                    }
                    // Then wait for the target to close it.
                    let mut buf = [0u8; 64];
                    while s.read(&mut buf).await? > 0 {}
                    Ok::<_, std::io::Error>(())
                };
                if tokio::time::timeout_at(deadline, alive).await.is_ok() {
                    closed.fetch_add(1, Ordering::Relaxed);
                    // Opens another a second later, as slowloris tools keep their count up
                    // (slowhttptest: a connection rate); a flood is the flood mode's.
                    tokio::time::sleep(REOPEN).await;
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    Ok(format!(
        "{} count={count} opened={} closed_by_target={} connect_failed={}",
        if slow { "slowloris" } else { "hold" },
        opened.load(Ordering::Relaxed),
        closed.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    ))
}

/// `flood`: `rate` new connections a second, each sending 64 random bytes, then waiting (at
/// most 2 s) for the target to close it.
async fn flood(args: &Args) -> anyhow::Result<String> {
    let target: SocketAddr = args.req("target")?;
    let rate: u64 = args.req("rate")?;
    let duration = Duration::from_secs(args.req("duration")?);
    let sources = args.sources()?;
    let started = tokio::time::Instant::now();
    let deadline = started + duration;
    let (opened, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent: u64 = 0;
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    while tokio::time::Instant::now() < deadline {
        tick.tick().await;
        let due = rate * u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX) / 1000;
        while sent < due {
            sent += 1;
            let src = sources[usize::try_from(sent).unwrap_or(0) % sources.len()];
            let mut bytes = [0u8; 64];
            for b in &mut bytes {
                // xorshift: random enough for garbage.
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *b = seed.to_le_bytes()[0];
            }
            let (opened, failed) = (Arc::clone(&opened), Arc::clone(&failed));
            tokio::spawn(async move {
                match connect(src, target).await {
                    Ok(mut s) => {
                        opened.fetch_add(1, Ordering::Relaxed);
                        let _ = s.write_all(&bytes).await;
                        let mut buf = [0u8; 64];
                        let _ = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
                    }
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    }
    let secs = started.elapsed().as_secs_f64();
    #[allow(clippy::cast_precision_loss)] // a rate for a report
    let achieved = opened.load(Ordering::Relaxed) as f64 / secs;
    Ok(format!(
        "flood rate={rate} opened={} connect_failed={} achieved_per_s={achieved:.0}",
        opened.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    ))
}

/// Accepts any certificate: the bench measures the proxy's cost, not certificate checks.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// One request on a new connection: TCP, TLS handshake, `GET /`, the whole answer.
fn request(config: &Arc<rustls::ClientConfig>, to: SocketAddr, sni: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let tcp = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5))?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    tcp.set_write_timeout(Some(Duration::from_secs(5)))?;
    tcp.set_nodelay(true)?;
    let name = rustls::pki_types::ServerName::try_from(sni.to_owned())?;
    let conn = rustls::ClientConnection::new(Arc::clone(config), name)?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(format!("GET / HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n").as_bytes())?;
    let mut answer = Vec::new();
    match tls.read_to_end(&mut answer) {
        Ok(_) => {}
        // A peer closing without close_notify after the whole answer is not an error here.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => {}
        Err(e) => return Err(e.into()),
    }
    if !answer.starts_with(b"HTTP/1.1 200") {
        bail!(
            "answer: {:?}",
            String::from_utf8_lossy(&answer[..answer.len().min(40)])
        );
    }
    Ok(started.elapsed())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

/// `legit`: every `--every-ms`, one request through the target and one straight to the backend.
fn legit(args: &Args) -> anyhow::Result<String> {
    let target: SocketAddr = args.req("target")?;
    let direct: SocketAddr = args.req("direct")?;
    let sni: String = args.or("sni", "localhost".to_owned())?;
    let every = Duration::from_millis(args.or("every-ms", 20)?);
    let duration = Duration::from_secs(args.req("duration")?);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
            .with_no_client_auth(),
    );
    let deadline = Instant::now() + duration;
    let (mut via, mut straight) = (Vec::new(), Vec::new());
    let (mut errors, mut direct_errors) = (0u64, 0u64);
    let mut first_error = None;
    while Instant::now() < deadline {
        let round = Instant::now();
        match request(&config, target, &sni) {
            Ok(d) => via.push(d),
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
        match request(&config, direct, &sni) {
            Ok(d) => straight.push(d),
            Err(_) => direct_errors += 1,
        }
        if let Some(rest) = every.checked_sub(round.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    via.sort();
    straight.sort();
    let (p50, p99) = (percentile(&via, 0.5), percentile(&via, 0.99));
    let (d50, d99) = (percentile(&straight, 0.5), percentile(&straight, 0.99));
    Ok(format!(
        "legit requests={} errors={errors} p50_ms={p50:.3} p99_ms={p99:.3} direct_requests={} direct_errors={direct_errors} \
         direct_p50_ms={d50:.3} direct_p99_ms={d99:.3} p99_added_ms={:.3} first_error={:?}",
        via.len(),
        straight.len(),
        p99 - d99,
        first_error.unwrap_or_default()
    ))
}
