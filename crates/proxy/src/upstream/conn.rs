//! keypool's own HTTP/1.1 client for the request path ([`Upstream`]): pooled keep-alive
//! connections (plain TCP, or TLS with rustls), the request written with one vectored
//! write, the response head parsed out of the connection's read buffer, and the
//! response body ([`UpstreamBody`]) read by whoever polls it.
//!
//! There is no connection task: the request's own task writes the request and reads
//! the answer, and a committed stream's body is read by the client connection's task
//! that writes it out. A connection goes back to the pool when its body has been read
//! to its end (and the upstream did not ask to close it); a body dropped before its
//! end closes its connection, which is how a hedge's loser or a client that went away
//! stops the upstream request.
//!
//! **Idle connections.** The pool keeps up to [`MAX_IDLE_PER_ORIGIN`] idle connections
//! per origin for [`IDLE_TIMEOUT`], most recently used first. One that the upstream
//! closed (or wrote to) while idle is dropped when it is taken, never used: a
//! connection idle for less than [`PROBE_AFTER`] is judged by the readiness the event
//! loop already saw (no system call), a longer idle one by a non-blocking `MSG_PEEK`
//! (an upstream's idle timeout is seconds to minutes, so a connection in steady use
//! costs nothing). A request whose pooled connection turns out to be gone when its
//! bytes are written is sent once more on a fresh connection (the upstream cannot have
//! read it); once the request has been written, a failure is the attempt's.

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::Uri;
use http_body::{Body, Frame, SizeHint};
use hyper_rustls::ConfigBuilderExt;
use keypool_providers::UpstreamHead;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::{BoxError, Egress, EgressConnector};
use crate::h1::{self, BodyReader, Parsed};
use crate::timing::poll_moved_timer;

/// How long an idle connection is kept.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Most idle connections kept per origin (per worker thread); past it the oldest is
/// closed.
pub const MAX_IDLE_PER_ORIGIN: usize = 512;
/// An idle connection taken after this long is probed with a system call (see the
/// module docs); one idle for less is judged by the readiness already seen.
pub const PROBE_AFTER: Duration = Duration::from_secs(1);
/// How much a connection's read buffer grows by when it runs out of room.
const READ_CHUNK: usize = 16 * 1024;
/// A pooled connection's read buffer larger than this is given back to the allocator.
const MAX_KEPT_BUFFER: usize = 64 * 1024;

/// Why a request could not be sent or its answer's head read.
#[derive(Debug)]
pub(crate) enum SendError {
    /// No connection could be made (TCP, the outbound proxy, or the TLS handshake), or
    /// the URI cannot be called.
    Connect(BoxError),
    /// The connection failed, or the answer is not HTTP/1.1 keypool can read.
    Io(io::Error),
    /// The answer's head was not in by the deadline.
    Timeout,
}

impl SendError {
    /// Whether no connection could be made.
    pub(crate) fn is_connect(&self) -> bool {
        matches!(self, Self::Connect(_))
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connect(e) => write!(f, "cannot connect to the upstream: {e}"),
            Self::Io(e) => write!(f, "upstream connection failed: {e}"),
            Self::Timeout => write!(f, "the upstream's answer did not start in time"),
        }
    }
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Connect(e) => Some(e.as_ref()),
            Self::Io(e) => Some(e),
            Self::Timeout => None,
        }
    }
}

/// The request path's upstream client: one per worker thread and egress (the process's,
/// or an account's own `proxy_url`), like the connection pool it holds.
pub(crate) struct Upstream {
    connector: EgressConnector,
    tls: tokio_rustls::TlsConnector,
    pool: Mutex<Pool>,
    /// [`PROBE_AFTER`] (tests set their own).
    probe_after: Duration,
    /// The task that closes connections idle for too long, once one was pooled
    /// (stopped when the client is dropped).
    sweeper: OnceLock<tokio::task::AbortHandle>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(sweeper) = self.sweeper.get() {
            sweeper.abort();
        }
    }
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream").finish_non_exhaustive()
    }
}

type Origins = std::collections::HashMap<Box<str>, Vec<Idle>, foldhash::fast::RandomState>;

/// Idle connections by origin: plain and TLS apart, each by authority.
#[derive(Default)]
struct Pool {
    plain: Origins,
    tls: Origins,
}

impl Pool {
    fn origins(&mut self, tls: bool) -> &mut Origins {
        if tls { &mut self.tls } else { &mut self.plain }
    }
}

struct Idle {
    conn: Box<Conn>,
    since: Instant,
}

impl Upstream {
    /// A client whose connections leave through `egress`, TLS with the webpki roots
    /// (ring), offering only HTTP/1.1.
    pub(crate) fn new(egress: Egress) -> Arc<Self> {
        Self::with_probe_after(egress, PROBE_AFTER)
    }

    /// [`Upstream::new`] probing idle connections taken after `probe_after`.
    fn with_probe_after(egress: Egress, probe_after: Duration) -> Arc<Self> {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map(|builder| builder.with_webpki_roots().with_no_client_auth())
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "ring TLS provider unusable; using the process default");
            rustls::ClientConfig::builder()
                .with_webpki_roots()
                .with_no_client_auth()
        });
        let mut config = config;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(Self {
            connector: super::egress_connector(egress),
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            pool: Mutex::new(Pool::default()),
            probe_after,
            sweeper: OnceLock::new(),
        })
    }

    /// Sends `head` with `body` and reads the answer's head by `deadline`; the body is
    /// read from the returned response.
    ///
    /// The deadline is kept by the connection's own timer, armed once and moved on
    /// when it fires early ([`poll_moved_timer`]): a pooled connection's next request
    /// costs no timer-wheel insertion and removal.
    ///
    /// # Errors
    /// [`SendError::Connect`] when no connection could be made, [`SendError::Io`] when
    /// the exchange failed before the answer's head was read, [`SendError::Timeout`]
    /// when the head was not in by `deadline`.
    pub(crate) async fn send(
        self: &Arc<Self>,
        head: &UpstreamHead,
        body: &Bytes,
        deadline: Instant,
    ) -> Result<Answer, SendError> {
        let (tls, authority) = origin(&head.uri)?;
        let mut pooled = poll_fn(|cx| Poll::Ready(self.checkout(cx, tls, authority))).await;
        let mut timer = pooled
            .as_mut()
            .and_then(|conn| conn.timer.take())
            .unwrap_or_else(|| Box::pin(tokio::time::sleep_until(deadline)));
        // A fresh connection's future (connect, TLS handshake, the request's write:
        // ~1.3 KB) is boxed: it is the rare path, and inline it made this block, every
        // future that holds it up to the connection's task, and the `select!` below
        // that moves it, that much larger on every request (issue 22).
        let exchange = async {
            let written = match pooled {
                Some(mut pooled) => pooled.write_request(head, body).await.ok().map(|()| pooled),
                None => None,
            };
            // None idle, or the pooled one gone while idle (the upstream cannot have
            // read the request): once more on a fresh connection.
            let mut conn = match written {
                Some(conn) => conn,
                None => Box::pin(self.fresh(head, body, tls, authority)).await?,
            };
            let answer = conn.read_head().await.map_err(SendError::Io)?;
            Ok::<_, SendError>((conn, answer))
        };
        let (mut conn, answer) = tokio::select! {
            biased;
            exchanged = exchange => exchanged?,
            () = poll_fn(|cx| poll_moved_timer(timer.as_mut(), deadline, cx)) => {
                return Err(SendError::Timeout);
            }
        };
        conn.timer = Some(timer);
        let (framing, keep_alive) = h1::framing(&head.method, &answer).map_err(SendError::Io)?;
        Ok(Answer {
            head: answer,
            body: UpstreamBody {
                conn: Some(conn),
                reader: BodyReader::new(framing),
                keep_alive,
                upstream: Arc::downgrade(self),
            },
        })
    }

    /// A new connection with the request written on it.
    async fn fresh(
        &self,
        head: &UpstreamHead,
        body: &Bytes,
        tls: bool,
        authority: &str,
    ) -> Result<Box<Conn>, SendError> {
        let mut conn = self.connect(&head.uri, tls, authority).await?;
        conn.write_request(head, body)
            .await
            .map_err(SendError::Io)?;
        Ok(conn)
    }

    async fn connect(&self, uri: &Uri, tls: bool, authority: &str) -> Result<Box<Conn>, SendError> {
        let mut connector = self.connector.clone();
        let tcp = connector
            .call(uri.clone())
            .await
            .map_err(SendError::Connect)?
            .into_inner();
        let io = if tls {
            let host = uri.host().unwrap_or_default();
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                .map_err(|e| SendError::Connect(Box::new(e)))?;
            let stream = self
                .tls
                .connect(name, tcp)
                .await
                .map_err(|e| SendError::Connect(Box::new(e)))?;
            Io::Tls(Box::new(stream))
        } else {
            Io::Plain(tcp)
        };
        Ok(Box::new(Conn {
            io,
            read: BytesMut::new(),
            write: Vec::with_capacity(1024),
            tls,
            authority: authority.into(),
            host: h1::host_header(uri),
            timer: None,
        }))
    }

    /// The most recently used idle connection to the origin that is still usable.
    fn checkout(&self, cx: &mut Context<'_>, tls: bool, authority: &str) -> Option<Box<Conn>> {
        let now = crate::timing::now();
        loop {
            let mut idle = {
                let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
                pool.origins(tls).get_mut(authority)?.pop()?
            };
            let idle_for = now.saturating_duration_since(idle.since);
            if idle_for < IDLE_TIMEOUT && idle.conn.idle_usable(cx, idle_for >= self.probe_after) {
                return Some(idle.conn);
            }
            // Dropped outside the lock: closing is a system call.
        }
    }

    /// Puts a connection whose exchange ended cleanly back into the pool.
    fn checkin(self: Arc<Self>, mut conn: Box<Conn>) {
        if conn.read.capacity() > MAX_KEPT_BUFFER {
            conn.read = BytesMut::new();
        }
        let evicted = {
            let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
            let origins = pool.origins(conn.tls);
            let list = match origins.get_mut(&*conn.authority) {
                Some(list) => list,
                None => origins.entry(conn.authority.clone()).or_default(),
            };
            list.push(Idle {
                conn,
                since: crate::timing::now(),
            });
            (list.len() > MAX_IDLE_PER_ORIGIN).then(|| list.remove(0))
        };
        drop(evicted);
        if self.sweeper.get().is_none() {
            let task = tokio::spawn(sweep(Arc::downgrade(&self))).abort_handle();
            if let Err(task) = self.sweeper.set(task) {
                task.abort();
            }
        }
    }

    /// Closes the connections idle for longer than [`IDLE_TIMEOUT`].
    fn sweep(&self) {
        let now = Instant::now();
        let mut expired = Vec::new();
        {
            let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
            let Pool { plain, tls } = &mut *pool;
            for origins in [plain, tls] {
                origins.retain(|_, list| {
                    let keep = list
                        .iter()
                        .position(|i| now.saturating_duration_since(i.since) < IDLE_TIMEOUT)
                        .unwrap_or(list.len());
                    expired.extend(list.drain(..keep));
                    !list.is_empty()
                });
            }
        }
        drop(expired);
    }

    /// Idle connections now, all origins together (tests).
    #[cfg(test)]
    fn idle(&self) -> usize {
        let pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        pool.plain
            .values()
            .chain(pool.tls.values())
            .map(Vec::len)
            .sum()
    }
}

/// Every third of [`IDLE_TIMEOUT`], closes what has been idle for longer, until the
/// client is gone.
async fn sweep(upstream: Weak<Upstream>) {
    let mut every = tokio::time::interval(IDLE_TIMEOUT / 3);
    every.tick().await;
    loop {
        every.tick().await;
        match upstream.upgrade() {
            Some(upstream) => upstream.sweep(),
            None => return,
        }
    }
}

/// Whether `uri` is TLS, and its authority.
fn origin(uri: &Uri) -> Result<(bool, &str), SendError> {
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => {
            return Err(SendError::Connect(
                "the upstream URI is not http or https".into(),
            ));
        }
    };
    match uri.authority() {
        Some(authority) => Ok((tls, authority.as_str())),
        None => Err(SendError::Connect("the upstream URI has no host".into())),
    }
}

/// One connection's byte stream.
enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Io {
    fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(tcp) => tcp,
            Self::Tls(tls) => tls.get_ref().0,
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// An upstream's answer: its head (status and header lines as they came) and its body,
/// read from the connection as it is polled.
#[derive(Debug)]
pub(crate) struct Answer {
    pub head: h1::Head,
    pub body: UpstreamBody,
}

/// One upstream connection: its stream, the bytes read but not yet consumed, and the
/// buffer its request heads are written into.
pub(crate) struct Conn {
    io: Io,
    read: BytesMut,
    write: Vec<u8>,
    tls: bool,
    authority: Box<str>,
    /// The `host` header of every request on this connection (its origin's, computed
    /// once: the pool keys connections by origin).
    host: Box<[u8]>,
    /// The timer of its requests' deadlines ([`Upstream::send`]), from its first
    /// answer on.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Conn {
    /// Whether an idle connection can carry a request: the upstream has neither closed
    /// it nor sent anything on it. With `probe`, asks the socket (a non-blocking
    /// `MSG_PEEK`); without, only when the event loop saw it become readable. TLS
    /// records that carry no data (a session ticket) are taken in.
    fn idle_usable(&mut self, cx: &mut Context<'_>, probe: bool) -> bool {
        if !self.read.is_empty() {
            return false;
        }
        let peeked = if probe {
            let mut byte = [std::mem::MaybeUninit::uninit()];
            match socket2::SockRef::from(self.io.tcp()).peek(&mut byte) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
                Ok(n) => Poll::Ready(Ok(n)),
            }
        } else {
            let mut byte = [0u8; 1];
            let mut byte = ReadBuf::new(&mut byte);
            self.io.tcp().poll_peek(cx, &mut byte)
        };
        match peeked {
            Poll::Pending => true,
            Poll::Ready(Err(_) | Ok(0)) => false,
            Poll::Ready(Ok(_)) => match &mut self.io {
                Io::Plain(_) => false,
                Io::Tls(_) => matches!(self.poll_fill(cx), Poll::Pending) && self.read.is_empty(),
            },
        }
    }

    /// Writes the request head and body, then flushes.
    async fn write_request(&mut self, head: &UpstreamHead, body: &Bytes) -> io::Result<()> {
        h1::write_head(
            &mut self.write,
            &head.method,
            &head.uri,
            &self.host,
            &head.headers,
            body.len(),
        );
        // A small body goes after the head, the two in one plain write
        // (`h1::COALESCE_MAX`); a larger one beside it.
        if body.len() <= h1::COALESCE_MAX {
            self.write.extend_from_slice(body);
            self.io.write_all(&self.write).await?;
            return self.io.flush().await;
        }
        let head_len = self.write.len();
        let mut written = 0;
        while written < head_len + body.len() {
            let n = if written < head_len {
                let parts = [IoSlice::new(&self.write[written..]), IoSlice::new(body)];
                self.io.write_vectored(&parts).await?
            } else {
                self.io.write(&body[written - head_len..]).await?
            };
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            written += n;
        }
        self.io.flush().await
    }

    /// Reads into the read buffer: the number of bytes read, 0 at the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        h1::Source::poll_fill(self, cx)
    }

    /// Reads the answer's head, skipping interim (1xx) answers.
    async fn read_head(&mut self) -> io::Result<h1::Head> {
        loop {
            if !self.read.is_empty() {
                match h1::parse_head(&mut self.read)? {
                    Parsed::Head(head) if head.status.is_informational() => {
                        if head.status == http::StatusCode::SWITCHING_PROTOCOLS {
                            return Err(h1::invalid("the upstream switched protocols"));
                        }
                        continue;
                    }
                    Parsed::Head(head) => return Ok(head),
                    Parsed::Partial => {}
                }
            }
            if poll_fn(|cx| self.poll_fill(cx)).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the upstream closed the connection before its answer",
                ));
            }
        }
    }
}

impl h1::Source for Conn {
    fn buffer(&mut self) -> &mut BytesMut {
        &mut self.read
    }

    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        h1::poll_read_into(&mut self.io, &mut self.read, READ_CHUNK, cx)
    }
}

/// The body of an upstream answer, read from its connection as it is polled. The
/// connection goes back to the pool at the body's clean end; dropping the body before
/// closes it.
pub(crate) struct UpstreamBody {
    /// `None` once the body ended (or failed). Boxed once per connection, so that the
    /// body (which moves with the answer and into the client's stream) stays small.
    conn: Option<Box<Conn>>,
    reader: BodyReader,
    keep_alive: bool,
    upstream: Weak<Upstream>,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("ended", &self.conn.is_none())
            .finish_non_exhaustive()
    }
}

impl UpstreamBody {
    /// The body ended cleanly: its connection goes back to the pool when it may.
    fn end(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.keep_alive
            && conn.read.is_empty()
            && let Some(upstream) = self.upstream.upgrade()
        {
            upstream.checkin(conn);
        }
    }

    /// The body failed: its connection is closed.
    fn fail(&mut self, error: io::Error) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        self.conn = None;
        Poll::Ready(Some(Err(error)))
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        let this = self.get_mut();
        let Some(conn) = this.conn.as_deref_mut() else {
            return Poll::Ready(None);
        };
        const CLOSED: &str = "the upstream closed the connection before the end of the body";
        match ready!(this.reader.poll_next(conn, cx, CLOSED)) {
            Some(Ok((data, last))) => {
                if last {
                    this.end();
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            None => {
                this.end();
                Poll::Ready(None)
            }
            Some(Err(e)) => this.fail(e),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.conn {
            None => SizeHint::with_exact(0),
            Some(_) => self.reader.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue, Method, StatusCode};
    use http_body_util::BodyExt;
    use keypool_providers::HeaderLines as _;
    use keypool_providers::UpstreamHeaders;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// One request as the upstream received it: the head's text and the body.
    #[derive(Debug)]
    struct Received {
        head: String,
        body: Vec<u8>,
    }

    /// Reads one request (head, then `content-length` bytes) off `stream`; `None`
    /// when the client closed first.
    async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Received> {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8(buf[..end + 4].to_vec()).unwrap();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .map_or(0, |n| n.trim().parse().unwrap());
                while buf.len() < end + 4 + length {
                    let mut chunk = [0u8; 4096];
                    let n = stream.read(&mut chunk).await.ok()?;
                    if n == 0 {
                        return None;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body = buf[end + 4..end + 4 + length].to_vec();
                buf.drain(..end + 4 + length);
                return Some(Received { head, body });
            }
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// A loopback upstream whose every connection is served by `serve` (with the
    /// connection's number, from 0): the base URL, and the count of connections.
    async fn upstream<F, Fut>(serve: F) -> (String, Arc<AtomicUsize>)
    where
        F: Fn(TcpStream, usize) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let counter = count.clone();
        let serve = Arc::new(serve);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, n));
            }
        });
        (format!("http://{addr}"), count)
    }

    /// Answers every request of a connection with `answer`.
    async fn answer_all(mut stream: TcpStream, answer: &'static [u8]) {
        let mut buf = Vec::new();
        while read_request(&mut stream, &mut buf).await.is_some() {
            if stream.write_all(answer).await.is_err() {
                return;
            }
        }
    }

    fn head(base: &str) -> UpstreamHead {
        let mut headers = UpstreamHeaders::default();
        headers.append(
            &HeaderName::from_static("x-api-key"),
            &HeaderValue::from_static("sk-ant-test"),
        );
        UpstreamHead {
            method: Method::POST,
            uri: format!("{base}/v1/messages").parse().unwrap(),
            headers,
        }
    }

    fn client() -> Arc<Upstream> {
        Upstream::new(Egress::Direct)
    }

    /// A deadline no test reaches.
    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    async fn body_of(response: Answer) -> Vec<u8> {
        response.body.collect().await.unwrap().to_bytes().to_vec()
    }

    const OK: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";

    #[tokio::test]
    async fn requests_reuse_one_connection_and_arrive_whole() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (base, connections) = upstream(move |mut stream, _| {
            let tx = tx.clone();
            async move {
                let mut buf = Vec::new();
                while let Some(request) = read_request(&mut stream, &mut buf).await {
                    tx.send(request).unwrap();
                    stream.write_all(OK).await.unwrap();
                }
            }
        })
        .await;
        let client = client();
        for i in 0..3 {
            let body = Bytes::from(format!("{{\"n\":{i}}}"));
            let response = client.send(&head(&base), &body, far()).await.unwrap();
            assert_eq!(response.head.status, StatusCode::OK);
            assert_eq!(
                response.head.headers.first_str("content-type"),
                Some("application/json")
            );
            assert_eq!(body_of(response).await, b"{}");
            let received = rx.recv().await.unwrap();
            let authority = base.trim_start_matches("http://");
            assert_eq!(
                received.head,
                format!(
                    "POST /v1/messages HTTP/1.1\r\nhost: {authority}\r\nx-api-key: sk-ant-test\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                )
            );
            assert_eq!(received.body, body);
        }
        assert_eq!(connections.load(Ordering::SeqCst), 1);
        assert_eq!(client.idle(), 1);
    }

    #[tokio::test]
    async fn an_answer_that_says_close_is_not_pooled_and_until_close_bodies_end_at_the_close() {
        let (base, connections) = upstream(|mut stream, n| async move {
            let mut buf = Vec::new();
            read_request(&mut stream, &mut buf).await;
            if n == 0 {
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 1\r\n\r\na",
                    )
                    .await;
            } else {
                // no length: the body is everything until the close
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\n\r\nuntil the close")
                    .await;
            }
        })
        .await;
        let client = client();
        let first = client
            .send(&head(&base), &Bytes::new(), far())
            .await
            .unwrap();
        assert_eq!(body_of(first).await, b"a");
        assert_eq!(client.idle(), 0);
        let second = client
            .send(&head(&base), &Bytes::new(), far())
            .await
            .unwrap();
        assert_eq!(body_of(second).await, b"until the close");
        assert_eq!(client.idle(), 0);
        assert_eq!(connections.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn chunked_answers_arrive_byte_by_byte_after_an_interim_answer() {
        let (base, _) = upstream(|mut stream, _| async move {
            let mut buf = Vec::new();
            while read_request(&mut stream, &mut buf).await.is_some() {
                let answer: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n";
                for byte in answer {
                    stream.write_all(&[*byte]).await.unwrap();
                }
            }
        })
        .await;
        let client = client();
        for _ in 0..2 {
            let response = client
                .send(&head(&base), &Bytes::new(), far())
                .await
                .unwrap();
            assert_eq!(response.head.status, StatusCode::OK);
            assert_eq!(body_of(response).await, b"hello world");
            assert_eq!(client.idle(), 1, "a clean end pools the connection");
        }
    }

    /// A pooled connection keeps one timer for its requests' deadlines: a timer that
    /// fired while the connection was idle does not fail the next request (it is moved
    /// on to that request's deadline), and a deadline earlier than the timer's is kept
    /// (the timer is moved back to it).
    #[tokio::test]
    async fn each_request_on_a_pooled_connection_keeps_its_own_deadline() {
        let (base, connections) = upstream(|mut stream, _| async move {
            let mut buf = Vec::new();
            let mut n = 0;
            while read_request(&mut stream, &mut buf).await.is_some() {
                match n {
                    0 => {}
                    // the upstream's own pace, the thing under test
                    1 => tokio::time::sleep(Duration::from_millis(400)).await,
                    _ => tokio::time::sleep(Duration::from_secs(30)).await,
                }
                stream.write_all(OK).await.unwrap();
                n += 1;
            }
        })
        .await;
        let client = client();
        // room for a slow connect on a loaded machine; the idle wait outlasts it
        let deadline = Instant::now() + Duration::from_secs(1);
        let first = client
            .send(&head(&base), &Bytes::new(), deadline)
            .await
            .unwrap();
        assert_eq!(body_of(first).await, b"{}");
        // the connection's timer fires while it is idle
        tokio::time::sleep_until(deadline + Duration::from_millis(100)).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        let second = client.send(&head(&base), &Bytes::new(), deadline).await;
        let second = second.expect("the second request has its own deadline");
        assert_eq!(body_of(second).await, b"{}");
        let started = Instant::now();
        let deadline = started + Duration::from_millis(300);
        let third = client.send(&head(&base), &Bytes::new(), deadline).await;
        assert!(
            matches!(third, Err(SendError::Timeout)),
            "{:?}",
            third.as_ref().err()
        );
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "timed out after {took:?} with a 300 ms deadline"
        );
        assert_eq!(connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_closes_its_connection() {
        let (base, connections) = upstream(|mut stream, _| async move {
            let mut buf = Vec::new();
            while read_request(&mut stream, &mut buf).await.is_some() {
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf")
                    .await;
            }
        })
        .await;
        let client = client();
        let mut response = client
            .send(&head(&base), &Bytes::new(), far())
            .await
            .unwrap();
        let first = response.body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "half");
        drop(response);
        assert_eq!(client.idle(), 0);
        let _ = client
            .send(&head(&base), &Bytes::new(), far())
            .await
            .unwrap();
        assert_eq!(connections.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error_and_a_connection_closed_before_the_head_too() {
        let (base, _) = upstream(|mut stream, n| async move {
            let mut buf = Vec::new();
            read_request(&mut stream, &mut buf).await;
            if n == 0 {
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf")
                    .await;
            }
        })
        .await;
        let client = client();
        let response = client
            .send(&head(&base), &Bytes::new(), far())
            .await
            .unwrap();
        let error = response.body.collect().await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        match client.send(&head(&base), &Bytes::new(), far()).await {
            Err(SendError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn an_idle_connection_the_upstream_closed_is_never_used() {
        let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
        let (base, connections) = upstream(move |mut stream, _| {
            let closed_tx = closed_tx.clone();
            async move {
                let mut buf = Vec::new();
                read_request(&mut stream, &mut buf).await;
                stream.write_all(OK).await.unwrap();
                // the upstream's idle timeout: it closes without saying so in the head
                drop(stream);
                closed_tx.send(()).unwrap();
            }
        })
        .await;
        // probed at once, as a connection idle past PROBE_AFTER is
        let client = Upstream::with_probe_after(Egress::Direct, Duration::ZERO);
        for _ in 0..3 {
            let response = client
                .send(&head(&base), &Bytes::new(), far())
                .await
                .unwrap();
            assert_eq!(body_of(response).await, b"{}");
            closed.recv().await.unwrap();
        }
        assert_eq!(connections.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_pooled_connection_reset_while_idle_is_replaced_by_a_fresh_one() {
        let (reset_tx, mut reset) = tokio::sync::mpsc::unbounded_channel();
        let (base, connections) = upstream(move |mut stream, n| {
            let reset_tx = reset_tx.clone();
            async move {
                let mut buf = Vec::new();
                read_request(&mut stream, &mut buf).await;
                stream.write_all(OK).await.unwrap();
                if n == 0 {
                    // the first connection is reset once it was answered
                    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
                    drop(stream);
                    reset_tx.send(()).unwrap();
                } else {
                    answer_all(stream, OK).await;
                }
            }
        })
        .await;
        // not probed: the readiness the event loop saw, or the write, finds the reset
        let client = client();
        let first = client
            .send(&head(&base), &Bytes::new(), far())
            .await
            .unwrap();
        assert_eq!(body_of(first).await, b"{}");
        reset.recv().await.unwrap();
        let body = Bytes::from(vec![b'x'; 256 * 1024]);
        let second = client.send(&head(&base), &body, far()).await.unwrap();
        assert_eq!(body_of(second).await, b"{}");
        assert_eq!(connections.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_connections_expire_and_the_pool_is_bounded() {
        let (base, connections) = upstream(|stream, _| answer_all(stream, OK)).await;
        let client = client();
        let response = client
            .send(&head(&base), &Bytes::new(), far())
            .await
            .unwrap();
        assert_eq!(body_of(response).await, b"{}");
        assert_eq!(client.idle(), 1);
        tokio::time::advance(IDLE_TIMEOUT + Duration::from_secs(1)).await;
        // taken past its timeout: closed, and a fresh connection made
        let response = client
            .send(&head(&base), &Bytes::new(), far())
            .await
            .unwrap();
        assert_eq!(body_of(response).await, b"{}");
        assert_eq!(connections.load(Ordering::SeqCst), 2);
        // the sweeper closes what nobody takes
        tokio::time::advance(IDLE_TIMEOUT * 2).await;
        tokio::task::yield_now().await;
        assert_eq!(client.idle(), 0);

        // many at once: at most MAX_IDLE_PER_ORIGIN stay
        let many = MAX_IDLE_PER_ORIGIN + 3;
        let mut responses = Vec::new();
        for _ in 0..many {
            responses.push(
                client
                    .send(&head(&base), &Bytes::new(), far())
                    .await
                    .unwrap(),
            );
        }
        for response in responses {
            assert_eq!(body_of(response).await, b"{}");
        }
        assert_eq!(client.idle(), MAX_IDLE_PER_ORIGIN);
    }

    #[tokio::test]
    async fn connect_failures_and_bad_answers_are_told_apart() {
        // nothing listens there
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = client();
        let refused = client
            .send(
                &head(&format!("http://127.0.0.1:{port}")),
                &Bytes::new(),
                far(),
            )
            .await
            .unwrap_err();
        assert!(refused.is_connect(), "{refused}");
        let (base, _) = upstream(|mut stream, _| async move {
            let mut buf = Vec::new();
            read_request(&mut stream, &mut buf).await;
            let _ = stream.write_all(b"SSH-2.0-OpenSSH_9.2\r\n\r\n").await;
        })
        .await;
        match client.send(&head(&base), &Bytes::new(), far()).await {
            Err(SendError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::InvalidData),
            other => panic!("{other:?}"),
        }
    }
}
