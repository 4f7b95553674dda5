//! The load driver: a hyper 1 client (keep-alive, `TCP_NODELAY`) that sends the same
//! request again and again and records latencies in histograms.
//!
//! - [`closed_loop`]: `concurrency` workers, each sending its next request when the
//!   previous one is complete; bounded by a request count or a duration. Concurrency 1
//!   measures latency; concurrency 16 measures the most req/s.
//! - [`constant_rate`]: requests are due at `start + i / rate`; a worker that picks up a
//!   request already overdue (all workers were busy: the target is queueing) measures it
//!   from its due time, not from when it was sent, so a stall counts for every request
//!   it delayed (no coordinated omission). A worker that is early sleeps until the due
//!   time and measures from when it woke (tokio's timer wakes up to 1 ms late; that is
//!   the driver's lateness, not the target's).
//! - Streams: time to the first body chunk (TTFT) and every gap between chunks.
//!
//! Every request has a timeout; every run is bounded in requests and time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::stats::{Latencies, intended_offset};

/// The longest a single request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How many of a run's slowest streams (by net TTFT) [`Outcome::slowest`] keeps.
pub const SLOWEST_KEPT: usize = 8;

/// The HTTP client of every run.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A keep-alive HTTP/1.1 client with `TCP_NODELAY`.
pub fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(512)
        .pool_idle_timeout(Duration::from_secs(60))
        .build(connector)
}

/// One request, sent again and again.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `http://127.0.0.1:PORT/…/v1/messages`.
    pub uri: Uri,
    /// Headers (credential, `anthropic-version`, `content-type`, peer-specific ones).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The JSON body.
    pub body: Bytes,
    /// Whether the answer is an SSE stream (TTFT and gaps are recorded, and the stream
    /// must end with `message_stop`).
    pub stream: bool,
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Whole-request latency of successful requests.
    pub latency: Latencies,
    /// Streams: time to the first body chunk.
    pub ttft: Latencies,
    /// Streams: time to the first body chunk minus the upstream's own wait, when the
    /// simulator reported it (`--think-time-in-id`): what lies between the client and
    /// the upstream, without the upstream's timer jitter.
    pub net_ttft: Latencies,
    /// Streams: the net TTFT of each closed-loop worker's first stream of the run, kept
    /// out of `net_ttft`. When a target's samples are further apart than the pool's
    /// idle timeout (a full floor run), a run's first streams open their connections,
    /// through processes that idled meanwhile. In a traced quick run with a 5 s idle
    /// timeout, the first stream of a sample took 2–5 ms in 7 of the 9 samples of
    /// nginx, HAProxy and keypool (BENCHMARKS, "An AMD host, and the first stream of a
    /// sample counted apart"). `net_ttft` is what a target adds to a stream on a
    /// client connection that is (mostly) open, as a client's keep-alive one is.
    pub first_net_ttft: Latencies,
    /// Streams: gaps between body chunks.
    pub gap: Latencies,
    /// Closed loops: the [`SLOWEST_KEPT`] streams of the highest net TTFT, slowest
    /// first, with where they fell in the run.
    pub slowest: Vec<SlowStream>,
    /// Successful requests.
    pub ok: u64,
    /// Failed requests.
    pub errors: u64,
    /// The first few error descriptions.
    pub first_errors: Vec<String>,
    /// Wall time of the run.
    pub elapsed: Duration,
}

/// One of a run's slowest streams and where it fell: whether the slow ones are each
/// worker's first request of the run, come at one moment (a stall of the target) or
/// are spread out.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SlowStream {
    /// TTFT net of the simulator's wait, µs.
    pub net_ttft_us: f64,
    /// When it was sent, ms into the run.
    pub start_ms: f64,
    /// The closed-loop worker that sent it.
    pub worker: usize,
    /// That worker's request number in the run, from 0.
    pub nth: u64,
}

impl Outcome {
    fn merge(&mut self, other: Outcome) {
        self.latency.merge(&other.latency);
        self.ttft.merge(&other.ttft);
        self.net_ttft.merge(&other.net_ttft);
        self.first_net_ttft.merge(&other.first_net_ttft);
        self.gap.merge(&other.gap);
        for s in other.slowest {
            self.keep_if_slow(s);
        }
        self.ok += other.ok;
        self.errors += other.errors;
        for e in other.first_errors {
            if self.first_errors.len() < 5 {
                self.first_errors.push(e);
            }
        }
    }

    /// Keeps `s` among the [`SLOWEST_KEPT`] slowest streams.
    fn keep_if_slow(&mut self, s: SlowStream) {
        let at = self
            .slowest
            .partition_point(|k| k.net_ttft_us >= s.net_ttft_us);
        if at < SLOWEST_KEPT {
            self.slowest.insert(at, s);
            self.slowest.truncate(SLOWEST_KEPT);
        }
    }

    fn error(&mut self, e: String) {
        self.errors += 1;
        if self.first_errors.len() < 5 {
            self.first_errors.push(e);
        }
    }
}

/// Sends one request; records it into `out` measuring from `start`. Returns a stream's
/// net TTFT when it was recorded (into `first_net_ttft` when `first_of_worker`, else
/// into `net_ttft`).
async fn one(
    client: &HttpClient,
    ep: &Endpoint,
    start: Instant,
    first_of_worker: bool,
    out: &mut Outcome,
) -> Option<Duration> {
    let mut builder = Request::post(ep.uri.clone());
    for (name, value) in &ep.headers {
        builder = builder.header(name, value);
    }
    let request = match builder.body(Full::new(ep.body.clone())) {
        Ok(r) => r,
        Err(e) => {
            out.error(format!("cannot build the request: {e}"));
            return None;
        }
    };
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| format!("request failed: {e:?}"))?;
        let status = response.status();
        let mut body = response.into_body();
        let mut first: Option<Instant> = None;
        let mut think: Option<Duration> = None;
        let mut last = start;
        let mut gaps = Vec::new();
        let mut tail: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("body failed: {e}"))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if data.is_empty() {
                continue;
            }
            let now = Instant::now();
            if first.is_none() {
                first = Some(now);
                think = think_time(&data);
            } else {
                gaps.push(now - last);
            }
            last = now;
            // Keep the end of the body to check it (and small bodies whole for errors).
            tail.extend_from_slice(&data);
            if tail.len() > 4096 {
                tail.drain(..tail.len() - 256);
            }
        }
        let end = Instant::now();
        if status != StatusCode::OK {
            return Err(format!(
                "status {status}: {}",
                String::from_utf8_lossy(&tail[..tail.len().min(300)])
            ));
        }
        if ep.stream && !contains(&tail, b"message_stop") {
            return Err("stream ended without message_stop".to_owned());
        }
        Ok((end, first, think, gaps))
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
        Ok(Ok((end, first, think, gaps))) => {
            out.ok += 1;
            out.latency.record(end - start);
            let mut net = None;
            if ep.stream {
                if let Some(first) = first {
                    out.ttft.record(first - start);
                    if let Some(think) = think {
                        let n = (first - start).saturating_sub(think);
                        if first_of_worker {
                            out.first_net_ttft.record(n);
                        } else {
                            out.net_ttft.record(n);
                        }
                        net = Some(n);
                    }
                }
                for g in gaps {
                    out.gap.record(g);
                }
            }
            net
        }
        Ok(Err(e)) => {
            out.error(e);
            None
        }
        Err(_) => {
            out.error(format!("no complete answer within {REQUEST_TIMEOUT:?}"));
            None
        }
    }
}

/// The upstream's own wait a `keypool-sim --think-time-in-id` wrote into the message
/// id of the first chunk (`…_think<ns>"`), if any.
fn think_time(chunk: &[u8]) -> Option<Duration> {
    const MARK: &[u8] = b"_think";
    let at = chunk.windows(MARK.len()).position(|w| w == MARK)? + MARK.len();
    let digits = chunk[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    let ns: u64 = std::str::from_utf8(&chunk[at..at + digits])
        .ok()?
        .parse()
        .ok()?;
    Some(Duration::from_nanos(ns))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// How long a closed-loop run goes on.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Stop after this many requests (over all workers), if set.
    pub requests: Option<u64>,
    /// Stop starting new requests after this long.
    pub duration: Duration,
    /// Pause between a worker's requests (not measured).
    pub pause: Duration,
}

/// `concurrency` workers sending back to back until `bounds` says stop.
pub async fn closed_loop(
    client: &HttpClient,
    ep: &Endpoint,
    concurrency: usize,
    bounds: Bounds,
) -> Outcome {
    closed_loop_staggered(client, ep, concurrency, bounds, Duration::ZERO).await
}

/// [`closed_loop`] whose worker `i` sends its first request `i × stagger` into the
/// run: long requests (streams) then start one at a time, as from independent
/// callers, instead of all at once and in lockstep for the whole run (each worker's
/// next stream starts when its last one ends, so workers that start together stay
/// together, and every stream would queue behind the others of its burst).
pub async fn closed_loop_staggered(
    client: &HttpClient,
    ep: &Endpoint,
    concurrency: usize,
    bounds: Bounds,
    stagger: Duration,
) -> Outcome {
    let issued = Arc::new(AtomicU64::new(0));
    // Each worker's histograms are made before the run starts: four of ~230 KB each,
    // zeroed, per worker. Made by the workers themselves, the 16 workers' ~15 MB were
    // zeroed inside the timed window, while worker 0's first request was in flight, on
    // the CPUs the target and the simulator share with the driver. (It is not what makes
    // a run's first stream slow when its connections are new: BENCHMARKS, "The first
    // stream of a sample".)
    let outcomes: Vec<Outcome> = (0..concurrency.max(1))
        .map(|_| Outcome::default())
        .collect();
    let begin = Instant::now();
    let deadline = begin + bounds.duration;
    let mut tasks = Vec::with_capacity(concurrency);
    for (worker, mut out) in outcomes.into_iter().enumerate() {
        let client = client.clone();
        let ep = ep.clone();
        let issued = issued.clone();
        let first = begin + stagger * u32::try_from(worker).unwrap_or(u32::MAX);
        tasks.push(tokio::spawn(async move {
            if first > begin {
                tokio::time::sleep_until(first).await;
            }
            for nth in 0.. {
                if Instant::now() >= deadline {
                    break;
                }
                let n = issued.fetch_add(1, Ordering::Relaxed);
                if bounds.requests.is_some_and(|max| n >= max) {
                    break;
                }
                let start = Instant::now();
                if let Some(net) = one(&client, &ep, start, nth == 0, &mut out).await {
                    out.keep_if_slow(SlowStream {
                        net_ttft_us: net.as_secs_f64() * 1e6,
                        start_ms: (start - begin).as_secs_f64() * 1e3,
                        worker,
                        nth,
                    });
                }
                if !bounds.pause.is_zero() {
                    tokio::time::sleep(bounds.pause).await;
                }
            }
            out
        }));
    }
    let mut total = Outcome::default();
    for t in tasks {
        match t.await {
            Ok(out) => total.merge(out),
            Err(e) => total.error(format!("worker failed: {e}")),
        }
    }
    total.elapsed = begin.elapsed();
    total
}

/// Requests due at `rate` per second for `duration`, sent by up to `workers` at once,
/// measured from their due time when they start late (see the module docs).
pub async fn constant_rate(
    client: &HttpClient,
    ep: &Endpoint,
    rate: f64,
    duration: Duration,
    workers: usize,
) -> Outcome {
    let total = (rate * duration.as_secs_f64()).ceil() as u64;
    let next = Arc::new(AtomicU64::new(0));
    // Made before the schedule starts, as in `closed_loop_staggered`.
    let outcomes: Vec<Outcome> = (0..workers.max(1)).map(|_| Outcome::default()).collect();
    let begin = Instant::now() + Duration::from_millis(5);
    // Hard stop: the schedule plus the longest a request may take.
    let hard_stop = begin + duration + REQUEST_TIMEOUT;
    let mut tasks = Vec::with_capacity(workers);
    for mut out in outcomes {
        let client = client.clone();
        let ep = ep.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total || Instant::now() >= hard_stop {
                    break;
                }
                let due = begin + intended_offset(i, rate);
                let start = if Instant::now() >= due {
                    due
                } else {
                    tokio::time::sleep_until(due).await;
                    Instant::now()
                };
                // a schedule, not a worker's run: every stream counts in `net_ttft`
                one(&client, &ep, start, false, &mut out).await;
            }
            out
        }));
    }
    let mut out = Outcome::default();
    for t in tasks {
        match t.await {
            Ok(o) => out.merge(o),
            Err(e) => out.error(format!("worker failed: {e}")),
        }
    }
    out.elapsed = begin.elapsed();
    out
}

/// `GET uri` and the body as text, or `None` on any failure (within 5 s).
pub async fn get_text(client: &HttpClient, uri: &Uri) -> Option<(StatusCode, String)> {
    let request = Request::get(uri.clone())
        .body(Full::new(Bytes::new()))
        .ok()?;
    let exchange = async {
        let response = client.request(request).await.ok()?;
        let status = response.status();
        let body = response.into_body().collect().await.ok()?.to_bytes();
        Some((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// The sum of every sample of a Prometheus counter `name` (all label sets) in a
/// `/metrics` text.
pub fn counter_sum(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            // `name{…} v` or `name v`, not `name_suffix …`.
            let value = if rest.starts_with('{') {
                &rest[rest.find('}')? + 1..]
            } else if rest.starts_with(' ') {
                rest
            } else {
                return None;
            };
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_over_labels_only_for_the_exact_name() {
        let text = "# HELP keypool_failovers_total Failovers.\n\
                    # TYPE keypool_failovers_total counter\n\
                    keypool_failovers_total{org=\"bench\",reason=\"rate_limit\"} 41\n\
                    keypool_failovers_total{org=\"bench\",reason=\"overloaded\"} 1\n\
                    keypool_failovers_total_extra 100\n\
                    keypool_requests_total 7\n";
        assert_eq!(counter_sum(text, "keypool_failovers_total"), 42.0);
        assert_eq!(counter_sum(text, "keypool_requests_total"), 7.0);
        assert_eq!(counter_sum(text, "nothing"), 0.0);
    }

    #[test]
    fn the_slowest_streams_are_kept_in_order_across_workers() {
        let stream = |net: f64, worker: usize| SlowStream {
            net_ttft_us: net,
            start_ms: net / 10.0,
            worker,
            nth: 0,
        };
        let (mut a, mut b) = (Outcome::default(), Outcome::default());
        for i in 0..10 {
            a.keep_if_slow(stream(f64::from(i) * 100.0, 0));
            b.keep_if_slow(stream(f64::from(i) * 100.0 + 50.0, 1));
        }
        assert_eq!(a.slowest.len(), SLOWEST_KEPT);
        assert_eq!(a.slowest[0].net_ttft_us, 900.0);
        assert_eq!(a.slowest[SLOWEST_KEPT - 1].net_ttft_us, 200.0);
        a.merge(b);
        let kept: Vec<f64> = a.slowest.iter().map(|s| s.net_ttft_us).collect();
        assert_eq!(
            kept,
            [950.0, 900.0, 850.0, 800.0, 750.0, 700.0, 650.0, 600.0]
        );
        assert_eq!(a.slowest[0].worker, 1);
    }

    #[test]
    fn contains_finds_the_stream_end() {
        assert!(contains(
            b"event: message_stop\ndata: {}\n\n",
            b"message_stop"
        ));
        assert!(!contains(b"event: ping", b"message_stop"));
    }

    #[test]
    fn outcome_merge_adds_and_keeps_five_errors() {
        let mut a = Outcome {
            ok: 2,
            ..Outcome::default()
        };
        for i in 0..4 {
            a.error(format!("a{i}"));
        }
        let mut b = Outcome {
            ok: 3,
            ..Outcome::default()
        };
        b.latency.record(Duration::from_micros(50));
        b.error("b0".into());
        b.error("b1".into());
        a.merge(b);
        assert_eq!((a.ok, a.errors), (5, 6));
        assert_eq!(a.first_errors, ["a0", "a1", "a2", "a3", "b0"]);
        assert_eq!(a.latency.len(), 1);
    }

    use keypool_sim::{Behaviour, Delay, OkSpec, Script, Sim, SimConfig, SimHandle};

    async fn sim(script: Script) -> SimHandle {
        Sim::start(SimConfig::new().any_credential(script).record_limit(0))
            .await
            .unwrap()
    }

    /// A simulator streaming `chunks` deltas `interval_ms` apart after a 10 ms wait
    /// that it reports in the message id (`--think-time-in-id`).
    async fn stream_sim(chunks: u32, interval_ms: u64) -> SimHandle {
        let spec = OkSpec::default()
            .ttft(Delay::ms(10))
            .think_time_in_id(true)
            .chunks(chunks)
            .chunk_interval(Delay::ms(interval_ms));
        sim(Script::new(Behaviour::Ok(spec))).await
    }

    fn endpoint(sim: &SimHandle, stream: bool) -> Endpoint {
        let body = if stream {
            r#"{"model":"m","max_tokens":8,"messages":[],"stream":true}"#
        } else {
            r#"{"model":"m","max_tokens":8,"messages":[]}"#
        };
        Endpoint {
            uri: format!("{}/v1/messages", sim.base_url()).parse().unwrap(),
            headers: vec![
                (
                    HeaderName::from_static("x-api-key"),
                    HeaderValue::from_static("sk-ant-api03-test"),
                ),
                (
                    HeaderName::from_static("content-type"),
                    HeaderValue::from_static("application/json"),
                ),
            ],
            body: Bytes::from_static(body.as_bytes()),
            stream,
        }
    }

    fn bounds(requests: u64) -> Bounds {
        Bounds {
            requests: Some(requests),
            duration: Duration::from_secs(20),
            pause: Duration::ZERO,
        }
    }

    #[tokio::test]
    async fn closed_loop_stops_at_the_request_count() {
        let sim = sim(Script::ok()).await;
        let out = closed_loop(&client(), &endpoint(&sim, false), 3, bounds(20)).await;
        assert_eq!((out.ok, out.errors), (20, 0), "{:?}", out.first_errors);
        assert_eq!(out.latency.len(), 20);
        assert_eq!(out.ttft.len(), 0);
        assert_eq!(sim.total_stats().requests, 20);
        sim.shutdown().await;
    }

    #[test]
    fn think_times_are_read_from_the_message_id() {
        let chunk = br#"event: message_start
data: {"type":"message_start","message":{"id":"msg_sim00000000000000000007_think20531000","type":"message"}}"#;
        assert_eq!(think_time(chunk), Some(Duration::from_nanos(20_531_000)));
        assert_eq!(think_time(br#"{"id":"msg_sim00000000000000000007"}"#), None);
        assert_eq!(think_time(br#"{"id":"msg_think"}"#), None);
    }

    #[tokio::test]
    async fn streams_record_ttft_and_gaps() {
        // 10 ms to the first frames, reported as think time; 5 deltas 5 ms apart: the
        // first goes with message_start, then 4 paced writes.
        let sim = stream_sim(5, 5).await;
        let out = closed_loop(&client(), &endpoint(&sim, true), 2, bounds(4)).await;
        assert_eq!((out.ok, out.errors), (4, 0), "{:?}", out.first_errors);
        assert_eq!(out.ttft.len(), 4);
        // The simulator's 10 ms wait is taken out of the net figure; each worker's
        // first stream is counted apart.
        assert_eq!(out.first_net_ttft.len(), 2);
        assert_eq!(out.net_ttft.len(), 2);
        let (ttft, net) = (out.ttft.summary().unwrap(), out.net_ttft.summary().unwrap());
        assert!(ttft.p50_us >= 10_000.0, "{ttft:?}");
        // Each net TTFT is its TTFT less a think time of at least 10 ms (whatever the
        // machine's load, which moves both alike).
        assert!(net.max_us <= ttft.max_us - 9_000.0, "{net:?} vs {ttft:?}");
        // 4 gaps per stream unless the network merged two writes.
        assert!((8..=16).contains(&out.gap.len()), "{}", out.gap.len());
        let gap = out.gap.summary().unwrap();
        assert!(gap.max_us >= 4_000.0, "{gap:?}");
        // Every stream is among the kept slowest (fewer than SLOWEST_KEPT), slowest
        // first, two per worker.
        assert_eq!(out.slowest.len(), 4);
        assert!(
            out.slowest
                .windows(2)
                .all(|w| w[0].net_ttft_us >= w[1].net_ttft_us)
        );
        let mut who: Vec<(usize, u64)> = out.slowest.iter().map(|s| (s.worker, s.nth)).collect();
        who.sort_unstable();
        assert_eq!(who.len(), 4);
        assert!(who.iter().all(|&(w, n)| w < 2 && n < 4), "{who:?}");
        let total = out.latency.summary().unwrap();
        assert!(total.p50_us >= 20_000.0, "{total:?}");
        sim.shutdown().await;
    }

    #[tokio::test]
    async fn staggered_workers_start_one_stagger_apart() {
        // One 210 ms stream per worker (so no worker takes a second one); worker i
        // starts i × 50 ms into the run, not before.
        let sim = stream_sim(2, 100).await;
        let bounds = Bounds {
            requests: Some(3),
            duration: Duration::from_secs(5),
            pause: Duration::ZERO,
        };
        let ep = endpoint(&sim, true);
        let out = closed_loop_staggered(&client(), &ep, 3, bounds, Duration::from_millis(50)).await;
        assert_eq!((out.ok, out.errors), (3, 0), "{:?}", out.first_errors);
        let mut starts: Vec<(usize, f64)> =
            out.slowest.iter().map(|s| (s.worker, s.start_ms)).collect();
        starts.sort_by_key(|s| s.0);
        assert_eq!(starts.iter().map(|s| s.0).collect::<Vec<_>>(), [0, 1, 2]);
        for (worker, start_ms) in &starts {
            assert!(
                *start_ms >= 50.0 * *worker as f64,
                "worker {worker} started {start_ms} ms in: {starts:?}"
            );
        }
        assert!(starts.windows(2).all(|w| w[0].1 < w[1].1), "{starts:?}");
        sim.shutdown().await;
    }

    #[tokio::test]
    async fn error_statuses_are_counted_with_their_body() {
        let sim = sim(Script::new(Behaviour::status(529))).await;
        let out = closed_loop(&client(), &endpoint(&sim, false), 1, bounds(3)).await;
        assert_eq!((out.ok, out.errors), (0, 3));
        assert!(
            out.first_errors[0].starts_with("status 529"),
            "{:?}",
            out.first_errors
        );
        assert!(
            out.first_errors[0].contains("overloaded_error"),
            "{:?}",
            out.first_errors
        );
        assert_eq!(out.latency.summary(), None);
        sim.shutdown().await;
    }

    #[tokio::test]
    async fn constant_rate_counts_queueing_from_the_due_time() {
        // 40 ms per answer, one worker, 10 requests due 10 ms apart: request i is due at
        // 10·i ms but can only start at 40·i ms, so it is measured as about 30·i + 40 ms.
        // Measured from its real start every request would take about 40 ms.
        let spec = OkSpec::default().latency(Delay::ms(40));
        let sim = sim(Script::new(Behaviour::Ok(spec))).await;
        let out = constant_rate(
            &client(),
            &endpoint(&sim, false),
            100.0,
            Duration::from_millis(100),
            1,
        )
        .await;
        assert_eq!((out.ok, out.errors), (10, 0), "{:?}", out.first_errors);
        let s = out.latency.summary().unwrap();
        assert!(s.max_us >= 300_000.0, "{s:?}");
        assert!(s.p50_us >= 150_000.0, "{s:?}");
        // With enough workers nothing queues.
        let out = constant_rate(
            &client(),
            &endpoint(&sim, false),
            100.0,
            Duration::from_millis(100),
            16,
        )
        .await;
        assert_eq!(out.ok, 10);
        let s = out.latency.summary().unwrap();
        assert!(s.max_us < 150_000.0, "{s:?}");
        sim.shutdown().await;
    }
}
