//! State that every serving thread writes on every request, kept in one copy per
//! thread so that the threads do not write the same cache lines.
//!
//! keypool's serving threads share the books a request adds to (usage history and
//! totals, metrics). One copy behind one lock makes both threads of a two-CPU machine
//! take the same lock and write the same lines on every request, and each write waits
//! for the line to come from the other core. [`PerThread`] keeps a copy per thread
//! slot ([`thread_slot`]), each behind its own lock on lines of its own: the thread
//! that owns a slot takes an uncontended lock that stays in its core's cache, and a
//! reader visits every copy. Threads past [`slot_count`] share the slots in turn
//! (still correct: each copy has its lock).
//!
//! ```
//! use keypool_core::per_thread::PerThread;
//! let counts: PerThread<u64> = PerThread::default();
//! std::thread::scope(|s| {
//!     for _ in 0..4 {
//!         s.spawn(|| (0..1000).for_each(|_| counts.with(|n| *n += 1)));
//!     }
//! });
//! let mut total = 0;
//! counts.each(|n| total += *n);
//! assert_eq!(total, 4000);
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

/// How many thread slots there are: one per CPU plus two (the main thread and one
/// more), from 2 to 64.
pub fn slot_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(8, |n| n.get() + 2)
            .clamp(2, 64)
    })
}

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD: usize = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// This thread's number: 0 for the first thread that asks, 1 for the next, and so
/// on (a thread that is being torn down gets `usize::MAX`). The first
/// [`slot_count`]` - 1` threads are the only ones with their number below that.
pub fn thread_slot() -> usize {
    THREAD.try_with(|n| *n).unwrap_or(usize::MAX)
}

/// One copy, on cache lines of its own.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Slot<T>(Mutex<T>);

/// One `T` per thread slot (see the module docs).
#[derive(Debug)]
pub struct PerThread<T> {
    slots: Box<[Slot<T>]>,
}

impl<T: Default> Default for PerThread<T> {
    fn default() -> Self {
        Self::new(T::default)
    }
}

impl<T> PerThread<T> {
    /// [`slot_count`] copies made by `make`.
    pub fn new(mut make: impl FnMut() -> T) -> Self {
        Self {
            slots: (0..slot_count())
                .map(|_| Slot(Mutex::new(make())))
                .collect(),
        }
    }

    /// Runs `f` on this thread's copy.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let slot = &self.slots[thread_slot() % self.slots.len()];
        f(&mut slot.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Runs `f` on every copy in turn (each under its lock while `f` runs on it).
    pub fn each(&self, mut f: impl FnMut(&mut T)) {
        for slot in &self.slots {
            f(&mut slot.0.lock().unwrap_or_else(PoisonError::into_inner));
        }
    }

    /// How many copies there are.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Never true: there is at least one copy (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_writes_the_copy_of_its_slot_and_nothing_is_lost() {
        let copies: PerThread<Vec<usize>> = PerThread::default();
        assert_eq!(copies.len(), slot_count());
        assert!(slot_count() >= 2);
        let threads = slot_count() * 2;
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let me = thread_slot();
                    for _ in 0..100 {
                        copies.with(|v| v.push(me));
                    }
                });
            }
        });
        let mut total = 0;
        let mut index = 0;
        copies.each(|v| {
            total += v.len();
            // Copy i holds the writes of the threads numbered i, i + n, i + 2n, …
            assert!(
                v.iter().all(|&owner| owner % slot_count() == index),
                "{v:?}"
            );
            index += 1;
        });
        assert_eq!(total, threads * 100);
    }

    #[test]
    fn thread_numbers_are_distinct() {
        let mut numbers: Vec<usize> = (0..8)
            .map(|_| std::thread::spawn(thread_slot).join().unwrap())
            .collect();
        numbers.push(thread_slot());
        let n = numbers.len();
        numbers.sort_unstable();
        numbers.dedup();
        assert_eq!(numbers.len(), n);
    }
}
