//! The crate's one error type.

/// What can be wrong with ledger input (prices, dates).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LedgerError {
    /// A model glob that can match no model id.
    #[error(
        "model pattern {0:?} is empty or has spaces or control characters: write a model id, `*` for any characters, `?` for one"
    )]
    InvalidGlob(String),
    /// A price that is not a number of USD per million tokens.
    #[error("price {0} is not a number of USD per million tokens between 0 and 1,000,000")]
    InvalidPrice(f64),
    /// A date that is not `YYYY-MM-DD` (or `YYYY-MM` for a month).
    #[error(
        "{0:?} is not a date: write YYYY-MM-DD for a day or YYYY-MM for a month (UTC, 1970 on)"
    )]
    InvalidDate(String),
}
