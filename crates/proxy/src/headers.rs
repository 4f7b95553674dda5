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

use keypool_providers::HeaderLines as _;

use crate::h1::HeadLines;

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

/// The largest header map a thread keeps as a spare ([`crate::spares`]).
const MAX_SPARE_MAP: usize = 32;

thread_local! {
    /// Header maps of answers this thread wrote, for the next answers it makes.
    static SPARE_MAPS: crate::spares::Spares<HeaderMap> = const { crate::spares::Spares::new() };
}

/// An empty header map for an answer: the thread's spare when it has one (its storage
/// allocated already), else a new one.
pub(crate) fn header_map() -> HeaderMap {
    crate::spares::take(&SPARE_MAPS).unwrap_or_default()
}

/// Keeps an answer's header map, emptied, for the thread's next answers (not a large
/// one).
pub(crate) fn give_back(mut map: HeaderMap) {
    if map.capacity() == 0 || map.capacity() > MAX_SPARE_MAP {
        return;
    }
    map.clear();
    crate::spares::keep(&SPARE_MAPS, map);
}

/// Copies the allowlisted headers of an upstream response into `to` (the first value
/// of each, sharing the upstream head's bytes).
pub(crate) fn copy_safe_response_headers(from: &HeadLines, to: &mut HeaderMap) {
    for name in &RESPONSE_HEADER_ALLOWLIST {
        if let Some(value) = from
            .first(name.as_str())
            .and_then(|value| from.to_value(value))
        {
            to.insert(name.clone(), value);
        }
    }
}

/// Adds `Deprecation: true` and `Sunset: <legacy_routes_until>` (an HTTP date).
pub fn add_legacy_headers(headers: &mut HeaderMap, sunset_unix_secs: u64) {
    headers.insert(DEPRECATION, HeaderValue::from_static("true"));
    if let Some(value) = sunset_value(sunset_unix_secs) {
        headers.insert(SUNSET, value);
    }
}

thread_local! {
    /// The sunset this thread formatted last, and its HTTP date: the configuration's
    /// `legacy_routes_until`, which changes only with a reload, so legacy responses do
    /// not format the same date each time (~1,000 instructions).
    static SUNSET_VALUE: std::cell::RefCell<Option<(u64, HeaderValue)>> =
        const { std::cell::RefCell::new(None) };
}

/// `Sunset`'s value for `unix_secs`; `None` for a time no `SystemTime` can hold.
fn sunset_value(unix_secs: u64) -> Option<HeaderValue> {
    SUNSET_VALUE.with_borrow_mut(|cached| {
        if let Some((secs, value)) = cached.as_ref()
            && *secs == unix_secs
        {
            return Some(value.clone());
        }
        let when = std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(unix_secs))?;
        let value = HeaderValue::from_str(&httpdate::fmt_http_date(when)).ok()?;
        *cached = Some((unix_secs, value.clone()));
        Some(value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_map_given_back_serves_the_next_answer_empty() {
        while crate::spares::take(&SPARE_MAPS).is_some() {}
        assert_eq!(header_map().capacity(), 0, "none spare: a new map");
        let mut map = header_map();
        map.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        map.insert(X_REQUEST_ID, HeaderValue::from_static("req_1"));
        let room = map.capacity();
        give_back(map);
        let again = header_map();
        assert!(again.is_empty());
        assert_eq!(again.capacity(), room, "its storage kept");
        // a large map is not kept
        let mut large = HeaderMap::with_capacity(MAX_SPARE_MAP * 2);
        large.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        give_back(large);
        assert_eq!(header_map().capacity(), 0);
    }

    #[test]
    fn only_content_type_passes() {
        let mut raw = String::from("HTTP/1.1 200 OK\r\n");
        for (name, value) in [
            ("Content-Type", "application/json"),
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
            ("content-type", "text/html"),
        ] {
            raw.push_str(&format!("{name}: {value}\r\n"));
        }
        raw.push_str("\r\n");
        let mut buf = bytes::BytesMut::from(raw.as_bytes());
        let crate::h1::Parsed::Head(head) = crate::h1::parse_head(&mut buf).unwrap() else {
            panic!("a whole head");
        };
        let upstream = head.headers;
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

    #[test]
    fn a_reloaded_sunset_gets_its_own_date() {
        for (secs, date) in [
            (1_798_761_599, "Thu, 31 Dec 2026 23:59:59 GMT"),
            (1_798_761_599, "Thu, 31 Dec 2026 23:59:59 GMT"),
            (1_767_225_599, "Wed, 31 Dec 2025 23:59:59 GMT"),
            (1_798_761_599, "Thu, 31 Dec 2026 23:59:59 GMT"),
            (0, "Thu, 01 Jan 1970 00:00:00 GMT"),
        ] {
            let mut headers = HeaderMap::new();
            add_legacy_headers(&mut headers, secs);
            assert_eq!(headers[SUNSET], date, "{secs}");
        }
        // Past what a SystemTime holds: the Deprecation header alone, no panic.
        let mut headers = HeaderMap::new();
        add_legacy_headers(&mut headers, u64::MAX);
        assert_eq!(headers[DEPRECATION], "true");
        assert!(headers.get(SUNSET).is_none());
    }
}
