//! [`MinuteHistory`]: requests, errors and tokens per minute over the last hour, in this
//! process (the status page's trend chart).

use keypool_core::UnixMs;
use keypool_core::per_thread::PerThread;
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
/// round again). Every request adds to it: each serving thread counts in its own copy
/// ([`PerThread`]), and [`MinuteHistory::series`] adds the copies up.
#[derive(Debug)]
pub struct MinuteHistory {
    slots: PerThread<[Minute; MINUTES]>,
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
            slots: PerThread::new(|| [Minute::default(); MINUTES]),
        }
    }

    /// One request that ended at `now`.
    pub fn record(&self, now: UnixMs, error: bool, tokens: u64) {
        let at = now - now % 60_000;
        let index = (at / 60_000) as usize % MINUTES;
        self.slots.with(|slots| {
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
        });
    }

    /// The last [`MINUTES`] minutes up to `now`'s, oldest first; minutes without
    /// requests are zeros.
    pub fn series(&self, now: UnixMs) -> Vec<Minute> {
        let current = now - now % 60_000;
        let mut series: Vec<Minute> = (0..MINUTES as u64)
            .rev()
            .map(|back| Minute {
                at: current.saturating_sub(back * 60_000),
                ..Minute::default()
            })
            .collect();
        self.slots.each(|slots| {
            for minute in &mut series {
                let slot = slots[(minute.at / 60_000) as usize % MINUTES];
                if slot.at == minute.at {
                    minute.requests += slot.requests;
                    minute.errors += slot.errors;
                    minute.tokens = minute.tokens.saturating_add(slot.tokens);
                }
            }
        });
        series
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

    #[test]
    fn the_counts_of_every_thread_are_added_up() {
        let h = MinuteHistory::new();
        let t0 = 1_800_000_000_000;
        std::thread::scope(|s| {
            for thread in 0..5u64 {
                let h = &h;
                s.spawn(move || {
                    for i in 0..100 {
                        h.record(t0 + thread * 60_000 + i, i % 10 == 0, 2);
                    }
                });
            }
        });
        // A thread that counted a minute long gone leaves nothing in the series.
        h.record(t0 - 110 * 60_000, false, 1_000);
        let s = h.series(t0 + 4 * 60_000);
        for (back, m) in s.iter().rev().take(5).enumerate() {
            let at = t0 + (4 - back as u64) * 60_000;
            assert_eq!((m.at, m.requests, m.errors, m.tokens), (at, 100, 10, 200));
        }
        assert_eq!(s.iter().map(|m| m.requests).sum::<u64>(), 500);
        assert_eq!(s.iter().map(|m| m.tokens).sum::<u64>(), 1_000);
    }
}
