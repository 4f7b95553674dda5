//! [`Rows`]: counters kept in one row per thread, summed when read.
//!
//! Every request adds to a dozen counters (its account's in-flight gauge, attempts and
//! two latency histograms, the attempts histogram, the request counter). With one
//! atomic per counter, both workers write the same cache lines with locked
//! instructions, and each write waits for the line to come from the other core. Here
//! each of the first threads that count gets a row of its own, which it alone writes,
//! with a plain load and store; the threads after those share the last row and add to
//! it atomically. A reader sums the rows: a counter read while it is being written may
//! miss the latest additions, as it could before.
//!
//! The price is memory: a set of counters takes one 64-byte-aligned row per CPU plus
//! two. An account's series (two counters and two histograms of 14, in rows of 32
//! counters) is then 256 bytes per row: 1 KiB on 2 CPUs, 16 KiB from 62 CPUs on (64
//! rows at most).

use std::sync::atomic::{AtomicU64, Ordering};

use keypool_core::per_thread::{slot_count, thread_slot};

/// How many rows a set of counters has: one per thread slot ([`slot_count`]: one per
/// CPU plus two, at most 64).
fn rows() -> usize {
    slot_count()
}

/// One thread's `W` counters, on cache lines of their own.
#[derive(Debug)]
#[repr(align(64))]
struct Row<const W: usize>([AtomicU64; W]);

/// `W` counters, one row per thread (see the module docs).
#[derive(Debug)]
pub(crate) struct Rows<const W: usize>(Box<[Row<W>]>);

impl<const W: usize> Default for Rows<W> {
    fn default() -> Self {
        Self(
            (0..rows())
                .map(|_| Row(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        )
    }
}

impl<const W: usize> Rows<W> {
    /// Adds `n` to counter `i` (wrapping: adding `n.wrapping_neg()` subtracts).
    #[inline]
    pub(crate) fn add(&self, i: usize, n: u64) {
        // This thread's row: its own while its number is below the last row's, else
        // the shared last one.
        let last = self.0.len() - 1;
        let row = thread_slot().min(last);
        let Some(counter) = self.0[row].0.get(i) else {
            return;
        };
        if row < last {
            // this thread is the row's only writer
            counter.store(
                counter.load(Ordering::Relaxed).wrapping_add(n),
                Ordering::Relaxed,
            );
        } else {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counter `i`: the sum of the rows.
    pub(crate) fn sum(&self, i: usize) -> u64 {
        self.0.iter().fold(0u64, |sum, row| {
            sum.wrapping_add(row.0.get(i).map_or(0, |c| c.load(Ordering::Relaxed)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_are_exact_over_more_threads_than_rows() {
        let rows: Rows<3> = Rows::default();
        let threads = super::rows() * 2 + 3;
        std::thread::scope(|s| {
            for t in 0..threads {
                let rows = &rows;
                s.spawn(move || {
                    for _ in 0..10_000 {
                        rows.add(0, 1);
                        rows.add(1, t as u64);
                    }
                    // in and out again, on different counters' rows
                    rows.add(2, 5);
                    rows.add(2, 5u64.wrapping_neg());
                });
            }
        });
        assert_eq!(rows.sum(0), threads as u64 * 10_000);
        assert_eq!(rows.sum(1), (0..threads as u64).sum::<u64>() * 10_000);
        assert_eq!(rows.sum(2), 0);
        assert_eq!(rows.sum(3), 0, "past the width: nothing");
    }

    #[test]
    fn a_subtraction_on_another_thread_balances_an_addition() {
        let rows: Rows<1> = Rows::default();
        rows.add(0, 1);
        std::thread::scope(|s| {
            s.spawn(|| rows.add(0, 1u64.wrapping_neg()));
        });
        assert_eq!(rows.sum(0), 0);
    }
}
