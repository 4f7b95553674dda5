//! Shared test data.
pub mod anthropic_stream;
