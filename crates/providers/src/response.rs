//! What keypool reads from upstream responses (SPEC 8): rate-limit headers, usage from
//! JSON bodies and SSE frames, and the upstream's error type and message.
//!
//! The rate-limit headers are read by each provider's adapter ([`crate::anthropic`],
//! [`crate::openai`]) into the neutral [`RateLimitInfo`] that `keypool-cooldown` reads.

use http::{HeaderMap, StatusCode};
use keypool_cooldown::facts::RateLimitInfo;
use keypool_core::UnixMs;
use keypool_sse::Frame;
use serde::{Deserialize, Serialize};

/// Longest upstream error type or message kept, in bytes (cut at a character boundary).
pub const MAX_UPSTREAM_ERROR_TEXT: usize = 1024;

pub use keypool_core::Usage;

/// The usage fields one JSON object carried; absent fields are `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct UsageUpdate {
    /// `input_tokens`, if present.
    pub input_tokens: Option<u64>,
    /// `output_tokens`, if present.
    pub output_tokens: Option<u64>,
    /// `cache_creation_input_tokens`, if present.
    pub cache_creation_input_tokens: Option<u64>,
    /// `cache_read_input_tokens`, if present.
    pub cache_read_input_tokens: Option<u64>,
}

impl UsageUpdate {
    /// Writes the fields this update carries into `usage`. Anthropic's counts are
    /// cumulative (the `output_tokens` of `message_delta` is the total so far), so the
    /// latest value wins.
    pub fn apply_to(&self, usage: &mut Usage) {
        let set = |field: &mut u64, value: Option<u64>| {
            if let Some(value) = value {
                *field = value;
            }
        };
        set(&mut usage.input_tokens, self.input_tokens);
        set(&mut usage.output_tokens, self.output_tokens);
        set(
            &mut usage.cache_creation_input_tokens,
            self.cache_creation_input_tokens,
        );
        set(
            &mut usage.cache_read_input_tokens,
            self.cache_read_input_tokens,
        );
    }
}

/// A response's header lines, as this crate's readers take them: an
/// [`http::HeaderMap`], or a head that keeps its lines as they came (keypool's own
/// HTTP/1 client does, so that an answer's headers are not hashed into a map only to be
/// read once).
pub trait HeaderLines {
    /// Each header line in order: its name in lower case and its value.
    fn lines(&self) -> impl Iterator<Item = (&[u8], &[u8])>;

    /// The value of the first line named `name` (lower case).
    fn first(&self, name: &str) -> Option<&[u8]> {
        self.lines()
            .find(|(line, _)| *line == name.as_bytes())
            .map(|(_, value)| value)
    }

    /// [`first`](Self::first) as text: `None` unless it is visible ASCII or tabs (what
    /// `HeaderValue::to_str` accepts).
    fn first_text(&self, name: &str) -> Option<&str> {
        header_text(self.first(name)?)
    }

    /// [`first_text`](Self::first_text), trimmed.
    fn first_str(&self, name: &str) -> Option<&str> {
        self.first_text(name).map(str::trim)
    }

    /// `value`, one of these lines' values, as a `HeaderValue` to send on: a copy,
    /// unless the lines keep their bytes where it can share them. `None` if it is not a
    /// valid header value.
    fn to_value(&self, value: &[u8]) -> Option<http::HeaderValue> {
        http::HeaderValue::from_bytes(value).ok()
    }
}

/// A header value as text: `None` unless every byte is visible ASCII or a tab (what
/// `HeaderValue::to_str` accepts).
pub fn header_text(value: &[u8]) -> Option<&str> {
    // folded without an early exit, so that it is checked many bytes at a time
    let invisible = value.iter().fold(false, |any, &b| {
        any | (b != b'\t' && !(0x20..0x7f).contains(&b))
    });
    if invisible {
        return None;
    }
    std::str::from_utf8(value).ok()
}

/// [`header_text`], trimmed (as `HeaderValue::to_str` then `str::trim`).
pub(crate) fn visible_text(value: &[u8]) -> Option<&str> {
    header_text(value).map(str::trim)
}

impl HeaderLines for HeaderMap {
    fn lines(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.iter()
            .map(|(name, value)| (name.as_str().as_bytes(), value.as_bytes()))
    }

    fn first(&self, name: &str) -> Option<&[u8]> {
        self.get(name).map(http::HeaderValue::as_bytes)
    }
}

/// Reads the rate-limit and window headers of any upstream response (success or
/// failure) of an Anthropic-speaking account ([`crate::anthropic::rate_limit_facts`]).
/// `now` turns an HTTP-date `retry-after` into a delay.
pub fn rate_limits<H: HeaderLines + ?Sized>(headers: &H, now: UnixMs) -> RateLimitInfo {
    crate::anthropic::rate_limit_facts(headers, now)
}

/// [`rate_limits`] for an account of `provider`: an `openai` account's
/// `x-ratelimit-*` headers are added in the same neutral form
/// ([`crate::openai::OpenAiRateLimits::apply_to`]).
pub fn rate_limits_of<H: HeaderLines + ?Sized>(
    provider: keypool_core::Provider,
    headers: &H,
    now: UnixMs,
) -> RateLimitInfo {
    let mut info = rate_limits(headers, now);
    if !provider.speaks_messages() {
        crate::openai::OpenAiRateLimits::from_headers(headers).apply_to(&mut info, now);
    }
    info
}

#[derive(Deserialize)]
struct BodyUsage {
    usage: Option<UsageUpdate>,
    /// `count_tokens` answers `{"input_tokens": N}` at the top level.
    input_tokens: Option<u64>,
}

/// Usage from a non-streaming JSON answer: its top-level `usage` object, or the
/// top-level `input_tokens` of a `count_tokens` answer. `None` when neither is there
/// or the body is not JSON.
pub fn usage_from_json_body(body: &[u8]) -> Option<Usage> {
    let parsed: BodyUsage = serde_json::from_slice(body).ok()?;
    let update = match (parsed.usage, parsed.input_tokens) {
        (Some(usage), _) => usage,
        (None, Some(input_tokens)) => UsageUpdate {
            input_tokens: Some(input_tokens),
            ..UsageUpdate::default()
        },
        (None, None) => return None,
    };
    let mut usage = Usage::default();
    update.apply_to(&mut usage);
    Some(usage)
}

/// Why a non-streaming 2xx answer is not one keypool passes on (SPEC 3.8: it is a failed
/// attempt, and the request fails over).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerProblem {
    /// A 2xx other than `200` (`204`, `299`, …): the Messages API answers `200`.
    Status(u16),
    /// A `content-encoding` other than `identity`, although keypool asked for identity.
    Encoded,
    /// An event stream for a request that did not ask to stream.
    EventStream,
    /// A body that is not a JSON object (empty, HTML, binary, truncated).
    NotJson,
    /// A JSON object that is not an answer of the endpoint (no `"type":"message"`, or,
    /// for `count_tokens`, no numeric `input_tokens`).
    NotAnAnswer,
}

impl AnswerProblem {
    /// Low-cardinality name for logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Status(_) => "unexpected_2xx_status",
            Self::Encoded => "content_encoding",
            Self::EventStream => "event_stream",
            Self::NotJson => "not_json",
            Self::NotAnAnswer => "not_an_answer",
        }
    }
}

/// Checks the head of a non-streaming 2xx answer before its body is read: status `200`,
/// identity encoding, not an event stream.
///
/// # Errors
/// The [`AnswerProblem`] found.
pub fn check_answer_head<H: HeaderLines + ?Sized>(
    status: StatusCode,
    headers: &H,
) -> Result<(), AnswerProblem> {
    if status != StatusCode::OK {
        return Err(AnswerProblem::Status(status.as_u16()));
    }
    if headers
        .first_str("content-encoding")
        .is_some_and(|e| !e.is_empty() && !e.eq_ignore_ascii_case("identity"))
    {
        return Err(AnswerProblem::Encoded);
    }
    if headers.first_str("content-type").is_some_and(|t| {
        t.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"))
    }) {
        return Err(AnswerProblem::EventStream);
    }
    Ok(())
}

#[derive(Deserialize)]
struct Answer {
    #[serde(rename = "type")]
    kind: Option<String>,
    usage: Option<UsageUpdate>,
    input_tokens: Option<u64>,
    /// A `chat.completion`'s choices (not read, only required).
    choices: Option<serde::de::IgnoredAny>,
}

/// Checks the body of a non-streaming 2xx answer of `endpoint` and reads its usage, in
/// one parse: a Messages answer is a JSON object with `"type":"message"` (its `usage`,
/// when present, is returned); a `count_tokens` answer has a numeric top-level
/// `input_tokens`; a native chat completion (an `openai` account) has `choices` (its
/// usage read by [`crate::openai::usage_from_chat_json`]).
///
/// The body is read by an allocation-free scanner (the private `answer_scan` module),
/// which gives the verdict serde_json would give and leaves its rare corners to
/// serde_json.
///
/// # Errors
/// [`AnswerProblem::NotJson`] or [`AnswerProblem::NotAnAnswer`].
pub fn check_answer_body(
    endpoint: crate::Endpoint,
    body: &[u8],
) -> Result<Option<Usage>, AnswerProblem> {
    use crate::answer_scan::{Stop, scan_answer};
    let members = match scan_answer(body) {
        Ok(members) => members,
        Err(Stop::Syntax) => return Err(AnswerProblem::NotJson),
        Err(Stop::Data) => return Err(AnswerProblem::NotAnAnswer),
        Err(Stop::Unsure) => answer_members_serde(body)?,
    };
    answer_of(endpoint, body, members)
}

/// [`check_answer_body`] through serde_json alone: the reference the scanner is tested
/// against.
#[cfg(test)]
pub(crate) fn check_answer_body_serde(
    endpoint: crate::Endpoint,
    body: &[u8],
) -> Result<Option<Usage>, AnswerProblem> {
    answer_of(endpoint, body, answer_members_serde(body)?)
}

/// The members of an answer the check reads, through serde_json: the fallback of
/// [`crate::answer_scan`] for the corners it leaves, and its reference in tests.
pub(crate) fn answer_members_serde(
    body: &[u8],
) -> Result<crate::answer_scan::AnswerMembers, AnswerProblem> {
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(AnswerProblem::NotJson);
    }
    let answer: Answer = serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            AnswerProblem::NotAnAnswer
        } else {
            AnswerProblem::NotJson
        }
    })?;
    Ok(crate::answer_scan::AnswerMembers {
        is_message: answer.kind.as_deref() == Some("message"),
        usage: answer.usage,
        input_tokens: answer.input_tokens,
        has_choices: answer.choices.is_some(),
    })
}

/// The endpoint's rules over the members of a well-formed body.
fn answer_of(
    endpoint: crate::Endpoint,
    body: &[u8],
    answer: crate::answer_scan::AnswerMembers,
) -> Result<Option<Usage>, AnswerProblem> {
    let update = match endpoint {
        crate::Endpoint::Messages => {
            if !answer.is_message {
                return Err(AnswerProblem::NotAnAnswer);
            }
            answer.usage
        }
        crate::Endpoint::CountTokens => {
            let input_tokens = answer.input_tokens.ok_or(AnswerProblem::NotAnAnswer)?;
            Some(UsageUpdate {
                input_tokens: Some(input_tokens),
                ..UsageUpdate::default()
            })
        }
        // A native OpenAI answer: a `chat.completion` object with its `choices`.
        crate::Endpoint::ChatCompletions => {
            if !answer.has_choices {
                return Err(AnswerProblem::NotAnAnswer);
            }
            return Ok(crate::openai::usage_from_chat_json(body));
        }
        crate::Endpoint::Models => return Err(AnswerProblem::NotAnAnswer),
    };
    Ok(update.map(|update| {
        let mut usage = Usage::default();
        update.apply_to(&mut usage);
        usage
    }))
}

#[derive(Deserialize)]
struct MessageStart {
    message: MessageStartMessage,
}

#[derive(Deserialize)]
struct MessageStartMessage {
    usage: Option<UsageUpdate>,
}

#[derive(Deserialize)]
struct MessageDelta {
    usage: Option<UsageUpdate>,
}

/// The usage a stream frame carries: `message.usage` of `message_start`, `usage` of
/// `message_delta`; `None` for every other frame.
pub fn usage_from_frame(frame: &Frame) -> Option<UsageUpdate> {
    if frame.is_event("message_start") {
        let data = frame.data()?;
        serde_json::from_slice::<MessageStart>(&data)
            .ok()?
            .message
            .usage
    } else if frame.is_event("message_delta") {
        let data = frame.data()?;
        serde_json::from_slice::<MessageDelta>(&data).ok()?.usage
    } else {
        None
    }
}

/// Accumulates usage over a stream's frames, observed on the side while they are
/// forwarded (SPEC 7).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamUsage {
    usage: Usage,
    seen: bool,
    wire: crate::StreamWire,
}

impl StreamUsage {
    /// Usage of a stream in `wire` format (the default: Messages).
    pub fn for_wire(wire: crate::StreamWire) -> Self {
        Self {
            wire,
            ..Self::default()
        }
    }

    /// Looks at one frame; returns whether it carried usage. An OpenAI stream's usage
    /// chunk carries the whole usage.
    pub fn observe(&mut self, frame: &Frame) -> bool {
        if self.wire == crate::StreamWire::OpenAiChat {
            return match crate::openai::classify_chat_frame(frame) {
                crate::openai::ChatFrame::Chunk {
                    usage: Some(usage), ..
                } => {
                    self.usage = usage;
                    self.seen = true;
                    true
                }
                _ => false,
            };
        }
        match usage_from_frame(frame) {
            Some(update) => {
                update.apply_to(&mut self.usage);
                self.seen = true;
                true
            }
            None => false,
        }
    }

    /// The usage so far, `None` when no frame carried any.
    pub fn usage(&self) -> Option<Usage> {
        self.seen.then_some(self.usage)
    }
}

/// An upstream error's type and message, read to classify and log the failure. Never
/// forwarded as is: only [`crate::sanitise::passthrough_body`] may pass the message on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamError {
    /// `error.type`, e.g. `overloaded_error` (at most [`MAX_UPSTREAM_ERROR_TEXT`] bytes).
    pub error_type: Option<String>,
    /// `error.message` (at most [`MAX_UPSTREAM_ERROR_TEXT`] bytes).
    pub message: Option<String>,
}

#[derive(Deserialize)]
struct ErrorEnvelope {
    error: ErrorObject,
}

#[derive(Deserialize)]
struct ErrorObject {
    #[serde(rename = "type")]
    error_type: Option<serde_json::Value>,
    message: Option<serde_json::Value>,
}

/// The `error` object of an Anthropic-shaped error body (`{"type":"error","error":
/// {"type":..,"message":..}}`), `None` when the body has none. Texts are cut to
/// [`MAX_UPSTREAM_ERROR_TEXT`] bytes; non-string values are ignored.
pub fn upstream_error(body: &[u8]) -> Option<UpstreamError> {
    let envelope: ErrorEnvelope = serde_json::from_slice(body).ok()?;
    let text = |value: Option<serde_json::Value>| match value {
        Some(serde_json::Value::String(s)) => Some(truncate_at_char(s, MAX_UPSTREAM_ERROR_TEXT)),
        _ => None,
    };
    Some(UpstreamError {
        error_type: text(envelope.error.error_type),
        message: text(envelope.error.message),
    })
}

/// The error an in-band `event: error` frame carries, `None` for other frames. A
/// malformed error frame still counts as an error (with empty fields).
pub fn stream_error(frame: &Frame) -> Option<UpstreamError> {
    if !frame.is_event("error") {
        return None;
    }
    Some(
        frame
            .data()
            .and_then(|data| upstream_error(&data))
            .unwrap_or(UpstreamError {
                error_type: None,
                message: None,
            }),
    )
}

/// Cuts `text` to at most `max` bytes at a character boundary.
pub(crate) fn truncate_at_char(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

/// Everything keypool reads from one complete (non-streaming) upstream response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponseMeta {
    /// The rate-limit and window headers.
    pub rate_limits: RateLimitInfo,
    /// Usage, for a 2xx answer that reports it.
    pub usage: Option<Usage>,
    /// The upstream error, for a non-2xx answer with an Anthropic-shaped body.
    pub error: Option<UpstreamError>,
}

/// Reads a complete upstream response: headers always, usage from a 2xx body, the
/// error object from any other.
pub fn response_meta<H: HeaderLines + ?Sized>(
    status: StatusCode,
    headers: &H,
    body: &[u8],
    now: UnixMs,
) -> ResponseMeta {
    let success = status.is_success();
    ResponseMeta {
        rate_limits: rate_limits(headers, now),
        usage: if success {
            usage_from_json_body(body)
        } else {
            None
        },
        error: if success { None } else { upstream_error(body) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keypool_sse::decode_all;

    #[test]
    fn stream_usage_takes_message_start_then_message_delta() {
        let frames = decode_all(
            b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":3,\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"usage\":{\"output_tokens\":999}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n",
        )
        .unwrap();
        let mut usage = StreamUsage::default();
        assert_eq!(usage.usage(), None);
        let carried: Vec<bool> = frames.iter().map(|f| usage.observe(f)).collect();
        assert_eq!(carried, [true, false, true]);
        assert_eq!(
            usage.usage(),
            Some(Usage {
                input_tokens: 25,
                output_tokens: 15,
                cache_creation_input_tokens: 3,
                cache_read_input_tokens: 100
            })
        );
    }

    #[test]
    fn body_usage_and_count_tokens() {
        let usage =
            usage_from_json_body(br#"{"id":"m","usage":{"input_tokens":5,"output_tokens":7}}"#);
        assert_eq!(
            usage,
            Some(Usage {
                input_tokens: 5,
                output_tokens: 7,
                ..Usage::default()
            })
        );
        let usage = usage_from_json_body(br#"{"input_tokens":2095}"#);
        assert_eq!(
            usage,
            Some(Usage {
                input_tokens: 2095,
                ..Usage::default()
            })
        );
        assert_eq!(usage_from_json_body(br#"{"id":"m"}"#), None);
        assert_eq!(usage_from_json_body(b"<html>"), None);
    }

    #[test]
    fn only_a_200_json_answer_of_the_endpoint_is_passed_on() {
        use crate::Endpoint;
        let mut headers = HeaderMap::new();
        assert_eq!(check_answer_head(StatusCode::OK, &headers), Ok(()));
        for code in [201, 204, 299] {
            let status = StatusCode::from_u16(code).unwrap();
            assert_eq!(
                check_answer_head(status, &headers),
                Err(AnswerProblem::Status(code))
            );
        }
        headers.insert("content-encoding", "identity".parse().unwrap());
        assert_eq!(check_answer_head(StatusCode::OK, &headers), Ok(()));
        headers.insert("content-encoding", "gzip".parse().unwrap());
        assert_eq!(
            check_answer_head(StatusCode::OK, &headers),
            Err(AnswerProblem::Encoded)
        );
        headers.remove("content-encoding");
        headers.insert(
            "content-type",
            "Text/Event-Stream; charset=utf-8".parse().unwrap(),
        );
        assert_eq!(
            check_answer_head(StatusCode::OK, &headers),
            Err(AnswerProblem::EventStream)
        );

        let message =
            br#"{"id":"msg_1","type":"message","usage":{"input_tokens":3,"output_tokens":4}}"#;
        assert_eq!(
            check_answer_body(Endpoint::Messages, message),
            Ok(Some(Usage {
                input_tokens: 3,
                output_tokens: 4,
                ..Usage::default()
            }))
        );
        assert_eq!(
            check_answer_body(Endpoint::Messages, br#"{"type":"message"}"#),
            Ok(None)
        );
        assert_eq!(
            check_answer_body(Endpoint::CountTokens, br#"{"input_tokens":17}"#),
            Ok(Some(Usage {
                input_tokens: 17,
                ..Usage::default()
            }))
        );
        let cases: [(Endpoint, &[u8], AnswerProblem); 8] = [
            (Endpoint::Messages, b"", AnswerProblem::NotJson),
            (
                Endpoint::Messages,
                b"\x1f\x8b\x08\x00gzip",
                AnswerProblem::NotJson,
            ),
            (
                Endpoint::Messages,
                b"<html>ok</html>",
                AnswerProblem::NotJson,
            ),
            (
                Endpoint::Messages,
                br#"{"type":"message""#,
                AnswerProblem::NotJson,
            ),
            (
                Endpoint::Messages,
                br#"[{"type":"message"}]"#,
                AnswerProblem::NotJson,
            ),
            (
                Endpoint::Messages,
                br#"{"type":"error"}"#,
                AnswerProblem::NotAnAnswer,
            ),
            (
                Endpoint::Messages,
                br#"{"type":5}"#,
                AnswerProblem::NotAnAnswer,
            ),
            (
                Endpoint::CountTokens,
                br#"{"type":"message"}"#,
                AnswerProblem::NotAnAnswer,
            ),
        ];
        for (endpoint, body, problem) in cases {
            assert_eq!(
                check_answer_body(endpoint, body),
                Err(problem),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn upstream_error_texts_are_bounded() {
        let long = "é".repeat(MAX_UPSTREAM_ERROR_TEXT);
        let body =
            serde_json::json!({"type":"error","error":{"type":"rate_limit_error","message":long}});
        let err = upstream_error(body.to_string().as_bytes()).unwrap();
        assert_eq!(err.error_type.as_deref(), Some("rate_limit_error"));
        let message = err.message.unwrap();
        assert_eq!(message.len(), MAX_UPSTREAM_ERROR_TEXT);
        assert!(message.chars().all(|c| c == 'é'));
        assert_eq!(
            upstream_error(br#"{"error":{"message":5}}"#),
            Some(UpstreamError {
                error_type: None,
                message: None
            })
        );
        assert_eq!(upstream_error(b"Bad Gateway"), None);
    }

    #[test]
    fn error_frames_are_recognised_even_malformed() {
        let frames = decode_all(
            b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\nevent: error\ndata: nope\n\nevent: ping\ndata: {}\n\n",
        )
        .unwrap();
        assert_eq!(
            stream_error(&frames[0]).unwrap().error_type.as_deref(),
            Some("overloaded_error")
        );
        assert_eq!(
            stream_error(&frames[1]),
            Some(UpstreamError {
                error_type: None,
                message: None
            })
        );
        assert_eq!(stream_error(&frames[2]), None);
    }
}
