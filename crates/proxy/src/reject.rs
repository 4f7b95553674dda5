//! [`Reject`]: a request keypool answers itself with an error, and
//! [`Reject::respond`], the one place where every such error becomes a response: an
//! Anthropic-shaped JSON body (`{"type":"error","error":{…},"request_id":…}`),
//! `content-type: application/json`, `Retry-After` where a wait is known and
//! `x-should-retry: false` when that wait is longer than a minute (SPEC 3.8).

use std::borrow::Cow;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};
use keypool_core::UnixMs;
use keypool_providers::{ErrorType, ProvidersError, error_body};
use keypool_selector::SelectError;
use keypool_store::resolve::{AuthError, ResolveError};

use crate::body::ProxyBody;

/// `x-should-retry`: SDKs honour it; `false` stops their automatic retries.
pub const X_SHOULD_RETRY: http::HeaderName = http::HeaderName::from_static("x-should-retry");

/// Waits longer than this (seconds) get `x-should-retry: false` on a 429 or 503.
pub const SHOULD_RETRY_MAX_WAIT_SECS: u64 = 60;

/// The message of the `404` for an unknown org and an unknown URL alike (SPEC 3.2).
pub const NOT_FOUND_MESSAGE: &str = "Custom URL config not found";

/// A request keypool answers itself with an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// The status.
    pub status: StatusCode,
    /// `error.type`.
    pub error_type: ErrorType,
    /// `error.message`: keypool's own text, never an upstream's (except the
    /// pass-through, which builds its body with `passthrough_body`).
    pub message: Cow<'static, str>,
    /// `Retry-After` in seconds, when a wait is known.
    pub retry_after_secs: Option<u64>,
}

impl Reject {
    /// A rejection with `status`, `error_type` and `message`.
    pub fn new(
        status: StatusCode,
        error_type: ErrorType,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self {
            status,
            error_type,
            message: message.into(),
            retry_after_secs: None,
        }
    }

    /// Adds `Retry-After: secs`.
    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }

    /// `404 not_found_error` "Custom URL config not found": unknown org and unknown URL.
    pub fn url_not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ErrorType::NotFound,
            NOT_FOUND_MESSAGE,
        )
    }

    /// `404` for a path keypool does not serve at all.
    pub fn unknown_path() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ErrorType::NotFound,
            "Not found: keypool serves POST /{org}/{url}/v1/messages and /v1/messages/count_tokens",
        )
    }

    /// `405` for a Messages route called with another method than `POST`.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorType::InvalidRequest,
            "Method not allowed: the Messages API takes POST",
        )
    }

    /// `413 request_too_large`.
    pub fn too_large(limit: u64) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorType::RequestTooLarge,
            format!("Request body is larger than the limit of {limit} bytes"),
        )
    }

    /// `400 invalid_request_error` for a body that could not be read.
    pub fn unreadable_body() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            ErrorType::InvalidRequest,
            "The request body could not be read completely",
        )
    }

    /// `408` when the client stopped sending its body for `idle`.
    pub fn body_timeout(idle: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            ErrorType::InvalidRequest,
            format!(
                "The request body stalled: nothing received for {} ms",
                idle.as_millis()
            ),
        )
    }

    /// `408` when the whole body did not arrive within `body_read_timeout`.
    pub fn body_too_slow(total: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            ErrorType::InvalidRequest,
            format!(
                "The request body took longer than {} s to arrive (body_read_timeout_secs)",
                total.as_secs()
            ),
        )
    }

    /// `503 overloaded_error` with `Retry-After: 1` when the bodies held by the whole
    /// process would exceed `max_body_bytes_in_flight` with this one.
    pub fn bodies_over_budget() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorType::Overloaded,
            "keypool is holding as many request bodies in memory as it may; retry shortly",
        )
        .with_retry_after(1)
    }

    /// `410` after `legacy_routes_until`, naming the new URL form.
    pub fn legacy_gone(url: &str) -> Self {
        Self::new(
            StatusCode::GONE,
            ErrorType::InvalidRequest,
            format!(
                "Legacy routes without an organisation were removed: use /{{org}}/{url}/v1/messages"
            ),
        )
    }

    /// The generic `503 overloaded_error` with `Retry-After` (at least 1 s).
    pub fn overloaded(retry_after_secs: u64) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorType::Overloaded,
            keypool_providers::sanitise::OVERLOADED_MESSAGE,
        )
        .with_retry_after(retry_after_secs.max(1))
    }

    /// `500 api_error` for a bug in keypool itself (never expected).
    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorType::Api,
            "Internal error in keypool; see its log for this request id",
        )
    }

    /// `429 rate_limit_error` when every available account is at its `max_concurrent`
    /// and no slot came free within `queue_max_wait_ms` (or the queue was full), with
    /// `Retry-After: 1`.
    pub fn at_capacity(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, ErrorType::RateLimit, message).with_retry_after(1)
    }

    /// The `429` of SPEC 3.5.2: every account is out of a usage window.
    pub fn all_out_of_window(window: &str, retry_after_secs: u64, returns_at: UnixMs) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorType::RateLimit,
            format!(
                "Every account of this pool is out of its {window} usage window; the first returns at {}",
                format_utc(returns_at)
            ),
        )
        .with_retry_after(retry_after_secs.max(1))
    }
}

impl From<ResolveError> for Reject {
    fn from(e: ResolveError) -> Self {
        match e {
            ResolveError::NotFound => Reject::url_not_found(),
            ResolveError::LegacyConflict => Reject::new(
                StatusCode::CONFLICT,
                ErrorType::InvalidRequest,
                "This custom URL exists in several organisations: migrate to /{org}/{url}/v1/messages",
            ),
            ResolveError::NoPool => {
                Reject::new(StatusCode::FORBIDDEN, ErrorType::Permission, e.to_string())
            }
        }
    }
}

impl From<AuthError> for Reject {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Unauthenticated => Reject::new(
                StatusCode::UNAUTHORIZED,
                ErrorType::Authentication,
                "invalid x-api-key",
            ),
            AuthError::OrgSuspended => {
                Reject::new(StatusCode::FORBIDDEN, ErrorType::Permission, e.to_string())
            }
        }
    }
}

impl From<ProvidersError> for Reject {
    fn from(e: ProvidersError) -> Self {
        if e.is_client_error() {
            Reject::new(
                StatusCode::BAD_REQUEST,
                ErrorType::InvalidRequest,
                e.to_string(),
            )
        } else {
            // An account configuration problem: nothing of it reaches the client.
            tracing::error!(error = %e, "account configuration error");
            Reject::overloaded(1)
        }
    }
}

impl From<SelectError> for Reject {
    fn from(e: SelectError) -> Self {
        match e {
            SelectError::AllOutOfWindow {
                window,
                family,
                retry_after_secs,
                returns_at,
            } => Reject::all_out_of_window(
                &keypool_selector::window_name(window, family),
                retry_after_secs,
                returns_at,
            ),
            other => {
                tracing::warn!(reason = %other, "no account can serve this pool");
                Reject::overloaded(1)
            }
        }
    }
}

impl Reject {
    /// The rejection as its response (without `x-request-id`, which the caller adds to
    /// every response alike): the Anthropic-shaped body with `request_id`,
    /// `Retry-After` when a wait is known, `x-should-retry: false` past a minute.
    pub fn respond(&self, request_id: &str) -> Response<ProxyBody> {
        let body = error_body(self.error_type, &self.message, Some(request_id));
        json_error(self.status, body, self.retry_after_secs)
    }
}

/// An error response with an already built Anthropic-shaped `body`.
pub(crate) fn json_error(
    status: StatusCode,
    body: Bytes,
    retry_after_secs: Option<u64>,
) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(secs) = retry_after_secs {
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        if secs > SHOULD_RETRY_MAX_WAIT_SECS && matches!(status.as_u16(), 429 | 503) {
            headers.insert(X_SHOULD_RETRY, HeaderValue::from_static("false"));
        }
    }
    response
}

/// `2026-12-31T23:59:59Z` for unix ms (UTC, proleptic Gregorian).
pub fn format_utc(ms: UnixMs) -> String {
    let t = keypool_core::UtcDateTime::from_unix_secs(ms / 1000);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body_json(response: Response<ProxyBody>) -> serde_json::Value {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn respond_writes_an_anthropic_shaped_body_with_the_request_id() {
        let response = Reject::url_not_found().respond("req_1");
        assert_eq!(response.status(), 404);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        assert!(!response.headers().contains_key(RETRY_AFTER));
        assert_eq!(
            body_json(response).await,
            serde_json::json!({
                "type": "error",
                "error": {"type": "not_found_error", "message": "Custom URL config not found"},
                "request_id": "req_1"
            })
        );
    }

    #[tokio::test]
    async fn long_waits_stop_sdk_retries() {
        let short = Reject::overloaded(60).respond("r");
        assert_eq!(short.headers()[RETRY_AFTER], "60");
        assert!(!short.headers().contains_key(&X_SHOULD_RETRY));
        let long = Reject::overloaded(61).respond("r");
        assert_eq!(long.headers()[RETRY_AFTER], "61");
        assert_eq!(long.headers()[&X_SHOULD_RETRY], "false");
        let window = Reject::all_out_of_window("5h", 3600, 0).respond("r");
        assert_eq!(window.status(), 429);
        assert_eq!(window.headers()[&X_SHOULD_RETRY], "false");
        // At least one second, even when the wait already passed.
        assert_eq!(
            Reject::overloaded(0).respond("r").headers()[RETRY_AFTER],
            "1"
        );
        let json = body_json(window).await;
        assert_eq!(json["error"]["type"], "rate_limit_error");
        assert_eq!(
            json["error"]["message"],
            "Every account of this pool is out of its 5h usage window; the first returns at 1970-01-01T00:00:00Z"
        );
    }

    #[tokio::test]
    async fn errors_map_to_the_spec_statuses() {
        let cases: [(Reject, u16, &str); 7] = [
            (ResolveError::NotFound.into(), 404, "not_found_error"),
            (
                ResolveError::LegacyConflict.into(),
                409,
                "invalid_request_error",
            ),
            (ResolveError::NoPool.into(), 403, "permission_error"),
            (
                AuthError::Unauthenticated.into(),
                401,
                "authentication_error",
            ),
            (AuthError::OrgSuspended.into(), 403, "permission_error"),
            (
                ProvidersError::MissingModel.into(),
                400,
                "invalid_request_error",
            ),
            (
                ProvidersError::MissingBaseUrl.into(),
                503,
                "overloaded_error",
            ),
        ];
        for (reject, status, kind) in cases {
            let message = reject.message.clone();
            let response = reject.respond("r");
            assert_eq!(response.status(), status, "{message}");
            assert_eq!(body_json(response).await["error"]["type"], kind);
        }
        let suspended: Reject = AuthError::OrgSuspended.into();
        assert!(suspended.message.contains("ORG_SUSPENDED"));
        let gone = Reject::legacy_gone("team");
        assert_eq!(gone.status, 410);
        assert!(gone.message.contains("/{org}/team/v1/messages"));
    }

    #[test]
    fn utc_formatting() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(1_798_761_599_000), "2026-12-31T23:59:59Z");
        assert_eq!(format_utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_709_251_199_999), "2024-02-29T23:59:59Z");
    }
}
