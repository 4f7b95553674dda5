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
use std::cell::RefCell;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
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
    /// How a `[[models]]` rule routed the request (issue 24).
    pub routing: Option<keypool_ledger::ModelRouting>,
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
    pub user_agent: Option<Arc<str>>,
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

/// Texts a thread logged lately, shared with the next requests that log the same text
/// rather than copied for each: a connection's user agent, the few models a team asks
/// for. At most `N` are kept, the oldest replaced first.
pub(crate) struct RecentTexts<const N: usize> {
    kept: [Option<Arc<str>>; N],
    next: usize,
}

impl<const N: usize> RecentTexts<N> {
    pub(crate) const fn new() -> Self {
        Self {
            kept: [const { None }; N],
            next: 0,
        }
    }

    /// `text`, shared with the kept one of the same text, else kept in place of the
    /// oldest.
    pub(crate) fn share(&mut self, text: &str) -> Arc<str> {
        if let Some(kept) = self.kept.iter().flatten().find(|kept| ***kept == *text) {
            return Arc::clone(kept);
        }
        let fresh: Arc<str> = Arc::from(text);
        if N > 0 {
            self.kept[self.next] = Some(Arc::clone(&fresh));
            self.next = (self.next + 1) % N;
        }
        fresh
    }
}

thread_local! {
    /// The user agents this thread logged last. A connection's requests (and most
    /// clients') send the same one.
    static USER_AGENTS: RefCell<RecentTexts<2>> = const { RefCell::new(RecentTexts::new()) };
    /// The models this thread logged last: a team asks for a few.
    static MODELS: RefCell<RecentTexts<4>> = const { RefCell::new(RecentTexts::new()) };
}

/// `text` shared through the thread's `cache` ([`RecentTexts`]).
fn shared<const N: usize>(
    cache: &'static std::thread::LocalKey<RefCell<RecentTexts<N>>>,
    text: &str,
) -> Arc<str> {
    cache.with(|cache| match cache.try_borrow_mut() {
        Ok(mut cache) => cache.share(text),
        Err(_) => Arc::from(text),
    })
}

/// The longest model name shared through the thread's [`RecentTexts`]: a longer one
/// (nothing but the body's size bounds it) is copied for its request alone, so that a
/// thread never keeps a large one after its request.
const MAX_SHARED_MODEL: usize = 256;

/// The model a request asked for, as logged (shared with the thread's recent ones).
pub(crate) fn logged_model(model: &str) -> Arc<str> {
    if model.len() > MAX_SHARED_MODEL {
        return Arc::from(model);
    }
    shared(&MODELS, model)
}

/// The user agent as logged: at most [`MAX_USER_AGENT`] bytes, and none at all when it
/// holds something that looks like a key (`sk-`), which a log must never show. Shared
/// with the thread's recent ones of the same text.
pub(crate) fn loggable_user_agent(value: &str) -> Option<Arc<str>> {
    let logged = if value.contains("sk-") {
        "[redacted]"
    } else {
        let mut end = value.len().min(MAX_USER_AGENT);
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        &value[..end]
    };
    Some(shared(&USER_AGENTS, logged))
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
            routing: None,
            // room for the one attempt most requests make, without growing into it
            attempts: Vec::with_capacity(1),
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
    ///
    /// The record takes the shared names (org, URL, caller, account, models) and the
    /// attempts instead of cloning them: the org's, the caller's and the account's
    /// counts are shared by every request of both workers, and each clone and drop is
    /// a cache line moving between cores. The request line reads them from the record.
    fn record(&mut self, app: &App, total_ms: u64) -> Option<UsageRecord> {
        if self.org.is_none() || self.url.is_none() || self.caller.is_none() {
            return None;
        }
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
        let (kind, id) = match self.caller.take()? {
            Caller::User(id) => (CallerKind::User, id),
            Caller::Client(id) => (CallerKind::Client, id),
        };
        Some(UsageRecord {
            request_id: self.request_id.clone(),
            at: self.at,
            org: self.org.take()?,
            url: self.url.take()?,
            caller: CallerRef { kind, id },
            endpoint: Cow::Borrowed(if self.count_tokens {
                "count_tokens"
            } else {
                "messages"
            }),
            model: self.model.take(),
            model_sent: self.model_sent.take(),
            routing: self.routing.take(),
            stream: self.stream,
            status: self.status,
            account: self.served_by.take(),
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
/// dozen numbers per request; the binary's log formatters share it): digit by digit,
/// which for the usual one to four digits costs less than checking the digits as a
/// `str` and copying them.
///
/// # Errors
/// What `out` answers.
pub fn write_u64(out: &mut impl fmt::Write, n: u64) -> fmt::Result {
    crate::h1::decimal(n, &mut [0; 20])
        .iter()
        .try_for_each(|&digit| out.write_char(char::from(digit)))
}

/// `"text"` as a JSON string (the whole text at once when nothing needs escaping).
fn json_string(f: &mut impl fmt::Write, text: &str) -> fmt::Result {
    f.write_str("\"")?;
    // what the plain format quotes as is needs no JSON escape either
    if is_plain(text) {
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

impl Attempts<'_> {
    fn write_to(&self, f: &mut impl fmt::Write) -> fmt::Result {
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

impl fmt::Display for Attempts<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_to(f)
    }
}

/// `[429,200]`: the status of every attempt that got an upstream answer, in order.
struct Statuses<'a>(&'a [AttemptRecord]);

impl Statuses<'_> {
    fn write_to(&self, f: &mut impl fmt::Write) -> fmt::Result {
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

impl fmt::Display for Statuses<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_to(f)
    }
}

/// Nano-USD as `0.000186000` (what `keypool_ledger::Usd` writes), without the formatting machinery.
struct Cost(u64);

impl Cost {
    /// The text, made in `buf` (20 digits, the point and 9 decimals fit).
    fn text(&self, buf: &mut [u8; 30]) -> usize {
        let mut digits = [0; 20];
        let whole = crate::h1::decimal(self.0 / keypool_ledger::NANO_PER_USD, &mut digits);
        buf[..whole.len()].copy_from_slice(whole);
        let frac = &mut buf[whole.len()..whole.len() + 10];
        frac[0] = b'.';
        let mut n = self.0 % keypool_ledger::NANO_PER_USD;
        for slot in frac[1..].iter_mut().rev() {
            *slot = b'0' + (n % 10) as u8;
            n /= 10;
        }
        whole.len() + 10
    }

    fn write_to(&self, f: &mut impl fmt::Write) -> fmt::Result {
        let mut buf = [0; 30];
        let len = self.text(&mut buf);
        f.write_str(std::str::from_utf8(&buf[..len]).map_err(|_| fmt::Error)?)
    }

    fn push_to(&self, out: &mut Vec<u8>) {
        let mut buf = [0; 30];
        let len = self.text(&mut buf);
        out.extend_from_slice(&buf[..len]);
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_to(f)
    }
}

/// The client's address as `127.0.0.1:50686` (IPv4 without the formatting
/// machinery; IPv6 as the standard library writes it).
struct Peer(SocketAddr);

impl Peer {
    fn write_to(&self, f: &mut impl fmt::Write) -> fmt::Result {
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

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_to(f)
    }
}

/// How many client addresses a thread keeps the text of ([`write_peer`]).
const PEER_SLOTS: usize = 64;

thread_local! {
    /// The text of the IPv4 client addresses this thread wrote last, one per slot,
    /// the slot chosen by the port.
    static PEER_TEXT: RefCell<Vec<(Option<std::net::SocketAddrV4>, Vec<u8>)>> =
        RefCell::new(vec![(None, Vec::new()); PEER_SLOTS]);
}

/// Appends `peer` as [`Peer`] writes it. Every request of a connection writes the
/// same address, so an IPv4 address's text is kept by the thread (its connections
/// stay on it) and copied: ~450 instructions of digits per line become one copy.
fn write_peer(out: &mut Vec<u8>, peer: SocketAddr) -> fmt::Result {
    let SocketAddr::V4(v4) = peer else {
        return Peer(peer).write_to(&mut ByteText(out));
    };
    PEER_TEXT.with(|slots| {
        let Ok(mut slots) = slots.try_borrow_mut() else {
            return Peer(peer).write_to(&mut ByteText(out));
        };
        let (addr, text) = &mut slots[usize::from(v4.port()) % PEER_SLOTS];
        if *addr != Some(v4) {
            text.clear();
            Peer(peer).write_to(&mut ByteText(text))?;
            *addr = Some(v4);
        }
        out.extend_from_slice(text);
        Ok(())
    })
}

/// A byte buffer written through `fmt::Write`: what the request line's JSON arrays and
/// addresses write goes in as bytes (every `str` is UTF-8, so the buffer stays text).
struct ByteText<'a>(&'a mut Vec<u8>);

impl fmt::Write for ByteText<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }

    fn write_char(&mut self, c: char) -> fmt::Result {
        match u8::try_from(c) {
            Ok(byte) if byte.is_ascii() => {
                self.0.push(byte);
                Ok(())
            }
            _ => self.write_str(c.encode_utf8(&mut [0; 4])),
        }
    }
}

/// Takes the fields of each request line as the plain-text format writes them
/// (`request request_id="…" org="…" …`, see [`write_request_lines_to`]): UTF-8 text,
/// handed over as the bytes they are written into.
pub type LineSink = Box<dyn Fn(&[u8]) + Send + Sync>;

/// Where request lines go instead of a `tracing` event, once the binary said so.
static SINK: OnceLock<LineSink> = OnceLock::new();

thread_local! {
    /// This thread's text of the request line being written.
    static PLAIN: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(1024));
}

/// From now on every request line that `tracing`'s filter lets through (target
/// `keypool::request`, level `INFO`) is written as its plain-text fields (what a
/// visitor writing strings as [`write_quoted`], numbers and booleans bare, `None` not
/// at all and the rest by `Display` would write, `message` (`request`) first) and
/// handed to `sink`, instead of being dispatched as a `tracing` event: the binary's
/// plain-text log format installs a sink that adds the timestamp, level and target
/// and appends the line to its batch. The event's dispatch (27 fields through dynamic
/// dispatch, then a formatter, then a copy into the writer) was a fifth of the line's
/// cost. `false` when a sink was installed already (the first one stays).
pub fn write_request_lines_to(sink: LineSink) -> bool {
    SINK.set(sink).is_ok()
}

/// A string field's value as the plain format writes it: quoted, and as the string's
/// `Debug` (escaped) only when it holds a control character, a quote, a backslash or
/// DEL.
///
/// # Errors
/// What `out` answers.
pub fn write_quoted(out: &mut impl fmt::Write, value: &str) -> fmt::Result {
    if is_plain(value) {
        out.write_char('"')?;
        out.write_str(value)?;
        out.write_char('"')
    } else {
        write!(out, "{value:?}")
    }
}

/// The request line's fields, computed once for its event and its plain text.
struct LineFields<'a> {
    request_id: &'a str,
    org: &'a str,
    url: &'a str,
    user_api_key_id: Option<&'a str>,
    client_api_key_id: Option<&'a str>,
    strategy: &'a str,
    count_tokens: bool,
    stream: bool,
    model: Option<&'a str>,
    model_sent: Option<&'a str>,
    attempts: &'a [AttemptRecord],
    served_by: &'a str,
    upstream_request_id: &'a str,
    status: u16,
    stream_end: &'a str,
    limit: Option<&'static str>,
    ttft_ms: Option<u64>,
    duration_ms: u64,
    usage: Usage,
    cost: Option<u64>,
    client: Option<SocketAddr>,
    user_agent: Option<&'a str>,
}

impl LineFields<'_> {
    /// The `keypool::request` event. [`LineFields::write_plain`] writes the same
    /// fields in the same order.
    fn emit(&self) {
        tracing::info!(
            target: "keypool::request",
            request_id = self.request_id,
            org = self.org,
            url = self.url,
            user_api_key_id = self.user_api_key_id,
            client_api_key_id = self.client_api_key_id,
            strategy = self.strategy,
            count_tokens = self.count_tokens,
            stream = self.stream,
            model = self.model,
            model_sent = self.model_sent,
            attempts = %Attempts(self.attempts),
            upstream_statuses = %Statuses(self.attempts),
            served_by = self.served_by,
            upstream_request_id = self.upstream_request_id,
            status = self.status,
            stream_end = self.stream_end,
            limit = self.limit,
            ttft_ms = self.ttft_ms,
            duration_ms = self.duration_ms,
            input_tokens = self.usage.input_tokens,
            output_tokens = self.usage.output_tokens,
            cache_creation_input_tokens = self.usage.cache_creation_input_tokens,
            cache_read_input_tokens = self.usage.cache_read_input_tokens,
            cost_usd = self.cost.map(|c| tracing::field::display(Cost(c))),
            client = self.client.map(|c| tracing::field::display(Peer(c))),
            user_agent = self.user_agent,
            "request"
        );
    }

    /// The fields of [`LineFields::emit`] as the plain format writes them (UTF-8: every
    /// piece is a `str`'s bytes or ASCII). Each name comes with its `=` and, for a
    /// string, its opening quote, as one constant copied at once.
    fn write_plain(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"request");
        quoted(out, b" request_id=\"", Some(self.request_id));
        quoted(out, b" org=\"", Some(self.org));
        quoted(out, b" url=\"", Some(self.url));
        quoted(out, b" user_api_key_id=\"", self.user_api_key_id);
        quoted(out, b" client_api_key_id=\"", self.client_api_key_id);
        quoted(out, b" strategy=\"", Some(self.strategy));
        out.extend_from_slice(if self.count_tokens {
            b" count_tokens=true"
        } else {
            b" count_tokens=false"
        });
        out.extend_from_slice(if self.stream {
            b" stream=true"
        } else {
            b" stream=false"
        });
        quoted(out, b" model=\"", self.model);
        quoted(out, b" model_sent=\"", self.model_sent);
        out.extend_from_slice(b" attempts=");
        // writing to a `Vec` cannot fail
        let _ = Attempts(self.attempts).write_to(&mut ByteText(out));
        out.extend_from_slice(b" upstream_statuses=");
        let _ = Statuses(self.attempts).write_to(&mut ByteText(out));
        quoted(out, b" served_by=\"", Some(self.served_by));
        quoted(
            out,
            b" upstream_request_id=\"",
            Some(self.upstream_request_id),
        );
        number(out, b" status=", Some(u64::from(self.status)));
        quoted(out, b" stream_end=\"", Some(self.stream_end));
        quoted(out, b" limit=\"", self.limit);
        number(out, b" ttft_ms=", self.ttft_ms);
        number(out, b" duration_ms=", Some(self.duration_ms));
        let u = &self.usage;
        number(out, b" input_tokens=", Some(u.input_tokens));
        number(out, b" output_tokens=", Some(u.output_tokens));
        number(
            out,
            b" cache_creation_input_tokens=",
            Some(u.cache_creation_input_tokens),
        );
        number(
            out,
            b" cache_read_input_tokens=",
            Some(u.cache_read_input_tokens),
        );
        if let Some(cost) = self.cost {
            out.extend_from_slice(b" cost_usd=");
            Cost(cost).push_to(out);
        }
        if let Some(client) = self.client {
            out.extend_from_slice(b" client=");
            let _ = write_peer(out, client);
        }
        quoted(out, b" user_agent=\"", self.user_agent);
    }

    /// Writes the line: to the sink of [`write_request_lines_to`] when there is one
    /// (and the line is enabled), else as its `tracing` event.
    fn log(&self) {
        if let Some(sink) = SINK.get() {
            if !tracing::enabled!(target: "keypool::request", tracing::Level::INFO) {
                return;
            }
            let written = PLAIN.with(|text| {
                let Ok(mut text) = text.try_borrow_mut() else {
                    return false;
                };
                text.clear();
                self.write_plain(&mut text);
                sink(&text);
                true
            });
            if written {
                return;
            }
        }
        self.emit();
    }
}

/// ` name="value"` for a string field that is there (nothing for `None`); `name` ends
/// with the opening quote. Inlined, so that the constant name is copied without a
/// call; a plain value (the usual case) goes in with one reservation and two copies.
#[inline(always)]
fn quoted(out: &mut Vec<u8>, name: &[u8], value: Option<&str>) {
    let Some(value) = value else {
        return;
    };
    if is_plain(value) {
        out.reserve(name.len() + value.len() + 1);
        out.extend_from_slice(name);
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
        return;
    }
    // the escaped form brings its own quotes
    out.extend_from_slice(&name[..name.len() - 1]);
    let _ = write_quoted(&mut ByteText(out), value);
}

/// Whether the plain format writes `value` as is between quotes: no control character,
/// quote, backslash or DEL ([`write_quoted`]). Eight bytes at a time, the last few
/// too: a request line checks ~200 bytes of names this way.
#[inline]
fn is_plain(value: &str) -> bool {
    let bytes = value.as_bytes();
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let word = u64::from_le_bytes([
            word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7],
        ]);
        if has_special_byte(word) {
            return false;
        }
    }
    let rest = words.remainder();
    if rest.is_empty() {
        return true;
    }
    if let Some(last) = bytes.last_chunk::<8>() {
        // the last 1–7 bytes within the last eight (some of them checked twice)
        return !has_special_byte(u64::from_le_bytes(*last));
    }
    // a value shorter than a word: padded with a byte that passes
    let mut word = [b'a'; 8];
    word[..rest.len()].copy_from_slice(rest);
    !has_special_byte(u64::from_le_bytes(word))
}

/// Whether a byte of `word` is below `0x20`, a quote, a backslash or DEL (exact: the
/// classic "has a zero byte" and "has a byte less than" tests report a byte if and
/// only if there is one).
#[inline]
fn has_special_byte(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |x: u64| x.wrapping_sub(ONES) & !x;
    let below_space = word.wrapping_sub(ONES * 0x20) & !word;
    let quote = zero_byte(word ^ (ONES * b'"' as u64));
    let backslash = zero_byte(word ^ (ONES * b'\\' as u64));
    let del = zero_byte(word ^ (ONES * 0x7f));
    (below_space | quote | backslash | del) & HIGHS != 0
}

/// ` name=123` for a number field that is there (nothing for `None`): the digits made
/// on the stack and copied at once.
#[inline(always)]
fn number(out: &mut Vec<u8>, name: &[u8], value: Option<u64>) {
    let Some(n) = value else {
        return;
    };
    let mut digits = [0u8; 20];
    let digits = crate::h1::decimal(n, &mut digits);
    out.reserve(name.len() + digits.len());
    out.extend_from_slice(name);
    out.extend_from_slice(digits);
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        let duration_ms = keypool_store::clock::instant()
            .saturating_duration_since(self.started)
            .as_millis() as u64;
        let ledger = self.ledger.take();
        let record = ledger
            .as_ref()
            .and_then(|app| Some((app, self.record(app, duration_ms)?)));
        let cost = record.as_ref().map(|(_, r)| r.cost_nano_usd);
        let usage = self.usage.unwrap_or_default();
        if let Some(guard) = self.limit_guard.take() {
            guard.settle(Spend::of(&usage, cost.unwrap_or(0)));
        }
        // The record took the names and the attempts (without one they are still here).
        let rec = record.as_ref().map(|(_, r)| r);
        let caller_id = |kind: CallerKind| match rec {
            Some(r) => (r.caller.kind == kind).then_some(&*r.caller.id),
            None => self.caller.as_ref().and_then(match kind {
                CallerKind::User => Caller::user_api_key_id,
                CallerKind::Client => Caller::client_api_key_id,
            }),
        };
        let model = rec.map_or(self.model.as_deref(), |r| r.model.as_deref());
        LineFields {
            request_id: &self.request_id,
            org: rec
                .map_or(self.org.as_deref(), |r| Some(&r.org))
                .unwrap_or("-"),
            url: rec
                .map_or(self.url.as_deref(), |r| Some(&r.url))
                .unwrap_or("-"),
            user_api_key_id: caller_id(CallerKind::User),
            client_api_key_id: caller_id(CallerKind::Client),
            strategy: self.strategy.map_or("-", Strategy::as_str),
            count_tokens: self.count_tokens,
            stream: self.stream,
            model,
            // Only when an account's `model` override changed it.
            model_sent: rec
                .map_or(self.model_sent.as_deref(), |r| r.model_sent.as_deref())
                .filter(|m| Some(*m) != model),
            attempts: rec.map_or(&self.attempts[..], |r| &r.attempts),
            served_by: rec
                .map_or(self.served_by.as_ref(), |r| r.account.as_ref())
                .map_or("-", AccountId::as_str),
            upstream_request_id: self.upstream_request_id.as_deref().unwrap_or("-"),
            status: self.status,
            stream_end: self.stream_end.unwrap_or("-"),
            limit: self.limit.map(LimitKind::as_str),
            ttft_ms: self.ttft_ms,
            duration_ms,
            usage,
            cost,
            client: self.client,
            user_agent: self.user_agent.as_deref(),
        }
        .log();
        if let Some((app, record)) = record {
            app.store().record_usage(record);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The hand-written cost and address read as the standard formatting's, for any.
        #[test]
        fn any_cost_and_address_read_as_the_standard_ones(
            n in proptest::prelude::any::<u64>(),
            ip in proptest::prelude::any::<[u8; 4]>(),
            port in proptest::prelude::any::<u16>(),
        ) {
            proptest::prop_assert_eq!(Cost(n).to_string(), keypool_ledger::Usd(n).to_string());
            let mut pushed = Vec::new();
            Cost(n).push_to(&mut pushed);
            proptest::prop_assert_eq!(String::from_utf8(pushed).unwrap(), keypool_ledger::Usd(n).to_string());
            let a = SocketAddr::from((ip, port));
            proptest::prop_assert_eq!(Peer(a).to_string(), a.to_string());
            let mut digits = String::new();
            write_u64(&mut digits, n).unwrap();
            proptest::prop_assert_eq!(digits, n.to_string());
        }

        /// The kept text of a client address is its text, whatever addresses share
        /// its slot and in whatever order they come.
        #[test]
        fn kept_peer_text_is_the_address(
            peers in proptest::collection::vec((0u8..3, 0u16..200), 1..60),
        ) {
            for (host, port) in peers {
                // Ports 64 apart share a slot; the same port on another host too.
                let a = SocketAddr::from(([10, 0, 0, host], port));
                let mut out = b"x".to_vec();
                write_peer(&mut out, a).unwrap();
                proptest::prop_assert_eq!(String::from_utf8(out).unwrap(), format!("x{a}"));
            }
            let v6: SocketAddr = "[::1]:8080".parse().unwrap();
            let mut out = Vec::new();
            write_peer(&mut out, v6).unwrap();
            proptest::prop_assert_eq!(String::from_utf8(out).unwrap(), "[::1]:8080");
        }

        /// The eight-bytes-at-a-time check says what the byte-by-byte one says.
        #[test]
        fn plain_is_checked_exactly(text in "(?s).{0,40}", bytes in proptest::collection::vec(0u8..0x80, 0..40)) {
            let slow = |s: &str| s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\' && b != 0x7f);
            proptest::prop_assert_eq!(is_plain(&text), slow(&text));
            let ascii = String::from_utf8(bytes).unwrap();
            proptest::prop_assert_eq!(is_plain(&ascii), slow(&ascii));
        }
    }

    /// One byte the plain format escapes, at every place of texts of every length up to
    /// three words: found wherever it is, in the words or in the last few bytes.
    #[test]
    fn plain_finds_one_special_byte_anywhere() {
        for len in 0..=24 {
            assert!(is_plain(&"a".repeat(len)), "{len} plain bytes");
            for at in 0..len {
                for special in [b'\0', b'\n', b'"', b'\\', 0x7f] {
                    let mut text = vec![b'a'; len];
                    text[at] = special;
                    let text = String::from_utf8(text).unwrap();
                    assert!(!is_plain(&text), "{text:?}");
                }
            }
        }
    }

    proptest::proptest! {
        /// Whatever the texts and their order, a shared text is the text asked for, and
        /// one of the last `N` texts newly kept is shared, not copied.
        #[test]
        fn recent_texts_give_back_the_text_and_share_the_recent_ones(
            texts in proptest::collection::vec("[a-d]{0,2}", 0..40),
        ) {
            let mut recent = RecentTexts::<3>::new();
            // the model: the texts kept, oldest first, and those it let go
            let mut kept: std::collections::VecDeque<Arc<str>> = Default::default();
            let mut gone: Vec<Arc<str>> = Vec::new();
            for text in &texts {
                let shared = recent.share(text);
                proptest::prop_assert_eq!(&*shared, text.as_str());
                match kept.iter().find(|k| &***k == text.as_str()) {
                    Some(k) => proptest::prop_assert!(Arc::ptr_eq(k, &shared)),
                    None => {
                        // a fresh copy: neither a kept text nor one let go
                        proptest::prop_assert!(
                            kept.iter().chain(&gone).all(|k| !Arc::ptr_eq(k, &shared))
                        );
                        kept.push_back(shared);
                        if kept.len() > 3 {
                            gone.extend(kept.pop_front());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn models_are_shared_while_recent() {
        let sonnet = logged_model("claude-sonnet-4-5");
        let haiku = logged_model("claude-haiku-4-5");
        assert!(Arc::ptr_eq(&sonnet, &logged_model("claude-sonnet-4-5")));
        assert!(Arc::ptr_eq(&haiku, &logged_model("claude-haiku-4-5")));
        for other in ["a", "b", "c", "d"] {
            assert_eq!(&*logged_model(other), other);
        }
        let again = logged_model("claude-sonnet-4-5");
        assert_eq!(&*again, "claude-sonnet-4-5");
        assert!(
            !Arc::ptr_eq(&sonnet, &again),
            "four others since: a fresh copy"
        );
        // a long model is its request's own
        let long = "m".repeat(MAX_SHARED_MODEL + 1);
        let first = logged_model(&long);
        assert_eq!(*first, *long);
        assert!(!Arc::ptr_eq(&first, &logged_model(&long)));
    }

    #[test]
    fn user_agents_are_cut_redacted_and_shared_while_the_same() {
        let a = loggable_user_agent("curl/8.5").unwrap();
        let again = loggable_user_agent("curl/8.5").unwrap();
        assert!(Arc::ptr_eq(&a, &again), "the same text is shared");
        let b = loggable_user_agent("wrk").unwrap();
        assert_eq!(&*b, "wrk");
        assert_eq!(&*loggable_user_agent("curl/8.5").unwrap(), "curl/8.5");
        assert_eq!(
            &*loggable_user_agent("tool sk-lb-abc").unwrap(),
            "[redacted]"
        );
        // Cut at 256 bytes, back to a character boundary (é is two bytes).
        let long = format!("{}é{}", "a".repeat(255), "b".repeat(10));
        assert_eq!(&*loggable_user_agent(&long).unwrap(), "a".repeat(255));
        let short = "a".repeat(300);
        assert_eq!(loggable_user_agent(&short).unwrap().len(), 256);
    }

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

    /// What `tracing-subscriber`'s default format (no time, level nor target: the
    /// fields only, which the binary's plain format writes the same, see its tests)
    /// writes for `line`'s event, and the text a sink of [`write_request_lines_to`]
    /// gets for it.
    fn default_and_plain(line: &LineFields<'_>) -> (String, String) {
        #[derive(Clone, Default)]
        struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Capture {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let capture = Capture::default();
        let writer = {
            let c = capture.clone();
            move || c.clone()
        };
        let subscriber = tracing_subscriber::fmt()
            .without_time()
            .with_ansi(false)
            .with_level(false)
            .with_target(false)
            .with_writer(writer)
            .finish();
        tracing::subscriber::with_default(subscriber, || line.emit());
        let default = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
        let mut plain = Vec::new();
        line.write_plain(&mut plain);
        (default, String::from_utf8(plain).unwrap())
    }

    #[test]
    fn the_plain_fields_are_the_default_formats() {
        let attempt = |account: &str, status, class: Option<&'static str>| AttemptRecord {
            account: AccountId::from(account),
            status,
            outcome: Cow::Borrowed("rate_limited"),
            class: class.map(Cow::Borrowed),
            ms: 3,
        };
        let attempts = [
            attempt("a\"1", Some(429), Some("rate_limit")),
            attempt("b", None, None),
        ];
        let usage = Usage {
            input_tokens: 12,
            output_tokens: 0,
            cache_creation_input_tokens: u64::MAX,
            cache_read_input_tokens: 7,
        };
        let full = LineFields {
            request_id: "req_kp_1",
            org: "acme",
            url: "team-a",
            user_api_key_id: Some("alice"),
            client_api_key_id: None,
            strategy: "round_robin",
            count_tokens: true,
            stream: false,
            model: Some("claude-sonnet-4-5"),
            model_sent: Some("claude-opus-4"),
            attempts: &attempts,
            served_by: "b",
            upstream_request_id: "req_\"x\"\n",
            status: 200,
            stream_end: "complete",
            limit: Some(LimitKind::Models.as_str()),
            ttft_ms: Some(0),
            duration_ms: 1234,
            usage,
            cost: Some(186_000),
            client: Some("[::1]:8080".parse().unwrap()),
            user_agent: Some("curl/8.5 \u{7f} tab\t é"),
        };
        let bare = LineFields {
            user_api_key_id: None,
            client_api_key_id: Some("ci"),
            model: None,
            model_sent: None,
            attempts: &[],
            limit: None,
            ttft_ms: None,
            usage: Usage::default(),
            cost: None,
            client: Some("127.0.0.1:50686".parse().unwrap()),
            user_agent: None,
            ..full
        };
        let none = LineFields {
            client: None,
            client_api_key_id: None,
            ..bare
        };
        for line in [full, bare, none] {
            let (default, plain) = default_and_plain(&line);
            assert!(plain.starts_with("request request_id="), "{plain}");
            assert_eq!(default, format!("{plain}\n"));
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
