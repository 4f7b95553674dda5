//! [`run`]: the accept loop (the public listener and, when configured, the admin
//! listener), HTTP/1.1 and HTTP/2 (h2c, and `h2` by ALPN over TLS) with a bound on
//! every connection's first bytes, and the graceful drain on shutdown;
//! [`run_workers`]: the same on one single-threaded runtime per worker thread.

use std::future::Future;
use std::time::Duration;

use hyper_util::server::graceful::GracefulShutdown;
use keypool_store::{StoreError, now_ms};
use tokio::net::TcpListener;

use crate::balance::{AcceptBalance, OpenConnection, WorkerShare};
use crate::connection::{self, Protocols, Side};
use crate::tls::TlsCertificates;
use crate::{App, ProxyError};

/// What the server listens on: the public listener (`server.listen`), optionally with
/// TLS, and optionally the admin listener (`server.admin_listen`, plain HTTP) that then
/// alone serves `/admin/…` and `/metrics`. A bare `TcpListener` converts into one.
#[derive(Debug)]
pub struct Listeners {
    public: TcpListener,
    admin: Option<TcpListener>,
    tls: Option<TlsCertificates>,
}

impl Listeners {
    /// The public listener alone, plain HTTP.
    pub fn new(public: TcpListener) -> Self {
        Self {
            public,
            admin: None,
            tls: None,
        }
    }

    /// Adds the admin listener.
    pub fn with_admin(mut self, admin: TcpListener) -> Self {
        self.admin = Some(admin);
        self
    }

    /// Terminates TLS on the public listener with `tls` (reload it with
    /// [`TlsCertificates::reload`]: new handshakes use the new certificate).
    pub fn with_tls(mut self, tls: TlsCertificates) -> Self {
        self.tls = Some(tls);
        self
    }
}

impl From<TcpListener> for Listeners {
    fn from(public: TcpListener) -> Self {
        Self::new(public)
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then drains: stops accepting,
/// lets requests and streams in flight finish for up to `shutdown_grace`, persists the
/// runtime state and returns.
///
/// Connections speak HTTP/1.1 with keep-alive or HTTP/2 (h2c with prior knowledge on
/// plain TCP, `h2` by ALPN over TLS). A client whose TLS handshake and first bytes have
/// not arrived within `header_read_timeout` of the accept is disconnected (see
/// [`crate::connection`]: neither hyper's HTTP/2 server nor hyper-util's protocol
/// detection bound that wait themselves); an HTTP/1.1 client that has not sent its
/// complete request head within `header_read_timeout` (from its first bytes or the end
/// of the previous request) too. The header read timeout and the grace period are read
/// from the configuration at start.
///
/// # Errors
/// [`ProxyError::Listener`] when the listener's address cannot be read;
/// [`ProxyError::StateNotSaved`] when the state file cannot be written at the end
/// (after the drain). Accept errors (e.g. too many open files) are logged and retried,
/// never fatal; a failed final push to Redis is logged (every change was mirrored as
/// it happened).
pub async fn run(
    listeners: impl Into<Listeners>,
    app: impl Into<App>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ProxyError> {
    let app = app.into();
    let Listeners { public, admin, tls } = listeners.into();
    log_listening(&public, admin.as_ref(), tls.is_some(), 1)?;
    let refresher = crate::oauth::spawn_refresher(app.clone());
    serve(public, admin, tls.as_ref(), &app, None, shutdown).await;
    refresher.abort();
    persist(&app).await
}

/// Stops a background task when dropped (on every return path).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Logs the addresses (and fails when one cannot be read).
fn log_listening(
    public: &TcpListener,
    admin: Option<&TcpListener>,
    tls: bool,
    workers: usize,
) -> Result<(), ProxyError> {
    let addr = public.local_addr().map_err(ProxyError::Listener)?;
    let admin = admin
        .map(|a| a.local_addr().map_err(ProxyError::AdminListener))
        .transpose()?;
    match admin {
        Some(admin) => {
            tracing::info!(%addr, %admin, tls, workers, "keypool listening; admin API and metrics on the admin address only")
        }
        None => tracing::info!(%addr, tls, workers, "keypool listening"),
    }
    Ok(())
}

/// [`run`] on `workers` threads: this task serves too, and `workers - 1` more threads
/// each run a single-threaded tokio runtime that accepts from the same listening socket
/// and owns its own upstream connection pool ([`App::with_own_client`]). Everything
/// else (configuration, health, ratings, metrics) is shared.
///
/// A request lives on one thread, together with the upstream connections it uses: no
/// request hops between threads, which on small machines costs more than the proxying
/// itself (a cross-thread wake-up of an idle CPU is tens of microseconds in a VM). The
/// kernel hands each new connection to whichever thread accepts first; the balance
/// ([`crate::balance`]) gives it to the lowest-numbered thread that is not busy, and
/// between requests moves connections onto fewer threads while the load is light and
/// spreads them when a thread is saturated or starved. `workers` is `[server] workers` (0 there means one
/// per CPU); `1` serves on this task alone.
///
/// # Errors
/// [`ProxyError::Listener`] when the listener cannot be shared,
/// [`ProxyError::Worker`] when a worker thread or its runtime cannot start, and
/// [`ProxyError::StateNotSaved`] as for [`run`].
pub async fn run_workers(
    listeners: impl Into<Listeners>,
    app: impl Into<App>,
    workers: usize,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ProxyError> {
    let app = app.into();
    let Listeners { public, admin, tls } = listeners.into();
    let workers = workers.max(1);
    log_listening(&public, admin.as_ref(), tls.is_some(), workers)?;
    let _refresher = AbortOnDrop(crate::oauth::spawn_refresher(app.clone()));
    let shared = public.into_std().map_err(ProxyError::Listener)?;
    // Dropping the sender (this function returning, on any path) also stops them.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut threads = Vec::with_capacity(workers - 1);
    let mut shares = AcceptBalance::shares(workers).into_iter();
    if workers > 1
        && let Some(share) = shares.as_slice().first()
    {
        app.show_workers(&share.balance);
    }
    let own_share = shares.next();
    let mut start = || -> Result<TcpListener, ProxyError> {
        for (index, share) in (1..workers).zip(shares.by_ref()) {
            let socket = shared.try_clone().map_err(ProxyError::Listener)?;
            let app = app.with_own_client();
            let tls = tls.clone();
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
                        serve(listener, None, tls.as_ref(), &app, Some(share), stop).await;
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
    let shutdown = async move {
        shutdown.await;
        let _ = stop.send(true);
    };
    let own_share = own_share.filter(|_| workers > 1);
    serve(listener, admin, tls.as_ref(), &app, own_share, shutdown).await;
    join(threads).await;
    persist(&app).await
}

/// Hands a connection this worker accepted to `worker` (counted open there by `open`);
/// serves it here when that worker has stopped.
fn hand_over(
    share: &WorkerShare,
    worker: usize,
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    open: OpenConnection,
    spawn: &impl Fn(tokio::net::TcpStream, std::net::SocketAddr, Side, Option<OpenConnection>),
) {
    let stream = match stream.into_std() {
        Ok(stream) => stream,
        Err(e) => {
            tracing::warn!(error = %e, "an accepted connection could not be handed to another worker; closed");
            return;
        }
    };
    if let Err((stream, peer, open)) = share.balance.hand_over(worker, (stream, peer, open)) {
        drop(open);
        match tokio::net::TcpStream::from_std(stream) {
            Ok(stream) => spawn(
                stream,
                peer,
                Side::Public,
                Some(share.balance.open_on(share.me)),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "an accepted connection could not be registered again; closed")
            }
        }
    }
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

/// The accept loop and the drain, without persisting: `public` (with `tls`) and, on
/// this thread only, `admin`. With a `share` of the workers' [`AcceptBalance`], a
/// public connection goes to the worker [`crate::balance::place`] picks, this worker's
/// load is measured and its moves planned ([`crate::balance::watch_load`]), and the
/// connections the other workers hand over arrive in the share's inbox.
async fn serve(
    public: TcpListener,
    admin: Option<TcpListener>,
    tls: Option<&TlsCertificates>,
    app: &App,
    mut share: Option<WorkerShare>,
    shutdown: impl Future<Output = ()>,
) {
    let settings = app.store().config().server().clone();
    let protocols = std::sync::Arc::new(Protocols::new(Duration::from_millis(
        settings.header_read_timeout_ms,
    )));
    let graceful = GracefulShutdown::new();
    // keypool's own HTTP/1.1 connections drain through this (see connection::DrainSignals)
    let (drain, drain_signal) = tokio::sync::watch::channel(false);
    let accept_admin = async |admin: &Option<TcpListener>| match admin {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    };
    let handed_over = async |share: &mut Option<WorkerShare>| match share {
        Some(share) => share.inbox.recv().await,
        None => std::future::pending().await,
    };
    let spawn = |stream: tokio::net::TcpStream,
                 peer: std::net::SocketAddr,
                 side: Side,
                 open: Option<OpenConnection>| {
        let tls = match side {
            Side::Public => tls.map(TlsCertificates::acceptor),
            Side::Admin => None,
        };
        let signals = connection::DrainSignals {
            watcher: graceful.watcher(),
            drain: drain_signal.clone(),
        };
        let (app, protocols) = (app.clone(), protocols.clone());
        // The clock is read once per poll of the connection (`keypool_store::clock`).
        tokio::spawn(keypool_store::clock::once_per_poll(async move {
            connection::serve(stream, peer, side, tls, &protocols, app, signals, open).await;
        }));
    };
    // Each worker measures its own thread's load and plans its connections' moves.
    let load_watch = share.as_ref().map(|share| {
        AbortOnDrop(tokio::spawn(crate::balance::watch_load(
            std::sync::Arc::clone(&share.balance),
            share.me,
        )))
    });
    tokio::pin!(shutdown);
    loop {
        let (accepted, side) = tokio::select! {
            accepted = public.accept() => (accepted, Side::Public),
            accepted = accept_admin(&admin) => (accepted, Side::Admin),
            Some((stream, peer, open)) = handed_over(&mut share) => {
                match tokio::net::TcpStream::from_std(stream) {
                    Ok(stream) => spawn(stream, peer, Side::Public, Some(open)),
                    Err(e) => tracing::warn!(error = %e, "a connection handed over by another worker could not be registered; closed"),
                }
                continue;
            }
            () = &mut shutdown => break,
        };
        match accepted {
            Ok((stream, peer)) => match (&share, side) {
                (Some(share), Side::Public) => {
                    let (worker, open) = share.balance.assign(share.me, tls.is_none());
                    if worker == share.me {
                        spawn(stream, peer, side, Some(open));
                    } else {
                        hand_over(share, worker, stream, peer, open, &spawn);
                    }
                }
                _ => spawn(stream, peer, side, None),
            },
            Err(e) => {
                tracing::warn!(error = %e, "accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    drop(load_watch);
    if let Some(share) = &share {
        share.balance.stop(share.me);
    }
    // Connections handed over just before the shutdown are served (and drained) too;
    // from now on the other workers serve what they accept themselves.
    if let Some(share) = &mut share {
        share.inbox.close();
        while let Ok((stream, peer, open)) = share.inbox.try_recv() {
            if let Ok(stream) = tokio::net::TcpStream::from_std(stream) {
                spawn(stream, peer, Side::Public, Some(open));
            }
        }
    }
    drop(drain_signal);
    app.begin_drain();
    drop(public);
    drop(admin);
    let grace = Duration::from_millis(settings.shutdown_grace_ms);
    tracing::info!(
        grace_ms = settings.shutdown_grace_ms,
        "draining requests in flight"
    );
    let _ = drain.send(true);
    let drained = async {
        tokio::join!(graceful.shutdown(), drain.closed());
    };
    tokio::select! {
        () = drained => tracing::info!("all connections drained"),
        () = tokio::time::sleep(grace) => tracing::warn!("shutdown grace elapsed; closing what is still in flight"),
    }
}
