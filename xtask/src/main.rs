//! `cargo xtask`: project automation that would otherwise live in shell scripts.
//!
//! - `cargo xtask ci`: formatting check, clippy with warnings denied, the whole test
//!   suite. This is the README's test command and what `.ci/run` calls. Before the
//!   tests it creates the Anthropic SDK venv (`target/py-sdk`) the SDK suites use,
//!   installs the Debian packages the tests need when missing (`chromium`,
//!   `chromium-driver`, `curl`, `prometheus` for `promtool`, `redis-server`,
//!   `redis-tools`) and runs `promtool check rules` on `deploy/prometheus/*-rules.yaml`.
//! - `cargo xtask bench [--quick] [--peers] [--floor] [--pgo] [--baseline-binary PATH]`:
//!   keypool's overhead and throughput against the bare upstream simulator and, with
//!   `--peers`, LiteLLM, Portkey, nginx and HAProxy; `--floor` runs only the comparison
//!   with nginx and HAProxy (`bench`), `--pgo` measures the PGO build.
//! - `cargo xtask ab REV [--rounds N] [--seconds S] [--pool NAME]`: this tree's keypool
//!   against commit `REV`'s, measured alternately: req/s and CPU per request
//!   (`bench::ab`); `--limits` measures one binary without and with caller limits,
//!   `--pool-against NAME` one binary on `--pool` and on pool `NAME`.
//! - `cargo xtask instructions [--requests N] [--warm N] [--baseline-binary PATH]`:
//!   instructions per request of keypool (8 accounts at info and warn, 1,000 accounts;
//!   and another build's at 8 and 1,000) and nginx under valgrind's callgrind, and
//!   where keypool's go by crate and source file (`bench::instructions`).
//! - `cargo xtask pgo [--out PATH]`: keypool built with profile-guided optimisation,
//!   trained on loopback against the simulator (`bench::pgo`): `target/pgo/keypool`,
//!   the build the container image ships. `cargo xtask bench --pgo` measures it, with
//!   the plain release build beside it in the floor comparison.
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
    check_built_from(&root, std::env::var_os(EXPECTED_ROOT).map(PathBuf::from))?;
    match args.first().map(String::as_str) {
        Some("ci") => ci(&root),
        Some("bench") => bench::run(&root, &args[1..]),
        Some("ab") => bench::ab::run(&root, &args[1..]),
        Some("instructions") => bench::instructions::run(&root, &args[1..]),
        Some("pgo") => bench::pgo::run(&root, &args[1..]),
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
         ci     cargo fmt --check, cargo clippy -D warnings, promtool check rules, and the whole test suite\n  \
         bench  [--quick] [--peers] [--floor] [--pgo] [--baseline-binary PATH] overhead and throughput on loopback (--floor: only beside nginx and HAProxy), target/bench/report.json\n  \
         ab     (REV | --limits | --pool-against NAME) [--rounds N] [--seconds S] [--pool NAME] [--concurrency C] this tree against commit REV (or one binary without and with limits, or on two pools), interleaved\n  \
         instructions  [--requests N] [--warm N] [--baseline-binary PATH] [--cache-sim] instructions per request of keypool and nginx (callgrind), and where keypool's go\n  \
         pgo    [--out PATH] keypool built with profile-guided optimisation (needs `rustup component add llvm-tools`), target/pgo/keypool\n  \
         endurance  [--quick] keypool's memory idle, over 10,000 streams and 1,000 at once"
    );
}

/// Set by the debug xtask on the release xtask it runs (`bench::release_build`): the
/// tree that asked.
pub(crate) const EXPECTED_ROOT: &str = "KEYPOOL_XTASK_ROOT";

/// Refuses to run when this xtask was built from another tree than the one that ran it.
/// A git worktree built into this tree's `target/` leaves its own `xtask` and
/// `keypool` in `target/release/`, and cargo does not copy this tree's (fresh) ones
/// back: the bench would build and measure the other tree.
fn check_built_from(root: &Path, expected: Option<PathBuf>) -> anyhow::Result<()> {
    match expected {
        Some(expected) if expected != root => bail!(
            "target/release/xtask was built from {} and {} ran it: another tree built into \
             this target directory. In {}, run `touch xtask/src/main.rs bins/keypool/src/main.rs \
             crates/sim/src/bin/keypool-sim.rs` so that its binaries are built again, then the \
             command again",
            root.display(),
            expected.display(),
            expected.display()
        ),
        _ => Ok(()),
    }
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

/// The Debian packages the tests and checks need, as `(program, package, who needs
/// it)`: installed when the program is missing (CI runs as root with apt reachable). A
/// failure is reported here, and the test that needs the program then fails with the
/// reason under `CI=true`.
const DEBIAN_TOOLS: [(&str, &str, &str); 6] = [
    (
        "chromium",
        "chromium",
        "the status-page test (tests/tests/admin_ui.rs)",
    ),
    (
        "chromedriver",
        "chromium-driver",
        "the status-page click-through test (tests/tests/admin_ui_actions.rs)",
    ),
    ("curl", "curl", "the HTTP/2 test (tests/tests/listeners.rs)"),
    (
        "promtool",
        "prometheus",
        "promtool check rules of deploy/prometheus",
    ),
    (
        "redis-server",
        "redis-server",
        "the Redis suites (crates/store/tests, tests/)",
    ),
    (
        "redis-cli",
        "redis-tools",
        "the Redis Cluster test (redis-cli --cluster create)",
    ),
];

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

/// Installs the package of each missing program of [`DEBIAN_TOOLS`] (one `apt-get
/// install`, then `apt-get update` and once more if that failed).
fn ensure_debian_tools() {
    let missing: Vec<(&str, &str, &str)> = DEBIAN_TOOLS
        .into_iter()
        .filter(|(program, _, _)| !on_path(program))
        .collect();
    if missing.is_empty() {
        return;
    }
    let packages: Vec<&str> = missing.iter().map(|(_, package, _)| *package).collect();
    eprintln!(
        "$ apt-get install -y --no-install-recommends {}",
        packages.join(" ")
    );
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        let _ = Command::new("apt-get").arg("update").status();
        if !install() {
            for (program, package, needed_by) in missing {
                eprintln!(
                    "xtask ci: could not install {package} ({program}); {needed_by} will fail"
                );
            }
        }
    }
}

/// `promtool check rules` of every rules file under `deploy/prometheus/`.
fn check_prometheus_rules(root: &Path) -> anyhow::Result<()> {
    let dir = root.join("deploy/prometheus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with("-rules.yaml"))
        })
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no *-rules.yaml in {}", dir.display());
    }
    eprintln!(
        "$ promtool check rules {}",
        files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let status = Command::new("promtool")
        .arg("check")
        .arg("rules")
        .args(&files)
        .status()
        .context("could not start promtool (Debian package prometheus)")?;
    if !status.success() {
        bail!("promtool check rules failed ({status})");
    }
    Ok(())
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
    ensure_debian_tools();
    check_prometheus_rules(root)?;
    cargo(root, &["test", "--workspace", "--no-fail-fast"])?;
    eprintln!("xtask ci: all checks passed");
    Ok(())
}

#[cfg(test)]
mod built_from_tests {
    use super::*;

    #[test]
    fn an_xtask_of_another_tree_refuses_and_says_what_to_touch() {
        let root = Path::new("/work/main");
        assert!(check_built_from(root, None).is_ok(), "run directly");
        assert!(check_built_from(root, Some(PathBuf::from("/work/main"))).is_ok());
        let error = check_built_from(root, Some(PathBuf::from("/work/other")))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("built from /work/main and /work/other ran it")
                && error.contains("In /work/other, run `touch xtask/src/main.rs"),
            "{error}"
        );
    }
}
