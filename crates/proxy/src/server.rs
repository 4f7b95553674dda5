//! [`run`]: the accept loop, HTTP/1.1 with a header read timeout, and the graceful
//! drain on shutdown; [`run_workers`]: the same on one single-threaded runtime per
//! worker thread.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use keypool_store::{StoreError, now_ms};
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
/// [`ProxyError::Listener`] when the listener's address cannot be read;
/// [`ProxyError::StateNotSaved`] when the state file cannot be written at the end
/// (after the drain). Accept errors (e.g. too many open files) are logged and retried,
/// never fatal; a failed final push to Redis is logged (every change was mirrored as
/// it happened).
pub async fn run(
    listener: TcpListener,
    app: impl Into<App>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ProxyError> {
    let app = app.into();
    let addr = listener.local_addr().map_err(ProxyError::Listener)?;
    tracing::info!(%addr, "keypool listening");
    serve(listener, &app, shutdown).await;
    persist(&app).await
}

/// [`run`] on `workers` threads: this task serves too, and `workers - 1` more threads
/// each run a single-threaded tokio runtime that accepts from the same listening socket
/// and owns its own upstream connection pool ([`App::with_own_client`]). Everything
/// else (configuration, health, ratings, metrics) is shared.
///
/// A connection then lives on one thread from its accept to its close, together with
/// the upstream connections its requests use: no request hops between threads, which
/// on small machines costs more than the proxying itself (a cross-thread wake-up of an
/// idle CPU is tens of microseconds in a VM). The kernel hands each new connection to
/// whichever thread accepts first, so an idle thread takes the next one. `workers` is
/// `[server] workers` (0 there means one per CPU); `1` serves on this task alone.
///
/// # Errors
/// [`ProxyError::Listener`] when the listener cannot be shared,
/// [`ProxyError::Worker`] when a worker thread or its runtime cannot start, and
/// [`ProxyError::StateNotSaved`] as for [`run`].
pub async fn run_workers(
    listener: TcpListener,
    app: impl Into<App>,
    workers: usize,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ProxyError> {
    let app = app.into();
    let addr = listener.local_addr().map_err(ProxyError::Listener)?;
    let workers = workers.max(1);
    let shared = listener.into_std().map_err(ProxyError::Listener)?;
    // Dropping the sender (this function returning, on any path) also stops them.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut threads = Vec::with_capacity(workers - 1);
    let mut start = || -> Result<TcpListener, ProxyError> {
        for index in 1..workers {
            let socket = shared.try_clone().map_err(ProxyError::Listener)?;
            let app = app.with_own_client();
            let mut stopped = stopped.clone();
            let thread = std::thread::Builder::new()
                .name(format!("keypool-worker-{index}"))
                .spawn(move || -> Result<(), ProxyError> {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(ProxyError::Worker)?;
                    runtime.block_on(async move {
                        let listener =
                            TcpListener::from_std(socket).map_err(ProxyError::Listener)?;
                        let stop = async move {
                            let _ = stopped.wait_for(|&stop| stop).await;
                        };
                        serve(listener, &app, stop).await;
                        Ok(())
                    })
                })
                .map_err(ProxyError::Worker)?;
            threads.push(thread);
        }
        TcpListener::from_std(shared.try_clone().map_err(ProxyError::Listener)?)
            .map_err(ProxyError::Listener)
    };
    let listener = match start() {
        Ok(listener) => listener,
        Err(e) => {
            // The threads already started see the sender go and drain.
            drop(stop);
            join(threads).await;
            return Err(e);
        }
    };
    // Only the serving loops keep the socket open: once they stop accepting, new
    // connections are refused rather than left in the backlog during the drain.
    drop(shared);
    tracing::info!(%addr, workers, "keypool listening");
    let shutdown = async move {
        shutdown.await;
        let _ = stop.send(true);
    };
    serve(listener, &app, shutdown).await;
    join(threads).await;
    persist(&app).await
}

/// Waits for the worker threads without blocking the runtime; a worker's error is
/// logged (its connections have ended either way).
async fn join(threads: Vec<std::thread::JoinHandle<Result<(), ProxyError>>>) {
    for thread in threads {
        match tokio::task::spawn_blocking(move || thread.join()).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::error!(error = %e, "a worker thread failed"),
            Ok(Err(_)) | Err(_) => tracing::error!("a worker thread panicked"),
        }
    }
}

/// The final write of the runtime state. Only a state file that cannot be written is
/// an error: it is the only copy. Redis got every change as it happened; its final push
/// is best-effort.
async fn persist(app: &App) -> Result<(), ProxyError> {
    match app.store().persist(now_ms()).await {
        Ok(()) => Ok(()),
        Err(e @ StoreError::WriteState { .. }) => Err(ProxyError::StateNotSaved(e)),
        Err(e) => {
            tracing::warn!(error = %e, "could not push the runtime state to Redis at shutdown");
            Ok(())
        }
    }
}

/// The accept loop and the drain, without persisting.
async fn serve(listener: TcpListener, app: &App, shutdown: impl Future<Output = ()>) {
    let settings = app.store().config().server().clone();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(settings.header_read_timeout_ms));
    let graceful = GracefulShutdown::new();
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
}
