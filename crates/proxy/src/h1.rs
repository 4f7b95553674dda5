//! The HTTP/1.1 wire format, without I/O, for both of keypool's HTTP/1.1 roles:
//!
//! - as the upstream's client ([`crate::upstream`]): the request head written into a
//!   reusable buffer, the response head parsed out of the read buffer, how the
//!   response body is framed (RFC 9112 section 6.3);
//! - as the clients' server ([`crate::h1_server`]): the request head parsed (with
//!   hyper's limits and framing rules, which the server replaced), the response head
//!   written;
//! - both: the chunked decoder, and [`BodyReader`], a body's framing read from a
//!   connection's buffer.
//!
//! Everything here works on byte buffers handed in by a connection, so that every rule
//! can be tested on its own, byte by byte and split at any point; the only I/O named is
//! the read that fills a buffer ([`Source`], [`poll_read_into`]).

use std::io;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, Version};
use keypool_providers::UpstreamHeaders;

use crate::headers::X_REQUEST_ID;

/// Most header lines a response head may have (hyper's limit too).
pub(crate) const MAX_HEADERS: usize = 100;
/// The largest body sent in one buffer with its head (copied after it) rather than
/// beside it in a vectored write. On Linux a `writev` of a head and a body costs the
/// kernel 0.3–0.4 µs more than a `send` of the two together (the iovec import and the
/// file layer a socket `send` skips; measured on loopback, 491 bytes, see
/// docs/BENCHMARKS.md), and a request or answer of a few kilobytes copies in far less
/// than that. Larger bodies are not copied (nor kept: the buffer a connection keeps
/// grows by at most this).
pub(crate) const COALESCE_MAX: usize = 4 * 1024;
/// Most bytes a response head may take.
pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most bytes of a chunk-size line (with its extensions) or of one trailer line.
const MAX_LINE_BYTES: usize = 4 * 1024;
/// Most bytes of all trailer lines of a chunked body.
const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// An error of the wire format: the upstream's answer is not HTTP/1.1 keypool can read.
pub(crate) fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// The `Host` header value of `uri`: the host, with the port when it is not the
/// scheme's default (what an HTTP/1.1 client sends when the caller set none). An
/// upstream connection computes it once, when it is made ([`write_head`] is given it).
pub(crate) fn host_header(uri: &Uri) -> Box<[u8]> {
    let Some(host) = uri.host() else {
        return Box::default();
    };
    let default = match uri.scheme_str() {
        Some("https") => 443,
        _ => 80,
    };
    let mut out = host.as_bytes().to_vec();
    if let Some(port) = uri.port_u16().filter(|&p| p != default) {
        out.push(b':');
        write_decimal(&mut out, u64::from(port));
    }
    out.into_boxed_slice()
}

/// Writes the request head of `method` to `uri` with `headers` and a body of
/// `content_length` bytes into `out` (cleared first): the request line in origin
/// form, `host` (the connection's [`host_header`], unless `headers` has one or it is
/// empty), every header of `headers` (names as `http` keeps them, lower case),
/// `content-length`, and the blank line.
///
/// `headers` must not carry framing of its own (`content-length`,
/// `transfer-encoding`, `connection`): the body's length is this function's to say,
/// and any such header is left out.
pub(crate) fn write_head(
    out: &mut Vec<u8>,
    method: &Method,
    uri: &Uri,
    host: &[u8],
    headers: &UpstreamHeaders,
    content_length: usize,
) {
    out.clear();
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    match uri.path_and_query() {
        Some(pq) if !pq.as_str().is_empty() => out.extend_from_slice(pq.as_str().as_bytes()),
        _ => out.push(b'/'),
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if !host.is_empty() && !headers.has_host() {
        out.extend_from_slice(b"host: ");
        out.extend_from_slice(host);
        out.extend_from_slice(b"\r\n");
    }
    // the lines as the adapter wrote them (no framing line among them)
    out.extend_from_slice(headers.as_bytes());
    out.extend_from_slice(b"content-length: ");
    write_decimal(out, content_length as u64);
    out.extend_from_slice(b"\r\n\r\n");
}

fn write_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(decimal(n, &mut [0; 20]));
}

/// The two digits of every number below 100, `"00"` to `"99"`.
const DIGIT_PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// `n` in decimal, in `digits` (without the formatting machinery; the request line
/// shares it): two digits per division, from a table of the hundred pairs.
pub(crate) fn decimal(mut n: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut i = digits.len();
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        i -= 2;
        digits[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = n as usize * 2;
        i -= 2;
        digits[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    } else {
        i -= 1;
        digits[i] = b'0' + n as u8;
    }
    &digits[i..]
}

/// A response head, parsed.
#[derive(Debug)]
pub(crate) struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeadLines,
}

/// A head's header lines as they came, in order: names in lower case, values sharing
/// the head's bytes. keypool reads a few of a request's headers (its key, route, session,
/// length) and forwards five, and reads a few of an answer's (its rate-limit facts,
/// request id, content type, framing) and passes on at most its `content-type`, so the
/// lines are not hashed into a `HeaderMap` (~500 instructions a line; Claude Code's
/// requests and Anthropic's answers carry ~15–25).
pub(crate) struct HeadLines {
    head: Bytes,
    spans: Vec<Span>,
}

impl std::fmt::Debug for HeadLines {
    /// The names only: an upstream's values (cookies, its organisation) stay out of
    /// any debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(
                self.spans
                    .iter()
                    .map(|span| String::from_utf8_lossy(span.name(&self.head))),
            )
            .finish()
    }
}

/// The longest span list a thread keeps as a spare ([`crate::spares`]): a head of
/// more lines than this is rare and its list is freed.
const MAX_SPARE_SPANS: usize = 64;

thread_local! {
    /// Span lists of the heads this thread dropped, for the next heads it parses.
    static SPARE_SPANS: crate::spares::Spares<Vec<Span>> = const { crate::spares::Spares::new() };
}

impl Drop for HeadLines {
    fn drop(&mut self) {
        let spans = std::mem::take(&mut self.spans);
        if spans.capacity() > 0 && spans.capacity() <= MAX_SPARE_SPANS {
            crate::spares::keep(&SPARE_SPANS, spans);
        }
    }
}

impl HeadLines {
    /// The lines of `map` (the requests of a server that parsed into a `HeaderMap`).
    pub fn from_map(map: &HeaderMap) -> Self {
        let mut head = Vec::new();
        let mut spans = Vec::with_capacity(map.len());
        for (name, value) in map {
            let start = head.len();
            head.extend_from_slice(name.as_str().as_bytes());
            let middle = head.len();
            head.extend_from_slice(value.as_bytes());
            spans.push(Span {
                name: (start, middle),
                value: (middle, head.len()),
            });
        }
        Self {
            head: Bytes::from(head),
            spans,
        }
    }

    /// Without the lines named `name` (lower case) after the first `keep` of them.
    fn remove(&mut self, name: &str, keep: usize) {
        let head = &self.head;
        let mut seen = 0;
        self.spans.retain(|span| {
            if span.name(head) != name.as_bytes() {
                return true;
            }
            seen += 1;
            seen <= keep
        });
    }

    /// Every value of `name` (lower case), in order.
    pub fn all<'a>(&'a self, name: &'a str) -> impl DoubleEndedIterator<Item = &'a [u8]> {
        self.spans
            .iter()
            .filter(move |span| span.name(&self.head) == name.as_bytes())
            .map(|span| span.value(&self.head))
    }
}

impl keypool_providers::HeaderLines for HeadLines {
    fn first(&self, name: &str) -> Option<&[u8]> {
        // lengths first: most lines' names are not as long as `name`
        let name = name.as_bytes();
        self.spans
            .iter()
            .find(|span| span.name.1 - span.name.0 == name.len() && span.name(&self.head) == name)
            .map(|span| span.value(&self.head))
    }

    fn lines(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.spans
            .iter()
            .map(|span| (span.name(&self.head), span.value(&self.head)))
    }

    fn first_text(&self, name: &str) -> Option<&str> {
        // httparse (or `HeaderValue`, for lines made from a map) let no control byte
        // but a tab into these values, nor DEL: they are text when they are ASCII
        let text = std::str::from_utf8(self.first(name)?).ok()?;
        text.is_ascii().then_some(text)
    }

    fn to_value(&self, value: &[u8]) -> Option<HeaderValue> {
        // one of the head's values: shared; a value from elsewhere is a programming error
        // `slice_ref` would panic on, so it is copied instead
        let base = self.head.as_ptr() as usize;
        let start = (value.as_ptr() as usize).wrapping_sub(base);
        if start > self.head.len() || value.len() > self.head.len() - start {
            return HeaderValue::from_bytes(value).ok();
        }
        HeaderValue::from_maybe_shared(self.head.slice(start..start + value.len())).ok()
    }
}

/// What [`parse_head`] found at the start of the read buffer.
#[derive(Debug)]
pub(crate) enum Parsed {
    /// Not a whole head yet: read more.
    Partial,
    /// A whole head (taken out of the buffer).
    Head(Head),
}

/// Where one header line's name and value lie in the head's bytes.
#[derive(Clone, Copy)]
pub(crate) struct Span {
    name: (usize, usize),
    value: (usize, usize),
}

impl Span {
    fn name<'h>(&self, head: &'h [u8]) -> &'h [u8] {
        &head[self.name.0..self.name.1]
    }

    fn value<'h>(&self, head: &'h [u8]) -> &'h [u8] {
        &head[self.value.0..self.value.1]
    }
}

/// Parses the response head at the start of `buf`. A whole head is taken out of
/// `buf` (what follows, the start of the body, stays); its header names are put in
/// lower case where they lie and its lines keep to the head's bytes instead of being
/// copied. httparse has checked each name is a token and each value has no control
/// byte but a tab (what `HeaderName` and `HeaderValue` check).
///
/// # Errors
/// `InvalidData` when the bytes are not an HTTP/1.x response head, it has more than
/// [`MAX_HEADERS`] header lines, or it is not whole within [`MAX_HEAD_BYTES`].
pub(crate) fn parse_head(buf: &mut BytesMut) -> io::Result<Parsed> {
    // Neither array is initialised: httparse writes only the lines it finds.
    let mut lines =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        buf,
        &mut lines,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD_BYTES => {
            return Err(invalid("the upstream's response head is too large"));
        }
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(invalid("the upstream's response head has too many headers"));
        }
        Err(_) => return Err(invalid("the upstream's answer is not an HTTP/1.1 response")),
    };
    let (Some(code), Some(minor)) = (response.code, response.version) else {
        return Err(invalid("the upstream's answer is not an HTTP/1.1 response"));
    };
    let status =
        StatusCode::from_u16(code).map_err(|_| invalid("the upstream's status is invalid"))?;
    let version = if minor == 0 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let spans = spans_of(buf, response.headers)
        .ok_or_else(|| invalid("the upstream sent an invalid header name"))?;
    Ok(Parsed::Head(Head {
        status,
        version,
        headers: take_lines(buf, len, spans),
    }))
}

/// The longest header name `http::HeaderName` takes (a head with a longer one is
/// refused, as it was when heads were parsed into `HeaderMap`s).
const MAX_HEADER_NAME_LEN: usize = (1 << 16) - 1;

/// `bytes` with ASCII `A`-`Z` made `a`-`z`, eight bytes at a time, the last eight
/// overlapping the word before when the length is not a multiple of eight (a header
/// name is ~20 bytes: too short for the byte loop of `make_ascii_lowercase` to be
/// vectorised).
fn lower_case(bytes: &mut [u8]) {
    let len = bytes.len();
    if len < 8 {
        bytes.make_ascii_lowercase();
        return;
    }
    let mut lower = |at: usize| {
        if let Some(word) = bytes
            .get_mut(at..at + 8)
            .and_then(|w| <&mut [u8; 8]>::try_from(w).ok())
        {
            *word = lower_case_8(u64::from_le_bytes(*word)).to_le_bytes();
        }
    };
    let mut at = 0;
    while at + 8 < len {
        lower(at);
        at += 8;
    }
    lower(len - 8);
}

/// The eight bytes of `x` with ASCII `A`-`Z` made `a`-`z` (every other byte kept).
fn lower_case_8(x: u64) -> u64 {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    let low7 = x & (0x7f * ONES);
    // the high bit of each byte: low7 >= 'A', low7 > 'Z' (no carry leaves a byte)
    let from_a = low7 + u64::from(0x80 - b'A') * ONES;
    let past_z = low7 + u64::from(0x7f - b'Z') * ONES;
    let upper = from_a & !past_z & !x & (0x80 * ONES);
    x | (upper >> 2)
}

/// Where `part`, a slice of `buf`, lies in it.
fn offset(buf: &[u8], part: &[u8]) -> (usize, usize) {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    (start, start + part.len())
}

/// Where httparse's `lines` of the head at the start of `buf` lie; `None` for a name
/// longer than [`MAX_HEADER_NAME_LEN`] (httparse checked that each name is a token and
/// each value has no control byte but a tab: what `HeaderName` and `HeaderValue`
/// check).
fn spans_of(buf: &[u8], lines: &[httparse::Header<'_>]) -> Option<Vec<Span>> {
    let mut spans = crate::spares::take(&SPARE_SPANS).unwrap_or_default();
    spans.clear();
    spans.reserve(lines.len());
    for line in lines {
        if line.name.len() > MAX_HEADER_NAME_LEN {
            return None;
        }
        spans.push(Span {
            name: offset(buf, line.name.as_bytes()),
            value: offset(buf, line.value),
        });
    }
    Some(spans)
}

/// The head's `len` bytes taken out of `buf`, as lines with their names made lower
/// case where they lie.
fn take_lines(buf: &mut BytesMut, len: usize, spans: Vec<Span>) -> HeadLines {
    for span in &spans {
        lower_case(&mut buf[span.name.0..span.name.1]);
    }
    HeadLines {
        head: buf.split_to(len).freeze(),
        spans,
    }
}

/// How a response body ends (RFC 9112, 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the upstream closes the connection.
    UntilClose,
}

/// The framing of `head`'s body, answering `method`, and whether the connection may
/// carry another request once the body has been read.
///
/// # Errors
/// `InvalidData` for a `content-length` that is not one number (or several that
/// differ).
pub(crate) fn framing(method: &Method, head: &Head) -> io::Result<(Framing, bool)> {
    let headers = &head.headers;
    let mut keep_alive = head.version == Version::HTTP_11
        && !headers.all("connection").any(|v| has_token(v, b"close"));
    if method == Method::HEAD
        || head.status == StatusCode::NO_CONTENT
        || head.status == StatusCode::NOT_MODIFIED
    {
        return Ok((Framing::Length(0), keep_alive));
    }
    if let Some(coding) = headers.all("transfer-encoding").next_back() {
        // A length beside a transfer coding is ignored, and the connection not reused
        // (RFC 9112, 6.3 item 3); a coding that does not end in chunked is read until
        // the close.
        let chunked = last_token(coding).eq_ignore_ascii_case(b"chunked");
        if headers.all("content-length").next().is_some() || !chunked {
            keep_alive = false;
        }
        return Ok(if chunked {
            (Framing::Chunked, keep_alive)
        } else {
            (Framing::UntilClose, false)
        });
    }
    let mut length = None;
    for value in headers.all("content-length") {
        for part in value.split(|&b| b == b',') {
            let n = parse_decimal(trim(part))
                .ok_or_else(|| invalid("the upstream sent an invalid content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(invalid("the upstream sent conflicting content-lengths"));
            }
            length = Some(n);
        }
    }
    Ok(match length {
        Some(n) => (Framing::Length(n), keep_alive),
        None => (Framing::UntilClose, false),
    })
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &bytes[start..end]
}

fn has_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| trim(t).eq_ignore_ascii_case(token))
}

fn last_token(value: &[u8]) -> &[u8] {
    trim(value.rsplit(|&b| b == b',').next().unwrap_or(b""))
}

/// A non-empty run of ASCII digits as a number (`None` past `u64`).
fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))?
    })
}

/// Most header lines of a request head (hyper's default, which the server replaced).
pub(crate) const MAX_REQUEST_HEADERS: usize = 100;
/// Most bytes of a request head (hyper's default read buffer bound).
pub(crate) const MAX_REQUEST_HEAD_BYTES: usize = 8192 + 4096 * 100;
/// Longest request target (hyper's).
const MAX_URI_LEN: usize = (u16::MAX - 1) as usize;

/// A request head the server cannot serve, and the status it answers before closing
/// (hyper's automatic answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestError {
    /// Not HTTP/1.x, a bad method, target, header or framing: `400`.
    Bad(&'static str),
    /// More than [`MAX_REQUEST_HEADERS`] lines or [`MAX_REQUEST_HEAD_BYTES`] bytes: `431`.
    TooLarge,
    /// A target longer than 65,534 bytes: `414`.
    UriTooLong,
}

impl RequestError {
    /// The status of the server's answer.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Self::Bad(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::UriTooLong => StatusCode::URI_TOO_LONG,
        }
    }
}

/// How a request body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyFraming {
    /// Exactly this many bytes (0: none).
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
}

/// A request head, parsed.
#[derive(Debug)]
pub(crate) struct RequestHead {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeadLines,
    pub body: BodyFraming,
    /// Whether the connection may carry another request after this one.
    pub keep_alive: bool,
    /// `expect: 100-continue`.
    pub expect_continue: bool,
}

/// What [`parse_request`] found at the start of the read buffer.
// Returned straight into the server's match: boxing the head would cost an
// allocation per request for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum ParsedRequest {
    /// Not a whole head yet: read more.
    Partial,
    /// A whole head (taken out of the buffer).
    Head(RequestHead),
}

/// Parses the request head at the start of `buf` with hyper's rules: leading empty
/// lines skipped; HTTP/1.0 and 1.1; `transfer-encoding` only on 1.1 and only ending in
/// `chunked` (beside a `content-length` it wins and the connection closes after);
/// several `content-length`s only when they agree; `connection: close` (and 1.0
/// without `keep-alive`) ends the connection after the answer; a `CONNECT` or an
/// `upgrade` is not kept alive (keypool upgrades nothing). A whole head is taken out
/// of `buf`; its header values share the head's bytes.
///
/// # Errors
/// [`RequestError`]: what the server answers before closing.
pub(crate) fn parse_request(buf: &mut BytesMut) -> Result<ParsedRequest, RequestError> {
    let mut lines =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_REQUEST_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut request,
        buf,
        &mut lines,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) if len > MAX_REQUEST_HEAD_BYTES => {
            return Err(RequestError::TooLarge);
        }
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_REQUEST_HEAD_BYTES => {
            return Err(RequestError::TooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(ParsedRequest::Partial),
        Err(httparse::Error::TooManyHeaders) => return Err(RequestError::TooLarge),
        Err(httparse::Error::Version) => return Err(RequestError::Bad("version")),
        Err(_) => return Err(RequestError::Bad("not an HTTP/1.1 request head")),
    };
    let (Some(method), Some(path), Some(minor)) = (request.method, request.path, request.version)
    else {
        return Err(RequestError::Bad("not an HTTP/1.1 request head"));
    };
    if path.len() > MAX_URI_LEN {
        return Err(RequestError::UriTooLong);
    }
    let method = Method::from_bytes(method.as_bytes()).map_err(|_| RequestError::Bad("method"))?;
    let http11 = minor == 1;
    let target = offset(buf, path.as_bytes());
    let spans = spans_of(buf, request.headers).ok_or(RequestError::Bad("header name"))?;
    let mut headers = take_lines(buf, len, spans);
    let uri = Uri::from_maybe_shared(headers.head.slice(target.0..target.1))
        .map_err(|_| RequestError::Bad("request target"))?;
    let mut keep_alive = http11;
    let mut closing = false;
    let mut expect_continue = false;
    let mut upgrade = method == Method::CONNECT;
    let mut length: Option<u64> = None;
    let mut chunked = None;
    let mut repeated_length = false;
    for span in &headers.spans {
        let value = span.value(&headers.head);
        match span.name(&headers.head) {
            b"transfer-encoding" => {
                if !http11 {
                    return Err(RequestError::Bad("transfer-encoding in HTTP/1.0"));
                }
                chunked = Some(last_token(value).eq_ignore_ascii_case(b"chunked"));
            }
            b"content-length" => {
                let n = parse_decimal(trim(value)).ok_or(RequestError::Bad("content-length"))?;
                if length.is_some_and(|l| l != n) {
                    return Err(RequestError::Bad("conflicting content-lengths"));
                }
                repeated_length |= length.is_some();
                length = Some(n);
            }
            b"connection" => {
                if closing || has_token(value, b"close") {
                    closing = true;
                    keep_alive = false;
                } else if !keep_alive {
                    keep_alive = has_token(value, b"keep-alive");
                }
            }
            b"expect" => expect_continue = value.eq_ignore_ascii_case(b"100-continue"),
            b"upgrade" => upgrade = http11,
            _ => {}
        }
    }
    let body = match (chunked, length) {
        (Some(false), _) => return Err(RequestError::Bad("transfer-encoding not chunked")),
        (Some(true), Some(_)) => {
            // both: the coding wins, the length goes, and nothing after this request
            // is read (RFC 9112, 6.3 item 3)
            headers.remove("content-length", 0);
            keep_alive = false;
            BodyFraming::Chunked
        }
        (Some(true), None) => BodyFraming::Chunked,
        (None, n) => {
            if repeated_length {
                // the same length several times: one line of it stays
                headers.remove("content-length", 1);
            }
            BodyFraming::Length(n.unwrap_or(0))
        }
    };
    Ok(ParsedRequest::Head(RequestHead {
        method,
        uri,
        version: if http11 {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        },
        headers,
        body,
        keep_alive: keep_alive && !upgrade,
        expect_continue: expect_continue && http11,
    }))
}

/// How a response body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResponseFraming {
    /// No body at all (a `HEAD` answer, `204`, `304`): a `content-length` of the body
    /// that would have been, or none.
    None(Option<u64>),
    /// `content-length`.
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
    /// Until the connection closes (an HTTP/1.0 client's stream).
    UntilClose,
}

/// Writes a response head into `out` (cleared first): the status line (in the
/// request's `version`, as hyper did), `headers`
/// (without framing headers of their own), `x-request-id: request_id` in place of any
/// the headers carry, the framing, `connection: keep-alive` for an HTTP/1.0 client
/// kept alive, `date`, and the blank line.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_response_head(
    out: &mut Vec<u8>,
    version: Version,
    status: StatusCode,
    headers: &HeaderMap,
    framing: ResponseFraming,
    keep_alive_10: bool,
    date: &[u8],
    request_id: Option<&str>,
) {
    out.clear();
    out.extend_from_slice(if version == Version::HTTP_10 {
        b"HTTP/1.0 "
    } else {
        b"HTTP/1.1 "
    });
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    out.extend_from_slice(b"\r\n");
    // keypool's request id (always `req_kp_` and hex) replaces any other
    let request_id = request_id.filter(|id| id.bytes().all(|b| b.is_ascii_graphic()));
    for (name, value) in headers {
        if name == CONTENT_LENGTH
            || name == TRANSFER_ENCODING
            || (request_id.is_some() && name == X_REQUEST_ID)
        {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(id) = request_id {
        out.extend_from_slice(b"x-request-id: ");
        out.extend_from_slice(id.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        ResponseFraming::None(Some(n)) | ResponseFraming::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            write_decimal(out, n);
            out.extend_from_slice(b"\r\n");
        }
        ResponseFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        ResponseFraming::None(None) | ResponseFraming::UntilClose => {}
    }
    if keep_alive_10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"date: ");
    out.extend_from_slice(date);
    out.extend_from_slice(b"\r\n\r\n");
}

/// The chunk-size line of a chunk of `len` bytes (`len` in hex, CRLF) in `out`; the
/// bytes written.
pub(crate) fn chunk_size_line(out: &mut [u8; 18], len: usize) -> &[u8] {
    let mut n = len;
    let mut i = 16;
    loop {
        i -= 1;
        out[i] = b"0123456789abcdef"[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out[16] = b'\r';
    out[17] = b'\n';
    &out[i..]
}

/// Where a connection's bytes come from, for [`BodyReader::poll_next`]: its read
/// buffer and the read that fills it (the only I/O this module names).
pub(crate) trait Source {
    /// The bytes read but not yet used.
    fn buffer(&mut self) -> &mut BytesMut;
    /// Reads more into [`Source::buffer`]: the bytes read, 0 at the end of the stream.
    fn poll_fill(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<usize>>;
}

/// Reads from `io` into the spare room of `buf`, first growing it by `chunk` bytes when
/// less than a KiB is left: the bytes read, 0 at the end of the stream. The one read of
/// both roles' connections. An empty buffer is first rewound ([`rewind`]).
pub(crate) fn poll_read_into(
    io: &mut (impl tokio::io::AsyncRead + Unpin),
    buf: &mut BytesMut,
    chunk: usize,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<io::Result<usize>> {
    if buf.is_empty() {
        rewind(buf);
    }
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(chunk);
    }
    tokio_util::io::poll_read_buf(std::pin::Pin::new(io), cx, buf)
}

/// Moves an empty `buf` back to the start of its allocation when nothing else holds a
/// part of it (the heads and bodies taken out of it were dropped): whether it did.
///
/// Without it, each request of a keep-alive connection was read past the last one,
/// walking through the whole chunk before the buffer came back to its start: at 64
/// connections, every read and parse touched cache lines no request had touched
/// lately. Rewound, a connection's requests land on the same few lines, as nginx's
/// reused header buffer does (issue 22).
fn rewind(buf: &mut BytesMut) -> bool {
    // Asking for one byte more than the room left makes `bytes` take back the
    // allocation's front, when it is the only handle, without allocating.
    buf.is_empty() && buf.try_reclaim(buf.capacity().saturating_add(1))
}

/// How far the reading of a framed body is, for both roles (a request's body, an
/// answer's body).
#[derive(Debug)]
pub(crate) enum BodyReader {
    /// This many bytes to go.
    Length(u64),
    /// The chunked coding.
    Chunked(Chunked),
    /// Everything until the peer closes (an answer only).
    UntilClose,
    /// Read to its end.
    Done,
}

impl BodyReader {
    /// The reader of a body framed as `framing` says.
    pub(crate) fn new(framing: Framing) -> Self {
        match framing {
            Framing::Length(n) => Self::Length(n),
            Framing::Chunked => Self::Chunked(Chunked::default()),
            Framing::UntilClose => Self::UntilClose,
        }
    }

    /// The next data of the body from `source` (and whether the body ended with it),
    /// `None` at its end, or the error that ends it: bytes that are not the chunked
    /// coding, a failed read, or the peer closing before the end (`closed` says so).
    pub(crate) fn poll_next(
        &mut self,
        source: &mut impl Source,
        cx: &mut std::task::Context<'_>,
        closed: &'static str,
    ) -> std::task::Poll<Option<io::Result<(Bytes, bool)>>> {
        use std::task::Poll;
        loop {
            let buf = source.buffer();
            match self {
                Self::Done | Self::Length(0) => {
                    *self = Self::Done;
                    return Poll::Ready(None);
                }
                Self::Length(rest) if !buf.is_empty() => {
                    let n = usize::try_from(*rest).unwrap_or(usize::MAX).min(buf.len());
                    let data = buf.split_to(n).freeze();
                    *rest -= n as u64;
                    let last = *rest == 0;
                    if last {
                        *self = Self::Done;
                    }
                    return Poll::Ready(Some(Ok((data, last))));
                }
                Self::Chunked(decoder) => match decoder.decode(buf) {
                    Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok((data, false)))),
                    Ok(Decoded::End) => {
                        *self = Self::Done;
                        return Poll::Ready(None);
                    }
                    Ok(Decoded::NeedMore) => {}
                    Err(e) => return Poll::Ready(Some(Err(e))),
                },
                Self::UntilClose if !buf.is_empty() => {
                    return Poll::Ready(Some(Ok((buf.split().freeze(), false))));
                }
                Self::Length(_) | Self::UntilClose => {}
            }
            match std::task::ready!(source.poll_fill(cx)) {
                Ok(0) if matches!(self, Self::UntilClose) => {
                    *self = Self::Done;
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    return Poll::Ready(Some(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        closed,
                    ))));
                }
                Ok(_) => {}
                Err(e) => return Poll::Ready(Some(Err(e))),
            }
        }
    }

    /// Whether the body was read to its end.
    pub(crate) fn is_done(&self) -> bool {
        matches!(self, Self::Done | Self::Length(0))
    }

    /// The bytes left, when known.
    pub(crate) fn size_hint(&self) -> http_body::SizeHint {
        match self {
            Self::Done => http_body::SizeHint::with_exact(0),
            Self::Length(n) => http_body::SizeHint::with_exact(*n),
            Self::Chunked(_) | Self::UntilClose => http_body::SizeHint::default(),
        }
    }
}

/// What [`Chunked::decode`] got out of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// Data of the body.
    Data(Bytes),
    /// The buffer holds no more of the body yet: read more.
    NeedMore,
    /// The body is complete (the last chunk and the trailers were read).
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At a chunk-size line.
    Size,
    /// Inside a chunk: this many data bytes to go.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one (this many bytes so far).
    Trailers(usize),
    /// Done.
    End,
}

/// The chunked transfer coding's decoder (RFC 9112, 7.1): chunk extensions and
/// trailers are read and dropped; data comes out as slices of the read buffer.
#[derive(Debug, Clone)]
pub(crate) struct Chunked {
    state: State,
}

impl Default for Chunked {
    fn default() -> Self {
        Self { state: State::Size }
    }
}

impl Chunked {
    /// Decodes what `buf` holds: the next data (taken out of `buf`), `NeedMore`
    /// (everything usable was consumed), or `End`.
    ///
    /// # Errors
    /// `InvalidData` when the bytes are not the chunked coding (or a line is too long).
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> io::Result<Decoded> {
        loop {
            match self.state {
                State::End => return Ok(Decoded::End),
                State::Size => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(Decoded::NeedMore);
                    };
                    let size = chunk_size(&line)?;
                    self.state = if size == 0 {
                        State::Trailers(0)
                    } else {
                        State::Data(size)
                    };
                }
                State::Data(rest) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let n = usize::try_from(rest).unwrap_or(usize::MAX).min(buf.len());
                    let data = buf.split_to(n).freeze();
                    let rest = rest - n as u64;
                    self.state = if rest == 0 {
                        State::DataEnd
                    } else {
                        State::Data(rest)
                    };
                    return Ok(Decoded::Data(data));
                }
                State::DataEnd => {
                    if buf.len() < 2 {
                        if buf.first().is_some_and(|&b| b != b'\r') {
                            return Err(invalid(
                                "a chunk of the upstream's body is not ended by CRLF",
                            ));
                        }
                        return Ok(Decoded::NeedMore);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(invalid(
                            "a chunk of the upstream's body is not ended by CRLF",
                        ));
                    }
                    buf.advance(2);
                    self.state = State::Size;
                }
                State::Trailers(seen) => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(Decoded::NeedMore);
                    };
                    if line.is_empty() {
                        self.state = State::End;
                    } else {
                        let seen = seen + line.len() + 2;
                        if seen > MAX_TRAILER_BYTES {
                            return Err(invalid("the upstream's trailers are too large"));
                        }
                        self.state = State::Trailers(seen);
                    }
                }
            }
        }
    }
}

/// Takes one CRLF-ended line out of `buf` (without its CRLF); `None` when the buffer
/// holds no whole line yet.
fn take_line(buf: &mut BytesMut) -> io::Result<Option<BytesMut>> {
    match memchr::memchr(b'\n', buf) {
        Some(end) => {
            if end == 0 || buf[end - 1] != b'\r' {
                return Err(invalid(
                    "a line of the upstream's chunked body is not ended by CRLF",
                ));
            }
            let mut line = buf.split_to(end + 1);
            line.truncate(end - 1);
            Ok(Some(line))
        }
        None if buf.len() > MAX_LINE_BYTES => {
            Err(invalid("a line of the upstream's chunked body is too long"))
        }
        None => Ok(None),
    }
}

/// The size of a chunk-size line: hex digits, then optional whitespace and
/// `;extensions`.
fn chunk_size(line: &[u8]) -> io::Result<u64> {
    let digits = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let rest = &line[digits..];
    if digits == 0 || digits > 16 {
        return Err(invalid("the upstream sent an invalid chunk size"));
    }
    let after = trim(rest);
    if !after.is_empty() && after[0] != b';' {
        return Err(invalid("the upstream sent an invalid chunk size"));
    }
    line[..digits].iter().try_fold(0u64, |n, &d| {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => d - b'A' + 10,
        };
        n.checked_mul(16)
            .map(|n| n + u64::from(v))
            .ok_or_else(|| invalid("the upstream sent an invalid chunk size"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderName;
    use http::header::{CONNECTION, HOST};
    use keypool_providers::HeaderLines as _;
    use keypool_providers::upstream::X_API_KEY;
    use proptest::prelude::*;

    /// An empty buffer goes back to the start of its allocation once the heads taken
    /// out of it are dropped, and not before; a buffer with bytes left is never moved.
    #[test]
    fn an_empty_buffer_is_rewound_once_nothing_else_holds_it() {
        let mut buf = BytesMut::with_capacity(8 * 1024);
        let start = buf.as_ptr();
        let full = buf.capacity();
        buf.extend_from_slice(&[b'a'; 300]);
        let taken = buf.split_to(300).freeze();
        assert!(buf.is_empty());
        assert!(!rewind(&mut buf), "the head still holds the allocation");
        assert_eq!(buf.capacity(), full - 300);
        drop(taken);
        assert!(rewind(&mut buf));
        assert_eq!((buf.as_ptr(), buf.capacity()), (start, full));
        // already at the start: nothing to do
        assert!(!rewind(&mut buf));
        // bytes left to read are never moved
        buf.extend_from_slice(&[b'b'; 100]);
        drop(buf.split_to(60).freeze());
        assert!(!rewind(&mut buf));
        assert_eq!(&buf[..], &[b'b'; 40][..]);
        // a buffer never split (the one a connection starts with) rewinds too
        let mut fresh = BytesMut::with_capacity(4096);
        let fresh_start = fresh.as_ptr();
        fresh.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        fresh.advance(fresh.len());
        assert!(rewind(&mut fresh));
        assert_eq!(fresh.as_ptr(), fresh_start);
    }

    /// Reads through [`poll_read_into`] of requests taken out whole land at the same
    /// place each time.
    #[tokio::test]
    async fn a_keep_alive_connections_reads_land_at_the_same_place() {
        use tokio::io::AsyncWriteExt;
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        let mut buf = BytesMut::with_capacity(8 * 1024);
        let mut starts = Vec::new();
        for _ in 0..40 {
            client.write_all(&[b'r'; 350]).await.unwrap();
            let n = std::future::poll_fn(|cx| poll_read_into(&mut server, &mut buf, 8 * 1024, cx))
                .await
                .unwrap();
            assert_eq!(n, 350);
            starts.push(buf.as_ptr());
            drop(buf.split_to(n).freeze());
        }
        assert!(starts.iter().all(|&p| p == starts[0]), "{starts:?}");
    }

    fn head(bytes: &[u8]) -> (Head, BytesMut) {
        let mut buf = BytesMut::from(bytes);
        match parse_head(&mut buf).unwrap() {
            Parsed::Head(head) => (head, buf),
            Parsed::Partial => panic!("partial"),
        }
    }

    #[test]
    fn a_head_made_from_a_map_finds_its_names() {
        use keypool_providers::HeaderLines as _;
        let mut map = HeaderMap::new();
        map.insert("X-Api-Key", HeaderValue::from_static("sk-lb-k"));
        map.append("accept", HeaderValue::from_static("a"));
        map.append("accept", HeaderValue::from_static("b"));
        let lines = HeadLines::from_map(&map);
        assert_eq!(lines.first_text("x-api-key"), Some("sk-lb-k"));
        assert_eq!(
            lines.all("accept").collect::<Vec<_>>(),
            [&b"a"[..], &b"b"[..]]
        );
        assert_eq!(lines.first("authorization"), None);
    }

    #[test]
    fn a_dropped_heads_span_list_serves_the_next_head_of_its_thread() {
        while crate::spares::take(&SPARE_SPANS).is_some() {}
        let (first, _) = head(b"HTTP/1.1 200 OK\r\nA: 1\r\nb: 2\r\n\r\n");
        let list = first.headers.spans.as_ptr();
        drop(first);
        let (second, _) = head(b"HTTP/1.1 200 OK\r\nC: 3\r\n\r\n");
        assert_eq!(second.headers.spans.as_ptr(), list, "the same allocation");
        let lines: Vec<_> = second.headers.lines().collect();
        assert_eq!(
            lines,
            [(&b"c"[..], &b"3"[..])],
            "and only the new head's lines"
        );
        // a list longer than a spare's is freed, not kept
        let many: String = (0..MAX_SPARE_SPANS + 1)
            .map(|i| format!("x{i}: {i}\r\n"))
            .collect();
        let (large, _) = head(format!("HTTP/1.1 200 OK\r\n{many}\r\n").as_bytes());
        drop(large);
        assert!(crate::spares::take(&SPARE_SPANS).is_none());
    }

    #[test]
    fn the_request_head_is_origin_form_with_host_and_length() {
        let uri: Uri = "http://127.0.0.1:9000/v1/messages?beta=true"
            .parse()
            .unwrap();
        let mut headers = UpstreamHeaders::default();
        headers.append(&X_API_KEY, &HeaderValue::from_static("sk-ant-x"));
        headers.append(&CONTENT_LENGTH, &HeaderValue::from_static("999"));
        headers.append(&CONNECTION, &HeaderValue::from_static("close"));
        headers.append(&TRANSFER_ENCODING, &HeaderValue::from_static("chunked"));
        let mut out = b"stale".to_vec();
        write_head(
            &mut out,
            &Method::POST,
            &uri,
            &host_header(&uri),
            &headers,
            42,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /v1/messages?beta=true HTTP/1.1\r\nhost: 127.0.0.1:9000\r\nx-api-key: sk-ant-x\r\ncontent-length: 42\r\n\r\n"
        );
        let mut out = Vec::new();
        let https: Uri = "https://api.anthropic.com:443/v1/messages".parse().unwrap();
        write_head(
            &mut out,
            &Method::POST,
            &https,
            &host_header(&https),
            &UpstreamHeaders::default(),
            0,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /v1/messages HTTP/1.1\r\nhost: api.anthropic.com\r\ncontent-length: 0\r\n\r\n"
        );
        // a caller's own host wins; an IPv6 host keeps its brackets
        let v6: Uri = "http://[::1]:8080/v1/messages".parse().unwrap();
        assert_eq!(&*host_header(&v6), b"[::1]:8080");
        let mut own = UpstreamHeaders::default();
        own.append(&HOST, &HeaderValue::from_static("example.test"));
        let mut out = Vec::new();
        write_head(&mut out, &Method::POST, &v6, &host_header(&v6), &own, 0);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /v1/messages HTTP/1.1\r\nhost: example.test\r\ncontent-length: 0\r\n\r\n"
        );
    }

    #[test]
    fn a_head_is_taken_out_and_the_body_stays() {
        let (h, rest) = head(
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nX-A: 1\r\nx-a: 2\r\ncontent-length: 4\r\n\r\nbody",
        );
        assert_eq!(h.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(h.version, Version::HTTP_11);
        assert_eq!(h.headers.first("retry-after"), Some(&b"3"[..]));
        let all: Vec<_> = h.headers.all("x-a").collect();
        assert_eq!(all, [b"1", b"2"]);
        let first = h.headers.first("x-a").unwrap();
        assert_eq!(h.headers.to_value(first).unwrap(), "1");
        assert_eq!(&rest[..], b"body");
        assert_eq!(
            framing(&Method::POST, &h).unwrap(),
            (Framing::Length(4), true)
        );
    }

    #[test]
    fn partial_heads_wait_and_garbage_is_refused() {
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-le"[..]);
        assert!(matches!(parse_head(&mut buf).unwrap(), Parsed::Partial));
        assert_eq!(buf.len(), 27);
        let mut garbage = BytesMut::from(&b"SSH-2.0-OpenSSH\r\n\r\n"[..]);
        assert_eq!(
            parse_head(&mut garbage).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        let mut huge = BytesMut::from(&b"HTTP/1.1 200 OK\r\n"[..]);
        huge.extend(std::iter::repeat_n(b'a', MAX_HEAD_BYTES));
        assert!(parse_head(&mut huge).is_err());
        let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            many.extend_from_slice(format!("x-{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert!(parse_head(&mut BytesMut::from(&many[..])).is_err());
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let f = |raw: &str| {
            let (h, _) = head(raw.as_bytes());
            framing(&Method::POST, &h)
        };
        assert_eq!(
            f("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").unwrap(),
            (Framing::Chunked, true)
        );
        // a length beside chunked: chunked wins, the connection is not reused
        assert_eq!(
            f("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n")
                .unwrap(),
            (Framing::Chunked, false)
        );
        assert_eq!(
            f("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n").unwrap(),
            (Framing::UntilClose, false)
        );
        assert_eq!(
            f("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, Chunked\r\n\r\n").unwrap(),
            (Framing::Chunked, true)
        );
        assert_eq!(
            f("HTTP/1.1 200 OK\r\n\r\n").unwrap(),
            (Framing::UntilClose, false)
        );
        assert_eq!(
            f("HTTP/1.1 200 OK\r\nconnection: keep-alive, Close\r\ncontent-length: 0\r\n\r\n")
                .unwrap(),
            (Framing::Length(0), false)
        );
        assert_eq!(
            f("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n").unwrap(),
            (Framing::Length(2), false)
        );
        assert_eq!(
            f("HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n").unwrap(),
            (Framing::Length(0), true)
        );
        assert_eq!(
            f("HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\ncontent-length: 3\r\n\r\n").unwrap(),
            (Framing::Length(3), true)
        );
        assert!(f("HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n").is_err());
        assert!(f("HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n").is_err());
        assert!(f("HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999999\r\n\r\n").is_err());
    }

    fn request(bytes: &[u8]) -> Result<(RequestHead, BytesMut), RequestError> {
        let mut buf = BytesMut::from(bytes);
        match parse_request(&mut buf)? {
            ParsedRequest::Head(head) => Ok((head, buf)),
            ParsedRequest::Partial => panic!("partial: {:?}", String::from_utf8_lossy(bytes)),
        }
    }

    #[test]
    fn request_heads_parse_with_hypers_rules() {
        let (head, rest) = request(
            b"\r\nPOST /acme/team/v1/messages?beta=true HTTP/1.1\r\nHost: k\r\nX-Api-Key: sk-lb-x\r\ncontent-length: 4\r\n\r\nbody",
        )
        .unwrap();
        assert_eq!(head.method, Method::POST);
        assert_eq!(head.uri, "/acme/team/v1/messages?beta=true");
        assert_eq!(head.version, Version::HTTP_11);
        assert_eq!(head.headers.first_text("x-api-key"), Some("sk-lb-x"));
        assert_eq!(head.body, BodyFraming::Length(4));
        assert!(head.keep_alive && !head.expect_continue);
        assert_eq!(&rest[..], b"body");

        let case = |raw: &str| request(raw.as_bytes()).map(|(h, _)| (h.body, h.keep_alive));
        assert_eq!(
            case("GET / HTTP/1.1\r\n\r\n"),
            Ok((BodyFraming::Length(0), true))
        );
        assert_eq!(
            case("GET / HTTP/1.0\r\n\r\n"),
            Ok((BodyFraming::Length(0), false))
        );
        assert_eq!(
            case("GET / HTTP/1.0\r\nconnection: Keep-Alive\r\n\r\n"),
            Ok((BodyFraming::Length(0), true))
        );
        // a later keep-alive does not undo a close
        assert_eq!(
            case("GET / HTTP/1.1\r\nconnection: close\r\nconnection: keep-alive\r\n\r\n"),
            Ok((BodyFraming::Length(0), false))
        );
        assert_eq!(
            case("POST / HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n"),
            Ok((BodyFraming::Chunked, true))
        );
        // both: chunked wins, the length goes, the connection ends after the answer
        let (both, _) =
            request(b"POST / HTTP/1.1\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n")
                .unwrap();
        assert_eq!((both.body, both.keep_alive), (BodyFraming::Chunked, false));
        assert!(both.headers.first("content-length").is_none());
        assert_eq!(
            case("POST / HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\n"),
            Ok((BodyFraming::Length(3), true))
        );
        let (upgrade, _) = request(b"GET / HTTP/1.1\r\nupgrade: websocket\r\n\r\n").unwrap();
        assert!(!upgrade.keep_alive);
        let (expect, _) =
            request(b"POST / HTTP/1.1\r\nexpect: 100-Continue\r\ncontent-length: 1\r\n\r\n")
                .unwrap();
        assert!(expect.expect_continue);
        let (expect10, _) =
            request(b"POST / HTTP/1.0\r\nexpect: 100-continue\r\ncontent-length: 1\r\n\r\n")
                .unwrap();
        assert!(!expect10.expect_continue);

        for (raw, status) in [
            ("POST / HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n", 400),
            ("POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n", 400),
            (
                "POST / HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n",
                400,
            ),
            ("POST / HTTP/1.1\r\ncontent-length: +3\r\n\r\n", 400),
            ("POST / HTTP/2.0\r\n\r\n", 400),
            ("P\x01ST / HTTP/1.1\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nbad header\r\n\r\n", 400),
        ] {
            assert_eq!(
                request(raw.as_bytes())
                    .map(|_| ())
                    .unwrap_err()
                    .status()
                    .as_u16(),
                status,
                "{raw:?}"
            );
        }
        let many: String = (0..=MAX_REQUEST_HEADERS)
            .map(|i| format!("x-{i}: v\r\n"))
            .collect();
        let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(
            request(many.as_bytes()).unwrap_err(),
            RequestError::TooLarge
        );
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_URI_LEN));
        assert_eq!(
            request(long.as_bytes()).unwrap_err(),
            RequestError::UriTooLong
        );
        let mut endless = BytesMut::from(&b"GET / HTTP/1.1\r\nx: "[..]);
        endless.extend(std::iter::repeat_n(b'a', MAX_REQUEST_HEAD_BYTES));
        assert_eq!(
            parse_request(&mut endless).unwrap_err(),
            RequestError::TooLarge
        );
        // the longest name `HeaderName` takes, and one byte more
        let named = |len: usize| format!("GET / HTTP/1.1\r\n{}: v\r\n\r\n", "N".repeat(len));
        let (longest, _) = request(named(MAX_HEADER_NAME_LEN).as_bytes()).unwrap();
        assert_eq!(
            longest.headers.first(&"n".repeat(MAX_HEADER_NAME_LEN)),
            Some(&b"v"[..])
        );
        assert_eq!(
            request(named(MAX_HEADER_NAME_LEN + 1).as_bytes()).unwrap_err(),
            RequestError::Bad("header name")
        );
    }

    #[test]
    fn response_heads_are_written_with_their_framing_and_date() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("999"));
        let date = b"Wed, 02 Dec 2026 07:34:49 GMT";
        let mut out = b"stale".to_vec();
        write_response_head(
            &mut out,
            Version::HTTP_11,
            StatusCode::OK,
            &headers,
            ResponseFraming::Length(2),
            false,
            date,
            None,
        );
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\ndate: Wed, 02 Dec 2026 07:34:49 GMT\r\n\r\n"
        );
        write_response_head(
            &mut out,
            Version::HTTP_10,
            StatusCode::TOO_MANY_REQUESTS,
            &HeaderMap::new(),
            ResponseFraming::Chunked,
            true,
            date,
            None,
        );
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            "HTTP/1.0 429 Too Many Requests\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\ndate: Wed, 02 Dec 2026 07:34:49 GMT\r\n\r\n"
        );
        write_response_head(
            &mut out,
            Version::HTTP_11,
            StatusCode::OK,
            &HeaderMap::new(),
            ResponseFraming::None(None),
            false,
            date,
            None,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\ndate: Wed, 02 Dec 2026 07:34:49 GMT\r\n\r\n"
        );
        // the request id after the headers, in place of one they carry; one that is not
        // a header value is left out (the headers' own is kept)
        let mut headers = HeaderMap::new();
        headers.insert(X_REQUEST_ID, HeaderValue::from_static("upstream-id"));
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        let json = "content-type: application/json\r\n";
        let theirs = "x-request-id: upstream-id\r\n";
        let ours = "x-request-id: req_kp_0123456789abcdef\r\n";
        for (id, lines) in [
            (Some("req_kp_0123456789abcdef"), format!("{json}{ours}")),
            (Some("req\r\nx-evil: 1"), format!("{theirs}{json}")),
            (None, format!("{theirs}{json}")),
        ] {
            let mut out = Vec::new();
            write_response_head(
                &mut out,
                Version::HTTP_11,
                StatusCode::OK,
                &headers,
                ResponseFraming::Length(2),
                false,
                date,
                id,
            );
            assert_eq!(
                String::from_utf8(out).unwrap(),
                format!(
                    "HTTP/1.1 200 OK\r\n{lines}content-length: 2\r\ndate: Wed, 02 Dec 2026 07:34:49 GMT\r\n\r\n"
                )
            );
        }
        let mut line = [0u8; 18];
        assert_eq!(chunk_size_line(&mut line, 0), b"0\r\n");
        assert_eq!(chunk_size_line(&mut line, 0x1a2b), b"1a2b\r\n");
        assert_eq!(
            chunk_size_line(&mut line, usize::MAX),
            b"ffffffffffffffff\r\n"
        );
    }

    fn decode_all(chunks: &[&[u8]]) -> io::Result<(Vec<u8>, bool)> {
        let mut decoder = Chunked::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            loop {
                match decoder.decode(&mut buf)? {
                    Decoded::Data(d) => out.extend_from_slice(&d),
                    Decoded::NeedMore => break,
                    Decoded::End => return Ok((out, true)),
                }
            }
        }
        Ok((out, false))
    }

    #[test]
    fn chunked_bodies_decode_with_extensions_and_trailers() {
        let body: &[u8] = b"5;name=value\r\nhello\r\nA \r\n0123456789\r\n0\r\nx-trailer: 1\r\n\r\n";
        assert_eq!(
            decode_all(&[body]).unwrap(),
            (b"hello0123456789".to_vec(), true)
        );
        // nothing after the end is consumed
        let mut decoder = Chunked::default();
        let mut buf = BytesMut::from(&b"0\r\n\r\nNEXT"[..]);
        assert_eq!(decoder.decode(&mut buf).unwrap(), Decoded::End);
        assert_eq!(&buf[..], b"NEXT");
        for bad in [
            &b"z\r\n"[..],
            b"5\r\nhelloX\r\n",
            b"5\nhello\r\n",
            b"11111111111111111\r\n",
            b"5 x\r\n",
        ] {
            assert!(
                decode_all(&[bad]).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = vec![b'1'; MAX_LINE_BYTES + 1];
        assert!(decode_all(&[&long]).is_err());
    }

    /// The chunked coding of `parts`, with an extension on every other size line.
    fn encode(parts: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, p) in parts.iter().filter(|p| !p.is_empty()).enumerate() {
            out.extend_from_slice(format!("{:x}", p.len()).as_bytes());
            if i % 2 == 1 {
                out.extend_from_slice(b";ext=1");
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(p);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    /// The path a client's head takes to the upstream: parsed here (names in any case,
    /// an LB key in several headers and spellings), then `build_upstream_head`. Only
    /// the allowlisted lines without an LB key go on, with their values as sent.
    #[test]
    fn a_parsed_head_forwards_only_allowlisted_lines_without_lb_keys() {
        use keypool_core::{AuthType, Provider};
        use keypool_providers::{Endpoint, UpstreamAccount, build_upstream_head};
        let (head, _) = request(
            b"POST /v1/messages HTTP/1.1\r\nHost: kp\r\nX-Api-Key: sk-lb-AAAA\r\n\
              Authorization: Bearer SK-LB-bbbb\r\nAnthropic-Beta: tools-1, Sk-Lb-cccc\r\n\
              ANTHROPIC-BETA: claude-code-20250219\r\nAnthropic-Version: 2023-06-01\r\n\
              User-Agent: claude-cli/2.0 sk-lb-dddd\r\nContent-Type: application/json\r\n\
              X-Claude-Code-Session-Id: s1\r\nContent-Length: 2\r\n\r\n",
        )
        .unwrap();
        let account = UpstreamAccount {
            provider: Provider::Anthropic,
            auth: AuthType::ApiKey,
            secret: "sk-ant-api03-SECRET",
            base_url: Some("http://127.0.0.1:9"),
        };
        let upstream =
            build_upstream_head(&head.uri, &head.headers, Endpoint::Messages, &account).unwrap();
        let lines: Vec<(String, String)> = upstream
            .headers
            .iter()
            .map(|(n, v)| (n.to_owned(), String::from_utf8(v.to_vec()).unwrap()))
            .collect();
        let line = |n: &str, v: &str| (n.to_owned(), v.to_owned());
        assert_eq!(
            lines,
            [
                line("anthropic-beta", "claude-code-20250219"),
                line("anthropic-version", "2023-06-01"),
                line("content-type", "application/json"),
                line("accept-encoding", "identity"),
                line("x-api-key", "sk-ant-api03-SECRET"),
            ]
        );
    }

    proptest! {
        /// The eight-byte lower-casing is `to_ascii_lowercase` on every byte, and so is
        /// a name's, whatever its length.
        #[test]
        fn lower_casing_is_ascii_lowercase(x in any::<u64>(), bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let each = x.to_le_bytes().map(|b| b.to_ascii_lowercase());
            prop_assert_eq!(lower_case_8(x), u64::from_le_bytes(each));
            let mut ours = bytes.clone();
            lower_case(&mut ours);
            prop_assert_eq!(ours, bytes.to_ascii_lowercase());
        }

        /// A request's header line is taken when `http::HeaderName` and `HeaderValue`
        /// take it (as when the server parsed into a `HeaderMap`), its name read in lower
        /// case and its value as `HeaderValue::to_str` reads it; any other is a `400`.
        #[test]
        fn request_header_names_are_what_http_takes(
            // (no CR, LF or colon: those would make other lines, not another name)
            name in proptest::collection::vec(any::<u8>().prop_filter("one name", |b| !b"\r\n:".contains(b)), 0..24),
            known in "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,24}",
            pick_known in any::<bool>(),
            value in proptest::collection::vec(
                prop_oneof![any::<u8>(), 0x20u8..0x7f, 0x20u8..0x7f].prop_filter("one line", |b| *b != b'\r' && *b != b'\n'),
                0..24,
            ),
        ) {
            let name = if pick_known { known.into_bytes() } else { name };
            let mut raw = b"POST /v1/messages HTTP/1.1\r\n".to_vec();
            raw.extend_from_slice(&name);
            raw.extend_from_slice(b": v1\r\nx-after: v2\r\nx-any: ");
            raw.extend_from_slice(&value);
            raw.extend_from_slice(b"\r\n\r\n");
            let parsed = parse_request(&mut BytesMut::from(&raw[..]));
            let taken = HeaderName::from_bytes(&name)
                .ok()
                .filter(|_| HeaderValue::from_bytes(&value).is_ok());
            match taken {
                Some(http) => {
                    let Ok(ParsedRequest::Head(head)) = parsed else {
                        return Err(TestCaseError::fail(format!("{name:?} refused")));
                    };
                    let ours: Vec<_> = head.headers.lines().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
                    prop_assert_eq!(&ours[0], &(http.as_str().as_bytes().to_vec(), b"v1".to_vec()));
                    prop_assert_eq!(head.headers.first("x-after"), Some(&b"v2"[..]));
                    // any value taken is one `HeaderValue` takes, and reads as its text
                    let any = head.headers.first("x-any").unwrap();
                    let http = HeaderValue::from_bytes(any).unwrap();
                    prop_assert_eq!(head.headers.first_text("x-any"), http.to_str().ok());
                    prop_assert_eq!(head.headers.first_str("x-any"), http.to_str().ok().map(str::trim));
                    prop_assert_eq!(head.headers.first_text("x-any"), keypool_providers::header_text(any));
                }
                None => prop_assert!(!matches!(parsed, Ok(ParsedRequest::Head(_)))),
            }
        }
    }

    proptest! {
        /// Any body, chunked any way and delivered split at any points, decodes to
        /// itself and ends exactly at the end of the coding.
        #[test]
        fn chunked_round_trips_at_any_split(
            parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
        ) {
            let wire = encode(&parts);
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
            cuts.push(0);
            cuts.push(wire.len());
            cuts.sort_unstable();
            let pieces: Vec<&[u8]> = cuts.windows(2).map(|w| &wire[w[0]..w[1]]).collect();
            let (out, ended) = decode_all(&pieces).unwrap();
            prop_assert!(ended);
            prop_assert_eq!(out, parts.concat());
        }

        /// Names of a tiny alphabet, so that heads repeat names and lookups hit lines of
        /// the same length: `first` and `all` find what a case-blind scan of every line
        /// finds.
        #[test]
        fn lookups_find_what_a_scan_of_every_line_finds(
            lines in proptest::collection::vec(("[a-cA-C-]{1,4}", "[a-z0-9]{0,6}"), 0..24),
            asked in proptest::collection::vec("[a-c-]{1,4}", 1..12),
        ) {
            use keypool_providers::HeaderLines as _;
            let mut raw = String::from("HTTP/1.1 200 OK\r\n");
            for (name, value) in &lines {
                raw.push_str(&format!("{name}: {value}\r\n"));
            }
            raw.push_str("\r\n");
            let (parsed, _) = head(raw.as_bytes());
            for name in asked.iter().map(String::as_str).chain(lines.iter().map(|(n, _)| n.as_str())) {
                let name = name.to_ascii_lowercase();
                let scan: Vec<&[u8]> = lines
                    .iter()
                    .filter(|(n, _)| n.eq_ignore_ascii_case(&name))
                    .map(|(_, v)| v.as_bytes())
                    .collect();
                prop_assert_eq!(parsed.headers.first(&name), scan.first().copied());
                prop_assert_eq!(parsed.headers.all(&name).collect::<Vec<_>>(), scan);
            }
        }

        /// The lines as they came read as a `HeaderMap` of the same lines reads: every
        /// name's first value and all its values (any case on the wire), the
        /// rate-limit facts, the request id and the answer check.
        #[test]
        fn response_lines_read_as_a_header_map(
            lines in proptest::collection::vec((0usize..12, any::<bool>(), "[ -~\t]{0,24}"), 0..16),
        ) {
            use keypool_providers::{HeaderLines as _, check_answer_head, rate_limits_of, upstream_request_id};
            const NAMES: [&str; 12] = [
                "retry-after", "retry-after-ms", "request-id", "x-request-id", "content-type",
                "content-encoding", "anthropic-ratelimit-unified-status",
                "anthropic-ratelimit-unified-5h-utilization", "anthropic-ratelimit-unified-reset",
                "x-ratelimit-remaining-requests", "x-ratelimit-reset-tokens", "set-cookie",
            ];
            let mut raw = String::from("HTTP/1.1 200 OK\r\n");
            let mut map = HeaderMap::new();
            for (i, upper, value) in &lines {
                let name = if *upper { NAMES[*i].to_ascii_uppercase() } else { NAMES[*i].to_owned() };
                raw.push_str(&format!("{name}: {value}\r\n"));
                // what the wire carries: a value without its surrounding spaces
                map.append(NAMES[*i], HeaderValue::from_str(value.trim_matches([' ', '\t'])).unwrap());
            }
            raw.push_str("\r\n");
            let (head, _) = head(raw.as_bytes());
            let ours = &head.headers;
            for name in NAMES {
                prop_assert_eq!(ours.first(name), map.first(name));
                prop_assert_eq!(ours.first_str(name), map.first_str(name));
                let all: Vec<&[u8]> = ours.all(name).collect();
                let theirs: Vec<&[u8]> = map.get_all(name).iter().map(HeaderValue::as_bytes).collect();
                prop_assert_eq!(all, theirs);
            }
            for provider in [keypool_core::Provider::Anthropic, keypool_core::Provider::OpenAi] {
                prop_assert_eq!(rate_limits_of(provider, ours, 1_700_000_000_000), rate_limits_of(provider, &map, 1_700_000_000_000));
                prop_assert_eq!(upstream_request_id(provider, ours), upstream_request_id(provider, &map));
            }
            prop_assert_eq!(check_answer_head(StatusCode::OK, ours), check_answer_head(StatusCode::OK, &map));
        }

        /// A head split anywhere is partial until its last byte arrives, then parses to
        /// the same head, leaving the body's bytes.
        #[test]
        fn heads_parse_the_same_at_any_split(cut in 0usize..200, n in 0u64..100_000) {
            let raw = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nrequest-id: req_1\r\ncontent-length: {n}\r\n\r\nBODY"
            );
            let cut = cut % raw.len();
            let mut buf = BytesMut::from(&raw.as_bytes()[..cut]);
            let whole = raw.len() - 4;
            if cut < whole {
                prop_assert!(matches!(parse_head(&mut buf).unwrap(), Parsed::Partial));
            }
            buf.extend_from_slice(&raw.as_bytes()[cut..]);
            let Parsed::Head(h) = parse_head(&mut buf).unwrap() else {
                return Err(TestCaseError::fail("not parsed"));
            };
            prop_assert_eq!(&buf[..], b"BODY");
            prop_assert_eq!(framing(&Method::POST, &h).unwrap(), (Framing::Length(n), true));
            prop_assert_eq!(h.headers.first_str("request-id"), Some("req_1"));
        }

        /// A request head split anywhere is partial until its last byte, then parses to
        /// the same head, leaving the body's bytes.
        #[test]
        fn request_heads_parse_the_same_at_any_split(cut in 0usize..200, n in 0u64..100_000) {
            let raw = format!(
                "POST /acme/team/v1/messages HTTP/1.1\r\nhost: keypool\r\nx-api-key: sk-lb-k\r\ncontent-length: {n}\r\n\r\nBODY"
            );
            let cut = cut % raw.len();
            let mut buf = BytesMut::from(&raw.as_bytes()[..cut]);
            if cut < raw.len() - 4 {
                prop_assert!(matches!(parse_request(&mut buf).unwrap(), ParsedRequest::Partial));
            }
            buf.extend_from_slice(&raw.as_bytes()[cut..]);
            let ParsedRequest::Head(h) = parse_request(&mut buf).unwrap() else {
                return Err(TestCaseError::fail("not parsed"));
            };
            prop_assert_eq!(&buf[..], b"BODY");
            prop_assert_eq!(h.body, BodyFraming::Length(n));
            prop_assert_eq!(h.headers.first_text("x-api-key"), Some("sk-lb-k"));
        }

        /// Arbitrary bytes never panic the decoder, and it never hands out more data
        /// than it was given.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let mut decoder = Chunked::default();
            let mut buf = BytesMut::from(&bytes[..]);
            let mut out = 0;
            while let Ok(Decoded::Data(d)) = decoder.decode(&mut buf) {
                out += d.len();
            }
            prop_assert!(out <= bytes.len());
            let _ = parse_head(&mut BytesMut::from(&bytes[..]));
            let _ = parse_request(&mut BytesMut::from(&bytes[..]));
        }
    }
}
