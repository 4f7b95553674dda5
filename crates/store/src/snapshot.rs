//! [`Snapshot`]: a pool's candidates in SPEC order, each with its health signals
//! resolved, so that planning a request reads atomics instead of looking every account
//! up in the books.

use std::ops::Deref;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use keypool_cooldown::{CooldownSignal, PoolHealth, WindowSignal};
use keypool_core::UnixMs;
use keypool_selector::Candidate;

use crate::config::{Account, Config};

/// One candidate's health signals (see `keypool_cooldown`'s `signal` module): whether
/// the account may be cooling, out of a window (of the account or of a model family)
/// or have a model locked, in three atomic loads; the books hold the details.
#[derive(Debug, Clone)]
pub struct CandidateSignals {
    /// Its cooldown expiry.
    pub cooldown: Arc<CooldownSignal>,
    /// Its "out of a window until", with its own `window_threshold`.
    pub window: Arc<WindowSignal>,
    /// The latest end of its model lockouts (SPEC 16).
    pub lockout: Arc<CooldownSignal>,
    /// The account as the snapshot's config has it (see [`Snapshot::account`]).
    pub account: Arc<Account>,
}

impl CandidateSignals {
    /// Whether the books might keep the account out of some request at `now`.
    #[inline]
    pub fn blocked(&self, now: keypool_core::UnixMs) -> bool {
        self.cooldown.may_block(now) || self.window.may_block(now) || self.lockout.may_block(now)
    }
}

/// How many survivor lists a snapshot keeps: one for requests of no model family and
/// one per family (a family's weekly window filters differently, SPEC 16).
pub const SURVIVOR_SCOPES: usize = 1 + keypool_core::ModelFamily::ALL.len();

/// A pool's candidate accounts in SPEC order (`priority`, `last_used`, `id`) and, at
/// the same index, each one's [`CandidateSignals`]. Cheap to clone (two `Arc`s);
/// dereferences to the candidates.
#[derive(Debug, Clone)]
pub struct Snapshot {
    candidates: Arc<[Candidate]>,
    signals: Arc<[CandidateSignals]>,
    kept: Arc<[ArcSwapOption<KeptSurvivors>; SURVIVOR_SCOPES]>,
    /// The config the snapshot was taken from (kept alive, so that its address names
    /// it: [`Snapshot::account`]).
    config: Arc<Config>,
}

/// The filters' survivors of a snapshot, kept for the requests that follow (see
/// [`Snapshot::kept_survivors`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptSurvivors {
    /// `PoolHealth::signal_epoch` read before the filters ran.
    pub epoch: u64,
    /// The earliest moment a block seen by the filters ends (unix ms; `u64::MAX` when
    /// none was blocked): from then on the survivors may grow.
    pub valid_until: UnixMs,
    /// The survivors, in the order the pool's strategy plans from.
    pub survivors: Arc<[usize]>,
}

impl Snapshot {
    /// Resolves the signals of `candidates` (already in snapshot order) in `health`,
    /// handing the window book each account's threshold from `config`. Every candidate
    /// must be one of `config`'s accounts (those that are not are left out).
    pub fn new(candidates: Vec<Candidate>, health: &PoolHealth, config: &Arc<Config>) -> Self {
        let (candidates, signals): (Vec<_>, Vec<_>) = candidates
            .into_iter()
            .filter_map(|c| {
                let account = config.account(c.id.as_str())?.clone();
                let signals = CandidateSignals {
                    cooldown: health.cooldowns.signal(&c.id),
                    lockout: health.lockouts.signal(&c.id),
                    window: health
                        .windows
                        .signal_with_threshold(&c.id, account.window_threshold().map(|t| t.get())),
                    account,
                };
                Some((c, signals))
            })
            .unzip();
        Self {
            candidates: candidates.into(),
            signals: signals.into(),
            kept: Arc::new(std::array::from_fn(|_| ArcSwapOption::empty())),
            config: config.clone(),
        }
    }

    /// The configured account of candidate `index`, when `config` is the one this
    /// snapshot was taken from (a request and its snapshot almost always share it; a
    /// reload between the two makes this `None`, and the caller looks the id up in its
    /// own config). Saves the request path a lookup by id per attempt: with a large
    /// pool served in turn, that lookup's hash slot and key were cold every time.
    pub fn account(&self, index: usize, config: &Config) -> Option<&Arc<Account>> {
        std::ptr::eq(Arc::as_ptr(&self.config), config)
            .then(|| self.signals.get(index).map(|s| &s.account))
            .flatten()
    }

    /// The survivors kept by [`Snapshot::keep_survivors`] for requests of `scope`
    /// ([`survivor_scope`]), while they still hold: no signal has changed since
    /// (`epoch` is still `PoolHealth::signal_epoch`) and no block they saw has ended
    /// (`now < valid_until`). A block only starts with a signal change and only ends at
    /// its expiry, so the filters would find the same survivors.
    pub fn kept_survivors(
        &self,
        scope: usize,
        epoch: u64,
        now: UnixMs,
    ) -> Option<Arc<KeptSurvivors>> {
        self.kept
            .get(scope)?
            .load_full()
            .filter(|k| k.epoch == epoch && now < k.valid_until)
    }

    /// Keeps `kept` for the next requests of `scope` on this snapshot (replacing what
    /// was kept).
    pub fn keep_survivors(&self, scope: usize, kept: Arc<KeptSurvivors>) {
        if let Some(slot) = self.kept.get(scope) {
            slot.store(Some(kept));
        }
    }

    /// The candidates.
    pub fn candidates(&self) -> &Arc<[Candidate]> {
        &self.candidates
    }

    /// The signals, index for index with [`Snapshot::candidates`].
    pub fn signals(&self) -> &[CandidateSignals] {
        &self.signals
    }
}

impl Deref for Snapshot {
    type Target = [Candidate];

    fn deref(&self) -> &[Candidate] {
        &self.candidates
    }
}

/// The survivor list a request for a model of `family` uses: 0 for no family, else
/// 1 + the family's index.
pub const fn survivor_scope(family: Option<keypool_core::ModelFamily>) -> usize {
    match family {
        None => 0,
        Some(f) => 1 + f.index(),
    }
}
