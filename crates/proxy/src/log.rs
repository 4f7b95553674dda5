//! One request's facts, written when it ends: its usage record (SPEC 11, for every
//! authenticated request) and its one log line (SPEC 10): request id, org, URL config,
//! caller id, strategy, model, every attempt with its account, upstream status,
//! outcome, class and time, final status, TTFT and duration, the four token counts and
//! the cost, the client's address and user agent. Neither ever holds a secret or an LB
//! key: callers are named by key id, and a user agent that carries `sk-` is not logged.
//!
//! The caller is two fields (`user_api_key_id` or `client_api_key_id`), and
//! `attempts` and `upstream_statuses` are JSON arrays written as the fields' text
//! ([`JSON_FIELDS`]): the binary's JSON log format embeds them as arrays, the plain
//! format shows the same text.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use keypool_core::{AccountId, Strategy, Usage};
use keypool_ledger::{
    AttemptRecord, CallerKind, CallerRef, CostBasis, LimitKind, Prices, Spend, UsageRecord,
};
use keypool_store::limits::LimitGuard;
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
    pub client: Option<SocketAddr>,
    pub user_agent: Option<String>,
    /// What the caller's limits hold for this request, settled to its real spend
    /// when the record is written.
    pub limit_guard: Option<LimitGuard>,
    /// The caller limit that refused it.
    pub limit: Option<LimitKind>,
    /// The prices of `model` when the limit check looked them up (`Some(None)`: it
    /// has none), so that the record does not look them up again.
    pub asked_prices: Option<Option<Prices>>,
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
            client: None,
            user_agent: None,
            limit_guard: None,
            limit: None,
            asked_prices: None,
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
        let price = match self.asked_prices {
            // Sent as asked: the prices the limit check found.
            Some(prices) if self.model_sent.is_none() || self.model_sent == self.model => {
                prices.map(|p| p.cost(&usage))
            }
            _ => model.and_then(|m| app.store().config().prices().cost(m, &usage)),
        };
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
            limit: self.limit,
        })
    }
}

/// Writes `n` in decimal without the formatting machinery (the request line writes a
/// dozen numbers per request; the binary's log formatters share it).
///
/// # Errors
/// What `out` answers.
pub fn write_u64(out: &mut impl std::fmt::Write, mut n: u64) -> std::fmt::Result {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    out.write_str(std::str::from_utf8(&buf[i..]).map_err(|_| std::fmt::Error)?)
}

/// `"text"` as a JSON string (the whole text at once when nothing needs escaping).
fn json_string(f: &mut std::fmt::Formatter<'_>, text: &str) -> std::fmt::Result {
    f.write_str("\"")?;
    if !text.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        f.write_str(text)?;
        return f.write_str("\"");
    }
    for c in text.chars() {
        match c {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
            c => f.write_char(c)?,
        }
    }
    f.write_str("\"")
}

/// `[{"account":"a","outcome":"retry_after","status":429,"class":"rate_limit","ms":3},…]`:
/// every attempt, `status` null for a transport error, `class` null for a success.
struct Attempts<'a>(&'a [AttemptRecord]);

impl std::fmt::Display for Attempts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[")?;
        for (i, a) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str("{\"account\":")?;
            json_string(f, a.account.as_str())?;
            f.write_str(",\"outcome\":")?;
            json_string(f, &a.outcome)?;
            f.write_str(",\"status\":")?;
            match a.status {
                Some(s) => write_u64(f, u64::from(s))?,
                None => f.write_str("null")?,
            }
            f.write_str(",\"class\":")?;
            match &a.class {
                Some(c) => json_string(f, c)?,
                None => f.write_str("null")?,
            }
            f.write_str(",\"ms\":")?;
            write_u64(f, a.ms)?;
            f.write_str("}")?;
        }
        f.write_str("]")
    }
}

/// `[429,200]`: the status of every attempt that got an upstream answer, in order.
struct Statuses<'a>(&'a [AttemptRecord]);

impl std::fmt::Display for Statuses<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[")?;
        let mut first = true;
        for status in self.0.iter().filter_map(|a| a.status) {
            if !std::mem::take(&mut first) {
                f.write_str(",")?;
            }
            write_u64(f, u64::from(status))?;
        }
        f.write_str("]")
    }
}

/// Nano-USD as `0.000186000` (what `keypool_ledger::Usd` writes), without the formatting machinery.
struct Cost(u64);

impl std::fmt::Display for Cost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write_u64(f, self.0 / keypool_ledger::NANO_PER_USD)?;
        let mut frac = [b'0'; 10];
        frac[0] = b'.';
        let mut n = self.0 % keypool_ledger::NANO_PER_USD;
        for slot in frac[1..].iter_mut().rev() {
            *slot = b'0' + (n % 10) as u8;
            n /= 10;
        }
        f.write_str(std::str::from_utf8(&frac).unwrap_or(".000000000"))
    }
}

/// The client's address as `127.0.0.1:50686` (IPv4 without the formatting
/// machinery; IPv6 as the standard library writes it).
struct Peer(SocketAddr);

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            SocketAddr::V4(v4) => {
                for (i, octet) in v4.ip().octets().iter().enumerate() {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    write_u64(f, u64::from(*octet))?;
                }
                f.write_str(":")?;
                write_u64(f, u64::from(v4.port()))
            }
            v6 => write!(f, "{v6}"),
        }
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
        if let Some(guard) = self.limit_guard.take() {
            guard.settle(Spend::of(&usage, cost.unwrap_or(0)));
        }
        // The record took the attempts (without a record they are still here).
        let attempts = record
            .as_ref()
            .map_or(&self.attempts[..], |(_, r)| &r.attempts);
        tracing::info!(
            target: "keypool::request",
            request_id = &*self.request_id,
            org = self.org.as_deref().unwrap_or("-"),
            url = self.url.as_deref().unwrap_or("-"),
            user_api_key_id = self.caller.as_ref().and_then(Caller::user_api_key_id),
            client_api_key_id = self.caller.as_ref().and_then(Caller::client_api_key_id),
            strategy = self.strategy.map_or("-", Strategy::as_str),
            count_tokens = self.count_tokens,
            stream = self.stream,
            model = self.model.as_deref(),
            // Only when an account's `model` override changed it.
            model_sent = self.model_sent.as_deref().filter(|m| Some(*m) != self.model.as_deref()),
            attempts = %Attempts(attempts),
            upstream_statuses = %Statuses(attempts),
            served_by = self.served_by.as_ref().map_or("-", AccountId::as_str),
            upstream_request_id = self.upstream_request_id.as_deref().unwrap_or("-"),
            status = self.status,
            stream_end = self.stream_end.unwrap_or("-"),
            limit = self.limit.map(LimitKind::as_str),
            ttft_ms = self.ttft_ms,
            duration_ms,
            input_tokens = usage.input_tokens,
            output_tokens = usage.output_tokens,
            cache_creation_input_tokens = usage.cache_creation_input_tokens,
            cache_read_input_tokens = usage.cache_read_input_tokens,
            cost_usd = cost.map(|c| tracing::field::display(Cost(c))),
            client = self.client.map(|c| tracing::field::display(Peer(c))),
            user_agent = self.user_agent.as_deref(),
            "request"
        );
        if let Some((app, record)) = record {
            app.metrics().usage(&record);
            app.store().record_usage(record);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hand_written_numbers_read_as_the_standard_ones() {
        for n in [0u64, 7, 186_000, 1_000_000_000, 12_345_678_901, u64::MAX] {
            assert_eq!(Cost(n).to_string(), keypool_ledger::Usd(n).to_string());
        }
        for addr in ["127.0.0.1:50686", "10.0.255.1:0", "[::1]:8080"] {
            let a: SocketAddr = addr.parse().unwrap();
            assert_eq!(Peer(a).to_string(), a.to_string());
        }
    }

    #[test]
    fn attempts_are_a_json_array_escaped_where_needed() {
        let a = |account: &str, status, class: Option<&'static str>| AttemptRecord {
            account: AccountId::from(account),
            status,
            outcome: Cow::Borrowed("ok"),
            class: class.map(Cow::Borrowed),
            ms: 12,
        };
        let list = [a("a\"1", Some(429), Some("rate_limit")), a("b", None, None)];
        let text = Attempts(&list).to_string();
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed[0]["account"], "a\"1");
        assert_eq!(parsed[0]["status"], 429);
        assert_eq!(parsed[1]["status"], serde_json::Value::Null);
        assert_eq!(Statuses(&list).to_string(), "[429]");
    }
}
