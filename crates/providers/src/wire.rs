//! What a frame of an upstream stream means, whatever the provider's wire format: the
//! proxy asks [`StreamWire::role`] instead of naming any provider's events.
//!
//! | wire | error | end of the answer | content |
//! | --- | --- | --- | --- |
//! | [`StreamWire::Messages`] | `event: error` | `message_stop` | `content_block_delta` |
//! | [`StreamWire::OpenAiChat`] | `data: {"error":…}` | `data: [DONE]` | a chunk with text, a refusal or a tool call |
//!
//! ```
//! use keypool_providers::{Endpoint, FrameRole, StreamWire};
//! use keypool_sse::decode_all;
//! let wire = StreamWire::of(Endpoint::ChatCompletions);
//! let done = &decode_all(b"data: [DONE]\n\n").unwrap()[0];
//! assert_eq!(wire.role(done), FrameRole::End);
//! let stop = &decode_all(b"event: message_stop\ndata: {}\n\n").unwrap()[0];
//! assert_eq!(StreamWire::Messages.role(stop), FrameRole::End);
//! ```

use keypool_sse::Frame;

use crate::Endpoint;
use crate::openai::{ChatFrame, classify_chat_frame};
use crate::response::stream_error;

/// The wire format of an upstream stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamWire {
    /// The Anthropic Messages API's named events.
    #[default]
    Messages,
    /// OpenAI `chat.completion.chunk` frames ending with `data: [DONE]`.
    OpenAiChat,
}

/// What one frame of a stream is, for the commit point, the watchdog and the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameRole {
    /// The upstream failed in-band: never forwarded, the stream fails.
    Error,
    /// The answer is complete: nothing after it is forwarded.
    End,
    /// Generated content (counted by the slow-stream watchdog).
    Content,
    /// Anything else (start, keep-alives, usage, block boundaries).
    Other,
}

/// The one generic error frame a committed stream of the client's `endpoint` ends
/// with when the upstream fails after the head (SPEC 3.8): Anthropic's
/// `event: error` `overloaded_error`, or its OpenAI-shaped equivalent on the OpenAI
/// routes.
pub fn generic_error_frame(endpoint: Endpoint) -> bytes::Bytes {
    if endpoint.is_openai() {
        crate::openai::overloaded_error_frame()
    } else {
        keypool_sse::overloaded_error_frame()
    }
}

/// The upstream's own request id, for the log line: Anthropic's `request-id`, an
/// OpenAI-compatible server's `x-request-id`.
pub fn upstream_request_id<H: crate::HeaderLines + ?Sized>(
    provider: keypool_core::Provider,
    headers: &H,
) -> Option<&str> {
    headers.first_str(if provider.speaks_messages() {
        "request-id"
    } else {
        "x-request-id"
    })
}

impl StreamWire {
    /// The wire format of an upstream `endpoint`'s streams.
    pub const fn of(endpoint: Endpoint) -> Self {
        match endpoint {
            Endpoint::ChatCompletions => Self::OpenAiChat,
            _ => Self::Messages,
        }
    }

    /// What `frame` is in this wire format.
    pub fn role(self, frame: &Frame) -> FrameRole {
        match self {
            Self::Messages => {
                if stream_error(frame).is_some() {
                    FrameRole::Error
                } else if frame.is_event("message_stop") {
                    FrameRole::End
                } else if frame.is_event("content_block_delta") {
                    FrameRole::Content
                } else {
                    FrameRole::Other
                }
            }
            Self::OpenAiChat => match classify_chat_frame(frame) {
                ChatFrame::Error(_) => FrameRole::Error,
                ChatFrame::Done => FrameRole::End,
                ChatFrame::Chunk { content: true, .. } => FrameRole::Content,
                _ => FrameRole::Other,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keypool_sse::decode_all;

    fn role(wire: StreamWire, text: &str) -> FrameRole {
        wire.role(&decode_all(text.as_bytes()).unwrap()[0])
    }

    #[test]
    fn roles_of_both_wires() {
        let m = StreamWire::Messages;
        assert_eq!(role(m, "event: error\ndata: {}\n\n"), FrameRole::Error);
        assert_eq!(role(m, "event: message_stop\ndata: {}\n\n"), FrameRole::End);
        assert_eq!(
            role(m, "event: content_block_delta\ndata: {}\n\n"),
            FrameRole::Content
        );
        assert_eq!(role(m, "event: ping\ndata: {}\n\n"), FrameRole::Other);
        let o = StreamWire::OpenAiChat;
        assert_eq!(
            role(o, "data: {\"error\":{\"message\":\"x\"}}\n\n"),
            FrameRole::Error
        );
        assert_eq!(role(o, "data: [DONE]\n\n"), FrameRole::End);
        assert_eq!(
            role(
                o,
                "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"
            ),
            FrameRole::Content
        );
        assert_eq!(role(o, ": keep-alive\n\n"), FrameRole::Other);
        assert_eq!(StreamWire::of(Endpoint::Messages), m);
        assert_eq!(StreamWire::of(Endpoint::ChatCompletions), o);
    }

    #[test]
    fn error_frames_and_request_ids_by_format() {
        assert!(generic_error_frame(Endpoint::Messages).starts_with(b"event: error\n"));
        assert!(generic_error_frame(Endpoint::ChatCompletions).starts_with(b"data: {\"error\""));
        let mut headers = http::HeaderMap::new();
        headers.insert("request-id", http::HeaderValue::from_static("req_a"));
        headers.insert("x-request-id", http::HeaderValue::from_static("req_o"));
        use keypool_core::Provider;
        assert_eq!(
            upstream_request_id(Provider::Anthropic, &headers),
            Some("req_a")
        );
        assert_eq!(
            upstream_request_id(Provider::OpenAi, &headers),
            Some("req_o")
        );
    }
}
