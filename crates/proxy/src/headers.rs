//! Response headers: the allowlist of upstream headers a client may see, keypool's own
//! `x-request-id`, and the legacy-route deprecation headers.
//!
//! **Decision: only `content-type` of a successful upstream answer reaches the client.**
//! Everything else an upstream sends identifies or describes one account of the pool:
//! its `request-id` (Anthropic support can map it to the account's organisation), the
//! `anthropic-ratelimit-*` window and quota headers (one account's usage, meaningless
//! for a pool and misleading for clients that display it), `anthropic-organization-id`,
//! cookies, `set-cookie`, `cf-*`/`via`/`server` and hop-by-hop headers. The upstream
//! `request-id` is written to keypool's log line instead, next to keypool's own
//! `x-request-id`, so operators can correlate.

use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue};

/// keypool's own request id, on every response (and as `request_id` in its error
/// bodies).
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// `Deprecation: true` on every legacy-route response.
pub const DEPRECATION: HeaderName = HeaderName::from_static("deprecation");

/// `Sunset: <HTTP date>` on every legacy-route response.
pub const SUNSET: HeaderName = HeaderName::from_static("sunset");

/// The upstream response headers that reach the client on a successful non-streaming
/// answer (see the module docs for why the list is this short).
pub const RESPONSE_HEADER_ALLOWLIST: [HeaderName; 1] = [CONTENT_TYPE];

/// Copies the allowlisted headers of an upstream response into `to`.
pub fn copy_safe_response_headers(from: &HeaderMap, to: &mut HeaderMap) {
    for name in &RESPONSE_HEADER_ALLOWLIST {
        if let Some(value) = from.get(name) {
            to.insert(name.clone(), value.clone());
        }
    }
}

/// Adds `Deprecation: true` and `Sunset: <legacy_routes_until>` (an HTTP date).
pub fn add_legacy_headers(headers: &mut HeaderMap, sunset_unix_secs: u64) {
    headers.insert(DEPRECATION, HeaderValue::from_static("true"));
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(sunset_unix_secs);
    if let Ok(value) = HeaderValue::from_str(&httpdate::fmt_http_date(when)) {
        headers.insert(SUNSET, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_content_type_passes() {
        let mut upstream = HeaderMap::new();
        for (name, value) in [
            ("content-type", "application/json"),
            ("request-id", "req_upstream_123"),
            ("anthropic-organization-id", "org-uuid"),
            ("anthropic-ratelimit-unified-5h-utilization", "0.4"),
            ("set-cookie", "session=abc"),
            ("x-api-key", "sk-ant-secret"),
            ("authorization", "Bearer sk-ant-oat01-secret"),
            ("via", "1.1 google"),
            ("cf-ray", "abc"),
            ("connection", "keep-alive"),
            ("content-length", "12"),
        ] {
            upstream.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let mut out = HeaderMap::new();
        copy_safe_response_headers(&upstream, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[CONTENT_TYPE], "application/json");
    }

    #[test]
    fn legacy_headers_match_the_spec() {
        let mut headers = HeaderMap::new();
        add_legacy_headers(&mut headers, 1_798_761_599);
        assert_eq!(headers[DEPRECATION], "true");
        assert_eq!(headers[SUNSET], "Thu, 31 Dec 2026 23:59:59 GMT");
    }
}
