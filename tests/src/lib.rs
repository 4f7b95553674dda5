//! Shared support for keypool's end-to-end suites (in `tests/tests/`).
//!
//! The suites start keypool and `keypool-sim` on `127.0.0.1:0` and talk real HTTP to
//! them. Helpers that more than one suite needs live here so no suite writes a second
//! copy.
