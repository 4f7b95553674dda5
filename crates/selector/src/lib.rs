//! Turns a pool of upstream accounts into an ordered plan of attempts: filters, strategies and the key-rating engine. Pure: no I/O, no clock reads.
//!
//! This crate is a placeholder laid down by the workspace foundation; its issue fills it.
//! See `docs/ARCHITECTURE.md` for what it will own.
