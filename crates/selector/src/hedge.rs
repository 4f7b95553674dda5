//! The hedge/race gate (SPEC 4, "Hedge and race") and the hedge budget.

use std::sync::{Mutex, PoisonError};

use keypool_core::UnixMs;

use crate::error::SelectError;

/// The default `hedge_min_delay`: the hedge delay is never shorter (200 ms).
pub const DEFAULT_HEDGE_MIN_DELAY_MS: u64 = 200;
/// The default hedge budget: extra attempts may not exceed 10 % of the group's requests
/// over the last minute.
pub const DEFAULT_HEDGE_BUDGET: f64 = 0.10;

/// Why a request took the single path, in the order the gate checks them (the first
/// that applies wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GateReason {
    /// 1. The strategy is neither `hedge` nor `race`.
    NotHedgeStrategy,
    /// 2. The request is `count_tokens`.
    CountTokens,
    /// 3. Fewer than two accounts survived the filters.
    FewerThanTwo,
    /// 4. No other surviving account has the primary's provider and auth type and a
    ///    different `base_url`.
    NoPartner,
    /// 5. No account of the group has any TTFT sample.
    NoTtftData,
    /// 6. The group's hedge budget is spent.
    BudgetSpent,
}

impl GateReason {
    /// Every reason, in gate order.
    pub const ALL: [GateReason; 6] = [
        GateReason::NotHedgeStrategy,
        GateReason::CountTokens,
        GateReason::FewerThanTwo,
        GateReason::NoPartner,
        GateReason::NoTtftData,
        GateReason::BudgetSpent,
    ];

    /// The metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            GateReason::NotHedgeStrategy => "not_hedge_strategy",
            GateReason::CountTokens => "count_tokens",
            GateReason::FewerThanTwo => "fewer_than_two",
            GateReason::NoPartner => "no_partner",
            GateReason::NoTtftData => "no_ttft_data",
            GateReason::BudgetSpent => "budget_spent",
        }
    }
}

impl std::fmt::Display for GateReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

const BUCKETS: usize = 60;
const BUCKET_MS: u64 = 1_000;
const PPM: u64 = 1_000_000;

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// Which second (`now / 1000`) the counts belong to.
    second: u64,
    requests: u64,
    extras: u64,
}

/// One group's hedge budget: extra (hedge/race backup) attempts may not exceed a
/// fraction of the group's requests over the last minute (a sliding window of 60
/// one-second buckets). Thread-safe; `now` is an argument.
///
/// The planner records every request of the group it plans for, and spends one extra
/// attempt when it decides a fan-out, so concurrent requests can never overspend. A
/// hedge whose primary committed before the delay never fired its backup: the proxy
/// gives the attempt back with [`HedgeBudget::refund`].
///
/// The check counts the current request: with 10 %, the first extra attempt is allowed
/// once the group has seen 10 requests in the last minute.
#[derive(Debug)]
pub struct HedgeBudget {
    ratio_ppm: u64,
    buckets: Mutex<[Bucket; BUCKETS]>,
}

impl Default for HedgeBudget {
    fn default() -> Self {
        Self::from_ppm((DEFAULT_HEDGE_BUDGET * PPM as f64) as u64)
    }
}

impl HedgeBudget {
    /// A budget of `ratio` (`0.0..=1.0`; `0.1` = 10 %) of the group's requests.
    pub fn try_new(ratio: f64) -> Result<Self, SelectError> {
        if !(0.0..=1.0).contains(&ratio) {
            return Err(SelectError::InvalidHedgeBudget(ratio));
        }
        Ok(Self::from_ppm((ratio * PPM as f64).round() as u64))
    }

    fn from_ppm(ratio_ppm: u64) -> Self {
        Self {
            ratio_ppm,
            buckets: Mutex::new([Bucket::default(); BUCKETS]),
        }
    }

    fn with_bucket<T>(&self, now: UnixMs, f: impl FnOnce(&mut [Bucket; BUCKETS], usize) -> T) -> T {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let second = now / BUCKET_MS;
        let slot = (second % BUCKETS as u64) as usize;
        // A bucket from a minute (or more) ago is reused; one from a later second (a
        // caller whose clock read raced ahead of ours) keeps its counts.
        if buckets[slot].second < second {
            buckets[slot] = Bucket {
                second,
                requests: 0,
                extras: 0,
            };
        }
        f(&mut buckets, slot)
    }

    /// Counts one request of the group.
    pub fn record_request(&self, now: UnixMs) {
        self.with_bucket(now, |b, slot| b[slot].requests += 1);
    }

    /// Spends one extra attempt if that keeps extras within the budget; `false` (and
    /// nothing spent) otherwise.
    pub fn try_spend(&self, now: UnixMs) -> bool {
        self.with_bucket(now, |buckets, slot| {
            let (requests, extras) = window_totals(buckets, now / BUCKET_MS);
            let allowed = (extras + 1) * PPM <= self.ratio_ppm * requests;
            if allowed {
                buckets[slot].extras += 1;
            }
            allowed
        })
    }

    /// Gives back one extra attempt that never fired (the newest one still in the
    /// window).
    pub fn refund(&self, now: UnixMs) {
        let current = now / BUCKET_MS;
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(bucket) = buckets
            .iter_mut()
            .filter(|b| in_window(b, current) && b.extras > 0)
            .max_by_key(|b| b.second)
        {
            bucket.extras -= 1;
        }
    }

    /// `(requests, extra attempts)` over the last minute.
    pub fn usage(&self, now: UnixMs) -> (u64, u64) {
        let buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        window_totals(&buckets, now / BUCKET_MS)
    }
}

fn in_window(b: &Bucket, current: u64) -> bool {
    b.second <= current && current - b.second < BUCKETS as u64
}

fn window_totals(buckets: &[Bucket; BUCKETS], current: u64) -> (u64, u64) {
    buckets
        .iter()
        .filter(|b| in_window(b, current))
        .fold((0, 0), |(r, e), b| (r + b.requests, e + b.extras))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_percent_allows_one_extra_per_ten_requests() {
        let b = HedgeBudget::default();
        for i in 0..9 {
            b.record_request(i);
            assert!(!b.try_spend(i), "request {i}");
        }
        b.record_request(9);
        assert!(b.try_spend(9));
        assert!(!b.try_spend(9));
        assert_eq!(b.usage(9), (10, 1));
        b.refund(9);
        assert_eq!(b.usage(9), (10, 0));
        assert!(b.try_spend(9));
    }

    #[test]
    fn the_window_slides_after_a_minute() {
        let b = HedgeBudget::try_new(0.5).unwrap();
        b.record_request(0);
        b.record_request(0);
        assert!(b.try_spend(0));
        assert!(!b.try_spend(59_999));
        assert_eq!(b.usage(59_999), (2, 1));
        // At 60 s the bucket of second 0 has left the window.
        assert_eq!(b.usage(60_000), (0, 0));
        assert!(!b.try_spend(60_000));
        b.record_request(60_000);
        b.record_request(60_500);
        assert!(b.try_spend(60_900));
    }

    #[test]
    fn ratio_is_validated() {
        assert!(matches!(
            HedgeBudget::try_new(1.5),
            Err(SelectError::InvalidHedgeBudget(_))
        ));
        assert!(HedgeBudget::try_new(f64::NAN).is_err());
        let zero = HedgeBudget::try_new(0.0).unwrap();
        zero.record_request(0);
        assert!(!zero.try_spend(0));
    }

    #[test]
    fn reasons_have_metric_names_in_gate_order() {
        let names: Vec<_> = GateReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            names,
            [
                "not_hedge_strategy",
                "count_tokens",
                "fewer_than_two",
                "no_partner",
                "no_ttft_data",
                "budget_spent"
            ]
        );
        assert!(GateReason::ALL.windows(2).all(|w| w[0] < w[1]));
    }
}
