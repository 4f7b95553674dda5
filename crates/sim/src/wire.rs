//! The Anthropic wire format the simulator writes: JSON messages, `count_tokens`
//! answers, error bodies and the SSE frames of a message stream.
//!
//! Every frame is `event: <name>\ndata: <json>\n\n`, as the real API sends it. Frames are
//! rendered once per response into [`Bytes`] so that repeated deltas are reference-count
//! clones, not copies.

use bytes::Bytes;
use http::StatusCode;
use serde::Serialize;

use crate::frames::{Deltas, StreamFrames};
use crate::script::{OkSpec, Usage};
use crate::tools::{ToolCall, fragments};

/// `content-type` of JSON answers.
pub const JSON: &str = "application/json";
/// `content-type` of streams.
pub const EVENT_STREAM: &str = "text/event-stream; charset=utf-8";

/// The frames after `message_start` that never change.
pub(crate) const CONTENT_BLOCK_START: &[u8] = b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";
/// The keep-alive frame (the real API writes it with spaces).
pub(crate) const PING: &[u8] = b"event: ping\ndata: {\"type\": \"ping\"}\n\n";
/// End of the text block.
pub(crate) const CONTENT_BLOCK_STOP: &[u8] =
    b"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n";
/// End of the message.
pub(crate) const MESSAGE_STOP: &[u8] =
    b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
/// The in-band error Anthropic sends after `message_start` when it is overloaded.
pub(crate) const OVERLOADED_ERROR_FRAME: &[u8] = b"event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n";

/// The Anthropic `error.type` for an HTTP status.
pub(crate) fn error_type_for(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 422 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

/// A realistic `error.message` for an HTTP status.
pub(crate) fn default_message_for(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 422 => "messages: Field required",
        401 => "invalid x-api-key",
        402 => {
            "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."
        }
        403 => "Your API key does not have permission to use the specified resource.",
        404 => "Not found",
        405 => "Method not allowed",
        413 => "Request exceeds the maximum allowed number of bytes.",
        429 => {
            "This request would exceed the rate limit for your organization. Please try again later."
        }
        503 | 529 => "Overloaded",
        504 => "Request timed out",
        _ => "Internal server error",
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: ErrorDetail<'a>,
    request_id: &'a str,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    message: &'a str,
}

/// `{"type":"error","error":{"type":…,"message":…},"request_id":…}`.
pub(crate) fn error_body(error_type: &str, message: &str, request_id: &str) -> Bytes {
    to_json(&ErrorBody {
        kind: "error",
        error: ErrorDetail {
            kind: error_type,
            message,
        },
        request_id,
    })
}

#[derive(Serialize)]
struct UsageJson {
    input_tokens: u64,
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
    output_tokens: u64,
}

impl UsageJson {
    fn new(usage: &Usage, output_tokens: u64) -> Self {
        Self {
            input_tokens: usage.input_tokens,
            cache_creation_input_tokens: usage.cache_creation_input_tokens,
            cache_read_input_tokens: usage.cache_read_input_tokens,
            output_tokens,
        }
    }
}

/// A content block of a message.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: serde_json::Value,
    },
}

impl<'a> Block<'a> {
    fn tool_use(call: &'a ToolCall) -> Self {
        Block::ToolUse {
            id: &call.id,
            name: &call.name,
            input: serde_json::from_str(&call.arguments)
                .unwrap_or_else(|_| serde_json::Value::Object(Default::default())),
        }
    }
}

#[derive(Serialize)]
struct MessageJson<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: &'a [Block<'a>],
    stop_reason: Option<&'a str>,
    stop_sequence: Option<&'a str>,
    usage: UsageJson,
}

/// The `stop_reason` of a message that calls a tool.
const TOOL_USE: &str = "tool_use";

/// The whole JSON answer of a non-streaming request: the text, or the tool call.
pub(crate) fn message_json(id: &str, model: &str, spec: &OkSpec, tool: Option<&ToolCall>) -> Bytes {
    let text = spec.text.repeat(spec.chunks as usize);
    let (content, stop_reason) = match tool {
        Some(call) => ([Block::tool_use(call)], TOOL_USE),
        None => ([Block::Text { text: &text }], &*spec.stop_reason),
    };
    to_json(&MessageJson {
        id,
        kind: "message",
        role: "assistant",
        model,
        content: &content,
        stop_reason: Some(stop_reason),
        stop_sequence: None,
        usage: UsageJson::new(&spec.usage, spec.usage.output_tokens),
    })
}

#[derive(Serialize)]
struct CountTokens {
    input_tokens: u64,
}

/// `{"input_tokens":N}`.
pub(crate) fn count_tokens_json(input_tokens: u64) -> Bytes {
    to_json(&CountTokens { input_tokens })
}

#[derive(Serialize)]
struct MessageStart<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: MessageJson<'a>,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: u32,
    delta: BlockDelta<'a>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta<'a> {
    TextDelta { text: &'a str },
    InputJsonDelta { partial_json: &'a str },
}

#[derive(Serialize)]
struct BlockStart<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: u32,
    content_block: Block<'a>,
}

#[derive(Serialize)]
struct MessageDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    delta: StopDelta<'a>,
    usage: OutputUsage,
}

#[derive(Serialize)]
struct StopDelta<'a> {
    stop_reason: &'a str,
    stop_sequence: Option<&'a str>,
}

#[derive(Serialize)]
struct OutputUsage {
    output_tokens: u64,
}

fn delta_frame(delta: BlockDelta<'_>) -> Bytes {
    frame(
        "content_block_delta",
        &Delta {
            kind: "content_block_delta",
            index: 0,
            delta,
        },
    )
}

impl StreamFrames {
    /// The Messages API stream of `spec` (or of the tool call): `message_start`,
    /// `content_block_start`, `ping`, the deltas, `content_block_stop`,
    /// `message_delta`, `message_stop`; `chunks` + 6 frames for a text answer.
    pub(crate) fn new(id: &str, model: &str, spec: &OkSpec, tool: Option<&ToolCall>) -> Self {
        let message_start = frame(
            "message_start",
            &MessageStart {
                kind: "message_start",
                message: MessageJson {
                    id,
                    kind: "message",
                    role: "assistant",
                    model,
                    content: &[],
                    stop_reason: None,
                    stop_sequence: None,
                    usage: UsageJson::new(&spec.usage, 1),
                },
            },
        );
        let (block_start, deltas, stop_reason) = match tool {
            None => {
                let delta = delta_frame(BlockDelta::TextDelta { text: &spec.text });
                let deltas = Deltas::Repeat {
                    frame: delta,
                    times: spec.chunks as usize,
                };
                (
                    Bytes::from_static(CONTENT_BLOCK_START),
                    deltas,
                    &*spec.stop_reason,
                )
            }
            Some(call) => {
                let start = BlockStart {
                    kind: "content_block_start",
                    index: 0,
                    content_block: Block::ToolUse {
                        id: &call.id,
                        name: &call.name,
                        input: serde_json::Value::Object(Default::default()),
                    },
                };
                let deltas = fragments(&call.arguments, spec.chunks as usize)
                    .into_iter()
                    .map(|partial_json| delta_frame(BlockDelta::InputJsonDelta { partial_json }))
                    .collect();
                (
                    frame("content_block_start", &start),
                    Deltas::Each(deltas),
                    TOOL_USE,
                )
            }
        };
        let message_delta = frame(
            "message_delta",
            &MessageDelta {
                kind: "message_delta",
                delta: StopDelta {
                    stop_reason,
                    stop_sequence: None,
                },
                usage: OutputUsage {
                    output_tokens: spec.usage.output_tokens,
                },
            },
        );
        StreamFrames::from_parts(
            vec![message_start, block_start, Bytes::from_static(PING)],
            deltas,
            vec![
                Bytes::from_static(CONTENT_BLOCK_STOP),
                message_delta,
                Bytes::from_static(MESSAGE_STOP),
            ],
            Bytes::from_static(OVERLOADED_ERROR_FRAME),
        )
    }
}

pub(crate) fn frame(event: &str, data: &impl Serialize) -> Bytes {
    let mut out = Vec::with_capacity(192);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    write_json(&mut out, data);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

pub(crate) fn to_json(value: &impl Serialize) -> Bytes {
    let mut out = Vec::with_capacity(256);
    write_json(&mut out, value);
    Bytes::from(out)
}

fn write_json(out: &mut Vec<u8>, value: &impl Serialize) {
    // Serialising these plain structs into a Vec cannot fail (no maps with non-string
    // keys, no I/O); an empty object keeps the frame well-formed should it ever do.
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.extend_from_slice(b"{}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn parse_frame(bytes: &[u8]) -> (String, Value) {
        let text = std::str::from_utf8(bytes).unwrap();
        let body = text.strip_suffix("\n\n").unwrap();
        let (event, data) = body.split_once('\n').unwrap();
        let event = event.strip_prefix("event: ").unwrap().to_owned();
        let data = data.strip_prefix("data: ").unwrap();
        assert!(!data.contains('\n'));
        (event, serde_json::from_str(data).unwrap())
    }

    proptest! {
        #[test]
        fn every_frame_is_one_event_whose_data_type_is_its_name(
            model in ".{0,40}", text in ".{0,40}", chunks in 0u32..20
        ) {
            let spec = OkSpec::default().text(&text).chunks(chunks);
            let frames = StreamFrames::new("msg_1", &model, &spec, None);
            prop_assert_eq!(frames.len(), chunks as usize + 6);
            for i in 0..frames.len() {
                let (event, data) = parse_frame(&frames.get(i));
                prop_assert_eq!(data["type"].as_str(), Some(event.as_str()));
            }
            let (_, start) = parse_frame(&frames.get(0));
            prop_assert_eq!(start["message"]["model"].as_str(), Some(model.as_str()));
            if chunks > 0 {
                let (_, delta) = parse_frame(&frames.get(3));
                prop_assert_eq!(delta["delta"]["text"].as_str(), Some(text.as_str()));
            }
        }

        #[test]
        fn json_message_echoes_model_and_text(model in ".{0,40}", text in ".{0,10}", chunks in 0u32..5) {
            let spec = OkSpec::default().text(&text).chunks(chunks);
            let v: Value = serde_json::from_slice(&message_json("msg_1", &model, &spec, None)).unwrap();
            prop_assert_eq!(v["model"].as_str(), Some(model.as_str()));
            let expected = text.repeat(chunks as usize);
            prop_assert_eq!(v["content"][0]["text"].as_str(), Some(expected.as_str()));
        }
    }

    #[test]
    fn static_frames_parse() {
        for f in [
            CONTENT_BLOCK_START,
            PING,
            CONTENT_BLOCK_STOP,
            MESSAGE_STOP,
            OVERLOADED_ERROR_FRAME,
        ] {
            let (event, data) = parse_frame(f);
            assert_eq!(data["type"].as_str(), Some(event.as_str()));
        }
        let (_, err) = parse_frame(OVERLOADED_ERROR_FRAME);
        assert_eq!(err["error"]["type"], "overloaded_error");
    }

    #[test]
    fn error_body_has_anthropic_shape() {
        let v: Value =
            serde_json::from_slice(&error_body("rate_limit_error", "slow down", "req_1")).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type":"error","error":{"type":"rate_limit_error","message":"slow down"},"request_id":"req_1"})
        );
    }
}
