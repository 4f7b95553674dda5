//! The model lockout book (SPEC 16): a `404 not_found_error` for a model locks that
//! (account, model) pair, not the account.
//!
//! The first lockout lasts `model_lockout_ms` (10 min), each repeat doubles it up to
//! `model_lockout_max_ms` (6 h) ([`crate::CooldownConfig::lockout_ms`]); a success of the
//! pair halves its failure count, and a pair whose count reached 0 and whose lockout
//! ended is forgotten. Herd protection as in the cooldown book: a 404 of an attempt that
//! started before the current lockout was set does not double it again.
//!
//! Each account has one [`CooldownSignal`] holding the latest end of any of its
//! lockouts, so the request path asks the book only about accounts that have one.
//!
//! ```
//! use keypool_cooldown::{CooldownConfig, LockoutBook};
//! use keypool_core::AccountId;
//!
//! let book = LockoutBook::new(CooldownConfig::default());
//! let a = AccountId::from("a");
//! assert_eq!(book.lock(&a, "claude-x", 0, 1_000), 1_000 + 600_000);
//! assert_eq!(book.locked_until(&a, "claude-x", 1_000), Some(601_000));
//! assert_eq!(book.locked_until(&a, "claude-sonnet-4-5", 1_000), None);
//! assert_eq!(book.lock(&a, "claude-x", 700_000, 700_000), 700_000 + 1_200_000); // doubled
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arc_swap::ArcSwap;
use dashmap::DashMap;
use keypool_core::{AccountId, UnixMs};
use serde::{Deserialize, Serialize};

use crate::config::CooldownConfig;
use crate::signal::{CooldownSignal, Signals};

/// Most models one account keeps lockouts for (the model is the caller's text, so the
/// book stays bounded whatever callers send).
pub const MAX_MODELS_PER_ACCOUNT: usize = 64;

/// One (account, model) lockout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lockout {
    /// The model is usable again on the account at `until`, unix ms.
    pub until: UnixMs,
    /// When the last fresh (non-herd) 404 was recorded.
    pub set_at: UnixMs,
    /// Consecutive 404s, halved by each success (the lockout doubles with it).
    pub failures: u32,
}

/// One exported lockout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockoutRecord {
    /// The account.
    pub account: AccountId,
    /// The model id as the request named it.
    pub model: String,
    /// Its state.
    #[serde(flatten)]
    pub lockout: Lockout,
}

/// Per-(account, model) lockouts. Thread-safe; every operation takes `now`.
#[derive(Debug)]
pub struct LockoutBook {
    config: ArcSwap<CooldownConfig>,
    /// Per account: its locked models (few; a linear scan).
    entries: DashMap<AccountId, Vec<(Box<str>, Lockout)>, crate::Hasher>,
    signals: Signals<CooldownSignal>,
    /// Accounts with an entry: a success on an account of a book that holds none costs
    /// one load.
    accounts: AtomicUsize,
}

impl Default for LockoutBook {
    fn default() -> Self {
        Self::new(CooldownConfig::default())
    }
}

impl LockoutBook {
    /// An empty book.
    pub fn new(config: CooldownConfig) -> Self {
        Self {
            config: ArcSwap::from_pointee(config),
            entries: DashMap::default(),
            signals: Signals::default(),
            accounts: AtomicUsize::new(0),
        }
    }

    /// Takes the lockout lengths of a reloaded config; running lockouts keep their end.
    pub fn set_config(&self, config: CooldownConfig) {
        self.config.store(config.into());
    }

    /// Records a `404 not_found_error` of `model` on `account` by an attempt that
    /// started at `attempt_started_at`; returns the lockout's end. A fresh 404 adds one
    /// failure and locks for [`CooldownConfig::lockout_ms`] of the new count from `now`;
    /// a lockout is never shortened.
    pub fn lock(
        &self,
        account: &AccountId,
        model: &str,
        attempt_started_at: UnixMs,
        now: UnixMs,
    ) -> UnixMs {
        let config = self.config.load();
        let signal = self.signals.get(account);
        let mut models = self.entries.entry(account.clone()).or_insert_with(|| {
            self.accounts.fetch_add(1, Ordering::Relaxed);
            Vec::new()
        });
        let at = match models.iter().position(|(m, _)| &**m == model) {
            Some(i) => i,
            None => {
                // The model is the caller's text: an account keeps at most
                // MAX_MODELS_PER_ACCOUNT of them, the one that ends first making room.
                if models.len() >= MAX_MODELS_PER_ACCOUNT
                    && let Some(i) = (0..models.len()).min_by_key(|&i| models[i].1.until)
                {
                    models.swap_remove(i);
                }
                models.push((model.into(), Lockout::default_at(now)));
                models.len() - 1
            }
        };
        let lock = &mut models[at].1;
        let herd = lock.failures > 0 && attempt_started_at <= lock.set_at;
        if !herd {
            lock.failures = lock.failures.saturating_add(1);
            lock.set_at = now;
        }
        let own = now.saturating_add(config.lockout_ms(lock.failures));
        lock.until = if herd {
            lock.until
        } else {
            lock.until.max(own)
        };
        let until = lock.until;
        self.signals.changed(signal.set(latest(&models)));
        until
    }

    /// A success of `model` on `account`: halves the pair's failure count, and forgets
    /// a pair whose count reached 0 once its lockout has ended.
    pub fn record_success(&self, account: &AccountId, model: &str, now: UnixMs) {
        if self.accounts.load(Ordering::Relaxed) == 0 {
            return;
        }
        let Some(mut models) = self.entries.get_mut(account) else {
            return;
        };
        let Some(i) = models.iter().position(|(m, _)| &**m == model) else {
            return;
        };
        let lock = &mut models[i].1;
        lock.failures /= 2;
        if lock.failures == 0 && lock.until <= now {
            models.swap_remove(i);
            self.resignal(account, &models);
        }
        let empty = models.is_empty();
        drop(models);
        if empty {
            self.forget_if_empty(account);
        }
    }

    /// When `model` is usable again on `account`, if it is locked at `now`.
    pub fn locked_until(&self, account: &AccountId, model: &str, now: UnixMs) -> Option<UnixMs> {
        let models = self.entries.get(account)?;
        let (_, lock) = models.iter().find(|(m, _)| &**m == model)?;
        (lock.until > now).then_some(lock.until)
    }

    /// The state of the (account, model) pair, ended or not.
    pub fn get(&self, account: &AccountId, model: &str) -> Option<Lockout> {
        let models = self.entries.get(account)?;
        models.iter().find(|(m, _)| &**m == model).map(|(_, l)| *l)
    }

    /// Changes so far of any account's lockout signal (see
    /// [`crate::CooldownBook::signal_epoch`]).
    pub fn signal_epoch(&self) -> u64 {
        self.signals.epoch()
    }

    /// The account's [`CooldownSignal`]: the latest end of any of its lockouts.
    pub fn signal(&self, account: &AccountId) -> Arc<CooldownSignal> {
        self.signals.get(account)
    }

    /// The account's lockouts still running at `now`, by model.
    pub fn of_account(&self, account: &AccountId, now: UnixMs) -> Vec<(String, Lockout)> {
        self.entries.get(account).map_or_else(Vec::new, |models| {
            models
                .iter()
                .filter(|(_, l)| l.until > now)
                .map(|(m, l)| (m.to_string(), *l))
                .collect()
        })
    }

    /// Ends the account's lockouts: of `model` only, or all of them (`None`). Returns
    /// how many running ones were cleared (the operator's "clear lockouts").
    pub fn clear(&self, account: &AccountId, model: Option<&str>, now: UnixMs) -> usize {
        let Some(mut models) = self.entries.get_mut(account) else {
            return 0;
        };
        let before = models.iter().filter(|(_, l)| l.until > now).count();
        models.retain(|(m, _)| model.is_some_and(|want| &**m != want));
        let after = models.iter().filter(|(_, l)| l.until > now).count();
        self.resignal(account, &models);
        let empty = models.is_empty();
        drop(models);
        if empty {
            self.forget_if_empty(account);
        }
        before - after
    }

    /// Sets the account's signal to the latest end of `models` (its entry, locked).
    fn resignal(&self, account: &AccountId, models: &[(Box<str>, Lockout)]) {
        if let Some(signal) = self.signals.existing(account) {
            self.signals.changed(signal.set(latest(models)));
        }
    }

    /// Drops the account's entry when it holds no model any more.
    fn forget_if_empty(&self, account: &AccountId) {
        if self
            .entries
            .remove_if(account, |_, m| m.is_empty())
            .is_some()
        {
            self.accounts.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether any account has a lockout entry (running or not yet forgotten).
    pub fn is_empty(&self) -> bool {
        self.accounts.load(Ordering::Relaxed) == 0
    }

    /// Every lockout, for the state file and Redis.
    pub fn export(&self) -> Vec<LockoutRecord> {
        let mut out = Vec::new();
        for entry in &self.entries {
            for (model, lockout) in entry.value() {
                out.push(LockoutRecord {
                    account: entry.key().clone(),
                    model: model.to_string(),
                    lockout: *lockout,
                });
            }
        }
        out.sort_by(|a, b| (&a.account, &a.model).cmp(&(&b.account, &b.model)));
        out
    }

    /// Loads exported lockouts still running at `now` (bounded to
    /// `model_lockout_max_ms` from `now`). A pair already known here keeps the later
    /// end. Returns how many were taken.
    pub fn import(&self, records: impl IntoIterator<Item = LockoutRecord>, now: UnixMs) -> usize {
        let max = now.saturating_add(self.config.load().settings().model_lockout_max_ms);
        let mut taken = 0;
        for r in records.into_iter().filter(|r| r.lockout.until > now) {
            let lockout = Lockout {
                until: r.lockout.until.min(max),
                ..r.lockout
            };
            let mut models = self.entries.entry(r.account.clone()).or_insert_with(|| {
                self.accounts.fetch_add(1, Ordering::Relaxed);
                Vec::new()
            });
            match models.iter_mut().find(|(m, _)| **m == *r.model) {
                Some((_, known)) if known.until >= lockout.until => continue,
                Some((_, known)) => *known = lockout,
                None => models.push((r.model.into(), lockout)),
            }
            taken += 1;
            let signal = self.signals.get(&r.account);
            self.signals.changed(signal.set(latest(&models)));
        }
        taken
    }
}

impl Lockout {
    fn default_at(now: UnixMs) -> Self {
        Self {
            until: now,
            set_at: now,
            failures: 0,
        }
    }
}

/// The latest end among `models` (0 when none).
fn latest(models: &[(Box<str>, Lockout)]) -> UnixMs {
    models.iter().map(|(_, l)| l.until).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: UnixMs = 1_700_000_000_000;
    const MIN: u64 = 60_000;

    fn a() -> AccountId {
        AccountId::from("a")
    }

    #[test]
    fn a_404_locks_only_that_model_and_doubles_up_to_six_hours() {
        let book = LockoutBook::default();
        let mut now = NOW;
        let mut lengths = Vec::new();
        for _ in 0..8 {
            let until = book.lock(&a(), "claude-x", now, now);
            lengths.push((until - now) / MIN);
            assert_eq!(book.locked_until(&a(), "claude-x", now), Some(until));
            assert_eq!(book.locked_until(&a(), "claude-y", now), None);
            assert_eq!(book.signal(&a()).until(), until);
            now = until; // the next 404 after the lockout ended
        }
        assert_eq!(lengths, [10, 20, 40, 80, 160, 320, 360, 360]);
        assert_eq!(book.locked_until(&a(), "claude-x", now), None);
    }

    #[test]
    fn the_herd_does_not_double_it_again() {
        let book = LockoutBook::default();
        let until = book.lock(&a(), "m", NOW - 5, NOW);
        // two more attempts that were in flight before the lockout was set
        assert_eq!(book.lock(&a(), "m", NOW - 3, NOW + 10), until);
        assert_eq!(book.lock(&a(), "m", NOW, NOW + 20), until);
        assert_eq!(book.of_account(&a(), NOW)[0].1.failures, 1);
    }

    #[test]
    fn successes_halve_the_count_and_forget_an_ended_pair() {
        let book = LockoutBook::default();
        let mut now = NOW;
        for _ in 0..4 {
            now = book.lock(&a(), "m", now, now);
        }
        // count 4: two successes bring it to 1, the next lockout lasts 20 min (count 2)
        book.record_success(&a(), "m", now);
        book.record_success(&a(), "m", now);
        assert_eq!(book.lock(&a(), "m", now, now), now + 20 * MIN);
        // a success at count 0 after the end forgets the pair
        let end = now + 20 * MIN;
        book.record_success(&a(), "m", end);
        book.record_success(&a(), "m", end);
        assert!(book.is_empty());
        assert_eq!(book.signal(&a()).until(), 0);
        assert_eq!(book.lock(&a(), "m", end, end), end + 10 * MIN);
    }

    #[test]
    fn clear_ends_one_model_or_all_and_export_import_keep_the_end() {
        let book = LockoutBook::default();
        let x = book.lock(&a(), "x", NOW, NOW);
        book.lock(&a(), "y", NOW, NOW + 1);
        let json = serde_json::to_string(&book.export()).unwrap();
        assert_eq!(book.clear(&a(), Some("y"), NOW), 1);
        assert_eq!(book.locked_until(&a(), "x", NOW), Some(x));
        assert_eq!(book.signal(&a()).until(), x);
        assert_eq!(book.clear(&a(), None, NOW), 1);
        assert!(book.is_empty());
        assert_eq!(book.signal(&a()).until(), 0);

        let restored = LockoutBook::default();
        let later = NOW + 5 * MIN;
        assert_eq!(
            restored.import(
                serde_json::from_str::<Vec<LockoutRecord>>(&json).unwrap(),
                later
            ),
            2
        );
        assert_eq!(restored.locked_until(&a(), "x", later), Some(x));
        // at x only y's lockout is still running
        let fresh = LockoutBook::default();
        assert_eq!(
            fresh.import(
                serde_json::from_str::<Vec<LockoutRecord>>(&json).unwrap(),
                x
            ),
            1
        );
    }

    #[test]
    fn an_account_keeps_a_bounded_number_of_models() {
        let book = LockoutBook::default();
        for i in 0..(MAX_MODELS_PER_ACCOUNT as u64 + 10) {
            book.lock(&a(), &format!("made-up-{i}"), NOW + i, NOW + i);
        }
        let held = book.of_account(&a(), NOW);
        assert_eq!(held.len(), MAX_MODELS_PER_ACCOUNT);
        // the ones that end first made room: the newest are all there
        assert!(book.locked_until(&a(), "made-up-73", NOW).is_some());
        assert!(book.locked_until(&a(), "made-up-0", NOW).is_none());
    }

    proptest! {
        /// The lockout state machine against a model of SPEC 16: fresh 404s double the
        /// length from 10 min up to 6 h, successes halve the count, the signal is always
        /// the latest end, and a lockout is never shortened by a 404.
        #[test]
        fn lockouts_follow_the_spec(steps in proptest::collection::vec((0u8..3, 0u64..30 * MIN), 1..40)) {
            let book = LockoutBook::default();
            let mut now = NOW;
            let (mut failures, mut until, mut set_at) = (0u32, 0u64, 0u64);
            for (op, gap) in steps {
                now += gap;
                match op {
                    0 => {
                        // a fresh 404 (the attempt started now)
                        let got = book.lock(&a(), "m", now, now);
                        if failures == 0 || now > set_at {
                            failures += 1;
                            set_at = now;
                            let own = now + ((10 * MIN) << (failures - 1).min(20)).min(360 * MIN);
                            until = until.max(own);
                        }
                        prop_assert_eq!(got, until);
                    }
                    1 => {
                        book.record_success(&a(), "m", now);
                        failures /= 2;
                        if failures == 0 && until <= now {
                            until = 0;
                        }
                    }
                    _ => {
                        let expect = (until > now).then_some(until);
                        prop_assert_eq!(book.locked_until(&a(), "m", now), expect);
                    }
                }
                prop_assert_eq!(book.signal(&a()).until(), until);
            }
        }
    }
}
