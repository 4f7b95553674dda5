//! Shared support for keypool's end-to-end suites (in `tests/tests/`).
//!
//! The suites start keypool and `keypool-sim` on `127.0.0.1:0` and talk real HTTP to
//! them. Helpers that more than one suite needs live here so no suite writes a second
//! copy. Every [`Harness`] asserts, when it finishes, that the simulated upstream never
//! received any `sk-lb-` value (SPEC 3.4).
//!
//! ```no_run
//! use keypool_sim::Script;
//! use keypool_tests::Harness;
//! # async fn example() {
//! let h = Harness::with_accounts([("a", Script::ok())]).await;
//! let reply = h.send_message().await;
//! assert_eq!(reply.status, 200);
//! h.finish().await;
//! # }
//! ```
//!
//! # Layout
//! - [`harness`]: [`Harness`] (simulator + configuration + proxy), [`AccountSpec`],
//!   [`HarnessBuilder`].
//! - [`fake_upstream`]: [`fake_upstream::FakeUpstream`], an upstream that writes exactly
//!   the bytes a test scripts (careless and hostile upstreams).
//! - [`browser`]: headless Chromium and [`browser::WebDriver`] (real clicks and typing
//!   into the status page through `chromedriver`).
//! - [`client`]: the HTTP client of the suites, [`Reply`] and SSE frames.
//! - [`logs`]: [`LogLines`], log lines captured in memory.
//! - [`property`]: [`check_property`], a proptest property against one harness.
//! - [`process`]: [`process::KeypoolProcess`], the real binary as a child process.
//! - [`raw`]: raw HTTP/1.1 over TCP for hostile-input tests.
//! - [`prometheus`]: a scrape's families, the Prometheus naming rules, the metric
//!   names a PromQL expression uses.
//! - [`tls`]: test certificates (a CA and a `localhost` leaf) made at run time, and a
//!   TLS client that trusts them.
//! - [`egress_proxy`]: an HTTP `CONNECT` / SOCKS5 proxy on loopback that records its
//!   tunnels (the outbound proxy tests).
//! - [`venv`]: the Python venv with the Anthropic SDK (shared with `xtask`), and
//!   [`sdk_python`], the policy when it cannot be created.

pub mod browser;
pub mod client;
pub mod egress_proxy;
pub mod fake_upstream;
pub mod harness;
pub mod logs;
pub mod process;
pub mod prometheus;
pub mod property;
pub mod raw;
pub mod tls;
pub mod venv;
pub mod webhook;

use std::path::{Path, PathBuf};

pub use client::{Client, Reply, SseFrame, StreamingReply, admin_account, message_body};
pub use harness::{AccountSpec, Harness, HarnessBuilder, KEY, MODEL, ORG, URL, secret_of};
pub use logs::LogLines;
pub use property::check_property;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

/// The SDK venv's Python, created if missing. `None` only when it cannot be created
/// and `KEYPOOL_SKIP_SDK=1` is set outside CI (the skip is said on stderr).
///
/// # Panics
/// When the venv cannot be created under `CI=true`, or without `KEYPOOL_SKIP_SDK=1`:
/// the SDK test never skips silently.
pub fn sdk_python(test: &str) -> Option<PathBuf> {
    let error = match venv::ensure_venv(&workspace_root()) {
        Ok(python) => return Some(python),
        Err(e) => e,
    };
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: cannot create the Anthropic SDK venv under CI=true: {error}");
    }
    if std::env::var("KEYPOOL_SKIP_SDK").is_ok_and(|v| v == "1") {
        eprintln!("{test}: SKIPPED (KEYPOOL_SKIP_SDK=1): cannot create the SDK venv: {error}");
        return None;
    }
    panic!(
        "{test}: cannot create the Anthropic SDK venv: {error}\n\
         (set KEYPOOL_SKIP_SDK=1 to skip this test on a machine without Python/PyPI)"
    );
}
