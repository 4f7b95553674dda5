//! [`Snapshot`]: a pool's candidates in SPEC order, each with its health signals
//! resolved, so that planning a request reads atomics instead of looking every account
//! up in the books.

use std::ops::Deref;
use std::sync::Arc;

use keypool_cooldown::{CooldownSignal, PoolHealth, WindowSignal};
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
