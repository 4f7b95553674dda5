//! The keypool hyper service: composes selection, cooldown, streaming and providers into the request path.
//!
//! This crate is a placeholder laid down by the workspace foundation; its issue fills it.
//! See `docs/ARCHITECTURE.md` for what it will own.
