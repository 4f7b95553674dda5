//! Error bodies in the OpenAI shape:
//! `{"error":{"message":"…","type":"…","param":…,"code":…}}`.
//!
//! Every error keypool answers on an OpenAI route is first what it would answer on the
//! Messages route (an Anthropic [`ErrorType`] and a message, already sanitised by
//! [`crate::sanitise`]), then re-shaped here with one table:
//!
//! | Anthropic `error.type` | status | OpenAI `type` | OpenAI `code` |
//! | --- | --- | --- | --- |
//! | `invalid_request_error` | 400 | `invalid_request_error` | `null` |
//! | `authentication_error` | 401 | `authentication_error` | `invalid_api_key` |
//! | `billing_error` | 402 | `insufficient_quota` | `insufficient_quota` |
//! | `permission_error` | 403 | `permission_error` | `null` |
//! | `not_found_error` | 404 | `invalid_request_error` | `not_found` |
//! | `request_too_large` | 413 | `invalid_request_error` | `request_too_large` |
//! | `rate_limit_error` | 429 | `rate_limit_error` | `rate_limit_exceeded` |
//! | `api_error` | 500 | `server_error` | `null` |
//! | `timeout_error` | 504 | `server_error` | `timeout` |
//! | `overloaded_error` | 503, 529 → 503 | `server_error` | `overloaded` |
//!
//! The status is kept, except Anthropic's `529`, which OpenAI clients do not know: it
//! becomes `503`. There is no `request_id` in the body (OpenAI bodies have none; the
//! `x-request-id` header carries it).

use bytes::Bytes;
use http::StatusCode;
use serde::Serialize;

use crate::ProvidersError;
use crate::response::upstream_error;
use crate::sanitise::{ErrorType, OVERLOADED_MESSAGE};

/// The OpenAI `type` and `code` of an Anthropic error type (the table above).
pub fn openai_error_kind(error_type: ErrorType) -> (&'static str, Option<&'static str>) {
    match error_type {
        ErrorType::InvalidRequest => ("invalid_request_error", None),
        ErrorType::Authentication => ("authentication_error", Some("invalid_api_key")),
        ErrorType::Billing => ("insufficient_quota", Some("insufficient_quota")),
        ErrorType::Permission => ("permission_error", None),
        ErrorType::NotFound => ("invalid_request_error", Some("not_found")),
        ErrorType::RequestTooLarge => ("invalid_request_error", Some("request_too_large")),
        ErrorType::RateLimit => ("rate_limit_error", Some("rate_limit_exceeded")),
        ErrorType::Api => ("server_error", None),
        ErrorType::Timeout => ("server_error", Some("timeout")),
        ErrorType::Overloaded => ("server_error", Some("overloaded")),
    }
}

#[derive(Serialize)]
struct Envelope<'a> {
    error: ErrorObject<'a>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

/// An OpenAI-shaped error body of `error_type` (mapped by the table) with `message`
/// and `param`. Serve it with `content-type: application/json`.
pub fn error_body(error_type: ErrorType, message: &str, param: Option<&str>) -> Bytes {
    let (kind, code) = openai_error_kind(error_type);
    encode(message, kind, param, code)
}

fn encode(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Bytes {
    let body = Envelope {
        error: ErrorObject {
            message,
            kind,
            param,
            code,
        },
    };
    // Serialising strings cannot fail.
    Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
}

/// The `400` body of a request keypool refused before any upstream call (a
/// [`ProvidersError::is_client_error`] error): `invalid_request_error` with the error's
/// text and [`ProvidersError::param`].
pub fn invalid_request_body(error: &ProvidersError) -> Bytes {
    error_body(ErrorType::InvalidRequest, &error.to_string(), error.param())
}

/// An Anthropic-shaped error answer keypool would send on the Messages route (its own
/// body from [`crate::sanitise`], never an unsanitised upstream body) re-shaped for an
/// OpenAI client: the status to answer (`529` → `503`) and the OpenAI body. The type
/// comes from the body's `error.type`, else from the status; the message from
/// `error.message`, else the status's reason.
pub fn error_from_anthropic(status: StatusCode, body: &[u8]) -> (StatusCode, Bytes) {
    let upstream = upstream_error(body);
    let error_type = upstream
        .as_ref()
        .and_then(|e| e.error_type.as_deref())
        .and_then(ErrorType::from_wire)
        .unwrap_or_else(|| ErrorType::for_status(status));
    let message = upstream
        .and_then(|e| e.message)
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("Error").to_owned());
    let status = if status.as_u16() == 529 {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        status
    };
    (status, error_body(error_type, &message, None))
}

/// An OpenAI stream's error frame, `data: {"error":{…}}\n\n` (the OpenAI SDKs raise an
/// `APIError` on it), for `error_type` with `message`.
pub fn error_frame(error_type: ErrorType, message: &str) -> Bytes {
    data_frame(&error_body(error_type, message, None))
}

/// The generic mid-stream error frame (keypool's `overloaded_error` of SPEC 3.8) in the
/// OpenAI shape.
pub fn overloaded_error_frame() -> Bytes {
    error_frame(ErrorType::Overloaded, OVERLOADED_MESSAGE)
}

/// `data: <json>\n\n`. `json` is compact JSON (no line breaks), as `serde_json` writes it.
pub(crate) fn data_frame(json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}
