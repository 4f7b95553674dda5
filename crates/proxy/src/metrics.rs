//! A small Prometheus registry of atomics (SPEC 10), rendered in the text format.
//!
//! Labels are low-cardinality by construction: org slugs, custom URLs and account ids
//! come from the configuration (a request for an unknown org or URL is counted under
//! `-`), classes, triggers and gate reasons are static names. No secret and no LB key is
//! ever a label.

use std::borrow::Borrow;
use std::fmt::Write as _;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

/// The registry's maps: keys are config names (orgs, URLs, accounts, key ids) or fixed
/// labels, hashed on every request, so with `foldhash` rather than SipHash.
type Map<K, V> = DashMap<K, V, foldhash::fast::RandomState>;
use keypool_cooldown::Classification;
use keypool_core::{AccountId, UnixMs};
use keypool_ledger::NANO_PER_USD;
use keypool_selector::GateReason;
use keypool_store::Store;
use rows::Rows;

mod alerts;
mod oauth;
mod operations;
mod process;
mod rows;
mod states;
mod usage;

pub use operations::{BuildInfo, InternalRoute};

/// Upper bounds (seconds) of the latency histogram buckets.
pub const LATENCY_BUCKETS_SECS: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Upper bounds of the attempts-per-request histogram.
pub const ATTEMPT_BUCKETS: [u64; 6] = [1, 2, 3, 4, 5, 10];

/// Where a cumulative histogram of `N` buckets keeps its counters in a set of
/// [`Rows`]: `N` buckets from `buckets` on, the count at `count`, and the sum in the
/// unit the histogram is rendered in, times 1000 (ms for latencies), at `sum`.
#[derive(Debug, Clone, Copy)]
struct Layout<const N: usize> {
    buckets: usize,
    count: usize,
    sum: usize,
}

impl<const N: usize> Layout<N> {
    /// Counts one value; `bucket` is the index of the first bound ≥ value (N = +Inf).
    fn observe<const W: usize>(self, rows: &Rows<W>, bucket: usize, milli: u64) {
        if bucket < N {
            rows.add(self.buckets + bucket, 1);
        }
        rows.add(self.count, 1);
        rows.add(self.sum, milli);
    }

    /// Values counted.
    fn count<const W: usize>(self, rows: &Rows<W>) -> u64 {
        rows.sum(self.count)
    }

    /// Their sum, times 1000.
    fn sum_milli<const W: usize>(self, rows: &Rows<W>) -> u64 {
        rows.sum(self.sum)
    }

    /// The counters it uses, for the layouts' tests.
    #[cfg(test)]
    fn counters(self) -> impl Iterator<Item = usize> {
        (self.buckets..self.buckets + N).chain([self.count, self.sum])
    }

    fn render<const W: usize>(
        self,
        rows: &Rows<W>,
        out: &mut String,
        name: &str,
        labels: &str,
        bounds: &[String],
    ) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, bucket) in bounds.iter().zip(0..N) {
            cumulative += rows.sum(self.buckets + bucket);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        let count = self.count(rows);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let sum = self.sum_milli(rows) as f64 / 1000.0;
        let braces = |s: &str| {
            if s.is_empty() {
                String::new()
            } else {
                format!("{{{s}}}")
            }
        };
        let _ = writeln!(out, "{name}_sum{} {sum}", braces(labels));
        let _ = writeln!(out, "{name}_count{} {count}", braces(labels));
    }
}

/// A cumulative histogram of `N` buckets in rows of its own: counters `0..N` are the
/// buckets, `N` the count, `N + 1` the sum ([`Layout`]).
#[derive(Debug, Default)]
struct Histogram<const N: usize> {
    rows: Rows<16>,
}

impl<const N: usize> Histogram<N> {
    const LAYOUT: Layout<N> = {
        assert!(N + 2 <= 16, "a histogram's counters fit in its rows");
        Layout {
            buckets: 0,
            count: N,
            sum: N + 1,
        }
    };

    fn observe(&self, bucket: usize, milli: u64) {
        Self::LAYOUT.observe(&self.rows, bucket, milli);
    }

    /// Values counted.
    fn count(&self) -> u64 {
        Self::LAYOUT.count(&self.rows)
    }

    /// Their sum, times 1000.
    fn sum_milli(&self) -> u64 {
        Self::LAYOUT.sum_milli(&self.rows)
    }

    fn render(&self, out: &mut String, name: &str, labels: &str, bounds: &[String]) {
        Self::LAYOUT.render(&self.rows, out, name, labels, bounds);
    }
}

fn latency_bucket(ms: u64) -> usize {
    LATENCY_BUCKETS_SECS
        .iter()
        .position(|&b| (ms as f64) <= b * 1000.0)
        .unwrap_or(LATENCY_BUCKETS_SECS.len())
}

/// `-` stands for "not resolved" (unknown org or URL, or not a Messages route).
pub const UNRESOLVED: &str = "-";

type RequestKey = (Arc<str>, Arc<str>, u16);

/// Which attempt of a hedge/race served the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanOutRole {
    /// The primary.
    Primary,
    /// The backup (partner).
    Backup,
}

/// Every series keypool exports.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Map<RequestKey, Rows<1>>,
    attempts: Histogram<6>,
    failovers: Map<(&'static str, &'static str), AtomicU64>,
    gate: [AtomicU64; 6],
    fired: [AtomicU64; 2],
    wins: [AtomicU64; 2],
    stream_failures: AtomicU64,
    /// Client connections moved from one worker thread to another ([`crate::balance`]).
    connections_moved: AtomicU64,
    /// Per account: in flight, attempts started, TTFT and total latency, in one entry
    /// (one lookup per attempt; the attempt's [`InFlight`] guard observes the
    /// latencies without another).
    accounts: Map<AccountId, Arc<AccountSeries>>,
    affinity: [AtomicU64; 3],
    queue_rejections: [AtomicU64; 2],
    body_budget_rejections: AtomicU64,
    local_failures: Map<&'static str, AtomicU64>,
    /// Per (org, caller, limit): requests a caller limit refused (SPEC 12).
    limit_rejections: Map<(Arc<str>, Arc<str>, &'static str), AtomicU64>,
    account_failures: Map<(AccountId, &'static str), AtomicU64>,
    internal_requests: Map<(InternalRoute, u16), AtomicU64>,
    oauth_refreshes: oauth::Refreshes,
    restatements: states::Restatements,
    fallbacks: states::Fallbacks,
    build: std::sync::OnceLock<BuildInfo>,
}

/// What session affinity did for one request that carried a session key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AffinityOutcome {
    /// The bound account was available and tried first.
    Hit,
    /// The session had no binding (new, expired, or affinity just turned on).
    Miss,
    /// The session was served by another account than its binding and now points there.
    Rebind,
}

impl AffinityOutcome {
    /// Every outcome, in label order.
    pub const ALL: [AffinityOutcome; 3] = [Self::Hit, Self::Miss, Self::Rebind];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::Miss => "miss",
            Self::Rebind => "rebind",
        }
    }
}

/// One account's series, in one set of rows: [`IN_FLIGHT`], attempts and committed
/// streams in flight (added 1 and 1.wrapping_neg(), read as an `i64`); [`ATTEMPTS`],
/// upstream attempts started; the [`TTFT`] and [`TOTAL`] latency histograms of served
/// attempts. The counters every attempt writes (the first two, and each histogram's
/// count and sum) share the row's first cache line with the TTFT's fastest buckets,
/// so that an attempt with a TTFT within 100 ms and a total within 2.5 s writes two
/// lines of its thread's row. In a pool of 1,000 accounts served in turn each is a
/// cache miss: three to five lines, in three more allocations, when the counters and
/// each histogram had rows of their own.
#[derive(Debug, Default)]
struct AccountSeries {
    rows: Rows<32>,
}

/// See [`AccountSeries`].
const IN_FLIGHT: usize = 0;
/// See [`AccountSeries`].
const ATTEMPTS: usize = 1;
/// See [`AccountSeries`].
const TTFT: Layout<12> = Layout {
    count: 2,
    sum: 3,
    buckets: 6,
};
/// See [`AccountSeries`].
const TOTAL: Layout<12> = Layout {
    count: 4,
    sum: 5,
    buckets: 18,
};

/// One attempt (or committed stream) in flight on an account: counted in
/// [`Metrics::in_flight`] from [`Metrics::start_in_flight`] until it is dropped. It
/// also records the attempt's latencies in its account's histograms.
#[derive(Debug)]
pub struct InFlight(Arc<AccountSeries>);

impl InFlight {
    /// TTFT of the attempt, which was served.
    pub fn ttft(&self, ms: u64) {
        TTFT.observe(&self.0.rows, latency_bucket(ms), ms);
    }

    /// Total latency of the attempt, which was served.
    pub fn total(&self, ms: u64) {
        TOTAL.observe(&self.0.rows, latency_bucket(ms), ms);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.rows.add(IN_FLIGHT, 1u64.wrapping_neg());
    }
}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Self {
        // `process_start_time_seconds` is taken when the first registry is made
        process::start_time_secs();
        Self::default()
    }

    /// One answered request (`org`/`url` are [`UNRESOLVED`] when not resolved).
    pub fn request(&self, org: &Arc<str>, url: &Arc<str>, status: u16) {
        let key = (org.clone(), url.clone(), status);
        with_value(&self.requests, &key, || key.clone(), |n| n.add(0, 1));
    }

    /// How many upstream attempts one request made (0 for requests answered without any).
    pub fn attempts(&self, n: u64) {
        let bucket = ATTEMPT_BUCKETS
            .iter()
            .position(|&b| n <= b)
            .unwrap_or(ATTEMPT_BUCKETS.len());
        self.attempts.observe(bucket, n * 1000);
    }

    /// One failed attempt, by class and trigger.
    pub fn failover(&self, c: &Classification) {
        let key = (c.class.as_str(), c.trigger.as_str());
        with_value(&self.failovers, &key, || key, increment);
    }

    /// One failure credited to `account` (an attempt, or a committed stream that broke).
    pub fn account_failure(&self, account: &AccountId, c: &Classification) {
        let key = (account.clone(), c.class.as_str());
        with_value(&self.account_failures, &key, || key.clone(), increment);
    }

    /// The hedge/race gate sent a request down the single path for `reason`.
    pub fn gate(&self, reason: GateReason) {
        if let Some(i) = GateReason::ALL.iter().position(|r| *r == reason) {
            self.gate[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A backup attempt was fired (`race` true for race, false for hedge).
    pub fn backup_fired(&self, race: bool) {
        self.fired[usize::from(race)].fetch_add(1, Ordering::Relaxed);
    }

    /// A request that fanned out was won by `role`.
    pub fn fan_out_win(&self, role: FanOutRole) {
        self.wins[usize::from(role == FanOutRole::Backup)].fetch_add(1, Ordering::Relaxed);
    }

    /// One session-affinity outcome.
    pub fn affinity(&self, outcome: AffinityOutcome) {
        self.affinity[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Session-affinity outcomes so far.
    pub fn affinity_count(&self, outcome: AffinityOutcome) -> u64 {
        self.affinity[outcome as usize].load(Ordering::Relaxed)
    }

    /// A request refused because no concurrency slot came free: `full` when the queue
    /// was full, else the wait timed out.
    pub fn queue_rejection(&self, full: bool) {
        self.queue_rejections[usize::from(!full)].fetch_add(1, Ordering::Relaxed);
    }

    /// A request refused because its body did not fit in `max_body_bytes_in_flight`.
    pub fn body_budget_rejection(&self) {
        self.body_budget_rejections.fetch_add(1, Ordering::Relaxed);
    }

    /// An attempt that found keypool's own resources exhausted (`resource` is
    /// `resources` or `body_budget`): never counted against the account.
    pub fn local_failure(&self, resource: &'static str) {
        with_value(&self.local_failures, resource, || resource, increment);
    }

    /// A request refused by a caller limit (`limit`: its config name, or
    /// `redis_unavailable` for `limits_fail_mode = "closed"`).
    pub fn limit_rejected(&self, org: &Arc<str>, caller: &Arc<str>, limit: &'static str) {
        let key = (org.clone(), caller.clone(), limit);
        with_value(&self.limit_rejections, &key, || key.clone(), increment);
    }

    /// `keypool_tokens_total{org,caller,type}`, `keypool_cost_usd_total{org,caller}`,
    /// `keypool_usage_unpriced_total`.
    fn render_usage(&self, out: &mut String, store: &Store) {
        // Summed by the ledger's fold, not on the request path.
        let rows = store.usage().aggregates.since_start_by_caller();
        out.push_str("# HELP keypool_tokens_total Tokens used by answered requests, by org, caller (LB key id) and token type.\n# TYPE keypool_tokens_total counter\n");
        for (org, caller, t) in &rows {
            let v = [
                t.input_tokens,
                t.output_tokens,
                t.cache_creation_input_tokens,
                t.cache_read_input_tokens,
            ];
            for (kind, n) in ["input", "output", "cache_creation", "cache_read"]
                .iter()
                .zip(v)
            {
                let _ = writeln!(
                    out,
                    "keypool_tokens_total{{org=\"{}\",caller=\"{}\",type=\"{kind}\"}} {n}",
                    escape(org),
                    escape(caller)
                );
            }
        }
        out.push_str("# HELP keypool_cost_usd_total Cost of answered requests in USD (API prices; the list-price equivalent for subscription accounts), by org and caller.\n# TYPE keypool_cost_usd_total counter\n");
        for (org, caller, t) in &rows {
            let _ = writeln!(
                out,
                "keypool_cost_usd_total{{org=\"{}\",caller=\"{}\"}} {}",
                escape(org),
                escape(caller),
                t.cost_nano_usd as f64 / NANO_PER_USD as f64
            );
        }
        let mut limits: Vec<_> = self
            .limit_rejections
            .iter()
            .map(|e| (e.key().clone(), e.value().load(Ordering::Relaxed)))
            .collect();
        limits.sort();
        out.push_str("# HELP keypool_limit_rejections_total Requests refused by a caller limit before any upstream call, by org, caller (LB key id) and limit.\n# TYPE keypool_limit_rejections_total counter\n");
        for ((org, caller, limit), n) in &limits {
            let _ = writeln!(
                out,
                "keypool_limit_rejections_total{{org=\"{}\",caller=\"{}\",limit=\"{limit}\"}} {n}",
                escape(org),
                escape(caller)
            );
        }
        let _ = writeln!(
            out,
            "# HELP keypool_usage_unpriced_total Answered requests with tokens whose model has no price (counted at 0 USD).\n# TYPE keypool_usage_unpriced_total counter\nkeypool_usage_unpriced_total {}",
            rows.iter().map(|(_, _, t)| t.unpriced).sum::<u64>()
        );
    }

    /// The body budgets' series: request body and buffered answer bytes held now, and
    /// the requests refused for their body so far.
    pub fn render_body_budget(&self, out: &mut String, requests: u64, answers: u64) {
        let _ = writeln!(
            out,
            "# HELP keypool_body_in_flight_bytes Bytes held in memory now, by kind: request bodies and buffered (non-streaming) upstream answers, each bounded by max_body_bytes_in_flight.\n# TYPE keypool_body_in_flight_bytes gauge\nkeypool_body_in_flight_bytes{{kind=\"request\"}} {requests}\nkeypool_body_in_flight_bytes{{kind=\"answer\"}} {answers}\n# HELP keypool_body_budget_rejections_total Requests answered 503 because their body did not fit in max_body_bytes_in_flight.\n# TYPE keypool_body_budget_rejections_total counter\nkeypool_body_budget_rejections_total {}",
            self.body_budget_rejections.load(Ordering::Relaxed)
        );
        let mut rows: Vec<_> = self
            .local_failures
            .iter()
            .map(|e| (*e.key(), e.value().load(Ordering::Relaxed)))
            .collect();
        rows.sort();
        counter_family(
            out,
            "keypool_local_failures_total",
            "Attempts that failed on keypool's own resources (file descriptors, memory, the body budget), by resource: never counted against an account.",
            "resource",
            rows,
        );
    }

    /// A committed stream failed after its head.
    pub fn stream_failure(&self) {
        self.stream_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A client connection moved to another worker thread between two requests.
    pub(crate) fn connection_moved(&self) {
        self.connections_moved.fetch_add(1, Ordering::Relaxed);
    }

    /// Client connections moved between worker threads so far.
    pub fn connections_moved(&self) -> u64 {
        self.connections_moved.load(Ordering::Relaxed)
    }

    /// Requests `account` served (attempts that reached their commit point).
    pub fn served(&self, account: &AccountId) -> u64 {
        self.accounts
            .get(account)
            .map_or(0, |a| TTFT.count(&a.rows))
    }

    /// `(requests, attempts)`: requests counted so far in the attempts histogram and the
    /// upstream attempts they made.
    pub fn attempt_totals(&self) -> (u64, u64) {
        (self.attempts.count(), self.attempts.sum_milli() / 1000)
    }

    /// Failed attempts so far, by `(class, trigger)`, sorted.
    pub fn failover_counts(&self) -> Vec<((&'static str, &'static str), u64)> {
        let mut rows: Vec<_> = self
            .failovers
            .iter()
            .map(|e| (*e.key(), e.value().load(Ordering::Relaxed)))
            .collect();
        rows.sort();
        rows
    }

    /// Counts one attempt in flight on `account` until the returned guard is dropped
    /// (an attempt that wins a streaming answer hands its guard to the stream).
    pub fn start_in_flight(&self, account: &AccountId) -> InFlight {
        let series = with_value(&self.accounts, account, || account.clone(), Arc::clone);
        series.rows.add(IN_FLIGHT, 1);
        series.rows.add(ATTEMPTS, 1);
        InFlight(series)
    }

    /// Attempts and committed streams in flight on `account` now.
    pub fn in_flight(&self, account: &AccountId) -> u64 {
        self.accounts
            .get(account)
            .map_or(0, |a| (a.rows.sum(IN_FLIGHT) as i64).max(0) as u64)
    }

    /// Upstream attempts started on `account`.
    pub(crate) fn account_attempts(&self, account: &AccountId) -> u64 {
        self.accounts
            .get(account)
            .map_or(0, |a| a.rows.sum(ATTEMPTS))
    }

    /// The Prometheus text exposition, with gauges read from `store` at `now`.
    pub fn render(&self, store: &Store, now: UnixMs) -> String {
        let mut out = String::with_capacity(4096);
        self.render_requests(&mut out);
        self.render_attempts(&mut out);
        self.render_latencies(&mut out);
        self.render_usage(&mut out, store);
        self.render_accounts(&mut out, store, now);
        self.render_affinity_and_slots(&mut out, store);
        render_backend(&mut out, store);
        self.render_account_traffic(&mut out, store);
        usage::render_account_windows(&mut out, store, now);
        self.render_oauth(&mut out, store);
        self.render_states(&mut out, store, now);
        self.render_operations(&mut out, store);
        alerts::render_alerts(&mut out, store);
        out
    }

    /// `keypool_requests_total`.
    fn render_requests(&self, out: &mut String) {
        out.push_str("# HELP keypool_requests_total Messages and count_tokens requests answered, by org, URL config and status (keypool's own routes are in keypool_internal_requests_total).\n# TYPE keypool_requests_total counter\n");
        let mut rows: Vec<_> = self
            .requests
            .iter()
            .map(|e| (e.key().clone(), e.value().sum(0)))
            .collect();
        rows.sort();
        for ((org, url, status), n) in rows {
            let _ = writeln!(
                out,
                "keypool_requests_total{{org=\"{}\",url=\"{}\",status=\"{status}\"}} {n}",
                escape(&org),
                escape(&url)
            );
        }
    }

    /// Attempts per request, failovers, stream failures and the hedge/race series.
    fn render_attempts(&self, out: &mut String) {
        out.push_str("# HELP keypool_attempts_per_request Upstream attempts made per request.\n# TYPE keypool_attempts_per_request histogram\n");
        let bounds: Vec<String> = ATTEMPT_BUCKETS.iter().map(u64::to_string).collect();
        self.attempts
            .render(out, "keypool_attempts_per_request", "", &bounds);

        out.push_str("# HELP keypool_failovers_total Failed upstream attempts, by failure class and trigger.\n# TYPE keypool_failovers_total counter\n");
        let mut rows: Vec<_> = self
            .failovers
            .iter()
            .map(|e| (*e.key(), e.value().load(Ordering::Relaxed)))
            .collect();
        rows.sort();
        for ((class, trigger), n) in rows {
            let _ = writeln!(
                out,
                "keypool_failovers_total{{class=\"{class}\",trigger=\"{trigger}\"}} {n}"
            );
        }

        out.push_str("# HELP keypool_stream_failures_total Committed streams that failed after their head (ended with the generic error frame).\n# TYPE keypool_stream_failures_total counter\n");
        let _ = writeln!(
            out,
            "keypool_stream_failures_total {}",
            self.stream_failures.load(Ordering::Relaxed)
        );
        out.push_str("# HELP keypool_connections_moved_total Client connections moved from one worker thread to another between two requests: gathered onto fewer threads at light load, spread from a thread that is saturated or starved.\n# TYPE keypool_connections_moved_total counter\n");
        let _ = writeln!(
            out,
            "keypool_connections_moved_total {}",
            self.connections_moved.load(Ordering::Relaxed)
        );

        counter_family(
            out,
            "keypool_hedge_gate_total",
            "Requests that took the single path, by the hedge/race gate reason.",
            "reason",
            GateReason::ALL
                .iter()
                .map(|r| r.as_str())
                .zip(loads(&self.gate)),
        );
        counter_family(
            out,
            "keypool_hedge_backups_total",
            "Backup attempts fired, by strategy.",
            "strategy",
            ["hedge", "race"].into_iter().zip(loads(&self.fired)),
        );
        counter_family(
            out,
            "keypool_hedge_wins_total",
            "Requests whose primary and backup both ran, by the attempt that served them.",
            "winner",
            ["primary", "backup"].into_iter().zip(loads(&self.wins)),
        );
    }

    /// The TTFT and total latency histograms by account.
    fn render_latencies(&self, out: &mut String) {
        let bounds: Vec<String> = LATENCY_BUCKETS_SECS.iter().map(f64::to_string).collect();
        let mut accounts: Vec<(AccountId, Arc<AccountSeries>)> = self
            .accounts
            .iter()
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect();
        accounts.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, help, layout) in [
            (
                "keypool_ttft_seconds",
                "Time to first token of served attempts (first valid frame; response headers when not streaming), by account.",
                TTFT,
            ),
            (
                "keypool_request_duration_seconds",
                "Total latency of served attempts, by account.",
                TOTAL,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            // An account's histogram is rendered once it has a value (an account that
            // only ever failed has none).
            for (account, series) in &accounts {
                if layout.count(&series.rows) > 0 {
                    let labels = format!("account=\"{}\"", escape(account.as_str()));
                    layout.render(&series.rows, out, name, &labels, &bounds);
                }
            }
        }
    }

    /// The per-account gauges (cooldown, out of rotation, in flight) and their totals.
    fn render_accounts(&self, out: &mut String, store: &Store, now: UnixMs) {
        let config = store.config();
        let health = store.health();
        let mut cooling = 0;
        let mut disabled = 0;
        let mut inactive = 0;
        let mut per_account = String::new();
        let mut in_flight = String::new();
        let mut states = String::new();
        let mut ids: Vec<&AccountId> = config.accounts().map(|a| a.id()).collect();
        ids.sort();
        for id in ids {
            let until = health.cooldowns.cooldown_until(id, now);
            // only runtime disabling (a key error): `active = false` in the file is a
            // decision, not a problem, and is counted apart
            let off = health.disabled.is_disabled(id);
            cooling += u64::from(until.is_some());
            disabled += u64::from(off);
            inactive += u64::from(config.account(id.as_str()).is_some_and(|a| !a.active()));
            let _ = writeln!(
                per_account,
                "keypool_account_cooldown_seconds{{account=\"{}\"}} {}",
                escape(id.as_str()),
                until.map_or(0.0, |u| u.saturating_sub(now) as f64 / 1000.0)
            );
            let _ = writeln!(
                in_flight,
                "keypool_account_in_flight{{account=\"{}\"}} {}",
                escape(id.as_str()),
                self.in_flight(id)
            );
            let _ = writeln!(
                states,
                "keypool_account_disabled{{account=\"{}\"}} {}",
                escape(id.as_str()),
                u8::from(off)
            );
        }
        let _ = writeln!(
            out,
            "# HELP keypool_accounts_cooling Accounts in cooldown now.\n# TYPE keypool_accounts_cooling gauge\nkeypool_accounts_cooling {cooling}"
        );
        let _ = writeln!(
            out,
            "# HELP keypool_accounts_disabled Accounts disabled at runtime (a key error: 401, 403, 402); they need a human.\n# TYPE keypool_accounts_disabled gauge\nkeypool_accounts_disabled {disabled}"
        );
        let _ = writeln!(
            out,
            "# HELP keypool_accounts_inactive Accounts kept out of rotation by active = false in the configuration.\n# TYPE keypool_accounts_inactive gauge\nkeypool_accounts_inactive {inactive}"
        );
        out.push_str("# HELP keypool_account_cooldown_seconds Seconds until each account's cooldown ends (0 when not cooling).\n# TYPE keypool_account_cooldown_seconds gauge\n");
        out.push_str(&per_account);
        out.push_str("# HELP keypool_account_disabled Whether each account is disabled at runtime (1: a key error; re-enable it through the admin API).\n# TYPE keypool_account_disabled gauge\n");
        out.push_str(&states);
        out.push_str("# HELP keypool_account_in_flight Upstream attempts and committed streams in flight, by account.\n# TYPE keypool_account_in_flight gauge\n");
        out.push_str(&in_flight);
    }
}

/// Redis readiness and fallbacks, or the state file's health, as the store's backend has.
fn render_backend(out: &mut String, store: &Store) {
    let backend = store.backend_status();
    if let Some(ready) = backend.redis_ready {
        let _ = writeln!(
            out,
            "# HELP keypool_redis_ready Whether Redis answers (1) or keypool serves from memory (0).\n# TYPE keypool_redis_ready gauge\nkeypool_redis_ready {}",
            u8::from(ready)
        );
        let _ = writeln!(
            out,
            "# HELP keypool_redis_fallbacks_total Redis operations that fell back to memory.\n# TYPE keypool_redis_fallbacks_total counter\nkeypool_redis_fallbacks_total {}",
            backend.redis_fallbacks
        );
    }
    if let keypool_store::BackendKind::StateFile(_) = backend.kind {
        let _ = writeln!(
            out,
            "# HELP keypool_state_file_writable Whether the last state file write succeeded (1) or failed (0: runtime state is kept in memory only).\n# TYPE keypool_state_file_writable gauge\nkeypool_state_file_writable {}",
            u8::from(backend.state_file_error.is_none())
        );
        let _ = writeln!(
            out,
            "# HELP keypool_state_file_write_failures_total State file writes that failed.\n# TYPE keypool_state_file_write_failures_total counter\nkeypool_state_file_write_failures_total {}",
            backend.state_file_write_failures
        );
    }
}

impl Metrics {
    /// Session affinity outcomes, queue rejections and the slot gauges of capped
    /// accounts (`max_concurrent`).
    fn render_affinity_and_slots(&self, out: &mut String, store: &Store) {
        counter_family(
            out,
            "keypool_session_affinity_total",
            "Requests with a session key, by what affinity did: hit (bound account tried first), miss (no binding), rebind (served elsewhere, binding moved).",
            "outcome",
            AffinityOutcome::ALL
                .into_iter()
                .map(|o| (o.as_str(), self.affinity_count(o))),
        );
        counter_family(
            out,
            "keypool_queue_rejections_total",
            "Requests answered 429 because every available account was at its max_concurrent, by reason.",
            "reason",
            ["full", "timeout"]
                .into_iter()
                .zip(loads(&self.queue_rejections)),
        );
        let slots = store.slots();
        let _ = writeln!(
            out,
            "# HELP keypool_queue_waiting Requests waiting for a concurrency slot now.\n# TYPE keypool_queue_waiting gauge\nkeypool_queue_waiting {}",
            slots.waiting()
        );
        out.push_str("# HELP keypool_account_slots_in_use Concurrency slots held in this process, by account with max_concurrent.\n# TYPE keypool_account_slots_in_use gauge\n");
        let config = store.config();
        let mut capped: Vec<&AccountId> = config
            .accounts()
            .filter(|a| a.max_concurrent().is_some())
            .map(|a| a.id())
            .collect();
        capped.sort();
        for id in capped {
            let _ = writeln!(
                out,
                "keypool_account_slots_in_use{{account=\"{}\"}} {}",
                escape(id.as_str()),
                slots.in_use(id)
            );
        }
    }
}

/// Runs `f` on `key`'s value in `map`: under the shard's read lock when the key is there
/// (every call after the first), else on a default value inserted with the key `owned`
/// makes (only then: no clone of the key on the usual path).
fn with_value<K, Q, V, R>(
    map: &Map<K, V>,
    key: &Q,
    owned: impl FnOnce() -> K,
    f: impl FnOnce(&V) -> R,
) -> R
where
    K: Eq + Hash + Borrow<Q>,
    Q: Eq + Hash + ?Sized,
    V: Default,
{
    if let Some(value) = map.get(key) {
        return f(&value);
    }
    f(&map.entry(owned()).or_default())
}

fn increment(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A counter family with one label: its `HELP`/`TYPE` lines, then one sample per
/// `(label value, count)` row.
fn counter_family<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    label: &str,
    rows: impl IntoIterator<Item = (&'a str, u64)>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for (value, n) in rows {
        let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {n}");
    }
}

/// The current values of an array of counters.
fn loads(counters: &[AtomicU64]) -> impl Iterator<Item = u64> + '_ {
    counters.iter().map(|n| n.load(Ordering::Relaxed))
}

/// Escapes a label value (`\`, `"`, newline).
fn escape(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return value.into();
    }
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_escaping() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(50), 0);
        assert_eq!(latency_bucket(51), 1);
        assert_eq!(latency_bucket(300_000), 11);
        assert_eq!(latency_bucket(300_001), 12);
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(escape("plain"), "plain");
    }

    #[test]
    fn in_flight_guards_count_until_dropped() {
        let m = Metrics::new();
        let a = AccountId::from("a");
        assert_eq!(m.in_flight(&a), 0);
        let first = m.start_in_flight(&a);
        let second = m.start_in_flight(&a);
        assert_eq!(m.in_flight(&a), 2);
        assert_eq!(m.in_flight(&AccountId::from("b")), 0);
        drop(first);
        assert_eq!(m.in_flight(&a), 1);
        drop(second);
        assert_eq!(m.in_flight(&a), 0);
    }

    #[test]
    fn an_attempt_guard_counts_its_account_and_records_its_latencies() {
        let m = Metrics::new();
        let (served, failed) = (AccountId::from("served"), AccountId::from("failed"));
        let attempt = m.start_in_flight(&served);
        attempt.ttft(40);
        attempt.total(120);
        drop(attempt);
        drop(m.start_in_flight(&failed));
        drop(m.start_in_flight(&failed));
        assert_eq!(m.served(&served), 1);
        assert_eq!(m.served(&failed), 0);
        assert_eq!(m.account_attempts(&served), 1);
        assert_eq!(m.account_attempts(&failed), 2);
        assert_eq!(m.account_attempts(&AccountId::from("other")), 0);
        let mut out = String::new();
        m.render_latencies(&mut out);
        // Only an account with a value has a histogram: the failed one has none.
        assert!(!out.contains("failed"), "{out}");
        assert!(
            out.contains("keypool_ttft_seconds_bucket{account=\"served\",le=\"0.05\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("keypool_ttft_seconds_sum{account=\"served\"} 0.04\n"),
            "{out}"
        );
        assert!(
            out.contains(
                "keypool_request_duration_seconds_bucket{account=\"served\",le=\"0.05\"} 0\n"
            ),
            "{out}"
        );
        assert!(
            out.contains("keypool_request_duration_seconds_count{account=\"served\"} 1\n"),
            "{out}"
        );
    }

    /// An account's counters each have a place of their own in its rows, and those
    /// every served attempt writes (the fast latency buckets with them) are on the
    /// rows' first cache line.
    #[test]
    fn an_account_series_layout_is_disjoint_and_keeps_the_hot_counters_together() {
        let mut used: Vec<usize> = [IN_FLIGHT, ATTEMPTS]
            .into_iter()
            .chain(TTFT.counters())
            .chain(TOTAL.counters())
            .collect();
        let n = used.len();
        used.sort_unstable();
        used.dedup();
        assert_eq!(used.len(), n, "no counter is used twice");
        assert!(used.iter().all(|&i| i < 32), "every counter fits: {used:?}");
        let line = 64 / std::mem::size_of::<u64>();
        for hot in [
            IN_FLIGHT,
            ATTEMPTS,
            TTFT.count,
            TTFT.sum,
            TOTAL.count,
            TOTAL.sum,
            TTFT.buckets,
            TTFT.buckets + 1,
        ] {
            assert!(hot < line, "counter {hot} is on the first line");
        }
    }

    #[test]
    fn histogram_renders_cumulative_buckets() {
        let h: Histogram<6> = Histogram::default();
        let bounds: Vec<String> = ATTEMPT_BUCKETS.iter().map(u64::to_string).collect();
        h.observe(0, 1000);
        h.observe(1, 2000);
        h.observe(6, 20_000);
        let mut out = String::new();
        h.render(&mut out, "x", "", &bounds);
        assert!(out.contains("x_bucket{le=\"1\"} 1\n"));
        assert!(out.contains("x_bucket{le=\"2\"} 2\n"));
        assert!(out.contains("x_bucket{le=\"10\"} 2\n"));
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"));
        assert!(out.contains("x_sum 23\n"));
        assert!(out.contains("x_count 3\n"));
    }
}
