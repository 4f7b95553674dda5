//! Unix signals for the binary: `SIGTERM`/`SIGINT` end the server gracefully, `SIGHUP`
//! reloads the configuration file (SPEC 9, 10).

use std::path::PathBuf;

use keypool_store::Store;
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;

use crate::{ProxyError, TlsCertificates};

/// A future that completes at the first `SIGTERM` or `SIGINT`: pass it to
/// [`run`](crate::run) as the shutdown future. Installs the handlers at once: make it
/// before binding the listener (see [`HangUp`]).
///
/// # Errors
/// [`ProxyError::Signal`] when a handler cannot be installed.
pub fn terminate_signal() -> Result<impl Future<Output = ()> + Send + 'static, ProxyError> {
    let install = |kind, name| {
        signal(kind).map_err(|source| ProxyError::Signal {
            signal: name,
            source,
        })
    };
    let mut term = install(SignalKind::terminate(), "SIGTERM")?;
    let mut int = install(SignalKind::interrupt(), "SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT received: shutting down"),
        }
    })
}

/// `SIGHUP`, caught from the moment this is made: one that arrives before the reload
/// task runs is kept for it. Make it (with [`terminate_signal`]) before binding the
/// listener: once the port accepts connections, a deployment may send `SIGHUP` at any
/// moment, and the default action of an uncaught `SIGHUP` ends the process (every
/// connection then reset).
#[derive(Debug)]
pub struct HangUp(tokio::signal::unix::Signal);

/// Installs the `SIGHUP` handler now ([`HangUp`]).
///
/// # Errors
/// [`ProxyError::Signal`] when the handler cannot be installed.
pub fn hangup_signal() -> Result<HangUp, ProxyError> {
    signal(SignalKind::hangup())
        .map(HangUp)
        .map_err(|source| ProxyError::Signal {
            signal: "SIGHUP",
            source,
        })
}

/// Spawns a task that reloads `path` into `store` at every `SIGHUP` (`hup`). An invalid
/// file is rejected with every problem logged; the old configuration keeps serving.
pub fn spawn_reload_on_sighup(hup: HangUp, store: Store, path: PathBuf) -> JoinHandle<()> {
    spawn_reload_with_tls_on_sighup(hup, store, path, None)
}

/// [`spawn_reload_on_sighup`], and at every `SIGHUP` also re-reads the TLS certificate
/// and key of `tls` (a file that cannot be used is logged and the current certificate
/// keeps serving).
pub fn spawn_reload_with_tls_on_sighup(
    hup: HangUp,
    store: Store,
    path: PathBuf,
    tls: Option<TlsCertificates>,
) -> JoinHandle<()> {
    let HangUp(mut hup) = hup;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match store.reload_config(&path).await {
                Ok(()) => tracing::info!(config = %path.display(), "configuration reloaded"),
                Err(e) => tracing::error!(
                    config = %path.display(),
                    error = %e,
                    "configuration reload rejected; the previous configuration keeps serving"
                ),
            }
            if let Some(tls) = &tls {
                match tls.reload() {
                    Ok(()) => tracing::info!("TLS certificate and key reloaded"),
                    Err(e) => tracing::error!(
                        error = %e,
                        "TLS certificate reload rejected; the current certificate keeps serving"
                    ),
                }
            }
        }
    })
}
