//! One shutdown signal: SIGTERM or SIGINT.

use std::future::Future;

/// Listens for SIGTERM and SIGINT from this call on; the future completes on the first one.
///
/// The handlers are installed before this returns, not when the future is first polled: a
/// server calls it before it binds its sockets, so a signal sent as soon as it accepts
/// connections (a supervisor, a test, an impatient operator) stops it cleanly instead of
/// killing it by the default action.
pub fn shutdown() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{Signal, SignalKind, signal};
        async fn first(signal: Option<Signal>) {
            match signal {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        let term = signal(SignalKind::terminate()).ok();
        let int = signal(SignalKind::interrupt()).ok();
        async move {
            tokio::select! {
                () = first(term) => {}
                () = first(int) => {}
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
