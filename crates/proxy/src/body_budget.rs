//! [`BodyBudget`]: the bytes of bodies the whole process holds at once (SPEC 3.1: "the
//! memory held by bodies in flight bounded for the whole process"), so that many
//! clients, or a careless upstream, cannot make keypool hold more than
//! `max_body_bytes_in_flight` however many connections they open. The proxy keeps two:
//! one for request bodies, one for buffered (non-streaming) upstream answers, so that
//! requests filling theirs never starve the answers that would end them.
//!
//! A body reserves what its `content-length` announces before its first byte is read
//! and grows the reservation as chunks arrive; the [`Reservation`] gives its bytes back
//! when dropped (the request, or the response carrying the buffered answer, is done).
//! A reservation that does not fit is refused at once: waiting could deadlock bodies
//! that each hold part of the budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The process-wide count of body bytes held. Share it with an `Arc`.
#[derive(Debug, Default)]
pub struct BodyBudget {
    held: AtomicU64,
}

impl BodyBudget {
    /// An empty budget.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes held now (the `keypool_body_in_flight_bytes` gauge).
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Reserves `bytes` if the total stays within `limit`; `None` when it would not.
    pub fn reserve(self: &Arc<Self>, bytes: u64, limit: u64) -> Option<Reservation> {
        self.take(bytes, limit).then(|| Reservation {
            budget: Arc::clone(self),
            bytes,
        })
    }

    fn take(&self, bytes: u64, limit: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&total| total <= limit)
            })
            .is_ok()
    }
}

/// Bytes held out of a [`BodyBudget`], given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<BodyBudget>,
    bytes: u64,
}

impl Reservation {
    /// The bytes reserved.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Makes the reservation at least `total` bytes; `false` (nothing changed) when the
    /// budget cannot give the difference within `limit`.
    pub fn grow_to(&mut self, total: u64, limit: u64) -> bool {
        let more = total.saturating_sub(self.bytes);
        if !self.budget.take(more, limit) {
            return false;
        }
        self.bytes += more;
        true
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reservations_fit_the_limit_and_give_back_when_dropped() {
        let budget = Arc::new(BodyBudget::new());
        let a = budget.reserve(60, 100).expect("fits");
        assert!(budget.reserve(41, 100).is_none());
        let mut b = budget.reserve(40, 100).expect("fits exactly");
        assert_eq!(budget.held(), 100);
        assert!(!b.grow_to(41, 100));
        assert_eq!(b.bytes(), 40);
        drop(a);
        assert!(b.grow_to(90, 100));
        assert_eq!(budget.held(), 90);
        // Growing to less than held changes nothing.
        assert!(b.grow_to(10, 100));
        assert_eq!(b.bytes(), 90);
        drop(b);
        assert_eq!(budget.held(), 0);
        // Nothing reserved is always fine, even over a limit of 0.
        assert!(budget.reserve(0, 0).is_some());
    }

    proptest! {
        /// Whatever the order of reserves, growths and drops, the budget never holds
        /// more than the limit and is back at 0 once every reservation is dropped.
        #[test]
        fn never_over_the_limit_and_nothing_leaks(
            limit in 0u64..1_000,
            ops in proptest::collection::vec((0u8..3, 0u64..400, any::<prop::sample::Index>()), 0..60),
        ) {
            let budget = Arc::new(BodyBudget::new());
            let mut held: Vec<Reservation> = Vec::new();
            for (op, n, pick) in ops {
                match op {
                    0 => if let Some(r) = budget.reserve(n, limit) { held.push(r) },
                    1 if !held.is_empty() => {
                        let i = pick.index(held.len());
                        let total = held[i].bytes() + n;
                        held[i].grow_to(total, limit);
                    }
                    _ if !held.is_empty() => { held.swap_remove(pick.index(held.len())); }
                    _ => {}
                }
                let sum: u64 = held.iter().map(Reservation::bytes).sum();
                prop_assert_eq!(budget.held(), sum);
                prop_assert!(sum <= limit);
            }
            drop(held);
            prop_assert_eq!(budget.held(), 0);
        }
    }
}
