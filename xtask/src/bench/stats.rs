//! The pure maths of the benchmark: latency histograms, percentiles, added latency
//! (target minus direct), rates and CPU cost. No I/O here, so all of it is unit-tested.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// The largest latency a histogram records (longer ones are clamped to it): 60 s.
const MAX_NANOS: u64 = 60_000_000_000;

/// A latency histogram in nanoseconds (3 significant digits, 1 ns … 60 s).
#[derive(Debug, Clone)]
pub struct Latencies {
    hist: Histogram<u64>,
}

impl Default for Latencies {
    fn default() -> Self {
        Self::new()
    }
}

impl Latencies {
    /// An empty histogram.
    pub fn new() -> Self {
        // The bounds are constants that hdrhistogram accepts (low ≥ 1, high ≥ 2 × low,
        // sigfig ≤ 5), so this cannot fail.
        let hist = Histogram::new_with_bounds(1, MAX_NANOS, 3).expect("valid histogram bounds");
        Self { hist }
    }

    /// Records one latency.
    pub fn record(&mut self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos())
            .unwrap_or(MAX_NANOS)
            .clamp(1, MAX_NANOS);
        // Cannot fail: the value is clamped into the histogram's range.
        let _ = self.hist.record(nanos);
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &Latencies) {
        // Same bounds on both sides: cannot fail.
        let _ = self.hist.add(&other.hist);
    }

    /// Every recorded value (ns, the highest of its bucket) with its count: what
    /// [`Latencies::from_recorded`] rebuilds the histogram from, for a report that
    /// pools runs.
    pub fn recorded(&self) -> Vec<(u64, u64)> {
        self.hist
            .iter_recorded()
            .map(|v| (v.value_iterated_to(), v.count_at_value()))
            .collect()
    }

    /// The histogram of [`Latencies::recorded`]'s pairs.
    pub fn from_recorded(pairs: &[(u64, u64)]) -> Self {
        let mut latencies = Self::new();
        for &(nanos, count) in pairs {
            // Clamped into the histogram's range: cannot fail.
            let _ = latencies.hist.record_n(nanos.clamp(1, MAX_NANOS), count);
        }
        latencies
    }

    /// Samples recorded.
    #[cfg(test)]
    pub fn len(&self) -> u64 {
        self.hist.len()
    }

    /// The p50/p90/p99/max summary, or `None` without samples.
    pub fn summary(&self) -> Option<Percentiles> {
        if self.hist.is_empty() {
            return None;
        }
        let us = |q: f64| self.hist.value_at_quantile(q) as f64 / 1000.0;
        Some(Percentiles {
            p50_us: us(0.50),
            p90_us: us(0.90),
            p99_us: us(0.99),
            max_us: self.hist.max() as f64 / 1000.0,
            samples: self.hist.len(),
        })
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Largest sample.
    pub max_us: f64,
    /// Number of samples.
    pub samples: u64,
}

/// What a target adds to the direct upstream, per percentile, in microseconds (may be
/// negative: noise, or a target faster than the floor at that percentile).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Added {
    /// p50 of the target minus p50 of the direct run.
    pub p50_us: f64,
    /// Same at p90.
    pub p90_us: f64,
    /// Same at p99.
    pub p99_us: f64,
}

/// `target − direct` per percentile. Percentiles are compared, not individual requests:
/// the difference of medians, which is what a user of the gateway sees shift.
pub fn added(target: &Percentiles, direct: &Percentiles) -> Added {
    Added {
        p50_us: target.p50_us - direct.p50_us,
        p90_us: target.p90_us - direct.p90_us,
        p99_us: target.p99_us - direct.p99_us,
    }
}

/// Requests per second: `requests` completed in `elapsed`.
pub fn rate(requests: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    requests as f64 / secs
}

/// CPU seconds per 1,000 requests, from a delta of clock ticks (`utime + stime` of
/// `/proc/PID/stat`) and the ticks per second (`CLK_TCK`, 100 on Linux). `None` when
/// nothing was served.
pub fn cpu_seconds_per_1k(ticks: u64, ticks_per_second: u64, requests: u64) -> Option<f64> {
    if requests == 0 || ticks_per_second == 0 {
        return None;
    }
    let seconds = ticks as f64 / ticks_per_second as f64;
    Some(seconds * 1000.0 / requests as f64)
}

/// `value / reference` as a percentage, `None` when the reference is zero.
pub fn percent_of(value: f64, reference: f64) -> Option<f64> {
    (reference > 0.0).then(|| value * 100.0 / reference)
}

/// The intended start of request `index` of a constant-rate run that started at
/// `offset 0`: `index / rate` seconds. A request that starts late is measured from this
/// instant, so the queueing a slow target causes is counted (no coordinated omission).
pub fn intended_offset(index: u64, rate_per_second: f64) -> Duration {
    if rate_per_second <= 0.0 {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(index as f64 / rate_per_second)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist_of(values_us: impl IntoIterator<Item = u64>) -> Latencies {
        let mut h = Latencies::new();
        for v in values_us {
            h.record(Duration::from_micros(v));
        }
        h
    }

    /// Within hdrhistogram's 3 significant digits.
    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= b.abs() * 0.001 + 0.001
    }

    #[test]
    fn percentiles_of_1_to_1000_us() {
        let s = hist_of(1..=1000).summary().unwrap();
        assert!(close(s.p50_us, 500.0), "{s:?}");
        assert!(close(s.p90_us, 900.0), "{s:?}");
        assert!(close(s.p99_us, 990.0), "{s:?}");
        assert!(close(s.max_us, 1000.0), "{s:?}");
        assert_eq!(s.samples, 1000);
    }

    #[test]
    fn empty_histogram_has_no_summary() {
        assert_eq!(Latencies::new().summary(), None);
    }

    #[test]
    fn sub_microsecond_and_huge_values_are_kept_in_range() {
        let mut h = Latencies::new();
        h.record(Duration::ZERO);
        h.record(Duration::from_secs(3600));
        let s = h.summary().unwrap();
        assert_eq!(s.samples, 2);
        assert!(close(s.max_us, 60_000_000.0), "{s:?}");
    }

    #[test]
    fn merge_adds_samples() {
        let mut a = hist_of([10, 20]);
        a.merge(&hist_of([30]));
        assert_eq!(a.len(), 3);
        assert!(close(a.summary().unwrap().max_us, 30.0));
    }

    #[test]
    fn added_is_target_minus_direct_per_percentile() {
        let direct = Percentiles {
            p50_us: 40.0,
            p90_us: 55.0,
            p99_us: 80.0,
            max_us: 900.0,
            samples: 10,
        };
        let target = Percentiles {
            p50_us: 65.5,
            p90_us: 50.0,
            p99_us: 180.0,
            max_us: 5.0,
            samples: 10,
        };
        assert_eq!(
            added(&target, &direct),
            Added {
                p50_us: 25.5,
                p90_us: -5.0,
                p99_us: 100.0
            }
        );
    }

    #[test]
    fn rates_and_cpu() {
        assert_eq!(rate(500, Duration::from_millis(250)), 2000.0);
        assert_eq!(rate(5, Duration::ZERO), 0.0);
        // 150 ticks at 100/s = 1.5 s for 3,000 requests = 0.5 s per 1,000.
        assert_eq!(cpu_seconds_per_1k(150, 100, 3000), Some(0.5));
        assert_eq!(cpu_seconds_per_1k(150, 100, 0), None);
        assert_eq!(cpu_seconds_per_1k(150, 0, 10), None);
        assert_eq!(percent_of(25.0, 200.0), Some(12.5));
        assert_eq!(percent_of(25.0, 0.0), None);
    }

    #[test]
    fn intended_offsets_follow_the_rate() {
        assert_eq!(intended_offset(0, 500.0), Duration::ZERO);
        assert_eq!(intended_offset(500, 500.0), Duration::from_secs(1));
        assert_eq!(intended_offset(3, 1000.0), Duration::from_millis(3));
        assert_eq!(intended_offset(7, 0.0), Duration::ZERO);
    }
}
