//! The error bodies keypool writes itself, all Anthropic-shaped (SPEC 2 and 3.8):
//! `{"type":"error","error":{"type":"<type>","message":"<text>"},"request_id":"<id>"}`.
//!
//! Nothing of an upstream leaks through these, except the one thing SPEC 3.8 allows: the
//! `error.message` text of a terminal 429/402 (or another `passthrough_statuses` code),
//! bounded and re-escaped by [`passthrough_body`].

use bytes::Bytes;
use http::StatusCode;
use serde::Serialize;

use crate::response::upstream_error;
use crate::upstream::{DEFAULT_BASE_URL, UpstreamAccount};

/// The message of the generic `503 overloaded_error`.
pub const OVERLOADED_MESSAGE: &str = "Overloaded";

/// Anthropic's error types (`error.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorType {
    /// `invalid_request_error` (400, and keypool's 409/410).
    InvalidRequest,
    /// `authentication_error` (401).
    Authentication,
    /// `billing_error` (402).
    Billing,
    /// `permission_error` (403).
    Permission,
    /// `not_found_error` (404).
    NotFound,
    /// `request_too_large` (413).
    RequestTooLarge,
    /// `rate_limit_error` (429).
    RateLimit,
    /// `api_error` (500 and other 5xx).
    Api,
    /// `timeout_error` (504).
    Timeout,
    /// `overloaded_error` (503, 529).
    Overloaded,
}

impl ErrorType {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request_error",
            Self::Authentication => "authentication_error",
            Self::Billing => "billing_error",
            Self::Permission => "permission_error",
            Self::NotFound => "not_found_error",
            Self::RequestTooLarge => "request_too_large",
            Self::RateLimit => "rate_limit_error",
            Self::Api => "api_error",
            Self::Timeout => "timeout_error",
            Self::Overloaded => "overloaded_error",
        }
    }

    /// The error type of a wire name (`error.type` of an Anthropic error body), `None`
    /// for a name Anthropic does not use.
    pub fn from_wire(name: &str) -> Option<Self> {
        [
            Self::InvalidRequest,
            Self::Authentication,
            Self::Billing,
            Self::Permission,
            Self::NotFound,
            Self::RequestTooLarge,
            Self::RateLimit,
            Self::Api,
            Self::Timeout,
            Self::Overloaded,
        ]
        .into_iter()
        .find(|t| t.as_str() == name)
    }

    /// The error type Anthropic uses for a status code (`api_error` for statuses it
    /// does not name, `invalid_request_error` for other 4xx).
    pub fn for_status(status: StatusCode) -> Self {
        match status.as_u16() {
            401 => Self::Authentication,
            402 => Self::Billing,
            403 => Self::Permission,
            404 => Self::NotFound,
            413 => Self::RequestTooLarge,
            429 => Self::RateLimit,
            503 | 529 => Self::Overloaded,
            504 => Self::Timeout,
            400..=499 => Self::InvalidRequest,
            _ => Self::Api,
        }
    }
}

#[derive(Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: ErrorObject<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<&'a str>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
}

/// An Anthropic-shaped error body; `request_id` (the `x-request-id` keypool answers
/// with) is included when given. Serve it with `content-type: application/json`.
pub fn error_body(error_type: ErrorType, message: &str, request_id: Option<&str>) -> Bytes {
    let body = Body {
        kind: "error",
        error: ErrorObject {
            kind: error_type.as_str(),
            message,
        },
        request_id,
    };
    // Serialising strings and static names cannot fail.
    Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
}

/// The generic body of keypool's `503` when every attempt failed:
/// `overloaded_error` / `Overloaded`, nothing of any upstream.
pub fn overloaded_body(request_id: Option<&str>) -> Bytes {
    error_body(ErrorType::Overloaded, OVERLOADED_MESSAGE, request_id)
}

/// The body for a terminal upstream failure whose status is passed through (`429`,
/// `402` by default, SPEC 3.8): the error type that status has, and **only** the
/// upstream's `error.message` text, cut to
/// [`MAX_UPSTREAM_ERROR_TEXT`](crate::response::MAX_UPSTREAM_ERROR_TEXT) bytes, cleaned
/// by [`redact_upstream_text`] of everything about the `account` it was sent with, and
/// escaped anew. Without a usable message (or when it cannot be cleaned), the status's
/// canonical reason is used.
pub fn passthrough_body(
    status: StatusCode,
    upstream_body: &[u8],
    request_id: Option<&str>,
    account: &UpstreamAccount<'_>,
) -> Bytes {
    let message = upstream_error(upstream_body)
        .and_then(|error| error.message)
        .filter(|message| !message.trim().is_empty())
        .and_then(|message| redact_upstream_text(&message, account));
    let fallback = status.canonical_reason().unwrap_or("Upstream error");
    error_body(
        ErrorType::for_status(status),
        message.as_deref().unwrap_or(fallback),
        request_id,
    )
}

/// What replaces a confidential part of an upstream text.
pub const REDACTED: &str = "[redacted]";

/// Token prefixes that never reach a client in an upstream text: Anthropic credentials
/// (`sk-ant-api03-…`, `sk-ant-oat01-…`) and keypool's own LB keys.
const TOKEN_PREFIXES: [&str; 2] = ["sk-ant-", "sk-lb-"];

/// The shortest run of the account's secret that makes a text unusable: an upstream
/// that echoes a truncated credential (`sk-ant-api03-AbC…xyz`) would otherwise leak a
/// part of it through an exact-match redaction.
const SECRET_WINDOW: usize = 12;

/// An upstream text (an error message) cleaned of everything about the account it was
/// sent with (SPEC 3.8, issue 14): `None` when it holds any run of
/// [`SECRET_WINDOW`] bytes of the account's secret (or the whole secret, when shorter),
/// since no redaction can be sure of a partial echo; otherwise the text with every
/// `sk-ant-…`/`sk-lb-…` token, the account's base URL (or the default one), its
/// authority, host and user info replaced by [`REDACTED`] (case-insensitively for
/// the URL parts).
pub fn redact_upstream_text(text: &str, account: &UpstreamAccount<'_>) -> Option<String> {
    let secret = account.secret.as_bytes();
    let window = SECRET_WINDOW.min(secret.len());
    if window > 0
        && secret
            .windows(window)
            .any(|run| memchr::memmem::find(text.as_bytes(), run).is_some())
    {
        return None;
    }
    let mut text = text.to_owned();
    for part in url_parts(account.base_url.unwrap_or(DEFAULT_BASE_URL)) {
        text = replace_ignoring_ascii_case(&text, part);
    }
    for prefix in TOKEN_PREFIXES {
        text = redact_tokens(&text, prefix);
    }
    Some(text)
}

/// The parts of a base URL that name the upstream: the URL (without a trailing `/`),
/// its authority (`user:pass@host:port`), user info (whole, user, password),
/// `host:port` and host, longest
/// first; parts shorter than 3 bytes are left alone (they would redact ordinary words).
fn url_parts(base_url: &str) -> Vec<&str> {
    let url = base_url.trim_end_matches('/');
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = after_scheme.split(['/', '?', '#']).next().unwrap_or("");
    let (userinfo, host_port) = match authority.rsplit_once('@') {
        Some((userinfo, host_port)) => (Some(userinfo), host_port),
        None => (None, authority),
    };
    let host = match host_port.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => host_port,
    };
    let (user, password) = match userinfo.and_then(|u| u.split_once(':')) {
        Some((user, password)) => (Some(user), Some(password)),
        None => (userinfo, None),
    };
    let mut parts: Vec<&str> = [
        Some(url),
        Some(authority),
        userinfo,
        user,
        password,
        Some(host_port),
        Some(host),
    ]
    .into_iter()
    .flatten()
    .filter(|p| p.len() >= 3)
    .collect();
    parts.sort_by_key(|p| std::cmp::Reverse(p.len()));
    parts.dedup();
    parts
}

/// `text` with every occurrence of `needle`, compared ASCII-case-insensitively, replaced
/// by [`REDACTED`].
fn replace_ignoring_ascii_case(text: &str, needle: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let needle = needle.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    // ASCII lowercasing keeps every byte offset, and a match of ASCII-lowercased needle
    // bytes starts and ends at character boundaries of the original text.
    for at in memchr::memmem::find_iter(lower.as_bytes(), needle.as_bytes()) {
        if at < from {
            continue;
        }
        out.push_str(&text[from..at]);
        out.push_str(REDACTED);
        from = at + needle.len();
    }
    out.push_str(&text[from..]);
    out
}

/// `text` with every `prefix` token (the prefix and the token characters after it:
/// letters, digits, `-`, `_`) replaced by [`REDACTED`].
fn redact_tokens(text: &str, prefix: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        out.push_str(&rest[..at]);
        out.push_str(REDACTED);
        let token = &rest[at + prefix.len()..];
        let end = token
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(token.len());
        rest = &token[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::response::MAX_UPSTREAM_ERROR_TEXT;
    use keypool_core::{AuthType, Provider};
    use proptest::prelude::*;
    use serde_json::{Value, json};

    const SECRET: &str = "sk-ant-api03-Zq8XvT2mLp4Rk9WcYb7NsD1fGh6JtE3uAo5Ii0";

    fn account(base_url: Option<&'static str>) -> UpstreamAccount<'static> {
        UpstreamAccount {
            provider: Provider::Anthropic,
            auth: AuthType::ApiKey,
            secret: SECRET,
            base_url,
        }
    }

    fn message_of(body: &Bytes) -> String {
        let parsed: Value = serde_json::from_slice(body).unwrap();
        parsed["error"]["message"].as_str().unwrap().to_owned()
    }

    fn upstream_429(message: &str) -> Vec<u8> {
        json!({"type":"error","error":{"type":"rate_limit_error","message":message}})
            .to_string()
            .into_bytes()
    }

    /// Issue 14.2: an upstream that echoes what it was sent (the credential, the request
    /// headers with `host`) has none of it reach the client.
    #[test]
    fn passthrough_never_carries_the_account_or_any_credential() {
        let on = |base_url, message: &str| {
            message_of(&passthrough_body(
                StatusCode::TOO_MANY_REQUESTS,
                &upstream_429(message),
                None,
                &account(base_url),
            ))
        };
        // The secret itself, or a truncated echo of it: the message is not used at all.
        assert_eq!(
            on(None, &format!("key {SECRET} is over its limit")),
            "Too Many Requests"
        );
        assert_eq!(
            on(None, "key sk-ant-api03-Zq8XvT2m... is over its limit"),
            "Too Many Requests"
        );
        assert_eq!(
            on(None, "key ...Zq8XvT2mLp4R... is over"),
            "Too Many Requests"
        );
        // Other credentials and LB keys are cut out; the rest of the text stays.
        assert_eq!(
            on(
                None,
                "keys sk-ant-oat01-AAAA_bb-cc and sk-lb-0123456789abcdefABCDEF0123456789 are limited"
            ),
            "keys [redacted] and [redacted] are limited"
        );
        // The echoed request headers: the default host, in any case.
        assert_eq!(
            on(
                None,
                "limit for Host: API.Anthropic.com, see https://api.anthropic.com/v1/messages"
            ),
            "limit for Host: [redacted], see [redacted]/v1/messages"
        );
        // An account's own base URL, its host:port, host and user info.
        let gw = Some("https://user:hunter22@gw.example.net:8443/anthropic/");
        assert_eq!(
            on(
                gw,
                "gw.example.net:8443 via https://user:hunter22@gw.example.net:8443/anthropic says slow down (hunter22, GW.EXAMPLE.NET)"
            ),
            "[redacted] via [redacted] says slow down ([redacted], [redacted])"
        );
        // A message with nothing of the kind passes unchanged.
        assert_eq!(
            on(
                gw,
                "Number of request tokens has exceeded your per-minute rate limit"
            ),
            "Number of request tokens has exceeded your per-minute rate limit"
        );
    }

    #[test]
    fn keypool_bodies_are_anthropic_shaped() {
        assert_eq!(
            &overloaded_body(Some("req_1"))[..],
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}"#
        );
        assert_eq!(
            &error_body(ErrorType::NotFound, "Custom URL config not found", None)[..],
            br#"{"type":"error","error":{"type":"not_found_error","message":"Custom URL config not found"}}"#
        );
    }

    #[test]
    fn passthrough_keeps_only_the_message() {
        let upstream = json!({
            "type": "error",
            "error": {"type": "rate_limit_error", "message": "Number of requests has exceeded your \"rate\" limit", "account": "acct-secret"},
            "request_id": "req_upstream"
        });
        let body = passthrough_body(
            StatusCode::TOO_MANY_REQUESTS,
            upstream.to_string().as_bytes(),
            Some("req_kp"),
            &account(None),
        );
        assert_eq!(
            serde_json::from_slice::<Value>(&body).unwrap(),
            json!({"type":"error","error":{"type":"rate_limit_error","message":"Number of requests has exceeded your \"rate\" limit"},"request_id":"req_kp"})
        );
        let body = passthrough_body(
            StatusCode::PAYMENT_REQUIRED,
            b"<html>upstream internals</html>",
            None,
            &account(None),
        );
        assert_eq!(
            &body[..],
            br#"{"type":"error","error":{"type":"billing_error","message":"Payment Required"}}"#
        );
    }

    #[test]
    fn statuses_map_to_anthropic_types() {
        let cases = [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (402, "billing_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (409, "invalid_request_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (503, "overloaded_error"),
            (504, "timeout_error"),
            (529, "overloaded_error"),
        ];
        for (status, name) in cases {
            assert_eq!(
                ErrorType::for_status(StatusCode::from_u16(status).unwrap()).as_str(),
                name
            );
        }
    }

    proptest! {
        /// Whatever an upstream wraps around the secret, tokens, base URL or host, none
        /// of them is in the passed-through text.
        #[test]
        fn redaction_leaves_nothing_of_the_account(
            pieces in proptest::collection::vec(
                prop_oneof![
                    "\\PC{0,20}",
                    Just(SECRET.to_owned()),
                    Just(SECRET[..20].to_owned()),
                    Just(SECRET[10..].to_owned()),
                    "sk-(ant|lb)-[A-Za-z0-9_-]{0,40}",
                    Just("GW.example.NET:8443".to_owned()),
                    Just("https://user:hunter22@gw.example.net:8443/p".to_owned()),
                    Just("hunter22".to_owned()),
                ],
                0..8,
            ),
        ) {
            let text: String = pieces.concat();
            let gw = account(Some("https://user:hunter22@gw.example.net:8443/p"));
            if let Some(out) = redact_upstream_text(&text, &gw) {
                let lower = out.to_ascii_lowercase();
                for secret_run in SECRET.as_bytes().windows(SECRET_WINDOW) {
                    prop_assert!(memchr::memmem::find(out.as_bytes(), secret_run).is_none());
                }
                prop_assert!(!out.contains("sk-ant-") && !out.contains("sk-lb-"), "{}", out);
                prop_assert!(!lower.contains("gw.example.net"), "{}", out);
                prop_assert!(!out.contains("hunter22"), "{}", out);
            }
        }

        #[test]
        fn passthrough_is_valid_json_with_the_bounded_message(message in "\\PC{0,1200}|[\"\\\\\u{0}-\u{1f}]{0,20}") {
            let upstream = json!({"type":"error","error":{"type":"x","message":message}});
            let body = passthrough_body(StatusCode::TOO_MANY_REQUESTS, upstream.to_string().as_bytes(), None, &account(Some("https://upstream.invalid")));
            let parsed: Value = serde_json::from_slice(&body).unwrap();
            let got = parsed["error"]["message"].as_str().unwrap();
            if message.trim().is_empty() {
                prop_assert_eq!(got, "Too Many Requests");
            } else {
                prop_assert!(got.len() <= MAX_UPSTREAM_ERROR_TEXT);
                prop_assert!(message.starts_with(got));
            }
            prop_assert_eq!(parsed.as_object().unwrap().len(), 2);
            prop_assert_eq!(parsed["error"].as_object().unwrap().len(), 2);
        }
    }
}
