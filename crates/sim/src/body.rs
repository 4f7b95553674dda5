//! The response body: a whole JSON answer, a paced SSE stream, or a stall, with the
//! request's [`RequestGuard`] inside so that a client going away is counted.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use rand::rngs::SmallRng;
use tokio::time::{Instant, Sleep};

use crate::accounts::RequestGuard;
use crate::frames::StreamFrames;
use crate::script::{Cut, Delay};

/// Set by a behaviour that wants its connection reset (TCP RST) rather than closed.
pub(crate) type ResetFlag = Arc<AtomicBool>;

/// How a stream ends once its frames are out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Chunked terminator: the body is complete.
    Clean,
    /// The body fails: the connection is closed, or reset for [`Cut::Reset`].
    Fail(Cut),
}

/// A stream in progress.
#[derive(Debug)]
pub(crate) struct StreamCursor {
    frames: StreamFrames,
    next: usize,
    /// Frames of the complete stream to send.
    send: usize,
    error_frame: bool,
    ending: Ending,
    interval: Delay,
    rng: SmallRng,
    /// The index of the frame we already waited for.
    waited: Option<usize>,
}

impl StreamCursor {
    /// Sends the first `send` frames of `frames`, then the in-band error frame when asked,
    /// then ends as `ending` says.
    pub(crate) fn new(
        frames: StreamFrames,
        send: usize,
        error_frame: bool,
        ending: Ending,
        interval: Delay,
        rng: SmallRng,
    ) -> Self {
        let send = send.min(frames.len());
        Self {
            frames,
            next: 0,
            send,
            error_frame,
            ending,
            interval,
            rng,
            waited: None,
        }
    }
}

#[derive(Debug)]
enum State {
    Full(Option<Bytes>),
    Stream(StreamCursor),
    /// Head sent: wait, then reset the connection.
    Stall {
        wait: Duration,
        started: bool,
    },
    Done,
}

/// The body of every simulator response.
#[derive(Debug)]
pub(crate) struct SimBody {
    state: State,
    sleep: Option<Pin<Box<Sleep>>>,
    sleeping: bool,
    /// Whether the frames before a failure were given a chance to be flushed.
    flushed: bool,
    guard: Option<RequestGuard>,
    reset: Option<ResetFlag>,
}

impl SimBody {
    /// A complete body in one frame (sent with `content-length`).
    pub(crate) fn full(bytes: Bytes, guard: RequestGuard) -> Self {
        Self::new(State::Full(Some(bytes)), guard, None)
    }

    /// A streamed body.
    pub(crate) fn stream(cursor: StreamCursor, guard: RequestGuard, reset: ResetFlag) -> Self {
        Self::new(State::Stream(cursor), guard, Some(reset))
    }

    /// Nothing for `wait`, then a connection reset.
    pub(crate) fn stall(wait: Duration, guard: RequestGuard, reset: ResetFlag) -> Self {
        Self::new(
            State::Stall {
                wait,
                started: false,
            },
            guard,
            Some(reset),
        )
    }

    fn new(state: State, guard: RequestGuard, reset: Option<ResetFlag>) -> Self {
        Self {
            state,
            sleep: None,
            sleeping: false,
            flushed: false,
            guard: Some(guard),
            reset,
        }
    }

    fn start_sleep(&mut self, wait: Duration) {
        let deadline = Instant::now() + wait;
        match &mut self.sleep {
            Some(sleep) => sleep.as_mut().reset(deadline),
            None => self.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
        self.sleeping = true;
    }

    /// The scripted response is complete: count it as finished.
    fn finish(&mut self) {
        if let Some(guard) = &mut self.guard {
            guard.finish();
        }
        self.state = State::Done;
    }

    fn fail(&mut self, cut: Cut) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        if cut == Cut::Reset
            && let Some(flag) = &self.reset
        {
            flag.store(true, Ordering::Relaxed);
        }
        self.finish();
        Poll::Ready(Some(Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "keypool-sim: scripted cut",
        ))))
    }
}

/// What the body does next.
enum Step {
    Sleep(Duration),
    Yield { frame: Bytes, last: bool },
    End,
    Fail(Cut),
}

impl State {
    fn step(&mut self) -> Step {
        match self {
            State::Done => Step::End,
            State::Full(bytes) => match bytes.take() {
                Some(frame) => Step::Yield { frame, last: true },
                None => Step::End,
            },
            State::Stall { wait, started } => {
                if *started {
                    Step::Fail(Cut::Reset)
                } else {
                    *started = true;
                    Step::Sleep(*wait)
                }
            }
            State::Stream(c) => {
                if c.next < c.send {
                    let i = c.next;
                    if c.frames.is_paced(i) && c.waited != Some(i) {
                        c.waited = Some(i);
                        let wait = c.interval.sample(&mut c.rng);
                        if !wait.is_zero() {
                            return Step::Sleep(wait);
                        }
                    }
                    // Frames that follow without a pause go out as one chunk: one
                    // write instead of many, as a busy upstream's TCP stream would look.
                    let unpaced = c.interval.is_zero();
                    let mut end = i + 1;
                    while end < c.send && (unpaced || !c.frames.is_paced(end)) {
                        end += 1;
                    }
                    c.next = end;
                    let with_error = end == c.send && c.error_frame;
                    c.error_frame &= !with_error;
                    let frame = c
                        .frames
                        .join(i..end, with_error.then(|| c.frames.error_frame()));
                    let last = end == c.send && !c.error_frame && c.ending == Ending::Clean;
                    return Step::Yield { frame, last };
                }
                if c.error_frame {
                    c.error_frame = false;
                    let last = c.ending == Ending::Clean;
                    return Step::Yield {
                        frame: c.frames.error_frame(),
                        last,
                    };
                }
                match c.ending {
                    Ending::Clean => Step::End,
                    Ending::Fail(cut) => Step::Fail(cut),
                }
            }
        }
    }
}

impl http_body::Body for SimBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        loop {
            if this.sleeping {
                if let Some(sleep) = &mut this.sleep {
                    ready!(sleep.as_mut().poll(cx));
                }
                this.sleeping = false;
            }
            match this.state.step() {
                Step::Sleep(wait) => this.start_sleep(wait),
                Step::Yield { frame, last } => {
                    if last {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(frame))));
                }
                Step::End => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Step::Fail(cut) => {
                    // hyper writes the frames it got so far only once the body is
                    // pending; fail on the next poll so they reach the client first.
                    if !this.flushed {
                        this.flushed = true;
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    return this.fail(cut);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done | State::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            State::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            State::Full(None) | State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use rand::SeedableRng;

    use super::*;
    use crate::accounts::Accounts;
    use crate::script::OkSpec;

    fn body(
        spec: &OkSpec,
        send: usize,
        error_frame: bool,
        ending: Ending,
    ) -> (SimBody, Arc<Accounts>) {
        let accounts = Arc::new(Accounts::new(vec![], None).unwrap());
        let frames = StreamFrames::new("msg_1", "m", spec, None);
        let rng = SmallRng::seed_from_u64(1);
        let cursor = StreamCursor::new(frames, send, error_frame, ending, spec.chunk_interval, rng);
        let reset = ResetFlag::default();
        (
            SimBody::stream(cursor, accounts.begin(None), reset),
            accounts,
        )
    }

    /// The event names of each chunk the body yields, until it ends or fails.
    async fn chunks(mut body: SimBody) -> (Vec<Vec<String>>, bool) {
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { return (out, true) };
            let text = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
            let events = text
                .split_terminator("\n\n")
                .map(|f| {
                    f.lines()
                        .next()
                        .unwrap()
                        .trim_start_matches("event: ")
                        .to_owned()
                })
                .collect();
            out.push(events);
        }
        (out, false)
    }

    #[tokio::test(start_paused = true)]
    async fn paced_frames_go_one_by_one_and_the_rest_in_one_chunk() {
        let spec = OkSpec::default().chunks(3).chunk_interval(Delay::ms(1000));
        let (b, accounts) = body(&spec, 9, false, Ending::Clean);
        let start = Instant::now();
        let (got, failed) = chunks(b).await;
        assert!(!failed);
        assert_eq!(
            got,
            [
                vec![
                    "message_start",
                    "content_block_start",
                    "ping",
                    "content_block_delta"
                ],
                vec!["content_block_delta"],
                vec![
                    "content_block_delta",
                    "content_block_stop",
                    "message_delta",
                    "message_stop"
                ],
            ]
        );
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert_eq!(accounts.total.read().finished, 1);
    }

    #[tokio::test]
    async fn unpaced_stream_is_one_chunk_and_the_error_frame_joins_it() {
        let spec = OkSpec::default().chunks(2);
        let (got, _) = chunks(body(&spec, 8, false, Ending::Clean).0).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].len(), 8);
        let (got, failed) = chunks(body(&spec, 1, true, Ending::Clean).0).await;
        assert_eq!(
            (got, failed),
            (
                vec![vec!["message_start".to_owned(), "error".to_owned()]],
                false
            )
        );
    }

    #[tokio::test]
    async fn failing_endings_fail_after_the_frames_and_only_reset_sets_the_flag() {
        for (cut, resets) in [(Cut::Close, false), (Cut::Reset, true)] {
            let spec = OkSpec::default();
            let accounts = Arc::new(Accounts::new(vec![], None).unwrap());
            let frames = StreamFrames::new("msg_1", "m", &spec, None);
            let cursor = StreamCursor::new(
                frames,
                2,
                false,
                Ending::Fail(cut),
                Delay::ZERO,
                SmallRng::seed_from_u64(1),
            );
            let reset = ResetFlag::default();
            let b = SimBody::stream(cursor, accounts.begin(None), reset.clone());
            let (got, failed) = chunks(b).await;
            assert_eq!(got, [vec!["message_start", "content_block_start"]]);
            assert!(failed);
            assert_eq!(reset.load(Ordering::Relaxed), resets);
            assert_eq!(
                accounts.total.read().finished,
                1,
                "a scripted cut is not a cancellation"
            );
        }
    }

    #[tokio::test]
    async fn dropping_the_body_early_counts_a_cancellation() {
        let spec = OkSpec::default().chunk_interval(Delay::ms(1000));
        let (mut b, accounts) = body(&spec, 10, false, Ending::Clean);
        b.frame().await.unwrap().unwrap();
        drop(b);
        let stats = accounts.total.read();
        assert_eq!(
            (stats.finished, stats.cancelled, stats.in_flight),
            (0, 1, 0)
        );
    }
}
