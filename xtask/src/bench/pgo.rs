//! `cargo xtask pgo [--out PATH]`: keypool built with profile-guided optimisation
//! (PGO), the build the container image ships and `cargo xtask bench --pgo` measures.
//!
//! 1. `llvm-profdata` of the pinned toolchain's own LLVM is found first (`rustup
//!    component add llvm-tools` installs it; a profile written by another LLVM version
//!    cannot be read), so a missing tool fails before any build.
//! 2. keypool is built with `-Cprofile-generate` into `target/pgo/gen` (its own
//!    target directory: the flags differ, so it would otherwise evict the plain build).
//! 3. That binary serves [`WORKLOAD`] from a `keypool-sim` on loopback, twice: with
//!    the bench config and plain logs, then with every caller limit and `--log-format
//!    json` (the container image's format). Each instance is stopped with `SIGTERM`, so
//!    it drains and exits and the profile runtime writes its counts. The profiles the
//!    build scripts wrote while the build ran are removed before (they describe the
//!    build, not the server).
//! 4. `llvm-profdata merge` → `target/pgo/keypool-<hash>.profdata` (named by its
//!    content: cargo fingerprints `RUSTFLAGS`, not the file they name, so a new profile
//!    needs a new path to be built with); keypool is built again with `-Cprofile-use`
//!    into `target/pgo/use` and copied to `target/pgo/keypool` (and to `--out`).
//!
//! The training covers the request path every deployment runs (messages answered whole
//! and streamed, `count_tokens`, a failover on `429`, the rated strategy, a pool of
//! 1,000 accounts, caller limits, a refused key); code it does not reach is optimised
//! as in the plain build, only without the profile's layout. `RUSTFLAGS` of the caller
//! are kept and extended.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};

use super::driver::{self, Bounds, Endpoint};
use super::procs::{self, Proc};
use super::{Bins, body, common_headers, setup, start_sim, uri, wait_http};

/// Command-line options of `cargo xtask pgo`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PgoOptions {
    /// Where to copy the optimised binary too.
    pub out: Option<PathBuf>,
}

const USAGE: &str = "cargo xtask pgo [--out PATH]";

impl PgoOptions {
    /// Parses the arguments after `pgo`.
    pub fn parse(args: &[String]) -> anyhow::Result<Self> {
        let mut o = Self::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--out" => {
                    let path = it
                        .next()
                        .with_context(|| format!("--out needs a path ({USAGE})"))?;
                    o.out = Some(PathBuf::from(path));
                }
                other => bail!("unknown option {other:?} ({USAGE})"),
            }
        }
        Ok(o)
    }
}

/// Which key a training step sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The config's client key: every request must be answered `200`.
    Valid,
    /// A well-formed key the config does not hold: every request must be refused.
    Unknown,
}

/// One closed loop of the training workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The bench pool ([`setup::POOLS`]) the requests go to.
    pub pool: &'static str,
    /// The path after `/{org}/{pool}`.
    pub path: &'static str,
    /// A streamed request.
    pub stream: bool,
    /// Requests in flight.
    pub concurrency: usize,
    /// Requests in all.
    pub requests: u64,
    /// Pause after each request (the failover pool's cooldown is 1 ms).
    pub pause_ms: u64,
    /// The key sent.
    pub caller: Caller,
}

const MESSAGES: &str = "/v1/messages";
const COUNT_TOKENS: &str = "/v1/messages/count_tokens";

const fn step(pool: &'static str, path: &'static str, stream: bool, requests: u64) -> Step {
    Step {
        pool,
        path,
        stream,
        concurrency: 16,
        requests,
        pause_ms: 0,
        caller: Caller::Valid,
    }
}

/// The training workload: what each keypool instance serves, in this order. Sized so
/// that the steady state outweighs start-up (about 50,000 requests, a minute or less
/// on two cores under instrumentation).
pub const WORKLOAD: [Step; 9] = [
    step("rr8", MESSAGES, false, 20_000),
    Step {
        concurrency: 64,
        ..step("rr8", MESSAGES, false, 10_000)
    },
    step("rr8", MESSAGES, true, 4_000),
    step("rr1000", MESSAGES, false, 6_000),
    step("rated8", MESSAGES, false, 4_000),
    step("rated8", MESSAGES, true, 1_000),
    step("rr8", COUNT_TOKENS, false, 2_000),
    Step {
        concurrency: 4,
        pause_ms: 2,
        ..step("failover", MESSAGES, false, 1_000)
    },
    Step {
        caller: Caller::Unknown,
        ..step("rr8", MESSAGES, false, 1_000)
    },
];

/// A key of the right shape that no config holds.
const UNKNOWN_KEY: &str = "sk-lb-pgoTrainingKeyThatNoConfigHolds0000000000";

/// `RUSTFLAGS` for a build: the caller's, then `extra`.
pub fn rustflags(existing: Option<&str>, extra: &str) -> String {
    match existing.map(str::trim).filter(|s| !s.is_empty()) {
        Some(flags) => format!("{flags} {extra}"),
        None => extra.to_owned(),
    }
}

/// Where `rustup component add llvm-tools` puts `llvm-profdata` for the toolchain whose
/// `rustc --print sysroot` is `sysroot` and whose `rustc -vV` printed `version`.
pub fn profdata_path(sysroot: &str, version: &str) -> Option<PathBuf> {
    let host = version
        .lines()
        .find_map(|l| l.strip_prefix("host: "))?
        .trim();
    Some(
        Path::new(sysroot.trim())
            .join("lib/rustlib")
            .join(host)
            .join("bin/llvm-profdata"),
    )
}

/// The LLVM version `rustc -vV` printed (for the error that says which tools to get).
fn llvm_version(version: &str) -> &str {
    version
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .map_or("unknown", str::trim)
}

fn rustc_output(root: &Path, args: &[&str]) -> anyhow::Result<String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let out = Command::new(&rustc)
        .args(args)
        .current_dir(root)
        .output()
        .with_context(|| format!("cannot run {rustc}"))?;
    if !out.status.success() {
        bail!("`{rustc} {}` failed ({})", args.join(" "), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The toolchain's `llvm-profdata`, or an error that says how to install it.
fn llvm_profdata(root: &Path) -> anyhow::Result<PathBuf> {
    let version = rustc_output(root, &["-vV"])?;
    let sysroot = rustc_output(root, &["--print", "sysroot"])?;
    let path = profdata_path(&sysroot, &version)
        .context("`rustc -vV` printed no `host:` line: cannot tell where llvm-profdata is")?;
    if !path.is_file() {
        bail!(
            "PGO needs llvm-profdata of the toolchain's LLVM ({}), not found at {}: install it \
             with `rustup component add llvm-tools` and run `cargo xtask pgo` again",
            llvm_version(&version),
            path.display()
        );
    }
    Ok(path)
}

/// `cargo build --release -p keypool` into `target_dir` with `extra` added to the
/// `RUSTFLAGS`.
fn build_keypool(root: &Path, target_dir: &Path, extra: &str) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let flags = rustflags(std::env::var("RUSTFLAGS").ok().as_deref(), extra);
    eprintln!(
        "$ RUSTFLAGS={flags:?} cargo build --release -p keypool --target-dir {}",
        target_dir.display()
    );
    let status = Command::new(&cargo)
        .args(["build", "--release", "-p", "keypool", "--target-dir"])
        .arg(target_dir)
        .env("RUSTFLAGS", &flags)
        .current_dir(root)
        .status()
        .with_context(|| format!("could not start {cargo}"))?;
    if !status.success() {
        bail!("the PGO build of keypool failed ({status}); RUSTFLAGS were {flags:?}");
    }
    Ok(target_dir.join("release").join("keypool"))
}

/// The file name of a merged profile: its content's hash, so that each profile has
/// its own path (the build's `RUSTFLAGS` name it).
pub fn profile_name(bytes: &[u8]) -> String {
    // FNV-1a, 64 bits: a name, not a defence against anyone.
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("keypool-{hash:016x}.profdata")
}

/// An empty directory at `dir`.
fn fresh_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("cannot empty {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))
}

/// The `.profraw` files under `dir`.
fn raw_profiles(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "profraw") {
            found.push(path);
        }
    }
    Ok(found)
}

/// Entry point of `cargo xtask pgo`.
pub fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let options = PgoOptions::parse(args)?;
    let Some((target, bins)) = super::release_build(root, "pgo", args)? else {
        return Ok(());
    };
    let built = build(root, &target, &bins)?;
    if let Some(out) = &options.out {
        std::fs::copy(&built, out)
            .with_context(|| format!("cannot copy {} to {}", built.display(), out.display()))?;
        eprintln!("pgo: copied to {}", out.display());
    }
    println!("{}", built.display());
    Ok(())
}

/// The whole pipeline (module docs); `bins` are the plain release builds (the
/// simulator serves the training, the plain keypool makes its key). Returns the path
/// of the optimised binary.
pub fn build(root: &Path, target: &Path, bins: &Bins) -> anyhow::Result<PathBuf> {
    let profdata = llvm_profdata(root)?;
    let dir = target.join("pgo");
    let profiles = dir.join("profiles");
    let instrumented = build_keypool(
        root,
        &dir.join("gen"),
        &format!("-Cprofile-generate={}", profiles.display()),
    )?;
    // The build scripts ran instrumented and wrote profiles of their own.
    fresh_dir(&profiles)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let served = runtime.block_on(train(&instrumented, bins, &dir))?;
    let raws = raw_profiles(&profiles)?;
    if raws.is_empty() {
        bail!(
            "the instrumented keypool wrote no profile into {} (it must exit by itself to \
             write one): see the logs in {}",
            profiles.display(),
            dir.display()
        );
    }
    let merged = dir.join("merged.profdata");
    eprintln!(
        "pgo: {served} requests served; merging {} profiles",
        raws.len()
    );
    let status = Command::new(&profdata)
        .arg("merge")
        .arg("-o")
        .arg(&merged)
        .arg(&profiles)
        .status()
        .with_context(|| format!("cannot run {}", profdata.display()))?;
    if !status.success() {
        bail!("`llvm-profdata merge` failed ({status})");
    }
    // Cargo fingerprints the flags, not the file they name: a profile at a path of its
    // own content makes it rebuild what a new profile changes, and only then.
    let bytes =
        std::fs::read(&merged).with_context(|| format!("cannot read {}", merged.display()))?;
    let merged_named = dir.join(profile_name(&bytes));
    for entry in std::fs::read_dir(&dir)?.filter_map(Result::ok) {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("keypool-") && name.ends_with(".profdata") {
            std::fs::remove_file(entry.path())
                .with_context(|| format!("cannot remove {}", entry.path().display()))?;
        }
    }
    std::fs::rename(&merged, &merged_named)
        .with_context(|| format!("cannot rename {}", merged.display()))?;
    let merged = merged_named;
    let optimised = build_keypool(
        root,
        &dir.join("use"),
        &format!("-Cprofile-use={}", merged.display()),
    )?;
    let out = dir.join("keypool");
    std::fs::copy(&optimised, &out)
        .with_context(|| format!("cannot copy {} to {}", optimised.display(), out.display()))?;
    eprintln!("pgo: built {}", out.display());
    Ok(out)
}

/// Serves [`WORKLOAD`] with the instrumented `keypool`, twice (module docs); the
/// requests served.
async fn train(keypool: &Path, bins: &Bins, dir: &Path) -> anyhow::Result<u64> {
    let client = driver::client();
    let (mut sim, sim_addr) =
        start_sim(&client, &bins.sim, false, "simulator", &dir.join("sim.log")).await?;
    let base = format!("http://{sim_addr}");
    let key = setup::keygen(&bins.keypool)?;
    let mut served = 0;
    for (name, limits, log_format) in [("plain", false, None), ("json", true, Some("json"))] {
        let addr = procs::free_addr()?;
        let mut config = setup::keypool_config(addr, &base, &base, &key.sha256);
        if limits {
            config = setup::with_caller_limits(&config);
        }
        let path = dir.join(format!("train-{name}.toml"));
        std::fs::write(&path, config)
            .with_context(|| format!("cannot write {}", path.display()))?;
        let mut command = Command::new(keypool);
        if let Some(format) = log_format {
            command.args(["--log-format", format]);
        }
        command.arg("serve").arg("--config").arg(&path);
        let log = dir.join(format!("train-{name}.log"));
        let mut proc = Proc::spawn(&format!("instrumented keypool ({name})"), command, &log)?;
        wait_http(
            &client,
            &mut proc,
            &uri(addr, "/healthz")?,
            Duration::from_secs(30),
        )
        .await?;
        for step in &WORKLOAD {
            let credential = match step.caller {
                Caller::Valid => key.key.as_str(),
                Caller::Unknown => UNKNOWN_KEY,
            };
            let endpoint = Endpoint {
                uri: uri(addr, &format!("/{}/{}{}", setup::ORG, step.pool, step.path))?,
                headers: common_headers(("x-api-key", credential))?,
                body: body(super::MODEL, step.stream),
                stream: step.stream,
            };
            let bounds = Bounds {
                requests: Some(step.requests),
                duration: Duration::from_secs(120),
                pause: Duration::from_millis(step.pause_ms),
            };
            let out = driver::closed_loop(&client, &endpoint, step.concurrency, bounds).await;
            let expected = match step.caller {
                Caller::Valid => out.errors == 0 && out.ok == step.requests,
                Caller::Unknown => out.ok == 0 && out.errors == step.requests,
            };
            if !expected {
                bail!(
                    "training step {step:?} on the {name} instance: {} answered, {} failed \
                     (first: {})",
                    out.ok,
                    out.errors,
                    out.first_errors.join("; ")
                );
            }
            served += out.ok + out.errors;
        }
        let status = proc.terminate(Duration::from_secs(60))?;
        if !status.success() {
            bail!(
                "the instrumented keypool ({name}) exited with {status} after SIGTERM; see {}",
                log.display()
            );
        }
    }
    sim.check_alive()?;
    Ok(served)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> anyhow::Result<PgoOptions> {
        PgoOptions::parse(&a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn options_parse() {
        assert_eq!(args(&[]).unwrap(), PgoOptions::default());
        assert_eq!(
            args(&["--out", "/tmp/kp"]).unwrap().out.as_deref(),
            Some(Path::new("/tmp/kp"))
        );
        assert!(
            args(&["--out"])
                .unwrap_err()
                .to_string()
                .contains("needs a path")
        );
        assert!(
            args(&["--fast"])
                .unwrap_err()
                .to_string()
                .contains("unknown option")
        );
    }

    #[test]
    fn rustflags_keep_the_callers() {
        assert_eq!(rustflags(None, "-Cprofile-use=/p"), "-Cprofile-use=/p");
        assert_eq!(
            rustflags(Some("  "), "-Cprofile-use=/p"),
            "-Cprofile-use=/p"
        );
        assert_eq!(
            rustflags(Some("-Ctarget-cpu=native"), "-Cprofile-use=/p"),
            "-Ctarget-cpu=native -Cprofile-use=/p"
        );
    }

    #[test]
    fn profdata_is_under_the_sysroot_of_the_host() {
        let version = "rustc 1.95.0 (59807616e 2026-04-14)\nbinary: rustc\nhost: x86_64-unknown-linux-gnu\nLLVM version: 22.1.2\n";
        assert_eq!(
            profdata_path("/r/toolchains/1.95.0\n", version).unwrap(),
            Path::new(
                "/r/toolchains/1.95.0/lib/rustlib/x86_64-unknown-linux-gnu/bin/llvm-profdata"
            )
        );
        assert_eq!(profdata_path("/r", "rustc 1.95.0\n"), None);
        assert_eq!(llvm_version(version), "22.1.2");
        assert_eq!(llvm_version("rustc 1.95.0\n"), "unknown");
    }

    #[test]
    fn the_workload_covers_the_request_path() {
        let pools: Vec<&str> = setup::POOLS.iter().map(|p| p.name).collect();
        for s in &WORKLOAD {
            assert!(pools.contains(&s.pool), "{s:?} names no bench pool");
            assert!(s.requests > 0 && s.concurrency > 0, "{s:?}");
        }
        let has = |f: &dyn Fn(&Step) -> bool| WORKLOAD.iter().any(f);
        assert!(has(&|s| s.stream), "a stream");
        assert!(has(&|s| s.path == COUNT_TOKENS), "count_tokens");
        assert!(
            has(&|s| s.pool == "failover" && s.pause_ms > 0),
            "a failover"
        );
        assert!(has(&|s| s.pool == "rr1000"), "1,000 accounts");
        assert!(has(&|s| s.caller == Caller::Unknown), "a refused key");
        // Mostly the common case: answered whole by a healthy pool.
        let total: u64 = WORKLOAD.iter().map(|s| s.requests).sum();
        let whole: u64 = WORKLOAD
            .iter()
            .filter(|s| !s.stream && s.path == MESSAGES && s.caller == Caller::Valid)
            .map(|s| s.requests)
            .sum();
        assert!(whole * 4 >= total * 3, "{whole} of {total}");
    }

    #[test]
    fn a_profile_is_named_by_its_content() {
        assert_eq!(profile_name(b""), "keypool-cbf29ce484222325.profdata");
        assert_eq!(profile_name(b"a"), "keypool-af63dc4c8601ec8c.profdata");
        assert_ne!(profile_name(b"ab"), profile_name(b"ba"));
    }

    #[test]
    fn raw_profiles_are_the_profraw_files() {
        let dir = std::env::temp_dir().join(format!("xtask-pgo-{}", std::process::id()));
        fresh_dir(&dir).unwrap();
        std::fs::write(dir.join("default_1_0.profraw"), b"x").unwrap();
        std::fs::write(dir.join("notes.txt"), b"x").unwrap();
        assert_eq!(
            raw_profiles(&dir).unwrap(),
            vec![dir.join("default_1_0.profraw")]
        );
        fresh_dir(&dir).unwrap();
        assert!(raw_profiles(&dir).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
