//! The admin endpoints, served safely by default: plain HTTP on loopback for the kubelet's
//! probes and local tools, and an authenticated HTTPS endpoint for Prometheus.
//!
//! ```text
//!  --admin-listen 127.0.0.1:9590 ──► plain HTTP: /health /ready /leader /metrics  (no auth: loopback only
//!                                     by default; another address is an explicit, logged opt-in)
//!  --metrics-listen 0.0.0.0:9592 ──► TlsListener (handshakes off the accept loop, each bounded)
//!        │ rustls: --metrics-tls-cert/-key, else a self-signed certificate made at start
//!        ▼
//!      require(): Authorization: Bearer <token> ─► auth::Authorizer
//!        TokenReview (who is it?) ─► SubjectAccessReview (may it `get` nonResourceURL <path>?)
//!        401 no/invalid token · 403 not allowed · 503 the API server cannot say · else the route
//! ```
//!
//! This is what controller-runtime's secure metrics (`filters.WithAuthenticationAndAuthorization`)
//! and kube-rbac-proxy do: a Prometheus whose service account is bound to a ClusterRole with
//! `nonResourceURLs: ["/metrics"], verbs: ["get"]` is let in, anybody else is not.

pub mod auth;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, warn};

pub use auth::{Authorizer, Verdict};

/// The longest a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// TLS handshakes in progress at once; connections beyond wait in the kernel's backlog.
const MAX_HANDSHAKES: usize = 64;

/// Errors starting an admin server.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The listen address cannot be bound.
    #[error("listening on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The TLS certificate or key.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// Where the plain admin server listens: `None` for `off`, else the address. The caller logs a
/// warning when it is not a loopback address (serving unauthenticated endpoints to the network
/// is an opt-in, never a default).
pub fn parse_listen(value: &str) -> Result<Option<SocketAddr>, String> {
    match value.trim() {
        "off" => Ok(None),
        v => v
            .parse()
            .map(Some)
            .map_err(|_| format!("{v:?}: expected IP:port or off")),
    }
}

/// Says, once at start, that plain, unauthenticated admin endpoints are served beyond loopback.
pub fn warn_if_exposed(flag: &str, addr: SocketAddr) {
    if !addr.ip().is_loopback() {
        warn!(%addr, flag, "admin endpoints served in plain HTTP without authentication on a non-loopback address (an explicit opt-in): anyone who reaches it reads them");
    }
}

/// Binds `addr` and serves `app` in plain HTTP until `shutdown`.
pub async fn bind_plain(addr: SocketAddr) -> Result<TcpListener, AdminError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError::Bind { addr, source })
}

/// Serves `app` on `listener` in plain HTTP until `shutdown`.
pub async fn serve_plain(listener: TcpListener, app: axum::Router, shutdown: CancellationToken) {
    if let Err(error) = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
    {
        warn!(%error, "admin server stopped");
    }
}

/// The authenticated metrics server: `app`'s routes over TLS, each request allowed only for a
/// bearer token the API server authenticates (TokenReview) and authorises for `get` on the
/// request's path (SubjectAccessReview).
pub struct SecureServer {
    listener: TcpListener,
    acceptor: TlsAcceptor,
    authorizer: Arc<Authorizer>,
}

impl SecureServer {
    /// Binds `addr` with the TLS configuration `tls`.
    pub async fn bind(
        addr: SocketAddr,
        tls: Arc<rustls::ServerConfig>,
        authorizer: Authorizer,
    ) -> Result<Self, AdminError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| AdminError::Bind { addr, source })?;
        Ok(Self {
            listener,
            acceptor: TlsAcceptor::from(tls),
            authorizer: Arc::new(authorizer),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `app` until `shutdown`.
    pub async fn serve(self, app: axum::Router, shutdown: CancellationToken) {
        let Self {
            listener,
            acceptor,
            authorizer,
        } = self;
        let addr = listener.local_addr().ok();
        info!(
            ?addr,
            "authenticated metrics server listening (HTTPS, TokenReview + SubjectAccessReview)"
        );
        let app = app.layer(axum::middleware::from_fn_with_state(authorizer, require));
        let tls = TlsListener::spawn(listener, acceptor, shutdown.clone());
        if let Err(error) = axum::serve(tls, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await
        {
            warn!(%error, "metrics server stopped");
        }
    }
}

/// Lets a request through only when its bearer token may `get` its path.
async fn require(State(authorizer): State<Arc<Authorizer>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    let token = auth::bearer_token(req.headers().get(header::AUTHORIZATION));
    match authorizer.check(token, &path).await {
        Verdict::Allowed { .. } => next.run(req).await,
        Verdict::Unauthenticated(why) => {
            debug!(%path, why, "admin request refused: not authenticated");
            let mut resp = (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response();
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            resp
        }
        Verdict::Forbidden { user } => {
            debug!(%path, %user, "admin request refused: not authorised");
            (
                StatusCode::FORBIDDEN,
                format!("Forbidden: {user} may not get {path}\n"),
            )
                .into_response()
        }
        Verdict::Unavailable(why) => {
            warn!(%path, %why, "cannot authenticate an admin request");
            (StatusCode::SERVICE_UNAVAILABLE, "authentication unavailable\n").into_response()
        }
    }
}

/// Accepted TLS connections for `axum::serve`: TCP connections are accepted in a task of their
/// own and each handshake runs in its own task, bounded by [`HANDSHAKE_TIMEOUT`], so a client
/// that stalls its handshake holds up nobody else.
struct TlsListener {
    ready: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    fn spawn(listener: TcpListener, acceptor: TlsAcceptor, shutdown: CancellationToken) -> Self {
        let local = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let (tx, ready) = tokio::sync::mpsc::channel(MAX_HANDSHAKES);
        let permits = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(
            async move {
                loop {
                    let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
                        return;
                    };
                    let accepted = tokio::select! {
                        () = shutdown.cancelled() => return,
                        a = listener.accept() => a,
                    };
                    let (tcp, peer) = match accepted {
                        Ok(c) => c,
                        Err(error) => {
                            debug!(%error, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let (acceptor, tx) = (acceptor.clone(), tx.clone());
                    tokio::spawn(async move {
                        let _permit = permit;
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(tls)) => {
                                let _ = tx.send((tls, peer)).await;
                            }
                            Ok(Err(error)) => debug!(%peer, %error, "TLS handshake failed"),
                            Err(_) => debug!(%peer, "TLS handshake timed out"),
                        }
                    });
                }
            }
            .instrument(tracing::info_span!("metrics-accept")),
        );
        Self { ready, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept task ended (shutdown): nothing more comes; graceful shutdown ends serve.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
