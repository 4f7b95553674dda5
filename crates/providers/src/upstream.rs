//! Building the upstream request head from the client's request (SPEC 3.4 and 8).

use std::borrow::Cow;
use std::fmt;

use http::header::{ACCEPT, ACCEPT_ENCODING, AUTHORIZATION, CONTENT_TYPE, USER_AGENT};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use keypool_core::{AuthType, Provider};

use crate::ProvidersError;
use crate::response::HeaderLines;

/// Anthropic's API, the base URL of `anthropic` accounts without their own `base_url`.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The `anthropic-version` sent when the client sent none.
pub const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";
/// The beta flag OAuth (subscription) accounts need in `anthropic-beta`.
pub const OAUTH_BETA: &str = "oauth-2025-04-20";
/// `anthropic-version`.
pub const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");
/// `anthropic-beta`.
pub const ANTHROPIC_BETA: HeaderName = HeaderName::from_static("anthropic-beta");
/// `x-api-key`.
pub const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The only client headers that may reach the upstream (SPEC 3.4). Everything else
/// (credentials, cookies, session and lease headers, hop-by-hop headers, SDK telemetry)
/// is dropped, and so is an allowed header whose value contains `sk-lb-`.
pub const FORWARDED_HEADERS: [HeaderName; 5] = [
    ANTHROPIC_VERSION,
    ANTHROPIC_BETA,
    CONTENT_TYPE,
    ACCEPT,
    USER_AGENT,
];

/// Which API route a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /v1/messages`.
    Messages,
    /// `POST /v1/messages/count_tokens`.
    CountTokens,
    /// `POST /v1/chat/completions` (OpenAI Chat Completions, issue 23): translated to
    /// [`Endpoint::Messages`] for accounts that speak Messages, passed through to
    /// `openai` accounts.
    ChatCompletions,
    /// `GET /v1/models` (OpenAI format): answered by keypool itself, never upstream.
    Models,
}

impl Endpoint {
    /// The endpoint's place in a per-endpoint array (`upstream_uri`'s memo).
    const fn slot(self) -> usize {
        match self {
            Self::Messages => 0,
            Self::CountTokens => 1,
            Self::ChatCompletions => 2,
            Self::Models => 3,
        }
    }

    /// The upstream path, appended to the account's base URL.
    pub const fn path(self) -> &'static str {
        match self {
            Self::Messages => "/v1/messages",
            Self::CountTokens => "/v1/messages/count_tokens",
            Self::ChatCompletions => "/v1/chat/completions",
            Self::Models => "/v1/models",
        }
    }

    /// Whether the client of this route speaks the OpenAI format (its errors are
    /// OpenAI-shaped).
    pub const fn is_openai(self) -> bool {
        matches!(self, Self::ChatCompletions | Self::Models)
    }

    /// The endpoint an attempt of this route calls on an account of `provider`: chat
    /// completions go to the Messages API of a provider that speaks it (translated),
    /// natively to `openai`; `None` when the provider cannot serve the route (a
    /// Messages or `count_tokens` request to an `openai` account).
    pub const fn upstream_for(self, provider: Provider) -> Option<Endpoint> {
        match (self, provider.speaks_messages()) {
            (Self::ChatCompletions, true) => Some(Self::Messages),
            (Self::ChatCompletions, false) => Some(Self::ChatCompletions),
            (Self::Messages | Self::CountTokens, true) => Some(self),
            _ => None,
        }
    }
}

/// The account an attempt goes to: what the adapter needs to address and authenticate
/// the upstream request. Its `Debug` never shows the secret.
#[derive(Clone, Copy)]
pub struct UpstreamAccount<'a> {
    /// The account's provider.
    pub provider: Provider,
    /// The account's auth type.
    pub auth: AuthType,
    /// The account's credential (API key or OAuth access token), already resolved from
    /// `$ENV_NAME` by the configuration loader.
    pub secret: &'a str,
    /// The account's own base URL; `None` means [`DEFAULT_BASE_URL`] (only allowed for
    /// `anthropic` accounts).
    pub base_url: Option<&'a str>,
}

impl fmt::Debug for UpstreamAccount<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamAccount")
            .field("provider", &self.provider)
            .field("auth", &self.auth)
            .field("secret", &"<redacted>")
            .field("base_url", &self.base_url)
            .finish()
    }
}

/// How an adapter authenticates, decided from provider and auth type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Credential {
    ApiKey,
    Bearer { oauth_beta: bool },
}

/// The credential header of `auth`, for a provider that accepts it
/// ([`Provider::accepts`], the one statement of which provider takes which auth type).
fn credential(provider: Provider, auth: AuthType) -> Result<Credential, ProvidersError> {
    if !provider.accepts(auth) {
        return Err(ProvidersError::UnsupportedAuth { provider, auth });
    }
    Ok(match auth {
        // OpenAI-compatible servers take their API key as a bearer token.
        AuthType::ApiKey if !provider.speaks_messages() => Credential::Bearer { oauth_beta: false },
        AuthType::ApiKey => Credential::ApiKey,
        AuthType::OAuth => Credential::Bearer { oauth_beta: true },
        AuthType::Bearer => Credential::Bearer { oauth_beta: false },
    })
}

/// Checks that an account's provider, auth type and base URL can be served, without a
/// request: for an embedder that builds accounts itself. (keypool's configuration
/// loader, in `keypool-store`, does not depend on this crate; it checks the auth type
/// with the same [`Provider::accepts`].)
///
/// # Errors
/// [`ProvidersError::UnsupportedAuth`], [`ProvidersError::MissingBaseUrl`] or
/// [`ProvidersError::InvalidBaseUrl`].
pub fn validate_account(
    provider: Provider,
    auth: AuthType,
    base_url: Option<&str>,
) -> Result<(), ProvidersError> {
    credential(provider, auth)?;
    upstream_uri(provider, base_url, Endpoint::Messages, None).map(drop)
}

/// The upstream request head: method, URI and header lines. The proxy adds the body
/// (and `content-length`, which its HTTP client derives from the body it sends).
#[derive(Debug, Clone)]
pub struct UpstreamHead {
    /// Always `POST`.
    pub method: Method,
    /// Base URL + endpoint path + the client's query string.
    pub uri: Uri,
    /// The allowlisted client headers plus what the adapter adds.
    pub headers: UpstreamHeaders,
}

impl UpstreamHead {
    /// The upstream request with `body` (for an HTTP client that takes
    /// `http::Request`s; the credential lines are marked sensitive).
    pub fn into_request<B>(self, body: B) -> Request<B> {
        let mut request = Request::new(body);
        *request.method_mut() = self.method;
        *request.uri_mut() = self.uri;
        *request.headers_mut() = self.headers.to_header_map();
        request
    }
}

/// The upstream request's header lines, `name: value\r\n` each, as they go on the
/// wire and in the order they are written.
///
/// A request sends half a dozen lines, each written once and read by nobody on the
/// request path: they are kept as their text, not hashed into a `HeaderMap` (which cost
/// ~1,600 instructions more per request: a 1.2 KB table, a `HeaderValue` and a shared
/// reference count per line; issue 22). Names are lower case; values are valid header
/// values (no control byte but a tab, no DEL), checked as they are added. The
/// credential lines (`x-api-key`, `authorization`) and the values appended as
/// sensitive are shown by `Debug` as `[redacted]` and marked sensitive in
/// [`UpstreamHeaders::to_header_map`].
#[derive(Clone, Default, PartialEq, Eq)]
pub struct UpstreamHeaders {
    text: Vec<u8>,
    /// Whether a `host` line was added ([`UpstreamHeaders::append`]).
    host: bool,
    /// The indexes of the lines appended with a value marked sensitive.
    sensitive: Vec<usize>,
}

impl UpstreamHeaders {
    /// No lines, room for a typical head's.
    fn new() -> Self {
        Self {
            text: Vec::with_capacity(256),
            host: false,
            sensitive: Vec::new(),
        }
    }

    /// Adds a line of the caller's (an embedder's or a test's). `content-length`,
    /// `transfer-encoding` and `connection` are not added: the HTTP client writes the
    /// framing of the body it sends. A `host` line replaces the one the client would
    /// derive from the URI. A value marked sensitive stays so (`Debug`,
    /// [`UpstreamHeaders::to_header_map`]).
    pub fn append(&mut self, name: &HeaderName, value: &HeaderValue) {
        if *name == http::header::CONTENT_LENGTH
            || *name == http::header::TRANSFER_ENCODING
            || *name == http::header::CONNECTION
        {
            return;
        }
        self.host |= *name == http::header::HOST;
        if value.is_sensitive() {
            self.sensitive.push(self.len());
        }
        self.push(name.as_str(), value.as_bytes());
    }

    /// Whether line `index`, named `name`, is not to be shown.
    fn is_sensitive(&self, index: usize, name: &str) -> bool {
        is_credential(name) || self.sensitive.contains(&index)
    }

    /// Whether a `host` line was added.
    pub fn has_host(&self) -> bool {
        self.host
    }

    /// Adds `name: value` (a name of this module's, lower case; `value` already
    /// checked by [`is_header_value`]).
    fn push(&mut self, name: &str, value: &[u8]) {
        self.push_parts(name, &[value]);
    }

    /// Adds `name: ` and the `parts` of its value one after the other (`Bearer ` and
    /// the secret without a buffer of their own).
    fn push_parts(&mut self, name: &str, parts: &[&[u8]]) {
        let value_len: usize = parts.iter().map(|part| part.len()).sum();
        self.text.reserve(name.len() + value_len + 4);
        self.text.extend_from_slice(name.as_bytes());
        self.text.extend_from_slice(b": ");
        for part in parts {
            self.text.extend_from_slice(part);
        }
        self.text.extend_from_slice(b"\r\n");
    }

    /// The lines as written upstream: `name: value\r\n` each.
    pub fn as_bytes(&self) -> &[u8] {
        &self.text
    }

    /// Every line's name and value, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.text
            .split(|&b| b == b'\n')
            .filter(|line| !line.is_empty())
            .map(|line| {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let colon = line.iter().position(|&b| b == b':').unwrap_or(line.len());
                let name = std::str::from_utf8(&line[..colon]).unwrap_or("");
                let value = line.get(colon + 2..).unwrap_or_default();
                (name, value)
            })
    }

    /// The values of the lines named `name` (lower case), in order.
    pub fn get_all<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a [u8]> {
        self.iter()
            .filter(move |(n, _)| *n == name)
            .map(|(_, value)| value)
    }

    /// The first value named `name` (lower case).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, value)| value)
    }

    /// The first value named `name` as text, if it is.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name)
            .and_then(|value| std::str::from_utf8(value).ok())
    }

    /// Whether a line is named `name` (lower case).
    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// How many lines there are.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// The same lines as a `HeaderMap`, the credential's (and those appended as
    /// sensitive) marked sensitive.
    pub fn to_header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(8);
        for (index, (name, value)) in self.iter().enumerate() {
            let (Ok(header), Ok(mut value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(value),
            ) else {
                continue;
            };
            value.set_sensitive(self.is_sensitive(index, name));
            map.append(header, value);
        }
        map
    }
}

/// Whether lines named `name` carry the account's credential.
fn is_credential(name: &str) -> bool {
    name == X_API_KEY.as_str() || name == AUTHORIZATION.as_str()
}

impl fmt::Debug for UpstreamHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().enumerate().map(|(index, (name, value))| {
                let value = if self.is_sensitive(index, name) {
                    Cow::Borrowed("[redacted]")
                } else {
                    String::from_utf8_lossy(value)
                };
                (name, value)
            }))
            .finish()
    }
}

/// Whether `value` is a valid header value, as `HeaderValue::from_bytes` judges it: no
/// control byte but a tab, no DEL (bytes from 0x80 are allowed).
fn is_header_value(value: &[u8]) -> bool {
    // folded without an early exit, so that it is checked many bytes at a time
    !value.iter().fold(false, |bad, &b| {
        bad | ((b < 0x20 && b != b'\t') || b == 0x7f)
    })
}

/// Builds the upstream request head for one attempt.
///
/// - URI: the account's base URL (default [`DEFAULT_BASE_URL`]) + `endpoint`'s path +
///   `client_uri`'s query string, unchanged.
/// - Headers: only [`FORWARDED_HEADERS`] are copied from `client_headers`, and none
///   whose value contains `sk-lb-` (any case). `anthropic-version` is the client's, or
///   [`DEFAULT_ANTHROPIC_VERSION`] when it sent none. `accept-encoding: identity` so the
///   body can be read frame by frame.
/// - Auth: `x-api-key: <secret>` for `api_key`; `authorization: Bearer <secret>` for
///   `oauth` and `bearer`. For `anthropic` + `oauth`, `anthropic-beta` becomes the
///   client's flags (every header, comma lists split, duplicates and blanks removed,
///   order kept) plus [`OAUTH_BETA`] when missing, as one header. Credential lines are
///   never shown by `Debug`.
///
/// # Errors
/// The account errors of [`validate_account`], and [`ProvidersError::InvalidSecret`].
pub fn build_upstream_head<H: HeaderLines + ?Sized>(
    client_uri: &Uri,
    client_headers: &H,
    endpoint: Endpoint,
    account: &UpstreamAccount<'_>,
) -> Result<UpstreamHead, ProvidersError> {
    let credential = credential(account.provider, account.auth)?;
    let query = client_uri
        .query()
        .map(without_lb_keys)
        .filter(|q| !q.is_empty());
    let uri = upstream_uri(
        account.provider,
        account.base_url,
        endpoint,
        query.as_deref(),
    )?;
    let secret = account.secret.as_bytes();
    if !is_header_value(secret) {
        return Err(ProvidersError::InvalidSecret);
    }

    // Decided before the pass: which forwarded names are kept as they come.
    let messages = account.provider.speaks_messages();
    let merge_beta = matches!(credential, Credential::Bearer { oauth_beta: true });
    let mut headers = UpstreamHeaders::new();
    let mut betas: Vec<&[u8]> = Vec::new();
    // one pass over the client's few headers rather than a lookup per forwarded name
    let mut versioned = false;
    for (name, value) in client_headers.lines() {
        let Some(forwarded) = FORWARDED_HEADERS
            .into_iter()
            .find(|forwarded| forwarded.as_str().as_bytes() == name)
        else {
            continue;
        };
        let anthropic_only = forwarded == ANTHROPIC_VERSION || forwarded == ANTHROPIC_BETA;
        if (anthropic_only && !messages) || contains_marker(value) || !is_header_value(value) {
            continue;
        }
        if merge_beta && forwarded == ANTHROPIC_BETA {
            betas.push(value);
            continue;
        }
        versioned |= forwarded == ANTHROPIC_VERSION;
        headers.push(forwarded.as_str(), value);
    }
    if messages && !versioned {
        headers.push(
            ANTHROPIC_VERSION.as_str(),
            DEFAULT_ANTHROPIC_VERSION.as_bytes(),
        );
    }
    headers.push(ACCEPT_ENCODING.as_str(), b"identity");
    match credential {
        Credential::ApiKey => headers.push(X_API_KEY.as_str(), secret),
        Credential::Bearer { .. } => {
            headers.push_parts(AUTHORIZATION.as_str(), &[b"Bearer ", secret]);
        }
    }
    if merge_beta {
        headers.push(
            ANTHROPIC_BETA.as_str(),
            &merge_beta_flags(betas, OAUTH_BETA),
        );
    }
    Ok(UpstreamHead {
        method: Method::POST,
        uri,
        headers,
    })
}

/// Whether a header value contains an LB key marker (`sk-lb-`, ASCII case ignored).
pub fn contains_lb_key(value: &HeaderValue) -> bool {
    contains_marker(value.as_bytes())
}

/// A query string without the parameters that carry an LB key (SPEC 3.4: nothing of
/// the client's credential reaches the upstream): a parameter whose name or value
/// contains `sk-lb-` (ASCII case ignored), also once percent-decoded (up to three
/// times, so `%73k-lb-` or a doubly encoded key is found), is dropped; the others stay
/// as the client wrote them, in order. A query without any `sk-lb-` or `%` is returned
/// as is, without a copy.
pub fn without_lb_keys(query: &str) -> Cow<'_, str> {
    if !query.contains('%') && !contains_marker(query.as_bytes()) {
        return Cow::Borrowed(query);
    }
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| !carries_lb_key(pair))
        .collect();
    Cow::Owned(kept.join("&"))
}

/// Whether `bytes` contain `sk-lb-` (ASCII case ignored). Eight starts at a time: a
/// start can be the marker only where its third and sixth bytes are `-`, found for
/// eight bytes in a few word operations; only there are the six compared (a forwarded
/// `anthropic-beta` is ~100 bytes on every request).
fn contains_marker(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGHS: u64 = ONES * 0x80;
    // the high bit of each byte of `word` that is `-` (exact: no carry leaves a byte)
    let dashes = |word: u64| {
        let t = word ^ (ONES * u64::from(b'-'));
        !(((t & !HIGHS) + !HIGHS) | t) & HIGHS
    };
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
    let is_marker = |start: usize| bytes[start..start + 6].eq_ignore_ascii_case(b"sk-lb-");
    let mut start = 0;
    while start + 13 <= bytes.len() {
        let mut both = dashes(word(start + 2)) & dashes(word(start + 5));
        while both != 0 {
            if is_marker(start + both.trailing_zeros() as usize / 8) {
                return true;
            }
            both &= both - 1;
        }
        start += 8;
    }
    (start..(bytes.len() + 1).saturating_sub(6)).any(is_marker)
}

fn carries_lb_key(pair: &str) -> bool {
    let mut text = Cow::Borrowed(pair.as_bytes());
    for _ in 0..=3 {
        if contains_marker(&text) {
            return true;
        }
        match percent_decoded(&text) {
            Some(decoded) => text = Cow::Owned(decoded),
            None => return false,
        }
    }
    contains_marker(&text)
}

/// A query-string value with its `%XX` sequences (and `+`) decoded; invalid UTF-8 is
/// replaced. Borrowed when there is nothing to decode.
pub fn percent_decode(value: &str) -> Cow<'_, str> {
    match percent_decoded(value.as_bytes()) {
        Some(bytes) => Cow::Owned(String::from_utf8_lossy(&bytes).into_owned()),
        None => Cow::Borrowed(value),
    }
}

/// `bytes` with `%XX` sequences (and `+`) decoded, `None` when there is nothing to decode.
fn percent_decoded(bytes: &[u8]) -> Option<Vec<u8>> {
    if !bytes.iter().any(|&b| b == b'%' || b == b'+') {
        return None;
    }
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    Some(out)
}

/// The union of the comma-separated flags of `values` and `extra`, without blanks or
/// duplicates, in first-seen order (`extra` last), as one header value.
pub(crate) fn merge_beta_flags<'v>(
    values: impl IntoIterator<Item = &'v [u8]>,
    extra: &str,
) -> Vec<u8> {
    let mut flags: Vec<&[u8]> = Vec::new();
    let mut push = |flag: &'v [u8]| {
        let flag = flag.trim_ascii();
        if !flag.is_empty() && !flags.contains(&flag) {
            flags.push(flag);
        }
    };
    for value in values {
        value.split(|&b| b == b',').for_each(&mut push);
    }
    let extra = extra.trim();
    let mut out = Vec::new();
    for flag in &flags {
        out.extend_from_slice(flag);
        out.push(b',');
    }
    if !flags.contains(&extra.as_bytes()) {
        out.extend_from_slice(extra.as_bytes());
    } else {
        out.pop();
    }
    out
}

/// Most base URLs [`upstream_uri`] remembers per thread (past it, it starts over).
const MAX_REMEMBERED_BASES: usize = 1024;

thread_local! {
    /// The URIs built without a query, per thread, by base URL and endpoint: every
    /// request of an account builds the same one, and building it (a string, a parse)
    /// was ~1.3 k instructions per request. Keyed by the base URL's text, so accounts
    /// sharing a base URL share the entry and a reload's new strings find it.
    static REMEMBERED: std::cell::RefCell<RememberedUris> = std::cell::RefCell::default();
}

type RememberedUris =
    std::collections::HashMap<Box<str>, [Option<Uri>; 4], foldhash::fast::RandomState>;

/// The upstream URI: base URL + endpoint path + query (see [`REMEMBERED`] for the ones
/// without a query).
fn upstream_uri(
    provider: Provider,
    base_url: Option<&str>,
    endpoint: Endpoint,
    query: Option<&str>,
) -> Result<Uri, ProvidersError> {
    let base = match base_url {
        Some(base) => base,
        None if provider.has_default_base_url() => DEFAULT_BASE_URL,
        None => return Err(ProvidersError::MissingBaseUrl),
    };
    if query.is_some() {
        return build_uri(base, endpoint, query);
    }
    let slot = endpoint.slot();
    let remembered = REMEMBERED.with(|r| {
        r.try_borrow()
            .ok()
            .and_then(|r| r.get(base).and_then(|uris| uris[slot].clone()))
    });
    if let Some(uri) = remembered {
        return Ok(uri);
    }
    let uri = build_uri(base, endpoint, None)?;
    REMEMBERED.with(|r| {
        if let Ok(mut r) = r.try_borrow_mut() {
            if r.len() >= MAX_REMEMBERED_BASES && !r.contains_key(base) {
                r.clear();
            }
            r.entry(base.into()).or_default()[slot] = Some(uri.clone());
        }
    });
    Ok(uri)
}

/// [`upstream_uri`] built and checked: base URL + endpoint path + query.
fn build_uri(base: &str, endpoint: Endpoint, query: Option<&str>) -> Result<Uri, ProvidersError> {
    let invalid = |reason| ProvidersError::InvalidBaseUrl {
        base_url: base.to_owned(),
        reason,
    };
    if base.contains(['?', '#']) {
        return Err(invalid("a base URL cannot have a query or fragment"));
    }
    let trimmed = base.trim_end_matches('/');
    let mut uri = String::with_capacity(trimmed.len() + 32 + query.map_or(0, str::len));
    uri.push_str(trimmed);
    uri.push_str(endpoint.path());
    if let Some(query) = query {
        uri.push('?');
        uri.push_str(query);
    }
    let check = |parsed: &Uri| match (parsed.scheme_str(), parsed.authority()) {
        (Some("http" | "https"), Some(_)) => Ok(()),
        (Some("http" | "https"), None) => Err(invalid("no host")),
        _ => Err(invalid("the scheme must be http or https")),
    };
    // One parse on the request path: the whole URI. Only when it fails is the base
    // parsed alone, to say which part is wrong.
    match uri.parse::<Uri>() {
        Ok(parsed) => check(&parsed).map(|()| parsed),
        Err(_) => match base.parse::<Uri>() {
            Err(_) => Err(invalid("not a URI")),
            Ok(parsed) => {
                check(&parsed)?;
                Err(invalid("not a URI once the path is added"))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn remembered_uris_are_the_built_ones_and_errors_are_not_remembered() {
        let build = |base: Option<&str>, endpoint, query| {
            upstream_uri(Provider::Anthropic, base, endpoint, query)
        };
        for base in [
            Some("http://127.0.0.1:9000/"),
            Some("https://llm.example/proxy"),
            None,
        ] {
            for endpoint in [
                Endpoint::Messages,
                Endpoint::CountTokens,
                Endpoint::ChatCompletions,
            ] {
                let first = build(base, endpoint, None).unwrap();
                let again = build(base, endpoint, None).unwrap();
                assert_eq!(first, again);
                assert_eq!(
                    first,
                    build_uri(base.unwrap_or(DEFAULT_BASE_URL), endpoint, None).unwrap()
                );
                assert!(first.path().ends_with(endpoint.path()), "{first}");
            }
        }
        // a query is never served from memory
        let with = build(
            Some("http://127.0.0.1:9000"),
            Endpoint::Messages,
            Some("beta=true"),
        )
        .unwrap();
        assert_eq!(with.query(), Some("beta=true"));
        assert_eq!(
            build(Some("http://127.0.0.1:9000"), Endpoint::Messages, None)
                .unwrap()
                .query(),
            None
        );
        for _ in 0..2 {
            assert!(matches!(
                build(Some("ftp://x"), Endpoint::Messages, None),
                Err(ProvidersError::InvalidBaseUrl { .. })
            ));
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    fn account(provider: Provider, auth: AuthType, base_url: Option<&str>) -> UpstreamAccount<'_> {
        UpstreamAccount {
            provider,
            auth,
            secret: "sk-ant-api03-SECRET",
            base_url,
        }
    }

    /// Issue 14.9: an LB key in the query string (`?key=sk-lb-…`, encoded or not) never
    /// reaches the upstream; the other parameters pass unchanged, in order.
    #[test]
    fn query_parameters_carrying_an_lb_key_are_dropped() {
        let cases = [
            ("beta=true", "beta=true"),
            ("beta=true&key=sk-lb-AAAA1111", "beta=true"),
            ("key=SK-LB-AAAA&beta=true&x=1", "beta=true&x=1"),
            ("k=%73k-lb-AAAA&beta=true", "beta=true"),
            ("k=%2573k%252Dlb%252DAAAA&beta=true", "beta=true"),
            ("sk-lb-AAAA=1&a=%41", "a=%41"),
            ("a=%zz&b=100%", "a=%zz&b=100%"),
            ("key=sk-lb-AAAA", ""),
        ];
        for (query, kept) in cases {
            assert_eq!(without_lb_keys(query), kept, "{query}");
        }
        assert!(matches!(without_lb_keys("beta=true"), Cow::Borrowed(_)));
        let uri: Uri =
            "/acme/team/v1/messages?beta=true&key=sk-lb-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
                .parse()
                .unwrap();
        let head = build_upstream_head(
            &uri,
            &HeaderMap::new(),
            Endpoint::Messages,
            &account(Provider::Anthropic, AuthType::ApiKey, None),
        )
        .unwrap();
        assert_eq!(head.uri, "https://api.anthropic.com/v1/messages?beta=true");
    }

    #[test]
    fn client_credentials_and_non_allowlisted_headers_never_pass() {
        let client = headers(&[
            ("x-api-key", "sk-lb-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
            ("authorization", "Bearer sk-lb-BBBBBBBB"),
            ("cookie", "session=1"),
            ("x-claude-code-session-id", "abc"),
            ("x-session-id", "abc"),
            ("x-keypool-lease", "l1"),
            ("connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("accept-encoding", "gzip, br"),
            ("host", "keypool.local"),
            ("content-length", "10"),
            ("user-agent", "claude-cli/2.0 sk-lb-CCCCCCCC"),
            ("anthropic-beta", "SK-LB-lowercase-is-caught-too"),
            ("content-type", "application/json"),
        ]);
        let uri: Uri = "/acme/team/v1/messages".parse().unwrap();
        let head = build_upstream_head(
            &uri,
            &client,
            Endpoint::Messages,
            &account(Provider::Anthropic, AuthType::ApiKey, None),
        )
        .unwrap();
        let mut names: Vec<&str> = head.headers.iter().map(|(name, _)| name).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "accept-encoding",
                "anthropic-version",
                "content-type",
                "x-api-key"
            ]
        );
        assert_eq!(
            head.headers.get_str("x-api-key"),
            Some("sk-ant-api03-SECRET")
        );
        assert_eq!(head.headers.get_str("accept-encoding"), Some("identity"));
        assert_eq!(
            head.headers.get_str("anthropic-version"),
            Some("2023-06-01")
        );
        let shown = format!("{head:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("\"x-api-key\": \"[redacted]\""), "{shown}");
        let map = head.headers.to_header_map();
        assert!(map["x-api-key"].is_sensitive());
        assert!(!map["accept-encoding"].is_sensitive());
        // On the wire: each line once, as the adapter wrote it.
        assert_eq!(
            head.headers.as_bytes(),
            b"content-type: application/json\r\nanthropic-version: 2023-06-01\r\n\
              accept-encoding: identity\r\nx-api-key: sk-ant-api03-SECRET\r\n"
        );
        assert_eq!(head.uri, "https://api.anthropic.com/v1/messages");
        assert_eq!(head.method, Method::POST);
    }

    /// A line appended with a value marked sensitive is shown by no `Debug` and stays
    /// sensitive in the map; framing lines are not added; a `host` line is noted.
    #[test]
    fn appended_lines_keep_their_sensitivity() {
        let mut headers = UpstreamHeaders::default();
        let mut secret = HeaderValue::from_static("vendor-SECRET");
        secret.set_sensitive(true);
        headers.append(&HeaderName::from_static("x-vendor-key"), &secret);
        headers.append(&ACCEPT, &HeaderValue::from_static("application/json"));
        headers.append(
            &http::header::CONTENT_LENGTH,
            &HeaderValue::from_static("9"),
        );
        headers.append(&http::header::HOST, &HeaderValue::from_static("h.example"));
        let shown = format!("{headers:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("application/json"), "{shown}");
        let map = headers.to_header_map();
        assert!(map["x-vendor-key"].is_sensitive());
        assert!(!map["accept"].is_sensitive());
        assert!(!map.contains_key("content-length"));
        assert!(headers.has_host());
        assert_eq!(headers.len(), 3);
    }

    #[test]
    fn oauth_merges_the_beta_flag_without_duplicates() {
        let client = headers(&[
            ("anthropic-beta", "claude-code-20250219, oauth-2025-04-20"),
            (
                "anthropic-beta",
                "interleaved-thinking-2025-05-14,,claude-code-20250219",
            ),
            ("anthropic-version", "2026-10-21"),
        ]);
        let uri: Uri = "/o/u/v1/messages?beta=true".parse().unwrap();
        let head = build_upstream_head(
            &uri,
            &client,
            Endpoint::Messages,
            &account(Provider::Anthropic, AuthType::OAuth, None),
        )
        .unwrap();
        assert_eq!(
            head.headers.get_all("anthropic-beta").collect::<Vec<_>>(),
            [&b"claude-code-20250219,oauth-2025-04-20,interleaved-thinking-2025-05-14"[..]]
        );
        assert_eq!(
            head.headers.get_str("authorization"),
            Some("Bearer sk-ant-api03-SECRET")
        );
        assert!(!format!("{head:?}").contains("SECRET"));
        assert!(head.headers.to_header_map()["authorization"].is_sensitive());
        assert!(!head.headers.contains_key("x-api-key"));
        assert_eq!(
            head.headers.get_str("anthropic-version"),
            Some("2026-10-21")
        );
        assert_eq!(head.uri, "https://api.anthropic.com/v1/messages?beta=true");

        let head = build_upstream_head(
            &uri,
            &HeaderMap::new(),
            Endpoint::CountTokens,
            &account(Provider::Anthropic, AuthType::OAuth, None),
        )
        .unwrap();
        assert_eq!(
            head.headers.get_str("anthropic-beta"),
            Some("oauth-2025-04-20")
        );
        assert_eq!(
            head.uri,
            "https://api.anthropic.com/v1/messages/count_tokens?beta=true"
        );
    }

    #[test]
    fn compatible_accounts_use_their_base_url_path_prefix_and_auth() {
        let uri: Uri = "/v1/messages?x=1&y=%20".parse().unwrap();
        let bearer = account(
            Provider::AnthropicCompatible,
            AuthType::Bearer,
            Some("https://llm.example.com/anthropic/"),
        );
        let head =
            build_upstream_head(&uri, &HeaderMap::new(), Endpoint::Messages, &bearer).unwrap();
        assert_eq!(
            head.uri,
            "https://llm.example.com/anthropic/v1/messages?x=1&y=%20"
        );
        assert_eq!(
            head.headers.get_str("authorization"),
            Some("Bearer sk-ant-api03-SECRET")
        );
        assert!(!head.headers.contains_key("anthropic-beta"));
        let key = account(
            Provider::AnthropicCompatible,
            AuthType::ApiKey,
            Some("http://127.0.0.1:8080"),
        );
        let head = build_upstream_head(&uri, &HeaderMap::new(), Endpoint::Messages, &key).unwrap();
        assert_eq!(head.uri, "http://127.0.0.1:8080/v1/messages?x=1&y=%20");
        assert_eq!(
            head.headers.get_str("x-api-key"),
            Some("sk-ant-api03-SECRET")
        );
    }

    #[test]
    fn unsupported_accounts_are_typed_errors_without_the_secret() {
        use ProvidersError::*;
        let cases = [
            (
                Provider::Anthropic,
                AuthType::Bearer,
                None,
                UnsupportedAuth {
                    provider: Provider::Anthropic,
                    auth: AuthType::Bearer,
                },
            ),
            (
                Provider::AnthropicCompatible,
                AuthType::OAuth,
                Some("https://x.io"),
                UnsupportedAuth {
                    provider: Provider::AnthropicCompatible,
                    auth: AuthType::OAuth,
                },
            ),
            (
                Provider::AnthropicCompatible,
                AuthType::ApiKey,
                None,
                MissingBaseUrl,
            ),
            (
                Provider::Anthropic,
                AuthType::ApiKey,
                Some("ftp://x.io"),
                InvalidBaseUrl {
                    base_url: "ftp://x.io".into(),
                    reason: "the scheme must be http or https",
                },
            ),
            (
                Provider::Anthropic,
                AuthType::ApiKey,
                Some("/relative"),
                InvalidBaseUrl {
                    base_url: "/relative".into(),
                    reason: "the scheme must be http or https",
                },
            ),
            (
                Provider::Anthropic,
                AuthType::ApiKey,
                Some("localhost:8080"),
                InvalidBaseUrl {
                    base_url: "localhost:8080".into(),
                    reason: "the scheme must be http or https",
                },
            ),
            (
                Provider::Anthropic,
                AuthType::ApiKey,
                Some("https://bad host"),
                InvalidBaseUrl {
                    base_url: "https://bad host".into(),
                    reason: "not a URI",
                },
            ),
            (
                Provider::Anthropic,
                AuthType::ApiKey,
                Some("https://x.io/?a=1"),
                InvalidBaseUrl {
                    base_url: "https://x.io/?a=1".into(),
                    reason: "a base URL cannot have a query or fragment",
                },
            ),
        ];
        for (provider, auth, base_url, expected) in cases {
            assert_eq!(
                validate_account(provider, auth, base_url),
                Err(expected.clone())
            );
            let err = build_upstream_head(
                &Uri::from_static("/v1/messages"),
                &HeaderMap::new(),
                Endpoint::Messages,
                &account(provider, auth, base_url),
            )
            .unwrap_err();
            assert_eq!(err, expected);
            assert!(!err.to_string().contains("SECRET"));
        }
        let bad = UpstreamAccount {
            secret: "hunter2\nX",
            ..account(Provider::Anthropic, AuthType::ApiKey, None)
        };
        let err = build_upstream_head(
            &Uri::from_static("/"),
            &HeaderMap::new(),
            Endpoint::Messages,
            &bad,
        )
        .unwrap_err();
        assert_eq!(err, ProvidersError::InvalidSecret);
        assert!(!format!("{err} {err:?} {bad:?}").contains("hunter2"));
    }

    fn header_name() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("x-api-key".to_string()),
            Just("authorization".to_string()),
            Just("cookie".to_string()),
            Just("x-claude-code-session-id".to_string()),
            Just("connection".to_string()),
            Just("accept-encoding".to_string()),
            Just("anthropic-version".to_string()),
            Just("anthropic-beta".to_string()),
            Just("content-type".to_string()),
            Just("accept".to_string()),
            Just("user-agent".to_string()),
            "x-[a-z]{1,8}",
        ]
    }

    fn header_value() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9-]{1,12}(,[ a-z0-9-]{0,12}){0,3}",
            "[a-zA-Z ]{0,4}(sk-lb-|SK-LB-|Sk-Lb-)[A-Za-z0-9]{0,8}",
        ]
    }

    proptest! {
        /// The word-at-a-time search finds the marker exactly where a window-by-window
        /// comparison does: texts of dashes, marker letters in any case and others,
        /// with a marker put anywhere or not at all.
        #[test]
        fn the_marker_is_found_as_window_by_window(
            text in prop::collection::vec(prop::sample::select(b"sSkKlLbB--x0".to_vec()), 0..40),
            marker in prop::option::of((0usize..40, "[sS][kK]-[lL][bB]-")),
        ) {
            let mut text = text;
            if let Some((at, marker)) = marker {
                let at = at.min(text.len());
                text.splice(at..at, marker.bytes());
            }
            let windows = text.windows(6).any(|w| w.eq_ignore_ascii_case(b"sk-lb-"));
            prop_assert_eq!(contains_marker(&text), windows);
        }

        /// A value is written upstream exactly when `HeaderValue` would take it.
        #[test]
        fn header_values_are_checked_as_http_checks_them(
            value in prop::collection::vec(any::<u8>(), 0..24),
        ) {
            prop_assert_eq!(is_header_value(&value), HeaderValue::from_bytes(&value).is_ok());
        }

        #[test]
        fn only_allowlisted_headers_without_lb_keys_reach_the_upstream(
            pairs in prop::collection::vec((header_name(), header_value()), 0..16),
            oauth in any::<bool>(),
        ) {
            let client = headers(&pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect::<Vec<_>>());
            let auth = if oauth { AuthType::OAuth } else { AuthType::ApiKey };
            let head = build_upstream_head(
                &Uri::from_static("/o/u/v1/messages"),
                &client,
                Endpoint::Messages,
                &account(Provider::Anthropic, auth, None),
            )
            .unwrap();
            for (name, value) in head.headers.iter() {
                prop_assert!(!contains_marker(value), "{name}: {value:?}");
                let allowed = FORWARDED_HEADERS.iter().any(|f| f.as_str() == name)
                    || name == ACCEPT_ENCODING.as_str()
                    || (name == X_API_KEY.as_str() && !oauth)
                    || (name == AUTHORIZATION.as_str() && oauth);
                prop_assert!(allowed, "{name} must not be sent");
            }
            prop_assert_eq!(head.headers.get_all(ACCEPT_ENCODING.as_str()).count(), 1);
            prop_assert!(head.headers.contains_key(ANTHROPIC_VERSION.as_str()));
            // The lines read back as a map of the same lines reads.
            let map = head.headers.to_header_map();
            prop_assert_eq!(map.len(), head.headers.len());
            for (name, value) in head.headers.iter() {
                prop_assert!(map.get_all(name).iter().any(|v| v.as_bytes() == value));
            }
            // Forwarded values are the client's own, untouched (beta aside for OAuth).
            for name in [CONTENT_TYPE, ACCEPT, USER_AGENT] {
                let expected: Vec<&[u8]> = client.get_all(&name).iter().filter(|v| !contains_lb_key(v)).map(HeaderValue::as_bytes).collect();
                prop_assert_eq!(head.headers.get_all(name.as_str()).collect::<Vec<_>>(), expected);
            }
            if oauth {
                let flags = |values: Vec<&HeaderValue>| -> Vec<String> {
                    let mut seen = Vec::new();
                    for v in values {
                        for f in v.to_str().unwrap().split(',') {
                            let f = f.trim().to_string();
                            if !f.is_empty() && !seen.contains(&f) {
                                seen.push(f);
                            }
                        }
                    }
                    seen
                };
                let mut expected = flags(client.get_all(&ANTHROPIC_BETA).iter().filter(|v| !contains_lb_key(v)).collect());
                if !expected.iter().any(|f| f == OAUTH_BETA) {
                    expected.push(OAUTH_BETA.to_string());
                }
                let got: Vec<&[u8]> = head.headers.get_all(ANTHROPIC_BETA.as_str()).collect();
                prop_assert_eq!(got.len(), 1);
                let expected = expected.join(",");
                prop_assert_eq!(got[0], expected.as_bytes());
            }
        }
    }
}
