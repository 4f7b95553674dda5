//! keypool's own HTTP/1.1 server for plain-TCP connections (issue 22): what an L7
//! proxy's client side does, in the connection's one task.
//!
//! hyper's server dispatches each request through a boxed service future (copied into
//! the connection's slot), hands the request body over a channel, and arms a boxed
//! timer per request; here the connection's task parses a head out of its read buffer
//! ([`crate::h1::parse_request`], hyper's limits and framing rules), awaits
//! [`App::handle`] in place, and writes the answer with one vectored write (a stream:
//! its head, then one write per frame in the chunked coding). TLS connections and
//! HTTP/2 keep hyper ([`crate::connection`]).
//!
//! What it keeps of hyper's behaviour, each tested by the suites in `tests/`:
//! - The head of every request must be whole within `header_read_timeout` of the
//!   moment the server waits for it (after the previous answer), else the connection
//!   is closed without an answer. A head that is not HTTP/1.x, too large (more than 100
//!   lines or ~400 KiB) or badly framed gets `400`, `431` or `414` and the close.
//! - The request body is read only when the request path reads it
//!   ([`RequestBody`]): an unauthenticated client's body is never read, and
//!   `expect: 100-continue` is answered when the body is first read. A body left
//!   unread closes the connection after the answer.
//! - While a request is answered, the connection is watched: a client that closes it
//!   cancels the request (its upstream call is dropped); bytes it sends ahead
//!   (pipelining) are kept for the next request.
//! - Keep-alive as HTTP/1.1 says (`connection: close`, HTTP/1.0 without `keep-alive`, a
//!   request with both a length and a transfer coding, an answer that says close). A
//!   drain lets the request in progress finish, then closes; an idle connection closes
//!   at once.
//! - Answers carry `date` and `content-length` (a stream: `transfer-encoding:
//!   chunked`, or the close for an HTTP/1.0 client); `HEAD` answers have no body.

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::CONNECTION;
use http::{HeaderValue, Method, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use keypool_store::keys::KeyMemo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::watch;

use crate::App;
use crate::app::RequestParts;
use crate::balance::OpenConnection;
use crate::body::ProxyBody;
use crate::connection::ClientInfo;
use crate::h1::{
    self, BodyFraming, BodyReader, Framing, ParsedRequest, RequestError, ResponseFraming,
};
use crate::timing::poll_moved_timer;

/// Bytes of a next request a client may send ahead while its previous one is answered
/// (more are left in the socket until then).
const MAX_AHEAD: usize = 64 * 1024;
/// How much a connection's read buffer grows by when it runs out of room.
const READ_CHUNK: usize = 8 * 1024;

/// Serves one plain-TCP HTTP/1.1 connection to its end; `prefix` is what the protocol
/// detection already read. `drain` says `true` when the server drains.
///
/// `open` counts the connection on its worker thread: between two requests, with
/// nothing of the next one read, the connection leaves for another worker when the
/// balance has planned a move for this one ([`crate::balance`]); its socket then goes
/// on there, and this task ends without closing it.
pub(crate) async fn serve(
    stream: TcpStream,
    prefix: Vec<u8>,
    info: ClientInfo,
    header_read_timeout: Duration,
    app: App,
    drain: watch::Receiver<bool>,
    mut open: Option<OpenConnection>,
) {
    let mut drain = DrainWatch::new(drain);
    let (read, write) = stream.into_split();
    let mut conn = Conn {
        write,
        inbound: Some(Inbound {
            read,
            buf: BytesMut::from(&prefix[..]),
        }),
        slot: Arc::new(Mutex::new(None)),
        out: Vec::with_capacity(512),
        info,
        keys: KeyMemo::default(),
    };
    // Armed once; each request's deadline moves it only when it fires early
    // (`poll_moved_timer`), not at every request.
    let timer = tokio::time::sleep(header_read_timeout);
    tokio::pin!(timer);
    loop {
        let deadline = crate::timing::now() + header_read_timeout;
        let head = match conn.read_head(timer.as_mut(), deadline, &mut drain).await {
            Ok(Some(head)) => head,
            Ok(None) => break,
            Err(Some(error)) => {
                tracing::debug!(peer = %info.peer, ?error, "bad request head; answered and closed");
                let _ = conn.write_error(error.status()).await;
                break;
            }
            Err(None) => break,
        };
        let draining = drain.draining();
        match conn.exchange(&app, head).await {
            Ok(true) if !draining => {}
            Ok(_) => break,
            Err(e) => {
                tracing::debug!(peer = %info.peer, error = %e, "connection ended with an error");
                break;
            }
        }
        // The drain's value (read under its lock) only when a move was planned: a
        // request with none pays one relaxed load here.
        if conn.idle()
            && let Some(to) = open.as_ref().and_then(OpenConnection::take_move)
            && !drain.draining()
            && let Some(open) = open.take()
        {
            return conn.move_to(to, open, &app);
        }
    }
    let _ = conn.write.shutdown().await;
}

/// The server's drain as one connection watches it: one waiter in the drain channel's
/// lists for the connection's life, polled again only once the channel changed.
///
/// Waiting on `watch::Receiver::changed` each time the connection went idle put a
/// waiter into one of the channel's waiter lists and took it out again, each under
/// that list's lock (about 550 instructions per request, issue 22). Registered once,
/// the waiter keeps the connection task's waker, and between requests the connection
/// only loads the channel's version (the channel is its worker's own).
struct DrainWatch {
    /// The server's side of the drain, read to know whether it changed or drains.
    seen: watch::Receiver<bool>,
    /// Resolves when the server drains or is gone; holds its own receiver.
    drained: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// `drained` was polled (its waiter holds the task's waker).
    registered: bool,
    /// `drained` resolved.
    done: bool,
}

impl DrainWatch {
    fn new(seen: watch::Receiver<bool>) -> Self {
        let mut own = seen.clone();
        Self {
            seen,
            // unconstrained: a poll out of tokio's budget would return without putting
            // the waiter in the list, and the next poll may be long after the drain
            drained: Box::pin(tokio::task::unconstrained(async move {
                // an error is a server gone: its connections end too
                let _ = own.wait_for(|&draining| draining).await;
            })),
            registered: false,
            done: false,
        }
    }

    /// Whether the server drains: the value is read (under the channel's value lock)
    /// only once the channel changed.
    fn draining(&self) -> bool {
        self.done || (!matches!(self.seen.has_changed(), Ok(false)) && *self.seen.borrow())
    }

    /// `Ready` once the server drains (or is gone). A connection's task is the one
    /// task that polls it, so the waker registered at the first poll stays right.
    fn poll_drained(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.done {
            return Poll::Ready(());
        }
        if self.registered && matches!(self.seen.has_changed(), Ok(false)) {
            return Poll::Pending;
        }
        self.registered = true;
        let polled = self.drained.as_mut().poll(cx);
        self.done = polled.is_ready();
        polled
    }
}

/// The connection's read side: the socket's read half and what was read but not yet
/// used.
struct Inbound {
    read: OwnedReadHalf,
    buf: BytesMut,
}

impl h1::Source for Inbound {
    fn buffer(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        h1::poll_read_into(&mut self.read, &mut self.buf, READ_CHUNK, cx)
    }
}

impl Inbound {
    /// Reads into the buffer: the bytes read, 0 at the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        h1::Source::poll_fill(self, cx)
    }

    /// While a request is answered: takes in what the client sends ahead (up to
    /// [`MAX_AHEAD`]); `Ready` when the client closed (or the socket failed).
    fn poll_closed(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        while self.buf.len() < MAX_AHEAD {
            match self.poll_fill(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(()),
                Poll::Ready(Ok(_)) => {}
            }
        }
        Poll::Pending
    }
}

/// Where a request body puts the read side back when it ends or is dropped, and
/// whether it was read to its end.
type Slot = Arc<Mutex<Option<(Inbound, bool)>>>;

struct Conn {
    write: OwnedWriteHalf,
    /// The read side, unless a request body has it.
    inbound: Option<Inbound>,
    slot: Slot,
    /// The answer's head.
    out: Vec<u8>,
    info: ClientInfo,
    /// The key the connection presented last, with its hash.
    keys: KeyMemo,
}

impl Conn {
    /// Between two requests with nothing of the next one read.
    fn idle(&self) -> bool {
        self.inbound
            .as_ref()
            .is_some_and(|inbound| inbound.buf.is_empty())
    }

    /// Sends the (idle) connection's socket to worker `to`, which serves it from its next
    /// request on. When that cannot be done (the target worker has stopped: the server
    /// is shutting down) the connection is closed between two requests, as a
    /// keep-alive connection may be.
    fn move_to(self, to: usize, open: OpenConnection, app: &App) {
        let peer = self.info.peer;
        let Some(inbound) = self.inbound else {
            return;
        };
        let moved = inbound
            .read
            .reunite(self.write)
            .map_err(|e| io::Error::other(e.to_string()))
            .and_then(TcpStream::into_std)
            .map(|stream| open.move_to(to, stream, peer).is_ok());
        match moved {
            Ok(true) => app.metrics().connection_moved(),
            Ok(false) => {
                tracing::debug!(%peer, "the worker a connection was moving to has stopped; closed between requests")
            }
            Err(e) => {
                tracing::debug!(%peer, error = %e, "a connection could not leave its worker; closed between requests")
            }
        }
    }

    /// Waits for the next request head: `Ok(None)` when the client closed between
    /// requests, the head timed out or the server drains while the connection is
    /// idle; `Err(Some)` for a head to answer with an error, `Err(None)` for a failed
    /// socket.
    async fn read_head(
        &mut self,
        mut timer: Pin<&mut tokio::time::Sleep>,
        deadline: tokio::time::Instant,
        drain: &mut DrainWatch,
    ) -> Result<Option<h1::RequestHead>, Option<RequestError>> {
        let Some(inbound) = self.inbound.as_mut() else {
            return Err(None);
        };
        loop {
            if !inbound.buf.is_empty() {
                match h1::parse_request(&mut inbound.buf) {
                    Ok(ParsedRequest::Head(head)) => return Ok(Some(head)),
                    Ok(ParsedRequest::Partial) => {}
                    Err(e) => return Err(Some(e)),
                }
            }
            let idle = inbound.buf.is_empty();
            // An idle connection ends when the server drains, even with the next request
            // already sent (only a load of the channel's version while nothing changed);
            // then the read, and the timer only when nothing came: bytes that came are
            // taken without polling it, its waker registered from the poll that found
            // none.
            let read = poll_fn(|cx| {
                if idle && drain.poll_drained(cx).is_ready() {
                    return Poll::Ready(Ok(None));
                }
                if let Poll::Ready(read) = inbound.poll_fill(cx) {
                    return Poll::Ready(read.map(Some));
                }
                poll_moved_timer(timer.as_mut(), deadline, cx).map(|()| Ok(None))
            })
            .await;
            match read {
                Ok(Some(0)) if idle => return Ok(None),
                // closed in the middle of a head: nothing to answer
                Ok(Some(0)) => return Err(None),
                Ok(Some(_)) => {}
                Ok(None) if idle => return Ok(None),
                Ok(None) => {
                    tracing::debug!(peer = %self.info.peer, "no complete request head within header_read_timeout; closed");
                    return Err(None);
                }
                Err(_) => return Err(None),
            }
        }
    }

    /// Answers one request: `Ok(true)` when the connection may carry another.
    async fn exchange(&mut self, app: &App, head: h1::RequestHead) -> io::Result<bool> {
        let h1::RequestHead {
            method,
            uri,
            version,
            headers,
            body,
            keep_alive,
            expect_continue,
        } = head;
        let body = match body {
            BodyFraming::Length(0) => RequestBody::empty(),
            framing => RequestBody {
                inbound: self.inbound.take(),
                reader: BodyReader::new(match framing {
                    BodyFraming::Length(n) => Framing::Length(n),
                    BodyFraming::Chunked => Framing::Chunked,
                }),
                expect_continue,
                slot: Some(self.slot.clone()),
            },
        };
        let parts = RequestParts {
            method: method.clone(),
            uri,
            headers,
        };
        let Some((response, request_id)) = self.answer(app, parts, body).await else {
            // the client closed: the request was cancelled
            return Ok(false);
        };
        let body_read = self.take_back();
        let (parts, body) = response.into_parts();
        let says_close = parts
            .headers
            .get_all(CONNECTION)
            .iter()
            .any(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        let mut keep_alive = keep_alive && body_read && !says_close && self.inbound.is_some();
        let bodiless = method == Method::HEAD
            || parts.status == StatusCode::NO_CONTENT
            || parts.status == StatusCode::NOT_MODIFIED;
        let framing = match body.size_hint().exact() {
            _ if bodiless => ResponseFraming::None(body.size_hint().exact().filter(|&n| n > 0)),
            Some(n) => ResponseFraming::Length(n),
            None if version == Version::HTTP_11 => ResponseFraming::Chunked,
            None => {
                keep_alive = false;
                ResponseFraming::UntilClose
            }
        };
        let keep_alive_10 = keep_alive && version == Version::HTTP_10;
        let date = DATE.with(CachedDate::now);
        h1::write_response_head(
            &mut self.out,
            version,
            parts.status,
            &parts.headers,
            framing,
            keep_alive_10,
            &date,
            Some(&request_id),
        );
        crate::headers::give_back(parts.headers);
        if bodiless {
            self.write_all(&[]).await?;
        } else {
            self.write_body(body, framing).await?;
        }
        Ok(keep_alive)
    }

    /// Awaits the answer while watching the connection: `None` when the client closed
    /// (the request is dropped, which cancels its upstream call).
    async fn answer(
        &mut self,
        app: &App,
        parts: RequestParts,
        body: RequestBody,
    ) -> Option<(Response<ProxyBody>, Arc<str>)> {
        // pinned where it is made: a `let` then `tokio::pin!` moved the whole request
        // future (~5 KB) once more
        // the memo is out of `self` while the request has it (`self` watches the client)
        let mut keys = std::mem::take(&mut self.keys);
        let answer = {
            let mut handling =
                std::pin::pin!(app.handle_from(Some(self.info), &mut keys, parts, body));
            poll_fn(|cx| {
                if let Poll::Ready(response) = handling.as_mut().poll(cx) {
                    return Poll::Ready(Some(response));
                }
                self.poll_client_gone(cx).map(|()| None)
            })
            .await
        };
        self.keys = keys;
        answer
    }

    /// `Ready` when the client closed; only while this task holds the read side (a
    /// body being read watches it itself).
    fn poll_client_gone(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.inbound.is_none()
            && let Some((inbound, read)) = self
                .slot
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
        {
            self.inbound = Some(inbound);
            if !read {
                // unread body bytes would be taken for the next request
                self.inbound = None;
                return Poll::Pending;
            }
        }
        match self.inbound.as_mut() {
            Some(inbound) => inbound.poll_closed(cx),
            None => Poll::Pending,
        }
    }

    /// Takes the read side back from the request body: whether the body was read to
    /// its end (or there was none). A body left unread closes the connection.
    fn take_back(&mut self) -> bool {
        if self.inbound.is_some() {
            return true;
        }
        match self
            .slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            Some((inbound, true)) => {
                self.inbound = Some(inbound);
                true
            }
            _ => false,
        }
    }

    /// Writes the head (in `out`) and the body.
    async fn write_body(
        &mut self,
        mut body: ProxyBody,
        framing: ResponseFraming,
    ) -> io::Result<()> {
        if let Some(bytes) = body.full_bytes().cloned() {
            return self.write_all(&bytes).await;
        }
        if matches!(framing, ResponseFraming::Length(0)) {
            return self.write_all(&[]).await;
        }
        // A stream: the head with every frame ready now (those held to the commit point)
        // in one write, then each burst of frames that arrived together in one write.
        let chunked = framing == ResponseFraming::Chunked;
        let mut head = true;
        let mut frames: Vec<Bytes> = Vec::new();
        // a small burst is copied here and sent with one plain write
        let mut joined: Vec<u8> = Vec::new();
        loop {
            let ended = poll_fn(|cx| {
                if let Poll::Ready(ended) = gather(&mut body, cx, &mut frames) {
                    return Poll::Ready(Some(ended));
                }
                if head {
                    // nothing to send with it: the head goes alone, now
                    return Poll::Ready(Some(false));
                }
                self.poll_client_gone(cx).map(|()| None)
            })
            .await;
            // the client closed: dropping the body ends the stream as client_gone
            let ended = ended.ok_or(io::ErrorKind::ConnectionAborted)?;
            let mut sizes = vec![[0u8; 18]; if chunked { frames.len() } else { 0 }];
            let mut parts: Vec<&[u8]> = Vec::with_capacity(frames.len() * 3 + 2);
            if std::mem::take(&mut head) {
                parts.push(&self.out);
            }
            if chunked {
                for (frame, size) in frames.iter().zip(sizes.iter_mut()) {
                    parts.push(h1::chunk_size_line(size, frame.len()));
                    parts.push(frame);
                    parts.push(b"\r\n");
                }
                if ended {
                    parts.push(b"0\r\n\r\n");
                }
            } else {
                parts.extend(frames.iter().map(|f| &f[..]));
            }
            if parts.iter().map(|p| p.len()).sum::<usize>() <= h1::COALESCE_MAX {
                joined.clear();
                for part in &parts {
                    joined.extend_from_slice(part);
                }
                self.write.write_all(&joined).await?;
            } else {
                write_vectored_all(&mut self.write, &parts).await?;
            }
            drop(parts);
            frames.clear();
            if ended {
                return Ok(());
            }
        }
    }

    /// Writes the head (in `out`) and `body`: a small body copied after the head and
    /// the two sent with one plain write ([`h1::COALESCE_MAX`]), a larger one beside it
    /// with one vectored write (more when the socket takes less).
    async fn write_all(&mut self, body: &[u8]) -> io::Result<()> {
        if body.len() > h1::COALESCE_MAX {
            return write_vectored_all(&mut self.write, &[&self.out, body]).await;
        }
        self.out.extend_from_slice(body);
        self.write.write_all(&self.out).await
    }

    /// The automatic answer to a head that cannot be served, then the close.
    async fn write_error(&mut self, status: StatusCode) -> io::Result<()> {
        let mut headers = http::HeaderMap::new();
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
        let date = DATE.with(CachedDate::now);
        h1::write_response_head(
            &mut self.out,
            Version::HTTP_11,
            status,
            &headers,
            ResponseFraming::Length(0),
            false,
            &date,
            None,
        );
        self.write_all(&[]).await
    }
}

/// Writes every byte of `parts`, in order, with as few vectored writes as the socket
/// allows.
async fn write_vectored_all(write: &mut OwnedWriteHalf, parts: &[&[u8]]) -> io::Result<()> {
    /// Parts whose slices are kept on the stack: an answer's head and body (a stream's
    /// batches of frames take a vector).
    const ON_STACK: usize = 4;
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut done = 0;
    let mut on_stack = [IoSlice::new(&[]); ON_STACK];
    let mut on_heap = Vec::new();
    let slices: &mut [IoSlice<'_>] = if parts.len() <= ON_STACK {
        &mut on_stack[..parts.len()]
    } else {
        on_heap.resize(parts.len(), IoSlice::new(&[]));
        &mut on_heap
    };
    while done < total {
        let mut skip = done;
        let mut used = 0;
        for part in parts {
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            slices[used] = IoSlice::new(&part[skip..]);
            used += 1;
            skip = 0;
        }
        let written = write.write_vectored(&slices[..used]).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        done += written;
    }
    Ok(())
}

/// Most frames of a stream written together.
const MAX_BATCH: usize = 64;

/// Takes the frames of `body` ready now into `frames` (at most [`MAX_BATCH`]):
/// `Ready(true)` at the body's end, `Ready(false)` with frames to write, `Pending` when
/// none is ready.
fn gather(body: &mut ProxyBody, cx: &mut Context<'_>, frames: &mut Vec<Bytes>) -> Poll<bool> {
    while frames.len() < MAX_BATCH {
        match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data()
                    && !data.is_empty()
                {
                    frames.push(data);
                }
            }
            Poll::Ready(Some(Err(never))) => match never {},
            Poll::Ready(None) => return Poll::Ready(true),
            Poll::Pending if frames.is_empty() => return Poll::Pending,
            Poll::Pending => break,
        }
    }
    Poll::Ready(false)
}

/// A request body, read from the connection as the request path reads it. It holds
/// the connection's read side until it ends or is dropped, then gives it back.
pub(crate) struct RequestBody {
    inbound: Option<Inbound>,
    reader: BodyReader,
    /// `expect: 100-continue` not answered yet.
    expect_continue: bool,
    slot: Option<Slot>,
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBody")
            .field("done", &self.reader.is_done())
            .finish_non_exhaustive()
    }
}

impl RequestBody {
    fn empty() -> Self {
        Self {
            inbound: None,
            reader: BodyReader::Done,
            expect_continue: false,
            slot: None,
        }
    }

    /// Writes `100 Continue` (at most a few bytes into an idle socket's buffer).
    fn poll_continue(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
        let Some(inbound) = self.inbound.as_ref() else {
            return Poll::Ready(Ok(()));
        };
        let stream = inbound.read.as_ref();
        let mut written = 0;
        while written < CONTINUE.len() {
            match stream.try_write(&CONTINUE[written..]) {
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if written > 0 {
                        // practically never: the rest goes out once the socket takes it
                        continue;
                    }
                    std::task::ready!(stream.poll_write_ready(cx))?;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        self.expect_continue = false;
        Poll::Ready(Ok(()))
    }

    fn fail(&mut self, error: io::Error) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        // the connection cannot be read on: the read side is not given back
        self.inbound = None;
        self.reader = BodyReader::Done;
        Poll::Ready(Some(Err(error)))
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        if let (Some(inbound), Some(slot)) = (self.inbound.take(), self.slot.as_ref()) {
            let read = self.reader.is_done();
            *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some((inbound, read));
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        let this = self.get_mut();
        if this.expect_continue
            && let Err(e) = std::task::ready!(this.poll_continue(cx))
        {
            return this.fail(e);
        }
        let Some(inbound) = this.inbound.as_mut() else {
            return Poll::Ready(None);
        };
        const CLOSED: &str = "the client closed the connection before the end of its body";
        match std::task::ready!(this.reader.poll_next(inbound, cx, CLOSED)) {
            Some(Ok((data, _))) => Poll::Ready(Some(Ok(Frame::data(data)))),
            None => Poll::Ready(None),
            Some(Err(e)) => this.fail(e),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.reader.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        self.reader.size_hint()
    }
}

/// The `date` header's value, formatted once a second per thread.
struct CachedDate {
    second: std::cell::Cell<u64>,
    text: std::cell::Cell<[u8; 29]>,
}

impl CachedDate {
    /// The date now, as IMF-fixdate (`Wed, 02 Dec 2026 07:34:49 GMT`).
    fn now(&self) -> [u8; 29] {
        let now = keypool_store::clock::system_time();
        let second = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if second != self.second.get() {
            let text = httpdate::fmt_http_date(now);
            if let Ok(fixed) = <[u8; 29]>::try_from(text.as_bytes()) {
                self.text.set(fixed);
                self.second.set(second);
            }
        }
        self.text.get()
    }
}

thread_local! {
    static DATE: CachedDate = const {
        CachedDate {
            second: std::cell::Cell::new(0),
            text: std::cell::Cell::new(*b"Thu, 01 Jan 1970 00:00:00 GMT"),
        }
    };
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    use super::*;

    /// Counts its wakes.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Wakes {
        /// A waker that counts its wakes, and the count.
        fn counting() -> (Arc<Self>, Waker) {
            let wakes = Arc::new(Self::default());
            let waker = Waker::from(wakes.clone());
            (wakes, waker)
        }

        fn count(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// Spends what is left of tokio's budget for this poll.
    fn spend_budget(cx: &mut Context<'_>) {
        loop {
            let mut spend = std::pin::pin!(tokio::task::consume_budget());
            if spend.as_mut().poll(cx).is_pending() {
                return;
            }
        }
    }

    #[tokio::test]
    async fn the_drain_wakes_an_idle_connection_whose_first_wait_was_out_of_budget() {
        let (tx, rx) = watch::channel(false);
        let mut drain = DrainWatch::new(rx);
        let (wakes, waker) = Wakes::counting();
        let mut cx = Context::from_waker(&waker);
        spend_budget(&mut cx);
        assert!(drain.poll_drained(&mut cx).is_pending());
        // nothing changed: another idle wait of the connection
        assert!(drain.poll_drained(&mut cx).is_pending());
        assert!(!drain.draining());
        let before = wakes.count();
        tx.send(true).expect("the connection holds a receiver");
        assert_eq!(
            wakes.count(),
            before + 1,
            "the drain woke the connection's task"
        );
        assert!(drain.draining());
        assert!(drain.poll_drained(&mut cx).is_ready());
        assert!(drain.poll_drained(&mut cx).is_ready(), "and stays drained");
    }

    #[tokio::test]
    async fn a_server_gone_ends_an_idle_connection() {
        let (tx, rx) = watch::channel(false);
        let mut drain = DrainWatch::new(rx);
        let (wakes, waker) = Wakes::counting();
        let mut cx = Context::from_waker(&waker);
        assert!(drain.poll_drained(&mut cx).is_pending());
        drop(tx);
        assert_eq!(wakes.count(), 1);
        assert!(!drain.draining(), "gone is not draining");
        assert!(drain.poll_drained(&mut cx).is_ready());
        assert!(drain.draining(), "but its connections end as if it were");
    }

    #[tokio::test]
    async fn a_drain_already_begun_ends_the_first_wait() {
        let (tx, rx) = watch::channel(false);
        tx.send(true).expect("a receiver");
        let mut drain = DrainWatch::new(rx);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(drain.poll_drained(&mut cx).is_ready());
    }

    /// A server connection on worker `worker` of `balance`, as `server::serve` spawns
    /// it, and the client's end.
    fn serve_on(
        app: &App,
        balance: &Arc<crate::balance::AcceptBalance>,
        worker: usize,
        stream: TcpStream,
        peer: std::net::SocketAddr,
        open: Option<OpenConnection>,
    ) -> tokio::task::JoinHandle<()> {
        let protocols = crate::connection::Protocols::new(Duration::from_secs(10));
        let (drain_tx, drain) = watch::channel(false);
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let signals = crate::connection::DrainSignals {
            watcher: graceful.watcher(),
            drain,
        };
        let app = app.clone();
        let open = open.unwrap_or_else(|| balance.open_on(worker));
        tokio::spawn(async move {
            let _keep = (drain_tx, graceful);
            crate::connection::serve(
                stream,
                peer,
                crate::connection::Side::Public,
                None,
                &protocols,
                app,
                signals,
                Some(open),
            )
            .await;
        })
    }

    /// Reads one `GET /readyz` answer off `client` (`got` keeps what was read past
    /// it): its status line.
    async fn read_answer(client: &mut TcpStream, got: &mut Vec<u8>) -> String {
        use tokio::io::AsyncReadExt;
        let mut chunk = [0u8; 1024];
        loop {
            let text = String::from_utf8_lossy(got).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let length: usize = text[..end]
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .unwrap()
                    .parse()
                    .unwrap();
                if got.len() >= end + 4 + length {
                    got.drain(..end + 4 + length);
                    return text.lines().next().unwrap().to_owned();
                }
            }
            let n = tokio::time::timeout(Duration::from_secs(10), client.read(&mut chunk))
                .await
                .unwrap_or_else(|_| panic!("no answer; so far {text:?}"))
                .unwrap();
            assert!(n > 0, "closed after {text:?}");
            got.extend_from_slice(&chunk[..n]);
        }
    }

    const READY: &[u8] = b"GET /readyz HTTP/1.1\r\nhost: keypool\r\n\r\n";

    /// A connection keeps its requests in order across a move to another worker: it
    /// leaves only between two requests with nothing of the next one read (here after
    /// the second of two pipelined ones), is counted on its new worker, and is served
    /// there on the same socket.
    #[tokio::test]
    async fn a_connection_moves_to_another_worker_between_requests() {
        let config = keypool_store::config::Config::from_toml_str(
            "[server]\nstate_file = \"\"\n[[orgs]]\nslug = \"acme\"\n",
            None,
            &|_| None,
        )
        .unwrap();
        let app = App::new(keypool_store::Store::open(config).await.unwrap());
        let mut shares = crate::balance::AcceptBalance::shares(2);
        let balance = Arc::clone(&shares[0].balance);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, peer) = listener.accept().await.unwrap();
        let first = serve_on(&app, &balance, 0, stream, peer, None);
        assert_eq!(balance.open_counts(), [1, 0]);

        let mut got = Vec::new();
        balance.order(0, crate::balance::Leaving { to: 1, count: 1 });
        // two requests at once: after the first, the second is already read
        client.write_all(&[READY, READY].concat()).await.unwrap();
        assert_eq!(read_answer(&mut client, &mut got).await, "HTTP/1.1 200 OK");
        assert_eq!(read_answer(&mut client, &mut got).await, "HTTP/1.1 200 OK");
        let (stream, moved_peer, open) = shares[1].inbox.recv().await.unwrap();
        first.await.unwrap();
        assert_eq!(moved_peer, peer);
        assert_eq!(balance.open_counts(), [0, 1]);
        assert_eq!(balance.take_move(0), None, "the one planned move was taken");
        assert_eq!(app.metrics().connections_moved(), 1);

        // worker 1 serves the same socket from the next request on
        let stream = TcpStream::from_std(stream).unwrap();
        let second = serve_on(&app, &balance, 1, stream, peer, Some(open));
        for _ in 0..3 {
            client.write_all(READY).await.unwrap();
            assert_eq!(read_answer(&mut client, &mut got).await, "HTTP/1.1 200 OK");
        }
        assert!(shares[0].inbox.try_recv().is_err());
        drop(client);
        second.await.unwrap();
        assert_eq!(balance.open_counts(), [0, 0]);

        // a move to a worker that has stopped closes the connection between requests
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, peer) = listener.accept().await.unwrap();
        let third = serve_on(&app, &balance, 0, stream, peer, None);
        drop(shares.remove(1));
        balance.order(0, crate::balance::Leaving { to: 1, count: 1 });
        let mut got = Vec::new();
        client.write_all(READY).await.unwrap();
        assert_eq!(read_answer(&mut client, &mut got).await, "HTTP/1.1 200 OK");
        third.await.unwrap();
        let mut rest = Vec::new();
        use tokio::io::AsyncReadExt;
        assert_eq!(client.read_to_end(&mut rest).await.unwrap(), 0);
        assert_eq!(balance.open_counts(), [0, 0]);
        assert_eq!(app.metrics().connections_moved(), 1);
    }
}
