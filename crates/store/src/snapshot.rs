//! [`Snapshot`]: a pool's candidates in SPEC order, each with its health signals
//! resolved, so that planning a request reads atomics instead of looking every account
//! up in the books.

use std::ops::Deref;
use std::sync::Arc;

use keypool_cooldown::{CooldownSignal, PoolHealth, WindowSignal};
use keypool_selector::Candidate;

use crate::config::Config;

/// One candidate's health signals (see `keypool_cooldown`'s `signal` module): they
/// say when the account *may* be blocked; the books give the exact answer.
#[derive(Debug, Clone)]
pub struct CandidateSignals {
    /// Its cooldown expiry.
    pub cooldown: Arc<CooldownSignal>,
    /// Its usage-window summary.
    pub window: Arc<WindowSignal>,
    /// Its own `window_threshold`; `None` takes the default at read time.
    pub window_threshold: Option<f64>,
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
    /// with the per-account thresholds of `config`.
    pub fn new(candidates: Vec<Candidate>, health: &PoolHealth, config: &Config) -> Self {
        let signals = candidates
            .iter()
            .map(|c| CandidateSignals {
                cooldown: health.cooldowns.signal(&c.id),
                window: health.windows.signal(&c.id),
                window_threshold: config
                    .account(c.id.as_str())
                    .and_then(|a| a.window_threshold())
                    .map(|t| t.get()),
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
