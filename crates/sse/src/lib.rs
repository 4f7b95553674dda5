//! Incremental Server-Sent Events decoder and encoder over bytes, with no async runtime.
//!
//! This crate is a placeholder laid down by the workspace foundation; its issue fills it.
//! See `docs/ARCHITECTURE.md` for what it will own.
