//! The one error type of this crate.

use keypool_core::{ModelFamily, UnixMs, Window};

/// The name of a window in messages: `5h`, `weekly`, or `weekly (opus)` for one model
/// family's weekly window.
pub fn window_name(window: Window, family: Option<ModelFamily>) -> String {
    match family {
        Some(f) => format!("{window} ({f})"),
        None => window.to_string(),
    }
}

/// Why no plan could be made, or why a configuration value was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SelectError {
    /// The snapshot holds no account at all.
    #[error(
        "the pool has no accounts: add accounts to the group (or to the organisation) in the configuration"
    )]
    EmptyPool,

    /// Every account of the snapshot is inactive (`active = false`).
    #[error(
        "all {total} accounts of the pool are disabled (active = false): re-enable one through the admin API or the configuration"
    )]
    NoActiveAccounts {
        /// How many accounts the snapshot held.
        total: usize,
    },

    /// Every active account is out of its 5-hour or weekly usage window (SPEC 3.5.2).
    /// The proxy answers `429` at once with `Retry-After: retry_after_secs`.
    #[error(
        "all accounts are out of their {} usage window: retry after {retry_after_secs} s, the first account returns at unix ms {returns_at}",
        window_name(*window, *family)
    )]
    AllOutOfWindow {
        /// The window of the account that returns first (`5h` or `weekly`).
        window: Window,
        /// The model family, when the window is one family's weekly window (SPEC 16).
        family: Option<ModelFamily>,
        /// Seconds until that account returns, rounded up, at least 1.
        retry_after_secs: u64,
        /// When the first account returns: the earliest window reset, UTC unix ms.
        returns_at: UnixMs,
    },

    /// A rating configuration value is out of range.
    #[error(
        "invalid rating configuration: {0}; weights must be finite and >= 0, the EWMA factor in (0, 1]"
    )]
    InvalidRatingConfig(&'static str),

    /// A hedge budget ratio is outside `0.0..=1.0`.
    #[error(
        "invalid hedge budget {0}: it is a fraction of the group's requests, between 0.0 and 1.0 (e.g. 0.1 for 10 %)"
    )]
    InvalidHedgeBudget(f64),
}
