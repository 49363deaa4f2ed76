//! A small HTTPS server for the lab's stand-ins (the slow API server, the slow admission
//! webhook): TLS with a certificate from the cluster CA, HTTP/1.1 and HTTP/2 (ALPN), one task
//! per connection, all stopped when the serving task is aborted.
//!
//! ```text
//!  TcpListener ─accept─▶ TLS (rustls, ring) ─▶ hyper auto (h1 | h2) ─▶ handler(req) -> resp
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::control_plane::ServingCert;

/// The body of every answer.
pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

/// A TLS acceptor serving `cert`, offering HTTP/2 and HTTP/1.1.
pub(crate) fn acceptor(cert: ServingCert) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![rustls::pki_types::CertificateDer::from(cert.cert_der)],
            rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_der.into()),
        )
        .context("the server's certificate")?;
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(tls)))
}

/// Serves `handler` on `listener` until aborted; each connection runs on a task that is
/// aborted with this one.
pub(crate) async fn serve<H, F>(listener: TcpListener, acceptor: tokio_rustls::TlsAcceptor, handler: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let _ = tcp.set_nodelay(true);
                let (acceptor, handler) = (acceptor.clone(), handler.clone());
                conns.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let service = hyper::service::service_fn(move |req| {
                        let answer = handler(req);
                        async move { Ok::<_, Infallible>(answer.await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
            Some(_) = conns.join_next() => {}
        }
    }
}

/// An answer with `status` and a one-line text body.
pub(crate) fn text(status: StatusCode, msg: &str) -> Response<Body> {
    let mut resp = Response::new(full(Bytes::from(format!("{msg}\n"))));
    *resp.status_mut() = status;
    resp
}

/// `bytes` as a body.
pub(crate) fn full(bytes: Bytes) -> Body {
    Full::new(bytes).map_err(|n| match n {}).boxed()
}
