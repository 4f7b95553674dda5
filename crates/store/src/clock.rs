//! The clock, read at most once per poll of a task that asks for it (issue 22).
//!
//! A request through keypool looks at the time some eighteen times (its start, the
//! plan's `now`, the attempt's start and answer, the cooldown and rating books, the
//! usage record, the log line's timestamp, the `date` header …), and on a virtual
//! machine one `clock_gettime` costs 20–45 ns: together the better part of a
//! microsecond per request. Almost all of those reads fall into the same two or three
//! polls of the connection's task, microseconds apart. So, as nginx caches its time
//! once per turn of its event loop, a task that runs under [`once_per_poll`] reads
//! each clock at most once per poll: the first [`system_time`], [`now_ms`] or
//! [`instant`] of a poll reads the clock, the others of the same poll get that value.
//!
//! Outside such a poll (background tasks, tests, other threads) every call reads the
//! clock. Inside one, time does not move: a duration measured within one poll is
//! zero, a deadline computed late in a poll is as early as the poll's start. No code
//! under [`once_per_poll`] may wait for the clock to move without yielding (nothing
//! on the request path does: it awaits its timers).
//!
//! Other clocks (tokio's mockable `Instant`) can share the same bound: [`poll_epoch`]
//! numbers the polls of this thread, so a cache of their own is valid while it
//! returns the number the cache was filled in.

use std::cell::Cell;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// This thread's clock reads within the poll in progress.
struct PollClock {
    /// Whether a poll under [`once_per_poll`] is in progress on this thread.
    open: Cell<bool>,
    /// The number of the poll in progress (counts every poll this thread entered).
    epoch: Cell<u64>,
    wall: Cell<Option<SystemTime>>,
    /// `wall` in unix milliseconds, once [`now_ms`] asked for it in this poll.
    wall_ms: Cell<Option<u64>>,
    mono: Cell<Option<Instant>>,
}

thread_local! {
    static POLL: PollClock = const {
        PollClock {
            open: Cell::new(false),
            epoch: Cell::new(0),
            wall: Cell::new(None),
            wall_ms: Cell::new(None),
            mono: Cell::new(None),
        }
    };
}

/// The value in `slot` when a poll is open and it was read in it, else `read()`
/// (kept in `slot` for the rest of the poll when one is open).
fn cached<T: Copy>(slot: impl Fn(&PollClock) -> &Cell<Option<T>>, read: impl FnOnce() -> T) -> T {
    POLL.with(|clock| {
        if !clock.open.get() {
            return read();
        }
        let cell = slot(clock);
        if let Some(value) = cell.get() {
            return value;
        }
        let value = read();
        cell.set(Some(value));
        value
    })
}

/// The wall-clock time (read once per poll under [`once_per_poll`]).
pub fn system_time() -> SystemTime {
    cached(|c| &c.wall, SystemTime::now)
}

/// The wall-clock time in unix milliseconds (0 before 1970, saturated far after): the
/// [`system_time`] of the poll, converted once per poll (a request asks five times).
pub fn now_ms() -> u64 {
    cached(
        |c| &c.wall_ms,
        || {
            system_time()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        },
    )
}

/// The monotonic clock (read once per poll under [`once_per_poll`]).
pub fn instant() -> Instant {
    cached(|c| &c.mono, Instant::now)
}

/// The number of the poll in progress under [`once_per_poll`] on this thread; `None`
/// outside one. Two calls that return the same number are within the same poll.
pub fn poll_epoch() -> Option<u64> {
    POLL.with(|clock| clock.open.get().then(|| clock.epoch.get()))
}

/// Marks a poll as in progress until dropped (what [`once_per_poll`] does around each
/// poll of its future); its reads are forgotten when it ends.
#[derive(Debug)]
#[must_use = "the poll ends when the guard is dropped"]
pub struct PollGuard {
    was_open: bool,
}

/// Starts a poll on this thread: the clock reads until the guard drops are shared.
/// A poll started within another (a nested `block_on`) starts afresh and ends
/// both: the outer one's next reads read the clock again.
pub fn enter_poll() -> PollGuard {
    POLL.with(|clock| {
        clock.epoch.set(clock.epoch.get().wrapping_add(1));
        clock.wall.set(None);
        clock.wall_ms.set(None);
        clock.mono.set(None);
        PollGuard {
            was_open: clock.open.replace(true),
        }
    })
}

impl Drop for PollGuard {
    fn drop(&mut self) {
        POLL.with(|clock| {
            clock.wall.set(None);
            clock.wall_ms.set(None);
            clock.mono.set(None);
            // an outer poll continues with fresh reads under a new number
            clock.epoch.set(clock.epoch.get().wrapping_add(1));
            clock.open.set(self.was_open);
        });
    }
}

/// Runs `future` with the clock read at most once per poll (see the module docs).
pub async fn once_per_poll<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    poll_fn(|cx| {
        let _poll = enter_poll();
        future.as_mut().poll(cx)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    /// Spins until the clock moves, so that two reads that differ prove two reads.
    fn until_the_clock_moves() {
        let start = Instant::now();
        while Instant::now() == start {}
        let wall = SystemTime::now();
        while SystemTime::now() == wall {}
    }

    #[test]
    fn outside_a_poll_every_call_reads_the_clock() {
        assert_eq!(poll_epoch(), None);
        let (a, wall_a) = (instant(), system_time());
        until_the_clock_moves();
        assert!(instant() > a);
        assert!(system_time() > wall_a);
    }

    #[test]
    fn within_a_poll_the_clock_is_read_once_and_forgotten_after() {
        let poll = enter_poll();
        let epoch = poll_epoch();
        assert!(epoch.is_some());
        let (a, wall_a, ms_a) = (instant(), system_time(), now_ms());
        until_the_clock_moves();
        assert_eq!(instant(), a);
        assert_eq!(system_time(), wall_a);
        assert_eq!(now_ms(), ms_a);
        assert_eq!(poll_epoch(), epoch);
        drop(poll);

        assert_eq!(poll_epoch(), None);
        assert!(instant() > a);
        let next = enter_poll();
        assert!(instant() > a, "a new poll reads the clock again");
        assert!(system_time() > wall_a);
        assert_ne!(poll_epoch(), epoch);
        drop(next);
    }

    #[test]
    fn a_nested_poll_reads_afresh_and_the_outer_one_goes_on_with_new_reads() {
        let outer = enter_poll();
        let (epoch, a) = (poll_epoch(), instant());
        until_the_clock_moves();
        let inner = enter_poll();
        let b = instant();
        assert!(b > a);
        drop(inner);
        assert!(poll_epoch().is_some(), "the outer poll is still open");
        assert_ne!(poll_epoch(), epoch);
        until_the_clock_moves();
        assert!(instant() > b);
        drop(outer);
        assert_eq!(poll_epoch(), None);
    }

    #[test]
    fn now_ms_is_the_wall_clock_in_milliseconds() {
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let ms = now_ms();
        let after = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        assert!(u128::from(ms) >= before.as_millis() && u128::from(ms) <= after.as_millis());
    }

    /// `now_ms` in a poll is the poll's `system_time` in milliseconds, and the next
    /// poll's is the next poll's: its kept value goes with the poll.
    #[test]
    fn now_ms_in_a_poll_is_that_polls_wall_clock() {
        let ms_of = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        let poll = enter_poll();
        let first = now_ms();
        assert_eq!(first, ms_of(system_time()));
        assert_eq!(now_ms(), first);
        drop(poll);
        let start = SystemTime::now();
        while ms_of(SystemTime::now()) <= ms_of(start) {}
        let poll = enter_poll();
        let next = now_ms();
        assert!(
            next > first,
            "a new poll converts its own time ({next} after {first})"
        );
        assert_eq!(next, ms_of(system_time()));
        drop(poll);
    }

    /// A future under `once_per_poll` sees one time per poll and a new one at the
    /// next poll; its output comes through.
    #[test]
    fn once_per_poll_shares_the_reads_of_each_poll() {
        let mut seen: Vec<(Instant, Instant)> = Vec::new();
        let mut polls = 0;
        {
            let future = once_per_poll(poll_fn(|_| {
                let first = instant();
                until_the_clock_moves();
                seen.push((first, instant()));
                polls += 1;
                if polls == 2 {
                    Poll::Ready(7)
                } else {
                    Poll::Pending
                }
            }));
            let mut future = pin!(future);
            let mut cx = Context::from_waker(Waker::noop());
            assert_eq!(future.as_mut().poll(&mut cx), Poll::Pending);
            assert_eq!(poll_epoch(), None, "the poll ended with its poll call");
            assert_eq!(future.as_mut().poll(&mut cx), Poll::Ready(7));
        }
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].0, seen[0].1);
        assert_eq!(seen[1].0, seen[1].1);
        assert!(seen[1].0 > seen[0].0);
        assert!(seen[1].0 - seen[0].0 < Duration::from_secs(60));
    }
}
