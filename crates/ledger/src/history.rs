//! [`MinuteHistory`]: requests, errors and tokens per minute over the last hour, in this
//! process (the status page's trend chart).

use std::sync::{Mutex, PoisonError};

use keypool_core::UnixMs;
use serde::Serialize;

/// Minutes kept.
pub const MINUTES: usize = 60;

/// One minute's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Minute {
    /// The minute, as unix ms of its start.
    pub at: UnixMs,
    /// Requests that ended in it.
    pub requests: u64,
    /// Of which errors.
    pub errors: u64,
    /// Tokens (all four kinds).
    pub tokens: u64,
}

/// The last [`MINUTES`] minutes, one slot each (a slot is reused when its minute comes
/// round again).
#[derive(Debug)]
pub struct MinuteHistory {
    slots: Mutex<[Minute; MINUTES]>,
}

impl Default for MinuteHistory {
    fn default() -> Self {
        Self::new()
    }
}

impl MinuteHistory {
    /// No history.
    pub fn new() -> Self {
        Self {
            slots: Mutex::new([Minute::default(); MINUTES]),
        }
    }

    /// One request that ended at `now`.
    pub fn record(&self, now: UnixMs, error: bool, tokens: u64) {
        let at = now - now % 60_000;
        let index = (at / 60_000) as usize % MINUTES;
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = &mut slots[index];
        if slot.at != at {
            *slot = Minute {
                at,
                ..Minute::default()
            };
        }
        slot.requests += 1;
        slot.errors += u64::from(error);
        slot.tokens = slot.tokens.saturating_add(tokens);
    }

    /// The last [`MINUTES`] minutes up to `now`'s, oldest first; minutes without
    /// requests are zeros.
    pub fn series(&self, now: UnixMs) -> Vec<Minute> {
        let current = now - now % 60_000;
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        (0..MINUTES as u64)
            .rev()
            .map(|back| {
                let at = current.saturating_sub(back * 60_000);
                let slot = slots[(at / 60_000) as usize % MINUTES];
                if slot.at == at {
                    slot
                } else {
                    Minute {
                        at,
                        ..Minute::default()
                    }
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_are_counted_and_forgotten_after_an_hour() {
        let h = MinuteHistory::new();
        let t0 = 1_800_000_000_000; // a minute boundary
        h.record(t0 + 1, false, 10);
        h.record(t0 + 59_999, true, 5);
        h.record(t0 + 60_000, false, 1);
        let s = h.series(t0 + 60_000);
        assert_eq!(s.len(), MINUTES);
        assert_eq!(
            s[MINUTES - 1],
            Minute {
                at: t0 + 60_000,
                requests: 1,
                errors: 0,
                tokens: 1
            }
        );
        assert_eq!(
            s[MINUTES - 2],
            Minute {
                at: t0,
                requests: 2,
                errors: 1,
                tokens: 15
            }
        );
        assert_eq!(s[0].requests, 0);
        // An hour later the slot of t0 is reused.
        h.record(t0 + 3_600_000, false, 7);
        let s = h.series(t0 + 3_600_000);
        assert_eq!(s[MINUTES - 1].tokens, 7);
        assert!(s.iter().all(|m| m.at != t0));
        assert_eq!(s.iter().map(|m| m.requests).sum::<u64>(), 2);
    }
}
