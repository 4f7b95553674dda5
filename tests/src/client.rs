//! A small HTTP/1.1 client for the suites: JSON and streaming requests against keypool,
//! answers as [`Reply`] (status, headers, body) with the SSE frames decoded by
//! `keypool-sse`.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use keypool_sse::Decoder;
use serde_json::Value;

/// Longest a suite waits for one whole answer before the test fails: every test is
/// bounded in time even when keypool hangs.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A plain-HTTP client (no connection reuse, so that every request is independent).
#[derive(Clone)]
pub struct Client {
    inner: HyperClient<HttpConnector, Full<Bytes>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

impl Default for Client {
    fn default() -> Self {
        Self::new()
    }
}

impl Client {
    /// A new client. Must be called inside a tokio runtime.
    pub fn new() -> Self {
        let inner = HyperClient::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build_http();
        Self { inner }
    }

    /// Starts a request.
    pub fn request(&self, method: Method, url: impl Into<String>) -> RequestBuilder {
        RequestBuilder {
            client: self.clone(),
            method,
            url: url.into(),
            headers: HeaderMap::new(),
            body: Bytes::new(),
        }
    }

    /// Starts a `POST`.
    pub fn post(&self, url: impl Into<String>) -> RequestBuilder {
        self.request(Method::POST, url)
    }
}

/// One request being built.
#[derive(Debug)]
pub struct RequestBuilder {
    client: Client,
    method: Method,
    url: String,
    headers: HeaderMap,
    body: Bytes,
}

impl RequestBuilder {
    /// Adds a header.
    ///
    /// # Panics
    /// If the name or value is not valid in HTTP.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        let name = HeaderName::from_bytes(name.as_bytes()).expect("valid header name");
        let value = HeaderValue::from_str(value).expect("valid header value");
        self.headers.append(name, value);
        self
    }

    /// Sends `key` as `x-api-key`.
    pub fn api_key(self, key: &str) -> Self {
        self.header("x-api-key", key)
    }

    /// Sends `token` as `Authorization: Bearer <token>`.
    pub fn bearer(self, token: &str) -> Self {
        self.header("authorization", &format!("Bearer {token}"))
    }

    /// A JSON body (`content-type: application/json`).
    pub fn json(mut self, value: &Value) -> Self {
        self.headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        self.body = Bytes::from(serde_json::to_vec(value).expect("JSON serialises"));
        self
    }

    /// A raw body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    fn build(self) -> (Client, Request<Full<Bytes>>) {
        let mut request = Request::builder()
            .method(self.method)
            .uri(&self.url)
            .body(Full::new(self.body))
            .expect("valid request");
        *request.headers_mut() = self.headers;
        (self.client, request)
    }

    /// Sends the request and reads the whole answer (bounded by [`REQUEST_TIMEOUT`]).
    ///
    /// # Panics
    /// If the connection fails or the answer does not complete in time.
    pub async fn send(self) -> Reply {
        let url = self.url.clone();
        tokio::time::timeout(REQUEST_TIMEOUT, async move {
            let streaming = self.send_streaming().await;
            streaming.read_to_end().await
        })
        .await
        .unwrap_or_else(|_| panic!("no complete answer from {url} within {REQUEST_TIMEOUT:?}"))
    }

    /// Sends the request and returns as soon as the response head arrived; the body is
    /// read frame by frame with [`StreamingReply::next_frame`].
    ///
    /// # Panics
    /// If the connection fails or no head arrives within [`REQUEST_TIMEOUT`].
    pub async fn send_streaming(self) -> StreamingReply {
        let url = self.url.clone();
        let (client, request) = self.build();
        let response = tokio::time::timeout(REQUEST_TIMEOUT, client.inner.request(request))
            .await
            .unwrap_or_else(|_| panic!("no response head from {url} within {REQUEST_TIMEOUT:?}"))
            .unwrap_or_else(|e| panic!("request to {url} failed: {e:?}"));
        let (parts, body) = response.into_parts();
        StreamingReply {
            status: parts.status,
            headers: parts.headers,
            body,
            raw: BytesMut::new(),
            decoder: Decoder::new(),
            ended: false,
        }
    }
}

/// One decoded SSE frame of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseFrame {
    /// `event:` name.
    pub event: Option<String>,
    /// `data:` text (lines joined with `\n`).
    pub data: Option<String>,
    /// The frame's bytes as received.
    pub raw: Bytes,
}

impl SseFrame {
    /// `data` parsed as JSON.
    ///
    /// # Panics
    /// If the frame has no data or it is not JSON.
    pub fn json(&self) -> Value {
        let data = self.data.as_deref().expect("frame has data");
        serde_json::from_str(data)
            .unwrap_or_else(|e| panic!("frame data is not JSON ({e}): {data}"))
    }
}

/// An answer whose head arrived and whose body is read as it comes.
#[derive(Debug)]
pub struct StreamingReply {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    body: Incoming,
    raw: BytesMut,
    decoder: Decoder,
    ended: bool,
}

impl StreamingReply {
    /// The next complete SSE frame, `None` at the end of the body (bounded by
    /// [`REQUEST_TIMEOUT`]).
    ///
    /// # Panics
    /// If the body fails, does not decode as SSE, or stalls past the timeout.
    pub async fn next_frame(&mut self) -> Option<SseFrame> {
        loop {
            if let Some(frame) = self.decoder.next_frame().expect("valid SSE") {
                return Some(to_frame(frame));
            }
            if self.ended {
                return self.decoder.finish().expect("valid SSE end").map(to_frame);
            }
            match self.next_chunk().await {
                Some(chunk) => self.decoder.push(&chunk),
                None => self.ended = true,
            }
        }
    }

    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            let frame = tokio::time::timeout(REQUEST_TIMEOUT, self.body.frame())
                .await
                .expect("the body stalled past the request timeout")?;
            let frame = frame.unwrap_or_else(|e| panic!("the answer's body failed: {e:?}"));
            if let Ok(data) = frame.into_data() {
                self.raw.extend_from_slice(&data);
                return Some(data);
            }
        }
    }

    /// Reads the rest of the body.
    pub async fn read_to_end(mut self) -> Reply {
        while !self.ended {
            if self.next_chunk().await.is_none() {
                self.ended = true;
            }
        }
        Reply {
            status: self.status,
            headers: self.headers,
            body: self.raw.freeze(),
        }
    }
}

fn to_frame(frame: keypool_sse::Frame) -> SseFrame {
    SseFrame {
        event: frame.event().map(|e| e.into_owned()),
        data: frame.data_str(),
        raw: frame.raw().clone(),
    }
}

/// A complete answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Reply {
    /// The first value of header `name` as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The header names, sorted, for exact comparisons.
    pub fn header_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.headers.keys().map(|n| n.as_str().to_owned()).collect();
        names.sort();
        names.dedup();
        names
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON.
    ///
    /// # Panics
    /// If it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }

    /// The SSE frames of the body.
    ///
    /// # Panics
    /// If the body is not valid SSE.
    pub fn frames(&self) -> Vec<SseFrame> {
        keypool_sse::decode_all(&self.body)
            .expect("valid SSE body")
            .into_iter()
            .map(to_frame)
            .collect()
    }

    /// The `event:` names of the SSE frames, in order.
    pub fn events(&self) -> Vec<String> {
        self.frames()
            .into_iter()
            .map(|f| f.event.unwrap_or_default())
            .collect()
    }

    /// Asserts that this is one of keypool's own errors (SPEC 2): `status`,
    /// `content-type: application/json`, body exactly
    /// `{"type":"error","error":{"type":<error_type>,"message":…},"request_id":<x-request-id>}`;
    /// returns the message.
    ///
    /// # Panics
    /// When any of that does not hold.
    pub fn assert_keypool_error(&self, status: u16, error_type: &str) -> String {
        assert_eq!(
            self.status.as_u16(),
            status,
            "status; body: {}",
            self.text()
        );
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "content-type of an error body"
        );
        let id = self.header("x-request-id").expect("x-request-id header");
        let body = self.json();
        let message = body["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("error.message missing: {body}"))
            .to_owned();
        assert_eq!(
            body,
            serde_json::json!({
                "type": "error",
                "error": {"type": error_type, "message": message},
                "request_id": id,
            }),
            "shape of keypool's error body"
        );
        message
    }

    /// The body with the request id (header and body) replaced by a fixed marker, and
    /// the headers that legitimately differ between two answers (`x-request-id`, `date`)
    /// removed: two answers that must be byte-identical except their request ids compare
    /// equal through this.
    pub fn without_request_id(&self) -> Comparable {
        let id = self.header("x-request-id").unwrap_or("").to_owned();
        let mut headers: Vec<(String, Vec<u8>)> = self
            .headers
            .iter()
            .filter(|(n, _)| *n != "x-request-id" && *n != "date")
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect();
        headers.sort();
        let body = if id.is_empty() {
            self.body.to_vec()
        } else {
            replace_all(&self.body, id.as_bytes(), b"<request-id>")
        };
        Comparable {
            status: self.status,
            headers,
            body,
        }
    }
}

/// An answer reduced to what must be identical between two answers that differ only in
/// their request ids (see [`Reply::without_request_id`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comparable {
    /// Status.
    pub status: StatusCode,
    /// Headers except `x-request-id` and `date`, sorted.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body with the request id replaced by `<request-id>`.
    pub body: Vec<u8>,
}

fn replace_all(hay: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

/// A minimal Messages request body for `model`.
pub fn message_body(model: &str, stream: bool) -> Value {
    serde_json::json!({
        "model": model,
        "max_tokens": 64,
        "stream": stream,
        "messages": [{"role": "user", "content": "Hello"}],
    })
}

/// Account `id` in a `GET /admin/accounts` overview (every org, every group).
///
/// # Panics
/// If the overview has no such account.
pub fn admin_account<'a>(overview: &'a Value, id: &str) -> &'a Value {
    let list = |v: &'a Value| v.as_array().map_or(&[][..], Vec::as_slice);
    list(&overview["orgs"])
        .iter()
        .flat_map(|o| list(&o["groups"]))
        .flat_map(|g| list(&g["accounts"]))
        .find(|a| a["id"] == id)
        .unwrap_or_else(|| panic!("no account {id} in {overview}"))
}
