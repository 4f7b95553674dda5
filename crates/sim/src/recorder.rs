//! The in-memory log of every request the simulator received, bounded.

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;
use http::{HeaderMap, Method};
use keypool_core::AccountId;
use tokio::time::Instant;

/// One request as it arrived.
///
/// It holds the credentials that arrived (the simulator's accounts use fake ones): the
/// point is that tests can look at exactly what an upstream would have seen.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// Arrival order, from 0, over the simulator's lifetime.
    pub seq: u64,
    /// HTTP method.
    pub method: Method,
    /// Path and query string, as received (`/v1/messages?beta=true`).
    pub path_and_query: String,
    /// All request headers.
    pub headers: HeaderMap,
    /// The whole request body.
    pub body: Bytes,
    /// The account the credential identified (`"*"` for the any-credential fallback),
    /// `None` when the credential was missing or unknown.
    pub account: Option<AccountId>,
    /// When the request (head and body) had arrived, on the tokio clock.
    pub received_at: Instant,
}

impl RecordedRequest {
    /// The first value of header `name`, when it is valid text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Whether `needle` occurs in the path and query, any header name or value, or the body.
    pub fn contains(&self, needle: &[u8]) -> bool {
        let found =
            |hay: &[u8]| !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle);
        found(self.path_and_query.as_bytes())
            || self
                .headers
                .iter()
                .any(|(n, v)| found(n.as_str().as_bytes()) || found(v.as_bytes()))
            || found(&self.body)
    }

    /// The body parsed as JSON.
    pub fn body_json(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

/// A bounded FIFO of recorded requests: past `limit` the oldest are dropped.
#[derive(Debug)]
pub(crate) struct Recorder {
    limit: usize,
    log: Mutex<VecDeque<RecordedRequest>>,
}

impl Recorder {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            log: Mutex::new(VecDeque::new()),
        }
    }

    /// Whether anything is kept (a limit of 0 turns recording off).
    pub(crate) fn enabled(&self) -> bool {
        self.limit > 0
    }

    pub(crate) fn push(&self, request: RecordedRequest) {
        if !self.enabled() {
            return;
        }
        let mut log = self.lock();
        while log.len() >= self.limit {
            log.pop_front();
        }
        log.push_back(request);
    }

    pub(crate) fn snapshot(&self) -> Vec<RecordedRequest> {
        self.lock().iter().cloned().collect()
    }

    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<RecordedRequest>> {
        // A panic while holding the lock cannot leave the deque half-updated.
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(seq: u64, body: &'static str) -> RecordedRequest {
        RecordedRequest {
            seq,
            method: Method::POST,
            path_and_query: "/v1/messages?beta=true".into(),
            headers: HeaderMap::new(),
            body: Bytes::from_static(body.as_bytes()),
            account: None,
            received_at: Instant::now(),
        }
    }

    #[test]
    fn keeps_only_the_newest_up_to_the_limit() {
        let r = Recorder::new(2);
        for i in 0..5 {
            r.push(req(i, "{}"));
        }
        let seqs: Vec<u64> = r.snapshot().iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [3, 4]);
        r.clear();
        assert!(r.snapshot().is_empty());
    }

    #[test]
    fn limit_zero_records_nothing() {
        let r = Recorder::new(0);
        r.push(req(0, "{}"));
        assert!(r.snapshot().is_empty());
    }

    #[test]
    fn contains_looks_at_path_headers_and_body() {
        let mut r = req(0, r#"{"k":"sk-lb-body"}"#);
        assert!(r.contains(b"sk-lb-body"));
        assert!(r.contains(b"beta=true"));
        assert!(!r.contains(b"sk-lb-header"));
        r.headers
            .insert("x-custom", "Bearer sk-lb-header".parse().unwrap());
        assert!(r.contains(b"sk-lb-header"));
        assert!(!r.contains(b""));
    }
}
