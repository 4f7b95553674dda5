//! The OpenAI Chat Completions wire format the simulator writes: `chat.completion`
//! JSON, `chat.completion.chunk` streams (`data: {…}` frames ending in
//! `data: [DONE]`), the model list and OpenAI error bodies; and the `x-ratelimit-*`
//! headers a script can attach ([`OpenAiRateLimitHeaders`]).

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use serde::Serialize;

use crate::frames::{Deltas, StreamFrames};
use crate::script::{OkSpec, Usage, header_pair};
use crate::tools::{ToolCall, fragments};
use crate::wire::to_json;

/// The models `GET …/v1/models` lists.
pub const SIM_MODELS: [&str; 3] = ["claude-sonnet-4-5", "claude-haiku-4-5", "gpt-4o-mini"];

/// The `x-ratelimit-*` headers of an OpenAI-compatible upstream: limits, what remains,
/// and when each budget is whole again (Go-style durations such as `6m0s`, `20ms`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OpenAiRateLimitHeaders {
    /// `x-ratelimit-limit-requests`.
    pub limit_requests: Option<u64>,
    /// `x-ratelimit-remaining-requests`.
    pub remaining_requests: Option<u64>,
    /// `x-ratelimit-reset-requests`.
    pub reset_requests: Option<String>,
    /// `x-ratelimit-limit-tokens`.
    pub limit_tokens: Option<u64>,
    /// `x-ratelimit-remaining-tokens`.
    pub remaining_tokens: Option<u64>,
    /// `x-ratelimit-reset-tokens`.
    pub reset_tokens: Option<String>,
}

impl OpenAiRateLimitHeaders {
    /// A request budget of `limit` used up, whole again after `reset` (e.g. `"20s"`).
    pub fn requests_exhausted(limit: u64, reset: &str) -> Self {
        Self {
            limit_requests: Some(limit),
            remaining_requests: Some(0),
            reset_requests: Some(reset.to_owned()),
            ..Self::default()
        }
    }

    /// A token budget of `limit` used up, whole again after `reset`.
    pub fn tokens_exhausted(limit: u64, reset: &str) -> Self {
        Self {
            limit_tokens: Some(limit),
            remaining_tokens: Some(0),
            reset_tokens: Some(reset.to_owned()),
            ..Self::default()
        }
    }

    /// The header pairs, in a stable order.
    ///
    /// # Panics
    /// If a reset holds control characters.
    pub fn to_headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let counts = [
            ("x-ratelimit-limit-requests", self.limit_requests),
            ("x-ratelimit-remaining-requests", self.remaining_requests),
            ("x-ratelimit-limit-tokens", self.limit_tokens),
            ("x-ratelimit-remaining-tokens", self.remaining_tokens),
        ];
        let resets = [
            ("x-ratelimit-reset-requests", &self.reset_requests),
            ("x-ratelimit-reset-tokens", &self.reset_tokens),
        ];
        let mut out: Vec<_> = counts
            .into_iter()
            .filter_map(|(name, n)| n.map(|n| header_pair(name, &n.to_string())))
            .collect();
        out.extend(
            resets
                .into_iter()
                .filter_map(|(name, r)| r.as_deref().map(|r| header_pair(name, r))),
        );
        out
    }
}

/// The OpenAI `type` and `code` for an Anthropic error type and status, as OpenAI
/// would answer: a bad key is `invalid_request_error` / `invalid_api_key`, a rate
/// limit `requests` / `rate_limit_exceeded`, server trouble `server_error`.
fn error_kind(status: StatusCode, error_type: &str) -> (&'static str, Option<&'static str>) {
    match (status.as_u16(), error_type) {
        (401, _) | (_, "authentication_error") => {
            ("invalid_request_error", Some("invalid_api_key"))
        }
        (402, _) | (_, "billing_error") => ("insufficient_quota", Some("insufficient_quota")),
        (429, _) | (_, "rate_limit_error") => ("requests", Some("rate_limit_exceeded")),
        (403, _) => (
            "invalid_request_error",
            Some("unsupported_country_region_territory"),
        ),
        (404, _) => ("invalid_request_error", Some("model_not_found")),
        (500..=599, _) => ("server_error", None),
        _ => ("invalid_request_error", None),
    }
}

/// OpenAI's own text for the statuses whose Anthropic default text names Anthropic
/// things (`x-api-key`).
pub(crate) fn default_message_for(status: StatusCode) -> Option<&'static str> {
    match status.as_u16() {
        401 => {
            Some("Incorrect API key provided. You can find your API key in your account settings.")
        }
        429 => Some("Rate limit reached for requests. Please try again later."),
        _ => None,
    }
}

#[derive(Serialize)]
struct ErrorEnvelope<'a> {
    error: ErrorObject<'a>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: Option<&'static str>,
}

/// `{"error":{"message":…,"type":…,"param":null,"code":…}}`.
pub(crate) fn error_body(status: StatusCode, error_type: &str, message: &str) -> Bytes {
    let (kind, code) = error_kind(status, error_type);
    to_json(&ErrorEnvelope {
        error: ErrorObject {
            message,
            kind,
            param: None,
            code,
        },
    })
}

#[derive(Serialize)]
struct ModelList<'a> {
    object: &'static str,
    data: Vec<ModelEntry<'a>>,
}

#[derive(Serialize)]
struct ModelEntry<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
}

/// The answer of `GET …/v1/models`: [`SIM_MODELS`].
pub(crate) fn models_json(created: u64) -> Bytes {
    to_json(&ModelList {
        object: "list",
        data: SIM_MODELS
            .iter()
            .map(|id| ModelEntry {
                id,
                object: "model",
                created,
                owned_by: "keypool-sim",
            })
            .collect(),
    })
}

#[derive(Serialize)]
struct ChatUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    prompt_tokens_details: PromptDetails,
}

#[derive(Serialize)]
struct PromptDetails {
    cached_tokens: u64,
}

impl From<&Usage> for ChatUsage {
    fn from(u: &Usage) -> Self {
        let prompt = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens;
        Self {
            prompt_tokens: prompt,
            completion_tokens: u.output_tokens,
            total_tokens: prompt + u.output_tokens,
            prompt_tokens_details: PromptDetails {
                cached_tokens: u.cache_read_input_tokens,
            },
        }
    }
}

#[derive(Serialize)]
struct FunctionJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

#[derive(Serialize)]
struct ToolCallJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionJson<'a>,
}

impl<'a> ToolCallJson<'a> {
    /// The call's first appearance: id, type, name and `arguments`.
    fn whole(call: &'a ToolCall, index: Option<u32>, arguments: &'a str) -> Self {
        Self {
            index,
            id: Some(&call.id),
            kind: Some("function"),
            function: FunctionJson {
                name: Some(&call.name),
                arguments,
            },
        }
    }
}

#[derive(Serialize)]
struct AssistantJson<'a> {
    role: &'static str,
    content: Option<&'a str>,
    refusal: Option<()>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<ToolCallJson<'a>>,
}

#[derive(Serialize)]
struct CompletionChoice<'a> {
    index: u32,
    message: AssistantJson<'a>,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct Completion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [CompletionChoice<'a>; 1],
    usage: ChatUsage,
}

/// OpenAI's `finish_reason` for the spec's Anthropic `stop_reason`.
fn finish_reason(stop_reason: &str) -> &'static str {
    match stop_reason {
        "max_tokens" => "length",
        "tool_use" => "tool_calls",
        _ => "stop",
    }
}

/// Everything a Chat Completions answer is made of besides the spec.
pub(crate) struct ChatAnswer<'a> {
    /// `chatcmpl-…`.
    pub(crate) id: &'a str,
    /// The request's model.
    pub(crate) model: &'a str,
    /// Unix seconds.
    pub(crate) created: u64,
    /// The tool call to make, if any.
    pub(crate) tool: Option<&'a ToolCall>,
}

/// The whole `chat.completion` answer of a non-streaming request.
pub(crate) fn completion_json(answer: &ChatAnswer<'_>, spec: &OkSpec) -> Bytes {
    let text = spec.text.repeat(spec.chunks as usize);
    let (content, tool_calls, finish) = match answer.tool {
        Some(call) => (
            None,
            vec![ToolCallJson::whole(call, None, &call.arguments)],
            "tool_calls",
        ),
        None => (
            Some(text.as_str()),
            Vec::new(),
            finish_reason(&spec.stop_reason),
        ),
    };
    to_json(&Completion {
        id: answer.id,
        object: "chat.completion",
        created: answer.created,
        model: answer.model,
        choices: [CompletionChoice {
            index: 0,
            message: AssistantJson {
                role: "assistant",
                content,
                refusal: None,
                tool_calls,
            },
            logprobs: None,
            finish_reason: finish,
        }],
        usage: ChatUsage::from(&spec.usage),
    })
}

#[derive(Serialize, Default)]
struct DeltaJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[ToolCallJson<'a>; 1]>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: DeltaJson<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<ChunkChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<ChatUsage>>,
}

/// `data: <json>\n\n`.
fn data_frame(json: &Bytes) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The end of every OpenAI stream.
const DONE: &[u8] = b"data: [DONE]\n\n";

/// Writes the chunks of one stream.
struct ChunkWriter<'a> {
    answer: &'a ChatAnswer<'a>,
    include_usage: bool,
}

impl ChunkWriter<'_> {
    /// A chunk with one choice (`"usage": null` with `include_usage`).
    fn chunk(&self, delta: DeltaJson<'_>, finish: Option<&'static str>) -> Bytes {
        let choice = ChunkChoice {
            index: 0,
            delta,
            logprobs: None,
            finish_reason: finish,
        };
        self.write(vec![choice], self.include_usage.then_some(None))
    }

    /// The last chunk of a stream with `include_usage`: no choice, the usage.
    fn usage_chunk(&self, usage: &Usage) -> Bytes {
        self.write(Vec::new(), Some(Some(ChatUsage::from(usage))))
    }

    fn write(&self, choices: Vec<ChunkChoice<'_>>, usage: Option<Option<ChatUsage>>) -> Bytes {
        data_frame(&to_json(&Chunk {
            id: self.answer.id,
            object: "chat.completion.chunk",
            created: self.answer.created,
            model: self.answer.model,
            choices,
            usage,
        }))
    }

    /// A tool call's arguments as `pieces` fragments, one chunk each.
    fn tool_fragments(&self, call: &ToolCall, pieces: usize) -> Vec<Bytes> {
        fragments(&call.arguments, pieces)
            .into_iter()
            .map(|arguments| {
                let fragment = ToolCallJson {
                    index: Some(0),
                    id: None,
                    kind: None,
                    function: FunctionJson {
                        name: None,
                        arguments,
                    },
                };
                let delta = DeltaJson {
                    tool_calls: Some([fragment]),
                    ..DeltaJson::default()
                };
                self.chunk(delta, None)
            })
            .collect()
    }
}

impl StreamFrames {
    /// The Chat Completions stream of `spec` (or of the tool call): the role chunk
    /// (and the tool call's first chunk), the deltas, the finish chunk, the usage chunk
    /// when `include_usage`, `data: [DONE]`.
    pub(crate) fn chat(answer: &ChatAnswer<'_>, spec: &OkSpec, include_usage: bool) -> Self {
        let writer = ChunkWriter {
            answer,
            include_usage,
        };
        let role = DeltaJson {
            role: Some("assistant"),
            content: Some(""),
            ..DeltaJson::default()
        };
        let mut head = vec![writer.chunk(role, None)];
        let (deltas, finish) = match answer.tool {
            None => {
                let text = DeltaJson {
                    content: Some(&spec.text),
                    ..DeltaJson::default()
                };
                let deltas = Deltas::Repeat {
                    frame: writer.chunk(text, None),
                    times: spec.chunks as usize,
                };
                (deltas, finish_reason(&spec.stop_reason))
            }
            Some(call) => {
                let first = DeltaJson {
                    tool_calls: Some([ToolCallJson::whole(call, Some(0), "")]),
                    ..DeltaJson::default()
                };
                head.push(writer.chunk(first, None));
                let fragments = writer.tool_fragments(call, spec.chunks as usize);
                (Deltas::Each(fragments), "tool_calls")
            }
        };
        let mut tail = vec![writer.chunk(DeltaJson::default(), Some(finish))];
        if include_usage {
            tail.push(writer.usage_chunk(&spec.usage));
        }
        tail.push(Bytes::from_static(DONE));
        let overloaded = error_body(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded_error",
            "Overloaded",
        );
        StreamFrames::from_parts(head, deltas, tail, data_frame(&overloaded))
    }
}
