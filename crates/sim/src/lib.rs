//! A simulated Anthropic upstream speaking the real wire format, shared by tests, benchmarks and the demo.
//!
//! This crate is a placeholder laid down by the workspace foundation; its issue fills it.
//! See `docs/ARCHITECTURE.md` for what it will own.
