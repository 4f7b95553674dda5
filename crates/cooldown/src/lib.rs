//! Failure classes, cooldown and backoff, disabling, usage windows and the circuit breaker for upstream accounts. Pure policy: no I/O, no clock reads.
//!
//! This crate is a placeholder laid down by the workspace foundation; its issue fills it.
//! See `docs/ARCHITECTURE.md` for what it will own.
