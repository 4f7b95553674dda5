//! Timeouts on the request path that cost no clock read and no timer-wheel operation
//! in the usual case (issue 22): a body that is already there is taken at once, and a
//! deadline that only moves later leaves its timer where it is until it fires.
//!
//! [`now`] and [`since`] read tokio's clock (which tests pause) at most once per poll
//! of a connection's task, like [`keypool_store::clock`] does for the others.

use std::cell::Cell;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

thread_local! {
    /// tokio's time as read in a poll, with the poll's number ([`keypool_store::clock::poll_epoch`]).
    static READ: Cell<(u64, Option<Instant>)> = const { Cell::new((0, None)) };
}

/// tokio's `Instant::now()`, read once per poll under
/// [`keypool_store::clock::once_per_poll`] (every call reads it outside one).
pub(crate) fn now() -> Instant {
    let Some(epoch) = keypool_store::clock::poll_epoch() else {
        return Instant::now();
    };
    READ.with(|read| match read.get() {
        (seen, Some(at)) if seen == epoch => at,
        _ => {
            let at = Instant::now();
            read.set((epoch, Some(at)));
            at
        }
    })
}

/// The time since `start` by [`now`] (zero for a `start` later than now).
pub(crate) fn since(start: Instant) -> Duration {
    now().saturating_duration_since(start)
}

/// Ready once `due` has passed, for a timer whose deadline usually moves later and is
/// not reset at each move (a timer-wheel removal and insertion): `sleep` is left armed
/// where it was and, when it fires before `due`, moved on to `due`. A `due` earlier
/// than the timer's deadline (a timeout shortened by a reload) is set at once.
pub(crate) fn poll_moved_timer(
    mut sleep: Pin<&mut Sleep>,
    due: Instant,
    cx: &mut Context<'_>,
) -> Poll<()> {
    if due < sleep.deadline() {
        sleep.as_mut().reset(due);
    }
    loop {
        ready!(sleep.as_mut().poll(cx));
        if due <= sleep.deadline() {
            return Poll::Ready(());
        }
        sleep.as_mut().reset(due);
    }
}

/// The limits of reading a body piece by piece: each piece within `idle` of asking
/// for it, the whole within `total` of the first wait.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Paced {
    pub idle: Duration,
    pub total: Duration,
    /// Set the first time a piece is not there at once.
    deadline: Option<Instant>,
}

/// Why [`Paced::next`] gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Late {
    /// Nothing came for `idle`.
    Idle,
    /// The whole was not in within `total`.
    Total,
}

impl Paced {
    pub(crate) fn new(idle: Duration, total: Duration) -> Self {
        Self {
            idle,
            total,
            deadline: None,
        }
    }

    /// `next`'s output: taken at once when it is ready (no clock read, no timer), else
    /// awaited within the limits.
    pub(crate) async fn next<F: Future + Unpin>(&mut self, mut next: F) -> Result<F::Output, Late> {
        let ready = poll_fn(|cx| {
            Poll::Ready(match Pin::new(&mut next).poll(cx) {
                Poll::Ready(output) => Some(output),
                Poll::Pending => None,
            })
        })
        .await;
        if let Some(output) = ready {
            return Ok(output);
        }
        let now = Instant::now();
        let deadline = *self.deadline.get_or_insert(now + self.total);
        tokio::time::timeout_at((now + self.idle).min(deadline), next)
            .await
            .map_err(|_| {
                if Instant::now() >= deadline {
                    Late::Total
                } else {
                    Late::Idle
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn until_tokio_time_moves() {
        let start = Instant::now();
        while Instant::now() == start {}
    }

    /// Under `once_per_poll`, tokio's clock is read once per poll; outside it, at
    /// every call. (Real time: a paused clock would not move either way.)
    #[test]
    fn tokio_time_is_read_once_per_poll_of_a_connection() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let a = now();
            until_tokio_time_moves();
            assert!(now() > a, "outside a poll every call reads");
            let (first, second, later) = keypool_store::clock::once_per_poll(async {
                let first = now();
                until_tokio_time_moves();
                let second = now();
                tokio::task::yield_now().await;
                (first, second, since(first))
            })
            .await;
            assert_eq!(first, second, "one read within a poll");
            assert!(later > Duration::ZERO, "the next poll reads again");
        });
    }

    /// A piece that is there is taken without arming anything; one that never comes is
    /// `Idle` after `idle`, and pieces that keep coming just within `idle` end at
    /// `total` of the first wait.
    #[tokio::test(start_paused = true)]
    async fn pieces_wait_idle_each_and_total_in_all() {
        let mut paced = Paced::new(Duration::from_secs(2), Duration::from_secs(5));
        assert_eq!(paced.next(std::future::ready(7)).await, Ok(7));
        assert_eq!(paced.deadline, None);

        let start = Instant::now();
        let never = std::future::pending::<()>();
        assert_eq!(paced.next(never).await, Err(Late::Idle));
        assert_eq!(start.elapsed(), Duration::from_secs(2));

        let mut paced = Paced::new(Duration::from_secs(2), Duration::from_secs(5));
        let start = Instant::now();
        let mut pieces = 0;
        let mut end = None;
        for _ in 0..10 {
            let piece = Box::pin(tokio::time::sleep(Duration::from_millis(1_900)));
            match paced.next(piece).await {
                Ok(()) => pieces += 1,
                Err(late) => {
                    end = Some(late);
                    break;
                }
            }
        }
        assert_eq!(end, Some(Late::Total));
        assert_eq!(pieces, 2);
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    /// A moved timer fires at the last deadline it was given, not at its first, nor
    /// later than a deadline earlier than its own.
    #[tokio::test(start_paused = true)]
    async fn a_moved_timer_fires_at_its_last_deadline() {
        assert_eq!(fires_after(1, 3).await, Duration::from_secs(3));
        // a timer armed later than its due (a shortened timeout) fires at the due
        assert_eq!(fires_after(10, 2).await, Duration::from_secs(2));
    }

    /// How long a timer armed `armed` seconds from now takes to fire when moved to
    /// `due` seconds from now; once fired, a deadline already passed is ready at once.
    async fn fires_after(armed: u64, due: u64) -> Duration {
        let start = Instant::now();
        let sleep = tokio::time::sleep(Duration::from_secs(armed));
        tokio::pin!(sleep);
        let due = start + Duration::from_secs(due);
        poll_fn(|cx| poll_moved_timer(sleep.as_mut(), due, cx)).await;
        let fired = start.elapsed();
        poll_fn(|cx| poll_moved_timer(sleep.as_mut(), start, cx)).await;
        assert_eq!(start.elapsed(), fired);
        fired
    }
}
