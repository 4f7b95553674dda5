//! `cargo xtask`: project automation that would otherwise live in shell scripts.
//!
//! - `cargo xtask ci`: formatting check, clippy with warnings denied, the whole test
//!   suite. This is the README's test command and what `.ci/run` calls. Before the
//!   tests it creates the Anthropic SDK venv (`target/py-sdk`) the SDK suite uses and
//!   installs Debian's `chromium` when missing (the status-page browser test).
//! - `cargo xtask bench [--quick] [--peers]`: keypool's overhead and throughput against
//!   the bare upstream simulator and, with `--peers`, LiteLLM and Portkey (`bench`).
//! - `cargo xtask ab REV [--rounds N] [--seconds S] [--pool NAME]`: this tree's keypool
//!   against commit `REV`'s, measured alternately: req/s and CPU per request
//!   (`bench::ab`).
//! - `tidy` (tests only, run by `cargo test --workspace` and so by `cargo xtask ci`):
//!   the dependency and clock rules of `docs/ARCHITECTURE.md`.
//! - `cargo xtask endurance [--quick]`: keypool's resident memory idle, over 10,000
//!   streamed requests and with 1,000 streams at once; fails on growth after warm-up
//!   (`endurance`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

mod bench;
mod endurance;
#[cfg(test)]
mod tidy;

/// The SDK venv, shared with the end-to-end suites (`keypool-tests`), so both create it
/// the same way under the same lock.
#[path = "../../tests/src/venv.rs"]
mod venv;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = project_root();
    match args.first().map(String::as_str) {
        Some("ci") => ci(&root),
        Some("bench") => bench::run(&root, &args[1..]),
        Some("ab") => bench::ab::run(&root, &args[1..]),
        Some("endurance") => endurance::run(&root, &args[1..]),
        Some("help") | Some("--help") | Some("-h") | None => {
            print_help();
            Ok(())
        }
        Some(other) => {
            print_help();
            bail!("unknown xtask command {other:?}")
        }
    }
}

fn print_help() {
    eprintln!(
        "cargo xtask <command>\n\n\
         commands:\n  \
         ci     cargo fmt --check, cargo clippy -D warnings, and the whole test suite\n  \
         bench  [--quick] [--peers] overhead and throughput on loopback, target/bench/report.json\n  \
         ab     REV [--rounds N] [--seconds S] [--pool NAME] [--concurrency C] this tree against commit REV, interleaved\n  \
         endurance  [--quick] keypool's memory idle, over 10,000 streams and 1,000 at once"
    );
}

fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Runs `cargo` with `args` in the project root and fails if it fails.
fn cargo(root: &Path, args: &[&str]) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    eprintln!("$ cargo {}", args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(root)
        .status()
        .with_context(|| format!("could not start {cargo}"))?;
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// The status-page test (`tests/tests/admin_ui.rs`) drives Debian's headless `chromium`:
/// install it when missing (CI runs as root). A failure is reported here, and the test
/// then fails with the reason under `CI=true`.
fn ensure_chromium() {
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
    };
    if on_path("chromium") {
        return;
    }
    eprintln!("$ apt-get install -y --no-install-recommends chromium");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", "chromium"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        let _ = Command::new("apt-get").arg("update").status();
        if !install() {
            eprintln!("xtask ci: could not install chromium; the status-page test will fail");
        }
    }
}

fn ci(root: &Path) -> anyhow::Result<()> {
    cargo(root, &["fmt", "--all", "--", "--check"])?;
    cargo(
        root,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    // The SDK suite creates the venv itself when missing; creating it here first keeps
    // pip's output out of the test run. A failure is reported, and the SDK test then
    // fails with the reason (it never skips under CI=true).
    match venv::ensure_venv(root) {
        Ok(python) => eprintln!("xtask ci: Anthropic SDK venv ready ({})", python.display()),
        Err(e) => eprintln!("xtask ci: could not prepare the Anthropic SDK venv: {e}"),
    }
    ensure_chromium();
    cargo(root, &["test", "--workspace", "--no-fail-fast"])?;
    eprintln!("xtask ci: all checks passed");
    Ok(())
}
