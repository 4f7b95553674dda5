//! [`Snapshot`]: a pool's candidates in SPEC order, each with its health signals
//! resolved, so that planning a request reads atomics instead of looking every account
//! up in the books.

use std::ops::Deref;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use keypool_cooldown::{CooldownSignal, PoolHealth, WindowSignal};
use keypool_core::UnixMs;
use keypool_selector::Candidate;

use crate::config::Config;

/// One candidate's health signals (see `keypool_cooldown`'s `signal` module): whether
/// the account is cooling or out of a window, as the books would answer, in two atomic
/// loads; the books hold the details.
#[derive(Debug, Clone)]
pub struct CandidateSignals {
    /// Its cooldown expiry.
    pub cooldown: Arc<CooldownSignal>,
    /// Its "out of a window until", with its own `window_threshold`.
    pub window: Arc<WindowSignal>,
}

impl CandidateSignals {
    /// Whether the books would call the account cooling or out of a window at `now`.
    #[inline]
    pub fn blocked(&self, now: keypool_core::UnixMs) -> bool {
        self.cooldown.may_block(now) || self.window.may_block(now)
    }
}

/// A pool's candidate accounts in SPEC order (`priority`, `last_used`, `id`) and, at
/// the same index, each one's [`CandidateSignals`]. Cheap to clone (two `Arc`s);
/// dereferences to the candidates.
#[derive(Debug, Clone)]
pub struct Snapshot {
    candidates: Arc<[Candidate]>,
    signals: Arc<[CandidateSignals]>,
    kept: Arc<ArcSwapOption<KeptSurvivors>>,
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
    pub survivors: Vec<usize>,
}

impl Snapshot {
    /// Resolves the signals of `candidates` (already in snapshot order) in `health`,
    /// handing the window book each account's threshold from `config`.
    pub fn new(candidates: Vec<Candidate>, health: &PoolHealth, config: &Config) -> Self {
        let signals = candidates
            .iter()
            .map(|c| CandidateSignals {
                cooldown: health.cooldowns.signal(&c.id),
                window: health.windows.signal_with_threshold(
                    &c.id,
                    config
                        .account(c.id.as_str())
                        .and_then(|a| a.window_threshold())
                        .map(|t| t.get()),
                ),
            })
            .collect();
        Self {
            candidates: candidates.into(),
            signals,
            kept: Arc::new(ArcSwapOption::empty()),
        }
    }

    /// The survivors kept by [`Snapshot::keep_survivors`], while they still hold: no
    /// signal has changed since (`epoch` is still `PoolHealth::signal_epoch`) and no
    /// block they saw has ended (`now < valid_until`). A block only starts with a signal
    /// change and only ends at its expiry, so the filters would find the same
    /// survivors.
    pub fn kept_survivors(&self, epoch: u64, now: UnixMs) -> Option<Arc<KeptSurvivors>> {
        self.kept
            .load_full()
            .filter(|k| k.epoch == epoch && now < k.valid_until)
    }

    /// Keeps `kept` for the next requests on this snapshot (replacing what was kept).
    pub fn keep_survivors(&self, kept: Arc<KeptSurvivors>) {
        self.kept.store(Some(kept));
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
