//! A Kubernetes client that fails over between API servers on the client side.
//!
//! The controller must never reach Kubernetes through the FIP it manages (CPEM #304/#319): if the
//! FIP holder dies it would lose the very API it needs to move the FIP. Given every control-plane
//! address, [`client`] builds one `kube::Client` whose requests go to the last API server that
//! answered, and on a transport error (connection refused, timeout, TLS) are retried on the next
//! address. Request bodies are buffered so a retry sends the same bytes. Watches reconnect through
//! the same path, so they move to a live API server too.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use kube::client::Body;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Errors building the client.
#[derive(Debug, thiserror::Error)]
pub enum FailoverError {
    #[error("invalid API server URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("building a client for {url}: {source}")]
    Client {
        url: String,
        #[source]
        source: kube::Error,
    },
    #[error("no API server URL given")]
    Empty,
}

/// The tower service behind the client.
#[derive(Clone)]
struct Failover {
    clients: Arc<Vec<(String, kube::Client)>>,
    current: Arc<AtomicUsize>,
}

impl tower::Service<Request<Body>> for Failover {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await?;
            let n = this.clients.len();
            let start = this.current.load(Ordering::Relaxed);
            let mut last: Option<kube::Error> = None;
            for i in 0..n {
                let idx = (start + i) % n;
                let mut builder = Request::builder()
                    .method(parts.method.clone())
                    .uri(parts.uri.clone())
                    .version(parts.version);
                if let Some(h) = builder.headers_mut() {
                    h.clone_from(&parts.headers);
                }
                let req = builder.body(Body::from(bytes.clone()))?;
                let (url, client) = &this.clients[idx];
                match client.send(req).await {
                    Ok(resp) => {
                        if idx != start {
                            tracing::info!(api_server = %url, "switched to another API server");
                        }
                        this.current.store(idx, Ordering::Relaxed);
                        return Ok(resp);
                    }
                    Err(error) => {
                        tracing::debug!(api_server = %url, %error, "API server unreachable; trying the next");
                        last = Some(error);
                    }
                }
            }
            Err(last.map_or_else(|| "no API server".into(), |e| Box::new(e) as BoxError))
        })
    }
}

/// A client for `base` (credentials, CA, TLS server name) that sends each request to the first
/// reachable of `urls`, starting from the last one that answered.
pub fn client(base: &kube::Config, urls: &[String]) -> Result<kube::Client, FailoverError> {
    if urls.is_empty() {
        return Err(FailoverError::Empty);
    }
    let mut clients = Vec::with_capacity(urls.len());
    for url in urls {
        let mut cfg = base.clone();
        cfg.cluster_url = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| FailoverError::Url {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        // A dead API server must cost little: fail the connection fast and try the next.
        cfg.connect_timeout = Some(
            cfg.connect_timeout
                .unwrap_or(Duration::from_secs(1))
                .min(Duration::from_secs(1)),
        );
        let c = kube::Client::try_from(cfg).map_err(|source| FailoverError::Client {
            url: url.clone(),
            source,
        })?;
        clients.push((url.clone(), c));
    }
    let ns = base.default_namespace.clone();
    Ok(kube::Client::new(
        Failover {
            clients: Arc::new(clients),
            current: Arc::new(AtomicUsize::new(0)),
        },
        ns,
    ))
}
