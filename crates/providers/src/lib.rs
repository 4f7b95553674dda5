//! Provider adapters: upstream request heads, model override, response metadata, stream validity and sanitised error bodies. Pure functions over http types.
//!
//! This crate is a placeholder laid down by the workspace foundation; its issue fills it.
//! See `docs/ARCHITECTURE.md` for what it will own.
