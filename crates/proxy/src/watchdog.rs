//! The slow-stream watchdog (SPEC 16, off by default): a stream whose content bytes
//! per second stay below `stream_min_bytes_per_sec` over a window (30 s) after a
//! warm-up (10 s) is too slow. Before its commit point the attempt then fails over
//! (`slow_stream`, a transient failure); a committed stream is ended with the generic
//! error frame.
//!
//! [`RateWatch`] is pure: time is an argument (ms since the attempt started). The
//! window is counted in [`SLOTS`] slots of `window / SLOTS` each, so memory is fixed
//! whatever the stream's rate, and the rate is judged over the last `SLOTS` slots (the
//! current one partly filled).

use keypool_store::config::ServerSettings;

/// Slots the window is counted in.
pub(crate) const SLOTS: usize = 30;

/// Content bytes per slot of one stream's recent past.
#[derive(Debug, Clone)]
pub(crate) struct RateWatch {
    min_bytes_per_sec: u64,
    warmup_ms: u64,
    window_ms: u64,
    slot_ms: u64,
    /// Boxed: the watch travels inside every held stream's state, which stays small.
    slots: Box<[u64; SLOTS]>,
    /// The absolute slot (since the warm-up ended) of the newest count.
    head: u64,
}

impl RateWatch {
    /// The watchdog of `settings`, `None` when it is off.
    pub(crate) fn from_settings(settings: &ServerSettings) -> Option<Self> {
        (settings.stream_min_bytes_per_sec > 0).then(|| {
            Self::new(
                settings.stream_min_bytes_per_sec,
                settings.stream_watchdog_warmup_ms,
                settings.stream_watchdog_window_ms,
            )
        })
    }

    /// A watch of `min_bytes_per_sec` over `window_ms` after `warmup_ms`.
    pub(crate) fn new(min_bytes_per_sec: u64, warmup_ms: u64, window_ms: u64) -> Self {
        let window_ms = window_ms.max(1);
        Self {
            min_bytes_per_sec,
            warmup_ms,
            window_ms,
            slot_ms: (window_ms / SLOTS as u64).max(1),
            slots: Box::new([0; SLOTS]),
            head: 0,
        }
    }

    fn slot_of(&self, at_ms: u64) -> u64 {
        (at_ms - self.warmup_ms) / self.slot_ms
    }

    /// Moves the newest slot to `slot`, zeroing the slots that passed.
    fn advance(&mut self, slot: u64) {
        if slot <= self.head {
            return;
        }
        let passed = (slot - self.head).min(SLOTS as u64);
        for s in 0..passed {
            self.slots[((slot - s) % SLOTS as u64) as usize] = 0;
        }
        self.head = slot;
    }

    /// `bytes` of content arrived at `at_ms`. Bytes of the warm-up do not count.
    pub(crate) fn observe(&mut self, at_ms: u64, bytes: usize) {
        if at_ms < self.warmup_ms {
            return;
        }
        let slot = self.slot_of(at_ms);
        if slot + (SLOTS as u64) <= self.head {
            return; // older than the window
        }
        self.advance(slot);
        self.slots[(slot % SLOTS as u64) as usize] += bytes as u64;
    }

    /// Whether the stream is too slow at `at_ms`: a whole window has passed since the
    /// warm-up and the content bytes of the last window are below the minimum rate.
    pub(crate) fn too_slow(&mut self, at_ms: u64) -> bool {
        if at_ms < self.warmup_ms.saturating_add(self.window_ms) {
            return false;
        }
        self.advance(self.slot_of(at_ms));
        let bytes: u64 = self.slots.iter().sum();
        bytes.saturating_mul(1000) < self.min_bytes_per_sec.saturating_mul(self.window_ms)
    }

    /// When to look next, ms since the attempt started: the end of the first window,
    /// then every slot.
    pub(crate) fn next_check(&self, at_ms: u64) -> u64 {
        let first = self.warmup_ms.saturating_add(self.window_ms);
        if at_ms < first {
            first
        } else {
            at_ms + self.slot_ms
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_trickle_is_too_slow_only_after_warmup_and_a_whole_window() {
        // 100 B/s minimum, 10 s warm-up, 30 s window; 50 B every second.
        let mut w = RateWatch::new(100, 10_000, 30_000);
        for s in 0..60u64 {
            w.observe(s * 1000, 50);
            let slow = w.too_slow(s * 1000 + 1);
            assert_eq!(slow, s * 1000 + 1 >= 40_000, "at {s} s");
        }
        assert_eq!(w.next_check(0), 40_000);
        assert_eq!(w.next_check(40_000), 41_000);
    }

    #[test]
    fn a_fast_stream_is_never_too_slow_and_a_stall_is() {
        let mut w = RateWatch::new(100, 10_000, 30_000);
        for s in 0..45u64 {
            w.observe(s * 1000, 500);
            assert!(!w.too_slow(s * 1000 + 1));
        }
        // nothing for a whole window: too slow
        assert!(!w.too_slow(60_000));
        assert!(w.too_slow(76_000));
    }

    proptest! {
        /// The verdict is exactly "fewer than min × window bytes in the slots of the last
        /// window", for any arrival pattern, and never before warm-up + window.
        #[test]
        fn verdict_matches_a_direct_count(
            arrivals in proptest::collection::vec((0u64..3_000, 0usize..400), 1..60),
            min in 1u64..200,
        ) {
            let (warmup, window) = (1_000u64, 3_000u64);
            let mut w = RateWatch::new(min, warmup, window);
            let mut at = 0u64;
            let mut seen: Vec<(u64, usize)> = Vec::new();
            for (gap, bytes) in arrivals {
                at += gap;
                w.observe(at, bytes);
                seen.push((at, bytes));
                let slot_ms = window / SLOTS as u64;
                let verdict = w.too_slow(at);
                if at < warmup + window {
                    prop_assert!(!verdict);
                    continue;
                }
                let head = (at - warmup) / slot_ms;
                let counted: u64 = seen
                    .iter()
                    .filter(|(t, _)| *t >= warmup)
                    .filter(|(t, _)| (t - warmup) / slot_ms + SLOTS as u64 > head)
                    .map(|(_, b)| *b as u64)
                    .sum();
                prop_assert_eq!(verdict, counted * 1000 < min * window);
            }
        }
    }
}
