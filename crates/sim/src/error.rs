//! The crate's one error type.

use std::net::SocketAddr;

/// What can go wrong when starting or scripting the simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}; pick a free port or listen on 127.0.0.1:0")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A script or counter was asked for an account the simulator does not know.
    #[error(
        "no simulated account has the id {id:?}; declare it with SimConfig::account or SimHandle::add_account first"
    )]
    UnknownAccount {
        /// The id asked for.
        id: String,
    },
    /// Two accounts were declared with the same id.
    #[error("the simulated account id {id:?} is declared twice; give every account its own id")]
    DuplicateAccount {
        /// The repeated id.
        id: String,
    },
    /// Two accounts were declared with the same credential (the credential identifies the
    /// account, so it must be unique). The credential itself is not repeated here.
    #[error(
        "simulated accounts {id:?} and {other:?} share one credential; give every account its own credential"
    )]
    DuplicateCredential {
        /// The account being added.
        id: String,
        /// The account that already has the credential.
        other: String,
    },
}
