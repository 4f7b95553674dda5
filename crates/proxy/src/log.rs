//! The one log line per request (SPEC 10): request id, org, URL config, caller id,
//! strategy, every attempt with its account id and outcome, final status, TTFT and
//! duration. It never holds a secret or an LB key: callers are named by key id.

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
    pub attempts: Vec<(AccountId, &'static str)>,
    pub served_by: Option<AccountId>,
    pub upstream_request_id: Option<String>,
    pub status: u16,
    pub ttft_ms: Option<u64>,
    pub usage: Option<Usage>,
    pub stream_end: Option<&'static str>,
    pub started: Instant,
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
        }
    }
}

struct Attempts<'a>(&'a [(AccountId, &'static str)]);

impl std::fmt::Display for Attempts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (account, outcome)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{account}:{outcome}")?;
        }
        Ok(())
    }
}

struct CallerId<'a>(&'a Caller);

impl std::fmt::Display for CallerId<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Caller::User(id) => write!(f, "user_api_key_id={id}"),
            Caller::Client(id) => write!(f, "client_api_key_id={id}"),
        }
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
            caller = %self.caller.as_ref().map(CallerId).map_or_else(|| "-".to_owned(), |c| c.to_string()),
            strategy = self.strategy.map_or("-", Strategy::as_str),
            count_tokens = self.count_tokens,
            stream = self.stream,
            attempts = %Attempts(&self.attempts),
            served_by = self.served_by.as_ref().map_or("-", AccountId::as_str),
            upstream_request_id = self.upstream_request_id.as_deref().unwrap_or("-"),
            status = self.status,
            stream_end = self.stream_end.unwrap_or("-"),
            ttft_ms = self.ttft_ms,
            duration_ms,
            input_tokens = usage.input_tokens,
            output_tokens = usage.output_tokens,
            "request"
        );
    }
}
