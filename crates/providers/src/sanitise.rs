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
/// [`MAX_UPSTREAM_ERROR_TEXT`](crate::response::MAX_UPSTREAM_ERROR_TEXT) bytes and
/// escaped anew. Without a usable message, the status's canonical reason is used.
pub fn passthrough_body(
    status: StatusCode,
    upstream_body: &[u8],
    request_id: Option<&str>,
) -> Bytes {
    let message = upstream_error(upstream_body)
        .and_then(|error| error.message)
        .filter(|message| !message.trim().is_empty());
    let fallback = status.canonical_reason().unwrap_or("Upstream error");
    error_body(
        ErrorType::for_status(status),
        message.as_deref().unwrap_or(fallback),
        request_id,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::response::MAX_UPSTREAM_ERROR_TEXT;
    use proptest::prelude::*;
    use serde_json::{Value, json};

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
        );
        assert_eq!(
            serde_json::from_slice::<Value>(&body).unwrap(),
            json!({"type":"error","error":{"type":"rate_limit_error","message":"Number of requests has exceeded your \"rate\" limit"},"request_id":"req_kp"})
        );
        let body = passthrough_body(
            StatusCode::PAYMENT_REQUIRED,
            b"<html>upstream internals</html>",
            None,
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
        #[test]
        fn passthrough_is_valid_json_with_the_bounded_message(message in "\\PC{0,1200}|[\"\\\\\u{0}-\u{1f}]{0,20}") {
            let upstream = json!({"type":"error","error":{"type":"x","message":message}});
            let body = passthrough_body(StatusCode::TOO_MANY_REQUESTS, upstream.to_string().as_bytes(), None);
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
