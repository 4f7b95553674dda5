//! `cargo xtask bench [--quick] [--peers] [--floor] [--pgo] [--baseline-binary PATH]`:
//! keypool's overhead and throughput measured side by side with the bare upstream and,
//! with `--peers`, LiteLLM, the Portkey gateway, nginx and HAProxy, in one run on
//! loopback. `--floor` runs only the comparison with nginx and HAProxy ([`floor`]);
//! `--pgo` measures the PGO build ([`pgo`]) with the plain build as the floor's baseline.
//!
//! 1. `cargo build --release -p keypool -p keypool-sim`.
//! 2. Two standalone `keypool-sim`s on 127.0.0.1: *fast* (no delay: the overhead runs)
//!    and *slow* (20 ms to the first byte, 64 deltas paced at 20 ms: the sustained and
//!    streaming runs). The fast one answers the credential
//!    [`setup::RATE_LIMITED_SECRET`] with `429` + `retry-after-ms: 1`.
//! 3. keypool with a generated config in `target/bench/keypool.toml` (the pools of
//!    [`setup::POOLS`]); with `--peers`, LiteLLM (virtualenv cached in
//!    `target/bench/litellm-venv`) and Portkey (`target/bench/portkey`). A peer that
//!    cannot be installed, started or answer is reported as skipped with the reason.
//! 4. Per target: concurrency 1 (latency), concurrency 16 (most req/s), a constant rate
//!    against the slow upstream (latency without coordinated omission), 64-chunk
//!    streams at concurrency 16 (TTFT, inter-chunk gaps). CPU and peak RSS come from
//!    `/proc` for the target's process group.
//! 5. With `--peers` or `--floor`: the floor comparison ([`floor`]), interleaved rounds
//!    of nginx, HAProxy and keypool (also at log level `warn` and with 1,000 accounts).
//! 6. The table on stdout and `target/bench/report.json`.
//!
//! Every child is killed when the run ends, also on error ([`procs::Proc`]'s drop).
//!
//! # Layout
//! - `stats`: histograms, percentiles, added latency, rates, CPU per 1,000 requests.
//! - `report`: the report, the targets checked, the table and JSON.
//! - `driver`: the hyper load driver.
//! - `procs`: child processes and `/proc`.
//! - `setup`: generated configs, keygen, the peers' cached installs.
//! - `ab`: `cargo xtask ab REV`, this tree against an older commit, interleaved.
//! - `floor`: nginx and HAProxy beside keypool, interleaved rounds, issue 22's targets.
//! - `pgo`: `cargo xtask pgo`, keypool built with profile-guided optimisation (and
//!   `bench --pgo`'s keypool).
//! - `instructions`: `cargo xtask instructions`, instructions per request of keypool and
//!   nginx under callgrind, and where keypool's go.

pub mod ab;
pub mod driver;
pub mod floor;
pub mod instructions;
pub mod pgo;
pub mod procs;
pub mod report;
pub mod setup;
pub mod stats;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Uri};

use driver::{Bounds, Endpoint, HttpClient};
use procs::Proc;
use report::{Machine, Report, RunResult, Scenario, TargetInfo};

/// Command-line options of `cargo xtask bench`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Options {
    /// Short runs, for checking (under two minutes).
    pub quick: bool,
    /// Also measure LiteLLM, the Portkey gateway, nginx and HAProxy.
    pub peers: bool,
    /// Only the floor comparison (nginx, HAProxy, keypool), none of the other phases.
    pub floor: bool,
    /// Another keypool binary measured in the floor comparison beside this tree's
    /// (`--baseline-binary PATH`: a change's before and after in the same rounds).
    pub baseline: Option<PathBuf>,
    /// Measure keypool built with profile-guided optimisation (`cargo xtask pgo`), the
    /// build the container image ships; the floor comparison then measures the plain
    /// release build as its baseline unless `--baseline-binary` names another.
    pub pgo: bool,
    /// Set by `--pgo` when it made the plain build the baseline (not part of the
    /// command as typed).
    pub plain_baseline: bool,
}

impl Options {
    /// Parses the arguments after `bench`.
    pub fn parse(args: &[String]) -> anyhow::Result<Self> {
        const USAGE: &str =
            "cargo xtask bench [--quick] [--peers] [--floor] [--pgo] [--baseline-binary PATH]";
        let mut o = Self::default();
        let mut args = args.iter();
        while let Some(a) = args.next() {
            match a.as_str() {
                "--quick" => o.quick = true,
                "--peers" => o.peers = true,
                "--floor" => o.floor = true,
                "--pgo" => o.pgo = true,
                "--baseline-binary" => {
                    let path = args
                        .next()
                        .with_context(|| format!("--baseline-binary needs a path ({USAGE})"))?;
                    o.baseline = Some(PathBuf::from(path));
                }
                other => bail!("unknown option {other:?} ({USAGE})"),
            }
        }
        if o.baseline.is_some() && !o.runs_floor() {
            bail!("--baseline-binary is measured in the floor comparison: add --floor or --peers");
        }
        Ok(o)
    }

    fn command(&self) -> String {
        let mut c = String::from("cargo xtask bench");
        if self.quick {
            c.push_str(" --quick");
        }
        if self.peers {
            c.push_str(" --peers");
        }
        if self.floor {
            c.push_str(" --floor");
        }
        if self.pgo {
            c.push_str(" --pgo");
        }
        if let Some(b) = self.baseline.as_ref().filter(|_| !self.plain_baseline) {
            let _ = write!(c, " --baseline-binary {}", b.display());
        }
        c
    }

    /// Whether the floor comparison runs.
    pub fn runs_floor(&self) -> bool {
        self.peers || self.floor
    }

    /// Whether the phases of issue 7 (and LiteLLM, Portkey) run.
    pub fn runs_phases(&self) -> bool {
        !self.floor
    }
}

/// How much each phase measures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// Requests at concurrency 1…
    pub c1_requests: u64,
    /// …or at most this long.
    pub c1_max: Duration,
    /// The concurrency-16 closed loop.
    pub c16: Duration,
    /// The constant-rate run.
    pub sustained: Duration,
    /// Its rate (lowered to 70 % of a target's concurrency-16 req/s when that is less).
    pub sustained_rate: f64,
    /// Workers of the constant-rate run (the most requests in flight).
    pub sustained_workers: usize,
    /// The streaming run.
    pub stream: Duration,
    /// Warm-up requests per target before measuring.
    pub warmup: u64,
}

impl Plan {
    /// The plan for `--quick` or a full run.
    pub fn new(quick: bool) -> Self {
        if quick {
            Self {
                c1_requests: 1_000,
                c1_max: Duration::from_secs(5),
                c16: Duration::from_secs(2),
                sustained: Duration::from_secs(2),
                sustained_rate: 500.0,
                sustained_workers: 64,
                stream: Duration::from_secs(3),
                warmup: 200,
            }
        } else {
            Self {
                c1_requests: 20_000,
                c1_max: Duration::from_secs(20),
                c16: Duration::from_secs(10),
                sustained: Duration::from_secs(10),
                sustained_rate: 500.0,
                sustained_workers: 64,
                stream: Duration::from_secs(20),
                warmup: 500,
            }
        }
    }
}

/// Pause between the failover run's requests: longer than the 1 ms cooldown the
/// rate-limited account gets, so every request meets it again.
const FAILOVER_PAUSE: Duration = Duration::from_millis(2);

/// Builds keypool and keypool-sim in release mode and says where they are, with the
/// target directory. `cargo xtask` is a debug build, and a load driver at opt-level 0
/// would be slower than the gateways it measures: from a debug build this also builds
/// the release xtask, runs `xtask <command> <args>` there and returns `None` (the work
/// is done).
pub(crate) fn release_build(
    root: &Path,
    command: &str,
    args: &[String],
) -> anyhow::Result<Option<(PathBuf, Bins)>> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let build = ["build", "--release", "-p", "keypool", "-p", "keypool-sim"];
    if cfg!(debug_assertions) {
        // Only the release xtask here: it builds the binaries itself. Built in one
        // command with xtask, they would get xtask's dependency features, then be
        // built again without them (and the measured binary is the one a user builds).
        crate::cargo(root, &["build", "--release", "-p", "xtask"])?;
        let xtask = target.join("release").join("xtask");
        let status = Command::new(&xtask)
            .arg(command)
            .args(args)
            .env(crate::EXPECTED_ROOT, root)
            .status()
            .with_context(|| format!("cannot run {}", xtask.display()))?;
        if !status.success() {
            bail!("the release xtask failed ({status})");
        }
        return Ok(None);
    }
    crate::cargo(root, &build)?;
    let bins = Bins {
        keypool: target.join("release").join("keypool"),
        sim: target.join("release").join("keypool-sim"),
    };
    Ok(Some((target, bins)))
}

/// Entry point of `cargo xtask bench`.
pub fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let mut options = Options::parse(args)?;
    let Some((target, mut bins)) = release_build(root, "bench", args)? else {
        return Ok(());
    };
    if options.pgo {
        let optimised = pgo::build(root, &target, &bins)?;
        if options.baseline.is_none() && options.runs_floor() {
            options.baseline = Some(bins.keypool.clone());
            options.plain_baseline = true;
        }
        bins.keypool = optimised;
    }
    let dir = target.join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // The driver runs on one thread: the gateway and the upstream get the other core's
    // worth of time between them, as the 2-core setup says.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let report = runtime.block_on(bench(&options, &bins, &dir))?;
    println!("{}", report.table());
    let json = dir.join("report.json");
    std::fs::write(&json, report.to_json())
        .with_context(|| format!("cannot write {}", json.display()))?;
    eprintln!("bench: wrote {}", json.display());
    Ok(())
}

pub(crate) struct Bins {
    pub(crate) keypool: PathBuf,
    pub(crate) sim: PathBuf,
}

/// A target and how to measure it.
struct Target {
    name: &'static str,
    /// Process group whose CPU counts during fast-upstream runs…
    pgid_fast: u32,
    /// …and during slow-upstream runs.
    pgid_slow: u32,
    small: Endpoint,
    c16: bool,
    pause: Duration,
    sustained: Option<Endpoint>,
    stream: Option<Endpoint>,
    /// keypool's `/metrics`, to count failovers.
    metrics: Option<Uri>,
}

fn uri(addr: SocketAddr, path: &str) -> anyhow::Result<Uri> {
    format!("http://{addr}{path}")
        .parse()
        .with_context(|| format!("bad URI for {addr}{path}"))
}

fn header(name: &'static str, value: &str) -> anyhow::Result<(HeaderName, HeaderValue)> {
    Ok((
        HeaderName::from_static(name),
        HeaderValue::from_str(value).with_context(|| format!("bad value for {name}"))?,
    ))
}

fn body(model: &str, stream: bool) -> Bytes {
    let stream = if stream { ",\"stream\":true" } else { "" };
    Bytes::from(format!(
        "{{\"model\":\"{model}\",\"max_tokens\":64,\"messages\":[{{\"role\":\"user\",\"content\":\"Say hello.\"}}]{stream}}}"
    ))
}

/// The three endpoints of a target: small message (fast upstream), small message and
/// stream (slow upstream).
fn endpoints(
    fast: (Uri, Vec<(HeaderName, HeaderValue)>, &str),
    slow: (Uri, Vec<(HeaderName, HeaderValue)>, &str),
) -> (Endpoint, Endpoint, Endpoint) {
    let small = Endpoint {
        uri: fast.0,
        headers: fast.1,
        body: body(fast.2, false),
        stream: false,
    };
    let sustained = Endpoint {
        uri: slow.0.clone(),
        headers: slow.1.clone(),
        body: body(slow.2, false),
        stream: false,
    };
    let stream = Endpoint {
        uri: slow.0,
        headers: slow.1,
        body: body(slow.2, true),
        stream: true,
    };
    (small, sustained, stream)
}

fn common_headers(
    credential: (&'static str, &str),
) -> anyhow::Result<Vec<(HeaderName, HeaderValue)>> {
    Ok(vec![
        header(credential.0, credential.1)?,
        header("anthropic-version", "2023-06-01")?,
        header("content-type", "application/json")?,
    ])
}

const MODEL: &str = "claude-sonnet-4-5";

fn sim_command(sim: &Path, addr: SocketAddr, slow: bool) -> Command {
    let mut c = Command::new(sim);
    c.arg("--listen")
        .arg(addr.to_string())
        .args(["--threads", "1"]);
    if slow {
        c.args([
            "--delay-ms",
            "20",
            "--chunks",
            "64",
            "--chunk-interval-ms",
            "20",
            // The driver subtracts the simulator's own wait from each TTFT.
            "--think-time-in-id",
        ]);
    } else {
        c.args([
            "--rate-limited",
            setup::RATE_LIMITED_SECRET,
            "--retry-after-ms",
            "1",
        ]);
    }
    c
}

/// Waits until `GET uri` gets any HTTP answer, or fails after `limit` (or when the
/// process exits).
/// A standalone simulator (`slow`: the paced one, [`sim_command`]) on a free loopback
/// port, answering: its process and address.
async fn start_sim(
    client: &HttpClient,
    sim: &Path,
    slow: bool,
    name: &str,
    log: &Path,
) -> anyhow::Result<(Proc, SocketAddr)> {
    let addr = procs::free_addr()?;
    let mut proc = Proc::spawn(name, sim_command(sim, addr, slow), log)?;
    // Any path answers (404 for GET): the simulator is up.
    wait_http(client, &mut proc, &uri(addr, "/")?, Duration::from_secs(10)).await?;
    Ok((proc, addr))
}

async fn wait_http(
    client: &HttpClient,
    proc: &mut Proc,
    uri: &Uri,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        proc.check_alive()?;
        if driver::get_text(client, uri).await.is_some() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("no answer from {uri} within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One request to `ep`; the failure's description.
async fn smoke_endpoint(client: &HttpClient, ep: &Endpoint) -> Result<(), String> {
    let once = Bounds {
        requests: Some(1),
        duration: Duration::from_secs(30),
        pause: Duration::ZERO,
    };
    let out = driver::closed_loop(client, ep, 1, once).await;
    if out.ok == 1 {
        return Ok(());
    }
    Err(format!(
        "{}{}: {}",
        ep.uri,
        if ep.stream { " (stream)" } else { "" },
        out.first_errors.join("; ")
    ))
}

/// One request to each endpoint of a target; the first failure's description.
async fn smoke(client: &HttpClient, t: &Target) -> Result<(), String> {
    let eps = [Some(&t.small), t.sustained.as_ref(), t.stream.as_ref()];
    for ep in eps.into_iter().flatten() {
        smoke_endpoint(client, ep).await?;
    }
    Ok(())
}

/// A peer's smoke test: its non-streaming endpoints must answer; when only its stream
/// fails, the stream scenario is dropped and the reason returned as a note.
async fn smoke_peer(client: &HttpClient, t: &mut Target) -> Result<Option<String>, String> {
    let stream = t.stream.take();
    smoke(client, t)
        .await
        .map_err(|e| format!("started but did not answer as expected: {e}"))?;
    let Some(stream) = stream else {
        return Ok(None);
    };
    match smoke_endpoint(client, &stream).await {
        Ok(()) => {
            t.stream = Some(stream);
            Ok(None)
        }
        Err(e) => {
            eprintln!("bench: {} streaming not measured: {e}", t.name);
            Ok(Some(format!("streaming NOT measured, it failed: {e}")))
        }
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".into())
}

fn machine() -> Machine {
    let cpu_model = Command::new("lscpu")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("Model name:").map(|m| m.trim().to_owned()))
        })
        .unwrap_or_else(|| "?".into());
    let mem_kib: f64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0.0);
    Machine {
        cpu_model,
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        mem_gib: mem_kib / 1024.0 / 1024.0,
        loadavg_at_start: loadavg(),
    }
}

async fn bench(options: &Options, bins: &Bins, dir: &Path) -> anyhow::Result<Report> {
    let plan = Plan::new(options.quick);
    let began = std::time::Instant::now();
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut report = Report {
        command: options.command(),
        date_utc: report::utc_string(unix),
        machine: machine(),
        quick: options.quick,
        targets: Vec::new(),
        results: Vec::new(),
        verdicts: Vec::new(),
        floor: None,
    };
    let client = driver::client();
    let ticks = procs::clock_ticks_per_second();

    // Upstreams.
    let (mut sim_fast, fast_addr) = start_sim(
        &client,
        &bins.sim,
        false,
        "keypool-sim (fast)",
        &dir.join("sim-fast.log"),
    )
    .await?;
    let (mut sim_slow, slow_addr) = start_sim(
        &client,
        &bins.sim,
        true,
        "keypool-sim (slow)",
        &dir.join("sim-slow.log"),
    )
    .await?;
    let fast_base = format!("http://{fast_addr}");
    let slow_base = format!("http://{slow_addr}");

    // keypool.
    let key = setup::keygen(&bins.keypool)?;
    let kp_addr = procs::free_addr()?;
    let config_path = dir.join("keypool.toml");
    std::fs::write(
        &config_path,
        setup::keypool_config(kp_addr, &fast_base, &slow_base, &key.sha256),
    )
    .with_context(|| format!("cannot write {}", config_path.display()))?;
    let check = Command::new(&bins.keypool)
        .arg("check-config")
        .arg(&config_path)
        .output()
        .context("cannot run keypool check-config")?;
    if !check.status.success() {
        bail!(
            "the generated {} is invalid:\n{}{}",
            config_path.display(),
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
    }
    let mut serve = Command::new(&bins.keypool);
    serve.arg("serve").arg("--config").arg(&config_path);
    let mut keypool = Proc::spawn("keypool", serve, &dir.join("keypool.log"))?;
    wait_http(
        &client,
        &mut keypool,
        &uri(kp_addr, "/healthz")?,
        Duration::from_secs(20),
    )
    .await?;

    let direct_headers = common_headers(("x-api-key", setup::UPSTREAM_SECRET))?;
    let (small, sustained, stream) = endpoints(
        (
            uri(fast_addr, "/v1/messages")?,
            direct_headers.clone(),
            MODEL,
        ),
        (uri(slow_addr, "/v1/messages")?, direct_headers, MODEL),
    );
    let mut targets = vec![Target {
        name: report::DIRECT,
        pgid_fast: sim_fast.pid(),
        pgid_slow: sim_slow.pid(),
        small,
        c16: true,
        pause: Duration::ZERO,
        sustained: Some(sustained),
        stream: Some(stream),
        metrics: None,
    }];
    report.targets.push(TargetInfo {
        name: report::DIRECT.into(),
        description: "keypool-sim standalone, 1 thread (fast: no delay; slow: 20 ms, 64 chunks at 20 ms); CPU/RSS are the simulator's".into(),
        skipped: None,
        peak_rss_mib: None,
    });

    let kp_headers = common_headers(("x-api-key", &key.key))?;
    let kp_path = |pool: &str| format!("/{}/{pool}/v1/messages", setup::ORG);
    let (small, sustained, stream) = endpoints(
        (uri(kp_addr, &kp_path("rr8"))?, kp_headers.clone(), MODEL),
        (uri(kp_addr, &kp_path("slow8"))?, kp_headers.clone(), MODEL),
    );
    let kp_target = |name, path: &str, pause, metrics: bool| -> anyhow::Result<Target> {
        Ok(Target {
            name,
            pgid_fast: keypool.pid(),
            pgid_slow: keypool.pid(),
            small: Endpoint {
                uri: uri(kp_addr, path)?,
                headers: kp_headers.clone(),
                body: body(MODEL, false),
                stream: false,
            },
            c16: !metrics,
            pause,
            sustained: None,
            stream: None,
            metrics: if metrics {
                Some(uri(kp_addr, "/metrics")?)
            } else {
                None
            },
        })
    };
    targets.push(Target {
        sustained: Some(sustained),
        stream: Some(stream),
        small,
        ..kp_target(report::KEYPOOL_RR, "/", Duration::ZERO, false)?
    });
    targets.push(kp_target(
        report::KEYPOOL_RATED,
        &kp_path("rated8"),
        Duration::ZERO,
        false,
    )?);
    targets.push(kp_target(
        report::KEYPOOL_1000,
        &kp_path("rr1000"),
        Duration::ZERO,
        false,
    )?);
    targets.push(kp_target(
        report::KEYPOOL_FAILOVER,
        &kp_path("failover"),
        FAILOVER_PAUSE,
        true,
    )?);
    let kp_desc = [
        (
            report::KEYPOOL_RR,
            "8 accounts, round_robin (slow8 for sustained/stream)",
        ),
        (report::KEYPOOL_RATED, "8 accounts, rated"),
        (report::KEYPOOL_1000, "1,000 accounts, round_robin"),
        (
            report::KEYPOOL_FAILOVER,
            "priority: 1st account answers 429 (retry-after-ms 1), 2nd serves; 2 ms between requests",
        ),
    ];
    for (name, what) in kp_desc {
        report.targets.push(TargetInfo {
            name: name.into(),
            description: format!(
                "keypool (release, default log level, one process for all keypool rows): {what}"
            ),
            skipped: None,
            peak_rss_mib: None,
        });
    }
    for t in &targets {
        if let Err(e) = smoke(&client, t).await {
            bail!("{} does not answer as expected: {e}", t.name);
        }
    }

    // Peers.
    let mut peers: Vec<(Proc, &'static str)> = Vec::new();
    if options.peers && options.runs_phases() {
        match start_litellm(&client, dir, &fast_base, &slow_base).await {
            Ok((proc, target, version, note)) => {
                report.targets.push(TargetInfo {
                    name: report::LITELLM.into(),
                    description: format!(
                        "LiteLLM proxy {version}, 2 workers, /v1/messages, anthropic/ model at the simulators{}",
                        note.map_or_else(String::new, |n| format!("; {n}"))
                    ),
                    skipped: None,
                    peak_rss_mib: None,
                });
                peers.push((proc, report::LITELLM));
                targets.push(target);
            }
            Err(reason) => report
                .targets
                .push(skipped(report::LITELLM, "LiteLLM proxy", reason)),
        }
        match start_portkey(&client, dir, &fast_base, &slow_base).await {
            Ok((proc, target, version, note)) => {
                report.targets.push(TargetInfo {
                    name: report::PORTKEY.into(),
                    description: format!(
                        "Portkey gateway {version} (node), /v1/messages, x-portkey-provider: anthropic + x-portkey-custom-host{}",
                        note.map_or_else(String::new, |n| format!("; {n}"))
                    ),
                    skipped: None,
                    peak_rss_mib: None,
                });
                peers.push((proc, report::PORTKEY));
                targets.push(target);
            }
            Err(reason) => report
                .targets
                .push(skipped(report::PORTKEY, "Portkey gateway", reason)),
        }
    } else {
        for (name, what) in [
            (report::LITELLM, "LiteLLM proxy"),
            (report::PORTKEY, "Portkey gateway"),
        ] {
            let reason = if options.runs_phases() {
                "not requested (run with --peers)"
            } else {
                "not requested (--floor: the floor comparison only)"
            };
            report.targets.push(skipped(name, what, reason.into()));
        }
    }
    if !options.runs_phases() {
        targets.clear();
    }

    for t in &targets {
        eprintln!("bench: measuring {}", t.name);
        let results = measure(&client, t, &plan, ticks).await;
        report.results.extend(results);
        sim_fast.check_alive()?;
        sim_slow.check_alive()?;
        keypool.check_alive()?;
    }

    // Peak RSS, read before the processes are killed.
    let mib = |kib: u64| Some(kib as f64 / 1024.0);
    let kp_rss = mib(keypool.usage().peak_rss_kib);
    for info in &mut report.targets {
        if info.skipped.is_some() {
            continue;
        }
        info.peak_rss_mib = match info.name.as_str() {
            report::DIRECT => mib(sim_fast
                .usage()
                .peak_rss_kib
                .max(sim_slow.usage().peak_rss_kib)),
            name if name.starts_with("keypool") => kp_rss,
            name => peers
                .iter()
                .find(|(_, n)| *n == name)
                .and_then(|(p, _)| mib(p.usage().peak_rss_kib)),
        };
    }
    if options.runs_phases() {
        report.compute_added();
        report.compute_verdicts();
    }
    // The floor comparison shares the CPUs with nothing but its own targets.
    drop(peers);
    if options.runs_floor() {
        let inputs = FloorInputs {
            bins,
            dir,
            fast_base: &fast_base,
            slow_base: &slow_base,
            key: &key,
            keypool: &keypool,
            kp_addr,
            sims: (&sim_fast, &sim_slow),
            addrs: (fast_addr, slow_addr),
            baseline: options.baseline.as_deref(),
            pgo: options.pgo,
            plain_baseline: options.plain_baseline,
        };
        let floor = floor_comparison(&client, &inputs, options.quick, ticks).await?;
        sim_fast.check_alive()?;
        sim_slow.check_alive()?;
        keypool.check_alive()?;
        report.floor = Some(floor);
    }
    eprintln!("bench: done in {:.0} s", began.elapsed().as_secs_f64());
    Ok(report)
}

/// What the floor comparison needs of the run: the simulators, keypool, the key.
struct FloorInputs<'a> {
    bins: &'a Bins,
    dir: &'a Path,
    fast_base: &'a str,
    slow_base: &'a str,
    key: &'a setup::LbKey,
    /// The keypool of the other phases (log level `info`).
    keypool: &'a Proc,
    kp_addr: SocketAddr,
    /// The fast and the slow simulator.
    sims: (&'a Proc, &'a Proc),
    addrs: (SocketAddr, SocketAddr),
    /// `--baseline-binary`.
    baseline: Option<&'a Path>,
    /// keypool is the PGO build (`--pgo`)…
    pgo: bool,
    /// …and the baseline the plain release build.
    plain_baseline: bool,
}

/// Starts nginx (also with an access log), HAProxy and a keypool at log level `warn`,
/// and runs [`floor::run`] over them, keypool and the simulators alone.
async fn floor_comparison(
    client: &HttpClient,
    i: &FloorInputs<'_>,
    quick: bool,
    ticks: u64,
) -> anyhow::Result<floor::FloorReport> {
    let mut report = floor::FloorReport::default();
    let mut targets = Vec::new();
    let kp_headers = common_headers(("x-api-key", &i.key.key))?;
    let small = |uri: Uri, headers: &Vec<(HeaderName, HeaderValue)>| Endpoint {
        uri,
        headers: headers.clone(),
        body: body(MODEL, false),
        stream: false,
    };
    let stream = |uri: Uri, headers: &Vec<(HeaderName, HeaderValue)>| Endpoint {
        uri,
        headers: headers.clone(),
        body: body(MODEL, true),
        stream: true,
    };
    let direct_headers = common_headers(("x-api-key", setup::UPSTREAM_SECRET))?;
    targets.push(floor::FloorTarget {
        name: floor::DIRECT,
        pgid: i.sims.0.pid(),
        pgid_stream: i.sims.1.pid(),
        small: small(uri(i.addrs.0, "/v1/messages")?, &direct_headers),
        stream: Some(stream(uri(i.addrs.1, "/v1/messages")?, &direct_headers)),
        metrics: None,
    });
    report.targets.push(TargetInfo {
        name: floor::DIRECT.into(),
        description:
            "keypool-sim standalone, 1 thread (the streaming baseline: 20 ms, 64 chunks at 20 ms)"
                .into(),
        skipped: None,
        peak_rss_mib: None,
    });

    // The proxies get the client's request as keypool does (its LB key in x-api-key)
    // and replace the key with the upstream one.
    let mut peers = Vec::new();
    for (name, started) in [
        (
            floor::NGINX,
            floor::start_nginx(client, i.dir, i.fast_base, i.slow_base, false).await,
        ),
        (
            floor::NGINX_LOG,
            floor::start_nginx(client, i.dir, i.fast_base, i.slow_base, true).await,
        ),
        (
            floor::HAPROXY,
            floor::start_haproxy(client, i.dir, i.fast_base, i.slow_base).await,
        ),
    ] {
        let checked = match started {
            Ok(peer) => {
                let target = floor::FloorTarget {
                    name,
                    pgid: peer.proc.pid(),
                    pgid_stream: peer.proc.pid(),
                    small: small(
                        uri(peer.addr, &format!("{}/v1/messages", floor::FAST_PREFIX))?,
                        &kp_headers,
                    ),
                    stream: Some(stream(
                        uri(peer.addr, &format!("{}/v1/messages", floor::SLOW_PREFIX))?,
                        &kp_headers,
                    )),
                    metrics: None,
                };
                let mut answers = smoke_endpoint(client, &target.small).await;
                if answers.is_ok()
                    && let Some(ep) = &target.stream
                {
                    answers = smoke_endpoint(client, ep).await;
                }
                answers
                    .map(|()| (peer, target))
                    .map_err(|e| format!("started but did not answer as expected: {e}"))
            }
            Err(reason) => Err(reason),
        };
        match checked {
            Ok((peer, target)) => {
                report.targets.push(TargetInfo {
                    name: name.into(),
                    description: peer.description.clone(),
                    skipped: None,
                    peak_rss_mib: None,
                });
                targets.push(target);
                peers.push(peer);
            }
            Err(reason) => report
                .targets
                .push(skipped(name, name, reason.replace('\n', " / "))),
        }
    }

    // keypool: the process of the other phases (info), and one more at warn.
    let kp_path = |pool: &str| format!("/{}/{pool}/v1/messages", setup::ORG);
    targets.push(floor::FloorTarget {
        name: floor::KEYPOOL,
        pgid: i.keypool.pid(),
        pgid_stream: i.keypool.pid(),
        small: small(uri(i.kp_addr, &kp_path("rr8"))?, &kp_headers),
        stream: Some(stream(uri(i.kp_addr, &kp_path("slow8"))?, &kp_headers)),
        metrics: Some(uri(i.kp_addr, "/metrics")?),
    });
    targets.push(floor::FloorTarget {
        name: floor::KEYPOOL_1000,
        pgid: i.keypool.pid(),
        pgid_stream: i.keypool.pid(),
        small: small(uri(i.kp_addr, &kp_path("rr1000"))?, &kp_headers),
        stream: None,
        metrics: Some(uri(i.kp_addr, "/metrics")?),
    });
    // More keypools, each its own process on the same config: at log level warn, and
    // the --baseline-binary.
    let mut extra = vec![(floor::KEYPOOL_WARN, i.bins.keypool.as_path(), Some("warn"))];
    if let Some(b) = i.baseline {
        extra.push((floor::KEYPOOL_BASELINE, b, None));
    }
    let mut extra_procs = Vec::new();
    for (name, binary, level) in extra {
        let addr = procs::free_addr()?;
        let config = i.dir.join(format!("{name}.toml"));
        std::fs::write(
            &config,
            setup::keypool_config(addr, i.fast_base, i.slow_base, &i.key.sha256),
        )
        .with_context(|| format!("cannot write {}", config.display()))?;
        let mut serve = Command::new(binary);
        serve.arg("serve").arg("--config").arg(&config);
        if let Some(level) = level {
            serve.env("RUST_LOG", level);
        }
        let mut proc = Proc::spawn(name, serve, &i.dir.join(format!("{name}.log")))?;
        wait_http(
            client,
            &mut proc,
            &uri(addr, "/healthz")?,
            Duration::from_secs(20),
        )
        .await?;
        let target = floor::FloorTarget {
            name,
            pgid: proc.pid(),
            pgid_stream: proc.pid(),
            small: small(uri(addr, &kp_path("rr8"))?, &kp_headers),
            stream: None,
            metrics: Some(uri(addr, "/metrics")?),
        };
        if let Err(e) = smoke_endpoint(client, &target.small).await {
            bail!("{name} does not answer as expected: {e}");
        }
        targets.push(target);
        extra_procs.push(proc);
    }
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (name, what) in [
        (
            floor::KEYPOOL,
            "8 accounts, round_robin (slow8 for streams), log level info",
        ),
        (
            floor::KEYPOOL_1000,
            "1,000 accounts, round_robin, log level info (same process)",
        ),
        (
            floor::KEYPOOL_WARN,
            "8 accounts, round_robin, RUST_LOG=warn (its own process)",
        ),
    ]
    .into_iter()
    .chain(i.baseline.map(|_| {
        (
            floor::KEYPOOL_BASELINE,
            if i.plain_baseline {
                "8 accounts, round_robin, log level info: the plain release build (no PGO)"
            } else {
                "8 accounts, round_robin, log level info: the --baseline-binary"
            },
        )
    })) {
        let build = if i.pgo && name != floor::KEYPOOL_BASELINE {
            "release with PGO (`cargo xtask pgo`)"
        } else {
            "release"
        };
        report.targets.push(TargetInfo {
            name: name.into(),
            description: format!(
                "keypool ({build}, default config: workers = one per CPU = {workers}): {what}"
            ),
            skipped: None,
            peak_rss_mib: None,
        });
    }

    let plan = floor::FloorPlan::new(quick);
    eprintln!(
        "bench: floor comparison, {} rounds of {:?} per closed loop and {:?} per stream run",
        plan.rounds, plan.seconds, plan.stream_seconds
    );
    report.samples = floor::run(client, &targets, plan, i.dir, ticks).await?;
    for p in &mut extra_procs {
        p.check_alive()?;
    }
    for p in &mut peers {
        p.proc.check_alive()?;
    }
    report.compute_verdicts();
    Ok(report)
}

fn skipped(name: &str, what: &str, reason: String) -> TargetInfo {
    eprintln!("bench: {name} skipped: {reason}");
    TargetInfo {
        name: name.into(),
        description: what.into(),
        skipped: Some(reason),
        peak_rss_mib: None,
    }
}

async fn start_litellm(
    client: &HttpClient,
    dir: &Path,
    fast: &str,
    slow: &str,
) -> Result<(Proc, Target, String, Option<String>), String> {
    let program = setup::ensure_litellm(&dir.join("litellm-venv"))?;
    let version = setup::peer_version(&program, true);
    let config = dir.join("litellm.yaml");
    std::fs::write(&config, setup::litellm_config(fast, slow)).map_err(|e| e.to_string())?;
    let addr = procs::free_addr().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(&program);
    cmd.arg("--config")
        .arg(&config)
        .args(["--host", "127.0.0.1", "--port", &addr.port().to_string()])
        .args(["--num_workers", "2"])
        // No network at start-up (model cost map), no telemetry, quiet logs.
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("LITELLM_TELEMETRY", "False")
        .env("LITELLM_LOG", "ERROR");
    let mut proc =
        Proc::spawn("litellm", cmd, &dir.join("litellm.log")).map_err(|e| e.to_string())?;
    let ready = uri(addr, "/health/liveliness").map_err(|e| e.to_string())?;
    wait_http(client, &mut proc, &ready, Duration::from_secs(120))
        .await
        .map_err(|e| format!("did not start: {e:#}"))?;
    let run = || -> anyhow::Result<Target> {
        let headers = common_headers((
            "authorization",
            &format!("Bearer {}", setup::LITELLM_MASTER_KEY),
        ))?;
        let path = uri(addr, "/v1/messages")?;
        let (small, sustained, stream) = endpoints(
            (path.clone(), headers.clone(), setup::LITELLM_FAST_MODEL),
            (path, headers, setup::LITELLM_SLOW_MODEL),
        );
        Ok(Target {
            name: report::LITELLM,
            pgid_fast: proc.pid(),
            pgid_slow: proc.pid(),
            small,
            c16: true,
            pause: Duration::ZERO,
            sustained: Some(sustained),
            stream: Some(stream),
            metrics: None,
        })
    };
    let mut target = run().map_err(|e| e.to_string())?;
    let note = smoke_peer(client, &mut target).await?;
    Ok((proc, target, version, note))
}

async fn start_portkey(
    client: &HttpClient,
    dir: &Path,
    fast: &str,
    slow: &str,
) -> Result<(Proc, Target, String, Option<String>), String> {
    let script = setup::ensure_portkey(&dir.join("portkey"))?;
    let version = setup::peer_version(&script, false);
    let addr = procs::free_addr().map_err(|e| e.to_string())?;
    let mut cmd = Command::new("node");
    cmd.arg(&script)
        .arg(format!("--port={}", addr.port()))
        .arg("--headless")
        .env("NODE_ENV", "production");
    let mut proc =
        Proc::spawn("portkey", cmd, &dir.join("portkey.log")).map_err(|e| e.to_string())?;
    wait_http(
        client,
        &mut proc,
        &uri(addr, "/").map_err(|e| e.to_string())?,
        Duration::from_secs(60),
    )
    .await
    .map_err(|e| format!("did not start: {e:#}"))?;
    let run = || -> anyhow::Result<Target> {
        let headers = |base: &str| -> anyhow::Result<Vec<(HeaderName, HeaderValue)>> {
            let mut h = common_headers(("x-api-key", setup::UPSTREAM_SECRET))?;
            h.push(header("x-portkey-provider", "anthropic")?);
            h.push(header("x-portkey-custom-host", &format!("{base}/v1"))?);
            Ok(h)
        };
        let path = uri(addr, "/v1/messages")?;
        let (small, sustained, stream) = endpoints(
            (path.clone(), headers(fast)?, MODEL),
            (path, headers(slow)?, MODEL),
        );
        Ok(Target {
            name: report::PORTKEY,
            pgid_fast: proc.pid(),
            pgid_slow: proc.pid(),
            small,
            c16: true,
            pause: Duration::ZERO,
            sustained: Some(sustained),
            stream: Some(stream),
            metrics: None,
        })
    };
    let mut target = run().map_err(|e| e.to_string())?;
    let note = smoke_peer(client, &mut target).await?;
    Ok((proc, target, version, note))
}

/// Runs every scenario of a target.
async fn measure(client: &HttpClient, t: &Target, plan: &Plan, ticks: u64) -> Vec<RunResult> {
    let mut results = Vec::new();
    // Warm-up: connections, caches, the rating engine's first samples.
    let warm = Bounds {
        requests: Some(plan.warmup),
        duration: Duration::from_secs(5),
        pause: t.pause,
    };
    let _ = driver::closed_loop(client, &t.small, if t.c16 { 4 } else { 1 }, warm).await;

    let failovers_before = failovers(client, t).await;
    let c1 = Bounds {
        requests: Some(plan.c1_requests),
        duration: plan.c1_max,
        pause: t.pause,
    };
    let mut r = phase(t.name, Scenario::SmallC1, t.pgid_fast, ticks, async {
        driver::closed_loop(client, &t.small, 1, c1).await
    })
    .await;
    if let (Some(before), Some(after)) = (failovers_before, failovers(client, t).await)
        && r.requests > 0
    {
        r.failovers_per_request = Some((after - before) / r.requests as f64);
    }
    results.push(r);

    let mut max_rps = None;
    if t.c16 {
        let c16 = Bounds {
            requests: None,
            duration: plan.c16,
            pause: Duration::ZERO,
        };
        let r = phase(t.name, Scenario::SmallC16, t.pgid_fast, ticks, async {
            driver::closed_loop(client, &t.small, 16, c16).await
        })
        .await;
        max_rps = Some(r.req_per_s);
        results.push(r);
    }
    if let Some(ep) = &t.sustained {
        let rate = max_rps.map_or(plan.sustained_rate, |m| plan.sustained_rate.min(0.7 * m));
        let mut r = phase(t.name, Scenario::Sustained, t.pgid_slow, ticks, async {
            driver::constant_rate(client, ep, rate, plan.sustained, plan.sustained_workers).await
        })
        .await;
        r.offered_per_s = Some(rate);
        results.push(r);
    }
    if let Some(ep) = &t.stream {
        let streams = Bounds {
            requests: None,
            duration: plan.stream,
            pause: Duration::ZERO,
        };
        results.push(
            phase(t.name, Scenario::Stream, t.pgid_slow, ticks, async {
                driver::closed_loop(client, ep, 16, streams).await
            })
            .await,
        );
    }
    results
}

async fn failovers(client: &HttpClient, t: &Target) -> Option<f64> {
    let (_, text) = driver::get_text(client, t.metrics.as_ref()?).await?;
    Some(driver::counter_sum(&text, "keypool_failovers_total"))
}

/// Runs one measured phase and turns its outcome and the CPU delta into a result.
async fn phase(
    target: &str,
    scenario: Scenario,
    pgid: u32,
    ticks_per_second: u64,
    run: impl Future<Output = driver::Outcome>,
) -> RunResult {
    let before = procs::group_usage(pgid).cpu_ticks;
    let out = run.await;
    let after = procs::group_usage(pgid).cpu_ticks;
    let mut r = RunResult::new(target, scenario);
    r.requests = out.ok;
    r.errors = out.errors;
    r.elapsed_s = out.elapsed.as_secs_f64();
    r.req_per_s = stats::rate(out.ok, out.elapsed);
    r.latency = out.latency.summary();
    r.ttft = out.ttft.summary();
    // every stream, each worker's first too (only the floor's verdict sets them apart)
    let mut net_ttft = out.net_ttft.clone();
    net_ttft.merge(&out.first_net_ttft);
    r.net_ttft = net_ttft.summary();
    r.gap = out.gap.summary();
    r.cpu_s_per_1k =
        stats::cpu_seconds_per_1k(after.saturating_sub(before), ticks_per_second, out.ok);
    eprintln!(
        "bench:   {:<18} {:<11} ok {:>6} err {:>4} {:>8.0} req/s p50 {:>9.1} µs p99 {:>9.1} µs{}",
        target,
        scenario.label(),
        out.ok,
        out.errors,
        r.req_per_s,
        r.latency.map_or(0.0, |l| l.p50_us),
        r.latency.map_or(0.0, |l| l.p99_us),
        out.first_errors
            .first()
            .map_or_else(String::new, |e| format!("  first error: {e}")),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        let args =
            |a: &[&str]| Options::parse(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(args(&[]).unwrap(), Options::default());
        assert_eq!(
            args(&["--peers", "--quick"]).unwrap(),
            Options {
                quick: true,
                peers: true,
                ..Options::default()
            }
        );
        let base = args(&["--floor", "--baseline-binary", "/tmp/kp"]).unwrap();
        assert_eq!(base.baseline.as_deref(), Some(Path::new("/tmp/kp")));
        assert_eq!(
            base.command(),
            "cargo xtask bench --floor --baseline-binary /tmp/kp"
        );
        assert!(args(&["--baseline-binary", "/tmp/kp"]).is_err());
        assert!(args(&["--floor", "--baseline-binary"]).is_err());
        let floor = args(&["--floor"]).unwrap();
        assert!(floor.floor && floor.runs_floor() && !floor.runs_phases());
        let peers = args(&["--peers"]).unwrap();
        assert!(peers.runs_floor() && peers.runs_phases());
        let plain = args(&[]).unwrap();
        assert!(!plain.runs_floor() && plain.runs_phases());
        assert_eq!(floor.command(), "cargo xtask bench --floor");
        assert!(
            args(&["--fast"])
                .unwrap_err()
                .to_string()
                .contains("--fast")
        );
        assert_eq!(
            Options {
                quick: true,
                peers: true,
                ..Options::default()
            }
            .command(),
            "cargo xtask bench --quick --peers"
        );
        let pgo = args(&["--floor", "--pgo"]).unwrap();
        assert!(pgo.pgo && pgo.baseline.is_none());
        assert_eq!(pgo.command(), "cargo xtask bench --floor --pgo");
        // The plain build --pgo makes the baseline is not part of the command typed.
        let made = Options {
            baseline: Some(PathBuf::from("/t/release/keypool")),
            plain_baseline: true,
            ..pgo.clone()
        };
        assert_eq!(made.command(), "cargo xtask bench --floor --pgo");
    }

    #[test]
    fn bodies_are_json_with_model_and_stream_flag() {
        let small: serde_json::Value = serde_json::from_slice(&body("m", false)).unwrap();
        assert_eq!(small["model"], "m");
        assert!(small.get("stream").is_none());
        let stream: serde_json::Value = serde_json::from_slice(&body("m", true)).unwrap();
        assert_eq!(stream["stream"], true);
    }

    #[test]
    fn quick_plan_is_shorter() {
        let (q, f) = (Plan::new(true), Plan::new(false));
        assert!(q.c16 < f.c16 && q.stream < f.stream && q.c1_requests < f.c1_requests);
    }
}
