//! The cooldown book: per-account cooldown expiry, backoff level and failure count
//! (SPEC 6), with herd protection.
//!
//! ```
//! use keypool_cooldown::{Classification, CooldownBook, CooldownConfig, FailureClass, Trigger};
//! use keypool_core::AccountId;
//!
//! let book = CooldownBook::new(CooldownConfig::default());
//! let a = AccountId::from("a");
//! let plain_429 = Classification { class: FailureClass::RateLimit, trigger: Trigger::PlainRateLimit };
//! // 40 accounts in the snapshot: a plain 429 rests the account 60 s.
//! assert_eq!(book.record_failure(&a, &plain_429, 900, 40, 1_000), Some(61_000));
//! assert_eq!(book.cooldown_until(&a, 60_999), Some(61_000));
//! assert_eq!(book.cooldown_until(&a, 61_000), None);
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arc_swap::ArcSwap;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use keypool_core::{AccountId, UnixMs};
use serde::{Deserialize, Serialize};

use crate::book::{self, Imported};
use crate::classify::{Classification, FailureClass, Trigger};
use crate::config::CooldownConfig;
use crate::signal::{CooldownSignal, Signals};

/// One account's cooldown state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CooldownEntry {
    /// Absolute expiry, unix ms. The account may be used again at `until` (an entry
    /// whose failure set no cooldown has `until <= set_at`).
    pub until: UnixMs,
    /// When the last fresh (non-herd) failure was recorded: attempts that started at or
    /// before this moment are the herd.
    pub set_at: UnixMs,
    /// The trigger that decided `until`.
    pub trigger: Trigger,
    /// Consecutive failures of the backoff rows (other statuses, transport), not
    /// counting the herd. Reset by a success.
    pub backoff_level: u32,
    /// Every recorded failure since the last success (herd included; key errors and
    /// request errors excluded).
    pub consecutive_failures: u32,
    /// Consecutive `403`s without a ban marker (SPEC 16), not counting the herd: the
    /// [`crate::CooldownSettings::ban_after_forbidden`]-th bans the account. Any other
    /// outcome ends the streak.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub forbidden_streak: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One exported cooldown entry: the account and its state, with absolute times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CooldownRecord {
    /// The account.
    pub account: AccountId,
    /// Its state.
    #[serde(flatten)]
    pub entry: CooldownEntry,
}

/// A persisted cooldown that ended later than any trigger can set
/// ([`CooldownConfig::longest_cooldown_ms`]), as [`CooldownBook::import`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CooldownCorrection {
    /// The persisted expiry, unix ms.
    pub received: UnixMs,
    /// The expiry taken instead, unix ms.
    pub recorded: UnixMs,
}

/// Per-account cooldowns. Thread-safe; every operation takes `now`.
#[derive(Debug)]
pub struct CooldownBook {
    config: ArcSwap<CooldownConfig>,
    entries: DashMap<AccountId, CooldownEntry, crate::Hasher>,
    /// How many entries `entries` holds, kept by every write under the entry's lock:
    /// a success while no account has an entry (the usual case) reads this instead of
    /// taking a shard's write lock, which every serving thread would contend for.
    held: AtomicUsize,
    signals: Signals<CooldownSignal>,
}

impl Default for CooldownBook {
    fn default() -> Self {
        Self::new(CooldownConfig::default())
    }
}

impl CooldownBook {
    /// An empty book.
    pub fn new(config: CooldownConfig) -> Self {
        Self {
            config: ArcSwap::from_pointee(config),
            entries: DashMap::default(),
            held: AtomicUsize::new(0),
            signals: Signals::default(),
        }
    }

    /// Replaces the configuration (config reload). Existing expiries are kept.
    pub fn set_config(&self, config: CooldownConfig) {
        self.config.store(config.into());
    }

    /// The current configuration.
    pub fn config(&self) -> Arc<CooldownConfig> {
        self.config.load_full()
    }

    /// Records a failed attempt of `account` and returns its cooldown expiry after the
    /// update, if it is in cooldown at `now`.
    ///
    /// - Key errors and request errors change nothing here (key errors disable the
    ///   account through [`crate::DisabledBook`]; request errors are the request's fault),
    ///   except a `403` without a ban marker ([`Trigger::Forbidden`]): a cooldown of
    ///   `forbidden_ms` and one more in the account's streak
    ///   ([`CooldownEntry::forbidden_streak`]). A family's weekly window changes nothing
    ///   either: the window book keeps the account out of that family only.
    /// - Otherwise the cooldown becomes `max(current expiry, now + duration)`, where the
    ///   duration is what the trigger says ([`CooldownConfig::trigger_duration_ms`]): a
    ///   cooldown is never shortened by a failure, and never shorter than its trigger.
    /// - Herd protection: when the attempt started at or before the moment the current
    ///   state was set (`attempt_started_at <= set_at`), the backoff level is not raised
    ///   and the duration is computed at the current level, so the herd neither raises
    ///   the level a second time nor extends the cooldown beyond its own trigger.
    /// - `snapshot_len` is the number of accounts in the request's snapshot (the plain
    ///   429 row is shorter above `large_pool_accounts`).
    pub fn record_failure(
        &self,
        account: &AccountId,
        classification: &Classification,
        attempt_started_at: UnixMs,
        snapshot_len: usize,
        now: UnixMs,
    ) -> Option<UnixMs> {
        let trigger = classification.trigger;
        let forbidden = trigger == Trigger::Forbidden;
        if (classification.class == FailureClass::KeyError && !forbidden)
            || classification.is_request_error()
            || matches!(trigger, Trigger::FamilyWindowExhausted { .. })
        {
            return self.cooldown_until(account, now);
        }
        let config = self.config.load();
        let raises = trigger.is_backoff();
        let fresh = |level: u32| {
            let until =
                now.saturating_add(config.trigger_duration_ms(&trigger, level, snapshot_len, now));
            CooldownEntry {
                until,
                set_at: now,
                trigger,
                backoff_level: level,
                consecutive_failures: 1,
                forbidden_streak: u32::from(forbidden),
            }
        };
        let signal = self.signals.get(account);
        let until = match self.entries.entry(account.clone()) {
            Entry::Vacant(v) => {
                self.held.fetch_add(1, Ordering::Relaxed);
                let entry = v.insert(fresh(u32::from(raises)));
                self.signals.changed(signal.set(entry.until));
                entry.until
            }
            Entry::Occupied(mut o) => {
                let e = o.get_mut();
                let herd = attempt_started_at <= e.set_at;
                let level = if raises && !herd {
                    e.backoff_level.saturating_add(1)
                } else {
                    e.backoff_level
                };
                let own = now.saturating_add(config.trigger_duration_ms(
                    &trigger,
                    level,
                    snapshot_len,
                    now,
                ));
                if own >= e.until || e.until <= now {
                    e.trigger = trigger;
                }
                e.until = e.until.max(own);
                e.backoff_level = level;
                e.consecutive_failures = e.consecutive_failures.saturating_add(1);
                if !forbidden {
                    e.forbidden_streak = 0;
                } else if !herd || e.forbidden_streak == 0 {
                    e.forbidden_streak = e.forbidden_streak.saturating_add(1);
                }
                if !herd {
                    e.set_at = now;
                }
                self.signals.changed(signal.set(e.until));
                e.until
            }
        };
        (until > now).then_some(until)
    }

    /// Records a successful attempt: resets the failure count and backoff level. A
    /// running cooldown keeps its expiry (the success may come from an attempt that was
    /// in flight before the limit was hit); use [`CooldownBook::clear`] to end one.
    ///
    /// While no account has an entry this is one load: a success that races with the
    /// first failure of its account is then ordered before that failure.
    pub fn record_success(&self, account: &AccountId, now: UnixMs) {
        if self.held.load(Ordering::Relaxed) == 0 {
            return;
        }
        let removed = self.entries.remove_if_mut(account, |_, e| {
            e.backoff_level = 0;
            e.consecutive_failures = 0;
            e.forbidden_streak = 0;
            e.until <= now
        });
        if removed.is_some() {
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The account's current streak of consecutive `403`s
    /// ([`CooldownEntry::forbidden_streak`]).
    pub fn forbidden_streak(&self, account: &AccountId) -> u32 {
        self.entries.get(account).map_or(0, |e| e.forbidden_streak)
    }

    /// The account's cooldown expiry, if it is in cooldown at `now` (`now < until`).
    pub fn cooldown_until(&self, account: &AccountId, now: UnixMs) -> Option<UnixMs> {
        let until = self.entries.get(account)?.until;
        (until > now).then_some(until)
    }

    /// The account's full state, expired or not.
    pub fn entry(&self, account: &AccountId) -> Option<CooldownEntry> {
        self.entries.get(account).map(|e| *e)
    }

    /// Forgets everything about the account: cooldown, backoff level, failure count
    /// (the operator's "clear cooldown").
    pub fn clear(&self, account: &AccountId) {
        self.clear_if(account, |_| true);
    }

    /// [`CooldownBook::clear`] when the account's entry passes `clear`; returns the
    /// entry it removed.
    pub fn clear_if(
        &self,
        account: &AccountId,
        clear: impl FnOnce(&CooldownEntry) -> bool,
    ) -> Option<CooldownEntry> {
        match self.entries.entry(account.clone()) {
            Entry::Occupied(o) if clear(o.get()) => {
                if let Some(signal) = self.signals.existing(account) {
                    self.signals.changed(signal.set(0));
                }
                self.held.fetch_sub(1, Ordering::Relaxed);
                Some(o.remove())
            }
            _ => None,
        }
    }

    /// The account's [`CooldownSignal`]: its expiry, readable without a lock, kept in
    /// step with the entry by every write of this book. Resolve it once and read it
    /// many times (see the `signal` module).
    pub fn signal(&self, account: &AccountId) -> Arc<CooldownSignal> {
        self.signals.get(account)
    }

    /// How many times any account's [`CooldownSignal`] changed value: a result computed
    /// from the signals stays right while this stays the same (and no block it saw has
    /// expired).
    pub fn signal_epoch(&self) -> u64 {
        self.signals.epoch()
    }

    /// Every entry, with absolute times, for the state file and Redis.
    pub fn export(&self) -> Vec<CooldownRecord> {
        book::export(&self.entries, |account, entry| CooldownRecord {
            account,
            entry,
        })
    }

    /// Loads exported entries: those whose cooldown has not expired at `now` are kept
    /// with their absolute expiry (so exactly their remaining time); expired ones are
    /// dropped. An expiry later than any trigger can set from `now`
    /// ([`CooldownConfig::longest_cooldown_ms`]: persisted by an older keypool from a
    /// far-future reset) is clamped to that and reported. When the book already holds
    /// an entry for the account, the one with the later expiry wins. Returns how many
    /// entries were taken and what was clamped.
    pub fn import(
        &self,
        records: impl IntoIterator<Item = CooldownRecord>,
        now: UnixMs,
    ) -> Imported<CooldownCorrection> {
        let limit = now.saturating_add(self.config.load().longest_cooldown_ms());
        let mut corrected = Vec::new();
        let live = records
            .into_iter()
            .filter(|r| r.entry.until > now)
            .map(|mut r| {
                if r.entry.until > limit {
                    corrected.push((
                        r.account.clone(),
                        CooldownCorrection {
                            received: r.entry.until,
                            recorded: limit,
                        },
                    ));
                    r.entry.until = limit;
                    if let Trigger::WindowExhausted { reset } = &mut r.entry.trigger {
                        *reset = (*reset).min(limit);
                    }
                }
                (r.account, r.entry)
            });
        let taken = book::import(
            &self.entries,
            live,
            |current, incoming| current.until < incoming.until,
            |account, entry, new| {
                if new {
                    self.held.fetch_add(1, Ordering::Relaxed);
                }
                let changed = self.signals.get(account).set(entry.until);
                self.signals.changed(changed);
            },
        );
        Imported { taken, corrected }
    }

    /// Drops entries that no longer matter at `now`: expired and at backoff level 0.
    pub fn purge(&self, now: UnixMs) {
        self.entries.retain(|_, e| {
            let keep = e.until > now || e.backoff_level > 0;
            if !keep {
                self.held.fetch_sub(1, Ordering::Relaxed);
            }
            keep
        });
    }

    /// Number of accounts with an entry (expired or not).
    pub fn len(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// True when no account has an entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::{AttemptFailure, TransportFailure, classify};
    use crate::config::CooldownSettings;
    use crate::facts::{RateLimitInfo, UnifiedStatus};
    use http::StatusCode;
    use proptest::prelude::*;

    const NOW: UnixMs = 1_700_000_000_000;
    const SEC: u64 = 1_000;

    fn id(s: &str) -> AccountId {
        AccountId::from(s)
    }

    fn status_info(code: u16, info: &RateLimitInfo) -> Classification {
        let status = StatusCode::from_u16(code).unwrap();
        classify(
            &AttemptFailure::Status {
                status,
                rate_limit: info,
                marks: Default::default(),
            },
            NOW,
        )
    }

    fn status(code: u16) -> Classification {
        status_info(code, &RateLimitInfo::default())
    }

    fn transport(f: TransportFailure) -> Classification {
        classify(&AttemptFailure::Transport(f), NOW)
    }

    /// Records one fresh failure (attempt started just before `now`) on a new book and
    /// returns the cooldown in ms from `now`.
    fn first_cooldown(c: &Classification, snapshot_len: usize) -> Option<u64> {
        let book = CooldownBook::default();
        book.record_failure(&id("a"), c, NOW - 1, snapshot_len, NOW)
            .map(|u| u - NOW)
    }

    // ---- one test per row of the SPEC 6 trigger table ----

    #[test]
    fn row_401_key_error_no_cooldown() {
        assert_eq!(status(401).class, FailureClass::KeyError);
        assert_eq!(first_cooldown(&status(401), 10), None);
    }

    /// SPEC 6/16: a 403 without a ban marker is a 60 s cooldown (the streak that bans
    /// is `PoolHealth`'s), counted in the entry's streak.
    #[test]
    fn row_403_cooldown_of_60_s_and_its_streak() {
        assert_eq!(status(403).class, FailureClass::KeyError);
        assert_eq!(first_cooldown(&status(403), 10), Some(60_000));
        let book = CooldownBook::default();
        let a = id("a");
        book.record_failure(&a, &status(403), NOW - 1, 10, NOW);
        // the herd (started before) does not add to the streak
        book.record_failure(&a, &status(403), NOW - 2, 10, NOW + 1);
        assert_eq!(book.forbidden_streak(&a), 1);
        book.record_failure(&a, &status(403), NOW + 5, 10, NOW + 6);
        assert_eq!(book.forbidden_streak(&a), 2);
        // any other failure ends it
        book.record_failure(&a, &status(500), NOW + 7, 10, NOW + 8);
        assert_eq!(book.forbidden_streak(&a), 0);
    }

    #[test]
    fn row_402_key_error_no_cooldown() {
        assert_eq!(status(402).class, FailureClass::KeyError);
        assert_eq!(first_cooldown(&status(402), 10), None);
    }

    #[test]
    fn row_429_window_exhausted_until_the_reset() {
        let info = RateLimitInfo {
            unified_status: Some(UnifiedStatus::Rejected),
            unified_reset: Some(NOW + 4 * 3_600 * SEC),
            retry_after_ms: Some(30 * SEC),
            ..Default::default()
        };
        let c = status_info(429, &info);
        assert_eq!(c.class, FailureClass::RateLimit);
        assert_eq!(first_cooldown(&c, 10), Some(4 * 3_600 * SEC));
        // Also in a large pool: the window row is not shortened.
        assert_eq!(first_cooldown(&c, 500), Some(4 * 3_600 * SEC));
    }

    #[test]
    fn row_429_retry_after_clamped_1s_to_1h() {
        for (wait, expected) in [
            (0, SEC),
            (500, SEC),
            (SEC, SEC),
            (42 * SEC, 42 * SEC),
            (3_600 * SEC, 3_600 * SEC),
            (3_600 * SEC + 1, 3_600 * SEC),
            (u64::MAX, 3_600 * SEC),
        ] {
            let info = RateLimitInfo {
                retry_after_ms: Some(wait),
                ..Default::default()
            };
            let c = status_info(429, &info);
            assert_eq!(c.class, FailureClass::RateLimit);
            assert_eq!(first_cooldown(&c, 10), Some(expected), "wait {wait}");
            assert_eq!(
                first_cooldown(&c, 500),
                Some(expected),
                "wait {wait}, large pool"
            );
        }
    }

    #[test]
    fn row_429_plain_60s_or_10s_above_100_accounts() {
        let c = status(429);
        assert_eq!(c.class, FailureClass::RateLimit);
        assert_eq!(first_cooldown(&c, 1), Some(60 * SEC));
        assert_eq!(first_cooldown(&c, 100), Some(60 * SEC));
        assert_eq!(first_cooldown(&c, 101), Some(10 * SEC));
        assert_eq!(first_cooldown(&c, 400), Some(10 * SEC));
    }

    #[test]
    fn row_529_503_overloaded_15s() {
        for code in [529, 503] {
            let c = status(code);
            assert_eq!(c.class, FailureClass::Transient);
            assert_eq!(first_cooldown(&c, 10), Some(15 * SEC));
        }
    }

    #[test]
    fn row_other_transient_none_then_exponential_backoff() {
        let failures = [
            status(500),
            status(502),
            status(504),
            transport(TransportFailure::Connect),
            transport(TransportFailure::Reset),
            transport(TransportFailure::Timeout),
            transport(TransportFailure::InvalidStreamStart),
        ];
        for c in failures {
            assert_eq!(c.class, FailureClass::Transient);
            let book = CooldownBook::default();
            let mut got = Vec::new();
            for n in 0..10u64 {
                // Sequential attempts: each one starts after the previous failure.
                let now = NOW + n * 1_000 * SEC;
                got.push(
                    book.record_failure(&id("a"), &c, now - 1, 10, now)
                        .map(|u| u - now),
                );
            }
            let s = |x: u64| Some(x * SEC);
            assert_eq!(
                got,
                [
                    None,
                    s(5),
                    s(10),
                    s(20),
                    s(40),
                    s(80),
                    s(160),
                    s(300),
                    s(300),
                    s(300)
                ],
                "{:?}",
                c.trigger
            );
        }
    }

    #[test]
    fn row_request_errors_no_cooldown_and_no_backoff() {
        for code in [400, 404, 413, 422] {
            let c = status(code);
            assert_eq!(c.class, FailureClass::Transient);
            assert!(c.is_request_error());
            let book = CooldownBook::default();
            for n in 0..5 {
                let now = NOW + n * SEC;
                assert_eq!(book.record_failure(&id("a"), &c, now - 1, 10, now), None);
            }
            assert!(book.is_empty());
        }
    }

    // ---- the class table: effect per class ----

    #[test]
    fn class_table_effects() {
        // key_error: no cooldown (disabling is the DisabledBook's job; tested there).
        assert_eq!(first_cooldown(&status(401), 10), None);
        // rate_limit: cooldown set by the trigger.
        assert_eq!(first_cooldown(&status(429), 10), Some(60 * SEC));
        // transient: short backoff or none.
        assert_eq!(first_cooldown(&status(500), 10), None);
        assert_eq!(first_cooldown(&status(503), 10), Some(15 * SEC));
    }

    // ---- success, herd, clear, export/import ----

    #[test]
    fn success_resets_level_and_count_but_not_a_running_cooldown() {
        let book = CooldownBook::default();
        let a = id("a");
        let c = status(500);
        book.record_failure(&a, &c, NOW - 1, 10, NOW);
        assert_eq!(
            book.record_failure(&a, &c, NOW + 1, 10, NOW + 2),
            Some(NOW + 2 + 5 * SEC)
        );
        book.record_success(&a, NOW + 3);
        let e = book.entry(&a).unwrap();
        assert_eq!(
            (e.backoff_level, e.consecutive_failures, e.until),
            (0, 0, NOW + 2 + 5 * SEC)
        );
        // Next failure is a "first" again: no cooldown of its own.
        let later = NOW + 10 * SEC;
        assert_eq!(book.record_failure(&a, &c, later - 1, 10, later), None);
        // A success after expiry removes the entry.
        book.record_success(&a, later + 1);
        assert!(book.entry(&a).is_none());
    }

    #[test]
    fn herd_does_not_raise_backoff_or_extend_beyond_own_trigger() {
        let book = CooldownBook::default();
        let a = id("a");
        let c = status(500);
        let start = NOW - 100;
        // Level 1 at NOW, level 2 (5 s) at NOW + 10.
        book.record_failure(&a, &c, start, 10, NOW);
        assert_eq!(
            book.record_failure(&a, &c, NOW + 5, 10, NOW + 10),
            Some(NOW + 10 + 5 * SEC)
        );
        // Twenty attempts that started before NOW + 10 fail later: level stays 2,
        // each may push the expiry only to its own now + 5 s.
        for k in 1..=20 {
            let now = NOW + 10 + k * 100;
            assert_eq!(
                book.record_failure(&a, &c, NOW + 9, 10, now),
                Some(now + 5 * SEC)
            );
        }
        let e = book.entry(&a).unwrap();
        assert_eq!(e.backoff_level, 2);
        assert_eq!(e.consecutive_failures, 22);
        assert_eq!(e.set_at, NOW + 10);
    }

    #[test]
    fn failures_never_shorten_a_cooldown() {
        let book = CooldownBook::default();
        let a = id("a");
        let info = RateLimitInfo {
            unified_status: Some(UnifiedStatus::Rejected),
            unified_reset: Some(NOW + 3_600 * SEC),
            ..Default::default()
        };
        book.record_failure(&a, &status_info(429, &info), NOW - 1, 10, NOW);
        assert_eq!(
            book.record_failure(&a, &status(503), NOW + 1, 10, NOW + 2),
            Some(NOW + 3_600 * SEC)
        );
        assert_eq!(book.entry(&a).unwrap().trigger.as_str(), "window_exhausted");
        book.clear(&a);
        assert_eq!(book.cooldown_until(&a, NOW + 3), None);
    }

    #[test]
    fn config_reload_changes_later_durations() {
        let book = CooldownBook::default();
        let settings = CooldownSettings {
            rate_limit_ms: 30 * SEC,
            ..Default::default()
        };
        book.set_config(CooldownConfig::try_new(settings).unwrap());
        assert_eq!(
            book.record_failure(&id("a"), &status(429), NOW - 1, 10, NOW),
            Some(NOW + 30 * SEC)
        );
    }

    #[test]
    fn import_keeps_unexpired_with_absolute_expiry() {
        let book = CooldownBook::default();
        let info = RateLimitInfo {
            unified_status: Some(UnifiedStatus::Rejected),
            unified_reset: Some(NOW + 4 * 3_600 * SEC),
            ..Default::default()
        };
        book.record_failure(&id("window"), &status_info(429, &info), NOW - 1, 10, NOW);
        book.record_failure(&id("plain"), &status(429), NOW - 1, 10, NOW);
        let json = serde_json::to_string(&book.export()).unwrap();
        // One hour later: the window cooldown has 3 h left, the 60 s one is gone.
        let later = NOW + 3_600 * SEC;
        let restored = CooldownBook::default();
        let records: Vec<CooldownRecord> = serde_json::from_str(&json).unwrap();
        assert_eq!(restored.import(records, later).taken, 1);
        assert_eq!(
            restored.cooldown_until(&id("window"), later),
            Some(later + 3 * 3_600 * SEC)
        );
        assert_eq!(restored.entry(&id("plain")), None);
    }

    #[test]
    fn purge_keeps_what_still_matters() {
        let book = CooldownBook::default();
        book.record_failure(&id("rl"), &status(429), NOW - 1, 10, NOW);
        book.record_failure(&id("t"), &status(500), NOW - 1, 10, NOW);
        book.purge(NOW + 61 * SEC);
        assert!(book.entry(&id("rl")).is_none());
        assert_eq!(book.entry(&id("t")).unwrap().backoff_level, 1);
    }

    fn any_failure() -> impl Strategy<Value = Classification> {
        prop_oneof![
            (0u64..7_200_000).prop_map(|w| {
                let info = RateLimitInfo {
                    retry_after_ms: Some(w),
                    ..Default::default()
                };
                status_info(429, &info)
            }),
            (1u64..20_000_000).prop_map(|d| {
                let info = RateLimitInfo {
                    unified_status: Some(UnifiedStatus::Rejected),
                    unified_reset: Some(NOW + d),
                    ..Default::default()
                };
                status_info(429, &info)
            }),
            Just(status(429)),
            Just(status(503)),
            Just(status(529)),
            Just(status(500)),
            Just(status(400)),
            Just(status(401)),
            Just(transport(TransportFailure::Timeout)),
        ]
    }

    /// One operation on a book, for the count's property test.
    #[derive(Debug, Clone)]
    enum Op {
        Failure(usize, Classification),
        Success(usize),
        Clear(usize),
        ClearWindowOnly(usize),
        Purge,
        Import(Vec<(usize, u64, u32)>),
    }

    fn any_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0usize..4, any_failure()).prop_map(|(a, c)| Op::Failure(a, c)),
            4 => (0usize..4).prop_map(Op::Success),
            1 => (0usize..4).prop_map(Op::Clear),
            1 => (0usize..4).prop_map(Op::ClearWindowOnly),
            1 => Just(Op::Purge),
            1 => proptest::collection::vec((0usize..4, 0u64..400_000, 0u32..3), 0..4)
                .prop_map(Op::Import),
        ]
    }

    proptest! {
        /// The count a success reads before it takes any lock is the number of
        /// entries after every operation, and a success with no entry held changes
        /// nothing that a success with the lock would have changed.
        #[test]
        fn the_held_count_is_the_number_of_entries(
            ops in proptest::collection::vec((any_op(), 0u64..200_000), 1..60),
        ) {
            let book = CooldownBook::default();
            let mut now = NOW;
            for (op, step) in ops {
                now += step;
                match op {
                    Op::Failure(a, c) => {
                        book.record_failure(&id(&a.to_string()), &c, now - 1, 10, now);
                    }
                    Op::Success(a) => book.record_success(&id(&a.to_string()), now),
                    Op::Clear(a) => book.clear(&id(&a.to_string())),
                    Op::ClearWindowOnly(a) => {
                        book.clear_if(&id(&a.to_string()), |e| e.backoff_level > 1);
                    }
                    Op::Purge => book.purge(now),
                    Op::Import(records) => {
                        book.import(
                            records.into_iter().map(|(a, ahead, level)| CooldownRecord {
                                account: id(&a.to_string()),
                                entry: CooldownEntry {
                                    until: now + ahead,
                                    set_at: now,
                                    trigger: Trigger::OtherStatus { status: 503 },
                                    backoff_level: level,
                                    consecutive_failures: 1,
                                    forbidden_streak: 0,
                                },
                            }),
                            now,
                        );
                    }
                }
                prop_assert_eq!(book.len(), book.entries.len());
                prop_assert_eq!(book.is_empty(), book.entries.is_empty());
            }
        }

        /// Whatever happened before, after a failure the account is in cooldown at
        /// least as long as that failure's own trigger says (at the level it was
        /// recorded at).
        #[test]
        fn cooldown_never_shorter_than_its_trigger(
            events in proptest::collection::vec((any_failure(), 0u64..5_000, 0u64..3_000, 1usize..300), 1..30),
        ) {
            let book = CooldownBook::default();
            let config = CooldownConfig::default();
            let a = id("a");
            let mut now = NOW;
            for (c, step, age, len) in events {
                now += step;
                let started = now.saturating_sub(age);
                let got = book.record_failure(&a, &c, started, len, now);
                let level = book.entry(&a).map_or(0, |e| e.backoff_level);
                let own = config.trigger_duration_ms(&c.trigger, level, len, now);
                if own > 0 {
                    prop_assert!(got.is_some_and(|u| u >= now + own), "{:?}: {:?} < {}", c.trigger, got, now + own);
                }
            }
        }

        /// k attempts all in flight when the cooldown they hit was set raise the
        /// backoff level by exactly one in total.
        #[test]
        fn herd_raises_backoff_level_by_exactly_one(
            prior in 0u32..6,
            k in 1usize..40,
            gaps in proptest::collection::vec(1u64..2_000, 40),
        ) {
            let book = CooldownBook::default();
            let a = id("a");
            let c = status(502);
            let mut now = NOW;
            for _ in 0..prior {
                now += 10_000;
                book.record_failure(&a, &c, now - 1, 10, now);
            }
            let before = book.entry(&a).map_or(0, |e| e.backoff_level);
            // All k attempts started here, before the first of them fails.
            let started = now + 1;
            now += 2;
            for gap in gaps.iter().take(k) {
                book.record_failure(&a, &c, started, 10, now);
                now += gap;
            }
            prop_assert_eq!(book.entry(&a).unwrap().backoff_level, before + 1);
        }

        /// The pool-size boundary of the plain 429 row.
        #[test]
        fn plain_429_pool_size_boundary(len in prop_oneof![95usize..107, 0usize..1_000]) {
            let expected = if len > 100 { 10 * SEC } else { 60 * SEC };
            prop_assert_eq!(first_cooldown(&status(429), len), Some(expected));
        }

        /// Export, then import at any later `now`: unexpired entries keep their exact
        /// absolute expiry (so their remaining time), expired ones are dropped.
        #[test]
        fn export_import_preserves_absolute_expiries(
            events in proptest::collection::vec((0usize..5, any_failure(), 0u64..5_000), 1..30),
            later in 0u64..8_000_000,
        ) {
            let book = CooldownBook::default();
            let mut now = NOW;
            for (acct, c, step) in events {
                now += step;
                book.record_failure(&id(&acct.to_string()), &c, now - 1, 10, now);
            }
            let exported = book.export();
            let json = serde_json::to_string(&exported).unwrap();
            let later_now = now + later;
            let restored = CooldownBook::default();
            restored.import(serde_json::from_str::<Vec<CooldownRecord>>(&json).unwrap(), later_now);
            for r in exported {
                let got = restored.entry(&r.account);
                if r.entry.until > later_now {
                    prop_assert_eq!(got, Some(r.entry));
                    prop_assert_eq!(
                        restored.cooldown_until(&r.account, later_now).map(|u| u - later_now),
                        Some(r.entry.until - later_now)
                    );
                } else {
                    prop_assert_eq!(got, None);
                }
            }
        }
    }
}
