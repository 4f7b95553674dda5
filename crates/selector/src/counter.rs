//! Per-group rotation counters for `round_robin` and `weighted`.
//!
//! The caller fetches the counter value *before* planning (the Redis implementation in
//! `keypool-store` is asynchronous) and hands it to the planner as a plain `u64`
//! ([`PlanInput::counter`](crate::PlanInput::counter)). Only groups whose strategy is
//! `round_robin` or `weighted` need it ([`needs_counter`](crate::needs_counter)).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

/// A source of successive per-group counter values.
///
/// Consecutive calls for one group return consecutive integers (the first call
/// returns 0), shared by everyone who uses the same counter (all replicas, for the
/// Redis one). Only the value modulo the pool size matters, so wrapping is harmless.
pub trait Counter: Send + Sync {
    /// The next value of `group`'s counter.
    fn next(&self, group: &str) -> impl Future<Output = u64> + Send;
}

/// An in-memory counter per group: an atomic increment, no allocation after a group's
/// first call.
///
/// The groups are hashed with `foldhash` (seeded per map) rather than SipHash: a
/// group name comes from the configuration, never from a caller, and the lookup is on
/// every request of a rotating pool.
#[derive(Debug, Default)]
pub struct MemoryCounter {
    groups: DashMap<Box<str>, AtomicU64, foldhash::fast::RandomState>,
}

impl MemoryCounter {
    /// A counter with no group yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next value of `group`'s counter, synchronously (the future of
    /// [`Counter::next`] is this value, already ready).
    pub fn next_value(&self, group: &str) -> u64 {
        if let Some(counter) = self.groups.get(group) {
            return counter.fetch_add(1, Ordering::Relaxed);
        }
        self.groups
            .entry(group.into())
            .or_default()
            .fetch_add(1, Ordering::Relaxed)
    }

    /// The value [`next_value`](Self::next_value) would return now, without taking it
    /// (route explain).
    pub fn peek(&self, group: &str) -> u64 {
        self.groups
            .get(group)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Raises `group`'s counter to at least `value` (never lowers it): for merging an
    /// exported or shared (Redis) value back in.
    pub fn raise_to(&self, group: &str, value: u64) {
        if let Some(counter) = self.groups.get(group) {
            counter.fetch_max(value, Ordering::Relaxed);
            return;
        }
        self.groups
            .entry(group.into())
            .or_default()
            .fetch_max(value, Ordering::Relaxed);
    }

    /// Every group's current value (the next one [`next_value`](Self::next_value)
    /// would return), by group; [`raise_to`](Self::raise_to) loads them back.
    pub fn export(&self) -> BTreeMap<String, u64> {
        self.groups
            .iter()
            .map(|e| (e.key().to_string(), e.value().load(Ordering::Relaxed)))
            .collect()
    }
}

impl Counter for MemoryCounter {
    fn next(&self, group: &str) -> impl Future<Output = u64> + Send {
        std::future::ready(self.next_value(group))
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::*;

    fn ready<F: Future>(f: F) -> F::Output {
        let mut cx = Context::from_waker(Waker::noop());
        match pin!(f).poll(&mut cx) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("MemoryCounter futures are always ready"),
        }
    }

    #[test]
    fn counts_per_group_from_zero() {
        let c = MemoryCounter::new();
        assert_eq!(ready(c.next("g1")), 0);
        assert_eq!(ready(c.next("g1")), 1);
        assert_eq!(ready(c.next("g2")), 0);
        assert_eq!(c.next_value("g1"), 2);
    }

    #[test]
    fn export_and_raise_to_carry_the_counters_over() {
        let c = MemoryCounter::new();
        c.next_value("g1");
        c.next_value("g1");
        c.next_value("g2");
        let exported = c.export();
        assert_eq!(
            exported,
            BTreeMap::from([("g1".into(), 2), ("g2".into(), 1)])
        );
        let d = MemoryCounter::new();
        for (group, value) in &exported {
            d.raise_to(group, *value);
        }
        assert_eq!(d.next_value("g1"), 2);
        assert_eq!(d.next_value("g2"), 1);
        // Never lowered.
        d.raise_to("g1", 0);
        assert_eq!(d.next_value("g1"), 3);
    }

    #[test]
    fn concurrent_callers_never_share_a_value() {
        let c = MemoryCounter::new();
        let mut all: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..1000).map(|_| c.next_value("g")).collect::<Vec<_>>()))
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        all.sort_unstable();
        assert_eq!(all, (0..4000).collect::<Vec<_>>());
    }
}
