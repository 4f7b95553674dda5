//! Failure classes, cooldown and backoff, disabling, usage windows and the circuit
//! breaker for upstream accounts (SPEC 5 and 6).
//!
//! Pure policy: no I/O, no runtime, no clock reads. Time (`now`, unix ms) is an
//! argument everywhere.
//!
//! # Layout
//! - [`headers`]: parsers for `retry-after`, `retry-after-ms` and the Anthropic
//!   rate-limit headers, gathered into [`headers::RateLimitInfo`].

pub mod headers;
