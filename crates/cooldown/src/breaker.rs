//! The optional per-`base_url` circuit breaker of SPEC 6 (off by default).
//!
//! Closed: every attempt passes; outcomes are counted per second over a sliding window
//! of `window_ms` (the current second and the ones before it). When a failure is
//! recorded and the window then holds at least `min_attempts` attempts of which at least
//! `failure_ratio` failed `transient` (request errors excluded), it opens for `open_ms`. Open: nothing passes. After `open_ms`: half-open, exactly one probe passes
//! (another one only if the probe's outcome never arrives within `open_ms`); the probe's
//! success closes the breaker, its failure opens it again.
//!
//! ```
//! use keypool_cooldown::{BreakerOutcome, BreakerState, CircuitBreakers, CooldownConfig, CooldownSettings};
//!
//! let mut settings = CooldownSettings::default();
//! settings.breaker.enabled = true;
//! let breakers = CircuitBreakers::new(&CooldownConfig::try_new(settings).unwrap());
//! let url = "https://api.example.com";
//! for t in 0..10 {
//!     assert!(breakers.allow(url, t));
//!     breakers.record(url, BreakerOutcome::Failure, t);
//! }
//! assert_eq!(breakers.state(url, 10), BreakerState::Open { until: 30_009 });
//! assert!(!breakers.allow(url, 30_008));
//! assert!(breakers.allow(url, 30_009)); // the one half-open probe
//! assert!(!breakers.allow(url, 30_010));
//! breakers.record(url, BreakerOutcome::Success, 30_100);
//! assert_eq!(breakers.state(url, 30_100), BreakerState::Closed);
//! ```

use std::collections::VecDeque;
use std::sync::Mutex;

use arc_swap::ArcSwap;
use dashmap::DashMap;
use keypool_core::UnixMs;
use serde::{Deserialize, Serialize};

use crate::classify::{Classification, FailureClass};
use crate::config::{BreakerSettings, CooldownConfig};

/// What one attempt means to its `base_url`'s breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerOutcome {
    /// The URL answered usefully: a success, or a failure that belongs to the account
    /// or the request (key error, rate limit, request error).
    Success,
    /// A `transient` failure other than a request error.
    Failure,
}

impl BreakerOutcome {
    /// The outcome of an attempt: `None` for a success, else its classification.
    pub fn of(failure: Option<&Classification>) -> Self {
        match failure {
            Some(c) if c.class == FailureClass::Transient && !c.is_request_error() => Self::Failure,
            _ => Self::Success,
        }
    }
}

/// The visible state of one breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum BreakerState {
    /// Attempts pass.
    Closed,
    /// Attempts are refused until `until` (unix ms).
    Open {
        /// When the breaker turns half-open.
        until: UnixMs,
    },
    /// One probe may pass (or is in flight).
    HalfOpen {
        /// When the probe in flight was let through, if one is.
        probe_since: Option<UnixMs>,
    },
}

impl BreakerState {
    /// `closed`, `open` or `half_open`, for metrics.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open { .. } => "open",
            Self::HalfOpen { .. } => "half_open",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    second: u64,
    attempts: u32,
    failures: u32,
}

/// One `base_url`'s breaker: a pure state machine, time passed in.
#[derive(Debug, Clone)]
pub struct CircuitBreaker {
    state: BreakerState,
    buckets: VecDeque<Bucket>,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self {
            state: BreakerState::Closed,
            buckets: VecDeque::new(),
        }
    }
}

impl CircuitBreaker {
    /// The state at `now` (an open breaker past its `until` reads as half-open).
    pub fn state(&self, now: UnixMs) -> BreakerState {
        match self.state {
            BreakerState::Open { until } if now >= until => {
                BreakerState::HalfOpen { probe_since: None }
            }
            s => s,
        }
    }

    /// Whether an attempt may go to this URL at `now`. In half-open state this lets the
    /// one probe through and counts it as in flight.
    pub fn allow(&mut self, settings: &BreakerSettings, now: UnixMs) -> bool {
        match self.state(now) {
            BreakerState::Closed => true,
            BreakerState::Open { .. } => false,
            BreakerState::HalfOpen { probe_since } => {
                let lost = probe_since.is_none_or(|t| now >= t.saturating_add(settings.open_ms));
                if lost {
                    self.state = BreakerState::HalfOpen {
                        probe_since: Some(now),
                    };
                }
                lost
            }
        }
    }

    /// Records an attempt's outcome at `now`.
    pub fn record(&mut self, settings: &BreakerSettings, outcome: BreakerOutcome, now: UnixMs) {
        let failed = outcome == BreakerOutcome::Failure;
        match self.state(now) {
            // Stragglers that were in flight when it opened change nothing.
            BreakerState::Open { .. } => {}
            BreakerState::HalfOpen { .. } if failed => self.open(settings, now),
            BreakerState::HalfOpen { .. } => {
                self.state = BreakerState::Closed;
                self.buckets.clear();
            }
            BreakerState::Closed => {
                let second = now / 1000;
                match self.buckets.back_mut() {
                    Some(b) if b.second >= second => {
                        b.attempts = b.attempts.saturating_add(1);
                        b.failures = b.failures.saturating_add(u32::from(failed));
                    }
                    _ => self.buckets.push_back(Bucket {
                        second,
                        attempts: 1,
                        failures: u32::from(failed),
                    }),
                }
                let window_secs = (settings.window_ms / 1000).max(1);
                while self
                    .buckets
                    .front()
                    .is_some_and(|b| b.second.saturating_add(window_secs) <= second)
                {
                    self.buckets.pop_front();
                }
                let (attempts, failures) = self.buckets.iter().fold((0u64, 0u64), |(a, f), b| {
                    (a + u64::from(b.attempts), f + u64::from(b.failures))
                });
                let ratio_hit = failures as f64 >= settings.failure_ratio * attempts as f64;
                if failed && attempts >= u64::from(settings.min_attempts) && ratio_hit {
                    self.open(settings, now);
                }
            }
        }
    }

    fn open(&mut self, settings: &BreakerSettings, now: UnixMs) {
        self.state = BreakerState::Open {
            until: now.saturating_add(settings.open_ms),
        };
        self.buckets.clear();
    }
}

/// The breakers of every `base_url`. Thread-safe. When the breaker is disabled in the
/// config, `allow` is always `true` and `record` does nothing.
#[derive(Debug)]
pub struct CircuitBreakers {
    settings: ArcSwap<BreakerSettings>,
    breakers: DashMap<String, Mutex<CircuitBreaker>, crate::Hasher>,
}

impl Default for CircuitBreakers {
    fn default() -> Self {
        Self::new(&CooldownConfig::default())
    }
}

impl CircuitBreakers {
    /// Breakers with the config's `breaker` settings.
    pub fn new(config: &CooldownConfig) -> Self {
        Self {
            settings: ArcSwap::from_pointee(config.settings().breaker.clone()),
            breakers: DashMap::default(),
        }
    }

    /// Takes the breaker settings of a reloaded config. Turning the breaker off forgets
    /// every breaker's state.
    pub fn set_config(&self, config: &CooldownConfig) {
        let settings = config.settings().breaker.clone();
        if !settings.enabled {
            self.breakers.clear();
        }
        self.settings.store(settings.into());
    }

    fn with<R>(&self, base_url: &str, f: impl FnOnce(&mut CircuitBreaker) -> R) -> R {
        let slot = match self.breakers.get(base_url) {
            Some(slot) => slot,
            None => self
                .breakers
                .entry(base_url.to_owned())
                .or_default()
                .downgrade(),
        };
        // A poisoned lock only means another thread panicked mid-update; the state is
        // still a valid breaker state.
        let mut breaker = slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut breaker)
    }

    /// Whether an attempt may go to `base_url` at `now` (see [`CircuitBreaker::allow`]).
    /// An absent `base_url` is the empty string.
    pub fn allow(&self, base_url: &str, now: UnixMs) -> bool {
        let settings = self.settings.load();
        if !settings.enabled {
            return true;
        }
        self.with(base_url, |b| b.allow(&settings, now))
    }

    /// Records an attempt's outcome for `base_url` at `now`.
    pub fn record(&self, base_url: &str, outcome: BreakerOutcome, now: UnixMs) {
        let settings = self.settings.load();
        if settings.enabled {
            self.with(base_url, |b| b.record(&settings, outcome, now));
        }
    }

    /// The state of `base_url`'s breaker at `now` (`Closed` when unknown or disabled).
    pub fn state(&self, base_url: &str, now: UnixMs) -> BreakerState {
        self.breakers
            .get(base_url)
            .map_or(BreakerState::Closed, |b| {
                b.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .state(now)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CooldownSettings;
    use proptest::prelude::*;

    const URL: &str = "https://a.example";

    fn on() -> CircuitBreakers {
        let mut s = CooldownSettings::default();
        s.breaker.enabled = true;
        CircuitBreakers::new(&CooldownConfig::try_new(s).unwrap())
    }

    #[test]
    fn off_by_default() {
        let b = CircuitBreakers::default();
        for t in 0..100 {
            b.record(URL, BreakerOutcome::Failure, t);
            assert!(b.allow(URL, t));
        }
        assert_eq!(b.state(URL, 100), BreakerState::Closed);
    }

    #[test]
    fn opens_at_half_of_ten_attempts_not_before() {
        let b = on();
        for t in 0..4 {
            b.record(URL, BreakerOutcome::Success, t);
            b.record(URL, BreakerOutcome::Failure, t);
        }
        b.record(URL, BreakerOutcome::Success, 5);
        assert_eq!(b.state(URL, 5), BreakerState::Closed); // 4 of 9
        b.record(URL, BreakerOutcome::Failure, 6); // 5 of 10
        assert_eq!(b.state(URL, 6), BreakerState::Open { until: 30_006 });
        assert!(!b.allow(URL, 30_005));
    }

    #[test]
    fn old_attempts_leave_the_60s_window() {
        let b = on();
        for _ in 0..9 {
            b.record(URL, BreakerOutcome::Failure, 0);
        }
        // 60 s later the nine failures are out of the window: one more does not open.
        b.record(URL, BreakerOutcome::Failure, 60_000);
        assert_eq!(b.state(URL, 60_000), BreakerState::Closed);
        // Within the window they count: 59.999 s later would have opened.
        let b = on();
        for _ in 0..9 {
            b.record(URL, BreakerOutcome::Failure, 0);
        }
        b.record(URL, BreakerOutcome::Failure, 59_999);
        assert_eq!(b.state(URL, 59_999).as_str(), "open");
    }

    #[test]
    fn half_open_probe_failure_reopens_and_lost_probe_is_replaced() {
        let b = on();
        for _ in 0..10 {
            b.record(URL, BreakerOutcome::Failure, 0);
        }
        assert!(b.allow(URL, 30_000));
        assert!(!b.allow(URL, 30_001));
        b.record(URL, BreakerOutcome::Failure, 31_000);
        assert_eq!(b.state(URL, 31_000), BreakerState::Open { until: 61_000 });
        assert!(b.allow(URL, 61_000));
        // The probe never reports: after open_ms another probe may go.
        assert!(!b.allow(URL, 90_999));
        assert!(b.allow(URL, 91_000));
        // Other URLs are independent.
        assert!(b.allow("https://b.example", 31_000));
    }

    #[test]
    fn outcome_of_classification() {
        use crate::classify::{AttemptFailure, TransportFailure, classify};
        use crate::facts::RateLimitInfo;
        let info = RateLimitInfo::default();
        let st = |code| {
            let status = http::StatusCode::from_u16(code).unwrap();
            classify(
                &AttemptFailure::Status {
                    status,
                    rate_limit: &info,
                    marks: Default::default(),
                },
                0,
            )
        };
        assert_eq!(BreakerOutcome::of(None), BreakerOutcome::Success);
        for code in [401, 402, 429, 400, 422] {
            assert_eq!(
                BreakerOutcome::of(Some(&st(code))),
                BreakerOutcome::Success,
                "{code}"
            );
        }
        for code in [500, 503, 529] {
            assert_eq!(
                BreakerOutcome::of(Some(&st(code))),
                BreakerOutcome::Failure,
                "{code}"
            );
        }
        let t = classify(&AttemptFailure::Transport(TransportFailure::Timeout), 0);
        assert_eq!(BreakerOutcome::of(Some(&t)), BreakerOutcome::Failure);
    }

    #[derive(Debug, Clone)]
    enum Event {
        Advance(u64),
        Allow,
        Record(bool),
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (0u64..20_000).prop_map(Event::Advance),
            Just(Event::Allow),
            any::<bool>().prop_map(Event::Record),
        ]
    }

    proptest! {
        /// For any event sequence the breaker moves only along the state machine's
        /// edges, and each move happens exactly when the model says it must.
        #[test]
        fn breaker_follows_the_state_machine(events in proptest::collection::vec(event(), 1..300)) {
            let settings = BreakerSettings { enabled: true, ..Default::default() };
            let mut b = CircuitBreaker::default();
            let mut now: UnixMs = 1_000_000;
            // Model of the closed state: every outcome recorded since it closed.
            let mut closed_log: Vec<(UnixMs, bool)> = Vec::new();
            for ev in events {
                let before = b.state(now);
                match ev {
                    Event::Advance(ms) => {
                        now += ms;
                        let after = b.state(now);
                        match (before, after) {
                            (BreakerState::Open { until }, BreakerState::HalfOpen { probe_since: None }) => {
                                prop_assert!(now >= until);
                            }
                            (x, y) => prop_assert_eq!(x, y),
                        }
                    }
                    Event::Allow => {
                        let allowed = b.allow(&settings, now);
                        match before {
                            BreakerState::Closed => prop_assert!(allowed),
                            BreakerState::Open { until } => {
                                prop_assert!(now < until);
                                prop_assert!(!allowed);
                            }
                            BreakerState::HalfOpen { probe_since } => {
                                let expect = probe_since.is_none_or(|t| now >= t + settings.open_ms);
                                prop_assert_eq!(allowed, expect);
                                if allowed {
                                    prop_assert_eq!(b.state(now), BreakerState::HalfOpen { probe_since: Some(now) });
                                }
                            }
                        }
                    }
                    Event::Record(failed) => {
                        let outcome = if failed { BreakerOutcome::Failure } else { BreakerOutcome::Success };
                        b.record(&settings, outcome, now);
                        let after = b.state(now);
                        let reopened = BreakerState::Open { until: now + settings.open_ms };
                        match before {
                            BreakerState::Open { .. } => prop_assert_eq!(after, before),
                            BreakerState::HalfOpen { .. } => {
                                closed_log.clear();
                                prop_assert_eq!(after, if failed { reopened } else { BreakerState::Closed });
                            }
                            BreakerState::Closed => {
                                closed_log.push((now, failed));
                                let sec = now / 1000;
                                let in_window: Vec<_> = closed_log.iter().filter(|(t, _)| t / 1000 + 60 > sec).collect();
                                let attempts = in_window.len() as f64;
                                let failures = in_window.iter().filter(|(_, f)| *f).count() as f64;
                                let should_open = failed && attempts >= 10.0 && failures >= 0.5 * attempts;
                                if should_open {
                                    prop_assert_eq!(after, reopened);
                                    closed_log.clear();
                                } else {
                                    prop_assert_eq!(after, BreakerState::Closed);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
