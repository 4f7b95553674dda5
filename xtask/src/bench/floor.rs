//! The floor comparison of `cargo xtask bench --peers` (or `--floor` alone): keypool
//! beside nginx and HAProxy, the physical floor of an HTTP/1.1 proxy on this machine,
//! each forwarding to the same simulators and setting `x-api-key`.
//!
//! Rounds are interleaved (every target once per scenario, the order rotated each
//! round) so that a drift of the shared machine cannot masquerade as a difference; the
//! medians over the rounds are reported, and each target of the issue is judged by the
//! median of its two measurements' ratio (or, for an added latency or cost, their
//! difference) within a round: the paired comparison. The one exception is the added
//! streaming TTFT: a round has only ~235 streams per target, so its p99 is taken over
//! the streams of every round pooled, each worker's first stream of a round apart
//! (over a connection the round opens: [`driver::Outcome::first_net_ttft`]; shown in
//! the table beside the rest for every target). CPU per request (CPU time of the target's
//! process group over the requests it served) is the headline: it is far less noisy
//! than latency on a shared machine.
//!
//! Scenarios: closed loops at concurrency 16 and 64, the same at 64 while two busy
//! loops (started and killed by the bench) share the CPUs, and 64-chunk streams at
//! concurrency 16, the workers' first streams [`STREAM_STAGGER`] apart (net TTFT and
//! inter-chunk gaps against the simulator alone; the table also lists each target's
//! slowest streams with where they fell in their run). keypool
//! also runs with 1,000 accounts and at log level `warn`, at concurrency 16. Around each
//! of keypool's samples its `/metrics` is read ([`Threads`]): how its connections sat
//! on its worker threads and each worker's load after the sample, listed beside each
//! round's CPU per request. Around every sample the bench also reads where the
//! machine's CPUs went ([`Machine`]): the simulator's and the driver's CPU per request
//! and the share of the time the CPUs idled or were stolen, so that req/s can be set
//! against all that a request costs the machine, not only the target's share.
//!
//! The pure parts (configs, medians, verdicts, table) are unit-tested here; the run
//! itself is [`run`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::driver::{self, Bounds, Endpoint, HttpClient, SlowStream};
use super::procs::{self, Proc};
use super::report::{TargetInfo, Verdict};
use super::stats::Percentiles;

/// nginx in front of the simulators.
pub const NGINX: &str = "nginx";
/// HAProxy in front of the simulators.
pub const HAPROXY: &str = "haproxy";
/// nginx as [`NGINX`], writing an access log line per request (buffered as keypool
/// buffers its request lines): not a target of the issue's, it says what logging each
/// request costs a peer, beside what keypool's request line costs ([`KEYPOOL_WARN`]).
pub const NGINX_LOG: &str = "nginx-access-log";
/// keypool, `rr8`, default log level (`info`).
pub const KEYPOOL: &str = "keypool-rr8";
/// keypool, `rr8`, `RUST_LOG=warn`: no request log line.
pub const KEYPOOL_WARN: &str = "keypool-rr8-warn";
/// keypool, `rr1000`, default log level.
pub const KEYPOOL_1000: &str = "keypool-rr1000";
/// `--baseline-binary`'s keypool, `rr8`, default log level.
pub const KEYPOOL_BASELINE: &str = "keypool-baseline-rr8";
/// The simulators alone (the streaming baseline).
pub const DIRECT: &str = super::report::DIRECT;

/// How far apart the stream scenario's workers send their first stream: one stream's
/// length (20 ms + 64 chunks × 20 ms) over the 16 workers, so that streams start one
/// at a time for the whole run. Started together, the 16 streams stay in lockstep
/// (each worker's next stream starts when its last one ends): every stream of the run
/// then waits behind the others of its burst, and the first burst of a round, which
/// meets cold caches as well, made every target's slowest streams (2026-12-05 run:
/// each target's ten slowest were first streams of a round, 0–1 ms into it). The
/// stagger spreads the bursts; it does not remove the stall of a sample's very first
/// stream when its connections have to be made again, which is why each worker's
/// first stream is counted apart (BENCHMARKS, "The first stream of a sample").
pub const STREAM_STAGGER: Duration = Duration::from_millis(80);

/// How many of a target's slowest streams the table lists.
pub const SLOWEST_SHOWN: usize = 10;

/// Worker processes (nginx) and threads (HAProxy): keypool's default, one per CPU on
/// the bench machine, is stated beside them in the table.
pub const PEER_WORKERS: usize = 2;

/// Path prefixes of the fast and the slow simulator on nginx and HAProxy.
pub const FAST_PREFIX: &str = "/fast";
/// See [`FAST_PREFIX`].
pub const SLOW_PREFIX: &str = "/slow";

/// One scenario of the floor comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FloorScenario {
    /// Closed loop, 16 connections, small message, fast simulator.
    C16,
    /// Closed loop, 64 connections.
    C64,
    /// Closed loop, 64 connections, two busy loops on the machine.
    C64Busy,
    /// 64-chunk streams paced at 20 ms, 16 at once.
    Stream,
}

impl FloorScenario {
    /// Every scenario, in the order of a round.
    pub const ALL: [FloorScenario; 4] = [
        FloorScenario::C16,
        FloorScenario::C64,
        FloorScenario::C64Busy,
        FloorScenario::Stream,
    ];

    /// The closed loops (every scenario but the streams), in the order of a round.
    pub const CLOSED_LOOPS: [FloorScenario; 3] = [
        FloorScenario::C16,
        FloorScenario::C64,
        FloorScenario::C64Busy,
    ];

    /// Label for the table.
    pub fn label(self) -> &'static str {
        match self {
            FloorScenario::C16 => "c16",
            FloorScenario::C64 => "c64",
            FloorScenario::C64Busy => "c64 + 2 busy loops",
            FloorScenario::Stream => "stream c16",
        }
    }

    /// Closed-loop connections.
    pub fn concurrency(self) -> usize {
        match self {
            FloorScenario::C16 | FloorScenario::Stream => 16,
            FloorScenario::C64 | FloorScenario::C64Busy => 64,
        }
    }

    /// The targets measured in this scenario: the proxies in every one, keypool's
    /// variants at concurrency 16 only, nginx with its access log in the plain closed
    /// loops, the simulator alone for the streams.
    pub fn targets(self) -> &'static [&'static str] {
        match self {
            FloorScenario::C16 => &[
                NGINX,
                NGINX_LOG,
                HAPROXY,
                KEYPOOL,
                KEYPOOL_WARN,
                KEYPOOL_1000,
                KEYPOOL_BASELINE,
            ],
            FloorScenario::C64 => &[NGINX, NGINX_LOG, HAPROXY, KEYPOOL, KEYPOOL_BASELINE],
            FloorScenario::C64Busy => &[NGINX, HAPROXY, KEYPOOL, KEYPOOL_BASELINE],
            FloorScenario::Stream => &[DIRECT, NGINX, HAPROXY, KEYPOOL],
        }
    }
}

/// How long the floor comparison measures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FloorPlan {
    /// Rounds (at least three: the figures are medians).
    pub rounds: u32,
    /// One closed-loop measurement.
    pub seconds: Duration,
    /// One streaming measurement (a stream takes ~1.3 s).
    pub stream_seconds: Duration,
}

impl FloorPlan {
    /// The plan for `--quick` or a full run.
    pub fn new(quick: bool) -> Self {
        if quick {
            Self {
                rounds: 3,
                seconds: Duration::from_secs(1),
                stream_seconds: Duration::from_secs(2),
            }
        } else {
            Self {
                rounds: 7,
                seconds: Duration::from_secs(4),
                // ~220 streams per target and round besides each worker's first: with 6 s
                // (~56) the pooled p99 was the 4th slowest of ~390 streams, and one
                // outlier more or fewer moved it by hundreds of µs (BENCHMARKS, "An AMD
                // host, and the first stream of a sample counted apart")
                stream_seconds: Duration::from_secs(20),
            }
        }
    }
}

/// The order of `targets` in round `round` (1-based): rotated by one each round, so
/// no target is always measured first or right after the same neighbour.
pub fn round_order<'a>(targets: &[&'a str], round: u32) -> Vec<&'a str> {
    let mut order = targets.to_vec();
    if !order.is_empty() {
        let by = (round.saturating_sub(1) as usize) % order.len();
        order.rotate_left(by);
    }
    order
}

/// One measurement of one target in one round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FloorSample {
    /// Target name.
    pub target: String,
    /// Scenario.
    pub scenario: FloorScenario,
    /// Round, from 1.
    pub round: u32,
    /// Requests completed.
    pub requests: u64,
    /// Requests failed.
    pub errors: u64,
    /// Completed requests per second.
    pub req_per_s: f64,
    /// CPU µs of the target's process group per completed request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_us: Option<f64>,
    /// Whole-response latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<Percentiles>,
    /// Streams: TTFT net of the simulator's own wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_ttft: Option<Percentiles>,
    /// Streams: every net TTFT of the run (ns, count), pooled over the rounds for the
    /// TTFT verdict ([`FloorReport::pooled_net_ttft`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub net_ttft_recorded: Vec<(u64, u64)>,
    /// Streams: the net TTFT of each worker's first stream of the run (ns, count), kept
    /// out of `net_ttft` ([`driver::Outcome::first_net_ttft`]) and shown beside it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_net_ttft_recorded: Vec<(u64, u64)>,
    /// Streams: gaps between chunks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gap: Option<Percentiles>,
    /// Streams: the run's slowest streams by net TTFT and where they fell.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slowest_streams: Vec<SlowStream>,
    /// keypool: where its worker threads' connections were (read from its `/metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<Threads>,
    /// Where the machine's CPUs went during the sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
}

/// Where the machine's CPUs went during one sample: the simulator's and the bench's own
/// (the load driver's) CPU per completed request (per stream in the stream scenario),
/// and the machine's idle and stolen time in thousandths of all its CPUs' time. In a
/// closed loop on CPUs that only the driver, the simulator and the target use, the
/// CPUs' busy time is about what the three spent, so req/s is about the CPUs' time less
/// the idle share over what one request costs all three: at the same CPU per request of
/// their own, two targets' req/s differ by the others' cost per request or by the idle
/// share. (Not so with other busy processes, such as the busy-loop scenario's.)
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Machine {
    /// CPU µs of the simulator per request (`None` when the target is the simulator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim_cpu_us: Option<f64>,
    /// CPU µs of the bench's own process (the driver) per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_cpu_us: Option<f64>,
    /// The CPUs' idle time (`idle + iowait`), ‰ of all their time.
    pub idle_permille: u32,
    /// The CPUs' stolen time, ‰ of all their time.
    pub steal_permille: u32,
}

impl Machine {
    /// The split of one sample, from the ticks counted during it: the simulator's
    /// (`None` when the target is the simulator), the driver's, and the machine's;
    /// `None` when the machine counted nothing or no request completed.
    pub fn of(
        sim_ticks: Option<u64>,
        driver_ticks: Option<u64>,
        machine: procs::MachineTicks,
        ticks_per_s: u64,
        requests: u64,
    ) -> Option<Self> {
        let total = machine.total();
        if total == 0 || requests == 0 {
            return None;
        }
        let per_request =
            |t: u64| super::stats::cpu_seconds_per_1k(t, ticks_per_s, requests).map(|s| s * 1000.0);
        let permille = |t: u64| u32::try_from(t * 1000 / total).unwrap_or(1000);
        Some(Self {
            sim_cpu_us: sim_ticks.and_then(per_request),
            driver_cpu_us: driver_ticks.and_then(per_request),
            idle_permille: permille(machine.idle),
            steal_permille: permille(machine.steal),
        })
    }
}

/// How a keypool target's connections sat on its worker threads in one sample: the
/// connections it moved between threads during the sample, each thread's open client
/// connections right after it (every open one: the driver pools its idle connections,
/// so the count can include those of earlier samples), and each thread's load right
/// after it, which its balancer places and moves connections by. Packed onto one
/// thread or spread over both is a difference of a few µs per request (BENCHMARKS,
/// "Connections packed onto the threads the load needs"), so the rounds of a scenario
/// can be told apart by it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Threads {
    /// `keypool_connections_moved_total` after the sample less before it.
    pub moved: u64,
    /// `keypool_worker_connections`, by worker number.
    pub connections: Vec<u64>,
    /// `keypool_worker_load_ratio` right after the sample, by worker number (as many
    /// as `connections`): the moving average, over about the last two seconds, that
    /// the balancer places and moves connections by. `None` for a worker whose load is
    /// not known (keypool leaves it out); empty where the kernel tells no load.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load: Vec<Option<WorkerLoad>>,
}

/// One worker thread's load as keypool's `/metrics` reports it, in thousandths of the
/// wall time: the share it ran on a CPU and the share it waited on a run queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerLoad {
    /// Ran, ‰.
    pub ran: u32,
    /// Waited for a CPU, ‰.
    pub waited: u32,
}

impl Threads {
    /// `64/0, 0 moved`: each worker's connections, then the moves; with loads,
    /// `, ran 930/0 ‰, waited 50/0 ‰` after them (`-` for a load not known).
    pub fn cell(&self) -> String {
        let per_worker: Vec<String> = self.connections.iter().map(u64::to_string).collect();
        let mut cell = format!("{}, {} moved", per_worker.join("/"), self.moved);
        if !self.load.is_empty() {
            let each = |share: fn(&WorkerLoad) -> u32| {
                self.load
                    .iter()
                    .map(|l| {
                        l.as_ref()
                            .map_or_else(|| "-".to_owned(), |l| share(l).to_string())
                    })
                    .collect::<Vec<_>>()
                    .join("/")
            };
            let _ = write!(
                cell,
                ", ran {} ‰, waited {} ‰",
                each(|l| l.ran),
                each(|l| l.waited)
            );
        }
        cell
    }
}

/// Each worker's `keypool_worker_load_ratio{worker="N",kind="ran"|"waited"}` in a
/// `/metrics` text, by worker number, in thousandths, padded to `workers` (a worker
/// with no such line is `None`: keypool leaves out a load it does not know; a kind
/// absent beside the other counts 0). No such line at all: an empty list.
pub fn worker_loads(metrics: &str, workers: usize) -> Vec<Option<WorkerLoad>> {
    let mut out: Vec<Option<WorkerLoad>> = Vec::new();
    for (worker, labels, value) in worker_lines(metrics, "keypool_worker_load_ratio") {
        let kind = labels
            .strip_prefix(",kind=\"")
            .and_then(|k| k.strip_suffix('"'));
        let (Some(kind @ ("ran" | "waited")), Ok(value)) = (kind, value.parse::<f64>()) else {
            continue;
        };
        let thousandths = (value * 1000.0).round().clamp(0.0, 1000.0) as u32;
        if out.len() <= worker {
            out.resize(worker + 1, None);
        }
        let load = out[worker].get_or_insert_default();
        if kind == "ran" {
            load.ran = thousandths;
        } else {
            load.waited = thousandths;
        }
    }
    if !out.is_empty() && out.len() < workers {
        out.resize(workers, None);
    }
    out
}

/// The `name{worker="N"…} value` lines of a `/metrics` text: each one's worker number,
/// the labels after `worker` (`""`, or `,kind="ran"`), and its value.
fn worker_lines<'a>(
    metrics: &'a str,
    name: &'a str,
) -> impl Iterator<Item = (usize, &'a str, &'a str)> + 'a {
    metrics.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?.strip_prefix("{worker=\"")?;
        let (worker, rest) = rest.split_once('"')?;
        let (labels, value) = rest.split_once("} ")?;
        Some((worker.parse().ok()?, labels, value.trim()))
    })
}

/// Each worker's `keypool_worker_connections{worker="N"}` in a `/metrics` text, by
/// worker number (a worker absent from the text counts 0).
pub fn worker_connections(metrics: &str) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    for (worker, labels, value) in worker_lines(metrics, "keypool_worker_connections") {
        let (true, Ok(value)) = (labels.is_empty(), value.parse::<u64>()) else {
            continue;
        };
        if out.len() <= worker {
            out.resize(worker + 1, 0);
        }
        out[worker] = value;
    }
    out
}

/// Median of the finite values, `None` without any.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// The medians over the rounds of one target in one scenario, and the range of the CPU
/// figure.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct FloorMedians {
    /// Rounds measured.
    pub rounds: usize,
    /// Requests failed, all rounds.
    pub errors: u64,
    /// Median req/s.
    pub req_per_s: Option<f64>,
    /// Median CPU µs per request.
    pub cpu_us: Option<f64>,
    /// Lowest and highest CPU µs per request of a round.
    pub cpu_us_range: Option<(f64, f64)>,
    /// Median p50 latency, µs.
    pub p50_us: Option<f64>,
    /// Median p99 latency, µs.
    pub p99_us: Option<f64>,
    /// Streams: median net TTFT p50 and p99, µs.
    pub net_ttft_p50_us: Option<f64>,
    /// See `net_ttft_p50_us`.
    pub net_ttft_p99_us: Option<f64>,
    /// Streams: median gap p50 and p99, µs.
    pub gap_p50_us: Option<f64>,
    /// See `gap_p50_us`.
    pub gap_p99_us: Option<f64>,
    /// Median CPU µs per request of the simulator ([`Machine`]).
    #[serde(default)]
    pub sim_cpu_us: Option<f64>,
    /// Median CPU µs per request of the driver ([`Machine`]).
    #[serde(default)]
    pub driver_cpu_us: Option<f64>,
    /// Median over the rounds of the target's, the simulator's and the driver's CPU µs
    /// per request added up in each round ([`Machine`]; not the sum of the three
    /// medians).
    #[serde(default)]
    pub all_cpu_us: Option<f64>,
    /// Median idle share of the machine's CPUs, ‰ ([`Machine`]).
    #[serde(default)]
    pub idle_permille: Option<f64>,
    /// Median stolen share of the machine's CPUs, ‰ ([`Machine`]).
    #[serde(default)]
    pub steal_permille: Option<f64>,
}

/// How [`FloorReport::paired`] compares two measurements of one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paired {
    /// `a / b` (CPU, req/s, p99 against a peer).
    Ratio,
    /// `a - b` (an added latency or cost).
    Difference,
}

/// What the floor comparison found: `report.json`'s `floor`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct FloorReport {
    /// Every target, measured or skipped.
    pub targets: Vec<TargetInfo>,
    /// Every measurement.
    pub samples: Vec<FloorSample>,
    /// The issue's targets.
    pub verdicts: Vec<Verdict>,
}

impl FloorReport {
    /// The medians of `target` in `scenario` (`rounds == 0` when it was not measured).
    pub fn medians(&self, target: &str, scenario: FloorScenario) -> FloorMedians {
        let mine: Vec<&FloorSample> = self
            .samples
            .iter()
            .filter(|s| s.target == target && s.scenario == scenario)
            .collect();
        let of = |f: &dyn Fn(&FloorSample) -> Option<f64>| {
            median(mine.iter().filter_map(|s| f(s)).collect())
        };
        let cpus: Vec<f64> = mine.iter().filter_map(|s| s.cpu_us).collect();
        FloorMedians {
            rounds: mine.len(),
            errors: mine.iter().map(|s| s.errors).sum(),
            req_per_s: of(&|s| (s.requests > 0).then_some(s.req_per_s)),
            cpu_us: median(cpus.clone()),
            cpu_us_range: cpus.iter().copied().fold(None, |r: Option<(f64, f64)>, c| {
                Some(r.map_or((c, c), |(lo, hi)| (lo.min(c), hi.max(c))))
            }),
            p50_us: of(&|s| s.latency.map(|l| l.p50_us)),
            p99_us: of(&|s| s.latency.map(|l| l.p99_us)),
            net_ttft_p50_us: of(&|s| s.net_ttft.map(|l| l.p50_us)),
            net_ttft_p99_us: of(&|s| s.net_ttft.map(|l| l.p99_us)),
            gap_p50_us: of(&|s| s.gap.map(|l| l.p50_us)),
            gap_p99_us: of(&|s| s.gap.map(|l| l.p99_us)),
            sim_cpu_us: of(&|s| s.machine.and_then(|m| m.sim_cpu_us)),
            driver_cpu_us: of(&|s| s.machine.and_then(|m| m.driver_cpu_us)),
            all_cpu_us: of(&|s| {
                let m = s.machine?;
                Some(s.cpu_us? + m.sim_cpu_us? + m.driver_cpu_us?)
            }),
            idle_permille: of(&|s| s.machine.map(|m| f64::from(m.idle_permille))),
            steal_permille: of(&|s| s.machine.map(|m| f64::from(m.steal_permille))),
        }
    }

    /// The median over the rounds of `f(a) / f(b)` (or `f(a) - f(b)`, `how`), taken in
    /// each round that measured both `a` and `b` in `scenario`: the paired comparison.
    /// Both ran minutes apart at most in one round, so a drift of the shared machine
    /// between rounds (which moves both) cancels, where it would not between two medians
    /// taken over different rounds' values.
    pub fn paired(
        &self,
        a: &str,
        b: &str,
        scenario: FloorScenario,
        how: Paired,
        f: impl Fn(&FloorSample) -> Option<f64>,
    ) -> Option<f64> {
        let of = |target: &str, round: u32| {
            self.samples
                .iter()
                .find(|s| s.target == target && s.scenario == scenario && s.round == round)
                .and_then(&f)
        };
        let mut rounds: Vec<u32> = self.samples.iter().map(|s| s.round).collect();
        rounds.sort_unstable();
        rounds.dedup();
        median(
            rounds
                .into_iter()
                .filter_map(|r| of(a, r).zip(of(b, r)))
                .filter_map(|(x, y)| match how {
                    Paired::Ratio => (y > 0.0).then(|| x / y),
                    Paired::Difference => Some(x - y),
                })
                .collect(),
        )
    }

    /// The net TTFT percentiles of every stream `target` ran in `scenario`, all rounds
    /// pooled (`None` without any). A run's stream scenario starts ~235 streams per
    /// target and round (16 at once, 1.3 s each, 20 s): one round's p99 is its worst two
    /// or three streams, so the TTFT target is judged on the pooled streams instead (the
    /// rounds interleave the targets, so a drift of the machine reaches each of them
    /// alike).
    pub fn pooled_net_ttft(&self, target: &str, scenario: FloorScenario) -> Option<Percentiles> {
        self.pooled(target, scenario, |s| &s.net_ttft_recorded)
    }

    /// [`FloorReport::pooled_net_ttft`] of the workers' first streams of each round.
    pub fn pooled_first_net_ttft(
        &self,
        target: &str,
        scenario: FloorScenario,
    ) -> Option<Percentiles> {
        self.pooled(target, scenario, |s| &s.first_net_ttft_recorded)
    }

    fn pooled(
        &self,
        target: &str,
        scenario: FloorScenario,
        recorded: impl Fn(&FloorSample) -> &[(u64, u64)],
    ) -> Option<Percentiles> {
        let mut pooled = super::stats::Latencies::new();
        for s in self
            .samples
            .iter()
            .filter(|s| s.target == target && s.scenario == scenario)
        {
            pooled.merge(&super::stats::Latencies::from_recorded(recorded(s)));
        }
        pooled.summary()
    }

    /// `target`'s slowest streams of every round with their round, slowest first (at
    /// most `n`).
    pub fn slowest_streams(&self, target: &str, n: usize) -> Vec<(u32, SlowStream)> {
        let mut all: Vec<(u32, SlowStream)> = self
            .samples
            .iter()
            .filter(|s| s.target == target && s.scenario == FloorScenario::Stream)
            .flat_map(|s| s.slowest_streams.iter().map(|k| (s.round, *k)))
            .collect();
        all.sort_by(|a, b| b.1.net_ttft_us.total_cmp(&a.1.net_ttft_us));
        all.truncate(n);
        all
    }

    /// Checks issue 22's targets. Each target compares two measurements of the same
    /// rounds, and is judged by their paired ratio ([`FloorReport::paired`]); the
    /// medians are shown beside it. The streaming TTFT is judged on the pooled streams
    /// ([`FloorReport::pooled_net_ttft`]).
    pub fn compute_verdicts(&mut self) {
        let m = |t: &str, s| self.medians(t, s);
        let cpu = |s: &FloorSample| s.cpu_us;
        let rps = |s: &FloorSample| (s.requests > 0).then_some(s.req_per_s);
        let p99 = |s: &FloorSample| s.latency.map(|l| l.p99_us);
        let mut v = Vec::new();
        let us = |x: f64| format!("{x:.1} us");
        for scenario in [FloorScenario::C16, FloorScenario::C64] {
            let (k, n) = (m(KEYPOOL, scenario), m(NGINX, scenario));
            let both = k.cpu_us.zip(n.cpu_us);
            let paired = self.paired(KEYPOOL, NGINX, scenario, Paired::Ratio, cpu);
            v.push(Verdict {
                goal: format!("CPU per request at {} <= nginx's", scenario.label()),
                measured: both.zip(paired).map_or_else(
                    || "n/a (nginx or keypool not measured)".into(),
                    |((k, n), p)| {
                        format!(
                            "keypool {} vs nginx {} (paired {:+.0} %)",
                            us(k),
                            us(n),
                            (p - 1.0) * 100.0
                        )
                    },
                ),
                met: paired.map(|p| p <= 1.0),
            });
        }
        for scenario in [FloorScenario::C16, FloorScenario::C64] {
            let (k, n) = (m(KEYPOOL, scenario), m(NGINX, scenario));
            let both = k.req_per_s.zip(n.req_per_s);
            let paired = self.paired(KEYPOOL, NGINX, scenario, Paired::Ratio, rps);
            v.push(Verdict {
                goal: format!("req/s at {} >= nginx's", scenario.label()),
                measured: both.zip(paired).map_or_else(
                    || "n/a (nginx or keypool not measured)".into(),
                    |((k, n), p)| {
                        format!(
                            "keypool {k:.0} vs nginx {n:.0} (paired {:+.0} %)",
                            (p - 1.0) * 100.0
                        )
                    },
                ),
                met: paired.map(|p| p >= 1.0),
            });
        }
        for scenario in [FloorScenario::C64, FloorScenario::C64Busy] {
            let (k, n) = (m(KEYPOOL, scenario), m(NGINX, scenario));
            let both = k.p99_us.zip(n.p99_us);
            let paired = self.paired(KEYPOOL, NGINX, scenario, Paired::Ratio, p99);
            v.push(Verdict {
                goal: format!("p99 at {} <= 1.5 x nginx's", scenario.label()),
                measured: both.zip(paired).map_or_else(
                    || "n/a (nginx or keypool not measured)".into(),
                    |((k, n), p)| format!("keypool {} vs nginx {} (paired {p:.2} x)", us(k), us(n)),
                ),
                met: paired.map(|p| p <= 1.5),
            });
        }
        let stream = |f: fn(&FloorSample) -> Option<f64>| {
            self.paired(
                KEYPOOL,
                DIRECT,
                FloorScenario::Stream,
                Paired::Difference,
                f,
            )
        };
        let pooled = |t: &str| self.pooled_net_ttft(t, FloorScenario::Stream);
        let direct = pooled(DIRECT);
        let added = |t: &str| pooled(t).zip(direct).map(|(t, d)| (t, t.p99_us - d.p99_us));
        let ttft = added(KEYPOOL);
        let nginx = added(NGINX).map_or_else(String::new, |(_, a)| format!("; nginx {a:+.1} us"));
        v.push(Verdict {
            goal: "added streaming TTFT p99 <= 150 us net of the simulator's wait".into(),
            measured: ttft.zip(direct).map_or_else(
                || "n/a".into(),
                |((k, a), d)| {
                    format!(
                        "{a:+.1} us (p99 of the pooled streams, each worker's first of a round apart (table): keypool {} of {}, simulator alone {} of {}{nginx})",
                        us(k.p99_us),
                        k.samples,
                        us(d.p99_us),
                        d.samples
                    )
                },
            ),
            met: ttft.map(|(_, a)| a <= 150.0),
        });
        let gap = stream(|s| s.gap.map(|l| l.p50_us)).zip(stream(|s| s.gap.map(|l| l.p99_us)));
        v.push(Verdict {
            goal: "no added inter-chunk gap (added p50 <= 100 us, added p99 <= 1 ms)".into(),
            measured: gap.map_or_else(
                || "n/a".into(),
                |(a50, a99)| format!("p50 {a50:+.1} us, p99 {a99:+.1} us (paired)"),
            ),
            met: gap.map(|(a50, a99)| a50 <= 100.0 && a99 <= 1000.0),
        });
        let (big, small) = (
            m(KEYPOOL_1000, FloorScenario::C16),
            m(KEYPOOL, FloorScenario::C16),
        );
        let ratio = self
            .paired(
                KEYPOOL_1000,
                KEYPOOL,
                FloorScenario::C16,
                Paired::Ratio,
                cpu,
            )
            .map(|r| r - 1.0);
        v.push(Verdict {
            goal: "1,000-account pool within 5 % of 8 accounts in CPU per request (c16)".into(),
            measured: ratio.map_or_else(
                || "n/a".into(),
                |r| {
                    format!(
                        "{} vs {} (paired {:+.1} %)",
                        us(big.cpu_us.unwrap_or(0.0)),
                        us(small.cpu_us.unwrap_or(0.0)),
                        r * 100.0
                    )
                },
            ),
            met: ratio.map(|r| r <= 0.05),
        });
        let warn = m(KEYPOOL_WARN, FloorScenario::C16);
        let line = small
            .cpu_us
            .zip(warn.cpu_us)
            .zip(self.paired(
                KEYPOOL,
                KEYPOOL_WARN,
                FloorScenario::C16,
                Paired::Difference,
                cpu,
            ))
            .map(|((i, w), d)| (i, w, d));
        v.push(Verdict {
            goal:
                "cost of one info-level request log line stated (CPU per request, info - warn, c16)"
                    .into(),
            measured: line.map_or_else(
                || "n/a".into(),
                |(i, w, d)| format!("{d:+.1} us paired ({} at info, {} at warn)", us(i), us(w)),
            ),
            // A statement, not a bound: "met" once both were measured.
            met: line.map(|_| true),
        });
        // Not a target of the issue's either: keypool with its request line against nginx
        // writing an access log line, each logging every request.
        for scenario in [FloorScenario::C16, FloorScenario::C64] {
            let both = m(KEYPOOL, scenario)
                .cpu_us
                .zip(m(NGINX_LOG, scenario).cpu_us)
                .zip(self.paired(KEYPOOL, NGINX_LOG, scenario, Paired::Ratio, cpu));
            v.push(Verdict {
                goal: format!(
                    "cost of logging each request stated: keypool (info) against nginx with an access log (CPU per request, {})",
                    scenario.label()
                ),
                measured: both.map_or_else(
                    || "n/a (nginx with an access log or keypool not measured)".into(),
                    |((k, l), p)| {
                        format!(
                            "keypool {} vs nginx with an access log {} (paired {:+.0} %)",
                            us(k),
                            us(l),
                            (p - 1.0) * 100.0
                        )
                    },
                ),
                met: both.map(|_| true),
            });
        }
        self.verdicts = v;
    }

    /// The table: medians per scenario and target, then the verdicts.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let cell = |v: Option<f64>, digits: usize| {
            v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"))
        };
        let _ = writeln!(
            out,
            "Floor comparison (issue 22): medians of interleaved rounds; CPU = CPU time of the target's process group per request"
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "| scenario | target | rounds | err | req/s | p50 µs | p99 µs | CPU µs/req | CPU range |"
        );
        let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|--:|--:|");
        for scenario in FloorScenario::CLOSED_LOOPS {
            for target in scenario.targets() {
                let md = self.medians(target, scenario);
                if md.rounds == 0 {
                    continue;
                }
                let _ = writeln!(
                    out,
                    "| {} | {target} | {} | {} | {} | {} | {} | {} | {} |",
                    scenario.label(),
                    md.rounds,
                    md.errors,
                    cell(md.req_per_s, 0),
                    cell(md.p50_us, 1),
                    cell(md.p99_us, 1),
                    cell(md.cpu_us, 1),
                    md.cpu_us_range
                        .map_or_else(|| "-".into(), |(lo, hi)| format!("{lo:.1}–{hi:.1}")),
                );
            }
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "| stream c16 | rounds | err | net TTFT p50 µs | net TTFT p99 µs | pooled streams | pooled p99 µs | added pooled p99 | first streams | first: p50 µs | first: max µs | gap p50 µs | gap p99 µs | CPU µs/stream |"
        );
        let _ = writeln!(
            out,
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
        );
        let direct = self.pooled_net_ttft(DIRECT, FloorScenario::Stream);
        for target in FloorScenario::Stream.targets() {
            let md = self.medians(target, FloorScenario::Stream);
            if md.rounds == 0 {
                continue;
            }
            let pooled = self.pooled_net_ttft(target, FloorScenario::Stream);
            let added = match (*target == DIRECT, pooled, direct) {
                (false, Some(t), Some(d)) => format!("{:+.1}", t.p99_us - d.p99_us),
                _ => "-".into(),
            };
            let first = self.pooled_first_net_ttft(target, FloorScenario::Stream);
            let _ = writeln!(
                out,
                "| {target} | {} | {} | {} | {} | {} | {} | {added} | {} | {} | {} | {} | {} | {} |",
                md.rounds,
                md.errors,
                cell(md.net_ttft_p50_us, 1),
                cell(md.net_ttft_p99_us, 1),
                pooled.map_or_else(|| "-".into(), |p| p.samples.to_string()),
                cell(pooled.map(|p| p.p99_us), 1),
                first.map_or_else(|| "-".into(), |p| p.samples.to_string()),
                cell(first.map(|p| p.p50_us), 1),
                cell(first.map(|p| p.max_us), 1),
                cell(md.gap_p50_us, 1),
                cell(md.gap_p99_us, 1),
                cell(md.cpu_us, 1),
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "| stream c16 | slowest streams of all rounds: net TTFT µs (round, ms into the run, worker's nth request; #0, a worker's first, is not in the pooled p99) |"
        );
        let _ = writeln!(out, "|---|---|");
        for target in FloorScenario::Stream.targets() {
            let slow = self.slowest_streams(target, SLOWEST_SHOWN);
            if slow.is_empty() {
                continue;
            }
            let list: Vec<String> = slow
                .iter()
                .map(|(round, k)| {
                    format!(
                        "{:.0} (r{round}, {:.0} ms, #{})",
                        k.net_ttft_us, k.start_ms, k.nth
                    )
                })
                .collect();
            let _ = writeln!(out, "| {target} | {} |", list.join("; "));
        }
        self.threads_table(&mut out);
        self.machine_table(&mut out);
        let _ = writeln!(out);
        let _ = writeln!(out, "| target | setup |");
        let _ = writeln!(out, "|---|---|");
        for t in &self.targets {
            let what = match &t.skipped {
                Some(reason) => format!("SKIPPED: {reason}"),
                None => t.description.clone(),
            };
            let _ = writeln!(out, "| {} | {what} |", t.name);
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "| issue 22 target | measured | met |");
        let _ = writeln!(out, "|---|---|---|");
        for v in &self.verdicts {
            let met = match v.met {
                Some(true) if v.goal.starts_with("cost of") => "stated",
                Some(true) => "met",
                Some(false) => "MISSED",
                None => "n/a",
            };
            let _ = writeln!(out, "| {} | {} | {met} |", v.goal, v.measured);
        }
        out
    }

    /// Where the machine's CPUs went in the closed loops ([`Machine`]), medians over the
    /// rounds, when they were read: every target's req/s beside what a request cost the
    /// target, the simulator and the driver (each, and the three added up in each
    /// round), and the share the CPUs idled.
    fn machine_table(&self, out: &mut String) {
        let cell = |v: Option<f64>, digits: usize| {
            v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"))
        };
        let mut rows = Vec::new();
        for scenario in FloorScenario::CLOSED_LOOPS {
            for target in scenario.targets() {
                let md = self.medians(target, scenario);
                if md.rounds == 0 || md.idle_permille.is_none() {
                    continue;
                }
                rows.push(format!(
                    "| {} | {target} | {} | {} | {} | {} | {} | {} | {} |",
                    scenario.label(),
                    cell(md.req_per_s, 0),
                    cell(md.cpu_us, 1),
                    cell(md.sim_cpu_us, 1),
                    cell(md.driver_cpu_us, 1),
                    cell(md.all_cpu_us, 1),
                    cell(md.idle_permille, 0),
                    cell(md.steal_permille, 0),
                ));
            }
        }
        optional_table(
            out,
            "| scenario | target | req/s | target CPU µs/req | simulator | driver | all three, added up per round | CPUs idle ‰ | stolen ‰ |",
            "|---|---|--:|--:|--:|--:|--:|--:|--:|",
            &rows,
        );
    }

    /// keypool's threads in each round's sample of the closed loops ([`Threads`]), when
    /// they were read: next to a round's CPU per request, whether its connections were
    /// packed or spread.
    fn threads_table(&self, out: &mut String) {
        let rows: Vec<String> = FloorScenario::CLOSED_LOOPS
            .into_iter()
            .flat_map(|scenario| scenario.targets().iter().map(move |t| (*t, scenario)))
            .filter_map(|(target, scenario)| {
                let mut samples: Vec<&FloorSample> = self
                    .samples
                    .iter()
                    .filter(|s| s.target == target && s.scenario == scenario)
                    .collect();
                samples.sort_by_key(|s| s.round);
                let cells: Vec<String> = samples
                    .iter()
                    .map(|s| {
                        let cpu = s
                            .cpu_us
                            .map_or_else(|| "-".into(), |c| format!("{c:.1} µs"));
                        match &s.threads {
                            Some(t) => format!("r{}: {}; {cpu}", s.round, t.cell()),
                            None => format!("r{}: -; {cpu}", s.round),
                        }
                    })
                    .collect();
                samples.iter().any(|s| s.threads.is_some()).then(|| {
                    format!(
                        "| {} | {target} | {} |",
                        scenario.label(),
                        cells.join(" · ")
                    )
                })
            })
            .collect();
        optional_table(
            out,
            "| scenario | target | each round: connections per worker thread after the sample, moves during it, each worker's load after it; CPU per request |",
            "|---|---|---|",
            &rows,
        );
    }
}

/// A table of `rows` under `header` and `separator`, after a blank line; nothing at all
/// when there are no rows (the readings it shows were not taken).
fn optional_table(out: &mut String, header: &str, separator: &str, rows: &[String]) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "{header}");
    let _ = writeln!(out, "{separator}");
    for row in rows {
        let _ = writeln!(out, "{row}");
    }
}

/// nginx's configuration: `PEER_WORKERS` worker processes, one upstream per simulator
/// with 64 idle keep-alive connections per worker, HTTP/1.1 to the upstream with
/// `x-api-key` set to `secret`; `/fast/…` and `/slow/…` lose their prefix, the slow
/// (streaming) location is not buffered. The access log is off, or with `access_log`
/// one line per request ([`ACCESS_LOG_FORMAT`]) into `prefix/access.log` through a
/// 64 KiB buffer. Everything it writes stays under `prefix`.
pub fn nginx_config(
    prefix: &Path,
    listen: std::net::SocketAddr,
    fast: &str,
    slow: &str,
    secret: &str,
    access_log: bool,
) -> String {
    let p = prefix.display();
    let log = if access_log {
        format!(
            "log_format requests '{ACCESS_LOG_FORMAT}';\n    \
             access_log {p}/access.log requests buffer=64k flush=1s;"
        )
    } else {
        "access_log off;".to_owned()
    };
    let upstream = |name: &str, base: &str| {
        format!(
            "    upstream {name} {{\n        server {};\n        keepalive 64;\n    }}\n",
            base.trim_start_matches("http://")
        )
    };
    let location = |prefix: &str, name: &str, buffering: bool| {
        format!(
            "        location {prefix}/ {{\n            proxy_pass http://{name}/;\n            proxy_http_version 1.1;\n            \
             proxy_set_header Connection \"\";\n            proxy_set_header x-api-key \"{secret}\";\n            \
             proxy_buffering {};\n        }}\n",
            if buffering { "on" } else { "off" }
        )
    };
    format!(
        "# Generated by `cargo xtask bench`; rewritten on every run.\n\
         worker_processes {PEER_WORKERS};\ndaemon off;\nmaster_process on;\npid {p}/nginx.pid;\nerror_log {p}/error.log warn;\n\
         events {{\n    worker_connections 4096;\n}}\n\
         http {{\n    {log}\n    client_body_temp_path {p}/body;\n    proxy_temp_path {p}/proxy;\n    \
         fastcgi_temp_path {p}/fastcgi;\n    uwsgi_temp_path {p}/uwsgi;\n    scgi_temp_path {p}/scgi;\n    \
         keepalive_requests 1000000;\n{}{}    server {{\n        listen {listen};\n{}{}    }}\n}}\n",
        upstream("fast", fast),
        upstream("slow", slow),
        location(FAST_PREFIX, "fast", true),
        location(SLOW_PREFIX, "slow", false),
    )
}

/// The access log line of [`NGINX_LOG`]: what a request line of keypool's says that
/// nginx knows (time, request id, client, request, status, bytes, times, upstream), 150
/// bytes against keypool's 590.
pub const ACCESS_LOG_FORMAT: &str = "$time_iso8601 $request_id $remote_addr \"$request\" $status \
     $body_bytes_sent $request_time $upstream_addr $upstream_status $upstream_response_time \
     \"$http_user_agent\"";

/// HAProxy's configuration: `PEER_WORKERS` threads, HTTP mode, `http-reuse always`,
/// `option http-no-delay` (without it HAProxy sends with `MSG_MORE` and holds a stream's
/// first frames for ~200 ms), `x-api-key` set to `secret`; `/slow/…` goes to the slow simulator, the rest to the
/// fast one, the prefix removed.
pub fn haproxy_config(
    listen: std::net::SocketAddr,
    fast: &str,
    slow: &str,
    secret: &str,
) -> String {
    let backend = |name: &str, prefix: &str, base: &str| {
        format!(
            "backend {name}\n    http-request set-header x-api-key \"{secret}\"\n    \
             http-request replace-path ^{prefix}(/.*) \\1\n    server sim {}\n\n",
            base.trim_start_matches("http://")
        )
    };
    format!(
        "# Generated by `cargo xtask bench`; rewritten on every run.\n\
         global\n    nbthread {PEER_WORKERS}\n    maxconn 4096\n\n\
         defaults\n    mode http\n    timeout connect 5s\n    timeout client 60s\n    timeout server 60s\n    \
         http-reuse always\n    option http-no-delay\n\n\
         frontend bench\n    bind {listen}\n    use_backend slow if {{ path_beg {SLOW_PREFIX}/ }}\n    default_backend fast\n\n{}{}",
        backend("fast", FAST_PREFIX, fast),
        backend("slow", SLOW_PREFIX, slow),
    )
}

/// A Debian program: its path when it is installed (`/usr/sbin` is searched too, it is
/// not on every `PATH`), else after `apt-get install -y package`; `Err` is the reason
/// to report the target skipped.
pub fn ensure_debian_program(program: &str, package: &str) -> Result<PathBuf, String> {
    let find = || {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    };
    if let Some(path) = find() {
        return Ok(path);
    }
    eprintln!("bench: installing {package} with apt-get (once)");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        let _ = Command::new("apt-get")
            .arg("update")
            .stdout(std::process::Stdio::null())
            .status();
        install();
    }
    find().ok_or_else(|| {
        format!("{program} is not installed and `apt-get install -y {package}` did not install it")
    })
}

/// The first line of a program's version output (nginx writes it to stderr).
fn version_line(program: &Path, arg: &str) -> String {
    Command::new(program)
        .arg(arg)
        .output()
        .ok()
        .and_then(|o| {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stderr),
                String::from_utf8_lossy(&o.stdout)
            );
            text.lines().next().map(|l| l.trim().to_owned())
        })
        .unwrap_or_else(|| "?".into())
}

/// A proxy of the comparison, started.
pub struct Peer {
    /// Its process (group).
    pub proc: Proc,
    /// Its address.
    pub addr: std::net::SocketAddr,
    /// What it is, for the table.
    pub description: String,
}

/// Starts nginx with [`nginx_config`] under `dir/nginx` (with its access log: under
/// `dir/nginx-access-log`).
pub async fn start_nginx(
    client: &HttpClient,
    dir: &Path,
    fast: &str,
    slow: &str,
    access_log: bool,
) -> Result<Peer, String> {
    let program = ensure_debian_program("nginx", "nginx")?;
    let name = if access_log { NGINX_LOG } else { NGINX };
    let prefix = dir.join(name);
    std::fs::create_dir_all(&prefix)
        .map_err(|e| format!("cannot create {}: {e}", prefix.display()))?;
    let addr = procs::free_addr().map_err(|e| e.to_string())?;
    let conf = prefix.join("nginx.conf");
    std::fs::write(
        &conf,
        nginx_config(
            &prefix,
            addr,
            fast,
            slow,
            super::setup::UPSTREAM_SECRET,
            access_log,
        ),
    )
    .map_err(|e| format!("cannot write {}: {e}", conf.display()))?;
    let mut cmd = Command::new(&program);
    cmd.arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(prefix.join("error.log"));
    let proc =
        Proc::spawn(name, cmd, &dir.join(format!("{name}.log"))).map_err(|e| e.to_string())?;
    let log = if access_log {
        "; an access log line per request, buffered 64 KiB (not a target: what logging each request costs a peer)"
    } else {
        ""
    };
    let description = format!(
        "{}, {PEER_WORKERS} worker processes, upstream keepalive 64, proxy_http_version 1.1, sets x-api-key; stream location unbuffered{log}",
        version_line(&program, "-v")
    );
    ready(client, proc, addr, description).await
}

/// Starts HAProxy with [`haproxy_config`].
pub async fn start_haproxy(
    client: &HttpClient,
    dir: &Path,
    fast: &str,
    slow: &str,
) -> Result<Peer, String> {
    let program = ensure_debian_program("haproxy", "haproxy")?;
    let addr = procs::free_addr().map_err(|e| e.to_string())?;
    let conf = dir.join("haproxy.cfg");
    std::fs::write(
        &conf,
        haproxy_config(addr, fast, slow, super::setup::UPSTREAM_SECRET),
    )
    .map_err(|e| format!("cannot write {}: {e}", conf.display()))?;
    let mut cmd = Command::new(&program);
    cmd.arg("-db").arg("-f").arg(&conf);
    let proc = Proc::spawn("haproxy", cmd, &dir.join("haproxy.log")).map_err(|e| e.to_string())?;
    let version = version_line(&program, "-v");
    let version = version.split(" - ").next().unwrap_or(&version).to_owned();
    let description = format!(
        "{version}, nbthread {PEER_WORKERS}, http-reuse always, option http-no-delay, sets x-api-key"
    );
    ready(client, proc, addr, description).await
}

async fn ready(
    client: &HttpClient,
    mut proc: Proc,
    addr: std::net::SocketAddr,
    description: String,
) -> Result<Peer, String> {
    let up = super::uri(addr, "/").map_err(|e| e.to_string())?;
    super::wait_http(client, &mut proc, &up, Duration::from_secs(20))
        .await
        .map_err(|e| format!("did not start: {e:#}"))?;
    Ok(Peer {
        proc,
        addr,
        description,
    })
}

/// A target of the comparison: where its requests go and whose CPU counts.
pub struct FloorTarget {
    /// Name ([`NGINX`], [`KEYPOOL`], …).
    pub name: &'static str,
    /// Process group during the closed loops (fast simulator)…
    pub pgid: u32,
    /// …and during the streams.
    pub pgid_stream: u32,
    /// Small message.
    pub small: Endpoint,
    /// Stream (slow simulator), when the target is measured streaming.
    pub stream: Option<Endpoint>,
    /// keypool's `/metrics`, read before and after each sample ([`Threads`]).
    pub metrics: Option<http::Uri>,
}

/// keypool's moves so far, its connections per worker and its workers' loads, from
/// `/metrics` (`None` when it does not answer or reports no worker's connections).
async fn read_threads(
    client: &HttpClient,
    metrics: &http::Uri,
) -> Option<(f64, Vec<u64>, Vec<Option<WorkerLoad>>)> {
    let (status, text) = driver::get_text(client, metrics).await?;
    if !status.is_success() {
        return None;
    }
    // a keypool older than its balancer (a `--baseline-binary`) has no such lines
    let connections = worker_connections(&text);
    if connections.is_empty() {
        return None;
    }
    let load = worker_loads(&text, connections.len());
    Some((
        driver::counter_sum(&text, "keypool_connections_moved_total"),
        connections,
        load,
    ))
}

/// Two busy loops, each its own process group (killed when dropped).
fn busy_loops(dir: &Path) -> anyhow::Result<Vec<Proc>> {
    (0..2)
        .map(|i| {
            let mut c = Command::new("sh");
            c.args(["-c", "while :; do :; done"]);
            Proc::spawn(
                &format!("busy loop {i}"),
                c,
                &dir.join(format!("busy-{i}.log")),
            )
        })
        .collect()
}

/// Runs the rounds over `targets` (a scenario's target that is not among them, e.g. a
/// skipped peer, is left out).
pub async fn run(
    client: &HttpClient,
    targets: &[FloorTarget],
    plan: FloorPlan,
    dir: &Path,
    ticks: u64,
) -> anyhow::Result<Vec<FloorSample>> {
    // Warm-up: connections at the highest concurrency, caches.
    for t in targets {
        let warm = Bounds {
            requests: Some(2_000),
            duration: Duration::from_secs(5),
            pause: Duration::ZERO,
        };
        driver::closed_loop(client, &t.small, 64, warm).await;
    }
    // the simulators every target forwards to: the bare target's processes
    let sims = targets
        .iter()
        .find(|t| t.name == DIRECT)
        .map(|t| (t.pgid, t.pgid_stream));
    let mut samples = Vec::new();
    for round in 1..=plan.rounds {
        for scenario in FloorScenario::ALL {
            for name in round_order(scenario.targets(), round) {
                let Some(t) = targets.iter().find(|t| t.name == name) else {
                    continue;
                };
                let (ep, pgid, seconds) = match scenario {
                    FloorScenario::Stream => match &t.stream {
                        Some(ep) => (ep, t.pgid_stream, plan.stream_seconds),
                        None => continue,
                    },
                    _ => (&t.small, t.pgid, plan.seconds),
                };
                let busy = if scenario == FloorScenario::C64Busy {
                    let b = busy_loops(dir)?;
                    // Let them reach the run queue before the measurement starts.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    b
                } else {
                    Vec::new()
                };
                let bounds = Bounds {
                    requests: None,
                    duration: seconds,
                    pause: Duration::ZERO,
                };
                // read before the CPU is, so that the reading is not counted
                let threads_before = match &t.metrics {
                    Some(m) => read_threads(client, m).await,
                    None => None,
                };
                let sim_pgid = sims
                    .map(|(fast, slow)| match scenario {
                        FloorScenario::Stream => slow,
                        _ => fast,
                    })
                    .filter(|sim| *sim != pgid);
                let sim_before = sim_pgid.map(|p| procs::group_usage(p).cpu_ticks);
                let driver_before = procs::own_ticks();
                let machine_before = procs::machine_ticks();
                let before = procs::group_usage(pgid).cpu_ticks;
                let stagger = match scenario {
                    FloorScenario::Stream => STREAM_STAGGER,
                    _ => Duration::ZERO,
                };
                let out = driver::closed_loop_staggered(
                    client,
                    ep,
                    scenario.concurrency(),
                    bounds,
                    stagger,
                )
                .await;
                let after = procs::group_usage(pgid).cpu_ticks;
                let machine_after = procs::machine_ticks();
                let driver_after = procs::own_ticks();
                let sim_after = sim_pgid.map(|p| procs::group_usage(p).cpu_ticks);
                drop(busy);
                let machine = match (machine_before, machine_after) {
                    (Some(b), Some(a)) => Machine::of(
                        sim_before.zip(sim_after).map(|(b, a)| a.saturating_sub(b)),
                        driver_before
                            .zip(driver_after)
                            .map(|(b, a)| a.saturating_sub(b)),
                        a.since(b),
                        ticks,
                        out.ok,
                    ),
                    _ => None,
                };
                let threads = match (&t.metrics, threads_before) {
                    (Some(m), Some((moved_before, _, _))) => {
                        read_threads(client, m)
                            .await
                            .map(|(moved, connections, load)| Threads {
                                moved: (moved - moved_before).max(0.0) as u64,
                                connections,
                                load,
                            })
                    }
                    _ => None,
                };
                let cpu_us =
                    super::stats::cpu_seconds_per_1k(after.saturating_sub(before), ticks, out.ok)
                        .map(|s| s * 1000.0);
                let sample = FloorSample {
                    target: name.to_owned(),
                    scenario,
                    round,
                    requests: out.ok,
                    errors: out.errors,
                    req_per_s: super::stats::rate(out.ok, out.elapsed),
                    cpu_us,
                    latency: out.latency.summary(),
                    net_ttft: out.net_ttft.summary(),
                    net_ttft_recorded: out.net_ttft.recorded(),
                    first_net_ttft_recorded: out.first_net_ttft.recorded(),
                    gap: out.gap.summary(),
                    slowest_streams: out.slowest,
                    threads,
                    machine,
                };
                eprintln!(
                    "bench: floor round {round} {:<19} {:<17} {:>7.0} req/s p99 {:>8.1} µs CPU {:>6.1} µs/req{}{}{}",
                    scenario.label(),
                    name,
                    sample.req_per_s,
                    sample.latency.map_or(0.0, |l| l.p99_us),
                    cpu_us.unwrap_or(f64::NAN),
                    sample.machine.map_or_else(String::new, |m| format!(
                        "  sim {:.1} driver {:.1} µs/req, idle {} ‰",
                        m.sim_cpu_us.unwrap_or(f64::NAN),
                        m.driver_cpu_us.unwrap_or(f64::NAN),
                        m.idle_permille
                    )),
                    sample
                        .threads
                        .as_ref()
                        .map_or_else(String::new, |t| format!("  threads {}", t.cell())),
                    out.first_errors
                        .first()
                        .map_or_else(String::new, |e| format!(
                            "  ({} errors, first: {e})",
                            out.errors
                        )),
                );
                samples.push(sample);
            }
        }
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pct(p50: f64, p99: f64) -> Percentiles {
        Percentiles {
            p50_us: p50,
            p90_us: p99,
            p99_us: p99,
            max_us: p99,
            samples: 100,
        }
    }

    fn sample(
        target: &str,
        scenario: FloorScenario,
        round: u32,
        rps: f64,
        cpu: f64,
        p99: f64,
    ) -> FloorSample {
        FloorSample {
            target: target.into(),
            scenario,
            round,
            requests: 1000,
            errors: 0,
            req_per_s: rps,
            cpu_us: Some(cpu),
            latency: Some(pct(p99 / 3.0, p99)),
            net_ttft: None,
            net_ttft_recorded: Vec::new(),
            first_net_ttft_recorded: Vec::new(),
            gap: None,
            slowest_streams: Vec::new(),
            threads: None,
            machine: None,
        }
    }

    /// 98 streams at half of `ttft99` and 2 at `ttft99` (µs): a p99 of `ttft99`.
    fn stream(target: &str, round: u32, ttft99: f64, gap50: f64, gap99: f64) -> FloorSample {
        let ns = |us: f64| (us * 1000.0) as u64;
        FloorSample {
            net_ttft: Some(pct(ttft99 / 2.0, ttft99)),
            net_ttft_recorded: vec![(ns(ttft99 / 2.0), 98), (ns(ttft99), 2)],
            gap: Some(pct(gap50, gap99)),
            ..sample(
                target,
                FloorScenario::Stream,
                round,
                10.0,
                500.0,
                1_300_000.0,
            )
        }
    }

    /// keypool at 40 µs against nginx's 35 at c16, level with nginx at c64.
    fn report() -> FloorReport {
        let mut s = Vec::new();
        for round in 1..=3 {
            let r = f64::from(round);
            s.push(sample(
                NGINX,
                FloorScenario::C16,
                round,
                22_000.0 + r,
                35.0 + r,
                2_000.0,
            ));
            s.push(sample(
                KEYPOOL,
                FloorScenario::C16,
                round,
                20_000.0 + r,
                40.0 + r,
                2_500.0,
            ));
            s.push(sample(
                KEYPOOL_WARN,
                FloorScenario::C16,
                round,
                21_000.0,
                37.0 + r,
                2_400.0,
            ));
            s.push(sample(
                KEYPOOL_1000,
                FloorScenario::C16,
                round,
                19_900.0,
                41.0 + r,
                2_600.0,
            ));
            s.push(sample(
                NGINX,
                FloorScenario::C64,
                round,
                25_000.0,
                30.0,
                6_000.0,
            ));
            s.push(sample(
                NGINX_LOG,
                FloorScenario::C16,
                round,
                21_000.0,
                40.0 + 2.0 * r,
                2_100.0,
            ));
            s.push(sample(
                KEYPOOL,
                FloorScenario::C64,
                round,
                26_000.0,
                30.0,
                8_000.0,
            ));
            s.push(sample(
                NGINX,
                FloorScenario::C64Busy,
                round,
                15_000.0,
                32.0,
                6_500.0,
            ));
            s.push(sample(
                KEYPOOL,
                FloorScenario::C64Busy,
                round,
                14_000.0,
                33.0,
                40_000.0,
            ));
            s.push(stream(DIRECT, round, 300.0, 20_050.0, 20_300.0));
            s.push(stream(KEYPOOL, round, 400.0 + r, 20_060.0, 20_500.0));
        }
        let mut r = FloorReport {
            targets: vec![TargetInfo {
                name: HAPROXY.into(),
                description: "HAProxy".into(),
                skipped: Some("apt-get failed".into()),
                peak_rss_mib: None,
            }],
            samples: s,
            verdicts: Vec::new(),
        };
        r.compute_verdicts();
        r
    }

    #[test]
    fn medians_are_taken_over_the_rounds() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![f64::NAN]), None);
        let r = report();
        let k = r.medians(KEYPOOL, FloorScenario::C16);
        assert_eq!(k.rounds, 3);
        assert_eq!(k.cpu_us, Some(42.0));
        assert_eq!(k.cpu_us_range, Some((41.0, 43.0)));
        assert_eq!(k.req_per_s, Some(20_002.0));
        assert_eq!(k.p99_us, Some(2_500.0));
        assert_eq!(r.medians(HAPROXY, FloorScenario::C16).rounds, 0);
        assert_eq!(
            r.medians(KEYPOOL, FloorScenario::Stream).net_ttft_p99_us,
            Some(402.0)
        );
    }

    #[test]
    fn the_slowest_streams_of_every_round_are_listed_slowest_first() {
        let slow = |net: f64, nth: u64| SlowStream {
            net_ttft_us: net,
            start_ms: 12.0,
            worker: 3,
            nth,
        };
        let mut r = report();
        let mut s1 = stream(KEYPOOL, 1, 400.0, 20_000.0, 21_000.0);
        s1.slowest_streams = vec![slow(900.0, 0), slow(300.0, 5)];
        let mut s2 = stream(KEYPOOL, 2, 400.0, 20_000.0, 21_000.0);
        s2.slowest_streams = vec![slow(1_200.0, 7)];
        r.samples.extend([s1, s2]);
        let listed = r.slowest_streams(KEYPOOL, 2);
        assert_eq!(listed.len(), 2);
        assert_eq!((listed[0].0, listed[0].1.net_ttft_us), (2, 1_200.0));
        assert_eq!((listed[1].0, listed[1].1.nth), (1, 0));
        assert!(r.slowest_streams(NGINX, 10).is_empty());
        assert!(
            r.table().contains(
                "| keypool-rr8 | 1200 (r2, 12 ms, #7); 900 (r1, 12 ms, #0); 300 (r1, 12 ms, #5) |"
            ),
            "{}",
            r.table()
        );
    }

    #[test]
    fn the_ttft_verdict_pools_every_rounds_streams() {
        let ttft = |target: &str, round: u32, recorded: Vec<(u64, u64)>| FloorSample {
            net_ttft_recorded: recorded,
            ..stream(target, round, 200.0, 20_050.0, 20_300.0)
        };
        let mut r = report();
        r.samples.retain(|s| s.scenario != FloorScenario::Stream);
        for round in 1..=3 {
            r.samples.push(ttft(DIRECT, round, vec![(200_000, 100)]));
        }
        // Each round's p99 adds nothing in two rounds of three (a paired median of 0),
        // but 4 slow streams of 300 put the pooled p99 at 2 ms.
        r.samples.push(ttft(KEYPOOL, 1, vec![(200_000, 100)]));
        r.samples.push(ttft(KEYPOOL, 2, vec![(200_000, 100)]));
        r.samples
            .push(ttft(KEYPOOL, 3, vec![(200_000, 96), (2_000_000, 4)]));
        // Each round's first streams (16, one of them 5 ms) are kept apart: shown in the
        // table, not in the verdict's pool.
        for s in r.samples.iter_mut().filter(|s| s.target == KEYPOOL) {
            s.first_net_ttft_recorded = vec![(300_000, 15), (5_000_000, 1)];
        }
        let first = r
            .pooled_first_net_ttft(KEYPOOL, FloorScenario::Stream)
            .unwrap();
        assert_eq!(first.samples, 48);
        assert!((first.max_us - 5_000.0).abs() < 5.0, "{first:?}");
        assert!((first.p50_us - 300.0).abs() < 1.0, "{first:?}");
        let pooled = r.pooled_net_ttft(KEYPOOL, FloorScenario::Stream).unwrap();
        assert_eq!(pooled.samples, 300);
        assert!((pooled.p99_us - 2_000.0).abs() < 2.0, "{pooled:?}");
        assert!((pooled.p50_us - 200.0).abs() < 1.0, "{pooled:?}");
        r.compute_verdicts();
        let v = r
            .verdicts
            .iter()
            .find(|v| v.goal.starts_with("added streaming TTFT"))
            .unwrap();
        assert_eq!(v.met, Some(false), "{v:?}");
        assert!(v.measured.starts_with("+1800"), "{v:?}");
        assert!(v.measured.contains("of 300"), "{v:?}");
        let table = r.table();
        assert!(table.contains("| 300 |"), "{table}");
        assert!(table.contains("| 48 | 300.0 | 5001.2 |"), "{table}");
    }

    #[test]
    fn verdicts_check_each_issue_target() {
        let r = report();
        let met: Vec<Option<bool>> = r.verdicts.iter().map(|v| v.met).collect();
        assert_eq!(
            met,
            [
                Some(false), // CPU c16: 42 > 37
                Some(true),  // CPU c64: 30 <= 30
                Some(false), // req/s c16
                Some(true),  // req/s c64
                Some(true),  // p99 c64: 8.0 <= 9.0 ms
                Some(false), // p99 c64 busy: 40 > 9.75 ms
                Some(true),  // TTFT: 402 - 300 = +102 <= 150
                Some(true),  // gap: +10 / +200
                Some(true),  // 1,000 accounts: 43 / 42 = +2.4 %
                Some(true),  // the log line stated
                Some(true),  // c16 beside nginx's access log, stated
                None,        // c64: nginx with an access log not measured
            ]
        );
        assert_eq!(
            r.verdicts[10].measured,
            "keypool 42.0 us vs nginx with an access log 44.0 us (paired -5 %)"
        );
        assert!(r.verdicts[11].measured.starts_with("n/a"));
        assert_eq!(
            r.verdicts[0].measured,
            "keypool 42.0 us vs nginx 37.0 us (paired +14 %)"
        );
        assert_eq!(
            r.verdicts[5].measured,
            "keypool 40000.0 us vs nginx 6500.0 us (paired 6.15 x)"
        );
        assert_eq!(
            r.verdicts[9].measured,
            "+3.0 us paired (42.0 us at info, 39.0 us at warn)"
        );
        assert_eq!(r.verdicts[8].measured, "43.0 us vs 42.0 us (paired +2.4 %)");
        assert!(
            r.verdicts[6]
                .measured
                .starts_with("+102.1 us (p99 of the pooled streams, each worker's first of a round apart (table): keypool 402.2 us of 300"),
            "{}",
            r.verdicts[6].measured
        );
    }

    #[test]
    fn paired_ratios_are_taken_within_each_round() {
        let mut r = FloorReport::default();
        // Round 1 ran on a quiet machine, rounds 2 and 3 on a loaded one; round 4
        // measured only keypool and pairs with nothing.
        for (round, k, n) in [(1, 10.0, 8.0), (2, 20.0, 19.0), (3, 30.0, 29.0)] {
            r.samples
                .push(sample(KEYPOOL, FloorScenario::C16, round, 1.0, k, 1.0));
            r.samples
                .push(sample(NGINX, FloorScenario::C16, round, 1.0, n, 1.0));
        }
        r.samples
            .push(sample(KEYPOOL, FloorScenario::C16, 4, 1.0, 1.0, 1.0));
        let cpu = |s: &FloorSample| s.cpu_us;
        let paired = r.paired(KEYPOOL, NGINX, FloorScenario::C16, Paired::Ratio, cpu);
        assert_eq!(paired, Some(20.0 / 19.0));
        // The medians of the values would compare 15 (rounds 1-4) with 19.
        assert_eq!(r.medians(KEYPOOL, FloorScenario::C16).cpu_us, Some(15.0));
        assert_eq!(
            r.paired(KEYPOOL, HAPROXY, FloorScenario::C16, Paired::Ratio, cpu),
            None
        );
        assert_eq!(
            r.paired(KEYPOOL, NGINX, FloorScenario::C64, Paired::Ratio, cpu),
            None
        );
        // Differences pair the same way: 2, 1 and 1 µs.
        assert_eq!(
            r.paired(KEYPOOL, NGINX, FloorScenario::C16, Paired::Difference, cpu),
            Some(1.0)
        );
    }

    #[test]
    fn verdicts_without_nginx_are_not_applicable() {
        let mut r = report();
        r.samples.retain(|s| s.target != NGINX);
        r.compute_verdicts();
        assert!(r.verdicts[..6].iter().all(|v| v.met.is_none()));
        assert!(r.verdicts[0].measured.starts_with("n/a"));
        // The keypool-only targets are still judged.
        assert_eq!(r.verdicts[8].met, Some(true));
    }

    #[test]
    fn table_shows_medians_skips_and_verdicts() {
        let t = report().table();
        assert!(
            t.contains("| c16 | keypool-rr8 | 3 | 0 | 20002 | 833.3 | 2500.0 | 42.0 | 41.0–43.0 |"),
            "{t}"
        );
        assert!(
            t.contains("| keypool-rr8 | 3 | 0 | 201.0 | 402.0 | 300 | 402.2 | +102.1 |"),
            "{t}"
        );
        assert!(t.contains("| haproxy | SKIPPED: apt-get failed |"), "{t}");
        assert!(t.contains("| CPU per request at c16 <= nginx's | keypool 42.0 us vs nginx 37.0 us (paired +14 %) | MISSED |"), "{t}");
        assert!(t.contains("| stated |"), "{t}");
        assert!(
            t.contains("| c16 | nginx-access-log | 3 | 0 | 21000 |"),
            "{t}"
        );
        assert!(!t.contains("| c64 | haproxy"), "{t}");
    }

    #[test]
    fn worker_connections_are_read_by_worker_number() {
        let text = "# HELP keypool_worker_connections Open client connections on each worker thread.\n\
            # TYPE keypool_worker_connections gauge\n\
            keypool_worker_connections{worker=\"1\"} 3\n\
            keypool_worker_connections{worker=\"0\"} 61\n\
            keypool_worker_connections_other{worker=\"0\"} 9\n\
            keypool_worker_load_ratio{worker=\"0\",kind=\"ran\"} 0.9\n\
            keypool_connections_moved_total 12\n";
        assert_eq!(worker_connections(text), vec![61, 3]);
        assert_eq!(
            worker_connections("keypool_worker_connections{worker=\"2\"} 5\n"),
            vec![0, 0, 5]
        );
        assert_eq!(worker_connections("keypool_up 1\n"), Vec::<u64>::new());
        assert_eq!(
            driver::counter_sum(text, "keypool_connections_moved_total"),
            12.0
        );
    }

    #[test]
    fn worker_loads_are_read_in_thousandths_by_worker_number() {
        let text = "# HELP keypool_worker_load_ratio Share of the last seconds.\n\
            # TYPE keypool_worker_load_ratio gauge\n\
            keypool_worker_load_ratio{worker=\"1\",kind=\"waited\"} 0.004\n\
            keypool_worker_load_ratio{worker=\"0\",kind=\"ran\"} 0.9305\n\
            keypool_worker_load_ratio{worker=\"0\",kind=\"waited\"} 0.052\n\
            keypool_worker_load_ratio{worker=\"1\",kind=\"ran\"} 0.25\n\
            keypool_worker_load_ratio{worker=\"1\",kind=\"other\"} 0.5\n\
            keypool_worker_connections{worker=\"0\"} 61\n";
        let load = |ran, waited| Some(WorkerLoad { ran, waited });
        assert_eq!(worker_loads(text, 2), vec![load(931, 52), load(250, 4)]);
        // padded to the workers: a worker keypool leaves out (its load not known) is
        // `None`, beside one it reports
        assert_eq!(
            worker_loads(text, 3),
            vec![load(931, 52), load(250, 4), None]
        );
        assert_eq!(
            worker_loads(
                "keypool_worker_load_ratio{worker=\"1\",kind=\"waited\"} 0.1\n",
                2
            ),
            vec![None, load(0, 100)]
        );
        // a share is clamped to the whole of the time
        assert_eq!(
            worker_loads(
                "keypool_worker_load_ratio{worker=\"0\",kind=\"ran\"} 1.5\n",
                1
            ),
            vec![load(1000, 0)]
        );
        // no load at all (a kernel that does not tell): nothing, not a row of unknowns
        assert_eq!(worker_loads("keypool_up 1\n", 2), Vec::new());
        assert_eq!(
            worker_loads(
                "keypool_worker_load_ratio{worker=\"0\",kind=\"other\"} 0.5\n",
                2
            ),
            Vec::new()
        );
    }

    #[test]
    fn threads_read_before_loads_were_kept_still_load() {
        // a report.json written before the loads were read
        let old: Threads = serde_json::from_str(r#"{"moved":3,"connections":[64,0]}"#).unwrap();
        assert_eq!(
            old,
            Threads {
                moved: 3,
                connections: vec![64, 0],
                load: Vec::new(),
            }
        );
        assert_eq!(old.cell(), "64/0, 3 moved");
        // and no loads are written as no key at all
        let text = serde_json::to_string(&old).unwrap();
        assert!(!text.contains("load"), "{text}");
        let with = Threads {
            load: vec![Some(WorkerLoad { ran: 5, waited: 6 }), None],
            ..old
        };
        let back: Threads = serde_json::from_str(&serde_json::to_string(&with).unwrap()).unwrap();
        assert_eq!(back, with);
    }

    #[test]
    fn the_threads_of_each_round_are_listed_beside_its_cpu() {
        let mut r = report();
        let t = r.table();
        assert!(
            !t.contains("connections per worker thread"),
            "no readings, no table: {t}"
        );
        for s in r
            .samples
            .iter_mut()
            .filter(|s| s.target == KEYPOOL && s.scenario == FloorScenario::C64)
        {
            s.threads = Some(Threads {
                moved: u64::from(s.round == 2) * 32,
                connections: if s.round == 2 {
                    vec![33, 32]
                } else {
                    vec![65, 0]
                },
                load: if s.round == 3 {
                    vec![
                        Some(WorkerLoad {
                            ran: 930,
                            waited: 52,
                        }),
                        None,
                    ]
                } else {
                    Vec::new()
                },
            });
        }
        let t = r.table();
        assert!(
            t.contains("| c64 | keypool-rr8 | r1: 65/0, 0 moved; 30.0 µs · r2: 33/32, 32 moved; 30.0 µs · r3: 65/0, 0 moved, ran 930/- ‰, waited 52/- ‰; 30.0 µs |"),
            "{t}"
        );
        assert!(!t.contains("| c16 | keypool-rr8 | r1"), "{t}");
    }

    #[test]
    fn the_machines_split_is_per_request_and_in_thousandths() {
        let busy_idle = |busy, idle, steal| procs::MachineTicks { busy, idle, steal };
        // 100 ticks a second, 1,000 requests: a tick is 10 µs per request
        let m = Machine::of(Some(150), Some(80), busy_idle(700, 250, 50), 100, 1000).unwrap();
        assert_eq!(m.sim_cpu_us, Some(1500.0));
        assert_eq!(m.driver_cpu_us, Some(800.0));
        assert_eq!((m.idle_permille, m.steal_permille), (250, 50));
        // the target is the simulator: no simulator apart
        let bare = Machine::of(None, Some(80), busy_idle(1, 0, 0), 100, 1000).unwrap();
        assert_eq!((bare.sim_cpu_us, bare.idle_permille), (None, 0));
        assert_eq!(
            Machine::of(Some(1), Some(1), busy_idle(0, 0, 0), 100, 1000),
            None
        );
        assert_eq!(
            Machine::of(Some(1), Some(1), busy_idle(9, 1, 0), 100, 0),
            None
        );
        // a sample read before the split existed still reads
        let old =
            serde_json::to_string(&sample(NGINX, FloorScenario::C64, 1, 1.0, 1.0, 1.0)).unwrap();
        assert!(!old.contains("machine"), "{old}");
        let back: FloorSample = serde_json::from_str(&old).unwrap();
        assert_eq!(back.machine, None);
    }

    #[test]
    fn the_machines_split_is_listed_by_target_with_its_medians() {
        let mut r = report();
        assert!(!r.table().contains("CPUs idle"), "no readings, no table");
        for s in r
            .samples
            .iter_mut()
            .filter(|s| s.scenario == FloorScenario::C64)
        {
            let keypool = s.target == KEYPOOL;
            // rounds 1–3: the simulator 21, 22, 23 (keypool), the driver 27, 24, 25: the
            // three added up per round 78, 76, 78 (median 78), where the medians of the
            // columns add up to 30 + 22 + 25 = 77
            s.machine = Some(Machine {
                sim_cpu_us: Some(if keypool { 20.0 } else { 19.0 } + f64::from(s.round)),
                driver_cpu_us: Some([27.0, 24.0, 25.0][s.round as usize - 1]),
                idle_permille: if keypool { 40 + s.round } else { 5 },
                steal_permille: 1,
            });
        }
        let md = r.medians(KEYPOOL, FloorScenario::C64);
        assert_eq!(md.sim_cpu_us, Some(22.0));
        assert_eq!(md.idle_permille, Some(42.0));
        assert_eq!(md.all_cpu_us, Some(78.0), "the median of the rounds' sums");
        let t = r.table();
        assert!(
            t.contains("| c64 | keypool-rr8 | 26000 | 30.0 | 22.0 | 25.0 | 78.0 | 42 | 1 |"),
            "{t}"
        );
        assert!(
            t.contains("| c64 | nginx | 25000 | 30.0 | 21.0 | 25.0 | 77.0 | 5 | 1 |"),
            "{t}"
        );
        assert!(!t.contains("| c16 | keypool-rr8 | 2"), "{t}");
    }

    #[test]
    fn rounds_rotate_the_order() {
        let t = [NGINX, HAPROXY, KEYPOOL];
        assert_eq!(round_order(&t, 1), [NGINX, HAPROXY, KEYPOOL]);
        assert_eq!(round_order(&t, 2), [HAPROXY, KEYPOOL, NGINX]);
        assert_eq!(round_order(&t, 4), [NGINX, HAPROXY, KEYPOOL]);
        assert!(round_order(&[], 3).is_empty());
        assert!(FloorPlan::new(false).rounds >= 3 && FloorPlan::new(true).rounds >= 3);
    }

    #[test]
    fn nginx_config_keeps_upstream_connections_and_sets_the_key() {
        let text = nginx_config(
            Path::new("/tmp/b/nginx"),
            "127.0.0.1:9000".parse().unwrap(),
            "http://127.0.0.1:9001",
            "http://127.0.0.1:9002",
            "sk-x",
            false,
        );
        assert!(text.contains("worker_processes 2;"), "{text}");
        assert!(
            text.contains("upstream fast {\n        server 127.0.0.1:9001;\n        keepalive 64;"),
            "{text}"
        );
        assert!(text.contains("server 127.0.0.1:9002;"), "{text}");
        assert!(text.contains("listen 127.0.0.1:9000;"), "{text}");
        assert_eq!(
            text.matches("proxy_set_header x-api-key \"sk-x\";").count(),
            2
        );
        assert_eq!(text.matches("proxy_set_header Connection \"\";").count(), 2);
        assert!(
            text.contains("location /fast/ {\n            proxy_pass http://fast/;"),
            "{text}"
        );
        let slow = &text[text.find("location /slow/").unwrap()..];
        assert!(slow.contains("proxy_buffering off;"), "{text}");
        assert!(text.contains("pid /tmp/b/nginx/nginx.pid;") && text.contains("access_log off;"));
        assert_eq!(text.matches('{').count(), text.matches('}').count());
    }

    #[test]
    fn nginx_with_an_access_log_writes_one_buffered_line_per_request() {
        let text = nginx_config(
            Path::new("/tmp/b/nginx-access-log"),
            "127.0.0.1:9000".parse().unwrap(),
            "http://127.0.0.1:9001",
            "http://127.0.0.1:9002",
            "sk-x",
            true,
        );
        assert!(!text.contains("access_log off;"), "{text}");
        assert!(
            text.contains(
                "access_log /tmp/b/nginx-access-log/access.log requests buffer=64k flush=1s;"
            ),
            "{text}"
        );
        let format = format!("log_format requests '{ACCESS_LOG_FORMAT}';");
        assert!(text.contains(&format), "{text}");
        assert!(
            ACCESS_LOG_FORMAT.contains("$status $body_bytes_sent $request_time"),
            "{ACCESS_LOG_FORMAT}"
        );
        assert!(!ACCESS_LOG_FORMAT.contains('\''));
        // The rest is the plain config's.
        assert_eq!(
            text.matches("proxy_set_header x-api-key \"sk-x\";").count(),
            2
        );
        assert_eq!(text.matches('{').count(), text.matches('}').count());
    }

    #[test]
    fn haproxy_config_reuses_connections_and_sets_the_key() {
        let text = haproxy_config(
            "127.0.0.1:9000".parse().unwrap(),
            "http://127.0.0.1:9001",
            "http://127.0.0.1:9002",
            "sk-x",
        );
        assert!(text.contains("nbthread 2\n"), "{text}");
        assert!(text.contains("http-reuse always\n"), "{text}");
        assert!(text.contains("option http-no-delay\n"), "{text}");
        assert!(text.contains("bind 127.0.0.1:9000\n"), "{text}");
        assert!(
            text.contains("use_backend slow if { path_beg /slow/ }"),
            "{text}"
        );
        assert_eq!(
            text.matches("http-request set-header x-api-key \"sk-x\"")
                .count(),
            2
        );
        assert!(text.contains("backend fast\n    http-request set-header x-api-key \"sk-x\"\n    http-request replace-path ^/fast(/.*) \\1\n    server sim 127.0.0.1:9001\n"), "{text}");
        assert!(text.contains("server sim 127.0.0.1:9002"), "{text}");
    }
}
