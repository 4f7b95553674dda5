//! An Anthropic message stream turned into an OpenAI `chat.completion.chunk` stream,
//! frame by frame.
//!
//! [`ChatStream`] is a state machine fed the upstream's SSE frames (already framed by
//! `keypool-sse`, as the proxy reads them, or raw bytes through
//! [`ChatStream::push_bytes`]); each frame yields zero or more OpenAI frames
//! (`data: {…}\n\n`):
//!
//! | Anthropic event | OpenAI chunks |
//! | --- | --- |
//! | `message_start` | `delta: {"role":"assistant","content":""}` (id, model and input usage remembered) |
//! | `content_block_start` of a `tool_use` | `delta.tool_calls[0]`: `index` (the call's number), `id`, `type`, `function.name`, `arguments: ""` |
//! | `content_block_delta` `text_delta` | `delta: {"content": text}` |
//! | `content_block_delta` `input_json_delta` | `delta.tool_calls[0]`: `index`, `function.arguments` fragment |
//! | `message_delta` | nothing (stop reason and usage remembered) |
//! | `message_stop` | `delta: {}` with `finish_reason`; the usage chunk (`choices: []`) when `include_usage`; `data: [DONE]` |
//! | `error` | an OpenAI error frame `data: {"error":{…}}` ([`super::error_frame`]); the stream ends |
//! | `ping`, `content_block_stop`, thinking and other deltas, unknown events | nothing |
//!
//! With `include_usage` every chunk carries `"usage": null`, as OpenAI's do. Content
//! before `message_start` and anything after the end is ignored; the translator never
//! panics, whatever the frames (a property test).

use bytes::{Bytes, BytesMut};
use keypool_core::Usage;
use keypool_sse::{Decoder, Event, Frame, SseError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::errors::{error_frame, overloaded_error_frame};
use super::response::{ChatUsage, FunctionCall, ToolCall, completion_id, finish_reason};
use crate::response::UsageUpdate;
use crate::sanitise::ErrorType;

/// The frame that ends every successful OpenAI stream.
pub const DONE_FRAME: &[u8] = b"data: [DONE]\n\n";

/// What a stream's chunks need that the frames do not carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChatStreamOptions {
    /// The chunks' `created`, unix seconds (this crate reads no clock).
    pub created: u64,
    /// `stream_options.include_usage` of the request.
    pub include_usage: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No `message_start` yet.
    Waiting,
    /// Chunks are flowing.
    Open,
    /// `[DONE]` or an error frame was written: nothing more.
    Ended,
}

/// The translator of one stream. See the [module docs](self).
#[derive(Debug)]
pub struct ChatStream {
    options: ChatStreamOptions,
    state: State,
    id: String,
    model: String,
    usage: Usage,
    stop_reason: Option<String>,
    /// (Anthropic block index, OpenAI tool call index) of the `tool_use` blocks so far.
    tool_blocks: Vec<(u64, usize)>,
    decoder: Decoder,
}

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<ChunkChoice<'a>>,
    /// Absent without `include_usage`; `null` on every chunk but the usage chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<ChatUsage>>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize, Default)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[ToolCall<'a>; 1]>,
}

impl ChatStream {
    /// A translator for one stream.
    pub fn new(options: ChatStreamOptions) -> Self {
        Self {
            options,
            state: State::Waiting,
            id: completion_id(""),
            model: String::new(),
            usage: Usage::default(),
            stop_reason: None,
            tool_blocks: Vec::new(),
            decoder: Decoder::new(),
        }
    }

    /// Whether the OpenAI stream is complete (`[DONE]` or an error frame written).
    pub fn is_ended(&self) -> bool {
        self.state == State::Ended
    }

    /// The usage seen so far (Anthropic's four counts).
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Translates raw upstream bytes (any chunking): frames them with `keypool-sse`
    /// and appends the OpenAI frames to `out`.
    ///
    /// # Errors
    /// The decoder's error (a frame over 16 MiB); the stream is then ended with the
    /// generic error frame already appended to `out`.
    pub fn push_bytes(&mut self, chunk: &[u8], out: &mut BytesMut) -> Result<(), SseError> {
        self.decoder.push(chunk);
        loop {
            match self.decoder.next_frame() {
                Ok(Some(frame)) => self.on_frame(&frame, out),
                Ok(None) => return Ok(()),
                Err(e) => {
                    self.fail(out);
                    return Err(e);
                }
            }
        }
    }

    /// The end of the upstream body: when the stream did not end (no `message_stop`,
    /// no `error`), appends the generic error frame ([`super::overloaded_error_frame`])
    /// so the client does not take a cut answer for a complete one.
    pub fn finish(&mut self, out: &mut BytesMut) {
        if let Ok(Some(frame)) = self.decoder.finish() {
            self.on_frame(&frame, out);
        }
        self.fail(out);
    }

    fn fail(&mut self, out: &mut BytesMut) {
        if self.state != State::Ended {
            out.extend_from_slice(&overloaded_error_frame());
            self.state = State::Ended;
        }
    }

    /// Translates one upstream frame, appending the OpenAI frames it yields to `out`.
    pub fn on_frame(&mut self, frame: &Frame, out: &mut BytesMut) {
        if self.state == State::Ended {
            return;
        }
        let Some(data) = frame.data() else { return };
        let Ok(value) = serde_json::from_slice::<Value>(&data) else {
            return;
        };
        let kind = match value.get("type").and_then(Value::as_str) {
            Some(kind) => kind.to_owned(),
            None => match frame.event() {
                Some(event) => event.into_owned(),
                None => return,
            },
        };
        match (kind.as_str(), self.state) {
            ("error", _) => self.on_error(&value, out),
            ("message_start", State::Waiting) => self.on_message_start(&value, out),
            ("content_block_start", State::Open) => self.on_block_start(&value, out),
            ("content_block_delta", State::Open) => self.on_block_delta(&value, out),
            ("message_delta", State::Open) => self.on_message_delta(&value),
            ("message_stop", State::Open) => self.on_message_stop(out),
            _ => {}
        }
    }

    fn on_message_start(&mut self, value: &Value, out: &mut BytesMut) {
        let message = value.get("message");
        let text = |field: &str| {
            message
                .and_then(|m| m.get(field))
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        self.id = completion_id(text("id"));
        self.model = text("model").to_owned();
        self.observe_usage(message.and_then(|m| m.get("usage")));
        self.state = State::Open;
        let delta = Delta {
            role: Some("assistant"),
            content: Some(""),
            ..Delta::default()
        };
        self.write_choice(delta, None, out);
    }

    fn on_block_start(&mut self, value: &Value, out: &mut BytesMut) {
        let Some(block) = value.get("content_block") else {
            return;
        };
        if block.get("type").and_then(Value::as_str) != Some("tool_use") {
            return;
        }
        let Some(index) = value.get("index").and_then(Value::as_u64) else {
            return;
        };
        let tool_index = self.tool_blocks.len();
        self.tool_blocks.push((index, tool_index));
        let call = ToolCall {
            index: Some(tool_index),
            id: Some(block.get("id").and_then(Value::as_str).unwrap_or("")),
            kind: Some("function"),
            function: FunctionCall {
                name: Some(block.get("name").and_then(Value::as_str).unwrap_or("")),
                arguments: "",
            },
        };
        let delta = Delta {
            tool_calls: Some([call]),
            ..Delta::default()
        };
        self.write_choice(delta, None, out);
    }

    fn on_block_delta(&mut self, value: &Value, out: &mut BytesMut) {
        let Some(delta) = value.get("delta") else {
            return;
        };
        match delta.get("type").and_then(Value::as_str) {
            Some("text_delta") => {
                let Some(text) = delta.get("text").and_then(Value::as_str) else {
                    return;
                };
                let delta = Delta {
                    content: Some(text),
                    ..Delta::default()
                };
                self.write_choice(delta, None, out);
            }
            Some("input_json_delta") => {
                let index = value.get("index").and_then(Value::as_u64);
                let tool = self.tool_blocks.iter().find(|(b, _)| Some(*b) == index);
                let partial = delta.get("partial_json").and_then(Value::as_str);
                let (Some(&(_, tool_index)), Some(partial)) = (tool, partial) else {
                    return;
                };
                if partial.is_empty() {
                    return;
                }
                let call = ToolCall {
                    index: Some(tool_index),
                    id: None,
                    kind: None,
                    function: FunctionCall {
                        name: None,
                        arguments: partial,
                    },
                };
                let delta = Delta {
                    tool_calls: Some([call]),
                    ..Delta::default()
                };
                self.write_choice(delta, None, out);
            }
            _ => {}
        }
    }

    fn on_message_delta(&mut self, value: &Value) {
        if let Some(reason) = value
            .get("delta")
            .and_then(|d| d.get("stop_reason"))
            .and_then(Value::as_str)
        {
            self.stop_reason = Some(reason.to_owned());
        }
        self.observe_usage(value.get("usage"));
    }

    fn on_message_stop(&mut self, out: &mut BytesMut) {
        let reason = finish_reason(self.stop_reason.as_deref());
        self.write_choice(Delta::default(), Some(reason), out);
        if self.options.include_usage {
            let usage = ChatUsage::from(&self.usage);
            self.write_chunk(Vec::new(), Some(Some(usage)), out);
        }
        out.extend_from_slice(DONE_FRAME);
        self.state = State::Ended;
    }

    fn on_error(&mut self, value: &Value, out: &mut BytesMut) {
        let error = value.get("error");
        let text = |field: &str| error.and_then(|e| e.get(field)).and_then(Value::as_str);
        let error_type = text("type")
            .and_then(ErrorType::from_wire)
            .unwrap_or(ErrorType::Api);
        let message = text("message").unwrap_or("upstream error");
        out.extend_from_slice(&error_frame(error_type, message));
        self.state = State::Ended;
    }

    fn observe_usage(&mut self, usage: Option<&Value>) {
        if let Some(update) = usage.and_then(|u| UsageUpdate::deserialize(u).ok()) {
            update.apply_to(&mut self.usage);
        }
    }

    fn write_choice(&self, delta: Delta<'_>, finish: Option<&'static str>, out: &mut BytesMut) {
        let choice = ChunkChoice {
            index: 0,
            delta,
            logprobs: None,
            finish_reason: finish,
        };
        let usage = self.options.include_usage.then_some(None);
        self.write_chunk(vec![choice], usage, out);
    }

    fn write_chunk(
        &self,
        choices: Vec<ChunkChoice<'_>>,
        usage: Option<Option<ChatUsage>>,
        out: &mut BytesMut,
    ) {
        let chunk = Chunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.options.created,
            model: &self.model,
            choices,
            usage,
        };
        // Serialising these plain structs cannot fail, and compact JSON has no line
        // break, so the event always encodes.
        let Ok(json) = serde_json::to_string(&chunk) else {
            return;
        };
        let _ = Event {
            data: Some(&json),
            ..Event::default()
        }
        .encode_into(out);
    }
}

/// Translates a whole Anthropic stream at once (tests, fixtures): the OpenAI stream's
/// bytes.
pub fn translate_stream(upstream: &[u8], options: ChatStreamOptions) -> Bytes {
    let mut stream = ChatStream::new(options);
    let mut out = BytesMut::new();
    let _ = stream.push_bytes(upstream, &mut out);
    stream.finish(&mut out);
    out.freeze()
}
