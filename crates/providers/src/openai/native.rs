//! What keypool reads from an OpenAI-compatible upstream's own answers, for the native
//! `openai` provider (chat completions passed through): usage from a `chat.completion`
//! body, and what each `chat.completion.chunk` frame of a stream is.
//!
//! Usage maps onto the four Anthropic kinds keypool accounts in: `input_tokens` =
//! `prompt_tokens` − `prompt_tokens_details.cached_tokens`, `cache_read_input_tokens` =
//! the cached tokens, `output_tokens` = `completion_tokens` (no cache writes).

use keypool_core::Usage;
use keypool_sse::Frame;
use serde::Deserialize;

use crate::response::{MAX_UPSTREAM_ERROR_TEXT, UpstreamError, truncate_at_char};

#[derive(Deserialize)]
struct WithUsage {
    usage: Option<ChatUsageIn>,
}

#[derive(Deserialize)]
struct ChatUsageIn {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetailsIn>,
}

#[derive(Deserialize)]
struct PromptDetailsIn {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl From<ChatUsageIn> for Usage {
    fn from(u: ChatUsageIn) -> Self {
        let cached = u
            .prompt_tokens_details
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0)
            .min(u.prompt_tokens);
        Usage {
            input_tokens: u.prompt_tokens - cached,
            output_tokens: u.completion_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: cached,
        }
    }
}

/// The usage of a `chat.completion` body (or of a chunk's JSON), `None` without one.
pub fn usage_from_chat_json(body: &[u8]) -> Option<Usage> {
    let parsed: WithUsage = serde_json::from_slice(body).ok()?;
    parsed.usage.map(Usage::from)
}

/// What one frame of an OpenAI stream is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatFrame {
    /// `data: [DONE]`: the stream is complete.
    Done,
    /// `data: {"error":{…}}`: the upstream failed mid-stream (texts bounded).
    Error(UpstreamError),
    /// A `chat.completion.chunk`.
    Chunk {
        /// Whether it carries content (text, a refusal or a tool call): the first such
        /// chunk is a stream's first content.
        content: bool,
        /// The usage chunk's usage (`stream_options.include_usage`).
        usage: Option<Usage>,
    },
    /// Anything else (comments, keep-alives, unparsable data).
    Other,
}

#[derive(Deserialize)]
struct ChunkIn {
    #[serde(default)]
    choices: Vec<ChoiceIn>,
    usage: Option<ChatUsageIn>,
    error: Option<ErrorIn>,
}

#[derive(Deserialize)]
struct ChoiceIn {
    #[serde(default)]
    delta: Option<DeltaIn>,
}

#[derive(Deserialize)]
struct DeltaIn {
    content: Option<String>,
    refusal: Option<String>,
    tool_calls: Option<Vec<serde_json::Value>>,
}

#[derive(Deserialize)]
struct ErrorIn {
    #[serde(rename = "type")]
    kind: Option<serde_json::Value>,
    message: Option<serde_json::Value>,
}

fn bounded(value: Option<serde_json::Value>) -> Option<String> {
    match value? {
        serde_json::Value::String(text) => Some(truncate_at_char(text, MAX_UPSTREAM_ERROR_TEXT)),
        _ => None,
    }
}

/// Classifies one frame of an OpenAI-compatible stream.
pub fn classify_chat_frame(frame: &Frame) -> ChatFrame {
    let Some(data) = frame.data() else {
        return ChatFrame::Other;
    };
    if data.trim_ascii() == b"[DONE]" {
        return ChatFrame::Done;
    }
    let Ok(chunk) = serde_json::from_slice::<ChunkIn>(&data) else {
        return ChatFrame::Other;
    };
    if let Some(error) = chunk.error {
        return ChatFrame::Error(UpstreamError {
            error_type: bounded(error.kind),
            message: bounded(error.message),
        });
    }
    let content = chunk
        .choices
        .iter()
        .filter_map(|c| c.delta.as_ref())
        .any(|d| {
            d.content.as_deref().is_some_and(|t| !t.is_empty())
                || d.refusal.as_deref().is_some_and(|t| !t.is_empty())
                || d.tool_calls.as_ref().is_some_and(|calls| !calls.is_empty())
        });
    ChatFrame::Chunk {
        content,
        usage: chunk.usage.map(Usage::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keypool_sse::decode_all;

    fn one(text: &str) -> ChatFrame {
        classify_chat_frame(&decode_all(text.as_bytes()).unwrap()[0])
    }

    #[test]
    fn usage_splits_cached_prompt_tokens() {
        let body = br#"{"id":"x","usage":{"prompt_tokens":100,"completion_tokens":7,"total_tokens":107,"prompt_tokens_details":{"cached_tokens":60}}}"#;
        assert_eq!(
            usage_from_chat_json(body),
            Some(Usage {
                input_tokens: 40,
                output_tokens: 7,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 60,
            })
        );
        let plain = br#"{"usage":{"prompt_tokens":5,"completion_tokens":1}}"#;
        assert_eq!(usage_from_chat_json(plain).map(|u| u.input_tokens), Some(5));
        assert_eq!(usage_from_chat_json(br#"{"usage":null}"#), None);
        assert_eq!(usage_from_chat_json(b"nope"), None);
    }

    #[test]
    fn frames_are_classified() {
        assert_eq!(one("data: [DONE]\n\n"), ChatFrame::Done);
        assert_eq!(one(": keep-alive\n\n"), ChatFrame::Other);
        assert_eq!(one("data: {oops\n\n"), ChatFrame::Other);
        let role = r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        assert_eq!(
            one(&format!("{role}\n\n")),
            ChatFrame::Chunk {
                content: false,
                usage: None
            }
        );
        let text = r#"data: {"choices":[{"index":0,"delta":{"content":"Hi"}}],"usage":null}"#;
        assert!(matches!(
            one(&format!("{text}\n\n")),
            ChatFrame::Chunk { content: true, .. }
        ));
        let tool = r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c"}]}}]}"#;
        assert!(matches!(
            one(&format!("{tool}\n\n")),
            ChatFrame::Chunk { content: true, .. }
        ));
        let usage = r#"data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#;
        assert!(matches!(
            one(&format!("{usage}\n\n")),
            ChatFrame::Chunk { content: false, usage: Some(u) } if u.output_tokens == 2
        ));
        let error = format!(
            "data: {{\"error\":{{\"type\":\"server_error\",\"message\":\"{}\"}}}}\n\n",
            "x".repeat(5000)
        );
        let ChatFrame::Error(e) = one(&error) else {
            panic!("not an error")
        };
        assert_eq!(e.error_type.as_deref(), Some("server_error"));
        assert_eq!(e.message.map(|m| m.len()), Some(MAX_UPSTREAM_ERROR_TEXT));
    }
}
