//! One request's facts, written when it ends: its usage record (SPEC 11, for every
//! authenticated request) and its one log line (SPEC 10). Neither ever holds a secret
//! or an LB key: callers are named by key id.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use keypool_core::{AccountId, Strategy, Usage};
use keypool_ledger::{AttemptRecord, CallerKind, CallerRef, CostBasis, UsageRecord, Usd};
use keypool_store::now_ms;
use keypool_store::resolve::Caller;

use crate::App;

/// Gathers a request's facts; when dropped (at the end of the handler, or at the end
/// of a committed stream) it adds the request's usage record to the ledger (when the
/// request was authenticated) and writes its log line.
#[derive(Debug)]
pub(crate) struct RequestLog {
    pub request_id: Arc<str>,
    /// When the request arrived, unix ms.
    pub at: u64,
    pub org: Option<Arc<str>>,
    pub url: Option<Arc<str>>,
    pub caller: Option<Caller>,
    /// Where the usage record goes: set once the caller is authenticated.
    pub ledger: Option<App>,
    pub strategy: Option<Strategy>,
    pub count_tokens: bool,
    pub stream: bool,
    /// The model the body asked for.
    pub model: Option<Arc<str>>,
    /// The model sent upstream by the attempt that served.
    pub model_sent: Option<Arc<str>>,
    pub attempts: Vec<AttemptRecord>,
    pub served_by: Option<AccountId>,
    /// Whether the serving account is a subscription (OAuth) account.
    pub served_by_oauth: bool,
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
            at: now_ms(),
            org: None,
            url: None,
            caller: None,
            ledger: None,
            strategy: None,
            count_tokens: false,
            stream: false,
            model: None,
            model_sent: None,
            attempts: Vec::new(),
            served_by: None,
            served_by_oauth: false,
            upstream_request_id: None,
            status: 0,
            ttft_ms: None,
            usage: None,
            stream_end: None,
            started,
        }
    }

    /// The usage record of this request, priced with `app`'s price table; `None`
    /// before the caller was authenticated.
    fn record(&mut self, app: &App, total_ms: u64) -> Option<UsageRecord> {
        let (kind, id) = match self.caller.as_ref()? {
            Caller::User(id) => (CallerKind::User, id.clone()),
            Caller::Client(id) => (CallerKind::Client, id.clone()),
        };
        let usage = self.usage.unwrap_or_default();
        let model = self.model_sent.as_ref().or(self.model.as_ref());
        let price = model.and_then(|m| app.store().config().prices().cost(m, &usage));
        let (cost, basis) = match price {
            None => (0, CostBasis::Unpriced),
            Some(cost) if self.served_by_oauth => (cost, CostBasis::ListPriceEquivalent),
            Some(cost) => (cost, CostBasis::Api),
        };
        Some(UsageRecord {
            request_id: self.request_id.clone(),
            at: self.at,
            org: self.org.clone()?,
            url: self.url.clone()?,
            caller: CallerRef { kind, id },
            endpoint: Cow::Borrowed(if self.count_tokens {
                "count_tokens"
            } else {
                "messages"
            }),
            model: self.model.clone(),
            model_sent: self.model_sent.clone(),
            stream: self.stream,
            status: self.status,
            account: self.served_by.clone(),
            attempts: std::mem::take(&mut self.attempts),
            usage,
            cost_nano_usd: cost,
            cost_basis: basis,
            ttft_ms: self.ttft_ms,
            total_ms,
            stream_end: self.stream_end.map(Cow::Borrowed),
        })
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

/// The `n`th attempt's account, upstream status, outcome and time, as separate log
/// fields (absent when there was no such attempt).
fn nth(
    attempts: &[AttemptRecord],
    n: usize,
) -> (Option<&str>, Option<u16>, Option<&str>, Option<u64>) {
    match attempts.get(n) {
        Some(a) => (
            Some(a.account.as_str()),
            a.status,
            Some(&a.outcome),
            Some(a.ms),
        ),
        None => (None, None, None, None),
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        let duration_ms = self.started.elapsed().as_millis() as u64;
        let ledger = self.ledger.take();
        let record = ledger
            .as_ref()
            .and_then(|app| Some((app, self.record(app, duration_ms)?)));
        let cost = record.as_ref().map(|(_, r)| r.cost_nano_usd);
        let usage = self.usage.unwrap_or_default();
        // The record took the attempts (without a record they are still here).
        let attempts = record
            .as_ref()
            .map_or(&self.attempts[..], |(_, r)| &r.attempts);
        let (a1, s1, o1, m1) = nth(attempts, 0);
        let (a2, s2, o2, m2) = nth(attempts, 1);
        let (a3, s3, o3, m3) = nth(attempts, 2);
        tracing::info!(
            target: "keypool::request",
            request_id = %self.request_id,
            org = self.org.as_deref().unwrap_or("-"),
            url = self.url.as_deref().unwrap_or("-"),
            caller = %self.caller.as_ref().map(CallerId).map_or_else(|| "-".to_owned(), |c| c.to_string()),
            strategy = self.strategy.map_or("-", Strategy::as_str),
            count_tokens = self.count_tokens,
            stream = self.stream,
            model = self.model.as_deref(),
            // Only when an account's `model` override changed it.
            model_sent = self.model_sent.as_deref().filter(|m| Some(*m) != self.model.as_deref()),
            attempt_count = attempts.len(),
            attempt1_account = a1,
            attempt1_status = s1,
            attempt1_outcome = o1,
            attempt1_ms = m1,
            attempt2_account = a2,
            attempt2_status = s2,
            attempt2_outcome = o2,
            attempt2_ms = m2,
            attempt3_account = a3,
            attempt3_status = s3,
            attempt3_outcome = o3,
            attempt3_ms = m3,
            served_by = self.served_by.as_ref().map_or("-", AccountId::as_str),
            upstream_request_id = self.upstream_request_id.as_deref().unwrap_or("-"),
            status = self.status,
            stream_end = self.stream_end.unwrap_or("-"),
            ttft_ms = self.ttft_ms,
            duration_ms,
            input_tokens = usage.input_tokens,
            output_tokens = usage.output_tokens,
            cache_creation_input_tokens = usage.cache_creation_input_tokens,
            cache_read_input_tokens = usage.cache_read_input_tokens,
            cost_usd = cost.map(|c| tracing::field::display(Usd(c))),
            "request"
        );
        if let Some((app, record)) = record {
            app.metrics().usage(&record);
            app.store().record_usage(record);
        }
    }
}
