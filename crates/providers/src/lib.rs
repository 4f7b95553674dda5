//! Provider adapters: everything keypool knows about the upstream wire format, as pure
//! functions over `http` types and bytes (no HTTP client, no runtime, no clock).
//!
//! The proxy calls this crate at each step of an attempt (SPEC 3.4, 3.6, 3.8, 8):
//! 1. [`inspect_request`] reads `model` and `stream` from the client's body (a `400`
//!    when it cannot), and [`override_model`] splices an account's model into it;
//! 2. [`build_upstream_head`] turns the client's head into the upstream one through an
//!    allowlist, adding the account's credential;
//! 3. [`rate_limits_of`] / [`response_meta`] read every response's rate-limit headers
//!    (into `keypool-cooldown`'s neutral [`RateLimitInfo`]), usage and error; [`StreamUsage`] reads usage
//!    from stream frames;
//! 4. [`CommitGate`] decides frame by frame when a stream may be committed;
//! 5. [`sanitise`] writes keypool's own Anthropic-shaped error bodies.
//!
//! [`openai`] translates OpenAI Chat Completions requests, answers, streams and errors
//! to and from the Messages API, and reads OpenAI-compatible rate-limit headers.
//!
//! ```
//! use http::{HeaderMap, Uri};
//! use keypool_core::{AuthType, Provider};
//! use keypool_providers::{Endpoint, UpstreamAccount, build_upstream_head, inspect_request, override_model};
//!
//! let body = br#"{"model":"claude-3-5-haiku","stream":true,"messages":[]}"#;
//! let info = inspect_request(body)?;
//! assert!(info.stream);
//! let body = override_model(body, "claude-sonnet-4-5")?;
//! assert_eq!(&body[..], br#"{"model":"claude-sonnet-4-5","stream":true,"messages":[]}"#);
//!
//! let mut client = HeaderMap::new();
//! client.insert("x-api-key", "sk-lb-0123456789abcdef0123456789abcdef".parse().unwrap());
//! client.insert("anthropic-beta", "claude-code-20250219".parse().unwrap());
//! let account = UpstreamAccount {
//!     provider: Provider::Anthropic,
//!     auth: AuthType::OAuth,
//!     secret: "sk-ant-oat01-example",
//!     base_url: None,
//! };
//! let uri: Uri = "/acme/team/v1/messages?beta=true".parse().unwrap();
//! let head = build_upstream_head(&uri, &client, Endpoint::Messages, &account)?;
//! assert_eq!(head.uri, "https://api.anthropic.com/v1/messages?beta=true");
//! assert_eq!(
//!     head.headers.get_str("anthropic-beta"),
//!     Some("claude-code-20250219,oauth-2025-04-20")
//! );
//! assert!(!head.headers.contains_key("x-api-key"));
//! # Ok::<(), keypool_providers::ProvidersError>(())
//! ```
//!
//! # Layout
//! - [`anthropic`]: the `anthropic-ratelimit-*`, `retry-after` and `retry-after-ms`
//!   headers read into [`RateLimitInfo`], every reset bounded.
//! - [`upstream`]: the upstream request head (allowlist, auth, beta merge, URI).
//! - [`request_body`]: [`inspect_request`] and the splicing [`override_model`].
//! - [`response`]: rate limits, usage (JSON bodies and SSE frames), upstream errors.
//! - `answer_scan`: the allocation-free reader behind [`check_answer_body`].
//! - `request_scan`: the single-pass reader behind [`inspect_request`].
//! - `json_scan`: the JSON reading both share, giving serde_json's verdicts.
//! - [`stream_start`]: [`is_valid_first_frame`] and the [`CommitGate`] of SPEC 3.8.
//! - [`sanitise`]: keypool's Anthropic-shaped error bodies and the 429/402 pass-through.
//! - [`openai`]: the Chat Completions ↔ Messages translation, `x-ratelimit-*` headers.
//! - [`wire`]: [`StreamWire`], what a stream frame means in each wire format (error,
//!   end, content), so the proxy names no provider's events.
//! - [`error`]: [`ProvidersError`], the crate's one error type.

mod answer_scan;
pub mod anthropic;
pub mod error;
mod json_scan;
pub mod openai;
pub mod request_body;
mod request_scan;
pub mod response;
pub mod sanitise;
pub mod stream_start;
pub mod upstream;
pub mod wire;

pub use error::ProvidersError;
pub use keypool_cooldown::facts::RateLimitInfo;
pub use keypool_core::StreamCommit;
pub use request_body::{RequestInfo, inspect_request, override_model};
pub use response::{
    AnswerProblem, HeaderLines, ResponseMeta, StreamUsage, UpstreamError, Usage, UsageUpdate,
    check_answer_body, check_answer_head, header_text, rate_limits, rate_limits_of, response_meta,
    stream_error, upstream_error, usage_from_frame, usage_from_json_body,
};
pub use sanitise::{ErrorType, error_body, overloaded_body, passthrough_body};
pub use stream_start::{CommitGate, StartFailure, Verdict, is_valid_first_frame};
pub use upstream::{
    Endpoint, UpstreamAccount, UpstreamHead, UpstreamHeaders, build_upstream_head, validate_account,
};
pub use wire::{FrameRole, StreamWire, generic_error_frame, upstream_request_id};
