//! An Anthropic message (the JSON answer of a non-streaming request) turned into an
//! OpenAI `chat.completion`.
//!
//! - `id`: `chatcmpl-` and the message id without its `msg_` prefix
//!   ([`completion_id`]); `created` is an argument (this crate reads no clock);
//!   `model` is the message's.
//! - `choices[0].message.content`: the text blocks joined (`null` when there is none and
//!   the message calls tools); `tool_use` blocks become `tool_calls` with `arguments`
//!   the JSON text of `input`; `thinking` blocks are left out.
//! - `finish_reason`: [`finish_reason`].
//! - `usage`: `prompt_tokens` = input + cache read + cache creation tokens,
//!   `completion_tokens` = output tokens, `prompt_tokens_details.cached_tokens` = cache
//!   read tokens.

use bytes::Bytes;
use keypool_core::Usage;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ProvidersError;
use crate::response::UsageUpdate;

/// The OpenAI id of a completion answered by Anthropic message `message_id`.
pub fn completion_id(message_id: &str) -> String {
    format!(
        "chatcmpl-{}",
        message_id.strip_prefix("msg_").unwrap_or(message_id)
    )
}

/// The OpenAI `finish_reason` of an Anthropic `stop_reason`:
///
/// | Anthropic | OpenAI |
/// | --- | --- |
/// | `end_turn`, `stop_sequence`, `pause_turn`, none | `stop` |
/// | `max_tokens`, `model_context_window_exceeded` | `length` |
/// | `tool_use` | `tool_calls` |
/// | `refusal` | `content_filter` |
/// | anything else | `stop` |
pub fn finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("max_tokens" | "model_context_window_exceeded") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        _ => "stop",
    }
}

#[derive(Deserialize)]
struct Message {
    id: String,
    #[serde(default)]
    model: String,
    #[serde(default)]
    content: Vec<Value>,
    stop_reason: Option<String>,
    #[serde(default)]
    usage: UsageUpdate,
}

/// The OpenAI `usage` object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct ChatUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    prompt_tokens_details: PromptDetails,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
struct PromptDetails {
    cached_tokens: u64,
}

impl From<&Usage> for ChatUsage {
    fn from(usage: &Usage) -> Self {
        let prompt = usage
            .input_tokens
            .saturating_add(usage.cache_read_input_tokens)
            .saturating_add(usage.cache_creation_input_tokens);
        Self {
            prompt_tokens: prompt,
            completion_tokens: usage.output_tokens,
            total_tokens: prompt.saturating_add(usage.output_tokens),
            prompt_tokens_details: PromptDetails {
                cached_tokens: usage.cache_read_input_tokens,
            },
        }
    }
}

/// One OpenAI tool call, complete (`message.tool_calls[i]`) or as a stream fragment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ToolCall<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) index: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<&'static str>,
    pub(crate) function: FunctionCall<'a>,
}

/// `function` of a tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct FunctionCall<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<&'a str>,
    pub(crate) arguments: &'a str,
}

#[derive(Serialize)]
struct Completion<'a> {
    id: String,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [Choice<'a>; 1],
    usage: ChatUsage,
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    message: AssistantMessage<'a>,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct AssistantMessage<'a> {
    role: &'static str,
    content: Option<String>,
    refusal: Option<()>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<ToolCall<'a>>,
}

/// Translates an Anthropic message body into an OpenAI `chat.completion` body.
/// `created` is the completion's time, unix seconds.
///
/// # Errors
/// [`ProvidersError::UntranslatableAnswer`] when the body is not a JSON message object
/// (no `id`) or a `tool_use` block lacks its `id` or `name`.
pub fn message_to_chat_completion(body: &[u8], created: u64) -> Result<Bytes, ProvidersError> {
    let message: Message =
        serde_json::from_slice(body).map_err(|e| ProvidersError::UntranslatableAnswer {
            reason: e.to_string(),
        })?;
    let mut text: Option<String> = None;
    let mut arguments = Vec::new();
    let mut calls = Vec::new();
    for block in &message.content {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                let piece = block.get("text").and_then(Value::as_str).unwrap_or("");
                text.get_or_insert_with(String::new).push_str(piece);
            }
            Some("tool_use") => {
                let field = |name: &str| {
                    block.get(name).and_then(Value::as_str).ok_or_else(|| {
                        ProvidersError::UntranslatableAnswer {
                            reason: format!("a tool_use block has no {name}"),
                        }
                    })
                };
                calls.push((field("id")?, field("name")?));
                let input = block.get("input").cloned().unwrap_or(Value::Null);
                let input = if input.is_null() {
                    Value::Object(Default::default())
                } else {
                    input
                };
                arguments.push(input.to_string());
            }
            _ => {}
        }
    }
    if text.is_none() && calls.is_empty() {
        text = Some(String::new());
    }
    let tool_calls = calls
        .iter()
        .zip(&arguments)
        .map(|((id, name), arguments)| ToolCall {
            index: None,
            id: Some(id),
            kind: Some("function"),
            function: FunctionCall {
                name: Some(name),
                arguments,
            },
        })
        .collect();
    let mut usage = Usage::default();
    message.usage.apply_to(&mut usage);
    let completion = Completion {
        id: completion_id(&message.id),
        object: "chat.completion",
        created,
        model: &message.model,
        choices: [Choice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content: text,
                refusal: None,
                tool_calls,
            },
            logprobs: None,
            finish_reason: finish_reason(message.stop_reason.as_deref()),
        }],
        usage: ChatUsage::from(&usage),
    };
    serde_json::to_vec(&completion)
        .map(Bytes::from)
        .map_err(|e| ProvidersError::UntranslatableAnswer {
            reason: e.to_string(),
        })
}
