//! [`run`]: the accept loop, HTTP/1.1 and h2c with a header read timeout, and the
//! graceful drain on shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use keypool_store::now_ms;
use tokio::net::TcpListener;

use crate::{App, ProxyError};

/// Serves `app` on `listener` until `shutdown` completes, then drains: stops accepting,
/// lets requests and streams in flight finish for up to `shutdown_grace`, persists the
/// runtime state and returns.
///
/// Connections speak HTTP/1.1 with keep-alive; a client that has not sent its complete
/// request head within `header_read_timeout` (from the connection's start or the end of
/// the previous request) is disconnected. HTTP/2 is deliberately not served: hyper-util's
/// HTTP/1-or-h2c detection waits for the first 24 bytes without any timeout, so a client
/// that connects and sends nothing would hold its connection forever; Anthropic clients
/// speak HTTP/1.1 to a plain-HTTP base URL, and a TLS terminator in front of keypool can
/// still speak HTTP/2 to clients. The header read timeout and the grace period are read
/// from the configuration at start.
///
/// # Errors
/// [`ProxyError::Listener`] when the listener's address cannot be read; accept errors
/// (e.g. too many open files) are logged and retried, never fatal.
pub async fn run(
    listener: TcpListener,
    app: impl Into<App>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ProxyError> {
    let app = app.into();
    let addr = listener.local_addr().map_err(ProxyError::Listener)?;
    let settings = app.store().config().server().clone();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(settings.header_read_timeout_ms));
    let graceful = GracefulShutdown::new();
    tracing::info!(%addr, "keypool listening");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    let app = app.clone();
                    let service = service_fn(move |request| {
                        let app = app.clone();
                        async move { Ok::<_, Infallible>(app.handle(request).await) }
                    });
                    let connection = builder.serve_connection(TokioIo::new(stream), service);
                    let connection = graceful.watch(connection);
                    tokio::spawn(async move {
                        if let Err(e) = connection.await {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    let grace = Duration::from_millis(settings.shutdown_grace_ms);
    tracing::info!(
        grace_ms = settings.shutdown_grace_ms,
        "draining requests in flight"
    );
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("all connections drained"),
        () = tokio::time::sleep(grace) => tracing::warn!("shutdown grace elapsed; closing what is still in flight"),
    }
    if let Err(e) = app.store().persist(now_ms()).await {
        tracing::error!(error = %e, "could not persist runtime state at shutdown");
    }
    Ok(())
}
