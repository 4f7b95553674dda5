//! The window book: the latest usage-window headers per account, and the "out of its
//! window until" answer of SPEC 5.
//!
//! State is only ever compared with `now`, so an account returns to service exactly at
//! the reset, with no request needed.
//!
//! ```
//! use keypool_cooldown::facts::{RateLimitInfo, WindowUsage};
//! use keypool_cooldown::{CooldownConfig, UsageLimit, WindowBook};
//! use keypool_core::{AccountId, Window};
//!
//! let book = WindowBook::new(&CooldownConfig::default());
//! let a = AccountId::from("a");
//! let info = RateLimitInfo {
//!     five_hour: WindowUsage { utilization: Some(0.96), reset: Some(50_000), status: None },
//!     ..Default::default()
//! };
//! book.observe(&a, &info, 1_000);
//! let out = book.out_of_window(&a, None, 1_000).unwrap();
//! assert_eq!((out.limit, out.until), (UsageLimit::Window(Window::FiveHour), 50_000));
//! assert_eq!(book.out_of_window(&a, Some(0.99), 1_000), None); // per-account threshold
//! assert_eq!(book.out_of_window(&a, None, 50_000), None); // back at the reset
//! ```

use std::sync::Arc;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use keypool_core::{AccountId, ModelFamily, UnixMs, Window};
use serde::{Deserialize, Serialize};

use crate::book::{self, Imported};
use crate::config::CooldownConfig;
use crate::facts::{RateLimitInfo, ResetCorrection, ResetKind, UnifiedStatus, WindowUsage};
use crate::signal::{Signals, WindowSignal};

/// What keeps an account out of rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageLimit {
    /// A subscription window (`5h` or `weekly`).
    Window(Window),
    /// An API-key account's request limit (`requests-remaining: 0`).
    Requests,
    /// The weekly window of one model family (SPEC 16): the account is out for
    /// requests of that family only.
    FamilyWeekly(ModelFamily),
}

impl UsageLimit {
    /// `5h`, `weekly` or `requests`: for the 429 body, metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Window(w) => w.as_str(),
            Self::Requests => "requests",
            Self::FamilyWeekly(ModelFamily::Opus) => "weekly_opus",
            Self::FamilyWeekly(ModelFamily::Sonnet) => "weekly_sonnet",
            Self::FamilyWeekly(ModelFamily::Haiku) => "weekly_haiku",
        }
    }

    /// The model family whose requests only this limit keeps out, if it is one.
    pub const fn family(self) -> Option<ModelFamily> {
        match self {
            Self::FamilyWeekly(f) => Some(f),
            Self::Window(_) | Self::Requests => None,
        }
    }

    /// The subscription window, if this is one.
    pub const fn window(self) -> Option<Window> {
        match self {
            Self::Window(w) => Some(w),
            Self::FamilyWeekly(_) => Some(Window::Weekly),
            Self::Requests => None,
        }
    }
}

/// The answer "out of its window until".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutOfWindow {
    /// The limit that ends last.
    pub limit: UsageLimit,
    /// When the account is back in service, unix ms (the latest blocking reset).
    pub until: UnixMs,
}

/// The latest rate-limit headers seen for one account.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowState {
    /// The merged headers (`retry_after_ms` is never kept: it belongs to one response).
    pub info: RateLimitInfo,
    /// When the last response with any of these headers arrived, unix ms.
    pub updated_at: UnixMs,
}

impl WindowState {
    /// The latest reset of any kind that is still after `now`; `None` when every
    /// recorded reset has passed (the state can no longer keep the account out).
    pub fn latest_future_reset(&self, now: UnixMs) -> Option<UnixMs> {
        ResetKind::ALL
            .into_iter()
            .filter_map(|kind| self.info.reset(kind))
            .filter(|&r| r > now)
            .max()
    }

    /// SPEC 5: whether this state keeps the account out at `now` for every model, and
    /// until when. `threshold` is the account's utilisation threshold. A family's
    /// weekly window (SPEC 16) is not counted here: see [`WindowState::family_block`].
    pub fn out_of_window(&self, threshold: f64, now: UnixMs) -> Option<OutOfWindow> {
        let i = &self.info;
        // The account is back only when every block has passed: keep the latest one
        // (ties keep the first found).
        let mut latest = Latest::new(now);
        for window in Window::ALL {
            let usage = i.window(*window);
            if exhausted(usage, threshold) {
                latest.block(UsageLimit::Window(*window), usage.reset);
            }
        }
        if i.unified_status == Some(UnifiedStatus::Rejected) && i.claimed_family().is_none() {
            latest.block(UsageLimit::Window(self.rejected_window()), i.unified_reset);
        }
        if i.requests_remaining == Some(0) {
            latest.block(UsageLimit::Requests, i.requests_reset);
        }
        latest.0
    }

    /// SPEC 16: whether `family`'s weekly window keeps the account out of requests of
    /// that family at `now`: its `-7d_<family>-*` headers say it is used up (at
    /// `threshold`) or rejected, or the overall status is `rejected` with the
    /// representative claim `seven_day_<family>`.
    pub fn family_block(
        &self,
        family: ModelFamily,
        threshold: f64,
        now: UnixMs,
    ) -> Option<OutOfWindow> {
        let i = &self.info;
        let mut latest = Latest::new(now);
        let usage = i.families.get(family);
        let limit = UsageLimit::FamilyWeekly(family);
        if exhausted(usage, threshold) {
            latest.block(limit, usage.reset);
        }
        if i.unified_status == Some(UnifiedStatus::Rejected) && i.claimed_family() == Some(family) {
            latest.block(limit, i.unified_reset.or(usage.reset));
        }
        latest.0
    }

    /// What keeps the account out of a request for a model of `family` (`None`: a
    /// model of no family): the account-wide block or the family's, whichever ends
    /// last.
    pub fn out_for(
        &self,
        family: Option<ModelFamily>,
        threshold: f64,
        now: UnixMs,
    ) -> Option<OutOfWindow> {
        let wide = self.out_of_window(threshold, now);
        let scoped = family.and_then(|f| self.family_block(f, threshold, now));
        match (wide, scoped) {
            (Some(w), Some(s)) => Some(if s.until > w.until { s } else { w }),
            (w, s) => w.or(s),
        }
    }

    /// The latest end of any block, account-wide or of any family: what the account's
    /// [`WindowSignal`] holds (a request of another family then asks the book).
    pub fn any_block_until(&self, threshold: f64, now: UnixMs) -> UnixMs {
        ModelFamily::ALL
            .iter()
            .filter_map(|f| self.family_block(*f, threshold, now))
            .chain(self.out_of_window(threshold, now))
            .map(|o| o.until)
            .max()
            .unwrap_or(0)
    }

    /// Every family whose weekly window keeps the account out at `now`.
    pub fn family_blocks(&self, threshold: f64, now: UnixMs) -> Vec<OutOfWindow> {
        ModelFamily::ALL
            .iter()
            .filter_map(|f| self.family_block(*f, threshold, now))
            .collect()
    }

    /// The window the overall `rejected` status stands for: the representative claim,
    /// else a window whose own status is `rejected`, else the 5-hour window.
    fn rejected_window(&self) -> Window {
        let i = &self.info;
        i.claimed_window()
            .or_else(|| {
                Window::ALL
                    .iter()
                    .copied()
                    .find(|w| i.window(*w).status == Some(UnifiedStatus::Rejected))
            })
            .unwrap_or(Window::FiveHour)
    }
}

/// A window used up at `threshold`, or rejected.
fn exhausted(usage: &WindowUsage, threshold: f64) -> bool {
    usage.utilization.is_some_and(|u| u >= threshold)
        || usage.status == Some(UnifiedStatus::Rejected)
}

/// The block that ends last among those offered (ties keep the first found).
struct Latest(Option<OutOfWindow>, UnixMs);

impl Latest {
    fn new(now: UnixMs) -> Self {
        Self(None, now)
    }

    fn block(&mut self, limit: UsageLimit, reset: Option<UnixMs>) {
        if let Some(until) = reset.filter(|&r| r > self.1)
            && self.0.is_none_or(|l| until > l.until)
        {
            self.0 = Some(OutOfWindow { limit, until });
        }
    }
}

/// What [`WindowBook::observe_change`] saw: the "out of its window" answer before and
/// after the update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowChange {
    /// Before the headers were merged.
    pub before: Option<OutOfWindow>,
    /// After.
    pub after: Option<OutOfWindow>,
}

/// One exported window state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowRecord {
    /// The account.
    pub account: AccountId,
    /// Its latest headers.
    #[serde(flatten)]
    pub state: WindowState,
}

/// Per-account usage-window state. Thread-safe; every answer takes `now`.
#[derive(Debug)]
pub struct WindowBook {
    default_threshold: std::sync::atomic::AtomicU64,
    entries: DashMap<AccountId, WindowState, crate::Hasher>,
    signals: Signals<WindowSignal>,
}

impl Default for WindowBook {
    fn default() -> Self {
        Self::new(&CooldownConfig::default())
    }
}

impl WindowBook {
    /// An empty book using the config's default `window_threshold`.
    pub fn new(config: &CooldownConfig) -> Self {
        let book = Self {
            default_threshold: std::sync::atomic::AtomicU64::new(0),
            entries: DashMap::default(),
            signals: Signals::default(),
        };
        book.set_config(config);
        book
    }

    /// Takes the default threshold from a reloaded config (and recomputes the signals
    /// of accounts without a threshold of their own when it changed).
    pub fn set_config(&self, config: &CooldownConfig) {
        let bits = config.settings().window_threshold.to_bits();
        let old = self
            .default_threshold
            .swap(bits, std::sync::atomic::Ordering::AcqRel);
        if old == bits {
            return;
        }
        let threshold = f64::from_bits(bits);
        for state in &self.entries {
            if let Some(signal) = self.signals.existing(state.key())
                && signal.threshold().is_none()
            {
                self.signals
                    .changed(signal.set_from(&state, threshold, state.updated_at));
            }
        }
    }

    /// The default threshold (used when an account has none of its own).
    pub fn default_threshold(&self) -> f64 {
        f64::from_bits(
            self.default_threshold
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Records the rate-limit headers of any upstream response (success or failure) of
    /// the account. Headers present overwrite what was known; absent ones keep the old
    /// value. A response with none of them changes nothing.
    pub fn observe(&self, account: &AccountId, info: &RateLimitInfo, now: UnixMs) {
        if !info.has_no_window_state() {
            self.observe_change(account, info, None, now);
        }
    }

    /// [`WindowBook::observe`], also answering [`WindowBook::out_of_window`] just before
    /// and just after the update (with the account's `threshold`, `None` = default), in
    /// one lookup: the store mirrors a state only when that answer changed.
    pub fn observe_change(
        &self,
        account: &AccountId,
        info: &RateLimitInfo,
        threshold: Option<f64>,
        now: UnixMs,
    ) -> WindowChange {
        let threshold = threshold.unwrap_or_else(|| self.default_threshold());
        if info.has_no_window_state() {
            let same = self
                .entries
                .get(account)
                .and_then(|state| state.out_of_window(threshold, now));
            return WindowChange {
                before: same,
                after: same,
            };
        }
        let signal = self.signals.get(account);
        let mut state = self.entries.entry(account.clone()).or_default();
        // Read under the entry lock (see signal_with_threshold).
        let own = signal
            .threshold()
            .unwrap_or_else(|| self.default_threshold());
        let before = state.out_of_window(threshold, now);
        let i = &mut state.info;
        i.unified_status = info.unified_status.or(i.unified_status);
        i.unified_reset = info.unified_reset.or(i.unified_reset);
        if info.representative_claim.is_some() {
            i.representative_claim
                .clone_from(&info.representative_claim);
        }
        i.five_hour.merge(&info.five_hour);
        i.seven_day.merge(&info.seven_day);
        for family in ModelFamily::ALL {
            i.families
                .get_mut(*family)
                .merge(info.families.get(*family));
        }
        i.requests_remaining = info.requests_remaining.or(i.requests_remaining);
        i.requests_reset = info.requests_reset.or(i.requests_reset);
        state.updated_at = state.updated_at.max(now);
        self.signals.changed(signal.set_from(&state, own, now));
        WindowChange {
            before,
            after: state.out_of_window(threshold, now),
        }
    }

    /// How many times any account's [`WindowSignal`] changed value (see
    /// [`CooldownBook::signal_epoch`](crate::CooldownBook::signal_epoch)).
    pub fn signal_epoch(&self) -> u64 {
        self.signals.epoch()
    }

    /// The account's [`WindowSignal`]: a lock-free "out of a window until" kept in step
    /// with the state by every write of this book, with the account's own `threshold`
    /// (`None` = the default). Resolve it once and read it many times (see the `signal`
    /// module); resolving it again with another threshold recomputes it.
    pub fn signal_with_threshold(
        &self,
        account: &AccountId,
        threshold: Option<f64>,
    ) -> Arc<WindowSignal> {
        let signal = self.signals.get(account);
        // Stored before taking the entry lock: a writer that locks after us reads it,
        // one that locked before us is recomputed here.
        if signal.set_threshold(threshold)
            && let Some(state) = self.entries.get(account)
        {
            let threshold = threshold.unwrap_or_else(|| self.default_threshold());
            self.signals
                .changed(signal.set_from(&state, threshold, state.updated_at));
        }
        signal
    }

    /// SPEC 5: `Some` while the account is out of a window (or of its request limit) at
    /// `now`, with the limit and the time it is back. `threshold` is the account's own
    /// `window_threshold`; `None` uses the default (0.95). Thresholds are validated by
    /// the configuration; a NaN one never matches a utilisation.
    pub fn out_of_window(
        &self,
        account: &AccountId,
        threshold: Option<f64>,
        now: UnixMs,
    ) -> Option<OutOfWindow> {
        let threshold = threshold.unwrap_or_else(|| self.default_threshold());
        self.entries.get(account)?.out_of_window(threshold, now)
    }

    /// [`WindowState::out_for`] of the account: what keeps it out of a request for a
    /// model of `family`, with its `threshold` (`None` = the default).
    pub fn out_for(
        &self,
        account: &AccountId,
        family: Option<ModelFamily>,
        threshold: Option<f64>,
        now: UnixMs,
    ) -> Option<OutOfWindow> {
        let threshold = threshold.unwrap_or_else(|| self.default_threshold());
        self.entries.get(account)?.out_for(family, threshold, now)
    }

    /// The account's latest state (for the admin view and `reset_aware`).
    pub fn state(&self, account: &AccountId) -> Option<WindowState> {
        self.entries.get(account).map(|s| s.clone())
    }

    /// Forgets the account's window state (the operator's "clear windows"); returns it.
    pub fn clear(&self, account: &AccountId) -> Option<WindowState> {
        let Entry::Occupied(o) = self.entries.entry(account.clone()) else {
            return None;
        };
        if let Some(signal) = self.signals.existing(account) {
            self.signals.changed(signal.clear());
        }
        Some(o.remove())
    }

    /// Every state, for the state file and Redis.
    pub fn export(&self) -> Vec<WindowRecord> {
        book::export(&self.entries, |account, state| WindowRecord {
            account,
            state,
        })
    }

    /// Loads exported states that still have a reset after `now`; states whose every
    /// reset has passed are dropped. Every reset is bounded first, exactly as a
    /// response's are ([`RateLimitInfo::bound_resets`]): state persisted by an older
    /// keypool, or mirrored by one, cannot keep an account out longer than a fresh
    /// response could. An account already known here keeps the state updated last.
    /// Returns how many were taken and what was bounded.
    pub fn import(
        &self,
        records: impl IntoIterator<Item = WindowRecord>,
        now: UnixMs,
    ) -> Imported<ResetCorrection> {
        let mut corrected = Vec::new();
        let live = records
            .into_iter()
            .map(|mut r| {
                for c in r.state.info.bound_resets(now) {
                    corrected.push((r.account.clone(), c));
                }
                r
            })
            .filter(|r| r.state.latest_future_reset(now).is_some())
            .map(|r| (r.account, r.state));
        let taken = book::import(
            &self.entries,
            live,
            |current, incoming| current.info.is_empty() || current.updated_at < incoming.updated_at,
            |account, state, _| {
                let signal = self.signals.get(account);
                let threshold = signal
                    .threshold()
                    .unwrap_or_else(|| self.default_threshold());
                self.signals.changed(signal.set_from(state, threshold, now));
            },
        );
        Imported { taken, corrected }
    }

    /// Number of accounts with a state.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no account has a state.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: UnixMs = 1_700_000_000_000;
    const H: u64 = 3_600_000;

    fn a() -> AccountId {
        AccountId::from("a")
    }

    fn usage(u: f64, reset: UnixMs) -> WindowUsage {
        WindowUsage {
            utilization: Some(u),
            reset: Some(reset),
            status: None,
        }
    }

    fn book_with(info: RateLimitInfo) -> WindowBook {
        let book = WindowBook::default();
        book.observe(&a(), &info, NOW);
        book
    }

    /// SPEC 16: a family's weekly window takes the account out for that family only;
    /// the overall `rejected` with a family claim is that family's, not the account's.
    #[test]
    fn a_family_window_blocks_only_its_family() {
        use crate::facts::FamilyWeekly;
        let book = book_with(RateLimitInfo {
            families: FamilyWeekly {
                opus: usage(1.0, NOW + 48 * H),
                sonnet: usage(0.3, NOW + 48 * H),
                ..FamilyWeekly::default()
            },
            ..RateLimitInfo::default()
        });
        let opus = Some(ModelFamily::Opus);
        assert_eq!(book.out_of_window(&a(), None, NOW), None);
        assert_eq!(
            book.out_for(&a(), Some(ModelFamily::Sonnet), None, NOW),
            None
        );
        assert_eq!(book.out_for(&a(), None, None, NOW), None);
        let out = book.out_for(&a(), opus, None, NOW).unwrap();
        assert_eq!(
            (out.limit, out.until),
            (UsageLimit::FamilyWeekly(ModelFamily::Opus), NOW + 48 * H)
        );
        assert_eq!(out.limit.as_str(), "weekly_opus");
        assert_eq!(out.limit.window(), Some(Window::Weekly));
        // the signal holds the family block: other families ask the book
        assert_eq!(book.signal_with_threshold(&a(), None).until(), NOW + 48 * H);
        assert_eq!(book.out_for(&a(), opus, None, NOW + 48 * H), None);

        let claimed = book_with(RateLimitInfo {
            unified_status: Some(UnifiedStatus::Rejected),
            unified_reset: Some(NOW + 20 * H),
            representative_claim: Some("seven_day_opus".into()),
            ..RateLimitInfo::default()
        });
        assert_eq!(claimed.out_of_window(&a(), None, NOW), None);
        assert_eq!(
            claimed.out_for(&a(), opus, None, NOW).unwrap().until,
            NOW + 20 * H
        );
        // an account-wide block applies to every family, the later one wins
        let both = book_with(RateLimitInfo {
            five_hour: usage(0.99, NOW + 2 * H),
            families: FamilyWeekly {
                opus: usage(1.0, NOW + H),
                ..FamilyWeekly::default()
            },
            ..RateLimitInfo::default()
        });
        assert_eq!(
            both.out_for(&a(), opus, None, NOW).unwrap().limit,
            UsageLimit::Window(Window::FiveHour)
        );
        assert_eq!(
            both.out_for(&a(), Some(ModelFamily::Haiku), None, NOW)
                .unwrap()
                .until,
            NOW + 2 * H
        );
    }

    proptest! {
        /// Per-family blocks never change the account-wide answer, a request of a family
        /// sees the later of the two, and the signal is the latest of all.
        #[test]
        fn family_blocks_compose(
            wide in proptest::option::of(0u64..10), fams in proptest::collection::vec(proptest::option::of(0u64..10), 3),
            probe in 0u64..12,
        ) {
            use crate::facts::FamilyWeekly;
            let mut info = RateLimitInfo::default();
            if let Some(h) = wide {
                info.seven_day = usage(1.0, NOW + h * H);
            }
            let mut families = FamilyWeekly::default();
            for (f, h) in ModelFamily::ALL.iter().zip(&fams) {
                if let Some(h) = h {
                    *families.get_mut(*f) = usage(1.0, NOW + h * H);
                }
            }
            info.families = families;
            let state = WindowState { info, updated_at: NOW };
            let now = NOW + probe * H;
            let wide_until = state.out_of_window(0.95, now).map(|o| o.until);
            prop_assert_eq!(wide_until, wide.map(|h| NOW + h * H).filter(|&u| u > now));
            let mut all = wide_until.unwrap_or(0);
            for (f, h) in ModelFamily::ALL.iter().zip(&fams) {
                let own = h.map(|h| NOW + h * H).filter(|&u| u > now);
                let got = state.out_for(Some(*f), 0.95, now).map(|o| o.until);
                prop_assert_eq!(got, own.max(wide_until));
                all = all.max(own.unwrap_or(0));
            }
            prop_assert_eq!(state.any_block_until(0.95, now), all);
        }
    }

    #[test]
    fn utilization_at_threshold_is_out_until_reset() {
        let book = book_with(RateLimitInfo {
            five_hour: usage(0.95, NOW + H),
            ..Default::default()
        });
        assert_eq!(
            book.out_of_window(&a(), None, NOW),
            Some(OutOfWindow {
                limit: UsageLimit::Window(Window::FiveHour),
                until: NOW + H
            })
        );
        assert!(book.out_of_window(&a(), None, NOW + H - 1).is_some());
        assert_eq!(book.out_of_window(&a(), None, NOW + H), None);
        let below = book_with(RateLimitInfo {
            five_hour: usage(0.949, NOW + H),
            ..Default::default()
        });
        assert_eq!(below.out_of_window(&a(), None, NOW), None);
        assert!(below.out_of_window(&a(), Some(0.9), NOW).is_some());
    }

    #[test]
    fn weekly_window_and_the_latest_block_wins() {
        let book = book_with(RateLimitInfo {
            five_hour: usage(1.0, NOW + H),
            seven_day: usage(0.99, NOW + 48 * H),
            ..Default::default()
        });
        assert_eq!(
            book.out_of_window(&a(), None, NOW),
            Some(OutOfWindow {
                limit: UsageLimit::Window(Window::Weekly),
                until: NOW + 48 * H
            })
        );
    }

    #[test]
    fn rejected_status_until_reset_names_the_claimed_window() {
        let book = book_with(RateLimitInfo {
            unified_status: Some(UnifiedStatus::Rejected),
            unified_reset: Some(NOW + 2 * H),
            representative_claim: Some("seven_day".into()),
            ..Default::default()
        });
        let out = book.out_of_window(&a(), None, NOW).unwrap();
        assert_eq!(
            out,
            OutOfWindow {
                limit: UsageLimit::Window(Window::Weekly),
                until: NOW + 2 * H
            }
        );
        assert_eq!(out.limit.as_str(), "weekly");
        assert_eq!(book.out_of_window(&a(), None, NOW + 2 * H), None);
        // A per-window `rejected` status counts too.
        let per_window = book_with(RateLimitInfo {
            five_hour: WindowUsage {
                status: Some(UnifiedStatus::Rejected),
                reset: Some(NOW + H),
                utilization: None,
            },
            ..Default::default()
        });
        assert_eq!(
            per_window.out_of_window(&a(), None, NOW).unwrap().until,
            NOW + H
        );
    }

    #[test]
    fn api_key_requests_remaining_zero_until_requests_reset() {
        let book = book_with(RateLimitInfo {
            requests_remaining: Some(0),
            requests_reset: Some(NOW + 30_000),
            ..Default::default()
        });
        let out = book.out_of_window(&a(), None, NOW).unwrap();
        assert_eq!(
            out,
            OutOfWindow {
                limit: UsageLimit::Requests,
                until: NOW + 30_000
            }
        );
        assert_eq!((out.limit.as_str(), out.limit.window()), ("requests", None));
        assert_eq!(book.out_of_window(&a(), None, NOW + 30_000), None);
        let one_left = book_with(RateLimitInfo {
            requests_remaining: Some(1),
            requests_reset: Some(NOW + 30_000),
            ..Default::default()
        });
        assert_eq!(one_left.out_of_window(&a(), None, NOW), None);
    }

    #[test]
    fn observe_merges_and_ignores_empty_responses() {
        let book = book_with(RateLimitInfo {
            five_hour: usage(0.5, NOW + H),
            ..Default::default()
        });
        book.observe(
            &a(),
            &RateLimitInfo {
                retry_after_ms: Some(1),
                ..Default::default()
            },
            NOW + 1,
        );
        assert_eq!(book.state(&a()).unwrap().updated_at, NOW);
        let newer = RateLimitInfo {
            five_hour: WindowUsage {
                utilization: Some(0.97),
                reset: None,
                status: None,
            },
            ..Default::default()
        };
        book.observe(&a(), &newer, NOW + 2);
        let s = book.state(&a()).unwrap();
        assert_eq!(s.info.five_hour, usage(0.97, NOW + H));
        assert_eq!(s.updated_at, NOW + 2);
        assert!(book.out_of_window(&a(), None, NOW + 2).is_some());
        assert!(
            WindowBook::default()
                .out_of_window(&a(), None, NOW)
                .is_none()
        );
    }

    #[test]
    fn import_drops_states_with_every_reset_passed() {
        let book = WindowBook::default();
        book.observe(
            &AccountId::from("live"),
            &RateLimitInfo {
                seven_day: usage(0.99, NOW + 48 * H),
                ..Default::default()
            },
            NOW,
        );
        book.observe(
            &AccountId::from("stale"),
            &RateLimitInfo {
                five_hour: usage(0.99, NOW + H),
                ..Default::default()
            },
            NOW,
        );
        let json = serde_json::to_string(&book.export()).unwrap();
        let restored = WindowBook::default();
        let later = NOW + 2 * H;
        assert_eq!(
            restored
                .import(
                    serde_json::from_str::<Vec<WindowRecord>>(&json).unwrap(),
                    later
                )
                .taken,
            1
        );
        assert_eq!(
            restored
                .out_of_window(&AccountId::from("live"), None, later)
                .unwrap()
                .until,
            NOW + 48 * H
        );
        assert!(restored.state(&AccountId::from("stale")).is_none());
    }

    /// What an older keypool persisted after a far-future reset (`u64::MAX`) and after
    /// a unix-ms reset read as seconds: loaded at a restart, both are bounded.
    #[test]
    fn import_bounds_the_resets_an_older_version_persisted() {
        let json = format!(
            r#"[{{"account":"far","info":{{"retry_after_ms":null,"unified_status":"rejected",
                "unified_reset":{max},"representative_claim":"five_hour",
                "five_hour":{{"utilization":1.0,"reset":{max},"status":"rejected"}},
                "seven_day":{{"utilization":0.99,"reset":{max},"status":null}},
                "requests_remaining":0,"requests_reset":{max}}},"updated_at":{NOW}}},
               {{"account":"ms","info":{{"five_hour":{{"utilization":1.0,"reset":{ms_as_s},"status":null}},
                "seven_day":{{}}}},"updated_at":{NOW}}}]"#,
            max = u64::MAX,
            ms_as_s = (NOW + 30 * 60_000) * 1000,
        );
        let records: Vec<WindowRecord> = serde_json::from_str(&json).unwrap();
        let book = WindowBook::default();
        let imported = book.import(records, NOW);
        assert_eq!(imported.taken, 2);
        let corrected: Vec<(&str, ResetKind, bool)> = imported
            .corrected
            .iter()
            .map(|(a, c)| (a.as_str(), c.kind, c.read_as_ms))
            .collect();
        assert_eq!(
            corrected,
            [
                ("far", ResetKind::Unified, true),
                ("far", ResetKind::FiveHour, true),
                ("far", ResetKind::SevenDay, true),
                ("far", ResetKind::Requests, true),
                ("ms", ResetKind::FiveHour, true),
            ]
        );
        let far = book.state(&AccountId::from("far")).unwrap().info;
        assert_eq!(far.five_hour.reset, Some(NOW + 5 * H + 300_000));
        assert_eq!(far.seven_day.reset, Some(NOW + 7 * 24 * H + 300_000));
        assert_eq!(far.unified_reset, Some(NOW + 7 * 24 * H + 300_000));
        assert_eq!(far.requests_reset, Some(NOW + H + 300_000));
        assert_eq!(
            book.out_of_window(&AccountId::from("far"), None, NOW),
            Some(OutOfWindow {
                limit: UsageLimit::Window(Window::Weekly),
                until: NOW + 7 * 24 * H + 300_000
            })
        );
        // the signal the request path reads agrees
        let signal = book.signal_with_threshold(&AccountId::from("far"), None);
        assert_eq!(signal.until(), NOW + 7 * 24 * H + 300_000);
        // a unix-ms reset read as seconds is read as ms
        assert_eq!(
            book.out_of_window(&AccountId::from("ms"), None, NOW)
                .map(|o| o.until),
            Some(NOW + 30 * 60_000)
        );
    }

    /// A reset as an adapter reads it (unix ms): soon, far, sent in unix ms where
    /// seconds belong (so ×1000), or huge.
    fn reset_value() -> impl Strategy<Value = u64> {
        prop_oneof![
            (0u64..30 * 24 * 3600).prop_map(|ahead| (NOW / 1000 + ahead) * 1000),
            (0u64..30 * 24 * H).prop_map(|ahead| (NOW + ahead).saturating_mul(1000)),
            any::<u64>(),
        ]
    }

    proptest! {
        /// However the responses' resets lie and whatever their order, the account is
        /// never out of its window beyond the weekly bound after the latest response,
        /// and its signal agrees with the book.
        #[test]
        fn no_sequence_of_responses_keeps_an_account_out_beyond_the_bound(
            responses in proptest::collection::vec(
                (proptest::collection::vec(reset_value(), 4), 0u64..10 * H),
                1..8,
            ),
        ) {
            let book = WindowBook::default();
            let signal = book.signal_with_threshold(&a(), None);
            let mut now = NOW;
            for (resets, advance) in responses {
                now += advance;
                let exhausted = |reset| WindowUsage {
                    utilization: Some(1.0),
                    reset: Some(reset),
                    status: None,
                };
                let mut info = RateLimitInfo {
                    unified_status: Some(UnifiedStatus::Rejected),
                    representative_claim: Some("seven_day".into()),
                    requests_remaining: Some(0),
                    unified_reset: Some(resets[0]),
                    five_hour: exhausted(resets[1]),
                    seven_day: exhausted(resets[2]),
                    requests_reset: Some(resets[3]),
                    ..RateLimitInfo::default()
                };
                // what every adapter does before the facts reach the book
                info.corrections = info.bound_resets(now);
                book.observe(&a(), &info, now);
                let until = book.out_of_window(&a(), None, now).map_or(0, |o| o.until);
                prop_assert!(until <= now + ResetKind::longest_bound_ms(), "out until {until} at {now}");
                prop_assert_eq!(signal.until(), until);
            }
        }

        /// Whatever the headers, the account is out exactly until the answer's `until`:
        /// out at every moment before it, back at it, with no request in between.
        #[test]
        fn window_state_flips_back_exactly_at_reset(
            u5 in proptest::option::of(0.0f64..1.2), r5 in proptest::option::of(0u64..10 * H),
            u7 in proptest::option::of(0.0f64..1.2), r7 in proptest::option::of(0u64..200 * H),
            rejected in any::<bool>(), ur in proptest::option::of(0u64..10 * H),
            remaining in proptest::option::of(0u64..3), rr in proptest::option::of(0u64..H),
            threshold in proptest::option::of(0.5f64..=1.0),
            probe in 0u64..200 * H,
        ) {
            let at = |d: Option<u64>| d.map(|d| NOW + d);
            let info = RateLimitInfo {
                five_hour: WindowUsage { utilization: u5, reset: at(r5), status: None },
                seven_day: WindowUsage { utilization: u7, reset: at(r7), status: None },
                unified_status: rejected.then_some(UnifiedStatus::Rejected),
                unified_reset: at(ur),
                requests_remaining: remaining,
                requests_reset: at(rr),
                ..Default::default()
            };
            let book = book_with(info);
            match book.out_of_window(&a(), threshold, NOW) {
                None => prop_assert!(book.out_of_window(&a(), threshold, NOW + probe).is_none()),
                Some(out) => {
                    prop_assert!(out.until > NOW);
                    let before = NOW + probe % (out.until - NOW);
                    prop_assert!(book.out_of_window(&a(), threshold, before).is_some());
                    prop_assert!(book.out_of_window(&a(), threshold, out.until - 1).is_some());
                    prop_assert_eq!(book.out_of_window(&a(), threshold, out.until), None);
                    prop_assert_eq!(book.out_of_window(&a(), threshold, out.until + probe), None);
                }
            }
        }
    }
}
