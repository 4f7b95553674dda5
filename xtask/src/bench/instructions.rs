//! `cargo xtask instructions [--requests N] [--warm N] [--baseline-binary PATH]
//! [--cache-sim]`: instructions per request of keypool and of nginx, counted by
//! valgrind's callgrind, in front of the same simulator.
//!
//! CPU time per request on a shared two-vCPU machine moves by ±30 % between rounds;
//! an instruction count does not move at all for the same binary and the same requests,
//! whatever else the machine is doing. It is the figure that says *why* keypool's CPU
//! per request is what it is (issue 22: "for each target missed, the profile that says
//! why"), and the one that shows a change of 1 % that no A/B in CPU time can resolve.
//! It is necessary, not sufficient: a change that saves instructions can still cost
//! time (cache lines, allocator placement), so it still needs its paired A/B.
//!
//! Each target serves one connection on one thread under `valgrind --tool=callgrind`:
//! keypool with `workers = 1` (8 accounts at log level `info` and `warn`, and 1,000
//! accounts), nginx with one worker and no master process. The driver sends
//! `--warm` requests (not counted: connections, caches, lazy initialisation; 14,336 by
//! default: fourteen turns of the 1,000-account pool, the usage ledger's first three
//! folds, at every 4,096 records, the first of which creates every account's totals,
//! and more than the 10,000 records the recent-requests ring keeps, so that the count
//! sees a long-running process's books and ring, not their creation and growth; half
//! way between two folds, so that neither end of the count falls on one), zeroes the
//! counters (`callgrind_control -z`), sends
//! `--requests` requests one at a time (8,192 by default: the usage ledger folds its
//! queue every 4,096 records, so the count holds exactly two folds), and dumps the
//! counters (`callgrind_control -d`). Instructions per request are the
//! dump's total over the requests answered. For keypool at `info` the dump is also
//! split by the source file each instruction's line comes from (inlined code counts
//! where it was written), grouped by crate: where a request's instructions go.
//!
//! With `--baseline-binary PATH`, that keypool (another commit's build) is counted
//! too, at `rr8` and `rr1000` with log level `info`, in the same run: a change's
//! before and after, to the instruction.
//!
//! With `--cache-sim`, callgrind also simulates the data caches, shaped as this
//! machine's L1 data cache and its L2 (read from `/sys`; the L2 stands in for
//! callgrind's last level, since a miss there is what costs a request time: the L3 of
//! a shared host is shared). It counts the misses per request, to the miss: what a
//! 1,000-account pool costs beyond its instructions (each request touches a different
//! account's state).
//!
//! The dumps stay in `target/bench/instructions/` for `callgrind_annotate`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};

use super::driver::{self, Bounds, Endpoint};
use super::procs::{self, Proc};
use super::{MODEL, body, common_headers, setup, uri, wait_http};

/// What `cargo xtask instructions` was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstructionOptions {
    /// Requests counted per target.
    pub requests: u64,
    /// Requests sent before the counters are zeroed.
    pub warm: u64,
    /// Another keypool binary counted beside this tree's.
    pub baseline: Option<PathBuf>,
    /// Also simulate the L1 data cache and the L2, and count their misses.
    pub cache_sim: bool,
}

const USAGE: &str =
    "cargo xtask instructions [--requests N] [--warm N] [--baseline-binary PATH] [--cache-sim]";

impl InstructionOptions {
    /// Parses the arguments after `instructions`.
    pub fn parse(args: &[String]) -> anyhow::Result<Self> {
        let mut o = Self {
            requests: 8_192,
            warm: 14_336,
            baseline: None,
            cache_sim: false,
        };
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut number = |name: &str| -> anyhow::Result<u64> {
                let value = it
                    .next()
                    .with_context(|| format!("{name} needs a number ({USAGE})"))?;
                match value.parse::<u64>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => bail!("{name} takes a whole number above 0, not {value:?} ({USAGE})"),
                }
            };
            match arg.as_str() {
                "--requests" => o.requests = number("--requests")?,
                "--warm" => o.warm = number("--warm")?,
                "--cache-sim" => o.cache_sim = true,
                "--baseline-binary" => {
                    let path = it
                        .next()
                        .with_context(|| format!("--baseline-binary needs a path ({USAGE})"))?;
                    o.baseline = Some(PathBuf::from(path));
                }
                other => bail!("unknown argument {other:?} ({USAGE})"),
            }
        }
        Ok(o)
    }
}

/// Entry point of `cargo xtask instructions`.
pub fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let options = InstructionOptions::parse(args)?;
    if let Some(baseline) = &options.baseline
        && !baseline.is_file()
    {
        bail!(
            "--baseline-binary {} is not a file: give the path of another build's keypool",
            baseline.display()
        );
    }
    let Some((target, bins)) = super::release_build(root, "instructions", args)? else {
        return Ok(());
    };
    // Found on PATH, else installed from Debian's packages like the floor run's peers.
    for program in ["valgrind", "callgrind_control"] {
        super::floor::ensure_debian_program(program, "valgrind")
            .map_err(|reason| anyhow::anyhow!("{program}: {reason}"))?;
    }
    let caches = if options.cache_sim {
        Some(Caches::of_this_machine()?)
    } else {
        None
    };
    let dir = target.join("bench").join("instructions");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // A dump is found by its process id: none of an earlier run may be taken for it.
    for entry in std::fs::read_dir(&dir)?.filter_map(Result::ok) {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("callgrind.")
        {
            std::fs::remove_file(entry.path())
                .with_context(|| format!("cannot remove {}", entry.path().display()))?;
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let rows = runtime.block_on(measure(&options, &bins, &dir, caches.as_ref()))?;
    println!("{}", table(&rows, options.requests));
    if let Some(caches) = &caches {
        println!("{}", miss_table(&rows, caches));
    }
    Ok(())
}

/// One target's count.
#[derive(Debug, Clone)]
pub struct Row {
    /// What was measured.
    pub name: String,
    /// Requests answered while counting.
    pub requests: u64,
    /// Instructions counted over them.
    pub instructions: u64,
    /// Self instructions by crate or source file (keypool at `info` only), largest first.
    pub by_origin: Vec<(String, u64)>,
    /// With `--cache-sim`: data reads and writes that missed the L1 and the L2.
    pub misses: Option<Misses>,
}

impl Row {
    fn per_request(&self) -> f64 {
        self.instructions as f64 / self.requests.max(1) as f64
    }
}

/// Data accesses (reads and writes) that missed each simulated cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Misses {
    /// Missed the L1 data cache.
    pub l1: u64,
    /// Missed the L2 as well (callgrind's last level).
    pub l2: u64,
}

impl Misses {
    /// From a dump's event totals (`D1mr`, `D1mw`, `DLmr`, `DLmw`).
    fn of(events: &[(String, u64)]) -> Option<Self> {
        let get = |name: &str| events.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
        Some(Self {
            l1: get("D1mr")? + get("D1mw")?,
            l2: get("DLmr")? + get("DLmw")?,
        })
    }
}

/// The caches `--cache-sim` simulates: `(size in bytes, ways, line size)` of this
/// machine's L1 data cache and of its L2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caches {
    /// The L1 data cache.
    pub l1: (u64, u64, u64),
    /// The L2, simulated as callgrind's last level.
    pub l2: (u64, u64, u64),
}

impl Caches {
    fn of_this_machine() -> anyhow::Result<Self> {
        let cache = |index: u32| -> anyhow::Result<(u64, u64, u64)> {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{index}");
            let read = |f: &str| {
                std::fs::read_to_string(format!("{dir}/{f}")).with_context(|| {
                    format!("--cache-sim reads the caches' shape: cannot read {dir}/{f}")
                })
            };
            let shape = (
                read("size")?,
                read("ways_of_associativity")?,
                read("coherency_line_size")?,
            );
            parse_cache(&shape.0, &shape.1, &shape.2).with_context(|| {
                format!("--cache-sim: {dir} describes no cache valgrind can simulate: {shape:?}")
            })
        };
        // index0 is the L1 data cache and index2 the L2 on x86 Linux.
        Ok(Self {
            l1: cache(0)?,
            l2: cache(2)?,
        })
    }

    /// valgrind's options for them.
    fn args(&self) -> [String; 3] {
        let spec = |(size, ways, line): (u64, u64, u64)| format!("{size},{ways},{line}");
        [
            "--cache-sim=yes".to_owned(),
            format!("--D1={}", spec(self.l1)),
            format!("--LL={}", spec(self.l2)),
        ]
    }
}

/// A cache's `size` (`48K`, `2048K`, `1M`), ways and line size as `/sys` writes them;
/// `None` unless valgrind can simulate it (a power-of-two number of sets).
pub fn parse_cache(size: &str, ways: &str, line: &str) -> Option<(u64, u64, u64)> {
    let size = size.trim();
    let (digits, unit) = match size.strip_suffix('K') {
        Some(d) => (d, 1024),
        None => match size.strip_suffix('M') {
            Some(d) => (d, 1024 * 1024),
            None => (size, 1),
        },
    };
    let size = digits.parse::<u64>().ok()? * unit;
    let ways = ways.trim().parse::<u64>().ok().filter(|w| *w > 0)?;
    let line = line
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|l| l.is_power_of_two())?;
    let sets = size / (ways * line);
    (sets * ways * line == size && sets.is_power_of_two()).then_some((size, ways, line))
}

/// A target: how to start it under callgrind and where to send.
struct Spec {
    name: String,
    command: Command,
    endpoint: Endpoint,
    ready: http::Uri,
    split: bool,
}

async fn measure(
    options: &InstructionOptions,
    bins: &super::Bins,
    dir: &Path,
    caches: Option<&Caches>,
) -> anyhow::Result<Vec<Row>> {
    let client = driver::client();
    let (_sim, fast_addr) = super::start_sim(
        &client,
        &bins.sim,
        false,
        "keypool-sim",
        &dir.join("sim.log"),
    )
    .await?;
    let fast_base = format!("http://{fast_addr}");
    let key = setup::keygen(&bins.keypool)?;
    let mut specs = Vec::new();
    let this = bins.keypool.as_path();
    let mut targets = vec![
        ("keypool rr8, log level info", this, "rr8", "info", true),
        ("keypool rr8, log level warn", this, "rr8", "warn", false),
        (
            "keypool rr1000, log level info",
            this,
            "rr1000",
            "info",
            false,
        ),
    ];
    if let Some(baseline) = &options.baseline {
        targets.extend([
            (
                "baseline rr8, log level info",
                baseline.as_path(),
                "rr8",
                "info",
                false,
            ),
            (
                "baseline rr1000, log level info",
                baseline.as_path(),
                "rr1000",
                "info",
                false,
            ),
        ]);
    }
    for (name, binary, pool, level, split) in targets {
        let file = name.split(',').next().unwrap_or(name).replace(' ', "-");
        let addr = procs::free_addr()?;
        let config = dir.join(format!("{file}-{level}.toml"));
        let text = one_worker(&setup::keypool_config(
            addr,
            &fast_base,
            &fast_base,
            &key.sha256,
        ));
        std::fs::write(&config, text)
            .with_context(|| format!("cannot write {}", config.display()))?;
        let mut command = callgrind(dir, &format!("{file}-{level}"), caches);
        command
            .arg(binary)
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", level);
        specs.push(Spec {
            name: name.to_owned(),
            command,
            endpoint: Endpoint {
                uri: uri(addr, &format!("/{}/{pool}/v1/messages", setup::ORG))?,
                headers: common_headers(("x-api-key", &key.key))?,
                body: body(MODEL, false),
                stream: false,
            },
            ready: uri(addr, "/healthz")?,
            split,
        });
    }
    match super::floor::ensure_debian_program("nginx", "nginx") {
        Ok(nginx) => {
            let addr = procs::free_addr()?;
            let prefix = dir.join("nginx");
            std::fs::create_dir_all(&prefix)
                .with_context(|| format!("cannot create {}", prefix.display()))?;
            let conf = prefix.join("nginx.conf");
            let text = single_process(&super::floor::nginx_config(
                &prefix,
                addr,
                &fast_base,
                &fast_base,
                setup::UPSTREAM_SECRET,
                false,
            ));
            std::fs::write(&conf, text)
                .with_context(|| format!("cannot write {}", conf.display()))?;
            let mut command = callgrind(dir, "nginx", caches);
            command
                .arg(nginx)
                .arg("-p")
                .arg(&prefix)
                .arg("-c")
                .arg(&conf)
                .arg("-e")
                .arg(prefix.join("error.log"));
            specs.push(Spec {
                name: "nginx, 1 worker".to_owned(),
                command,
                endpoint: Endpoint {
                    uri: uri(addr, &format!("{}/v1/messages", super::floor::FAST_PREFIX))?,
                    headers: common_headers(("x-api-key", "unused"))?,
                    body: body(MODEL, false),
                    stream: false,
                },
                ready: uri(addr, "/")?,
                split: false,
            });
        }
        Err(reason) => eprintln!("instructions: nginx skipped: {reason}"),
    }
    let mut rows = Vec::new();
    for spec in specs {
        rows.push(count(&client, spec, options, dir).await?);
    }
    Ok(rows)
}

/// `valgrind --tool=callgrind` with its dumps under `dir`, named after `name`,
/// simulating `caches` if given.
fn callgrind(dir: &Path, name: &str, caches: Option<&Caches>) -> Command {
    let mut c = Command::new("valgrind");
    c.arg("--tool=callgrind")
        .arg(format!(
            "--callgrind-out-file={}",
            dir.join(format!("callgrind.{name}.%p")).display()
        ))
        .arg("--trace-children=no");
    if let Some(caches) = caches {
        c.args(caches.args());
    }
    c
}

/// The bench's keypool config with one serving thread.
fn one_worker(config: &str) -> String {
    config.replacen("[server]\n", "[server]\nworkers = 1\n", 1)
}

/// The floor comparison's nginx config as one process: one worker, no master.
fn single_process(config: &str) -> String {
    config
        .replacen(
            &format!("worker_processes {};", super::floor::PEER_WORKERS),
            "worker_processes 1;",
            1,
        )
        .replacen("master_process on;", "master_process off;", 1)
}

async fn count(
    client: &driver::HttpClient,
    spec: Spec,
    options: &InstructionOptions,
    dir: &Path,
) -> anyhow::Result<Row> {
    let Spec {
        name,
        command,
        endpoint,
        ready,
        split,
    } = spec;
    let log = dir.join(format!("{}.log", name.replace([' ', ','], "_")));
    let mut proc = Proc::spawn(&name, command, &log)?;
    // Under valgrind a start takes seconds.
    wait_http(client, &mut proc, &ready, Duration::from_secs(120)).await?;
    let once = |requests: u64| Bounds {
        requests: Some(requests),
        duration: Duration::from_secs(600),
        pause: Duration::ZERO,
    };
    let warm = driver::closed_loop(client, &endpoint, 1, once(options.warm)).await;
    if warm.ok == 0 {
        bail!(
            "{name} answered no request: {}",
            warm.first_errors.join("; ")
        );
    }
    let pid = proc.pid();
    callgrind_control(pid, "-z")?;
    let out = driver::closed_loop(client, &endpoint, 1, once(options.requests)).await;
    callgrind_control(pid, "-d")?;
    proc.check_alive()?;
    if out.errors > 0 {
        bail!(
            "{name}: {} of {} requests failed: {}",
            out.errors,
            out.errors + out.ok,
            out.first_errors.join("; ")
        );
    }
    let dump = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(&format!(".{pid}.1")))
        })
        .with_context(|| {
            format!(
                "no callgrind dump of {name} (pid {pid}) in {}",
                dir.display()
            )
        })?;
    let text = std::fs::read_to_string(&dump)
        .with_context(|| format!("cannot read {}", dump.display()))?;
    let events = events(&text)
        .with_context(|| format!("{} has no `totals:` or `summary:` line", dump.display()))?;
    let instructions = total(&events)
        .with_context(|| format!("{} counts no instructions (`Ir`)", dump.display()))?;
    let misses = Misses::of(&events);
    let by_origin = if split { by_origin(&text) } else { Vec::new() };
    eprintln!(
        "instructions: {name}: {:.0} per request ({} requests, {})",
        instructions as f64 / out.ok.max(1) as f64,
        out.ok,
        dump.display()
    );
    drop(proc);
    Ok(Row {
        name,
        requests: out.ok,
        instructions,
        by_origin,
        misses,
    })
}

fn callgrind_control(pid: u32, flag: &str) -> anyhow::Result<()> {
    let status = Command::new("callgrind_control")
        .arg(flag)
        .arg(pid.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .context("cannot run callgrind_control")?;
    if !status.success() {
        bail!("callgrind_control {flag} {pid} failed ({status})");
    }
    Ok(())
}

/// The dump's totals by event (`Ir`, and with the cache simulation `D1mr` …): the
/// names of its `events:` line (`Ir` alone when it has none) with the values of its
/// `totals:` line, else of its `summary:` line (an event left off at the end is 0).
pub fn events(dump: &str) -> Option<Vec<(String, u64)>> {
    let line = |prefix: &str| dump.lines().find_map(|l| l.strip_prefix(prefix));
    let names: Vec<String> = line("events:").map_or_else(
        || vec!["Ir".to_owned()],
        |l| l.split_whitespace().map(str::to_owned).collect(),
    );
    let values: Vec<u64> = line("totals:")
        .or_else(|| line("summary:"))?
        .split_whitespace()
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    if values.is_empty() || values.len() > names.len() {
        return None;
    }
    Some(
        names
            .into_iter()
            .zip(values.into_iter().chain(std::iter::repeat(0)))
            .collect(),
    )
}

/// The instructions (`Ir`) of a dump's [`events`].
pub fn total(events: &[(String, u64)]) -> Option<u64> {
    events.iter().find(|(n, _)| n == "Ir").map(|(_, v)| *v)
}

/// Self instructions by where their source line lives, grouped ([`origin`]), largest
/// first. Reads the callgrind format: `fl=` names a function's file, `fi=`/`fe=` the
/// file of the (inlined) lines that follow until the next `fn=`; names are compressed
/// as `(id) name` once and `(id)` after; the cost line after a `calls=` line is the
/// call's inclusive cost, not the caller's own, and is skipped.
pub fn by_origin(dump: &str) -> Vec<(String, u64)> {
    let mut names: HashMap<String, String> = HashMap::new();
    let mut file_of_fn = String::new();
    let mut current = String::new();
    let mut skip_next = false;
    let mut costs: HashMap<String, u64> = HashMap::new();
    let mut name = |spec: &str| -> String {
        let spec = spec.trim();
        match spec.strip_prefix('(').and_then(|s| s.split_once(')')) {
            Some((id, rest)) if !rest.trim().is_empty() => {
                let n = rest.trim().to_owned();
                names.insert(id.to_owned(), n.clone());
                n
            }
            Some((id, _)) => names.get(id).cloned().unwrap_or_default(),
            None => spec.to_owned(),
        }
    };
    for line in dump.lines() {
        if let Some(v) = line.strip_prefix("fl=") {
            file_of_fn = name(v);
            current = file_of_fn.clone();
        } else if let Some(v) = line
            .strip_prefix("fi=")
            .or_else(|| line.strip_prefix("fe="))
        {
            current = name(v);
        } else if line.starts_with("fn=") {
            current = file_of_fn.clone();
        } else if let Some(v) = line
            .strip_prefix("cfi=")
            .or_else(|| line.strip_prefix("cfl="))
        {
            // Defines a compressed name as well.
            name(v);
        } else if line.starts_with("calls=") {
            skip_next = true;
        } else if line
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || matches!(c, '+' | '-' | '*'))
        {
            if std::mem::take(&mut skip_next) {
                continue;
            }
            let cost = line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            *costs.entry(origin(&current)).or_default() += cost;
        }
    }
    let mut out: Vec<_> = costs.into_iter().filter(|(_, c)| *c > 0).collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// Where a source file belongs: a workspace file by its path (`crates/proxy/src/log.rs`),
/// a crates.io dependency by its crate (`tokio`), the standard library by module
/// (`std: core/src/slice`), libc and the rest by file name.
pub fn origin(file: &str) -> String {
    if let Some(i) = file.find("/library/") {
        let rest = &file[i + "/library/".len()..];
        let module: Vec<_> = rest.split('/').take(3).collect();
        return format!("std: {}", module.join("/"));
    }
    if let Some(i) = file.find("/registry/src/") {
        let rest = &file[i + "/registry/src/".len()..];
        let krate = rest.split('/').nth(1).unwrap_or(rest);
        // `tokio-1.54.1` → `tokio`
        let name = match krate.rsplit_once('-') {
            Some((n, v)) if v.starts_with(|c: char| c.is_ascii_digit()) => n,
            _ => krate,
        };
        return name.to_owned();
    }
    for marker in ["/crates/", "/bins/", "/xtask/"] {
        if let Some(i) = file.find(marker) {
            return file[i + 1..].to_owned();
        }
    }
    let base = file.rsplit('/').next().unwrap_or(file);
    format!("other: {base}")
}

/// The cache table: data misses per request of each target in the simulated L1 and
/// L2, and what 1,000 accounts add to them.
pub fn miss_table(rows: &[Row], caches: &Caches) -> String {
    use std::fmt::Write as _;
    let kib = |(size, ways, _): (u64, u64, u64)| format!("{} KiB {ways}-way", size / 1024);
    let mut t = String::new();
    let _ = writeln!(
        t,
        "Data cache misses per request (callgrind's simulation of this machine's L1 data cache, {}, and L2, {})\n\n\
         | target | L1 misses per request | L2 misses per request |\n|---|--:|--:|",
        kib(caches.l1),
        kib(caches.l2)
    );
    let per = |n: u64, r: &Row| n as f64 / r.requests.max(1) as f64;
    for r in rows {
        if let Some(m) = r.misses {
            let _ = writeln!(
                t,
                "| {} | {:.1} | {:.1} |",
                r.name,
                per(m.l1, r),
                per(m.l2, r)
            );
        }
    }
    let find = |prefix: &str| rows.iter().find(|r| r.name.starts_with(prefix));
    for (label, eight, thousand) in [
        ("this tree", "keypool rr8, log level info", "keypool rr1000"),
        ("the baseline", "baseline rr8", "baseline rr1000"),
    ] {
        if let (Some(a), Some(b)) = (find(eight), find(thousand))
            && let (Some(ma), Some(mb)) = (a.misses, b.misses)
        {
            let _ = writeln!(
                t,
                "\n{label}, 1,000 accounts against 8: {:+.1} L1 and {:+.1} L2 misses per request",
                per(mb.l1, b) - per(ma.l1, a),
                per(mb.l2, b) - per(ma.l2, a)
            );
        }
    }
    t
}

/// The table: instructions per request of each target, keypool's against nginx's, the
/// log line's, the 1,000-account pool's, and the largest origins of keypool's.
pub fn table(rows: &[Row], asked: u64) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "Instructions per request (callgrind, one connection, one request at a time, {asked} requests after warm-up)\n\n\
         | target | requests | instructions per request |\n|---|--:|--:|"
    );
    for r in rows {
        let _ = writeln!(
            t,
            "| {} | {} | {:.0} |",
            r.name,
            r.requests,
            r.per_request()
        );
    }
    let find = |prefix: &str| rows.iter().find(|r| r.name.starts_with(prefix));
    let info = find("keypool rr8, log level info");
    let _ = writeln!(t);
    if let (Some(k), Some(n)) = (info, find("nginx")) {
        let _ = writeln!(
            t,
            "keypool (rr8, info) / nginx: {:.2} ×",
            k.per_request() / n.per_request()
        );
    }
    if let (Some(k), Some(w)) = (info, find("keypool rr8, log level warn")) {
        let _ = writeln!(
            t,
            "the info-level request line: {:+.0} instructions per request",
            k.per_request() - w.per_request()
        );
    }
    if let (Some(k), Some(m)) = (info, find("keypool rr1000")) {
        let _ = writeln!(
            t,
            "1,000 accounts against 8: {:+.1} %",
            (m.per_request() / k.per_request() - 1.0) * 100.0
        );
    }
    for (pool, this, base) in [
        ("rr8", "keypool rr8, log level info", "baseline rr8"),
        ("rr1000", "keypool rr1000", "baseline rr1000"),
    ] {
        if let (Some(k), Some(b)) = (find(this), find(base)) {
            let _ = writeln!(
                t,
                "this tree against the baseline, {pool}: {:+.0} instructions per request ({:+.1} %)",
                k.per_request() - b.per_request(),
                (k.per_request() / b.per_request() - 1.0) * 100.0
            );
        }
    }
    if let (Some(b8), Some(b1000)) = (find("baseline rr8"), find("baseline rr1000")) {
        let _ = writeln!(
            t,
            "the baseline's 1,000 accounts against 8: {:+.1} %",
            (b1000.per_request() / b8.per_request() - 1.0) * 100.0
        );
    }
    if let Some(k) = info.filter(|k| !k.by_origin.is_empty()) {
        let _ = writeln!(
            t,
            "\nWhere keypool's instructions go (rr8, info; self instructions by the source of their line, inlined code where it was written)\n\n\
             | origin | per request | share |\n|---|--:|--:|"
        );
        let all: u64 = k.by_origin.iter().map(|(_, c)| c).sum();
        for (origin, cost) in k.by_origin.iter().take(30) {
            let _ = writeln!(
                t,
                "| {origin} | {:.0} | {:.1} % |",
                *cost as f64 / k.requests.max(1) as f64,
                *cost as f64 * 100.0 / all.max(1) as f64
            );
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> anyhow::Result<InstructionOptions> {
        InstructionOptions::parse(&a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn options_take_counts_and_refuse_anything_else() {
        assert_eq!(
            args(&[]).unwrap(),
            InstructionOptions {
                requests: 8_192,
                warm: 14_336,
                baseline: None,
                cache_sim: false,
            }
        );
        let o = args(&[
            "--requests",
            "50",
            "--warm",
            "7",
            "--baseline-binary",
            "/b/keypool",
            "--cache-sim",
        ])
        .unwrap();
        assert!(o.cache_sim);
        assert_eq!((o.requests, o.warm), (50, 7));
        assert_eq!(o.baseline, Some(PathBuf::from("/b/keypool")));
        for bad in [
            &["--requests"][..],
            &["--baseline-binary"],
            &["--requests", "0"],
            &["--requests", "x"],
            &["--warm", "-1"],
            &["--rounds", "3"],
        ] {
            let e = args(bad).unwrap_err().to_string();
            assert!(e.contains(USAGE), "{bad:?}: {e}");
        }
    }

    fn total_of(dump: &str) -> Option<u64> {
        total(&events(dump)?)
    }

    #[test]
    fn the_total_is_the_totals_line_or_else_the_summary() {
        assert_eq!(
            total_of("summary: 10\nfn=(1) a\n0 10\ntotals: 12\n"),
            Some(12)
        );
        assert_eq!(
            total_of("events: Ir\nsummary: 1259108821\n"),
            Some(1_259_108_821)
        );
        assert_eq!(total_of("events: Ir\n"), None);
    }

    /// With the cache simulation a dump counts several events: each total is found
    /// by its name, an event left off the end of the line is 0, and the misses are
    /// the reads' and the writes'.
    #[test]
    fn the_cache_simulation_totals_are_read_by_event() {
        let dump = "events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\nsummary: 1\n\
                    totals: 1000 300 200 5 40 2 1 7 3\n";
        let e = events(dump).unwrap();
        assert_eq!(e.len(), 9);
        assert_eq!(total(&e), Some(1000));
        assert_eq!(Misses::of(&e), Some(Misses { l1: 42, l2: 10 }));
        let short = events("events: Ir D1mr D1mw DLmr DLmw\ntotals: 9 4\n").unwrap();
        assert_eq!(Misses::of(&short), Some(Misses { l1: 4, l2: 0 }));
        // Without the simulation: instructions only, no misses.
        let plain = events("events: Ir\ntotals: 12\n").unwrap();
        assert_eq!(Misses::of(&plain), None);
        assert_eq!(events("events: Ir\ntotals: 1 2\n"), None);
    }

    #[test]
    fn caches_are_taken_as_sys_writes_them_when_valgrind_can_simulate_them() {
        assert_eq!(parse_cache("48K\n", "12\n", "64\n"), Some((49_152, 12, 64)));
        assert_eq!(parse_cache("2048K", "16", "64"), Some((2_097_152, 16, 64)));
        assert_eq!(parse_cache("1M", "16", "64"), Some((1_048_576, 16, 64)));
        // 1.25 MiB, 20-way: 1,024 sets.
        assert_eq!(parse_cache("1280K", "20", "64"), Some((1_310_720, 20, 64)));
        // 12 MiB, 12-way: 16,384 sets; 36 MiB, 12-way: not a power of two.
        assert!(parse_cache("12288K", "12", "64").is_some());
        assert_eq!(parse_cache("36864K", "12", "64"), None);
        assert_eq!(parse_cache("48K", "0", "64"), None);
        assert_eq!(parse_cache("big", "8", "64"), None);
        let c = Caches {
            l1: (49_152, 12, 64),
            l2: (2_097_152, 16, 64),
        };
        assert_eq!(
            c.args(),
            ["--cache-sim=yes", "--D1=49152,12,64", "--LL=2097152,16,64"]
        );
    }

    #[test]
    fn the_miss_table_shows_what_1000_accounts_add() {
        let row = |name: &str, l1: u64, l2: u64| Row {
            name: name.to_owned(),
            requests: 10,
            instructions: 1,
            by_origin: Vec::new(),
            misses: Some(Misses { l1, l2 }),
        };
        let caches = Caches {
            l1: (49_152, 12, 64),
            l2: (2_097_152, 16, 64),
        };
        let t = miss_table(
            &[
                row("keypool rr8, log level info", 1_000, 20),
                row("keypool rr1000, log level info", 1_500, 95),
            ],
            &caches,
        );
        assert!(
            t.contains("L1 data cache, 48 KiB 12-way, and L2, 2048 KiB 16-way"),
            "{t}"
        );
        assert!(
            t.contains("| keypool rr1000, log level info | 150.0 | 9.5 |"),
            "{t}"
        );
        assert!(
            t.contains(
                "this tree, 1,000 accounts against 8: +50.0 L1 and +7.5 L2 misses per request"
            ),
            "{t}"
        );
        assert!(!t.contains("the baseline"), "{t}");
    }

    /// Compressed names, inlined files, and a call's inclusive cost not counted as the
    /// caller's own.
    #[test]
    fn self_costs_go_to_the_file_of_their_line() {
        let dump = "\
events: Ir
ob=(1) /bin/keypool
fl=(1) /work/main/crates/proxy/src/log.rs
fn=(1) keypool_proxy::log::emit
10 100
fi=(2) /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/tokio-1.54.1/src/io.rs
+2 40
fe=(1)
-1 5
cfi=(3) /rustc/abc/library/core/src/slice/mod.rs
cfn=(2) core::slice::copy
calls=3 7
* 1000
* 6
fl=(3)
fn=(2)
7 30
fl=(4) ./string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S
fn=(3) __memmove
0 9
totals: 190
";
        let got = by_origin(dump);
        assert_eq!(
            got,
            vec![
                ("crates/proxy/src/log.rs".to_owned(), 111),
                ("tokio".to_owned(), 40),
                ("std: core/src/slice".to_owned(), 30),
                ("other: memmove-vec-unaligned-erms.S".to_owned(), 9),
            ]
        );
        // Every instruction counted once: the self costs add up to the total.
        let sum: u64 = got.iter().map(|(_, c)| c).sum();
        assert_eq!(Some(sum), total_of(dump));
    }

    #[test]
    fn origins_group_by_crate_workspace_file_and_std_module() {
        assert_eq!(
            origin(
                "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/httparse-1.10.1/src/lib.rs"
            ),
            "httparse"
        );
        assert_eq!(
            origin("/root/.cargo/registry/src/index.crates.io-x/libmimalloc-sys-0.1.49/c_src/a.c"),
            "libmimalloc-sys"
        );
        assert_eq!(
            origin("/rustc/59807616e1fa/library/alloc/src/vec/mod.rs"),
            "std: alloc/src/vec"
        );
        assert_eq!(
            origin("/work/main/crates/providers/src/json_scan.rs"),
            "crates/providers/src/json_scan.rs"
        );
        assert_eq!(origin("???"), "other: ???");
    }

    #[test]
    fn the_configs_run_as_one_thread_and_one_process() {
        let k = one_worker(&setup::keypool_config(
            "127.0.0.1:1".parse().unwrap(),
            "http://127.0.0.1:2",
            "http://127.0.0.1:3",
            &"a".repeat(64),
        ));
        assert!(k.contains("[server]\nworkers = 1\nlisten"), "{k}");
        let n = single_process(&super::super::floor::nginx_config(
            Path::new("/tmp/p"),
            "127.0.0.1:1".parse().unwrap(),
            "http://127.0.0.1:2",
            "http://127.0.0.1:3",
            "sk",
            false,
        ));
        assert!(n.contains("worker_processes 1;"), "{n}");
        assert!(n.contains("master_process off;"), "{n}");
        assert!(!n.contains("master_process on;"), "{n}");
    }

    #[test]
    fn the_table_compares_keypool_with_nginx_and_itself() {
        let row = |name: &str, per: u64, by: Vec<(String, u64)>| Row {
            name: name.to_owned(),
            requests: 10,
            instructions: per * 10,
            by_origin: by,
            misses: None,
        };
        let t = table(
            &[
                row(
                    "keypool rr8, log level info",
                    48_000,
                    vec![("tokio".into(), 30_000), ("httparse".into(), 10_000)],
                ),
                row("keypool rr8, log level warn", 43_000, vec![]),
                row("keypool rr1000, log level info", 50_400, vec![]),
                row("nginx, 1 worker", 24_000, vec![]),
            ],
            10,
        );
        assert!(
            t.contains("| keypool rr8, log level info | 10 | 48000 |"),
            "{t}"
        );
        assert!(t.contains("keypool (rr8, info) / nginx: 2.00 ×"), "{t}");
        assert!(
            t.contains("the info-level request line: +5000 instructions"),
            "{t}"
        );
        assert!(t.contains("1,000 accounts against 8: +5.0 %"), "{t}");
        assert!(t.contains("| tokio | 3000 | 75.0 % |"), "{t}");
        assert!(!t.contains("baseline"), "{t}");
    }

    #[test]
    fn the_table_compares_this_tree_with_the_baseline_binary() {
        let row = |name: &str, per: u64| Row {
            name: name.to_owned(),
            requests: 4,
            instructions: per * 4,
            by_origin: Vec::new(),
            misses: None,
        };
        let t = table(
            &[
                row("keypool rr8, log level info", 47_000),
                row("keypool rr1000, log level info", 47_470),
                row("baseline rr8, log level info", 47_200),
                row("baseline rr1000, log level info", 49_088),
            ],
            4,
        );
        assert!(
            t.contains(
                "this tree against the baseline, rr8: -200 instructions per request (-0.4 %)"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "this tree against the baseline, rr1000: -1618 instructions per request (-3.3 %)"
            ),
            "{t}"
        );
        assert!(
            t.contains("the baseline's 1,000 accounts against 8: +4.0 %"),
            "{t}"
        );
        assert!(t.contains("1,000 accounts against 8: +1.0 %"), "{t}");
    }
}
