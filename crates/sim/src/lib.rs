//! A simulated Anthropic upstream speaking the real wire format, shared by tests,
//! benchmarks and the demo.
//!
//! keypool's behaviour is all about what upstream accounts do: answer, rate-limit,
//! reject a key, stall, reset, break a stream. This crate is the one upstream every test,
//! benchmark and the demo talks to, so that nobody writes a second mock.
//!
//! - It serves `POST …/v1/messages` and `POST …/v1/messages/count_tokens` (any query
//!   string) over HTTP/1.1 on loopback: JSON messages with `usage`, `{"input_tokens":N}`,
//!   and streams with the real event sequence and framing (`message_start`,
//!   `content_block_start`, `ping`, `content_block_delta`…, `content_block_stop`,
//!   `message_delta`, `message_stop`), `request-id` headers and Anthropic error bodies.
//! - It speaks OpenAI's Chat Completions too: `POST …/v1/chat/completions` (JSON or
//!   `chat.completion.chunk` streams, the usage chunk with
//!   `stream_options.include_usage`) and `GET …/v1/models`, with bearer auth, OpenAI
//!   error bodies and scriptable `x-ratelimit-*` headers ([`OpenAiRateLimitHeaders`]).
//! - A request offering tools whose last message is the user's gets a call of a tool
//!   (both wire formats); the next one, carrying the tool's result, gets text
//!   ([`OkSpec::tool_calls`] turns this off).
//! - Each account is identified by the credential it receives (`x-api-key` or
//!   `Authorization: Bearer`) and follows a [`Script`]: a sequence of [`Behaviour`]s
//!   consumed one per request, then a default. Scripts can change at runtime.
//! - It records every request (bounded) and counts, per account, requests, finished
//!   ones, ones the client cancelled, and concurrency.
//! - Delays use `tokio::time`, so tests with paused time run instantly.
//!
//! ```
//! use keypool_sim::{Behaviour, ErrorReply, Script, Sim, SimConfig};
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let sim = Sim::start(
//!     SimConfig::new()
//!         .account("a", "sk-ant-api03-test-a", Script::ok().then(ErrorReply::rate_limited().retry_after_secs(30)))
//!         .account("b", "sk-ant-oat01-test-b", Script::new(Behaviour::status(529))),
//! )
//! .await
//! .unwrap();
//! assert!(sim.base_url().starts_with("http://127.0.0.1:"));
//! // Tests flip an account at runtime:
//! sim.set_default("b", Behaviour::status(401)).unwrap();
//! assert_eq!(sim.stats("a").unwrap().requests, 0);
//! assert!(sim.requests_containing(b"sk-lb-").is_empty());
//! sim.shutdown().await;
//! # });
//! ```
//!
//! The standalone program `keypool-sim` (`src/bin/keypool-sim.rs`) serves any
//! credential with one fixed script, for benchmarks: `--listen`, `--delay-ms`,
//! `--chunks`, `--chunk-interval-ms`, `--input-tokens`, `--threads`, and
//! `--rate-limited CREDENTIAL` / `--retry-after-ms` for an account that always answers 429.
//!
//! # Layout
//! - `script`: [`Behaviour`], [`OkSpec`], [`Delay`], [`ErrorReply`], [`UnifiedHeaders`],
//!   [`Script`]: what an account does.
//! - `wire`: the Anthropic wire format (JSON bodies, error bodies, SSE frames).
//! - `openai`: the Chat Completions wire format, [`OpenAiRateLimitHeaders`], [`SIM_MODELS`].
//! - `frames`: the frames of one stream, whatever the wire format.
//! - `tools`: when a request gets a tool call, and its arguments.
//! - `accounts`: credential → account, script state, counters ([`AccountStats`]).
//! - `recorder`: the bounded request log ([`RecordedRequest`]).
//! - `body`: the response body state machine (paced frames, stalls, cuts).
//! - `server`: [`Sim`], [`SimConfig`], [`SimHandle`], the hyper accept loop and handler.
//! - `oauth`: the token endpoint (`POST …/v1/oauth/token`, rotating refresh tokens)
//!   and access tokens that expire ([`IssuedTokens`], [`OAuthStats`]).
//! - `error`: [`SimError`].

mod accounts;
mod body;
mod error;
mod frames;
pub mod oauth;
mod openai;
mod recorder;
mod script;
mod server;
mod tools;
pub mod wire;

pub use accounts::{ANY_CREDENTIAL, AccountStats, SimAccount};
pub use error::SimError;
pub use oauth::{IssuedTokens, OAuthStats};
pub use openai::{OpenAiRateLimitHeaders, SIM_MODELS};
pub use recorder::RecordedRequest;
pub use script::{
    Behaviour, Cut, Delay, ErrorReply, OkSpec, Script, UnifiedHeaders, Usage, WindowReading,
};
pub use server::{Sim, SimConfig, SimHandle};
