//! Lock-free per-account summaries of the books, for the request path.
//!
//! The selector asks about every account of a pool on every request. Looking each one
//! up by id in the books costs a hash and a shard lock per account and book: at 1,000
//! accounts that was most of a request's work. Instead, each book keeps, beside its
//! entries, one small signal per account that it has ever written: a few atomics that
//! say "this account may be blocked at `now`". A caller resolves the signals once (the
//! store does it when it builds a pool's snapshot, every `snapshot_ttl`) and then reads
//! them with plain atomic loads.
//!
//! A signal is **conservative**: when it says "not blocked", the book's exact answer is
//! "not blocked" too; when it says "may be blocked", ask the book
//! ([`CooldownBook::cooldown_until`](crate::CooldownBook::cooldown_until),
//! [`WindowBook::out_of_window`](crate::WindowBook::out_of_window)). Books store a
//! signal while they hold the account's entry lock, so two writers of one account
//! cannot leave it older than the entry. Signals are never removed (an account that left
//! the configuration keeps a few bytes), so a signal handed out earlier stays the one
//! the book writes to.
//!
//! ```
//! use keypool_cooldown::headers::{RateLimitInfo, WindowUsage};
//! use keypool_cooldown::WindowBook;
//! use keypool_core::AccountId;
//!
//! let book = WindowBook::default();
//! let a = AccountId::from("a");
//! let signal = book.signal(&a); // resolved once, before any state exists
//! assert!(!signal.may_block(0.95, 1_000));
//! let info = RateLimitInfo {
//!     five_hour: WindowUsage { utilization: Some(0.97), reset: Some(60_000), status: None },
//!     ..Default::default()
//! };
//! book.observe(&a, &info, 1_000);
//! assert!(signal.may_block(0.95, 1_000)); // now ask the book for the exact answer
//! assert!(!signal.may_block(0.99, 1_000)); // this account's own threshold is higher
//! assert!(!signal.may_block(0.95, 60_000)); // the reset has passed
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use keypool_core::{AccountId, UnixMs};

use crate::headers::UnifiedStatus;
use crate::window::WindowState;

/// One account's cooldown expiry, readable without a lock. `0` = none.
#[derive(Debug, Default)]
pub struct CooldownSignal {
    until: AtomicU64,
}

impl CooldownSignal {
    /// The recorded expiry (unix ms; `0` when the account has no entry).
    pub fn until(&self) -> UnixMs {
        self.until.load(Ordering::Acquire)
    }

    /// Whether the account may be cooling at `now` (`now < until`).
    pub fn may_block(&self, now: UnixMs) -> bool {
        self.until() > now
    }

    pub(crate) fn set(&self, until: UnixMs) {
        self.until.store(until, Ordering::Release);
    }
}

/// What a [`WindowState`] can block, reduced to three numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct WindowSummary {
    /// The latest reset of a block that does not depend on the threshold: a `rejected`
    /// status (overall or per window) or `requests-remaining: 0`. `0` = none.
    hard_until: UnixMs,
    /// The latest reset of a window that reported a utilisation. `0` = none.
    full_until: UnixMs,
    /// The highest utilisation reported by any window (`-inf` when none).
    peak: f64,
}

impl WindowSummary {
    pub(crate) const NONE: Self = Self {
        hard_until: 0,
        full_until: 0,
        peak: f64::NEG_INFINITY,
    };

    /// Covers every block [`WindowState::out_of_window`] can report: a window blocks
    /// when it is `rejected` (counted in `hard_until`) or when its utilisation reaches
    /// the threshold (then `peak >= threshold` and `full_until >= its reset`).
    pub(crate) fn of(state: &WindowState) -> Self {
        let i = &state.info;
        let mut s = Self::NONE;
        for window in keypool_core::Window::ALL {
            let usage = i.window(*window);
            let reset = usage.reset.unwrap_or(0);
            if usage.status == Some(UnifiedStatus::Rejected) {
                s.hard_until = s.hard_until.max(reset);
            }
            if let Some(u) = usage.utilization {
                s.peak = s.peak.max(u);
                s.full_until = s.full_until.max(reset);
            }
        }
        if i.unified_status == Some(UnifiedStatus::Rejected) {
            s.hard_until = s.hard_until.max(i.unified_reset.unwrap_or(0));
        }
        if i.requests_remaining == Some(0) {
            s.hard_until = s.hard_until.max(i.requests_reset.unwrap_or(0));
        }
        s
    }
}

/// One account's window state, summarised for lock-free reads.
#[derive(Debug)]
pub struct WindowSignal {
    hard_until: AtomicU64,
    full_until: AtomicU64,
    peak: AtomicU64,
}

impl Default for WindowSignal {
    fn default() -> Self {
        let signal = Self {
            hard_until: AtomicU64::new(0),
            full_until: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        };
        signal.set(WindowSummary::NONE);
        signal
    }
}

impl WindowSignal {
    /// Whether the account may be out of a window (or its request limit) at `now` with
    /// the utilisation `threshold`. `false` means the book would answer `None`. A NaN
    /// threshold matches no utilisation, as in the book.
    pub fn may_block(&self, threshold: f64, now: UnixMs) -> bool {
        self.hard_until.load(Ordering::Acquire) > now
            || (self.full_until.load(Ordering::Acquire) > now
                && f64::from_bits(self.peak.load(Ordering::Acquire)) >= threshold)
    }

    pub(crate) fn set(&self, s: WindowSummary) {
        // A reader that runs during this write may see parts of both summaries: it
        // races with the write itself, as a lookup in the book would.
        self.peak.store(s.peak.to_bits(), Ordering::Release);
        self.full_until.store(s.full_until, Ordering::Release);
        self.hard_until.store(s.hard_until, Ordering::Release);
    }
}

/// The signals of one book: created on first use, never removed.
#[derive(Debug)]
pub(crate) struct Signals<S> {
    map: DashMap<AccountId, Arc<S>>,
}

impl<S> Default for Signals<S> {
    fn default() -> Self {
        Self {
            map: DashMap::new(),
        }
    }
}

impl<S: Default> Signals<S> {
    /// The account's signal, created (reporting "not blocked") when it has none.
    pub(crate) fn get(&self, account: &AccountId) -> Arc<S> {
        if let Some(s) = self.map.get(account) {
            return Arc::clone(&s);
        }
        Arc::clone(&self.map.entry(account.clone()).or_default())
    }

    /// The account's signal if it has one (nothing to clear otherwise).
    pub(crate) fn existing(&self, account: &AccountId) -> Option<Arc<S>> {
        self.map.get(account).map(|s| Arc::clone(&s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::{AttemptFailure, classify};
    use crate::cooldown::CooldownRecord;
    use crate::headers::{RateLimitInfo, WindowUsage};
    use crate::window::WindowRecord;
    use crate::{CooldownBook, WindowBook};
    use http::StatusCode;
    use proptest::prelude::*;

    const NOW: UnixMs = 1_700_000_000_000;
    const H: u64 = 3_600_000;

    #[derive(Debug, Clone)]
    enum Op {
        Fail {
            account: usize,
            status: u16,
            retry_after_ms: Option<u64>,
        },
        Succeed {
            account: usize,
        },
        ClearCooldown {
            account: usize,
        },
        ImportCooldown {
            account: usize,
            until: u64,
        },
        Observe {
            account: usize,
            info: RateLimitInfo,
        },
        ClearWindow {
            account: usize,
        },
        ImportWindow {
            account: usize,
            info: RateLimitInfo,
            age: u64,
        },
        Advance {
            ms: u64,
        },
    }

    fn usage() -> impl Strategy<Value = WindowUsage> {
        (
            proptest::option::of(0.0f64..1.2),
            proptest::option::of(0u64..10 * H),
            proptest::option::of(prop_oneof![
                Just(UnifiedStatus::Allowed),
                Just(UnifiedStatus::AllowedWarning),
                Just(UnifiedStatus::Rejected),
            ]),
        )
            .prop_map(|(utilization, reset, status)| WindowUsage {
                utilization,
                reset: reset.map(|r| NOW + r),
                status,
            })
    }

    fn info() -> impl Strategy<Value = RateLimitInfo> {
        (
            usage(),
            usage(),
            any::<bool>(),
            proptest::option::of(0u64..10 * H),
            proptest::option::of(0u64..3),
            proptest::option::of(0u64..H),
        )
            .prop_map(|(five_hour, seven_day, rejected, ur, remaining, rr)| {
                RateLimitInfo {
                    five_hour,
                    seven_day,
                    unified_status: rejected.then_some(UnifiedStatus::Rejected),
                    unified_reset: ur.map(|r| NOW + r),
                    requests_remaining: remaining,
                    requests_reset: rr.map(|r| NOW + r),
                    ..RateLimitInfo::default()
                }
            })
    }

    fn op() -> impl Strategy<Value = Op> {
        let account = 0usize..3;
        prop_oneof![
            (
                account.clone(),
                prop_oneof![Just(429u16), Just(529), Just(500), Just(401), Just(400)],
                proptest::option::of(0u64..120_000)
            )
                .prop_map(|(account, status, retry_after_ms)| Op::Fail {
                    account,
                    status,
                    retry_after_ms
                }),
            account.clone().prop_map(|account| Op::Succeed { account }),
            account
                .clone()
                .prop_map(|account| Op::ClearCooldown { account }),
            (account.clone(), 0u64..H)
                .prop_map(|(account, until)| Op::ImportCooldown { account, until }),
            (account.clone(), info()).prop_map(|(account, info)| Op::Observe { account, info }),
            account
                .clone()
                .prop_map(|account| Op::ClearWindow { account }),
            (account, info(), 0u64..H).prop_map(|(account, info, age)| Op::ImportWindow {
                account,
                info,
                age
            }),
            (0u64..2 * H).prop_map(|ms| Op::Advance { ms }),
        ]
    }

    proptest! {
        /// Whatever the books go through, a signal resolved at any time never says "not
        /// blocked" while the book says "blocked", and the cooldown signal holds the
        /// entry's expiry.
        #[test]
        fn signals_never_miss_a_block(
            ops in proptest::collection::vec(op(), 1..40),
            early in proptest::collection::vec(any::<bool>(), 3),
            thresholds in proptest::collection::vec(
                prop_oneof![0.0f64..=1.0, Just(f64::NAN)], 3),
            probes in proptest::collection::vec(0u64..12 * H, 4),
        ) {
            let cooldowns = CooldownBook::default();
            let windows = WindowBook::default();
            let ids: Vec<AccountId> = ["a", "b", "c"].map(AccountId::from).to_vec();
            // Some signals are taken before any state exists, the rest at the end.
            let mut signals: Vec<Option<(Arc<CooldownSignal>, Arc<WindowSignal>)>> = ids
                .iter()
                .zip(&early)
                .map(|(id, &e)| e.then(|| (cooldowns.signal(id), windows.signal(id))))
                .collect();
            let mut now = NOW;
            for op in ops {
                match op {
                    Op::Fail { account, status, retry_after_ms } => {
                        let rl = RateLimitInfo { retry_after_ms, ..RateLimitInfo::default() };
                        let failure = AttemptFailure::Status {
                            status: StatusCode::from_u16(status).unwrap(),
                            rate_limit: &rl,
                        };
                        cooldowns.record_failure(&ids[account], &classify(&failure, now), now, 10, now);
                    }
                    Op::Succeed { account } => cooldowns.record_success(&ids[account], now),
                    Op::ClearCooldown { account } => cooldowns.clear(&ids[account]),
                    Op::ImportCooldown { account, until } => {
                        let mut entry = CooldownBook::default();
                        let rl = RateLimitInfo { retry_after_ms: Some(until), ..RateLimitInfo::default() };
                        let failure = AttemptFailure::Status {
                            status: StatusCode::TOO_MANY_REQUESTS,
                            rate_limit: &rl,
                        };
                        entry.record_failure(&ids[account], &classify(&failure, now), now, 10, now);
                        let records: Vec<CooldownRecord> = std::mem::take(&mut entry).export();
                        cooldowns.import(records, now);
                    }
                    Op::Observe { account, info } => windows.observe(&ids[account], &info, now),
                    Op::ClearWindow { account } => windows.clear(&ids[account]),
                    Op::ImportWindow { account, info, age } => {
                        let state = WindowState { info, updated_at: now.saturating_sub(age) };
                        windows.import([WindowRecord { account: ids[account].clone(), state }], now);
                    }
                    Op::Advance { ms } => now += ms,
                }
            }
            for (slot, id) in signals.iter_mut().zip(&ids) {
                slot.get_or_insert_with(|| (cooldowns.signal(id), windows.signal(id)));
            }
            for ((signal, id), threshold) in signals.iter().zip(&ids).zip(&thresholds) {
                let (cooling, window) = signal.as_ref().unwrap();
                // Exactly the entry's expiry; an entry dropped once expired may leave
                // its (past) expiry behind, which blocks nothing.
                match cooldowns.entry(id) {
                    Some(e) => prop_assert_eq!(cooling.until(), e.until),
                    None => prop_assert!(cooling.until() <= now),
                }
                for t in probes.iter().map(|p| now.saturating_sub(H) + p) {
                    if cooldowns.cooldown_until(id, t).is_some() {
                        prop_assert!(cooling.may_block(t));
                    }
                    if windows.out_of_window(id, Some(*threshold), t).is_some() {
                        prop_assert!(window.may_block(*threshold, t), "{id} at {t}");
                    }
                    if windows.state(id).is_none() {
                        prop_assert!(!window.may_block(*threshold, t));
                    }
                }
            }
        }
    }

    #[test]
    fn a_window_below_its_threshold_is_not_flagged() {
        let book = WindowBook::default();
        let a = AccountId::from("a");
        let signal = book.signal(&a);
        let info = RateLimitInfo {
            five_hour: WindowUsage {
                utilization: Some(0.4),
                reset: Some(NOW + H),
                status: Some(UnifiedStatus::Allowed),
            },
            seven_day: WindowUsage {
                utilization: Some(0.7),
                reset: Some(NOW + 100 * H),
                status: Some(UnifiedStatus::Allowed),
            },
            ..RateLimitInfo::default()
        };
        book.observe(&a, &info, NOW);
        // The usual case: every account reports utilisation, few are near the line.
        assert!(!signal.may_block(0.95, NOW));
        assert!(signal.may_block(0.5, NOW));
        let rejected = RateLimitInfo {
            unified_status: Some(UnifiedStatus::Rejected),
            unified_reset: Some(NOW + 2 * H),
            ..RateLimitInfo::default()
        };
        book.observe(&a, &rejected, NOW);
        assert!(
            signal.may_block(0.95, NOW),
            "rejected blocks at any threshold"
        );
        book.clear(&a);
        assert!(!signal.may_block(0.0, NOW));
    }
}
