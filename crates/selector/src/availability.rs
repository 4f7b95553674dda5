//! Availability facts: usage windows and cooldowns, seen through a small trait.
//!
//! The selector does not depend on `keypool-cooldown`: the proxy implements
//! [`Availability`] over the cooldown crate's books. [`StaticAvailability`] is a plain
//! in-memory implementation for tests, benchmarks and embedders.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use keypool_core::{AccountId, ModelFamily, UnixMs, Window};

use crate::candidate::Candidate;
use crate::hash::IdHasher;

/// An account is out of a usage window until `until` (SPEC 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowBlock {
    /// Which window is exhausted.
    pub window: Window,
    /// When it resets (unix ms).
    pub until: UnixMs,
    /// The model family whose weekly window it is (SPEC 16), when it blocks only the
    /// requests of one family; `None` for a window of the whole account.
    pub family: Option<ModelFamily>,
}

impl WindowBlock {
    /// A block of the whole account.
    pub const fn new(window: Window, until: UnixMs) -> Self {
        Self {
            window,
            until,
            family: None,
        }
    }
}

/// What the filter needs to know about one account at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountStatus {
    /// Neither out of window nor cooling.
    Available,
    /// Out of a usage window.
    OutOfWindow(WindowBlock),
    /// In cooldown until the given unix ms.
    CoolingUntil(UnixMs),
}

/// The availability facts the filter pipeline reads.
///
/// Implementations answer about `now`; a fact that has already expired (`until <= now`)
/// is ignored by the filter anyway, so an implementation may return stale entries.
pub trait Availability {
    /// `Some` while the account is out of its 5-hour or weekly window.
    fn window_block(&self, id: &AccountId, now: UnixMs) -> Option<WindowBlock>;

    /// `Some(until)` while the account is in cooldown.
    fn cooldown_until(&self, id: &AccountId, now: UnixMs) -> Option<UnixMs>;

    /// When the account's 5-hour usage window resets, if known (read only by the
    /// `reset_aware` strategy, for accounts that survived the filters). The default
    /// knows nothing: every account then ranks as "unknown reset", after known ones.
    fn five_hour_reset(&self, _id: &AccountId, _now: UnixMs) -> Option<UnixMs> {
        None
    }

    /// Both facts in one call; the window wins over the cooldown, as in the pipeline.
    /// Override it when one lookup can answer both (the default
    /// [`Availability::status_of`] calls it).
    fn status(&self, id: &AccountId, now: UnixMs) -> AccountStatus {
        if let Some(block) = self.window_block(id, now).filter(|b| b.until > now) {
            return AccountStatus::OutOfWindow(block);
        }
        match self.cooldown_until(id, now) {
            Some(until) if until > now => AccountStatus::CoolingUntil(until),
            _ => AccountStatus::Available,
        }
    }

    /// The status of `candidate`, which sits at `index` in the snapshot being planned.
    /// The planner calls only this. The default asks [`Availability::status`] by id;
    /// an implementation that keeps per-snapshot state (facts resolved when the
    /// snapshot was built) can answer by index instead of looking the id up.
    fn status_of(&self, index: usize, candidate: &Candidate, now: UnixMs) -> AccountStatus {
        let _ = index;
        self.status(&candidate.id, now)
    }
}

/// Every account is available: no windows, no cooldowns.
#[derive(Debug, Clone, Copy, Default)]
pub struct AlwaysAvailable;

impl Availability for AlwaysAvailable {
    fn window_block(&self, _: &AccountId, _: UnixMs) -> Option<WindowBlock> {
        None
    }
    fn cooldown_until(&self, _: &AccountId, _: UnixMs) -> Option<UnixMs> {
        None
    }
    #[inline]
    fn status(&self, _: &AccountId, _: UnixMs) -> AccountStatus {
        AccountStatus::Available
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Facts {
    window: Option<WindowBlock>,
    cooldown: Option<UnixMs>,
    five_hour_reset: Option<UnixMs>,
}

/// Fixed availability facts held in a map: for tests, benchmarks and embedders that
/// keep their own books.
#[derive(Debug, Clone, Default)]
pub struct StaticAvailability {
    facts: HashMap<AccountId, Facts, BuildHasherDefault<IdHasher>>,
}

impl StaticAvailability {
    /// No facts: every account is available.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks `id` out of `window` until `until`.
    pub fn block_window(&mut self, id: AccountId, window: Window, until: UnixMs) -> &mut Self {
        self.facts.entry(id).or_default().window = Some(WindowBlock::new(window, until));
        self
    }

    /// Puts `id` in cooldown until `until`.
    pub fn cool_until(&mut self, id: AccountId, until: UnixMs) -> &mut Self {
        self.facts.entry(id).or_default().cooldown = Some(until);
        self
    }

    /// Records when `id`'s 5-hour window resets (for `reset_aware`), without taking it
    /// out of rotation.
    pub fn five_hour_resets_at(&mut self, id: AccountId, reset: UnixMs) -> &mut Self {
        self.facts.entry(id).or_default().five_hour_reset = Some(reset);
        self
    }

    /// Forgets every fact about `id`.
    pub fn clear(&mut self, id: &AccountId) -> &mut Self {
        self.facts.remove(id);
        self
    }
}

impl Availability for StaticAvailability {
    fn window_block(&self, id: &AccountId, _: UnixMs) -> Option<WindowBlock> {
        self.facts.get(id).and_then(|f| f.window)
    }

    fn cooldown_until(&self, id: &AccountId, _: UnixMs) -> Option<UnixMs> {
        self.facts.get(id).and_then(|f| f.cooldown)
    }

    fn five_hour_reset(&self, id: &AccountId, _: UnixMs) -> Option<UnixMs> {
        self.facts.get(id).and_then(|f| f.five_hour_reset)
    }

    #[inline]
    fn status(&self, id: &AccountId, now: UnixMs) -> AccountStatus {
        if self.facts.is_empty() {
            return AccountStatus::Available;
        }
        let Some(facts) = self.facts.get(id) else {
            return AccountStatus::Available;
        };
        match (facts.window, facts.cooldown) {
            (Some(block), _) if block.until > now => AccountStatus::OutOfWindow(block),
            (_, Some(until)) if until > now => AccountStatus::CoolingUntil(until),
            _ => AccountStatus::Available,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_facts_do_not_count_and_window_wins() {
        let a = AccountId::from("a");
        let mut av = StaticAvailability::new();
        av.block_window(a.clone(), Window::Weekly, 2_000)
            .cool_until(a.clone(), 3_000);
        assert_eq!(
            av.status(&a, 1_000),
            AccountStatus::OutOfWindow(WindowBlock::new(Window::Weekly, 2_000))
        );
        assert_eq!(av.status(&a, 2_000), AccountStatus::CoolingUntil(3_000));
        assert_eq!(av.status(&a, 3_000), AccountStatus::Available);
        assert_eq!(
            av.status(&AccountId::from("b"), 0),
            AccountStatus::Available
        );
    }

    /// The provided `status` gives the same answers as the overriding one.
    #[test]
    fn default_status_matches_the_override() {
        struct ViaTrait<'a>(&'a StaticAvailability);
        impl Availability for ViaTrait<'_> {
            fn window_block(&self, id: &AccountId, now: UnixMs) -> Option<WindowBlock> {
                self.0.window_block(id, now)
            }
            fn cooldown_until(&self, id: &AccountId, now: UnixMs) -> Option<UnixMs> {
                self.0.cooldown_until(id, now)
            }
        }
        let a = AccountId::from("a");
        let b = AccountId::from("b");
        let mut av = StaticAvailability::new();
        av.block_window(a.clone(), Window::FiveHour, 50)
            .cool_until(a.clone(), 80)
            .cool_until(b.clone(), 20);
        for now in [0, 19, 20, 49, 50, 79, 80, 100] {
            for id in [&a, &b] {
                assert_eq!(
                    ViaTrait(&av).status(id, now),
                    av.status(id, now),
                    "{id} at {now}"
                );
            }
        }
    }
}
