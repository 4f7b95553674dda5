//! `cargo xtask ab REV [--against REV2] [--rounds N] [--seconds S] [--pool NAME]
//! [--concurrency C]`: this tree's keypool (or commit `REV2`'s) against the keypool of
//! commit `REV`, side by side, in one run. `cargo xtask ab --limits [--against REV2] …`
//! measures one binary (this tree's, or `REV2`'s) twice instead: without caller limits
//! (the baseline) and with every SPEC 12 limit on the bench key (`current`).
//! `cargo xtask ab --pool-against NAME [--pool NAME] …` also measures one binary twice:
//! sending to the `--pool` (the baseline, `rr8` by default) and to the pool `NAME`
//! (`current`): issue 22's "1,000 accounts within 5 % of 8", paired round by round.
//!
//! The question it answers is "what did this change cost on the hot path?", on a shared
//! and noisy machine, so it measures the two binaries *alternately* (A B, B A, A B, …),
//! in front of the same simulator, with the same generated configuration (the
//! `cargo xtask bench` pools), and reports each round and the medians: requests per
//! second of a closed loop at concurrency `C` (16) and CPU time per request of the
//! keypool process group (`utime + stime` from `/proc`, the figure noise affects
//! least).
//!
//! The baseline (and `--against`) is built from `git archive REV` into `target/bench/ab/src-<commit>`
//! with its own target directory (`target/bench/ab/target`, so the two builds never
//! evict each other); both are kept for the next run. The table goes to stdout and
//! `target/bench/ab.json`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};

use super::driver::{self, Bounds, Endpoint, HttpClient};
use super::floor::median;
use super::procs::{self, Proc};
use super::{MODEL, body, common_headers, setup, uri, wait_http};

/// What `cargo xtask ab` was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbOptions {
    /// The baseline commit (anything `git rev-parse` takes).
    pub rev: String,
    /// The commit measured against it (default: this tree).
    pub against: Option<String>,
    /// Rounds; each measures both binaries once.
    pub rounds: u32,
    /// Length of one measurement.
    pub seconds: u64,
    /// The pool of the generated config to send to.
    pub pool: String,
    /// Closed-loop concurrency.
    pub concurrency: usize,
    /// One binary, without and with caller limits, instead of two commits.
    pub limits: bool,
    /// One binary, sending to `pool` and to this pool, instead of two commits.
    pub pool_against: Option<String>,
}

const USAGE: &str = "cargo xtask ab (REV | --limits | --pool-against NAME) [--against REV2] [--rounds N] [--seconds S] [--pool NAME] [--concurrency C]";

impl AbOptions {
    /// Parses the arguments after `ab`.
    pub fn parse(args: &[String]) -> anyhow::Result<Self> {
        let mut o = Self {
            rev: String::new(),
            against: None,
            rounds: 6,
            seconds: 5,
            pool: "rr8".into(),
            concurrency: 16,
            limits: false,
            pool_against: None,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .cloned()
                    .with_context(|| format!("{name} needs a value ({USAGE})"))
            };
            match a.as_str() {
                "--against" => o.against = Some(value("--against")?),
                "--limits" => o.limits = true,
                "--rounds" => o.rounds = number(&value("--rounds")?, "--rounds", 1, 100)?,
                "--seconds" => o.seconds = number(&value("--seconds")?, "--seconds", 1, 600)?,
                "--concurrency" => {
                    o.concurrency = number(&value("--concurrency")?, "--concurrency", 1, 1024)?;
                }
                "--pool" => o.pool = bench_pool("--pool", value("--pool")?)?,
                "--pool-against" => {
                    o.pool_against = Some(bench_pool("--pool-against", value("--pool-against")?)?);
                }
                flag if flag.starts_with('-') => bail!("unknown option {flag:?} ({USAGE})"),
                rev if o.rev.is_empty() => o.rev = rev.to_owned(),
                extra => bail!("one baseline only, got {:?} and {extra:?} ({USAGE})", o.rev),
            }
        }
        if o.limits && !o.rev.is_empty() {
            bail!(
                "--limits measures one binary with and without limits: no baseline commit ({USAGE})"
            );
        }
        if o.pool_against.is_some() && (o.limits || !o.rev.is_empty()) {
            bail!(
                "--pool-against measures one binary on two pools: no baseline commit and no --limits ({USAGE})"
            );
        }
        if o.rev.is_empty() && !o.limits && o.pool_against.is_none() {
            bail!("which commit is the baseline? ({USAGE})");
        }
        Ok(o)
    }

    /// The pool the current side sends to.
    fn current_pool(&self) -> &str {
        self.pool_against.as_deref().unwrap_or(&self.pool)
    }
}

/// `pool` when it is one of the generated config's pools.
fn bench_pool(option: &str, pool: String) -> anyhow::Result<String> {
    if !setup::POOLS.iter().any(|p| p.name == pool) {
        let names: Vec<&str> = setup::POOLS.iter().map(|p| p.name).collect();
        bail!("{option} {pool:?} is not one of {}", names.join(", "));
    }
    Ok(pool)
}

fn number<T: TryFrom<u64>>(text: &str, name: &str, min: u64, max: u64) -> anyhow::Result<T> {
    text.parse::<u64>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .and_then(|n| T::try_from(n).ok())
        .with_context(|| format!("{name} {text:?} must be a whole number from {min} to {max}"))
}

/// Entry point of `cargo xtask ab`.
pub fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let options = AbOptions::parse(args)?;
    let Some((target, bins)) = super::release_build(root, "ab", args)? else {
        return Ok(());
    };
    let dir = target.join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (current_name, bins) = match &options.against {
        None => ("this tree".to_owned(), bins),
        Some(rev) => {
            let (commit, keypool) = build_baseline(root, &target, rev)?;
            (commit[..12].to_owned(), super::Bins { keypool, ..bins })
        }
    };
    let (commit, baseline) = if options.limits {
        let name = format!("{current_name} without limits");
        (name, bins.keypool.clone())
    } else if options.pool_against.is_some() {
        let name = format!("{current_name}, pool {}", options.pool);
        (name, bins.keypool.clone())
    } else {
        build_baseline(root, &target, &options.rev)?
    };
    let current_name = if options.limits {
        format!("{current_name} with every caller limit")
    } else if let Some(pool) = &options.pool_against {
        format!("{current_name}, pool {pool}")
    } else {
        current_name
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let rows = runtime.block_on(measure(&options, &bins, &baseline, &dir))?;
    let report = Report {
        options: &options,
        commit: &commit,
        current: &current_name,
        rows: &rows,
    };
    println!("{}", report.table());
    let json = dir.join("ab.json");
    std::fs::write(&json, report.json().to_string())
        .with_context(|| format!("cannot write {}", json.display()))?;
    eprintln!("ab: wrote {}", json.display());
    Ok(())
}

/// Extracts `rev` with `git archive` and builds its keypool in release mode; the full
/// commit id and the binary (copied to `target/bench/ab/keypool-<commit>`).
fn build_baseline(root: &Path, target: &Path, rev: &str) -> anyhow::Result<(String, PathBuf)> {
    let out = Command::new("git")
        .current_dir(root)
        .args(["rev-parse", "--verify", &format!("{rev}^{{commit}}")])
        .output()
        .context("cannot run git rev-parse")?;
    if !out.status.success() {
        bail!("{rev:?} is not a commit of this repository");
    }
    let commit = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let ab = target.join("bench").join("ab");
    let src = ab.join(format!("src-{}", &commit[..12]));
    if !src.join("Cargo.toml").is_file() {
        std::fs::create_dir_all(&src)
            .with_context(|| format!("cannot create {}", src.display()))?;
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "git -C '{}' archive '{commit}' | tar -x -C '{}'",
                root.display(),
                src.display()
            ))
            .status()
            .context("cannot run git archive")?;
        if !status.success() {
            let _ = std::fs::remove_dir_all(&src);
            bail!("git archive {commit} failed ({status})");
        }
    }
    let build_target = ab.join("target");
    // Cargo decides what to rebuild by file times, and `git archive` gives every file
    // its commit's time: a commit older than the one built last would look fresh and
    // the other commit's binary would be measured twice. So when the shared target
    // directory last built another commit, this commit's sources are made newer.
    let last = build_target.join("ab-last-built");
    if std::fs::read_to_string(&last).ok().as_deref() != Some(commit.as_str()) {
        touch_tree(&src, std::time::SystemTime::now())?;
    }
    eprintln!(
        "ab: building the baseline {} in {}",
        &commit[..12],
        src.display()
    );
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", &build_target)
        .args(["build", "--release", "-p", "keypool"])
        .status()
        .context("cannot run cargo")?;
    if !status.success() {
        bail!("the baseline {commit} does not build ({status})");
    }
    std::fs::write(&last, &commit).with_context(|| format!("cannot write {}", last.display()))?;
    // Both commits build into one target directory: keep this one's binary aside.
    let kept = ab.join(format!("keypool-{}", &commit[..12]));
    std::fs::copy(build_target.join("release").join("keypool"), &kept)
        .with_context(|| format!("cannot copy the built keypool to {}", kept.display()))?;
    Ok((commit, kept))
}

/// Sets the modification time of every file under `dir` to `now`.
fn touch_tree(dir: &Path, now: std::time::SystemTime) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            touch_tree(&path, now)?;
        } else {
            std::fs::File::options()
                .append(true)
                .open(&path)
                .and_then(|f| f.set_modified(now))
                .with_context(|| format!("cannot touch {}", path.display()))?;
        }
    }
    Ok(())
}

/// One measurement of one binary.
#[derive(Debug, Clone, Copy)]
struct Row {
    round: u32,
    /// `false`: the baseline; `true`: this tree.
    current: bool,
    requests: u64,
    errors: u64,
    elapsed: Duration,
    cpu_ticks: u64,
    ticks_per_second: u64,
}

impl Row {
    fn rate(&self) -> f64 {
        super::stats::rate(self.requests, self.elapsed)
    }

    /// CPU µs per request.
    fn cpu_us(&self) -> Option<f64> {
        super::stats::cpu_seconds_per_1k(self.cpu_ticks, self.ticks_per_second, self.requests)
            .map(|s| s * 1000.0)
    }
}

/// A keypool under test.
struct Gateway {
    proc: Proc,
    endpoint: Endpoint,
}

/// One side of the comparison: its name, its binary, whether its config has every
/// caller limit on the bench key, and the pool it is sent to.
struct Side<'a> {
    name: &'a str,
    binary: &'a Path,
    limits: bool,
    pool: &'a str,
}

async fn start_gateway(
    client: &HttpClient,
    side: Side<'_>,
    dir: &Path,
    fast_base: &str,
    key: &setup::LbKey,
) -> anyhow::Result<Gateway> {
    let Side {
        name,
        binary,
        limits,
        pool,
    } = side;
    let addr = procs::free_addr()?;
    let config = dir.join(format!("ab-{name}.toml"));
    // Both pools' upstream is the one fast simulator (the slow pools are not measured).
    let mut text = setup::keypool_config(addr, fast_base, fast_base, &key.sha256);
    if limits {
        text = setup::with_caller_limits(&text);
    }
    std::fs::write(&config, text).with_context(|| format!("cannot write {}", config.display()))?;
    let mut serve = Command::new(binary);
    serve.arg("serve").arg("--config").arg(&config);
    let mut proc = Proc::spawn(
        &format!("keypool ({name})"),
        serve,
        &dir.join(format!("ab-{name}.log")),
    )?;
    wait_http(
        client,
        &mut proc,
        &uri(addr, "/healthz")?,
        Duration::from_secs(20),
    )
    .await?;
    let endpoint = Endpoint {
        uri: uri(addr, &format!("/{}/{pool}/v1/messages", setup::ORG))?,
        headers: common_headers(("x-api-key", &key.key))?,
        body: body(MODEL, false),
        stream: false,
    };
    let check = driver::closed_loop(
        client,
        &endpoint,
        1,
        Bounds {
            requests: Some(1),
            duration: Duration::from_secs(30),
            pause: Duration::ZERO,
        },
    )
    .await;
    if check.ok != 1 {
        bail!(
            "keypool ({name}) does not answer: {}",
            check.first_errors.join("; ")
        );
    }
    Ok(Gateway { proc, endpoint })
}

async fn measure(
    options: &AbOptions,
    bins: &super::Bins,
    baseline: &Path,
    dir: &Path,
) -> anyhow::Result<Vec<Row>> {
    let client = driver::client();
    let ticks_per_second = procs::clock_ticks_per_second();
    let (_sim, fast_addr) = super::start_sim(
        &client,
        &bins.sim,
        false,
        "keypool-sim",
        &dir.join("ab-sim.log"),
    )
    .await?;
    let fast_base = format!("http://{fast_addr}");
    let key = setup::keygen(&bins.keypool)?;
    let mut gateways = [
        start_gateway(
            &client,
            Side {
                name: "baseline",
                binary: baseline,
                limits: false,
                pool: &options.pool,
            },
            dir,
            &fast_base,
            &key,
        )
        .await?,
        start_gateway(
            &client,
            Side {
                name: "current",
                binary: if options.pool_against.is_some() {
                    baseline
                } else {
                    &bins.keypool
                },
                limits: options.limits,
                pool: options.current_pool(),
            },
            dir,
            &fast_base,
            &key,
        )
        .await?,
    ];
    let warm = Bounds {
        requests: Some(500),
        duration: Duration::from_secs(10),
        pause: Duration::ZERO,
    };
    let run = Bounds {
        requests: None,
        duration: Duration::from_secs(options.seconds),
        pause: Duration::ZERO,
    };
    for g in &gateways {
        driver::closed_loop(&client, &g.endpoint, options.concurrency, warm).await;
    }
    let mut rows = Vec::new();
    for round in 1..=options.rounds {
        // A B, then B A: neither binary always goes first.
        let order = if round % 2 == 1 { [0, 1] } else { [1, 0] };
        for i in order {
            let g = &mut gateways[i];
            g.proc.check_alive()?;
            let before = procs::group_usage(g.proc.pid());
            let out = driver::closed_loop(&client, &g.endpoint, options.concurrency, run).await;
            let after = procs::group_usage(g.proc.pid());
            let row = Row {
                round,
                current: i == 1,
                requests: out.ok,
                errors: out.errors,
                elapsed: out.elapsed,
                cpu_ticks: after.cpu_ticks.saturating_sub(before.cpu_ticks),
                ticks_per_second,
            };
            eprintln!(
                "ab: round {round} {:<8} {:>8.0} req/s  {:>6.1} µs CPU/request{}",
                if row.current { "current" } else { "baseline" },
                row.rate(),
                row.cpu_us().unwrap_or(f64::NAN),
                if out.errors > 0 {
                    format!("  ({} errors: {})", out.errors, out.first_errors.join("; "))
                } else {
                    String::new()
                }
            );
            rows.push(row);
        }
    }
    Ok(rows)
}

/// A commit id cut to 12 characters; any other name whole.
fn short(name: &str) -> &str {
    if name.len() == 40 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
        &name[..12]
    } else {
        name
    }
}

struct Report<'a> {
    options: &'a AbOptions,
    commit: &'a str,
    /// What was measured against the baseline: `this tree` or a commit.
    current: &'a str,
    rows: &'a [Row],
}

impl Report<'_> {
    fn medians(&self, current: bool) -> (Option<f64>, Option<f64>) {
        let mine = || self.rows.iter().filter(move |r| r.current == current);
        (
            median(mine().map(Row::rate).collect()),
            median(mine().filter_map(Row::cpu_us).collect()),
        )
    }

    /// The median over the rounds of each round's current / baseline − 1 (req/s, CPU
    /// per request): the two measurements of one round are seconds apart, so the
    /// machine's slow drift, which moves both, cancels in the ratio.
    fn paired(&self) -> (Option<f64>, Option<f64>) {
        let pairs = || {
            (1..=self.options.rounds).filter_map(|round| {
                let find = |current| {
                    self.rows
                        .iter()
                        .find(|r| r.round == round && r.current == current)
                };
                Some((find(false)?, find(true)?))
            })
        };
        let change = |c: f64, b: f64| (b > 0.0).then(|| c / b - 1.0);
        (
            median(
                pairs()
                    .filter_map(|(b, c)| change(c.rate(), b.rate()))
                    .collect(),
            ),
            median(
                pairs()
                    .filter_map(|(b, c)| change(c.cpu_us()?, b.cpu_us()?))
                    .collect(),
            ),
        )
    }

    fn table(&self) -> String {
        use std::fmt::Write as _;
        let o = self.options;
        let mut t = format!(
            "cargo xtask ab {}{} --rounds {} --seconds {} --pool {} --concurrency {}\n\
             baseline {} against {}; closed loop at concurrency {}, {} s per measurement\n\n\
             | round | baseline req/s | current req/s | baseline CPU µs/req | current CPU µs/req |\n\
             | --- | --- | --- | --- | --- |\n",
            match &o.pool_against {
                _ if o.limits => "--limits".to_owned(),
                Some(pool) => format!("--pool-against {pool}"),
                None => o.rev.clone(),
            },
            o.against
                .as_ref()
                .map_or_else(String::new, |a| format!(" --against {a}")),
            o.rounds,
            o.seconds,
            o.pool,
            o.concurrency,
            short(self.commit),
            self.current,
            o.concurrency,
            o.seconds
        );
        let cpu = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
        for round in 1..=o.rounds {
            let find = |current| {
                self.rows
                    .iter()
                    .find(|r| r.round == round && r.current == current)
            };
            if let (Some(b), Some(c)) = (find(false), find(true)) {
                let _ = writeln!(
                    t,
                    "| {round} | {:.0} | {:.0} | {} | {} |",
                    b.rate(),
                    c.rate(),
                    cpu(b.cpu_us()),
                    cpu(c.cpu_us())
                );
            }
        }
        let (b_rate, b_cpu) = self.medians(false);
        let (c_rate, c_cpu) = self.medians(true);
        let pct = |c: Option<f64>, b: Option<f64>| match (c, b) {
            (Some(c), Some(b)) if b > 0.0 => format!("{:+.1} %", (c - b) * 100.0 / b),
            _ => "-".to_owned(),
        };
        let _ = writeln!(
            t,
            "| **median** | **{:.0}** | **{:.0}** ({}) | **{}** | **{}** ({}) |",
            b_rate.unwrap_or(0.0),
            c_rate.unwrap_or(0.0),
            pct(c_rate, b_rate),
            cpu(b_cpu),
            cpu(c_cpu),
            pct(c_cpu, b_cpu)
        );
        let (rate_change, cpu_change) = self.paired();
        let ratio = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:+.1} %", v * 100.0));
        let _ = writeln!(
            t,
            "| **median of the rounds' changes** | | **{}** | | **{}** |",
            ratio(rate_change),
            ratio(cpu_change)
        );
        let errors: u64 = self.rows.iter().map(|r| r.errors).sum();
        if errors > 0 {
            let _ = writeln!(t, "\n{errors} failed requests (see the progress lines)");
        }
        t
    }

    fn json(&self) -> serde_json::Value {
        let (b_rate, b_cpu) = self.medians(false);
        let (c_rate, c_cpu) = self.medians(true);
        serde_json::json!({
            "baseline": self.commit,
            "current": self.current,
            "pool": self.options.pool,
            "current_pool": self.options.current_pool(),
            "concurrency": self.options.concurrency,
            "seconds": self.options.seconds,
            "rounds": self.rows.iter().map(|r| serde_json::json!({
                "round": r.round,
                "binary": if r.current { "current" } else { "baseline" },
                "requests": r.requests,
                "errors": r.errors,
                "req_per_s": r.rate(),
                "cpu_us_per_request": r.cpu_us(),
            })).collect::<Vec<_>>(),
            "median": {
                "baseline": {"req_per_s": b_rate, "cpu_us_per_request": b_cpu},
                "current": {"req_per_s": c_rate, "cpu_us_per_request": c_cpu},
            },
            "median_round_change": {
                "req_per_s": self.paired().0,
                "cpu_us_per_request": self.paired().1,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    /// An archived baseline's files get one time, so that cargo cannot take a commit
    /// older than the last one built for fresh.
    #[test]
    fn every_file_of_a_tree_is_touched() {
        let dir = std::env::temp_dir().join(format!("xtask-ab-touch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("crates/a/src")).unwrap();
        std::fs::write(dir.join("Cargo.toml"), "").unwrap();
        std::fs::write(dir.join("crates/a/src/lib.rs"), "").unwrap();
        let at = std::time::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        touch_tree(&dir, at).unwrap();
        for file in ["Cargo.toml", "crates/a/src/lib.rs"] {
            let modified = std::fs::metadata(dir.join(file))
                .unwrap()
                .modified()
                .unwrap();
            assert_eq!(modified, at, "{file}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The paired figure is the median of each round's own change, whatever the
    /// rounds' drift.
    #[test]
    fn the_rounds_changes_are_paired() {
        let options = AbOptions::parse(&args(&["A", "--rounds", "3"])).unwrap();
        let row = |round, current, cpu_ticks| Row {
            round,
            current,
            requests: 10_000,
            errors: 0,
            elapsed: Duration::from_secs(1),
            cpu_ticks,
            ticks_per_second: 100,
        };
        // CPU µs per request = ticks here; the machine gets 2× and 4× slower.
        let rows = [
            row(1, false, 10),
            row(1, true, 11),
            row(2, true, 22),
            row(2, false, 20),
            row(3, false, 40),
            row(3, true, 40),
        ];
        let report = Report {
            options: &options,
            commit: "0123456789ab",
            current: "this tree",
            rows: &rows,
        };
        let (rate, cpu) = report.paired();
        assert_eq!(rate, Some(0.0));
        assert!((cpu.unwrap() - 0.1).abs() < 1e-9, "{cpu:?}");
        assert!(
            report
                .table()
                .contains("| **median of the rounds' changes** | | **+0.0 %** | | **+10.0 %** |")
        );
    }

    #[test]
    fn options() {
        let o = AbOptions::parse(&args(&["HEAD~1", "--rounds", "4", "--pool", "rr1000"])).unwrap();
        assert_eq!(o.against, None);
        let a = AbOptions::parse(&args(&["A", "--against", "B"])).unwrap();
        assert_eq!((a.rev.as_str(), a.against.as_deref()), ("A", Some("B")));
        assert_eq!((o.rev.as_str(), o.rounds, o.seconds), ("HEAD~1", 4, 5));
        assert_eq!((o.pool.as_str(), o.concurrency), ("rr1000", 16));
        assert!(AbOptions::parse(&args(&[])).is_err());
        assert!(AbOptions::parse(&args(&["a", "b"])).is_err());
        assert!(AbOptions::parse(&args(&["a", "--rounds", "0"])).is_err());
        let l = AbOptions::parse(&args(&["--limits", "--rounds", "8"])).unwrap();
        assert!(l.limits && l.rev.is_empty() && l.rounds == 8);
        assert!(AbOptions::parse(&args(&["HEAD", "--limits"])).is_err());
        assert!(AbOptions::parse(&args(&[])).is_err());
        assert!(AbOptions::parse(&args(&["a", "--pool", "nope"])).is_err());
        assert!(AbOptions::parse(&args(&["a", "--seconds"])).is_err());
        let p = AbOptions::parse(&args(&["--pool-against", "rr1000"])).unwrap();
        assert_eq!(
            (p.pool.as_str(), p.current_pool(), p.rev.as_str()),
            ("rr8", "rr1000", "")
        );
        assert_eq!(o.current_pool(), "rr1000");
        assert!(AbOptions::parse(&args(&["--pool-against", "nope"])).is_err());
        assert!(AbOptions::parse(&args(&["HEAD", "--pool-against", "rr1000"])).is_err());
        assert!(AbOptions::parse(&args(&["--limits", "--pool-against", "rr1000"])).is_err());
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![f64::NAN]), None);
    }
}
