//! [`StoreError`]: every failure of this crate.

use std::path::PathBuf;

use crate::config::ConfigErrors;

/// Everything that can go wrong in `keypool-store`. No variant carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}; check the path and its permissions")]
    ReadConfig {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The config file was read but is not valid; every problem is listed.
    #[error("config file {path} is invalid: {errors}")]
    InvalidConfig {
        /// The file.
        path: PathBuf,
        /// Every problem, with its location.
        errors: ConfigErrors,
    },
    /// The config document in Redis (`config_store = "redis"`) is not valid with this
    /// replica's `[server]` table and environment; every problem is listed.
    #[error(
        "the config document in Redis (keypool:{{config}}:document, with the [server] table of {local}) is invalid: {errors}; fix it with `keypool config pull`, edit, `keypool config push`"
    )]
    InvalidDocument {
        /// This replica's local file (its `[server]` table).
        local: PathBuf,
        /// Every problem, with its location.
        errors: ConfigErrors,
    },
    /// The state file could not be written.
    #[error("cannot write state file {path}: {source}; check the folder exists and is writable")]
    WriteState {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The state file could not be read (other than being absent or corrupt).
    #[error("cannot read state file {path}: {source}")]
    ReadState {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A config file's listen addresses could not be read (`config::listen_addresses`).
    #[error("{0}")]
    Config(String),
    /// Redis could not be reached or answered an error; the caller falls back to memory.
    #[error("redis: {0}; keypool keeps serving from memory until Redis answers again")]
    Redis(String),
    /// Every available account is at its `max_concurrent` and the queue of waiting
    /// requests is full.
    #[error(
        "every account is at its max_concurrent and {depth} requests already wait (queue_max_depth); retry later or raise max_concurrent"
    )]
    QueueFull {
        /// `queue_max_depth`.
        depth: u32,
    },
    /// No concurrency slot came free within `queue_max_wait_ms`.
    #[error(
        "no account had a free concurrency slot within {waited_ms} ms (queue_max_wait_ms); retry later or raise max_concurrent"
    )]
    QueueTimeout {
        /// How long the request waited.
        waited_ms: u64,
    },
}
