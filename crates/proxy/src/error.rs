//! [`ProxyError`]: what can stop the server itself. Request failures never surface here:
//! they become Anthropic-shaped responses ([`crate::reject`]).

/// Everything that can go wrong while running the proxy (not while answering one
/// request). No variant carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The listener's address could not be read.
    #[error("cannot read the listening socket's address: {0}; check the listener is bound")]
    Listener(#[source] std::io::Error),
    /// The configured hedge budget is out of range.
    #[error("invalid server.hedge_budget: {0}")]
    HedgeBudget(#[from] keypool_selector::SelectError),
    /// A worker thread or its runtime could not start.
    #[error(
        "cannot start a worker thread: {0}; lower [server] workers or raise the process's thread limit"
    )]
    Worker(#[source] std::io::Error),
    /// The state file could not be written at shutdown: the runtime state since its
    /// last successful write is lost.
    #[error(
        "the runtime state could not be saved at shutdown: {0}; cooldowns, disabled accounts and usage windows since the last successful write are lost"
    )]
    StateNotSaved(keypool_store::StoreError),
    /// The TLS certificate or key could not be used (the message names the file).
    #[error("TLS: {0}")]
    Tls(String),
    /// The admin listener's address could not be read.
    #[error("cannot read the admin listener's address: {0}")]
    AdminListener(#[source] std::io::Error),
    /// Installing a signal handler failed.
    #[error("cannot install the {signal} handler: {source}; is this a Unix system?")]
    Signal {
        /// Which signal.
        signal: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}
