//! What an account does with each request: [`Behaviour`]s, their parameters and the
//! per-account [`Script`] (a default plus an optional sequence consumed first).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, StatusCode};
use keypool_core::Window;
use rand::Rng;

use crate::openai::OpenAiRateLimitHeaders;

/// A duration drawn for each request: fixed, or uniform in a closed range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delay {
    /// Always this long.
    Fixed(Duration),
    /// Uniformly distributed in `min..=max` (`max < min` behaves as `Fixed(min)`).
    Uniform {
        /// Shortest draw.
        min: Duration,
        /// Longest draw.
        max: Duration,
    },
}

impl Delay {
    /// No delay at all.
    pub const ZERO: Delay = Delay::Fixed(Duration::ZERO);

    /// A fixed delay of `ms` milliseconds.
    pub const fn ms(ms: u64) -> Self {
        Delay::Fixed(Duration::from_millis(ms))
    }

    /// A delay uniform in `min_ms..=max_ms` milliseconds.
    pub const fn uniform_ms(min_ms: u64, max_ms: u64) -> Self {
        Delay::Uniform {
            min: Duration::from_millis(min_ms),
            max: Duration::from_millis(max_ms),
        }
    }

    /// Whether every draw is zero.
    pub fn is_zero(&self) -> bool {
        match *self {
            Delay::Fixed(d) => d.is_zero(),
            Delay::Uniform { min, max } => min.is_zero() && max.is_zero(),
        }
    }

    /// Draws one duration.
    pub fn sample(&self, rng: &mut impl Rng) -> Duration {
        match *self {
            Delay::Fixed(d) => d,
            Delay::Uniform { min, max } if max <= min => min,
            Delay::Uniform { min, max } => {
                let lo = u64::try_from(min.as_nanos()).unwrap_or(u64::MAX);
                let hi = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
                Duration::from_nanos(rng.random_range(lo..=hi))
            }
        }
    }
}

impl Default for Delay {
    fn default() -> Self {
        Delay::ZERO
    }
}

/// Token usage reported in responses (`usage` of the message, `message_start` and
/// `message_delta`) and by `count_tokens` (`input_tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// `input_tokens`.
    pub input_tokens: u64,
    /// `output_tokens` of the finished message (`message_start` always reports 1).
    pub output_tokens: u64,
    /// `cache_creation_input_tokens`.
    pub cache_creation_input_tokens: u64,
    /// `cache_read_input_tokens`.
    pub cache_read_input_tokens: u64,
}

impl Default for Usage {
    fn default() -> Self {
        Self {
            input_tokens: 12,
            output_tokens: 4,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 0,
        }
    }
}

/// How a successful answer looks and how fast it comes.
#[derive(Debug, Clone, PartialEq)]
pub struct OkSpec {
    /// Non-streaming requests (and `count_tokens`): wait this long, then send the whole
    /// response.
    pub latency: Delay,
    /// Streaming requests: wait this long, then send the head together with
    /// `message_start`, `content_block_start` and `ping`.
    pub ttft: Delay,
    /// Number of `content_block_delta` frames.
    pub chunks: u32,
    /// Pause before every `content_block_delta` after the first.
    pub chunk_interval: Delay,
    /// Pause `chunk_interval` after `message_start` too, before the rest of the head
    /// and the content: a stream that starts and then makes the client wait (a slow
    /// start, SPEC 16's watchdog).
    pub pace_first_delta: bool,
    /// The text of each delta; the JSON answer's text is it repeated `chunks` times.
    pub text: Arc<str>,
    /// Reported usage.
    pub usage: Usage,
    /// `stop_reason` of the finished message.
    pub stop_reason: Cow<'static, str>,
    /// Streams: end `message_start`'s message id with `_think<ns>`, the nanoseconds
    /// between the request's arrival (body read) and the rendering of the first frames.
    /// A client subtracts it from its time to first byte to see what lies between it
    /// and the upstream, without the upstream's own (timer-driven, jittery) wait.
    pub think_time_in_id: bool,
    /// Answer a request that offers tools, and whose last message is the user's, with
    /// a tool call instead of the text (both wire formats; see the crate docs). On by
    /// default, so a client's tool round trip works with any script.
    pub tool_calls: bool,
}

impl Default for OkSpec {
    fn default() -> Self {
        Self {
            latency: Delay::ZERO,
            ttft: Delay::ZERO,
            chunks: 4,
            chunk_interval: Delay::ZERO,
            pace_first_delta: false,
            text: Arc::from("Hello"),
            usage: Usage::default(),
            stop_reason: Cow::Borrowed("end_turn"),
            think_time_in_id: false,
            tool_calls: true,
        }
    }
}

impl OkSpec {
    /// Sets [`OkSpec::latency`].
    pub fn latency(mut self, latency: Delay) -> Self {
        self.latency = latency;
        self
    }
    /// Sets [`OkSpec::ttft`].
    pub fn ttft(mut self, ttft: Delay) -> Self {
        self.ttft = ttft;
        self
    }
    /// Sets [`OkSpec::chunks`].
    pub fn chunks(mut self, chunks: u32) -> Self {
        self.chunks = chunks;
        self
    }
    /// Sets [`OkSpec::pace_first_delta`]: the first delta waits `chunk_interval` too.
    pub fn pace_first_delta(mut self) -> Self {
        self.pace_first_delta = true;
        self
    }

    /// Sets [`OkSpec::chunk_interval`].
    pub fn chunk_interval(mut self, interval: Delay) -> Self {
        self.chunk_interval = interval;
        self
    }
    /// Sets [`OkSpec::text`].
    pub fn text(mut self, text: &str) -> Self {
        self.text = Arc::from(text);
        self
    }
    /// Sets [`OkSpec::usage`].
    pub fn usage(mut self, usage: Usage) -> Self {
        self.usage = usage;
        self
    }
    /// Sets [`OkSpec::think_time_in_id`].
    pub fn think_time_in_id(mut self, on: bool) -> Self {
        self.think_time_in_id = on;
        self
    }
    /// Sets [`OkSpec::tool_calls`].
    pub fn tool_calls(mut self, on: bool) -> Self {
        self.tool_calls = on;
        self
    }
}

/// An error answer: status, Anthropic error body and extra headers.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorReply {
    /// HTTP status.
    pub status: StatusCode,
    /// `error.type` of the body (defaults from the status, e.g. 429 → `rate_limit_error`).
    pub error_type: Cow<'static, str>,
    /// `error.message` of the body.
    pub message: Cow<'static, str>,
    /// Extra response headers (`retry-after`, unified window headers, …).
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl ErrorReply {
    /// An error with the Anthropic error type and a realistic message for `status`.
    pub fn new(status: StatusCode) -> Self {
        Self {
            status,
            error_type: Cow::Borrowed(crate::wire::error_type_for(status)),
            message: Cow::Borrowed(crate::wire::default_message_for(status)),
            headers: Vec::new(),
        }
    }

    /// A plain `429 rate_limit_error` (no `retry-after`).
    pub fn rate_limited() -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS)
    }

    /// Replaces `error.message`.
    pub fn message(mut self, message: impl Into<Cow<'static, str>>) -> Self {
        self.message = message.into();
        self
    }

    /// Replaces `error.type`.
    pub fn error_type(mut self, error_type: impl Into<Cow<'static, str>>) -> Self {
        self.error_type = error_type.into();
        self
    }

    /// Adds a response header.
    ///
    /// # Panics
    /// If `name` is not a valid lowercase header name or `value` holds control characters.
    pub fn header(mut self, name: &'static str, value: impl AsRef<str>) -> Self {
        self.headers.push(header_pair(name, value.as_ref()));
        self
    }

    /// Adds `retry-after: <seconds>`.
    pub fn retry_after_secs(self, seconds: u64) -> Self {
        self.header("retry-after", seconds.to_string())
    }

    /// Adds `retry-after-ms: <milliseconds>`.
    pub fn retry_after_ms(self, ms: u64) -> Self {
        self.header("retry-after-ms", ms.to_string())
    }

    /// Adds the unified window headers.
    pub fn unified(mut self, unified: &UnifiedHeaders) -> Self {
        self.headers.extend(unified.to_headers());
        self
    }

    /// Adds an OpenAI-compatible upstream's `x-ratelimit-*` headers.
    pub fn openai_rate_limits(mut self, limits: &OpenAiRateLimitHeaders) -> Self {
        self.headers.extend(limits.to_headers());
        self
    }
}

/// Builds one header pair from static text.
///
/// # Panics
/// If `name` is not a valid lowercase header name or `value` holds control characters.
pub(crate) fn header_pair(name: &'static str, value: &str) -> (HeaderName, HeaderValue) {
    let value = HeaderValue::from_str(value).expect("header value without control characters");
    (HeaderName::from_static(name), value)
}

/// One window's reading in the unified rate-limit headers.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowReading {
    /// Which window (`5h` → `-5h-*`, weekly → `-7d-*`).
    pub window: Window,
    /// Utilisation fraction 0–1.
    pub utilization: f64,
    /// Reset time, unix seconds.
    pub reset: u64,
    /// `allowed`, `allowed_warning` or `rejected`.
    pub status: Cow<'static, str>,
}

/// One model family's weekly window in the unified headers (`-7d_<family>-*`, SPEC 16).
#[derive(Debug, Clone, PartialEq)]
pub struct FamilyReading {
    /// `opus`, `sonnet` or `haiku`.
    pub family: keypool_core::ModelFamily,
    /// Utilisation fraction 0–1.
    pub utilization: f64,
    /// Reset time, unix seconds.
    pub reset: u64,
    /// `allowed`, `allowed_warning` or `rejected`.
    pub status: Cow<'static, str>,
}

/// The `anthropic-ratelimit-unified-*` headers of a subscription account.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UnifiedHeaders {
    /// `-status` (`allowed`, `allowed_warning`, `rejected`).
    pub status: Option<Cow<'static, str>>,
    /// `-reset`, unix seconds.
    pub reset: Option<u64>,
    /// `-representative-claim` (e.g. `five_hour`).
    pub representative_claim: Option<Cow<'static, str>>,
    /// Per-window readings (`-5h-*`, `-7d-*`).
    pub windows: Vec<WindowReading>,
    /// Per-family weekly readings (`-7d_opus-*`, …).
    pub families: Vec<FamilyReading>,
}

impl UnifiedHeaders {
    /// `-status: rejected` with `-reset: reset_unix_s` and `-representative-claim:
    /// five_hour`: the 429 of an exhausted window.
    pub fn rejected(reset_unix_s: u64) -> Self {
        Self {
            status: Some(Cow::Borrowed("rejected")),
            reset: Some(reset_unix_s),
            representative_claim: Some(Cow::Borrowed("five_hour")),
            windows: Vec::new(),
            families: Vec::new(),
        }
    }

    /// The 429 of an exhausted family weekly window: `-status: rejected`, `-reset`,
    /// `-representative-claim: seven_day_<family>` and the family's own reading.
    pub fn family_rejected(family: keypool_core::ModelFamily, reset_unix_s: u64) -> Self {
        Self {
            status: Some(Cow::Borrowed("rejected")),
            reset: Some(reset_unix_s),
            representative_claim: Some(Cow::Owned(format!("seven_day_{family}"))),
            windows: Vec::new(),
            families: Vec::new(),
        }
        .family(family, 1.0, reset_unix_s, "rejected")
    }

    /// Adds a family's weekly reading.
    pub fn family(
        mut self,
        family: keypool_core::ModelFamily,
        utilization: f64,
        reset_unix_s: u64,
        status: &'static str,
    ) -> Self {
        self.families.push(FamilyReading {
            family,
            utilization,
            reset: reset_unix_s,
            status: Cow::Borrowed(status),
        });
        self
    }

    /// `-status: allowed` with no reading yet.
    pub fn allowed() -> Self {
        Self {
            status: Some(Cow::Borrowed("allowed")),
            ..Self::default()
        }
    }

    /// Adds a window reading.
    pub fn window(
        mut self,
        window: Window,
        utilization: f64,
        reset_unix_s: u64,
        status: &'static str,
    ) -> Self {
        self.windows.push(WindowReading {
            window,
            utilization,
            reset: reset_unix_s,
            status: Cow::Borrowed(status),
        });
        self
    }

    /// The header pairs, in a stable order.
    pub fn to_headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let mut out = Vec::new();
        if let Some(status) = &self.status {
            out.push(header_pair("anthropic-ratelimit-unified-status", status));
        }
        if let Some(reset) = self.reset {
            out.push(header_pair(
                "anthropic-ratelimit-unified-reset",
                &reset.to_string(),
            ));
        }
        if let Some(claim) = &self.representative_claim {
            out.push(header_pair(
                "anthropic-ratelimit-unified-representative-claim",
                claim,
            ));
        }
        for w in &self.windows {
            let (util, reset, status) = match w.window {
                Window::FiveHour => (
                    "anthropic-ratelimit-unified-5h-utilization",
                    "anthropic-ratelimit-unified-5h-reset",
                    "anthropic-ratelimit-unified-5h-status",
                ),
                Window::Weekly => (
                    "anthropic-ratelimit-unified-7d-utilization",
                    "anthropic-ratelimit-unified-7d-reset",
                    "anthropic-ratelimit-unified-7d-status",
                ),
            };
            out.push(header_pair(util, &w.utilization.to_string()));
            out.push(header_pair(reset, &w.reset.to_string()));
            out.push(header_pair(status, &w.status));
        }
        for f in &self.families {
            let name = |part: &str| format!("anthropic-ratelimit-unified-7d_{}-{part}", f.family);
            for (part, value) in [
                ("utilization", f.utilization.to_string()),
                ("reset", f.reset.to_string()),
                ("status", f.status.to_string()),
            ] {
                if let (Ok(n), Ok(v)) = (
                    HeaderName::try_from(name(part)),
                    HeaderValue::try_from(value),
                ) {
                    out.push((n, v));
                }
            }
        }
        out
    }
}

/// How a stream cut mid-way ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The HTTP body ends cleanly (chunked terminator sent) but `message_stop` never came.
    EndOfBody,
    /// The connection is closed (FIN) without finishing the HTTP body.
    Close,
    /// The connection is reset (TCP RST) without finishing the HTTP body.
    Reset,
}

/// What the simulated upstream does with one request.
///
/// Stream-shaped behaviours on a non-streaming request or `count_tokens`:
/// `InBandError` answers `529 overloaded_error`; `StallBeforeFirstFrame` and `CutAfter`
/// send a `200` head and then fail the body the same way (no JSON at all).
#[derive(Debug, Clone, PartialEq)]
pub enum Behaviour {
    /// A successful answer.
    Ok(OkSpec),
    /// An error status with an Anthropic error body.
    Error(ErrorReply),
    /// Reset the connection (TCP RST) without any response.
    Reset,
    /// Send nothing for this long (cancellable by the client), then reset the connection.
    StallBeforeHeaders(Duration),
    /// Send the `200` head, then nothing for this long, then reset the connection.
    StallBeforeFirstFrame(Duration),
    /// Stream the first `after_frames` frames of `spec` (at least `message_start`), then
    /// `event: error` with `overloaded_error`, then end the body.
    InBandError {
        /// Frames of the normal stream sent before the error (clamped to `1..`).
        after_frames: usize,
        /// The stream the frames come from.
        spec: OkSpec,
    },
    /// Stream the first `frames` frames of `spec` (never `message_stop`), then cut.
    CutAfter {
        /// Frames sent before the cut (clamped so `message_stop` is never sent).
        frames: usize,
        /// How the stream ends.
        cut: Cut,
        /// The stream the frames come from.
        spec: OkSpec,
    },
}

impl Behaviour {
    /// A default successful answer, without delays.
    pub fn ok() -> Self {
        Behaviour::Ok(OkSpec::default())
    }

    /// An error with the Anthropic body for `status` (401 `authentication_error`, 429
    /// `rate_limit_error`, 529 `overloaded_error`, …).
    ///
    /// # Panics
    /// If `status` is not in `100..=999`.
    pub fn status(status: u16) -> Self {
        let status = StatusCode::from_u16(status).expect("an HTTP status in 100..=999");
        Behaviour::Error(ErrorReply::new(status))
    }

    /// `event: error` (`overloaded_error`) right after `message_start`.
    pub fn in_band_error() -> Self {
        Behaviour::InBandError {
            after_frames: 1,
            spec: OkSpec::default(),
        }
    }

    /// The default stream cut after `frames` frames, ending as `cut` says.
    pub fn cut_after(frames: usize, cut: Cut) -> Self {
        Behaviour::CutAfter {
            frames,
            cut,
            spec: OkSpec::default(),
        }
    }
}

impl From<ErrorReply> for Behaviour {
    fn from(reply: ErrorReply) -> Self {
        Behaviour::Error(reply)
    }
}

impl From<OkSpec> for Behaviour {
    fn from(spec: OkSpec) -> Self {
        Behaviour::Ok(spec)
    }
}

/// An account's script: `sequence` is consumed one behaviour per request; once it is
/// empty every request gets `default`. `headers` are attached to every response the
/// account sends (success and error), e.g. window utilisation headers.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    /// What every request gets once `sequence` is empty.
    pub default: Behaviour,
    /// Per-request behaviours consumed first, front to back.
    pub sequence: VecDeque<Behaviour>,
    /// Headers attached to every response of the account.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Behaviours for requests whose `model` contains a text, checked first (the
    /// sequence is not consumed by them): an account that serves one model family and
    /// refuses another.
    pub by_model: Vec<(String, Behaviour)>,
}

impl Script {
    /// A script that always does `default`.
    pub fn new(default: impl Into<Behaviour>) -> Self {
        Self {
            default: default.into(),
            sequence: VecDeque::new(),
            headers: Vec::new(),
            by_model: Vec::new(),
        }
    }

    /// Always [`Behaviour::ok`].
    pub fn ok() -> Self {
        Self::new(Behaviour::ok())
    }

    /// Appends one behaviour to the sequence.
    pub fn then(mut self, behaviour: impl Into<Behaviour>) -> Self {
        self.sequence.push_back(behaviour.into());
        self
    }

    /// Adds a header attached to every response.
    ///
    /// # Panics
    /// If `name` is not a valid lowercase header name or `value` holds control characters.
    pub fn header(mut self, name: &'static str, value: impl AsRef<str>) -> Self {
        self.headers.push(header_pair(name, value.as_ref()));
        self
    }

    /// Attaches the unified window headers to every response.
    pub fn unified(mut self, unified: &UnifiedHeaders) -> Self {
        self.headers.extend(unified.to_headers());
        self
    }

    /// Attaches an OpenAI-compatible upstream's `x-ratelimit-*` headers to every
    /// response.
    pub fn openai_rate_limits(mut self, limits: &OpenAiRateLimitHeaders) -> Self {
        self.headers.extend(limits.to_headers());
        self
    }

    /// Requests whose `model` contains `text` get `behaviour` (every time).
    pub fn for_model(mut self, text: &str, behaviour: impl Into<Behaviour>) -> Self {
        self.by_model.push((text.to_owned(), behaviour.into()));
        self
    }
}

impl Default for Script {
    fn default() -> Self {
        Self::ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    proptest! {
        #[test]
        fn uniform_delay_stays_in_its_range(min in 0u64..10_000, span in 0u64..10_000, seed: u64) {
            let d = Delay::uniform_ms(min, min + span);
            let mut rng = SmallRng::seed_from_u64(seed);
            for _ in 0..16 {
                let s = d.sample(&mut rng);
                prop_assert!(s >= Duration::from_millis(min));
                prop_assert!(s <= Duration::from_millis(min + span));
            }
        }
    }

    #[test]
    fn inverted_uniform_range_is_its_minimum() {
        let d = Delay::Uniform {
            min: Duration::from_secs(2),
            max: Duration::from_secs(1),
        };
        assert_eq!(
            d.sample(&mut SmallRng::seed_from_u64(1)),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn status_behaviour_uses_anthropic_error_types() {
        let Behaviour::Error(e) = Behaviour::status(529) else {
            panic!("not an error")
        };
        assert_eq!(e.error_type, "overloaded_error");
        let Behaviour::Error(e) = Behaviour::status(402) else {
            panic!("not an error")
        };
        assert_eq!(e.error_type, "billing_error");
    }

    #[test]
    fn unified_headers_name_both_windows() {
        let h = UnifiedHeaders::rejected(1_800_000_000)
            .window(Window::FiveHour, 1.0, 1_800_000_000, "rejected")
            .window(Window::Weekly, 0.5, 1_800_500_000, "allowed")
            .to_headers();
        let names: Vec<&str> = h.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "anthropic-ratelimit-unified-status",
                "anthropic-ratelimit-unified-reset",
                "anthropic-ratelimit-unified-representative-claim",
                "anthropic-ratelimit-unified-5h-utilization",
                "anthropic-ratelimit-unified-5h-reset",
                "anthropic-ratelimit-unified-5h-status",
                "anthropic-ratelimit-unified-7d-utilization",
                "anthropic-ratelimit-unified-7d-reset",
                "anthropic-ratelimit-unified-7d-status",
            ]
        );
        assert_eq!(h[3].1, "1");
        assert_eq!(h[6].1, "0.5");
    }
}
