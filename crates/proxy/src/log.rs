//! The one log line per request (SPEC 10): request id, org, URL config, caller id,
//! strategy, every attempt with its account id, outcome and upstream status, final
//! status, TTFT and duration, the client's address and user agent. It never holds a
//! secret or an LB key: callers are named by key id, and a user agent that carries
//! `sk-` is not logged.
//!
//! The caller is two fields (`user_api_key_id` or `client_api_key_id`), and
//! `attempts` and `upstream_statuses` are JSON arrays written as the fields' text
//! ([`JSON_FIELDS`]): the binary's JSON log format embeds them as arrays, the plain
//! format shows the same text.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use keypool_core::{AccountId, Strategy};
use keypool_providers::Usage;
use keypool_store::resolve::Caller;

/// Gathers a request's facts and writes them as one `tracing` event when dropped (at the
/// end of the handler, or at the end of a committed stream).
#[derive(Debug)]
pub(crate) struct RequestLog {
    pub request_id: Arc<str>,
    pub org: Option<Arc<str>>,
    pub url: Option<Arc<str>>,
    pub caller: Option<Caller>,
    pub strategy: Option<Strategy>,
    pub count_tokens: bool,
    pub stream: bool,
    pub attempts: Vec<(AccountId, &'static str, Option<u16>)>,
    pub served_by: Option<AccountId>,
    pub upstream_request_id: Option<String>,
    pub status: u16,
    pub ttft_ms: Option<u64>,
    pub usage: Option<Usage>,
    pub stream_end: Option<&'static str>,
    pub started: Instant,
    pub client: Option<SocketAddr>,
    pub user_agent: Option<String>,
}

/// The fields of the request line whose text is a JSON value (an array): a JSON log
/// format writes them as JSON, not as strings.
pub const JSON_FIELDS: [&str; 2] = ["attempts", "upstream_statuses"];

/// The longest user agent logged (longer ones are cut at a character boundary).
const MAX_USER_AGENT: usize = 256;

/// The user agent as logged: at most [`MAX_USER_AGENT`] bytes, and none at all when it
/// holds something that looks like a key (`sk-`), which a log must never show.
pub(crate) fn loggable_user_agent(value: &str) -> Option<String> {
    if value.contains("sk-") {
        return Some("[redacted]".to_owned());
    }
    let mut end = value.len().min(MAX_USER_AGENT);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    Some(value[..end].to_owned())
}

impl RequestLog {
    pub fn new(request_id: Arc<str>, started: Instant) -> Self {
        Self {
            request_id,
            org: None,
            url: None,
            caller: None,
            strategy: None,
            count_tokens: false,
            stream: false,
            attempts: Vec::new(),
            served_by: None,
            upstream_request_id: None,
            status: 0,
            ttft_ms: None,
            usage: None,
            stream_end: None,
            started,
            client: None,
            user_agent: None,
        }
    }
}

type AttemptRow = (AccountId, &'static str, Option<u16>);

/// `[{"account":"a","outcome":"timeout","status":null},…]`.
struct Attempts<'a>(&'a [AttemptRow]);

impl std::fmt::Display for Attempts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rows: Vec<serde_json::Value> = self
            .0
            .iter()
            .map(|(account, outcome, status)| {
                serde_json::json!({"account": account.as_str(), "outcome": outcome, "status": status})
            })
            .collect();
        write!(f, "{}", serde_json::Value::Array(rows))
    }
}

/// `[429,200]`: the status of every attempt that got an upstream answer, in order.
struct Statuses<'a>(&'a [AttemptRow]);

impl std::fmt::Display for Statuses<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[")?;
        let mut first = true;
        for status in self.0.iter().filter_map(|row| row.2) {
            if !std::mem::take(&mut first) {
                f.write_str(",")?;
            }
            write!(f, "{status}")?;
        }
        f.write_str("]")
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        let duration_ms = self.started.elapsed().as_millis() as u64;
        let usage = self.usage.unwrap_or_default();
        tracing::info!(
            target: "keypool::request",
            request_id = %self.request_id,
            org = self.org.as_deref().unwrap_or("-"),
            url = self.url.as_deref().unwrap_or("-"),
            user_api_key_id = self.caller.as_ref().and_then(Caller::user_api_key_id),
            client_api_key_id = self.caller.as_ref().and_then(Caller::client_api_key_id),
            strategy = self.strategy.map_or("-", Strategy::as_str),
            count_tokens = self.count_tokens,
            stream = self.stream,
            attempts = %Attempts(&self.attempts),
            upstream_statuses = %Statuses(&self.attempts),
            served_by = self.served_by.as_ref().map_or("-", AccountId::as_str),
            upstream_request_id = self.upstream_request_id.as_deref().unwrap_or("-"),
            status = self.status,
            stream_end = self.stream_end.unwrap_or("-"),
            ttft_ms = self.ttft_ms,
            duration_ms,
            input_tokens = usage.input_tokens,
            output_tokens = usage.output_tokens,
            client = self.client.map(tracing::field::display),
            user_agent = self.user_agent.as_deref(),
            "request"
        );
    }
}
