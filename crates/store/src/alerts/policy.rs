//! The pure parts of alerting (SPEC 15), time an argument: which alerts are sent
//! ([`Deduplicator`]: the same event for the same subject at most once per window), when
//! a failed delivery is tried again ([`RetrySchedule`]), and when a pool counts as
//! unavailable ([`PoolOutageTracker`]: ≥ 80 % of its accounts out for ≥ 60 s, once per
//! episode).

use std::collections::HashMap;

use keypool_core::UnixMs;

use super::AlertKind;

/// Entries the deduplicator keeps before it forgets those whose window ended.
const DEDUP_PRUNE_AT: usize = 4096;

/// The same event for the same subject at most once per `window_ms`.
#[derive(Debug, Clone)]
pub struct Deduplicator {
    window_ms: u64,
    last_sent: HashMap<(AlertKind, String), UnixMs>,
}

impl Deduplicator {
    /// A deduplicator with a window of `window_ms` (`0`: every event passes).
    pub fn new(window_ms: u64) -> Self {
        Self {
            window_ms,
            last_sent: HashMap::new(),
        }
    }

    /// Whether the event `kind` about `subject` at `now` is sent (and then remembered),
    /// or suppressed because the same one passed less than the window ago. A window
    /// changed by a reload applies from the next call.
    pub fn admit(&mut self, kind: AlertKind, subject: &str, now: UnixMs, window_ms: u64) -> bool {
        self.window_ms = window_ms;
        if self.window_ms == 0 {
            return true;
        }
        let key = (kind, subject.to_owned());
        if let Some(&at) = self.last_sent.get(&key)
            && now.saturating_sub(at) < self.window_ms
        {
            return false;
        }
        if self.last_sent.len() >= DEDUP_PRUNE_AT {
            let window = self.window_ms;
            self.last_sent
                .retain(|_, at| now.saturating_sub(*at) < window);
        }
        self.last_sent.insert(key, now);
        true
    }

    /// Forgets the last admission of `kind` about `subject` (it was never sent: the
    /// queue was full), so that the next one is not suppressed.
    pub fn forget(&mut self, kind: AlertKind, subject: &str) {
        self.last_sent.remove(&(kind, subject.to_owned()));
    }

    /// How many (event, subject) pairs it remembers.
    pub fn len(&self) -> usize {
        self.last_sent.len()
    }

    /// Whether it remembers none.
    pub fn is_empty(&self) -> bool {
        self.last_sent.is_empty()
    }
}

/// When a failed delivery is tried again: `initial_ms × 2^n`, at most `cap_ms`, and no
/// more than `max_attempts` attempts in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySchedule {
    /// The wait after the first failed attempt.
    pub initial_ms: u64,
    /// The longest wait.
    pub cap_ms: u64,
    /// Attempts in all (the first one included), at least 1.
    pub max_attempts: u32,
}

impl RetrySchedule {
    /// The wait before attempt `failed + 1` after `failed` failed attempts (`failed` ≥
    /// 1), or `None` when none is left: the delivery is dropped.
    pub fn delay_after(&self, failed: u32) -> Option<u64> {
        if failed == 0 || failed >= self.max_attempts {
            return None;
        }
        let doubled = self
            .initial_ms
            .saturating_mul(1u64.checked_shl(failed - 1).unwrap_or(u64::MAX));
        Some(doubled.min(self.cap_ms))
    }
}

/// One pool's current episode of unavailability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Episode {
    since: UnixMs,
    fired: bool,
}

/// What [`PoolOutageTracker::observe`] found worth an alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolOutage {
    /// Since when the pool has been unavailable, unix ms.
    pub since: UnixMs,
    /// Its accounts out of service.
    pub unavailable: usize,
    /// Its accounts.
    pub total: usize,
}

/// Per pool: since when at least `threshold` of its accounts are unavailable; an
/// episode that lasts `hold_ms` fires once, and a pool that recovers starts over.
#[derive(Debug, Clone)]
pub struct PoolOutageTracker {
    threshold: f64,
    pools: HashMap<String, Episode>,
}

impl PoolOutageTracker {
    /// A tracker calling a pool unavailable when `threshold` (`0.8`) of its accounts are.
    pub fn new(threshold: f64) -> Self {
        Self {
            threshold,
            pools: HashMap::new(),
        }
    }

    /// Records that `unavailable` of `pool`'s `total` accounts are out at `now`;
    /// `Some` exactly once per episode, when it has lasted `hold_ms`. A pool without
    /// accounts is never unavailable.
    pub fn observe(
        &mut self,
        pool: &str,
        unavailable: usize,
        total: usize,
        now: UnixMs,
        hold_ms: u64,
    ) -> Option<PoolOutage> {
        let out = total > 0 && unavailable as f64 >= self.threshold * total as f64;
        if !out {
            self.pools.remove(pool);
            return None;
        }
        let episode = self.pools.entry(pool.to_owned()).or_insert(Episode {
            since: now,
            fired: false,
        });
        if episode.fired || now.saturating_sub(episode.since) < hold_ms {
            return None;
        }
        episode.fired = true;
        Some(PoolOutage {
            since: episode.since,
            unavailable,
            total,
        })
    }

    /// Forgets the pools not in `keep` (after a reload removed some).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.pools.retain(|pool, _| keep(pool));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TEN_MIN: u64 = 600_000;

    #[test]
    fn the_same_event_passes_once_per_window() {
        let mut d = Deduplicator::new(TEN_MIN);
        assert!(d.admit(AlertKind::AccountDisabled, "a1", 1_000, TEN_MIN));
        assert!(!d.admit(AlertKind::AccountDisabled, "a1", 2_000, TEN_MIN));
        assert!(d.admit(AlertKind::AccountDisabled, "a2", 2_000, TEN_MIN));
        assert!(d.admit(AlertKind::AccountOutOfWindow, "a1", 2_000, TEN_MIN));
        assert!(!d.admit(
            AlertKind::AccountDisabled,
            "a1",
            1_000 + TEN_MIN - 1,
            TEN_MIN
        ));
        assert!(d.admit(AlertKind::AccountDisabled, "a1", 1_000 + TEN_MIN, TEN_MIN));
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_then_gives_up() {
        let s = RetrySchedule {
            initial_ms: 1_000,
            cap_ms: 60_000,
            max_attempts: 9,
        };
        let waits: Vec<_> = (1..=9).map(|n| s.delay_after(n)).collect();
        assert_eq!(
            waits,
            [
                Some(1_000),
                Some(2_000),
                Some(4_000),
                Some(8_000),
                Some(16_000),
                Some(32_000),
                Some(60_000),
                Some(60_000),
                None
            ]
        );
        assert_eq!(s.delay_after(0), None);
    }

    #[test]
    fn a_pool_fires_once_per_episode() {
        let mut t = PoolOutageTracker::new(0.8);
        assert_eq!(t.observe("acme/*", 4, 5, 0, 60_000), None);
        assert_eq!(t.observe("acme/*", 5, 5, 59_999, 60_000), None);
        let fired = t.observe("acme/*", 4, 5, 60_000, 60_000);
        assert_eq!(
            fired,
            Some(PoolOutage {
                since: 0,
                unavailable: 4,
                total: 5
            })
        );
        assert_eq!(t.observe("acme/*", 5, 5, 120_000, 60_000), None);
        // recovers, then a new episode
        assert_eq!(t.observe("acme/*", 3, 5, 130_000, 60_000), None);
        assert_eq!(t.observe("acme/*", 5, 5, 140_000, 60_000), None);
        assert!(t.observe("acme/*", 5, 5, 200_000, 60_000).is_some());
        assert_eq!(t.observe("empty", 0, 0, 500_000, 0), None);
    }

    proptest! {
        /// Whatever the order of events, two admitted ones with the same key are at
        /// least a window apart (times non-decreasing).
        #[test]
        fn admitted_events_are_a_window_apart(
            steps in prop::collection::vec((0u8..3, 0u8..3, 0u64..300_000), 1..200),
            window in 0u64..1_000_000,
        ) {
            let mut d = Deduplicator::new(window);
            let mut now = 0u64;
            let mut last: HashMap<(u8, u8), u64> = HashMap::new();
            for (kind, subject, step) in steps {
                now += step;
                let k = [AlertKind::AccountDisabled, AlertKind::BudgetReached, AlertKind::PoolUnavailable][kind as usize];
                let admitted = d.admit(k, &subject.to_string(), now, window);
                let previous = last.get(&(kind, subject)).copied();
                let expected = previous.is_none_or(|p| now - p >= window);
                prop_assert_eq!(admitted, expected);
                if admitted {
                    last.insert((kind, subject), now);
                }
            }
        }

        /// Waits never shrink, never pass the cap, and there are exactly
        /// `max_attempts - 1` of them.
        #[test]
        fn backoff_is_monotone_capped_and_bounded(
            initial in 1u64..100_000,
            cap in 1u64..10_000_000,
            max_attempts in 1u32..64,
        ) {
            let s = RetrySchedule { initial_ms: initial, cap_ms: cap, max_attempts };
            let waits: Vec<u64> = (1..).map_while(|n| s.delay_after(n)).collect();
            prop_assert_eq!(waits.len() as u32, max_attempts - 1);
            prop_assert!(waits.windows(2).all(|w| w[0] <= w[1]));
            prop_assert!(waits.iter().all(|&w| w <= cap && w >= initial.min(cap)));
        }

        /// A pool fires at most once per unbroken episode of unavailability, and only
        /// once the episode lasted `hold`.
        #[test]
        fn outage_fires_once_per_episode_after_the_hold(
            steps in prop::collection::vec((0usize..6, 0u64..40_000), 1..200),
            hold in 0u64..120_000,
        ) {
            let total = 5;
            let mut t = PoolOutageTracker::new(0.8);
            let mut now = 0u64;
            let mut since: Option<u64> = None;
            let mut fired_in_episode = false;
            for (unavailable, step) in steps {
                now += step;
                let out = unavailable >= 4;
                let got = t.observe("p", unavailable, total, now, hold);
                if !out {
                    since = None;
                    fired_in_episode = false;
                    prop_assert_eq!(got, None);
                    continue;
                }
                let start = *since.get_or_insert(now);
                if let Some(o) = got {
                    prop_assert!(!fired_in_episode);
                    prop_assert!(now - start >= hold);
                    prop_assert_eq!(o.since, start);
                    fired_in_episode = true;
                } else {
                    prop_assert!(fired_in_episode || now - start < hold);
                }
            }
        }
    }
}
