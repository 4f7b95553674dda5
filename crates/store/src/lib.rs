//! Configuration, org/URL/LB-key resolution and shared runtime state (memory, state file, Redis).
//!
//! This crate is a placeholder laid down by the workspace foundation; its issue fills it.
//! See `docs/ARCHITECTURE.md` for what it will own.
