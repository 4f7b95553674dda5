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
//! A signal gives the book's own yes/no answer for any `now` after the book's last
//! write of the account: blocks only ever end with time (at their reset or expiry),
//! and only a write can start one. The window signal knows the account's threshold
//! ([`WindowBook::signal_with_threshold`](crate::WindowBook::signal_with_threshold)), so
//! the book computes the exact "out until" when it writes. For the details of a block
//! (which window, the exact expiry), ask the book
//! ([`CooldownBook::cooldown_until`](crate::CooldownBook::cooldown_until),
//! [`WindowBook::out_of_window`](crate::WindowBook::out_of_window)). Books store a
//! signal while they hold the account's entry lock, so two writers of one account
//! cannot leave it older than the entry. Signals are never removed (an account that left
//! the configuration keeps a few bytes), so a signal handed out earlier stays the one
//! the book writes to.
//!
//! ```
//! use keypool_cooldown::facts::{RateLimitInfo, WindowUsage};
//! use keypool_cooldown::WindowBook;
//! use keypool_core::AccountId;
//!
//! let book = WindowBook::default();
//! let a = AccountId::from("a");
//! // Resolved once, before any state exists, with the account's own threshold.
//! let signal = book.signal_with_threshold(&a, Some(0.96));
//! assert!(!signal.may_block(1_000));
//! let info = RateLimitInfo {
//!     five_hour: WindowUsage { utilization: Some(0.97), reset: Some(60_000), status: None },
//!     ..Default::default()
//! };
//! book.observe(&a, &info, 1_000);
//! assert!(signal.may_block(1_000)); // out until 60_000: the book has the details
//! assert!(!signal.may_block(60_000)); // back at the reset
//! book.signal_with_threshold(&a, Some(0.99)); // a higher threshold of its own
//! assert!(!signal.may_block(1_000));
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use keypool_core::{AccountId, UnixMs};

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

    /// Stores `until`; `true` when the value changed.
    pub(crate) fn set(&self, until: UnixMs) -> bool {
        self.until.swap(until, Ordering::AcqRel) != until
    }
}

/// One account's "out of its window until", readable without a lock: the account's
/// own `window_threshold` lives here too, so the book can compute the exact answer
/// when it writes, and a read is one load.
#[derive(Debug)]
pub struct WindowSignal {
    until: AtomicU64,
    /// The account's own threshold (`f64` bits), or [`DEFAULT_THRESHOLD`].
    threshold: AtomicU64,
}

/// Marks a [`WindowSignal`] whose account has no threshold of its own (a NaN pattern
/// no configuration can produce: thresholds are validated into `0..=1`).
const DEFAULT_THRESHOLD: u64 = u64::MAX;

impl Default for WindowSignal {
    fn default() -> Self {
        Self {
            until: AtomicU64::new(0),
            threshold: AtomicU64::new(DEFAULT_THRESHOLD),
        }
    }
}

impl WindowSignal {
    /// Whether the account is out of a window (or of its request limit) at `now`, with
    /// its own threshold (see [`WindowBook::signal_with_threshold`](crate::WindowBook::signal_with_threshold)).
    /// Exact for any `now` at or after the book's last write of this account: a block
    /// only ever ends with time (at its reset), never starts without a write.
    pub fn may_block(&self, now: UnixMs) -> bool {
        self.until.load(Ordering::Acquire) > now
    }

    /// When the account is back (unix ms; `0` when it is not out).
    pub fn until(&self) -> UnixMs {
        self.until.load(Ordering::Acquire)
    }

    /// The account's own threshold, if it has one.
    pub(crate) fn threshold(&self) -> Option<f64> {
        match self.threshold.load(Ordering::Acquire) {
            DEFAULT_THRESHOLD => None,
            bits => Some(f64::from_bits(bits)),
        }
    }

    /// Records the account's own threshold; `true` when it changed.
    pub(crate) fn set_threshold(&self, threshold: Option<f64>) -> bool {
        let bits = threshold.map_or(DEFAULT_THRESHOLD, f64::to_bits);
        self.threshold.swap(bits, Ordering::AcqRel) != bits
    }

    /// Stores the book's answer for `state` at `now` with `threshold`; `true` when the
    /// value changed.
    pub(crate) fn set_from(&self, state: &WindowState, threshold: f64, now: UnixMs) -> bool {
        let until = state.any_block_until(threshold, now);
        self.until.swap(until, Ordering::AcqRel) != until
    }

    /// Clears the block; `true` when there was one recorded.
    pub(crate) fn clear(&self) -> bool {
        self.until.swap(0, Ordering::AcqRel) != 0
    }
}

/// The signals of one book: created on first use, never removed. `epoch` counts the
/// changes of any signal's value, so that a reader can keep a result computed from the
/// signals until it moves (or until a block it saw expires).
#[derive(Debug)]
pub(crate) struct Signals<S> {
    map: DashMap<AccountId, Arc<S>, crate::Hasher>,
    epoch: AtomicU64,
}

impl<S> Default for Signals<S> {
    fn default() -> Self {
        Self {
            map: DashMap::default(),
            epoch: AtomicU64::new(0),
        }
    }
}

impl<S> Signals<S> {
    /// Records that a signal's value changed (`changed`), after it was stored.
    pub(crate) fn changed(&self, changed: bool) {
        if changed {
            self.epoch.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// How many times a signal's value changed.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
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
    use crate::config::{CooldownConfig, CooldownSettings};
    use crate::cooldown::CooldownRecord;
    use crate::facts::{RateLimitInfo, UnifiedStatus, WindowUsage};
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
        OwnThreshold {
            account: usize,
            threshold: Option<f64>,
        },
        DefaultThreshold {
            threshold: f64,
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

    fn threshold() -> impl Strategy<Value = f64> {
        0.05f64..=1.0
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
            (account.clone(), info()).prop_map(|(account, info)| Op::Observe { account, info }),
            account
                .clone()
                .prop_map(|account| Op::ClearWindow { account }),
            (account.clone(), info(), 0u64..H).prop_map(|(account, info, age)| Op::ImportWindow {
                account,
                info,
                age
            }),
            (account, proptest::option::of(threshold()))
                .prop_map(|(account, threshold)| Op::OwnThreshold { account, threshold }),
            threshold().prop_map(|threshold| Op::DefaultThreshold { threshold }),
            (0u64..2 * H).prop_map(|ms| Op::Advance { ms }),
        ]
    }

    proptest! {
        /// Whatever the books go through (failures, successes, clears, imports, header
        /// observations, threshold changes of one account or of the default), a signal
        /// resolved at any time answers exactly as its book does at every later moment,
        /// and no signal changes value without the books' epoch moving.
        #[test]
        fn signals_answer_as_their_books_do(
            ops in proptest::collection::vec(op(), 1..40),
            early in proptest::collection::vec(any::<bool>(), 3),
            probes in proptest::collection::vec(0u64..12 * H, 4),
        ) {
            let cooldowns = CooldownBook::default();
            let windows = WindowBook::default();
            let ids: Vec<AccountId> = ["a", "b", "c"].map(AccountId::from).to_vec();
            let mut own: Vec<Option<f64>> = vec![None; 3];
            // Some signals are taken before any state exists, the rest at the end.
            let mut signals: Vec<Option<(Arc<CooldownSignal>, Arc<WindowSignal>)>> = ids
                .iter()
                .zip(&early)
                .map(|(id, &e)| e.then(|| (cooldowns.signal(id), windows.signal_with_threshold(id, None))))
                .collect();
            let mut now = NOW;
            // Every change of a signal's value moves the books' epoch.
            let values = |own: &[Option<f64>]| -> Vec<(UnixMs, UnixMs)> {
                ids.iter()
                    .zip(own)
                    .map(|(id, t)| {
                        (cooldowns.signal(id).until(), windows.signal_with_threshold(id, *t).until())
                    })
                    .collect()
            };
            let epoch = || cooldowns.signal_epoch() + windows.signal_epoch();
            for op in ops {
                let before = (values(&own), epoch());
                match op {
                    Op::Fail { account, status, retry_after_ms } => {
                        let rl = RateLimitInfo { retry_after_ms, ..RateLimitInfo::default() };
                        let failure = AttemptFailure::Status {
                            status: StatusCode::from_u16(status).unwrap(),
                            rate_limit: &rl,
                            marks: Default::default(),
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
                            marks: Default::default(),
                        };
                        entry.record_failure(&ids[account], &classify(&failure, now), now, 10, now);
                        let records: Vec<CooldownRecord> = std::mem::take(&mut entry).export();
                        let _ = cooldowns.import(records, now);
                    }
                    Op::Observe { account, info } => windows.observe(&ids[account], &info, now),
                    Op::ClearWindow { account } => {
                        let _ = windows.clear(&ids[account]);
                    }
                    Op::ImportWindow { account, info, age } => {
                        let state = WindowState { info, updated_at: now.saturating_sub(age) };
                        let _ = windows.import([WindowRecord { account: ids[account].clone(), state }], now);
                    }
                    Op::OwnThreshold { account, threshold } => {
                        own[account] = threshold;
                        windows.signal_with_threshold(&ids[account], threshold);
                    }
                    Op::DefaultThreshold { threshold } => {
                        let settings = CooldownSettings { window_threshold: threshold, ..CooldownSettings::default() };
                        windows.set_config(&CooldownConfig::try_new(settings).unwrap());
                    }
                    Op::Advance { ms } => now += ms,
                }
                if values(&own) != before.0 {
                    prop_assert_ne!(epoch(), before.1, "a signal changed without the epoch");
                }
            }
            for ((slot, id), threshold) in signals.iter_mut().zip(&ids).zip(&own) {
                slot.get_or_insert_with(|| (cooldowns.signal(id), windows.signal_with_threshold(id, *threshold)));
            }
            for ((signal, id), threshold) in signals.iter().zip(&ids).zip(&own) {
                let (cooling, window) = signal.as_ref().unwrap();
                for t in probes.iter().map(|p| now + p) {
                    prop_assert_eq!(cooling.may_block(t), cooldowns.cooldown_until(id, t).is_some());
                    prop_assert_eq!(
                        window.may_block(t),
                        windows.out_of_window(id, *threshold, t).is_some(),
                        "{} at {}", id, t
                    );
                }
            }
        }
    }

    #[test]
    fn a_window_below_its_threshold_does_not_block() {
        let book = WindowBook::default();
        let a = AccountId::from("a");
        let signal = book.signal_with_threshold(&a, None);
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
        assert!(!signal.may_block(NOW));
        book.signal_with_threshold(&a, Some(0.5));
        assert_eq!(
            signal.until(),
            NOW + 100 * H,
            "the weekly window is over 0.5"
        );
        let rejected = RateLimitInfo {
            unified_status: Some(UnifiedStatus::Rejected),
            unified_reset: Some(NOW + 200 * H),
            ..RateLimitInfo::default()
        };
        book.observe(&a, &rejected, NOW);
        assert_eq!(
            signal.until(),
            NOW + 200 * H,
            "rejected blocks at any threshold"
        );
        book.clear(&a);
        assert!(!signal.may_block(NOW));
    }
}
