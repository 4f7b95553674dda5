//! Per-thread spares: allocations a request is done with, kept for the next request
//! the thread serves instead of freed and allocated again (issue 22). A request's head
//! and its answer's head each took a list of line spans, and its answer a header map
//! (two allocations): per request, four allocations and their frees that a thread's
//! few spares replace.
//!
//! At most [`MAX_SPARES`] of a kind are kept per thread, and only the small ones (each
//! kind says which): a spare never holds memory a large head once needed.

use std::cell::RefCell;
use std::thread::LocalKey;

/// The most spares of one kind a thread keeps.
pub(crate) const MAX_SPARES: usize = 8;

/// One kind of spare, kept by one thread.
pub(crate) struct Spares<T> {
    kept: RefCell<Vec<T>>,
}

impl<T> Spares<T> {
    pub(crate) const fn new() -> Self {
        Self {
            kept: RefCell::new(Vec::new()),
        }
    }
}

/// A spare from the thread's `spares`, if it has one.
pub(crate) fn take<T>(spares: &'static LocalKey<Spares<T>>) -> Option<T> {
    spares
        .try_with(|s| s.kept.try_borrow_mut().ok()?.pop())
        .ok()
        .flatten()
}

/// Keeps `spare` in the thread's `spares` unless it has [`MAX_SPARES`] already (or
/// the thread is ending): then it is dropped.
pub(crate) fn keep<T>(spares: &'static LocalKey<Spares<T>>, spare: T) {
    let mut spare = Some(spare);
    let _ = spares.try_with(|s| {
        if let Ok(mut kept) = s.kept.try_borrow_mut()
            && kept.len() < MAX_SPARES
            && let Some(spare) = spare.take()
        {
            kept.push(spare);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static NUMBERS: Spares<Vec<u32>> = const { Spares::new() };
    }

    #[test]
    fn a_thread_keeps_at_most_its_share_and_gives_back_the_last_kept_first() {
        assert_eq!(take(&NUMBERS), None);
        for i in 0..MAX_SPARES + 3 {
            keep(&NUMBERS, vec![u32::try_from(i).unwrap()]);
        }
        let mut taken = Vec::new();
        while let Some(spare) = take(&NUMBERS) {
            taken.push(spare[0]);
        }
        let expected: Vec<u32> = (0..u32::try_from(MAX_SPARES).unwrap()).rev().collect();
        assert_eq!(taken, expected);
        // another thread has its own
        keep(&NUMBERS, vec![7]);
        std::thread::spawn(|| assert_eq!(take(&NUMBERS), None))
            .join()
            .unwrap();
        assert_eq!(take(&NUMBERS), Some(vec![7]));
    }
}
