//! The response body keypool writes: empty, one buffer, or a committed SSE stream that
//! forwards each upstream frame's original bytes as it arrives.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use keypool_cooldown::TransportFailure;
use keypool_providers::openai::ChatStream;
use keypool_providers::{Endpoint, FrameRole, StreamUsage, StreamWire, Usage, generic_error_frame};
use keypool_sse::Decoder;

use crate::body_budget::Reservation;
use crate::timing::poll_moved_timer;
use crate::upstream::UpstreamBody;
use crate::watchdog::RateWatch;
use tokio::time::{Instant, Sleep};

/// Joins the data chunks of a body read in full: a body of one chunk (the usual case)
/// is kept as it came, without a copy; only a second chunk starts a buffer.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    first: Option<Bytes>,
    rest: Option<BytesMut>,
}

impl Collected {
    /// Appends one chunk.
    pub(crate) fn push(&mut self, data: Bytes) {
        match (&self.first, &mut self.rest) {
            (None, _) => self.first = Some(data),
            (Some(first), None) => {
                let mut buf = BytesMut::with_capacity(first.len() + data.len());
                buf.extend_from_slice(first);
                buf.extend_from_slice(&data);
                self.rest = Some(buf);
            }
            (Some(_), Some(buf)) => buf.extend_from_slice(&data),
        }
    }

    /// The whole body.
    pub(crate) fn into_bytes(self) -> Bytes {
        match self.rest {
            Some(buf) => buf.freeze(),
            None => self.first.unwrap_or_default(),
        }
    }
}

/// The body of every response keypool writes. It never fails: a committed stream whose
/// upstream breaks ends with one generic `event: error` frame instead (SPEC 3.8).
#[derive(Debug)]
pub struct ProxyBody {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Empty,
    /// One buffer, and the bytes it holds in the process-wide body budget (given back
    /// when the body is dropped, after it was written).
    Full(Option<Bytes>, #[allow(dead_code)] Option<Reservation>),
    Stream(Box<StreamBody>),
}

impl ProxyBody {
    /// No body.
    pub fn empty() -> Self {
        Self { kind: Kind::Empty }
    }

    /// One buffer.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        if bytes.is_empty() {
            return Self::empty();
        }
        Self {
            kind: Kind::Full(Some(bytes), None),
        }
    }

    /// One buffer that holds `held` of the body budget until it is dropped.
    pub(crate) fn full_held(bytes: Bytes, held: Reservation) -> Self {
        Self {
            kind: Kind::Full(Some(bytes), Some(held)),
        }
    }

    /// The bytes of a one-buffer body (`None` for an empty or streaming one).
    pub(crate) fn full_bytes(&self) -> Option<&Bytes> {
        match &self.kind {
            Kind::Full(bytes, _) => bytes.as_ref(),
            _ => None,
        }
    }

    pub(crate) fn stream(stream: StreamBody) -> Self {
        Self {
            kind: Kind::Stream(Box::new(stream)),
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.kind {
            Kind::Empty => Poll::Ready(None),
            Kind::Full(bytes, _) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Kind::Stream(stream) => stream
                .poll_next(cx)
                .map(|chunk| chunk.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Full(bytes, _) => bytes.is_none(),
            Kind::Stream(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Full(bytes, _) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            Kind::Stream(_) => SizeHint::default(),
        }
    }
}

/// How a committed stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The upstream sent the end of the answer ([`FrameRole::End`]) and ended the body.
    Completed,
    /// The upstream failed after the head was written (error frame, cut, reset, idle
    /// timeout); the client got the generic error frame.
    Failed(TransportFailure),
    /// The client went away before the end (the upstream request was dropped with it).
    ClientGone,
}

/// How long a committed stream waits, after the end of its answer ([`FrameRole::End`]),
/// for the upstream body to end before it ends the client's stream anyway.
const AFTER_STOP_GRACE: Duration = Duration::from_secs(1);

/// What a committed stream writes to the client.
#[derive(Debug)]
pub(crate) enum StreamOutput {
    /// Each upstream frame's original bytes; `client` is the client's endpoint (the
    /// generic error frame takes its format).
    Raw { client: Endpoint },
    /// Messages frames translated to OpenAI chunks, for an OpenAI client.
    Chat(Box<ChatStream>),
}

impl StreamOutput {
    /// The one generic error frame of a stream that fails after its head (SPEC 3.8).
    fn failure_frame(&self) -> Bytes {
        match self {
            Self::Raw { client } => generic_error_frame(*client),
            Self::Chat(_) => generic_error_frame(Endpoint::ChatCompletions),
        }
    }

    /// Appends what the client gets of `frame` to `pending`.
    fn emit(&mut self, frame: keypool_sse::Frame, pending: &mut VecDeque<Bytes>) {
        match self {
            Self::Raw { .. } => pending.push_back(frame.into_raw()),
            Self::Chat(chat) => {
                let mut out = BytesMut::new();
                chat.on_frame(&frame, &mut out);
                if !out.is_empty() {
                    pending.push_back(out.freeze());
                }
            }
        }
    }

    /// What the client gets of the frames held before the commit point.
    fn held(&mut self, held: Vec<Bytes>) -> VecDeque<Bytes> {
        match self {
            Self::Raw { .. } => held.into(),
            Self::Chat(chat) => {
                let mut out = BytesMut::new();
                for raw in &held {
                    // A framing error ends the translation with its error frame.
                    let _ = chat.push_bytes(raw, &mut out);
                }
                std::iter::once(out.freeze())
                    .filter(|b| !b.is_empty())
                    .collect()
            }
        }
    }
}

/// Called exactly once when a committed stream ends, however it ends.
pub(crate) trait StreamFinish: Send + Sync + 'static {
    /// `usage` is what the stream's frames reported so far.
    fn finish(self: Box<Self>, end: StreamEnd, usage: Option<Usage>);
}

/// A committed stream: the frames held before the commit point, then every upstream
/// frame's original bytes as they come. Usage and mid-stream `error` frames are
/// observed on the side; an upstream `error` frame, a cut, a reset or
/// `stream_idle_timeout` of silence ends it with one generic error frame.
pub(crate) struct StreamBody {
    pending: VecDeque<Bytes>,
    decoder: Decoder,
    upstream: Option<UpstreamBody>,
    idle: Duration,
    /// The idle timer. It is not moved on at every chunk (a timer-wheel update each):
    /// when it fires, it is moved to `last_data + idle` if data came since it was set.
    sleep: Pin<Box<Sleep>>,
    /// When the last upstream data came (the start, before any).
    last_data: Instant,
    usage: StreamUsage,
    saw_stop: bool,
    wire: StreamWire,
    output: StreamOutput,
    /// The slow-stream watchdog, its next look, and the attempt's start (SPEC 16).
    watch: Option<Watch>,
    /// The end of the answer ([`FrameRole::End`]) was forwarded and the grace for the body's end has started.
    stopping: bool,
    done: bool,
    finish: Option<Box<dyn StreamFinish>>,
}

impl std::fmt::Debug for StreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamBody")
            .field("pending", &self.pending.len())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// A stream at its commit point, as the attempt's hold leaves it: what the committed
/// stream goes on from.
pub(crate) struct HeldStream {
    /// The frames held before the commit point (already observed for usage).
    pub held: Vec<Bytes>,
    /// The decoder, which may still hold decoded-but-unread frames of the body.
    pub decoder: Decoder,
    /// The rest of the upstream body.
    pub body: UpstreamBody,
    /// The usage the held frames reported.
    pub usage: StreamUsage,
    /// Whether the end of the answer ([`FrameRole::End`]: Anthropic's `message_stop`, OpenAI's `[DONE]`) was among the held
    /// frames.
    pub saw_stop: bool,
    /// The upstream's wire format.
    pub wire: StreamWire,
    /// What the client gets.
    pub output: StreamOutput,
    /// The slow-stream watchdog (when on) and when the attempt started.
    pub watch: Option<(RateWatch, Instant)>,
}

impl StreamBody {
    /// Goes on from `stream`; `idle` is `stream_idle_timeout`; `finish` is called once
    /// when the stream ends, however it ends.
    pub(crate) fn new(stream: HeldStream, idle: Duration, finish: Box<dyn StreamFinish>) -> Self {
        let HeldStream {
            held,
            decoder,
            body,
            usage,
            saw_stop,
            watch,
            wire,
            mut output,
        } = stream;
        let watch = watch.map(|(rate, started)| Watch::new(rate, started));
        Self {
            pending: output.held(held),
            decoder,
            upstream: Some(body),
            idle,
            sleep: Box::pin(tokio::time::sleep(idle)),
            last_data: crate::timing::now(),
            usage,
            saw_stop,
            wire,
            output,
            watch,
            stopping: false,
            done: false,
            finish: Some(finish),
        }
    }

    fn end(&mut self, end: StreamEnd) {
        if end != StreamEnd::Completed && end != StreamEnd::ClientGone {
            let frame = self.output.failure_frame();
            self.pending.push_back(frame);
        }
        self.done = true;
        // Dropping the upstream body closes the upstream connection.
        self.upstream = None;
        if let Some(finish) = self.finish.take() {
            finish.finish(end, self.usage.usage());
        }
    }

    /// Takes every complete frame out of the decoder into `pending`; ends the stream on
    /// an upstream error frame or a framing error.
    fn drain_decoder(&mut self, eof: bool) {
        while !self.done {
            let next = if eof {
                self.decoder.finish()
            } else {
                self.decoder.next_frame()
            };
            match next {
                Ok(Some(frame)) => {
                    let role = self.wire.role(&frame);
                    if role == FrameRole::Error {
                        self.end(StreamEnd::Failed(TransportFailure::Reset));
                        return;
                    }
                    self.usage.observe(&frame);
                    if let Some(w) = self.watch.as_mut() {
                        crate::attempt::observe_content(&mut w.rate, w.started, role, &frame);
                    }
                    let stop = role == FrameRole::End;
                    self.output.emit(frame, &mut self.pending);
                    if stop {
                        // The answer is complete: nothing after it is forwarded.
                        self.saw_stop = true;
                        return;
                    }
                }
                Ok(None) => return,
                Err(_) => {
                    self.end(StreamEnd::Failed(TransportFailure::Reset));
                    return;
                }
            }
        }
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            if let Some(bytes) = self.pending.pop_front() {
                return Poll::Ready(Some(bytes));
            }
            if self.done {
                return Poll::Ready(None);
            }
            if !self.saw_stop {
                self.drain_decoder(false);
                if !self.pending.is_empty() || self.done {
                    continue;
                }
            }
            let Some(upstream) = self.upstream.as_mut() else {
                self.end(StreamEnd::Failed(TransportFailure::Reset));
                continue;
            };
            if self.saw_stop {
                // the end of the answer was forwarded: the answer is complete, whatever the
                // upstream does next. Wait briefly for the end of its body (so that its
                // connection can be reused), ignoring anything more it sends; a reset,
                // a body shorter than its `content-length` or silence ends it as well.
                if !self.stopping {
                    self.stopping = true;
                    let deadline = crate::timing::now() + AFTER_STOP_GRACE.min(self.idle);
                    self.sleep.as_mut().reset(deadline);
                }
                match Pin::new(upstream).poll_frame(cx) {
                    Poll::Ready(Some(Ok(_))) => continue,
                    Poll::Ready(None | Some(Err(_))) => self.end(StreamEnd::Completed),
                    Poll::Pending => {
                        ready!(self.sleep.as_mut().poll(cx));
                        self.end(StreamEnd::Completed);
                    }
                }
                continue;
            }
            match Pin::new(upstream).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.decoder.push(&data);
                        self.last_data = crate::timing::now();
                    }
                }
                Poll::Ready(Some(Err(_))) => self.end(StreamEnd::Failed(TransportFailure::Reset)),
                Poll::Ready(None) => {
                    self.drain_decoder(true);
                    if !self.done {
                        if self.saw_stop {
                            self.end(StreamEnd::Completed);
                        } else {
                            self.end(StreamEnd::Failed(TransportFailure::Reset));
                        }
                    }
                }
                Poll::Pending => {
                    if self.watch.as_mut().is_some_and(|w| w.too_slow(cx)) {
                        self.end(StreamEnd::Failed(TransportFailure::SlowStream));
                        continue;
                    }
                    if self.idle_timer_fired(cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.end(StreamEnd::Failed(TransportFailure::Timeout));
                }
            }
        }
    }

    /// Ready once `idle` has passed since the last upstream data.
    fn idle_timer_fired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        poll_moved_timer(self.sleep.as_mut(), self.last_data + self.idle, cx)
    }
}

/// A committed stream's watchdog: the rate, the timer of its next look.
struct Watch {
    rate: RateWatch,
    started: Instant,
    sleep: Pin<Box<Sleep>>,
}

impl Watch {
    fn new(rate: RateWatch, started: Instant) -> Self {
        let next = started + Duration::from_millis(rate.next_check(elapsed_ms(started)));
        Self {
            rate,
            started,
            sleep: Box::pin(tokio::time::sleep_until(next)),
        }
    }

    /// Whether the look due now finds the stream too slow; arms the next look (and
    /// registers the waker) otherwise.
    fn too_slow(&mut self, cx: &mut Context<'_>) -> bool {
        while self.sleep.as_mut().poll(cx).is_ready() {
            let at = elapsed_ms(self.started);
            if self.rate.too_slow(at) {
                return true;
            }
            let next = self.started + Duration::from_millis(self.rate.next_check(at));
            self.sleep.as_mut().reset(next);
        }
        false
    }
}

fn elapsed_ms(started: Instant) -> u64 {
    crate::timing::since(started).as_millis() as u64
}

impl Drop for StreamBody {
    fn drop(&mut self) {
        if let Some(finish) = self.finish.take() {
            finish.finish(StreamEnd::ClientGone, self.usage.usage());
        }
    }
}
