//! The Python virtualenv with the official Anthropic and OpenAI SDKs, under
//! `target/py-sdk`.
//!
//! Only `std`: `xtask` includes this same file (`#[path]`) to create the venv before the
//! test step of `cargo xtask ci`, and the SDK suite calls it from a plain `cargo test`.
//! Concurrent callers (several test binaries, xtask) are serialised by an exclusive lock
//! on `target/py-sdk.lock`; a venv counts as ready only once both SDKs import, marked by
//! a `.keypool-ready` file holding the requirements it was made with, so an interrupted
//! creation is redone from scratch and a venv made with other requirements (an older
//! list without `openai`) is made again.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What `pip install` is given: the Anthropic SDK (the Messages API suites) and the
/// OpenAI SDK (the Chat Completions suites, issue 23).
const SDK_REQUIREMENTS: [&str; 2] = ["anthropic>=0.50", "openai>=1.50"];
/// The modules that must import for the venv to count as ready.
const SDK_MODULES: &str = "import anthropic, openai";
/// The marker written once the SDKs import; it holds the requirements, one per line.
const READY_MARKER: &str = ".keypool-ready";

/// The ready marker's content for [`SDK_REQUIREMENTS`].
fn marker_text() -> String {
    SDK_REQUIREMENTS.join("\n")
}

/// Returns the venv's Python interpreter, creating the venv (`python3 -m venv`, then
/// `pip install anthropic openai`) when it is missing or incomplete. `root` is the workspace
/// root; the venv lives in `$CARGO_TARGET_DIR` (default `<root>/target`) as `py-sdk`.
/// The interpreter that creates it is `$KEYPOOL_PYTHON`, default `python3`.
///
/// # Errors
/// A message saying which step failed and its output (no Python, no `venv` module, pip
/// cannot reach the package index, …).
pub fn ensure_venv(root: &Path) -> Result<PathBuf, String> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { root.join(p) })
        .unwrap_or_else(|| root.join("target"));
    let dir = target.join("py-sdk");
    let python = venv_python(&dir);
    let ready = |dir: &Path| {
        std::fs::read_to_string(dir.join(READY_MARKER)).is_ok_and(|m| m.trim() == marker_text())
    };
    if ready(&dir) && python.exists() {
        return Ok(python);
    }
    std::fs::create_dir_all(&target)
        .map_err(|e| format!("cannot create {}: {e}", target.display()))?;
    let lock_path = target.join("py-sdk.lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("cannot open {}: {e}", lock_path.display()))?;
    lock_file(&lock, &lock_path)?;
    // Someone else may have finished while we waited for the lock.
    if ready(&dir) && python.exists() {
        return Ok(python);
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .map_err(|e| format!("cannot remove the incomplete {}: {e}", dir.display()))?;
    }
    let creator = std::env::var("KEYPOOL_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    eprintln!(
        "creating the Python SDK venv in {} ({creator} -m venv; pip install {})",
        dir.display(),
        SDK_REQUIREMENTS.join(" ")
    );
    run(Command::new(&creator).arg("-m").arg("venv").arg(&dir))?;
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--quiet",
        ])
        .args(SDK_REQUIREMENTS))?;
    run(Command::new(&python).args(["-c", SDK_MODULES]))?;
    std::fs::write(dir.join(READY_MARKER), marker_text())
        .map_err(|e| format!("cannot write the venv's ready marker: {e}"))?;
    Ok(python)
}

fn venv_python(dir: &Path) -> PathBuf {
    if cfg!(windows) {
        dir.join("Scripts").join("python.exe")
    } else {
        dir.join("bin").join("python")
    }
}

fn lock_file(lock: &File, path: &Path) -> Result<(), String> {
    // Released when `lock` is closed (at the end of `ensure_venv`, or if we crash).
    lock.lock()
        .map_err(|e| format!("cannot lock {}: {e}", path.display()))
}

fn run(command: &mut Command) -> Result<(), String> {
    let shown = format!("{command:?}");
    let output = command
        .output()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{shown} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}
