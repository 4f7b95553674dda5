//! OpenAI Chat Completions clients on Anthropic accounts: the translation both ways,
//! as pure functions over bytes and `serde_json` (issue 23); and for OpenAI-compatible
//! upstreams, their rate-limit headers, usage and stream frames.
//!
//! What the proxy calls on a `POST …/v1/chat/completions` to an Anthropic account:
//! 1. [`chat_to_messages`] on the client's body: a Messages API body (then the usual
//!    [`inspect_request`](crate::inspect_request) / [`override_model`](crate::override_model))
//!    plus `stream` and `include_usage`; a client error answers `400` with
//!    [`invalid_request_body`];
//! 2. a JSON answer: [`message_to_chat_completion`] with the time (`created`, unix
//!    seconds);
//! 3. a stream: one [`ChatStream`] per answer, fed every upstream frame
//!    ([`ChatStream::on_frame`]) once the head is committed, [`ChatStream::finish`] at
//!    the end of the upstream body; a stream that fails after the head got
//!    [`overloaded_error_frame`] instead of the Anthropic one;
//! 4. every error keypool answers (its own, and the bounded pass-through): the
//!    Anthropic-shaped body it would send, through [`error_from_anthropic`];
//! 5. `GET …/v1/models`: [`models_body`].
//!
//! ```
//! use keypool_providers::openai::{ChatStreamOptions, chat_to_messages, message_to_chat_completion, translate_stream};
//!
//! let chat = br#"{"model":"claude-sonnet-4-5","messages":[
//!     {"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}"#;
//! let request = chat_to_messages(chat)?;
//! let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
//! assert_eq!(body["system"][0]["text"], "Be brief.");
//! assert_eq!(body["max_tokens"], 4096);
//!
//! let answer = br#"{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5",
//!     "content":[{"type":"text","text":"Hello!"}],"stop_reason":"end_turn",
//!     "usage":{"input_tokens":9,"output_tokens":3}}"#;
//! let completion: serde_json::Value =
//!     serde_json::from_slice(&message_to_chat_completion(answer, 1_700_000_000)?).unwrap();
//! assert_eq!(completion["id"], "chatcmpl-01");
//! assert_eq!(completion["choices"][0]["message"]["content"], "Hello!");
//! assert_eq!(completion["usage"]["total_tokens"], 12);
//!
//! let upstream = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"model\":\"m\",\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n\
//!     event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
//! let chunks = translate_stream(upstream, ChatStreamOptions { created: 1, include_usage: false });
//! assert!(chunks.ends_with(b"data: [DONE]\n\n"));
//! # Ok::<(), keypool_providers::ProvidersError>(())
//! ```
//!
//! # Layout
//! - [`request`]: [`chat_to_messages`] and its table.
//! - [`response`]: [`message_to_chat_completion`], [`finish_reason`], [`completion_id`].
//! - [`stream`]: [`ChatStream`], the incremental stream translator.
//! - [`errors`]: the OpenAI error shape and the Anthropic → OpenAI error table.
//! - [`models`]: the model list, [`models_body`].
//! - [`rate_limit`]: [`OpenAiRateLimits`], the `x-ratelimit-*` headers.
//! - [`native`]: usage and frame kinds of an OpenAI-compatible upstream's own answers
//!   (the native `openai` provider).

pub mod errors;
pub mod models;
pub mod native;
pub mod rate_limit;
pub mod request;
pub mod response;
pub mod stream;

pub use errors::{
    error_body, error_frame, error_from_anthropic, invalid_request_body, openai_error_kind,
    overloaded_error_frame,
};
pub use models::{CLAUDE_MODEL_IDS, models_body};
pub use native::{ChatFrame, classify_chat_frame, usage_from_chat_json};
pub use rate_limit::{LimitReading, OpenAiRateLimits, parse_duration_ms};
pub use request::{ChatRequest, DEFAULT_MAX_TOKENS, chat_to_messages};
pub use response::{completion_id, finish_reason, message_to_chat_completion};
pub use stream::{ChatStream, ChatStreamOptions, DONE_FRAME, translate_stream};
